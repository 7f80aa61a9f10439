"""Counting and searching: binary searches in sorted rows (``searchsorted``, ``isin``),
the positions of flagged elements in order (``nonzero``, the run starts of ``unique``),
counts and weighted sums per bin over sorted keys (``bincount``, ``histc``) and
``unravel_index``.

Nothing here adds floats with atomics: a compaction counts its flags per block of ``BLOCK``
elements, scans the block counts in one work-item and writes each block's positions in order;
a bin's weights are summed in index order (the keys sorted stably, each bin a run of them).
The number of positions a compaction found is the one value a caller must read back to size
what comes next (a data-dependent shape, as PyTorch's ``nonzero`` syncs).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import counting
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([0.0, 2.0, 0.0, 5.0], np.float32))
>>> counting.positions(x, "nonzero").to_host()
array([1, 3])
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..tensor import FLOAT, Tensor
from ._cache import get_kernel, round_up

LOCAL = 64
BLOCK = 1024          # elements a work-item of a compaction counts and writes
FLAGS = {"nonzero": 0, "run_start": 1}
C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.int32): "int",
           np.dtype(np.int64): "long"}

_TYPED = r"""
/* Whether element i is flagged: nonzero (NaN is), or the start of a run of equal values
   (NaNs never equal, so each starts its own). */
inline int flag_T(__global const T *x, const long i, const int kind)
{
    return kind ? (i == 0 || !(x[i] == x[i - 1])) : (x[i] != 0);
}

__kernel void block_counts_T(__global long *counts, __global const T *x, const long n,
                             const int kind, const int blocks)
{
    const int b = get_global_id(0);
    if (b >= blocks) return;
    const long s = (long)b * BLOCK, e = min(s + BLOCK, n);
    long c = 0;
    for (long i = s; i < e; ++i) c += flag_T(x, i, kind);
    counts[b] = c;
}

__kernel void block_write_T(__global long *pos, __global const T *x,
                            __global const long *offsets, const long n, const int kind,
                            const int blocks)
{
    const int b = get_global_id(0);
    if (b >= blocks) return;
    const long s = (long)b * BLOCK, e = min(s + BLOCK, n);
    long o = offsets[b];
    for (long i = s; i < e; ++i)
        if (flag_T(x, i, kind)) pos[o++] = i;
}

/* out[i] = 1 where x[i] is nonzero (NaN is), else 0: a float mask of any input. */
__kernel void nonzero_mask_T(__global float *out, __global const T *x, const long n)
{
    const long i = get_global_id(0);
    if (i < n) out[i] = x[i] != 0 ? 1.0f : 0.0f;
}

/* out[j] = keys[starts[j]] */
__kernel void run_values_T(__global T *out, __global const T *keys,
                           __global const long *starts, const long u)
{
    const long j = get_global_id(0);
    if (j < u) out[j] = keys[starts[j]];
}

/* Each block's smallest and largest element (out: 2 per block). */
__kernel void block_range_T(__global long *out, __global const T *x, const long n,
                            const int blocks)
{
    const int b = get_global_id(0);
    if (b >= blocks) return;
    const long s = (long)b * BLOCK, e = min(s + BLOCK, n);
    long lo = x[s], hi = x[s];
    for (long i = s + 1; i < e; ++i) {
        lo = min(lo, (long)x[i]);
        hi = max(hi, (long)x[i]);
    }
    out[2 * b] = lo;
    out[2 * b + 1] = hi;
}
"""

_CAST = r"""
/* out = x converted (float to int truncates; the callers convert integers only) */
__kernel void cast_S_D(__global D *out, __global const S *x, const long n)
{
    const long i = get_global_id(0);
    if (i < n) out[i] = (D)x[i];
}
"""

_SEARCH = r"""
/* torch.searchsorted's binary search over row r of seq (m elements, through sorter when
   given): the first position whose element is >= v (right: > v); NaN goes after all. */
__kernel void searchsorted_OT(__global OT *out, __global const float *seq,
                              __global const long *sorter, __global const float *v,
                              const long count, const long m, const long per_row,
                              const int shared, const int right, const int has_sorter)
{
    const long i = get_global_id(0);
    if (i >= count) return;
    const long base = shared ? 0 : (i / per_row) * m;
    const float val = v[i];
    long lo = 0, hi = m;
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        const float s = has_sorter ? seq[base + sorter[base + mid]] : seq[base + mid];
        if (right ? !(s > val) : !(s >= val)) lo = mid + 1;
        else hi = mid;
    }
    out[i] = (OT)lo;
}
"""

_PLAIN = r"""
__kernel void exclusive_scan(__global long *offsets, __global long *total,
                             __global const long *counts, const int blocks)
{
    if (get_global_id(0) != 0) return;
    long acc = 0;
    for (int b = 0; b < blocks; ++b) {
        offsets[b] = acc;
        acc += counts[b];
    }
    total[0] = acc;
}

