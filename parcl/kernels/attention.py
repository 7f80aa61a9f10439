"""The attention softmax: ``softmax(s * scale + mask)`` over the last axis of the scores
``s = q @ k^T`` in one pass over memory, and its backward ``ds = p * (dp - sum(p * dp)) * scale``.

Scores are ``(batch, Tq, Tk)``; one work-item per row. The mask is optional and read in place
through broadcast strides (a ``(Tq, Tk)`` mask is not copied per batch entry): additive
(float32) or boolean (an integer or byte tensor, nonzero = may attend); ``causal`` masks
``j > i`` (PyTorch's top-left aligned ``is_causal``). A row with nothing to attend to is NaN,
as in PyTorch's reference formula. The unfused composition (scale, add the mask, softmax) is
three launches and three passes over the scores; see ``docs/performance.md`` for the figures.

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
from pyopencl import cltypes

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor, check_same_queue
from ._cache import get_kernel, round_up
from .elementwise import broadcast_strides, collapse_dims

LOCAL = 64
MASK_DIMS = 4          # batch dims of a mask after merging (int4 of sizes and strides)
# the mask kinds: none, additive float, boolean of an integer type (the value of -DMT)
_MASK_TYPES = {np.dtype(np.float32): (1, "float"), np.dtype(np.int32): (2, "int"),
               np.dtype(np.int64): (2, "long"), np.dtype(np.uint8): (2, "uchar"),
               np.dtype(np.bool_): (2, "uchar")}

SOURCE = r"""//CL//
#ifndef MT
#define MT float
#endif
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

/* p[r, :] = softmax(s[r, :] * scale + mask) for row r = (batch b, query i). MASK 0: none,
   1: additive, 2: boolean (nonzero = may attend). */
__kernel void attn_softmax_fwd(__global const float *s, __global float *p, const int rows,
                               const int Tq, const int Tk, const float scale, const int causal,
                               __global const MT *mask, const int nd, const int4 md,
                               const int4 ms, const int msr, const int msc)
{
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int b = r / Tq, i = r - b * Tq;
    const long base = (long)r * Tk;
    const int end = causal ? min(Tk, i + 1) : Tk;
#if MASK
    __global const MT *mrow = mask + mask_offset(b, nd, md, ms) + (long)i * msr;
#endif
    float m = -INFINITY;
    for (int j = 0; j < end; ++j) {
        float v = s[base + j] * scale;
#if MASK == 1
        v += mrow[(long)j * msc];
#elif MASK == 2
        if (mrow[(long)j * msc] == 0) v = -INFINITY;
#endif
        p[base + j] = v;
        m = fmax(m, v);
    }
    float sum = 0.0f;
    for (int j = 0; j < end; ++j) {
        const float e = exp(p[base + j] - m);
        p[base + j] = e;
        sum += e;
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < end; ++j) p[base + j] *= inv;
    for (int j = end; j < Tk; ++j) p[base + j] = 0.0f;
}

/* ds[r, :] = p * (dp - sum(p * dp)) * scale (the softmax backward with the scale folded in) */
__kernel void attn_softmax_bwd(__global const float *p, __global const float *dp,
                               __global float *ds, const int rows, const int Tk,
                               const float scale)
{
    const int r = get_global_id(0);
    if (r >= rows) return;
    const long base = (long)r * Tk;
    float dot = 0.0f;
    for (int j = 0; j < Tk; ++j) dot += p[base + j] * dp[base + j];
    for (int j = 0; j < Tk; ++j) ds[base + j] = p[base + j] * (dp[base + j] - dot) * scale;
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
    return cltypes.make_int4(*(list(values) + [1] * (4 - len(values))))


def masked_softmax(s: Tensor, scale: float, mask: Tensor | None = None, causal: bool = False,
                   batch: tuple[int, ...] | None = None) -> Tensor:
    """``softmax(s * scale + mask)`` along the last axis of ``s`` ``(B, Tq, Tk)``; ``batch``
    is the unmerged batch shape the mask broadcasts against (default ``(B,)``)."""
    if s.dtype != FLOAT or s.ndim != 3:
        raise ShapeError(f"masked_softmax: expects float32 scores (B, Tq, Tk), got {s.shape} "
                         f"{s.dtype}")
    nb, tq, tk = s.shape
    q = s.queue
    p = Tensor.empty(q, s.shape)
    if mask is None:
        options, args = ("-DMASK=0",), (None, 0, _int4([]), _int4([]), 0, 0)
    else:
        check_same_queue("scaled_dot_product_attention", s, mask)
        lay = mask_layout(mask, batch if batch is not None else (nb,), tq, tk)
        options = (f"-DMASK={lay.kind}", f"-DMT={lay.ctype}")
        args = (mask.data, len(lay.dims), _int4(lay.dims), _int4(lay.strides), lay.row,
                lay.col)
    rows = nb * tq
    k = get_kernel(q, SOURCE, "attn_softmax_fwd", options)
    k(q, (round_up(rows, LOCAL),), (LOCAL,), s.data, p.data, np.int32(rows), np.int32(tq),
      np.int32(tk), np.float32(scale), np.int32(bool(causal)), args[0], np.int32(args[1]),
      args[2], args[3], np.int32(args[4]), np.int32(args[5]))
    return p


def masked_softmax_backward(p: Tensor, dp: Tensor, scale: float) -> Tensor:
    """``p * (dp - sum(p * dp, -1)) * scale``: the gradient of the scores ``s``."""
    nb, tq, tk = p.shape
    ds = Tensor.empty(p.queue, p.shape)
    rows = nb * tq
    k = get_kernel(p.queue, SOURCE, "attn_softmax_bwd", ("-DMASK=0",))
    k(p.queue, (round_up(rows, LOCAL),), (LOCAL,), p.data, dp.data, ds.data, np.int32(rows),
      np.int32(tk), np.float32(scale))
    return ds
