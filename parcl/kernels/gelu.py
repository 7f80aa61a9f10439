"""GELU (exact erf form), forward ``x * Phi(x)`` and backward ``g * (Phi(x) + x * phi(x))``,
each in one kernel of whole vectors per work-item on CPUs.

The backward does the same operations in the same order as the four flat launches it replaces
(phi, times x, plus Phi, times g), each rounded on its own: separate statements, which PoCL
never contracts into an FMA across, and ``FP_CONTRACT OFF`` in their scope, since NVIDIA's
compiler does (the helpers they call keep the default, as the flat kernels do), and the forward
the same as the flat ``gelu`` launch, so both are bit for bit the elementwise kernels' results,
in one pass over memory.

Variants, chosen by device type:

* ``"vec16"`` / ``"vec8"`` (CPUs): a work-item takes 16 or 8 consecutive elements as one
  vector. PoCL 3.0 leaves the scalar form unvectorised (7x slower). ``vec16`` is one AVX-512
  register and twice as fast where PoCL compiles AVX-512 code, but LLVM 14 aborts the process
  on it when compiling for AVX2, so it is a CPU's default only after the float16 probe
  (``probe.wide_kernel_ok``) has built and checked it in a subprocess there.
* ``"one"`` (GPUs): a work-item takes one element, neighbours touching neighbouring words.
"""

from __future__ import annotations

from operator import attrgetter
from string import Template

import numpy as np
import pyopencl as cl

from ..errors import ShapeError
from ..runtime import is_gpu
from ..tensor import Tensor, check_same_queue
from ._cache import VECTOR_TYPES, chosen, get_kernel, round_up
from .clmath import NORMAL_CDF
from .elementwise import LOCAL, check_float
from .probe import wide_kernel_ok

VARIANTS = ("vec16", "vec8", "one")

# The vector kernels at width $W (8 or 16): exp and the normal CDF as in NORMAL_CDF, per lane.
_VECTOR = Template(r"""
typedef float float${W}u __attribute__((ext_vector_type(${W}), aligned(4)));
inline float${W} exp_poly${W}(const float${W} x0)
{
    const float${W} x = x0 < -87.0f ? -87.0f : (x0 > 88.0f ? 88.0f : x0);
    const float${W} v = x * 1.44269504088896341f + 0.5f;
    const int${W} t = convert_int${W}_rtz(v);
    const int${W} k = t + (v < convert_float${W}(t));   // floor(v): true is -1 in a vector
    const float${W} n = convert_float${W}(k);
    const float${W} r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const float${W} p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f)
                         * r + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    const float${W} e = (p * r * r + r + 1.0f) * as_float${W}((k + 127) << 23);
    return x0 < -87.0f ? (float${W})(0.0f) : e;       // as exp_poly: 0 below -87
}
inline float${W} normal_cdf${W}(const float${W} x)
{
    const float${W} z = (x < 0.0f ? -x : x) * M_SQRT1_2_F;
    const float${W} t = 1.0f / (1.0f + 0.5f * z);
    const float${W} e = t * exp_poly${W}(-z * z - 1.26551223f + t * (1.00002368f + t * (0.37409196f
        + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f
        + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f)))))))));
    const float${W} half_tail = 0.5f * e;
    return x < 0.0f ? half_tail : 1.0f - half_tail;
}
__kernel void gelu_forward_vec(__global float *out, __global const float *a, const int n)
{
    const int i = get_global_id(0);
    if (${W} * i + ${W} <= n) {
        const float${W} x = *(__global const float${W}u*)(a + ${W} * i);
        *(__global float${W}u*)(out + ${W} * i) = x * normal_cdf${W}(x);
    } else {
        for (int j = ${W} * i; j < n; ++j) out[j] = gelu1(a[j]);
    }
}
__kernel void gelu_backward_vec(__global float *out, __global const float *a,
                                __global const float *b, const int n)
{
    const int i = get_global_id(0);
    if (${W} * i + ${W} <= n) {
        #pragma OPENCL FP_CONTRACT OFF
        const float${W} x = *(__global const float${W}u*)(a + ${W} * i);
        float${W} d = exp_poly${W}(-0.5f * x * x) * 0.3989422804014327f;
        d = x * d;
        d = normal_cdf${W}(x) + d;
        *(__global float${W}u*)(out + ${W} * i) = *(__global const float${W}u*)(b + ${W} * i) * d;
    } else {
        for (int j = ${W} * i; j < n; ++j) out[j] = gelu_grad1(a[j], b[j]);
    }
}
""")