/* One count per row of R contiguous elements of a 0/1 mask. */
__kernel void count_rows(__global long *out, __global const float *mask, const long rows,
                         const long R)
{
    const long r = get_global_id(0);
    if (r >= rows) return;
    long c = 0;
    for (long j = 0; j < R; ++j) c += mask[r * R + j] != 0.0f;
    out[r] = c;
}

/* For each sorted position i: the run it is in (the last start <= i), stored at perm[i]. */
__kernel void run_inverse(__global long *inv, __global const long *starts, const long u,
                          __global const long *perm, const long n, const int has_perm)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    long lo = 0, hi = u;                     /* the first start > i, less one */
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        if (starts[mid] <= i) lo = mid + 1;
        else hi = mid;
    }
    inv[has_perm ? perm[i] : i] = lo - 1;
}

__kernel void run_counts(__global long *counts, __global const long *starts, const long u,
                         const long n)
{
    const long j = get_global_id(0);
    if (j < u) counts[j] = (j + 1 < u ? starts[j + 1] : n) - starts[j];
}

/* torch.histc's bin of each element as a float key (NaN: outside [lo, hi], or NaN). */
__kernel void hist_keys(__global float *keys, __global const float *x, const long n,
                        const float lo, const float hi, const long bins)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i];
    if (!(v >= lo && v <= hi)) {
        keys[i] = NAN;
        return;
    }
    long k = (long)((v - lo) * (float)bins / (hi - lo));
    if (k >= bins) k = bins - 1;
    keys[i] = (float)k;
}

