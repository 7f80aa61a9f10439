"""Adaptive pooling layers beyond ``AdaptiveAvgPool2d`` (in ``layers``): PyTorch's
``AdaptiveAvgPool1d``, ``AdaptiveMaxPool1d`` and ``AdaptiveMaxPool2d`` over
``tp.adaptive_avg_pool1d``, ``tp.adaptive_max_pool1d`` and ``tp.adaptive_max_pool2d``. The
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

__all__ = ["AdaptiveAvgPool1d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d"]


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
