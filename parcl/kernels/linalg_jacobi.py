"""Symmetric eigendecompositions and singular value decompositions of small batched matrices by
Jacobi rotations, and QR by Householder reflections, on the device (the launchers of
``tp.linalg.eigh``, ``tp.linalg.svd`` and ``tp.linalg.qr``).

One work-item per matrix, as ``parcl.kernels.linalg``: cyclic Jacobi on the symmetric matrix
(``eigh``: rotations that zero each off-diagonal pair in turn) and one-sided Jacobi on the
columns (``svd``, Hestenes': rotations that make each pair of columns orthogonal), a fixed
sweep order and at most ``SWEEPS`` sweeps, so the results are the same bits on every run and
accurate to float32's precision (Jacobi finds small eigen- and singular values to high
relative accuracy, where ``A^T A``'s eigenvalues would lose them). Eigenvalues come ascending
(as LAPACK's ``syevd``), singular values descending; the columns of ``U`` that no singular
value fixes (a zero singular value, or the extra columns of ``full_matrices``) are completed
to an orthonormal basis (Gram-Schmidt on the unit vectors). A matrix holding NaN or inf
decomposes to NaN throughout (no sweeps); one whose entries are so large or small that
their squares would overflow or underflow is scaled by a power of two first (QR too). QR
takes LAPACK's reflections (``geqrf``'s signs: ``R``'s diagonal is ``-sign(a_jj) *
|column|``), so its ``Q`` and ``R`` are LAPACK's and PyTorch's, to rounding.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import linalg_jacobi
>>> q = pc.default_queue()
>>> w, v = linalg_jacobi.eigh(pc.Tensor.from_host(q, np.float32([[2, 0], [0, 1]])))
>>> w.to_host(), v.to_host()
(array([1., 2.], dtype=float32), array([[0., 1.],
       [1., 0.]], dtype=float32))
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._cache import get_kernel, round_up
from .linalg import LOCAL, check_square

SWEEPS = 40

BALANCE = r"""
/* The power of two that brings mx (the largest |entry|, finite) near 1 where it is past 2^16
   or below 2^-16, so that no sum of squares, nor svd's product of two (alpha * beta: 1e9's
   columns of 64 overflow it), overflows or underflows float32 (1e20's square is inf, 1e-25's
   0: eigenvalues NaN or 0); 1 otherwise. Scaling by a power of two is exact: the rotations
   and reflections only see ratios. */
float balancing_scale(const float mx)
{
    if (mx > 0x1p16f || (mx > 0.0f && mx < 0x1p-16f))
        return ldexp(1.0f, clamp(-ilogb(mx), -126, 126));     /* a normal float either way */
    return 1.0f;
}
"""

SOURCE = f"//CL//\n#define SWEEPS {SWEEPS}\n" + BALANCE + r"""
/* a (batch, n, n): only its lower triangle read. w (batch, n) the eigenvalues ascending,
   v (batch, n, n) the eigenvectors as columns; work (batch, n, n) scratch. */
