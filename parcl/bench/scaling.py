"""``parcl-bench scaling``: data-parallel throughput vs replica count, and where a step goes.

For each replica count ``n`` (``--replicas 1,2``) a ``ReplicaGroup`` runs on the first ``n``
devices. By default the devices are the CPU split into ``max(replicas)`` sub-devices, so every
replica, the 1-replica baseline included, owns the same share of the CPU: the comparison is per
device. Under ``mpiexec`` the CPU is split for all the ranks on the machine and each rank takes
its own share, as ``parcl-launch`` does. ``--batch-per-replica B`` (weak scaling, the default
with the model's batch) gives each replica ``B`` samples; ``--global-batch B`` (strong
scaling) splits ``B`` over the replicas.

Two loops per ``n``:

* the headline ``samples/s``: ``--steps`` calls of ``group.step`` with no extra
  synchronisation (the way training runs), timed ``--repeat`` times after warm-up. Every
  configuration's group is open at once and each round runs every configuration once, in a
  shuffled order, so ``speedup`` is the median of per-round ratios against the base run of the
  same round (this machine's speed drifts), with a bootstrap 95 % CI of that median;
* the phase split, the same step rebuilt from the group's public pieces with every queue
  finished after each phase: ``group.run`` for forward + backward in every replica (host to
  device copy included), ``group.allreduce_grads``, ``optimizer.step()`` (+ ``zero_grad``),
  ``group.broadcast_parameters()``: the unsharded end of a step (``group.step`` itself shares
  the reduce, update and broadcast among the replicas' queues when it can; see
  ``ReplicaGroup``). ``dispatch`` is the host time spent enqueueing inside
  those phases (the slowest replica thread for forward + backward), a part of their times, not
  an extra phase.

``--ceiling`` adds ``n (bare replays)`` rows, timed in the same rounds: each replica thread
replays its captured forward + backward and finishes its queue, step after step, with no
allreduce, update or synchronisation between the replicas. Their speedup (against one bare
replica) is what the devices and the host's threads allow at most, the ceiling for the
steps' speedup.

Unless ``--no-numpy`` (and for the models with a numpy reference: ``mlp``, ``cnn``),
``n (numpy threads)`` rows time ``reference.NumpyDataParallel`` in the same rounds: ``n``
threads, each its shard of the same batch through numpy with one BLAS thread per compute unit
of a replica's device, a barrier per step, then the averaged update. Their speedup (against
one numpy thread) is what plain synchronous data parallelism in numpy reaches on this machine,
measured beside parcl's.

``--trace FILE`` writes the phased steps as a Chrome trace (one row per replica thread and per
replica queue). Queues made with profiling (``pc.new_queue(dev, profiling=True)``) give device
timestamps from marker events at the phase boundaries; the group's ordinary queues give
host-timed spans instead (enqueue start to ``finish`` return), which the trace's metadata says.

JSON rows (table ``scaling``): ``label``, ``kind`` (``step``, ``bare`` or ``numpy``),
``replicas``, ``ranks``, ``batch`` (per step, all replicas and ranks), ``samples_per_s`` (+
``_min``/``_max``), ``speedup`` (+ ``_min``/``_max``, and ``_ci_min``/``_ci_max``: a 95 % CI
of the median), ``efficiency``, ``step_ms``, ``times`` (seconds per timed run, in round
order), and for ``step`` rows ``fwd_bwd_ms``, ``allreduce_ms``, ``optimizer_ms``,
``broadcast_ms``, ``dispatch_ms``, ``phased_ms`` (medians over the phased steps), for
``numpy`` rows ``blas_threads`` (per thread; ``"default"`` without threadpoolctl).
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pyopencl as cl

import parcl.tape as tp
from parcl.replica import ReplicaGroup

from . import models
from .scaling_phases import phased
from .scaling_plot import plot  # noqa: F401  (the subcommand's --plot)
from .common import (
    BenchError,
    add_table,
    cpu_share,
    device_info,
    fmt_range,
    median_ci,
    mpi_comm,
    new_result,
    numpy_threads,
    parse_ints,
    put_rate,
    repeat_of,
    resolve_devices,
    time_interleaved,
    warmup_of,
)
from .reference import NUMPY_MODELS, NumpyDataParallel
from .trace import ChromeTrace

DEFAULT_STEPS = {"mlp": 20, "cnn": 10, "digits": 20, "mobilenet": 5, "resnet18": 2, "gpt": 5}


def add_arguments(p) -> None:
    p.add_argument("--model", default="mlp", choices=models.MODELS)
    p.add_argument("--replicas", default="1,2", help="replica counts (default 1,2)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--batch-per-replica", type=int, default=None, metavar="B",
                   help="weak scaling: B samples per replica (default: the model's batch, "
                        f"{models.DEFAULT_BATCH})")
    g.add_argument("--global-batch", type=int, default=None, metavar="B",
                   help="strong scaling: B samples per step split over the replicas")
    p.add_argument("--allreduce", default="auto", help="allreduce algorithm (default auto)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per timed run (default {DEFAULT_STEPS})")
    p.add_argument("--devices", default=None, metavar="SPEC",
                   help="device spec (cpu:N, gpu, ...); default: the CPU split into "
                        "max(--replicas) sub-devices")
    p.add_argument("--image-size", type=int, default=64,
                   help="resnet18 input size (default 64: 3x64x64)")
    p.add_argument("--whole-device", action="store_true",
                   help="also run one replica on the whole (unsplit) CPU device")
    p.add_argument("--trace", metavar="FILE", help="write the phased steps as Chrome-trace JSON")
    p.add_argument("--capture", action="store_true",
                   help="capture each replica's forward/backward once and replay it "
                        "(ReplicaGroup(capture=True)) for the samples/s figure")
    p.add_argument("--sync-batchnorm", action="store_true",
                   help="ReplicaGroup(sync_batchnorm=True): batch norm over the global batch")
    p.add_argument("--ceiling", action="store_true",
                   help="also time bare replays: each replica thread replays its captured "
                        "forward/backward and finishes its queue, step after step, with no "
                        "allreduce, update or synchronisation between replicas (what the "
                        "devices and the host's threads allow at most; one process only)")
    p.add_argument("--no-numpy", action="store_true",
                   help="leave out the numpy data-parallel reference rows (threads, one "
                        "shard each, a barrier per step; mlp and cnn, one process only)")


def _plan(args, comm=None):
    from parcl.allreduce import ALGORITHMS

    if args.allreduce != "auto" and args.allreduce not in ALGORITHMS:
        raise BenchError(f"unknown --allreduce {args.allreduce!r}; choose auto or one of "
                         f"{sorted(ALGORITHMS)}")
    counts = sorted(set(parse_ints(args.replicas, "replica")))
    if args.devices:
        devs = resolve_devices(args.devices)
    else:
        devs = cpu_share(max(counts), comm)      # ranks on one machine share its cores
    if max(counts) > len(devs):
        raise BenchError(f"--replicas {max(counts)} but the devices give {len(devs)}; pass "
                         f"--devices cpu:{max(counts)} or fewer replicas")
    return counts, devs


def _batch_sizes(args, n: int) -> int:
    """Samples per step on this process for ``n`` replicas."""
    if args.global_batch is not None:
        if args.global_batch < n:
            raise BenchError(f"--global-batch {args.global_batch} is smaller than {n} replicas")
        return args.global_batch
    per = (models.DEFAULT_BATCH[args.model] if args.batch_per_replica is None
           else args.batch_per_replica)
    if per < 1:                      # 0 with `or` ran the model's default batch, silently
        raise BenchError(f"--batch-per-replica must be >= 1, got {per}")
    return per * n


def run(args) -> dict:
    repeat, warmup = repeat_of(args, 3), warmup_of(args, 2)
    steps = DEFAULT_STEPS[args.model] if args.steps is None else args.steps
    if steps < 1:                    # 0 with `or` ran the default steps, silently
        raise BenchError(f"--steps must be >= 1, got {steps}")
    comm = mpi_comm()
    world = comm.Get_size() if comm else 1
    counts, devs = _plan(args, comm)
    mode = "strong" if args.global_batch is not None else "weak"
    result = new_result("scaling", {
        "model": args.model, "replicas": counts, "mode": mode, "steps": steps,
        "capture": bool(getattr(args, "capture", False)),
        "repeat": repeat, "warmup": warmup, "allreduce": args.allreduce,
        "batch_per_replica": args.batch_per_replica, "global_batch": args.global_batch,
        "image_size": args.image_size if args.model == "resnet18" else None, "ranks": world})
    result["rank"] = comm.Get_rank() if comm else 0
    result["devices"] = [device_info(d, f"replica {i}") for i, d in
                         enumerate(devs[:max(counts)])]
    trace = None
    if args.trace:
        trace = ChromeTrace({"benchmark": "parcl-bench scaling", "model": args.model})
    plans = [(n, devs[:n], f"{n}", "step") for n in counts]
    if args.whole_device:
        whole = resolve_devices("cpu")
        result["devices"].append(device_info(whole[0], "whole-device baseline"))
        plans.append((1, whole, "1 (whole CPU)", "step"))
    if getattr(args, "ceiling", False):
        if comm is not None:
            raise BenchError("--ceiling times one process's replicas; run it without mpiexec")
        plans += [(n, devs[:n], f"{n} (bare replays)", "bare") for n in counts]
    if not getattr(args, "no_numpy", False) and comm is None and args.model in NUMPY_MODELS:
        plans += [(n, devs[:n], f"{n} (numpy threads)", "numpy") for n in counts]
    rows = _measure(args, plans, steps, repeat, warmup, comm, world, trace)
    bases = {kind: next(r for r in rows if r["kind"] == kind and r["replicas"] == min(counts))
             for kind in {r["kind"] for r in rows}}
    for r in rows:
        # Per run, against the base run of its kind timed in the same round (every round runs
        # each configuration once, so a change in the machine's load hits both sides alike).
        base = bases[r["kind"]]
        ratios = [b / t * (r["batch"] / base["batch"])
                  for t, b in zip(r["times"], base["times"])]
        r["speedup"] = float(np.median(ratios))
        r["speedup_min"], r["speedup_max"] = float(min(ratios)), float(max(ratios))
        r["speedup_ci_min"], r["speedup_ci_max"] = median_ci(ratios)
        r["efficiency"] = r["speedup"] / (r["replicas"] / base["replicas"])
    columns = [("label", "replicas", "")]
    if world > 1:
        columns.append(("ranks", "ranks", ""))
    columns += [
        ("batch", "batch/step", ""), ("samples_per_s", "samples/s", ".1f"),
        ("sps_range", "[min-max]", fmt_range("samples_per_s", ".1f")),
        ("speedup", "speedup", ".2f"), ("speedup_range", "[min-max]", fmt_range("speedup", ".2f")),
        ("speedup_ci", "[95% CI]", fmt_range("speedup_ci", ".2f")),
        ("efficiency", "efficiency", ".0%"),
        ("step_ms", "step ms", ".2f"), ("fwd_bwd_ms", "fwd+bwd ms", ".2f"),
        ("allreduce_ms", "allreduce ms", ".2f"), ("optimizer_ms", "optim ms", ".2f"),
        ("broadcast_ms", "bcast ms", ".2f"), ("dispatch_ms", "(dispatch ms)", ".2f"),
        ("phased_ms", "phased step ms", ".2f")]
    size = f" 3x{args.image_size}x{args.image_size}" if args.model == "resnet18" else ""
    add_table(result, "scaling", f"{args.model}{size}, {mode} scaling, allreduce "
              f"{args.allreduce}: samples/s median [min-max] of {repeat} runs of {steps} "
              "group.step calls; phase split = medians of phased steps (queues finished "
              "between phases)", columns, rows)
    base_desc = f"{bases['step']['label']} replica(s)"
    if "numpy" in bases:
        blas = next(r["blas_threads"] for r in rows if r["kind"] == "numpy")
        result["notes"].append(
            "numpy threads: reference.NumpyDataParallel, one thread per replica with its "
            f"shard through numpy (BLAS threads: {blas} each), a barrier per step, then each "
            "thread averages and applies the update for its share of the parameters; its "
            "speedup is against 1 (numpy threads), timed in the same rounds.")
    if "bare" in bases:
        result["notes"].append("bare replays: each replica thread replays its captured "
                               "forward + backward and finishes its queue, step after step, "
                               "with no allreduce, update or synchronisation between the "
                               "replicas; their speedup is against 1 (bare replays), and "
                               "bounds what a full step can reach on these devices.")
    result["notes"].append(f"speedup = median over runs of samples/s / samples/s of "
                           f"{base_desc} in the same round (every round runs each "
                           "configuration once, in a shuffled order), with a bootstrap 95 % "
                           "confidence interval "
                           "of that median; efficiency = speedup / (replicas / its "
                           "replicas). dispatch = host enqueue time inside the phases (part "
                           "of them, not added). The phases are the unsharded end of a step "
                           "(allreduce_grads, optimizer on replica 0, broadcast), timed apart.")
    if trace is not None:
        trace.write(args.trace)
        result["params"]["trace"] = args.trace
        result["notes"].append(f"trace written to {args.trace} ({trace.metadata['timing']})")
    return result


def _measure(args, plans, steps, repeat, warmup, comm, world, trace) -> list[dict]:
    """Open every configuration's group at once, time their steps in alternation, then
    time each one's phases."""
    capture = getattr(args, "capture", False)
    slowest = None
    if comm is not None:
        from mpi4py import MPI

        def slowest(t):
            return comm.allreduce(t, op=MPI.MAX)

    with ExitStack() as stack:
        runs, rows = [], []
        state = None
        for n, devs, label, kind in plans:
            batch = _batch_sizes(args, n)
            x, y = models.batch(args.model, batch, args.image_size,
                                seed=comm.Get_rank() if comm else 0)
            if kind == "numpy":
                blas = _blas_threads(devs, stack)
                dp = stack.enter_context(NumpyDataParallel(NUMPY_MODELS[args.model](state), n))
                runs.append(((lambda dp=dp, x=x, y=y: dp.step(x, y, models.LR, steps)), None))
                rows.append({"label": label, "kind": kind, "replicas": n, "ranks": world,
                             "batch": batch * world, "blas_threads": blas, "_run": None})
                continue
            group = stack.enter_context(ReplicaGroup(
                models.builder(args.model), devs, allreduce=args.allreduce, comm=comm,
                capture=capture or kind == "bare",
                sync_batchnorm=getattr(args, "sync_batchnorm", False)))
            if state is None:
                state = group.replicas[0].model.state_dict()
            opt = models.optimizer(args.model, group.parameters())
            run = _steps(group, opt, x, y, steps) if kind == "step" else _bare(group, x, y, steps)
            runs.append((run, _sync(group, comm)))
            rows.append({"label": label, "kind": kind, "replicas": n, "ranks": world,
                         "batch": batch * world, "_run": (group, opt, x, y)})
        stats = time_interleaved(runs, repeat, warmup, reduce_times=slowest)
        for row, stat in zip(rows, stats):
            setup = row.pop("_run")
            put_rate(row, "samples_per_s", row["batch"] * steps, stat)
            row["step_ms"] = stat["median"] / steps * 1e3
            row["times"] = stat["times"]
            if row["kind"] == "step":
                group, opt, x, y = setup
                row.update(phased(group, opt, x, y, steps, trace, row["label"], comm))
    return rows


