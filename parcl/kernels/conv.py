"""2-D convolution as im2col + GEMM, with a gather col2im for the input gradient.

Layout: ``cols`` has one row per output pixel (``n, oy, ox``) and one column per weight tap
(``c, ky, kx``), so the forward is a single NT GEMM over the whole batch chunk,
``cols (nb*P, K) @ W (cout, K)^T -> (nb*P, cout)`` with the bias fused in the GEMM epilogue,
followed by a transpose back to NCHW. The backward reuses the same layout: the upstream gradient
is transposed to ``(nb*P, cout)`` once, then ``grad_W += G^T @ cols`` (TN GEMM, accumulated
over chunks in a fixed order) and ``grad_cols = G @ W`` (NN GEMM) folded back by ``col2im``,
a *gather*: every input pixel sums its taps in a fixed (ky, kx) order, no atomics.

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

import numpy as np

from ..errors import DTypeError, ShapeError
from ..runtime import is_gpu
from ..tensor import FLOAT, Tensor, check_same_queue
from ._cache import get_kernel, round_up
from .gemm import gemm

SOURCE = r"""//CL//
// cols[r][k] = x[n][c][oy*SH - PH + ky][ox*SW - PW + kx] (0 outside), r = (n, oy, ox) counted
// from the chunk start, k = (c, ky, kx). One element per work-item, consecutive k adjacent.
__kernel void im2col(__global const float* restrict x, const long x_off,
                     __global float* restrict cols, const long total,
                     const int C, const int H, const int W, const int KH, const int KW,
                     const int SH, const int SW, const int PH, const int PW,
                     const int OH, const int OW)
{
    const long gid = get_global_id(0);
    if (gid >= total)
        return;
    const int K = C * KH * KW;
    const long r = gid / K;
    const int k = (int)(gid - r * K);
    const int P = OH * OW;
    const long n = r / P;
    const int p = (int)(r - n * P);
    const int oy = p / OW, ox = p - (p / OW) * OW;
    const int c = k / (KH * KW);
    const int t = k - c * KH * KW;
    const int ky = t / KW, kx = t - (t / KW) * KW;
    const int y = oy * SH - PH + ky, xx = ox * SW - PW + kx;
    float v = 0.0f;
    if (y >= 0 && y < H && xx >= 0 && xx < W)
        v = x[x_off + ((n * C + c) * H + y) * (long)W + xx];
    cols[gid] = v;
}

// gx[n][c][y][x] = sum over the taps (ky, kx) that read (y, x) of dcols[(n, oy, ox)][(c, ky, kx)],
// summed in ky-major order: a gather, so no two work-items write the same element.
__kernel void col2im(__global const float* restrict dcols, __global float* restrict gx,
                     const long gx_off, const long total,
                     const int C, const int H, const int W, const int KH, const int KW,
                     const int SH, const int SW, const int PH, const int PW,
                     const int OH, const int OW)
{
    const long gid = get_global_id(0);
    if (gid >= total)
        return;
    const int xx = (int)(gid % W);
    const long t0 = gid / W;
    const int y = (int)(t0 % H);
    const long t1 = t0 / H;
    const int c = (int)(t1 % C);
    const long n = t1 / C;
    const int K = C * KH * KW;
    const long base = n * OH * OW;
    float acc = 0.0f;
    for (int ky = 0; ky < KH; ++ky) {
        const int ty = y + PH - ky;
        if (ty < 0 || ty % SH != 0)
            continue;
        const int oy = ty / SH;
        if (oy >= OH)
            continue;
        for (int kx = 0; kx < KW; ++kx) {
            const int tx = xx + PW - kx;
            if (tx < 0 || tx % SW != 0)
                continue;
            const int ox = tx / SW;
            if (ox >= OW)
                continue;
            acc += dcols[(base + oy * OW + ox) * K + (c * KH + ky) * KW + kx];
        }
    }
    gx[gx_off + gid] = acc;
}

// out[off + (b, j, i)] = in[in_off + (b, i, j)] for in of shape (B, R, S): per-batch transpose.
__kernel void transpose_cpu(__global const float* restrict in, const long in_off,
                            __global float* restrict out, const long out_off,
                            const int R, const int S, const long total)
{
    const long gid = get_global_id(0);
    if (gid >= total)
        return;
    const long RS = (long)R * S;
    const long b = gid / RS;
    const int rem = (int)(gid - b * RS);
    const int j = rem / R, i = rem - (rem / R) * R;       // output (b, j, i), j < S, i < R
    out[out_off + gid] = in[in_off + b * RS + (long)i * S + j];
}

