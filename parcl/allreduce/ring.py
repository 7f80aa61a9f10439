"""``ring``: reduce-scatter then all-gather around the ring of replicas, K-1 steps each.

Each step is a chunked reduce kernel (or copy) on the receiving replica's queue that reads its
left neighbour's buffer directly (one shared context) and waits on the neighbour's event for the
previous step, never on the host. Every chunk is summed in a fixed ring order, so results are
bit-identical run to run (not necessarily to ``direct``, whose order differs).
"""

from __future__ import annotations

from ..kernels.reduce import reduce_into
from ..tensor import Tensor
from ._common import chunk_bounds, copy_range, order_after, pending


def ring(tensors: list[Tensor], scale: float = 1.0) -> None:
    """In place: every tensor becomes ``scale * sum(tensors)``."""
    k = len(tensors)
    if k == 1:
        return _scale_only(tensors[0], scale)
    bounds = chunk_bounds(tensors[0].size, k)
    last = [pending(t.queue) for t in tensors]         # each replica's latest event
    history: list[list] = [[e] for e in last]           # every event per replica
    # reduce-scatter: at step s replica r adds its left neighbour's partial chunk r-s-1
    for s in range(k - 1):
        step = []
        for r, t in enumerate(tensors):
            left = (r - 1) % k
            off, cnt = bounds[(r - s - 1) % k]
            sc = scale if s == k - 2 else 1.0
            step.append(reduce_into(t.queue, t.data, [tensors[left].data, t.data], off, cnt,
                                    sc, wait_for=[last[left]]))
        last = step
        for r, e in enumerate(step):
            history[r].append(e)
    # replica r now holds the finished chunk r+1; all-gather passes them around
    rs_done = list(last)
    for s in range(k - 1):
        step = []
        for r, t in enumerate(tensors):
            left, right = (r - 1) % k, (r + 1) % k
            off, cnt = bounds[(r - s) % k]
            # wait for the left's chunk (RAW) and for the right to have read ours (WAR)
            wait = [last[left], rs_done[right]] if s == 0 else [last[left], last[right]]
            step.append(copy_range(t.queue, t, tensors[left], off, cnt, wait))
        last = step
        for r, e in enumerate(step):
            history[r].append(e)
    for r, t in enumerate(tensors):
        order_after(t.queue, history[(r + 1) % k])       # the right neighbour read our buffer


def _scale_only(t: Tensor, scale: float) -> None:
    if scale != 1.0:
        from ..kernels.elementwise import scale_
        scale_(t, scale)
