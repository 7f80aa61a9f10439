"""The attention softmax: ``softmax(s * scale + mask)`` over the last axis of the scores
``s = q @ k^T`` in one pass over memory, and its backward ``ds = p * (dp - sum(p * dp)) * scale``.

Scores are ``(batch, Tq, Tk)``. Two variants, chosen by device type: on a CPU one work-item
per row walks it 8 columns at a time in explicit ``float8`` (PoCL then emits vector ``exp``:
measured 9x the scalar per-row loop); on a GPU one work-group per row, its work-items strided
over the columns, with fixed-tree reductions in local memory. The mask is optional and read in place
through broadcast strides (a ``(Tq, Tk)`` mask is not copied per batch entry): additive
(float32) or boolean (an integer or byte tensor, nonzero = may attend); ``causal`` masks
``j > i`` (PyTorch's top-left aligned ``is_causal``). A row with nothing to attend to (every
score masked to -inf) is all zeros, as PyTorch's ``scaled_dot_product_attention`` gives (its
"safe softmax"), not NaN; a row whose scores are NaN where not -inf is NaN, as PyTorch's.
The unfused composition (scale, add the mask, softmax) is three launches and three passes
over the scores; see ``docs/performance.md`` for the figures.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import attention as ak
>>> q = pc.default_queue()
>>> s = pc.Tensor.from_host(q, np.zeros((1, 2, 2), np.float32))
>>> ak.masked_softmax(s, 1.0, causal=True).to_host()
array([[[1. , 0. ],
        [0.5, 0.5]]], dtype=float32)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyopencl as cl
from pyopencl import cltypes

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor, check_same_queue
from ..runtime import on_gpu
from ._cache import LAUNCH_MAX, VECTOR_TYPES, get_kernel, group_size, round_up
from .elementwise import broadcast_strides, collapse_dims

LOCAL = 64
GPU_GROUP = 64         # work-items per row on a GPU (a power of two: the tree reductions)
VARIANTS = ("rows", "groups")
MASK_DIMS = 4          # batch dims of a mask after merging (int4 of sizes and strides)
# the mask kinds: none, additive float, boolean of an integer type (the value of -DMT)
_MASK_TYPES = {np.dtype(np.float32): (1, "float"), np.dtype(np.int32): (2, "int"),
               np.dtype(np.int64): (2, "long"), np.dtype(np.uint8): (2, "uchar"),
               np.dtype(np.bool_): (2, "uchar")}

SOURCE = VECTOR_TYPES + r"""//CL//
#ifndef MT
#define MT float
#endif
#if MASK == 2
#define MVAL(x) ((x) != 0 ? 0.0f : -INFINITY)
#else
#define MVAL(x) (x)
#endif
#define LOAD8(p) (*(__global const float8u *)(p))
#define STORE8(p, v) (*(__global float8u *)(p) = (v))

/* Offset of batch entry b in the mask: b decomposed over md (outermost s0) with strides ms. */
inline long mask_offset(int b, const int nd, const int4 md, const int4 ms)
{
    long o = 0;
    int q;
    switch (nd) {
    case 4: q = b % md.s3; b /= md.s3; o += (long)q * ms.s3;
    case 3: q = b % md.s2; b /= md.s2; o += (long)q * ms.s2;
    case 2: q = b % md.s1; b /= md.s1; o += (long)q * ms.s1;
    case 1: o += (long)b * ms.s0;
    default: break;
    }
    return o;
}

inline float8 mask8(__global const MT *m, const long j, const int sc)
{
#if MASK == 1
    if (sc == 1) return LOAD8(m + j);
#endif
    return (float8)(MVAL(m[j * sc]), MVAL(m[(j + 1) * sc]), MVAL(m[(j + 2) * sc]),
                    MVAL(m[(j + 3) * sc]), MVAL(m[(j + 4) * sc]), MVAL(m[(j + 5) * sc]),
                    MVAL(m[(j + 6) * sc]), MVAL(m[(j + 7) * sc]));
}

inline float hmax8(const float8 v)
{
    const float4 a = fmax(v.lo, v.hi);
    const float2 b = fmax(a.lo, a.hi);
    return fmax(b.lo, b.hi);
}

