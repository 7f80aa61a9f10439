"""Softmax, log-softmax and mean-squared-error kernels, and the line helpers that the
cross-entropy kernels (``cross_entropy``, ``loss``) share with them.

Softmax runs over one axis of a contiguous tensor viewed as (outer, C, inner): one work-item
per (outer, inner) line, max-subtracted, three passes over the line, its sums in blocks
(``line_sums.BLOCK_SUM``: float32 accurate over GPT-2's 50257 classes). MSE reduces in one
work-group (strided partial sums, then a fixed tree): bit-reproducible with no atomics. On a
CPU a contiguous line (inner 1) is walked 8 elements at a time (``ROW_HELPERS``: explicit
``float8``, for which PoCL emits its vector ``exp``; its scalar one is a call), its sums in
blocks as ``line_sums.BLOCK_SUM8``: 8x to 15x faster over GPT-2's vocabulary, as accurate.

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
from ..runtime import on_gpu
from ..tensor import FLOAT, Tensor, check_same_queue
from ._cache import GROUP_SUM, VECTOR_TYPES, get_kernel, group_size, round_up
from .line_sums import BLOCK_SUM8

# Sums, maxima and loops along a line, 8 elements at a time on a contiguous line on a CPU
ROW_HELPERS = VECTOR_TYPES + BLOCK_SUM8 + r"""
#define LOAD8(p) (*(__global const float8u *)(p))
#define STORE8(p, v) (*(__global float8u *)(p) = (v))
// Along a line of C: vec = contiguous (inner 1) on a CPU, walked 8 at a time (vector exp).
// Each reads `vec` and `C` from the kernel. ROW_SUM: s = the sum of term in blocks (line_sums;
// term8 the float8 at c); ROW_MAX: m = the max of x1 (x8 the float8 at c); ROW_EACH: body8 for
// c = 0, 8, ... then body1 for each c of the tail (all of them where not vec).
#define ROW_SUM(s, c, term8, term)                                                      \
    do {                                                                                \
        if (vec)                                                                        \
            BLOCK_SUM8(s, c, C, term8, term);                                           \
        else                                                                            \
            BLOCK_SUM(s, c, C, term);                                                   \
    } while (0)
#define ROW_MAX(m, c, x8, x1)                                                           \
    do {                                                                                \
        m = -INFINITY;                                                                  \
        int c = 0;                                                                      \
        if (vec) {                                                                      \
            float8 m8_ = (float8)(-INFINITY);                                           \
            for (; c < (C & ~7); c += 8)                                                \
                m8_ = fmax(m8_, (x8));                                                  \
            const float4 a_ = fmax(m8_.lo, m8_.hi);                                     \
            const float2 b_ = fmax(a_.lo, a_.hi);                                       \
            m = fmax(b_.lo, b_.hi);                                                     \
        }                                                                               \
        for (; c < C; ++c)                                                              \
            m = fmax(m, (x1));                                                          \
    } while (0)
#define ROW_EACH(c, body8, body1)                                                       \
    do {                                                                                \
        int c = 0;                                                                      \
        if (vec)                                                                        \
            for (; c < (C & ~7); c += 8) {                                              \
                body8;                                                                  \
            }                                                                           \
        for (; c < C; ++c) {                                                            \
            body1;                                                                      \
        }                                                                               \
    } while (0)

"""

SOURCE = "//CL//" + ROW_HELPERS + GROUP_SUM + r"""
// y = softmax (or log-softmax with LOG) of x along C, x viewed as (outer, C, inner).
__kernel void softmax_fwd(__global const float* restrict x, __global float* restrict y,
                          const long lines, const int C, const int inner, const int log_out,
                          const int vec)
{
    const long gid = get_global_id(0);
    if (gid >= lines)
        return;
    const long o = gid / inner;
    const int i = (int)(gid - o * inner);
    const global float* xl = x + o * C * inner + i;
    global float* yl = y + o * C * inner + i;
#define XS(c) xl[(long)(c) * inner]
#define YS(c) yl[(long)(c) * inner]
    float m;
    ROW_MAX(m, c, LOAD8(xl + c), XS(c));
    float s;                              // sums along the line in blocks (BLOCK_SUM)
    if (log_out) {
        ROW_SUM(s, c, exp(LOAD8(xl + c) - m), exp(XS(c) - m));
        // (x - m) - log s, as PyTorch: x - (m + log s) lost log s where |m| is huge (a row
        // masked with -1e9 came out all 0 instead of -log C)
        const float ls = log(s);
        ROW_EACH(c, STORE8(yl + c, (LOAD8(xl + c) - m) - ls), YS(c) = (XS(c) - m) - ls);
    } else {
        // each exp is kept in y (the term stores it) and scaled there: the exp is the cost
        // here, and computing it again for the output doubled the kernel's time
        ROW_SUM(s, c, STORE8(yl + c, exp(LOAD8(xl + c) - m)), (YS(c) = exp(XS(c) - m)));
        const float inv = 1.0f / s;
        ROW_EACH(c, STORE8(yl + c, LOAD8(yl + c) * inv), YS(c) *= inv);
    }
#undef XS
#undef YS
}

