"""Random draws on the device: uniform, normal, integers, Bernoulli trials, permutation and
multinomial keys, RReLU's slopes and Gumbel noise (the launchers of ``tp.rand``, ``tp.randn``,
``tp.randint``, ``tp.bernoulli``, ``tp.randperm``, ``tp.multinomial``, ``tp.rrelu``,
``tp.gumbel_softmax`` and ``tp.fractional_max_pool2d``'s samples).

Element ``i`` of a call is a pure function of the call's 64-bit ``key`` and ``i``: the bits
``splitmix64(key + i * golden)`` of dropout's masks (``parcl.kernels.random``), so any device,
work-group size or thread draws the same values. The caller gives ``next_key()``, which takes
the key of the next call from its generator; inside a captured step every replay calls it
again (``recorder.replay_arg``), so a replay draws fresh values, as the eager call would.

A uniform value is the top 24 bits over ``2**24`` (``[0, 1)``, every float32 of that grid); a
normal one is Box-Muller of two 24-bit uniforms (so ``|z| < 5.9``); an integer in a span of
``s`` is ``low + mul_hi(bits, s)``. RReLU's slopes, Gumbel noise and ``open_uniform`` are
on the open grid ``(0, 1)`` (the 24-bit grid moved by half a step), so their logarithms are
finite; they read the bits of ``i + 1``, only to keep the values they always drew.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import draws
>>> q = pc.default_queue()
>>> u = draws.uniform(pc.Tensor.empty(q, (1000,)), 0.0, 1.0, lambda: np.uint64(7))
>>> 0.4 < float(u.mean()) < 0.6
True
"""

from __future__ import annotations

import numpy as np

from .. import recorder
from ..errors import DTypeError
from ..tensor import FLOAT, Tensor
from . import random as rnd
from ._cache import get_kernel, round_up

LOCAL = 64
KEY_ARG = 1            # every kernel here takes its key second (a replay sets a fresh one)
NO_ERROR = np.iinfo(np.int32).max

_DRAWS = r"""
inline ulong draw_bits(const ulong key, const int i)
{
    return splitmix64(key + (ulong)i * 0x9E3779B97F4A7C15UL);
}

/* [0, 1): the top 24 bits; (0, 1): the same grid moved by half a step (for logarithms) */
inline float unit(const ulong bits) { return (float)(bits >> 40) * 0x1p-24f; }
inline float open_unit(const ulong bits) { return ((float)(bits >> 40) + 0.5f) * 0x1p-24f; }

/* low + span * u rounds up onto high where it crosses a power of two (uniform_(1, 2): 2.0)
   or the span is a few ulps of low: top, the float below high, keeps it in [low, high) */
__kernel void uniform(__global float* out, const ulong key, const float low, const float span,
                      const float top, const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = fmin(low + span * unit(draw_bits(key, i)), top);
}

/* Box-Muller: the radius from the top 24 bits, the angle from the next 24 */
__kernel void normal(__global float* out, const ulong key, const float mean, const float std,
                     const int n)
{
    const int i = get_global_id(0);
    if (i >= n)
        return;
    const ulong bits = draw_bits(key, i);
    const float angle = (float)((bits >> 16) & 0xFFFFFFUL) * 0x1p-24f;
    out[i] = mean + std * sqrt(-2.0f * log(open_unit(bits))) * cospi(2.0f * angle);
}

/* 1 with probability p[i] (p == 0: never, p == 1: always), else 0 */
__kernel void bernoulli(__global float* out, const ulong key, __global const float* p,
                        const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = unit(draw_bits(key, i)) < p[i] ? 1.0f : 0.0f;
}

/* rrelu, open_uniform and gumbel draw element i from the bits of i + 1, where the others use
   i: nothing needs it (open_unit maps bits 0, seed 0's first key's element 0, inside (0, 1)),
   but it keeps the streams these ops always drew, so seeded runs give the same values */

/* noise: 1 where x > 0, else a slope uniform in [lower, upper]; y = x * noise (the slopes
   are the gradient) */
__kernel void rrelu(__global float* noise, const ulong key, __global const float* x,
                    __global float* y, const float lower, const float upper, const int n)
{
    const int i = get_global_id(0);
    if (i >= n)
        return;
    const float v = x[i];
    const float r = v > 0.0f ? 1.0f : lower + (upper - lower) * open_unit(draw_bits(key, i + 1));
    noise[i] = r;
    y[i] = v * r;
}

__kernel void open_uniform(__global float* out, const ulong key, const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = open_unit(draw_bits(key, i + 1));
}

/* standard Gumbel noise -log(-log(u)) */
__kernel void gumbel(__global float* out, const ulong key, const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = -log(-log(open_unit(draw_bits(key, i + 1))));
}

/* Keys whose ascending order is a uniform permutation: non-negative finite floats from 31
   random bits (their order is their bits' order, so ties are rare even for long ranges) */
__kernel void permutation_keys(__global float* out, const ulong key, const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = as_float((uint)(draw_bits(key, i) >> 33) % 0x7F800000u);
}

/* Gumbel keys log(p) - log(-log(u)): the k largest of a row are k draws without
   replacement, in the order they are drawn (p == 0: -inf, never before a positive p) */
__kernel void gumbel_keys(__global float* out, const ulong key, __global const float* p,
                          const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = log(p[i]) - log(-log(open_unit(draw_bits(key, i))));
}

/* out (rows, m): per row, the first k with cdf[k] > u * cdf[K - 1] (a binary search of
   the row's inclusive cumulative sums); a u rounded up onto the total takes the last
   category of positive probability */
__kernel void multinomial(__global long* out, const ulong key, __global const float* cdf,
                          const int rows, const int K, const int m)
{
    const int g = get_global_id(0);
    if (g >= rows * m)
        return;
    __global const float* c = cdf + (long)(g / m) * K;
    const float target = unit(draw_bits(key, g)) * c[K - 1];
    int lo = 0, hi = K;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (c[mid] > target)
            hi = mid;
        else
            lo = mid + 1;
    }
    int k = min(lo, K - 1);
    while (k > 0 && c[k] == c[k - 1])
        --k;
    out[g] = k;
}

/* flag[0]: the first element that is negative, inf or NaN; flag[1]: the first row whose sum
   is not positive. One work-item per row, adding in order. */
__kernel void check_probabilities(__global const float* p, __global int* flag, const int rows,
                                  const int K)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
        const float v = p[(long)r * K + k];
        if (!(v >= 0.0f && v <= FLT_MAX)) {
            atomic_min(&flag[0], r * K + k);
            return;
        }
        sum += v;
    }
    if (!(sum > 0.0f))
        atomic_min(&flag[1], r);
}

/* flag: the first element outside [lo, hi] (NaN too) */
__kernel void check_range(__global const float* x, __global int* flag, const float lo,
                          const float hi, const int n)
{
    const int i = get_global_id(0);
    if (i < n && !(x[i] >= lo && x[i] <= hi))
        atomic_min(flag, i);
}
"""

