"""Batch normalisation over (N, C, HW) views, and per-channel sums.

Every per-channel reduction runs in a fixed order, so results are bit-identical run to run (no
atomics): on GPUs one work-group per channel, each work-item summing a fixed strided share of
the channel's N*HW elements, then a fixed tree; on CPUs one work-item per channel in 8 vector
lanes, with blocked running sums (``LANES_SUMS`` in ``cl/batchnorm.cl``). Training statistics
are two-pass (a mean, then the sums of the deviations from it and of their squares, which
correct the mean and give the variance around the corrected one), which stays accurate when
the mean is large against the spread.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import batchnorm as bn
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.arange(8, dtype=np.float32).reshape(2, 2, 2))
>>> bn.channel_sum(x).to_host()
array([10., 18.], dtype=float32)
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ShapeError
from ..pool import pool_of
from ..runtime import on_gpu
from ..tensor import FLOAT, Tensor
from . import elementwise as ew
from ._cache import (GROUP_SUM, GROUP_SUM2, LAUNCH_MAX, VECTOR_TYPES, get_kernel, group_size,
                     load_source, round_up)

# The per-channel reduction helpers (also used by batchnorm_sync.py's kernels).
CHANNEL_HELPERS = GROUP_SUM + GROUP_SUM2 + r"""
#define HAS_W 1
#define HAS_B 2
#define UPDATE 4

// PyTorch's running statistics: an exponential average of the batch mean and of the unbiased
// batch variance.
inline void update_running(__global float* running_mean, __global float* running_var,
                           const int c, const float momentum, const float mu,
                           const float unbiased)
{
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mu;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
}

// Visit every element `at` of channel c, work-item l taking a fixed strided share: along each
// image's HW run when it is long enough, else along the flattened (n, i) index.
#define FOR_CHANNEL(body) \
    if (HW >= L) { \
        for (int n = 0; n < N; ++n) { \
            const long base = ((long)n * C + c) * HW; \
            for (int i = l; i < HW; i += L) { const long at = base + i; body } \
        } \
    } else { \
        for (long j = l; j < (long)N * HW; j += L) { \
            const long at = (j / HW * C + c) * HW + j % HW; body \
        } \
    }

// The shift the second pass subtracts: the first pass's mean cut to 16 significant bits.
// x - shift is then exact for nearly every x; with a full-precision shift close to 0 every
// x - m1 of one binade would round the same way, biasing the correction by up to half a float
// step of the spread. Any shift near the mean serves CORRECTED_MOMENTS.
#define SHIFT(m) as_float(as_uint(m) & 0xffffff00u)

// A channel's mean and sum of squared deviations from the shift m1 (SHIFT of the first pass's
// mean) and the second pass's sums s of d = x - m1 and q of d * d over its M elements. The
// first pass's mean is off by the rounding of a sum as large as M * mean; s / M corrects it
// (the corrected two-pass algorithm of Chan, Golub and LeVeque) and the squares are taken
// around the corrected mean, so both stay accurate however large the mean against the
// spread. `lo` is what the float mean `mu` lost in rounding (mu + lo carries the mean beyond
// float precision; synchronised statistics combine several means with it).
#define CORRECTED_MOMENTS(m1, s, q, M, mu, m2, lo) \
    const float ds_ = (s) / (float)(M); \
    const float mu = (m1) + ds_; \
    const float lo = ds_ - (mu - (m1)); \
    const float sds_ = (s) * ds_; \
    const float m2 = fmax((q) - sds_, 0.0f);

// Channel c's moments (CORRECTED_MOMENTS) over its M = N * HW elements of x, in FOR_CHANNEL's
// fixed order (batch statistics, and each participant's part of synchronised ones).
#define CHANNEL_MOMENTS(x, mu, m2, lo) \
    float acc = 0.0f; \
    FOR_CHANNEL(acc += x[at];) \
    const float m1 = SHIFT(group_sum(acc, scratch) / (float)M); \
    float s = 0.0f, q = 0.0f; \
    FOR_CHANNEL(const float d = x[at] - m1; const float dd = d * d; s += d; q += dd;) \
    const float2 sq = group_sum2((float2)(s, q), scratch); \
    CORRECTED_MOMENTS(m1, sq.x, sq.y, M, mu, m2, lo)
