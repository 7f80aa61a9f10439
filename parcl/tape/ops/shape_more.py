"""More of PyTorch's shape ops: ``broadcast_to``, ``broadcast_tensors``, ``broadcast_shapes``,
``swapaxes``/``swapdims``, ``moveaxis``, ``ravel``, ``rot90``, ``fliplr``, ``flipud``,
``clone`` and ``numel``.

Built on ``expand``, ``permute``, ``movedim``, ``reshape`` and ``flip``, so their gradients are
those ops'. Where PyTorch returns a view, parcl's result is a new tensor except for ``ravel``
(a reshape: a view, as PyTorch's) and for ``broadcast_tensors``' operands that already have
the broadcast shape (returned as they are): an in-place change to a copy leaves the input as it
was, where PyTorch's would write through (or refuse, for an expanded view). ``clone`` is always
a new buffer whose gradient is the incoming one.

>>> x = tp.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
>>> tp.broadcast_to(x[0], (2, 3)).shape, tp.swapaxes(x, 0, 1).shape, tp.numel(x)
((2, 3), (3, 2), 6)
>>> tp.rot90(x).to_host()
array([[2., 5.],
       [1., 4.],
       [0., 3.]], dtype=float32)
"""

from __future__ import annotations

from math import prod

import numpy as np

from ...errors import ShapeError
from ...kernels.elementwise import broadcast_shapes as _broadcast
from ...kernels.strided import axis_int
from ...tensor import Tensor, dims
from ..node import Function
from .composed import _tensor
from .indexing import expand, flip
from .shape import movedim, permute, reshape, wrap_dim

__all__ = ["broadcast_shapes", "broadcast_tensors", "broadcast_to", "clone", "fliplr",
           "flipud", "moveaxis", "numel", "ravel", "rot90", "swapaxes", "swapdims"]


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    """``torch.broadcast_shapes``: the shape the given shapes broadcast to (numpy's rules;
    an int is a 1-D shape), as a tuple; shapes that do not broadcast are a ``ShapeError``.

    >>> tp.broadcast_shapes((2, 1), (3,), 1)
    (2, 3)
    """
    out: tuple[int, ...] = ()
    for s in shapes:
        s = (s,) if isinstance(s, (int, np.integer)) else s
        s = dims("broadcast_shapes", tuple(s))
        if any(v < 0 for v in s):
            raise ShapeError(f"broadcast_shapes: shape {s} has a negative size")
        out = _broadcast("broadcast_shapes", out, s)
    return out


def broadcast_to(input, size, *, tape=None):  # noqa: A002
    """``torch.broadcast_to``: ``input`` broadcast to ``size`` (``-1`` keeps a dim), as
    ``tp.expand``: a copy, its gradient summed back over the broadcast dims.

    >>> tp.broadcast_to(x[:, :1], (2, -1, 4)).shape
    (2, 2, 4)
    """
    _tensor("broadcast_to", "input", input)
    return expand(input, (size,) if isinstance(size, (int, np.integer)) else tuple(size),
                  tape=tape)


def broadcast_tensors(*tensors, tape=None) -> tuple:
    """``torch.broadcast_tensors``: the tensors broadcast to their common shape (a tuple);
    those of that shape already are returned as they are, the others are ``expand`` copies.

    >>> [t.shape for t in tp.broadcast_tensors(x, x[0], tp.tensor(1.0))]
    [(2, 3), (2, 3), (2, 3)]
    """
    for i, t in enumerate(tensors):
        _tensor("broadcast_tensors", f"tensor {i}", t)
    shape = broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return tuple(t if tuple(t.shape) == shape else expand(t, shape, tape=tape) for t in tensors)


def swapaxes(input, axis0: int, axis1: int, *, tape=None):  # noqa: A002
    """``torch.swapaxes`` (``torch.transpose(input, dim0, dim1)``): two dims exchanged; a
    ``permute``, so a copy unless only size-1 dims move.

    >>> tp.swapaxes(x[None], 0, -1).shape
    (3, 2, 1)
    """
    _tensor("swapaxes", "input", input)
    shape = tuple(input.shape)
    if not shape:
        wrap_dim("swapaxes", axis0, 0, shape)
        wrap_dim("swapaxes", axis1, 0, shape)
        return permute(input, (), tape=tape)
    a = wrap_dim("swapaxes", axis0, len(shape), shape)
    b = wrap_dim("swapaxes", axis1, len(shape), shape)
    order = list(range(len(shape)))
    order[a], order[b] = b, a
    return permute(input, tuple(order), tape=tape)


