"""Layers: thin Modules over the differentiable ops of ``parcl.tape.ops``.

Each takes a ``tp.Node`` or a raw ``pc.Tensor`` and returns what the op returns (a Node while
recording, a raw Tensor under ``tp.no_grad()``). Layers that own parameters take
``queue=None`` (the thread's default queue) and initialise them as PyTorch does, from the
thread's seeded generator (see ``parcl.nn.manual_seed``).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> fc = pc.nn.Linear(4, 2)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.ones((3, 4), np.float32))
>>> with tp.no_grad():
...     fc(x).shape
(3, 2)
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import Node, mode, ops
from ..tape.ops.checks import read_checks
from ..tape.ops.nn import check_divisor_override, string_padding
from ..tensor import Tensor
from .indexed import ContainerError, IndexedChildren
from .module import Module, Parameter, uniform_
from .module_hooks import holds_hooks

__all__ = ["AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm2d", "Conv2d", "Dropout", "Flatten",
           "Linear", "MaxPool2d", "ReLU", "Sequential"]


def _size(v, least: int) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= least


def _want(least: int) -> str:
    return "a positive integer" if least else "a non-negative integer"


def _pair(layer: str, name: str, value, least: int = 1) -> tuple[int, int]:
    """An int or a pair of ints (each at least ``least``) as a pair, checked before any
    conversion: ``(2.5, 2.5)`` is refused, not truncated."""
    pair = (value, value) if not isinstance(value, (tuple, list)) else tuple(value)
    if len(pair) != 2 or not all(_size(v, least) for v in pair):
        raise ShapeError(f"{layer}: {name} must be {_want(least)} or a pair of them, got "
                         f"{value!r}")
    return int(pair[0]), int(pair[1])


def _check_sizes(layer: str, positive: dict) -> None:
    """Refuse zero, negative or non-integer sizes at construction, naming the argument: else
    they surface later as an unrelated error (an empty weight's upload, a kernel's range)."""
    for name, value in positive.items():
        if not _size(value, 1):
            raise ShapeError(f"{layer}: {name} must be {_want(1)}, got {value!r}")


def _dim(layer: str, value, name: str = "dim") -> int:
    """A dimension index as an int; a float (``1.5``) or a bool is refused, where ``int()``
    would pick another dimension (PyTorch's ops refuse a float dim)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ShapeError(f"{layer}: {name} must be an int, got {value!r}")
    return int(value)


PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _check_padding_mode(layer: str, padding_mode) -> str:
    if padding_mode not in PADDING_MODES:
        raise ShapeError(f"{layer}: padding_mode must be one of {PADDING_MODES}, got "
                         f"{padding_mode!r}")
    return padding_mode


def _arg(pair: tuple[int, int]):
    """An int when both entries agree (the form every op accepts), else the pair."""
    return pair[0] if pair[0] == pair[1] else pair


def _param(queue, array: np.ndarray) -> Parameter:
    return Parameter(Tensor.from_host(queue, array))


def _weight_and_bias(layer: Module, queue, shape: tuple, fan_in: int, bias: bool,
                     out: int) -> None:
    """PyTorch's default initialisation: ``layer.weight`` of ``shape``, then ``layer.bias``
    of ``(out,)`` (None without ``bias``), both ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    layer.weight = _param(queue, uniform_(shape, bound))
    if bias:
        layer.bias = _param(queue, uniform_((out,), bound))
    else:
        layer.register_parameter("bias", None)


def redraw_uniform(layer: Module, bound: float) -> None:
    """``reset_parameters`` of a layer whose Parameters are all ~ U(-bound, bound): each drawn
    again from this thread's seeded generator in registration order (the order its
    constructor drew them, so after the same ``manual_seed`` the values are a new layer's)
    and written into the same Parameter, as PyTorch's in-place init: an optimizer holding
    it keeps training it."""
    for p in layer.parameters(recurse=False):
        overwrite(p, uniform_(p.shape, bound))


def overwrite(param: Parameter, array: np.ndarray) -> None:
    """``array`` written into ``param``, in place (noted as a change, as ``Tensor.copy_``)."""
    param.value.copy_(Tensor.from_host(param.value.queue, array))


def ones_and_zeros(layer: Module) -> None:
    """A normalisation layer's ``reset_parameters``: ``weight`` 1 and ``bias`` 0 (those it
    has), in place, as PyTorch's."""
    for name, value in (("weight", 1.0), ("bias", 0.0)):
        p = layer._parameters.get(name)
        if p is not None:
            p.value.fill_(value)


