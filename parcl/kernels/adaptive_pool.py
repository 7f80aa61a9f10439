"""Adaptive average pooling over NCHW tensors, PyTorch's bins ``[floor(o*I/O), ceil((o+1)*I/O))``
(any sizes; bins overlap when ``I % O != 0``). The backward is a gather: each input sums, in a
fixed order, its bins' gradients divided by their sizes (no atomics, bit-reproducible). Also
``window_argmax``, each adaptive max pool window's pick by PyTorch's rule, and
``window_positions``, the input position of each pick (the indices ``return_indices=True``
gives).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import adaptive_pool
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
>>> adaptive_pool.adaptive_avg_pool2d_forward(x, 1).to_host().ravel()
array([7.5], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor
from ._cache import get_kernel, gpu_group, group_size, round_up
from .conv import GPU_GROUP, _runs, pair

# Work-item (column block, row): XB consecutive columns of one output (forward) or input
# (backward) row, row = plane * height + y. XB is the whole row on CPUs, 1 on GPUs.
ROW_SETUP = r"""
#define ROW_SETUP(WIDTH, HEIGHT) \
    const int c0 = get_global_id(0) * XB, row = get_global_id(1); \
    if (c0 >= WIDTH || row >= rows) \
        return; \
    const int c1 = min(WIDTH, c0 + XB); \
    const int r = row % HEIGHT; \
    const long plane = row / HEIGHT;
"""

SOURCE = "//CL//" + ROW_SETUP + r"""

// Adaptive average pool, PyTorch's bins: [floor(o*I/O), ceil((o+1)*I/O)).
inline int bin_start(int o, int I, int O) { return (o * I) / O; }
inline int bin_end(int o, int I, int O) { return ((o + 1) * I + O - 1) / O; }

__kernel void adaptive_avg_fwd(__global const float* restrict x, __global float* restrict y,
                               const int H, const int W, const int OH, const int OW,
                               const int rows, const int XB)
{
    ROW_SETUP(OW, OH)
    const global float* xp = x + plane * H * W;
    const int ys = bin_start(r, H, OH), ye = bin_end(r, H, OH);
    for (int ox = c0; ox < c1; ++ox) {
        const int xs = bin_start(ox, W, OW), xe = bin_end(ox, W, OW);
        float acc = 0.0f;
        for (int yy = ys; yy < ye; ++yy)
            for (int xx = xs; xx < xe; ++xx)
                acc += xp[yy * W + xx];
        y[(long)row * OW + ox] = acc / (float)((ye - ys) * (xe - xs));
    }
}

__kernel void adaptive_avg_bwd(__global const float* restrict g, __global float* restrict gx,
                               const int H, const int W, const int OH, const int OW,
                               const int rows, const int XB)
{
    ROW_SETUP(W, H)
    const long base = plane * OH * OW;
    // Bins containing r: o from floor(r*OH/H) to ceil((r+1)*OH/H) - 1 (checked below).
    const int oy0 = (r * OH) / H, oy1 = min(((r + 1) * OH + H - 1) / H - 1, OH - 1);
    for (int xx = c0; xx < c1; ++xx) {
        const int ox0 = (xx * OW) / W, ox1 = min(((xx + 1) * OW + W - 1) / W - 1, OW - 1);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; ++oy) {
            const int ys = bin_start(oy, H, OH), ye = bin_end(oy, H, OH);
            if (r < ys || r >= ye)
                continue;
            for (int ox = ox0; ox <= ox1; ++ox) {
                const int xs = bin_start(ox, W, OW), xe = bin_end(ox, W, OW);
                if (xx < xs || xx >= xe)
                    continue;
                acc += g[base + oy * OW + ox] / (float)((ye - ys) * (xe - xs));
            }
        }
        gx[(long)row * W + xx] = acc;
    }
}

// Global pooling's backward (one bin per plane): every input gets its plane's gradient over
// the bin's size, the very expression adaptive_avg_bwd computes for it, without the per-
// element search for the bins that contain it (the whole backward was ~10x an elementwise
// pass).
__kernel void global_avg_bwd(__global const float* restrict g, __global float* restrict gx,
                             const int HW, const long n)
{
    const long i = get_global_id(0);
    if (i < n)
        gx[i] = 0.0f + g[i / HW] / (float)HW;
}
"""


def launch_rows(queue, source: str, name: str, run: int, rows: int, *args,
                options=()) -> None:
    """A pooling kernel of ``source``: one work-item per row of ``run`` outputs (CPU) or per
    output (GPU); ``options`` build the program (``PoolWindow.options`` for window kernels)."""
    g, loc, xb = _runs(queue, run, rows, group=gpu_group(queue, source, name, GPU_GROUP,
                                                         options))
    get_kernel(queue, source, name, options)(queue, g[:2], loc[:2], *args, np.int32(rows),
                                             np.int32(xb))


def _launch(queue, name: str, run: int, rows: int, *args) -> None:
    launch_rows(queue, SOURCE, name, run, rows, *args)


def i32(*v):
    return [np.int32(a) for a in v]


def rows_of(shape) -> int:
    """Rows (plane * height) of an NCHW shape."""
    return shape[0] * shape[1] * shape[2]


def adaptive_size(op: str, x_shape, output_size) -> tuple[int, int]:
    if len(x_shape) != 4:
        raise ShapeError(f"{op}: input must be 4-D (N, C, H, W), got shape {tuple(x_shape)}")
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        # None keeps the input's size along that dim, as PyTorch's (and adaptive_max_pool2d)
        output_size = [n if s is None else s for s, n in zip(output_size, x_shape[2:])]
    oh, ow = pair(op, "output_size", output_size)
    if oh < 1 or ow < 1:
        raise ShapeError(f"{op}: output_size must be >= 1, got {(oh, ow)}")
    return oh, ow


def adaptive_avg_pool2d_forward(x: Tensor, output_size) -> Tensor:
    """Adaptive average pool with PyTorch's bins [floor(o*I/O), ceil((o+1)*I/O))."""
    if x.dtype != FLOAT:
        raise DTypeError(f"adaptive_avg_pool2d: input has dtype {x.dtype} (shape {x.shape}), "
                         "expected float32")
    oh, ow = adaptive_size("adaptive_avg_pool2d", x.shape, output_size)
    y = Tensor.empty(x.queue, (*x.shape[:2], oh, ow))
    _launch(x.queue, "adaptive_avg_fwd", ow, rows_of(y.shape), x.data, y.data,
            *i32(x.shape[2], x.shape[3], oh, ow))
    return y


