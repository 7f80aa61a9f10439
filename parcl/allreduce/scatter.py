"""``scatter``: a parallel reduce-scatter in one step, then an all-gather.

Replica r reduces chunk r of every replica's buffer (all in one context, read directly) into its
own buffer, in replica order; then every replica copies the other chunks from their owners.
Each element is summed in the same order as ``direct``, so the two agree bit for bit, but the
reduction work is spread over all K devices: the best choice for large buckets.
"""

from __future__ import annotations

from ..kernels.reduce import reduce_into
from ..tensor import Tensor
from ._common import chunk_bounds, copy_range, order_after, per_chunk


def scatter(tensors: list[Tensor], scale: float = 1.0) -> None:
    """In place: every tensor becomes ``scale * sum(tensors)`` (summed in replica order)."""
    bounds = chunk_bounds(tensors[0].size, len(tensors))
    # reduce-scatter: replica r owns chunk r (it only writes there; others only read there)
    reduced = per_chunk(tensors, lambda t, bufs, off, cnt, wait: reduce_into(
        t.queue, t.data, bufs, off, cnt, scale, wait_for=wait))
    # all-gather: replica r copies chunk s from its owner s, once s has finished reducing it
    read_from: list[list] = [[] for _ in tensors]
    for r, t in enumerate(tensors):
        for s, src in enumerate(tensors):
            if s != r:
                off, cnt = bounds[s]
                read_from[s].append(copy_range(t.queue, t, src, off, cnt, [reduced[s]]))
    for s, t in enumerate(tensors):
        order_after(t.queue, read_from[s])   # no owner overwrites a chunk still being copied
