"""Convolution layers beyond ``Conv2d``: ``ConvTranspose2d``.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> up = pc.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.ones((1, 4, 5, 5), np.float32))
>>> with tp.no_grad():
...     up(x).shape
(1, 2, 10, 10)
"""

from __future__ import annotations

import math

from ..errors import ShapeError
from ..runtime import default_queue
from ..tape import ops
from .layers import _arg, _check_features, _check_sizes, _pair, _param
from .module import Module, uniform_

__all__ = ["ConvTranspose2d"]


class ConvTranspose2d(Module):
    """Transposed 2-d convolution over ``(N, C, H, W)`` (``tp.conv_transpose2d``); weight
    ``(cin, cout, kh, kw)`` as PyTorch. Initialisation as PyTorch's ``_ConvNd``: weight and
    bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with ``fan_in = weight.size(1)*kh*kw =
    cout*kh*kw`` (kaiming_uniform with a=sqrt(5) reads the fan-in from the weight's dim 1).
    Output height ``(H - 1)*stride - 2*padding + kh + output_padding``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, bias: bool = True, *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        _check_sizes("ConvTranspose2d", {"in_channels": in_channels,
                                         "out_channels": out_channels})
        self.kernel_size = _pair("ConvTranspose2d", "kernel_size", kernel_size)
        self.stride = _pair("ConvTranspose2d", "stride", stride)
        self.padding = _pair("ConvTranspose2d", "padding", padding, least=0)
        self.output_padding = _pair("ConvTranspose2d", "output_padding", output_padding,
                                    least=0)
        if any(o >= s for o, s in zip(self.output_padding, self.stride)):
            raise ShapeError(f"ConvTranspose2d: output_padding {self.output_padding} must be "
                             f"smaller than the stride {self.stride} (as PyTorch)")
        fan_in = self.out_channels * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = _param(queue, uniform_((self.in_channels, self.out_channels)
                                             + self.kernel_size, bound))
        if bias:
            self.bias = _param(queue, uniform_((self.out_channels,), bound))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        _check_features(self, x, 1, self.in_channels, (4,))
        return ops.conv_transpose2d(x, self.weight, self.bias, stride=_arg(self.stride),
                                    padding=_arg(self.padding),
                                    output_padding=_arg(self.output_padding))

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.output_padding != (0, 0):
            s += f", output_padding={self.output_padding}"
        return s + ("" if self.bias is not None else ", bias=False")
