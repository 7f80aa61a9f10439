"""3-D convolution as vol2col + GEMM, with a gather col2vol for the input gradient: conv2d's
layout (``kernels.conv``) with one more window dim.

``cols`` has one row per weight tap ``(c, kz, ky, kx)`` and one column per output voxel ``(n,
oz, oy, ox)`` of a batch chunk, so the forward is one GEMM per chunk (per group), ``W (cout,
K) @ cols (K, nb*P) -> (cout, nb*P)``, moved to ``(N, cout, OD, OH, OW)`` with the bias by
``swap01``. The backward reuses it: ``grad_W += cols @ G^T`` chunk by chunk in order, and
``W^T @ G`` folded back by ``col2vol``, a gather (every input voxel sums its taps in a fixed
``(kz, ky, kx)`` order; no atomics). Chunks keep ``cols`` under ``conv.COLS_LIMIT`` floats.

Geometry by device type: on CPUs a work-item walks whole rows (``OW`` or ``W`` long) of one
plane, on GPUs one element each, with ``RB`` rows (and ``XB`` elements) per work-item grown
until the grid holds about ``MAX_ITEMS`` work-items (never 2^31, whatever the input).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import conv3d
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.ones((1, 1, 3, 3, 3), np.float32))
>>> w = pc.Tensor.from_host(q, np.ones((1, 1, 2, 2, 2), np.float32))
>>> conv3d.conv3d_forward(x, w).to_host().ravel()
array([8., 8., 8., 8., 8., 8., 8., 8.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..runtime import on_gpu
from ..tensor import Tensor
from . import elementwise as ew
from ._cache import get_kernel, gpu_group, round_up
from .strided import parse_key, read_view
from .conv import GPU_GROUP, _chunks, _matmul, add_weight_grad, swap01, weight_layout

__all__ = ["col2vol", "conv3d_backward", "conv3d_forward", "conv_transpose3d_backward",
           "conv_transpose3d_forward", "vol2col"]

SOURCE = r"""//CL//
// KD, KH, KW (window), SD, SH, SW (stride), PD, PH, PW (padding), DD, DH, DW (dilation) are
// compile-time constants: tap loops of constant trip count, borders as masks.

// cols[k][(n*OD + oz)*OH*OW + oy*OW + ox] = x[n][c][oz*SD - PD + kz*DD][oy*SH - PH + ky*DH]
// [ox*SW - PW + kx*DW] (0 outside), k = ((c*KD + kz)*KH + ky)*KW + kx. Work-item (XB outputs
// of a row, RB rows (n*OD + oz)*OH + oy, tap k).
__kernel void vol2col(__global const float* restrict x, const long x_off,
                      __global float* restrict cols, const int nb, const int C, const int D,
                      const int H, const int W, const int OD, const int OH, const int OW,
                      const int XB, const int RB)
{
    const int ox0 = get_global_id(0) * XB, row0 = get_global_id(1) * RB;
    const int k = get_global_id(2);
    const int rows = nb * OD * OH;
    if (ox0 >= OW || row0 >= rows)
        return;
    const int ox1 = min(OW, ox0 + XB), row1 = min(rows, row0 + RB);
    const int c = k / (KD * KH * KW);
    int t = k - c * (KD * KH * KW);
    const int kz = t / (KH * KW);
    t -= kz * (KH * KW);
    const int ky = t / KW, kx = t - ky * KW;
    for (int row = row0; row < row1; ++row) {
        const int oy = row % OH, zr = row / OH;
        const int oz = zr % OD, n = zr / OD;
        global float* dst = cols + ((long)k * rows + row) * OW;
        const int z = oz * SD - PD + kz * DD, y = oy * SH - PH + ky * DH;
        const bool zyin = z >= 0 && z < D && y >= 0 && y < H;
        const global float* src = x + x_off
            + (((long)(n * C + c) * D + (zyin ? z : 0)) * H + (zyin ? y : 0)) * W;
        for (int ox = ox0; ox < ox1; ++ox) {
            const int xx = ox * SW - PW + kx * DW;
            const bool in = zyin && xx >= 0 && xx < W;
            dst[ox] = in ? src[in ? xx : 0] : 0.0f;
        }
    }
}

