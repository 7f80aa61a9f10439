"""``shared``: one pass, no copies. Replica r sums chunk r of every replica's buffer (all in one
context) and writes the result into chunk r of *every* buffer. Each element is summed in replica
order, so it agrees bit for bit with ``direct`` and ``scatter``; it moves the least memory of
the three (each element read K times and written K times, once), spread over all K devices.
"""

from __future__ import annotations

from ..kernels.reduce import MAX_K, reduce_broadcast
from ..tensor import Tensor
from ._common import chunk_bounds, order_after, pending
from .scatter import scatter


def shared(tensors: list[Tensor], scale: float = 1.0) -> None:
    """In place: every tensor becomes ``scale * sum(tensors)`` (summed in replica order)."""
    k = len(tensors)
    if k > MAX_K:
        return scatter(tensors, scale)        # one kernel reads at most MAX_K buffers
    bounds = chunk_bounds(tensors[0].size, k)
    ready = [pending(t.queue) for t in tensors]
    buffers = [t.data for t in tensors]
    done = []
    for r, t in enumerate(tensors):
        off, cnt = bounds[r]
        others = [e for i, e in enumerate(ready) if i != r]
        done.append(reduce_broadcast(t.queue, buffers, off, cnt, scale, wait_for=others))
    for r, t in enumerate(tensors):
        # every other replica wrote into this buffer: later work here waits for them
        order_after(t.queue, [e for i, e in enumerate(done) if i != r])
