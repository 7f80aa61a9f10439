"""Row normalisation kernels: layer norm and RMS norm over the last ``D`` elements of a
contiguous tensor viewed as ``(rows, D)``.

Forward saves each row's mean (0 for RMS norm) and inverse standard deviation ``rstd``; the
backward reads them instead of recomputing the statistics (Entrenar's LayerNorm metadata).
Statistics are two-pass (mean, then the mean of squared deviations), in a fixed order: on a
CPU a row is walked sequentially, 8 rows per work-item in the lanes of a vector where the rows
and D are whole multiples of 8 (4x faster than a work-item per row, whose lanes gather across
rows; the same bits); on a GPU one work-group takes a row, each work-item a fixed strided
share, combined by a fixed tree. Weight and bias gradients are column sums in
row order (one work-item per column; on CPUs 8 columns in the lanes of a vector, 6x faster),
so every result is bit-identical run to run.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import norm
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([[1.0, 3.0]], np.float32))
>>> y, mean, rstd = norm.norm_forward(x, 2, None, None, 0.0, center=True)
>>> y.to_host()
array([[-1.,  1.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..runtime import is_gpu
from ..tensor import Tensor
from ._cache import GROUP_SUM, VECTOR_TYPES, get_kernel, round_up

WG = 128      # work-group size of the GPU row kernels (a power of two)

def _variant(prefix: str, center: int) -> str:
    """The kernels of one normalisation: ``center`` 1 subtracts the mean (layer norm), 0 keeps
    it at zero (RMS norm). ``_row`` kernels take one row per work-item, ``_wg`` kernels one row
    per work-group of WG items; the two differ only in who sums which elements."""
    return f"""
__kernel void {prefix}_fwd_row(__global float *y, __global float *mean, __global float *rstd,
                               __global const float *x, __global const float *w,
                               __global const float *b, const int rows, const int D,
                               const float eps)
{{
    const int r = get_global_id(0);
    if (r >= rows) return;
    __global const float *xr = x + (long)r * D;
    __global float *yr = y + (long)r * D;
    float m = 0.0f;
    if ({center}) {{
        for (int j = 0; j < D; ++j) m += xr[j];
        m /= (float)D;
    }}
    float v = 0.0f;
    for (int j = 0; j < D; ++j) {{ const float d = xr[j] - m; v += d * d; }}
    const float rs = rsqrt(v / (float)D + eps);
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
    __local float scratch[WG];
    const int r = get_group_id(0), l = get_local_id(0);
    __global const float *xr = x + (long)r * D;
    __global float *yr = y + (long)r * D;
    float m = 0.0f;
    if ({center}) {{
        float s = 0.0f;
        for (int j = l; j < D; j += WG) s += xr[j];
        m = group_sum(s, scratch) / (float)D;
    }}
    float v = 0.0f;
    for (int j = l; j < D; j += WG) {{ const float d = xr[j] - m; v += d * d; }}
    const float rs = rsqrt(group_sum(v, scratch) / (float)D + eps);
    if (l == 0) {{ mean[r] = m; rstd[r] = rs; }}
    for (int j = l; j < D; j += WG) {{
        float h = (xr[j] - m) * rs;
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
    float s1 = 0.0f, s2 = 0.0f;
    for (int j = 0; j < D; ++j) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        s1 += gh;
        s2 += gh * h;
    }}
    s1 = {center} ? s1 / (float)D : 0.0f;
    s2 /= (float)D;
    for (int j = 0; j < D; ++j) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        gx[o + j] = rs * (gh - s1 - h * s2);
    }}
}}

__kernel void {prefix}_bwd_wg(__global float *gx, __global const float *g,
                              __global const float *x, __global const float *mean,
                              __global const float *rstd, __global const float *w,
                              const int rows, const int D)
{{
    __local float scratch[WG];
    const int r = get_group_id(0), l = get_local_id(0);
    const long o = (long)r * D;
    const float m = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (int j = l; j < D; j += WG) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        s1 += gh;
        s2 += gh * h;
    }}
    s1 = {center} ? group_sum(s1, scratch) / (float)D : 0.0f;
    s2 = group_sum(s2, scratch) / (float)D;
    for (int j = l; j < D; j += WG) {{
        const float h = (x[o + j] - m) * rs, gh = w ? g[o + j] * w[j] : g[o + j];
        gx[o + j] = rs * (gh - s1 - h * s2);
    }}
}}

/* The _row kernels on 8 rows per work-item, one row per vector lane (CPUs, D and the rows
   whole multiples of 8): an 8 x 8 block is read as 8 row vectors and turned into 8 column
   vectors (ROWS8, COL), so each lane sums its row in the _row kernels' order, statement
   for statement; the per-row rsqrt is the scalar one. Bit for bit the _row kernels, with
   contiguous loads where those gather across rows. */
