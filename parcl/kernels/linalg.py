"""Dense linear algebra on small batched matrices, on the device: LU with partial pivoting,
solves with its factors, Cholesky and triangular solves (the launchers of ``tp.linalg``).

One work-item factors one matrix (``lu_factor``, ``cholesky``) or solves one right-hand
column (``lu_solve``, ``solve_triangular``) in global memory, each sum in a fixed order: the
matrices of ML code are small (n up to a few dozen, many of them in a batch), where one
work-item per matrix has no barrier to wait on and gives bit-identical results run to run.
``MAX_N`` bounds n: past it one work-item's O(n^3) loop would leave a GPU mostly idle, and
the caller refuses the matrix instead of being slow.

A singular matrix (a zero pivot) or one that is not positive-definite (a Cholesky diagonal
that is not > 0) is reported per matrix (``info``, LAPACK's 1-based column, 0 for none) and
in a one-int ``flag`` holding the smallest ``matrix * n + column`` (``atomic_min`` of ints:
the same value whatever the schedule), for the caller's device-side check.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import linalg
>>> q = pc.default_queue()
>>> f = linalg.lu_factor(pc.Tensor.from_host(q, np.float32([[1, 3], [2, 4]])))
>>> f.det.to_host(), f.pivots.to_host()
(array(-2., dtype=float32), array([2, 2], dtype=int32))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor
from ._cache import get_kernel, round_up

MAX_N = 128
NO_ERROR = np.iinfo(np.int32).max
LOCAL = 32

SOURCE = r"""//CL//
/* a (batch, n, n) factored in place as P A = L U (L unit lower, below the diagonal; U on and
   above it); piv[b, k] the 1-based row swapped with row k at step k (LAPACK's ipiv). A zero
   pivot leaves its column as it is (LAPACK's getrf) and sets info. sign, logabs and det:
   slogdet's and det's values. */
__kernel void lu_factor(__global float *lu, __global int *piv, __global int *info,
                        __global float *sign_out, __global float *logabs_out,
                        __global float *det_out, __global int *flag, const int batch,
                        const int n)
{
    const int b = get_global_id(0);
    if (b >= batch) return;
    __global float *a = lu + (long)b * n * n;
    float sgn = 1.0f, logabs = 0.0f, det = 1.0f;
    int singular = -1;
    for (int k = 0; k < n; ++k) {
        int p = k;
        float best = fabs(a[k * n + k]);
        for (int i = k + 1; i < n; ++i) {
            const float v = fabs(a[i * n + k]);
            if (v > best) { best = v; p = i; }
        }
        piv[(long)b * n + k] = p + 1;
        if (p != k) {
            for (int j = 0; j < n; ++j) {
                const float t = a[k * n + j];
                a[k * n + j] = a[p * n + j];
                a[p * n + j] = t;
            }
            sgn = -sgn;
            det = -det;
        }
        const float d = a[k * n + k];
        det *= d;
        if (d == 0.0f) {
            if (singular < 0) singular = k;
            /* getf2's update still runs with the column unscaled: every entry is 0 then,
               but for a NaN (never taken as a pivot), which spreads as in LAPACK's, so
               det([[0, 1], [nan, 1]]) is NaN, not a singular 0 */
            for (int i = k + 1; i < n; ++i) {
                const float l = a[i * n + k];
                if (l != 0.0f)
                    for (int j = k + 1; j < n; ++j)
                        a[i * n + j] -= l * a[k * n + j];
            }
            continue;
        }
        logabs += log(fabs(d));
        if (d < 0.0f) sgn = -sgn;
        for (int i = k + 1; i < n; ++i) {
            const float l = a[i * n + k] / d;
            a[i * n + k] = l;
            for (int j = k + 1; j < n; ++j)
                a[i * n + j] -= l * a[k * n + j];
        }
    }
    info[b] = singular + 1;
    /* a NaN pivot after a zero one: the matrix held NaN, so its logabsdet is NaN (as det),
       not the -inf of a singular one */
    const int nan_pivot = isnan(logabs);
    if (singular >= 0) {
        sgn = 0.0f;
        logabs = nan_pivot ? NAN : -INFINITY;
        atomic_min(flag, b * n + singular);
    }
    if (isnan(logabs)) sgn = NAN;
    sign_out[b] = sgn;
    logabs_out[b] = logabs;
    det_out[b] = det;
}

