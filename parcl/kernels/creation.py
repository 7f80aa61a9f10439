"""Tensors written from their index alone: ``arange``, ``linspace``, ``logspace``, ``eye`` and
the row and column indices of a triangle (the launchers of ``tp.arange`` ... ``tp.tril_indices``).

Every value is computed on the device from its position, so nothing of the output's size is
uploaded from the host. One work-item per element, except the triangles' (one per row).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import creation
>>> q = pc.default_queue()
>>> creation.arange(q, 1, 2, 3, np.int64).to_host()
array([1, 3, 5])
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..tensor import FLOAT, Tensor
from ._cache import chosen, get_kernel, round_up

LOCAL = 64

# T: the element type; A: the type the value is computed in (float for float32, long for ints)
_TYPED = r"""
__kernel void arange_T(__global T* out, const A start, const A step, const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = (T)(start + (A)i * step);
}

/* out: one grid of a meshgrid, x (n,) repeated along the dim whose inner size is inner */
__kernel void grid_T(__global T* out, __global const T* x, const int inner, const int n,
                     const int total)
{
    const int g = get_global_id(0);
    if (g < total)
        out[g] = x[(g / inner) % n];
}

/* out (n, m): 1 on the main diagonal, 0 elsewhere */
__kernel void eye_T(__global T* out, const int n, const int m)
{
    const int g = get_global_id(0);
    if (g < n * m)
        out[g] = (g / m == g % m) ? (T)1 : (T)0;
}
"""

_INDEXED = r"""
/* How many columns of row r a triangle holds: the lower one c <= r + offset, the upper one
   c >= r + offset, of the columns [0, col). */
inline long row_count(const int r, const int col, const int offset, const int upper)
{
    const long edge = (long)r + offset;
    if (upper)
        return col - clamp(edge, 0L, (long)col);
    return clamp(edge + 1, 0L, (long)col);
}

/* out (2, total): the rows then the columns of a triangle's elements, row by row; one
   work-item per row, which counts the elements of the rows above it for its start. */
__kernel void tri_indices_T(__global T* out, const int row, const int col, const int offset,
                            const int upper, const long total)
{
    const int r = get_global_id(0);
    if (r >= row)
        return;
    long start = 0;
    for (int k = 0; k < r; ++k)
        start += row_count(k, col, offset, upper);
    const long count = row_count(r, col, offset, upper);
    const long first = upper ? col - count : 0;
    for (long j = 0; j < count; ++j) {
        out[start + j] = (T)r;
        out[total + start + j] = (T)(first + j);
    }
}
"""

_SPACED = r"""
/* torch's linspace: from the start for the first half, back from the end for the rest, so
   both ends are exact; logspace raises base to it. */
__kernel void linspace(__global float* out, const float start, const float end,
                       const float step, const int n, const int halfway, const float base,
                       const int log)
{
    const int i = get_global_id(0);
    if (i >= n)
        return;
    const float v = i < halfway ? start + step * i : end - step * (n - i - 1);
    out[i] = log ? pow(base, v) : v;
}
"""

_TYPES = {np.dtype(np.float32): ("float", "float", "f32"),
          np.dtype(np.int32): ("int", "long", "i32"),
          np.dtype(np.int64): ("long", "long", "i64")}


def _typed(kernel: str) -> str:
    out = []
    for t, a, suffix in _TYPES.values():
        out.append(kernel.replace("_T(", f"_{suffix}(").replace("T", t).replace("(A)", f"({a})")
                   .replace("const A ", f"const {a} "))
    return "".join(out)


def _source() -> str:
    typed = _typed(_TYPED)
    tri_kernel = _INDEXED[_INDEXED.index("/* out (2, total)"):]
    helper = _INDEXED[:_INDEXED.index("/* out (2, total)")]
    tri = "".join(tri_kernel.replace("_T(", f"_{suffix}(").replace("T*", f"{t}*")
                  .replace("(T)", f"({t})")
                  for t, _, suffix in (("int", "", "i32"), ("long", "", "i64")))
    return "//CL//" + typed + helper + tri + _SPACED


SOURCE = _source()

# A float32 range and logspace computed in double where the device has it, rounded once, as
# PyTorch's (float32's start + i * step is off by an ulp of the largest term where the terms
# cancel; float32's pow by several).
# Its own program: a device without doubles never builds it.
DOUBLE_SOURCE = r"""//CL//
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void arange_f32(__global float* out, const double start, const double step,
                         const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = (float)(start + (double)i * step);
}

/* torch's logspace: base to the points of the float32 ends' linspace (the second half
   counted back from end), both computed in double and rounded once */
