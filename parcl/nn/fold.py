"""PyTorch's ``Unfold`` (sliding windows as columns, im2col) and ``Fold`` (columns summed back
into images, col2im) over ``tp.unfold`` and ``tp.fold``; no parameters.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> cols = pc.nn.Unfold(kernel_size=2)(tp.tensor(np.ones((1, 3, 4, 4), np.float32)))
>>> cols.shape
(1, 12, 9)
>>> pc.nn.Fold(output_size=(4, 4), kernel_size=2)(cols).to_host()[0, 0]    # window counts
array([[1., 2., 2., 1.],
       [2., 4., 4., 2.],
       [2., 4., 4., 2.],
       [1., 2., 2., 1.]], dtype=float32)
"""

from __future__ import annotations

from ..tape import ops
from .module import Module

__all__ = ["Fold", "Unfold"]


class Unfold(Module):
    """``Unfold(kernel_size, dilation=1, padding=0, stride=1)``: ``(N, C, H, W)`` or
    ``(C, H, W)`` to ``(N, C*kh*kw, L)`` columns (``tp.unfold``)."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation = kernel_size, dilation
        self.padding, self.stride = padding, stride

    def forward(self, x):
        return ops.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class Fold(Module):
    """``Fold(output_size, kernel_size, dilation=1, padding=0, stride=1)``: ``(N, C*kh*kw,
    L)`` or ``(C*kh*kw, L)`` columns summed into ``(N, C) + output_size`` images
    (``tp.fold``)."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, x):
        return ops.fold(x, self.output_size, self.kernel_size, self.dilation, self.padding,
                        self.stride)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}")
