"""2-D pooling over NCHW tensors: max (with argmax for backward) and average.

Forward kernels compute one output element per work-item. Backward kernels are *gathers*: each
input element sums, in a fixed order, the gradients of the windows that contain it (for max
pooling only windows whose saved argmax is that element), so there are no atomics and results
are bit-reproducible; max pooling with windows that tile the input (stride = size, no padding)
walks each window once instead. Max pooling saves each argmax as its position within the
window, one byte for windows of up to 256 elements. The fixed-window kernels are built once
per window (size, stride and padding as ``-D`` constants): loops of constant trip count with
masked borders run ~5-10x faster on CPU devices than loops with run-time bounds.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import pool
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
>>> pool.max_pool2d_forward(x, 2)[0].to_host()[0, 0]
array([[ 5.,  7.],
       [13., 15.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..tensor import FLOAT, Tensor
from ._cache import VECTOR_TYPES
from .adaptive_pool import window_positions
from .adaptive_pool import (  # noqa: F401  (their home before adaptive_pool.py)
    ROW_SETUP,
    adaptive_avg_pool2d_backward,
    adaptive_avg_pool2d_forward,
    adaptive_size,
    i32,
    launch_rows,
    rows_of,
)
from .conv import pair
from .conv_geometry import PoolWindow, window

SOURCE = "//CL//" + VECTOR_TYPES + ROW_SETUP + r"""

#ifdef KH
// The window kernels are built per window: KH, KW (size), SH, SW (stride), PH, PW (padding)
// are compile-time constants, so every loop over a window has a constant trip count and
// unrolls; positions outside the input are masked (selects on clamped addresses), not skipped.
// Only set when they differ from the defaults: DH, DW (dilation: taps DH rows apart), OVER
// (ceil_mode's last windows reach past the padding, so they need masks even without it) and
// DIVISOR (average pool: 0 for KH*KW, 1 for the window clipped to the padded input, 2 for
// the window clipped to the input itself, count_include_pad=False).
#ifndef DH
#define DH 1
#endif
#ifndef DW
#define DW 1
#endif
#ifndef OVER
#define OVER 0
#endif
#ifndef DIVISOR
#define DIVISOR 0
#endif
#define WINDOW_ARGS const int H, const int W, const int OH, const int OW, const int rows, \
    const int XB
#define PADDED (PH > 0 || PW > 0 || OVER)
// Windows o that may contain input position i: o = (i + P) / S - j for j < NW (then checked),
// NW = ceil(span / S) for a window spanning (K - 1)*D + 1 inputs.
#define NWY (((KH - 1) * DH + SH) / SH)
#define NWX (((KW - 1) * DW + SW) / SW)
// The first tap of a window starting at o that is inside the input (o < 0: in the padding).
#define FIRST_IN(o, D) ((o) < 0 ? (-(o) + (D) - 1) / (D) : 0)

// Max pool: the first maximum of each window (NaN wins, as PyTorch) and its position within
// the window, ky * KW + kx: one byte for windows of up to 256 elements (a quarter of an int's
// memory kept for backward), an int for larger ones. Padding is -inf.
#if KH * KW <= 256
typedef uchar idx_t;
// Backward reads one byte per candidate window, a gather: CPUs have no byte gathers, so read
// the aligned 32-bit word that holds it and shift (pool buffers are whole multiples of 256
// bytes, so the word is inside the buffer).
inline int load_idx(const global idx_t* p, const long o)
{
    const uint w = ((const global uint*)p)[o >> 2];
#ifdef __ENDIAN_LITTLE__
    return (int)((w >> ((o & 3) * 8)) & 0xff);
#else
    return (int)((w >> ((3 - (o & 3)) * 8)) & 0xff);
#endif
}
#else
typedef int idx_t;
inline int load_idx(const global idx_t* p, const long o) { return p[o]; }
#endif
#define POOL_2X2 (KH == 2 && KW == 2 && SH == 2 && SW == 2 && DH == 1 && DW == 1 && !PADDED)
#if POOL_2X2
// 2x2 windows at stride 2 (the usual pooling layer), 8 outputs at a time: 16 floats of each of
// the two input rows (float8u, VECTOR_TYPES), split into even and odd columns; every lane
// makes the scalar loop's decisions (below), in its order. A row that is not whole blocks ends
// with a block overlapping the one before (the same values written twice) rather than with
// scalar iterations. Rows of 8 outputs or more (26x26 inputs: 1.6-2.6x faster); shorter rows
// measured no gain with 4-wide blocks and keep the scalar loop.
#define TAKE(v, k) { const int8 t = (v > best) | (v != v); \
                     best = select(best, v, t); arg = select(arg, (int8)(k), t); }
