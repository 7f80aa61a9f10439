"""LU factorisations and solves of small batched square matrices, on the device (no host
LAPACK): ``det``, ``slogdet``, ``logdet``, ``inverse``, ``solve``, ``lu_factor`` and
``matrix_power`` (PyTorch's ``torch.linalg`` names live in ``tp.linalg``; the ones PyTorch
also has at the top level are ``tp`` ops too). Cholesky and triangular solves are in
``linalg_cholesky``.

Every factorisation is ``parcl.kernels.linalg``'s LU with partial pivoting, one work-item per
matrix, float32, ``n`` from 1 to ``MAX_N`` (128) rows; a bigger matrix is a ``ShapeError``.
Gradients by the standard formulas: ``det``: ``g det A^-T``; ``slogdet``: ``g A^-T``;
``solve``: ``gB = A^-T G``, ``gA = -gB X^T`` (``inverse`` is ``solve(A, I)``).

A singular matrix (an exact zero pivot, as LAPACK's) has ``det`` 0 and ``slogdet`` (0, -inf)
as PyTorch's; ``inverse`` and ``solve`` of it raise ``LinAlgError`` at the first host read of
the result (or of a value computed from it), in the backward, or at once where nothing
records: the factorisation's flag is read without a stall (``checks.FlagCheck``). At a singular
matrix ``det``'s gradient is the adjugate's transpose (the cofactors, from the SVD);
``slogdet``'s (infinite there) is a ``LinAlgError``.

>>> a = tp.tensor(np.array([[2.0, 1.0], [1.0, 3.0]], np.float32), requires_grad=True)
>>> float(tp.det(a)), tp.inverse(a).to_host()
(5.0, array([[ 0.6, -0.2],
       [-0.2,  0.4]], dtype=float32))
"""

from __future__ import annotations

from math import prod
from numbers import Integral

import numpy as np

from ...errors import DTypeError, LinAlgError, ParclError, ShapeError
from ...kernels import creation as ck
from ...kernels import elementwise as ew
from ...kernels import linalg as lk
from ...kernels.gemm import batched_gemm
from ...kernels.reduction import sum_to_shape
from ...tensor import FLOAT, Tensor
from ..node import Function, Node
from ..tape import defer
from .checks import FlagCheck
from .creation import value_of
from .elementwise import mul
from .indexing import flip
from .join import cat
from .linalg import matmul
from .mathops import eq, lt
from .scans import cumprod
from .select import where
from .shape import squeeze, unsqueeze
from .shape_more import swapaxes
from .slices import narrow

__all__ = ["det", "inverse", "logdet", "matrix_power", "slogdet"]


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
        return (f"its pivot of column {column} is zero, so logabsdet is -inf and its "
                "gradient infinite; det's gradient there is the adjugate's transpose")


def _raw(x, op: str = "linalg") -> Tensor:
    return value_of(op, x)


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


def check_rhs(op: str, b: Tensor, a: Tensor) -> None:
    """``B`` float32 as ``A``: the kernels read its buffer as floats (PyTorch's "Expected A
    and B to have the same dtype")."""
    if b.dtype != FLOAT:
        raise DTypeError(f"{op}: B {b.shape} has dtype {b.dtype}, expected float32 as A "
                         f"{a.shape}; convert it with .astype(np.float32) before "
                         "Tensor.from_host")


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
        if self.recording:
            self.a, self.lu = a, lu
            if op != "det":          # a singular matrix is fine, but not its gradient
                self.check = _SingularGradientCheck(op, lu.flag, a.shape, "singular")
        return lu.det if op == "det" else lu.logabsdet

    def _inverse_t(self) -> Tensor:
        lu = self.lu
        n = lu.lu.shape[-1]
        count = prod(lu.lu.shape[:-2])
        return lk.lu_solve(lu.lu.reshape(count, n, n), lu.pivots.reshape(count, n),
                           _eye_like(lu.lu), trans=True).reshape(lu.lu.shape)


class _Det(_FromLU):
    def backward(self, g: Tensor):
        # g det A^-T, and where A is singular (A^-T inf or NaN) the adjugate's transpose from
        # the SVD: det(U) det(Vh) U diag(prod_{j != i} s_j) Vh. Both are computed (an SVD in
        # every det backward): choosing on the host would wait for the pivots' flag.
        lu = self.lu
        grad = _scaled(self._inverse_t(), mul(g, lu.det))
        singular = eq(lu.sign, 0.0)          # slogdet's sign: 0 exactly where singular
        adj = _adjugate_t(self.a)
        return where(unsqueeze(unsqueeze(singular, -1), -1), _scaled(adj, g), grad)


class _LogAbsDet(_FromLU):
    name = "slogdet"

    def backward(self, g: Tensor):
        defer(self.check.check)
        return _scaled(self._inverse_t(), g)


