"""More of ``torch.linalg``, built on the factorisations of ``linalg_solve`` and
``linalg_decomp``: ``pinv`` (its own backward), ``matrix_rank``, ``cond``, ``inv_ex``,
``solve_ex``, ``lu_solve``, ``multi_dot``, ``vecdot``, ``matmul`` and ``diagonal``
(``tp.linalg``'s), and ``cholesky_inverse`` (a ``tp`` op too, as ``torch.cholesky_inverse``).

>>> a = tp.tensor(np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], np.float32))
>>> tp.linalg.pinv(a).to_host()
array([[1. , 0. , 0. ],
       [0. , 0.5, 0. ]], dtype=float32)
"""

from __future__ import annotations

import math
from numbers import Real
from typing import NamedTuple

import numpy as np

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import creation as ck
from ...kernels import elementwise as ew
from ...kernels import linalg as lk
from ...kernels import strided
from ...kernels.broadcast import broadcast_strides
from ...kernels.reduction import sum_to_shape
from ...tensor import FLOAT, Tensor
from ..node import Function, Node
from ..tape import defer
from .checks import FlagCheck
from .counting import count_nonzero
from .diagonals import diagonal as diagonal_
from .elementwise import div, mul, sub
from .linalg import matmul as matmul_
from .linalg_decomp import _Svd, eigh, svdvals
from .linalg_norms import matrix_norm
from .linalg_cholesky import CholeskySolve
from .linalg_solve import (Solve, _batch_shape, _batched, _is_vector_rhs, _mT, _raw,
                           check_rhs)
from .mathops import gt
from .reduce import sum as sum_
from .reduce_dims import amax, amin
from .select import where
from .shape import squeeze, unsqueeze
from .unary import abs as abs_

__all__ = ["cholesky_inverse"]

matmul = matmul_
EPS = float(np.finfo(np.float32).eps)


def diagonal(A, *, offset: int = 0, dim1: int = -2, dim2: int = -1, tape=None):
    """``torch.linalg.diagonal``: ``tp.diagonal`` with the last two dims by default.

    >>> tp.linalg.diagonal(tp.tensor(np.eye(2, dtype=np.float32))).to_host()
    array([1., 1.], dtype=float32)
    """
    return diagonal_(A, offset, dim1, dim2, tape=tape)


def vecdot(x, y, *, dim: int = -1, tape=None):
    """``torch.linalg.vecdot``: ``sum(x * y, dim)``, the inputs broadcast (real tensors).

    >>> float(tp.linalg.vecdot(tp.tensor(np.float32([1, 2])), tp.tensor(np.float32([3, 4]))))
    11.0
    """
    return sum_(mul(x, y, tape=tape), dim, tape=tape)


def multi_dot(tensors, *, tape=None):
    """``torch.linalg.multi_dot``: the product of two or more matrices in the cheapest order
    (fewest multiplications, the textbook dynamic programme); the first may be 1-D (a row)
    and the last 1-D (a column), which the result then lacks.

    >>> ms = [tp.tensor(np.ones((2, 3), np.float32)), tp.tensor(np.ones((3, 4), np.float32))]
    >>> tp.linalg.multi_dot(ms).shape
    (2, 4)
    """
    ts = list(tensors)
    if len(ts) < 2:
        raise ShapeError(f"linalg.multi_dot: expected at least 2 tensors, got {len(ts)}")
    shapes = [tuple(t.shape) for t in ts]
    first_1d, last_1d = len(shapes[0]) == 1, len(shapes[-1]) == 1
    if first_1d:
        ts[0] = unsqueeze(ts[0], 0, tape=tape)
    if last_1d:
        ts[-1] = unsqueeze(ts[-1], -1, tape=tape)
    dims = [tuple(t.shape) for t in ts]
    for i, s in enumerate(dims):
        if len(s) != 2 or (i and dims[i - 1][1] != s[0]):
            raise ShapeError(f"linalg.multi_dot: expected a chain of matrices (the first and "
                             f"last may be 1-D), got shapes {shapes}")
    p = [dims[0][0]] + [s[1] for s in dims]
    n = len(ts)
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = math.inf
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + p[i] * p[k + 1] * p[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k

    def product(i, j):
        if i == j:
            return ts[i]
        k = split[i][j]
        return matmul_(product(i, k), product(k + 1, j), tape=tape)
    out = product(0, n - 1)
    if first_1d:
        out = squeeze(out, 0, tape=tape)
    if last_1d:
        out = squeeze(out, -1, tape=tape)
    return out


def _above(op: str, s: Tensor, atol, rtol, m: int, n: int) -> Tensor:
    """Which of each matrix's singular values ``s`` (its last dim; ``|eigenvalues|`` of a
    symmetric one) lie above PyTorch's threshold ``max(atol, rtol * amax(s))``, ``rtol``
    ``eps * max(m, n)`` when neither is given and 0 when only ``atol`` is."""
    top = amax(s, -1)
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, Real)):
            raise ParclError(f"{op}: {name} must be a number (tensors are not supported), "
                             f"got {v!r}")
    if rtol is None:
        rtol = EPS * max(m, n) if atol is None or atol == 0 else 0.0
    cut = ew.scalar("maximum", mul(top, float(rtol)), float(atol or 0.0))
    return gt(s, unsqueeze(cut, -1))


