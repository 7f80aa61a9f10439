"""Cholesky factorisations and triangular solves of small batched matrices, on the device:
``cholesky``, ``cholesky_ex``, ``solve_triangular`` (``tp.linalg``'s) and ``cholesky_solve``
(a ``tp`` op too, as ``torch.cholesky_solve``), on ``parcl.kernels.linalg``'s kernels (one
work-item per matrix or right-hand column, ``n`` up to 128).

Gradients PyTorch's: ``cholesky``: ``L^-T Φ(L^T gL) L^-1`` symmetrised (Φ: the lower
triangle, its diagonal halved); ``solve_triangular``: ``gB = A^-T G``, ``gA = -gB X^T`` kept
to ``A``'s triangle; ``cholesky_solve``: that of ``A = L L^T`` with ``L`` a full matrix. A
matrix that is not positive-definite is a ``LinAlgError`` from ``cholesky`` (at the first
host read of the factor, in the backward, or at once where nothing records), an ``info``
from ``cholesky_ex``.

>>> tp.linalg.cholesky(tp.tensor(np.float32([[4, 2], [2, 5]]))).to_host()
array([[2., 0.],
       [1., 2.]], dtype=float32)
"""

from __future__ import annotations

from ...errors import ShapeError
from ...kernels import elementwise as ew
from ...kernels import linalg as lk
from ...kernels.gemm import batched_gemm
from ...kernels.reduction import sum_to_shape
from ...tensor import Tensor
from ..node import Function
from ..tape import defer
from .elementwise import mul
from .linalg import matmul
from .linalg_solve import _batch_shape, _batched, _FactorCheck, _mT, _raw, check_rhs
from .slices import tril, triu

__all__ = ["cholesky_solve"]


class _CholeskyCheck(_FactorCheck):
    def detail(self, column: int) -> str:
        return (f"its leading minor of order {column + 1} is not positive-definite (as "
                "PyTorch's); cholesky takes symmetric positive-definite matrices")


class _ZeroDiagonalCheck(_FactorCheck):
    def detail(self, column: int) -> str:
        return (f"the diagonal element {column + 1} of the factor is zero, so the matrix it "
                "factors is singular (as PyTorch's)")


class Cholesky(Function):
    """The Cholesky factor, computed before (``factor``: ``lk.cholesky``'s output and flag,
    so that ``cholesky_ex`` has its ``info`` whether or not this records)."""

    name = "cholesky"

    def forward(self, a: Tensor, factor=None, upper: bool = False,
                op: str = "linalg.cholesky", check_errors: bool = True):
        out, flag = factor
        check = None
        if check_errors:
            check = _CholeskyCheck(op, flag, a.shape, "not positive-definite")
            check.guard(out, not self.recording)
        if self.recording:
            self.saved = (out, upper, check)
        return out

    def backward(self, g: Tensor):
        factor, upper, check = self.saved
        if check is not None:
            defer(check.check)
        # in the lower form, A = L L^T: S = L^-T phi(L^T gL) L^-1, gA = (S + S^T) / 2
        L, gL = (_mT(factor), _mT(g)) if upper else (factor, g)
        phi = tril(matmul(_mT(L), gL))
        phi = ew.binary("sub", phi, mul(_diagonal_matrix(phi), 0.5))
        shape = L.shape
        n = shape[-1]
        count = L.size // (n * n)
        L3 = L.reshape(count, n, n)
        s = lk.solve_triangular(L3, phi.reshape(count, n, n), upper=False, trans=True)
        s = _mT(lk.solve_triangular(L3, _mT(s), upper=False, trans=True))
        return mul(ew.binary("add", s, _mT(s)), 0.5).reshape(shape)


def _diagonal_matrix(m: Tensor) -> Tensor:
    """``m`` with everything off its diagonal zeroed."""
    return tril(triu(m))


def _cholesky(A, upper, check_errors: bool, op: str, tape):
    a = _raw(A, op)
    out, info, flag = lk.cholesky(a, bool(upper), op)
    L = Cholesky.apply(A, tape=tape, factor=(out, flag), upper=bool(upper), op=op,
                       check_errors=check_errors)
    return L, info