/* x (batch, n, k) holds B and becomes the solution of A X = B (trans = 0) or A^T X = B
   (trans = 1) for A's factors lu, piv; one work-item per (matrix, column). */
__kernel void lu_solve(__global const float *lu, __global const int *piv, __global float *x,
                       const int batch, const int n, const int k, const int trans)
{
    const int g = get_global_id(0);
    if (g >= batch * k) return;
    const int b = g / k, c = g % k;
    __global const float *a = lu + (long)b * n * n;
    __global const int *p = piv + (long)b * n;
    __global float *y = x + (long)b * n * k + c;
    if (!trans) {
        for (int i = 0; i < n; ++i) {            /* P b: the swaps in order */
            const int r = p[i] - 1;              /* bad pivots (check_pivots) move nothing */
            if (r != i && r >= 0 && r < n) {
                const float t = y[i * k]; y[i * k] = y[r * k]; y[r * k] = t;
            }
        }
        for (int i = 0; i < n; ++i) {            /* L z = P b */
            float s = y[i * k];
            for (int j = 0; j < i; ++j) s -= a[i * n + j] * y[j * k];
            y[i * k] = s;
        }
        for (int i = n - 1; i >= 0; --i) {       /* U x = z */
            float s = y[i * k];
            for (int j = i + 1; j < n; ++j) s -= a[i * n + j] * y[j * k];
            y[i * k] = s / a[i * n + i];
        }
    } else {
        for (int i = 0; i < n; ++i) {            /* U^T w = b */
            float s = y[i * k];
            for (int j = 0; j < i; ++j) s -= a[j * n + i] * y[j * k];
            y[i * k] = s / a[i * n + i];
        }
        for (int i = n - 1; i >= 0; --i) {       /* L^T z = w */
            float s = y[i * k];
            for (int j = i + 1; j < n; ++j) s -= a[j * n + i] * y[j * k];
            y[i * k] = s;
        }
        for (int i = n - 1; i >= 0; --i) {       /* x = P^T z: the swaps in reverse */
            const int r = p[i] - 1;
            if (r != i && r >= 0 && r < n) {
                const float t = y[i * k]; y[i * k] = y[r * k]; y[r * k] = t;
            }
        }
    }
}

/* flag = the smallest matrix * n + i of a zero diagonal entry a[i][i] of a (batch, n, n) */
__kernel void zero_diagonal(__global const float *a, __global int *flag, const int batch,
                            const int n)
{
    const int g = get_global_id(0);
    if (g >= batch * n) return;
    if (a[(long)g * n + g % n] == 0.0f) atomic_min(flag, g);
}

/* flag = the smallest position in piv (total entries) of a pivot outside 1..n: pivots that
   did not come from lu_factor, which lu_solve would follow out of its matrix */
__kernel void check_pivots(__global const int *piv, __global int *flag, const int total,
                           const int n)
{
    const int g = get_global_id(0);
    if (g >= total) return;
    if (piv[g] < 1 || piv[g] > n) atomic_min(flag, g);
}

/* out (zeros on entry) = the Cholesky factor L of a's lower triangle (upper = 0), or U = L^T
   of a's upper triangle (upper = 1); stops at the first diagonal that is not > 0. */