#define POOL_BLOCKS \
    for (const global float* r0 = xp + y0 * W; ox < c1 && c1 - c0 >= 8; ox += 8) { \
        ox = min(ox, c1 - 8); \
        const global float* p0 = r0 + 2 * ox; \
        const float8u a = *(const global float8u*)p0, b = *(const global float8u*)(p0 + 8); \
        const float8u c = *(const global float8u*)(p0 + W); \
        const float8u d = *(const global float8u*)(p0 + W + 8); \
        float8 best = (float8)(-INFINITY); \
        int8 arg = (int8)(0); \
        const float8 v00 = (float8)(a.even, b.even), v01 = (float8)(a.odd, b.odd); \
        const float8 v10 = (float8)(c.even, d.even), v11 = (float8)(c.odd, d.odd); \
        TAKE(v00, 0) TAKE(v01, 1) TAKE(v10, 2) TAKE(v11, 3) \
        *(global float8u*)(y + (long)row * OW + ox) = best; \
        if (save_idx) \
            *(global uchar8u*)(idx + (long)row * OW + ox) = convert_uchar8(arg); \
    }
#endif
__kernel void max_pool_fwd(__global const float* restrict x, __global float* restrict y,
                           __global idx_t* restrict idx, const int save_idx, WINDOW_ARGS)
{
    ROW_SETUP(OW, OH)
    const global float* xp = x + plane * H * W;
    const int y0 = r * SH - PH;
    int ox = c0;
#if POOL_2X2
    POOL_BLOCKS
#endif
    for (; ox < c1; ++ox) {
        const int x0 = ox * SW - PW;
        float best = -INFINITY;
        // as PyTorch: the first in-bounds position when no value beats -inf
        int arg = FIRST_IN(y0, DH) * KW + FIRST_IN(x0, DW);
        #pragma unroll
        for (int ky = 0; ky < KH; ++ky) {
            #pragma unroll
            for (int kx = 0; kx < KW; ++kx) {
                const int iy = y0 + ky * DH, ix = x0 + kx * DW, at = iy * W + ix;
#if PADDED
                const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
                const float v = in ? xp[in ? at : 0] : -INFINITY;
#else
                const float v = xp[at];
#endif
                const bool take = v > best || v != v;     // isnan(v), but vectorises
                best = take ? v : best;
                arg = take ? ky * KW + kx : arg;
            }
        }
        y[(long)row * OW + ox] = best;
        if (save_idx)
            idx[(long)row * OW + ox] = (idx_t)arg;
    }
}

