"""Softmax, log-softmax, fused cross-entropy and mean-squared-error kernels.

Softmax runs over one axis of a contiguous tensor viewed as (outer, C, inner): one work-item
per (outer, inner) line, max-subtracted, three passes over the line. The losses reduce to a
scalar inside one work-group (strided partial sums, then a fixed tree), so the loss value is
bit-reproducible and needs no second launch or atomics.

Cross-entropy checks its labels on the device: a label outside [0, C) makes that row's loss NaN
and is reported in a small int64 ``flag`` tensor (first bad row, its label; row -1 when all are
fine) that the caller may read back whenever it likes (``cross_entropy_forward`` returns it).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import softmax as sm
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.zeros((1, 4), np.float32))
>>> sm.softmax_forward(x, -1).to_host()
array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
"""

from __future__ import annotations

from math import prod

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ShapeError
from ..runtime import is_gpu
from ..tensor import FLOAT, LABEL_DTYPES, Tensor, check_same_queue
from ._cache import get_kernel, round_up

_CE = r"""
__kernel void ce_fwd_LT(__global const float* restrict x, __global const LT* restrict labels,
                        __global float* restrict loss, __global float* restrict lse,
                        __global long* restrict flag, const int N, const int C,
                        __local float* sums, __local int* bad)
{
    const int l = get_local_id(0), L = get_local_size(0);
    float acc = 0.0f;
    int first_bad = N;
    for (int r = l; r < N; r += L) {
        const global float* row = x + (long)r * C;
        float m = -INFINITY;
        for (int c = 0; c < C; ++c)
            m = fmax(m, row[c]);
        float s = 0.0f;
        for (int c = 0; c < C; ++c)
            s += exp(row[c] - m);
        const float z = m + log(s);
        lse[r] = z;
        const LT t = labels[r];
        if (t < 0 || t >= C) {
            acc += NAN;
            first_bad = min(first_bad, r);
        } else {
            acc += z - row[t];
        }
    }
    sums[l] = acc;
    bad[l] = first_bad;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) {
            sums[l] += sums[l + s];
            bad[l] = min(bad[l], bad[l + s]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) {
        loss[0] = sums[0] / (float)N;
        flag[0] = bad[0] < N ? bad[0] : -1;
        flag[1] = bad[0] < N ? (long)labels[bad[0]] : 0;
    }
}

// gx[r][c] = (softmax(x)[r][c] - (c == label[r])) * g / N
__kernel void ce_bwd_LT(__global const float* restrict x, __global const LT* restrict labels,
                        __global const float* restrict lse, __global const float* restrict g,
                        __global float* restrict gx, const int N, const int C)
{
    const long i = get_global_id(0);
    if (i >= (long)N * C)
        return;
    const int r = (int)(i / C), c = (int)(i - (long)r * C);
    const float p = exp(x[i] - lse[r]);
    gx[i] = (p - (labels[r] == c ? 1.0f : 0.0f)) * (g[0] / (float)N);
}
"""

