"""Scan and pick kernels: ``cumsum`` and ``cumprod`` along one axis (and ``cumprod``'s
gradient), and the two halves of an arg-reduction's
gradient path: ``take_rows`` (each row's element at a given index) and ``put_rows`` (a zero
tensor with one value per row at a given index, the backward of ``max``/``min``).

``cumsum`` views a contiguous tensor as ``(outer, R, inner)``; one work-item per
``(outer, inner)`` line adds along ``R`` in order (forwards, or backwards for the gradient),
in blocks of 256 (``line_sums``: 20 ulps off over 1e6 terms, where a running sum drifted by
450), so every partial sum is the same bit for bit on every run; ``cumprod`` multiplies in
order.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import scan
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([[1.0, 2.0, 3.0]], np.float32))
>>> scan.cumsum(x, 1).to_host()
array([[1., 3., 6.]], dtype=float32)
"""

from __future__ import annotations

from math import prod

import numpy as np

from ..errors import ShapeError
from ..tensor import Tensor
from ._cache import get_kernel, round_up
from .elementwise import check_float
from .line_sums import BLOCK_SUM

SOURCE = "//CL//" + BLOCK_SUM + r"""
/* x viewed as (outer, R, inner): out[o, r, j] = sum of x[o, 0..r, j] (reverse: r..R-1). */
__kernel void cumsum(__global float *out, __global const float *x, const int lines,
                     const int R, const int inner, const int reverse)
{
    const int g = get_global_id(0);
    if (g >= lines) return;
    const int j = g % inner, o = g / inner;
    const long base = (long)o * R * inner + j;
    // In blocks of SUM_BLOCK (line_sums): a block's running sum starts from the sum of the
    // blocks before it, which adds up their own sums (each block's terms summed apart too)
    // compensated, so a running sum drifts over one block, not the line. (Each output as that
    // sum plus the block's so far, an add more on its way to memory, was 20% slower. Unlike
    // BLOCK_SUM's, a loop that stores every partial sum runs as fast bounded by
    // min(R, start + SUM_BLOCK) as in full blocks then a tail: CPU time within 2% for 1M and
    // for (4096, 1024) along either axis, so it stays one loop.)
    float2 before = (float2)(0.0f, 0.0f);
    for (int start = 0; start < R; start += SUM_BLOCK) {
        float acc = sum_total(before), block = 0.0f;
        for (int k = start; k < min(R, start + SUM_BLOCK); ++k) {
            const int r = reverse ? R - 1 - k : k;
            const long at = base + (long)r * inner;
            const float v = x[at];
            acc += v;
            block += v;
            out[at] = acc;
        }
        before = sum_step(before, block);
    }
}

/* x viewed as (outer, R, inner): out[o, r, j] = product of x[o, 0..r, j]. */
__kernel void cumprod(__global float *out, __global const float *x, const int lines,
                      const int R, const int inner)
{
    const int g = get_global_id(0);
    if (g >= lines) return;
    const long base = (long)(g / inner) * R * inner + g % inner;
    float acc = 1.0f;
    for (int r = 0; r < R; ++r) {
        const long at = base + (long)r * inner;
        acc *= x[at];
        out[at] = acc;
    }
}

/* The gradient of out = cumprod(x) for upstream g, per line, as PyTorch's cumprod_backward:
   before the first zero z, (sum over j >= k of g_j out_j) / x_k (out_j is 0 from z on); at z,
   the product of x before z times sum over j >= z of g_j prod(x_{z+1..j}); after z, 0 (each
   out_j there also holds the zero at z). */
__kernel void cumprod_backward(__global float *gx, __global const float *x,
                               __global const float *out, __global const float *g,
                               const int lines, const int R, const int inner)
{
    const int t = get_global_id(0);
    if (t >= lines) return;
    const long base = (long)(t / inner) * R * inner + t % inner;
    int z = R;
    for (int r = 0; r < R; ++r) {
        if (x[base + (long)r * inner] == 0.0f) { z = r; break; }
    }
    float acc = 0.0f;
    for (int r = z - 1; r >= 0; --r) {
        const long at = base + (long)r * inner;
        acc += g[at] * out[at];
        gx[at] = acc / x[at];
    }
    if (z == R) return;
    float run = (z > 0) ? out[base + (long)(z - 1) * inner] : 1.0f;
    float sum = g[base + (long)z * inner] * run;
    for (int r = z + 1; r < R; ++r) {
        const long at = base + (long)r * inner;
        run *= x[at];
        sum += g[at] * run;
        gx[at] = 0.0f;
    }
    gx[base + (long)z * inner] = sum;
}

/* out[o] = x[o, idx[o]] for x (rows, R). */
__kernel void take_rows(__global float *out, __global const float *x,
                        __global const long *idx, const int rows, const int R)
{
    const int o = get_global_id(0);
    if (o < rows) out[o] = x[(long)o * R + idx[o]];
}

/* out (rows, R) = g[o] at column idx[o] of each row, 0 elsewhere. */
__kernel void put_rows(__global float *out, __global const float *g,
                       __global const long *idx, const int rows, const int R)
{
    const int r = get_global_id(0), o = get_global_id(1);
    if (r < R && o < rows) out[(long)o * R + r] = (r == idx[o]) ? g[o] : 0.0f;
}
"""


