"""``pc.Tensor``: a contiguous n-d array in an OpenCL buffer owned by one command queue.

A Tensor is a buffer, a shape and a dtype; it knows nothing of autograd. Its memory comes from
its queue's pool and goes back there when the last Tensor viewing it is dropped. Work is only
ever enqueued, never waited for, except in ``to_host``.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pyopencl as cl

from . import recorder
from .errors import DeviceError, DTypeError, ShapeError
from .pool import Allocation, pool_of

FLOAT = np.dtype(np.float32)
LABEL_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
SUPPORTED = (FLOAT,) + LABEL_DTYPES
# Kernels' own buffers only (Tensor.empty): uint8 holds what backward needs in a byte, such as
# max pooling's index within each window; users cannot upload it.
INTERNAL = SUPPORTED + (np.dtype(np.uint8),)


def _check_dtype(op: str, dtype, allowed=SUPPORTED) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in allowed:
        raise DTypeError(f"{op}: dtype {dt} is not supported; parcl holds float32 data and "
                         f"int32/int64 labels (convert with .astype(np.float32))")
    return dt


def normalize_shape(op: str, shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{op}: negative dimension in shape {shape}")
    return shape


class Tensor:
    """A device array: ``shape``, ``dtype``, ``size``, ``queue``; contiguous, row-major.

    >>> import numpy as np, parcl as pc
    >>> q = pc.default_queue()
    >>> t = pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> t.reshape(3, 2).to_host().shape
    (3, 2)
    """

    __slots__ = ("queue", "shape", "dtype", "data", "_alloc", "_keep", "__weakref__")

    def __init__(self, queue: cl.CommandQueue, shape, dtype, data: cl.Buffer,
                 alloc: Allocation | None, keep=None):
        self.queue = queue
        self.shape = shape
        self.dtype = dtype
        self.data = data          # the cl.Buffer kernels read and write (offset 0)
        self._alloc = alloc       # keeps the pooled memory on loan while this view lives
        self._keep = keep         # a pending upload's event (holds the host array alive)

    # -- construction ------------------------------------------------------------------
    @classmethod
    def empty(cls, queue: cl.CommandQueue, shape, dtype=np.float32) -> Tensor:
        """Uninitialised tensor from ``queue``'s memory pool."""
        if dtype is np.float32 and type(shape) is tuple:
            dt = FLOAT                 # the hot path: kernels allocating their outputs
        else:
            dt = _check_dtype("Tensor.empty", dtype, INTERNAL)
            shape = normalize_shape("Tensor.empty", shape)
        if min(shape, default=0) < 0:
            raise ShapeError(f"Tensor.empty: negative dimension in shape {shape}")
        alloc = pool_of(queue).allocate(max(prod(shape), 1) * dt.itemsize)
        return cls(queue, shape, dt, alloc.buffer, alloc)

    @classmethod
    def zeros(cls, queue: cl.CommandQueue, shape, dtype=np.float32) -> Tensor:
        """Zero-filled tensor from ``queue``'s memory pool."""
        t = cls.empty(queue, shape, dtype)
        t.fill_(0)
        return t

    @classmethod
    def full(cls, queue: cl.CommandQueue, shape, value: float, dtype=np.float32) -> Tensor:
        t = cls.empty(queue, shape, dtype)
        t.fill_(value)
        return t

    @classmethod
    def from_host(cls, queue: cl.CommandQueue, array) -> Tensor:
        """Device copy of a numpy array (float32 data, int32/int64 labels).

        Non-contiguous input is copied to contiguous first; other dtypes are a ``TypeError``
        and a zero-size array a ``ShapeError``. The copy is enqueued, not waited for.
        """
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
            if array.dtype == np.float64:
                array = array.astype(np.float32)
        dt = _check_dtype("Tensor.from_host", array.dtype)
        if array.size == 0:
            raise ShapeError(f"Tensor.from_host: zero-size array of shape {array.shape}; "
                             "parcl tensors hold at least one element")
        host = np.ascontiguousarray(array).reshape(array.shape)   # keeps 0-d arrays 0-d
        t = cls.empty(queue, host.shape, dt)
        event = cl.enqueue_copy(queue, t.data, host, is_blocking=False)
        recorder.copy(queue, t.data, host)
        t._keep = event           # pyopencl's event keeps `host` alive until the copy is done
        return t

    # -- views and copies --------------------------------------------------------------
    def reshape(self, *shape) -> Tensor:
        """Zero-copy view with a new shape; one dimension may be -1."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape: at most one -1 in {shape}")
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ShapeError(f"reshape: cannot view {self.shape} as {shape}")
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if prod(shape) != self.size:
            raise ShapeError(f"reshape: cannot view {self.shape} ({self.size} elements) "
                             f"as {shape} ({prod(shape)} elements)")
        return Tensor(self.queue, shape, self.dtype, self.data, self._alloc, self._keep)

    def view_of(self, buffer: cl.Buffer, shape) -> Tensor:
        """A tensor over ``buffer`` (e.g. a sub-buffer of this one) that keeps this alive."""
        return Tensor(self.queue, tuple(shape), self.dtype, buffer, self)

    def to_host(self) -> np.ndarray:
        """A numpy copy; blocks until every enqueued write to this tensor is done."""
        recorder.unsafe("a value was read back to the host (to_host/item)")
        out = np.empty(self.shape, self.dtype)
        cl.enqueue_copy(self.queue, out, self.data, is_blocking=True)
        return out

    def item(self) -> float:
        if self.size != 1:
            raise ShapeError(f"item: tensor of shape {self.shape} has {self.size} elements, "
                             "not one")
        return self.to_host().reshape(()).item()

    def copy(self) -> Tensor:
        out = Tensor.empty(self.queue, self.shape, self.dtype)
        cl.enqueue_copy(self.queue, out.data, self.data, byte_count=self.nbytes)
        recorder.copy(self.queue, out.data, self.data, byte_count=self.nbytes)
        return out

    def copy_(self, src: Tensor) -> Tensor:
        """Copy ``src`` (same size, same context) into this tensor, in place."""
        if src.size != self.size or src.dtype != self.dtype:
            raise ShapeError(f"copy_: source {src.shape} {src.dtype} does not fit "
                             f"{self.shape} {self.dtype}")
        check_same_context("copy_", self, src)
        wait = foreign_wait(src, self.queue)
        ev = cl.enqueue_copy(self.queue, self.data, src.data, byte_count=self.nbytes,
                             wait_for=wait)
        recorder.copy(self.queue, self.data, src.data, byte_count=self.nbytes, wait_for=wait)
        foreign_use(src, ev)
        return self

    def fill_(self, value) -> Tensor:
        """Set every element to ``value``, in place (enqueued)."""
        pattern = np.array([value], dtype=self.dtype)
        cl.enqueue_fill_buffer(self.queue, self.data, pattern, 0, self.size * self.itemsize)
        recorder.fill(self.queue, self.data, pattern, 0, self.size * self.itemsize)
        return self

    # -- properties --------------------------------------------------------------------
    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def context(self) -> cl.Context:
        return self.queue.context

    @property
    def device(self) -> cl.Device:
        return self.queue.device

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __getitem__(self, key) -> Tensor:
        """``t[key]``: basic indexing (ints, slices with steps, None, ...) into a new contiguous
        tensor, computed on this tensor's queue and never recorded (``tp.getitem`` records)."""
        from .kernels.strided import getitem     # kernels import this module: import late
        return getitem(self, key)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name})"


