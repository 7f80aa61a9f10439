"""Row normalisation kernels: layer norm and RMS norm over the last ``D`` elements of a
contiguous tensor viewed as ``(rows, D)``.

Forward saves each row's mean (0 for RMS norm) and inverse standard deviation ``rstd``; the
backward reads them instead of recomputing the statistics (Entrenar's LayerNorm metadata).
Statistics are two-pass: a mean, then the sums of the deviations from it and of their squares,
which correct the mean and give the variance around the corrected one (accurate with a mean
far from zero: a mean of 1e3 against a spread of 1 costs no accuracy). Every sum has a fixed
order: on a CPU a work-item walks its row (8 rows where the rows and D are whole multiples of
8, the same bits) in 8-lane vectors, in blocks whose lanes are folded by a tree, so no running
sum is long; on a GPU one work-group takes a row, each work-item a fixed strided share,
combined by a fixed tree. Weight and bias gradients are column sums in blocks of rows (one
work-item per column; on CPUs 8 columns in the lanes of a vector, 6x faster), so every result
is bit-identical run to run.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import norm
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([[1.0, 3.0]], np.float32))
>>> y, mean, rstd = norm.norm_forward(x, 2, None, None, 0.0, center=True)
>>> y.to_host()
array([[-1.,  1.]], dtype=float32)
"""

from __future__ import annotations


from ..runtime import on_gpu
from ..tensor import Tensor
from ._cache import (GROUP_SUM, GROUP_SUM2, LAUNCH_MAX, VECTOR_TYPES, get_kernel, kernel_limits,
                     round_up)

WG = 128      # work-group size of the GPU row kernels (a power of two)


def use_workgroups(rows: int) -> bool:
    """Whether a GPU takes a work-group per row (``_wg`` kernels): while the launch, ``rows *
    WG`` work-items, stays under ``LAUNCH_MAX``; past it a work-item per row (rows of fewer
    than WG elements, a few GiB in all, reach it)."""
    return rows * WG < LAUNCH_MAX