class FanInUniform(Module):
    """Layers whose ``weight`` and ``bias`` are ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in
    the product of the weight's dims after the first (PyTorch's default): Linear and the
    convolutions."""

    def reset_parameters(self) -> None:
        """Draw ``weight`` and ``bias`` again as the constructor did, in place (see
        ``redraw_uniform``), as PyTorch's."""
        redraw_uniform(self, 1.0 / math.sqrt(math.prod(self.weight.shape[1:])))


def _check_groups(layer: str, groups: int, in_channels: int, out_channels: int) -> int:
    if groups < 1 or in_channels % groups or out_channels % groups:
        raise ShapeError(f"{layer}: groups={groups} must be >= 1 and divide in_channels="
                         f"{in_channels} and out_channels={out_channels}")
    return groups


def _conv_repr(layer: Module) -> str:
    """A convolution's or transposed convolution's ``extra_repr``: what differs from the
    defaults, in PyTorch's order (``_ConvNd.extra_repr``: ``bias=False`` before
    ``padding_mode``)."""
    n = len(layer.kernel_size)
    s = (f"{layer.in_channels}, {layer.out_channels}, kernel_size={layer.kernel_size}, "
         f"stride={layer.stride}")
    if layer.padding != (0,) * n:
        s += f", padding={layer.padding}"
    if layer.dilation != (1,) * n:
        s += f", dilation={layer.dilation}"
    # (parcl's convolutions have no output_padding; PyTorch's hold zeros)
    output_padding = getattr(layer, "output_padding", (0,) * n)
    if output_padding != (0,) * n:
        s += f", output_padding={output_padding}"
    if layer.groups != 1:
        s += f", groups={layer.groups}"
    if layer.bias is None:
        s += ", bias=False"
    if getattr(layer, "padding_mode", "zeros") != "zeros":
        s += f", padding_mode={layer.padding_mode}"
    return s


def _check_features(layer: Module, x, dim: int, expected: int, ndims: tuple[int, ...]) -> None:
    shape = tuple(x.shape)
    if len(shape) not in ndims:
        want = " or ".join(f"{n}-d" for n in ndims)
        raise ShapeError(f"{layer!r}: expected a {want} input, got shape {shape}")
    if shape[dim] != expected:
        raise ShapeError(f"{layer!r}: input has {shape[dim]} features/channels at dim {dim} "
                         f"(shape {shape}), expected {expected}")