# -- cross-queue ordering ------------------------------------------------------------------
def check_same_context(op: str, *tensors: Tensor) -> None:
    ctx = tensors[0].queue.context
    for t in tensors[1:]:
        if t.queue.context != ctx:
            raise DeviceError(f"{op}: tensors live in different OpenCL contexts "
                              f"({tensors[0].shape} and {t.shape}); copy one across with "
                              "Tensor.from_host(queue, t.to_host())")


def check_same_queue(op: str, *tensors: Tensor) -> None:
    """Ops run on their inputs' queue: all inputs must share it."""
    q = tensors[0].queue
    for t in tensors[1:]:
        if t.queue is not q and t.queue != q:
            check_same_context(op, *tensors)
            raise DeviceError(f"{op}: inputs {tensors[0].shape} and {t.shape} are on different "
                              "command queues (different replicas?); ops run on one queue")


def foreign_wait(t: Tensor, queue: cl.CommandQueue) -> list[cl.Event] | None:
    """Events ``queue`` must wait for before it reads ``t`` (owned by another queue)."""
    if t.queue is queue or t.queue == queue:
        return None
    recorder.unsafe("work crosses command queues")
    return [cl.enqueue_marker(t.queue)]


def foreign_use(t: Tensor, event: cl.Event) -> None:
    """Order ``t``'s own queue after ``event`` (work another queue did on ``t``), so its pool
    never hands the buffer to new work while that event may still touch it."""
    if event is not None and event.get_info(cl.event_info.COMMAND_QUEUE) != t.queue:
        cl.enqueue_barrier(t.queue, wait_for=[event])