def adaptive_avg_pool2d_backward(grad: Tensor, x_shape) -> Tensor:
    oh, ow = grad.shape[2:]
    gx = Tensor.empty(grad.queue, tuple(x_shape))
    if oh == ow == 1:                     # global average pooling (ResNet, MobileNet)
        hw, n = x_shape[2] * x_shape[3], gx.size
        group = group_size(grad.queue, SOURCE, "global_avg_bwd", 256)
        get_kernel(grad.queue, SOURCE, "global_avg_bwd")(
            grad.queue, (-(-n // group) * group,), (group,), grad.data, gx.data, np.int32(hw),
            np.int64(n))
        return gx
    _launch(grad.queue, "adaptive_avg_bwd", x_shape[3], rows_of(x_shape), grad.data, gx.data,
            *i32(x_shape[2], x_shape[3], oh, ow))
    return gx


POSITIONS_SOURCE = r"""//CL//
// out[i] = table[(i % plane) * k + pick[i]]: the input position of output i's pick (its
// window's element pick[i], of type PICK), for every plane of windows.
__kernel void window_positions(__global const PICK* restrict pick,
                               __global const long* restrict table, __global long* restrict out,
                               const int plane, const int k, const long n)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    out[i] = table[(i % plane) * k + (long)pick[i]];
}

// pick[r] = the element of window r (a row of k in x) that PyTorch's max pools take: each
// element replaces the pick where it is larger or NaN (their `val > maxval || isnan(val)`),
// so the first of tied maxima, but the last of several NaNs.
__kernel void window_argmax(__global long* restrict pick, __global const float* restrict x,
                            const int rows, const int k)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    __global const float* w = x + (long)r * k;
    float best = -INFINITY;
    int arg = 0;
    for (int j = 0; j < k; ++j) {
        const float v = w[j];
        if (v > best || isnan(v)) {
            best = v;
            arg = j;
        }
    }
    pick[r] = arg;
}
"""

def window_argmax(windows: Tensor) -> Tensor:
    """Each window's pick (int64, ``windows``' shape less its last dim) over the last dim of
    a contiguous float32 ``windows``, by PyTorch's max pool rule: the first largest element,
    or the last NaN where there are NaNs (``torch.argmax`` takes the first NaN)."""
    k = windows.shape[-1]
    rows = windows.size // k
    pick = Tensor.empty(windows.queue, windows.shape[:-1], np.int64)
    get_kernel(windows.queue, POSITIONS_SOURCE, "window_argmax", ("-DPICK=long",))(
        windows.queue, (round_up(max(rows, 1), 64),), (64,), pick.data, windows.data,
        np.int32(rows), np.int32(k))
    return pick


PICK_TYPES = {np.dtype(np.uint8): "uchar", np.dtype(np.int32): "int", np.dtype(np.int64): "long"}


def window_positions(pick: Tensor, table: np.ndarray) -> Tensor:
    """``table[o, pick[..., o]]`` for every output ``o`` of a plane, as an int64 tensor shaped
    like ``pick``: ``table`` ``(outputs per plane, window)`` holds each window element's input
    position, ``pick`` (uint8, int32 or int64; last dims the plane's outputs) each window's
    chosen element."""
    plane, k = table.shape
    if pick.dtype not in PICK_TYPES or pick.size % plane:
        raise ShapeError(f"window_positions: pick {pick.shape} {pick.dtype} does not hold "
                         f"uint8, int32 or int64 planes of {plane} outputs")
    positions = Tensor.from_host(pick.queue, np.ascontiguousarray(table, np.int64))
    out = Tensor.empty(pick.queue, pick.shape, np.int64)
    options = (f"-DPICK={PICK_TYPES[pick.dtype]}",)
    get_kernel(pick.queue, POSITIONS_SOURCE, "window_positions", options)(
        pick.queue, (round_up(max(pick.size, 1), 64),), (64,), pick.data, positions.data,
        out.data, np.int32(plane), np.int32(k), np.int64(pick.size))
    return out
