"""``TensorMethods``: torch.Tensor's shape and dtype methods of ``pc.Tensor`` (``size()``,
``transpose``, ``mT``, ``split``, ``masked_fill``, ``contiguous``, ``dim``, ``tolist``, ``to``,
``float``, ...), as a recorded ``tp.Node``'s (``parcl/tape/node_methods.py``) and on the same
kernels: the values of ops under ``tp.no_grad`` (evaluation, a model's ``generate``) are raw
Tensors, so model code written with torch's methods runs the same either way. Kept apart from
``tensor.py`` so that the array's data structure stays short; ``Tensor`` inherits them.

>>> import numpy as np, parcl as pc
>>> t = pc.Tensor.from_host(pc.default_queue(), np.zeros((2, 3, 4), np.float32))
>>> t.size(), t.size, t.transpose(1, 2).shape, [p.shape for p in t.split(3, dim=-1)]
((2, 3, 4), 24, (2, 4, 3), [(2, 3, 3), (2, 3, 1)])
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

import numpy as np

from .errors import DeviceError, DTypeError, ShapeError

if TYPE_CHECKING:
    from .tensor import Tensor


# the dtypes ``to``, ``float``, ``long`` and ``int`` convert between
CASTS = tuple(np.dtype(d) for d in (np.float32, np.int32, np.int64))


def _is_dtype(a) -> bool:
    try:
        np.dtype(a)
    except TypeError:
        return False
    return True


def device_name(a) -> bool:
    """Whether ``a`` names a device the torch way (``"cpu"``, ``"cuda:0"``, an object whose
    ``type`` is such a name, like ``torch.device``); a dtype name is not one."""
    name = a if isinstance(a, str) else getattr(a, "type", None)
    return isinstance(name, str) and name.split(":")[0] in ("cpu", "cuda", "mps", "xpu")


def to_arguments(what: str, x, args: tuple, dtype, device):
    """The dtype ``x.to(*args, dtype=, device=)`` asks for (None: its own), as
    torch.Tensor.to reads ``to(dtype)``, ``to(device, dtype)``, ``to(other)``: a device name
    changes nothing, as parcl places tensors by queue; ``x``'s own queue is taken, another
    queue is a DeviceError (``what``: the method, for the messages)."""
    for a in args:
        if isinstance(a, bool):          # to(dtype, non_blocking, copy) positionally
            continue
        if hasattr(a, "queue") and hasattr(a, "dtype"):           # a Tensor or a Node
            _same_queue(what, x, a.queue)
            dtype = a.dtype
        elif device_name(a) or not _is_dtype(a):
            device = a
        else:
            dtype = a
    if device is not None and not device_name(device):
        _same_queue(what, x, device)
    return dtype


def _same_queue(what: str, x, queue) -> None:
    if queue is not x.queue:
        raise DeviceError(f"{what}: {queue!r} is not this tensor's queue; parcl does not move "
                          "a tensor between queues (build the tensor on the queue it is used "
                          "on, e.g. a layer's queue=)")


def cast_dtype(what: str, x, dtype) -> np.dtype:
    """``dtype`` as one ``x`` (a Tensor or Node) converts to, or the error naming ``what``."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: {dtype!r} is neither a dtype nor a device") from None
    if dtype != x.dtype and (dtype not in CASTS or x.dtype not in CASTS):
        raise DTypeError(f"{what}: {x.dtype} to {dtype} is not supported (shape "
                         f"{tuple(x.shape)}); parcl's dtypes are float32, int32, int64")
    return dtype


class ElementCount(int):
    """``size`` of a Tensor or Node: the element count, an int as numpy's ``size`` (what
    parcl's code reads), that called is torch.Tensor's ``size()``: ``x.size()`` the shape
    tuple, ``x.size(d)`` the size of dim ``d`` (negative counting from the end).

    >>> import numpy as np, parcl as pc
    >>> x = pc.Tensor.from_host(pc.default_queue(), np.zeros((2, 3, 4), np.float32))
    >>> x.size, x.size(), x.size(-1)
    (24, (2, 3, 4), 4)
    """

    def __new__(cls, count, shape=()):
        obj = super().__new__(cls, count)
        obj.shape = tuple(shape)
        return obj

    def __call__(self, dim=None):
        shape = self.shape
        if dim is None:
            return shape
        n = len(shape)
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            raise TypeError(f"size: dim must be an int, got {type(dim).__name__}")
        if not -n <= dim < n:
            raise ShapeError(f"size: dim {dim} is out of range for a tensor of shape {shape} "
                             f"(expected a dim in [{-n}, {n - 1}])")
        return shape[dim]


# One ElementCount per shape, shared by every tensor of that shape (it is immutable): making
# one per tensor cost 0.45 us, a look-up here less than the ``prod(shape)`` it replaces. A
# program meets few shapes; past MAX_COUNTS (shapes made anew each step) the table restarts.
COUNTS: dict[tuple, ElementCount] = {}
MAX_COUNTS = 4096


def element_count(shape: tuple) -> ElementCount:
    """The ``size`` of a tensor of ``shape`` (checked sizes); its ``shape`` is the tuple a
    tensor of this shape holds."""
    count = COUNTS.get(shape)
    if count is None:
        if len(COUNTS) >= MAX_COUNTS:
            COUNTS.clear()
        shape = tuple(map(int, shape))     # (True, 3) or numpy sizes: held as Python ints
        count = COUNTS[shape] = ElementCount(prod(shape), shape)
    return count