#if SH == KH && SW == KW && DH == 1 && DW == 1 && !PADDED
// Windows that tile the input (stride = size, no padding): each input has at most one window,
// so a work-item takes its columns of one input row window by window: contiguous loads of idx
// and g, KW stores each, no gathers. Inputs past the last window get 0.
__kernel void max_pool_bwd(__global const float* restrict g,
                           __global const idx_t* restrict idx, __global float* restrict gx,
                           WINDOW_ARGS)
{
    ROW_SETUP(W, H)
    const int oy = r / SH, ky = r - oy * SH;
    const long o0 = (plane * OH + oy) * OW;
    global float* dst = gx + (long)row * W;
    const int covered = oy < OH ? OW * SW : 0;
    // the whole windows in [c0, c1), and the columns around them one at a time
    const int ox0 = (c0 + SW - 1) / SW, ox1 = max(min(c1, covered) / SW, ox0);
#define ONE(xx) { \
        const int ox = (xx) / SW; \
        const long o = o0 + ((xx) < covered ? ox : 0); \
        dst[xx] = ((xx) < covered && idx[o] == ky * KW + (xx) - ox * SW) ? g[o] : 0.0f; }
    for (int xx = c0; xx < min(c1, ox0 * SW); ++xx)
        ONE(xx)
    for (int ox = ox0; ox < ox1; ++ox) {
        const int t = idx[o0 + ox];
        const float v = g[o0 + ox];
        #pragma unroll
        for (int kx = 0; kx < KW; ++kx)
            dst[ox * SW + kx] = t == ky * KW + kx ? v : 0.0f;
    }
    for (int xx = max(c0, ox1 * SW); xx < c1; ++xx)
        ONE(xx)
#undef ONE
}
#else
// Gathers: input (plane, r, xx) sums, in increasing (oy, ox) order, the gradients of the
// windows that took it.
__kernel void max_pool_bwd(__global const float* restrict g,
                           __global const idx_t* restrict idx, __global float* restrict gx,
                           WINDOW_ARGS)
{
    ROW_SETUP(W, H)
    const long base = plane * OH * OW;
    const int oyh = (r + PH) / SH;
    for (int xx = c0; xx < c1; ++xx) {
        const int oxh = (xx + PW) / SW;
        float acc = 0.0f;
        #pragma unroll
        for (int j = NWY - 1; j >= 0; --j) {
            const int oy = oyh - j, offy = r + PH - oy * SH, ky = offy / DH;
            const bool iny = oy >= 0 && oy < OH && offy % DH == 0 && ky < KH;
            #pragma unroll
            for (int i = NWX - 1; i >= 0; --i) {
                const int ox = oxh - i, offx = xx + PW - ox * SW, kx = offx / DW;
                const bool in = iny && ox >= 0 && ox < OW && offx % DW == 0 && kx < KW;
                const long o = base + (in ? oy * OW + ox : 0);
                acc += (in && load_idx(idx, o) == ky * KW + kx) ? g[o] : 0.0f;
            }
        }
        gx[(long)row * W + xx] = acc;
    }
}
#endif

// Average pool. DIVISOR 0: KH*KW (count_include_pad, PyTorch's default, with every window
// inside the padded input), or DIVIDE_BY where given (PyTorch's divisor_override: the window
// sum over that, for every window); else PyTorch's rule: the window clipped to the padded
// input (1) or to the input (2, count_include_pad=False).
#ifndef DIVIDE_BY
#define DIVIDE_BY (KH * KW)
#endif
inline float pool_divisor(const int y0, const int x0, const int H, const int W)
{
    const int ye = min(y0 + KH, H + PH), xe = min(x0 + KW, W + PW);
#if DIVISOR == 2
    return (float)((min(ye, H) - max(y0, 0)) * (min(xe, W) - max(x0, 0)));
#else
    return (float)((ye - y0) * (xe - x0));
#endif
}

__kernel void avg_pool_fwd(__global const float* restrict x, __global float* restrict y,
                           WINDOW_ARGS)
{
    ROW_SETUP(OW, OH)
    const global float* xp = x + plane * H * W;
    const int y0 = r * SH - PH;
    const float inv = 1.0f / (float)(DIVIDE_BY);
    for (int ox = c0; ox < c1; ++ox) {
        const int x0 = ox * SW - PW;
        float acc = 0.0f;
        #pragma unroll
        for (int ky = 0; ky < KH; ++ky) {
            #pragma unroll
            for (int kx = 0; kx < KW; ++kx) {
                const int at = (y0 + ky) * W + x0 + kx;
#if PADDED
                const bool in = y0 + ky >= 0 && y0 + ky < H && x0 + kx >= 0 && x0 + kx < W;
                acc += in ? xp[in ? at : 0] : 0.0f;
#else
                acc += xp[at];
#endif
            }
        }
#if DIVISOR == 0
        y[(long)row * OW + ox] = acc * inv;
#else
        y[(long)row * OW + ox] = acc / pool_divisor(y0, x0, H, W);
#endif
    }
}

