"""Matrix functions, least squares and tensor forms of the solves: ``matrix_exp`` (a ``tp`` op
too, as ``torch.matrix_exp``), ``lstsq``, ``tensorinv``, ``tensorsolve`` (``tp.linalg``'s)
and ``pinverse`` (``torch.pinverse``).

``matrix_exp`` scales ``A`` by ``2^-s`` until its 1-norm is at most 1/2 (``s`` read from the
device: one wait), takes the [6/6] Padé approximant (a solve with the LU kernels, its error
far below float32's rounding at that norm) and squares ``s`` times. Its gradient is the
upper-right block of the exponential of ``[[A^T, G], [0, A^T]]`` (Mathias' identity, as
PyTorch's), so ``n`` is at most 64 where a gradient is taken.

>>> tp.matrix_exp(tp.tensor(np.float32([[0, 1], [0, 0]]))).to_host()
array([[1., 1.],
       [0., 1.]], dtype=float32)
"""

from __future__ import annotations

import math
from math import prod

from ...errors import ShapeError
from ...kernels import creation as ck
from ...kernels import linalg as lk
from ...tensor import FLOAT, Tensor
from ..node import Function
from .elementwise import add, mul, sub
from .indexing import expand
from .join import cat
from .linalg import matmul
from .counting import count_nonzero
from .linalg_decomp import _SingularValues
from .linalg_more import KeptSvd, Pinv, pinv
from .linalg_solve import _mT, _raw, factor_without_grad, inverse, solve
from .mathops import square
from .reduce import sum as sum_
from .reduce_dims import amax
from .scans import cumprod
from .select import where
from .shape import movedim, reshape, squeeze, unsqueeze
from .slices import narrow, tril, triu
from .unary import abs as abs_

__all__ = ["matrix_exp", "pinverse"]

# the [6/6] Pade coefficients c_k = (12 - k)! 6! / (12! k! (6 - k)!)
_PADE = [math.factorial(12 - k) * math.factorial(6)
         / (math.factorial(12) * math.factorial(k) * math.factorial(6 - k)) for k in range(7)]


def _expm(a: Tensor) -> Tensor:
    """``exp(a)`` of raw ``a`` ``(*, n, n)``: scaling, Pade [6/6], squaring."""
    n = a.shape[-1]
    # Read back (PyTorch's reads its norm to the CPU too): the norm sets how many squarings
    # are enqueued, and a fixed count for every input would lose accuracy at small norms.
    norm = float(amax(sum_(abs_(a), -2)).to_host().max()) if a.size else 0.0
    if not math.isfinite(norm):
        s = 0                     # NaN or inf: no squaring makes it finite; the result is NaN
    else:
        s = max(0, math.ceil(math.log2(norm / 0.5))) if norm > 0.5 else 0
    x = mul(a, 2.0 ** -s)
    eye = ck.eye(a.queue, n, n, FLOAT)
    power, even, odd = eye, mul(eye, _PADE[0]), None
    for k in range(1, 7):
        power = matmul(x, power) if k > 1 else x
        term = mul(power, _PADE[k])
        if k % 2:
            odd = term if odd is None else add(odd, term)
        else:
            even = add(even, term)
    numerator, denominator = add(even, odd), sub(even, odd)
    count = prod(a.shape[:-2])
    lu = lk.lu_factor(denominator.reshape(count, n, n), "matrix_exp")
    e = lk.lu_solve(lu.lu, lu.pivots, numerator.reshape(count, n, n)).reshape(a.shape)
    for _ in range(s):
        e = matmul(e, e)
    return e


class MatrixExp(Function):
    name = "matrix_exp"

    def forward(self, a: Tensor):
        lk.check_square("matrix_exp", a)
        if self.recording:
            self.a = a
        return _expm(a)

    def backward(self, g: Tensor):
        a = self.a
        n = a.shape[-1]
        if 2 * n > lk.MAX_N:
            raise ShapeError(f"matrix_exp: the gradient of a {n} x {n} matrix (input "
                             f"{a.shape}) is not supported: it takes the exponential of a "
                             f"{2 * n} x {2 * n} block matrix, and parcl's solves take at "
                             f"most {lk.MAX_N} rows")
        at = _mT(a)
        zeros = Tensor.zeros(a.queue, a.shape)
        block = cat([cat([at, g], -1), cat([zeros, at], -1)], -2)      # [[A^T, G], [0, A^T]]
        return narrow(narrow(_expm(block), -2, 0, n), -1, n, n)


def matrix_exp(A, *, tape=None):
    """``torch.linalg.matrix_exp`` (``torch.matrix_exp``): the exponential of each matrix of
    ``A`` ``(*, n, n)``; gradient by the block-matrix identity, as PyTorch's (``n`` up to 64
    there).

    >>> float(tp.matrix_exp(tp.tensor(np.float32([[1.0]]))))
    2.7182817459106445
    """
    return MatrixExp.apply(A, tape=tape)


