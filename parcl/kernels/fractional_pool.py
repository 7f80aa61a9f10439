"""``fractional_max_pool2d``'s windows: for each output element, the flat position ``h * W + w``
of the largest input element of its pseudo-random window (the launcher of
``tp.fractional_max_pool2d``, which reads the values with ``gather``, so the gradient is
gather's deterministic scatter).

Each plane's windows start where PyTorch's ``generate_intervals`` puts them from the plane's two
samples ``u`` (width, then height) in [0, 1): ``start[i] = int((i + u) * a) - int(u * a)``,
``a = (in - k) / (out - 1)`` in float32, the last window ending at the input's edge; ties keep
the first maximum, a NaN wins (PyTorch's rule).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import fractional_pool as fpk
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
>>> u = pc.Tensor.from_host(q, np.zeros((1, 1, 2), np.float32))
>>> fpk.window_argmax(x, u, (2, 2), (2, 2)).to_host().tolist()
[[[5, 7, 13, 15]]]
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._cache import get_kernel, round_up

LOCAL = 64

SOURCE = r"""//CL//
inline int window_start(const float u, const int in, const int out, const int k, const int i)
{
    if (i == out - 1)
        return in - k;
    const float a = (float)(in - k) / (float)(out - 1);
    return (int)(((float)i + u) * a) - (int)(u * a);
}

__kernel void fractional_argmax(__global const float *x, __global const float *samples,
                                __global long *index, const long planes, const int H,
                                const int W, const int OH, const int OW, const int KH,
                                const int KW)
{
    const long g = get_global_id(0);
    if (g >= planes * OH * OW) return;
    const long plane = g / (OH * OW);
    const int o = (int)(g % (OH * OW)), oh = o / OW, ow = o % OW;
    const int h0 = window_start(samples[plane * 2 + 1], H, OH, KH, oh);
    const int w0 = window_start(samples[plane * 2], W, OW, KW, ow);
    __global const float *p = x + plane * (long)H * W;
    float best = -INFINITY;
    long at = (long)h0 * W + w0;
    for (int h = h0; h < h0 + KH; ++h)
        for (int w = w0; w < w0 + KW; ++w) {
            const float v = p[(long)h * W + w];
            if (v > best || isnan(v)) { best = v; at = (long)h * W + w; }
        }
    index[g] = at;
}
"""


def window_argmax(x: Tensor, samples: Tensor, kernel: tuple, out: tuple) -> Tensor:
    """int64 ``(N, C, OH * OW)``: each window's argmax in its ``H x W`` plane, for ``x``
    ``(N, C, H, W)`` and ``samples`` ``(N, C, 2)``."""
    q = x.queue
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = kernel, out
    index = Tensor.empty(q, (n, c, oh * ow), np.int64)
    get_kernel(q, SOURCE, "fractional_argmax")(
        q, (round_up(n * c * oh * ow, LOCAL),), (LOCAL,), x.data, samples.data, index.data,
        np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh), np.int32(ow), np.int32(kh),
        np.int32(kw))
    return index
