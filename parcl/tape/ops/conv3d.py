"""3-D convolutions over ``(N, C, D, H, W)`` (or unbatched ``(C, D, H, W)``) volumes and
videos: PyTorch's ``conv3d`` and ``conv_transpose3d`` on vol2col + GEMM (``kernels.conv3d``,
conv2d's layout with a depth dim): one GEMM per batch chunk (per group), a gather for the
input gradient, no atomics. ``conv_transpose3d`` is conv3d's input gradient run forward, and
its backward is conv3d.

>>> x = tp.tensor(np.ones((2, 3, 4, 6, 6), np.float32), requires_grad=True)
>>> w = tp.tensor(np.ones((5, 3, 3, 3, 3), np.float32), requires_grad=True)
>>> tp.conv3d(x, w, padding=1).shape, tp.conv3d(x, w, stride=(1, 2, 2)).shape
((2, 5, 4, 6, 6), (2, 5, 2, 2, 2))
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import conv3d as c3k
from ...kernels.conv_geometry import no_spatial_elements
from ...tensor import FLOAT, Tensor, check_same_queue
from ..node import Function
from .indexing import pad
from .nn import string_padding
from .shape import as_batched, unbatch

__all__ = ["conv3d", "conv_transpose3d"]


def triple(op: str, name: str, value, least: int = 1) -> tuple[int, int, int]:
    """An int or three ints (each at least ``least``) as a triple; anything else (a float, a
    pair, a bool) is a ShapeError naming the op and argument."""
    t = tuple(value) if isinstance(value, (tuple, list)) else (value,) * 3
    if len(t) != 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                              and v >= least for v in t):
        want = "positive" if least else "non-negative"
        raise ShapeError(f"{op}: {name} must be a {want} int or a tuple of three, got "
                         f"{value!r}")
    return int(t[0]), int(t[1]), int(t[2])


def check_volume(op: str, x) -> tuple[int, ...]:
    """``x``'s shape, refused unless a float32 ``(C, D, H, W)`` or ``(N, C, D, H, W)``: here,
    not in the 2-D ops the pools run on (whose errors name them and the reshaped planes)."""
    shape = tuple(x.shape)
    if len(shape) not in (4, 5):
        raise ShapeError(f"{op}: expected a 4-d (C, D, H, W) or 5-d (N, C, D, H, W) input, got "
                         f"shape {shape}")
    if x.dtype != FLOAT:
        raise DTypeError(f"{op}: input has dtype {x.dtype} (shape {shape}), expected float32")
    return shape


def batched5(op: str, x, tape):
    """``x`` as ``(N, C, D, H, W)`` and whether it was batched (``(C, D, H, W)`` gains N=1)."""
    shape = check_volume(op, x)
    if 0 in shape[-3:]:
        raise ShapeError(no_spatial_elements(op, shape[-3:]))
    return as_batched(op, x, "C, D, H, W", tape=tape)


def _check(op: str, x, weight, bias, groups, weight_dims: str) -> tuple:
    for name, t in (("input", x), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {name} has dtype {t.dtype} (shape {tuple(t.shape)}), "
                             "expected float32")
    wshape = tuple(weight.shape)
    if len(wshape) != 5:
        raise ShapeError(f"{op}: weight must be 5-d {weight_dims}, got shape {wshape}")
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ShapeError(f"{op}: groups must be a positive int, got {groups!r}")
    return wshape


def _check_bias(op: str, bias, cout: int, wshape) -> None:
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ShapeError(f"{op}: bias has shape {tuple(bias.shape)}, expected ({cout},) for "
                         f"weight {wshape}")


class Conv3d(Function):
    name = "conv3d"

    def forward(self, x: Tensor, weight: Tensor, bias: Tensor | None, stride=(1, 1, 1),
                padding=(0, 0, 0), dilation=(1, 1, 1), groups: int = 1):
        check_same_queue("conv3d", *[t for t in (x, weight, bias) if t is not None])
        y = c3k.conv3d_forward(x, weight, bias, stride, padding, dilation, groups)
        if self.recording:
            self.x, self.weight = x, weight
            self.window = (stride, padding, dilation, groups)
        return y

    def backward(self, g: Tensor):
        need = self.needs_input_grad
        return c3k.conv3d_backward(self.x, self.weight, g, *self.window, need_input=need[0],
                                   need_weight=need[1], need_bias=need[2])


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, *,
           tape=None):
    """``torch.nn.functional.conv3d``: cross-correlation of ``x`` ``(N, C, D, H, W)`` or
    ``(C, D, H, W)`` with ``weight`` ``(cout, cin/groups, kd, kh, kw)``; ``stride``,
    ``padding`` and ``dilation`` ints or triples (depth, height, width), ``padding`` also
    ``"valid"`` or ``"same"`` (stride 1; an odd total puts the extra zero after, as PyTorch).

    >>> tp.conv3d(x, w, padding="same", dilation=(1, 2, 2)).shape   # x (2, 3, 4, 6, 6)
    (2, 5, 4, 6, 6)
    """
    op = "conv3d"
    wshape = _check(op, x, weight, bias, groups, "(out_channels, in_channels/groups, kd, kh, "
                                                 "kw)")
    s, d = triple(op, "stride", stride), triple(op, "dilation", dilation)
    x5, batched = batched5(op, x, tape)
    c = x5.shape[1]
    cout, cin_g, kd, kh, kw = wshape
    if cout % groups or c % groups or c != cin_g * groups:
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} has {c} channels, weight "
                         f"{wshape} with groups={groups} expects {cin_g * groups} (and groups "
                         f"must divide its {cout} output channels)")
    _check_bias(op, bias, cout, wshape)
    if isinstance(padding, str):
        pads = string_padding(op, padding, (kd, kh, kw), s, d)
        p = tuple(a for a, _ in pads)
        if any(a != b for a, b in pads):        # the odd zero after: padded here
            flat = tuple(v for before, after in reversed(pads) for v in (before, after))
            x5, p = pad(x5, flat, tape=tape), (0, 0, 0)
    else:
        p = triple(op, "padding", padding, least=0)
    sizes = tuple(x5.shape[2:])
    out = [(n + 2 * pp - dd * (k - 1) - 1) // ss + 1
           for n, k, ss, pp, dd in zip(sizes, (kd, kh, kw), s, p, d)]
    if min(out) < 1:
        raise ShapeError(f"{op}: kernel {(kd, kh, kw)} with padding {p} and dilation {d} does "
                         f"not fit the input's spatial size {sizes}")
    y = Conv3d.apply(x5, weight, bias, tape=tape, stride=s, padding=p, dilation=d,
                     groups=int(groups))
    return unbatch(y, batched, tape=tape)


class ConvTranspose3d(Function):
    name = "conv_transpose3d"

    def forward(self, x: Tensor, weight: Tensor, bias: Tensor | None, stride=(1, 1, 1),
                padding=(0, 0, 0), dilation=(1, 1, 1), groups: int = 1, out_size=()):
        check_same_queue("conv_transpose3d", *[t for t in (x, weight, bias) if t is not None])
        y = c3k.conv_transpose3d_forward(x, weight, bias, stride, padding, dilation, groups,
                                         out_size)
        if self.recording:
            self.x = x if self.needs_input_grad[1] else None
            self.weight = weight
            self.window = (stride, padding, dilation, groups)
            self.in_size = tuple(x.shape[2:])
        return y

    def backward(self, g: Tensor):
        need = self.needs_input_grad
        return c3k.conv_transpose3d_backward(self.x, self.weight, g, *self.window,
                                             need_input=need[0], need_weight=need[1],
                                             need_bias=need[2], in_size=self.in_size)


def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1, *, tape=None):
    """``torch.nn.functional.conv_transpose3d`` of ``x`` ``(N, C, D, H, W)`` or ``(C, D, H,
    W)`` with ``weight`` ``(cin, cout/groups, kd, kh, kw)``: the gradient of ``conv3d`` with
    respect to its input. Each output dim is ``(n - 1)*stride - 2*padding + dilation*(k - 1)
    + output_padding + 1`` (``output_padding`` smaller than the stride or the dilation).

    >>> tp.conv_transpose3d(x, tp.permute(w, (1, 0, 2, 3, 4)), stride=2).shape
    (2, 5, 9, 13, 13)
    """
    op = "conv_transpose3d"
    wshape = _check(op, x, weight, bias, groups, "(in_channels, out_channels/groups, kd, kh, "
                                                 "kw)")
    s, p = triple(op, "stride", stride), triple(op, "padding", padding, least=0)
    d = triple(op, "dilation", dilation)
    o = triple(op, "output_padding", output_padding, least=0)
    if any(a >= max(st, dd) for a, st, dd in zip(o, s, d)):
        raise ShapeError(f"{op}: output_padding {o} must be smaller than the stride {s} or "
                         f"the dilation {d} (as PyTorch)")
    x5, batched = batched5(op, x, tape)
    c = x5.shape[1]
    cin, cout_g = wshape[:2]
    if c != cin or cin % groups:
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} has {c} channels, weight "
                         f"{wshape} expects {cin} (and groups={groups} must divide them)")
    _check_bias(op, bias, cout_g * groups, wshape)
    out = tuple((m - 1) * st - 2 * pa + dd * (k - 1) + op_ + 1
                for m, st, pa, dd, k, op_ in zip(x5.shape[2:], s, p, d, wshape[2:], o))
    if min(out) < 1:
        raise ShapeError(f"{op}: input of spatial size {tuple(x5.shape[2:])} with kernel "
                         f"{wshape[2:]}, stride {s}, padding {p} and dilation {d} gives no "
                         f"output ({out})")
    y = ConvTranspose3d.apply(x5, weight, bias, tape=tape, stride=s, padding=p, dilation=d,
                              groups=int(groups), out_size=out)
    return unbatch(y, batched, tape=tape)
