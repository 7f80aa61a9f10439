"""Transposed convolution: ``conv_transpose2d`` (the other convolutions live in ``nn``).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 4, 5, 5), np.float32)))
>>> w = tp.tensor(pc.Tensor.from_host(q, np.ones((4, 3, 3, 3), np.float32)), True)
>>> with tp.Tape() as tape:
...     y = tp.sum(tp.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1))
>>> _ = tape.backward(y)
>>> w.grad.shape
(4, 3, 3, 3)
"""

from __future__ import annotations

from ...kernels import conv_transpose as ctk
from ...tensor import Tensor
from ..node import Function

__all__ = ["conv_transpose2d"]


class ConvTranspose2d(Function):
    name = "conv_transpose2d"

    def forward(self, x: Tensor, weight: Tensor, bias: Tensor | None, stride=1, padding=0,
                output_padding=0):
        y = ctk.conv_transpose2d_forward(x, weight, bias, stride, padding, output_padding)
        if self.recording:
            self.x = x if self.needs_input_grad[1] else None
            self.weight = weight
            self.stride, self.padding = stride, padding
        return y

    def backward(self, g: Tensor):
        need = self.needs_input_grad
        return ctk.conv_transpose2d_backward(self.x, self.weight, g, self.stride, self.padding,
                                             need_input=need[0], need_weight=need[1],
                                             need_bias=need[2])


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, *,
                     tape=None):
    """Transposed 2-D convolution (PyTorch's ``conv_transpose2d``, groups=1, dilation=1) of
    NCHW ``x`` with ``weight`` ``(cin, cout, kh, kw)``: the gradient of ``conv2d`` with respect
    to its input, run forward on the same GEMM + col2im. The output is ``(H - 1)*stride -
    2*padding + kh + output_padding`` high (likewise wide); ``output_padding < stride`` picks
    among the sizes that a strided conv2d maps to the same input size.

    >>> tp.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1).shape
    (2, 3, 10, 10)
    """
    return ConvTranspose2d.apply(x, weight, bias, tape=tape, stride=stride, padding=padding,
                                 output_padding=output_padding)
