"""2-D convolution as im2col + GEMM, with a gather col2im for the input gradient.

Layout (Caffe's): ``cols`` has one row per weight tap (``c, ky, kx``) and one column per output
pixel (``n, oy, ox``) of a batch chunk, so the forward is a single GEMM over the chunk,
``W (cout, K) @ cols (K, nb*P) -> (cout, nb*P)``, and one pass (``swap01``) moves the result to
NCHW with the bias added on the way. im2col reads and writes contiguous runs along ``ox``.
The backward reuses the layout: the upstream gradient is moved to ``(cout, nb*P)`` once, then
``grad_W += G @ cols^T`` (NT GEMM, accumulated over chunks in a fixed order) and
``grad_cols = W^T @ G`` (TN GEMM) folded back by ``col2im``, a *gather*: every input pixel sums
its taps in a fixed (ky, kx) order, no atomics.

The batch is processed in chunks so ``cols`` stays under ``COLS_LIMIT`` floats; with small
inputs the whole batch is one chunk (one GEMM per conv call).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import conv
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.ones((1, 1, 3, 3), np.float32))
>>> w = pc.Tensor.from_host(q, np.ones((1, 1, 2, 2), np.float32))
>>> conv.conv2d_forward(x, w).to_host()[0, 0]
array([[4., 4.],
       [4., 4.]], dtype=float32)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..runtime import on_gpu
from ..tensor import Tensor
from . import elementwise as ew
from ._cache import VECTOR_TYPES, get_kernel, gpu_group, round_up
from .conv_geometry import (  # noqa: F401  (pair: used from here by pooling)
    ConvGeometry,
    _check_float,
    check_conv,
    pair,
    window_options,
)
from .gemm import batched_gemm, gemm

SOURCE = "//CL//" + VECTOR_TYPES + r"""
// Each work-item handles XB consecutive elements of each of RB consecutive contiguous runs
// (on CPUs whole runs, so the index arithmetic is paid once per run; 1 x 1 on GPUs, where
// neighbouring work-items touch neighbouring addresses). Grids are padded to whole work-groups.
#ifdef KH
// im2col and col2im are built per window: KH, KW (size), SH, SW (stride), PH, PW (padding),
// DH, DW (dilation) are compile-time constants, so tap loops have constant trip counts and
// borders are masks.
#define PADDED (PH > 0 || PW > 0)

// cols[k][n*P + oy*OW + ox] = x[n][c][oy*SH - PH + ky*DH][ox*SW - PW + kx*DW] (0 outside), for the
// images of one chunk; k = (c, ky, kx). Work-item (ox block, block of rows n*OH + oy, k).
__kernel void im2col(__global const float* restrict x, const long x_off,
                     __global float* restrict cols, const int nb, const int C, const int H,
                     const int W, const int OH, const int OW, const int XB, const int RB)
{
    const int ox0 = get_global_id(0) * XB, row0 = get_global_id(1) * RB;
    const int k = get_global_id(2);
    if (ox0 >= OW || row0 >= nb * OH)
        return;
    const int ox1 = min(OW, ox0 + XB), row1 = min(nb * OH, row0 + RB);
    const int c = k / (KH * KW), t = k - c * (KH * KW);
    const int ky = t / KW, kx = t - ky * KW;
    int n = row0 / OH, oy = row0 - n * OH;
    for (int row = row0; row < row1; ++row) {
        global float* dst = cols + (long)k * nb * OH * OW + (long)row * OW;
        const int y = oy * SH - PH + ky * DH;
#if PADDED
        const bool yin = y >= 0 && y < H;
        const global float* src = x + x_off + ((long)(n * C + c) * H + (yin ? y : 0)) * W;
        for (int ox = ox0; ox < ox1; ++ox) {
            const int xx = ox * SW - PW + kx * DW;
            const bool in = yin && xx >= 0 && xx < W;
            dst[ox] = in ? src[in ? xx : 0] : 0.0f;
        }
#else
        const global float* src = x + x_off + ((long)(n * C + c) * H + y) * W;
        for (int ox = ox0; ox < ox1; ++ox)
            dst[ox] = src[ox * SW + kx * DW];
#endif
        if (++oy == OH) {
            oy = 0;
            ++n;
        }
    }
}