// gx[n][c][z][y][x] = the sum over the taps (kz, ky, kx), in that order, that read voxel
// (z, y, x) of dcols[(c, kz, ky, kx)][(n, oz, oy, ox)]: a gather, so no two work-items write
// one element and the order is fixed. Work-item (XB voxels of a row, RB rows
// ((n*C + c)*D + z)*H + y).
__kernel void col2vol(__global const float* restrict dcols, __global float* restrict gx,
                      const long gx_off, const int nb, const int C, const int D, const int H,
                      const int W, const int OD, const int OH, const int OW, const int XB,
                      const int RB)
{
    const int x0 = get_global_id(0) * XB, row0 = get_global_id(1) * RB;
    const int rows = nb * C * D * H;
    if (x0 >= W || row0 >= rows)
        return;
    const int x1 = min(W, x0 + XB), row1 = min(rows, row0 + RB);
    const long P = (long)OD * OH * OW, M = (long)nb * P;
    for (int row = row0; row < row1; ++row) {
        const int y = row % H, r = row / H;
        const int z = r % D, nc = r / D;
        const int c = nc % C, n = nc / C;
        const global float* base = dcols + (long)c * (KD * KH * KW) * M + (long)n * P;
        global float* dst = gx + gx_off + (long)row * W;
        for (int xx = x0; xx < x1; ++xx) {
            float acc = 0.0f;
            #pragma unroll
            for (int kz = 0; kz < KD; ++kz) {
                const int tz = z + PD - kz * DD, oz = tz / SD;
                const bool inz = tz >= 0 && tz % SD == 0 && oz < OD;
                #pragma unroll
                for (int ky = 0; ky < KH; ++ky) {
                    const int ty = y + PH - ky * DH, oy = ty / SH;
                    const bool iny = inz && ty >= 0 && ty % SH == 0 && oy < OH;
                    #pragma unroll
                    for (int kx = 0; kx < KW; ++kx) {
                        const int tx = xx + PW - kx * DW, ox = tx / SW;
                        const bool in = iny && tx >= 0 && tx % SW == 0 && ox < OW;
                        const long at = ((kz * KH + ky) * KW + kx) * M
                            + ((long)oz * OH + oy) * OW + ox;
                        acc += in ? base[in ? at : 0] : 0.0f;
                    }
                }
            }
            dst[xx] = acc;
        }
    }
}
"""

# GPU grids aim at MAX_ITEMS work-items; rounding to whole work-groups adds at most as many
# again plus GPU_GROUP per tap, so a grid stays under 2^31 for up to 8M taps (C*kd*kh*kw)
MAX_ITEMS = 1 << 29


def _options(geo: tuple) -> tuple[str, ...]:
    """The build options of the window ``geo`` = (kernel, stride, padding, dilation)."""
    names = ("KD", "KH", "KW", "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")
    values = [v for triple in geo for v in triple]
    return tuple(f"-D{n}={v}" for n, v in zip(names, values))


def _grid(queue, run: int, rows: int, block: int, depth: int = 1, group: int = GPU_GROUP):
    """(global, local, XB, RB) for ``rows`` x ``depth`` rows of ``run`` elements: on CPUs one
    work-item per ``block`` whole rows, on GPUs one per element (``RB`` rows, and for rows of
    millions ``XB`` elements, each once the grid would pass ``MAX_ITEMS``) in groups of
    ``group`` work-items (what the device allows the kernel: ``gpu_group``)."""
    if on_gpu(queue):
        lx = min(32, group, 1 << max(run - 1, 0).bit_length())
        ly = max(1, group // lx)
        # XB > 1 only where one band of ly rows alone would pass MAX_ITEMS (rows of millions)
        xb = max(1, -(-run * ly * depth // MAX_ITEMS))
        gx = round_up(-(-run // xb), lx)
        rb = max(1, -(-gx * round_up(rows, ly) * depth // MAX_ITEMS))
        return (gx, round_up(-(-rows // rb), ly), depth), (lx, ly, 1), xb, rb
    items = -(-rows // block)
    return (1, round_up(items, 16), depth), (1, 16, 1), run, block


def _i32(*vals) -> list[np.int32]:
    return [np.int32(v) for v in vals]


def vol2col(x: Tensor, n0: int, nb: int, geo: tuple, out: tuple) -> Tensor:
    """The ``(C*kd*kh*kw, nb*OD*OH*OW)`` tap matrix of volumes n0..n0+nb of ``x``."""
    _, c, d, h, w = x.shape
    od, oh, ow = out
    k = c * int(np.prod(geo[0]))
    cols = Tensor.empty(x.queue, (k, nb * od * oh * ow))
    options = _options(geo)
    g, loc, xb, rb = _grid(x.queue, ow, nb * od * oh, oh, k,
                           group=gpu_group(x.queue, SOURCE, "vol2col", GPU_GROUP, options))
    get_kernel(x.queue, SOURCE, "vol2col", options)(
        x.queue, g, loc, x.data, np.int64(n0 * c * d * h * w), cols.data,
        *_i32(nb, c, d, h, w, od, oh, ow, xb, rb))
    return cols


def col2vol(dcols: Tensor, gx: Tensor, n0: int, nb: int, geo: tuple, out: tuple) -> None:
    """Fold ``dcols`` into volumes n0..n0+nb of ``gx`` (overwrites them)."""
    _, c, d, h, w = gx.shape
    od, oh, ow = out
    options = _options(geo)
    g, loc, xb, rb = _grid(gx.queue, w, nb * c * d * h, h,
                           group=gpu_group(gx.queue, SOURCE, "col2vol", GPU_GROUP, options))
    get_kernel(gx.queue, SOURCE, "col2vol", options)(
        gx.queue, g, loc, dcols.data, gx.data, np.int64(n0 * c * d * h * w),
        *_i32(nb, c, d, h, w, od, oh, ow, xb, rb))


def _out(x_shape, geo) -> tuple[int, int, int]:
    k, s, p, d = geo
    return tuple((n + 2 * pp - dd * (kk - 1) - 1) // ss + 1
                 for n, kk, ss, pp, dd in zip(x_shape[2:], k, s, p, d))


def conv3d_forward(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=(1, 1, 1),
                   padding=(0, 0, 0), dilation=(1, 1, 1), groups: int = 1) -> Tensor:
    """``(N, C, D, H, W)`` cross-correlation with ``weight`` ``(cout, cin/groups, kd, kh,
    kw)``; stride, padding and dilation triples, checked by the caller (``tp.conv3d``)."""
    n, c = x.shape[:2]
    cout = weight.shape[0]
    geo = (tuple(weight.shape[2:]), tuple(stride), tuple(padding), tuple(dilation))
    od, oh, ow = out = _out(x.shape, geo)
    p, k = od * oh * ow, c * int(np.prod(geo[0]))
    w2 = weight.reshape(cout, k // groups)
    y = Tensor.empty(x.queue, (n, cout, od, oh, ow))
    for n0, nb in _chunks(n, p, k):
        cols = vol2col(x, n0, nb, geo, out)
        prod = _matmul(w2, cols, groups)                   # (cout, nb*P)
        swap01(prod, 0, y, n0 * cout * p, cout, nb, p, bias)
        del cols, prod
    return y


def conv3d_backward(x: Tensor, weight: Tensor, grad: Tensor, stride, padding, dilation,
                    groups: int = 1, need_input: bool = True, need_weight: bool = True,
                    need_bias: bool = False):
    """Gradients (input, weight, bias) of ``conv3d_forward`` for ``grad`` ``(N, cout, OD, OH,
    OW)``; None where not asked. Deterministic: grad_weight accumulated over batch chunks in
    order, col2vol a gather, the bias gradient a fixed-order reduction."""
    from .batchnorm import channel_sum
    n, c = x.shape[:2]
    cout = weight.shape[0]
    geo = (tuple(weight.shape[2:]), tuple(stride), tuple(padding), tuple(dilation))
    out = tuple(grad.shape[2:])
    p, k = int(np.prod(out)), c * int(np.prod(geo[0]))
    kg, cg = k // groups, cout // groups
    w2 = weight.reshape(cout, kg)
    gx = Tensor.empty(x.queue, x.shape) if need_input else None
    gw = None
    if need_input or need_weight:
        for n0, nb in _chunks(n, p, k):
            gc = Tensor.empty(x.queue, (cout, nb * p))
            swap01(grad, n0 * cout * p, gc, 0, nb, cout, p)      # (nb, cout, P) -> (cout, nb, P)
            if need_weight:                 # grad_W^T = cols @ G^T, as conv2d's (K, cout)
                cols = vol2col(x, n0, nb, geo, out)
                gw = add_weight_grad(gw, cols, gc, groups)
                del cols
            if need_input:
                col2vol(_matmul(w2, gc, groups, trans_a=True), gx, n0, nb, geo, out)
    gb = channel_sum(grad.reshape(n, cout, p)) if need_bias else None
    gw = weight_layout(gw, weight, groups, kg, cg) if need_weight else None
    return gx, gw, gb


def conv_transpose3d_forward(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding,
                             dilation, groups: int, out_size: tuple) -> Tensor:
    """The transposed convolution of ``(N, cin, D, H, W)`` ``x`` with ``weight`` ``(cin,
    cout/groups, kd, kh, kw)`` into ``(N, cout) + out_size``, + bias: conv3d's input gradient
    run forward (per chunk ``cols = W^T @ x``, then ``col2vol``)."""
    n, cin = x.shape[:2]
    cout = weight.shape[1] * groups
    geo = (tuple(weight.shape[2:]), tuple(stride), tuple(padding), tuple(dilation))
    p_in, k = int(np.prod(x.shape[2:])), cout * int(np.prod(geo[0]))
    w2 = weight.reshape(cin, k // groups)
    y = Tensor.empty(x.queue, (n, cout) + tuple(out_size))
    for n0, nb in _chunks(n, p_in, k):
        xc = Tensor.empty(x.queue, (cin, nb * p_in))
        swap01(x, n0 * cin * p_in, xc, 0, nb, cin, p_in)       # (nb, cin, P) -> (cin, nb, P)
        col2vol(_matmul(w2, xc, groups, trans_a=True), y, n0, nb, geo, tuple(x.shape[2:]))
        del xc
    if bias is not None:
        ew.binary("add", y, bias.reshape(1, cout, 1, 1, 1), out=y)
    return y


def conv_transpose3d_backward(x: Tensor | None, weight: Tensor, grad: Tensor, stride, padding,
                              dilation, groups: int = 1, need_input: bool = True,
                              need_weight: bool = True, need_bias: bool = False,
                              in_size: tuple | None = None):
    """Gradients (input, weight, bias) of ``conv_transpose3d_forward``: conv3d of ``grad``
    with the same weight, and conv3d's weight gradient with input ``grad`` and upstream
    gradient ``x`` (only read for it). ``in_size`` is ``x``'s ``(D, H, W)``."""
    from .batchnorm import channel_sum
    window = (stride, padding, dilation, groups)
    gx = conv3d_forward(grad, weight, None, *window) if need_input else None
    if gx is not None and in_size is not None and tuple(gx.shape[2:]) != tuple(in_size):
        # an output_padding of a stride or more (allowed below the dilation) gives conv3d
        # of grad more positions than x has; the first ones are x's
        key = (slice(None), slice(None)) + tuple(slice(0, m) for m in in_size)
        gx = read_view(gx, parse_key("conv_transpose3d", gx.shape, key))   # not a user's copy
    gw = conv3d_backward(grad, weight, x, *window, need_input=False)[1] if need_weight else None
    n, c = grad.shape[:2]
    gb = channel_sum(grad.reshape(n, c, int(np.prod(grad.shape[2:])))) if need_bias else None
    return gx, gw, gb
