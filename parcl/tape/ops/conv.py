"""Transposed convolution: ``conv_transpose2d`` (the other convolutions live in ``nn``; grouped
and dilated ones run as ``conv_transpose3d`` on a depth-1 view).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 4, 5, 5), np.float32)))
>>> w = tp.tensor(pc.Tensor.from_host(q, np.ones((4, 3, 3, 3), np.float32)), True)
>>> with tp.Tape() as tape:
...     y = tp.sum(tp.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1))
>>> _ = tape.backward(y)
>>> w.grad.shape
(4, 3, 3, 3)
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...kernels import conv_transpose as ctk
from ...tensor import Tensor
from ..node import Function
from .conv3d import conv_transpose3d
from .shape import as_batched, squeeze, unbatch, unsqueeze

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


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1, *, tape=None):
    """Transposed 2-D convolution (PyTorch's ``conv_transpose2d``) of NCHW (or unbatched CHW)
    ``x`` with ``weight`` ``(cin, cout/groups, kh, kw)``: the gradient of ``conv2d`` with
    respect to its input, run forward on the same GEMM + col2im. The output is ``(H -
    1)*stride - 2*padding + dilation*(kh - 1) + output_padding + 1`` high (likewise wide);
    ``output_padding < stride`` picks among the sizes that a strided conv2d maps to the same
    input size. With ``groups > 1`` or a dilation, ``conv_transpose3d`` on a depth-1 view.

    >>> tp.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1).shape
    (2, 3, 10, 10)
    """
    op = "conv_transpose2d"
    x4, batched = as_batched(op, x, "C, H, W", tape=tape)
    d = _pair(op, "dilation", dilation)
    if groups == 1 and d == (1, 1):
        y = ConvTranspose2d.apply(x4, weight, bias, tape=tape, stride=stride, padding=padding,
                                  output_padding=output_padding)
        return unbatch(y, batched, tape=tape)
    wshape = tuple(weight.shape)
    if len(wshape) != 4:
        raise ShapeError(f"{op}: weight must be 4-d (in_channels, out_channels/groups, kh, "
                         f"kw), got shape {wshape}")
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1 \
            or x4.shape[1] != wshape[0] or wshape[0] % groups:
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} has {x4.shape[1]} channels, "
                         f"weight {wshape} expects {wshape[0]} (and groups={groups!r} must be "
                         "a positive int dividing them)")
    # depth 1: stride 1, no padding
    pairs = [(least,) + _pair(op, name, v, least) for name, v, least in
             (("stride", stride, 1), ("padding", padding, 0),
              ("output_padding", output_padding, 0))]
    y = conv_transpose3d(unsqueeze(x4, 2, tape=tape), unsqueeze(weight, 2, tape=tape), bias,
                         *pairs, groups=int(groups), dilation=(1,) + d, tape=tape)
    return unbatch(squeeze(y, 2, tape=tape), batched, tape=tape)


def _pair(op: str, name: str, value, least: int = 1) -> tuple[int, int]:
    """An int or two ints (each at least ``least``) as a pair, else a ShapeError."""
    t = tuple(value) if isinstance(value, (tuple, list)) else (value,) * 2
    if len(t) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                              and v >= least for v in t):
        want = "positive" if least else "non-negative"
        raise ShapeError(f"{op}: {name} must be a {want} int or a pair, got {value!r}")
    return int(t[0]), int(t[1])