// gx[n][c][y][x] = sum over the taps (ky, kx) that read (y, x) of dcols[(c, ky, kx)][(n, oy, ox)]
// in ky-major order: a gather, so no two work-items write one element and the order is fixed.
// Only taps with (y + PH - ky) % SH == 0 read row y: ky = (y + PH) % SH + j*SH, oy = (y + PH)
// / SH - j for j < NY (then checked), likewise along x. Work-item (x block, block of rows
// (n*C + c)*H + y).
#if DH == 1 && DW == 1
#define NY ((KH + SH - 1) / SH)
#define NX ((KW + SW - 1) / SW)
#define COL2IM_ONE(xx) { \
            const int kx0 = ((xx) + PW) % SW, ox0 = ((xx) + PW) / SW; \
            float acc = 0.0f; \
            _Pragma("unroll") \
            for (int j = 0; j < NY; ++j) { \
                const int ky = ky0 + j * SH, oy = oy0 - j; \
                const bool iny = ky < KH && oy >= 0 && oy < OH; \
                _Pragma("unroll") \
                for (int i = 0; i < NX; ++i) { \
                    const int kx = kx0 + i * SW, ox = ox0 - i; \
                    const bool in = iny && kx < KW && ox >= 0 && ox < OW; \
                    acc += in ? base[in ? (ky * KW + kx) * M + oy * OW + ox : 0] : 0.0f; \
                } \
            } \
            dst[xx] = acc; }
#else
// Dilated taps: every (ky, kx) in the same ky-major order, each checked for reading (y, xx).
#define COL2IM_ONE(xx) { \
            float acc = 0.0f; \
            _Pragma("unroll") \
            for (int ky = 0; ky < KH; ++ky) { \
                const int ty = y + PH - ky * DH, oy = ty / SH; \
                const bool iny = ty >= 0 && ty % SH == 0 && oy < OH; \
                _Pragma("unroll") \
                for (int kx = 0; kx < KW; ++kx) { \
                    const int tx = (xx) + PW - kx * DW, ox = tx / SW; \
                    const bool in = iny && tx >= 0 && tx % SW == 0 && ox < OW; \
                    acc += in ? base[in ? (ky * KW + kx) * M + oy * OW + ox : 0] : 0.0f; \
                } \
            } \
            dst[xx] = acc; }
#endif
__kernel void col2im(__global const float* restrict dcols, __global float* restrict gx,
                     const long gx_off, const int nb, const int C, const int H, const int W,
                     const int OH, const int OW, const int XB, const int RB)
{
    const int x0 = get_global_id(0) * XB, row0 = get_global_id(1) * RB;
    if (x0 >= W || row0 >= nb * C * H)
        return;
    const int x1 = min(W, x0 + XB), row1 = min(nb * C * H, row0 + RB);
    const long M = (long)nb * OH * OW;
    int y = row0 % H, nc = row0 / H;
    for (int row = row0; row < row1; ++row) {
        const int c = nc % C, n = nc / C;
        const global float* base = dcols + (long)c * KH * KW * M + (long)n * OH * OW;
        global float* dst = gx + gx_off + (long)row * W;
        const int ky0 = (y + PH) % SH, oy0 = (y + PH) / SH;
        int xx = x0;
#if SW == 1 && DH == 1 && DW == 1
        // Columns whose every tap is in bounds along x, 8 at a time: each lane adds the same
        // terms (zeros for rows out of bounds included) in the same order as the loop below.
        // A last block overlaps the one before (the same sums written twice).
        const int lo = max(x0, KW - 1 - PW), hi = min(x1, OW - PW);
        for (; xx < lo && hi - lo >= 8; ++xx)
            COL2IM_ONE(xx)
        for (; xx < hi && hi - lo >= 8; xx += 8) {
            xx = min(xx, hi - 8);
            float8 acc = (float8)(0.0f);
            #pragma unroll
            for (int j = 0; j < NY; ++j) {
                const int ky = ky0 + j * SH, oy = oy0 - j;
                const bool iny = ky < KH && oy >= 0 && oy < OH;
                const global float* tap = base + (iny ? ky * KW * M + oy * OW : 0) + xx + PW;
                #pragma unroll
                for (int i = 0; i < KW; ++i) {
                    const float8 v = *(const global float8u*)(tap + (iny ? i * M : 0) - i);
                    acc += iny ? v : (float8)(0.0f);
                }
            }
            *(global float8u*)(dst + xx) = acc;
        }
#endif
        for (; xx < x1; ++xx)
            COL2IM_ONE(xx)
        if (++y == H) {
            y = 0;
            ++nc;
        }
    }
}

