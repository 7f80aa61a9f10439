"""Sorting: ``sort``, ``argsort`` and ``topk`` (PyTorch's, dims negative from the end).

The order is one stable, total order (``parcl/kernels/sorting.py``): by value, NaN larger than
every number (last ascending, first descending, as PyTorch), equal values by their index
along the dim, in both directions. So ``stable=False`` gives the stable order too, ties come
out the same on every device and run, and ``topk`` keeps the lowest indices among equal
values. ``topk(..., sorted=False)`` returns its values sorted all the same.

The values are ``x`` gathered at the indices (``torch.gather``'s kernel); the backward adds
the upstream gradient into zeros at the picked positions (gather's backward: each picked
element once, so exact). The indices are an int64 raw Tensor, never recorded.

>>> x = tp.tensor(np.array([[3.0, 1.0, 2.0, 1.0]], np.float32), requires_grad=True)
>>> values, indices = tp.sort(x)
>>> values.to_host(), indices.to_host()
(array([[1., 1., 2., 3.]], dtype=float32), array([[1, 3, 2, 0]]))
>>> tp.topk(x, 2).indices.to_host()
array([[0, 2]])
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import gather as gk
from ...kernels import scatter as sc
from ...kernels import sorting
from ...tensor import FLOAT, SortResult, Tensor
from ..node import Function, Node
from .shape import reshape, wrap_dim

__all__ = ["argsort", "sort", "topk"]


class _Picked(Function):
    """``x`` gathered at indices known to be in range; the backward scatters into zeros."""

    name = "sort"

    def forward(self, x: Tensor, index: Tensor, axis: int = 0):
        out, _ = gk.gather_forward(x, axis, index)     # the sort's own indices: no check
        if self.recording:
            self.saved = (x.shape, axis, index)
        return out

    def backward(self, g: Tensor):
        x_shape, axis, index = self.saved
        if not self.needs_input_grad[0]:
            return None, None
        return sc.gather_backward(g, x_shape, axis, index), None


class _TopK(_Picked):
    name = "topk"


def _float_input(op: str, x):
    if not isinstance(x, (Node, Tensor)):
        raise TypeError(f"{op}: expected a tp.Node or pc.Tensor, got {type(x).__name__}")
    if x.dtype != FLOAT:
        raise DTypeError(f"{op}: input {x.shape} has dtype {x.dtype}, expected float32")


def _indices(op: str, x, dim, descending: bool, k, tape=None):
    """``(x as 1-D if it is 0-d, axis, the int64 indices of its first k along the axis)``."""
    _float_input(op, x)
    shape = tuple(x.shape)
    axis = wrap_dim(op, dim, len(shape), shape)
    flat = x if shape else reshape(x, (1,), tape=tape)
    raw = flat.value if isinstance(flat, Node) else flat
    indices = sorting.argsort(raw, axis, descending, k)
    # the input's pending checks (an embedding's index range): the top-k of rows picked by a
    # bad id raise at their host read, as tp.argmax's indices do
    indices.checks = raw.checks
    return flat, axis, indices


def _sorted(op: str, fn, x, dim, descending: bool, k, tape) -> SortResult:
    flat, axis, indices = _indices(op, x, dim, descending, k, tape)
    values = fn.apply(flat, indices, tape=tape, axis=axis)
    if not x.shape:
        return SortResult(reshape(values, (), tape=tape), indices.reshape(()))
    return SortResult(values, indices)


def sort(x, dim: int = -1, descending: bool = False, stable: bool = False, *,
         tape=None) -> SortResult:
    """``torch.sort``: ``(values, indices)`` of ``x`` sorted along ``dim``, ascending unless
    ``descending``; NaN sorts as the largest value; equal values keep their order along the
    dim whatever ``stable`` says (see the module docstring). op_name ``"sort"``.

    >>> tp.sort(x, descending=True).values.to_host()
    array([[3., 2., 1., 1.]], dtype=float32)
    """
    return _sorted("sort", _Picked, x, dim, bool(descending), None, tape)


def argsort(x, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """``torch.argsort``: the int64 indices that sort ``x`` along ``dim`` (``sort``'s order;
    stable always). A raw Tensor, never recorded.

    >>> tp.argsort(x).to_host()
    array([[1, 3, 2, 0]])
    """
    indices = _indices("argsort", x, dim, bool(descending), None)[2]
    return indices if x.shape else indices.reshape(())


def topk(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *,
         tape=None) -> SortResult:
    """``torch.topk``: ``(values, indices)`` of the ``k`` largest (``largest=False``: the
    smallest) entries of ``x`` along ``dim``, largest first (smallest first); among equal
    values the lowest indices, in index order. NaN counts as the largest value. The values
    come sorted whatever ``sorted`` says. ``k`` must be in ``[1, size of dim]`` (parcl tensors
    hold at least one element). op_name ``"topk"``.

    >>> tp.topk(x, 3, largest=False).values.to_host()
    array([[1., 1., 2.]], dtype=float32)
    """
    _float_input("topk", x)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ShapeError(f"topk: k must be an int, got {k!r} (input {tuple(x.shape)})")
    k = int(k)
    shape = tuple(x.shape)
    n = shape[wrap_dim("topk", dim, len(shape), shape)] if shape else 1
    if not 1 <= k <= n:
        raise ShapeError(f"topk: k={k} is out of range for dim {dim} of size {n} (input "
                         f"{shape}); expected 1 <= k <= {n}")
    return _sorted("topk", _TopK, x, dim, bool(largest), k, tape)
