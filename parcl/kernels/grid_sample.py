"""``grid_sample``'s integer work: for each sampling point (source coordinates ``ix``, ``iy`` in
pixels), the flat positions ``y * W + x`` of the pixels it reads and whether each lies inside
the ``H x W`` input (the launcher of ``tp.grid_sample``, whose weights and gathers are tape
ops, so both gradients are theirs).

Bilinear points read four corners, in the order (y0, x0), (y0, x1), (y1, x0), (y1, x1) with
``x0 = floor(ix)``, ``x1 = x0 + 1``; nearest points one pixel, ``rint`` of each coordinate
(halves to even, as PyTorch's ``nearbyint``). A corner outside the input gets position 0 and
validity 0. Results are laid out ``(N, K, P)``: K corners of the P points of each sample.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import grid_sample as gsk
>>> q = pc.default_queue()
>>> ix, iy = (pc.Tensor.from_host(q, np.array([[v]], np.float32)) for v in (0.5, 1.0))
>>> index, valid = gsk.corners(ix, iy, 2, 2, nearest=False)
>>> index.to_host().ravel().tolist(), valid.to_host().ravel().tolist()
([2, 3, 0, 0], [1.0, 1.0, 0.0, 0.0])
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._cache import get_kernel, round_up

LOCAL = 64

SOURCE = r"""//CL//
__kernel void grid_corners(__global const float *ix, __global const float *iy,
                           __global int *index, __global float *valid, const long N,
                           const long P, const long H, const long W, const int nearest)
{
    const long g = get_global_id(0);
    if (g >= N * P) return;
    const long n = g / P, p = g % P;
    const int K = nearest ? 1 : 4;
    const float fx = nearest ? rint(ix[g]) : floor(ix[g]);
    const float fy = nearest ? rint(iy[g]) : floor(iy[g]);
    for (int k = 0; k < K; ++k) {
        const float x = fx + (float)(k & 1), y = fy + (float)(k >> 1);
        const bool inside = x >= 0.0f && x < (float)W && y >= 0.0f && y < (float)H;
        const long at = (n * K + k) * P + p;
        index[at] = inside ? (int)((long)y * W + (long)x) : 0;
        valid[at] = inside ? 1.0f : 0.0f;
    }
}
"""


def corners(ix: Tensor, iy: Tensor, height: int, width: int,
            nearest: bool) -> tuple[Tensor, Tensor]:
    """``(index, valid)``: int32 flat positions and float 0/1 validity, ``(N, K, P)``, of the
    pixels the points ``(ix, iy)`` (each ``(N, P)``, float32 pixel coordinates) read."""
    q = ix.queue
    n, p = ix.shape
    k = 1 if nearest else 4
    index = Tensor.empty(q, (n, k, p), np.int32)
    valid = Tensor.empty(q, (n, k, p))
    get_kernel(q, SOURCE, "grid_corners")(
        q, (round_up(n * p, LOCAL),), (LOCAL,), ix.data, iy.data, index.data, valid.data,
        np.int64(n), np.int64(p), np.int64(height), np.int64(width), np.int32(nearest))
    return index, valid