class Linear(FanInUniform):
    """``y = x @ weight.T + bias``; weight ``(out, in)``, both ~ U(-1/sqrt(in), 1/sqrt(in))
    (PyTorch's default: kaiming_uniform with a=sqrt(5)). Runs as one fused GEMM with the bias
    in its epilogue. Inputs ``(N, in)`` or ``(*, in)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 queue=None):
        super().__init__()
        _check_sizes("Linear", {"in_features": in_features, "out_features": out_features})
        queue = queue if queue is not None else default_queue()
        self.in_features, self.out_features = int(in_features), int(out_features)
        _weight_and_bias(self, queue, (self.out_features, self.in_features), self.in_features,
                         bias, self.out_features)

    def forward(self, x, *, relu: bool = False):
        """``x @ weight.T + bias``; ``relu=True`` fuses a following ReLU into the GEMM."""
        shape = tuple(x.shape)
        if len(shape) < 1 or shape[-1] != self.in_features:
            raise ShapeError(f"{self!r}: input of shape {shape} does not end in "
                             f"{self.in_features} features")
        return ops.linear(x, self.weight, self.bias, relu=relu)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Conv2d(FanInUniform):
    """2-d convolution over ``(N, C, H, W)`` or unbatched ``(C, H, W)``; weight ``(cout, cin/groups,
    kh, kw)``; weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with ``fan_in =
    cin/groups*kh*kw`` (PyTorch's default). ``groups == cin`` is a depthwise convolution (its
    own fast kernels). ``padding_mode`` ``"reflect"``, ``"replicate"`` or ``"circular"`` pads
    the input with ``tp.pad`` in that mode first, then convolves without padding (as PyTorch)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        _check_sizes("Conv2d", {"in_channels": in_channels, "out_channels": out_channels,
                               "groups": groups})
        self.kernel_size = _pair("Conv2d", "kernel_size", kernel_size)
        self.stride = _pair("Conv2d", "stride", stride)
        # PyTorch keeps "same" and "valid" as given
        self.padding = padding if isinstance(padding, str) else _pair("Conv2d", "padding",
                                                                      padding, least=0)
        self.dilation = _pair("Conv2d", "dilation", dilation)
        self.padding_mode = _check_padding_mode("Conv2d", padding_mode)
        if isinstance(padding, str):         # refused now, as PyTorch refuses it
            string_padding("Conv2d", padding, self.kernel_size, self.stride, self.dilation)
        self.groups = _check_groups("Conv2d", int(groups), self.in_channels, self.out_channels)
        cin = self.in_channels // self.groups
        _weight_and_bias(self, queue, (self.out_channels, cin) + self.kernel_size,
                         cin * self.kernel_size[0] * self.kernel_size[1], bias, self.out_channels)

    def forward(self, x, *, relu: bool = False):
        """The convolution; ``relu=True`` fuses a following ReLU into its last pass."""
        _check_features(self, x, -3, self.in_channels, (3, 4))
        padding = self.padding
        if self.padding_mode != "zeros" and padding not in ("valid", (0, 0)):
            if isinstance(padding, str):
                (top, bottom), (left, right) = string_padding(
                    "Conv2d", padding, self.kernel_size, self.stride, self.dilation)
            else:
                (top, left), (bottom, right) = padding, padding
            x, padding = ops.pad(x, (left, right, top, bottom), mode=self.padding_mode), (0, 0)
        return ops.conv2d(x, self.weight, self.bias, stride=_arg(self.stride),
                          padding=padding if isinstance(padding, str) else _arg(padding),
                          dilation=_arg(self.dilation), groups=self.groups, relu=relu)

    def extra_repr(self) -> str:
        return _conv_repr(self)