def _adjugate_t(a: Tensor) -> Tensor:
    """``adj(a)^T`` of ``a`` ``(*, n, n)`` through its SVD (any rank)."""
    from .linalg_decomp import _Svd
    n = a.shape[-1]
    d = _Svd(a, False, "det")
    s = d.s
    if n == 1:
        products = Tensor.full(a.queue, s.shape, 1.0)
    else:           # prod_{j != i} s_j: the products before i times those after it
        ones = Tensor.full(a.queue, (*s.shape[:-1], 1), 1.0)
        before = cumprod(cat([ones, narrow(s, -1, 0, n - 1)], -1), -1)
        after = flip(cumprod(flip(cat([narrow(s, -1, 1, n - 1), ones], -1), -1), -1), -1)
        products = mul(before, after)
    count = prod(a.shape[:-2])
    signs = mul(lk.lu_factor(d.u.reshape(count, n, n), "det").det,
                lk.lu_factor(d.vh.reshape(count, n, n), "det").det).reshape(a.shape[:-2])
    return _scaled(matmul(mul(d.u, unsqueeze(products, -2)), d.vh), signs)


def det(A, *, tape=None):
    """``torch.linalg.det``: the determinant of each matrix of ``A`` ``(*, n, n)`` (``(*)``),
    0 for a singular one. Gradient ``g det A^-T``, at a singular matrix the adjugate's
    transpose (the cofactors, from the SVD). op_name ``"det"``.

    >>> float(tp.det(tp.tensor(np.array([[1.0, 3.0], [2.0, 4.0]]))))
    -2.0
    """
    return _Det.apply(A, tape=tape, lu=lk.lu_factor(_raw(A, "det"), "det"), op="det")


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
        check_rhs(op, b, a)
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


class LUFactorResult(tuple):
    """``(LU, pivots)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, LU, pivots):  # noqa: N803
        return super().__new__(cls, (LU, pivots))

    LU = property(lambda self: self[0])
    pivots = property(lambda self: self[1])


class LUFactorExResult(tuple):
    """``(LU, pivots, info)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, LU, pivots, info):  # noqa: N803
        return super().__new__(cls, (LU, pivots, info))

    LU = property(lambda self: self[0])
    pivots = property(lambda self: self[1])
    info = property(lambda self: self[2])


class _LUFactorCheck(_FactorCheck):
    def detail(self, column: int) -> str:
        return (f"U[{column + 1},{column + 1}] is zero and using it on lu_solve would divide "
                "by zero (as PyTorch's); use linalg.lu_factor_ex or linalg.lu for the factors "
                "of a singular matrix")


def factor_without_grad(A, pivot: bool, op: str) -> lk.LU:
    """``lk.lu_factor`` of ``A`` for the ops whose factors have no gradient (refused where
    ``A`` requires one)."""
    if not pivot:
        raise ShapeError(f"{op}: pivot=False is not supported (A {A.shape}); PyTorch's also "
                         "takes it on CUDA only")
    if _needs_grad(A):
        raise ParclError(f"{op}: A {A.shape} requires grad, but parcl's lu_factor has no "
                         "gradient; pass A.detach(), or use det, slogdet, solve or inverse, "
                         "which have theirs")
    return lk.lu_factor(_raw(A, op), op)


def lu_factor(A, *, pivot: bool = True) -> LUFactorResult:
    """``torch.linalg.lu_factor``: ``(LU, pivots)`` with ``P A = L U`` by partial pivoting,
    ``L`` (unit diagonal) below the diagonal of ``LU`` and ``U`` on and above it, ``pivots``
    1-based int32 (LAPACK's, as PyTorch's). Raw Tensors, no gradient: an ``A`` that requires
    one is a ``ParclError`` (detach it); ``pivot=False`` is refused (PyTorch's needs CUDA). A
    singular matrix (a zero pivot) is a ``LinAlgError``, as PyTorch's (``lu_factor_ex`` gives
    its factors).

    >>> tp.linalg.lu_factor(tp.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))).pivots.to_host()
    array([2, 2], dtype=int32)
    """
    op = "linalg.lu_factor"
    f = factor_without_grad(A, pivot, op)
    _LUFactorCheck(op, f.flag, f.lu.shape, "singular").guard(f.lu, True)
    return LUFactorResult(f.lu, f.pivots)


def lu_factor_ex(A, *, pivot: bool = True, check_errors: bool = False) -> LUFactorExResult:
    """``torch.linalg.lu_factor_ex``: ``lu_factor``'s ``(LU, pivots)`` and ``info`` (int32
    per matrix: 0, or the 1-based column of the first zero pivot), no error for a singular
    matrix unless ``check_errors``.

    >>> int(tp.linalg.lu_factor_ex(tp.tensor(np.float32([[1, 2], [2, 4]]))).info)
    2
    """
    op = "linalg.lu_factor_ex"
    f = factor_without_grad(A, pivot, op)
    if check_errors:
        _LUFactorCheck(op, f.flag, f.lu.shape, "singular").guard(f.lu, True)
    return LUFactorExResult(f.lu, f.pivots, f.info)


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
