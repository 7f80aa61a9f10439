"""Convolution layers beyond ``Conv2d``: ``ConvTranspose2d``, and the 1-D layers ``Conv1d``,
``ConvTranspose1d``, ``MaxPool1d`` and ``AvgPool1d`` (over ``(N, C, L)``, through the 2-D ops).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> up = pc.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.ones((1, 4, 5, 5), np.float32))
>>> with tp.no_grad():
...     up(x).shape
(1, 2, 10, 10)
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tape.ops.sequence import single
from .layers import (_arg, _AvgPool, _check_features, _check_groups, _check_padding_mode,
                     _check_sizes, _conv_repr, _MaxPool, _pair, _weight_and_bias,
                     FanInUniform)
from .module import Module

__all__ = ["AvgPool1d", "Conv1d", "ConvTranspose1d", "ConvTranspose2d", "MaxPool1d"]


def transposed_output_padding(layer: Module, x, output_size, kernel: tuple, stride: tuple,
                              padding: tuple) -> tuple[int, ...]:
    """PyTorch's ``_output_padding``: the per-dim output padding that gives ``output_size``
    (the spatial sizes, or the output's whole shape), each within a stride of the smallest
    output; else a ``ShapeError`` naming the valid range."""
    dims = len(kernel)
    sizes = [output_size] if not isinstance(output_size, (tuple, list)) else list(output_size)
    if len(sizes) == len(x.shape):
        sizes = sizes[-dims:]
    if len(sizes) != dims or not all(isinstance(v, (int, np.integer))
                                     and not isinstance(v, bool) for v in sizes):
        raise ShapeError(f"{layer!r}: output_size must be {dims} spatial size(s) or the "
                         f"output's shape ({len(x.shape)} ints), got {output_size!r}")
    spatial = tuple(x.shape[-dims:])
    smallest = [(n - 1) * s - 2 * p + k for n, s, p, k in zip(spatial, stride, padding, kernel)]
    largest = [m + s - 1 for m, s in zip(smallest, stride)]
    if not all(m <= v <= top for m, v, top in zip(smallest, sizes, largest)):
        raise ShapeError(f"{layer!r}: requested an output size of {list(sizes)}, but valid "
                         f"sizes range from {smallest} to {largest} (for an input of "
                         f"{list(spatial)})")
    return tuple(int(v) - m for v, m in zip(sizes, smallest))


class ConvTranspose2d(FanInUniform):
    """Transposed 2-d convolution over ``(N, C, H, W)`` or unbatched ``(C, H, W)``
    (``tp.conv_transpose2d``); weight ``(cin, cout/groups, kh, kw)`` as PyTorch.
    Initialisation as PyTorch's ``_ConvNd``: weight and bias ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) with ``fan_in = weight.size(1)*kh*kw = cout/groups*kh*kw``
    (kaiming_uniform with a=sqrt(5) reads the fan-in from the weight's dim 1). Output height
    ``(H - 1)*stride - 2*padding + dilation*(kh - 1) + output_padding + 1``. PyTorch's
    argument order (``groups`` before ``bias``); ``padding_mode`` only ``"zeros"``, as
    PyTorch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        _check_sizes("ConvTranspose2d", {"in_channels": in_channels,
                                         "out_channels": out_channels, "groups": groups})
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.padding_mode = _check_transposed_padding_mode("ConvTranspose2d", padding_mode)
        self.groups = _check_groups("ConvTranspose2d", int(groups), self.in_channels,
                                    self.out_channels)
        self.kernel_size = _pair("ConvTranspose2d", "kernel_size", kernel_size)
        self.stride = _pair("ConvTranspose2d", "stride", stride)
        self.padding = _pair("ConvTranspose2d", "padding", padding, least=0)
        self.dilation = _pair("ConvTranspose2d", "dilation", dilation)
        self.output_padding = _pair("ConvTranspose2d", "output_padding", output_padding,
                                    least=0)
        if any(o >= max(s, d) for o, s, d in zip(self.output_padding, self.stride,
                                                  self.dilation)):
            raise ShapeError(f"ConvTranspose2d: output_padding {self.output_padding} must be "
                             f"smaller than the stride {self.stride} or the dilation "
                             f"{self.dilation} (as PyTorch)")
        cout = self.out_channels // self.groups
        _weight_and_bias(self, queue, (self.in_channels, cout) + self.kernel_size,
                         cout * self.kernel_size[0] * self.kernel_size[1], bias,
                         self.out_channels)

    def forward(self, input, output_size=None):  # noqa: A002 - PyTorch's argument name
        """The transposed convolution; ``output_size`` (``(H, W)`` or the whole output shape,
        as PyTorch takes it) picks the output padding instead of ``output_padding``."""
        _check_features(self, input, -3, self.in_channels, (3, 4))
        output_padding = self.output_padding
        if output_size is not None:
            output_padding = transposed_output_padding(self, input, output_size,
                                                       _span(self), self.stride, self.padding)
        return ops.conv_transpose2d(input, self.weight, self.bias, stride=_arg(self.stride),
                                    padding=_arg(self.padding),
                                    output_padding=_arg(output_padding), groups=self.groups,
                                    dilation=_arg(self.dilation))

    def extra_repr(self) -> str:
        return _conv_repr(self)


def _check_transposed_padding_mode(layer: str, padding_mode) -> str:
    if padding_mode != "zeros":
        raise ShapeError(f"{layer}: only padding_mode='zeros' is supported (as PyTorch), got "
                         f"padding_mode={padding_mode!r}")
    return padding_mode


def _span(layer: Module) -> tuple[int, ...]:
    """The dilated kernel's extent per dim, ``dilation*(k - 1) + 1``."""
    return tuple(d * (k - 1) + 1 for d, k in zip(layer.dilation, layer.kernel_size))


class Conv1d(FanInUniform):
    """1-d convolution over ``(N, C, L)`` or unbatched ``(C, L)`` (``tp.conv1d``); weight
    ``(cout, cin/groups, k)`` and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with ``fan_in =
    cin/groups*k`` (PyTorch's default). ``padding`` an int, ``"valid"`` or ``"same"``;
    ``padding_mode`` ``"reflect"``, ``"replicate"`` or ``"circular"`` pads the input with
    ``tp.pad`` in that mode first (``"same"``: the odd one on the right), as PyTorch."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        _check_sizes("Conv1d", {"in_channels": in_channels, "out_channels": out_channels,
                               "groups": groups})
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = (single("Conv1d", "kernel_size", kernel_size),)
        self.stride = (single("Conv1d", "stride", stride),)
        self.dilation = (single("Conv1d", "dilation", dilation),)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ShapeError(f"Conv1d: padding {padding!r} is not 'same', 'valid' or an int")
            if padding == "same" and self.stride != (1,):
                raise ShapeError(f"Conv1d: padding='same' needs stride 1, got {self.stride}")
            self.padding = padding
        else:
            self.padding = (single("Conv1d", "padding", padding, least=0),)
        self.padding_mode = _check_padding_mode("Conv1d", padding_mode)
        self.groups = _check_groups("Conv1d", int(groups), self.in_channels, self.out_channels)
        cin = self.in_channels // self.groups
        _weight_and_bias(self, queue, (self.out_channels, cin) + self.kernel_size,
                         cin * self.kernel_size[0], bias, self.out_channels)

    def forward(self, x):
        _check_features(self, x, -2, self.in_channels, (2, 3))
        padding = self.padding if isinstance(self.padding, str) else self.padding[0]
        if self.padding_mode != "zeros" and padding not in ("valid", 0):
            if padding == "same":
                total = self.dilation[0] * (self.kernel_size[0] - 1)
                pads = (total // 2, total - total // 2)
            else:
                pads = (padding, padding)
            x, padding = ops.pad(x, pads, mode=self.padding_mode), 0
        return ops.conv1d(x, self.weight, self.bias, stride=self.stride[0], padding=padding,
                          dilation=self.dilation[0], groups=self.groups)

    def extra_repr(self) -> str:
        return _conv_repr(self)


class ConvTranspose1d(FanInUniform):
    """Transposed 1-d convolution over ``(N, C, L)`` or unbatched ``(C, L)``
    (``tp.conv_transpose1d``); weight ``(cin, cout/groups, k)`` and bias ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) with ``fan_in = cout/groups*k``, as PyTorch's. Output length ``(L -
    1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1``. PyTorch's argument
    order; ``padding_mode`` only ``"zeros"``, as PyTorch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        _check_sizes("ConvTranspose1d", {"in_channels": in_channels,
                                         "out_channels": out_channels, "groups": groups})
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.padding_mode = _check_transposed_padding_mode("ConvTranspose1d", padding_mode)
        self.groups = _check_groups("ConvTranspose1d", int(groups), self.in_channels,
                                    self.out_channels)
        self.kernel_size = (single("ConvTranspose1d", "kernel_size", kernel_size),)
        self.stride = (single("ConvTranspose1d", "stride", stride),)
        self.padding = (single("ConvTranspose1d", "padding", padding, least=0),)
        self.dilation = (single("ConvTranspose1d", "dilation", dilation),)
        self.output_padding = (single("ConvTranspose1d", "output_padding", output_padding,
                                      least=0),)
        if self.output_padding[0] >= max(self.stride[0], self.dilation[0]):
            raise ShapeError(f"ConvTranspose1d: output_padding {self.output_padding} must be "
                             f"smaller than the stride {self.stride} or the dilation "
                             f"{self.dilation} (as PyTorch)")
        cout = self.out_channels // self.groups
        _weight_and_bias(self, queue, (self.in_channels, cout) + self.kernel_size,
                         cout * self.kernel_size[0], bias, self.out_channels)

    def forward(self, input, output_size=None):  # noqa: A002 - PyTorch's argument name
        """The transposed convolution; ``output_size`` (the length, or the whole shape as
        PyTorch takes it) picks the output padding instead of ``output_padding``."""
        _check_features(self, input, -2, self.in_channels, (2, 3))
        output_padding = self.output_padding
        if output_size is not None:
            output_padding = transposed_output_padding(self, input, output_size,
                                                       _span(self), self.stride, self.padding)
        return ops.conv_transpose1d(input, self.weight, self.bias, stride=self.stride[0],
                                    padding=self.padding[0], output_padding=output_padding[0],
                                    groups=self.groups, dilation=self.dilation[0])

    def extra_repr(self) -> str:
        return _conv_repr(self)


class MaxPool1d(_MaxPool):
    """Max pooling over ``(N, C, L)`` or ``(C, L)`` (``tp.max_pool1d``); ``stride=None`` means
    ``kernel_size``; ``return_indices=True`` returns ``(output, indices)`` (positions in
    ``L``), as PyTorch's."""

    op = staticmethod(ops.max_pool1d)


class AvgPool1d(_AvgPool):
    """Average pooling over ``(N, C, L)`` or ``(C, L)`` (``tp.avg_pool1d``), PyTorch's
    divisors."""

    op = staticmethod(ops.avg_pool1d)
