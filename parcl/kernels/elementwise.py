"""Elementwise kernels: in-place updates (axpy, scale_), copies.

One OpenCL program for the family; launchers enqueue on the first input's queue and never wait.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import elementwise as ew
>>> q = pc.default_queue()
>>> y = pc.Tensor.from_host(q, np.ones(3, np.float32))
>>> ew.axpy(y, pc.Tensor.from_host(q, np.arange(3, dtype=np.float32)), 2.0).to_host()
array([1., 3., 5.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor, check_same_queue
from ._cache import get_kernel

SOURCE = r"""//CL//
__kernel void axpy(__global float *y, __global const float *x, const float alpha,
                   const int n)
{
    int i = get_global_id(0);
    if (i < n) y[i] += alpha * x[i];
}

__kernel void scale(__global float *x, const float alpha, const int n)
{
    int i = get_global_id(0);
    if (i < n) x[i] *= alpha;
}
"""

LOCAL = 64


def _check_float(op: str, *ts: Tensor) -> None:
    for t in ts:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected a pc.Tensor, got {type(t).__name__}")
        if t.dtype != FLOAT:
            raise DTypeError(f"{op}: dtype {t.dtype} is not supported; elementwise kernels "
                             f"take float32 (shape {t.shape})")


def _global(n: int) -> tuple[int]:
    return ((n + LOCAL - 1) // LOCAL * LOCAL,)


def axpy(y: Tensor, x: Tensor, alpha: float = 1.0) -> Tensor:
    """``y += alpha * x`` in place (same number of elements); returns ``y``."""
    _check_float("axpy", y, x)
    if x.size != y.size:
        raise ShapeError(f"axpy: sizes differ: y {y.shape} and x {x.shape}")
    check_same_queue("axpy", y, x)
    k = get_kernel(y.queue, SOURCE, "axpy")
    k(y.queue, _global(y.size), (LOCAL,), y.data, x.data, np.float32(alpha), np.int32(y.size))
    return y


def scale_(x: Tensor, alpha: float) -> Tensor:
    """``x *= alpha`` in place; returns ``x``."""
    _check_float("scale_", x)
    k = get_kernel(x.queue, SOURCE, "scale")
    k(x.queue, _global(x.size), (LOCAL,), x.data, np.float32(alpha), np.int32(x.size))
    return x


def fill_(x: Tensor, value: float) -> Tensor:
    """Set every element of ``x`` to ``value`` in place; returns ``x``."""
    return x.fill_(value)


def copy(x: Tensor) -> Tensor:
    """A new tensor (from the pool) with ``x``'s contents."""
    return x.copy()