class CholeskyExResult(tuple):
    """``(L, info)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, L, info):  # noqa: N803
        return super().__new__(cls, (L, info))

    L = property(lambda self: self[0])
    info = property(lambda self: self[1])


def cholesky(A, *, upper: bool = False, tape=None):
    """``torch.linalg.cholesky``: ``L`` lower with ``A = L L^T`` (``U`` upper, ``A = U^T U``
    where ``upper``), from ``A``'s lower (upper) triangle. A matrix that is not
    positive-definite is a ``LinAlgError``.

    >>> tp.linalg.cholesky(tp.tensor(np.array([[4.0, 2.0], [2.0, 5.0]]))).to_host()
    array([[2., 0.],
           [1., 2.]], dtype=float32)
    """
    return _cholesky(A, upper, True, "linalg.cholesky", tape)[0]


def cholesky_ex(A, *, upper: bool = False, check_errors: bool = False, tape=None):
    """``torch.linalg.cholesky_ex``: ``(L, info)``, ``info`` (int32, one per matrix) 0 or
    the order of the first leading minor that is not positive-definite (``L`` then holds the
    columns before it, zeros after). ``check_errors=True`` raises as ``cholesky``.

    >>> L, info = tp.linalg.cholesky_ex(tp.tensor(np.array([[1.0, 2.0], [2.0, 1.0]])))
    >>> int(info)
    2
    """
    return CholeskyExResult(*_cholesky(A, upper, bool(check_errors), "linalg.cholesky_ex",
                                       tape))


class CholeskySolve(Function):
    """``X`` with ``(L L^T) X = B`` (``(U^T U) X = B``), batch dims broadcast; the gradient
    of the factor is PyTorch's, that of ``A = L L^T`` with ``L`` a full matrix."""

    name = "cholesky_solve"

    def forward(self, b: Tensor, factor: Tensor, upper: bool = False, op: str = "cholesky_solve",
                check_diagonal: bool = False):
        n = lk.check_square(op, factor)
        check_rhs(op, b, factor)
        if b.ndim < 2 or b.shape[-2] != n:
            raise ShapeError(f"{op}: B {b.shape} does not fit the factor {factor.shape}: "
                             f"expected B of shape (*, {n}, k)")
        batch = _batch_shape(op, factor.shape, b.shape)
        k = b.shape[-1]
        f3 = _batched(factor, batch, n, n)
        x = self._solve(f3, _batched(b, batch, n, k), upper)
        out = x.reshape(*batch, n, k)
        check = None
        if check_diagonal:           # cholesky_inverse's, as PyTorch's (cholesky_solve has none)
            check = _ZeroDiagonalCheck(op, lk.zero_diagonal(f3), (*batch, n, n), "singular")
            check.guard(out, not self.recording)
        if self.recording:
            self.saved = (f3, x, batch, b.shape, factor.shape, upper, check)
        return out

    @staticmethod
    def _solve(f3: Tensor, b3: Tensor, upper: bool) -> Tensor:
        # lower: L y = b, L^T x = y; upper: U^T y = b, U x = y
        y = lk.solve_triangular(f3, b3, upper, trans=upper)
        return lk.solve_triangular(f3, y, upper, trans=not upper)

    def backward(self, g: Tensor):
        f3, x, batch, b_shape, f_shape, upper, check = self.saved
        if check is not None:
            defer(check.check)
        count, n, k = x.shape
        gb = self._solve(f3, g.reshape(count, n, k), upper)
        gf = None
        if self.needs_input_grad[1]:
            common = batched_gemm(gb, x, trans_b=True)
            common = ew.binary("add", common, _mT(common))
            gf = batched_gemm(f3, common) if upper else batched_gemm(common, f3)
            gf = sum_to_shape(ew.scale_(gf, -1.0).reshape(*batch, n, n), f_shape)
        gb = sum_to_shape(gb.reshape(*batch, n, k), b_shape) if self.needs_input_grad[0] \
            else None
        return gb, gf


