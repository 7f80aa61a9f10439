"""PyTorch's ops along one dim: ``cumprod`` (a scan kernel, its gradient right where the
input holds zeros), ``diff`` (``narrow`` and ``sub``, ``n`` times) and ``repeat_interleave``
(an ``index_select`` with the repeated positions, so repeats add their gradients in order).

>>> x = tp.tensor(np.array([[1.0, 2.0, 0.0, 4.0]]), requires_grad=True)
>>> tp.cumprod(x, 1).to_host(), tp.diff(x).to_host()
(array([[1., 2., 0., 0.]], dtype=float32), array([[ 1., -2.,  4.]], dtype=float32))
>>> tp.repeat_interleave(x, 2, dim=0).shape
(2, 4)
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import scan
from ...tensor import LABEL_DTYPES, Tensor
from ..node import Function, Node
from .elementwise import sub
from .join import cat
from .picks import index_select
from .shape import flatten, reshape, wrap_dim
from .slices import _shape_of, narrow

__all__ = ["cumprod", "diff", "repeat_interleave"]


class CumProd(Function):
    """Forward multiplies along ``axis`` in order; the backward is one kernel per line that
    handles zeros as PyTorch's ``cumprod_backward`` (no ``0 / 0``)."""

    name = "cumprod"

    def forward(self, x: Tensor, axis: int = 0):
        out = scan.cumprod(x, axis)
        if self.recording:
            self.saved = (x, out, axis)
        return out

    def backward(self, g: Tensor):
        x, out, axis = self.saved
        if x.shape[axis] == 1:               # PyTorch's: the gradient of one element is g
            return g
        return scan.cumprod_backward(x, out, g, axis)


def cumprod(x, dim: int, *, tape=None):
    """``torch.cumprod``: the inclusive cumulative product along ``dim`` (negative from the
    end; a 0-d tensor takes 0 and -1), multiplied in order. Its gradient is PyTorch's where
    ``x`` holds zeros too: before a line's first zero ``sum_{j>=k} g_j out_j / x_k``, at it
    the product of the others, after it 0. op_name ``"cumprod"``.

    >>> tp.cumprod(x, -1).shape                   # x (1, 4)
    (1, 4)
    """
    shape = _shape_of("cumprod", x)
    axis = wrap_dim("cumprod", dim, len(shape), shape)
    if not shape:
        return reshape(CumProd.apply(reshape(x, (1,), tape=tape), tape=tape, axis=0), (),
                       tape=tape)
    return CumProd.apply(x, tape=tape, axis=axis)


def diff(x, n: int = 1, dim: int = -1, prepend=None, append=None, *, tape=None):
    """``torch.diff``: the ``n``-th forward difference ``x[1:] - x[:-1]`` along ``dim``,
    after ``prepend`` and ``append`` (tensors of ``x``'s dims) are joined to ``x`` there;
    ``n=0`` gives ``x`` without them, as PyTorch's and numpy's. Each order is ``narrow``
    twice and ``sub``, so its gradient is theirs. A difference with no elements left (``n``
    at least the length) is a ``ShapeError``: parcl's tensors hold at least one element.

    >>> tp.diff(x, 2).to_host()                   # x [[1, 2, 0, 4]]
    array([[-3.,  6.]], dtype=float32)
    """
    shape = _shape_of("diff", x)
    if not shape:
        raise ShapeError("diff: expects a tensor of at least one dimension, got a 0-d one")
    if not isinstance(n, Integral) or isinstance(n, bool) or n < 0:
        raise ShapeError(f"diff: n must be a non-negative int, got {n!r}")
    axis = wrap_dim("diff", dim, len(shape), shape)
    pieces = []
    for name, extra in (("prepend", prepend), (None, x), ("append", append)):
        if extra is None:
            continue
        if name is not None:
            extra_shape = _shape_of("diff", extra)
            if len(extra_shape) != len(shape):
                raise ShapeError(f"diff: {name} has shape {extra_shape}, expected "
                                 f"{len(shape)} dims as the input {shape}")
        pieces.append(extra)
    if n == 0:             # the input as it is, prepend and append left out, as PyTorch's
        return x
    out = cat(pieces, axis, tape=tape) if len(pieces) > 1 else x
    length = out.shape[axis]
    if n >= length:
        raise ShapeError(f"diff: n={n} leaves no elements along dim {axis} of length "
                         f"{length} (input {shape}); parcl tensors hold at least one element")
    for _ in range(n):
        length = out.shape[axis]
        out = sub(narrow(out, axis, 1, length - 1, tape=tape),
                  narrow(out, axis, 0, length - 1, tape=tape), tape=tape)
    return out


