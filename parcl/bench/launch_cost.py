"""The host-cost sections of ``parcl-bench kernels``: what one launch costs the host (through
parcl's launcher and a raw pyopencl call, draining, the enqueue + ``finish`` round trip) and
what a recorded op of a tiny forward + backward costs, eager and replayed, against the floor of
bare enqueues. Tables ``launch`` and ``overhead`` (see ``parcl.bench.kernels``)."""

# The timed lambdas run inside the loop iteration that defines them (never later):
# ruff: noqa: B023

from __future__ import annotations

import time

import numpy as np
import pyopencl as cl

import parcl as pc
import parcl.tape as tp
from parcl import recorder
from parcl.kernels import elementwise as ew
from parcl.kernels._cache import get_kernel

from .common import BenchError


def launch_rows(q, label, launches, repeat) -> list[dict]:
    if launches < 1:
        raise BenchError(f"--launches must be >= 1, got {launches}")
    t = pc.Tensor.zeros(q, (1,))
    raw = get_kernel(q, ew.SOURCE, "scale")
    one, alpha = np.int32(1), np.float32(1.0)

    def parcl_launch():
        ew.scale_(t, 1.0)

    def raw_launch():
        raw(q, (1,), None, t.data, alpha, one)

    rows = []
    for what, fn in (("parcl launcher", parcl_launch), ("raw pyopencl call", raw_launch)):
        fn()
        q.finish()
        enq, drain = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(launches):
                fn()
            t1 = time.perf_counter()
            q.finish()
            t2 = time.perf_counter()
            enq.append((t1 - t0) / launches)
            drain.append((t2 - t0) / launches)
        rows.append(_us_row(label, f"enqueue ({what})", enq))
        rows.append(_us_row(label, f"enqueue + run, per kernel ({what})", drain))
    trips = []
    for _ in range(max(launches // 10, 10)):
        t0 = time.perf_counter()
        parcl_launch()
        q.finish()
        trips.append(time.perf_counter() - t0)
    rows.append(_us_row(label, "enqueue + finish round trip", trips))
    return rows


def overhead_rows(q, label, chain, repeat, warmup) -> list[dict]:
    """Eager and captured host time of a tiny forward + backward of ``chain`` mul-adds."""
    if chain < 1:
        raise BenchError(f"--chain must be >= 1, got {chain}")
    w = tp.tensor(pc.Tensor.from_host(q, np.full(4, 0.5, np.float32)), requires_grad=True)
    w.grad = pc.Tensor.zeros(q, (4,))          # persistent, so a replay accumulates into it
    hx = np.ones(4, np.float32)
    nodes = []

    def step(x):
        xn = tp.tensor(x)
        with tp.Tape() as tape:
            h = xn
            for _ in range(chain):
                h = h * w + xn
            loss = tp.sum(h)
        tape.backward(loss)
        nodes.append(len(tape.nodes))
        tape.release()
        return loss.value

    x = pc.Tensor.from_host(q, hx)
    rec = recorder.start()                     # count the launches of one step
    try:
        step(x)
    finally:
        recorder.stop()
    kernels = sum(1 for op in rec.ops if isinstance(op, recorder.Launch))
    del rec
    q.finish()
    captured = tp.capture(step, q)
    # The floor: the same number of bare enqueues of a kernel whose arguments are preset (a
    # replay's own launch call), so what parcl's Python adds above OpenCL's enqueue shows.
    bare = cl.Kernel(get_kernel(q, ew.SOURCE, "scale").program, "scale")
    bare.set_args(pc.Tensor.zeros(q, (1,)).data, np.float32(1.0), np.int32(1))

    def floor():
        for _ in range(kernels):
            cl.enqueue_nd_range_kernel(q, bare, (1,), None)

    rows = []
    for mode, fn in (("eager", lambda: step(x)), ("capture (replay)", lambda: captured(hx)),
                     ("floor: bare enqueues", floor)):
        for _ in range(warmup + 2):            # capture: the first call records
            fn()
            q.finish()
        host, total = [], []
        for _ in range(repeat):
            q.finish()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            q.finish()
            host.append(t1 - t0)
            total.append(time.perf_counter() - t0)
        h, tot = np.asarray(host) * 1e6, np.asarray(total) * 1e6
        med = float(np.median(h))
        ops = nodes[-1]
        rows.append({"device": label, "mode": mode, "ops": ops, "kernels": kernels,
                     "host_us": med, "host_us_min": float(h.min()), "host_us_max": float(h.max()),
                     "us_per_op": med / ops, "ops_per_s": ops / med * 1e6,
                     "us_per_kernel": med / kernels, "step_us": float(np.median(tot))})
    if captured.replays == 0:
        raise BenchError(f"overhead: the chain was not replayed ({captured.reason(hx)})")
    floor_us = rows[-1]["host_us"]
    for r in rows:
        r["above_floor_us_per_op"] = (r["host_us"] - floor_us) / r["ops"]
    return rows


def _us_row(label, what, times) -> dict:
    t = np.asarray(times) * 1e6
    return {"device": label, "what": what, "us": float(np.median(t)),
            "us_min": float(t.min()), "us_max": float(t.max())}