inline float hsum8(const float8 v)
{
    const float4 a = v.lo + v.hi;
    const float2 b = a.lo + a.hi;
    return b.lo + b.hi;
}

#define ROW_SETUP                                                                      \
    const int b = r / Tq, i = r - b * Tq;                                              \
    const long base = (long)r * Tk;                                                    \
    const int end = causal ? min(Tk, i + 1) : Tk;                                      \
    __global const float *sr = s + base;                                               \
    __global float *pr = p + base;

#if MASK
#define MASK_ROW __global const MT *mrow = mask + mask_offset(b, nd, md, ms) + (long)i * msr;
#define ADD_MASK8(v, j) v += mask8(mrow, j, msc)
#define ADD_MASK1(v, j) v += MVAL(mrow[(long)(j) * msc])
#else
#define MASK_ROW
#define ADD_MASK8(v, j)
#define ADD_MASK1(v, j)
#endif

/* CPU: p[r, :] = softmax(s[r, :] * scale + mask), one work-item per row r = (batch b, query
   i), the row walked 8 columns at a time (explicit float8: PoCL then emits vector exp, about
   9x the scalar loop), the tail one at a time. MASK 0: none, 1: additive, 2: boolean. */
__kernel void attn_softmax_fwd(__global const float *s, __global float *p, const int rows,
                               const int Tq, const int Tk, const float scale, const int causal,
                               __global const MT *mask, const int nd, const int4 md,
                               const int4 ms, const int msr, const int msc)
{
    const int r = get_global_id(0);
    if (r >= rows) return;
    ROW_SETUP
    MASK_ROW
    const int end8 = end & ~7;
    float8 m8 = (float8)(-INFINITY);
    for (int j = 0; j < end8; j += 8) {
        float8 v = LOAD8(sr + j) * scale;
        ADD_MASK8(v, j);
        STORE8(pr + j, v);
        m8 = fmax(m8, v);
    }
    float m = hmax8(m8);
    for (int j = end8; j < end; ++j) {
        float v = sr[j] * scale;
        ADD_MASK1(v, j);
        pr[j] = v;
        m = fmax(m, v);
    }
    if (m == -INFINITY) {            /* nothing to attend to: zeros, as PyTorch */
        /* unless a score is NaN (fmax passes over NaN): then NaN, as PyTorch's softmax */
        float fill = 0.0f;
        for (int j = 0; j < end; ++j) fill = isnan(pr[j]) ? NAN : fill;
        for (int j = 0; j < end; ++j) pr[j] = fill;
        for (int j = end; j < Tk; ++j) pr[j] = 0.0f;
        return;
    }
    float8 s8 = (float8)(0.0f);
    for (int j = 0; j < end8; j += 8) {
        const float8 e = exp(LOAD8(pr + j) - m);
        STORE8(pr + j, e);
        s8 += e;
    }
    float sum = hsum8(s8);
    for (int j = end8; j < end; ++j) {
        const float e = exp(pr[j] - m);
        pr[j] = e;
        sum += e;
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < end8; j += 8) STORE8(pr + j, LOAD8(pr + j) * inv);
    for (int j = end8; j < end; ++j) pr[j] *= inv;
    for (int j = end; j < Tk; ++j) pr[j] = 0.0f;
}

/* GPU: one work-group per row, its work-items strided over the columns (coalesced), max and
   sum by a fixed tree in local memory. */
