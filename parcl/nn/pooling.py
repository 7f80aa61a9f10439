"""Pooling layers beyond those in ``layers`` and ``conv``: PyTorch's ``AdaptiveAvgPool1d``,
``AdaptiveMaxPool1d`` and ``AdaptiveMaxPool2d`` over ``tp.adaptive_avg_pool1d``,
``tp.adaptive_max_pool1d`` and ``tp.adaptive_max_pool2d``, the power-average pools
``LPPool1d`` and ``LPPool2d`` over ``tp.lp_pool1d`` and ``tp.lp_pool2d``, and ``MaxUnpool1d``
and ``MaxUnpool2d`` over ``tp.max_unpool1d`` and ``tp.max_unpool2d``. The
max pools' ``return_indices=True`` returns ``(output, indices)``: each maximum's int64 position
in its input plane, as PyTorch's.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> x = tp.tensor(np.arange(10, dtype=np.float32).reshape(1, 1, 10))
>>> pc.nn.AdaptiveMaxPool1d(3)(x).to_host()
array([[[3., 6., 9.]]], dtype=float32)
"""

from __future__ import annotations

from ..tape import ops
from ..tape.ops.unpool import unpool_tuple
from .module import Module

__all__ = ["AdaptiveAvgPool1d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "LPPool1d",
           "LPPool2d", "MaxUnpool1d", "MaxUnpool2d"]


class AdaptiveAvgPool1d(Module):
    """The mean of each of ``output_size`` adaptive windows of ``(N, C, L)`` or ``(C, L)``."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return ops.adaptive_avg_pool1d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _AdaptiveMax(Module):
    op = ""

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        self.output_size, self.return_indices = output_size, bool(return_indices)

    def forward(self, x):
        return getattr(ops, self.op)(x, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(_AdaptiveMax):
    """The largest element of each of ``output_size`` adaptive windows of ``(N, C, L)`` or
    ``(C, L)``; the gradient to the first largest, as PyTorch's; ``return_indices=True`` also
    gives its position in ``L``."""

    op = "adaptive_max_pool1d"


class AdaptiveMaxPool2d(_AdaptiveMax):
    """The largest element of each adaptive window of ``(N, C, H, W)`` or ``(C, H, W)``;
    ``output_size`` an int or a pair (``None`` keeps that dim's size); ``return_indices=True``
    also gives its flat position ``h * W + w`` in its plane."""

    op = "adaptive_max_pool2d"


class _LPPool(Module):
    op = ""

    def __init__(self, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
        super().__init__()
        self.norm_type, self.kernel_size, self.stride = norm_type, kernel_size, stride
        self.ceil_mode = bool(ceil_mode)

    def forward(self, x):
        return getattr(ops, self.op)(x, self.norm_type, self.kernel_size, self.stride,
                                     self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, ceil_mode={self.ceil_mode}")


class LPPool1d(_LPPool):
    """``(sum over each window of x ** norm_type) ** (1/norm_type)`` over ``(N, C, L)`` or
    ``(C, L)``; ``stride=None`` means ``kernel_size``."""

    op = "lp_pool1d"


class LPPool2d(_LPPool):
    """``LPPool1d``'s power average over the windows of ``(N, C, H, W)`` or ``(C, H, W)``."""

    op = "lp_pool2d"


class _MaxUnpool(Module):
    op, dims = "", 1

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        name = type(self).__name__
        self.kernel_size = unpool_tuple(name, "kernel_size", kernel_size, self.dims, 1)
        self.stride = self.kernel_size if stride is None else unpool_tuple(
            name, "stride", stride, self.dims, 1)
        self.padding = unpool_tuple(name, "padding", padding, self.dims, 0)

    def forward(self, input, indices, output_size=None):  # noqa: A002 - PyTorch's name
        return getattr(ops, self.op)(input, indices, self.kernel_size, self.stride,
                                     self.padding, output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpool):
    """``MaxUnpool1d(kernel_size, stride=None, padding=0)``: ``unpool(input, indices,
    output_size=None)`` puts ``(N, C, L)`` or ``(C, L)`` values back at the positions a
    ``MaxPool1d(..., return_indices=True)`` gave, zeros elsewhere."""

    op, dims = "max_unpool1d", 1


class MaxUnpool2d(_MaxUnpool):
    """``MaxUnpool2d(kernel_size, stride=None, padding=0)``: ``MaxUnpool1d``'s inverse of a
    ``MaxPool2d(..., return_indices=True)`` over ``(N, C, H, W)`` or ``(C, H, W)``."""

    op, dims = "max_unpool2d", 2
