"""Shared helpers of ``parcl-bench``: timing, devices, tables, JSON and plots.

Every benchmark returns a *result* dict that ``__main__`` prints, writes (``--json``) and plots
(``--plot``)::

    {"benchmark": "allreduce", "command": "parcl-bench allreduce ...", "schema": 1,
     "environment": {...}, "devices": [{"role": ..., "name": ..., "compute_units": ...}],
     "params": {...}, "notes": [...],
     "tables": {"allreduce": {"title": ..., "columns": [[key, header], ...], "rows": [...]}}}

Timings are medians of ``--repeat`` runs after ``--warmup`` discarded runs; each run stops its
clock only after ``queue.finish()`` on every queue it used. The spread is stored beside each
median as ``<key>_min``/``<key>_max`` (and ``_q1``/``_q3``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np

SCHEMA = 1
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30}


class BenchError(Exception):
    """A user-facing problem (bad argument, missing optional package): one line, exit 2."""


# -- argument parsing ----------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"4K"`` -> 4096, ``"25M"`` -> 26214400, ``"1G"``, or a plain number of bytes."""
    s = text.strip().upper()
    num = s.rstrip("KMGB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise BenchError(f"cannot read size {text!r}: use e.g. 4K, 1M, 25M, 1G") from None
    if unit not in _UNITS or value <= 0:
        raise BenchError(f"cannot read size {text!r}: use e.g. 4K, 1M, 25M, 1G")
    return int(value * _UNITS[unit])


def parse_sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def parse_ints(text: str, what: str = "value") -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise BenchError(f"cannot read {what} list {text!r}: use e.g. 1,2") from None
    if not values or any(v < 1 for v in values):
        raise BenchError(f"{what} list {text!r}: give positive integers, e.g. 1,2")
    return values


def human_bytes(n: int) -> str:
    """4096 -> '4K', 26214400 -> '25M'; sizes that are no whole unit get one decimal."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def add_common_arguments(p) -> None:
    p.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE")
    p.add_argument("--plot", metavar="FILE", help="write a PNG plot to FILE (needs matplotlib: "
                   "pip install 'parcl[bench]')")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="timed runs per measurement (median and spread are reported)")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help="discarded warm-up runs before timing")


def repeat_of(args, default: int) -> int:
    r = default if args.repeat is None else args.repeat
    if r < 1:
        raise BenchError(f"--repeat must be >= 1, got {r}")
    return r


def warmup_of(args, default: int) -> int:
    w = default if args.warmup is None else args.warmup
    if w < 0:
        raise BenchError(f"--warmup must be >= 0, got {w}")
    return w


# -- timing --------------------------------------------------------------------------------
def summarize(times: Iterable[float]) -> dict:
    """Median, min, max and quartiles (seconds) of the timed runs."""
    t = np.asarray(list(times), dtype=np.float64)
    q1, med, q3 = np.percentile(t, [25, 50, 75])
    return {"median": float(med), "min": float(t.min()), "max": float(t.max()),
            "q1": float(q1), "q3": float(q3), "runs": int(t.size)}


def median_ci(values: Iterable[float], level: float = 0.95, resamples: int = 2000
              ) -> tuple[float, float]:
    """A bootstrap confidence interval of the median of ``values`` (seeded: the same values
    give the same interval). On a machine whose speed drifts, it says how far the median of
    this many runs can be trusted."""
    v = np.asarray(list(values), dtype=np.float64)
    if v.size < 2:
        return float(v[0]), float(v[0])
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(v, (resamples, v.size)), axis=1)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo), float(hi)


def time_runs(fn: Callable[[], object], repeat: int, warmup: int = 1,
              sync: Callable[[], object] | None = None,
              reduce_times: Callable[[float], float] | None = None) -> dict:
    """Time ``fn`` ``repeat`` times after ``warmup`` discarded runs; ``sync`` (e.g. every
    queue's ``finish``) runs inside the clock so device work is counted, and once before each
    run so nothing left over is. ``reduce_times`` maps each run's time (MPI: the max over
    ranks)."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        times.append(reduce_times(dt) if reduce_times else dt)
    return summarize(times)


def time_interleaved(fns: list, repeat: int, warmup: int = 1,
                     reduce_times: Callable[[float], float] | None = None,
                     lead_in: float = 0.0) -> list[dict]:
    """Time several ``(fn, sync)`` pairs in alternation: run ``r`` of each back to back, so
    a change in the machine's load hits all of them alike, in an order shuffled afresh for
    every round (seeded, so a rerun shuffles alike): a fixed order lets whatever one
    configuration leaves behind (warm caches, spinning worker threads) always land on the
    next. With ``lead_in`` > 0, untimed runs of the same configuration fill that many
    seconds before each timed one: they take what the one before left behind (OpenBLAS's
    workers spin ~0.1 s after a call), which matters where a run is short and uses every
    core. Each stat also carries its ``times`` (seconds,
    in round order) so callers can form per-run ratios. ``reduce_times`` maps each run's
    time (MPI: the max over ranks; every rank draws the same order)."""
    fns = [(fn, sync or (lambda: None)) for fn, sync in fns]
    for _ in range(warmup):
        for fn, sync in fns:
            fn()
            sync()
    times: list[list[float]] = [[] for _ in fns]
    rng = np.random.default_rng(0)
    for _ in range(repeat):
        for i in rng.permutation(len(fns)):
            fn, sync = fns[i]
            sync()
            if lead_in > 0:
                until = time.perf_counter() + lead_in
                while time.perf_counter() < until:
                    fn()
                    sync()
            t0 = time.perf_counter()
            fn()
            sync()
            dt = time.perf_counter() - t0
            times[i].append(reduce_times(dt) if reduce_times else dt)
    return [{**summarize(t), "times": t} for t in times]


def put_ratio(row: dict, key: str, faster: dict, slower: dict) -> None:
    """``row[key]`` = median over runs of slower_time / faster_time (``_min``/``_max`` too):
    how many times the first is faster, paired run by run."""
    r = np.asarray(slower["times"]) / np.asarray(faster["times"])
    row[key] = float(np.median(r))
    row[f"{key}_min"], row[f"{key}_max"] = float(r.min()), float(r.max())


def finisher(queues) -> Callable[[], None]:
    """A ``sync`` that waits for every queue (each ``queue.finish()``)."""
    queues = list(queues)

    def sync() -> None:
        for q in queues:
            q.finish()
    return sync


def put_stat(row: dict, key: str, stat: dict, scale: float = 1.0) -> None:
    """``row[key]`` = median * scale, plus ``key_min``/``_max``/``_q1``/``_q3``."""
    row[key] = stat["median"] * scale
    for part in ("min", "max", "q1", "q3"):
        row[f"{key}_{part}"] = stat[part] * scale


def put_rate(row: dict, key: str, amount: float, stat: dict) -> None:
    """``row[key]`` = amount / median time; ``_min``/``_max`` from the slowest/fastest run."""
    row[key] = amount / stat["median"]
    row[f"{key}_min"] = amount / stat["max"]
    row[f"{key}_max"] = amount / stat["min"]


# -- devices and environment ---------------------------------------------------------------
def device_info(device, role: str = "") -> dict:
    """What the tables name: the device, its type and compute units (CU)."""
    import pyopencl as cl

    kind = "gpu" if device.type & cl.device_type.GPU else (
        "cpu" if device.type & cl.device_type.CPU else "other")
    try:
        parent = device.parent_device
    except cl.Error:
        parent = None
    return {"role": role, "name": device.name.strip(), "type": kind,
            "compute_units": int(device.max_compute_units),
            "sub_device": parent is not None,
            "platform": device.platform.name.strip(),
            "global_mem_mb": int(device.global_mem_size >> 20)}


def describe_devices(devs: list[dict]) -> str:
    out = []
    for d in devs:
        sub = " sub-device" if d["sub_device"] else ""
        out.append(f"{d['role']}: {d['type']}{sub} {d['name']!r}, {d['compute_units']} CU "
                   f"({d['platform']})")
    return "\n".join(out)


def resolve_devices(spec: str | None, split: int | None = None) -> list:
    """Devices for a ``--devices SPEC`` (``cpu``, ``cpu:N``, ``gpu``, ``gpu:I,J``, ``all``),
    resolved as ``pc.devices()`` resolves ``PARCL_DEVICES`` (one shared context); without a
    spec, the CPU split into ``split`` sub-devices."""
    import parcl as pc
    from parcl.errors import DeviceError

    if spec is None:
        return pc.devices(split=split or 1)
    try:
        return pc.runtime.devices_for(spec)
    except DeviceError as exc:
        raise BenchError(str(exc)) from None


def cpu_share(n: int, comm=None) -> list:
    """``n`` sub-devices of the CPU for this process: the CPU is split for ``n`` replicas of
    every rank on this machine (under MPI), and this rank takes its own ``n``, as under
    parcl-launch, so every replica of every rank owns the same share of the cores."""
    from parcl import distributed

    ranks, rank = (distributed.local_size(), distributed.local_rank()) if comm else (1, 0)
    units = cpu_compute_units()
    if n * ranks > units:
        where = f" x {ranks} ranks on this machine" if ranks > 1 else ""
        raise BenchError(f"--replicas {n}{where}: the CPU has only {units} compute units to "
                         "split (give --devices to share devices)")
    return resolve_devices(None, n * ranks)[rank * n:(rank + 1) * n]


def cpu_compute_units() -> int:
    """Compute units of the whole CPU device (what ``cpu:N`` splits)."""
    import parcl as pc

    return int(pc.devices(split=1)[0].max_compute_units)


def environment() -> dict:
    import pyopencl

    import parcl

    try:
        from threadpoolctl import threadpool_info
        blas = [{"api": i.get("internal_api"), "threads": i.get("num_threads")}
                for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        blas = None
    return {"python": sys.version.split()[0], "numpy": np.__version__,
            "pyopencl": pyopencl.VERSION_TEXT, "parcl": parcl.__version__,
            "platform": platform.platform(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "blas": blas,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def numpy_threads(n: int | None):
    """A context manager limiting numpy's BLAS to ``n`` threads (threadpoolctl), and whether
    the limit is real: ``(context, applied)``. Without threadpoolctl the limit is a no-op."""
    import contextlib

    if n is None:
        return contextlib.nullcontext(), False
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext(), False
    return threadpool_limits(limits=int(n), user_api="blas"), True


def mpi_comm():
    """``MPI.COMM_WORLD`` when running under ``mpiexec`` with more than one rank, else None.
    mpi4py is imported only when the launcher's environment variables say so."""
    markers = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
    if not any(m in os.environ for m in markers):
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


class LazyLoss:
    """A loss on the device (parcl's or netcl's), read only when asked: timed steps never
    ask, so no step waits for its own loss."""

    def __init__(self, value):
        self.value = value

    def __float__(self) -> float:
        return float(self.value.to_host().reshape(-1)[0])


def torch_or_none():
    """PyTorch, or None where it is not installed (the benchmarks then skip its rows)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def new_result(benchmark: str, params: dict) -> dict:
    return {"benchmark": benchmark, "schema": SCHEMA, "command": None,
            "environment": environment(), "devices": [], "params": params, "notes": [],
            "tables": {}}


def add_table(result: dict, name: str, title: str, columns: list[tuple], rows: list[dict]):
    """``columns``: ``(key, header, fmt)``; fmt is a format spec ('.1f') or a callable(row)."""
    result["tables"][name] = {"title": title, "columns": [[c[0], c[1]] for c in columns],
                              "rows": rows}
    result.setdefault("_formats", {})[name] = {c[0]: c[2] for c in columns}


# -- output --------------------------------------------------------------------------------
def fmt_range(key: str, spec: str = ".3g") -> Callable[[dict], str]:
    """A column showing ``[min, max]`` of ``key`` (from put_stat / put_rate)."""
    def f(row: dict) -> str:
        lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
        if lo is None or hi is None:
            return "-"
        return f"{format(lo, spec)}-{format(hi, spec)}"
    return f


def format_table(columns: list[list], rows: list[dict], formats: dict | None = None) -> str:
    """An aligned text table: numbers right-aligned, text left-aligned."""
    formats = formats or {}
    cells = []
    for row in rows:
        line = []
        for key, _ in columns:
            fmt = formats.get(key)
            v = row.get(key)
            if callable(fmt):
                s = fmt(row)
            elif v is None:
                s = "-"
            elif isinstance(v, float) and fmt:
                s = format(v, fmt)
            elif isinstance(v, float):
                s = f"{v:.4g}"
            else:
                s = str(v)
            line.append(s)
        cells.append(line)
    headers = [h for _, h in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    numeric = [all(_looks_numeric(c[i]) for c in cells) if cells else False
               for i in range(len(headers))]

    def join(parts):
        return "  ".join(p.rjust(w) if num else p.ljust(w)
                         for p, w, num in zip(parts, widths, numeric)).rstrip()

    out = [join(headers), join(["-" * w for w in widths])]
    out.extend(join(c) for c in cells)
    return "\n".join(out)


def _looks_numeric(s: str) -> bool:
    s = s.replace("-", "").replace(".", "").replace("x", "").replace("%", "").replace("e", "")
    s = s.replace("+", "").replace(" ", "")
    return s.isdigit() or s == ""


def render(result: dict) -> str:
    """The text ``parcl-bench`` prints: devices, one aligned table per section, notes."""
    lines = [f"parcl-bench {result['benchmark']}"]
    if result.get("devices"):
        lines.append(describe_devices(result["devices"]))
    formats = result.get("_formats", {})
    for name, table in result["tables"].items():
        lines.append("")
        lines.append(table["title"])
        lines.append(format_table(table["columns"], table["rows"], formats.get(name)))
    if result.get("notes"):
        lines.append("")
        lines.extend(f"note: {n}" for n in result["notes"])
    return "\n".join(lines)


def write_json(path: str, result: dict) -> None:
    clean = {k: v for k, v in result.items() if not k.startswith("_")}
    with open(path, "w") as f:
        json.dump(clean, f, indent=1, default=_json_default)
        f.write("\n")


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def require_matplotlib():
    """matplotlib.pyplot on the Agg backend, or a BenchError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise BenchError("--plot needs matplotlib, which is not installed: "
                         "pip install 'parcl[bench]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
