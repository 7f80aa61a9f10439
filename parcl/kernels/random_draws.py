"""Counter-based uniform draws beside dropout's masks (``parcl/kernels/random.py``): RReLU's
random slopes, Gumbel noise and plain uniform numbers (fractional max pooling's samples).

Element ``i`` of call ``key`` is ``u = (top 24 bits of splitmix64(key + (i + 1) * golden) +
0.5) / 2**24``, strictly inside (0, 1), with ``key = random.mask_key(seed, counter)`` from the
dropout generator: a pure function of (seed, counter, i), the same on every device and
work-group size. The ``key`` argument sits at ``KEY_ARG`` of every kernel here, so a captured
step's replay can set a fresh one (``recorder.replay_arg``).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import random_draws as rd
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([-1.0, 2.0], np.float32))
>>> y, noise = rd.rrelu(x, 0.25, 0.25, key=1)
>>> y.to_host(), noise.to_host()
(array([-0.25,  2.  ], dtype=float32), array([0.25, 1.  ], dtype=float32))
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..tensor import FLOAT, Tensor
from ._cache import get_kernel, round_up
from .random import SOURCE as MASK_SOURCE

SOURCE = MASK_SOURCE + r"""
/* (i + 1): splitmix64(0) is 0, and seed 0's first key is 0 */
inline float uniform01(const ulong key, const long i)
{
    const uint bits = (uint)(splitmix64(key + (ulong)(i + 1) * 0x9E3779B97F4A7C15UL) >> 40);
    return ((float)bits + 0.5f) * (1.0f / 16777216.0f);
}

/* y = x * noise, noise 1 where x > 0, else a slope drawn uniformly in [lower, upper]. */
__kernel void rrelu_draw(__global const float* restrict x, __global float* restrict y,
                         __global float* restrict noise, const ulong key, const float lower,
                         const float upper, const long n)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    const float v = x[i];
    const float r = v > 0.0f ? 1.0f : lower + (upper - lower) * uniform01(key, i);
    noise[i] = r;
    y[i] = v * r;
}

/* out = u, uniform in (0, 1). */
__kernel void uniform_draw(__global float* restrict out, const ulong key, const long n)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    out[i] = uniform01(key, i);
}

/* out = -log(-log(u)): standard Gumbel noise. */
__kernel void gumbel_draw(__global float* restrict out, const ulong key, const long n)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    out[i] = -log(-log(uniform01(key, i)));
}
"""

RRELU_KEY_ARG = 3          # the ``key`` of ``rrelu_draw``
GUMBEL_KEY_ARG = 1         # the ``key`` of ``gumbel_draw``
UNIFORM_KEY_ARG = 1        # the ``key`` of ``uniform_draw``
LOCAL = 64


def rrelu(x: Tensor, lower: float, upper: float, key: int) -> tuple[Tensor, Tensor]:
    """``(y, noise)``: ``x`` times a slope per element (1 where positive, else uniform in
    ``[lower, upper]`` from ``key``), and those slopes (the gradient)."""
    if x.dtype != FLOAT:
        raise DTypeError(f"rrelu: input has dtype {x.dtype} (shape {x.shape}), expected "
                         "float32")
    y, noise = Tensor.empty(x.queue, x.shape), Tensor.empty(x.queue, x.shape)
    get_kernel(x.queue, SOURCE, "rrelu_draw")(
        x.queue, (round_up(x.size, LOCAL),), (LOCAL,), x.data, y.data, noise.data,
        np.uint64(key), np.float32(lower), np.float32(upper), np.int64(x.size))
    return y, noise


def uniform(queue, shape: tuple, key: int) -> Tensor:
    """Uniform numbers in (0, 1) of ``shape`` from ``key``."""
    out = Tensor.empty(queue, shape)
    get_kernel(queue, SOURCE, "uniform_draw")(
        queue, (round_up(out.size, LOCAL),), (LOCAL,), out.data, np.uint64(key),
        np.int64(out.size))
    return out


def gumbel(queue, shape: tuple, key: int) -> Tensor:
    """Standard Gumbel noise of ``shape`` from ``key``."""
    out = Tensor.empty(queue, shape)
    get_kernel(queue, SOURCE, "gumbel_draw")(
        queue, (round_up(out.size, LOCAL),), (LOCAL,), out.data, np.uint64(key),
        np.int64(out.size))
    return out
