"""3-D convolution layers with PyTorch's names, arguments and initialisation: ``Conv3d`` and
``ConvTranspose3d`` over ``(N, C, D, H, W)`` or unbatched ``(C, D, H, W)`` (``tp.conv3d``,
``tp.conv_transpose3d``).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> conv = pc.nn.Conv3d(3, 8, 3, padding=1)
>>> conv.weight.shape, conv(tp.tensor(np.ones((2, 3, 4, 8, 8), np.float32))).shape
((8, 3, 3, 3, 3), (2, 8, 4, 8, 8))
"""

from __future__ import annotations

from ..errors import ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tape.ops.conv3d import triple
from ..tape.ops.nn import string_padding
from .conv import transposed_output_padding
from .layers import (_check_features, _check_groups, _check_padding_mode, _check_sizes,
                     _conv_repr, _weight_and_bias, FanInUniform)

__all__ = ["Conv3d", "ConvTranspose3d"]


class Conv3d(FanInUniform):
    """``torch.nn.Conv3d``: weight ``(cout, cin/groups, kd, kh, kw)`` and bias ~
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with ``fan_in = cin/groups*kd*kh*kw`` (PyTorch's
    default), drawn from parcl's seeded generator. ``kernel_size``, ``stride``, ``padding``
    and ``dilation`` ints or triples, ``padding`` also ``"same"``/``"valid"``;
    ``padding_mode`` ``"reflect"``, ``"replicate"`` or ``"circular"`` pads the input with
    ``tp.pad`` in that mode first, then convolves without padding (as PyTorch)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        _check_sizes("Conv3d", {"in_channels": in_channels, "out_channels": out_channels,
                               "groups": groups})
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = triple("Conv3d", "kernel_size", kernel_size)
        self.stride = triple("Conv3d", "stride", stride)
        self.dilation = triple("Conv3d", "dilation", dilation)
        if isinstance(padding, str):         # kept as given, refused now as PyTorch does
            string_padding("Conv3d", padding, self.kernel_size, self.stride, self.dilation)
            self.padding = padding
        else:
            self.padding = triple("Conv3d", "padding", padding, least=0)
        self.padding_mode = _check_padding_mode("Conv3d", padding_mode)
        self.groups = _check_groups("Conv3d", int(groups), self.in_channels, self.out_channels)
        cin = self.in_channels // self.groups
        kd, kh, kw = self.kernel_size
        _weight_and_bias(self, queue, (self.out_channels, cin) + self.kernel_size,
                         cin * kd * kh * kw, bias, self.out_channels)

    def forward(self, x):
        _check_features(self, x, -4, self.in_channels, (4, 5))
        padding = self.padding
        if self.padding_mode != "zeros" and padding not in ("valid", (0, 0, 0)):
            if isinstance(padding, str):
                pads = string_padding("Conv3d", padding, self.kernel_size, self.stride,
                                      self.dilation)
            else:
                pads = [(v, v) for v in padding]
            flat = tuple(v for before, after in reversed(pads) for v in (before, after))
            x, padding = ops.pad(x, flat, mode=self.padding_mode), 0
        return ops.conv3d(x, self.weight, self.bias, stride=self.stride, padding=padding,
                          dilation=self.dilation, groups=self.groups)

    def extra_repr(self) -> str:
        return _conv_repr(self)


class ConvTranspose3d(FanInUniform):
    """``torch.nn.ConvTranspose3d``: weight ``(cin, cout/groups, kd, kh, kw)`` and bias ~
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with ``fan_in = cout/groups*kd*kh*kw`` (PyTorch reads
    the fan from the weight's dim 1). Each output dim ``(n - 1)*stride - 2*padding +
    dilation*(k - 1) + output_padding + 1``. PyTorch's argument order; ``padding_mode`` only
    ``"zeros"``, as PyTorch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        _check_sizes("ConvTranspose3d", {"in_channels": in_channels,
                                         "out_channels": out_channels, "groups": groups})
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        if padding_mode != "zeros":
            raise ShapeError(f"ConvTranspose3d: only padding_mode='zeros' is supported (as "
                             f"PyTorch), got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.groups = _check_groups("ConvTranspose3d", int(groups), self.in_channels,
                                    self.out_channels)
        self.kernel_size = triple("ConvTranspose3d", "kernel_size", kernel_size)
        self.stride = triple("ConvTranspose3d", "stride", stride)
        self.padding = triple("ConvTranspose3d", "padding", padding, least=0)
        self.dilation = triple("ConvTranspose3d", "dilation", dilation)
        self.output_padding = triple("ConvTranspose3d", "output_padding", output_padding,
                                     least=0)
        if any(o >= max(s, d) for o, s, d in zip(self.output_padding, self.stride,
                                                  self.dilation)):
            raise ShapeError(f"ConvTranspose3d: output_padding {self.output_padding} must be "
                             f"smaller than the stride {self.stride} or the dilation "
                             f"{self.dilation} (as PyTorch)")
        cout = self.out_channels // self.groups
        kd, kh, kw = self.kernel_size
        _weight_and_bias(self, queue, (self.in_channels, cout) + self.kernel_size,
                         cout * kd * kh * kw, bias, self.out_channels)

    def forward(self, input, output_size=None):  # noqa: A002 - PyTorch's argument name
        """The transposed convolution; ``output_size`` (``(D, H, W)`` or the whole output
        shape, as PyTorch takes it) picks the output padding instead of ``output_padding``."""
        _check_features(self, input, -4, self.in_channels, (4, 5))
        output_padding = self.output_padding
        if output_size is not None:
            span = tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel_size))
            output_padding = transposed_output_padding(self, input, output_size, span,
                                                       self.stride, self.padding)
        return ops.conv_transpose3d(input, self.weight, self.bias, stride=self.stride,
                                    padding=self.padding, output_padding=output_padding,
                                    groups=self.groups, dilation=self.dilation)

    def extra_repr(self) -> str:
        return _conv_repr(self)
