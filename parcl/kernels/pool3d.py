"""The indices of a 3-D max pool run as two 2-D pools (over each depth plane, then over depth):
``join_positions`` turns the second pool's pick (a depth ``d`` and a plane output ``p``) and
the first pool's position in plane ``d`` (``h * W + w``) into PyTorch's flat ``(d * H + h) *
W + w``, on the device (int64 in, int64 out). A depth window that holds no input depth (all
padding, with a dilation) picks a ``d`` past the input, which has no plane to read: its
position is ``d * H*W`` plus the plane window's first ``h * W + w`` (``starts``), PyTorch's.

Work-items step through the outputs by the grid's size, so a grid of at most ``MAX_ITEMS``
covers any number of outputs (never 2^31 work-items); CPUs run few long work-items (about
one per ``CPU_RUN`` outputs), GPUs one output per work-item in groups of 256 (or of what the
device allows the kernel).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels.pool3d import join_positions
>>> q = pc.default_queue()
>>> depth = pc.Tensor.from_host(q, np.array([1 * 2 + 0, 0 * 2 + 1]))   # (d, p) of 2 outputs
>>> plane = pc.Tensor.from_host(q, np.array([3, 1, 2, 0]))            # D=2 planes of P=2
>>> starts = pc.Tensor.from_host(q, np.array([0, 2]))                # each plane window's first
>>> join_positions(depth, plane, starts, planes=1, od=1, d=2, p=2, hw=4).to_host()
array([6, 1])
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..runtime import on_gpu
from ..tensor import Tensor
from ._cache import get_kernel, gpu_group, round_up

SOURCE = r"""//CL//
// out[i], i = (nc * OD + od) * P + p: depth[i] = d * P + p (the depth pool's pick in the
// (D, P) plane of nc), plane[(nc * D + d) * P + p] = h * W + w (the plane pool's pick in
// plane d), so out[i] = d * HW + h * W + w. A d past the input (a depth window of padding
// only) has no plane: starts[p] is plane window p's first h * W + w, as PyTorch's.
__kernel void join_positions(__global const long* restrict depth,
                             __global const long* restrict plane,
                             __global const long* restrict starts, __global long* restrict out,
                             const long n, const int OD, const int D, const int P, const long HW)
{
    for (long i = get_global_id(0); i < n; i += get_global_size(0)) {
        const long nc = i / ((long)OD * P);
        const long p = i % P;
        const long d = depth[i] / P;
        out[i] = d * HW + (d < D ? plane[(nc * D + d) * P + p] : starts[p]);
    }
}
"""

MAX_ITEMS = 1 << 24          # a grid's work-items at most; each steps on by the grid's size
CPU_RUN = 4096               # outputs per work-item on CPUs (few long items, as pool's rows)


def _grid(queue, n: int, group: int = 256) -> tuple[int, int]:
    """(global, local) for ``n`` outputs, chosen by device type (on a GPU in groups of
    ``group``: what the device allows the kernel)."""
    if on_gpu(queue):
        return min(round_up(max(n, 1), group), MAX_ITEMS), group
    return min(round_up(-(-max(n, 1) // CPU_RUN), 16), MAX_ITEMS), 16


def join_positions(depth: Tensor, plane: Tensor, starts: Tensor, *, planes: int, od: int,
                   d: int, p: int, hw: int) -> Tensor:
    """The flat ``d * H*W + h * W + w`` of each of ``planes * od * p`` outputs (shaped as
    ``depth``) from the depth pool's int64 ``depth`` positions in ``(D, P)`` planes and the
    plane pool's int64 ``plane`` positions ``(planes * D, P)``; ``starts`` (int64, ``P``)
    is each plane window's first ``h * W + w``, the position of a depth past the input."""
    for name, t in (("depth", depth), ("plane", plane), ("starts", starts)):
        if t.dtype != np.int64:
            raise DTypeError(f"join_positions: {name} positions have dtype {t.dtype}, "
                             "expected int64")
    out = Tensor.empty(depth.queue, depth.shape, np.int64)
    n = planes * od * p
    if n == 0:
        return out
    g, loc = _grid(depth.queue, n, gpu_group(depth.queue, SOURCE, "join_positions", 256))
    get_kernel(depth.queue, SOURCE, "join_positions")(
        depth.queue, (g,), (loc,), depth.data, plane.data, starts.data, out.data, np.int64(n),
        np.int32(od), np.int32(d), np.int32(p), np.int64(hw))
    return out
