"""PyTorch's diagonals and contractions: ``diagonal``, ``diag`` (a 1-D tensor onto a square
matrix's diagonal, or a matrix's diagonal), ``trace`` and ``tensordot``.

A diagonal is one strided copy (``parcl.kernels.strided``: stride ``s1 + s2`` through the two
dims), its backward the copy the other way into zeros; ``diag`` of a 1-D tensor is that
backward as its forward. ``tensordot`` is ``permute``, ``reshape`` and one ``mm``, so its
gradient is theirs.

>>> x = tp.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
>>> tp.diagonal(x, 1).to_host(), float(tp.trace(x))
(array([1., 5.], dtype=float32), 4.0)
>>> tp.diag(tp.diagonal(x)).to_host()
array([[0., 0.],
       [0., 4.]], dtype=float32)
"""

from __future__ import annotations

from math import prod
from numbers import Integral

from ...errors import ShapeError
from ...kernels import strided
from ...kernels.strided import View
from ...tensor import Tensor
from ..node import Function, Node
from .linalg import mm
from .reduce import sum as sum_
from .shape import permute, reshape, wrap_dim
from .slices import Slab, _shape_of

__all__ = ["diag", "diagonal", "tensordot", "trace"]


class Diagonal(Slab):
    """A diagonal read through a strided view; the backward writes it into zeros."""

    name = "diagonal"


class DiagEmbed(Function):
    """A 1-D tensor written onto one diagonal of a zero matrix; the backward reads it back."""

    name = "diag"

    def forward(self, x: Tensor, view: View | None = None, shape=()):
        self.view = view
        return strided.write_view(x, shape, view)

    def backward(self, g: Tensor):
        return strided.read_view(g, self.view)


def _offset(op: str, offset) -> int:
    if not isinstance(offset, Integral) or isinstance(offset, bool):
        raise ShapeError(f"{op}: the diagonal offset must be an int, got {offset!r}")
    return int(offset)


def diagonal(x, offset: int = 0, dim1: int = 0, dim2: int = 1, *, tape=None):
    """``torch.diagonal``: the elements ``[i, i + offset]`` of dims ``dim1`` and ``dim2`` (a
    negative ``offset`` below the main diagonal), as a new last dim; the other dims keep
    their order. A copy (PyTorch's is a view). A diagonal with no elements is a
    ``ShapeError``. op_name ``"diagonal"``.

    >>> tp.diagonal(x, -1).to_host()                        # x [[0, 1, 2], [3, 4, 5]]
    array([3.], dtype=float32)
    """
    shape = _shape_of("diagonal", x)
    if len(shape) < 2:
        raise ShapeError(f"diagonal: expects a tensor of at least 2 dims, got shape {shape}")
    d1 = wrap_dim("diagonal", dim1, len(shape), shape)
    d2 = wrap_dim("diagonal", dim2, len(shape), shape)
    if d1 == d2:
        raise ShapeError(f"diagonal: dim1 and dim2 are both dim {d1} (shape {shape})")
    offset = _offset("diagonal", offset)
    n1, n2 = shape[d1], shape[d2]
    row, col = (0, offset) if offset >= 0 else (-offset, 0)
    length = min(n1 - row, n2 - col)
    if length <= 0:
        raise ShapeError(f"diagonal: offset {offset} leaves no elements in dims {d1} and {d2} "
                         f"of shape {shape}; parcl tensors hold at least one element")
    whole = View.contiguous(shape)
    s = whole.strides
    others = [k for k in range(len(shape)) if k not in (d1, d2)]
    view = View((*(shape[k] for k in others), length), (*(s[k] for k in others), s[d1] + s[d2]),
                row * s[d1] + col * s[d2])
    return Diagonal.apply(x, tape=tape, view=view, shape=view.shape)


_diagonal = diagonal         # diag's argument takes the name, as PyTorch's


def diag(x, diagonal: int = 0, *, tape=None):
    """``torch.diag``: a 1-D tensor of ``n`` becomes the square matrix of size ``n + |k|``
    with it on diagonal ``k`` (``diagonal``; above the main one for ``k > 0``) and zeros
    elsewhere; a 2-D tensor gives its diagonal ``k`` (``tp.diagonal``). op_name ``"diag"``
    (``"diagonal"`` for a matrix).

    >>> tp.diag(tp.tensor(np.array([1.0, 2.0])), -1).to_host()
    array([[0., 0., 0.],
           [1., 0., 0.],
           [0., 2., 0.]], dtype=float32)
    """
    shape = _shape_of("diag", x)
    k = _offset("diag", diagonal)
    if len(shape) == 2:
        return _diagonal(x, k, tape=tape)
    if len(shape) != 1:
        raise ShapeError(f"diag: expects a 1-D or 2-D tensor, got shape {shape}")
    n = shape[0]
    m = n + abs(k)
    view = View((n,), (m + 1,), k if k >= 0 else -k * m)
    return DiagEmbed.apply(x, tape=tape, view=view, shape=(m, m))