def pinverse(input, rcond: float = 1e-15, *, tape=None):  # noqa: A002
    """``torch.pinverse``: ``tp.linalg.pinv(input, rtol=rcond)``.

    >>> tp.pinverse(tp.tensor(np.float32([[2, 0], [0, 0]]))).to_host()
    array([[0.5, 0. ],
           [0. , 0. ]], dtype=float32)
    """
    return pinv(input, rtol=rcond, tape=tape)


def tensorinv(A, ind: int = 2, *, tape=None):
    """``torch.linalg.tensorinv``: the inverse of ``A`` taken as the square matrix
    ``(prod(shape[:ind]), prod(shape[ind:]))``, shaped ``shape[ind:] + shape[:ind]``.

    >>> tp.linalg.tensorinv(tp.tensor(np.eye(4, dtype=np.float32).reshape(4, 2, 2)), 1).shape
    (2, 2, 4)
    """
    shape = tuple(A.shape)
    if not 0 < ind < len(shape) or isinstance(ind, bool):
        raise ShapeError(f"linalg.tensorinv: ind must be in [1, {len(shape) - 1}] for a tensor "
                         f"of shape {shape}, got {ind!r}")
    rows, cols = prod(shape[:ind]), prod(shape[ind:])
    if rows != cols:
        raise ShapeError(f"linalg.tensorinv: the product of the first ind={ind} dims of "
                         f"{shape} ({rows}) must equal that of the others ({cols})")
    inv = inverse(reshape(A, (rows, cols), tape=tape), tape=tape)
    return reshape(inv, shape[ind:] + shape[:ind], tape=tape)


def tensorsolve(A, B, dims=None, *, tape=None):
    """``torch.linalg.tensorsolve``: ``X`` with ``tensordot(A, X, X.ndim) = B``, ``X`` shaped
    ``A.shape[B.ndim:]`` (after ``dims`` of ``A`` are moved to the end).

    >>> a = tp.tensor(np.eye(6, dtype=np.float32).reshape(2, 3, 6))
    >>> tp.linalg.tensorsolve(a, tp.tensor(np.ones((2, 3), np.float32))).shape
    (6,)
    """
    if dims is not None:
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        nd = len(A.shape)
        A = movedim(A, dims, tuple(range(nd - len(dims), nd)), tape=tape)
    a_shape, b_shape = tuple(A.shape), tuple(B.shape)
    if a_shape[:len(b_shape)] != b_shape:
        raise ShapeError(f"linalg.tensorsolve: the leading dims of A {a_shape} must be B's "
                         f"shape {b_shape}")
    x_shape = a_shape[len(b_shape):]
    rows, cols = prod(b_shape), prod(x_shape)
    if rows != cols:
        raise ShapeError(f"linalg.tensorsolve: A {a_shape} must be square as a matrix "
                         f"(prod of B's dims {rows} == prod of the others {cols})")
    x = solve(reshape(A, (rows, cols), tape=tape), reshape(B, (rows,), tape=tape), tape=tape)
    return reshape(x, x_shape, tape=tape)


class LstsqResult(tuple):
    """``(solution, residuals, rank, singular_values)``, as PyTorch's named tuple (None where
    PyTorch's is an empty tensor)."""

    __slots__ = ()

    def __new__(cls, solution, residuals, rank, singular_values):
        return super().__new__(cls, (solution, residuals, rank, singular_values))

    solution = property(lambda self: self[0])
    residuals = property(lambda self: self[1])
    rank = property(lambda self: self[2])
    singular_values = property(lambda self: self[3])


_DRIVERS = (None, "gels", "gelsy", "gelsd", "gelss")