#else
// dst (B, A, P) at dst_off = src (A, B, P) at src_off with the first two axes swapped, plus
// bias[a] when given, then a ReLU when asked (NaN passes, as the relu kernel):
// NCHW <-> (C, N, HW) moves of whole contiguous HW runs. Work-item (p block, b, a).
__kernel void swap01(__global const float* restrict src, const long src_off,
                     __global float* restrict dst, const long dst_off,
                     __global const float* restrict bias, const int A, const int B,
                     const int P, const int XB, const int relu)
{
    const int p0 = get_global_id(0) * XB, b = get_global_id(1), a = get_global_id(2);
    if (p0 >= P || b >= B)
        return;
    const int p1 = min(P, p0 + XB);
    const global float* s = src + src_off + ((long)a * B + b) * P;
    global float* d = dst + dst_off + ((long)b * A + a) * P;
    const float add = bias ? bias[a] : 0.0f;
    if (relu) {
        for (int p = p0; p < p1; ++p) {
            const float v = s[p] + add;
            d[p] = v < 0.0f ? 0.0f : v;
        }
    } else {
        for (int p = p0; p < p1; ++p)
            d[p] = s[p] + add;
    }
}
#endif
"""

COLS_LIMIT = 1 << 22        # floats in one im2col chunk (16 MiB): bounds a conv's temporaries
GPU_GROUP = 128             # work-items of a GPU work-group where the device allows the kernel them


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def _runs(queue, run: int, rows: int, depth: int = 1, group: int = GPU_GROUP):
    """(global, local, XB) for ``rows`` x ``depth`` contiguous runs of length ``run``: on
    GPUs in groups of ``group`` work-items (what the device allows the kernel: ``gpu_group``)."""
    if on_gpu(queue):
        lx = min(32, group, 1 << max(run - 1, 0).bit_length())
        ly = max(1, group // lx)
        return (round_up(run, lx), round_up(rows, ly), depth), (lx, ly, 1), 1
    return (1, round_up(rows, 16), depth), (1, 16, 1), run


# -- building blocks -------------------------------------------------------------------------
def _row_blocks(queue, run: int, rows: int, block: int, depth: int = 1,
                group: int = GPU_GROUP):
    """(global, local, XB, RB) for ``rows`` x ``depth`` runs of length ``run``: on CPUs one
    work-item per ``block`` whole runs (one image: far fewer, longer work-items than one per
    row, ~2x faster on PoCL), on GPUs one per element (in groups of ``group``: ``_runs``)."""
    if on_gpu(queue):
        g, loc, _ = _runs(queue, run, rows, depth, group)
        return g, loc, 1, 1
    items = -(-rows // block)
    return (1, round_up(items, 16), depth), (1, 16, 1), run, block


def im2col(x: Tensor, n0: int, nb: int, kh: int, kw: int, stride, padding,
           out_hw, dilation=(1, 1)) -> Tensor:
    """The (C*kh*kw, nb*OH*OW) patch matrix of images n0..n0+nb of NCHW ``x``."""
    _, c, h, w = x.shape
    oh, ow = out_hw
    k = c * kh * kw
    cols = Tensor.empty(x.queue, (k, nb * oh * ow))
    options = window_options(kh, kw, stride, padding, dilation)
    group = gpu_group(x.queue, SOURCE, "im2col", GPU_GROUP, options)
    g, loc, xb, rb = _row_blocks(x.queue, ow, nb * oh, oh, k, group)
    get_kernel(x.queue, SOURCE, "im2col", options)(
        x.queue, g, loc, x.data, np.int64(n0 * c * h * w), cols.data,
        *_i32(nb, c, h, w, oh, ow, xb, rb))
    return cols


def col2im(dcols: Tensor, gx: Tensor, n0: int, nb: int, kh: int, kw: int, stride, padding,
           out_hw, dilation=(1, 1)) -> None:
    """Fold ``dcols`` (C*kh*kw, nb*OH*OW) into images n0..n0+nb of ``gx`` (overwrites)."""
    _, c, h, w = gx.shape
    oh, ow = out_hw
    options = window_options(kh, kw, stride, padding, dilation)
    group = gpu_group(gx.queue, SOURCE, "col2im", GPU_GROUP, options)
    g, loc, xb, rb = _row_blocks(gx.queue, w, nb * c * h, h, group=group)
    get_kernel(gx.queue, SOURCE, "col2im", options)(
        gx.queue, g, loc, dcols.data, gx.data, np.int64(n0 * c * h * w),
        *_i32(nb, c, h, w, oh, ow, xb, rb))


def swap01(src: Tensor, src_off: int, dst: Tensor, dst_off: int, a: int, b: int, p: int,
           bias: Tensor | None = None, relu: bool = False) -> None:
    """dst[dst_off:] viewed (b, a, p) = src[src_off:] viewed (a, b, p), + bias[a] if given,
    then max(., 0) when ``relu``."""
    q = src.queue
    g, loc, xb = _runs(q, p, b, a, gpu_group(q, SOURCE, "swap01", GPU_GROUP))
    _k(q, "swap01")(q, g, loc, src.data, np.int64(src_off), dst.data, np.int64(dst_off),
                    bias.data if bias is not None else None, *_i32(a, b, p, xb, relu))


def _i32(*vals) -> list[np.int32]:
    return [np.int32(v) for v in vals]


def _chunks(n: int, rows_per_image: int, k: int):
    """Batch chunks (n0, nb) whose im2col matrix stays under COLS_LIMIT floats; none for a
    batch of no images (x[n:])."""
    if n == 0:
        return
    nb = max(1, min(n, COLS_LIMIT // max(rows_per_image * k, 1)))
    nb = -(-n // -(-n // nb))                   # balanced: 32 images as 16 + 16, not 28 + 4
    for n0 in range(0, n, nb):
        yield n0, min(nb, n - n0)


def _matmul(w2: Tensor, cols: Tensor, groups: int, **kw) -> Tensor:
    """``w2 @ cols`` (the transposes of ``gemm`` in ``kw``), one product per group along the
    rows of both (a batched GEMM) when ``groups`` > 1, as a 2-D result."""
    if groups == 1:
        return gemm(w2, cols, **kw)
    a = w2.reshape(groups, w2.shape[0] // groups, w2.shape[1])
    b = cols.reshape(groups, cols.shape[0] // groups, cols.shape[1])
    y = batched_gemm(a, b, **kw)
    return y.reshape(y.shape[0] * y.shape[1], y.shape[2])


# -- convolution -----------------------------------------------------------------------------
def conv2d_forward(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,
                   padding=0, relu: bool = False, dilation=1, groups: int = 1) -> Tensor:
    """NCHW convolution (cross-correlation, as PyTorch), weight (cout, cin/groups, kh, kw);
    then a ReLU, fused into the last pass, when ``relu``. ``groups == cin`` (depthwise) runs a
    direct kernel (``parcl.kernels.depthwise``); other groups one GEMM per group."""
    check_conv(x, weight, bias, groups)
    n, c, h, w = x.shape
    geo = ConvGeometry.of("conv2d", (h, w), weight.shape, stride, padding, dilation, groups)
    if groups > 1 and groups == c:
        from .depthwise import depthwise_forward
        return depthwise_forward(x, weight, bias, geo, relu)
    cout, _, kh, kw = weight.shape
    (oh, ow), stride, padding, dilation = geo.out, geo.stride, geo.padding, geo.dilation
    p, k = oh * ow, c * kh * kw
    w2 = weight.reshape(cout, k // groups)
    if n == 1 and bias is None:
        cols = im2col(x, 0, 1, kh, kw, stride, padding, (oh, ow), dilation)
        if groups == 1:
            return gemm(w2, cols, relu=relu).reshape(1, cout, oh, ow)
        y = _matmul(w2, cols, groups)
        if relu:
            ew.unary("relu", y, out=y)
        return y.reshape(1, cout, oh, ow)
    out = Tensor.empty(x.queue, (n, cout, oh, ow))
    for n0, nb in _chunks(n, p, k):
        cols = im2col(x, n0, nb, kh, kw, stride, padding, (oh, ow), dilation)
        y = _matmul(w2, cols, groups)                    # (cout, nb*P)
        swap01(y, 0, out, n0 * cout * p, cout, nb, p, bias, relu)
        # back to the pool before the next chunk allocates its own (the in-order queue runs
        # whatever reuses them after this chunk's kernels)
        del cols, y
    return out


def conv2d_backward(x: Tensor, weight: Tensor, grad: Tensor, stride=1, padding=0,
                    need_input: bool = True, need_weight: bool = True,
                    need_bias: bool = False, dilation=1, groups: int = 1):
    """Gradients (input, weight, bias) of ``conv2d_forward`` for upstream ``grad`` (N, cout,
    OH, OW); entries not asked for are None. Deterministic: grad_weight is accumulated over
    batch chunks in order, col2im is a gather, the bias gradient a fixed-order reduction."""
    from .batchnorm import channel_sum
    n, c, h, w = x.shape
    geo = ConvGeometry.of("conv2d", (h, w), weight.shape, stride, padding, dilation, groups)
    geo = replace(geo, out=tuple(grad.shape[2:]))     # the gradient's own size, as ever
    if groups > 1 and groups == c:
        from .depthwise import depthwise_backward
        return depthwise_backward(x, weight, grad, geo, need_input, need_weight, need_bias)
    cout, _, kh, kw = weight.shape
    (oh, ow), stride, padding, dilation = geo.out, geo.stride, geo.padding, geo.dilation
    p, k = oh * ow, c * kh * kw
    kg, cg = k // groups, cout // groups
    w2 = weight.reshape(cout, kg)
    gx = Tensor.empty(x.queue, x.shape) if need_input else None
    gw = None
    if need_input or need_weight:
        for n0, nb in _chunks(n, p, k):
            if nb == 1 and n == 1:
                gc = grad.reshape(cout, p)
            else:
                gc = Tensor.empty(x.queue, (cout, nb * p))
                swap01(grad, n0 * cout * p, gc, 0, nb, cout, p)
            if need_weight:
                cols = im2col(x, n0, nb, kh, kw, stride, padding, (oh, ow), dilation)
                gw = add_weight_grad(gw, cols, gc, groups)     # grad_W^T = cols @ G^T
                del cols
            if need_input:
                dcols = _matmul(w2, gc, groups, trans_a=True)     # (K, nb*P)
                col2im(dcols, gx, n0, nb, kh, kw, stride, padding, (oh, ow), dilation)
    gb = channel_sum(grad.reshape(n, cout, p)) if need_bias else None
    gw = weight_layout(gw, weight, groups, kg, cg) if need_weight else None
    return gx, gw, gb


def add_weight_grad(gw: Tensor | None, cols: Tensor, gc: Tensor, groups: int) -> Tensor:
    """``gw`` plus one chunk's weight gradient ``cols @ gc^T``, ``(groups * kg, cg)`` (the
    first chunk's is ``gw``): the long reduction over pixels runs about twice as fast in this
    orientation as ``gc @ cols^T`` on the CPU GEMM. conv2d's and conv3d's backward."""
    if groups > 1:
        part = _matmul(cols, gc, groups, trans_b=True)
        return part if gw is None else ew.binary("add", gw, part, out=gw)
    if gw is None:
        return gemm(cols, gc, trans_b=True)
    gemm(cols, gc, trans_b=True, out=gw, beta=1.0)
    return gw


def weight_layout(gw: Tensor | None, weight: Tensor, groups: int, kg: int, cg: int) -> Tensor:
    """The summed ``(groups * kg, cg)`` weight gradient in ``weight``'s layout, ``(cg, kg)``
    per group; zeros where no chunk ran (no images or volumes: PyTorch's zeros)."""
    if gw is None:
        return Tensor.zeros(weight.queue, weight.shape)
    out = Tensor.empty(weight.queue, weight.shape)
    for g in range(groups):
        swap01(gw, g * kg * cg, out, g * cg * kg, kg, cg, 1)
    return out