"""

SOURCE = "//CL//" + VECTOR_TYPES + CHANNEL_HELPERS + load_source("batchnorm")


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def _group(queue, source: str, name: str) -> int:
    """The work-group of a per-channel reduction: 256 on GPUs, 64 on CPUs, or the most the
    device allows the kernel where that is less (``group_size``)."""
    return group_size(queue, source, name, 256 if on_gpu(queue) else 64)


def _grid2(queue, run: int, rows: int):
    """A 2-D grid over (position in a run of ``run`` elements, row), padded to work-groups."""
    lx = min(64, 1 << max(run - 1, 0).bit_length())
    ly = max(1, 64 // lx)
    return (round_up(run, lx), round_up(rows, ly)), (lx, ly)


def _ncw(op: str, x: Tensor) -> tuple[int, int, int]:
    """(N, C, HW) of an (N, C, ...) tensor."""
    if x.ndim < 2:
        raise ShapeError(f"{op}: expects (N, C) or (N, C, H, W) input, got shape {x.shape}")
    hw = 1
    for s in x.shape[2:]:
        hw *= s
    return x.shape[0], x.shape[1], hw


def _groups_per_channel(queue, c: int) -> bool:
    """Whether the channels' sums take a work-group each (GPUs) rather than a work-item each
    (``_lanes`` kernels): on a GPU, while the launch, ``c * 256`` work-items, stays under
    ``LAUNCH_MAX`` (2**23 channels reach it)."""
    return on_gpu(queue) and c * 256 < LAUNCH_MAX


def _per_channel(queue, name: str, c: int, *args) -> None:
    L = _group(queue, SOURCE, name)
    _k(queue, name)(queue, (c * L,), (L,), *args,
                    cl.LocalMemory(8 * L))          # two floats per work-item: group_sum2


def channel_sum(x: Tensor) -> Tensor:
    """Sum of an (N, C, ...) tensor over every axis but 1 -> (C,); fixed order."""
    n, c, hw = _ncw("channel_sum", x)
    out = Tensor.empty(x.queue, (c,))
    if _groups_per_channel(x.queue, c):
        _per_channel(x.queue, "channel_sum", c, x.data, out.data, *_i32(n, c, hw))
    else:
        _k(x.queue, "channel_sum_lanes")(x.queue, (c,), (1,), x.data, out.data,
                                         *_i32(n, c, hw))
    return out


def _i32(*v):
    return [np.int32(a) for a in v]


def _check(x: Tensor, c: int, **ts) -> None:
    if x.dtype != FLOAT:
        raise DTypeError(f"batch_norm: input has dtype {x.dtype}, expected float32")
    for name, t in ts.items():
        if t is None:
            continue
        if t.dtype != FLOAT:
            raise DTypeError(f"batch_norm: {name} has dtype {t.dtype}, expected float32")
        if t.shape != (c,):
            raise ShapeError(f"batch_norm: {name} has shape {t.shape}, expected ({c},) for "
                             f"input {x.shape} with {c} channels")


def batch_norm_forward(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                       running_mean: Tensor | None, running_var: Tensor | None,
                       training: bool, momentum: float = 0.1, eps: float = 1e-5, *,
                       residual: Tensor | None = None, relu: bool = False,
                       overwrite_residual: bool = False, stats=None):
    """Normalise per channel; returns ``(y, mean, invstd)`` (the statistics used).

    Training: batch mean and biased variance, and the running statistics (when given) updated
    in place with the unbiased variance. Evaluation: the running statistics. ``residual`` is
    added and ``relu`` applied in the same pass; with ``overwrite_residual`` the result is
    written over ``residual`` (then ``y`` is ``residual``) instead of a new tensor.
    ``stats``: ``(mean, invstd)`` computed elsewhere (``batchnorm_sync``: over several
    replicas' batches) to normalise with instead of this batch's (the running statistics are
    then not touched here).
    """
    n, c, hw = _ncw("batch_norm", x)
    _check(x, c, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    if residual is not None:
        if residual.dtype != FLOAT or tuple(residual.shape) != tuple(x.shape):
            raise ShapeError(f"batch_norm: residual {residual.shape} {residual.dtype} does not "
                             f"match the input {x.shape} float32")
        if overwrite_residual and residual.data == x.data:
            raise ShapeError("batch_norm: overwrite_residual with the input itself as the "
                             "residual; backward reads the input, pass a copy")
    elif overwrite_residual:
        raise ShapeError("batch_norm: overwrite_residual needs a residual")
    q = x.queue
    use_batch = training or running_mean is None or running_var is None
    if use_batch:
        if n * hw == 1 and training and stats is None:   # synced: the total is what counts
            raise ShapeError(f"batch_norm: expected more than 1 value per channel when "
                             f"training, got input of shape {x.shape}")
        update = training and running_mean is not None and running_var is not None
        if stats is not None:
            mean, invstd = stats
        elif n * hw == 0:
            # an empty batch (x[n:]): PyTorch's empty output, running statistics untouched
            mean, invstd = Tensor.zeros(q, (c,)), Tensor.zeros(q, (c,))
        else:
            mean, invstd = Tensor.empty(q, (c,)), Tensor.empty(q, (c,))
            args = (x.data, mean.data, invstd.data, running_mean.data if update else None,
                    running_var.data if update else None, *_i32(n, c, hw), np.float32(eps),
                    np.float32(momentum), np.int32(4 if update else 0))
            if _groups_per_channel(q, c):
                _per_channel(q, "bn_stats", c, *args)
            else:
                _k(q, "bn_stats_lanes")(q, (c,), (1,), *args)
            if update:   # changed in place: seen by a ReplicaGroup (copied to every replica)
                for t in (running_mean, running_var):   # and by a backward that saved them
                    pool_of(q).note_overwrite(t.data, "batch_norm's running statistics "
                                              "update", update=False)
    else:
        mean, invstd = running_mean, Tensor.empty(q, (c,))
        _k(q, "bn_invstd")(q, (round_up(c, 64),), (64,), running_var.data, invstd.data,
                           np.float32(eps), np.int32(c))
    y = residual if overwrite_residual else Tensor.empty(q, x.shape)
    flags = (1 if weight is not None else 0) | (2 if bias is not None else 0)
    g, loc = _grid2(q, hw, n * c)
    args = (x.data, y.data, mean.data, invstd.data, weight.data if weight is not None else None,
            bias.data if bias is not None else None)
    if residual is None:
        _k(q, "bn_apply")(q, g, loc, *args, *_i32(c, hw, n * c, flags))
        if relu:
            ew.unary("relu", y, out=y)
    else:
        name = "bn_apply_acc" if overwrite_residual else "bn_apply_add"
        _k(q, name)(q, g, loc, *args, residual.data, *_i32(c, hw, n * c, flags),
                    np.float32(0.0 if relu else -np.inf))
    return y, mean, invstd


def batch_norm_backward(x: Tensor, grad: Tensor, weight: Tensor | None, mean: Tensor,
                        invstd: Tensor, batch_stats: bool, need_input: bool = True,
                        need_weight: bool = True, need_bias: bool = True, count: int = 0,
                        sync=None):
    """Gradients (input, weight, bias) of ``batch_norm_forward`` given the statistics it used.
    ``batch_stats``: the forward normalised with batch statistics (training mode), so the
    gradient flows through the mean and variance too, taken over ``count`` values per channel
    (default: this input's); with ``sync`` those are every participant's, whose gradient sums
    the input gradient then uses (weight and bias get this participant's own sums, which the
    allreduce adds up)."""
    n, c, hw = _ncw("batch_norm", x)
    q = x.queue
    sg, sgx = Tensor.empty(q, (c,)), Tensor.empty(q, (c,))
    if need_weight or need_bias or (need_input and batch_stats):
        args = (x.data, grad.data, mean.data, invstd.data, sg.data, sgx.data, *_i32(n, c, hw))
        if _groups_per_channel(q, c):
            _per_channel(q, "bn_grad_sums", c, *args)
        else:
            _k(q, "bn_grad_sums_lanes")(q, (c,), (1,), *args)
    gx = None
    if need_input:
        gx = Tensor.empty(q, x.shape)
        inv_m = 1.0 / (count or n * hw) if batch_stats and (count or n * hw) else 0.0
        tg, tgx = sg, sgx
        if batch_stats and sync is not None:
            from . import batchnorm_sync as bns
            tg, tgx = bns.sum_parts(sync.gather(bns.stack_rows(sg, sgx), 0)[0])
        g, loc = _grid2(q, hw, n * c)
        _k(q, "bn_grad_input")(q, g, loc, x.data, grad.data, gx.data,
                               mean.data, invstd.data,
                               weight.data if weight is not None else None, tg.data, tgx.data,
                               np.int32(c), np.int32(hw), np.int32(n * c), np.float32(inv_m),
                               np.int32(1 if weight is not None else 0))
    return gx, (sgx if need_weight else None), (sg if need_bias else None)