__kernel void logspace_f32(__global float* out, const double start, const double end,
                           const double step, const int n, const int halfway, const double base)
{
    const int i = get_global_id(0);
    if (i < n)
        out[i] = (float)pow(base, i < halfway ? start + step * i : end - step * (n - i - 1));
}
"""


def choose_arange(device) -> str:
    """``"double"`` where ``device`` computes in double (its ``cl_khr_fp64``), else
    ``"float"``."""
    return "double" if "cl_khr_fp64" in device.extensions.split() else "float"


def _suffix(op: str, dtype) -> str:
    dt = np.dtype(dtype)
    if dt not in _TYPES:
        raise DTypeError(f"{op}: dtype {dt} is not supported; parcl holds float32 data and "
                         "int32/int64 integers")
    return _TYPES[dt][2]


def _launch(q, name: str, n: int, *args, source: str = SOURCE) -> None:
    if n:                                # a launch of no work-items is an OpenCL error
        get_kernel(q, source, name)(q, (round_up(n, LOCAL),), (LOCAL,), *args)


def arange(q, start, step, n: int, dtype) -> Tensor:
    """``(n,)`` of ``start + i * step``: for float32 computed in double and rounded once where
    the device has doubles (PyTorch's values), else in float32; for ints in int64."""
    suffix = _suffix("arange", dtype)
    out = Tensor.empty(q, (n,), dtype)
    if out.dtype == FLOAT and chosen(q, "arange", choose_arange) == "double":
        _launch(q, "arange_f32", n, out.data, np.float64(start), np.float64(step),
                np.int32(n), source=DOUBLE_SOURCE)
        return out
    scalar = np.float32 if out.dtype == FLOAT else np.int64
    _launch(q, "arange_" + suffix, n, out.data, scalar(start), scalar(step), np.int32(n))
    return out


def linspace(q, start: float, end: float, steps: int, base: float | None = None) -> Tensor:
    """float32 ``(steps,)`` evenly spaced from ``start`` to ``end`` (both included), as
    ``torch.linspace``; with ``base``, ``base`` to that power (``torch.logspace``)."""
    out = Tensor.empty(q, (steps,))
    start32, end32 = np.float32(start), np.float32(end)
    if base is not None and chosen(q, "arange", choose_arange) == "double":
        # float32's pow is off by up to tens of ulps (1e-4 as 1.00000005e-4); torch's in double
        # is not. One step: base ** start, start not rounded to float32 first (torch's fill).
        step = np.float64(end32 - start32) / (steps - 1) if steps > 1 else 0.0
        first = np.float64(start if steps == 1 else start32)
        _launch(q, "logspace_f32", steps, out.data, first, np.float64(end32), step,
                np.int32(steps), np.int32(max(steps // 2, 1)), np.float64(base),
                source=DOUBLE_SOURCE)
        return out
    step = (end32 - start32) / np.float32(steps - 1) if steps > 1 else np.float32(0)
    _launch(q, "linspace", steps, out.data, start32, end32, np.float32(step),
            np.int32(steps), np.int32(max(steps // 2, 1)),     # one step: start
            np.float32(1.0 if base is None else base), np.int32(base is not None))
    return out


def eye(q, n: int, m: int, dtype) -> Tensor:
    """``(n, m)`` with ones on the main diagonal."""
    suffix = _suffix("eye", dtype)
    out = Tensor.empty(q, (n, m), dtype)
    _launch(q, "eye_" + suffix, n * m, out.data, np.int32(n), np.int32(m))
    return out


def grid(x: Tensor, shape: tuple, dim: int) -> Tensor:
    """A tensor of ``shape`` holding the 1-D ``x`` (``shape[dim]`` long) along ``dim``, the
    same at every position of the other dims (a meshgrid's grid of integers)."""
    suffix = _suffix("meshgrid", x.dtype)
    out = Tensor.empty(x.queue, shape, x.dtype)
    inner = int(np.prod(shape[dim + 1:], dtype=np.int64))
    _launch(x.queue, "grid_" + suffix, out.size, out.data, x.data, np.int32(max(inner, 1)),
            np.int32(max(shape[dim], 1)), np.int32(out.size))
    return out


def triangle_size(row: int, col: int, offset: int, upper: bool) -> int:
    """How many elements the triangle holds (torch's count, done here in closed form per
    row on the host: ``row`` additions, nothing of the output's size)."""
    total = 0
    for r in range(row):
        edge = r + offset
        total += col - min(max(edge, 0), col) if upper else min(max(edge + 1, 0), col)
    return total


def tri_indices(q, row: int, col: int, offset: int, upper: bool, dtype) -> Tensor:
    """``(2, N)``: the row indices then the column indices of the lower (upper) triangle's
    elements of a ``row x col`` matrix, row by row."""
    suffix = _suffix("tril_indices", dtype)
    if suffix == "f32":
        raise DTypeError("tril_indices: indices are int32 or int64, got float32")
    total = triangle_size(row, col, offset, upper)
    out = Tensor.empty(q, (2, total), dtype)
    if total:
        _launch(q, "tri_indices_" + suffix, row, out.data, np.int32(row), np.int32(col),
                np.int32(offset), np.int32(bool(upper)), np.int64(total))
    return out
