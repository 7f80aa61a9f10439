"""Kernels of the losses on float targets: cross-entropy with class probabilities and binary
cross-entropy with logits.

Cross-entropy takes one work-item per row over the grid, then the rows' mean in one work-group;
binary cross-entropy reduces inside one work-group; each by strided partial sums, then a fixed
tree, so the value is bit-reproducible with no atomics. Their backwards are elementwise, one
work-item per element, except cross-entropy's on a CPU over contiguous rows: one work-item per
row, 8 classes at a time, as its forward (``softmax.ROW_HELPERS``: PoCL's vector ``exp``).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import loss as lk
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.zeros((1, 2), np.float32))
>>> t = pc.Tensor.from_host(q, np.array([[0.5, 0.5]], np.float32))
>>> round(float(lk.soft_cross_entropy_forward(x, t)[0].to_host()), 4)
0.6931
"""

from __future__ import annotations

from math import prod

import numpy as np
import pyopencl as cl

from ..errors import ShapeError
from ..tensor import Tensor, check_same_queue
from ._cache import GROUP_SUM, get_kernel
# the same launch geometry and line helpers
from .cross_entropy import REDUCTIONS, _rows
from .softmax import ROW_HELPERS, _contiguous_rows, _float, _grid, _group, _row_grid

SOURCE = "//CL//" + GROUP_SUM + ROW_HELPERS + r"""
// Rows r = (n, i) of x viewed as (N, C, inner), as the class-index kernels. With the target
// smoothed, t' = (1-eps) t + eps/C, row loss = sum_c t'[c] (lse - x[c]), one work-item per row
// (vec: a contiguous row on a CPU, 8 classes at a time, its sums in blocks; else each sum
// compensated, LINE_SUM). For the backward: stats[r] = the row's max, stats[rows + r] =
// sum_c t'[c], stats[2 * rows + r] = the log of its sum of exps below the max.
__kernel void soft_ce_rows(__global const float* restrict x, __global const float* restrict t,
                           __global float* restrict row_loss, __global float* restrict stats,
                           const int rows, const int C, const int inner, const float eps,
                           const int vec)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    const float u = eps / (float)C;
    const int n = r / inner;
    const long base = (long)n * C * inner + (r - n * inner);
    const global float *xr = x + base, *tr = t + base;
    float m;
    ROW_MAX(m, c, LOAD8(xr + c), xr[(long)c * inner]);
    // lse = m + ls, kept in two parts: their sum loses ls where |m| is huge (a row masked
    // with -1e9); lse - x >= 0: no cancellation
    float ls, loss, mass;
    if (vec) {
        BLOCK_SUM8(ls, c, C, exp(LOAD8(xr + c) - m), exp(xr[c] - m));
        ls = log(ls);
        BLOCK_SUM8(loss, c, C, ((1.0f - eps) * LOAD8(tr + c) + u) * ((m - LOAD8(xr + c)) + ls),
                   ((1.0f - eps) * tr[c] + u) * ((m - xr[c]) + ls));
        BLOCK_SUM8(mass, c, C, (1.0f - eps) * LOAD8(tr + c) + u, (1.0f - eps) * tr[c] + u);
    } else {
        float2 s = (float2)(0.0f, 0.0f);
        for (int c = 0; c < C; ++c)
            s = sum_step(s, exp(xr[(long)c * inner] - m));
        ls = log(sum_total(s));
        float2 row = (float2)(0.0f, 0.0f), tm = (float2)(0.0f, 0.0f);
        for (int c = 0; c < C; ++c) {
            const long j = (long)c * inner;
            const float tc = (1.0f - eps) * tr[j] + u;
            row = sum_step(row, tc * ((m - xr[j]) + ls));
            tm = sum_step(tm, tc);
        }
        loss = sum_total(row);
        mass = sum_total(tm);
    }
    stats[r] = m;
    stats[rows + r] = mass;
    stats[2 * rows + r] = ls;
    row_loss[r] = loss;
}

// The mean of the rows' losses in one work-group: strided partial sums, then a fixed tree
// (bit-reproducible, no atomics)
__kernel void soft_ce_mean(__global const float* restrict row_loss, __global float* restrict loss,
                           const int rows, __local float* sums)
{
    const int l = get_local_id(0), L = get_local_size(0);
    float acc = 0.0f;
    for (int r = l; r < rows; r += L)
        acc += row_loss[r];
    acc = group_sum(acc, sums);
    if (l == 0)
        loss[0] = acc / (float)rows;
}

// gx = (softmax(x) * sum_c t' - t') g / rows;  gt = (1-eps) (lse - x) g / rows
__kernel void soft_ce_bwd(__global const float* restrict x, __global const float* restrict t,
                          __global const float* restrict stats, __global const float* restrict g,
                          __global float* restrict gx, __global float* restrict gt,
                          const int rows, const int C, const int inner, const float eps,
                          const int which)
{
    const long i = get_global_id(0);
    if (i >= (long)rows * C)
        return;
    const long per = (long)C * inner;
    const int n = (int)(i / per), rest = (int)(i - n * per);
    const int r = n * inner + (rest - (rest / inner) * inner);
    const float scale = g[0] / (float)rows;
    if (which & 1) {
        const float tc = (1.0f - eps) * t[i] + eps / (float)C;
        gx[i] = (exp((x[i] - stats[r]) - stats[2 * rows + r]) * stats[rows + r] - tc) * scale;
    }
    if (which & 2)
        gt[i] = (1.0f - eps) * ((stats[r] - x[i]) + stats[2 * rows + r]) * scale;
}

// The same, one work-item per contiguous row (inner 1) walked 8 classes at a time (a CPU:
// vector exp, and no division per element)
__kernel void soft_ce_bwd_rows(__global const float* restrict x, __global const float* restrict t,
                               __global const float* restrict stats,
                               __global const float* restrict g, __global float* restrict gx,
                               __global float* restrict gt, const int rows, const int C,
                               const float eps, const int which)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    const int vec = 1;                 // for ROW_EACH
    const long base = (long)r * C;
    const global float *xr = x + base, *tr = t + base;
    const float m = stats[r], mass = stats[rows + r], ls = stats[2 * rows + r];
    const float scale = g[0] / (float)rows, u = eps / (float)C;
    if (which & 1) {
        global float* gr = gx + base;
        ROW_EACH(c, STORE8(gr + c, (exp((LOAD8(xr + c) - m) - ls) * mass
                                    - ((1.0f - eps) * LOAD8(tr + c) + u)) * scale),
                 gr[c] = (exp((xr[c] - m) - ls) * mass - ((1.0f - eps) * tr[c] + u)) * scale);
    }
    if (which & 2) {
        global float* gr = gt + base;
        ROW_EACH(c, STORE8(gr + c, (1.0f - eps) * ((m - LOAD8(xr + c)) + ls) * scale),
                 gr[c] = (1.0f - eps) * ((m - xr[c]) + ls) * scale);
    }
}

// The numerically stable binary cross-entropy of PyTorch: with sp = softplus(-x) =
// log1p(exp(-|x|)) + max(-x, 0) and lw = 1 + (pos_weight - 1) t,
// loss = weight * ((1 - t) x + lw sp); weight and pos_weight repeat with periods nw, npw
// (they broadcast from the trailing dims), absent when NULL. reduce: 0 each element's loss
// into loss[i], 1 their mean, 2 their sum.
inline float softplus_neg(const float x)
{
    return log1p(exp(-fabs(x))) + fmax(-x, 0.0f);
}

__kernel void bce_fwd(__global const float* restrict x, __global const float* restrict t,
                      __global const float* restrict w, __global const float* restrict pw,
                      __global float* restrict loss, const long n, const long nw,
                      const long npw, const int reduce, __local float* sums)
{
    // reduce 0 runs over the whole grid, an element per work-item; a reduction in one
    // work-group, strided partial sums then a fixed tree (bit-reproducible)
    const int l = get_local_id(0), L = get_local_size(0);
    const long first = reduce == 0 ? (long)get_global_id(0) : l;
    const long stride = reduce == 0 ? (long)get_global_size(0) : L;
    float acc = 0.0f;
    for (long i = first; i < n; i += stride) {
        const float xi = x[i], ti = t[i];
        const float lw = pw ? 1.0f + (pw[i % npw] - 1.0f) * ti : 1.0f;
        const float li = (1.0f - ti) * xi + lw * softplus_neg(xi);
        const float v = w ? w[i % nw] * li : li;
        if (reduce == 0)
            loss[i] = v;
        else
            acc += v;
    }
    if (reduce == 0)
        return;
    acc = group_sum(acc, sums);
    if (l == 0)
        loss[0] = reduce == 1 ? acc / (float)n : acc;
}

// gx = w (lw sigmoid(x) - pos_weight t) g / n;  gt = w ((pos_weight - 1) sp - x) g / n
// (reduce 2: g undivided; 0: each element's own g[i])
__kernel void bce_bwd(__global const float* restrict x, __global const float* restrict t,
                      __global const float* restrict w, __global const float* restrict pw,
                      __global const float* restrict g, __global float* restrict gx,
                      __global float* restrict gt, const long n, const long nw,
                      const long npw, const int which, const int reduce)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    const float xi = x[i], ti = t[i];
    const float p = pw ? pw[i % npw] : 1.0f;
    const float up = reduce == 1 ? g[0] / (float)n : reduce == 2 ? g[0] : g[i];
    const float scale = (w ? w[i % nw] : 1.0f) * up;
    if (which & 1) {
        const float sig = 1.0f / (1.0f + exp(-xi));
        gx[i] = ((1.0f + (p - 1.0f) * ti) * sig - p * ti) * scale;
    }
    if (which & 2)
        gt[i] = ((p - 1.0f) * softplus_neg(xi) - xi) * scale;
}
"""

