"""Class-index cross-entropy and NLL kernels.

Cross-entropy takes one work-item per row over the grid, then reduces the rows' losses in one
work-group (strided partial sums, then a fixed tree): the loss value is bit-reproducible with no
atomics. On a CPU a contiguous row (inner 1) is walked 8 classes at a time
(``softmax.ROW_HELPERS``: PoCL's vector ``exp``), its sums in blocks (``line_sums.BLOCK_SUM8``).

Cross-entropy (and NLL, the same kernel on log-probabilities) takes ``ignore_index`` and
``label_smoothing`` as PyTorch, and checks its labels on the device: a label outside [0, C)
(other than ``ignore_index``) makes the loss NaN and is reported in a small int64 ``flag``
tensor (first bad row, its label; row -1 when all are fine) that the caller may read back
whenever it likes (``cross_entropy_forward`` returns it).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import cross_entropy as cek
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.zeros((1, 4), np.float32))
>>> labels = pc.Tensor.from_host(q, np.array([2]))
>>> round(float(cek.cross_entropy_forward(x, labels)[0].to_host()), 4)
1.3863
"""

from __future__ import annotations

from math import prod

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ShapeError
from ..tensor import LABEL_DTYPES, Tensor, check_same_queue
from ._cache import get_kernel
# the same launch geometry and line helpers as the softmax
from .softmax import ROW_HELPERS, _contiguous_rows, _float, _grid, _group, _row_grid

