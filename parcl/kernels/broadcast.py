"""numpy broadcasting for the elementwise kernels: result shapes, element strides (0 along
broadcast dimensions) and the collapse of dimensions that are contiguous in every operand, so
a broadcast launch walks as few dimensions as it can (at most ``MAX_DIMS``)."""

from __future__ import annotations

import numpy as np
from pyopencl import cltypes

from ..errors import ShapeError

def broadcast_shapes(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of two shapes, or ShapeError naming ``op`` and both shapes."""
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"{op}: shapes {tuple(a)} and {tuple(b)} are not broadcastable "
                             "(numpy rules: trailing dimensions must be equal or 1)")
        out.append(y if x == 1 else x)
    return tuple(out)


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of a contiguous ``shape`` read as ``out_shape`` (0 where broadcast)."""
    n = len(out_shape)
    padded = (1,) * (n - len(shape)) + tuple(shape)
    strides, step = [0] * n, 1
    for k in range(n - 1, -1, -1):
        strides[k] = 0 if padded[k] == 1 else step
        step *= padded[k]
    return strides


def collapse_dims(shape, *strides_list) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dimensions and merge neighbours every stride list walks contiguously."""
    dims: list[int] = []
    out: list[list[int]] = [[] for _ in strides_list]
    for k, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(st[-1] == s[k] * size for st, s in zip(out, strides_list)):
            dims[-1] *= size
            for st, s in zip(out, strides_list):
                st[-1] = s[k]
            continue
        dims.append(size)
        for st, s in zip(out, strides_list):
            st.append(s[k])
    if not dims:
        dims = [1]
        out = [[0] for _ in strides_list]
    return dims, out


def int8_vector(values: list[int]):
    """Up to 8 dims or strides as the ``int8`` kernel argument, padded with 1s (built with
    numpy: ``cltypes.make_int8`` runs ``eval`` on every call, ~15 us). Read-only: a launch
    plan keeps it, and a kernel sets it once for every launch that passes this same array
    (``KernelArgs``)."""
    vector = np.array((*values, *[1] * (8 - len(values))), dtype=cltypes.int8)
    vector.flags.writeable = False
    return vector
