"""Counter-based random masks for dropout.

Element ``i`` of call ``(seed, counter)`` is kept when the top 24 bits of
``splitmix64(key + i * golden)`` (with ``key = splitmix64(seed * golden + counter)``, computed on
the host) are at least ``round(p * 2**24)``. The mask is a pure function of (seed, counter, i):
the backward regenerates it instead of storing it, and any device, work-group size or thread
produces the same bits.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import random as rnd
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.ones(8, np.float32))
>>> y = rnd.dropout_forward(x, 0.5, seed=1, counter=0)
>>> sorted(set(y.to_host().tolist())) in ([0.0, 2.0], [0.0], [2.0])
True
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor
from ._cache import get_kernel, round_up

SOURCE = r"""//CL//
inline ulong splitmix64(ulong z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
    return z ^ (z >> 31);
}

// y[i] = x[i] * scale when element i is kept, else 0 (also the backward: x = upstream grad).
__kernel void dropout(__global const float* restrict x, __global float* restrict y,
                      const ulong key, const uint threshold, const float scale, const long n)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    const uint bits = (uint)(splitmix64(key + (ulong)i * 0x9E3779B97F4A7C15UL) >> 40);
    y[i] = bits >= threshold ? x[i] * scale : 0.0f;
}

// mask[i] = 1 where kept, else 0 (for tests and inspection).
__kernel void dropout_mask(__global float* restrict mask, const ulong key, const uint threshold,
                           const long n)
{
    const long i = get_global_id(0);
    if (i >= n)
        return;
    const uint bits = (uint)(splitmix64(key + (ulong)i * 0x9E3779B97F4A7C15UL) >> 40);
    mask[i] = bits >= threshold ? 1.0f : 0.0f;
}
"""

LOCAL = 64
KEY_ARG = 2            # the ``key`` argument of ``dropout`` (a replay sets a fresh one)
_M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(z: int) -> int:
    """The host twin of the kernel's mixer (64-bit wrap-around)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def mask_key(seed: int, counter: int) -> int:
    """The per-call key of ``(seed, counter)``; never 0: the mixer's one fixed point is
    ``splitmix64(0) == 0``, so a key of 0 (seed 0, counter 0: every unseeded thread's first
    call) gave element 0 the bits 0, dropped whatever ``p``."""
    return splitmix64((int(seed) * GOLDEN + int(counter)) & _M64) or GOLDEN


def _params(p: float) -> tuple[np.uint32, np.float32]:
    if not 0.0 <= p <= 1.0:
        raise ShapeError(f"dropout: probability p must be in [0, 1], got {p}")
    threshold = int(round(p * (1 << 24)))
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return np.uint32(threshold), np.float32(scale)


def dropout_forward(x: Tensor, p: float, seed: int, counter: int) -> Tensor:
    """``x`` with each element zeroed with probability ``p``, the rest scaled by 1/(1-p)."""
    if x.dtype != FLOAT:
        raise DTypeError(f"dropout: input has dtype {x.dtype} (shape {x.shape}), expected "
                         "float32")
    threshold, scale = _params(p)
    y = Tensor.empty(x.queue, x.shape)
    get_kernel(x.queue, SOURCE, "dropout")(
        x.queue, (round_up(x.size, LOCAL),), (LOCAL,), x.data, y.data,
        np.uint64(mask_key(seed, counter)), threshold, scale, np.int64(x.size))
    return y


def dropout_backward(grad: Tensor, p: float, seed: int, counter: int) -> Tensor:
    """The gradient of ``dropout_forward``: the same mask (regenerated) and scale."""
    return dropout_forward(grad, p, seed, counter)


def dropout_mask(queue, shape, p: float, seed: int, counter: int) -> Tensor:
    """The 0/1 keep mask that ``dropout_forward`` uses for ``(seed, counter)``."""
    threshold, _ = _params(p)
    mask = Tensor.empty(queue, shape)
    get_kernel(queue, SOURCE, "dropout_mask")(
        queue, (round_up(mask.size, LOCAL),), (LOCAL,), mask.data,
        np.uint64(mask_key(seed, counter)), threshold, np.int64(mask.size))
    return mask