_CE = r"""
// Rows r = (n, i) of x viewed as (N, C, inner): row r's class c is x[(n*C + c)*inner + i].
// Row loss: (1-eps) * (lse - x[t]) + eps/C * sum_c (lse - x[c]); with NLL the input already
// holds log-probabilities (lse = 0, no smoothing). With class weights w (NULL: none), PyTorch's
// (1-eps) * w[t] * (lse - x[t]) + eps/C * sum_c w[c] (lse - x[c]). Rows labelled `ignore` take
// no part (loss 0). One work-item per row; vec: the row is contiguous (inner 1) and walked 8
// classes at a time (a CPU: vector exp). Row r's lse is kept in two parts, its max stats[r] and
// log-sum stats[rows + r]: m + log s loses log s where |m| is huge (a row masked with -1e9);
// stats[2 * rows + 1] = sum_c w[c].
#define X8(c) LOAD8(row + (c))
#define X1(c) row[(long)(c) * inner]
__kernel void ce_rows_LT(__global const float* restrict x, __global const LT* restrict labels,
                         __global const float* restrict w, __global float* restrict row_loss,
                         __global float* restrict stats, const int rows, const int C,
                         const int inner, const long ignore, const float eps, const int nll,
                         const int vec)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    const int n = r / inner;
    const global float* row = x + (long)n * C * inner + (r - n * inner);
    float m = 0.0f, ls = 0.0f, smooth = 0.0f, wall = 0.0f;
    if (w && eps != 0.0f)
        ROW_SUM(wall, c, LOAD8(w + c), w[c]);
    if (!nll) {
        ROW_MAX(m, c, X8(c), X1(c));
        float s;
        ROW_SUM(s, c, exp(X8(c) - m), exp(X1(c) - m));
        ls = log(s);
        if (eps != 0.0f) {                     // sum_c (lse - x[c]), each term >= 0
            float d;
            if (w) {
                ROW_SUM(d, c, LOAD8(w + c) * (m - X8(c)), w[c] * (m - X1(c)));
                smooth = wall * ls + d;
            } else {
                ROW_SUM(d, c, m - X8(c), m - X1(c));
                smooth = (float)C * ls + d;
            }
        }
    }
    stats[r] = m;
    stats[rows + r] = ls;
    if (r == 0)
        stats[2 * rows + 1] = wall;
    const LT t = labels[r];
    float v = 0.0f;
    if (t != ignore) {
        if (t < 0 || t >= C) {
            v = NAN;
        } else {
            const float nl = (m - X1(t)) + ls;
            if (w) {
                const float wt = w[t];
                v = eps == 0.0f ? wt * nl : (1.0f - eps) * wt * nl + eps / (float)C * smooth;
            } else {
                v = eps == 0.0f ? nl : (1.0f - eps) * nl + eps / (float)C * smooth;
            }
        }
    }
    row_loss[r] = v;
}

// The rows' losses reduced in one work-group: reduce 1 their mean over the rows that count
// (weighted: divided by the sum of their w[t]; 0/0 = NaN when all are ignored, as PyTorch),
// 2 their sum, 0 none (row_loss is the loss). Strided partial sums, then a fixed tree: the same
// bits on every run, with no atomics. stats[2 * rows] = what the backward divides by; flag =
// the first row with a label outside [0, C) and its label (-1, 0 when there is none).
__kernel void ce_sum_LT(__global const LT* restrict labels, __global const float* restrict w,
                        __global const float* restrict row_loss, __global float* restrict loss,
                        __global float* restrict stats, __global long* restrict flag,
                        const int rows, const int C, const long ignore, const int reduce,
                        __local float* sums, __local int* bad, __local int* counts)
{
    const int l = get_local_id(0), L = get_local_size(0);
    float acc = 0.0f, wsum = 0.0f;
    int first_bad = rows, count = 0;
    for (int r = l; r < rows; r += L) {
        const LT t = labels[r];
        if (t == ignore)
            continue;
        if (t < 0 || t >= C) {
            first_bad = min(first_bad, r);
        } else {
            if (w)
                wsum += w[t];
            ++count;
        }
        if (reduce != 0)
            acc += row_loss[r];
    }
    sums[l] = acc;
    bad[l] = first_bad;
    counts[l] = count;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) {
            sums[l] += sums[l + s];
            bad[l] = min(bad[l], bad[l + s]);
            counts[l] += counts[l + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = sums[0];
    float denom = (float)counts[0];
    if (w) {                           // the weights of the rows that count, summed alike
        barrier(CLK_LOCAL_MEM_FENCE);
        sums[l] = wsum;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = L / 2; s > 0; s >>= 1) {
            if (l < s)
                sums[l] += sums[l + s];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        denom = sums[0];
    }
    if (l == 0) {
        if (reduce != 1)
            denom = 1.0f;
        stats[2 * rows] = denom;
        if (reduce != 0)
            // a mean over no weight is PyTorch's 0/0 NaN, also where smoothing adds terms
            loss[0] = reduce == 1 ? (denom == 0.0f ? NAN : total / denom) : total;
        flag[0] = bad[0] < rows ? bad[0] : -1;
        flag[1] = bad[0] < rows ? (long)labels[bad[0]] : 0;
    }
}

// gx = (softmax(x) - (1-eps) onehot(label) - u) * g / count, u = eps/C (NLL: no softmax,
// eps = 0); with class weights (p ((1-eps) w[t] + u sum_c w[c]) - (1-eps) w[t] onehot -
// u w[c]) * g / sum of w[t]; per_row (reduce 0): each row's own upstream g[r], undivided.
// Rows labelled `ignore` get no gradient. A mean over no weight (every row's label weighs 0)
// with upstream 0 gives 0, not 0/0: a replica's share of a batch whose weight lies in the other
// shares (ReplicaGroup.step weighs it by 0) must add nothing, where NaN poisoned the model;
// with any other upstream it is NaN, as PyTorch's (not the smoothing terms' +-inf).
__kernel void ce_bwd_LT(__global const float* restrict x, __global const LT* restrict labels,
                        __global const float* restrict w,
                        __global const float* restrict stats, __global const float* restrict g,
                        __global float* restrict gx, const int rows, const int C,
                        const int inner, const long ignore, const float eps, const float u,
                        const int nll, const int per_row)
{
    const long i = get_global_id(0);
    if (i >= (long)rows * C)
        return;
    int r, c;
    if (inner == 1) {                  // (N, C): the common case, without the divisions
        r = (int)(i / C);
        c = (int)(i - (long)r * C);
    } else {
        const long per = (long)C * inner;
        const int n = (int)(i / per), rest = (int)(i - n * per);
        c = rest / inner;
        r = n * inner + (rest - c * inner);
    }
    const LT t = labels[r];
    const float e = exp((x[i] - stats[r]) - stats[rows + r]), p = nll ? 0.0f : e;  // a select
    const float d = stats[2 * rows];
    const float scale = per_row ? g[r] : g[0] == 0.0f ? g[0] : d == 0.0f ? NAN : g[0] / d;
    float v;
    if (w) {
        const float wt = t >= 0 && t < C ? w[t] : 0.0f;
        v = (p * ((1.0f - eps) * wt + u * stats[2 * rows + 1])
             - (t == c ? (1.0f - eps) * wt : 0.0f) - u * w[c]) * scale;
    } else {
        v = (p - (t == c ? 1.0f - eps : 0.0f) - u) * scale;
    }
    gx[i] = t == ignore ? 0.0f : v;
}

// The same, one work-item per contiguous row (inner 1) walked 8 classes at a time (a CPU:
// vector exp, and no division per element); the label's class is written again afterwards
// with its one-hot term.
__kernel void ce_bwd_rows_LT(__global const float* restrict x, __global const LT* restrict labels,
                             __global const float* restrict w,
                             __global const float* restrict stats,
                             __global const float* restrict g, __global float* restrict gx,
                             const int rows, const int C, const long ignore, const float eps,
                             const float u, const int nll, const int per_row)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    const global float* xr = x + (long)r * C;
    global float* gr = gx + (long)r * C;
    const int vec = 1;                 // ROW_EACH: 8 at a time, then the tail
    const LT t = labels[r];
    if (t == ignore) {
        ROW_EACH(c, STORE8(gr + c, (float8)(0.0f)), gr[c] = 0.0f);
        return;
    }
    const float m = stats[r], ls = stats[rows + r], d = stats[2 * rows];
    const float scale = per_row ? g[r] : g[0] == 0.0f ? g[0] : d == 0.0f ? NAN : g[0] / d;
    const bool valid = t >= 0 && t < C;
    // with weights: p a - u w[c], a = (1-eps) w[t] + u sum_c w[c]; without: p - u
    const float wt = w && valid ? w[t] : 0.0f;
    const float a = w ? (1.0f - eps) * wt + u * stats[2 * rows + 1] : 1.0f;
    ROW_EACH(c,
             const float8 p = nll ? (float8)(0.0f) : exp((LOAD8(xr + c) - m) - ls);
             STORE8(gr + c, (w ? p * a - u * LOAD8(w + c) : p - u) * scale),
             const float p = nll ? 0.0f : exp((xr[c] - m) - ls);
             gr[c] = (w ? p * a - u * w[c] : p - u) * scale);
    if (valid) {
        const float p = nll ? 0.0f : exp((xr[t] - m) - ls);
        gr[t] = (w ? p * a - (1.0f - eps) * wt - u * w[t] : p - (1.0f - eps) - u) * scale;
    }
}
"""