__kernel void cholesky(__global const float *a_all, __global float *out, __global int *info,
                       __global int *flag, const int batch, const int n, const int upper)
{
    const int b = get_global_id(0);
    if (b >= batch) return;
    __global const float *a = a_all + (long)b * n * n;
    __global float *L = out + (long)b * n * n;
    /* L[i][j] lives at (i, j), or at (j, i) when upper */
    const int si = upper ? 1 : n, sj = upper ? n : 1;
    int failed = 0;
    for (int j = 0; j < n && !failed; ++j) {
        float s = a[j * si + j * sj];
        for (int m = 0; m < j; ++m) s -= L[j * si + m * sj] * L[j * si + m * sj];
        if (!(s > 0.0f)) { failed = j + 1; break; }
        const float d = sqrt(s);
        L[j * si + j * sj] = d;
        for (int i = j + 1; i < n; ++i) {
            float t = a[i * si + j * sj];
            for (int m = 0; m < j; ++m) t -= L[i * si + m * sj] * L[j * si + m * sj];
            L[i * si + j * sj] = t / d;
        }
    }
    info[b] = failed;
    if (failed) atomic_min(flag, b * n + failed - 1);
}

/* x (batch, n, k) holds B and becomes the solution of M X = B, M = A (trans = 0) or A^T
   (trans = 1), A triangular (upper or lower, only that triangle read), its diagonal taken
   as ones where unit; one work-item per (matrix, column). */
