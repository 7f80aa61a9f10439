"""Factorisations and solves of small batched square matrices, on the device (no host LAPACK):
``det``, ``slogdet``, ``logdet``, ``inverse``, ``solve``, ``cholesky``, ``cholesky_ex``,
``cholesky_solve``, ``solve_triangular``, ``lu_factor`` and ``matrix_power`` (PyTorch's
``torch.linalg`` names live in ``tp.linalg``; the ones PyTorch also has at the top level are
``tp`` ops too).

Every factorisation is ``parcl.kernels.linalg``'s: LU with partial pivoting or Cholesky, one
work-item per matrix, float32, ``n`` from 1 to ``MAX_N`` (128) rows; a bigger matrix is a
``ShapeError``. Gradients by the standard formulas: ``det``: ``g det A^-T``; ``slogdet``:
``g A^-T``; ``solve``: ``gB = A^-T G``, ``gA = -gB X^T`` (``inverse`` is ``solve(A, I)``);
``cholesky``: ``L^-T Φ(L^T gL) L^-1``, symmetrised (Φ: the lower triangle, its diagonal
halved); ``solve_triangular``: the ``solve`` pair, ``gA`` kept to ``A``'s triangle.

A singular matrix (an exact zero pivot, as LAPACK's) has ``det`` 0 and ``slogdet`` (0, -inf)
as PyTorch's; ``inverse`` and ``solve`` of it, and ``cholesky`` of a matrix that is not
positive-definite, raise ``LinAlgError`` at the first host read of the result (or of a value
computed from it), in the backward, or at once where nothing records: the factorisation's
flag is read without a stall (``checks.FlagCheck``). The gradient of ``det`` or ``slogdet``
at a singular matrix (where PyTorch takes the adjugate) is a ``LinAlgError`` too.

>>> a = tp.tensor(np.array([[2.0, 1.0], [1.0, 3.0]], np.float32), requires_grad=True)
>>> float(tp.det(a)), tp.inverse(a).to_host()
(5.0, array([[ 0.6, -0.2],
       [-0.2,  0.4]], dtype=float32))
"""

from __future__ import annotations

from math import prod
from numbers import Integral

import numpy as np

from ...errors import LinAlgError, ParclError, ShapeError
from ...kernels import creation as ck
from ...kernels import elementwise as ew
from ...kernels import linalg as lk
from ...kernels.gemm import batched_gemm
from ...kernels.reduction import sum_to_shape
from ...tensor import Tensor
from ..node import Function, Node
from ..tape import defer
from .checks import FlagCheck
from .elementwise import mul
from .linalg import matmul
from .mathops import lt
from .select import where
from .shape import squeeze, unsqueeze
from .shape_more import swapaxes
from .slices import tril, triu

__all__ = ["cholesky_solve", "det", "inverse", "logdet", "matrix_power", "slogdet"]


class _FactorCheck(FlagCheck):
    """The flag of ``lu_factor`` or ``cholesky``: the smallest ``matrix * n + column`` that
    failed, or ``NO_ERROR``."""

    def __init__(self, op: str, flag: Tensor, shape: tuple, what: str):
        self.description = f"{op}'s check of its input"
        self.op, self.shape, self.what = op, shape, what
        super().__init__(flag)

    def error(self, host: np.ndarray) -> LinAlgError | None:
        at = int(host[0])
        if at == lk.NO_ERROR:
            return None
        n = self.shape[-1]
        matrix, column = divmod(at, n)
        where_ = (f" (matrix {tuple(map(int, np.unravel_index(matrix, self.shape[:-2])))} of "
                  "the batch)" if len(self.shape) > 2 else "")
        return LinAlgError(f"{self.op}: the input {self.shape} is {self.what}{where_}: "
                           f"{self.detail(column)}")

    def detail(self, column: int) -> str:
        return (f"the pivot of column {column} is zero, so it has no inverse (as PyTorch's "
                f"'the diagonal element {column + 1} is zero'); check the matrix's rank")


class _SingularGradientCheck(_FactorCheck):
    def detail(self, column: int) -> str:
        return (f"its pivot of column {column} is zero; the gradient of {self.op} at a "
                "singular matrix (PyTorch's adjugate) is not supported")


class _CholeskyCheck(_FactorCheck):
    def detail(self, column: int) -> str:
        return (f"its leading minor of order {column + 1} is not positive-definite (as "
                "PyTorch's); cholesky takes symmetric positive-definite matrices")