__kernel void {prefix}_fwd_rows8(__global float *y, __global float *mean,
                                 __global float *rstd, __global const float *x,
                                 __global const float *w, __global const float *b,
                                 const int rows, const int D, const float eps)
{{
    const int r0 = 8 * get_global_id(0);
    if (r0 >= rows) return;
    __global const float *xr = x + (long)r0 * D;
    float8 m = (float8)(0.0f);
    if ({center}) {{
        for (int j = 0; j < D; j += 8) {{
            ROWS8(xr, j)
            m += COL(0); m += COL(1); m += COL(2); m += COL(3);
            m += COL(4); m += COL(5); m += COL(6); m += COL(7);
        }}
        m /= (float)D;
    }}
    float8 v = (float8)(0.0f);
    for (int j = 0; j < D; j += 8) {{
        ROWS8(xr, j)
        SQDEV(0) SQDEV(1) SQDEV(2) SQDEV(3) SQDEV(4) SQDEV(5) SQDEV(6) SQDEV(7)
    }}
    float ms[8], vs[8], rs[8];
    *(float8u*)ms = m;
    *(float8u*)vs = v;
    for (int i = 0; i < 8; ++i) {{
        rs[i] = rsqrt(vs[i] / (float)D + eps);
        mean[r0 + i] = ms[i];
        rstd[r0 + i] = rs[i];
    }}
    for (int i = 0; i < 8; ++i) {{
        __global const float *xi = xr + (long)i * D;
        __global float *yi = y + (long)(r0 + i) * D;
        for (int j = 0; j < D; j += 8) {{
            float8 h = (*(__global const float8u*)(xi + j) - ms[i]) * rs[i];
            if (w) h *= *(__global const float8u*)(w + j);
            if (b) h += *(__global const float8u*)(b + j);
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
    const long o = (long)r0 * D;
    const float8 m = *(__global const float8u*)(mean + r0);
    const float8 rs = *(__global const float8u*)(rstd + r0);
    float8 s1 = (float8)(0.0f), s2 = (float8)(0.0f);
    for (int j = 0; j < D; j += 8) {{
        ROWS8(x + o, j)
        const float8 q0 = *(__global const float8u*)(g + o + j);
        const float8 q1 = *(__global const float8u*)(g + o + D + j);
        const float8 q2 = *(__global const float8u*)(g + o + 2 * D + j);
        const float8 q3 = *(__global const float8u*)(g + o + 3 * D + j);
        const float8 q4 = *(__global const float8u*)(g + o + 4 * D + j);
        const float8 q5 = *(__global const float8u*)(g + o + 5 * D + j);
        const float8 q6 = *(__global const float8u*)(g + o + 6 * D + j);
        const float8 q7 = *(__global const float8u*)(g + o + 7 * D + j);
        GRADSUMS(0) GRADSUMS(1) GRADSUMS(2) GRADSUMS(3)
        GRADSUMS(4) GRADSUMS(5) GRADSUMS(6) GRADSUMS(7)
    }}
    s1 = {center} ? s1 / (float)D : (float8)(0.0f);
    s2 /= (float)D;
    float ms[8], rss[8], a1[8], a2[8];
    *(float8u*)ms = m;
    *(float8u*)rss = rs;
    *(float8u*)a1 = s1;
    *(float8u*)a2 = s2;
    for (int i = 0; i < 8; ++i) {{
        const long oi = o + (long)i * D;
        for (int j = 0; j < D; j += 8) {{
            const float8 h = (*(__global const float8u*)(x + oi + j) - ms[i]) * rss[i];
            const float8 gi = *(__global const float8u*)(g + oi + j);
            const float8 gh = w ? gi * *(__global const float8u*)(w + j) : gi;
            *(__global float8u*)(gx + oi + j) = rss[i] * (gh - a1[i] - h * a2[i]);
        }}
    }}
}}

/* Column sums in row order: gw[j] (+)= sum_r g[r, j] * h[r, j], gb[j] (+)= sum_r g[r, j]. */
__kernel void {prefix}_bwd_params(__global float *gw, __global float *gb,
                                  __global const float *g, __global const float *x,
                                  __global const float *mean, __global const float *rstd,
                                  const int rows, const int D, const int accumulate)
{{
    const int j = get_global_id(0);
    if (j >= D) return;
    float sw = 0.0f, sb = 0.0f;
    for (int r = 0; r < rows; ++r) {{
        const long o = (long)r * D + j;
        sw += g[o] * ((x[o] - mean[r]) * rstd[r]);
        sb += g[o];
    }}
    if (gw) gw[j] = (accumulate & 1) ? gw[j] + sw : sw;
    if (gb) gb[j] = (accumulate & 2) ? gb[j] + sb : sb;
}}

/* The same on 8 columns per work-item in the lanes of a vector (CPUs, D a multiple of 8):
   each lane sums its column in row order, statement for statement: the same bits. */
__kernel void {prefix}_bwd_params8(__global float *gw, __global float *gb,
                                   __global const float *g, __global const float *x,
                                   __global const float *mean, __global const float *rstd,
                                   const int rows, const int D, const int accumulate)
{{
    const int j = 8 * get_global_id(0);
    if (j >= D) return;
    float8 sw = (float8)(0.0f), sb = (float8)(0.0f);
    for (int r = 0; r < rows; ++r) {{
        const long o = (long)r * D + j;
        const float8 go = *(__global const float8u*)(g + o);
        sw += go * ((*(__global const float8u*)(x + o) - mean[r]) * rstd[r]);
        sb += go;
    }}
    if (gw) *(__global float8u*)(gw + j) = (accumulate & 1)
        ? *(__global const float8u*)(gw + j) + sw : sw;
    if (gb) *(__global float8u*)(gb + j) = (accumulate & 2)
        ? *(__global const float8u*)(gb + j) + sb : sb;
}}"""


# 8 rows from `base` (row stride D), columns j..j+7, as row vectors p0..p7; COL(c) is column
# j+c of the 8 rows, one row per lane.
_ROWS8 = r"""
#define ROWS8(base, j) \
    const float8 p0 = *(__global const float8u*)((base) + (j)); \
    const float8 p1 = *(__global const float8u*)((base) + D + (j)); \
    const float8 p2 = *(__global const float8u*)((base) + 2 * D + (j)); \
    const float8 p3 = *(__global const float8u*)((base) + 3 * D + (j)); \
    const float8 p4 = *(__global const float8u*)((base) + 4 * D + (j)); \
    const float8 p5 = *(__global const float8u*)((base) + 5 * D + (j)); \
    const float8 p6 = *(__global const float8u*)((base) + 6 * D + (j)); \
    const float8 p7 = *(__global const float8u*)((base) + 7 * D + (j));
#define COL(c) ((float8)(p0.s##c, p1.s##c, p2.s##c, p3.s##c, p4.s##c, p5.s##c, p6.s##c, p7.s##c))
#define GCOL(c) ((float8)(q0.s##c, q1.s##c, q2.s##c, q3.s##c, q4.s##c, q5.s##c, q6.s##c, q7.s##c))
#define SQDEV(c) { const float8 d = COL(c) - m; v += d * d; }
#define GRADSUMS(c) { const float8 h = (COL(c) - m) * rs, \
                                   gh = w ? GCOL(c) * w[j + c] : GCOL(c); \
                       s1 += gh; s2 += gh * h; }
"""

SOURCE = ("//CL//\n" + f"#define WG {WG}\n" + VECTOR_TYPES + _ROWS8 + GROUP_SUM
          + _variant("ln", 1) + _variant("rms", 0))


def _prefix(center: bool) -> str:
    return "ln" if center else "rms"


def _launch(q, name: str, rows: int, D: int, *args, workgroup: bool | None = None,
            lanes: bool = True) -> None:
    """A row kernel: a work-group per row on GPUs (or ``workgroup=True``); on CPUs 8 rows
    per work-item where the rows and D are whole multiples of 8 (``lanes=False`` forces the
    one-row kernel, for tests), else one row per work-item."""
    if workgroup is None:
        workgroup = is_gpu(q.device)
    if workgroup:
        get_kernel(q, SOURCE, f"{name}_wg")(q, (rows * WG,), (WG,), *args)
    elif lanes and rows % 8 == 0 and D % 8 == 0:
        get_kernel(q, SOURCE, f"{name}_rows8")(q, (round_up(rows // 8, 16),), (16,), *args)
    else:
        get_kernel(q, SOURCE, f"{name}_row")(q, (round_up(rows, 16),), (16,), *args)


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
    rows = x.size // D
    y = Tensor.empty(q, x.shape)
    mean, rstd = Tensor.empty(q, (rows,)), Tensor.empty(q, (rows,))
    _launch(q, f"{_prefix(center)}_fwd", rows, D, y.data, mean.data, rstd.data, x.data,
            _buf(weight), _buf(bias), np.int32(rows), np.int32(D), np.float32(eps),
            workgroup=workgroup, lanes=lanes)
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
    rows = x.size // D
    gx = gw = gb = None
    if need_input:
        gx = Tensor.empty(q, x.shape)
        _launch(q, f"{_prefix(center)}_bwd", rows, D, gx.data, g.data, x.data, mean.data,
                rstd.data, _buf(weight), np.int32(rows), np.int32(D), workgroup=workgroup,
                lanes=lanes)
    if need_weight or need_bias:
        if need_weight:
            gw = weight_into if weight_into is not None else Tensor.empty(q, (D,))
        if need_bias:
            gb = bias_into if bias_into is not None else Tensor.empty(q, (D,))
        acc = (1 if weight_into is not None else 0) | (2 if bias_into is not None else 0)
        local = 64
        name, items = f"{_prefix(center)}_bwd_params", D
        if lanes and D % 8 == 0 and not is_gpu(q.device):
            name, items = name + "8", D // 8
        get_kernel(q, SOURCE, name)(
            q, (round_up(items, local),), (local,), _buf(gw), _buf(gb), g.data, x.data,
            mean.data, rstd.data, np.int32(rows), np.int32(D), np.int32(acc))
    return gx, gw, gb

