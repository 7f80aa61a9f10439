"""Scatter along one axis (``torch.scatter``, ``scatter_add``, ``index_add``), the gradient
of its source, and ``gather``'s backward (a ``scatter_add`` into zeros), each deterministic.

One work-item takes one line of ``index`` along the axis and walks it in order: no two
work-items share a line of the output, so repeated indices are applied in index order, with no
atomics. ``scatter_add`` sums them in that order (bit-identical run to run) and ``scatter``
keeps the last one along the axis (the highest position in ``index``). An index outside
``[0, out.shape[axis])`` is skipped and lowers a one-int flag (the flat position of the first
bad one in ``index``, or ``NO_ERROR``).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import scatter as sc
>>> q = pc.default_queue()
>>> x = pc.Tensor.zeros(q, (1, 3))
>>> i = pc.Tensor.from_host(q, np.array([[2, 0, 2]]))
>>> src = pc.Tensor.from_host(q, np.array([[1.0, 2.0, 4.0]], np.float32))
>>> sc.scatter(x, 1, i, src, "add")[0].to_host()
array([[2., 0., 5.]], dtype=float32)
>>> sc.scatter(x, 1, i, src, "set")[0].to_host()
array([[2., 0., 4.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, LABEL_DTYPES, Tensor, check_same_queue
from ._cache import get_kernel, round_up
from .broadcast import int8_vector
from .gather import _DECOMPOSE, NO_ERROR, _strides, _suffix

LOCAL = 64
MODES = {"set": 0, "add": 1}

_KERNELS = r"""
/* One work-item per line of index along the axis: out[line, index[line, j]] = (mode add:
   += ) scale * src[line, j] (or scale * value where src is null: use_value), j in order.
   d: the other dims of index; so, si, ss: the strides of out, index and src there. A null
   flag: gather's backward, whose forward reported its bad indices. */
__kernel void scatter_IT(__global float *out, __global const float *src,
                         __global const IT *index, __global int *flag, const int lines,
                         const int nd, const int8 d, const int8 so, const int8 si,
                         const int8 ss, const int len, const int soa, const int sia,
                         const int ssa, const int nx, const int mode, const float scale,
                         const int use_value, const float value)
{
    const int l = get_global_id(0);
    if (l >= lines) return;
    long oo = 0, oi = 0, os = 0, unused = 0;
    DECOMPOSE(l, nd, d, so, si, oo, oi);
    DECOMPOSE(l, nd, d, ss, ss, os, unused);
    for (int j = 0; j < len; ++j) {
        const long at = oi + (long)j * sia;
        const IT t = index[at];
        if (t < 0 || t >= nx) {
            if (flag) atomic_min(flag, (int)at);
            continue;
        }
        const float v = scale * (use_value ? value : src[os + (long)j * ssa]);
        const long o = oo + (long)t * soa;
        out[o] = mode ? out[o] + v : v;
    }
}

/* The gradient of src: gsrc[line, j] = scale * g[line, index[line, j]] (mode add), or, for
   set, only where j is the last position of the line to write that element (owner: scratch
   of g's shape; each line owns its elements of it, so no two work-items share one). */
__kernel void scatter_src_grad_IT(__global float *gsrc, __global const float *g,
                                  __global int *owner, __global const IT *index,
                                  const int lines, const int nd, const int8 d, const int8 so,
                                  const int8 si, const int8 ss, const int len, const int soa,
                                  const int sia, const int ssa, const int nx, const int mode,
                                  const float scale)
{
    const int l = get_global_id(0);
    if (l >= lines) return;
    long oo = 0, oi = 0, os = 0, unused = 0;
    DECOMPOSE(l, nd, d, so, si, oo, oi);
    DECOMPOSE(l, nd, d, ss, ss, os, unused);
    if (!mode) {
        for (int j = 0; j < len; ++j) {
            const IT t = index[oi + (long)j * sia];
            if (t >= 0 && t < nx) owner[oo + (long)t * soa] = j;
        }
    }
    for (int j = 0; j < len; ++j) {
        const IT t = index[oi + (long)j * sia];
        float v = 0.0f;
        if (t >= 0 && t < nx) {
            const long o = oo + (long)t * soa;
            if (mode || owner[o] == j) v = scale * g[o];
        }
        gsrc[os + (long)j * ssa] = v;
    }
}
"""

SOURCE = ("//CL//" + _DECOMPOSE + _KERNELS.replace("_IT(", "_i32(").replace("IT", "int")
          + _KERNELS.replace("_IT(", "_i64(").replace("IT", "long"))


def check_scatter(op: str, x: Tensor, axis: int, index: Tensor, src: Tensor | None) -> int:
    """Validate as ``torch.scatter`` does and return ``axis`` in ``[0, ndim)``: ``index`` of
    ``x``'s number of dims, no larger than ``src`` anywhere nor than ``x`` off the axis."""
    for what, t in (("input", x), ("src", src)):
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {what} {t.shape} has dtype {t.dtype}, expected float32")
    if index.dtype not in LABEL_DTYPES:
        raise DTypeError(f"{op}: index {index.shape} has dtype {index.dtype}, expected int32 "
                         "or int64")
    shapes = f"input {x.shape}, index {index.shape}" + (
        f", src {src.shape}" if src is not None else "")
    if index.ndim != x.ndim or (src is not None and src.ndim != x.ndim):
        raise ShapeError(f"{op}: input, index and src must have the same number of "
                         f"dimensions, got {shapes}")
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"{op}: dim {axis} is out of range for {shapes}")
    axis %= x.ndim
    for k in range(x.ndim):
        if (k != axis and index.shape[k] > x.shape[k]) or (
                src is not None and index.shape[k] > src.shape[k]):
            raise ShapeError(f"{op}: index is larger than {'input or ' if k != axis else ''}"
                             f"src in dimension {k} ({shapes}); index may not be")
    if x.ndim > 8:
        raise ShapeError(f"{op}: at most 8 dimensions are supported, got {shapes}")
    check_same_queue(op, *[t for t in (x, index, src) if t is not None])
    return axis