# One element per work-item (GPUs), and the vector kernels' tails.
_SCALAR = r"""
inline float gelu1(const float x)
{
    return x * normal_cdf(x);
}
inline float gelu_grad1(const float x, const float g)
{
    #pragma OPENCL FP_CONTRACT OFF
    float d = exp_poly(-0.5f * x * x) * 0.3989422804014327f;
    d = x * d;
    d = normal_cdf(x) + d;
    return g * d;
}
__kernel void gelu_forward_one(__global float *out, __global const float *a, const int n)
{
    const int i = get_global_id(0);
    if (i < n) out[i] = gelu1(a[i]);
}
__kernel void gelu_backward_one(__global float *out, __global const float *a,
                                __global const float *b, const int n)
{
    const int i = get_global_id(0);
    if (i < n) out[i] = gelu_grad1(a[i], b[i]);
}
"""

_PREFIX = "//CL//\n" + VECTOR_TYPES + NORMAL_CDF + _SCALAR
SOURCES = {"vec16": _PREFIX + _VECTOR.substitute(W=16),
           "vec8": _PREFIX + _VECTOR.substitute(W=8).replace(
               "typedef float float8u __attribute__((ext_vector_type(8), aligned(4)));", ""),
           "one": _PREFIX}
WIDTH = {"vec16": 16, "vec8": 8, "one": 1}      # elements per work-item


def choose_variant(device: cl.Device) -> str:
    """``"one"`` on GPUs; on CPUs ``"vec16"`` where its probe passed, else ``"vec8"``."""
    if is_gpu(device):
        return "one"
    return "vec16" if wide_kernel_ok(device, "gelu", SOURCES["vec16"]) else "vec8"


def gelu_forward(x: Tensor, *, variant: str | None = None) -> Tensor:
    """``x * Phi(x)`` (exact erf form); ``variant`` forces a kernel, for tests."""
    check_float("gelu", x)
    res = Tensor.empty(x.queue, x.shape)
    _launch("gelu_forward", variant, res, x)
    return res


def gelu_backward(x: Tensor, g: Tensor, *, variant: str | None = None) -> Tensor:
    """``g * (Phi(x) + x * phi(x))`` from gelu's input ``x`` (exact erf form); ``variant``
    forces a kernel, for tests."""
    if x.shape != g.shape:
        raise ShapeError(f"gelu_backward: saved tensor {x.shape} and gradient {g.shape} differ")
    check_float("gelu_backward", x, g)
    check_same_queue("gelu_backward", x, g)
    res = Tensor.empty(x.queue, x.shape)
    _launch("gelu_backward", variant, res, x, g)
    return res


_data = attrgetter("data")


def _launch(name: str, variant: str | None, res: Tensor, *inputs: Tensor) -> None:
    queue, n = res.queue, res.size
    if variant is None:
        variant = chosen(queue, "gelu", choose_variant)
    kind = "one" if variant == "one" else "vec"
    items = -(-n // WIDTH[variant])
    get_kernel(queue, SOURCES[variant], f"{name}_{kind}")(
        queue, (round_up(max(items, 1), LOCAL),), (LOCAL,), res.data,
        *map(_data, inputs), n)


def wide_check(queue: cl.CommandQueue) -> bool:
    """The float16 probe's check (run in its subprocess): ``vec16`` builds, and gives the
    bits of ``vec8``, forward and backward, tails included."""
    rng = np.random.default_rng(0)
    n = 16 * 5 + 7
    x = Tensor.from_host(queue, (rng.standard_normal(n) * 4).astype(np.float32))
    g = Tensor.from_host(queue, rng.standard_normal(n).astype(np.float32))
    return all(np.array_equal(f(*args, variant="vec16").to_host(),
                              f(*args, variant="vec8").to_host())
               for f, args in ((gelu_forward, (x,)), (gelu_backward, (x, g))))