SOURCE = "//CL//" + ROW_HELPERS + _CE.replace("_LT(", "_i32(").replace("LT", "int") \
    + _CE.replace("_LT(", "_i64(").replace("LT", "long")


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def check_cross_entropy(logits: Tensor, labels: Tensor, op: str = "cross_entropy",
                        what: str = "logits") -> None:
    """``logits`` (N, C) with ``labels`` (N,), or (N, C, d1, ...) with (N, d1, ...)."""
    _float(op, **{what: logits})
    if logits.ndim < 2:
        raise ShapeError(f"{op}: {what} must be 2-D (N, C) or (N, C, d1, ...), got shape "
                         f"{logits.shape}")
    if labels.dtype not in LABEL_DTYPES:
        also = f" (or class probabilities of the {what}' shape)" if op == "cross_entropy" else ""
        raise DTypeError(f"{op}: labels have dtype {labels.dtype} (shape {labels.shape}), "
                         f"expected int32 or int64 class indices{also}")
    expected = logits.shape[:1] + logits.shape[2:]
    if labels.shape != expected:
        raise ShapeError(f"{op}: labels have shape {labels.shape}, expected {expected} for "
                         f"{what} {logits.shape}")
    check_same_queue(op, logits, labels)


def _suffix(labels: Tensor) -> str:
    return "i32" if labels.dtype == np.int32 else "i64"


def _rows(logits: Tensor) -> tuple[int, int, int]:
    """(rows, C, inner): the class dim is dim 1; every other position is one row."""
    c, inner = logits.shape[1], prod(logits.shape[2:])
    return logits.shape[0] * inner, c, inner


REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def check_class_weight(logits: Tensor, weight: Tensor | None, op: str) -> None:
    """Class weights: float32 of shape (C,), on the logits' queue."""
    if weight is None:
        return
    _float(op, weight=weight)
    if tuple(weight.shape) != (logits.shape[1],):
        raise ShapeError(f"{op}: weight has shape {weight.shape}, expected one weight per "
                         f"class: ({logits.shape[1]},) for input {logits.shape}")
    check_same_queue(op, logits, weight)


