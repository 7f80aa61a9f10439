"""Connectionist temporal classification (the launchers behind ``tp.ctc_loss``): the forward
(alpha) and backward (beta) recursions over the blank-extended targets, in log space, and the
gradient of each sample's negative log-likelihood with respect to the log-probabilities.

One work-group per sample walks its time steps in order (a barrier between steps), its
work-items sharing the extended target's states; no atomics on any float, so the result is the
same whatever the schedule. The gradient is one work-item per ``(t, n)`` adding each state
into its class's entry in a fixed order (O(S + C) each). ``log_probs`` are ``(T, N, C)``, the
targets ``LT`` (int32 or int64) either padded rows ``(N, S)`` (``stride = S``) or one
concatenated run (``stride = 0``: each sample's offset is the sum of the lengths before it).
The lengths and the labels are checked on the device: ``flag`` holds the flat position of
the first label outside ``[0, C)`` or equal to the blank, the first sample whose input length
is outside ``[0, T]``, and the first whose target length is outside ``[0, S]`` (or runs past
the concatenated targets), each ``NO_ERROR`` when fine; a bad sample's loss is NaN and
nothing is read outside the buffers.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._cache import get_kernel, group_size, round_up

NO_ERROR = np.iinfo(np.int32).max
LOCAL = 64             # work-items per sample, where the device allows the recursions as many

_COMMON = r"""
inline float lse2(float a, float b)
{
    const float m = fmax(a, b);
    /* fmax drops a NaN: a + b keeps it (and is -inf for two -infs) */
    return m == -INFINITY ? a + b : m + log(exp(a - m) + exp(b - m));
}
"""

_KERNEL = r"""
/* sample n's target offset and length, and whether its lengths are usable (flags set) */
inline int ctc_sample_LT(__global const LT *tlen, __global const LT *ilen, const int n,
                         const int N, const int T, const int S, const int stride,
                         const int total, int *off, int *L, int *Tn, __global int *flag)
{
    int o = 0;
    if (stride) o = n * stride;
    else for (int k = 0; k < n; ++k) o += (int)tlen[k];
    const long l = tlen[n], t = ilen[n];
    int ok = 1;
    if (t < 0 || t > T) { atomic_min(flag + 1, n); ok = 0; }
    if (l < 0 || o < 0 || (stride ? l > S : o + l > total)) { atomic_min(flag + 2, n); ok = 0; }
    *off = o; *L = (int)l; *Tn = (int)t;
    return ok;
}

inline int ctc_label_LT(__global const LT *tg, const int off, const int s, const int blank)
{
    return (s & 1) ? (int)tg[off + (s >> 1)] : blank;
}

/* the position of the first of a sample's L labels outside [0, C) or the blank, or -1 */
inline int ctc_bad_label_LT(__global const LT *tg, const int off, const int L, const int C,
                            const int blank)
{
    for (int j = 0; j < L; ++j) {
        const long c = tg[off + j];
        if (c < 0 || c >= C || c == blank) return off + j;
    }
    return -1;
}

/* alpha (N, T, Smax): log of the prefix probabilities; nll (N): -log p(target | input);
   length (N): the target length as a float, at least 1 (the 'mean' reduction's divisor) */