def trace(x, *, tape=None):
    """``torch.trace``: the sum of a matrix's main diagonal (any ``(m, n)``), 0-d.

    >>> float(tp.trace(x))                                  # x (2, 3)
    4.0
    """
    shape = _shape_of("trace", x)
    if len(shape) != 2:
        raise ShapeError(f"trace: expects a 2-D tensor, got shape {shape}")
    return sum_(diagonal(x, tape=tape), tape=tape)


def _dims(a_shape, b_shape, dims) -> tuple[list[int], list[int]]:
    """tensordot's contracted dims of ``a`` and ``b``, wrapped, from an int or a pair."""
    if isinstance(dims, Integral) and not isinstance(dims, bool):
        if not 0 <= dims <= min(len(a_shape), len(b_shape)):
            raise ShapeError(f"tensordot: dims={dims} must be in [0, "
                             f"{min(len(a_shape), len(b_shape))}] for shapes {a_shape} and "
                             f"{b_shape}")
        return (list(range(len(a_shape) - dims, len(a_shape))), list(range(dims)))
    if not isinstance(dims, (tuple, list)) or len(dims) != 2:
        raise ShapeError(f"tensordot: dims must be an int or a pair of dim lists, got {dims!r}")
    da, db = ([d] if isinstance(d, Integral) else list(d) for d in dims)
    if len(da) != len(db):
        raise ShapeError(f"tensordot: {len(da)} dims of a {a_shape} against {len(db)} of b "
                         f"{b_shape}; contract as many of each")
    da = [wrap_dim("tensordot", d, len(a_shape), a_shape) for d in da]
    db = [wrap_dim("tensordot", d, len(b_shape), b_shape) for d in db]
    for dims_of, shape in ((da, a_shape), (db, b_shape)):
        if len(set(dims_of)) != len(dims_of):
            raise ShapeError(f"tensordot: dims {dims_of} name a dim of {shape} twice")
    return da, db


def _as_matrix(x, first: list[int], second: list[int], tape):
    """``x`` permuted to ``first + second`` and reshaped to (prod first, prod second)."""
    order = first + second
    if order != list(range(len(order))):
        x = permute(x, order, tape=tape)
    shape = _shape_of("tensordot", x)
    # each side's own product: a contracted dim of size 0 makes the rows 0, no divisor
    return reshape(x, (prod(shape[:len(first)]), prod(shape[len(first):])), tape=tape)


def tensordot(a, b, dims=2, *, tape=None):
    """``torch.tensordot``: the sum over the last ``dims`` dims of ``a`` against the first
    ``dims`` of ``b`` (an int), or over the dims of ``a`` and ``b`` named in a pair of lists
    (``dims=([1, 0], [0, 1])``); the result has ``a``'s other dims, then ``b``'s. One ``mm``
    of the two reshaped to matrices. Contracted sizes that differ are a ``ShapeError``.

    >>> tp.tensordot(x, x, ([0], [0])).shape                # x (2, 3)
    (3, 3)
    """
    for v in (a, b):
        if not isinstance(v, (Node, Tensor)):
            raise TypeError(f"tensordot: expected tp.Node or pc.Tensor operands, got "
                            f"{type(v).__name__}")
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    da, db = _dims(a_shape, b_shape, dims)
    for i, j in zip(da, db):
        if a_shape[i] != b_shape[j]:
            raise ShapeError(f"tensordot: dim {i} of a {a_shape} has size {a_shape[i]} but "
                             f"dim {j} of b {b_shape} has size {b_shape[j]}")
    free_a = [k for k in range(len(a_shape)) if k not in da]
    free_b = [k for k in range(len(b_shape)) if k not in db]
    out = mm(_as_matrix(a, free_a, da, tape), _as_matrix(b, db, free_b, tape), tape=tape)
    return reshape(out, tuple(a_shape[k] for k in free_a) + tuple(b_shape[k] for k in free_b),
                   tape=tape)