def _lines(out_shape, axis: int, index: Tensor, src_shape):
    """The launch arguments shared by both kernels: lines, dims and strides off the axis,
    the line length and the strides along it."""
    so, si, ss = _strides(out_shape), _strides(index.shape), _strides(src_shape)
    keep = [k for k in range(len(out_shape)) if k != axis]
    lines = index.size // index.shape[axis]
    return (np.int32(lines), np.int32(len(keep)), int8_vector([index.shape[k] for k in keep]),
            int8_vector([so[k] for k in keep]), int8_vector([si[k] for k in keep]),
            int8_vector([ss[k] for k in keep]), np.int32(index.shape[axis]),
            np.int32(so[axis]), np.int32(si[axis]), np.int32(ss[axis]),
            np.int32(out_shape[axis]))


def scatter(x: Tensor, axis: int, index: Tensor, src: Tensor | float, mode: str,
            scale: float = 1.0, *, op: str = "scatter", into: bool = False):
    """``(out, flag)``: a copy of ``x`` (``x`` itself with ``into``) with ``scale * src``
    written (``mode="set"``) or added (``"add"``) at ``index`` along ``axis``; ``src`` a
    tensor or a number. ``flag`` (int32, (1,)): ``NO_ERROR`` or the flat position in
    ``index`` of the first index out of range."""
    axis = check_scatter(op, x, axis, index, src if isinstance(src, Tensor) else None)
    out = x if into else x.copy()
    flag = Tensor.full(x.queue, (1,), NO_ERROR, np.int32)
    if index.size:                   # an empty index (idx[:, k:]) writes nothing: x as it is
        _launch(out, axis, index, src, mode, scale, flag)
    return out, flag


def gather_backward(g: Tensor, x_shape, axis: int, index: Tensor) -> Tensor:
    """The gradient of ``gather``'s ``x`` (``x_shape``) from ``g`` (``index``'s shape): zeros
    with ``g`` added at ``index`` along ``axis``, in index order (repeated indices sum
    bit-reproducibly); an index out of range, which the forward reported, adds nothing."""
    gx = Tensor.zeros(g.queue, tuple(x_shape))
    if index.size:
        _launch(gx, axis, index, g, "add", 1.0, None)
    return gx


def _launch(out: Tensor, axis: int, index: Tensor, src: Tensor | float, mode: str,
            scale: float, flag: Tensor | None) -> None:
    q = out.queue
    tensor = isinstance(src, Tensor)
    lines = index.size // index.shape[axis]
    get_kernel(q, SOURCE, "scatter_" + _suffix(index))(
        q, (round_up(lines, LOCAL),), (LOCAL,), out.data, (src if tensor else out).data,
        index.data, None if flag is None else flag.data,
        *_lines(out.shape, axis, index, src.shape if tensor else index.shape),
        np.int32(MODES[mode]), np.float32(scale), np.int32(not tensor),
        np.float32(0.0 if tensor else src))


def src_grad(g: Tensor, axis: int, index: Tensor, src_shape, mode: str,
             scale: float = 1.0) -> Tensor:
    """The gradient of ``scatter``'s ``src`` (of ``src_shape``) from the output's ``g``:
    ``scale * g`` at each index (``"add"``), or only where that position's value is the one
    that stayed (``"set"``: the last along the axis); zero where ``index`` does not reach."""
    q = g.queue
    gsrc = Tensor.zeros(q, tuple(src_shape))
    if not index.size:
        return gsrc
    owner = Tensor.empty(q, g.shape, np.int32) if mode == "set" else gsrc
    lines = index.size // index.shape[axis]
    get_kernel(q, SOURCE, "scatter_src_grad_" + _suffix(index))(
        q, (round_up(lines, LOCAL),), (LOCAL,), gsrc.data, g.data, owner.data, index.data,
        *_lines(g.shape, axis, index, src_shape), np.int32(MODES[mode]), np.float32(scale))
    return gsrc