__kernel void ctc_alpha_LT(__global float *alpha, __global float *nll, __global float *length,
                           __global const float *lp, __global const LT *tg,
                           __global const LT *ilen, __global const LT *tlen,
                           __global int *flag, const int T, const int N, const int C,
                           const int S, const int stride, const int total, const int Smax,
                           const int blank)
{
    const int n = get_group_id(0), lid = get_local_id(0), P = get_local_size(0);
    int off, L, Tn;
    int ok = ctc_sample_LT(tlen, ilen, n, N, T, S, stride, total, &off, &L, &Tn, flag);
    const int bad = ok ? ctc_bad_label_LT(tg, off, L, C, blank) : -1;   /* same for every item */
    if (bad >= 0) {
        if (lid == 0) atomic_min(flag, bad);
        ok = 0;
    }
    if (lid == 0) length[n] = (ok && L > 1) ? (float)L : 1.0f;
    if (!ok || Tn == 0) {
        if (lid == 0) nll[n] = !ok ? NAN : (L == 0 ? 0.0f : INFINITY);
        return;                                  /* uniform across the work-group */
    }
    const int Sn = 2 * L + 1;
    __global float *a = alpha + (long)n * T * Smax;
    for (int s = lid; s < Sn; s += P)
        a[s] = s < 2 ? lp[(long)n * C + ctc_label_LT(tg, off, s, blank)] : -INFINITY;
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int t = 1; t < Tn; ++t) {
        __global const float *prev = a + (long)(t - 1) * Smax;
        for (int s = lid; s < Sn; s += P) {
            const int lab = ctc_label_LT(tg, off, s, blank);
            float v = prev[s];
            if (s > 0) v = lse2(v, prev[s - 1]);
            if (s > 1 && lab != blank && lab != ctc_label_LT(tg, off, s - 2, blank))
                v = lse2(v, prev[s - 2]);
            a[(long)t * Smax + s] = v + lp[((long)t * N + n) * C + lab];
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
    if (lid == 0) {
        __global const float *last = a + (long)(Tn - 1) * Smax;
        nll[n] = -(Sn > 1 ? lse2(last[Sn - 1], last[Sn - 2]) : last[0]);
    }
}

/* beta (N, T, Smax): log of the suffix probabilities (emission at t included) */
__kernel void ctc_beta_LT(__global float *beta, __global const float *nll,
                          __global const float *lp, __global const LT *tg,
                          __global const LT *ilen, __global const LT *tlen,
                          __global int *flag, const int T, const int N, const int C,
                          const int S, const int stride, const int total, const int Smax,
                          const int blank)
{
    const int n = get_group_id(0), lid = get_local_id(0), P = get_local_size(0);
    int off, L, Tn;
    const int ok = ctc_sample_LT(tlen, ilen, n, N, T, S, stride, total, &off, &L, &Tn, flag);
    /* a bad sample is skipped by its lengths and labels, not by its NaN loss: NaN
       log-probabilities give a NaN loss whose gradient is NaN, as PyTorch's */
    if (!ok || Tn == 0 || ctc_bad_label_LT(tg, off, L, C, blank) >= 0) return;
    const int Sn = 2 * L + 1;
    __global float *b = beta + (long)n * T * Smax;
    __global float *end = b + (long)(Tn - 1) * Smax;
    for (int s = lid; s < Sn; s += P)
        end[s] = s >= Sn - 2 ? lp[((long)(Tn - 1) * N + n) * C + ctc_label_LT(tg, off, s, blank)]
                             : -INFINITY;
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int t = Tn - 2; t >= 0; --t) {
        __global const float *next = b + (long)(t + 1) * Smax;
        for (int s = lid; s < Sn; s += P) {
            const int lab = ctc_label_LT(tg, off, s, blank);
            float v = next[s];
            if (s + 1 < Sn) v = lse2(v, next[s + 1]);
            if (s + 2 < Sn && lab != blank && lab != ctc_label_LT(tg, off, s + 2, blank))
                v = lse2(v, next[s + 2]);
            b[(long)t * Smax + s] = v + lp[((long)t * N + n) * C + lab];
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
}

/* grad (T, N, C) of sum_n g[n] * nll[n] with respect to log_probs: -g exp(lse_{s: l'_s = c}
   (alpha + beta) - lp + nll), one work-item per (t, n) adding its states into its row in
   state order; 0 past the input length, for a bad sample (its error is raised), and for an
   infinite nll with zero_inf (otherwise NaN there, as PyTorch's; a NaN nll NaN too) */
__kernel void ctc_grad_LT(__global float *grad, __global const float *alpha,
                          __global const float *beta, __global const float *nll,
                          __global const float *g, __global const float *lp,
                          __global const LT *tg, __global const LT *ilen,
                          __global const LT *tlen, __global int *flag, const int T,
                          const int N, const int C, const int S, const int stride,
                          const int total, const int Smax, const int blank, const int zero_inf)
{
    const long i = get_global_id(0);
    if (i >= (long)T * N) return;
    const int n = (int)(i % N), t = (int)(i / N);
    __global float *row = grad + i * C;
    __global const float *lpr = lp + i * C;
    const float loss = nll[n];
    int off, L, Tn;
    const int ok = ctc_sample_LT(tlen, ilen, n, N, T, S, stride, total, &off, &L, &Tn, flag);
    if (!ok || t >= Tn || ctc_bad_label_LT(tg, off, L, C, blank) >= 0 ||
            (zero_inf && isinf(loss))) {
        for (int c = 0; c < C; ++c) row[c] = 0.0f;
        return;
    }
    for (int c = 0; c < C; ++c) row[c] = -INFINITY;
    const long base = ((long)n * T + t) * Smax;
    for (int s = 0; s < 2 * L + 1; ++s) {
        const int lab = ctc_label_LT(tg, off, s, blank);
        row[lab] = lse2(row[lab], alpha[base + s] + beta[base + s]);
    }
    const float gn = g[n];
    for (int c = 0; c < C; ++c) row[c] = -gn * exp(row[c] - lpr[c] + loss);
}
"""

# LT: the labels' and lengths' int type (one program holds both variants)
SOURCE = ("//CL//" + _COMMON + _KERNEL.replace("_LT(", "_i32(").replace("LT", "int")
          + _KERNEL.replace("_LT(", "_i64(").replace("LT", "long"))


def _suffix(t: Tensor) -> str:
    return "i32" if t.dtype == np.int32 else "i64"


def _common(log_probs: Tensor, targets: Tensor, padded: bool):
    t, n, c = log_probs.shape
    s = targets.shape[1] if padded else targets.size
    stride = s if padded else 0
    return t, n, c, s, stride


def ctc_forward(log_probs: Tensor, targets: Tensor, input_lengths: Tensor,
                target_lengths: Tensor, blank: int, padded: bool, longest: int | None = None):
    """``(nll, length, alpha, flag)``: each sample's negative log-likelihood (N,), its target
    length as a float of at least 1 (N,), the log alphas (N, T, Smax) for the backward and
    the three-int check flag (see the module docstring).
    ``targets``, ``input_lengths`` and ``target_lengths`` share one int dtype; ``longest``,
    where the target lengths are known on the host, the largest (Smax = 2 * longest + 1)."""
    q = log_probs.queue
    t, n, c, s, stride = _common(log_probs, targets, padded)
    # A sample's states fit a row of Smax: the padded width, else the whole concatenation,
    # unless the host knows the longest target. (Smax 2 * total + 1 made alpha and beta grow
    # with the square of the batch: 256 samples of 60 labels over 400 steps needed 3.1e9
    # floats each.) A length past the bound is flagged and its sample never walked.
    bound = s if padded else targets.size
    smax = 2 * (bound if longest is None else min(max(longest, 0), bound)) + 1
    nll, length = Tensor.empty(q, (n,)), Tensor.empty(q, (n,))
    alpha = Tensor.full(q, (n, t, smax), -np.inf)
    flag = Tensor.full(q, (3,), NO_ERROR, np.int32)
    if n:
        name = "ctc_alpha_" + _suffix(targets)
        group = group_size(q, SOURCE, name, LOCAL)
        get_kernel(q, SOURCE, name)(
            q, (n * group,), (group,), alpha.data, nll.data, length.data, log_probs.data,
            targets.data, input_lengths.data, target_lengths.data, flag.data, np.int32(t),
            np.int32(n), np.int32(c), np.int32(s), np.int32(stride), np.int32(targets.size),
            np.int32(smax), np.int32(blank))
    return nll, length, alpha, flag


def ctc_backward(log_probs: Tensor, targets: Tensor, input_lengths: Tensor,
                 target_lengths: Tensor, blank: int, padded: bool, nll: Tensor,
                 alpha: Tensor, g: Tensor, zero_infinity: bool) -> Tensor:
    """The gradient of ``sum_n g[n] nll[n]`` with respect to ``log_probs`` (T, N, C)."""
    q = log_probs.queue
    t, n, c, s, stride = _common(log_probs, targets, padded)
    smax = alpha.shape[2]
    beta = Tensor.full(q, alpha.shape, -np.inf)
    grad = Tensor.empty(q, log_probs.shape)
    flag = Tensor.full(q, (3,), NO_ERROR, np.int32)       # checked by the forward already
    suffix = _suffix(targets)
    if n:
        group = group_size(q, SOURCE, "ctc_beta_" + suffix, LOCAL)
        get_kernel(q, SOURCE, "ctc_beta_" + suffix)(
            q, (n * group,), (group,), beta.data, nll.data, log_probs.data, targets.data,
            input_lengths.data, target_lengths.data, flag.data, np.int32(t), np.int32(n),
            np.int32(c), np.int32(s), np.int32(stride), np.int32(targets.size),
            np.int32(smax), np.int32(blank))
    if t * n * c:
        get_kernel(q, SOURCE, "ctc_grad_" + suffix)(
            q, (round_up(t * n, LOCAL),), (LOCAL,), grad.data, alpha.data, beta.data, nll.data,
            g.data, log_probs.data, targets.data, input_lengths.data, target_lengths.data,
            flag.data, np.int32(t), np.int32(n), np.int32(c), np.int32(s), np.int32(stride),
            np.int32(targets.size), np.int32(smax), np.int32(blank),
            np.int32(bool(zero_infinity)))
    return grad