_INTEGERS = r"""
__kernel void randint_SUFFIX(__global T* out, const ulong key, const long low, const ulong span,
                             const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = (T)(low + (long)mul_hi(draw_bits(key, i), span));
}
"""

_INT_TYPES = {np.dtype(np.float32): ("float", "f32"), np.dtype(np.int32): ("int", "i32"),
              np.dtype(np.int64): ("long", "i64")}

SOURCE = (rnd.SOURCE + _DRAWS
          + "".join(_INTEGERS.replace("SUFFIX", s).replace("T*", f"{t}*").replace("(T)", f"({t})")
                    for t, s in _INT_TYPES.values()))


def _launch(q, name: str, n: int, *args, next_key=None) -> None:
    """Launch ``name`` over ``n`` work-items; with ``next_key`` its key (argument 1) is the
    generator's next, drawn again by every replay of a captured step."""
    if not n:                        # a launch of no work-items is an OpenCL error
        return
    if next_key is not None:
        args = (args[0], next_key(), *args[1:])
    get_kernel(q, SOURCE, name)(q, (round_up(n, LOCAL),), (LOCAL,), *args)
    if next_key is not None:
        recorder.replay_arg(KEY_ARG, next_key)


def _float_out(op: str, out: Tensor) -> None:
    if out.dtype != FLOAT:
        raise DTypeError(f"{op}: draws float32 values, the tensor {out.shape} is {out.dtype}")


def uniform(out: Tensor, low: float, high: float, next_key) -> Tensor:
    """``out`` filled with U(low, high) draws (``low + (high - low) * u``, u in [0, 1)), each
    in ``[low, high)`` (``low`` where they are one float32)."""
    _float_out("uniform", out)
    low32, high32 = np.float32(low), np.float32(high)
    top = np.nextafter(high32, low32) if low32 < high32 else high32
    _launch(out.queue, "uniform", out.size, out.data, low32, np.float32(high - low), top,
            np.int32(out.size), next_key=next_key)
    return out