SOURCE = r"""//CL//
// y = softmax (or log-softmax with LOG) of x along C, x viewed as (outer, C, inner).
__kernel void softmax_fwd(__global const float* restrict x, __global float* restrict y,
                          const long lines, const int C, const int inner, const int log_out)
{
    const long gid = get_global_id(0);
    if (gid >= lines)
        return;
    const long o = gid / inner;
    const int i = (int)(gid - o * inner);
    const global float* xl = x + o * C * inner + i;
    global float* yl = y + o * C * inner + i;
    float m = -INFINITY;
    for (int c = 0; c < C; ++c)
        m = fmax(m, xl[(long)c * inner]);
    float s = 0.0f;
    for (int c = 0; c < C; ++c)
        s += exp(xl[(long)c * inner] - m);
    if (log_out) {
        const float z = m + log(s);
        for (int c = 0; c < C; ++c)
            yl[(long)c * inner] = xl[(long)c * inner] - z;
    } else {
        const float inv = 1.0f / s;
        for (int c = 0; c < C; ++c)
            yl[(long)c * inner] = exp(xl[(long)c * inner] - m) * inv;
    }
}

// softmax:     gx = y * (g - sum(g * y));    log-softmax: gx = g - exp(y) * sum(g)
__kernel void softmax_bwd(__global const float* restrict y, __global const float* restrict g,
                          __global float* restrict gx, const long lines, const int C,
                          const int inner, const int log_out)
{
    const long gid = get_global_id(0);
    if (gid >= lines)
        return;
    const long o = gid / inner;
    const int i = (int)(gid - o * inner);
    const long base = o * C * inner + i;
    float s = 0.0f;
    if (log_out) {
        for (int c = 0; c < C; ++c)
            s += g[base + (long)c * inner];
        for (int c = 0; c < C; ++c) {
            const long j = base + (long)c * inner;
            gx[j] = g[j] - exp(y[j]) * s;
        }
    } else {
        for (int c = 0; c < C; ++c) {
            const long j = base + (long)c * inner;
            s += g[j] * y[j];
        }
        for (int c = 0; c < C; ++c) {
            const long j = base + (long)c * inner;
            gx[j] = y[j] * (g[j] - s);
        }
    }
}

// loss[0] = mean((p - t)^2), one work-group.
__kernel void mse_fwd(__global const float* restrict p, __global const float* restrict t,
                      __global float* restrict loss, const long n, __local float* sums)
{
    const int l = get_local_id(0), L = get_local_size(0);
    float acc = 0.0f;
    for (long i = l; i < n; i += L) {
        const float d = p[i] - t[i];
        acc += d * d;
    }
    sums[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s)
            sums[l] += sums[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0)
        loss[0] = sums[0] / (float)n;
}

// gp = 2 (p - t) g / n, gt = -gp (each only when its pointer is not NULL)
__kernel void mse_bwd(__global const float* restrict p, __global const float* restrict t,
                      __global const float* restrict g, __global float* restrict gp,
                      __global float* restrict gt, const long n, const int which)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    const float v = 2.0f * (p[i] - t[i]) * (g[0] / (float)n);
    if (which & 1)
        gp[i] = v;
    if (which & 2)
        gt[i] = -v;
}
""" + _CE.replace("LT", "int").replace("ce_fwd_int", "ce_fwd_i32") \
         .replace("ce_bwd_int", "ce_bwd_i32") \
    + _CE.replace("LT", "long").replace("ce_fwd_long", "ce_fwd_i64") \
         .replace("ce_bwd_long", "ce_bwd_i64")

LOCAL = 64


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def _group(queue) -> int:
    return 256 if is_gpu(queue.device) else 64


def _grid(n: int):
    return (round_up(max(n, 1), LOCAL),), (LOCAL,)


def _float(op: str, **ts) -> None:
    for name, t in ts.items():
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {name} has dtype {t.dtype} (shape {t.shape}), expected "
                             "float32")


def _lines(op: str, shape, axis: int) -> tuple[int, int, int, int]:
    """(axis, outer, C, inner) of ``shape`` split at ``axis`` (negative counts from the end)."""
    nd = len(shape)
    if nd == 0:
        raise ShapeError(f"{op}: needs at least a 1-D input, got a scalar")
    if not -nd <= axis < nd:
        raise ShapeError(f"{op}: axis {axis} is out of range for input of shape {tuple(shape)}")
    axis %= nd
    return axis, prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def softmax_forward(x: Tensor, axis: int = -1, log: bool = False) -> Tensor:
    """Softmax (``log=True``: log-softmax) of ``x`` along ``axis``, max-subtracted."""
    op = "log_softmax" if log else "softmax"
    _float(op, x=x)
    _, outer, c, inner = _lines(op, x.shape, axis)
    y = Tensor.empty(x.queue, x.shape)
    g, loc = _grid(outer * inner)
    _k(x.queue, "softmax_fwd")(x.queue, g, loc, x.data, y.data, np.int64(outer * inner),
                               np.int32(c), np.int32(inner), np.int32(log))
    return y