def _blas_threads(devs, stack) -> int | str:
    """Limit numpy's BLAS (for the rest of ``stack``) to a replica device's compute units
    on a CPU (1 on other devices), so each numpy thread gets a replica's share of the
    cores; the number, or ``"default"`` where threadpoolctl is missing."""
    cpu = all(d.type & cl.device_type.CPU for d in devs)
    threads = min(int(d.max_compute_units) for d in devs) if cpu else 1
    limit, applied = numpy_threads(threads)
    stack.enter_context(limit)
    return threads if applied else "default"


def capture_forward_backward(replica):
    """The replica's forward + backward alone (no update), captured on its queue; called with
    its batch shard ``x``, ``y`` and the loss weight (a float32 array) as numpy arrays."""
    loss_fn = models.loss_of(replica.model)

    def body(xd, yd, wd, model=replica.model):
        with tp.Tape() as tape:
            loss = loss_fn(model(tp.tensor(xd)), yd)
        tape.backward(loss, grad=wd.reshape(loss.shape))
        tape.release()
        return loss.value
    return tp.capture(body, replica.queue)


def _bare(group, x, y, steps):
    """Each replica thread replays its captured forward + backward and finishes its queue,
    ``steps`` times, in one dispatched call: no allreduce, no update, no synchronisation
    between the replicas (their gradients just accumulate)."""
    k = len(group.replicas)
    bounds = [i * x.shape[0] // k for i in range(k + 1)]
    shards = [(x[a:b], y[a:b], np.array(1.0 / x.shape[0], np.float32))
              for a, b in zip(bounds, bounds[1:])]
    captured = [None] * k

    def replay(replica, shard):
        if captured[replica.index] is None:
            captured[replica.index] = capture_forward_backward(replica)
        for _ in range(steps):
            captured[replica.index](*shard)
            replica.queue.finish()

    def run_steps():
        group.run(replay, shards)
    return run_steps


def _steps(group, opt, x, y, steps):
    loss_fn = models.loss_of(group.model)

    def run_steps():
        for _ in range(steps):
            group.step(x, y, loss_fn, opt)
    return run_steps


def _sync(group, comm):
    queues = [r.queue for r in group.replicas]

    def sync():
        for q in queues:
            q.finish()
        if comm is not None:
            comm.Barrier()
    return sync