__kernel void eigh_jacobi(__global const float *a_all, __global float *w_all,
                          __global float *v_all, __global float *work, const int batch,
                          const int n)
{
    const int b = get_global_id(0);
    if (b >= batch) return;
    __global const float *src = a_all + (long)b * n * n;
    __global float *a = work + (long)b * n * n;
    __global float *v = v_all + (long)b * n * n;
    __global float *w = w_all + (long)b * n;
    float mx = 0.0f;
    int finite = 1;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j <= i; ++j) {
            const float x = src[i * n + j];
            finite &= isfinite(x);
            mx = fmax(mx, fabs(x));
        }
    const float scale = balancing_scale(mx);
    float total = 0.0f;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j <= i; ++j) {
            const float x = src[i * n + j] * scale;
            a[i * n + j] = x;
            a[j * n + i] = x;
            total += (i == j ? 1.0f : 2.0f) * x * x;
        }
    if (!finite) {                                     /* NaN or inf: all NaN, no sweeps */
        for (int i = 0; i < n; ++i) {
            w[i] = NAN;
            for (int j = 0; j < n; ++j) v[i * n + j] = NAN;
        }
        return;
    }
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
            v[i * n + j] = i == j ? 1.0f : 0.0f;
    const float tol = 1e-14f * total;
    for (int sweep = 0; sweep < SWEEPS; ++sweep) {
        float off = 0.0f;
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < i; ++j)
                off += 2.0f * a[i * n + j] * a[i * n + j];
        if (!(off > tol)) break;
        for (int p = 0; p < n - 1; ++p)
            for (int q = p + 1; q < n; ++q) {
                const float apq = a[p * n + q];
                if (apq == 0.0f) continue;
                const float theta = (a[q * n + q] - a[p * n + p]) / (2.0f * apq);
                const float t = (theta >= 0.0f ? 1.0f : -1.0f)
                                / (fabs(theta) + sqrt(theta * theta + 1.0f));
                const float c = 1.0f / sqrt(t * t + 1.0f), s = t * c;
                for (int k = 0; k < n; ++k) {          /* columns: A J */
                    const float x = a[k * n + p], y = a[k * n + q];
                    a[k * n + p] = c * x - s * y;
                    a[k * n + q] = s * x + c * y;
                }
                for (int k = 0; k < n; ++k) {          /* rows: J^T A J */
                    const float x = a[p * n + k], y = a[q * n + k];
                    a[p * n + k] = c * x - s * y;
                    a[q * n + k] = s * x + c * y;
                }
                a[p * n + q] = 0.0f;
                a[q * n + p] = 0.0f;
                for (int k = 0; k < n; ++k) {          /* V J */
                    const float x = v[k * n + p], y = v[k * n + q];
                    v[k * n + p] = c * x - s * y;
                    v[k * n + q] = s * x + c * y;
                }
            }
    }
    for (int i = 0; i < n; ++i) w[i] = a[i * n + i] / scale;
    for (int i = 0; i < n - 1; ++i) {                  /* ascending, columns with them */
        int m = i;
        for (int j = i + 1; j < n; ++j) if (w[j] < w[m]) m = j;
        if (m != i) {
            const float t = w[i]; w[i] = w[m]; w[m] = t;
            for (int k = 0; k < n; ++k) {
                const float x = v[k * n + i]; v[k * n + i] = v[k * n + m]; v[k * n + m] = x;
            }
        }
    }
}

/* a (batch, m, n) with m >= n. u (batch, m, uc): uc = n (reduced) or m (full); s (batch, n)
   descending; v (batch, n, n) the right singular vectors as columns. */