def normal(out: Tensor, mean: float, std: float, next_key) -> Tensor:
    """``out`` filled with N(mean, std^2) draws."""
    _float_out("normal", out)
    _launch(out.queue, "normal", out.size, out.data, np.float32(mean), np.float32(std),
            np.int32(out.size), next_key=next_key)
    return out


def randint(out: Tensor, low: int, high: int, next_key) -> Tensor:
    """``out`` filled with integers uniform in ``[low, high)`` (``high > low``)."""
    if out.dtype not in _INT_TYPES:
        raise DTypeError(f"randint: dtype {out.dtype} is not supported (float32, int32, int64)")
    _launch(out.queue, "randint_" + _INT_TYPES[out.dtype][1], out.size, out.data,
            np.int64(low), np.uint64(high - low), np.int32(out.size), next_key=next_key)
    return out


def bernoulli(out: Tensor, p: Tensor, next_key) -> Tensor:
    """``out`` (float32) of 1 with probability ``p`` (same size), else 0."""
    _float_out("bernoulli", out)
    _launch(out.queue, "bernoulli", out.size, out.data, p.data, np.int32(out.size),
            next_key=next_key)
    return out


def rrelu(x: Tensor, lower: float, upper: float, next_key) -> tuple[Tensor, Tensor]:
    """``(y, noise)``: ``x`` times a slope per element (1 where positive, else uniform in
    ``[lower, upper]``), and those slopes (the gradient)."""
    if x.dtype != FLOAT:
        raise DTypeError(f"rrelu: input has dtype {x.dtype} (shape {x.shape}), expected "
                         "float32")
    y, noise = Tensor.empty(x.queue, x.shape), Tensor.empty(x.queue, x.shape)
    _launch(x.queue, "rrelu", x.size, noise.data, x.data, y.data, np.float32(lower),
            np.float32(upper), np.int32(x.size), next_key=next_key)
    return y, noise


def _drawn(q, name: str, shape: tuple, next_key) -> Tensor:
    """A float32 tensor of ``shape`` that kernel ``name`` fills with draws."""
    out = Tensor.empty(q, shape)
    _launch(q, name, out.size, out.data, np.int32(out.size), next_key=next_key)
    return out


def open_uniform(q, shape: tuple, next_key) -> Tensor:
    """Uniform float32 numbers in (0, 1) of ``shape``."""
    return _drawn(q, "open_uniform", shape, next_key)


def gumbel(q, shape: tuple, next_key) -> Tensor:
    """Standard Gumbel noise of ``shape``."""
    return _drawn(q, "gumbel", shape, next_key)


def permutation_keys(q, n: int, next_key) -> Tensor:
    """``(n,)`` float32 keys that ``argsort`` turns into a uniform random permutation."""
    return _drawn(q, "permutation_keys", (n,), next_key)


def gumbel_keys(p: Tensor, next_key) -> Tensor:
    """``log(p) - log(-log(u))`` per element of the probabilities ``p``."""
    keys = Tensor.empty(p.queue, p.shape)
    _launch(p.queue, "gumbel_keys", p.size, keys.data, p.data, np.int32(p.size),
            next_key=next_key)
    return keys


def multinomial(cdf: Tensor, m: int, next_key) -> Tensor:
    """``(rows, m)`` int64 category draws with replacement from each row of ``cdf`` (rows,
    K), the inclusive cumulative sums of the probabilities."""
    rows, k = cdf.shape
    out = Tensor.empty(cdf.queue, (rows, m), np.int64)
    _launch(cdf.queue, "multinomial", rows * m, out.data, cdf.data, np.int32(rows),
            np.int32(k), np.int32(m), next_key=next_key)
    return out


def check_probabilities(p: Tensor) -> Tensor:
    """int32 ``(2,)`` flag of ``p`` (rows, K): the first element that is negative, inf or
    NaN, and the first row whose sum is not positive (``NO_ERROR`` where none)."""
    rows, k = p.shape
    flag = Tensor.full(p.queue, (2,), NO_ERROR, np.int32)
    _launch(p.queue, "check_probabilities", rows, p.data, flag.data, np.int32(rows),
            np.int32(k))
    return flag


def check_range(x: Tensor, lo: float, hi: float) -> Tensor:
    """int32 ``(1,)`` flag: the first element of ``x`` outside ``[lo, hi]`` (NaN too), or
    ``NO_ERROR``."""
    flag = Tensor.full(x.queue, (1,), NO_ERROR, np.int32)
    _launch(x.queue, "check_range", x.size, x.data, flag.data, np.float32(lo), np.float32(hi),
            np.int32(x.size))
    return flag
