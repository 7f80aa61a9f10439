"""``parcl-bench scaling``'s phase split: a data-parallel step run phase by phase, each phase
waited for (forward and backward on the replicas, the allreduce, the optimizer on replica 0,
the broadcast), with the per-phase medians and, with ``--trace``, a Chrome trace of every
thread and queue. It tells where a step's time goes; the step itself is timed whole, in
``scaling._measure``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

import parcl as pc
import parcl.tape as tp

from . import models
from .scaling_plot import PHASES
from .trace import clock_offset, has_profiling


def _fwd_bwd(replica, x, y, weight, profiling):
    """Forward + backward on one replica: (enqueue start, enqueue end, finish end, markers)."""
    q = replica.queue
    t0 = time.perf_counter()
    m0 = cl.enqueue_marker(q) if profiling else None
    xt = tp.tensor(pc.Tensor.from_host(q, x))
    yt = pc.Tensor.from_host(q, y)
    with tp.Tape() as tape:
        loss = models.loss_of(replica.model)(replica.model(xt), yt)
    tape.backward(loss, grad=pc.Tensor.full(q, loss.shape, weight))
    tape.release()
    m1 = cl.enqueue_marker(q) if profiling else None
    t1 = time.perf_counter()
    q.finish()
    return t0, t1, time.perf_counter(), (m0, m1)


@dataclass
class Phase:
    """One phase of a phased step: its markers on every queue (None without profiling), the
    host times it began, finished enqueueing and found every queue done, and per queue when
    its ``finish()`` returned."""

    start: list | None
    end: list | None
    began: float
    enqueued: float
    done: list[float]
    finished: float


def phased(group, opt, x, y, steps, trace, label, comm) -> dict:
    """Run ``steps`` steps phase by phase; per-phase medians (ms) and the optional trace."""
    k = len(group.replicas)
    n = x.shape[0]
    total = n if comm is None else int(comm.allreduce(n))
    bounds = np.cumsum([0] + [n // k + (1 if i < n % k else 0) for i in range(k)])
    xs = [x[bounds[i]:bounds[i + 1]] for i in range(k)]
    ys = [y[bounds[i]:bounds[i + 1]] for i in range(k)]
    weights = [float(bounds[i + 1] - bounds[i]) / total for i in range(k)]
    queues = [r.queue for r in group.replicas]
    profiling = all(has_profiling(q) for q in queues)
    offsets = [clock_offset(q) for q in queues] if profiling and trace is not None else None
    group.zero_grad()
    records = {p: [] for p in PHASES + ("dispatch", "phased")}
    now = time.perf_counter

    def finish_each() -> list[float]:
        done = []
        for q in queues:
            q.finish()
            done.append(now())
        return done

    def markers():
        return [cl.enqueue_marker(q) for q in queues] if profiling else None

    def phase(*work) -> Phase:
        """Enqueue ``work`` between markers, then wait for every queue."""
        began, start = now(), markers()
        for w in work:
            w()
        end, enqueued = markers(), now()
        done = finish_each()
        return Phase(start, end, began, enqueued, done, now())

    for step in range(steps + 1):            # step 0 is a discarded warm-up
        finish_each()
        if comm is not None:
            comm.Barrier()
        t0 = now()
        per = group.run(_fwd_bwd, xs, ys, weights, [profiling] * k)
        t1 = now()
        ar = phase(lambda: group.allreduce_grads(average=False))   # weights: the batch mean
        up = phase(opt.step, group.zero_grad)
        bc = phase(group.broadcast_parameters)
        if step == 0:
            continue
        replica_dispatch = max(p[1] - p[0] for p in per)
        records["fwd_bwd"].append(t1 - t0)
        for name, ph in (("allreduce", ar), ("optimizer", up), ("broadcast", bc)):
            records[name].append(ph.finished - ph.began)
        records["dispatch"].append(replica_dispatch + sum(ph.enqueued - ph.began
                                                          for ph in (ar, up, bc)))
        records["phased"].append(bc.finished - t0)
        if trace is None:
            continue
        main = trace.track(f"[{label}] main thread")
        trace.span(main, "forward+backward (run in replicas)", t0, t1, "phase")
        for name, ph in (("allreduce", ar), ("optimizer", up), ("broadcast", bc)):
            trace.span(main, f"{name} enqueue", ph.began, ph.enqueued, "dispatch")
            trace.span(main, f"{name} wait", ph.enqueued, ph.finished, "wait")
        for i, (s, e, d, (m0, m1)) in enumerate(per):
            tid = trace.track(f"[{label}] replica {i} thread")
            trace.span(tid, "forward+backward enqueue", s, e, "dispatch", {"step": step})
            trace.span(tid, "finish (wait)", e, d, "wait", {"step": step})
            if profiling:
                qt = trace.track(f"[{label}] replica {i} queue (device clock)")
                spans = [("forward+backward", m0, m1), ("allreduce", ar.start[i], ar.end[i]),
                         ("broadcast", bc.start[i], bc.end[i])]
                if i == 0:                       # the optimizer runs on replica 0's queue
                    spans.insert(2, ("optimizer", up.start[i], up.end[i]))
                for name, a, b in spans:
                    trace.device_span(qt, name, a.profile.end, b.profile.end, offsets[i],
                                      args={"step": step})
            else:
                qt = trace.track(f"[{label}] replica {i} queue (host-timed)")
                trace.span(qt, "forward+backward", s, d, "queue", {"step": step})
                trace.span(qt, "allreduce", ar.began, ar.done[i], "queue", {"step": step})
                if i == 0:
                    trace.span(qt, "optimizer", up.began, up.done[i], "queue", {"step": step})
                trace.span(qt, "broadcast", bc.began, bc.done[i], "queue", {"step": step})
    if trace is not None:
        trace.metadata["timing"] = (
            "queue rows: device timestamps of OpenCL profiling markers at phase boundaries"
            if profiling else
            "queue rows are host-timed: the group's queues have no profiling, so each span "
            "runs from the phase's first enqueue to the return of that queue's finish()")
        trace.metadata.setdefault("replica_counts", []).append(label)
    return {f"{p}_ms": float(np.median(v)) * 1e3 for p, v in records.items()}
