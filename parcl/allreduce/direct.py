"""``direct``: one reduce kernel on replica 0's queue reads every replica's buffer (they share a
context) and writes the sum into replica 0's; then each replica copies it back. Fewest launches:
the best choice for small tensors, where launch latency dominates."""

from __future__ import annotations

import pyopencl as cl

from ..kernels.reduce import reduce_into
from ..tensor import Tensor
from ._common import order_after, pending


def direct(tensors: list[Tensor], scale: float = 1.0) -> None:
    """In place: every tensor becomes ``scale * sum(tensors)`` (summed in replica order)."""
    root = tensors[0]
    q0 = root.queue
    # reduce: wait for every replica's pending writes, then one kernel reads all K buffers
    ready = [pending(t.queue) for t in tensors[1:]]
    ev = reduce_into(q0, root.data, [t.data for t in tensors], 0, root.size, scale,
                     wait_for=ready)
    # broadcast: each replica copies the result into its own buffer
    copies = [cl.enqueue_copy(t.queue, t.data, root.data, byte_count=root.nbytes, wait_for=[ev])
              for t in tensors[1:]]
    order_after(q0, copies)    # replica 0 must not overwrite its buffer before they have read it
