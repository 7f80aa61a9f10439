"""Depthwise 2-D convolution (``groups == cin``): direct kernels, no im2col, no GEMM.

Output channel ``oc`` of a depthwise convolution reads only input channel ``oc // M`` (``M =
cout / cin``, the channel multiplier) through its own ``kh x kw`` taps, so a GEMM would be a
batch of tiny products. Instead each work-item walks whole output rows (CPUs; one output per
work-item on GPUs) with the window as compile-time constants (``-D``: size, stride, padding,
dilation): the taps unroll, borders are masks, and the columns whose every tap is inside the
input go 8 (or 4, in narrow rows) at a time through vector loads (stride 1 and 2). The three
passes:

* forward: ``y[n, oc] = sum_taps w[oc, tap] * x[n, oc // M]`` (+ bias, then an optional ReLU);
* input gradient: a gather, every input pixel sums its channel's ``M`` output channels and the
  taps that read it, in a fixed order (no atomics), vectorised like the forward (at stride 2
  the even and odd inputs apart);
* weight gradient: one work-item per (image, output channel) sums its taps over the image's
  pixels; the per-image partials are then summed over the batch by the fixed-order reduction.

All results are bit-identical from run to run.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import conv
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.ones((1, 2, 3, 3), np.float32))
>>> w = pc.Tensor.from_host(q, np.ones((2, 1, 2, 2), np.float32))
>>> conv.conv2d_forward(x, w, groups=2).to_host()[0, 1]
array([[4., 4.],
       [4., 4.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._cache import VECTOR_TYPES, get_kernel, gpu_group
from .conv import GPU_GROUP, ConvGeometry, _row_blocks
from .reduction import sum as reduce_sum

SOURCE = "//CL//" + VECTOR_TYPES + r"""
typedef float float4u __attribute__((ext_vector_type(4), aligned(4)));
#define NT (KH * KW)
// Columns [lo, hi) of an output row whose every tap along x is inside the input.
#define X_LO ((PW + SW - 1) / SW)
#define X_HI(W) (((W) + PW - (KW - 1) * DW - 1) / SW + 1)

// V inputs at columns p[i*SW], i < V (stride 1 or 2: one or two unaligned vector loads; the
// stride-2 loads stop at p[2V - 2], p[2V - 1] may be past the buffer's end).
inline float8 load8(const global float* p)
{
#if SW == 1
    return *(const global float8u*)p;
#elif SW == 2
    const float8u a = *(const global float8u*)p, b = *(const global float8u*)(p + 7);
    return (float8)(a.even, b.odd);
#else
    return (float8)(p[0], p[SW], p[2 * SW], p[3 * SW], p[4 * SW], p[5 * SW], p[6 * SW],
                    p[7 * SW]);
#endif
}

inline float4 load4(const global float* p)
{
#if SW == 1
    return *(const global float4u*)p;
#elif SW == 2
    const float4u a = *(const global float4u*)p, b = *(const global float4u*)(p + 3);
    return (float4)(a.even, b.odd);
#else
    return (float4)(p[0], p[SW], p[2 * SW], p[3 * SW]);
#endif
}

// y[n][oc][oy][ox] = sum over (ky, kx), ky-major, of w[oc][ky][kx] * x[n][oc / M][iy][ix], iy =
// oy*SH - PH + ky*DH, ix = ox*SW - PW + kx*DW (0 outside); then + bias[oc], then the ReLU.
// Columns whose taps are all inside the input along x go V at a time (8, or 4 in rows with
// fewer such columns; a row that is not whole blocks ends with a block overlapping the one
// before): rows outside the input are skipped for every lane alike, and each lane adds its
// taps in the scalar loop's order. Work-item (ox block, block of RB rows (n*CO + oc)*OH + oy).
#define FWD_ONE(ox) { \
            float acc = 0.0f; \
            _Pragma("unroll") \
            for (int ky = 0; ky < KH; ++ky) { \
                const int iy = iy0 + ky * DH; \
                _Pragma("unroll") \
                for (int kx = 0; kx < KW; ++kx) { \
                    const int ix = (ox) * SW - PW + kx * DW; \
                    const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W; \
                    acc += (in ? xp[in ? iy * W + ix : 0] : 0.0f) * wk[ky * KW + kx]; \
                } \
            } \
            const float v = acc + b; \
            dst[ox] = relu && v < 0.0f ? 0.0f : v; }