def _variant(prefix: str, center: int) -> str:
    """The kernels of one normalisation: ``center`` 1 subtracts the mean (layer norm), 0 keeps
    it at zero (RMS norm). ``_row`` kernels take one row per work-item, ``_rows8`` kernels 8
    rows, ``_wg`` kernels one row per work-group of WG items; they differ in who sums which
    elements (the ``_row`` and ``_rows8`` ones not at all: they share the row functions)."""
    return f"""
/* Row r's mean (0 when not centred) and rstd, two-pass in ROW_BLOCKS's order (CPU kernels). */
inline void {prefix}_moments(__global const float *xr, const int D, const float eps,
                             float *mean_out, float *rs_out)
{{
    const int D8 = D & ~7;
    float m = 0.0f;
    if ({center}) {{
        ROW_BLOCKS(D8, float8 bm = (float8)(0.0f);, bm += LOAD(xr + j);, m += TREE_LANES(bm);)
        for (int j = D8; j < D; ++j) m += xr[j];
        m = SHIFT(m / (float)D);
    }}
    float s = 0.0f, v = 0.0f;
    ROW_BLOCKS(D8, float8 bs = (float8)(0.0f); float8 bv = (float8)(0.0f);,
               const float8 d = LOAD(xr + j) - m; const float8 q = d * d; bs += d; bv += q;,
               s += TREE_LANES(bs); v += TREE_LANES(bv);)
    for (int j = D8; j < D; ++j) {{
        const float d = xr[j] - m;
        const float q = d * d;
        s += d;
        v += q;
    }}
    FINISH_MOMENTS(*mean_out, *rs_out, m, s, v, {center})
}}

/* The backward's row means: *a1 of gh = g * w (0 when not centred), *a2 of gh * h. */
inline void {prefix}_grad_means(__global const float *xr, __global const float *gr,
                                __global const float *w, const float m, const float rs,
                                const int D, float *a1, float *a2)
{{
    const int D8 = D & ~7;
    float s1 = 0.0f, s2 = 0.0f;
    ROW_BLOCKS(D8, float8 b1 = (float8)(0.0f); float8 b2 = (float8)(0.0f);,
               const float8 h = (LOAD(xr + j) - m) * rs;
               const float8 gh = w ? LOAD(gr + j) * LOAD(w + j) : LOAD(gr + j);
               const float8 p = gh * h; b1 += gh; b2 += p;,
               s1 += TREE_LANES(b1); s2 += TREE_LANES(b2);)
    for (int j = D8; j < D; ++j) {{
        const float h = (xr[j] - m) * rs, gh = w ? gr[j] * w[j] : gr[j];
        const float p = gh * h;
        s1 += gh;
        s2 += p;
    }}
    *a1 = {center} ? s1 / (float)D : 0.0f;
    *a2 = s2 / (float)D;
}}

__kernel void {prefix}_fwd_row(__global float *y, __global float *mean, __global float *rstd,
                               __global const float *x, __global const float *w,
                               __global const float *b, const int rows, const int D,
                               const float eps)
{{
    const int r = get_global_id(0);
    if (r >= rows) return;
    __global const float *xr = x + (long)r * D;
    __global float *yr = y + (long)r * D;
    float m, rs;
    {prefix}_moments(xr, D, eps, &m, &rs);
    mean[r] = m;
    rstd[r] = rs;
    for (int j = 0; j < D; ++j) {{
        float h = (xr[j] - m) * rs;
        if (w) h *= w[j];
        if (b) h += b[j];
        yr[j] = h;
    }}
}}

__kernel void {prefix}_fwd_wg(__global float *y, __global float *mean, __global float *rstd,
                              __global const float *x, __global const float *w,
                              __global const float *b, const int rows, const int D,
                              const float eps)
{{
    __local float scratch[2 * WG];
    const int r = get_group_id(0), l = get_local_id(0);
    __global const float *xr = x + (long)r * D;
    __global float *yr = y + (long)r * D;
    float m = 0.0f;
    if ({center}) {{
        float t = 0.0f;
        for (int j = l; j < D; j += WG) t += xr[j];
        m = SHIFT(group_sum(t, scratch) / (float)D);
    }}
    float s = 0.0f, v = 0.0f;
    for (int j = l; j < D; j += WG) {{ const float d = xr[j] - m; s += d; v += d * d; }}
    const float2 sv = group_sum2((float2)(s, v), scratch);
    float ms, rs;
    FINISH_MOMENTS(ms, rs, m, sv.x, sv.y, {center})
    if (l == 0) {{ mean[r] = ms; rstd[r] = rs; }}
    for (int j = l; j < D; j += WG) {{
        float h = (xr[j] - ms) * rs;
        if (w) h *= w[j];
        if (b) h += b[j];
        yr[j] = h;
    }}
}}

/* gx = rstd * (gh - mean(gh) - h * mean(gh * h)) with h the normalised input and
   gh = g * w (the mean(gh) term only when centred). */
__kernel void {prefix}_bwd_row(__global float *gx, __global const float *g,
                               __global const float *x, __global const float *mean,
                               __global const float *rstd, __global const float *w,
                               const int rows, const int D)
{{
    const int r = get_global_id(0);
    if (r >= rows) return;
    const long o = (long)r * D;
    const float m = mean[r], rs = rstd[r];
    float a1, a2;
    {prefix}_grad_means(x + o, g + o, w, m, rs, D, &a1, &a2);
    for (int j = 0; j < D; ++j) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        gx[o + j] = rs * (gh - a1 - h * a2);
    }}
}}

__kernel void {prefix}_bwd_wg(__global float *gx, __global const float *g,
                              __global const float *x, __global const float *mean,
                              __global const float *rstd, __global const float *w,
                              const int rows, const int D)
{{
    __local float scratch[2 * WG];
    const int r = get_group_id(0), l = get_local_id(0);
    const long o = (long)r * D;
    const float m = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (int j = l; j < D; j += WG) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        s1 += gh;
        s2 += gh * h;
    }}
    const float2 s = group_sum2((float2)(s1, s2), scratch);
    const float a1 = {center} ? s.x / (float)D : 0.0f, a2 = s.y / (float)D;
    for (int j = l; j < D; j += WG) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        gx[o + j] = rs * (gh - a1 - h * a2);
    }}
}}

/* The _row kernels on 8 rows per work-item (CPUs, D and the rows whole multiples of 8): the
   same row functions, so the same bits, with each row's elementwise pass in vectors. */
__kernel void {prefix}_fwd_rows8(__global float *y, __global float *mean,
                                 __global float *rstd, __global const float *x,
                                 __global const float *w, __global const float *b,
                                 const int rows, const int D, const float eps)
{{
    const int r0 = 8 * get_global_id(0);
    if (r0 >= rows) return;
    for (int i = 0; i < 8; ++i) {{
        __global const float *xi = x + (long)(r0 + i) * D;
        __global float *yi = y + (long)(r0 + i) * D;
        float m, rs;
        {prefix}_moments(xi, D, eps, &m, &rs);
        mean[r0 + i] = m;
        rstd[r0 + i] = rs;
        for (int j = 0; j < D; j += 8) {{
            float8 h = (LOAD(xi + j) - m) * rs;
            if (w) h *= LOAD(w + j);
            if (b) h += LOAD(b + j);
            *(__global float8u*)(yi + j) = h;
        }}
    }}
}}

__kernel void {prefix}_bwd_rows8(__global float *gx, __global const float *g,
                                 __global const float *x, __global const float *mean,
                                 __global const float *rstd, __global const float *w,
                                 const int rows, const int D)
{{
    const int r0 = 8 * get_global_id(0);
    if (r0 >= rows) return;
    for (int i = 0; i < 8; ++i) {{
        const long o = (long)(r0 + i) * D;
        const float m = mean[r0 + i], rs = rstd[r0 + i];
        float a1, a2;
        {prefix}_grad_means(x + o, g + o, w, m, rs, D, &a1, &a2);
        for (int j = 0; j < D; j += 8) {{
            const float8 h = (LOAD(x + o + j) - m) * rs;
            const float8 gi = LOAD(g + o + j);
            const float8 gh = w ? gi * LOAD(w + j) : gi;
            *(__global float8u*)(gx + o + j) = rs * (gh - a1 - h * a2);
        }}
    }}
}}

/* Column sums over the rows (COLUMN_SUMS's order): gw[j] (+)= sum_r g[r, j] * h[r, j],
   gb[j] (+)= sum_r g[r, j]. */
__kernel void {prefix}_bwd_params(__global float *gw, __global float *gb,
                                  __global const float *g, __global const float *x,
                                  __global const float *mean, __global const float *rstd,
                                  const int rows, const int D, const int accumulate)
{{
    const int j = get_global_id(0);
    if (j >= D) return;
    float sw = 0.0f, sb = 0.0f;
    COLUMN_SUMS(float, sw, sb, G1, H1)
    if (gw) gw[j] = (accumulate & 1) ? gw[j] + sw : sw;
    if (gb) gb[j] = (accumulate & 2) ? gb[j] + sb : sb;
}}

/* The same on 8 columns per work-item in the lanes of a vector (CPUs, D a multiple of 8):
   each lane sums its column in the same order, statement for statement: the same bits. */
__kernel void {prefix}_bwd_params8(__global float *gw, __global float *gb,
                                   __global const float *g, __global const float *x,
                                   __global const float *mean, __global const float *rstd,
                                   const int rows, const int D, const int accumulate)
{{
    const int j = 8 * get_global_id(0);
    if (j >= D) return;
    float8 sw = (float8)(0.0f), sb = (float8)(0.0f);
    COLUMN_SUMS(float8, sw, sb, G8, H8)
    if (gw) *(__global float8u*)(gw + j) = (accumulate & 1) ? LOAD(gw + j) + sw : sw;
    if (gb) *(__global float8u*)(gb + j) = (accumulate & 2) ? LOAD(gb + j) + sb : sb;
}}"""


