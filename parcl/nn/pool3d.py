"""3-D pooling layers with PyTorch's names and arguments over ``(N, C, D, H, W)`` or unbatched
``(C, D, H, W)``: ``MaxPool3d``, ``AvgPool3d``, ``AdaptiveAvgPool3d``, ``AdaptiveMaxPool3d``,
``LPPool3d`` and ``MaxUnpool3d`` (``tp.max_pool3d`` ... ``tp.max_unpool3d``). The max pools'
``return_indices=True`` returns ``(output, indices)``: each maximum's int64 position ``(d * H
+ h) * W + w`` in its volume, as PyTorch's.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> x = tp.tensor(np.arange(64, dtype=np.float32).reshape(1, 1, 4, 4, 4))
>>> pc.nn.MaxPool3d(2)(x).shape, pc.nn.AdaptiveAvgPool3d(1)(x).to_host().ravel()
((1, 1, 2, 2, 2), array([31.5], dtype=float32))
"""

from __future__ import annotations

from ..tape import ops
from .layers import _AvgPool, _MaxPool
from .module import Module
from .pooling import _AdaptiveMax, _LPPool, _MaxUnpool

__all__ = ["AdaptiveAvgPool3d", "AdaptiveMaxPool3d", "AvgPool3d", "LPPool3d", "MaxPool3d",
           "MaxUnpool3d"]


class MaxPool3d(_MaxPool):
    """``MaxPool3d(kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
    ceil_mode=False)``; ints or triples, ``stride=None`` means ``kernel_size``."""

    op = staticmethod(ops.max_pool3d)


class AvgPool3d(_AvgPool):
    """``AvgPool3d(kernel_size, stride=None, padding=0, ceil_mode=False,
    count_include_pad=True, divisor_override=None)``, PyTorch's divisors (see
    ``tp.avg_pool3d``)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, x):
        return ops.avg_pool3d(x, self.kernel_size, stride=self.stride, padding=self.padding,
                              ceil_mode=self.ceil_mode,
                              count_include_pad=self.count_include_pad,
                              divisor_override=self.divisor_override)


class AdaptiveAvgPool3d(Module):
    """The mean of each adaptive window; ``output_size`` an int or a triple (``None`` keeps
    that dim's size)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return ops.adaptive_avg_pool3d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool3d(_AdaptiveMax):
    """The largest element of each adaptive window (the first, or the last NaN, as
    PyTorch's); ``return_indices=True`` also gives its flat position in the volume."""

    op = "adaptive_max_pool3d"


class LPPool3d(_LPPool):
    """``LPPool3d(norm_type, kernel_size, stride=None, ceil_mode=False)``: the power average
    ``(sum of x ** p over each window) ** (1/p)``."""

    op = "lp_pool3d"


class MaxUnpool3d(_MaxUnpool):
    """``MaxUnpool3d(kernel_size, stride=None, padding=0)``: ``unpool(input, indices,
    output_size=None)`` puts the values back where a ``MaxPool3d(..., return_indices=True)``
    found them, zeros elsewhere."""

    op, dims = "max_unpool3d", 3
