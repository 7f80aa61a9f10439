"""``shared``: one pass, no copies. Replica r sums chunk r of every replica's buffer (all in one
context) and writes the result into chunk r of *every* buffer. Each element is summed in replica
order, so it agrees bit for bit with ``direct`` and ``scatter``; it moves the least memory of
the three (each element read K times and written K times, once), spread over all K devices.
"""

from __future__ import annotations

from ..kernels.reduce import MAX_K, reduce_broadcast
from ..tensor import Tensor
from ._common import order_after, per_chunk
from .scatter import scatter


def shared(tensors: list[Tensor], scale: float = 1.0) -> None:
    """In place: every tensor becomes ``scale * sum(tensors)`` (summed in replica order)."""
    k = len(tensors)
    if k > MAX_K:
        return scatter(tensors, scale)        # one kernel reads at most MAX_K buffers
    done = per_chunk(tensors, lambda t, bufs, off, cnt, wait: reduce_broadcast(
        t.queue, bufs, off, cnt, scale, wait_for=wait))
    for r, t in enumerate(tensors):
        # every other replica wrote into this buffer: later work here waits for them
        order_after(t.queue, [e for i, e in enumerate(done) if i != r])