# The fixed order of the CPU kernels' row sums (ROW_BLOCKS): the row in blocks of ROW_BLOCK
# elements; in a block, each of 8 vector lanes sums its column of the block's 8-element chunks
# (16 terms), then the lanes are folded as a tree (TREE_LANES) into the block's sum; the block
# sums added in order, then any tail (D % 8) one by one. The same additions as one running
# sum of D terms, but no running sum is longer than ~ROW_BLOCK / 8 + D / ROW_BLOCK terms, so
# the rounding error stays near a few roundings (pairwise summation's idea, at no extra cost):
# one long running sum is what cost 3x torch's accuracy on 768-element rows even at a mean of
# 0. Products are statements of their own, so the compiler fuses none into the sums.
_SUMS = r"""
#define ROW_BLOCK 128
#define COLUMN_BLOCK 16

#define LOAD(p) (*(__global const float8u*)(p))
#define TREE_LANES(v) ((((v).s0 + (v).s1) + ((v).s2 + (v).s3)) \
                       + (((v).s4 + (v).s5) + ((v).s6 + (v).s7)))

/* The chunks j = 0, 8, ... < END of a row in blocks of ROW_BLOCK elements: START declares a
   block's sums, BODY adds chunk j into them, FLUSH adds them into the row's; the chunks left
   over after the full blocks make one last, shorter block. Full blocks run a constant trip
   count (PoCL compiles a min()-bounded loop up to 20% slower than one running sum). */
#define ROW_BLOCKS(END, START, BODY, FLUSH) {                                            \
    int j0 = 0;                                                                           \
    for (; j0 + ROW_BLOCK <= (END); j0 += ROW_BLOCK) {                                    \
        START                                                                             \
        for (int k = 0; k < ROW_BLOCK; k += 8) { const int j = j0 + k; BODY }             \
        FLUSH                                                                             \
    }                                                                                     \
    START                                                                                 \
    for (int j = j0; j < (END); j += 8) { BODY }                                          \
    FLUSH                                                                                 \
}

/* The shift the second pass subtracts: the first pass's mean cut to 16 significant bits.
   x - shift is then exact for nearly every x; with a full-precision shift close to 0 every
   x - m of one binade would round the same way, biasing the correction s / D by up to half a
   float step of the spread. Any shift near the mean serves the corrected formulas. */
#define SHIFT(m) as_float(as_uint(m) & 0xffffff00u)

/* A row's mean and rstd from the two passes: m, the first pass's mean (SHIFT); s and v, the
   sums of d = x - m and d * d. m is off by the rounding of a sum as large as D * mean, so it
   is corrected by s / D (the corrected two-pass algorithm of Chan, Golub and LeVeque), and the
   variance is taken around the corrected mean: accurate however large the mean against the
   spread. RMS norm (center 0) keeps the mean at 0 and v / D. */
#define FINISH_MOMENTS(mean_out, rs_out, m, s, v, center) {                             \
    const float ds = (center) ? (s) / (float)D : 0.0f;                                    \
    const float ds2 = ds * ds;                                                            \
    mean_out = (m) + ds;                                                                  \
    rs_out = rsqrt(fmax((v) / (float)D - ds2, 0.0f) + eps);                                \
}

/* Column j's sums over the rows, sw of g * h and sb of g, in blocks of COLUMN_BLOCK rows,
   each block's running sum on its own, and those in groups of COLUMN_BLOCKS blocks: the
   block sums' running sum of a group, then the groups' sums in order. No running sum is
   longer than 64 terms up to 2^20 rows: with the block sums in one running sum (rows / 16
   terms) RMS norm's weight gradient over 2^18 rows was 5.6e-6 of its largest element off, now
   6.6e-7 (torch: 3.4e-7). Up to 1023 rows (one group) the bits of that one running sum. A
   tree over 8 rows, as along a row, measured 8% slower here; this costs nothing. G(o) reads
   g at o, H(o, r) the normalised input at o in row r (scalars, or 8 columns as a vector). */
#define G1(o) g[o]
#define H1(o, r) ((x[o] - mean[r]) * rstd[r])
#define G8(o) LOAD(g + (o))
#define H8(o, r) ((LOAD(x + (o)) - mean[r]) * rstd[r])
#define COLUMN_BLOCKS 64
#define COLUMN_TERM(T, r, bw, bb, G, H) {                                                 \
    const long o = (long)(r) * D + j;                                                     \
    const T gr = G(o);                                                                    \
    bw += gr * H(o, r);                                                                   \
    bb += gr;                                                                             \
}
/* rows r0 .. END - 1 (END - r0 <= COLUMN_BLOCK) summed on their own, then added to uw, ub */
#define COLUMN_BLOCK_SUM(T, r0, END, uw, ub, G, H) {                                      \
    T bw = (T)(0.0f), bb = (T)(0.0f);                                                     \
    for (int r = (r0); r < (END); ++r)                                                    \
        COLUMN_TERM(T, r, bw, bb, G, H)                                                   \
    uw += bw;                                                                             \
    ub += bb;                                                                             \
}
#define COLUMN_SUMS(T, sw, sb, G, H) {                                                    \
    int r0 = 0;                                                                           \
    for (; r0 + COLUMN_BLOCKS * COLUMN_BLOCK <= rows;) {                                  \
        T uw = (T)(0.0f), ub = (T)(0.0f);                                                 \
        for (int k = 0; k < COLUMN_BLOCKS; ++k, r0 += COLUMN_BLOCK)                       \
            COLUMN_BLOCK_SUM(T, r0, r0 + COLUMN_BLOCK, uw, ub, G, H)                      \
        sw += uw;                                                                         \
        sb += ub;                                                                         \
    }                                                                                     \
    T uw = (T)(0.0f), ub = (T)(0.0f);                                                     \
    for (; r0 + COLUMN_BLOCK <= rows; r0 += COLUMN_BLOCK)                                 \
        COLUMN_BLOCK_SUM(T, r0, r0 + COLUMN_BLOCK, uw, ub, G, H)                          \
    COLUMN_BLOCK_SUM(T, r0, rows, uw, ub, G, H)                                           \
    sw += uw;                                                                             \
    sb += ub;                                                                             \
}
"""