#define FWD_BLOCKS(VT, V, LOAD) \
        for (; ox < hi; ox += V) { \
            ox = min(ox, hi - V); \
            VT acc = (VT)(0.0f); \
            _Pragma("unroll") \
            for (int ky = 0; ky < KH; ++ky) { \
                const int iy = iy0 + ky * DH; \
                const bool iny = iy >= 0 && iy < H; \
                const global float* src = xp + (iny ? iy : 0) * W + ox * SW - PW; \
                _Pragma("unroll") \
                for (int kx = 0; kx < KW; ++kx) { \
                    const VT v = LOAD(src + kx * DW); \
                    acc += (iny ? v : (VT)(0.0f)) * wk[ky * KW + kx]; \
                } \
            } \
            VT r = acc + b; \
            if (relu) \
                r = select(r, (VT)(0.0f), r < 0.0f); \
            *(global VT##u*)(dst + ox) = r; \
        }
__kernel void dw_forward(__global const float* restrict x, __global const float* restrict w,
                         __global const float* restrict bias, __global float* restrict y,
                         const int relu, const int N, const int C, const int M, const int H,
                         const int W, const int OH, const int OW, const int XB, const int RB)
{
    const int CO = C * M, rows = N * CO * OH;
    const int ox0 = get_global_id(0) * XB, row0 = get_global_id(1) * RB;
    if (ox0 >= OW || row0 >= rows)
        return;
    const int ox1 = min(OW, ox0 + XB), row1 = min(rows, row0 + RB);
    const int lo = max(ox0, X_LO), hi = min(ox1, X_HI(W));
    for (int row = row0; row < row1; ++row) {
        const int oy = row % OH, plane = row / OH, oc = plane % CO, n = plane / CO;
        const global float* xp = x + ((long)n * C + oc / M) * H * W;
        float wk[NT];
        #pragma unroll
        for (int t = 0; t < NT; ++t)
            wk[t] = w[oc * NT + t];
        const float b = bias ? bias[oc] : 0.0f;
        global float* dst = y + (long)row * OW;
        const int iy0 = oy * SH - PH;
        int ox = ox0;
        if (hi - lo >= 4) {
            for (; ox < lo; ++ox)
                FWD_ONE(ox)
            if (hi - lo >= 8)
                FWD_BLOCKS(float8, 8, load8)
            else
                FWD_BLOCKS(float4, 4, load4)
        }
        for (; ox < ox1; ++ox)
            FWD_ONE(ox)
    }
}

// gx[n][c][iy][ix] = sum over m < M, then (ky, kx) ky-major, of g[n][c*M + m][oy][ox] *
// w[c*M + m][ky][kx] over the taps that read (iy, ix): oy*SH = iy + PH - ky*DH, likewise x.
// Inputs whose every tap along x lands on an output column go V at a time at stride 1 (V
// consecutive gradient columns per tap) and 2 (the even and odd inputs apart, V/2 gradient
// columns each through the taps of their parity, interleaved on the way out).
// Work-item (ix block, block of RB rows (n*C + c)*H + iy).
#define GX_TAPS(BODY) \
            for (int m = 0; m < M; ++m) { \
                const int oc = c * M + m; \
                const global float* gp = g + ((long)n * CO + oc) * OH * OW; \
                const global float* wk = w + oc * NT; \
                _Pragma("unroll") \
                for (int ky = 0; ky < KH; ++ky) { \
                    const int ty = iy + PH - ky * DH, oy = ty / SH; \
                    const bool iny = ty >= 0 && ty % SH == 0 && oy < OH; \
                    const global float* grow = gp + (iny ? oy : 0) * OW; \
                    _Pragma("unroll") \
                    for (int kx = 0; kx < KW; ++kx) \
                        BODY \
                } \
            }
#define GX_TERM { \
        const int tx = ix + PW - kx * DW, ox = tx / SW; \
        const bool in = iny && tx >= 0 && tx % SW == 0 && ox < OW; \
        acc += (in ? grow[in ? ox : 0] : 0.0f) * wk[ky * KW + kx]; }
