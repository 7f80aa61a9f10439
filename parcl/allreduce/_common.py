"""Shared checks and chunking for the allreduce algorithms."""

from __future__ import annotations

import pyopencl as cl

from .. import runtime
from ..gate import release

from ..errors import DeviceError, DTypeError, ShapeError
from ..tensor import FLOAT, Tensor


def check_tensors(op: str, tensors: list[Tensor]) -> None:
    if len(tensors) < 1:
        raise ShapeError(f"{op}: no tensors given")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: entry {i} is a {type(t).__name__}, expected pc.Tensor")
        if t.dtype != FLOAT:
            raise DTypeError(f"{op}: entry {i} has dtype {t.dtype}; allreduce sums float32")
        if t.size != first.size:
            raise ShapeError(f"{op}: entry {i} has shape {t.shape}, entry 0 has {first.shape}; "
                             "all replicas' tensors must have the same size")
        if t.queue.context != first.queue.context:
            raise DeviceError(f"{op}: entry {i} lives in another OpenCL context than entry 0; "
                              "replicas must share one context (pc.devices() gives that)")
    ids = {id(t.data) for t in tensors}
    if len(ids) != len(tensors):
        raise ShapeError(f"{op}: the same buffer appears twice among {len(tensors)} tensors")


def wait_limit(comm) -> float:
    """Seconds a device wait beside ``comm``'s collectives may take: a group's ``Bounded``
    communicator's timeout (as its collectives'), else ``runtime.WAIT_TIMEOUT``."""
    return getattr(comm, "timeout", runtime.WAIT_TIMEOUT)


def chunk_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """Split n elements into k contiguous (offset, count) chunks, the first n % k one longer."""
    base, extra = divmod(n, k)
    bounds, off = [], 0
    for i in range(k):
        cnt = base + (1 if i < extra else 0)
        bounds.append((off, cnt))
        off += cnt
    return bounds


def pending(queue: cl.CommandQueue) -> cl.Event:
    """An event for everything enqueued on ``queue`` so far (for other queues to wait for:
    none of it held back, ``parcl.gate``)."""
    event = cl.enqueue_marker(queue)
    release(queue)
    return event


def copy_range(queue, dst: Tensor, src: Tensor, offset: int, count: int, wait_for) -> cl.Event:
    """Enqueue ``dst[offset:offset+count] = src[same]`` (float32 elements) on ``queue``."""
    if count <= 0:
        return cl.enqueue_marker(queue, wait_for=wait_for)
    return cl.enqueue_copy(queue, dst.data, src.data, byte_count=count * 4,
                           src_offset=offset * 4, dst_offset=offset * 4, wait_for=wait_for)


def order_after(queue: cl.CommandQueue, events: list[cl.Event]) -> None:
    """Make later work on ``queue`` wait for ``events`` (work other queues did on its buffer)."""
    if events:
        cl.enqueue_barrier(queue, wait_for=events)


def per_chunk(tensors: list[Tensor], launch) -> list[cl.Event]:
    """Replica r calls ``launch(t_r, buffers, offset, count, wait_for)`` for its chunk r, after
    every other replica's pending work; returns the events, one per replica."""
    bounds = chunk_bounds(tensors[0].size, len(tensors))
    ready = [pending(t.queue) for t in tensors]
    buffers = [t.data for t in tensors]
    return [launch(t, buffers, *bounds[r], [e for i, e in enumerate(ready) if i != r])
            for r, t in enumerate(tensors)]
