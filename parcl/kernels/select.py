"""Selection kernels: ``where`` (an elementwise select of three broadcast operands) and the
embedding lookup with its deterministic backward.

``where`` walks the broadcast output through the elementwise family's strided offsets
(``elementwise.STRIDED_OFFSETS``) after ``collapse_dims``: the condition is uint8 (boolean
masks), int32, int64 or float32, nonzero meaning True.

The embedding backward sums the gradient rows of repeated indices in index order, with no
atomics, so the sums are bit-identical run to run: one work-item per weight row lists, in
index order, the positions that picked it (two integer passes over the ``n`` indices: a count,
then the positions, placed by a prefix sum of the counts), then one work-item per (row, column)
adds those positions' gradient rows. That is ``2 * V * n`` integer reads plus ``n * D`` adds:
cheap for character and word-piece vocabularies on a GPU, the integer passes dominate on a CPU
once ``V`` reaches tens of thousands. An index outside ``[0, V)``
gives a NaN row and is reported in a one-int ``flag`` (the first bad position, ``n`` when
all are fine) that the caller reads back when it likes.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import select
>>> q = pc.default_queue()
>>> c = pc.Tensor.from_host(q, np.array([True, False]))
>>> a = pc.Tensor.from_host(q, np.array([1.0, 2.0], np.float32))
>>> b = pc.Tensor.from_host(q, np.array([9.0], np.float32))
>>> select.where(c, a, b).to_host()
array([1., 9.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..runtime import on_gpu
from ..tensor import FLOAT, LABEL_DTYPES, Tensor, check_same_queue
from . import elementwise as ew
from ._cache import get_kernel, round_up

#: condition dtypes -> OpenCL type
COND_TYPES = {np.dtype(np.uint8): "uchar", np.dtype(np.int32): "int",
              np.dtype(np.int64): "long", FLOAT: "float"}
INDEX_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long"}


def _build_source() -> str:
    parts = ["//CL//", ew.STRIDED_OFFSETS]
    for ct in COND_TYPES.values():
        parts.append(f"""
__kernel void where_{ct}(__global float *out, __global const {ct} *c, __global const float *a,
                        __global const float *b, const int n, const int nd, const int8 d,
                        const int8 sc, const int8 sa, const int8 sb)
{{
    const int i = get_global_id(0);
    if (i >= n) return;
    int oa, ob, oc, unused;
    STRIDED_OFFSETS(i, nd, d, sa, sb, oa, ob);
    STRIDED_OFFSETS(i, nd, d, sc, sc, oc, unused);
    out[i] = (c[oc] != 0) ? a[oa] : b[ob];
}}""")
    for it in INDEX_TYPES.values():
        parts.append(f"""
/* out[i, :] = w[idx[i], :]; a bad index gives a NaN row and lowers flag to its position. */
__kernel void embed_fwd_{it}(__global float *out, __global const float *w,
                            __global const {it} *idx, __global int *flag, const int n,
                            const int V, const int D)
{{
    const int j = get_global_id(0), i = get_global_id(1);
    if (j >= D || i >= n) return;
    const {it} v = idx[i];
    if (v < 0 || v >= V) {{
        out[(long)i * D + j] = NAN;
        if (j == 0) atomic_min(flag, i);
        return;
    }}
    out[(long)i * D + j] = w[(long)v * D + j];
}}

/* Row v's share of the backward's position lists, in index order: count[v] = how many
   positions pick row v (first pass), then their positions from start[v] on (second pass). */
__kernel void embed_count_{it}(__global int *count, __global const {it} *idx, const int n,
                              const int V)
{{
    const int v = get_global_id(0);
    if (v >= V) return;
    int c = 0;
    for (int i = 0; i < n; ++i) c += (idx[i] == v);
    count[v] = c;
}}

/* CPUs: the same lists (count and start, positions in index order) walked once by one
   work-item, O(n + V) where the two kernels above take O(n V): 39 ms against well under one
   for GPT-2's 50257 rows and 4096 positions. ``cursor`` is scratch (V ints). */
__kernel void embed_lists_{it}(__global int *pos, __global int *start, __global int *cursor,
                              __global const {it} *idx, const int n, const int V)
{{
    if (get_global_id(0) != 0) return;
    for (int v = 0; v <= V; ++v) start[v] = 0;
    for (int i = 0; i < n; ++i) {{
        const {it} v = idx[i];
        if (v >= 0 && v < V) start[v + 1] += 1;
    }}
    for (int v = 0; v < V; ++v) {{ start[v + 1] += start[v]; cursor[v] = start[v]; }}
    for (int i = 0; i < n; ++i) {{
        const {it} v = idx[i];
        if (v >= 0 && v < V) pos[cursor[v]++] = i;
    }}
}}

