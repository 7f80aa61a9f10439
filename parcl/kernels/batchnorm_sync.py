"""Batch statistics over several participants' batches (``ReplicaGroup(sync_batchnorm=True)``).

Each participant reduces its own batch to per-channel partials, a ``(3, C)`` tensor: its mean,
its sum of squared deviations from that mean (two passes, as ``bn_stats``) and what the float
mean lost in rounding. Stacked in a fixed order, ``(P, 3, C)``, they combine into the
statistics of all the batches together by the parallel-variance rule (Chan et al.):
``mean = sum(n_p mean_p) / n`` and ``M2 = sum(M2_p + n_p (mean_p - mean)^2)``, summed in
participant order, so every participant computes the same bits. The means enter as offsets
from the first participant's, each with its rounding added back: with a mean of 1e3 a float
mean is off by up to 3e-5, which ``n_p (mean_p - mean)^2`` would otherwise turn into a
variance error of ~2e-6 relative (30x that of a float's batch statistics). The backward's
per-channel gradient sums are stacked and added up the same way (``sum_parts``).

>>> parts, counts = sync.gather(partial_stats(x), x.shape[0])   # (P, 3, C) and (P,)
>>> mean, invstd, count = combine_stats(parts, counts, None, None, 1e-5, 0.1, False)
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import ShapeError
from ..tensor import Tensor
from ._cache import VECTOR_TYPES, get_kernel, round_up
from .batchnorm import CHANNEL_HELPERS, _group, _i32, _ncw

SOURCE = "//CL//" + VECTOR_TYPES + CHANNEL_HELPERS + r"""
// This participant's partials: part[c] = mean, part[C + c] = sum of squared deviations,
// part[2C + c] = the mean's rounding (mean + that carries the mean beyond float precision).
__kernel void bn_partial(__global const float* restrict x, __global float* restrict part,
                         const int N, const int C, const int HW, __local float* scratch)
{
    const int c = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    const long M = (long)N * HW;
    CHANNEL_MOMENTS(x, mu, m2, lo)
    if (l == 0) {
        part[c] = mu;
        part[C + c] = m2;
        part[2 * C + c] = lo;
    }
}

// Every participant's partials (P of them, counts n[p]) combined in order, per channel.
// OFFSET(p): participant p's mean minus the pivot, its rounding added back.
#define OFFSET(p) ((parts[(p) * 3 * C + c] - pivot) + parts[((p) * 3 + 2) * C + c])
__kernel void bn_combine(__global const float* restrict parts, __global const float* restrict n,
                         const int P, const int C, __global float* restrict mean,
                         __global float* restrict invstd, __global float* running_mean,
                         __global float* running_var, const float eps, const float momentum,
                         const int flags)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    // Means as offsets from participant 0's (exact where they are within a factor 2 of it):
    // the offsets and their mean carry the means' roundings, which the float means drop.
    const float pivot = parts[c];
    float total = 0.0f, off = 0.0f;
    for (int p = 0; p < P; ++p) {
        total += n[p];
        off += n[p] * OFFSET(p);
    }
    off /= total;
    const float mu = pivot + off;
    float m2 = 0.0f;
    for (int p = 0; p < P; ++p) {
        const float d = OFFSET(p) - off;
        m2 += parts[(p * 3 + 1) * C + c] + n[p] * (d * d);
    }
    const float var = m2 / total;
    mean[c] = mu;
    invstd[c] = 1.0f / sqrt(var + eps);
    if (flags & UPDATE) {
        const float unbiased = total > 1.0f ? m2 / (total - 1.0f) : var;
        update_running(running_mean, running_var, c, momentum, mu, unbiased);
    }
}

// out[r][c] = sum over p, in order, of parts[p][r][c] (r = 0, 1)
__kernel void bn_sum_parts(__global const float* restrict parts, const int P, const int C,
                           __global float* restrict out)
{
    const int i = get_global_id(0);
    if (i >= 2 * C)
        return;
    float acc = 0.0f;
    for (int p = 0; p < P; ++p)
        acc += parts[p * 2 * C + i];
    out[i] = acc;
}
"""


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def partial_stats(x: Tensor) -> Tensor:
    """This participant's ``(3, C)`` partials of an ``(N, C, ...)`` batch: per channel its mean,
    its sum of squared deviations from it, and the mean's rounding error."""
    n, c, hw = _ncw("batch_norm", x)
    part = Tensor.empty(x.queue, (3, c))
    L = _group(x.queue, SOURCE, "bn_partial")   # a work-group per channel, as batchnorm's
    _k(x.queue, "bn_partial")(x.queue, (c * L,), (L,), x.data, part.data, *_i32(n, c, hw),
                              cl.LocalMemory(8 * L))       # two floats per work-item
    return part


def combine_stats(parts: Tensor, counts: np.ndarray, running_mean: Tensor | None,
                  running_var: Tensor | None, eps: float, momentum: float, update: bool):
    """``(mean, invstd, count)`` of all the participants' batches together from their stacked
    ``(P, 3, C)`` partials and their ``(P,)`` counts (values per channel); the running
    statistics (when ``update``) move towards them with the unbiased variance, as ``bn_stats``
    does."""
    counts = np.asarray(counts, np.float32)
    if parts.ndim != 3 or parts.shape[1] != 3 or counts.shape != (parts.shape[0],):
        raise ShapeError(f"combine_stats: partials {parts.shape} and counts {counts.shape} "
                         "do not fit (P, 3, C) and (P,); make them with partial_stats")
    if counts.sum() <= 1:          # training only; every participant finds the same total
        raise ShapeError(f"batch_norm: expected more than 1 value per channel when training, "
                         f"got {int(counts.sum())} over all the replicas' batches together")
    p, _, c = parts.shape
    q = parts.queue
    n = Tensor.from_host(q, counts)
    mean, invstd = Tensor.empty(q, (c,)), Tensor.empty(q, (c,))
    _k(q, "bn_combine")(q, (round_up(c, 64),), (64,), parts.data, n.data, np.int32(p),
                        np.int32(c), mean.data, invstd.data,
                        running_mean.data if update else None,
                        running_var.data if update else None, np.float32(eps),
                        np.float32(momentum), np.int32(4 if update else 0))
    return mean, invstd, int(counts.sum())


def stack_rows(a: Tensor, b: Tensor) -> Tensor:
    """``(2, C)``: ``a`` over ``b`` (per-channel gradient sums to exchange)."""
    out = Tensor.empty(a.queue, (2, a.size))
    cl.enqueue_copy(a.queue, out.data, a.data, byte_count=a.nbytes)
    cl.enqueue_copy(a.queue, out.data, b.data, byte_count=b.nbytes, dst_offset=a.nbytes)
    return out


def sum_parts(parts: Tensor) -> tuple[Tensor, Tensor]:
    """The two rows of ``(P, 2, C)`` partials, each summed over P in order."""
    p, _, c = parts.shape
    q = parts.queue
    out = Tensor.empty(q, (2, c))
    _k(q, "bn_sum_parts")(q, (round_up(2 * c, 64),), (64,), parts.data, np.int32(p),
                          np.int32(c), out.data)
    return _row(out, 0), _row(out, 1)


def _row(t: Tensor, r: int) -> Tensor:
    c = t.shape[1]
    out = Tensor.empty(t.queue, (c,))
    cl.enqueue_copy(t.queue, out.data, t.data, byte_count=c * 4, src_offset=r * c * 4)
    return out