def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def check_soft_cross_entropy(logits: Tensor, target: Tensor) -> None:
    _float("cross_entropy", logits=logits, target=target)
    if logits.ndim < 2:
        raise ShapeError(f"cross_entropy: logits must be 2-D (N, C) or (N, C, d1, ...), got "
                         f"shape {logits.shape}")
    if target.shape != logits.shape:
        raise ShapeError(f"cross_entropy: class-probability target has shape {target.shape}, "
                         f"expected the logits' shape {logits.shape}")
    check_same_queue("cross_entropy", logits, target)


def soft_cross_entropy_forward(logits: Tensor, target: Tensor, label_smoothing: float = 0.0):
    """Mean over rows of ``-sum_c t'[c] log_softmax(logits)[c]``, ``t'`` the target mixed
    with the uniform distribution by ``label_smoothing`` (class dim 1). Returns ``(loss,
    stats)``: the scalar loss, then per row its maximum, its target mass and its log of the sum
    of exps below the maximum (the log-sum-exp in two parts)."""
    check_soft_cross_entropy(logits, target)
    q = logits.queue
    rows, c, inner = _rows(logits)
    loss, stats = Tensor.empty(q, ()), Tensor.empty(q, (3 * rows,))
    # each row's loss over the grid (every core), then their mean in one work-group
    row_loss = Tensor.empty(q, (rows,))
    g, loc = _row_grid(rows)
    _k(q, "soft_ce_rows")(q, g, loc, logits.data, target.data, row_loss.data, stats.data,
                          np.int32(rows), np.int32(c), np.int32(inner),
                          np.float32(label_smoothing), np.int32(_contiguous_rows(q, inner)))
    L = _group(q, SOURCE, "soft_ce_mean")
    _k(q, "soft_ce_mean")(q, (L,), (L,), row_loss.data, loss.data, np.int32(rows),
                          cl.LocalMemory(4 * L))
    return loss, stats