class TensorMethods:
    """Mixed into ``pc.Tensor``; no state of its own."""

    __slots__ = ()

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """``t.transpose(dim0, dim1)``: two dims exchanged (a copy unless only size-1 dims
        move), as torch.Tensor's and tp.transpose's (``.T`` reverses every dim)."""
        from .kernels.layout import permuted
        from .kernels.strided import normalize_axis, view_copy
        from .tensor import keep_checks
        n, shape = self.ndim, self.shape
        # PyTorch's rule: negative from the end, and a 0-d tensor takes 0 and -1
        a, b = (normalize_axis("transpose", d, max(n, 1), shape) for d in (dim0, dim1))
        order = list(range(n))
        if n:
            order[a], order[b] = b, a
        return keep_checks(view_copy(permuted(self, tuple(order)), self, "permute"), self)

    swapaxes = swapdims = transpose

    @property
    def mT(self) -> Tensor:  # noqa: N802
        """The last two dims exchanged (a batch of matrices transposed), as torch's."""
        return self._matrices("mT")

    @property
    def mH(self) -> Tensor:  # noqa: N802
        """``mT``: parcl's tensors are real, so the conjugate transpose is the transpose."""
        return self._matrices("mH")

    def _matrices(self, what: str) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"pc.Tensor.{what}: a tensor of at least 2 dims, got shape "
                             f"{self.shape}")
        return self.transpose(-2, -1)

    def split(self, split_size, dim: int = 0) -> tuple:
        """``t.split(size_or_sections, dim)``: an int cuts along ``dim`` into pieces of that
        size (the last may be smaller), a list gives each piece's size; as torch.Tensor's and
        tp.split's."""
        from .kernels.strided import View, read_view, split_sizes, view_copy
        from .tensor import keep_checks
        axis, sizes = split_sizes(self.shape, split_size, dim)
        whole, pieces, start = View.contiguous(self.shape), [], 0
        for s in sizes:
            piece = read_view(self, whole.narrow(axis, start, s))
            pieces.append(keep_checks(view_copy(piece, self, "split"), self))
            start += s
        return tuple(pieces)

    def masked_fill(self, mask, value) -> Tensor:
        """``value`` (a number or a 0-d tensor) where ``mask`` (broadcast to this shape; a
        0/1 float mask, a bool array) is nonzero, this tensor elsewhere; as tp.masked_fill's."""
        from .kernels import select
        from .kernels.broadcast import broadcast_shapes
        from .tensor import Tensor, keep_checks
        if isinstance(mask, np.ndarray):
            mask = Tensor.from_host(self.queue, mask)
        elif not isinstance(mask, Tensor):
            mask = getattr(mask, "value", mask)           # a tp.Node's
            if not isinstance(mask, Tensor):
                raise TypeError(f"masked_fill: the mask must be a tensor or a numpy array, "
                                f"got {type(mask).__name__}")
        if broadcast_shapes("masked_fill", mask.shape, self.shape) != self.shape:
            raise ShapeError(f"masked_fill: mask of shape {mask.shape} does not broadcast to "
                             f"the input's shape {self.shape}")
        value = getattr(value, "value", value)            # a tp.Node's
        if isinstance(value, Tensor):
            if value.shape != ():
                raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, as "
                                 f"PyTorch's, got shape {value.shape} (input {self.shape})")
        else:
            value = Tensor.full(self.queue, (), float(value))
        return keep_checks(select.where(mask, value, self), self, mask, value)

    def contiguous(self, memory_format=None) -> Tensor:
        """The tensor itself: parcl's tensors are always contiguous."""
        return self

    def dim(self) -> int:
        """The number of dims (``ndim``), as torch.Tensor's."""
        return len(self.shape)

    def numel(self) -> int:
        """The number of elements, as torch.Tensor's (``size`` read as an int)."""
        return int(self.size)

    def tolist(self):
        """The values as nested Python lists (a number for a 0-d tensor), as torch's."""
        return self.to_host().tolist()

    def to(self, *args, dtype=None, device=None, non_blocking: bool = False,
           copy: bool = False, memory_format=None) -> Tensor:
        """torch.Tensor's ``to(dtype)``, ``to(device, dtype)``, ``to(other)``: a dtype
        converts (float32, int32, int64); a device name (``"cpu"``, ``"cuda:0"``) changes
        nothing, as parcl places tensors by queue; another queue is a DeviceError.
        ``copy=True`` gives a new tensor even where nothing changes."""
        dtype = to_arguments("pc.Tensor.to", self, args, dtype, device)
        out = self if dtype is None else self._cast("to", dtype)
        return out.copy() if copy and out is self else out

    def type_as(self, other) -> Tensor:
        """This tensor in ``other``'s dtype, as torch.Tensor's."""
        return self._cast("type_as", other.dtype)

    def float(self) -> Tensor:  # noqa: A003
        """As float32 (parcl's float type; torch's float), itself if it is one."""
        return self._cast("float", np.float32)

    def long(self) -> Tensor:
        """As int64."""
        return self._cast("long", np.int64)

    def int(self) -> Tensor:  # noqa: A003
        """As int32."""
        return self._cast("int", np.int32)

    def _cast(self, op: str, dtype) -> Tensor:
        from .kernels.counting import cast
        from .tensor import keep_checks
        dtype = cast_dtype(f"pc.Tensor.{op}", self, dtype)
        return self if dtype == self.dtype else keep_checks(cast(self, dtype), self)