#define TT 16
__kernel void transpose_tiled(__global const float* restrict in, const long in_off,
                              __global float* restrict out, const long out_off,
                              const int R, const int S, const long total)
{
    __local float tile[TT][TT + 1];
    const int b = get_global_id(2);
    const int j0 = get_group_id(0) * TT, i0 = get_group_id(1) * TT;
    const int lx = get_local_id(0), ly = get_local_id(1);
    const long RS = (long)R * S;
    const global float* src = in + in_off + b * RS;
    global float* dst = out + out_off + b * RS;
    if (i0 + ly < R && j0 + lx < S)
        tile[ly][lx] = src[(long)(i0 + ly) * S + j0 + lx];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j0 + ly < S && i0 + lx < R)
        dst[(long)(j0 + ly) * R + i0 + lx] = tile[lx][ly];
}

"""

LOCAL = 64
COLS_LIMIT = 1 << 24        # floats in one im2col chunk (64 MiB)


def _k(queue, name: str):
    return get_kernel(queue, SOURCE, name)


def _grid(n: int) -> tuple[tuple[int], tuple[int]]:
    return (round_up(max(n, 1), LOCAL),), (LOCAL,)


def pair(op: str, name: str, v) -> tuple[int, int]:
    """An int or a pair of ints as a pair (stride, padding, kernel_size)."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    try:
        a, b = v
        return int(a), int(b)
    except (TypeError, ValueError):
        raise ShapeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}") from None


def out_size(op: str, h: int, w: int, kh: int, kw: int, sh: int, sw: int, ph: int,
             pw: int) -> tuple[int, int]:
    """The output height and width of a kh x kw window sliding with stride and padding."""
    if sh < 1 or sw < 1:
        raise ShapeError(f"{op}: stride must be >= 1, got {(sh, sw)}")
    if ph < 0 or pw < 0:
        raise ShapeError(f"{op}: padding must be >= 0, got {(ph, pw)}")
    oh = (h + 2 * ph - kh) // sh + 1
    ow = (w + 2 * pw - kw) // sw + 1
    if kh < 1 or kw < 1 or oh < 1 or ow < 1:
        raise ShapeError(f"{op}: kernel {(kh, kw)} with padding {(ph, pw)} does not fit the "
                         f"input's spatial size {(h, w)}")
    return oh, ow


def _check_float(op: str, **ts) -> None:
    for name, t in ts.items():
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {name} has dtype {t.dtype} (shape {t.shape}), expected "
                             "float32")


def check_conv(x: Tensor, w: Tensor, bias: Tensor | None) -> None:
    _check_float("conv2d", x=x, weight=w, bias=bias)
    if x.ndim != 4:
        raise ShapeError(f"conv2d: input must be 4-D (N, C, H, W), got shape {x.shape}")
    if w.ndim != 4:
        raise ShapeError(f"conv2d: weight must be 4-D (cout, cin, kh, kw), got shape {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"conv2d: input has {x.shape[1]} channels but weight {w.shape} "
                         f"expects {w.shape[1]} (input shape {x.shape})")
    if bias is not None and bias.shape != (w.shape[0],):
        raise ShapeError(f"conv2d: bias has shape {bias.shape}, expected ({w.shape[0]},) for "
                         f"weight {w.shape}")
    check_same_queue("conv2d", *[t for t in (x, w, bias) if t is not None])


# -- building blocks -------------------------------------------------------------------------
def im2col(x: Tensor, n0: int, nb: int, kh: int, kw: int, stride, padding,
           out_hw) -> Tensor:
    """The (nb*OH*OW, C*kh*kw) patch matrix of images n0..n0+nb of NCHW ``x``."""
    _, c, h, w = x.shape
    oh, ow = out_hw
    cols = Tensor.empty(x.queue, (nb * oh * ow, c * kh * kw))
    g, loc = _grid(cols.size)
    _k(x.queue, "im2col")(x.queue, g, loc, x.data, np.int64(n0 * c * h * w), cols.data,
                          np.int64(cols.size), *_i32(c, h, w, kh, kw, *stride, *padding,
                                                     oh, ow))
    return cols


def col2im(dcols: Tensor, gx: Tensor, n0: int, nb: int, kh: int, kw: int, stride, padding,
           out_hw) -> None:
    """Fold ``dcols`` (nb*OH*OW, C*kh*kw) into images n0..n0+nb of ``gx`` (overwrites)."""
    _, c, h, w = gx.shape
    oh, ow = out_hw
    total = nb * c * h * w
    g, loc = _grid(total)
    _k(gx.queue, "col2im")(gx.queue, g, loc, dcols.data, gx.data, np.int64(n0 * c * h * w),
                           np.int64(total), *_i32(c, h, w, kh, kw, *stride, *padding, oh, ow))