def soft_cross_entropy_backward(logits: Tensor, target: Tensor, stats: Tensor, grad: Tensor,
                                label_smoothing: float = 0.0, need_logits: bool = True,
                                need_target: bool = False):
    """Gradients ``(logits, target)`` of ``soft_cross_entropy_forward`` (None where not
    asked for); ``grad`` is the scalar upstream."""
    q = logits.queue
    rows, c, inner = _rows(logits)
    gx = Tensor.empty(q, logits.shape) if need_logits else None
    gt = Tensor.empty(q, logits.shape) if need_target else None
    out = (None if gx is None else gx.data, None if gt is None else gt.data)
    which = np.int32((1 if need_logits else 0) | (2 if need_target else 0))
    if _contiguous_rows(q, inner):
        g, loc = _row_grid(rows)
        _k(q, "soft_ce_bwd_rows")(q, g, loc, logits.data, target.data, stats.data, grad.data,
                                  *out, np.int32(rows), np.int32(c),
                                  np.float32(label_smoothing), which)
    else:
        g, loc = _grid(rows * c)
        _k(q, "soft_ce_bwd")(q, g, loc, logits.data, target.data, stats.data, grad.data, *out,
                             np.int32(rows), np.int32(c), np.int32(inner),
                             np.float32(label_smoothing), which)
    return gx, gt