__kernel void avg_pool_bwd(__global const float* restrict g, __global float* restrict gx,
                           WINDOW_ARGS)
{
    ROW_SETUP(W, H)
    const long base = plane * OH * OW;
    const int oyh = (r + PH) / SH;
    const float inv = 1.0f / (float)(DIVIDE_BY);
    for (int xx = c0; xx < c1; ++xx) {
        const int oxh = (xx + PW) / SW;
        float acc = 0.0f;
        #pragma unroll
        for (int j = NWY - 1; j >= 0; --j) {
            const int oy = oyh - j;
            const bool iny = oy >= 0 && oy < OH && r + PH - oy * SH < KH;
            #pragma unroll
            for (int i = NWX - 1; i >= 0; --i) {
                const int ox = oxh - i;
                const bool in = iny && ox >= 0 && ox < OW && xx + PW - ox * SW < KW;
#if DIVISOR == 0
                acc += in ? g[base + (in ? oy * OW + ox : 0)] : 0.0f;
#else
                acc += in ? g[base + (in ? oy * OW + ox : 0)] /
                            pool_divisor(oy * SH - PH, ox * SW - PW, H, W) : 0.0f;
#endif
            }
        }
#if DIVISOR == 0
        gx[(long)row * W + xx] = acc * inv;
#else
        gx[(long)row * W + xx] = acc;
#endif
    }
}

#endif
"""

def _launch(queue, name: str, run: int, rows: int, *args, options=()) -> None:
    launch_rows(queue, SOURCE, name, run, rows, *args, options=options)


def _check(op: str, x: Tensor) -> None:
    if x.dtype != FLOAT:
        raise DTypeError(f"{op}: input has dtype {x.dtype} (shape {x.shape}), expected float32")


def _args(x_shape, o):
    return i32(x_shape[2], x_shape[3], o[0], o[1])


def index_dtype(kernel_size) -> np.dtype:
    """The dtype of max pooling's saved indices for a window: uint8 up to 256 elements (the
    index is the position within the window), int32 for larger windows."""
    kh, kw = pair("max_pool2d", "kernel_size", kernel_size)
    return np.dtype(np.uint8 if kh * kw <= 256 else np.int32)


def max_pool2d_forward(x: Tensor, kernel_size, stride=None, padding=0,
                       save_indices: bool = True, *, dilation=1, ceil_mode: bool = False):
    """Max pool (padding is -inf); returns ``(y, indices)``: for each output the position of
    its window's maximum within the window, ``ky * kw + kx``, as ``index_dtype(kernel_size)``
    (uint8 for windows of up to 256 elements), or None when not saved."""
    _check("max_pool2d", x)
    win = window("max_pool2d", x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    n, c = x.shape[:2]
    y = Tensor.empty(x.queue, (n, c, *win.out))
    idx = Tensor.empty(x.queue, y.shape, index_dtype(win.kernel)) if save_indices else None
    _launch(x.queue, "max_pool_fwd", win.out[1], n * c * win.out[0], x.data, y.data,
            idx.data if idx is not None else None, np.int32(save_indices),
            *_args(x.shape, win.out), options=win.options())
    return y, idx


def max_pool2d_backward(grad: Tensor, indices: Tensor, x_shape, kernel_size, stride=None,
                        padding=0, *, dilation=1, ceil_mode: bool = False) -> Tensor:
    win = window("max_pool2d", x_shape, kernel_size, stride, padding, dilation, ceil_mode)
    k = win.kernel
    if indices.dtype != index_dtype(k) or tuple(indices.shape) != tuple(grad.shape):
        raise DTypeError(f"max_pool2d backward: indices {indices.shape} {indices.dtype} do not "
                         f"come from max_pool2d_forward with window {k} for gradient "
                         f"{grad.shape} (expected {index_dtype(k)})")
    gx = Tensor.empty(grad.queue, tuple(x_shape))
    _launch(grad.queue, "max_pool_bwd", x_shape[3], rows_of(x_shape), grad.data, indices.data,
            gx.data, *_args(x_shape, win.out), options=win.options())
    return gx


def _divisor(win: PoolWindow, count_include_pad: bool) -> int:
    """The average pool's DIVISOR mode (see the kernel source) for ``win``."""
    if count_include_pad:
        return 1 if win.overhang else 0
    return 2 if win.overhang or win.padding != (0, 0) else 0