def transpose_into(src: Tensor, src_off: int, dst: Tensor, dst_off: int, batch: int, r: int,
                   s: int) -> None:
    """dst[dst_off:] viewed (batch, s, r) = src[src_off:] viewed (batch, r, s) transposed."""
    q = src.queue
    total = batch * r * s
    if is_gpu(q.device):
        _k(q, "transpose_tiled")(q, (round_up(s, 16), round_up(r, 16), batch), (16, 16, 1),
                                 src.data, np.int64(src_off), dst.data, np.int64(dst_off),
                                 np.int32(r), np.int32(s), np.int64(total))
    else:
        g, loc = _grid(total)
        _k(q, "transpose_cpu")(q, g, loc, src.data, np.int64(src_off), dst.data,
                               np.int64(dst_off), np.int32(r), np.int32(s), np.int64(total))


def _i32(*vals) -> list[np.int32]:
    return [np.int32(v) for v in vals]


def _chunks(n: int, rows_per_image: int, k: int):
    """Batch chunks (n0, nb) whose im2col matrix stays under COLS_LIMIT floats."""
    nb = max(1, min(n, COLS_LIMIT // max(rows_per_image * k, 1)))
    for n0 in range(0, n, nb):
        yield n0, min(nb, n - n0)


# -- convolution -----------------------------------------------------------------------------
def conv2d_forward(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,
                   padding=0) -> Tensor:
    """NCHW convolution (cross-correlation, as PyTorch), weight (cout, cin, kh, kw)."""
    check_conv(x, weight, bias)
    stride, padding = pair("conv2d", "stride", stride), pair("conv2d", "padding", padding)
    n, c, h, w = x.shape
    cout, _, kh, kw = weight.shape
    oh, ow = out_size("conv2d", h, w, kh, kw, *stride, *padding)
    p, k = oh * ow, c * kh * kw
    w2 = weight.reshape(cout, k)
    out = Tensor.empty(x.queue, (n, cout, oh, ow))
    for n0, nb in _chunks(n, p, k):
        cols = im2col(x, n0, nb, kh, kw, stride, padding, (oh, ow))
        y = gemm(cols, w2, trans_b=True, bias=bias)          # (nb*P, cout): NHWC
        if p == 1:
            if nb == n:
                return y.reshape(n, cout, oh, ow)
            transpose_into(y, 0, out, n0 * cout, 1, 1, nb * cout)   # a plain copy
        else:
            transpose_into(y, 0, out, n0 * cout * p, nb, p, cout)
    return out


def conv2d_backward(x: Tensor, weight: Tensor, grad: Tensor, stride=1, padding=0,
                    need_input: bool = True, need_weight: bool = True,
                    need_bias: bool = False):
    """Gradients (input, weight, bias) of ``conv2d_forward`` for upstream ``grad`` (N, cout,
    OH, OW); entries not asked for are None. Deterministic: grad_weight is accumulated over
    batch chunks in order, col2im is a gather, the bias gradient a fixed-order reduction."""
    from .batchnorm import channel_sum
    stride, padding = pair("conv2d", "stride", stride), pair("conv2d", "padding", padding)
    n, c, h, w = x.shape
    cout, _, kh, kw = weight.shape
    _, _, oh, ow = grad.shape
    p, k = oh * ow, c * kh * kw
    w2 = weight.reshape(cout, k)
    gx = Tensor.empty(x.queue, x.shape) if need_input else None
    gw = None
    if need_input or need_weight:
        for n0, nb in _chunks(n, p, k):
            if p == 1:
                gh = grad.reshape(n, cout) if nb == n else _slice_rows(grad, n0, nb, cout)
            else:
                gh = Tensor.empty(x.queue, (nb * p, cout))
                transpose_into(grad, n0 * cout * p, gh, 0, nb, cout, p)
            if need_weight:
                cols = im2col(x, n0, nb, kh, kw, stride, padding, (oh, ow))
                if gw is None:
                    gw = gemm(gh, cols, trans_a=True)
                else:
                    gemm(gh, cols, trans_a=True, out=gw, beta=1.0)
                del cols
            if need_input:
                dcols = gemm(gh, w2)                                # (nb*P, K)
                col2im(dcols, gx, n0, nb, kh, kw, stride, padding, (oh, ow))
    gb = channel_sum(grad.reshape(n, cout, p)) if need_bias else None
    return gx, (gw.reshape(weight.shape) if gw is not None else None), gb


def _slice_rows(t: Tensor, n0: int, nb: int, width: int) -> Tensor:
    """Rows n0..n0+nb of ``t`` viewed (rows, width), as a new tensor."""
    out = Tensor.empty(t.queue, (nb, width))
    transpose_into(t, n0 * width, out, 0, 1, 1, nb * width)
    return out