def cross_entropy_forward(logits: Tensor, labels: Tensor, ignore_index: int = -100,
                          label_smoothing: float = 0.0, nll: bool = False,
                          weight: Tensor | None = None, reduction: str = "mean"):
    """``logsumexp(logits[r]) - logits[r, labels[r]]`` per row (mixed with the uniform
    distribution by ``label_smoothing``; times ``weight[labels[r]]`` with class weights),
    reduced as PyTorch's ``reduction``: ``"mean"`` over the rows not labelled
    ``ignore_index`` (weighted: divided by the sum of their weights), ``"sum"``, or
    ``"none"`` (each row's loss, shape ``labels.shape``; 0 for ignored rows). ``nll=True``:
    ``logits`` are log-probabilities and the row loss is ``-logits[r, label]``.

    Returns ``(loss, stats, flag)``: the loss, ``stats`` (2 rows + 2,): each row's maximum,
    each row's log of the sum of exps below it (its log-sum-exp in two parts), what the
    backward divides by and the sum of the class weights, and an int64 (2,) flag: ``[first
    bad row or -1, its label]``.
    """
    op = "nll_loss" if nll else "cross_entropy"
    check_cross_entropy(logits, labels, op, "log_probs" if nll else "logits")
    check_class_weight(logits, weight, op)
    q = logits.queue
    rows, c, inner = _rows(logits)
    reduce = REDUCTIONS[reduction]
    loss = Tensor.empty(q, labels.shape if reduce == 0 else ())
    stats = Tensor.empty(q, (2 * rows + 2,))
    flag = Tensor.empty(q, (2,), np.int64)
    # each row's loss over the grid (every core), then their reduction in one work-group
    row_loss = loss if reduce == 0 else Tensor.empty(q, (rows,))
    w = None if weight is None else weight.data
    suffix = _suffix(labels)
    g, loc = _row_grid(rows)
    _k(q, "ce_rows_" + suffix)(q, g, loc, logits.data, labels.data, w, row_loss.data,
                               stats.data, np.int32(rows), np.int32(c), np.int32(inner),
                               np.int64(ignore_index), np.float32(label_smoothing),
                               np.int32(nll), np.int32(_contiguous_rows(q, inner)))
    name = "ce_sum_" + suffix
    L = _group(q, SOURCE, name)
    _k(q, name)(q, (L,), (L,), labels.data, w, row_loss.data, loss.data, stats.data, flag.data,
                np.int32(rows), np.int32(c), np.int64(ignore_index), np.int32(reduce),
                cl.LocalMemory(4 * L), cl.LocalMemory(4 * L), cl.LocalMemory(4 * L))
    return loss, stats, flag


def cross_entropy_backward(logits: Tensor, labels: Tensor, stats: Tensor, grad: Tensor,
                           ignore_index: int = -100, label_smoothing: float = 0.0,
                           nll: bool = False, weight: Tensor | None = None,
                           reduction: str = "mean") -> Tensor:
    """The logits' gradient of ``cross_entropy_forward``: ``(softmax(logits) - smoothed
    onehot(labels)) * grad / count`` (``nll``: without the softmax; class weights as
    PyTorch's); ``grad`` is the upstream, a scalar or (``"none"``) one per row; ``stats``
    what the forward returned."""
    q = logits.queue
    rows, c, inner = _rows(logits)
    gx = Tensor.empty(q, logits.shape)
    w = None if weight is None else weight.data
    eps = np.float32(label_smoothing)
    tail = (np.int64(ignore_index), eps, eps / np.float32(c), np.int32(nll),
            np.int32(reduction == "none"))
    suffix = _suffix(labels)
    if _contiguous_rows(q, inner):
        g, loc = _row_grid(rows)
        _k(q, "ce_bwd_rows_" + suffix)(q, g, loc, logits.data, labels.data, w, stats.data,
                                       grad.data, gx.data, np.int32(rows), np.int32(c), *tail)
    else:
        g, loc = _grid(rows * c)
        _k(q, "ce_bwd_" + suffix)(q, g, loc, logits.data, labels.data, w, stats.data, grad.data,
                                  gx.data, np.int32(rows), np.int32(c), np.int32(inner), *tail)
    return gx
