"""PyTorch's ``max_unpool1d`` and ``max_unpool2d``: the partial inverse of a max pool, each
value written back at the position its ``return_indices=True`` index names and zeros
elsewhere. The forward is the scatter kernel into zero ``(N*C, H*W)`` planes (where two indices
name one position, as overlapping pools give, the last along the plane stays: the same value
either way); the backward reads the upstream gradient at every index (the gather kernel), as
PyTorch's, so each of the duplicates gets it. Indices outside the plane are a ``ShapeError``,
checked as ``scatter``'s.

>>> y, where = tp.max_pool2d(x, 2, return_indices=True)        # x (1, 1, 4, 4)
>>> tp.max_unpool2d(y, where, 2).shape
(1, 1, 4, 4)
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import gather as gk
from ...kernels import scatter as sc
from ...tensor import Tensor
from ..node import Function
from .picks import _RangeCheck
from .shape import reshape

__all__ = ["max_unpool1d", "max_unpool2d"]


class MaxUnpool(Function):
    """``(planes, count)`` values at their ``(planes, count)`` indices in ``(planes, plane)``
    zeros; the gradient is the upstream gradient gathered at every index."""

    name = "max_unpool"

    def forward(self, x: Tensor, index: Tensor, plane: int = 1, op: str = "max_unpool2d"):
        out, flag = sc.scatter(Tensor.zeros(x.queue, (x.shape[0], plane)), 1, index, x, "set",
                               op=op, into=True)
        check = _RangeCheck(op, flag, index, plane, f"an output plane of {plane} positions",
                            lambda at: at)
        check.guard(out, not self.recording)
        self.index = index if self.recording else None
        return out

    def backward(self, g: Tensor):
        return gk.gather_forward(g, 1, self.index)[0], None


def unpool_tuple(op: str, name: str, value, dims: int, least: int) -> tuple[int, ...]:
    t = tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims
    if len(t) != dims or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                 and v >= least for v in t):
        want = "positive" if least else "non-negative"
        raise ShapeError(f"{op}: {name} must be a {want} int or {dims} of them, got {value!r}")
    return tuple(int(v) for v in t)


def _output_size(op: str, spatial: tuple, kernel, stride, padding, output_size) -> tuple:
    """PyTorch's ``_unpool_output_size``: the pool's input size by default, else the given
    spatial sizes (or whole shape), each strictly within a stride of the default."""
    default = tuple((n - 1) * s + k - 2 * p for n, k, s, p in zip(spatial, kernel, stride,
                                                                  padding))
    if output_size is None:
        size = default
    else:
        size = tuple(output_size)
        if len(size) == len(kernel) + 2:
            size = size[2:]
        if len(size) != len(kernel):
            raise ShapeError(f"{op}: output_size should hold {len(kernel)} or "
                             f"{len(kernel) + 2} sizes, got {output_size!r}")
        for d, (v, m, s) in enumerate(zip(size, default, stride)):
            if not m - s < v < m + s:
                raise ShapeError(f"{op}: invalid output_size {output_size!r} (dim {d} must be "
                                 f"between {m - s} and {m + s})")
    if any(v < 1 for v in size):
        raise ShapeError(f"{op}: output size {size} has an empty dim")
    return size


def _unpool(op: str, x, indices, kernel_size, stride, padding, output_size, dims: int, tape):
    if not isinstance(indices, Tensor) or indices.dtype != np.int64:
        raise DTypeError(f"{op}: indices must be the int64 pc.Tensor a max pool's "
                         f"return_indices=True gave, got "
                         f"{getattr(indices, 'dtype', type(indices).__name__)}")
    shape = tuple(x.shape)
    if len(shape) not in (dims + 1, dims + 2) or tuple(indices.shape) != shape:
        raise ShapeError(f"{op}: expected a {dims + 1}-d or {dims + 2}-d input and indices of "
                         f"its shape, got input {shape} and indices {tuple(indices.shape)}")
    kernel = unpool_tuple(op, "kernel_size", kernel_size, dims, 1)
    stride = kernel if stride is None else unpool_tuple(op, "stride", stride, dims, 1)
    padding = unpool_tuple(op, "padding", padding, dims, 0)
    size = _output_size(op, shape[-dims:], kernel, stride, padding, output_size)
    lead = shape[:-dims]
    planes, plane = int(np.prod(lead)), int(np.prod(size))
    count = int(np.prod(shape[-dims:]))
    y = MaxUnpool.apply(reshape(x, (planes, count), tape=tape), indices.reshape((planes, count)),
                        tape=tape, plane=plane, op=op)
    return reshape(y, lead + size, tape=tape)


def max_unpool2d(x, indices, kernel_size, stride=None, padding=0, output_size=None, *,
                 tape=None):
    """``F.max_unpool2d``: ``(N, C, H, W)`` or ``(C, H, W)`` values written at their
    ``indices`` (``h * W + w`` of the output plane) into zeros; the output is ``(H - 1) *
    stride - 2 * padding + kernel`` high (likewise wide) unless ``output_size`` says (within a
    stride of that)."""
    return _unpool("max_unpool2d", x, indices, kernel_size, stride, padding, output_size, 2,
                   tape)


def max_unpool1d(x, indices, kernel_size, stride=None, padding=0, output_size=None, *,
                 tape=None):
    """``F.max_unpool1d`` of ``(N, C, L)`` or ``(C, L)`` values at their ``indices`` in the
    output length."""
    return _unpool("max_unpool1d", x, indices, kernel_size, stride, padding, output_size, 1,
                   tape)