class KeptSvd(NamedTuple):
    """``a``'s SVD and which of its singular values lie above ``pinv``'s threshold: what
    ``pinv``, ``matrix_rank`` and ``lstsq`` (all three from one decomposition) read."""

    svd: _Svd
    keep: Tensor

    @classmethod
    def of(cls, op: str, a: Tensor, atol, rtol) -> KeptSvd:
        d = _Svd(a, False, op)
        return cls(d, _above(op, d.s, atol, rtol, *a.shape[-2:]))


class Pinv(Function):
    """The pseudo-inverse ``P`` by the SVD (or ``eigh``), with the gradient of a matrix of
    constant rank: ``-P^T G P^T + (I - A P) G^T P P^T + P^T P G^T (I - P A)``."""

    name = "pinv"

    def forward(self, a: Tensor, atol=None, rtol=None, hermitian: bool = False,
                kept: KeptSvd | None = None):
        op = "linalg.pinv"
        m, n = a.shape[-2:] if a.ndim >= 2 else (0, 0)
        if hermitian:
            w, v = eigh(a)
            keep = _above(op, abs_(w), atol, rtol, m, n)
            inv = where(keep, div(1.0, where(keep, w, 1.0)), 0.0)
            p = matmul_(mul(v, unsqueeze(inv, -2)), _mT(v))
        else:
            d, keep = kept or KeptSvd.of(op, a, atol, rtol)
            inv = where(keep, div(1.0, where(keep, d.s, 1.0)), 0.0)
            p = matmul_(mul(_mT(d.vh), unsqueeze(inv, -2)), _mT(d.u))
        if self.recording:
            self.a, self.p = a, p
        return p

    def backward(self, g: Tensor):
        a, p = self.a, self.p
        m, n = a.shape[-2:]
        pt = _mT(p)
        out = mul(matmul_(matmul_(pt, g), pt), -1.0)
        eye_m, eye_n = ck.eye(a.queue, m, m, FLOAT), ck.eye(a.queue, n, n, FLOAT)
        i_ap = sub(eye_m, matmul_(a, p))                # (m, m)
        i_pa = sub(eye_n, matmul_(p, a))                # (n, n)
        gt_ = _mT(g)
        out = ew.binary("add", out, matmul_(matmul_(i_ap, gt_), matmul_(p, pt)))
        out = ew.binary("add", out, matmul_(matmul_(pt, p), matmul_(gt_, i_pa)))
        return out


def pinv(A, *, atol=None, rtol=None, hermitian: bool = False, tape=None):
    """``torch.linalg.pinv``: the pseudo-inverse ``(*, n, m)`` of ``A`` ``(*, m, n)`` from its
    SVD (``eigh`` where ``hermitian``, ``A`` symmetric), singular values at or below
    ``max(atol, rtol * largest)`` taken as 0 (``rtol`` ``eps * max(m, n)`` by default, 0
    when only ``atol`` is given). The gradient is that of a matrix of constant rank, as
    PyTorch's.

    >>> tp.linalg.pinv(tp.tensor(np.float32([[2, 0], [0, 0]]))).to_host()
    array([[0.5, 0. ],
           [0. , 0. ]], dtype=float32)
    """
    return Pinv.apply(A, tape=tape, atol=atol, rtol=rtol, hermitian=bool(hermitian))


def matrix_rank(A, *, atol=None, rtol=None, hermitian: bool = False):
    """``torch.linalg.matrix_rank``: the number (int64) of singular values (``|eigenvalues|``
    where ``hermitian``) above ``max(atol, rtol * largest)``, ``pinv``'s threshold. No
    gradient.

    >>> int(tp.linalg.matrix_rank(tp.tensor(np.float32([[1, 2], [2, 4]]))))
    1
    """
    op = "linalg.matrix_rank"
    a = _raw(A, op)
    if hermitian:
        keep = _above(op, abs_(eigh(a)[0]), atol, rtol, *a.shape[-2:])
    else:
        keep = KeptSvd.of(op, a, atol, rtol).keep
    return count_nonzero(keep, -1)