inline long lower_bound(__global const float *keys, const long n, const float v)
{
    long lo = 0, hi = n;
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        if (keys[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Bin b of stably sorted keys: its count, or its weights summed in index order. */
__kernel void bin_sums(__global float *sums, __global long *counts, __global const float *keys,
                       __global const float *w, const long n, const long bins, const int mode)
{
    const long b = get_global_id(0);
    if (b >= bins) return;
    const long s = lower_bound(keys, n, (float)b), e = lower_bound(keys, n, (float)(b + 1));
    if (mode == 2) {
        float acc = 0.0f;
        for (long i = s; i < e; ++i) acc += w[i];
        sums[b] = acc;
    } else if (mode == 1) {
        sums[b] = (float)(e - s);
    } else {
        counts[b] = e - s;
    }
}

/* isin: whether x[i] equals an element of the sorted test elements (NaN never does). */
__kernel void isin(__global float *out, __global const float *x, __global const float *sorted,
                   const long n, const long m, const int invert)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i];
    const long p = lower_bound(sorted, m, v);
    const int found = p < m && sorted[p] == v;
    out[i] = found != invert ? 1.0f : 0.0f;
}

/* The coordinates of flat positions in a tensor of dims (nd of them), each dim taken
   modulo its size as PyTorch's unravel_index (negative positions count from the end). */
__kernel void unravel(__global long *out, __global const long *pos, const long count,
                      __global const long *dims, const int nd, const int by_dim)
{
    const long i = get_global_id(0);
    if (i >= count) return;
    long p = pos[i];
    for (int k = nd - 1; k >= 0; --k) {
        const long d = dims[k];
        long c = p % d, q = p / d;
        if (c < 0) {
            c += d;
            q -= 1;
        }
        out[by_dim ? (long)k * count + i : i * nd + k] = c;
        p = q;
    }
}
"""


def _source() -> str:
    typed = "".join(_TYPED.replace("_T(", f"_{c}(").replace("const T ", f"const {c} ")
                    .replace("__global T ", f"__global {c} ") for c in C_TYPES.values())
    search = "".join(_SEARCH.replace("_OT(", f"_{c}(").replace("OT", c)
                     for c in ("int", "long"))
    cast = "".join(_CAST.replace("_S_D(", f"_{a}_{b}(").replace("const S ", f"const {a} ")
                   .replace("__global D ", f"__global {b} ").replace("(D)", f"({b})")
                   for a in C_TYPES.values() for b in C_TYPES.values() if a != b)
    return f"//CL//\n#define BLOCK {BLOCK}\n" + typed + cast + search + _PLAIN


SOURCE = _source()


def _ctype(op: str, x: Tensor) -> str:
    if x.dtype not in C_TYPES:
        raise DTypeError(f"{op}: input {x.shape} has dtype {x.dtype}, expected float32, "
                         "int32 or int64")
    return C_TYPES[x.dtype]


def _grid(n: int):
    return (round_up(max(n, 1), LOCAL),), (LOCAL,)


def count(x: Tensor, kind: str, op: str = "nonzero") -> tuple[Tensor, Tensor, int]:
    """``(offsets, total, blocks)``: each block's first output position and the number of
    flagged elements of the flattened ``x`` (a (1,) int64 tensor on the device)."""
    c = _ctype(op, x)
    q, n = x.queue, x.size
    blocks = -(-n // BLOCK)
    counts = Tensor.empty(q, (max(blocks, 1),), np.int64)
    offsets = Tensor.empty(q, (max(blocks, 1),), np.int64)
    total = Tensor.zeros(q, (1,), np.int64)
    if blocks:
        get_kernel(q, SOURCE, f"block_counts_{c}")(q, *_grid(blocks), counts.data, x.data,
                                                   np.int64(n), np.int32(FLAGS[kind]),
                                                   np.int32(blocks))
        get_kernel(q, SOURCE, "exclusive_scan")(q, (1,), (1,), offsets.data, total.data,
                                                counts.data, np.int32(blocks))
    return offsets, total, blocks


def positions(x: Tensor, kind: str, op: str = "nonzero") -> Tensor:
    """The flat positions (int64, in order) of the flagged elements of ``x``: its nonzeros
    or, on sorted keys, the starts of runs of equal values. Reads their number back."""
    offsets, total, blocks = count(x, kind, op)
    found = int(total.to_host()[0])
    pos = Tensor.empty(x.queue, (found,), np.int64)
    if found:
        get_kernel(x.queue, SOURCE, f"block_write_{C_TYPES[x.dtype]}")(
            x.queue, *_grid(blocks), pos.data, x.data, offsets.data, np.int64(x.size),
            np.int32(FLAGS[kind]), np.int32(blocks))
    return pos


def nonzero_mask(x: Tensor, op: str = "count_nonzero") -> Tensor:
    """A float32 0/1 mask of ``x``'s nonzero elements (NaN included)."""
    c = _ctype(op, x)
    out = Tensor.empty(x.queue, x.shape)
    if x.size:
        get_kernel(x.queue, SOURCE, f"nonzero_mask_{c}")(x.queue, *_grid(x.size), out.data,
                                                         x.data, np.int64(x.size))
    return out


def count_rows(mask: Tensor, rows: int, R: int) -> Tensor:
    """The number of nonzeros in each of ``rows`` contiguous rows of ``R`` of a float mask."""
    out = Tensor.empty(mask.queue, (rows,), np.int64)
    if rows:
        get_kernel(mask.queue, SOURCE, "count_rows")(mask.queue, *_grid(rows), out.data,
                                                     mask.data, np.int64(rows), np.int64(R))
    return out


def runs(keys: Tensor, starts: Tensor, perm: Tensor | None, inverse: bool, counts: bool):
    """``(values, inverse, counts)`` of the runs of equal values of the 1-D ``keys`` that
    start at ``starts``: each run's value, each element's run (at ``perm[i]`` when the keys
    are ``x`` sorted by ``perm``) and each run's length; None where not asked for."""
    q, n, u = keys.queue, keys.size, starts.size
    values = Tensor.empty(q, (u,), keys.dtype)
    if u:
        get_kernel(q, SOURCE, f"run_values_{C_TYPES[keys.dtype]}")(
            q, *_grid(u), values.data, keys.data, starts.data, np.int64(u))
    inv = cnt = None
    if inverse:
        inv = Tensor.empty(q, (n,), np.int64)
        if n:
            get_kernel(q, SOURCE, "run_inverse")(
                q, *_grid(n), inv.data, starts.data, np.int64(u),
                (starts if perm is None else perm).data, np.int64(n), np.int32(perm is not None))
    if counts:
        cnt = Tensor.empty(q, (u,), np.int64)
        if u:
            get_kernel(q, SOURCE, "run_counts")(q, *_grid(u), cnt.data, starts.data,
                                                np.int64(u), np.int64(n))
    return values, inv, cnt


def searchsorted(seq: Tensor, values: Tensor, right: bool, sorter: Tensor | None,
                 out_int32: bool) -> Tensor:
    """For each element of ``values``, its insertion position in its row of ``seq`` (the
    last dim; one row for all when ``seq`` is 1-D): ``values``'s shape, int64 or int32."""
    q = seq.queue
    m = seq.shape[-1]
    shared = seq.ndim == 1
    per_row = values.shape[-1] if values.ndim else 1
    out_t = np.int32 if out_int32 else np.int64
    out = Tensor.empty(q, values.shape, out_t)
    if values.size:
        get_kernel(q, SOURCE, "searchsorted_" + ("int" if out_int32 else "long"))(
            q, *_grid(values.size), out.data, seq.data, (seq if sorter is None else sorter).data,
            values.data, np.int64(values.size), np.int64(m), np.int64(per_row),
            np.int32(shared), np.int32(bool(right)), np.int32(sorter is not None))
    return out


def isin(x: Tensor, sorted_test: Tensor, invert: bool) -> Tensor:
    """A float32 0/1 mask: whether each element of ``x`` is among ``sorted_test``."""
    out = Tensor.empty(x.queue, x.shape)
    if x.size:
        get_kernel(x.queue, SOURCE, "isin")(x.queue, *_grid(x.size), out.data, x.data,
                                            sorted_test.data, np.int64(x.size),
                                            np.int64(sorted_test.size), np.int32(bool(invert)))
    return out


def int_range(x: Tensor, op: str) -> tuple[int, int]:
    """The smallest and largest element of the integer tensor ``x`` (read back)."""
    c = _ctype(op, x)
    blocks = -(-x.size // BLOCK)
    out = Tensor.empty(x.queue, (2 * blocks,), np.int64)
    get_kernel(x.queue, SOURCE, f"block_range_{c}")(x.queue, *_grid(blocks), out.data,
                                                    x.data, np.int64(x.size), np.int32(blocks))
    host = out.to_host().reshape(blocks, 2)
    return int(host[:, 0].min()), int(host[:, 1].max())


def cast(x: Tensor, dtype) -> Tensor:
    """``x`` converted to ``dtype`` (float32, int32 or int64); ``x`` itself if it has it."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    out = Tensor.empty(x.queue, x.shape, dtype)
    if x.size:
        get_kernel(x.queue, SOURCE, f"cast_{_ctype('cast', x)}_{C_TYPES[dtype]}")(
            x.queue, *_grid(x.size), out.data, x.data, np.int64(x.size))
    return out


def hist_keys(x: Tensor, lo: float, hi: float, bins: int) -> Tensor:
    """``torch.histc``'s bin of each element as a float key (NaN: none)."""
    keys = Tensor.empty(x.queue, x.shape)
    get_kernel(x.queue, SOURCE, "hist_keys")(x.queue, *_grid(x.size), keys.data, x.data,
                                             np.int64(x.size), np.float32(lo), np.float32(hi),
                                             np.int64(bins))
    return keys


def bin_sums(sorted_keys: Tensor, weights: Tensor | None, bins: int, as_float: bool) -> Tensor:
    """Per bin ``0 .. bins-1`` of the stably sorted keys: the weights (sorted with them)
    summed in order, or the count (int64, or float32 with ``as_float``)."""
    q = sorted_keys.queue
    mode = 2 if weights is not None else (1 if as_float else 0)
    out = Tensor.empty(q, (bins,), np.int64 if mode == 0 else FLOAT)
    if bins:
        get_kernel(q, SOURCE, "bin_sums")(
            q, *_grid(bins), out.data, out.data, sorted_keys.data,
            (sorted_keys if weights is None else weights).data, np.int64(sorted_keys.size),
            np.int64(bins), np.int32(mode))
    return out


def unravel(pos: Tensor, dims: tuple[int, ...], by_dim: bool) -> Tensor:
    """The coordinates of the int64 flat positions ``pos`` in a tensor of ``dims``:
    (count, nd), or (nd, count) ``by_dim``."""
    q, n, nd = pos.queue, pos.size, len(dims)
    out = Tensor.empty(q, (nd, n) if by_dim else (n, nd), np.int64)
    if n and nd:
        sizes = Tensor.from_host(q, np.array(dims, np.int64))
        get_kernel(q, SOURCE, "unravel")(q, *_grid(n), out.data, pos.data, np.int64(n),
                                         sizes.data, np.int32(nd), np.int32(bool(by_dim)))
    return out
