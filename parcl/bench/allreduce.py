"""``parcl-bench allreduce``: time, algbw and busbw of every allreduce algorithm vs size.

Definitions as nccl-tests (``doc/PERFORMANCE.md`` there): for ``S`` bytes per rank (replica)
and ``n`` ranks, ``algbw = S / time`` and ``busbw = algbw * 2(n-1)/n`` (the bandwidth each link
would need for a ring allreduce, comparable across ``n``). Each measurement sums float32
buffers holding small integers, so every summation order is exact and the ``wrong`` column
(elements, over every replica, that differ from the numpy sum) must be 0. In the same run, a
numpy copy of ``S`` bytes (``memcpy``) and a device buffer copy on replica 0's queue give the
bandwidth the machine's memory reaches, as a reference.

Under ``mpiexec -n R`` the rows are the hierarchical path (local reduce kernel, one host
``MPI.Allreduce`` of the buffer, local broadcast; ``n = R * replicas``) and a plain
``MPI.Allreduce`` of a host numpy buffer (``n = R``); times are the slowest rank's.

JSON rows (table ``allreduce``): ``replicas``, ``ranks``, ``algorithm``, ``bytes``, ``size``,
``time_us`` (+ ``_min``/``_max``/``_q1``/``_q3``), ``algbw_gbps``, ``busbw_gbps`` (+ ``_min``/
``_max``), ``wrong``, ``memcpy_gbps``, ``devcopy_gbps``.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

import parcl as pc
from parcl.allreduce import ALGORITHMS, allreduce

from .common import (
    BenchError,
    add_table,
    cpu_compute_units,
    cpu_share,
    device_info,
    finisher,
    fmt_range,
    human_bytes,
    mpi_comm,
    new_result,
    parse_ints,
    parse_sizes,
    put_rate,
    put_stat,
    repeat_of,
    require_matplotlib,
    resolve_devices,
    save_figure,
    time_runs,
    warmup_of,
)

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,25M,64M,256M"


def add_arguments(p) -> None:
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"bytes per replica, comma-separated (default {DEFAULT_SIZES})")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS),
                   help=f"comma-separated, from {sorted(ALGORITHMS)} (default: all)")
    p.add_argument("--replicas", default=None,
                   help="replica counts, e.g. 2,3 (default: 2 .. the devices available)")
    p.add_argument("--devices", default=None, metavar="SPEC",
                   help="device spec (cpu:N, gpu, ...); default: the CPU split into "
                        "max(--replicas) sub-devices (one per compute unit by default)")


def _devices_for(args, comm=None) -> tuple[list, list[int]]:
    if args.devices:
        devs = resolve_devices(args.devices)
        counts = parse_ints(args.replicas, "replica") if args.replicas else list(
            range(2, len(devs) + 1))
        if counts and max(counts) > len(devs):
            raise BenchError(f"--replicas {max(counts)} but --devices {args.devices} gives "
                             f"{len(devs)} devices")
        return devs, counts
    counts = parse_ints(args.replicas, "replica") if args.replicas else list(
        range(2, cpu_compute_units() + 1))
    return cpu_share(max(counts) if counts else 1, comm), counts


def run(args) -> dict:
    sizes = parse_sizes(args.sizes)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for a in algorithms:
        if a not in ALGORITHMS:
            raise BenchError(f"unknown algorithm {a!r}; choose from {sorted(ALGORITHMS)}")
    repeat, warmup = repeat_of(args, 10), warmup_of(args, 2)
    comm = mpi_comm()
    devs, counts = _devices_for(args, comm)
    if comm is None and not counts:
        raise BenchError("an allreduce needs at least 2 replicas: give --replicas 2 and a "
                         "device spec with 2 devices (e.g. --devices cpu:2)")
    if comm is not None:
        counts = counts or [1]
    result = new_result("allreduce", {"sizes": sizes, "algorithms": algorithms,
                                      "replicas": counts, "repeat": repeat, "warmup": warmup,
                                      "ranks": comm.Get_size() if comm else 1})
    result["rank"] = comm.Get_rank() if comm else 0
    result["devices"] = [device_info(d, f"replica {i}") for i, d in
                         enumerate(devs[:max(counts)])]
    rows = []
    rng = np.random.default_rng(0)
    for n in counts:
        queues = [pc.new_queue(d) for d in devs[:n]]
        sync = finisher(queues)
        for size in sizes:
            elems = max(size // 4, 1)
            hosts = [rng.integers(-8, 8, elems, dtype=np.int8).astype(np.float32)
                     for _ in range(n)]
            ref = hosts[0].copy()
            for h in hosts[1:]:
                ref += h
            tensors = [pc.Tensor.from_host(q, h) for q, h in zip(queues, hosts)]
            sync()
            ref_bw = _references(queues[0], tensors[0], hosts[0], repeat, warmup)
            base = {"replicas": n, "bytes": elems * 4, "size": human_bytes(elems * 4), **ref_bw}
            if comm is None:
                for name in algorithms:
                    rows.append({**base, "ranks": 1, "algorithm": name,
                                 **_measure_local(name, tensors, hosts, ref, repeat, warmup,
                                                  sync)})
            else:
                rows.extend(_measure_mpi(comm, base, tensors, hosts, repeat, warmup, sync))
            del tensors
    for r in rows:
        participants = r["ranks"] * (r["replicas"] if r["algorithm"] != "mpi_host" else 1)
        r["participants"] = participants
        _bandwidths(r, participants)
    add_table(result, "allreduce", "allreduce (sum, float32): median time [min-max] of "
              f"{repeat} runs; algbw = bytes/time, busbw = algbw*2(n-1)/n", [
                  ("replicas", "replicas", ""), ("ranks", "ranks", ""),
                  ("algorithm", "algorithm", ""), ("size", "size", ""),
                  ("time_us", "time us", ".1f"), ("time_range", "[min-max] us",
                                                  fmt_range("time_us", ".1f")),
                  ("algbw_gbps", "algbw GB/s", ".2f"), ("busbw_gbps", "busbw GB/s", ".2f"),
                  ("wrong", "wrong", ""), ("memcpy_gbps", "numpy memcpy GB/s", ".2f"),
                  ("devcopy_gbps", "device copy GB/s", ".2f")], rows)
    result["notes"].append("GB/s are 1e9 bytes/s. memcpy: numpy copy of the same bytes on the "
                           "host; device copy: clEnqueueCopyBuffer on replica 0's queue.")
    return result


def _references(queue, tensor, host, repeat, warmup) -> dict:
    """numpy memcpy and device-copy bandwidth (bytes/s of data moved once) for this size."""
    dst = np.empty_like(host)
    mem = time_runs(lambda: np.copyto(dst, host), repeat, warmup)
    tmp = pc.Tensor.empty(queue, tensor.shape)
    dev = time_runs(lambda: cl.enqueue_copy(queue, tmp.data, tensor.data,
                                            byte_count=tensor.nbytes),
                    repeat, warmup, sync=queue.finish)
    return {"memcpy_gbps": host.nbytes / mem["median"] / 1e9,
            "devcopy_gbps": host.nbytes / dev["median"] / 1e9}


def _upload(tensors, hosts) -> None:
    for t, h in zip(tensors, hosts):
        cl.enqueue_copy(t.queue, t.data, h, is_blocking=True)


def _count_wrong(tensors, ref) -> int:
    return int(sum(np.count_nonzero(t.to_host() != ref) for t in tensors))


def _measure_local(name, tensors, hosts, ref, repeat, warmup, sync) -> dict:
    _upload(tensors, hosts)
    allreduce(tensors, op="sum", algorithm=name)
    sync()
    wrong = _count_wrong(tensors, ref)   # integers: every summation order is exact
    # later runs keep summing in place; the values only grow (no overflow in these counts)
    stat = time_runs(lambda: allreduce(tensors, op="sum", algorithm=name), repeat, warmup,
                     sync=sync)
    row = {"wrong": wrong}
    put_stat(row, "time_us", stat, 1e6)
    return row


def _measure_mpi(comm, base, tensors, hosts, repeat, warmup, sync) -> list[dict]:
    from mpi4py import MPI

    from parcl.allreduce.mpi import hierarchical

    world = comm.Get_size()

    def slowest(t: float) -> float:
        return comm.allreduce(t, op=MPI.MAX)

    def sync_all():
        sync()
        comm.Barrier()

    # every rank holds the same hosts (same seed), so the global sum is world * local sum
    ref = hosts[0].copy()
    for h in hosts[1:]:
        ref += h
    ref *= world
    rows = []
    _upload(tensors, hosts)
    hierarchical(tensors, comm, 1.0)
    sync()
    wrong = comm.allreduce(_count_wrong(tensors, ref), op=MPI.SUM)
    stat = time_runs(lambda: hierarchical(tensors, comm, 1.0), repeat, warmup, sync=sync_all,
                     reduce_times=slowest)
    row = {**base, "ranks": world, "algorithm": "hierarchical", "wrong": wrong}
    put_stat(row, "time_us", stat, 1e6)
    rows.append(row)
    host = hosts[0].copy()
    comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    wrong = comm.allreduce(int(np.count_nonzero(host != hosts[0] * world)), op=MPI.SUM)
    stat = time_runs(lambda: comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM), repeat, warmup,
                     sync=comm.Barrier, reduce_times=slowest)
    row = {**base, "replicas": 1, "ranks": world, "algorithm": "mpi_host", "wrong": wrong}
    put_stat(row, "time_us", stat, 1e6)
    rows.append(row)
    return rows


def _bandwidths(row: dict, n: int) -> None:
    factor = 2.0 * (n - 1) / n if n > 1 else 0.0
    stat = {"median": row["time_us"] * 1e-6, "min": row["time_us_min"] * 1e-6,
            "max": row["time_us_max"] * 1e-6}
    put_rate(row, "algbw_gbps", row["bytes"] / 1e9, stat)
    row["busbw_gbps"] = row["algbw_gbps"] * factor
    row["busbw_gbps_min"] = row["algbw_gbps_min"] * factor
    row["busbw_gbps_max"] = row["algbw_gbps_max"] * factor


def plot(result: dict, path: str) -> None:
    plt = require_matplotlib()
    rows = result["tables"]["allreduce"]["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = sorted({(r["algorithm"], r["replicas"], r["ranks"]) for r in rows})
    for algo, n, ranks in series:
        pts = sorted((r["bytes"], r["busbw_gbps"]) for r in rows
                     if (r["algorithm"], r["replicas"], r["ranks"]) == (algo, n, ranks))
        label = f"{algo} ({n} replicas" + (f", {ranks} ranks)" if ranks > 1 else ")")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label)
    ref = sorted({(r["bytes"], r["memcpy_gbps"]) for r in rows})
    ax.plot([p[0] for p in ref], [p[1] for p in ref], "k--", lw=1, label="numpy memcpy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per replica")
    ax.set_ylabel("busbw GB/s")
    ax.set_title("allreduce bus bandwidth", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)