def cond(A, p=None, *, tape=None):
    """``torch.linalg.cond``: ``matrix_norm(A, p) * matrix_norm(inv(A), p)``; for ``p`` None
    or 2 (-2) the ratio of the largest to the smallest singular value (its inverse), for any
    ``(*, m, n)``; the other norms need square matrices, and a singular one's is inf (as
    PyTorch's), the others' of the batch unchanged.

    >>> float(tp.linalg.cond(tp.tensor(np.float32([[2, 0], [0, 1]]))))
    2.0
    """
    if p is None or (not isinstance(p, str) and p in (2, -2)):
        s = svdvals(A, tape=tape)
        big, small = amax(s, -1, tape=tape), amin(s, -1, tape=tape)
        return div(big, small, tape=tape) if p != -2 else div(small, big, tape=tape)
    inv, info = inv_ex(A, tape=tape)
    out = mul(matrix_norm(A, p, tape=tape), matrix_norm(inv, p, tape=tape), tape=tape)
    return where(gt(info, 0), math.inf, out, tape=tape)


class InvExResult(tuple):
    """``(inverse, info)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, inverse, info):
        return super().__new__(cls, (inverse, info))

    inverse = property(lambda self: self[0])
    info = property(lambda self: self[1])


class SolveExResult(tuple):
    """``(result, info)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, result, info):
        return super().__new__(cls, (result, info))

    result = property(lambda self: self[0])
    info = property(lambda self: self[1])


def inv_ex(A, *, check_errors: bool = False, tape=None) -> InvExResult:
    """``torch.linalg.inv_ex``: ``(inverse, info)``, ``info`` int32 per matrix (0, or the
    1-based column of the first zero pivot, whose inverse is then inf or NaN);
    ``check_errors=True`` raises as ``inv``.

    >>> int(tp.linalg.inv_ex(tp.tensor(np.float32([[1, 2], [2, 4]]))).info)
    2
    """
    a = _raw(A, "linalg.inv_ex")
    lu = lk.lu_factor(a, "linalg.inv_ex")
    n = a.shape[-1]
    x = Solve.apply(A, ck.eye(a.queue, n, n, FLOAT), tape=tape, op="linalg.inv_ex", lu=lu,
                    check_errors=bool(check_errors))
    return InvExResult(x, lu.info)


def solve_ex(A, B, *, left: bool = True, check_errors: bool = False, tape=None):
    """``torch.linalg.solve_ex``: ``(result, info)``: ``solve``'s result and ``inv_ex``'s
    ``info`` (over the broadcast batch), no error for a singular matrix unless
    ``check_errors``.

    >>> int(tp.linalg.solve_ex(tp.tensor(np.float32([[1, 2], [2, 4]])),
    ...                        tp.tensor(np.float32([1, 1]))).info)
    2
    """
    op = "linalg.solve_ex"
    vector = _is_vector_rhs(tuple(A.shape), tuple(B.shape))
    if not left:
        A = _mT(A, tape)
        if not vector:
            B = _mT(B, tape)
    if vector:
        B = unsqueeze(B, -1, tape=tape)
    a, b = _raw(A, op), _raw(B, op)
    n = lk.check_square(op, a)
    batch = _batch_shape(op, a.shape, b.shape) if b.ndim >= 2 else a.shape[:-2]
    lu = lk.lu_factor(_batched(a, batch, n, n).reshape(*batch, n, n), op)
    x = Solve.apply(A, B, tape=tape, op=op, lu=lu, check_errors=bool(check_errors))
    if vector:
        x = squeeze(x, -1, tape=tape)
    elif not left:
        x = _mT(x, tape)
    return SolveExResult(x, lu.info)


class _PivotsCheck(FlagCheck):
    """The flag of ``check_pivots``: the first pivot outside ``1..n``, or ``NO_ERROR``."""

    def __init__(self, op: str, flag: Tensor, shape: tuple, n: int):
        self.description = f"{op}'s check of its pivots"
        self.op, self.shape, self.n = op, shape, n
        super().__init__(flag)

    def error(self, host: np.ndarray) -> ShapeError | None:
        at = int(host[0])
        if at == lk.NO_ERROR:
            return None
        where_ = tuple(map(int, np.unravel_index(at, self.shape)))
        return ShapeError(f"{self.op}: pivots {self.shape} hold a pivot outside 1..{self.n} "
                          f"at {where_} (as PyTorch's 'Pivots given to lu_solve must all be "
                          "...'); pass the pivots of linalg.lu_factor (1-based, LAPACK's)")