__kernel void solve_triangular(__global const float *a_all, __global float *x, const int batch,
                               const int n, const int k, const int upper, const int trans,
                               const int unit)
{
    const int g = get_global_id(0);
    if (g >= batch * k) return;
    const int b = g / k, c = g % k;
    __global const float *a = a_all + (long)b * n * n;
    __global float *y = x + (long)b * n * k + c;
    const int si = trans ? 1 : n, sj = trans ? n : 1;     /* M[i][j] = a[i * si + j * sj] */
    if (upper == trans) {                                  /* M lower: forward */
        for (int i = 0; i < n; ++i) {
            float s = y[i * k];
            for (int j = 0; j < i; ++j) s -= a[i * si + j * sj] * y[j * k];
            y[i * k] = unit ? s : s / a[i * si + i * sj];
        }
    } else {                                               /* M upper: backward */
        for (int i = n - 1; i >= 0; --i) {
            float s = y[i * k];
            for (int j = i + 1; j < n; ++j) s -= a[i * si + j * sj] * y[j * k];
            y[i * k] = unit ? s : s / a[i * si + i * sj];
        }
    }
}
"""


@dataclass
class LU:
    """A batch's LU factors (``lu`` ``(batch, n, n)``, 1-based ``pivots`` ``(batch, n)``
    int32), LAPACK's ``info`` per matrix (int32), slogdet's ``sign`` and ``logabsdet``,
    ``det`` (float32 ``(batch,)``) and the singular ``flag``."""

    lu: Tensor
    pivots: Tensor
    info: Tensor
    sign: Tensor
    logabsdet: Tensor
    det: Tensor
    flag: Tensor


def check_square(op: str, a: Tensor) -> int:
    """``n`` of ``a`` ``(*, n, n)`` float32, ``0 < n <= MAX_N``; else a ParclError."""
    if a.dtype != FLOAT:
        raise DTypeError(f"{op}: input {a.shape} has dtype {a.dtype}, expected float32")
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"{op}: expected square matrices (*, n, n), got shape {a.shape}")
    n = a.shape[-1]
    if not 0 < n <= MAX_N:
        raise ShapeError(f"{op}: matrices of size {n} x {n} (input {a.shape}) are not "
                         f"supported: parcl factors matrices of 1 to {MAX_N} rows, one per "
                         "work-item")
    return n


def _flag(q) -> Tensor:
    return Tensor.full(q, (1,), NO_ERROR, np.int32)


def lu_factor(a: Tensor, op: str = "lu_factor") -> LU:
    """``a`` ``(*, n, n)`` factored as ``P A = L U`` with partial pivoting (a copy); ``op``
    names the caller in errors."""
    n = check_square(op, a)
    q, batch = a.queue, a.size // (n * n)
    lu = a.copy().reshape(a.shape)
    piv = Tensor.empty(q, (*a.shape[:-1],), np.int32)
    info = Tensor.empty(q, a.shape[:-2], np.int32)
    sign, logabs, det = (Tensor.empty(q, a.shape[:-2]) for _ in range(3))
    flag = _flag(q)
    if batch:
        get_kernel(q, SOURCE, "lu_factor")(
            q, (round_up(batch, LOCAL),), None, lu.data, piv.data, info.data, sign.data,
            logabs.data, det.data, flag.data, np.int32(batch), np.int32(n))
    return LU(lu, piv, info, sign, logabs, det, flag)


def lu_solve(lu: Tensor, pivots: Tensor, b: Tensor, trans: bool = False) -> Tensor:
    """``X`` ``(batch, n, k)`` with ``A X = B`` (``A^T X = B`` where ``trans``) from the
    factors of ``lu_factor``; ``lu`` ``(batch, n, n)`` and ``b`` ``(batch, n, k)``."""
    batch, n, k = b.shape
    x = b.copy().reshape(b.shape)
    if batch * k:
        get_kernel(lu.queue, SOURCE, "lu_solve")(
            lu.queue, (round_up(batch * k, LOCAL),), None, lu.data, pivots.data, x.data,
            np.int32(batch), np.int32(n), np.int32(k), np.int32(trans))
    return x


def check_pivots(pivots: Tensor, n: int) -> Tensor:
    """The one-int flag of ``pivots`` (int32, any shape): the smallest flat position of a
    pivot outside ``1..n``, or ``NO_ERROR``."""
    q = pivots.queue
    flag = _flag(q)
    get_kernel(q, SOURCE, "check_pivots")(
        q, (round_up(pivots.size, LOCAL),), None, pivots.data, flag.data,
        np.int32(pivots.size), np.int32(n))
    return flag


def zero_diagonal(a: Tensor) -> Tensor:
    """The one-int flag of ``a`` ``(batch, n, n)``: the smallest ``matrix * n + i`` whose
    diagonal entry ``a[i][i]`` is 0, or ``NO_ERROR``."""
    batch, n, _ = a.shape
    q = a.queue
    flag = _flag(q)
    get_kernel(q, SOURCE, "zero_diagonal")(
        q, (round_up(batch * n, LOCAL),), None, a.data, flag.data, np.int32(batch),
        np.int32(n))
    return flag


def cholesky(a: Tensor, upper: bool = False, op: str = "cholesky"
             ) -> tuple[Tensor, Tensor, Tensor]:
    """``(factor, info, flag)``: ``a = L L^T`` from ``a``'s lower triangle (``U^T U`` from
    its upper one where ``upper``); ``info`` per matrix, 0 or the 1-based order of the first
    leading minor that is not positive-definite (the factor's later columns then zero)."""
    n = check_square(op, a)
    q, batch = a.queue, a.size // (n * n)
    out = Tensor.zeros(q, a.shape)
    info = Tensor.empty(q, a.shape[:-2], np.int32)
    flag = _flag(q)
    if batch:
        get_kernel(q, SOURCE, "cholesky")(
            q, (round_up(batch, LOCAL),), None, a.data, out.data, info.data, flag.data,
            np.int32(batch), np.int32(n), np.int32(upper))
    return out, info, flag


def solve_triangular(a: Tensor, b: Tensor, upper: bool, trans: bool = False,
                     unit: bool = False) -> Tensor:
    """``X`` ``(batch, n, k)`` with ``A X = B`` (``A^T X = B`` where ``trans``) for the
    triangular ``a`` ``(batch, n, n)`` (only its ``upper`` or lower triangle read)."""
    batch, n, k = b.shape
    x = b.copy().reshape(b.shape)
    if batch * k:
        get_kernel(a.queue, SOURCE, "solve_triangular")(
            a.queue, (round_up(batch * k, LOCAL),), None, a.data, x.data, np.int32(batch),
            np.int32(n), np.int32(k), np.int32(upper), np.int32(trans), np.int32(unit))
    return x