def _repeats(repeats, length: int, axis_name: str) -> np.ndarray:
    """``repeats`` (an int, a sequence or a 0-d / 1-D integer tensor) as one count per
    element along the dim."""
    if isinstance(repeats, Node):
        repeats = repeats.value
    if isinstance(repeats, Tensor):
        if repeats.dtype not in LABEL_DTYPES:
            raise DTypeError(f"repeat_interleave: repeats must be an int or an int32/int64 "
                             f"tensor, got dtype {repeats.dtype}")
        repeats = repeats.to_host()
    counts = np.asarray(repeats)
    if counts.dtype.kind not in "iu" or counts.ndim > 1:
        raise DTypeError(f"repeat_interleave: repeats must be an int or a 1-D sequence of "
                         f"ints, got {type(repeats).__name__} of dtype {counts.dtype} and "
                         f"shape {counts.shape}")
    if counts.ndim == 1 and counts.size not in (1, length):
        raise ShapeError(f"repeat_interleave: repeats has {counts.size} counts, expected 1 "
                         f"or {length} (the size of {axis_name})")
    if (counts < 0).any():
        raise ShapeError(f"repeat_interleave: repeats must be non-negative, got "
                         f"{counts.tolist()}")
    return np.broadcast_to(counts.reshape(-1), (length,))


def repeat_interleave(x, repeats, dim: int | None = None, *, output_size: int | None = None,
                      tape=None):
    """``torch.repeat_interleave``: each element along ``dim`` repeated ``repeats`` times in
    place (``[a, b] -> [a, a, b, b]``); ``dim=None`` flattens first. ``repeats`` is an int,
    or one count per element (a sequence or an int tensor, read to the host); ``output_size``
    if given must be the total. The gradient adds each element's copies in order.

    >>> tp.repeat_interleave(x, [1, 0, 2, 1], dim=1).to_host()     # x [[1, 2, 0, 4]]
    array([[1., 0., 0., 4.]], dtype=float32)
    """
    shape = _shape_of("repeat_interleave", x)
    if dim is None:
        x = flatten(x, tape=tape) if len(shape) != 1 else x
        axis, axis_name = 0, f"the flattened input {shape}"
    else:
        axis = wrap_dim("repeat_interleave", dim, len(shape), shape)
        axis_name = f"dim {axis} of the input {shape}"
        if not shape:
            x = reshape(x, (1,), tape=tape)
    length = x.shape[axis]
    counts = _repeats(repeats, length, axis_name)
    index = np.repeat(np.arange(length, dtype=np.int64), counts)
    if output_size is not None and output_size != index.size:
        raise ShapeError(f"repeat_interleave: output_size {output_size} is not the total of "
                         f"repeats, {index.size}")
    if index.size == 0:              # every count 0, or x[:, T:]: picks none, as PyTorch's
        # (an upload holds at least one element; a slice of one holds none)
        return index_select(x, axis, Tensor.from_host(x.queue, np.zeros(1, np.int64))[:0],
                            tape=tape)
    return index_select(x, axis, Tensor.from_host(x.queue, index), tape=tape)