def swapdims(input, dim0: int, dim1: int, *, tape=None):  # noqa: A002
    """``torch.swapdims``: ``swapaxes``.

    >>> tp.swapdims(x, 1, 0).shape
    (3, 2)
    """
    return swapaxes(input, dim0, dim1, tape=tape)


def moveaxis(input, source, destination, *, tape=None):  # noqa: A002
    """``torch.moveaxis``: ``tp.movedim``.

    >>> tp.moveaxis(x[None], 0, 2).shape
    (2, 3, 1)
    """
    return movedim(input, source, destination, tape=tape)


def ravel(input, *, tape=None):  # noqa: A002
    """``torch.ravel``: ``input`` flattened to 1-D; a view (a reshape), as PyTorch's of a
    contiguous tensor.

    >>> tp.ravel(x).shape
    (6,)
    """
    _tensor("ravel", "input", input)
    return reshape(input, (-1,), tape=tape)


class Clone(Function):
    name = "clone"

    def forward(self, x: Tensor):
        return x.copy()

    def backward(self, g: Tensor):
        return g


def clone(input, *, memory_format=None, tape=None):  # noqa: A002
    """``torch.clone``: a copy of ``input`` in a new buffer (an in-place change to one leaves
    the other as it was); the gradient passes through. parcl's tensors are contiguous, so
    ``memory_format`` (PyTorch's) changes nothing. op_name ``"clone"``.

    >>> tp.clone(x).op_name
    'clone'
    """
    _tensor("clone", "input", input)
    return Clone.apply(input, tape=tape)


def numel(input) -> int:  # noqa: A002
    """``torch.numel``: the number of elements, a Python int.

    >>> tp.numel(x[0])
    3
    """
    _tensor("numel", "input", input)
    return prod(tuple(input.shape))


def rot90(input, k: int = 1, dims=(0, 1), *, tape=None):  # noqa: A002
    """``torch.rot90``: rotated by 90 degrees ``k`` times in the plane of ``dims`` (from the
    first dim towards the second; negative ``k`` the other way). ``flip`` and ``permute``
    (``k % 4 == 0``: a ``clone``).

    >>> tp.rot90(x, -1).shape
    (3, 2)
    """
    _tensor("rot90", "input", input)
    shape = tuple(input.shape)
    given = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(given) != 2:
        raise ShapeError(f"rot90: expected two dims, got {dims!r} (shape {shape})")
    if len(shape) < 2:
        raise ShapeError(f"rot90: expects a tensor of at least 2 dims, got shape {shape}")
    d0, d1 = (wrap_dim("rot90", d, len(shape), shape) for d in given)
    if d0 == d1:
        raise ShapeError(f"rot90: dims {given} name one dim twice (shape {shape})")
    turns = axis_int("rot90", k, shape) % 4
    if turns == 0:
        return clone(input, tape=tape)
    if turns == 2:
        return flip(input, (d0, d1), tape=tape)
    flipped = flip(input, d1 if turns == 1 else d0, tape=tape)
    return swapaxes(flipped, d0, d1, tape=tape)


def fliplr(input, *, tape=None):  # noqa: A002
    """``torch.fliplr``: reversed along dim 1 (at least 2 dims).

    >>> tp.fliplr(x).to_host()[0]
    array([2., 1., 0.], dtype=float32)
    """
    _tensor("fliplr", "input", input)
    if len(tuple(input.shape)) < 2:
        raise ShapeError(f"fliplr: expects a tensor of at least 2 dims, got shape "
                         f"{tuple(input.shape)}")
    return flip(input, 1, tape=tape)


def flipud(input, *, tape=None):  # noqa: A002
    """``torch.flipud``: reversed along dim 0 (at least 1 dim).

    >>> tp.flipud(x).to_host()[0]
    array([3., 4., 5.], dtype=float32)
    """
    _tensor("flipud", "input", input)
    if not tuple(input.shape):
        raise ShapeError("flipud: expects a tensor of at least 1 dim, got shape ()")
    return flip(input, 0, tape=tape)
