"""Layout kernels: ``transpose`` (any permutation of up to 6 collapsed dimensions, numpy
semantics; more go through the strided copy) with a tiled path for (batched) 2-D transposes.

Dimensions that stay neighbours in the same order are merged first, so NCHW -> NHWC is the
batched 2-D transpose (N, C, HW) -> (N, HW, C) and takes the tiled kernel.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import layout
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3))
>>> layout.transpose(x).to_host().shape
(3, 2)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..runtime import on_gpu
from ..tensor import SUPPORTED, Tensor
from ._cache import get_kernel, kernel_limits
from .broadcast import int8_vector
from .strided import View, axis_int, read_view

TILE = 16

SOURCE = r"""//CL//
#define TILE 16

/* Kernels move 32-bit words (float32 or int32) unchanged.
   out is contiguous: n runs of `run` contiguous elements each; run i starts in x at the offset
   of index i in the collapsed dims d (outermost s0) with strides sx. run = 1 on a GPU (adjacent
   work-items then touch adjacent words); on a CPU one work-item copies a whole run. */
__kernel void permute_nd(__global uint *out, __global const uint *x, const int n,
                         const int run, const int nd, const int8 d, const int8 sx)
{
    int i = get_global_id(0);
    if (i >= n) return;
    int r = i, q, o = 0;
    switch (nd) {
    case 6: q = r % d.s5; r /= d.s5; o += q * sx.s5;
    case 5: q = r % d.s4; r /= d.s4; o += q * sx.s4;
    case 4: q = r % d.s3; r /= d.s3; o += q * sx.s3;
    case 3: q = r % d.s2; r /= d.s2; o += q * sx.s2;
    case 2: q = r % d.s1; r /= d.s1; o += q * sx.s1;
    default: o += r * sx.s0;
    }
    __global uint *dst = out + (long)i * run;
    __global const uint *src = x + o;
    for (int j = 0; j < run; ++j) dst[j] = src[j];
}

/* x: (batch, rows, cols) -> out: (batch, cols, rows), through a TILE x TILE local tile so both
   the reads and the writes walk memory contiguously. Global size: (cols, rows, batch) rounded
   up to TILE in the first two. */
__kernel void transpose_tiled(__global uint *out, __global const uint *x, const int rows,
                              const int cols)
{
    __local uint tile[TILE][TILE + 1];
    int b = get_global_id(2);
    int tx = get_local_id(0), ty = get_local_id(1);
    /* the group's first row from its global id, which counts a split launch's offset */
    int c0 = get_group_id(0) * TILE, r0 = get_global_id(1) - ty;
    long base = (long)b * rows * cols;
    int r = r0 + ty, c = c0 + tx;
    if (r < rows && c < cols) tile[ty][tx] = x[base + (long)r * cols + c];
    barrier(CLK_LOCAL_MEM_FENCE);
    int orow = c0 + ty, ocol = r0 + tx;          /* out is (cols, rows) */
    if (orow < cols && ocol < rows) out[base + (long)orow * rows + ocol] = tile[tx][ty];
}