__kernel void attn_softmax_fwd_wg(__global const float *s, __global float *p, const int rows,
                                  const int Tq, const int Tk, const float scale,
                                  const int causal, __global const MT *mask, const int nd,
                                  const int4 md, const int4 ms, const int msr, const int msc,
                                  __local float *red)
{
    const int r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    ROW_SETUP
    MASK_ROW
    float m = -INFINITY;
    for (int j = l; j < end; j += L) {
        float v = sr[j] * scale;
        ADD_MASK1(v, j);
        pr[j] = v;
        m = fmax(m, v);
    }
    red[l] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = L / 2; h > 0; h >>= 1) {
        if (l < h) red[l] = fmax(red[l], red[l + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (m == -INFINITY) {            /* the same for every work-item: no divergent barrier */
        float nan_seen = 0.0f;       /* a NaN score (fmax passes over it) makes the row NaN */
        for (int j = l; j < end; j += L) nan_seen = isnan(pr[j]) ? 1.0f : nan_seen;
        red[l] = nan_seen;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int h = L / 2; h > 0; h >>= 1) {
            if (l < h) red[l] = fmax(red[l], red[l + h]);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const float fill = red[0] != 0.0f ? NAN : 0.0f;
        for (int j = l; j < Tk; j += L) pr[j] = j < end ? fill : 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int j = l; j < end; j += L) {
        const float e = exp(pr[j] - m);
        pr[j] = e;
        sum += e;
    }
    red[l] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = L / 2; h > 0; h >>= 1) {
        if (l < h) red[l] += red[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / red[0];
    for (int j = l; j < Tk; j += L) pr[j] = j < end ? pr[j] * inv : 0.0f;
}

/* ds[r, :] = p * (dp - sum(p * dp)) * scale (the softmax backward with the scale folded in):
   CPU, one work-item per row, 8 columns at a time. */
__kernel void attn_softmax_bwd(__global const float *p, __global const float *dp,
                               __global float *ds, const int rows, const int Tk,
                               const float scale)
{
    const int r = get_global_id(0);
    if (r >= rows) return;
    const long base = (long)r * Tk;
    __global const float *pr = p + base, *gr = dp + base;
    __global float *dr = ds + base;
    const int end8 = Tk & ~7;
    float8 d8 = (float8)(0.0f);
    for (int j = 0; j < end8; j += 8) d8 += LOAD8(pr + j) * LOAD8(gr + j);
    float dot = hsum8(d8);
    for (int j = end8; j < Tk; ++j) dot += pr[j] * gr[j];
    for (int j = 0; j < end8; j += 8)
        STORE8(dr + j, LOAD8(pr + j) * (LOAD8(gr + j) - dot) * scale);
    for (int j = end8; j < Tk; ++j) dr[j] = pr[j] * (gr[j] - dot) * scale;
}

/* The same on a GPU: one work-group per row. */
__kernel void attn_softmax_bwd_wg(__global const float *p, __global const float *dp,
                                  __global float *ds, const int rows, const int Tk,
                                  const float scale, __local float *red)
{
    const int r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    const long base = (long)r * Tk;
    float dot = 0.0f;
    for (int j = l; j < Tk; j += L) dot += p[base + j] * dp[base + j];
    red[l] = dot;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = L / 2; h > 0; h >>= 1) {
        if (l < h) red[l] += red[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    dot = red[0];
    for (int j = l; j < Tk; j += L)
        ds[base + j] = p[base + j] * (dp[base + j] - dot) * scale;
}
"""



@dataclass(frozen=True)
class MaskLayout:
    """How the kernel reads a mask of ``shape`` broadcast to ``(*batch, Tq, Tk)``."""

    kind: int                 # 1 additive, 2 boolean
    ctype: str
    dims: tuple[int, ...]     # merged batch dims (outermost first)
    strides: tuple[int, ...]
    row: int                  # element stride along Tq and along Tk
    col: int


def mask_layout(mask: Tensor, batch: tuple[int, ...], tq: int, tk: int) -> MaskLayout:
    """Validate ``mask`` against scores ``(*batch, Tq, Tk)`` and say how to read it."""
    kind = _MASK_TYPES.get(np.dtype(mask.dtype))
    if kind is None:
        raise DTypeError(f"scaled_dot_product_attention: attn_mask has dtype {mask.dtype}; "
                         "expected float32 (additive) or an integer/boolean tensor (nonzero = "
                         "may attend)")
    full = (*batch, tq, tk)
    if len(mask.shape) > len(full) or any(
            m != 1 and m != f for m, f in zip(mask.shape[::-1], full[::-1])):
        raise ShapeError(f"scaled_dot_product_attention: attn_mask of shape {mask.shape} does "
                         f"not broadcast to the attention weights' shape {full}")
    strides = broadcast_strides(mask.shape, full)
    dims, (ms,) = collapse_dims(batch or (1,), strides[:-2] or [0])
    if len(dims) > MASK_DIMS:
        raise ShapeError(f"scaled_dot_product_attention: attn_mask {mask.shape} needs "
                         f"{len(dims)} strided batch dimensions; at most {MASK_DIMS}")
    return MaskLayout(kind[0], kind[1], tuple(dims), tuple(ms), strides[-2], strides[-1])


def _int4(values) -> object:
    return np.array((*values, *[1] * (4 - len(values))), dtype=cltypes.int4)   # no eval


def _variant(queue, variant: str | None, rows: int) -> str:
    """``"rows"`` (a work-item per row, vectorised along it) on CPUs, ``"groups"`` (a
    work-group per row) on GPUs where the launch, ``rows * GPU_GROUP`` work-items, stays
    under ``LAUNCH_MAX`` (short key rows, a few GiB of scores, reach it); tests force one
    with ``variant``."""
    if variant is None:
        return "groups" if on_gpu(queue) and rows * GPU_GROUP < LAUNCH_MAX else "rows"
    if variant not in VARIANTS:
        raise ValueError(f"attention: unknown variant {variant!r}; expected one of {VARIANTS}")
    return variant


def masked_softmax(s: Tensor, scale: float, mask: Tensor | None = None, causal: bool = False,
                   batch: tuple[int, ...] | None = None, *, variant: str | None = None
                   ) -> Tensor:
    """``softmax(s * scale + mask)`` along the last axis of ``s`` ``(B, Tq, Tk)``; ``batch``
    is the unmerged batch shape the mask broadcasts against (default ``(B,)``)."""
    if s.dtype != FLOAT or s.ndim != 3:
        raise ShapeError(f"masked_softmax: expects float32 scores (B, Tq, Tk), got {s.shape} "
                         f"{s.dtype}")
    nb, tq, tk = s.shape
    q = s.queue
    p = Tensor.empty(q, s.shape)
    if mask is None:
        options, margs = ("-DMASK=0",), (None, 0, _int4([]), _int4([]), 0, 0)
    else:
        check_same_queue("scaled_dot_product_attention", s, mask)
        lay = mask_layout(mask, batch if batch is not None else (nb,), tq, tk)
        options = (f"-DMASK={lay.kind}", f"-DMT={lay.ctype}")
        margs = (mask.data, len(lay.dims), _int4(lay.dims), _int4(lay.strides), lay.row,
                 lay.col)
    rows = nb * tq
    args = (s.data, p.data, np.int32(rows), np.int32(tq), np.int32(tk), np.float32(scale),
            np.int32(bool(causal)), margs[0], np.int32(margs[1]), margs[2], margs[3],
            np.int32(margs[4]), np.int32(margs[5]))
    if _variant(q, variant, rows) == "rows":
        k = get_kernel(q, SOURCE, "attn_softmax_fwd", options)
        k(q, (round_up(rows, LOCAL),), (LOCAL,), *args)
    else:
        k = get_kernel(q, SOURCE, "attn_softmax_fwd_wg", options)
        L = group_size(q, SOURCE, "attn_softmax_fwd_wg", GPU_GROUP, options)
        k(q, (rows * L,), (L,), *args, cl.LocalMemory(4 * L))
    return p


def masked_softmax_backward(p: Tensor, dp: Tensor, scale: float, *,
                            variant: str | None = None) -> Tensor:
    """``p * (dp - sum(p * dp, -1)) * scale``: the gradient of the scores ``s``."""
    nb, tq, tk = p.shape
    q = p.queue
    ds = Tensor.empty(q, p.shape)
    rows = nb * tq
    args = (p.data, dp.data, ds.data, np.int32(rows), np.int32(tk), np.float32(scale))
    if _variant(q, variant, rows) == "rows":
        k = get_kernel(q, SOURCE, "attn_softmax_bwd", ("-DMASK=0",))
        k(q, (round_up(rows, LOCAL),), (LOCAL,), *args)
    else:
        k = get_kernel(q, SOURCE, "attn_softmax_bwd_wg", ("-DMASK=0",))
        L = group_size(q, SOURCE, "attn_softmax_bwd_wg", GPU_GROUP, ("-DMASK=0",))
        k(q, (rows * L,), (L,), *args, cl.LocalMemory(4 * L))
    return ds
