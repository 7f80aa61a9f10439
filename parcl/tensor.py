"""``pc.Tensor``: a contiguous n-d array in an OpenCL buffer owned by one command queue.

A Tensor is a buffer, a shape and a dtype; it knows nothing of autograd. Its memory comes from
its queue's pool and goes back there when the last Tensor viewing it is dropped. Work is only
ever enqueued, never waited for, except in ``to_host``.
"""

from __future__ import annotations

import functools
from math import prod
from operator import index
from numbers import Real
from typing import Any, NamedTuple

import numpy as np
import pyopencl as cl

from . import recorder, runtime
from .errors import DeviceError, DTypeError, ParclError, ShapeError
from .crossqueue import foreign_use, foreign_wait
from .gate import transfer
from .pool import Allocation, pool_of
from .tensor_methods import COUNTS, TensorMethods, element_count
from .uploads import own

_new = object.__new__

FLOAT = np.dtype(np.float32)
_INTEGER = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint8))
LABEL_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
SUPPORTED = (FLOAT,) + LABEL_DTYPES
# Kernels' own buffers only (Tensor.empty): uint8 holds what backward needs in a byte, such as
# max pooling's index within each window; users cannot upload it.
INTERNAL = SUPPORTED + (np.dtype(np.uint8),)
# The most elements one tensor holds: parcl's kernels index a tensor with 32-bit ints (fast on
# every device), which wrap past 2**31 - 1 and read or write the wrong elements. Not every id
# of a launch is an element: launches are rounded up to whole work-groups and loops step by a
# group's width (a few thousand past the last element at most), so those ids must stay under
# 2**31 too; 2**16 of headroom keeps them there.
MAX_ELEMENTS = 2**31 - 2**16


def _check_size(op: str, shape, size: int) -> None:
    if size > MAX_ELEMENTS:
        raise ShapeError(f"{op}: shape {tuple(shape)} holds {size} elements, more than the "
                         f"{MAX_ELEMENTS} one parcl tensor holds (kernels index with 32-bit "
                         "ints, 2**31 - 1 at most, and launch ids a little past the last "
                         "element); split it")


def _check_dtype(op: str, dtype, allowed=SUPPORTED) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in allowed:
        raise DTypeError(f"{op}: dtype {dt} is not supported; parcl holds float32 data and "
                         f"int32/int64 labels and bool masks (convert with "
                         f".astype(np.float32))")
    return dt


def dims(op: str, shape) -> tuple[int, ...]:
    """``shape``'s sizes as Python ints. A size that is not an integer (``2.9``, ``2.0``) is a
    ``ShapeError``, as numpy and PyTorch refuse it, not truncated to another size."""
    try:
        return tuple(map(index, shape))
    except TypeError:
        raise ShapeError(f"{op}: sizes must be integers, got {tuple(shape)}") from None