def _period(op: str, name: str, t: Tensor | None, shape: tuple) -> int:
    """How often ``t`` repeats along the flat input: it must broadcast from the trailing dims
    (its shape, less leading 1s, a suffix of ``shape``)."""
    if t is None:
        return 1
    own = tuple(t.shape)
    while own and own[0] == 1:
        own = own[1:]
    if own and (len(own) > len(shape) or tuple(shape[len(shape) - len(own):]) != own):
        raise ShapeError(f"{op}: {name} of shape {t.shape} does not broadcast from the "
                         f"trailing dims of the input {shape}; expected a shape such as "
                         f"{shape[-1:]} or {shape}")
    return max(prod(own), 1)


def check_bce(logits: Tensor, target: Tensor, weight: Tensor | None,
              pos_weight: Tensor | None) -> tuple[int, int]:
    op = "binary_cross_entropy_with_logits"
    _float(op, logits=logits, target=target, weight=weight, pos_weight=pos_weight)
    if target.shape != logits.shape:
        raise ShapeError(f"{op}: target has shape {target.shape}, expected the logits' shape "
                         f"{logits.shape}")
    check_same_queue(op, *(t for t in (logits, target, weight, pos_weight) if t is not None))
    return (_period(op, "weight", weight, logits.shape),
            _period(op, "pos_weight", pos_weight, logits.shape))


def bce_forward(logits: Tensor, target: Tensor, weight: Tensor | None = None,
                pos_weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """PyTorch's stable binary cross-entropy with logits, each element's (``"none"``) or their
    mean or sum."""
    nw, npw = check_bce(logits, target, weight, pos_weight)
    q = logits.queue
    reduce = REDUCTIONS[reduction]
    loss = Tensor.empty(q, logits.shape if reduce == 0 else ())
    # each element's loss over the whole grid; a mean or sum in one work-group
    if reduce == 0:
        g, loc = _grid(logits.size)
    else:
        g = loc = (_group(q, SOURCE, "bce_fwd"),)
    _k(q, "bce_fwd")(q, g, loc, logits.data, target.data,
                     None if weight is None else weight.data,
                     None if pos_weight is None else pos_weight.data, loss.data,
                     np.int64(logits.size), np.int64(nw), np.int64(npw), np.int32(reduce),
                     cl.LocalMemory(4 * loc[0]))
    return loss


def bce_backward(logits: Tensor, target: Tensor, weight: Tensor | None,
                 pos_weight: Tensor | None, grad: Tensor, need_logits: bool = True,
                 need_target: bool = False, reduction: str = "mean"):
    """Gradients ``(logits, target)`` of ``bce_forward`` (None where not asked for)."""
    nw, npw = check_bce(logits, target, weight, pos_weight)
    q = logits.queue
    gx = Tensor.empty(q, logits.shape) if need_logits else None
    gt = Tensor.empty(q, logits.shape) if need_target else None
    g, loc = _grid(logits.size)
    _k(q, "bce_bwd")(q, g, loc, logits.data, target.data,
                     None if weight is None else weight.data,
                     None if pos_weight is None else pos_weight.data, grad.data,
                     None if gx is None else gx.data, None if gt is None else gt.data,
                     np.int64(logits.size), np.int64(nw), np.int64(npw),
                     np.int32((1 if need_logits else 0) | (2 if need_target else 0)),
                     np.int32(REDUCTIONS[reduction]))
    return gx, gt