__kernel void embed_positions_{it}(__global int *pos, __global const int *start,
                                  __global const {it} *idx, const int n, const int V)
{{
    const int v = get_global_id(0);
    if (v >= V) return;
    int k = start[v];
    for (int i = 0; i < n; ++i)
        if (idx[i] == v) pos[k++] = i;
}}""")
    parts.append(r"""
/* start[v] = count[0] + ... + count[v - 1], start[V] = the total: one work-item, in order. */
__kernel void embed_starts(__global int *start, __global const int *count, const int V)
{
    if (get_global_id(0) != 0) return;
    int acc = 0;
    for (int v = 0; v < V; ++v) { start[v] = acc; acc += count[v]; }
    start[V] = acc;
}

/* gw[v, j] (+)= the sum, in index order, of g[i, j] over the positions i that picked row v;
   row `skip` (padding_idx, or -1) gets none: 0, or its existing gradient left as it is. */
__kernel void embed_bwd(__global float *gw, __global const float *g, __global const int *pos,
                        __global const int *start, const int V, const int D,
                        const int accumulate, const int skip)
{
    const int j = get_global_id(0), v = get_global_id(1);
    if (j >= D || v >= V) return;
    if (v == skip) {
        if (!accumulate) gw[(long)v * D + j] = 0.0f;
        return;
    }
    float s = 0.0f;
    for (int k = start[v]; k < start[v + 1]; ++k) s += g[(long)pos[k] * D + j];
    const long o = (long)v * D + j;
    gw[o] = accumulate ? gw[o] + s : s;
}

/* PyTorch's embedding_renorm_: each listed row of w whose p-norm exceeds max_norm scaled by
   max_norm / (norm + 1e-7), in place; one work-item per row, its norm summed in order. */
__kernel void embed_renorm(__global float *w, __global const int *rows, const int k,
                           const int D, const float max_norm, const float p)
{
    const int r = get_global_id(0);
    if (r >= k) return;
    __global float *row = w + (long)rows[r] * D;
    float s = 0.0f;
    for (int j = 0; j < D; ++j) {
        const float a = fabs(row[j]);
        if (isinf(p)) s = p > 0.0f ? fmax(s, a) : (j == 0 ? a : fmin(s, a));   /* -inf: min */
        else if (p == 0.0f) s += a != 0.0f;
        else if (p == 1.0f) s += a;
        else if (p == 2.0f) s += a * a;
        else s += pow(a, p);
    }
    const float norm = (isinf(p) || p == 0.0f || p == 1.0f) ? s
                       : p == 2.0f ? sqrt(s) : pow(s, 1.0f / p);
    if (norm > max_norm) {
        const float scale = max_norm / (norm + 1e-7f);
        for (int j = 0; j < D; ++j) row[j] *= scale;
    }
}""")
    return "\n".join(parts)


SOURCE = _build_source()


def _grid2(cols: int, rows: int):
    lx = min(64, 1 << max(cols - 1, 0).bit_length())
    ly = max(1, 64 // lx)
    return (round_up(cols, lx), round_up(rows, ly)), (lx, ly)


def where(cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``cond ? a : b`` elementwise with numpy broadcasting of all three; ``cond`` uint8
    (boolean), int32, int64 or float32 (nonzero is True), ``a`` and ``b`` float32."""
    if cond.dtype not in COND_TYPES:
        raise DTypeError(f"where: condition {cond.shape} has dtype {cond.dtype}; expected bool "
                         "(uint8 on the device), int32, int64 or float32")
    ew.check_float("where", a, b)
    check_same_queue("where", cond, a, b)
    shape = ew.broadcast_shapes("where", ew.broadcast_shapes("where", cond.shape, a.shape),
                                b.shape)
    out = Tensor.empty(a.queue, shape)
    dims, (sc, sa, sb) = ew.collapse_dims(shape, *[ew.broadcast_strides(t.shape, shape)
                                                   for t in (cond, a, b)])
    if len(dims) > ew.MAX_DIMS:
        raise ShapeError(f"where: broadcasting {cond.shape}, {a.shape} and {b.shape} needs "
                         f"{len(dims)} strided dimensions; at most {ew.MAX_DIMS} are supported")
    n = out.size
    k = get_kernel(a.queue, SOURCE, f"where_{COND_TYPES[cond.dtype]}")
    k(a.queue, (round_up(n, 128),), (128,), out.data, cond.data, a.data, b.data, np.int32(n),
      np.int32(len(dims)), ew.int8_vector(dims), ew.int8_vector(sc), ew.int8_vector(sa),
      ew.int8_vector(sb))
    return out