def _avg_options(win: PoolWindow, count_include_pad: bool, divisor_override) -> tuple:
    if divisor_override is None:
        return win.options(_divisor(win, count_include_pad))
    return win.options(0) + (f"-DDIVIDE_BY=({int(divisor_override)})",)


def avg_pool2d_forward(x: Tensor, kernel_size, stride=None, padding=0, *,
                       ceil_mode: bool = False, count_include_pad: bool = True,
                       divisor_override: int | None = None) -> Tensor:
    """Average pool; the divisor follows PyTorch: ``kh*kw`` with ``count_include_pad`` (zero
    padding counts; a ceil_mode window is clipped to the padded input), else the number of
    input elements in the window; ``divisor_override`` for every window where given."""
    _check("avg_pool2d", x)
    win = window("avg_pool2d", x.shape, kernel_size, stride, padding, 1, ceil_mode)
    y = Tensor.empty(x.queue, (*x.shape[:2], *win.out))
    _launch(x.queue, "avg_pool_fwd", win.out[1], rows_of(y.shape), x.data, y.data,
            *_args(x.shape, win.out),
            options=_avg_options(win, count_include_pad, divisor_override))
    return y


def avg_pool2d_backward(grad: Tensor, x_shape, kernel_size, stride=None, padding=0, *,
                        ceil_mode: bool = False, count_include_pad: bool = True,
                        divisor_override: int | None = None) -> Tensor:
    win = window("avg_pool2d", x_shape, kernel_size, stride, padding, 1, ceil_mode)
    gx = Tensor.empty(grad.queue, tuple(x_shape))
    _launch(grad.queue, "avg_pool_bwd", x_shape[3], rows_of(x_shape), grad.data, gx.data,
            *_args(x_shape, win.out),
            options=_avg_options(win, count_include_pad, divisor_override))
    return gx


def max_pool2d_positions(x: Tensor, kernel_size, stride=None, padding=0, *, dilation=1,
                         ceil_mode: bool = False) -> Tensor:
    """Each max pool output's input position in its plane, ``h * W + w`` (int64): what
    PyTorch's ``return_indices=True`` gives. The pool's saved window positions (first
    maximum) looked up in a table of every window's input positions."""
    win = window("max_pool2d", x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    _, local = max_pool2d_forward(x, kernel_size, stride, padding, dilation=dilation,
                                  ceil_mode=ceil_mode)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = win.kernel, win.stride, win.padding, win.dilation
    (oh, ow), width = win.out, x.shape[3]
    rows = np.arange(oh)[:, None] * sh - ph + np.arange(kh)[None, :] * dh     # (oh, kh)
    cols = np.arange(ow)[:, None] * sw - pw + np.arange(kw)[None, :] * dw     # (ow, kw)
    table = rows[:, None, :, None] * width + cols[None, :, None, :]          # (oh, ow, kh, kw)
    return window_positions(local, table.reshape(oh * ow, kh * kw))