#define GX_ONE { float acc = 0.0f; GX_TAPS(GX_TERM) dst[ix] = acc; }
#define GX_TERM1(VT) { \
        const VT v = *(const global VT##u*)(grow + ix + PW - kx * DW); \
        acc += (iny ? v : (VT)(0.0f)) * wk[ky * KW + kx]; }
#define GX_BLOCKS1(VT, V) \
        for (; ix < hi; ix += V) { \
            ix = min(ix, hi - V); \
            VT acc = (VT)(0.0f); \
            GX_TAPS(GX_TERM1(VT)) \
            *(global VT##u*)(dst + ix) = acc; \
        }
#define GX_TERM2(HT) { \
        const int t = ix + PW - kx * DW; \
        const HT v = *(const global HT##u*)(grow + (t + 1) / 2); \
        const HT term = (iny ? v : (HT)(0.0f)) * wk[ky * KW + kx]; \
        if (t & 1) \
            b += term; \
        else \
            a += term; }
__kernel void dw_grad_input(__global const float* restrict g, __global const float* restrict w,
                            __global float* restrict gx, const int N, const int C, const int M,
                            const int H, const int W, const int OH, const int OW, const int XB,
                            const int RB)
{
    const int CO = C * M, rows = N * C * H;
    const int ix0 = get_global_id(0) * XB, row0 = get_global_id(1) * RB;
    if (ix0 >= W || row0 >= rows)
        return;
    const int ix1 = min(W, ix0 + XB), row1 = min(rows, row0 + RB);
#if SW == 1
    const int lo = max(ix0, (KW - 1) * DW - PW), hi = min(ix1, OW - PW);
#elif SW == 2
    const int lo = max(ix0, (KW - 1) * DW - PW), hi = min(ix1, 2 * OW - PW);
#endif
    for (int row = row0; row < row1; ++row) {
        const int iy = row % H, plane = row / H, c = plane % C, n = plane / C;
        global float* dst = gx + (long)row * W;
        int ix = ix0;
#if SW == 1
        if (hi - lo >= 4) {
            for (; ix < lo; ++ix)
                GX_ONE
            if (hi - lo >= 8)
                GX_BLOCKS1(float8, 8)
            else
                GX_BLOCKS1(float4, 4)
        }
#elif SW == 2
        if (hi - lo >= 8) {
            for (; ix < lo; ++ix)
                GX_ONE
            for (; ix < hi; ix += 8) {
                ix = min(ix, hi - 8);
                float4 a = (float4)(0.0f), b = (float4)(0.0f);
                GX_TAPS(GX_TERM2(float4))
                *(global float8u*)(dst + ix) = (float8)(a.s0, b.s0, a.s1, b.s1, a.s2, b.s2,
                                                        a.s3, b.s3);
            }
        }
#endif
        for (; ix < ix1; ++ix)
            GX_ONE
    }
}

// part[n][oc][tap] = sum over (oy, ox) of g[n][oc][oy][ox] * x[n][oc / M][iy][ix]: per row, the
// columns whose taps are all inside the input along x 8 (then 4) lanes at a time (lane sums
// kept apart until the end, then added in a fixed order), the others one at a time.
// Work-item (oc, n).
#define GW_BLOCK(VT, ACC, LOAD) { \
            const VT gv = *(const global VT##u*)(grow + ox); \
            _Pragma("unroll") \
            for (int ky = 0; ky < KH; ++ky) { \
                const int iy = iy0 + ky * DH; \
                const bool iny = iy >= 0 && iy < H; \
                const global float* src = xp + (iny ? iy : 0) * W + ox * SW - PW; \
                _Pragma("unroll") \
                for (int kx = 0; kx < KW; ++kx) { \
                    const VT v = LOAD(src + kx * DW); \
                    ACC[ky * KW + kx] += iny ? gv * v : (VT)(0.0f); \
                } \
            } }
__kernel void dw_grad_weight(__global const float* restrict x, __global const float* restrict g,
                             __global float* restrict part, const int N, const int C,
                             const int M, const int H, const int W, const int OH, const int OW)
{
    const int CO = C * M;
    const int oc = get_global_id(0), n = get_global_id(1);
    if (oc >= CO || n >= N)
        return;
    const global float* xp = x + ((long)n * C + oc / M) * H * W;
    const global float* gp = g + ((long)n * CO + oc) * OH * OW;
    float acc[NT];
    float8 acc8[NT];
    float4 acc4[NT];
    #pragma unroll
    for (int t = 0; t < NT; ++t) {
        acc[t] = 0.0f;
        acc8[t] = (float8)(0.0f);
        acc4[t] = (float4)(0.0f);
    }
    const int lo = X_LO, span = max(X_HI(W) - lo, 0);
    const int v8 = lo + span / 8 * 8, vhi = v8 + span % 8 / 4 * 4;
    for (int oy = 0; oy < OH; ++oy) {
        const global float* grow = gp + oy * OW;
        const int iy0 = oy * SH - PH;
        int ox = lo;
        for (; ox < v8; ox += 8)
            GW_BLOCK(float8, acc8, load8)
        for (; ox < vhi; ox += 4)
            GW_BLOCK(float4, acc4, load4)
        for (ox = 0; ox < OW; ++ox) {
            if (ox == lo && vhi > lo)
                ox = vhi;
            if (ox >= OW)
                break;
            const float gv = grow[ox];
            #pragma unroll
            for (int ky = 0; ky < KH; ++ky) {
                const int iy = iy0 + ky * DH;
                #pragma unroll
                for (int kx = 0; kx < KW; ++kx) {
                    const int ix = ox * SW - PW + kx * DW;
                    const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
                    acc[ky * KW + kx] += in ? gv * xp[in ? iy * W + ix : 0] : 0.0f;
                }
            }
        }
    }
    global float* dst = part + ((long)n * CO + oc) * NT;
    #pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float8 v = acc8[t];
        const float4 u = acc4[t];
        dst[t] = acc[t] + (((v.s0 + v.s1) + (v.s2 + v.s3)) + ((v.s4 + v.s5) + (v.s6 + v.s7)))
                 + ((u.s0 + u.s1) + (u.s2 + u.s3));
    }
}
"""


def _i32(*vals) -> list[np.int32]:
    return [np.int32(v) for v in vals]


def depthwise_forward(x: Tensor, weight: Tensor, bias: Tensor | None, geo: ConvGeometry,
                      relu: bool = False) -> Tensor:
    """The depthwise convolution of checked inputs (``conv2d_forward`` with groups == cin)."""
    n, c, h, w = x.shape
    cout = weight.shape[0]
    oh, ow = geo.out
    y = Tensor.empty(x.queue, (n, cout, oh, ow))
    options = geo.options()
    group = gpu_group(x.queue, SOURCE, "dw_forward", GPU_GROUP, options)
    g, loc, xb, rb = _row_blocks(x.queue, ow, n * cout * oh, oh, group=group)
    get_kernel(x.queue, SOURCE, "dw_forward", options)(
        x.queue, g[:2], loc[:2], x.data, weight.data, bias.data if bias is not None else None,
        y.data, *_i32(relu, n, c, cout // c, h, w, oh, ow, xb, rb))
    return y


def depthwise_backward(x: Tensor, weight: Tensor, grad: Tensor, geo: ConvGeometry,
                       need_input: bool = True, need_weight: bool = True,
                       need_bias: bool = False):
    """Gradients (input, weight, bias) of ``depthwise_forward``; None where not asked for."""
    from .batchnorm import channel_sum
    n, c, h, w = x.shape
    cout, _, kh, kw = weight.shape
    oh, ow = geo.out
    q = x.queue
    args = _i32(n, c, cout // c, h, w, oh, ow)
    options = geo.options()
    gx = gw = gb = None
    if need_input:
        gx = Tensor.empty(q, x.shape)
        group = gpu_group(q, SOURCE, "dw_grad_input", GPU_GROUP, options)
        g, loc, xb, rb = _row_blocks(q, w, n * c * h, h, group=group)
        get_kernel(q, SOURCE, "dw_grad_input", options)(
            q, g[:2], loc[:2], grad.data, weight.data, gx.data, *args, *_i32(xb, rb))
    if need_weight:
        part = Tensor.empty(q, (n, cout * kh * kw))
        get_kernel(q, SOURCE, "dw_grad_weight", options)(
            q, (cout, n), None, x.data, grad.data, part.data, *args)
        # summed over the images, also over none (a batch x[n:]: zeros)
        gw = (reduce_sum(part, axis=0) if n != 1 else part).reshape(weight.shape)
    if need_bias:
        gb = channel_sum(grad.reshape(n, cout, oh * ow))
    return gx, gw, gb