__kernel void svd_jacobi(__global const float *a_all, __global float *u_all,
                         __global float *s_all, __global float *v_all, const int batch,
                         const int m, const int n, const int uc)
{
    const int b = get_global_id(0);
    if (b >= batch) return;
    __global const float *a = a_all + (long)b * m * n;
    __global float *u = u_all + (long)b * m * uc;       /* W in its first n columns */
    __global float *s = s_all + (long)b * n;
    __global float *v = v_all + (long)b * n * n;
    float mx = 0.0f;
    int finite = 1;
    for (int i = 0; i < m * n; ++i) {
        finite &= isfinite(a[i]);
        mx = fmax(mx, fabs(a[i]));
    }
    const float scale = balancing_scale(mx);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < uc; ++j)
            u[i * uc + j] = j < n ? a[i * n + j] * scale : 0.0f;
    if (!finite) {                                     /* NaN or inf: all NaN, no sweeps */
        for (int i = 0; i < m * uc; ++i) u[i] = NAN;
        for (int i = 0; i < n; ++i) s[i] = NAN;
        for (int i = 0; i < n * n; ++i) v[i] = NAN;
        return;
    }
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
            v[i * n + j] = i == j ? 1.0f : 0.0f;
    for (int sweep = 0; sweep < SWEEPS; ++sweep) {
        int rotated = 0;
        for (int p = 0; p < n - 1; ++p)
            for (int q = p + 1; q < n; ++q) {
                float alpha = 0.0f, beta = 0.0f, gamma = 0.0f;
                for (int k = 0; k < m; ++k) {
                    const float x = u[k * uc + p], y = u[k * uc + q];
                    alpha += x * x;
                    beta += y * y;
                    gamma += x * y;
                }
                if (!(fabs(gamma) > 1e-7f * sqrt(alpha * beta))) continue;
                rotated = 1;
                const float zeta = (beta - alpha) / (2.0f * gamma);
                const float t = (zeta >= 0.0f ? 1.0f : -1.0f)
                                / (fabs(zeta) + sqrt(1.0f + zeta * zeta));
                const float c = 1.0f / sqrt(1.0f + t * t), sn = c * t;
                for (int k = 0; k < m; ++k) {
                    const float x = u[k * uc + p], y = u[k * uc + q];
                    u[k * uc + p] = c * x - sn * y;
                    u[k * uc + q] = sn * x + c * y;
                }
                for (int k = 0; k < n; ++k) {
                    const float x = v[k * n + p], y = v[k * n + q];
                    v[k * n + p] = c * x - sn * y;
                    v[k * n + q] = sn * x + c * y;
                }
            }
        if (!rotated) break;
    }
    for (int j = 0; j < n; ++j) {
        float t = 0.0f;
        for (int k = 0; k < m; ++k) t += u[k * uc + j] * u[k * uc + j];
        s[j] = sqrt(t);
    }
    for (int i = 0; i < n - 1; ++i) {                  /* descending, columns with them */
        int best = i;
        for (int j = i + 1; j < n; ++j) if (s[j] > s[best]) best = j;
        if (best != i) {
            const float t = s[i]; s[i] = s[best]; s[best] = t;
            for (int k = 0; k < m; ++k) {
                const float x = u[k * uc + i]; u[k * uc + i] = u[k * uc + best];
                u[k * uc + best] = x;
            }
            for (int k = 0; k < n; ++k) {
                const float x = v[k * n + i]; v[k * n + i] = v[k * n + best];
                v[k * n + best] = x;
            }
        }
    }
    /* U's columns: W_j / s_j, made orthogonal to the columns before (a column of a tiny s_j
       is mostly rounding noise); where that leaves too little (s_j = 0, or full_matrices'
       extra columns), the first unit vector that does: an orthonormal basis either way */
    for (int j = 0; j < uc; ++j) {
        int done = 0;
        for (int e = -1; e < m && !done; ++e) {
            if (e < 0) {
                if (j >= n || !(s[j] > 0.0f)) continue;
                const float inv = 1.0f / s[j];
                for (int k = 0; k < m; ++k) u[k * uc + j] *= inv;
            } else {
                for (int k = 0; k < m; ++k) u[k * uc + j] = k == e ? 1.0f : 0.0f;
            }
            for (int pass = 0; pass < 2; ++pass)
                for (int c = 0; c < j; ++c) {
                    float d = 0.0f;
                    for (int k = 0; k < m; ++k) d += u[k * uc + c] * u[k * uc + j];
                    for (int k = 0; k < m; ++k) u[k * uc + j] -= d * u[k * uc + c];
                }
            float t = 0.0f;
            for (int k = 0; k < m; ++k) t += u[k * uc + j] * u[k * uc + j];
            if (t > 0.25f) {
                const float inv = 1.0f / sqrt(t);
                for (int k = 0; k < m; ++k) u[k * uc + j] *= inv;
                done = 1;
            }
        }
    }
    for (int j = 0; j < n; ++j) s[j] /= scale;
}
"""


QR_SOURCE = "//CL//\n" + BALANCE + r"""
/* w (batch, m, n): A on entry, overwritten with the reflections (LAPACK's geqrf layout);
   tau (batch, k) scratch, k = min(m, n). q (batch, m, qc), r (batch, rc, n). */