class _NormBase(Module):
    """BatchNorm's and InstanceNorm's arguments and state, as PyTorch's ``_NormBase``: with
    ``affine`` a ``weight`` of ones and a ``bias`` of zeros (none with ``bias=False``), with
    ``track_running_stats`` a ``running_mean`` of zeros and a ``running_var`` of ones."""

    _ignored_keys = ("num_batches_tracked",)
    none_momentum = "0"       # what momentum=None means, for the error that refuses a value

    def __init__(self, num_features: int, eps: float, momentum: float | None, affine: bool,
                 track_running_stats: bool, bias: bool, queue):
        super().__init__()
        name = type(self).__name__
        _check_sizes(name, {"num_features": num_features})
        queue = queue if queue is not None else default_queue()
        if momentum is not None and not 0.0 <= float(momentum) <= 1.0:
            raise ValueError(f"{name}: momentum must be a number in [0, 1] or None "
                             f"({self.none_momentum}), got {momentum!r}")
        self.num_features, self.eps = int(num_features), float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        c = self.num_features
        self.weight = Parameter(Tensor.full(queue, (c,), 1.0)) if self.affine else None
        self.bias = Parameter(Tensor.zeros(queue, (c,))) if self.affine and bias else None
        tracked = self.track_running_stats
        self.register_buffer("running_mean", Tensor.zeros(queue, (c,)) if tracked else None)
        self.register_buffer("running_var", Tensor.full(queue, (c,), 1.0) if tracked else None)

    def reset_running_stats(self) -> None:
        """``running_mean`` 0, ``running_var`` 1 and ``num_batches_tracked`` 0, in place, as
        PyTorch's (nothing without ``track_running_stats``)."""
        if not self.track_running_stats:
            return
        for name, value in (("running_mean", 0.0), ("running_var", 1.0),
                            ("num_batches_tracked", 0)):
            buffer = self._buffers.get(name)
            if buffer is not None:
                buffer.fill_(value)

    def reset_parameters(self) -> None:
        """``reset_running_stats``, then ``weight`` 1 and ``bias`` 0, as PyTorch's."""
        self.reset_running_stats()
        ones_and_zeros(self)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm2d(_NormBase):
    """Batch normalisation over ``(N, C, H, W)`` per channel: batch statistics in training
    (running statistics updated in place, running variance unbiased, as PyTorch), running
    statistics in evaluation. weight 1, bias 0 (none with ``affine=False``; no bias with
    ``bias=False``), running_mean 0, running_var 1.

    ``momentum=None`` is PyTorch's cumulative moving average: the ``n``-th training batch
    weighs ``1/n``, ``n`` counted in the ``num_batches_tracked`` buffer (an int64 read back
    once per training forward). ``track_running_stats=False`` keeps no running statistics and
    normalises with the batch's in evaluation too; set False later, the statistics kept stop
    moving (evaluation still uses them), as PyTorch's. PyTorch's ``num_batches_tracked`` is kept
    only with ``momentum=None``, the one use of it; other layers accept such keys and ignore
    them in ``load_state_dict``."""

    none_momentum = "the cumulative average"

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *, bias: bool = True,
                 queue=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, bias, queue)
        if self.track_running_stats and self.momentum is None:
            self.register_buffer("num_batches_tracked",
                                 Tensor.zeros(self.running_mean.queue, (), np.int64))

    def forward(self, x, *, residual=None, relu: bool = False,
                overwrite_residual: bool = False):
        """``bn(x)``; ``residual``/``relu`` fuse ``relu(bn(x) + residual)`` into one op, written
        over the residual with ``overwrite_residual`` (see ``tp.batch_norm``)."""
        _check_features(self, x, 1, self.num_features, (4,))
        return self._normalise(x, residual=residual, relu=relu,
                               overwrite_residual=overwrite_residual)

    def _normalise(self, x, **fused):
        """``tp.batch_norm`` with this forward's statistics and momentum, as PyTorch's
        ``_BatchNorm.forward`` chooses them."""
        momentum = self.momentum
        stats = self.running_mean is not None and self.running_var is not None
        # The statistics move only while tracked: with track_running_stats switched off after
        # construction (the buffers kept) PyTorch normalises with the batch's in training,
        # leaving them and the count as they are, and with them in evaluation
        update = self.training and self.track_running_stats and stats
        if update and momentum is None and not mode.state.recompute:    # tp.checkpoint's
            # a batch computed from a bad input raises before it is counted, as PyTorch's
            # error comes before the batch norm: a skipped batch must not weigh the next ones
            read_checks(x.value if isinstance(x, Node) else x)
            count = self._buffers.get("num_batches_tracked")
            if count is None:
                raise ParclError(
                    f"{type(self).__name__}: momentum=None (the cumulative average) set after "
                    "construction: PyTorch weighs the n-th training batch by 1/n, n counted "
                    "since construction in num_batches_tracked, which parcl keeps only for a "
                    "layer built with momentum=None; build it so, or register_buffer("
                    "'num_batches_tracked', a 0-d int64 pc.Tensor of the batches it has "
                    "trained on)")
            n = int(count.to_host()) + 1
            count.fill_owned(n)
            momentum = 1.0 / n
        # tracked statistics go to tp.batch_norm in training too, as PyTorch passes them: one
        # of them set to None must raise there, not quietly normalise with the batch's
        running = (self.running_mean, self.running_var) \
            if self.track_running_stats or not self.training else (None, None)
        # evaluation never exchanges statistics (sync_batchnorm=True, SyncBatchNorm), as
        # PyTorch's SyncBatchNorm: without running statistics it normalises with this
        # replica's own batch
        with contextlib.nullcontext() if self.training else mode.own_batch_stats():
            return ops.batch_norm(x, self.weight, self.bias, *running,
                                  training=self.training or not stats,
                                  momentum=0.0 if momentum is None else momentum,
                                  eps=self.eps, **fused)


