"""Row normalisation kernels: layer norm and RMS norm over the last ``D`` elements of a
contiguous tensor viewed as ``(rows, D)``.

Forward saves each row's mean (0 for RMS norm) and inverse standard deviation ``rstd``; the
backward reads them instead of recomputing the statistics (Entrenar's LayerNorm metadata).
Statistics are two-pass (mean, then the mean of squared deviations), in a fixed order: on a
CPU one work-item walks a row sequentially; on a GPU one work-group takes a row, each work-item
a fixed strided share, combined by a fixed tree. Weight and bias gradients are column sums in
row order (one work-item per column), so every result is bit-identical run to run.

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
from ._cache import GROUP_SUM, get_kernel, round_up

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
}}"""


SOURCE = "//CL//\n" + f"#define WG {WG}\n" + GROUP_SUM + _variant("ln", 1) + _variant("rms", 0)


def _prefix(center: bool) -> str:
    return "ln" if center else "rms"


def _launch(q, name: str, rows: int, *args, workgroup: bool | None = None) -> None:
    if workgroup is None:
        workgroup = is_gpu(q.device)
    if workgroup:
        get_kernel(q, SOURCE, f"{name}_wg")(q, (rows * WG,), (WG,), *args)
    else:
        get_kernel(q, SOURCE, f"{name}_row")(q, (round_up(rows, 16),), (16,), *args)


def _buf(t: Tensor | None):
    return None if t is None else t.data


def norm_forward(x: Tensor, D: int, weight: Tensor | None, bias: Tensor | None, eps: float,
                 center: bool = True, *, workgroup: bool | None = None
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """Normalise each run of ``D`` elements of ``x`` (``x.size // D`` rows), then ``* weight +
    bias`` (each ``D`` elements, or None). Returns ``(y, mean, rstd)``, the statistics
    ``(rows,)`` each; ``center=False`` is RMS norm (mean 0). ``workgroup`` forces the kernel
    variant (default: a work-group per row on a GPU, a work-item per row otherwise)."""
    q = x.queue
    rows = x.size // D
    y = Tensor.empty(q, x.shape)
    mean, rstd = Tensor.empty(q, (rows,)), Tensor.empty(q, (rows,))
    _launch(q, f"{_prefix(center)}_fwd", rows, y.data, mean.data, rstd.data, x.data,
            _buf(weight), _buf(bias), np.int32(rows), np.int32(D), np.float32(eps),
            workgroup=workgroup)
    return y, mean, rstd


def norm_backward(x: Tensor, g: Tensor, D: int, mean: Tensor, rstd: Tensor,
                  weight: Tensor | None, center: bool = True, *, need_input: bool = True,
                  need_weight: bool = False, need_bias: bool = False,
                  weight_into: Tensor | None = None, bias_into: Tensor | None = None,
                  workgroup: bool | None = None):
    """Gradients ``(gx, gw, gb)`` of ``norm_forward`` (None where not needed). ``weight_into``
    / ``bias_into``: existing gradients the parameter gradients are added into (then they are
    what is returned)."""
    q = x.queue
    rows = x.size // D
    gx = gw = gb = None
    if need_input:
        gx = Tensor.empty(q, x.shape)
        _launch(q, f"{_prefix(center)}_bwd", rows, gx.data, g.data, x.data, mean.data,
                rstd.data, _buf(weight), np.int32(rows), np.int32(D), workgroup=workgroup)
    if need_weight or need_bias:
        gw = gb = None
        if need_weight:
            gw = weight_into if weight_into is not None else Tensor.empty(q, (D,))
        if need_bias:
            gb = bias_into if bias_into is not None else Tensor.empty(q, (D,))
        acc = (1 if weight_into is not None else 0) | (2 if bias_into is not None else 0)
        local = 64
        get_kernel(q, SOURCE, f"{_prefix(center)}_bwd_params")(
            q, (round_up(D, local),), (local,), _buf(gw), _buf(gb), g.data, x.data, mean.data,
            rstd.data, np.int32(rows), np.int32(D), np.int32(acc))
    return gx, gw, gb