def cholesky_solve(B, L, upper: bool = False, *, tape=None):
    """``torch.cholesky_solve``: ``X`` with ``A X = B`` for ``A = L L^T`` given its Cholesky
    factor ``L`` ``(*, n, n)`` (``U``, ``A = U^T U``, where ``upper``; only that triangle
    read) and ``B`` ``(*, n, k)``, batch dims broadcast: two triangular solves. The factor's
    gradient is PyTorch's (``-(G X^T + X G^T) L``, ``G = A^-1 gX``: ``L`` taken as a full
    matrix).

    >>> L = tp.tensor(np.array([[2.0, 0.0], [1.0, 2.0]]))
    >>> tp.cholesky_solve(tp.tensor(np.array([[4.0], [5.0]])), L).to_host()   # A [[4, 2], [2, 5]]
    array([[0.625],
           [0.75 ]], dtype=float32)
    """
    return CholeskySolve.apply(B, L, tape=tape, upper=bool(upper))


class SolveTriangular(Function):
    """``X`` with ``A X = B``, ``A`` triangular, batch dims broadcast."""

    name = "solve_triangular"

    def forward(self, a: Tensor, b: Tensor, upper: bool = False, unit: bool = False):
        op = "linalg.solve_triangular"
        n = lk.check_square(op, a)
        check_rhs(op, b, a)
        if b.ndim < 2 or b.shape[-2] != n:
            raise ShapeError(f"{op}: B {b.shape} does not fit A {a.shape}: expected B of "
                             f"shape (*, {n}, k)")
        batch = _batch_shape(op, a.shape, b.shape)
        k = b.shape[-1]
        a3 = _batched(a, batch, n, n)
        x = lk.solve_triangular(a3, _batched(b, batch, n, k), upper, unit=unit)
        if self.recording:
            self.saved = (a3, x, batch, a.shape, b.shape, upper, unit)
        return x.reshape(*batch, n, k)

    def backward(self, g: Tensor):
        a3, x, batch, a_shape, b_shape, upper, unit = self.saved
        count, n, k = x.shape
        gb = lk.solve_triangular(a3, g.reshape(count, n, k), upper, trans=True, unit=unit)
        ga = None
        if self.needs_input_grad[0]:
            ga = ew.scale_(batched_gemm(gb, x, trans_b=True), -1.0)
            ga = triu(ga, 1 if unit else 0) if upper else tril(ga, -1 if unit else 0)
            ga = sum_to_shape(ga.reshape(*batch, n, n), a_shape)
        gb = sum_to_shape(gb.reshape(*batch, n, k), b_shape) if self.needs_input_grad[1] \
            else None
        return ga, gb


def solve_triangular(A, B, *, upper: bool, left: bool = True, unitriangular: bool = False,
                     tape=None):
    """``torch.linalg.solve_triangular``: ``X`` with ``A X = B`` (``X A = B`` where
    ``left=False``) for a triangular ``A`` ``(*, n, n)`` (only its ``upper`` or lower
    triangle read; its diagonal taken as ones where ``unitriangular``) and ``B`` ``(*, n,
    k)`` (``(*, k, n)`` where ``left=False``), batch dims broadcast. A zero on the diagonal
    gives inf or NaN, as PyTorch's (no check).

    >>> tp.linalg.solve_triangular(tp.tensor(np.array([[2.0, 0.0], [1.0, 1.0]])),
    ...                            tp.tensor(np.array([[2.0], [3.0]])), upper=False).to_host()
    array([[1.],
           [2.]], dtype=float32)
    """
    if left:
        return SolveTriangular.apply(A, B, tape=tape, upper=bool(upper),
                                     unit=bool(unitriangular))
    x = SolveTriangular.apply(_mT(A, tape), _mT(B, tape), tape=tape, upper=not upper,
                              unit=bool(unitriangular))
    return _mT(x, tape)