def _raw(x, op: str = "linalg") -> Tensor:
    if isinstance(x, Node):
        return x.value
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a tp.Node or pc.Tensor, got {type(x).__name__}")
    return x


def _needs_grad(x) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _mT(x, tape=None):
    return swapaxes(x, -2, -1, tape=tape)


def _batched(t: Tensor, batch: tuple, r: int, c: int) -> Tensor:
    """``t`` ``(*its batch, r, c)`` broadcast to ``(*batch, r, c)`` as ``(count, r, c)``."""
    if t.shape[:-2] != batch:
        t = ew.broadcast_to(t, (*batch, r, c))
    return t.reshape(prod(batch), r, c)


def _eye_like(a: Tensor) -> Tensor:
    n = a.shape[-1]
    return _batched(ck.eye(a.queue, n, n, a.dtype), a.shape[:-2], n, n)


def _scaled(m: Tensor, s: Tensor) -> Tensor:
    """``m`` ``(*batch, n, n)`` times ``s`` ``(*batch)`` per matrix."""
    return mul(m, s.reshape(*s.shape, 1, 1))


def _batch_shape(op: str, a_shape: tuple, b_shape: tuple) -> tuple:
    ba, bb = a_shape[:-2], b_shape[:-2]
    try:
        return tuple(np.broadcast_shapes(ba, bb))
    except ValueError:
        raise ShapeError(f"{op}: the batch dims of A {a_shape} and B {b_shape} do not "
                         "broadcast (numpy rules)") from None


class _FromLU(Function):
    """``det`` or ``slogdet``'s ``logabsdet`` of factors computed once for both (``lu``)."""

    name = "det"

    def forward(self, a: Tensor, lu: lk.LU | None = None, op: str = "det"):
        if self.recording:          # a singular matrix is fine, but not its gradient
            self.lu = lu
            self.check = _SingularGradientCheck(op, lu.flag, a.shape, "singular")
        return lu.det if op == "det" else lu.logabsdet

    def backward(self, g: Tensor):
        defer(self.check.check)
        lu = self.lu
        n = lu.lu.shape[-1]
        batch = lu.lu.shape[:-2]
        count = prod(batch)
        inv_t = lk.lu_solve(lu.lu.reshape(count, n, n), lu.pivots.reshape(count, n),
                            _eye_like(lu.lu), trans=True).reshape(lu.lu.shape)
        scale = mul(g, lu.det) if self.name == "det" else g
        return _scaled(inv_t, scale)


class _LogAbsDet(_FromLU):
    name = "slogdet"


def det(A, *, tape=None):
    """``torch.linalg.det``: the determinant of each matrix of ``A`` ``(*, n, n)`` (``(*)``),
    0 for a singular one. Gradient ``g det A^-T``. op_name ``"det"``.

    >>> float(tp.det(tp.tensor(np.array([[1.0, 3.0], [2.0, 4.0]]))))
    -2.0
    """
    return _FromLU.apply(A, tape=tape, lu=lk.lu_factor(_raw(A, "det"), "det"),
                          op="det")