def check_indices(op: str, indices: Tensor, weight: Tensor) -> None:
    if indices.dtype not in LABEL_DTYPES:
        raise DTypeError(f"{op}: indices {indices.shape} have dtype {indices.dtype}; expected "
                         "int32 or int64")
    ew.check_float(op, weight)
    if weight.ndim != 2:
        raise ShapeError(f"{op}: weight must be 2-D (num_embeddings, embedding_dim), got "
                         f"{weight.shape}")
    check_same_queue(op, indices, weight)


def embedding_forward(indices: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of ``weight`` (V, D) picked by ``indices`` (any shape): ``(out, flag)`` with
    ``out`` of shape ``(*indices.shape, D)`` and ``flag`` an int32 (1,) tensor: the first
    position (flat) of an index outside ``[0, V)``, or ``indices.size`` when there is none."""
    check_indices("embedding", indices, weight)
    q = weight.queue
    V, D = weight.shape
    n = indices.size
    out = Tensor.empty(q, (*indices.shape, D))
    flag = Tensor.full(q, (1,), n, np.int32)
    gsize, lsize = _grid2(D, n)
    get_kernel(q, SOURCE, f"embed_fwd_{INDEX_TYPES[indices.dtype]}")(
        q, gsize, lsize, out.data, weight.data, indices.data, flag.data, np.int32(n),
        np.int32(V), np.int32(D))
    return out, flag


def embedding_backward(indices: Tensor, grad: Tensor, num_embeddings: int,
                       into: Tensor | None = None, *, padding_idx: int = -1,
                       _parallel_lists: bool | None = None) -> Tensor:
    """The weight gradient ``(V, D)`` of ``embedding_forward``: ``grad`` rows summed per index
    in index order; added into ``into`` (an existing gradient, returned) when given. Row
    ``padding_idx`` (in ``[0, V)``; -1 for none) gets no gradient: zeros, or ``into``'s row
    unchanged.
    (``_parallel_lists`` forces the GPU way of building the per-row lists, or the CPU one:
    tests run both.)"""
    q = grad.queue
    D = grad.shape[-1]
    V, n = int(num_embeddings), indices.size
    gw = into if into is not None else Tensor.empty(q, (V, D))
    it = INDEX_TYPES[indices.dtype]
    count, start = Tensor.empty(q, (V,), np.int32), Tensor.empty(q, (V + 1,), np.int32)
    pos = Tensor.empty(q, (n,), np.int32)
    if not (on_gpu(q) if _parallel_lists is None else _parallel_lists):
        get_kernel(q, SOURCE, f"embed_lists_{it}")(q, (1,), (1,), pos.data, start.data,
                                                    count.data, indices.data, np.int32(n),
                                                    np.int32(V))
    else:                          # GPUs: a work-item per row, each walking the indices
        rows = (round_up(V, 64),), (64,)
        get_kernel(q, SOURCE, f"embed_count_{it}")(q, *rows, count.data, indices.data,
                                                    np.int32(n), np.int32(V))
        get_kernel(q, SOURCE, "embed_starts")(q, (1,), (1,), start.data, count.data,
                                              np.int32(V))
        get_kernel(q, SOURCE, f"embed_positions_{it}")(q, *rows, pos.data, start.data,
                                                        indices.data, np.int32(n),
                                                        np.int32(V))
    gsize, lsize = _grid2(D, V)
    get_kernel(q, SOURCE, "embed_bwd")(q, gsize, lsize, gw.data, grad.data, pos.data,
                                       start.data, np.int32(V), np.int32(D),
                                       np.int32(1 if into is not None else 0),
                                       np.int32(padding_idx))
    return gw


def embedding_renorm_(weight: Tensor, rows: np.ndarray, max_norm: float,
                      norm_type: float) -> None:
    """``torch.embedding_renorm_``: the rows of ``weight`` (V, D) listed in ``rows`` (host
    ints in ``[0, V)``, each once) whose ``norm_type``-norm exceeds ``max_norm`` scaled to
    it (``max_norm / (norm + 1e-7)``), in place."""
    q = weight.queue
    k = int(rows.size)
    if k == 0:
        return
    weight._overwritten("embedding max_norm")
    listed = Tensor.from_host(q, rows.astype(np.int32))
    get_kernel(q, SOURCE, "embed_renorm")(q, (round_up(k, 64),), (64,), weight.data,
                                          listed.data, np.int32(k), np.int32(weight.shape[1]),
                                          np.float32(max_norm), np.float32(norm_type))
