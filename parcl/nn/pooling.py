"""Adaptive pooling layers beyond ``AdaptiveAvgPool2d`` (in ``layers``): PyTorch's
``AdaptiveAvgPool1d``, ``AdaptiveMaxPool1d`` and ``AdaptiveMaxPool2d`` over
``tp.adaptive_avg_pool1d``, ``tp.adaptive_max_pool1d`` and ``tp.adaptive_max_pool2d``.
``return_indices=True`` is refused.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> x = tp.tensor(np.arange(10, dtype=np.float32).reshape(1, 1, 10))
>>> pc.nn.AdaptiveMaxPool1d(3)(x).to_host()
array([[[3., 6., 9.]]], dtype=float32)
"""

from __future__ import annotations

from ..errors import ShapeError
from ..tape import ops
from .module import Module

__all__ = ["AdaptiveAvgPool1d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d"]


class _Adaptive(Module):
    op = ""

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        if return_indices:
            raise ShapeError(f"{type(self).__name__}: return_indices=True is not supported")
        self.output_size, self.return_indices = output_size, False

    def forward(self, x):
        return getattr(ops, self.op)(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_Adaptive):
    """The mean of each of ``output_size`` adaptive windows of ``(N, C, L)`` or ``(C, L)``."""

    op = "adaptive_avg_pool1d"

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveMaxPool1d(_Adaptive):
    """The largest element of each of ``output_size`` adaptive windows of ``(N, C, L)`` or
    ``(C, L)``; the gradient to the first largest, as PyTorch's."""

    op = "adaptive_max_pool1d"


class AdaptiveMaxPool2d(_Adaptive):
    """The largest element of each adaptive window of ``(N, C, H, W)`` or ``(C, H, W)``;
    ``output_size`` an int or a pair (``None`` keeps that dim's size)."""

    op = "adaptive_max_pool2d"