// softmax:     gx = y * (g - sum(g * y));    log-softmax: gx = g - exp(y) * sum(g)
__kernel void softmax_bwd(__global const float* restrict y, __global const float* restrict g,
                          __global float* restrict gx, const long lines, const int C,
                          const int inner, const int log_out, const int vec)
{
    const long gid = get_global_id(0);
    if (gid >= lines)
        return;
    const long o = gid / inner;
    const int i = (int)(gid - o * inner);
    const long base = o * C * inner + i;
    const global float *yl = y + base, *gl = g + base;
    global float* xl = gx + base;
#define AT(p, c) p[(long)(c) * inner]
    float s;                              // sums along the line in blocks (BLOCK_SUM)
    if (log_out) {
        ROW_SUM(s, c, LOAD8(gl + c), AT(gl, c));
        ROW_EACH(c, STORE8(xl + c, LOAD8(gl + c) - exp(LOAD8(yl + c)) * s),
                 AT(xl, c) = AT(gl, c) - exp(AT(yl, c)) * s);
    } else {
        ROW_SUM(s, c, LOAD8(gl + c) * LOAD8(yl + c), AT(gl, c) * AT(yl, c));
        ROW_EACH(c, STORE8(xl + c, LOAD8(yl + c) * (LOAD8(gl + c) - s)),
                 AT(xl, c) = AT(yl, c) * (AT(gl, c) - s));
    }
#undef AT
}

// loss[0] = mean((p - t)^2), one work-group. Each work-item's strided share (n / 64 terms
// on a CPU) is summed compensated (LINE_SUM): a plain float sum of 8e6 squares was 2.3e-5
// off (PyTorch's 1.9e-8).
__kernel void mse_fwd(__global const float* restrict p, __global const float* restrict t,
                      __global float* restrict loss, const long n, __local float* sums)
{
    const int l = get_local_id(0), L = get_local_size(0);
    float2 part = (float2)(0.0f, 0.0f);
    for (long i = l; i < n; i += L) {
        const float d = p[i] - t[i];
        part = sum_step(part, d * d);
    }
    const float acc = group_sum(sum_total(part), sums);
    if (l == 0)
        loss[0] = acc / (float)n;
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
"""

LOCAL = 64


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def _group(queue, source: str, name: str) -> int:
    """The work-group of a loss reduced in one group: 256 on GPUs, 64 on CPUs, or the most the
    device allows the kernel where that is less (``group_size``)."""
    return group_size(queue, source, name, 256 if on_gpu(queue) else 64)


def _grid(n: int):
    return (round_up(max(n, 1), LOCAL),), (LOCAL,)


def _row_grid(rows: int):
    """One work-item per row: groups of up to LOCAL rows, fewer where that leaves under 8
    groups, so that a few long rows still spread over the cores."""
    loc = min(LOCAL, 1 << max((rows // 8).bit_length() - 1, 0))
    return (round_up(max(rows, 1), loc),), (loc,)


def _contiguous_rows(queue, inner: int) -> bool:
    """Whether the class-index kernels walk each row 8 classes at a time: its classes lie
    side by side (inner 1), on a CPU (PoCL's vector exp; a GPU's work-items are its vectors)."""
    return inner == 1 and not on_gpu(queue)


def _float(op: str, **ts) -> None:
    for name, t in ts.items():
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {name} has dtype {t.dtype} (shape {t.shape}), expected "
                             "float32")


def _lines(op: str, shape, axis: int) -> tuple[int, int, int, int]:
    """(axis, outer, C, inner) of ``shape`` split at ``axis`` (negative counts from the end);
    a 0-d tensor takes axis 0 and -1, as PyTorch's (one line of one element)."""
    nd = len(shape)
    n = max(nd, 1)
    if not -n <= axis < n:
        raise ShapeError(f"{op}: axis {axis} is out of range for input of shape {tuple(shape)}")
    if nd == 0:
        return 0, 1, 1, 1
    axis %= nd
    return axis, prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def softmax_forward(x: Tensor, axis: int = -1, log: bool = False) -> Tensor:
    """Softmax (``log=True``: log-softmax) of ``x`` along ``axis``, max-subtracted."""
    op = "log_softmax" if log else "softmax"
    _float(op, x=x)
    _, outer, c, inner = _lines(op, x.shape, axis)
    y = Tensor.empty(x.queue, x.shape)
    g, loc = _row_grid(outer * inner)
    _k(x.queue, "softmax_fwd")(x.queue, g, loc, x.data, y.data, np.int64(outer * inner),
                               np.int32(c), np.int32(inner), np.int32(log),
                               np.int32(_contiguous_rows(x.queue, inner)))
    return y


def softmax_backward(y: Tensor, grad: Tensor, axis: int = -1, log: bool = False) -> Tensor:
    """Input gradient of ``softmax_forward`` from its output ``y`` and upstream ``grad``."""
    _, outer, c, inner = _lines("softmax", y.shape, axis)
    gx = Tensor.empty(y.queue, y.shape)
    g, loc = _row_grid(outer * inner)
    _k(y.queue, "softmax_bwd")(y.queue, g, loc, y.data, grad.data, gx.data,
                               np.int64(outer * inner), np.int32(c), np.int32(inner),
                               np.int32(log), np.int32(_contiguous_rows(y.queue, inner)))
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
    L = _group(q, SOURCE, "mse_fwd")
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
