"""``embedding_bag``'s reduction: the rows of each bag (a range of positions given by offsets)
summed, averaged or maximised, and the gradient back to the rows (the launchers of
``tp.embedding_bag``, whose lookup of the rows is ``tp.embedding``).

One work-item per (bag, column) walks its bag in order, so sums are in a fixed order and a
maximum's pick is the first of its ties (PyTorch's); positions whose index is ``padding_idx``
are skipped (not counted by the mean, never the maximum); an empty bag gives zeros. The
backward is one work-item per (position, column): it finds its bag by a binary search over the
offsets and takes the bag's gradient (over the bag's count for the mean, only where it was the
pick for the maximum), so no two work-items write one word and nothing is atomic but the flag.
Offsets that do not start at 0, decrease or run past the input lower an int flag (``atomic_min``
of the first bad entry, whatever the schedule) and are clamped, so nothing is read out of
range; the caller reads the flag back when it likes.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import embedding_bag as ebk
>>> q = pc.default_queue()
>>> rows = pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(3, 2))
>>> idx, off = (pc.Tensor.from_host(q, np.array(a)) for a in ([4, 5, 6], [0, 2]))
>>> out, pick, counts, flag = ebk.bag_forward(rows, idx, off, 2, -1, "sum")
>>> out.to_host()
array([[2., 4.],
       [4., 5.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..tensor import FLOAT, LABEL_DTYPES, Tensor
from ._cache import get_kernel, round_up

NO_ERROR = np.iinfo(np.int32).max
LOCAL = 64
MODES = {"sum": 0, "mean": 1, "max": 2}

SOURCE = r"""//CL//
/* the start of bag b, clamped to [0, n] */
inline long bag_start(__global const OT *offsets, const long b, const long n)
{
    return clamp((long)offsets[b], 0L, n);
}

/* the end of bag b: the next offset, or n after the last one (clamped: never before start) */
inline long bag_end(__global const OT *offsets, const long b, const long noffsets,
                    const long n, const long start)
{
    return b + 1 < noffsets ? clamp((long)offsets[b + 1], start, n) : n;
}

/* out (bags, D); pick (bags, D), the max's: the position each maximum came from (-1: none);
   counts (bags), the mean's: the positions each bag counted. */
__kernel void bag_forward(__global const float *rows, __global const IT *indices,
                          __global const OT *offsets, __global float *out,
                          __global int *pick, __global float *counts, __global int *flag,
                          const long bags, const long noffsets, const long n, const long D,
                          const long pad, const int mode)
{
    const long g = get_global_id(0);
    if (g >= bags * D) return;
    const long b = g / D, d = g % D;
    if (d == 0) {
        const long o = offsets[b];
        bool bad = o < 0 || o > n || (b == 0 && o != 0)
                   || (b + 1 < noffsets && (long)offsets[b + 1] < o);
        if (b == bags - 1 && noffsets > bags)           /* include_last_offset's end */
            bad = bad || (long)offsets[noffsets - 1] > n;
        if (bad) atomic_min(flag, (int)b);
    }
    const long start = bag_start(offsets, b, n);
    const long end = bag_end(offsets, b, noffsets, n, start);
    float acc = 0.0f;
    long at = -1, count = 0;
    for (long i = start; i < end; ++i) {
        if ((long)indices[i] == pad) continue;
        const float v = rows[i * D + d];
        if (mode == 2) {
            if (at < 0 || v > acc || (isnan(v) && !isnan(acc))) { acc = v; at = i; }
        } else {
            acc += v;
        }
        ++count;
    }
    if (mode == 1 && count > 0) acc /= (float)count;
    out[g] = acc;
    if (mode == 2) pick[g] = (int)at;
    if (mode == 1 && d == 0) counts[b] = (float)count;
}