/* The same for a CPU: one work-item per output row segment, plain loops (no local memory). */
__kernel void transpose_rows(__global uint *out, __global const uint *x, const int rows,
                             const int cols)
{
    int c = get_global_id(0), b = get_global_id(1);
    if (c >= cols) return;
    long base = (long)b * rows * cols;
    __global uint *o = out + base + (long)c * rows;
    __global const uint *src = x + base + c;
    for (int r = 0; r < rows; ++r) o[r] = src[(long)r * cols];
}
"""


def normalize_axes(axes, ndim: int, shape) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    if isinstance(axes, (int, np.integer)):
        axes = (axes,)
    axes = tuple(axis_int("transpose", a, tuple(shape)) for a in axes)
    if len(axes) != ndim:
        raise ShapeError(f"transpose: axes {axes} do not match a {ndim}-D tensor of shape "
                         f"{tuple(shape)}")
    norm = tuple(a + ndim if a < 0 else a for a in axes)
    if sorted(norm) != list(range(ndim)):
        raise ShapeError(f"transpose: axes {axes} are not a permutation of range({ndim}) "
                         f"(shape {tuple(shape)})")
    return norm


def transpose(x: Tensor, axes=None, *, tiled: bool | None = None) -> Tensor:
    """A new contiguous tensor: ``x`` with its axes permuted (``np.transpose`` semantics;
    ``axes=None`` reverses them). ``tiled`` forces the kernel of (batched) 2-D transposes
    (default: the local-memory tiled kernel on a GPU that allows it its groups, row loops
    otherwise)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"transpose: expected a pc.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED or x.dtype.itemsize != 4:
        raise DTypeError(f"transpose: dtype {x.dtype} is not supported (shape {x.shape}); "
                         "transpose takes float32 or int32")
    perm = normalize_axes(axes, x.ndim, x.shape)
    if perm == tuple(range(x.ndim)):
        return x.copy()
    in_strides = [1] * x.ndim
    for k in range(x.ndim - 2, -1, -1):
        in_strides[k] = in_strides[k + 1] * x.shape[k + 1]
    # Collapse in output order: merge out dims k-1, k when x walks them contiguously too.
    dims: list[int] = []
    strides: list[int] = []
    for a in perm:
        size, st = x.shape[a], in_strides[a]
        if size == 1:
            continue
        if dims and strides[-1] == st * size:
            dims[-1] *= size
            strides[-1] = st
            continue
        dims.append(size)
        strides.append(st)
    if len(dims) <= 1:                          # only size-1 axes moved: same memory order
        return x.copy().reshape(tuple(x.shape[a] for a in perm))
    if len(dims) > 6:
        # beyond permute_nd's int8 vectors: the strided copy takes up to 8 (a sum over
        # interleaved axes of an 8-d tensor, a repeat's backward over (r0, s0, ..., r3, s3))
        return read_view(x, View(tuple(x.shape[a] for a in perm),
                                 tuple(in_strides[a] for a in perm)))
    q = x.queue
    out = Tensor.empty(q, tuple(x.shape[a] for a in perm), x.dtype)
    # Batched 2-D: out (B, C, R) from x (B, R, C): strides (R*C, 1, C) in output order.
    batched_2d = (len(dims) == 2 and strides == [1, dims[0]]) or (
        len(dims) == 3 and strides == [dims[1] * dims[2], 1, dims[1]])
    if batched_2d:
        batch = dims[0] if len(dims) == 3 else 1
        cols, rows = dims[-2], dims[-1]          # x is (batch, rows, cols)
        if tiled is None:      # TILE x TILE groups where the device allows the kernel them
            tiled = on_gpu(q) and kernel_limits(q, SOURCE, "transpose_tiled").work_group >= (
                TILE * TILE)
        if tiled:
            k = get_kernel(q, SOURCE, "transpose_tiled")
            gsize = (_round(cols, TILE), _round(rows, TILE), batch)
            k(q, gsize, (TILE, TILE, 1), out.data, x.data, np.int32(rows), np.int32(cols))
        else:
            k = get_kernel(q, SOURCE, "transpose_rows")
            k(q, (cols, batch), None, out.data, x.data, np.int32(rows), np.int32(cols))
        return out
    run = 1
    if strides[-1] == 1 and dims[-1] >= 8 and not on_gpu(q):
        run = dims.pop()                         # x and out share this contiguous run
        strides.pop()
    n = out.size // run
    k = get_kernel(q, SOURCE, "permute_nd")
    k(q, (_round(n, 64),), (64,), out.data, x.data, np.int32(n), np.int32(run),
      np.int32(len(dims)), int8_vector(dims), int8_vector(strides))
    return out


def _round(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def permuted(x: Tensor, perm: tuple[int, ...]) -> Tensor:
    """``x`` with its dimensions in the order ``perm``: a view when the dimensions of size > 1
    keep their order (the memory order is unchanged), else a contiguous copy."""
    shape = tuple(x.shape[a] for a in perm)
    moved = [a for a in perm if x.shape[a] != 1]
    if moved == sorted(moved):
        return x.reshape(shape)
    if x.itemsize == 4 and x.ndim <= 6:            # the tiled (batched) 2-D path among others
        return transpose(x, perm)
    base = View.contiguous(x.shape)                # int64 and > 6-D: a strided copy
    return read_view(x, View(shape, tuple(base.strides[a] for a in perm)))