class ReLU(Module):
    """``max(x, 0)``; ``inplace=True`` overwrites its input (see ``tp.relu``)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x):
        return ops.relu(x, inplace=self.inplace)


def _stride(kernel_size, stride):
    """A pooling layer's stride as PyTorch's stores it: None is the kernel size given, fixed
    at construction (``pool.stride`` reads it, and a ``kernel_size`` changed later keeps it)."""
    return kernel_size if stride is None else stride


class _MaxPool(Module):
    """MaxPool1d's and MaxPool2d's arguments and forward, through the class's ``op``."""

    op = staticmethod(ops.max_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        self.return_indices = bool(return_indices)
        self.kernel_size, self.stride, self.padding = kernel_size, _stride(kernel_size, stride), \
            padding
        self.dilation, self.ceil_mode = dilation, bool(ceil_mode)

    def forward(self, x):
        return self.op(x, self.kernel_size, stride=self.stride, padding=self.padding,
                       dilation=self.dilation, ceil_mode=self.ceil_mode,
                       return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
                f", dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool2d(_MaxPool):
    """Max pooling over ``(N, C, H, W)`` or ``(C, H, W)``; ``stride=None`` means ``kernel_size``;
    ``dilation`` and ``ceil_mode`` as PyTorch (see ``tp.max_pool2d``); ``return_indices=True``
    returns ``(output, indices)``, each maximum's int64 position ``h * W + w`` in its plane
    (what ``MaxUnpool2d`` takes), as PyTorch's."""


class _AvgPool(Module):
    """AvgPool1d's and AvgPool2d's arguments and forward, through the class's ``op``."""

    op = staticmethod(ops.avg_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, _stride(kernel_size, stride), \
            padding
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)

    def forward(self, x):
        return self.op(x, self.kernel_size, stride=self.stride, padding=self.padding,
                       ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
                f", ceil_mode={self.ceil_mode}, count_include_pad={self.count_include_pad}")


class AvgPool2d(_AvgPool):
    """Average pooling over ``(N, C, H, W)`` or ``(C, H, W)``; ``stride=None`` means
    ``kernel_size``; ``ceil_mode``, ``count_include_pad`` and ``divisor_override`` as PyTorch
    (see ``tp.avg_pool2d``)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.divisor_override = check_divisor_override("AvgPool2d", divisor_override)

    def forward(self, x):
        return self.op(x, self.kernel_size, stride=self.stride, padding=self.padding,
                       ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad,
                       divisor_override=self.divisor_override)


class AdaptiveAvgPool2d(Module):
    """Average pooling to a fixed ``output_size`` (``1``: global average pooling; ``None`` in a
    pair keeps that dim's size)."""

    def __init__(self, output_size=1):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return ops.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


def flatten(x, start_dim: int = 1, end_dim: int = -1):
    """Reshape ``x`` so dims ``start_dim..end_dim`` become one (a zero-copy view)."""
    shape = tuple(x.shape)
    rank = max(len(shape), 1)
    start = start_dim if start_dim >= 0 else len(shape) + start_dim
    end = end_dim if end_dim >= 0 else rank + end_dim
    if not 0 <= start < rank or not 0 <= end < rank:
        raise ShapeError(f"flatten: start_dim {start_dim} or end_dim {end_dim} out of range "
                         f"for shape {shape}")
    if start > end:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
                         f"for shape {shape}")
    new = shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]
    return x if new == shape else ops.reshape(x, new)


class Flatten(Module):
    """``(N, d1, d2, ...) -> (N, d1*d2*...)``: dims ``start_dim..end_dim`` merged into one
    (by default all but dim 0), as ``torch.nn.Flatten``."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, x):
        return flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Dropout(Module):
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)`` while
    training; the identity in evaluation."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return ops.dropout(x, self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Sequential(IndexedChildren):
    """Layers applied in order; children are named ``0``, ``1``, ... (or by an OrderedDict).
    As PyTorch's: ``append``, ``extend``, ``insert``, ``pop``, ``del`` (by index or slice; the
    rest renumbered ``0``, ``1``, ...), assignment by index, ``+``/``+=`` with a Sequential,
    and ``*`` by a positive int (the same layers repeated, shared).

    >>> net = pc.nn.Sequential(pc.nn.Linear(8, 4), pc.nn.ReLU())
    >>> len(net), type(net[0]).__name__
    (2, 'Linear')
    """

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], OrderedDict):
            for name, layer in layers[0].items():
                self.add_module(name, layer)
        else:
            for i, layer in enumerate(layers):
                self.add_module(str(i), layer)

    def append(self, layer: Module) -> Sequential:
        self.add_module(str(len(self)), layer)
        return self

    def extend(self, layers: Iterable[Module]) -> Sequential:
        for layer in layers:
            self.append(layer)
        return self

    def insert(self, index: int, layer: Module) -> Sequential:
        """Insert ``layer`` before ``index`` (``-len <= index <= len``, else IndexError, as
        PyTorch's); the layers after it are renamed one up."""
        n = len(self)
        if not -n <= operator.index(index) <= n:
            raise IndexError(f"Sequential.insert: index {index} is out of range for {n} "
                             "layers")
        self._inserted(index, layer)
        return self

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        if isinstance(index, slice):             # keeps the children's names, as PyTorch's
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        return list(self._modules.values())[self._position(index)]

    def __setitem__(self, index: int, layer: Module) -> None:
        setattr(self, list(self._modules)[self._position(index)], layer)

    def _sequential(self, other, op: str) -> Sequential:
        if not isinstance(other, Sequential):
            raise ContainerError(f"Sequential {op} takes a Sequential, got "
                                 f"{type(other).__name__} (as PyTorch's)")
        return other

    def __add__(self, other: Sequential) -> Sequential:
        return Sequential(*self, *self._sequential(other, "+"))

    def __iadd__(self, other: Sequential) -> Sequential:
        return self.extend(list(self._sequential(other, "+=")))

    def _times(self, times: int) -> int:
        if not isinstance(times, int):
            raise TypeError(f"Sequential * takes an int, got {type(times).__name__}")
        if times <= 0:
            raise ContainerError(f"Sequential * {times}: the factor must be positive")
        return times

    def __mul__(self, times: int) -> Sequential:
        return Sequential(*(list(self) * self._times(times)))

    __rmul__ = __mul__

    def __imul__(self, times: int) -> Sequential:
        return self.extend(list(self) * (self._times(times) - 1))

    def forward(self, x):
        layers = list(self._modules.values())
        i = 0
        while i < len(layers):
            layer = layers[i]
            if (type(layer) in (Linear, Conv2d) and i + 1 < len(layers)
                    and type(layers[i + 1]) is ReLU and not holds_hooks(layer)
                    and not holds_hooks(layers[i + 1])):
                x = layer(x, relu=True)      # the ReLU runs in the GEMM's or conv's last pass
                i += 2
            else:
                x = layer(x)
                i += 1
        return x