def _broadcast(t: Tensor, shape: tuple) -> Tensor:
    """``t`` broadcast to ``shape`` (numpy rules) as a new contiguous tensor, or ``t`` itself
    if it has that shape; any dtype (int32 pivots as well as float32 factors)."""
    if tuple(t.shape) == shape:
        return t
    return strided.read_view(t, strided.View(shape, tuple(broadcast_strides(t.shape, shape))))


class LuSolve(Function):
    """``X`` from ``lu_factor``'s factors: ``A X = B`` or ``A^T X = B`` (``trans``); the
    gradient of ``B`` only (the factors come from ``lu_factor``, which has none)."""

    name = "lu_solve"

    def forward(self, b: Tensor, lu: Tensor = None, pivots: Tensor = None, trans=False):
        op = "linalg.lu_solve"
        n = lk.check_square(op, lu)
        check_rhs(op, b, lu)
        if pivots.shape != lu.shape[:-1]:
            raise ShapeError(f"{op}: pivots {pivots.shape} do not fit LU {lu.shape}: "
                             f"expected {lu.shape[:-1]}")
        if pivots.dtype != np.int32:
            raise DTypeError(f"{op}: pivots {pivots.shape} have dtype {pivots.dtype}, "
                             "expected int32 (linalg.lu_factor's)")
        if b.ndim < 2 or b.shape[-2] != n:
            raise ShapeError(f"{op}: B {b.shape} does not fit LU {lu.shape}: expected B of "
                             f"shape (*, {n}, k)")
        batch = _batch_shape(op, lu.shape, b.shape)
        k = b.shape[-1]
        count = int(np.prod(batch, dtype=np.int64))
        lu3 = _broadcast(lu, (*batch, n, n)).reshape(count, n, n)
        piv = _broadcast(pivots, (*batch, n)).reshape(count, n)
        check = _PivotsCheck(op, lk.check_pivots(pivots, n), pivots.shape, n)
        out = lk.lu_solve(lu3, piv, _batched(b, batch, n, k), trans).reshape(*batch, n, k)
        check.guard(out, not self.recording)
        self.saved = (lu3, piv, trans, b.shape, batch, check)
        return out

    def backward(self, g: Tensor):
        lu3, piv, trans, b_shape, batch, check = self.saved
        defer(check.check)
        count, n = piv.shape
        k = g.shape[-1]
        gb = lk.lu_solve(lu3, piv, g.reshape(count, n, k), not trans)
        return sum_to_shape(gb.reshape(*batch, n, k), b_shape)


def lu_solve(LU, pivots, B, *, left: bool = True, adjoint: bool = False,  # noqa: N803
             tape=None):
    """``torch.linalg.lu_solve``: ``X`` with ``A X = B`` (``A^T X = B`` where ``adjoint``;
    ``X A = B`` where ``left=False``) from ``lu_factor``'s ``(LU, pivots)``; the gradient of
    ``B`` (the factors have none: ``lu_factor`` refuses one).

    >>> LU, piv = tp.linalg.lu_factor(tp.tensor(np.float32([[2, 0], [0, 4]])))
    >>> tp.linalg.lu_solve(LU, piv, tp.tensor(np.float32([[2], [2]]))).to_host()
    array([[1. ],
           [0.5]], dtype=float32)
    """
    if isinstance(LU, Node) and LU.requires_grad:
        raise ParclError(f"linalg.lu_solve: LU {LU.shape} requires grad, but parcl's factors "
                         "have no gradient; use linalg.solve for one")
    lu, piv = _raw(LU, "linalg.lu_solve"), _raw(pivots, "linalg.lu_solve")
    if left:
        return LuSolve.apply(B, tape=tape, lu=lu, pivots=piv, trans=bool(adjoint))
    # X A = B: A^T X^T = B^T
    x = LuSolve.apply(_mT(B, tape), tape=tape, lu=lu, pivots=piv, trans=not adjoint)
    return _mT(x, tape)


def cholesky_inverse(L, upper: bool = False, *, tape=None):
    """``torch.cholesky_inverse``: ``A^-1`` for ``A = L L^T`` (``U^T U`` where ``upper``)
    given the Cholesky factor: ``cholesky_solve`` of the identity, so its gradient.

    >>> tp.cholesky_inverse(tp.tensor(np.float32([[2, 0], [0, 1]]))).to_host()
    array([[0.25, 0.  ],
           [0.  , 1.  ]], dtype=float32)
    """
    op = "cholesky_inverse"
    f = _raw(L, op)
    n = lk.check_square(op, f)
    return CholeskySolve.apply(ck.eye(f.queue, n, n, FLOAT), L, tape=tape, upper=bool(upper),
                               op=op, check_diagonal=True)

