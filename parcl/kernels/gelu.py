"""GELU's backward (exact erf form) in one kernel: ``g * (Phi(x) + x * phi(x))``.

The same operations in the same order as the four flat launches it replaces (phi, times x,
plus Phi, times g), each rounded on its own (separate statements: nothing is contracted into
an FMA across them), so the gradient is bit for bit the one those gave, in one pass over
memory instead of four. On CPUs a work-item takes 8 consecutive elements as a ``float8``:
PoCL 3.0 leaves the scalar form of this kernel unvectorised (7x slower than the flat
launches); on GPUs a work-item takes one element, neighbours touching neighbouring words.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..runtime import is_gpu
from ..tensor import Tensor, check_same_queue
from ._cache import VECTOR_TYPES, get_kernel, round_up
from .elementwise import LOCAL, NORMAL_CDF, check_float

VECTOR = 8            # elements per work-item on CPUs

SOURCE = "//CL//\n" + VECTOR_TYPES + NORMAL_CDF + r"""
inline float8 exp_poly8(float8 x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float8 v = x * 1.44269504088896341f + 0.5f;
    const int8 t = convert_int8_rtz(v);
    const int8 k = t + (v < convert_float8(t));       // floor(v): true is -1 in a vector
    const float8 n = convert_float8(k);
    const float8 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const float8 p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
                     + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    return (p * r * r + r + 1.0f) * as_float8((k + 127) << 23);
}
inline float8 normal_cdf8(const float8 x)
{
    const float8 z = (x < 0.0f ? -x : x) * M_SQRT1_2_F;
    const float8 t = 1.0f / (1.0f + 0.5f * z);
    const float8 e = t * exp_poly8(-z * z - 1.26551223f + t * (1.00002368f + t * (0.37409196f
        + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f
        + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f)))))))));
    const float8 half_tail = 0.5f * e;
    return x < 0.0f ? half_tail : 1.0f - half_tail;
}
inline float gelu_grad1(const float x, const float g)
{
    float d = exp_poly(-0.5f * x * x) * 0.3989422804014327f;
    d = x * d;
    d = normal_cdf(x) + d;
    return g * d;
}
__kernel void gelu_backward_vec(__global float *out, __global const float *a,
                                __global const float *b, const int n)
{
    const int i = get_global_id(0);
    if (VECTOR * i + VECTOR <= n) {
        const float8 x = *(__global const float8u*)(a + VECTOR * i);
        float8 d = exp_poly8(-0.5f * x * x) * 0.3989422804014327f;
        d = x * d;
        d = normal_cdf8(x) + d;
        *(__global float8u*)(out + VECTOR * i) = *(__global const float8u*)(b + VECTOR * i) * d;
    } else {
        for (int j = VECTOR * i; j < n; ++j) out[j] = gelu_grad1(a[j], b[j]);
    }
}
__kernel void gelu_backward_one(__global float *out, __global const float *a,
                                __global const float *b, const int n)
{
    const int i = get_global_id(0);
    if (i < n) out[i] = gelu_grad1(a[i], b[i]);
}
""".replace("VECTOR", str(VECTOR))


def gelu_backward(x: Tensor, g: Tensor, *, variant: str | None = None) -> Tensor:
    """``g * (Phi(x) + x * phi(x))`` from gelu's input ``x`` (exact erf form); ``variant``
    ``"vec"`` (CPUs' default) or ``"one"`` (GPUs') forces a kernel, for tests."""
    if x.shape != g.shape:
        raise ShapeError(f"gelu_backward: saved tensor {x.shape} and gradient {g.shape} differ")
    check_float("gelu_backward", x, g)
    check_same_queue("gelu_backward", x, g)
    res = Tensor.empty(x.queue, x.shape)
    n = res.size
    if variant is None:
        variant = "one" if is_gpu(x.queue.device) else "vec"
    items = -(-n // VECTOR) if variant == "vec" else n
    get_kernel(x.queue, SOURCE, "gelu_backward_" + variant)(
        x.queue, (round_up(items, LOCAL),), (LOCAL,), res.data, x.data, g.data, np.int32(n))
    return res