def softmax_backward(y: Tensor, grad: Tensor, axis: int = -1, log: bool = False) -> Tensor:
    """Input gradient of ``softmax_forward`` from its output ``y`` and upstream ``grad``."""
    _, outer, c, inner = _lines("softmax", y.shape, axis)
    gx = Tensor.empty(y.queue, y.shape)
    g, loc = _grid(outer * inner)
    _k(y.queue, "softmax_bwd")(y.queue, g, loc, y.data, grad.data, gx.data,
                               np.int64(outer * inner), np.int32(c), np.int32(inner),
                               np.int32(log))
    return gx


def check_cross_entropy(logits: Tensor, labels: Tensor) -> None:
    _float("cross_entropy", logits=logits)
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be 2-D (N, C), got shape {logits.shape}")
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"cross_entropy: labels have dtype {labels.dtype}, expected int32 or "
                         "int64 class indices")
    if labels.shape != (logits.shape[0],):
        raise ShapeError(f"cross_entropy: labels have shape {labels.shape}, expected "
                         f"({logits.shape[0]},) for logits {logits.shape}")
    check_same_queue("cross_entropy", logits, labels)


def _suffix(labels: Tensor) -> str:
    return "i32" if labels.dtype == np.int32 else "i64"


def cross_entropy_forward(logits: Tensor, labels: Tensor):
    """Mean over the batch of ``logsumexp(logits[r]) - logits[r, labels[r]]``.

    Returns ``(loss, lse, flag)``: the scalar loss (shape ``()``), each row's log-sum-exp (for
    the backward) and an int64 (2,) flag: ``[first bad row or -1, its label]``.
    """
    check_cross_entropy(logits, labels)
    q = logits.queue
    n, c = logits.shape
    loss, lse = Tensor.empty(q, ()), Tensor.empty(q, (n,))
    flag = Tensor.empty(q, (2,), np.int64)
    L = _group(q)
    _k(q, "ce_fwd_" + _suffix(labels))(q, (L,), (L,), logits.data, labels.data, loss.data,
                                       lse.data, flag.data, np.int32(n), np.int32(c),
                                       cl.LocalMemory(4 * L), cl.LocalMemory(4 * L))
    return loss, lse, flag


def cross_entropy_backward(logits: Tensor, labels: Tensor, lse: Tensor, grad: Tensor) -> Tensor:
    """``(softmax(logits) - onehot(labels)) * grad / N``; ``grad`` is the scalar upstream."""
    q = logits.queue
    n, c = logits.shape
    gx = Tensor.empty(q, logits.shape)
    g, loc = _grid(n * c)
    _k(q, "ce_bwd_" + _suffix(labels))(q, g, loc, logits.data, labels.data, lse.data,
                                       grad.data, gx.data, np.int32(n), np.int32(c))
    return gx


def check_mse(pred: Tensor, target: Tensor) -> None:
    _float("mse_loss", pred=pred, target=target)
    if pred.shape != target.shape:
        raise ShapeError(f"mse_loss: prediction {pred.shape} and target {target.shape} differ "
                         "in shape; reshape the target to match")
    check_same_queue("mse_loss", pred, target)


def mse_forward(pred: Tensor, target: Tensor) -> Tensor:
    """``mean((pred - target)**2)`` as a scalar tensor (shape ``()``)."""
    check_mse(pred, target)
    q = pred.queue
    loss = Tensor.empty(q, ())
    L = _group(q)
    _k(q, "mse_fwd")(q, (L,), (L,), pred.data, target.data, loss.data, np.int64(pred.size),
                     cl.LocalMemory(4 * L))
    return loss


def mse_backward(pred: Tensor, target: Tensor, grad: Tensor, need_pred: bool = True,
                 need_target: bool = False):
    """Gradients ``(pred, target)`` of ``mse_forward`` (None where not asked for)."""
    q = pred.queue
    gp = Tensor.empty(q, pred.shape) if need_pred else None
    gt = Tensor.empty(q, pred.shape) if need_target else None
    g, loc = _grid(pred.size)
    _k(q, "mse_bwd")(q, g, loc, pred.data, target.data, grad.data,
                     gp.data if gp is not None else None, gt.data if gt is not None else None,
                     np.int64(pred.size), np.int32((1 if need_pred else 0) |
                                                   (2 if need_target else 0)))
    return gp, gt