def _lines(op: str, x: Tensor, axis: int) -> tuple[int, int, int]:
    """``x`` as ``(outer, R, inner)`` lines along ``axis``: (lines, R, inner)."""
    check_float(op, x)
    if x.ndim == 0:
        raise ShapeError(f"{op}: a 0-d tensor has no axis")
    ax = int(axis)
    if not -x.ndim <= ax < x.ndim:
        raise ShapeError(f"{op}: axis {ax} is out of range for a {x.ndim}-D tensor "
                         f"(shape {x.shape})")
    ax %= x.ndim
    R, inner = x.shape[ax], prod(x.shape[ax + 1:])
    return prod(x.shape[:ax]) * inner, R, inner


def cumsum(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    """Inclusive cumulative sum along ``axis`` (negative axes count from the end);
    ``reverse=True`` sums from the end of the axis (the gradient of ``cumsum``)."""
    lines, R, inner = _lines("cumsum", x, axis)
    out = Tensor.empty(x.queue, x.shape)
    get_kernel(x.queue, SOURCE, "cumsum")(x.queue, (round_up(lines, 64),), (64,), out.data,
                                          x.data, np.int32(lines), np.int32(R),
                                          np.int32(inner), np.int32(1 if reverse else 0))
    return out


def cumprod(x: Tensor, axis: int) -> Tensor:
    """Inclusive cumulative product along ``axis``, multiplied in order."""
    lines, R, inner = _lines("cumprod", x, axis)
    out = Tensor.empty(x.queue, x.shape)
    get_kernel(x.queue, SOURCE, "cumprod")(x.queue, (round_up(lines, 64),), (64,), out.data,
                                           x.data, np.int32(lines), np.int32(R),
                                           np.int32(inner))
    return out


def cumprod_backward(x: Tensor, out: Tensor, g: Tensor, axis: int) -> Tensor:
    """The gradient of ``out = cumprod(x, axis)`` for the upstream ``g``: right where ``x``
    holds zeros (no ``0 / 0``), one work-item per line, so the same bits on every run."""
    lines, R, inner = _lines("cumprod", x, axis)
    gx = Tensor.empty(x.queue, x.shape)
    get_kernel(x.queue, SOURCE, "cumprod_backward")(
        x.queue, (round_up(lines, 64),), (64,), gx.data, x.data, out.data, g.data,
        np.int32(lines), np.int32(R), np.int32(inner))
    return gx


def take_rows(x: Tensor, idx: Tensor) -> Tensor:
    """``x`` (rows, R), ``idx`` int64 (rows,): each row's element at its index, (rows,)."""
    rows, R = x.shape
    out = Tensor.empty(x.queue, (rows,))
    get_kernel(x.queue, SOURCE, "take_rows")(x.queue, (round_up(rows, 64),), (64,), out.data,
                                             x.data, idx.data, np.int32(rows), np.int32(R))
    return out


def put_rows(g: Tensor, idx: Tensor, R: int) -> Tensor:
    """A new (rows, R) tensor: ``g[o]`` at column ``idx[o]`` of row ``o``, zero elsewhere."""
    rows = g.size
    out = Tensor.empty(g.queue, (rows, R))
    lx = min(64, 1 << max(R - 1, 0).bit_length())
    ly = max(1, 64 // lx)
    get_kernel(g.queue, SOURCE, "put_rows")(g.queue, (round_up(R, lx), round_up(rows, ly)),
                                            (lx, ly), out.data, g.data, idx.data,
                                            np.int32(rows), np.int32(R))
    return out