def lstsq(A, B, rcond: float | None = None, *, driver: str | None = None,
          tape=None) -> LstsqResult:
    """``torch.linalg.lstsq``: the minimum-norm least-squares ``X`` ``(*, n, k)`` minimising
    ``|A X - B|`` for ``A`` ``(*, m, n)`` and ``B`` ``(*, m, k)`` (or vectors ``(*, m)``, one
    dim fewer than ``A``: ``X`` ``(*, n)``), as ``pinv(A, rtol=rcond) @ B`` (``rcond`` ``eps *
    max(m, n)`` by default), so ``pinv``'s gradient. ``rank`` (int64)
    for every driver but ``"gels"``; ``"gelsd"`` and ``"gelss"`` also give the singular
    values, and with ``m > n`` and every matrix of full rank the squared residuals ``(*, k)``
    (a host read of the ranks). What PyTorch leaves empty is None.

    >>> a = tp.tensor(np.float32([[1, 0], [0, 1], [0, 0]]))
    >>> tp.linalg.lstsq(a, tp.tensor(np.float32([[1], [2], [3]]))).solution.to_host()
    array([[1.],
           [2.]], dtype=float32)
    """
    op = "linalg.lstsq"
    if driver not in _DRIVERS:
        raise ShapeError(f"{op}: driver must be one of {_DRIVERS}, got {driver!r}")
    a_shape, b_shape = tuple(A.shape), tuple(B.shape)
    # PyTorch's rule: B with one dim fewer than A is a (batch of) vector(s) (*, m)
    vector = len(a_shape) >= 2 and len(b_shape) == len(a_shape) - 1
    if vector:
        B = unsqueeze(B, -1, tape=tape)
        b_shape = tuple(B.shape)
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-2] != b_shape[-2]:
        raise ShapeError(f"{op}: expected A (*, m, n) and B (*, m, k) or (*, m) with the same "
                         f"m, got A {a_shape} and B {tuple(B.shape)}")
    m, n = a_shape[-2:]
    rtol = rcond if rcond is not None and rcond > 0 else None
    # one SVD gives the pseudo-inverse, the rank and the singular values
    kept = KeptSvd.of(op, _raw(A, op), None, rtol)
    x = matmul(Pinv.apply(A, tape=tape, kept=kept), B, tape=tape)
    rank = None if driver == "gels" else count_nonzero(kept.keep, -1)
    values = None
    if driver in ("gelsd", "gelss"):
        values = _SingularValues.apply(A, tape=tape, svd=kept.svd, part="s")
    residuals = None
    if driver in ("gels", "gelsd", "gelss") and m > n:
        full = rank if rank is not None else count_nonzero(kept.keep, -1)
        if (full.to_host() == n).all():
            residuals = sum_(square(sub(matmul(A, x, tape=tape), B, tape=tape), tape=tape), -2,
                             tape=tape)
    if vector:                  # PyTorch's residuals keep their k = 1
        x = squeeze(x, -1, tape=tape)
    return LstsqResult(x, residuals, rank, values)


def vander(x, *, N: int | None = None, tape=None):  # noqa: N803
    """``torch.linalg.vander``: the Vandermonde matrices ``(*, n, N)`` of ``x`` ``(*, n)``, the
    powers ``x ** 0 ... x ** (N-1)`` as columns (increasing, unlike ``tp.vander``), ``N``
    ``n`` by default and greater than 1. A cumulative product: the gradient at 0 is finite.

    >>> tp.linalg.vander(tp.tensor(np.float32([2, 3]))).to_host()
    array([[1., 2.],
           [1., 3.]], dtype=float32)
    """
    shape = tuple(x.shape)
    if not shape:
        raise ShapeError("linalg.vander: x must have at least one dimension, got a 0-d tensor")
    cols = shape[-1] if N is None else N
    if isinstance(cols, bool) or not isinstance(cols, int) or cols <= 1:
        raise ShapeError(f"linalg.vander: N must be an int greater than 1, got {N!r} (x "
                         f"{shape})")
    column = unsqueeze(x, -1, tape=tape)
    ones = where(0.0, column, 1.0, tape=tape)       # x ** 0, x kept with a zero gradient
    powers = cumprod(expand(column, (*shape, cols - 1), tape=tape), -1, tape=tape)
    return cat([ones, powers], -1, tape=tape)


class LuResult(tuple):
    """``(P, L, U)``, as PyTorch's named tuple."""

    __slots__ = ()

    def __new__(cls, P, L, U):  # noqa: N803
        return super().__new__(cls, (P, L, U))

    P = property(lambda self: self[0])
    L = property(lambda self: self[1])
    U = property(lambda self: self[2])


def lu(A, *, pivot: bool = True) -> LuResult:
    """``torch.linalg.lu`` for square matrices: ``(P, L, U)`` with ``A = P L U`` from
    ``lu_factor``'s factors (``P`` the permutation matrix, ``L`` unit lower, ``U`` upper).
    Raw Tensors, no gradient (an ``A`` that requires one is refused, as by ``lu_factor``).

    >>> P, L, U = tp.linalg.lu(tp.tensor(np.float32([[1, 2], [3, 4]])))
    >>> P.to_host()
    array([[0., 1.],
           [1., 0.]], dtype=float32)
    """
    f = factor_without_grad(A, pivot, "linalg.lu")          # a singular A has its P, L, U
    factors, pivots = f.lu, f.pivots
    n = factors.shape[-1]
    count = prod(factors.shape[:-2])
    eye = ck.eye(factors.queue, n, n, FLOAT)
    identities = Tensor.zeros(factors.queue, (count, n, n))
    identities = add(identities, eye)
    # the row swaps applied to the identity: with L = U = I, lu_solve's trans form is P^T
    p = lk.lu_solve(identities, pivots.reshape(count, n), identities, trans=True)
    lower = add(tril(factors, -1), eye)
    return LuResult(p.reshape(factors.shape), lower, triu(factors))
