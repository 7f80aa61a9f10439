"""Hierarchical allreduce across processes: local OpenCL reduce into replica 0, one
``MPI.Allreduce`` of the flat bucket on the host, then the local broadcast."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..kernels.reduce import reduce_into
from ..tensor import Tensor
from ._common import order_after, pending


def hierarchical(tensors: list[Tensor], comm, scale: float = 1.0) -> None:
    """In place: every tensor on every rank becomes ``scale * sum over ranks and replicas``."""
    from mpi4py import MPI

    root = tensors[0]
    q0 = root.queue
    if len(tensors) > 1:                                     # local reduce, replica order
        ready = [pending(t.queue) for t in tensors[1:]]
        reduce_into(q0, root.data, [t.data for t in tensors], 0, root.size, 1.0,
                    wait_for=ready)
    host = root.to_host().reshape(-1)                        # the one host round trip
    comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    if comm.Get_size() > 2:
        # With three or more ranks the summation order may differ between ranks: take rank 0's
        # result everywhere so every replica of every rank holds the same bits.
        comm.Bcast(host, root=0)
    if scale != 1.0:
        host *= np.float32(scale)
    cl.enqueue_copy(q0, root.data, host, is_blocking=True)
    copies = [cl.enqueue_copy(t.queue, t.data, root.data, byte_count=root.nbytes)
              for t in tensors[1:]]
    order_after(q0, copies)
