"""``parcl-bench scaling``'s phase split: a data-parallel step run phase by phase, each phase
waited for (forward and backward on the replicas, the allreduce, the optimizer on replica 0,
the broadcast), with the per-phase medians and, with ``--trace``, a Chrome trace of every
thread and queue. It tells where a step's time goes; the step itself is timed whole, in
``scaling._measure``.
"""

from __future__ import annotations

import time

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

    for step in range(steps + 1):            # step 0 is a discarded warm-up
        finish_each()
        if comm is not None:
            comm.Barrier()
        t0 = now()
        per = group.run(_fwd_bwd, xs, ys, weights, [profiling] * k)
        t1 = now()
        m_ar = markers()
        group.allreduce_grads(average=False)       # the weights make it the batch mean
        m_ar_end = markers()
        t2a = now()
        ar_done = finish_each()
        t2 = now()
        m_opt = markers()
        opt.step()
        group.zero_grad()
        m_opt_end = markers()
        t3a = now()
        opt_done = finish_each()
        t3 = now()
        m_bc = markers()
        group.broadcast_parameters()
        m_bc_end = markers()
        t4a = now()
        bc_done = finish_each()
        t4 = now()
        if step == 0:
            continue
        replica_dispatch = max(p[1] - p[0] for p in per)
        records["fwd_bwd"].append(t1 - t0)
        records["allreduce"].append(t2 - t1)
        records["optimizer"].append(t3 - t2)
        records["broadcast"].append(t4 - t3)
        records["dispatch"].append(replica_dispatch + (t2a - t1) + (t3a - t2) + (t4a - t3))
        records["phased"].append(t4 - t0)
        if trace is None:
            continue
        main = trace.track(f"[{label}] main thread")
        trace.span(main, "forward+backward (run in replicas)", t0, t1, "phase")
        trace.span(main, "allreduce enqueue", t1, t2a, "dispatch")
        trace.span(main, "allreduce wait", t2a, t2, "wait")
        trace.span(main, "optimizer enqueue", t2, t3a, "dispatch")
        trace.span(main, "optimizer wait", t3a, t3, "wait")
        trace.span(main, "broadcast enqueue", t3, t4a, "dispatch")
        trace.span(main, "broadcast wait", t4a, t4, "wait")
        for i, (s, e, d, (m0, m1)) in enumerate(per):
            tid = trace.track(f"[{label}] replica {i} thread")
            trace.span(tid, "forward+backward enqueue", s, e, "dispatch", {"step": step})
            trace.span(tid, "finish (wait)", e, d, "wait", {"step": step})
            if profiling:
                qt = trace.track(f"[{label}] replica {i} queue (device clock)")
                spans = [("forward+backward", m0, m1), ("allreduce", m_ar[i], m_ar_end[i]),
                         ("broadcast", m_bc[i], m_bc_end[i])]
                if i == 0:                       # the optimizer runs on replica 0's queue
                    spans.insert(2, ("optimizer", m_opt[i], m_opt_end[i]))
                for name, a, b in spans:
                    trace.device_span(qt, name, a.profile.end, b.profile.end, offsets[i],
                                      args={"step": step})
            else:
                qt = trace.track(f"[{label}] replica {i} queue (host-timed)")
                trace.span(qt, "forward+backward", s, d, "queue", {"step": step})
                trace.span(qt, "allreduce", t1, ar_done[i], "queue", {"step": step})
                if i == 0:
                    trace.span(qt, "optimizer", t2, opt_done[i], "queue", {"step": step})
                trace.span(qt, "broadcast", t3, bc_done[i], "queue", {"step": step})
    if trace is not None:
        trace.metadata["timing"] = (
            "queue rows: device timestamps of OpenCL profiling markers at phase boundaries"
            if profiling else
            "queue rows are host-timed: the group's queues have no profiling, so each span "
            "runs from the phase's first enqueue to the return of that queue's finish()")
        trace.metadata.setdefault("replica_counts", []).append(label)
    return {f"{p}_ms": float(np.median(v)) * 1e3 for p, v in records.items()}
