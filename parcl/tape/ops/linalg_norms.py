"""``torch.linalg``'s norms: ``vector_norm`` (``linalg_vector_norm``), ``matrix_norm``
(Frobenius; the 1 / -1 / inf / -inf norms: the largest or smallest absolute column or row
sum; the spectral and nuclear norms 2 / -2 / ``"nuc"``: the largest, smallest and summed
singular values) and ``norm``, which dispatches between the two as PyTorch's does. All are
``sum``, ``abs``, ``amax`` / ``amin``, ``svdvals`` and the vector norm, so their gradients
are those ops'.

>>> m = tp.tensor(np.array([[1.0, -2.0], [3.0, 4.0]], np.float32))
>>> float(tp.linalg.matrix_norm(m, 1)), float(tp.linalg.matrix_norm(m, float("inf")))
(6.0, 7.0)
"""

from __future__ import annotations

import math

from ...errors import ParclError, ShapeError
from .composed import linalg_vector_norm
from .linalg_decomp import svdvals
from .reduce import sum as sum_
from .reduce_dims import amax, amin
from .shape import movedim, squeeze, unsqueeze, wrap_dims
from .unary import abs as abs_

__all__: list[str] = []

vector_norm = linalg_vector_norm


def _matrix_dims(op: str, A, dim) -> tuple[int, int]:
    shape = tuple(A.shape)
    if not isinstance(dim, (tuple, list)) or len(dim) != 2:
        raise ShapeError(f"{op}: dim must be a pair of dims, got {dim!r} (input {shape})")
    if len(shape) < 2:
        raise ShapeError(f"{op}: expected a matrix or a batch of them (at least 2-D), got "
                         f"shape {shape}")
    d0, d1 = wrap_dims(op, dim, len(shape), shape)
    return d0, d1


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim: bool = False, *,  # noqa: A002
                tape=None):
    """``torch.linalg.matrix_norm`` over the two dims ``dim``: ``"fro"`` (the 2-norm of the
    entries), 1 / -1 (the largest / smallest sum of ``|A|`` down a column), inf / -inf (along
    a row), 2 / -2 (the largest / smallest singular value) and ``"nuc"`` (their sum).

    >>> float(tp.linalg.matrix_norm(tp.tensor(np.array([[3.0, 0.0], [0.0, 4.0]]))))
    5.0
    """
    op = "linalg.matrix_norm"
    d0, d1 = _matrix_dims(op, A, dim)
    if ord == "fro":
        return linalg_vector_norm(A, 2, (d0, d1), keepdim, tape=tape)
    if ord == "nuc" or (not isinstance(ord, str) and ord in (2, -2)):
        s = svdvals(movedim(A, (d0, d1), (-2, -1), tape=tape), tape=tape)
        if ord == "nuc":
            out = sum_(s, -1, tape=tape)
        else:
            out = (amax if ord > 0 else amin)(s, -1, tape=tape)
        if keepdim:
            out = unsqueeze(unsqueeze(out, min(d0, d1), tape=tape), max(d0, d1), tape=tape)
        return out
    if isinstance(ord, str) or ord not in (1, -1, math.inf, -math.inf):
        raise ParclError(f"{op}: ord={ord!r} is not supported (input {tuple(A.shape)}): "
                         "parcl takes 'fro', 'nuc', 1, -1, 2, -2, inf and -inf")
    # 1: sums down the columns (over the rows d0), the extreme over the columns d1
    summed, picked = (d0, d1) if abs(ord) == 1 else (d1, d0)
    s = sum_(abs_(A, tape=tape), summed, True, tape=tape)
    out = (amax if ord > 0 else amin)(s, picked, True, tape=tape)
    if not keepdim:
        out = squeeze(out, (max(d0, d1), min(d0, d1)), tape=tape)
    return out


def norm(A, ord=None, dim=None, keepdim: bool = False, *, tape=None):  # noqa: A002
    """``torch.linalg.norm``: a vector norm where ``dim`` is an int (or ``A`` is 1-D with
    ``dim=None``), a matrix norm where ``dim`` is a pair (or ``A`` is 2-D with ``dim=None``
    and an ``ord``); ``ord=None`` with ``dim=None`` is the 2-norm of all the entries, any
    shape.

    >>> float(tp.linalg.norm(tp.tensor(np.array([[1.0, -2.0], [3.0, 4.0]])), 1))
    6.0
    """
    op = "linalg.norm"
    shape = tuple(A.shape)
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if dim is None:
        if ord is None:
            return linalg_vector_norm(A, 2, None, keepdim, tape=tape)
        if len(shape) == 2:
            dim = (-2, -1)
        elif len(shape) == 1:
            dim = -1
        else:
            raise ShapeError(f"{op}: with dim=None and ord={ord!r} the input must be 1-D or "
                             f"2-D, got shape {shape}; pass dim")
    if isinstance(dim, (tuple, list)):
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, tape=tape)
    if isinstance(ord, str):
        raise ParclError(f"{op}: ord={ord!r} is a matrix norm, but dim={dim!r} names one "
                         f"dim (input {shape})")
    return linalg_vector_norm(A, 2 if ord is None else ord, dim, keepdim, tape=tape)
