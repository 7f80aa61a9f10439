"""Hierarchical allreduce across processes: local OpenCL reduce into replica 0, one
``MPI.Allreduce`` of the flat bucket on the host (on the mapped buffer), then the local
broadcast."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..kernels.reduce import reduce_into
from .. import runtime
from ..tensor import Tensor
from ._common import order_after, pending, wait_limit


# Below this a plain read and write beat map/unmap, whose fixed cost is ~0.2 ms here
# (`mpiexec -n 2 parcl-bench allreduce --replicas 1`: 4 KB 44 us copied vs 242 us mapped;
# 25 MB 17.1 ms copied vs 7.1 ms mapped).
MAP_BYTES = 256 * 1024


def _reduce_host(comm, host: np.ndarray, scale: float) -> None:
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    if comm.Get_size() > 2:
        # With three or more ranks the summation order may differ between ranks: take rank 0's
        # result everywhere so every replica of every rank holds the same bits.
        comm.Bcast(host, root=0)
    if scale != 1.0:
        host *= np.float32(scale)


def hierarchical(tensors: list[Tensor], comm, scale: float = 1.0) -> None:
    """In place: every tensor on every rank becomes ``scale * sum over ranks and replicas``."""
    root = tensors[0]
    q0 = root.queue
    if len(tensors) > 1:                                     # local reduce, replica order
        ready = [pending(t.queue) for t in tensors[1:]]
        reduce_into(q0, root.data, [t.data for t in tensors], 0, root.size, 1.0,
                    wait_for=ready)
    limit = wait_limit(comm)
    if root.nbytes >= MAP_BYTES:
        # Map the bucket rather than copy it: on a CPU device the map is the buffer itself
        # (no copy at all); elsewhere the driver moves the bytes, as a read and write would.
        with runtime.watched(limit, "mapping replica 0's summed gradients"):
            host, _ = cl.enqueue_map_buffer(q0, root.data,
                                            cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                            (root.size,), np.float32, is_blocking=True)
        try:
            _reduce_host(comm, host, scale)
        finally:
            # unmap: it writes the result back where the device keeps its own copy
            written = [host.base.release(queue=q0)]
    else:
        host = root.to_host(limit).reshape(-1)
        _reduce_host(comm, host, scale)
        with runtime.watched(limit, "writing the ranks' sum to replica 0"):
            written = [cl.enqueue_copy(q0, root.data, host, is_blocking=True)]
    copies = [cl.enqueue_copy(t.queue, t.data, root.data, byte_count=root.nbytes,
                              wait_for=written)
              for t in tensors[1:]]
    order_after(q0, copies)