/* grows (n, D): each position's share of its bag's gradient g (bags, D). */
__kernel void bag_backward(__global const float *g, __global const IT *indices,
                           __global const OT *offsets, __global const int *pick,
                           __global const float *counts, __global float *grows,
                           const long bags, const long noffsets, const long n, const long D,
                           const long pad, const int mode)
{
    const long k = get_global_id(0);
    if (k >= n * D) return;
    const long i = k / D, d = k % D;
    /* the last bag starting at or before i */
    long lo = 0, hi = bags - 1;
    while (lo < hi) {
        const long mid = (lo + hi + 1) / 2;
        if (bag_start(offsets, mid, n) <= i) lo = mid; else hi = mid - 1;
    }
    const long start = bag_start(offsets, lo, n);
    const long end = bag_end(offsets, lo, noffsets, n, start);
    float v = 0.0f;
    if (i >= start && i < end && (long)indices[i] != pad) {
        const float up = g[lo * D + d];
        if (mode == 0) v = up;
        else if (mode == 1) v = up / counts[lo];
        else v = pick[lo * D + d] == (int)i ? up : 0.0f;
    }
    grows[k] = v;
}
"""


def _options(indices: Tensor, offsets: Tensor) -> tuple[str, ...]:
    return tuple(f"-D{name}={'int' if t.dtype == np.int32 else 'long'}"
                 for name, t in (("IT", indices), ("OT", offsets)))


def _or(t: Tensor | None, spare: Tensor):
    """``t``'s buffer, or, for an output or input the mode has none of, ``spare``'s: a
    buffer the kernel binds but does not touch in that mode."""
    return (spare if t is None else t).data


def bag_forward(rows: Tensor, indices: Tensor, offsets: Tensor, bags: int, pad: int,
                mode: str) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    """``(out, pick, counts, flag)`` for ``rows`` (n, D) float32 read at positions grouped by
    the int32/int64 ``offsets`` into ``bags`` bags (``len(offsets) == bags + 1``: the last
    entry ends the last bag; else the input's end does); ``indices`` (n,) skip where equal to
    ``pad`` (-1: none). ``pick`` only for ``"max"`` and ``counts`` only for ``"mean"`` (their
    backwards read them); ``flag`` holds ``NO_ERROR`` or the first bag whose offset is bad."""
    for name, t in (("indices", indices), ("offsets", offsets)):
        if t.dtype not in LABEL_DTYPES:
            raise DTypeError(f"embedding_bag: {name} of shape {t.shape} have dtype {t.dtype}, "
                             "expected int32 or int64")
    if rows.dtype != FLOAT:
        raise DTypeError(f"embedding_bag: weight has dtype {rows.dtype}, expected float32")
    q = rows.queue
    n, D = rows.shape
    out = Tensor.empty(q, (bags, D))
    pick = Tensor.empty(q, (bags, D), np.int32) if mode == "max" else None
    counts = Tensor.empty(q, (bags,)) if mode == "mean" else None
    flag = Tensor.full(q, (1,), NO_ERROR, np.int32)
    if bags * D:
        get_kernel(q, SOURCE, "bag_forward", _options(indices, offsets))(
            q, (round_up(bags * D, LOCAL),), (LOCAL,), rows.data, indices.data, offsets.data,
            out.data, _or(pick, out), _or(counts, out), flag.data,
            np.int64(bags), np.int64(offsets.size), np.int64(n), np.int64(D), np.int64(pad),
            np.int32(MODES[mode]))
    return out, pick, counts, flag


def bag_backward(g: Tensor, indices: Tensor, offsets: Tensor, pick: Tensor | None,
                 counts: Tensor | None, n: int, pad: int, mode: str) -> Tensor:
    """The gradient of ``bag_forward``'s ``rows``: ``(n, D)`` from ``g`` ``(bags, D)``."""
    q = g.queue
    bags, D = g.shape
    if bags == 0:                      # no bags: no position is in one
        return Tensor.zeros(q, (n, D))
    grows = Tensor.empty(q, (n, D))
    get_kernel(q, SOURCE, "bag_backward", _options(indices, offsets))(
        q, (round_up(n * D, LOCAL),), (LOCAL,), g.data, indices.data, offsets.data,
        _or(pick, g), _or(counts, g), grows.data, np.int64(bags),
        np.int64(offsets.size), np.int64(n), np.int64(D), np.int64(pad),
        np.int32(MODES[mode]))
    return grows
