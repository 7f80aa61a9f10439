"""Indexing and layout ops over strided views: ``getitem`` (``x[key]``, basic indexing),
``flip``, ``pad`` (constant mode here; reflect, replicate and circular through
``index_select``), ``expand``; and ``gather`` (``torch.gather``).

Each forward copies a strided view of its input into a fresh contiguous tensor (see
``parcl.kernels.strided``); each backward is the same copy the other way: the gradient is
written into the selected view of a zero tensor (indexing and basic selections never repeat an
element, so the write needs no sums).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3)), True)
>>> with tp.Tape() as tape:
...     y = tp.sum(x[:, ::-2])
>>> tape.backward(y)
>>> x.grad.to_host()
array([[1., 0., 1.],
       [1., 0., 1.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...kernels import elementwise as ew
from ...kernels import strided
from ...kernels.reduction import sum_to_shape
from ...kernels.strided import View
from ...tensor import Tensor, dims
from ..node import Function
from .gather import gather
from .picks import constant, index_select
from .shape import wrap_dims
from .torch_names import torch_names

__all__ = ["expand", "flip", "gather", "getitem", "pad"]


class GetItem(Function):
    name = "getitem"

    def forward(self, x: Tensor, key=None):
        self.view = strided.parse_key("getitem", x.shape, key)
        self.in_shape = x.shape
        return strided.indexed_copy(strided.read_view(x, self.view), key)

    def backward(self, g: Tensor):
        return strided.write_view(g, self.in_shape, self.view)


def getitem(x, key, *, tape=None):
    """``x[key]`` with numpy's basic indexing: ints (negative from the end), slices with any
    step (negative too), ``None`` (a new size-1 axis) and one ``...``. The result is a new
    contiguous tensor; the backward writes the gradient into the selected positions of a zero
    tensor. ``x[key]`` on a Node or a ``pc.Tensor`` calls this. op_name ``"getitem"``.
    One 1-D int list, numpy array or int tensor in one position (``x[:, [-1], :]``) picks
    those entries along that dim, as PyTorch's advanced indexing: ``tp.index_select`` after
    the basic part (op_name ``"index_select"``; repeated entries add their gradients).

    >>> x[0, ::-1].shape, x[None, ..., 1].shape
    ((3,), (1, 2))
    """
    picked = strided.split_array_key("getitem", tuple(x.shape), key)
    if picked is None:
        return GetItem.apply(x, tape=tape, key=key)
    # one index array: x[basic] then index_select along its dim (PyTorch's advanced indexing
    # with one index array), both recorded with their backward
    basic, dim, index = picked
    if any(k is not Ellipsis and k != slice(None) for k in basic):    # not all of x
        x = GetItem.apply(x, tape=tape, key=basic)
    # uploaded per call, not kept as a constant: a shuffled index each step would fill the
    # queue's table of launch plans, and no plan would be kept after it
    return index_select(x, dim, Tensor.from_host(x.queue, index), tape=tape)


def _axes(op: str, axis, shape) -> tuple[int, ...]:
    """The dims to reverse, by PyTorch's rule (``wrap_dims``): a 0-d tensor's dim 0 or -1 is
    its one element, so none."""
    norm = wrap_dims(op, axis, len(shape), shape)
    return norm if shape else ()


class Flip(Function):
    name = "flip"

    def forward(self, x: Tensor, axis=0):
        self.axes = _axes("flip", axis, x.shape)
        return strided.read_view(x, View.contiguous(x.shape).flip(self.axes))

    def backward(self, g: Tensor):
        return strided.read_view(g, View.contiguous(g.shape).flip(self.axes))


@torch_names({"dims": "axis"})
def flip(x, axis, *, tape=None):
    """``x`` reversed along ``axis`` (an int or a tuple of ints), as ``torch.flip``.

    >>> tp.flip(x, -1).shape
    (2, 3)
    """
    return Flip.apply(x, tape=tape, axis=axis)


class Pad(Function):
    name = "pad"

    def forward(self, x: Tensor, pad=(), value: float = 0.0):
        pad = dims("pad", pad)
        if len(pad) % 2 or len(pad) // 2 > x.ndim:
            raise ShapeError(f"pad: padding {pad} must have an even length of at most "
                             f"2 * ndim = {2 * x.ndim} (input shape {x.shape})")
        out_shape = list(x.shape)
        spans = []                                   # (axis, in start, out start, length)
        for i in range(len(pad) // 2):
            axis = x.ndim - 1 - i
            left, right = pad[2 * i], pad[2 * i + 1]
            n = x.shape[axis]
            out_shape[axis] = n + left + right
            if out_shape[axis] < 0:
                raise ShapeError(f"pad: padding ({left}, {right}) of dimension {axis} (size "
                                 f"{n}) gives a negative size {out_shape[axis]} (input shape "
                                 f"{x.shape}, pad {pad})")
            # Negative pads crop the input itself (PyTorch narrows it first): cropping more
            # than the dimension holds is an error there, not a crop into the other side's pad
            if n + min(left, 0) + min(right, 0) < 0:
                raise ShapeError(f"pad: padding ({left}, {right}) of dimension {axis} crops "
                                 f"{-min(left, 0) - min(right, 0)} elements from a size of {n} "
                                 f"(input shape {x.shape}, pad {pad})")
            start, stop = max(0, -left), n - max(0, -right)
            spans.append((axis, start, max(0, left), max(0, stop - start)))
        kept, placed = View.contiguous(x.shape), View.contiguous(tuple(out_shape))
        for axis, start, out_start, length in spans:
            kept = kept.narrow(axis, start, length)
            placed = placed.narrow(axis, out_start, length)
        self.in_shape, self.kept, self.placed = x.shape, kept, placed
        self.cropped = kept.shape != x.shape
        out = Tensor.full(x.queue, tuple(out_shape), value, x.dtype)
        return strided.copy_view(out, placed, x, kept)

    def backward(self, g: Tensor):
        gx = (Tensor.zeros if self.cropped else Tensor.empty)(g.queue, self.in_shape)
        return strided.copy_view(gx, self.kept, g, self.placed)


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(x, pad, mode: str = "constant", value: float | None = None, *, tape=None):
    """``torch.nn.functional.pad``: ``pad`` is ``(left, right)`` of the last dimension, then
    ``(top, bottom)`` of the one before, ...; negative padding crops. The third argument is
    PyTorch's ``mode`` when a string, and parcl's fill value when a number (``pad(x, pad,
    0.5)``, the signature parcl has always had).

    ``mode="constant"`` fills the new positions with ``value`` (0 when None; their gradient
    is dropped), op_name ``"pad"``. ``"reflect"`` (mirrored without repeating the edge),
    ``"replicate"`` (the edge repeated) and ``"circular"`` (wrapped around) pad the last 1, 2
    or 3 dims of a ``(C, *)`` or ``(N, C, *)`` input, as PyTorch; each padded dim is an
    ``index_select`` of its source positions, so the gradient of a position copied several
    times is summed in a fixed order (bit-reproducible), op_name ``"index_select"``.

    >>> tp.pad(x, (1, 2)).shape, tp.pad(x, (0, 0, -1, 0)).shape
    ((2, 6), (1, 3))
    >>> tp.pad(x[None], (2, 1), mode="reflect").to_host()[0, 0]
    array([2., 1., 0., 1., 2., 1.], dtype=float32)
    """
    if mode is None or (isinstance(mode, (int, float, np.number)) and not isinstance(mode, bool)):
        if value is not None:
            raise ShapeError(f"pad: a fill value {mode!r} given third (where parcl has taken "
                             f"it) and value={value!r} too")
        mode, value = "constant", mode
    if not isinstance(mode, str) or mode not in PAD_MODES:
        raise ShapeError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    if mode == "constant":
        return Pad.apply(x, tape=tape, pad=tuple(pad),
                         value=0.0 if value is None else float(value))
    if value is not None and value != 0:
        raise ShapeError(f"pad: mode {mode!r} takes no fill value, got value={value!r} (as "
                         "PyTorch)")
    pad = dims("pad", pad)
    k = len(pad) // 2
    if len(pad) % 2 or k not in (1, 2, 3) or x.ndim not in (k + 1, k + 2):
        raise ShapeError(f"pad: mode {mode!r} pads the last 1, 2 or 3 dims of a (C, *) or "
                         f"(N, C, *) input; padding {pad} of length {len(pad)} needs a "
                         f"{k + 1}-D or {k + 2}-D input, got shape {tuple(x.shape)}")
    out = x
    for i in range(k):
        axis = x.ndim - 1 - i
        src = _pad_sources(mode, x.shape[axis], pad[2 * i], pad[2 * i + 1], axis, x.shape)
        # all pads 0: still an op, a new buffer as PyTorch's, so that an in-place change to
        # the output (+= under no_grad, relu(inplace=True)) leaves the input as it was
        if not np.array_equal(src, np.arange(x.shape[axis])) or i == k - 1 and out is x:
            out = index_select(out, axis, constant(x.queue, src), tape=tape)
    return out


def _pad_sources(mode: str, n: int, left: int, right: int, axis: int, shape) -> np.ndarray:
    """The input position each output position of a padded dim copies (``mode`` not
    constant), refused where PyTorch refuses it."""
    where = f"padding ({left}, {right}) of dimension {axis} (size {n}, input shape {shape})"
    if n == 0:
        raise ShapeError(f"pad: mode {mode!r} cannot pad an empty dimension: {where}")
    if mode == "reflect" and max(left, right) >= n:
        raise ShapeError(f"pad: mode 'reflect' needs padding smaller than the dimension: "
                         f"{where}")
    kept = n - max(0, -left) - max(0, -right)
    if mode == "circular" and max(left, right) > kept:
        # PyTorch copies each side from the cropped input: more than it holds is an
        # overlapping copy it refuses (or, where nothing is kept, uninitialised memory)
        raise ShapeError(f"pad: mode 'circular' wraps around at most once: padding at most "
                         f"the dimension's size after cropping ({kept}), got {where}")
    if n + min(left, 0) + min(right, 0) < 0:
        raise ShapeError(f"pad: {where} crops more than the dimension holds")
    if n + left + right < (0 if mode == "circular" else 1):
        raise ShapeError(f"pad: {where} leaves an output of size {n + left + right}")
    at = np.arange(-left, n + right, dtype=np.int64)
    if mode == "reflect":
        at = np.abs(at)
        at = np.where(at >= n, 2 * (n - 1) - at, at)
    elif mode == "replicate":
        at = np.clip(at, 0, n - 1)
    else:                       # wraps around the input left after any crop, as PyTorch
        start = max(0, -left)
        at = start + (at - start) % max(kept, 1)
    return at.astype(np.int32)


class Expand(Function):
    name = "expand"

    def forward(self, x: Tensor, shape=()):
        lead = len(shape) - x.ndim
        if lead < 0:
            raise ShapeError(f"expand: the target shape {shape} has fewer dimensions than the "
                             f"input {x.shape}")
        full = []
        for k, s in enumerate(shape):
            if s == -1:
                if k < lead:
                    raise ShapeError(f"expand: -1 is not allowed for the new leading "
                                     f"dimension {k} (target {shape}, input {x.shape})")
                s = x.shape[k - lead]
            elif k >= lead and x.shape[k - lead] not in (1, s):
                raise ShapeError(f"expand: dimension {k} of size {x.shape[k - lead]} cannot "
                                 f"expand to {s}; only size-1 dimensions expand (input "
                                 f"{x.shape}, target {shape})")
            full.append(int(s))
        self.in_shape = x.shape
        return strided.view_copy(ew.broadcast_to(x, tuple(full)), x, self.name)

    def backward(self, g: Tensor):
        return sum_to_shape(g, self.in_shape)


def expand(x, shape, *, tape=None):
    """``x`` broadcast to ``shape`` (numpy rules; ``-1`` keeps a dimension, new dimensions go
    in front), as ``torch.Tensor.expand`` but copied into a new contiguous tensor. The backward
    sums the gradient over the expanded dimensions. op_name ``"expand"``.

    >>> tp.expand(b, (4, -1)).shape        # b of shape (1, 3)
    (4, 3)
    """
    if isinstance(shape, int):
        shape = (shape,)
    return Expand.apply(x, tape=tape, shape=dims("expand", shape))