SOURCE = ("//CL//\n" + f"#define WG {WG}\n" + VECTOR_TYPES + GROUP_SUM + GROUP_SUM2 + _SUMS
          + _variant("ln", 1) + _variant("rms", 0))



def _prefix(center: bool) -> str:
    return "ln" if center else "rms"


# Each launch's kernel name, made once (a name built anew is hashed anew at every launch)
_NAMES = {(center, op, kind): f"{_prefix(center)}_{op}_{kind}" for center in (True, False)
          for op in ("fwd", "bwd") for kind in ("wg", "rows8", "row")}


def _launch(q, center: bool, op: str, rows: int, D: int, *args,
            workgroup: bool | None = None, lanes: bool = True) -> None:
    """A row kernel: a work-group per row on GPUs (or ``workgroup=True``) where the launch is
    not too big for that (``use_workgroups``) and the device allows the kernel groups of WG
    (compiled in: its local memory is sized for them); otherwise 8 rows per work-item where
    the rows and D are whole multiples of 8 (``lanes=False`` forces the one-row kernel, for
    tests), else one row per work-item."""
    if workgroup is None:
        workgroup = (on_gpu(q) and use_workgroups(rows)
                     and kernel_limits(q, SOURCE, _NAMES[center, op, "wg"]).work_group >= WG)
    if workgroup:
        get_kernel(q, SOURCE, _NAMES[center, op, "wg"])(q, (rows * WG,), (WG,), *args)
    elif lanes and rows % 8 == 0 and D % 8 == 0:
        get_kernel(q, SOURCE, _NAMES[center, op, "rows8"])(
            q, (round_up(rows // 8, 16),), (16,), *args)
    else:
        get_kernel(q, SOURCE, _NAMES[center, op, "row"])(q, (round_up(rows, 16),), (16,),
                                                          *args)


def _buf(t: Tensor | None):
    return None if t is None else t.data


def norm_forward(x: Tensor, D: int, weight: Tensor | None, bias: Tensor | None, eps: float,
                 center: bool = True, *, workgroup: bool | None = None, lanes: bool = True
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """Normalise each run of ``D`` elements of ``x`` (``x.size // D`` rows), then ``* weight +
    bias`` (each ``D`` elements, or None). Returns ``(y, mean, rstd)``, the statistics
    ``(rows,)`` each; ``center=False`` is RMS norm (mean 0). ``workgroup`` forces the kernel
    variant (default: a work-group per row on a GPU, a work-item per row otherwise)."""
    q = x.queue
    rows = x.size // D if D else 0      # runs of no elements (x[:, T:]): nothing to normalise
    y = Tensor.empty(q, x.shape)
    mean, rstd = Tensor.empty(q, (rows,)), Tensor.empty(q, (rows,))
    # plain numbers: the kernel's declared types pack them as numpy's would
    _launch(q, center, "fwd", rows, D, y.data, mean.data, rstd.data, x.data, _buf(weight),
            _buf(bias), rows, D, eps, workgroup=workgroup, lanes=lanes)
    return y, mean, rstd


def norm_backward(x: Tensor, g: Tensor, D: int, mean: Tensor, rstd: Tensor,
                  weight: Tensor | None, center: bool = True, *, need_input: bool = True,
                  need_weight: bool = False, need_bias: bool = False,
                  weight_into: Tensor | None = None, bias_into: Tensor | None = None,
                  workgroup: bool | None = None, lanes: bool = True):
    """Gradients ``(gx, gw, gb)`` of ``norm_forward`` (None where not needed). ``weight_into``
    / ``bias_into``: existing gradients the parameter gradients are added into (then they are
    what is returned)."""
    q = x.queue
    rows = x.size // D if D else 0
    gx = gw = gb = None
    if need_input:
        gx = Tensor.empty(q, x.shape)
        _launch(q, center, "bwd", rows, D, gx.data, g.data, x.data, mean.data, rstd.data,
                _buf(weight), rows, D, workgroup=workgroup, lanes=lanes)
    if need_weight or need_bias:
        if need_weight:
            gw = weight_into if weight_into is not None else Tensor.empty(q, (D,))
        if need_bias:
            gb = bias_into if bias_into is not None else Tensor.empty(q, (D,))
        acc = (1 if weight_into is not None else 0) | (2 if bias_into is not None else 0)
        local = 64
        name, items = f"{_prefix(center)}_bwd_params", D
        if lanes and D % 8 == 0 and not on_gpu(q):
            name, items = name + "8", D // 8
        get_kernel(q, SOURCE, name)(
            q, (round_up(items, local),), (local,), _buf(gw), _buf(gb), g.data, x.data,
            mean.data, rstd.data, rows, D, acc)
    return gx, gw, gb

