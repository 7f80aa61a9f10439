"""Joining and splitting: ``cat``, ``stack`` and ``split`` (numpy/PyTorch semantics).

``cat`` writes each input into its slab of the output and its backward reads the slabs back
out; ``stack`` is ``cat`` along a new axis; each piece of ``split`` is its own recorded Node (a
slab read), so gradients reach every input and every piece independently.

>>> a = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3), np.float32)), True)
>>> b = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 1), np.float32)), True)
>>> tp.cat([a, b], axis=1).shape
(2, 4)
>>> [p.shape for p in tp.split(a, [1, 2], axis=1)]
[(2, 1), (2, 2)]
"""

from __future__ import annotations

from ...errors import DTypeError, ShapeError
from ...kernels import strided
from ...kernels.strided import View
from ...tensor import Tensor, check_same_queue
from ..node import Function
from .torch_names import torch_names

__all__ = ["cat", "split", "stack"]


def _check_inputs(op: str, xs: tuple[Tensor, ...], axis: int, same_axis: bool) -> None:
    if not xs:
        raise ShapeError(f"{op}: expected a non-empty sequence of tensors")
    first = xs[0]
    for i, x in enumerate(xs):
        if x.dtype != first.dtype:
            raise DTypeError(f"{op}: input {i} has dtype {x.dtype}, input 0 has {first.dtype}")
        if x.ndim != first.ndim:
            raise ShapeError(f"{op}: input {i} has shape {x.shape}, input 0 has {first.shape}; "
                             "all inputs need the same number of dimensions")
        for k in range(x.ndim):
            if x.shape[k] != first.shape[k] and (same_axis or k != axis):
                raise ShapeError(f"{op}: input {i} has shape {x.shape}, input 0 has "
                                 f"{first.shape}; they must match"
                                 + ("" if same_axis else f" except along axis {axis}"))
    check_same_queue(op, *xs)


class _Join(Function):
    """Each input written into its slab (``self.slabs``) of one output view ``self.whole``."""

    def _join(self, xs, out_shape, views):
        out = Tensor.empty(xs[0].queue, out_shape, xs[0].dtype)
        for x, view in zip(xs, views):
            strided.copy_view(out, view, x, View.contiguous(view.shape))
        self.views, self.shapes = views, [x.shape for x in xs]
        return out

    def backward(self, g: Tensor):
        return tuple(strided.read_view(g, view).reshape(shape) if need else None
                     for view, shape, need in zip(self.views, self.shapes,
                                                  self.needs_input_grad))


class Cat(_Join):
    name = "cat"

    def forward(self, *xs: Tensor, axis: int = 0):
        if xs and xs[0].ndim == 0:
            raise ShapeError("cat: zero-dimensional tensors cannot be concatenated; use stack")
        axis = strided.normalize_axis("cat", axis, xs[0].ndim, xs[0].shape) if xs else 0
        _check_inputs("cat", xs, axis, same_axis=False)
        out_shape = list(xs[0].shape)
        out_shape[axis] = sum(x.shape[axis] for x in xs)
        whole, views, start = View.contiguous(tuple(out_shape)), [], 0
        for x in xs:
            views.append(whole.narrow(axis, start, x.shape[axis]))
            start += x.shape[axis]
        return self._join(xs, tuple(out_shape), views)


class Stack(_Join):
    name = "stack"

    def forward(self, *xs: Tensor, axis: int = 0):
        if not xs:
            raise ShapeError("stack: expected a non-empty sequence of tensors")
        axis = strided.normalize_axis("stack", axis, xs[0].ndim + 1, xs[0].shape)
        _check_inputs("stack", xs, axis, same_axis=True)
        out_shape = (*xs[0].shape[:axis], len(xs), *xs[0].shape[axis:])
        whole = View.contiguous(out_shape)
        return self._join(xs, out_shape, [whole.narrow(axis, i, 1) for i in range(len(xs))])


def _sequence(op: str, tensors) -> tuple:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: expected a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    return tuple(tensors)


@torch_names()
def cat(tensors, axis: int = 0, *, tape=None):
    """The tensors joined along ``axis`` (``torch.cat`` / ``np.concatenate``): same shapes
    except along ``axis``. Gradients reach every input. op_name ``"cat"``.

    >>> tp.cat([a, b], axis=-1).shape
    (2, 4)
    """
    return Cat.apply(*_sequence("cat", tensors), tape=tape, axis=axis)


@torch_names()
def stack(tensors, axis: int = 0, *, tape=None):
    """The tensors (all of one shape) joined along a new axis ``axis`` (``torch.stack``).
    op_name ``"stack"``.

    >>> tp.stack([a, a]).shape
    (2, 2, 3)
    """
    return Stack.apply(*_sequence("stack", tensors), tape=tape, axis=axis)


class Piece(Function):
    name = "split"

    def forward(self, x: Tensor, view: View | None = None):
        self.in_shape, self.view = x.shape, view
        return strided.view_copy(strided.read_view(x, view), x, self.name)

    def backward(self, g: Tensor):
        return strided.write_view(g, self.in_shape, self.view)


@torch_names()
def split(x, split_size_or_sections, axis: int = 0, *, tape=None) -> tuple:
    """``torch.split``: an int cuts ``x`` along ``axis`` into pieces of that size (the last
    may be smaller); a list gives each piece's size (they must add up to the dimension).
    Returns a tuple; each piece is its own Node (op_name ``"split"``).

    >>> [p.shape for p in tp.split(a, 2, axis=1)]
    [(2, 2), (2, 1)]
    """
    shape = x.shape
    axis, sizes = strided.split_sizes(shape, split_size_or_sections, axis)
    whole, pieces, start = View.contiguous(shape), [], 0
    for s in sizes:
        pieces.append(Piece.apply(x, tape=tape, view=whole.narrow(axis, start, s)))
        start += s
    return tuple(pieces)