class SlogdetResult(tuple):
    """``(sign, logabsdet)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, sign, logabsdet):
        return super().__new__(cls, (sign, logabsdet))

    sign = property(lambda self: self[0])
    logabsdet = property(lambda self: self[1])


def slogdet(A, *, tape=None) -> SlogdetResult:
    """``torch.linalg.slogdet``: ``(sign, logabsdet)`` of each matrix of ``A``, with ``det =
    sign * exp(logabsdet)``; ``(0, -inf)`` for a singular one. ``sign`` is a raw Tensor (no
    gradient); ``logabsdet``'s gradient is ``g A^-T``. op_name ``"slogdet"``.

    >>> s, l = tp.slogdet(tp.tensor(np.array([[1.0, 2.0], [3.0, 4.0]])))
    >>> float(s), round(float(l), 4)
    (-1.0, 0.6931)
    """
    lu = lk.lu_factor(_raw(A, "slogdet"), "slogdet")
    return SlogdetResult(lu.sign, _LogAbsDet.apply(A, tape=tape, lu=lu, op="slogdet"))


def logdet(A, *, tape=None):
    """``torch.logdet``: ``log(det(A))``: NaN where the determinant is negative, -inf where
    it is 0. The gradient is ``slogdet``'s.

    >>> float(tp.logdet(tp.tensor(np.array([[2.0, 0.0], [0.0, 3.0]]))))
    1.7917594909667969
    """
    sign, logabs = slogdet(A, tape=tape)
    return where(lt(sign, 0.0), float("nan"), logabs, tape=tape)


class Solve(Function):
    """``X`` with ``A X = B`` for ``A`` ``(*, n, n)`` and ``B`` ``(*, n, k)``, batch dims
    broadcast."""

    name = "solve"

    def forward(self, a: Tensor, b: Tensor, op: str = "linalg.solve", lu: lk.LU | None = None,
                check_errors: bool = True):
        n = lk.check_square(op, a)
        if b.ndim < 2 or b.shape[-2] != n:
            raise ShapeError(f"{op}: B {b.shape} does not fit A {a.shape}: expected B of "
                             f"shape (*, {n}, k) (or (*, {n}) for vectors)")
        self.shapes = (a.shape, b.shape)
        batch = _batch_shape(op, a.shape, b.shape)
        k = b.shape[-1]
        count = prod(batch)
        if lu is None:              # else factored by the caller, on A broadcast to batch
            lu = lk.lu_factor(_batched(a, batch, n, n), op)
        lu = lk.LU(lu.lu.reshape(count, n, n), lu.pivots.reshape(count, n), lu.info, lu.sign,
                   lu.logabsdet, lu.det, lu.flag)
        x = lk.lu_solve(lu.lu, lu.pivots, _batched(b, batch, n, k))
        check = _FactorCheck(op, lu.flag, (*batch, n, n), "singular")
        out = x.reshape(*batch, n, k)
        if check_errors:
            check.guard(out, not self.recording)
        if self.recording:
            self.saved = (lu, x, check, batch)
        return out

    def backward(self, g: Tensor):
        lu, x, check, batch = self.saved
        defer(check.check)         # a singular matrix has no gradient (inv_ex, solve_ex too)
        a_shape, b_shape = self.shapes
        count, n, k = x.shape
        gb = lk.lu_solve(lu.lu, lu.pivots, g.reshape(count, n, k), trans=True)
        ga = None
        if self.needs_input_grad[0]:
            ga = ew.scale_(batched_gemm(gb, x, trans_b=True), -1.0)
            ga = sum_to_shape(ga.reshape(*batch, n, n), a_shape)
        if self.needs_input_grad[1]:
            gb = sum_to_shape(gb.reshape(*batch, n, k), b_shape)
        else:
            gb = None
        return ga, gb


def _is_vector_rhs(a_shape: tuple, b_shape: tuple) -> bool:
    # PyTorch's rule: B is a (batch of) vector(s) when 1-D, or when shaped as A without its
    # last dim
    return len(b_shape) == 1 or (len(b_shape) == len(a_shape) - 1
                                 and b_shape == a_shape[:-1])


def solve(A, B, *, left: bool = True, tape=None):
    """``torch.linalg.solve``: ``X`` with ``A X = B`` (``X A = B`` where ``left=False``) for
    ``A`` ``(*, n, n)`` and ``B`` ``(*, n, k)`` or ``(*, n)`` (vectors: ``B`` 1-D or shaped
    ``A.shape[:-1]``), batch dims broadcast. A singular ``A`` is a ``LinAlgError``.

    >>> tp.linalg.solve(tp.tensor(np.array([[2.0, 0.0], [0.0, 4.0]])),
    ...                 tp.tensor(np.array([2.0, 2.0]))).to_host()
    array([1. , 0.5], dtype=float32)
    """
    a_shape, b_shape = tuple(A.shape), tuple(B.shape)
    if _is_vector_rhs(a_shape, b_shape):
        if not left:
            A = _mT(A, tape)
        x = Solve.apply(A, unsqueeze(B, -1, tape=tape), tape=tape)
        return squeeze(x, -1, tape=tape)
    if left:
        return Solve.apply(A, B, tape=tape)
    if len(b_shape) < 2:
        raise ShapeError(f"linalg.solve: B {b_shape} must be (*, k, n) with left=False (A "
                         f"{a_shape})")
    return _mT(Solve.apply(_mT(A, tape), _mT(B, tape), tape=tape), tape)


def inverse(A, *, tape=None):
    """``torch.linalg.inv`` (``torch.inverse``): the inverse of each matrix of ``A``
    ``(*, n, n)``, solved against the identity (``solve``'s gradient: ``-A^-T G A^-T``). A
    singular matrix is a ``LinAlgError``.

    >>> tp.inverse(tp.tensor(np.array([[2.0, 0.0], [0.0, 4.0]]))).to_host()
    array([[0.5 , 0.  ],
           [0.  , 0.25]], dtype=float32)
    """
    a = _raw(A, "linalg.inv")
    lk.check_square("linalg.inv", a)
    n = a.shape[-1]
    return Solve.apply(A, ck.eye(a.queue, n, n, a.dtype), tape=tape, op="linalg.inv")


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

    def forward(self, b: Tensor, factor: Tensor, upper: bool = False):
        op = "cholesky_solve"
        n = lk.check_square(op, factor)
        if b.ndim < 2 or b.shape[-2] != n:
            raise ShapeError(f"{op}: B {b.shape} does not fit the factor {factor.shape}: "
                             f"expected B of shape (*, {n}, k)")
        batch = _batch_shape(op, factor.shape, b.shape)
        k = b.shape[-1]
        f3 = _batched(factor, batch, n, n)
        x = self._solve(f3, _batched(b, batch, n, k), upper)
        if self.recording:
            self.saved = (f3, x, batch, b.shape, factor.shape, upper)
        return x.reshape(*batch, n, k)

    @staticmethod
    def _solve(f3: Tensor, b3: Tensor, upper: bool) -> Tensor:
        # lower: L y = b, L^T x = y; upper: U^T y = b, U x = y
        y = lk.solve_triangular(f3, b3, upper, trans=upper)
        return lk.solve_triangular(f3, y, upper, trans=not upper)

    def backward(self, g: Tensor):
        f3, x, batch, b_shape, f_shape, upper = self.saved
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
    >>> tp.cholesky_solve(tp.tensor(np.array([[4.0], [5.0]])), L).to_host()
    array([[0.75],
           [0.5 ]], dtype=float32)
    """
    return CholeskySolve.apply(B, L, tape=tape, upper=bool(upper))


class SolveTriangular(Function):
    """``X`` with ``A X = B``, ``A`` triangular, batch dims broadcast."""

    name = "solve_triangular"

    def forward(self, a: Tensor, b: Tensor, upper: bool = False, unit: bool = False):
        op = "linalg.solve_triangular"
        n = lk.check_square(op, a)
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


class LUFactorResult(tuple):
    """``(LU, pivots)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, LU, pivots):  # noqa: N803
        return super().__new__(cls, (LU, pivots))

    LU = property(lambda self: self[0])
    pivots = property(lambda self: self[1])


def lu_factor(A, *, pivot: bool = True) -> LUFactorResult:
    """``torch.linalg.lu_factor``: ``(LU, pivots)`` with ``P A = L U`` by partial pivoting,
    ``L`` (unit diagonal) below the diagonal of ``LU`` and ``U`` on and above it, ``pivots``
    1-based int32 (LAPACK's, as PyTorch's). Raw Tensors, no gradient: an ``A`` that requires
    one is a ``ParclError`` (detach it); ``pivot=False`` is refused (PyTorch's needs CUDA).

    >>> tp.linalg.lu_factor(tp.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))).pivots.to_host()
    array([2, 2], dtype=int32)
    """
    if not pivot:
        raise ShapeError(f"linalg.lu_factor: pivot=False is not supported (A {A.shape}); "
                         "PyTorch's also takes it on CUDA only")
    if _needs_grad(A):
        raise ParclError(f"linalg.lu_factor: A {A.shape} requires grad, but parcl's "
                         "lu_factor has no gradient; pass A.detach(), or use det, slogdet, "
                         "solve or inverse, which have theirs")
    f = lk.lu_factor(_raw(A, "linalg.lu_factor"), "linalg.lu_factor")
    return LUFactorResult(f.lu, f.pivots)


def matrix_power(A, n: int, *, tape=None):
    """``torch.linalg.matrix_power``: ``A`` to the integer power ``n`` by repeated squaring
    (``matmul``s, so their gradient); ``n = 0`` the identity, ``n < 0`` the inverse's power.

    >>> tp.matrix_power(tp.tensor(np.array([[1.0, 1.0], [0.0, 1.0]])), 3).to_host()
    array([[1., 3.],
           [0., 1.]], dtype=float32)
    """
    if isinstance(n, bool) or not isinstance(n, Integral):
        raise ShapeError(f"linalg.matrix_power: n must be an int, got {n!r}")
    a = _raw(A, "linalg.matrix_power")
    lk.check_square("linalg.matrix_power", a)
    n = int(n)
    if n == 0:
        # the identity, A kept in the graph with a zero gradient, as PyTorch's
        eye = _eye_like(a).reshape(a.shape)
        return where(1.0, eye, A, tape=tape)
    if n < 0:
        A, n = inverse(A, tape=tape), -n
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base, tape=tape)
        n >>= 1
        if n:
            base = matmul(base, base, tape=tape)
    return result