__kernel void qr_householder(__global float *w_all, __global float *tau_all,
                             __global float *q_all, __global float *r_all, const int batch,
                             const int m, const int n, const int qc, const int rc)
{
    const int b = get_global_id(0);
    if (b >= batch) return;
    const int k = min(m, n);
    __global float *w = w_all + (long)b * m * n;
    __global float *tau = tau_all + (long)b * k;
    __global float *q = q_all + (long)b * m * qc;
    __global float *r = r_all + (long)b * rc * n;
    float mx = 0.0f;
    for (int i = 0; i < m * n; ++i) mx = fmax(mx, fabs(w[i]));
    const float scale = isfinite(mx) ? balancing_scale(mx) : 1.0f;
    if (scale != 1.0f)
        for (int i = 0; i < m * n; ++i) w[i] *= scale;
    for (int j = 0; j < k; ++j) {
        const float alpha = w[j * n + j];
        float xx = 0.0f;
        for (int i = j + 1; i < m; ++i) xx += w[i * n + j] * w[i * n + j];
        if (xx == 0.0f) { tau[j] = 0.0f; continue; }       /* H = I, as LAPACK's */
        const float beta = -copysign(sqrt(alpha * alpha + xx), alpha);
        tau[j] = (beta - alpha) / beta;
        const float scale = 1.0f / (alpha - beta);
        for (int i = j + 1; i < m; ++i) w[i * n + j] *= scale;
        w[j * n + j] = beta;
        for (int c = j + 1; c < n; ++c) {                  /* H W[j:, c] */
            float s = w[j * n + c];
            for (int i = j + 1; i < m; ++i) s += w[i * n + j] * w[i * n + c];
            s *= tau[j];
            w[j * n + c] -= s;
            for (int i = j + 1; i < m; ++i) w[i * n + c] -= s * w[i * n + j];
        }
    }
    for (int i = 0; i < rc; ++i)
        for (int c = 0; c < n; ++c)
            r[i * n + c] = c >= i ? w[i * n + c] / scale : 0.0f;
    for (int i = 0; i < m; ++i)
        for (int c = 0; c < qc; ++c)
            q[i * qc + c] = i == c ? 1.0f : 0.0f;
    for (int j = k - 1; j >= 0; --j) {                    /* Q = H_0 ... H_{k-1} I */
        if (tau[j] == 0.0f) continue;
        for (int c = 0; c < qc; ++c) {
            float s = q[j * qc + c];
            for (int i = j + 1; i < m; ++i) s += w[i * n + j] * q[i * qc + c];
            s *= tau[j];
            q[j * qc + c] -= s;
            for (int i = j + 1; i < m; ++i) q[i * qc + c] -= s * w[i * n + j];
        }
    }
}
"""


def qr(a: Tensor, complete: bool = False) -> tuple[Tensor, Tensor]:
    """``(Q, R)`` of ``a`` ``(batch, m, n)``: ``Q`` ``(batch, m, m if complete else k)``,
    ``R`` ``(batch, m if complete else k, n)``, ``k = min(m, n)``."""
    batch, m, n = a.shape
    q_ = a.queue
    k = min(m, n)
    qc = rc = m if complete else k
    work = a.copy().reshape(a.shape)
    tau = Tensor.empty(q_, (batch, k))
    qm = Tensor.empty(q_, (batch, m, qc))
    r = Tensor.empty(q_, (batch, rc, n))
    get_kernel(q_, QR_SOURCE, "qr_householder")(
        q_, (round_up(batch, LOCAL),), None, work.data, tau.data, qm.data, r.data,
        np.int32(batch), np.int32(m), np.int32(n), np.int32(qc), np.int32(rc))
    return qm, r


def eigh(a: Tensor, op: str = "linalg.eigh") -> tuple[Tensor, Tensor]:
    """``(w, v)``: the eigenvalues (ascending, ``(*, n)``) and eigenvectors (columns,
    ``(*, n, n)``) of the symmetric matrices whose lower triangles ``a`` holds."""
    n = check_square(op, a)
    q, batch = a.queue, a.size // (n * n)
    w = Tensor.empty(q, a.shape[:-1])
    v = Tensor.empty(q, a.shape)
    work = Tensor.empty(q, a.shape)
    get_kernel(q, SOURCE, "eigh_jacobi")(
        q, (round_up(batch, LOCAL),), None, a.data, w.data, v.data, work.data,
        np.int32(batch), np.int32(n))
    return w, v


def svd(a: Tensor, full: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """``(U, S, V)`` of ``a`` ``(batch, m, n)``, ``m >= n``: ``U`` ``(batch, m, m if full
    else n)``, ``S`` ``(batch, n)`` descending, ``V`` ``(batch, n, n)`` (not transposed)."""
    batch, m, n = a.shape
    q = a.queue
    uc = m if full else n
    u = Tensor.empty(q, (batch, m, uc))
    s = Tensor.empty(q, (batch, n))
    v = Tensor.empty(q, (batch, n, n))
    get_kernel(q, SOURCE, "svd_jacobi")(
        q, (round_up(batch, LOCAL),), None, a.data, u.data, s.data, v.data, np.int32(batch),
        np.int32(m), np.int32(n), np.int32(uc))
    return u, s, v