def normalize_shape(op: str, shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = dims(op, shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{op}: negative dimension in shape {shape}")
    return shape



def joined_checks(a: tuple, b: tuple) -> tuple:
    """The checks of ``a`` and those of ``b`` not already in it (usually the same tuple)."""
    if a is b or not a:
        return b
    extra = tuple(c for c in b if c not in a)
    return a + extra if extra else a


def keep_checks(out, *inputs):
    """``out`` with its inputs' pending device-side checks added to its own (an embedding's
    index range, a loss's labels: ``Tensor.checks``), so a value computed from a bad input
    raises at its host read whichever way it was computed. Returns ``out``."""
    for t in inputs:
        if isinstance(t, Tensor) and t.checks:
            out.checks = joined_checks(out.checks, t.checks)
    return out


class SortResult(NamedTuple):
    """The ``(values, indices)`` of ``sort``, ``topk`` and ``max(dim)``, as
    ``torch.return_types``: the values (a Node when recorded) and their int64 indices along
    the dim."""

    values: Any
    indices: Tensor


def _keeps_checks(method):
    """A Tensor operator or method whose result keeps the operands' pending checks."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if isinstance(out, Tensor) and (self.checks or any(
                isinstance(a, Tensor) and a.checks for a in args)):
            keep_checks(out, self, *args)
        return out
    return run


def identity(op: str, a, b):
    """``a == b`` (``op``) for a Tensor or Node ``a``: identity, as an object's, but a
    ``TypeError`` where ``b`` is an array, a number or a sequence, whose values PyTorch would
    compare: ``np.mean(predicted == labels)`` was a silent accuracy of 0.0."""
    if isinstance(b, (np.ndarray, np.generic, Real, list, tuple)):
        raise TypeError(f"{type(a).__name__} {op} {type(b).__name__}: parcl's {op} compares "
                        f"identity, not values (a tensor stays hashable); compare values with "
                        f"tp.eq(a, b) / tp.ne(a, b) (a 0/1 mask on the device) or on the host "
                        f"with a.to_host() {op} b")
    return a is b if isinstance(b, type(a)) else NotImplemented


def _dims(op: str, dim, keepdim, axis, keepdims) -> tuple:
    """A reduction method's ``(dim, keepdim)`` from PyTorch's names or numpy's."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"pc.Tensor.{op}: axis and dim given both")
        dim = axis
    return dim, keepdim if keepdims is None else keepdims


def every_dim_if_empty(dim):
    """PyTorch's ``sum``/``mean`` read ``dim=()`` as every dim (numpy's ``axis=()`` is none),
    as a recorded Node's methods do: the same model code reduces alike under ``no_grad``."""
    return None if isinstance(dim, (tuple, list)) and not dim else dim


class Tensor(TensorMethods):
    """A device array: ``shape``, ``dtype``, ``size``, ``queue``; contiguous, row-major.

    >>> import numpy as np, parcl as pc
    >>> q = pc.default_queue()
    >>> t = pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> t.reshape(3, 2).to_host().shape
    (3, 2)
    >>> float((t * 2 + 1).sum()), int(t.argmax()), np.asarray(t.T).shape   # never recorded
    (36.0, 5, (3, 2))
    """

    __slots__ = ("queue", "shape", "size", "dtype", "data", "_alloc", "_keep", "checks",
                 "__weakref__")

    def __init__(self, queue: cl.CommandQueue, shape, dtype, data: cl.Buffer,
                 alloc: Allocation | None, keep=None):
        self.queue = queue
        count = COUNTS.get(shape)          # ``size`` is read by every launch: computed once
        if count is None:
            count = element_count(shape)
        self.shape, self.size = count.shape, count
        self.dtype = dtype
        self.data = data          # the cl.Buffer kernels read and write (offset 0)
        self._alloc = alloc       # keeps the pooled memory on loan while this view lives
        self._keep = keep         # a pending upload's event (holds the host array alive)
        # Callables ``to_host`` runs before reading (e.g. a label range an op checked on the
        # device): an op whose input was bad raises at the first read of what it produced.
        self.checks = ()

    # -- construction ------------------------------------------------------------------
    @classmethod
    def empty(cls, queue: cl.CommandQueue, shape, dtype=np.float32) -> Tensor:
        """Uninitialised tensor from ``queue``'s memory pool."""
        float32 = dtype is np.float32 or dtype is FLOAT   # or a tensor's (``x.dtype``)
        try:
            count = COUNTS.get(shape) if type(shape) is tuple else None
        except TypeError:              # an unhashable size: refused below
            count = None
        if count is not None and (count.shape is shape or type(prod(shape)) is int):
            # the hot path: a shape met before (checked then), given as that very tuple or an
            # equal one of ints (2.0 and numpy's 2 are equal to 2 too)
            dt = FLOAT if float32 else _check_dtype("Tensor.empty", dtype, INTERNAL)
        else:
            size = prod(shape) if type(shape) is tuple else None
            if (float32 and type(size) is int and size <= MAX_ELEMENTS
                    and not (shape and min(shape) < 0)):
                dt = FLOAT             # kernels allocating their float32 outputs
            else:         # another dtype or shape type, numpy or float sizes, a negative size
                dt = _check_dtype("Tensor.empty", dtype, INTERNAL)
                shape = normalize_shape("Tensor.empty", shape)     # refuses negative dimensions
                _check_size("Tensor.empty", shape, prod(shape))
                count = None
            if count is None:          # a shape met for the first time (or not as a tuple)
                count = element_count(shape)
        shape, size = count.shape, count
        try:
            pool = queue.pool          # a parcl Queue's own
        except AttributeError:
            pool = pool_of(queue)
        alloc = pool.allocate((size or 1) * dt.itemsize)
        t = _new(cls)                  # __init__'s fields, with the size known already
        t.queue, t.shape, t.size, t.dtype = queue, shape, size, dt
        t.data, t._alloc, t._keep, t.checks = alloc.buffer, alloc, None, ()
        return t

    @classmethod
    def zeros(cls, queue: cl.CommandQueue, shape, dtype=np.float32) -> Tensor:
        """Zero-filled tensor from ``queue``'s memory pool."""
        t = cls.empty(queue, shape, dtype)
        t.fill_owned(0)
        return t

    @classmethod
    def full(cls, queue: cl.CommandQueue, shape, value: float, dtype=np.float32) -> Tensor:
        t = cls.empty(queue, shape, dtype)
        t.fill_owned(value)
        return t

    @classmethod
    def from_host(cls, queue: cl.CommandQueue, array, *, borrow: bool = False) -> Tensor:
        """Device copy of a numpy array (float32 data, int32/int64 labels, ``np.bool_`` masks
        stored as uint8 0/1).

        The array may be changed or freed as soon as this returns: the copy is enqueued, not
        waited for, from a host copy that parcl owns (``snapshot``). ``borrow=True`` skips
        that host copy for a caller that keeps ``array`` unchanged until the copy is done
        (it waits for something enqueued after it on ``queue``, as ``ReplicaGroup.step``
        waits for its losses). Other dtypes are a ``TypeError`` and a zero-size array a
        ``ShapeError``.
        """
        converted = False               # a conversion's result is parcl's own copy already
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
            if array.dtype == np.float64:
                array, converted = array.astype(np.float32), True
        if array.dtype == np.bool_:     # masks: held as uint8 0/1 on the device
            array, dt, converted = array.astype(np.uint8), np.dtype(np.uint8), True
        else:
            dt = _check_dtype("Tensor.from_host", array.dtype)
        if array.size == 0:
            raise ShapeError(f"Tensor.from_host: zero-size array of shape {array.shape}; "
                             "parcl tensors hold at least one element")
        _check_size("Tensor.from_host", array.shape, array.size)
        host = own(array, borrow or converted)
        t = cls.empty(queue, host.shape, dt)
        event = transfer(queue, t.data, host)
        recorder.copy(queue, t.data, host)
        t._keep = event           # pyopencl's event keeps `host` alive until the copy is done
        return t

    # -- views and copies --------------------------------------------------------------
    def reshape(self, *shape) -> Tensor:
        """Zero-copy view with a new shape; one dimension may be -1."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        if shape == self.shape:                 # the ops' frequent no-op view
            view = Tensor(self.queue, self.shape, self.dtype, self.data, self._alloc, self._keep)
            view.checks = self.checks
            return view
        shape = dims("reshape", shape)
        if shape and min(shape) < 0:
            if shape.count(-1) > 1 or min(shape) < -1:
                raise ShapeError(f"reshape: at most one -1 and no other negative size in "
                                 f"{shape}")
            known = -prod(shape)               # the product of the other sizes
            if known == 0 or self.size % known:
                raise ShapeError(f"reshape: cannot view {self.shape} as {shape}")
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if prod(shape) != self.size:
            raise ShapeError(f"reshape: cannot view {self.shape} ({self.size} elements) "
                             f"as {shape} ({prod(shape)} elements)")
        view = Tensor(self.queue, shape, self.dtype, self.data, self._alloc, self._keep)
        view.checks = self.checks
        return view

    def view(self, *shape) -> Tensor:
        """PyTorch's ``t.view(*shape)``: ``reshape`` (parcl's tensors are contiguous, so it
        is always a view)."""
        return self.reshape(*shape)

    def view_of(self, buffer: cl.Buffer, shape) -> Tensor:
        """A tensor over ``buffer`` (e.g. a sub-buffer of this one) that keeps this alive."""
        return Tensor(self.queue, tuple(shape), self.dtype, buffer, self)

    def to_host(self, timeout: float = runtime.WAIT_TIMEOUT) -> np.ndarray:
        """A numpy copy; blocks until every enqueued write to this tensor is done, for at most
        ``timeout`` seconds (past it the process ends, naming the read and its thread:
        ``runtime.watched``). Runs ``checks`` first (they raise the error of an op
        that found its input bad)."""
        recorder.unsafe("a value was read back to the host (to_host/item)")
        for check in self.checks:
            check()
        out = np.empty(self.shape, self.dtype)
        # behind a hung kernel the copy would wait for ever: watched, it ends the process
        with runtime.watched(timeout, "Tensor.to_host"):
            cl.enqueue_copy(self.queue, out, self.data, is_blocking=True)
        return out

    def item(self) -> float:
        if self.size != 1:
            raise ShapeError(f"item: tensor of shape {self.shape} has {self.size} elements, "
                             "not one")
        return self.to_host().reshape(()).item()

    def copy(self) -> Tensor:
        out = Tensor.empty(self.queue, self.shape, self.dtype)
        if self.size:                   # OpenCL refuses a copy of no bytes (a slice t[2:2])
            cl.enqueue_copy(self.queue, out.data, self.data, byte_count=self.nbytes)
            recorder.copy(self.queue, out.data, self.data, byte_count=self.nbytes)
        out.checks = self.checks
        return out

    def __deepcopy__(self, memo: dict) -> Tensor:
        """``copy.deepcopy``: a device copy on the same queue, as PyTorch's. Without it the
        queue refused to be copied, and a model's ``copy.deepcopy`` shared a tensor it held
        in a tuple or a config object (``parcl.nn.clone`` shares what cannot be copied)."""
        return self.copy()

    def copy_(self, src: Tensor) -> Tensor:
        """Copy ``src`` (same shape and dtype, same context) into this tensor, in place."""
        self.not_a_copy("copy_")
        if tuple(src.shape) != tuple(self.shape):
            raise ShapeError(f"copy_: source of shape {src.shape} into a tensor of shape "
                             f"{self.shape}; reshape it first if the layout is meant")
        self.copy_owned(src)
        self._overwritten("Tensor.copy_")
        if src.data != self.data:       # every element is src's now: its checks, not ours
            self.checks = ()
        return keep_checks(self, src)

    def fill_(self, value) -> Tensor:
        """Set every element to ``value``, in place (enqueued)."""
        self.not_a_copy("fill_")
        self.fill_owned(value)
        self._overwritten("Tensor.fill_")
        return self

    def copy_owned(self, src: Tensor) -> None:
        """``copy_`` for parcl's own buffers that no recorded op can have saved (a new
        tensor, a gradient bucket): not noted as an overwrite (``MemoryPool.overwrites``),
        so no backward has to look for it."""
        if src.size != self.size or src.dtype != self.dtype:
            raise ShapeError(f"copy_: source {src.shape} {src.dtype} does not fit "
                             f"{self.shape} {self.dtype}")
        check_same_context("copy_", self, src)
        if src.data == self.data or not self.size:     # itself (or a view of it), or no
            return      # elements: nothing to copy, as PyTorch's; OpenCL refuses either copy
        wait = foreign_wait(src, self.queue)
        ev = cl.enqueue_copy(self.queue, self.data, src.data, byte_count=self.nbytes,
                             wait_for=wait)
        recorder.copy(self.queue, self.data, src.data, byte_count=self.nbytes, wait_for=wait)
        foreign_use(src, ev)

    def fill_owned(self, value) -> None:
        """``fill_`` for parcl's own buffers, not noted as an overwrite (see ``copy_owned``)."""
        if np.ndim(value) != 0:
            raise ShapeError(f"fill_: the value must be a scalar, got shape {np.shape(value)} "
                             f"(for a tensor of shape {self.shape})")
        pattern = np.array([value], dtype=self.dtype)
        cl.enqueue_fill_buffer(self.queue, self.data, pattern, 0, self.size * self.itemsize)
        recorder.fill(self.queue, self.data, pattern, 0, self.size * self.itemsize)
        self.checks = ()                # no element is what a check guarded any more

    def not_a_copy(self, what: str) -> None:
        """Refuse an in-place write (``what``) into a basic-indexing result (or a narrow,
        select, chunk, transpose, ...): parcl's is a copy where PyTorch's is a view, so the
        write would not reach the tensor it came from."""
        copies = pool_of(self.queue).copies
        if copies and self._alloc in copies:
            made = copies[self._alloc]           # a text, or (a template, its index key)
            made = made if isinstance(made, str) else made[0].format(made[1])
            raise ParclError(
                f"{what}: this tensor {self.shape} is {made}, a copy in "
                f"parcl where PyTorch's is a view, so "
                f"writing into it in place would leave the tensor it came from as it was; "
                f"write into that tensor instead: t[key] = value (t[key] = t[key] + v for "
                f"t[key] += v), or take t[key].copy() for a tensor of its own")

    def __setitem__(self, key, value) -> None:
        """``t[key] = value``: the elements basic indexing selects (ints, slices, None,
        ...) get ``value``, a number or a tensor broadcast to them (``t[mask] = number``:
        ``masked_fill``, see ``_mask_fill``), in place (noted, as
        ``copy_``: a backward through an op that saved ``t`` raises)."""
        from .kernels.strided import setitem     # kernels import this module: import late
        self.not_a_copy("setitem")
        written_into = getattr(value, "check_written_into", None)      # a tp.Node's
        if written_into is not None:
            written_into("setitem", self.shape, key)
        value = getattr(value, "value", value)           # a tp.Node's
        if self._mask_fill(key, value):
            return
        if isinstance(value, np.ndarray):
            value = Tensor.from_host(self.queue, value.astype(self.dtype, copy=False))
        setitem(self, key, value)
        self._overwritten("Tensor.__setitem__")
        if isinstance(value, Tensor) and value.checks:
            keep_checks(self, value)

    def _mask_fill(self, key, value) -> bool:
        """``t[mask] = number`` (nanoGPT's ``logits[logits < v[:, [-1]]] = -float('Inf')``):
        a mask (a float32 0/1 tensor, parcl's comparison result, or a bool array or tensor)
        of ``t``'s shape is ``masked_fill`` in place; False where ``key`` is no mask."""
        mask = getattr(key, "value", key)                # a tp.Node's
        if isinstance(mask, np.ndarray) and mask.dtype == np.bool_:
            mask = Tensor.from_host(self.queue, mask.astype(np.float32))
        if not isinstance(mask, Tensor) or mask.dtype not in (np.float32, np.uint8):
            return False                                 # an int index: refused by setitem
        if mask.shape != self.shape:
            raise ShapeError(f"setitem: a mask of shape {mask.shape} into a tensor of shape "
                             f"{self.shape}; t[mask] = number takes a mask of t's shape "
                             "(use t.masked_fill(mask, value) to broadcast one)")
        shape = value.shape if isinstance(value, Tensor) else np.shape(value)
        if shape != ():
            raise ShapeError(f"setitem: t[mask] = value takes a number or a 0-d tensor, got "
                             f"shape {shape} (t and mask of shape {self.shape})")
        from .kernels.strided import View, copy_view
        whole = View.contiguous(self.shape)
        copy_view(self, whole, self.masked_fill(mask, value), whole)
        self._overwritten("Tensor.__setitem__")
        return True

    def _overwritten(self, what: str) -> None:
        # a backward through an op recorded before now that saved this buffer raises
        pool_of(self.queue).note_overwrite(self.data, what, update=True)

    # -- properties --------------------------------------------------------------------
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

    def __iter__(self):
        """``for row in t``: ``t[0], t[1], ...``. A 0-d tensor is a TypeError, as numpy's:
        Python's fallback (``__getitem__`` until an IndexError) made ``list(t)`` of one ``[]``,
        silently."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __contains__(self, value) -> bool:
        """``v in t``: whether an element equals ``v`` (a host read that blocks), numpy's
        ``(t == v).any()``. Python's fallback compared each row to ``v`` by identity (no
        ``__eq__``): always False."""
        # np.asarray: a Tensor or tp.Node operand read to the host too
        return bool((self.to_host() == np.asarray(value)).any())

    @_keeps_checks
    def __getitem__(self, key) -> Tensor:
        """``t[key]``: basic indexing (ints, slices with steps, None, ...; and one 1-D int
        list/array/tensor in one position, ``t[:, [-1]]``) into a new contiguous tensor,
        computed on this tensor's queue and never recorded (``tp.getitem`` records)."""
        from .kernels.strided import getitem     # kernels import this module: import late
        return getitem(self, key)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name})"

    # -- PyTorch conveniences: host values, operators, methods ---------------------------
    # Computed on this tensor's queue and never recorded (a Tensor knows nothing of autograd;
    # an operand that is a tp.Node makes the Node's operator run instead, which records).
    # The kernels layer sits above the runtime, so it is imported inside each method.
    __array_priority__ = 1000       # `ndarray + tensor` defers to Tensor (which refuses it)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        """``bool(t)``, ``if t:``: a one-element tensor's value (blocks), as numpy's and
        PyTorch's. Without it Python took ``len(t)``, so ``bool`` of a ``[0.0]`` was True and
        that of any (2, 3) tensor True, where both are an error."""
        if self.size != 1:
            raise ValueError(f"bool: the truth value of a tensor of shape {self.shape} "
                             f"({self.size} elements) is ambiguous; reduce it first "
                             "(t.max(), t.sum())")
        return bool(self.item())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(t)``: a host copy (blocks until ready), as ``to_host``."""
        if copy is False:
            raise ValueError("np.asarray(pc.Tensor, copy=False): a device tensor cannot be "
                             "viewed from the host without a copy")
        host = self.to_host()
        return host if dtype is None else host.astype(dtype, copy=False)

    def _binary(self, op: str, a, b, out: Tensor | None = None):
        other = b if a is self else a
        # Python numbers and tensors first: the abstract-class check below is the slow one,
        # and a tp.Node on the other side (Tensor + Node under no_grad) comes here first
        if type(other) is not float and type(other) is not int and not isinstance(other,
                                                                               Tensor):
            if getattr(other, "__array_priority__", 0.0) > 0.0:
                # ranked above arrays (numpy's convention; a tp.Node): its reflected operator
                # takes the mix, without the slow abstract-class checks below
                return NotImplemented
            if isinstance(other, np.ndarray):
                raise TypeError(f"pc.Tensor {op}: a numpy array operand; upload it first "
                                "(pc.Tensor.from_host(t.queue, array)) or compute on the "
                                "host (np.asarray(t))")
            if isinstance(other, np.bool_):
                # refused here: numpy's reflected operator would read the tensor to the host
                # and return an ndarray (``t += np.True_`` rebinding t to it)
                raise TypeError(f"pc.Tensor {op}: a bool operand ({other!r}); booleans are "
                                "not numbers to parcl's ops (nor is a Python bool): pass "
                                "float(b)")
            if not isinstance(other, (Real, np.number)) or isinstance(other, bool):
                return NotImplemented
        from .kernels import elementwise as ew
        res = ew.binary(op, a, b, out=out)
        if self.checks or (type(other) is Tensor and other.checks):   # (inline: a hot path)
            keep_checks(res, a, b)
        return res

    def _inplace(self, op: str, symbol: str, other):
        """``self op= other`` into this tensor's own buffer, as PyTorch's and numpy's: its
        aliases (a reshape view, a Node's value, a module's parameter) see the change. Without
        these operators Python fell back to ``self = self op other``, a new tensor that left
        every alias as it was, silently. The result must keep this tensor's shape and dtype
        (float32): a broadcast that grows it is a ``ShapeError``, an int tensor a
        ``DTypeError``. A ``tp.Node`` operand gives its value (an op on a Tensor records
        nothing): its reflected operator made a new tensor or Node, the rebinding again."""
        self.not_a_copy(f"Tensor {symbol}")
        value = getattr(other, "value", None)
        if isinstance(value, Tensor) and not isinstance(other, Tensor):
            other = value
        res = self._binary(op, self, other, out=self)
        if res is not NotImplemented:
            self._overwritten(f"Tensor {symbol}")   # a backward that saved it raises
        return res

    def __iadd__(self, other):
        return self._inplace("add", "+=", other)

    def __isub__(self, other):
        return self._inplace("sub", "-=", other)

    def __imul__(self, other):
        return self._inplace("mul", "*=", other)

    def __itruediv__(self, other):
        return self._inplace("div", "/=", other)

    def __ipow__(self, other):
        return self._inplace("pow", "**=", other)

    def __add__(self, other):
        return self._binary("add", self, other)

    def __radd__(self, other):
        return self._binary("add", other, self)

    def __sub__(self, other):
        return self._binary("sub", self, other)

    def __rsub__(self, other):
        return self._binary("sub", other, self)

    def __mul__(self, other):
        return self._binary("mul", self, other)

    def __rmul__(self, other):
        return self._binary("mul", other, self)

    def __truediv__(self, other):
        return self._binary("div", self, other)

    def __rtruediv__(self, other):
        return self._binary("div", other, self)

    def __pow__(self, other):
        return self._binary("pow", self, other)

    def __rpow__(self, other):
        return self._binary("pow", other, self)

    # ``==`` and ``!=`` compare identity (Tensors stay hashable, and ``t in list`` works);
    # against an array or a number, where PyTorch compares values, they raise (``identity``)
    def __eq__(self, other):
        return identity("==", self, other)

    def __ne__(self, other):
        result = identity("!=", self, other)
        return result if result is NotImplemented else not result

    __hash__ = object.__hash__

    # float32 0/1 masks (parcl's masks, as tp.where takes them), not PyTorch's bool tensors
    def __lt__(self, other):
        return self._compare("lt", other)

    def __le__(self, other):
        return self._compare("le", other)

    def __gt__(self, other):
        return self._compare("gt", other)

    def __ge__(self, other):
        return self._compare("ge", other)

    def eq(self, other):
        """``torch.Tensor.eq``: a float32 0/1 mask (``==`` itself compares identity)."""
        return self._compare("eq", other)

    def ne(self, other):
        return self._compare("ne", other)

    def lt(self, other):
        return self._compare("lt", other)

    def le(self, other):
        return self._compare("le", other)

    def gt(self, other):
        return self._compare("gt", other)

    def ge(self, other):
        return self._compare("ge", other)

    def _compare(self, op: str, other):
        """``self op other`` as a float32 mask; integer tensors (labels) compare exactly
        (``parcl.kernels.compare``), float32 ones through the elementwise kernels."""
        if self.dtype in _INTEGER or type(other) is Tensor and other.dtype in _INTEGER:
            from .kernels import compare
            return keep_checks(compare.compare(op, self, other), self, other)
        return self._binary(op, self, other)

    @_keeps_checks
    def __neg__(self) -> Tensor:
        from .kernels import elementwise as ew
        return ew.unary("neg", self)

    def __matmul__(self, other):
        """numpy's matmul: 1-D, 2-D, and batched over any leading dims with broadcasting
        (``(B, H, T, D) @ (B, H, D, T)``), tp.matmul's kernels and bits."""
        if isinstance(other, np.ndarray):
            return self._binary("matmul", self, other)          # the clear TypeError
        if not isinstance(other, Tensor):
            return NotImplemented
        from .kernels.matmul import matmul
        out = matmul(self, other)
        return keep_checks(out, self, other) if self.checks or other.checks else out

    @_keeps_checks
    def exp(self) -> Tensor:
        from .kernels import elementwise as ew
        return ew.unary("exp", self)

    @_keeps_checks
    def log(self) -> Tensor:
        from .kernels import elementwise as ew
        return ew.unary("log", self)

    # The reductions take PyTorch's ``dim``/``keepdim`` and numpy's ``axis``/``keepdims``
    # alike (PyTorch accepts both), so code written for either reads the same on a raw Tensor.
    @_keeps_checks
    def sum(self, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A003
            keepdims: bool | None = None) -> Tensor:
        from .kernels import reduction
        dim, keepdim = _dims("sum", every_dim_if_empty(dim), keepdim, axis, keepdims)
        return reduction.sum(self, dim, keepdim)

    @_keeps_checks
    def mean(self, dim=None, keepdim: bool = False, *, axis=None,
             keepdims: bool | None = None) -> Tensor:
        from .kernels import reduction
        dim, keepdim = _dims("mean", every_dim_if_empty(dim), keepdim, axis, keepdims)
        return reduction.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A003
            keepdims: bool | None = None):
        """``t.max()``: the largest element; ``t.max(dim)``: ``(values, indices)`` along
        ``dim``, as ``torch.Tensor.max`` and a recorded Node's ``max``, so an evaluation
        loop's ``_, predicted = logits.max(1)`` means the same under ``no_grad``;
        ``t.max(other)`` of a tensor ``other``: the elementwise maximum."""
        dim, keepdim = _dims("max", dim, keepdim, axis, keepdims)
        return self._extreme("max", dim, keepdim)

    def min(self, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A003
            keepdims: bool | None = None):
        """``t.min()``: the smallest element; ``t.min(dim)``: ``(values, indices)`` along
        ``dim``; ``t.min(other)``: the elementwise minimum; as ``torch.Tensor.min``."""
        dim, keepdim = _dims("min", dim, keepdim, axis, keepdims)
        return self._extreme("min", dim, keepdim)

    def _extreme(self, op: str, dim, keepdim: bool):
        """torch.Tensor.max's / min's overloads, as a recorded Node's (``tp.max``)."""
        from .kernels import reduction
        from .kernels.strided import axis_int
        if isinstance(dim, Tensor):
            return self._binary("maximum" if op == "max" else "minimum", self, dim)
        if dim is None:
            if op == "max":
                return keep_checks(reduction.max(self, None, keepdim), self)
            return keep_checks(reduction.min(self, None, keepdim, op=op), self)
        dim = axis_int(op, dim, self.shape)             # one dim, as torch's (no tuple)
        values, indices = reduction.first_extreme(self, dim, op == "min", op)   # one kernel
        if keepdim:
            axes = reduction.normalize_axes(op, dim, self.ndim, self.shape)
            shape = reduction.reduced_shape(self.shape, axes, True)
            values, indices = values.reshape(shape), indices.reshape(shape)
        return SortResult(keep_checks(values, self), keep_checks(indices, self))

    @_keeps_checks
    def amax(self, dim=None, keepdim: bool = False, *, axis=None,
             keepdims: bool | None = None) -> Tensor:
        """``torch.Tensor.amax``: the largest element over ``dim`` (None or ``()``: every
        dim; an int or a tuple), the values alone; NaN propagates."""
        from .kernels import reduction
        dim, keepdim = _dims("amax", every_dim_if_empty(dim), keepdim, axis, keepdims)
        reduction.normalize_axes("amax", dim, self.ndim, self.shape)  # errors naming amax
        return reduction.max(self, dim, keepdim)

    @_keeps_checks
    def amin(self, dim=None, keepdim: bool = False, *, axis=None,
             keepdims: bool | None = None) -> Tensor:
        """``torch.Tensor.amin``: the smallest element over ``dim``, as ``amax``."""
        from .kernels import reduction
        dim, keepdim = _dims("amin", every_dim_if_empty(dim), keepdim, axis, keepdims)
        return reduction.min(self, dim, keepdim, op="amin")

    @_keeps_checks
    def argmax(self, dim: int | None = None, keepdim: bool = False, *, axis=None,
               keepdims: bool | None = None) -> Tensor:
        """int64 index of the first largest element (``dim=None``: of the flattened tensor)."""
        dim, keepdim = _dims("argmax", dim, keepdim, axis, keepdims)
        return self._arg("argmax", dim, keepdim, lowest=False)

    @_keeps_checks
    def argmin(self, dim: int | None = None, keepdim: bool = False, *, axis=None,
               keepdims: bool | None = None) -> Tensor:
        """int64 index of the first smallest element (``dim=None``: of the flattened tensor);
        a NaN is the smallest, as PyTorch's."""
        dim, keepdim = _dims("argmin", dim, keepdim, axis, keepdims)
        return self._arg("argmin", dim, keepdim, lowest=True)

    def _arg(self, op: str, dim, keepdim: bool, lowest: bool) -> Tensor:
        """The argmax (argmin where ``lowest``) of this tensor in this shape."""
        from .kernels import reduction
        from .kernels.strided import axis_int
        if dim is None:
            out = reduction.argmax(self.reshape(-1), 0, op=op, lowest=lowest)
            return out.reshape((1,) * self.ndim) if keepdim else out
        dim = axis_int(op, dim, self.shape)             # one dim, as torch's (no tuple)
        out = reduction.argmax(self, dim, op=op, lowest=lowest)
        if keepdim and self.ndim:          # a 0-d tensor keeps no dim (as PyTorch's)
            ax = dim % self.ndim
            out = out.reshape(*self.shape[:ax], 1, *self.shape[ax + 1:])
        return out

    def var(self, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
            correction: float | None = None) -> Tensor:
        """``torch.Tensor.var``: ``(dim, unbiased, keepdim)`` by position, ``correction`` by
        keyword (1 by default: unbiased); ``t.var(False)`` is ``unbiased`` alone, and ``()``
        every dim, as a recorded Node's; tp.var's bits."""
        return self._variance("var", dim, unbiased, keepdim, correction, root=False)

    def std(self, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
            correction: float | None = None) -> Tensor:
        """``torch.Tensor.std``: the square root of ``var``'s."""
        return self._variance("std", dim, unbiased, keepdim, correction, root=True)

    @_keeps_checks
    def _variance(self, op: str, dim, unbiased, keepdim, correction, root: bool) -> Tensor:
        from .kernels.moments import correction_of, unbiased_alone, variance
        dim, unbiased = unbiased_alone(dim, unbiased)      # torch's overload of one bool
        return variance(op, self, every_dim_if_empty(dim), bool(keepdim),
                        correction_of(op, unbiased, correction), root)[0]

    @_keeps_checks
    def softmax(self, dim: int) -> Tensor:
        """``torch.Tensor.softmax``: along ``dim``, tp.softmax's kernel (the same bits)."""
        from .kernels.softmax import softmax_forward
        from .kernels.strided import axis_int
        return softmax_forward(self, axis_int("softmax", dim, self.shape))

    @_keeps_checks
    def log_softmax(self, dim: int) -> Tensor:
        from .kernels.softmax import softmax_forward
        from .kernels.strided import axis_int
        return softmax_forward(self, axis_int("log_softmax", dim, self.shape), log=True)

    def all(self, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A003
        """``torch.Tensor.all``: 1 where every element over ``dim`` (None: all; an int or a
        tuple; ``()`` none, as PyTorch's) is nonzero (NaN is), else 0: a float32 mask, as
        tp.all's."""
        return self._truth("all", dim, keepdim, every=True)

    def any(self, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A003
        """``torch.Tensor.any``: 1 where some element over ``dim`` is nonzero, as tp.any's."""
        return self._truth("any", dim, keepdim, every=False)

    @_keeps_checks
    def _truth(self, op: str, dim, keepdim: bool, every: bool) -> Tensor:
        from .kernels import elementwise as ew
        from .kernels import reduction
        ew.check_float(op, self)
        # over no elements no hit (a sum of nothing: any 0, all 1, as PyTorch's), where a
        # max of nothing is an error
        count = reduction.max if self.size else reduction.sum
        hit = count(ew.scalar("eq" if every else "ne", self, 0.0), dim, bool(keepdim))
        return ew.scalar("rsub", hit, 1.0, out=hit) if every else hit

    @property
    def T(self) -> Tensor:  # noqa: N802
        """The axes reversed (a new contiguous tensor), as ``ndarray.T``."""
        from .kernels import layout, strided
        return keep_checks(strided.view_copy(layout.transpose(self), self, "T"), self)


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
