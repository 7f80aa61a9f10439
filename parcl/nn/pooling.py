"""Pooling layers beyond those in ``layers`` and ``conv``: PyTorch's ``AdaptiveAvgPool1d``,
``AdaptiveMaxPool1d`` and ``AdaptiveMaxPool2d`` over ``tp.adaptive_avg_pool1d``,
``tp.adaptive_max_pool1d`` and ``tp.adaptive_max_pool2d``, and the power-average pools
``LPPool1d`` and ``LPPool2d`` over ``tp.lp_pool1d`` and ``tp.lp_pool2d``. The
max pools' ``return_indices=True`` returns ``(output, indices)``: each maximum's int64 position
in its input plane, as PyTorch's.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> x = tp.tensor(np.arange(10, dtype=np.float32).reshape(1, 1, 10))
>>> pc.nn.AdaptiveMaxPool1d(3)(x).to_host()
array([[[3., 6., 9.]]], dtype=float32)
"""

from __future__ import annotations

from ..tape import ops
from .module import Module

__all__ = ["AdaptiveAvgPool1d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "LPPool1d",
           "LPPool2d"]


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
