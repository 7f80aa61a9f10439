"""3-D convolutions over ``(N, C, D, H, W)`` (or unbatched ``(C, D, H, W)``) volumes and
videos: PyTorch's ``conv3d`` and ``conv_transpose3d``, composed from the 2-D ops so that their
gradients are those ops' (deterministic, no atomics).

``conv3d`` folds the depth into the channels: ``unfold`` with a ``(kd, 1)`` window over the
``(N, C, D, H*W)`` view lays every output depth's ``kd`` input planes side by side as ``C*kd``
channels (rows ``(c, i)``, the order of the weight's ``(cin, kd)`` dims), those become a batch
of ``N*OD`` images, and one ``conv2d`` with the weight viewed ``(cout, cin/groups*kd, kh, kw)``
does the rest (its im2col + GEMM: ``cin*kd*kh*kw`` taps per output, as a 3-D im2col's).
``conv_transpose3d`` runs the other way: ``conv_transpose2d`` of each input plane with the
weight viewed ``(cin, cout*kd, kh, kw)``, then ``fold`` sums the ``kd`` planes each input
plane gives into the output depths they land on.

>>> x = tp.tensor(np.ones((2, 3, 4, 6, 6), np.float32), requires_grad=True)
>>> w = tp.tensor(np.ones((5, 3, 3, 3, 3), np.float32), requires_grad=True)
>>> tp.conv3d(x, w, padding=1).shape, tp.conv3d(x, w, stride=(1, 2, 2)).shape
((2, 5, 4, 6, 6), (2, 5, 2, 2, 2))
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels.conv_geometry import no_spatial_elements
from ...tensor import FLOAT
from .elementwise import add
from .fold import fold, unfold
from .indexing import pad
from .conv import conv_transpose2d
from .nn import conv2d, string_padding
from .shape import permute, reshape, squeeze, unsqueeze

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


def batched5(op: str, x, tape):
    """``x`` as ``(N, C, D, H, W)`` and whether it was batched (``(C, D, H, W)`` gains N=1)."""
    shape = tuple(x.shape)
    if len(shape) not in (4, 5):
        raise ShapeError(f"{op}: expected a 4-d (C, D, H, W) or 5-d (N, C, D, H, W) input, got "
                         f"shape {shape}")
    if 0 in shape[-3:]:
        raise ShapeError(no_spatial_elements(op, shape[-3:]))
    return (x, True) if len(shape) == 5 else (unsqueeze(x, 0, tape=tape), False)


def unbatch(y, batched: bool, tape):
    return y if batched else squeeze(y, 0, tape=tape)


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


def _out_len(op: str, sizes, kernel, stride, padding, dilation) -> tuple[int, ...]:
    out = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                for n, k, s, p, d in zip(sizes, kernel, stride, padding, dilation))
    if min(out) < 1:
        raise ShapeError(f"{op}: kernel {tuple(kernel)} with padding {tuple(padding)} and "
                         f"dilation {tuple(dilation)} does not fit the input's spatial size "
                         f"{tuple(sizes)}")
    return out


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, *,
           tape=None):
    """``torch.nn.functional.conv3d``: cross-correlation of ``x`` ``(N, C, D, H, W)`` or
    ``(C, D, H, W)`` with ``weight`` ``(cout, cin/groups, kd, kh, kw)``; ``stride``,
    ``padding`` and ``dilation`` ints or triples (depth, height, width), ``padding`` also
    ``"valid"`` or ``"same"`` (stride 1; an odd total puts the extra zero after, as PyTorch).
    The depth windows become channels (``unfold``), then one ``conv2d`` over ``N*OD`` images.

    >>> tp.conv3d(x, w, padding="same", dilation=(1, 2, 2)).shape   # x (2, 3, 4, 6, 6)
    (2, 5, 4, 6, 6)
    """
    op = "conv3d"
    wshape = _check(op, x, weight, bias, groups, "(out_channels, in_channels/groups, kd, kh, "
                                                 "kw)")
    s, d = triple(op, "stride", stride), triple(op, "dilation", dilation)
    x5, batched = batched5(op, x, tape)
    n, c = x5.shape[:2]
    cout, cin_g, kd, kh, kw = wshape
    if cout % groups or c % groups or c != cin_g * groups:
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} has {c} channels, weight "
                         f"{wshape} with groups={groups} expects {cin_g * groups} (and groups "
                         f"must divide its {cout} output channels)")
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ShapeError(f"{op}: bias has shape {tuple(bias.shape)}, expected ({cout},) for "
                         f"weight {wshape}")
    if isinstance(padding, str):
        pads = string_padding(op, padding, (kd, kh, kw), s, d)
        p = tuple(a for a, _ in pads)
        if any(a != b for a, b in pads):        # the odd zero after: padded here
            flat = tuple(v for before, after in reversed(pads) for v in (before, after))
            x5, p = pad(x5, flat, tape=tape), (0, 0, 0)
    else:
        p = triple(op, "padding", padding, least=0)
    dd, hh, ww = x5.shape[2:]
    od, oh, ow = _out_len(op, (dd, hh, ww), (kd, kh, kw), s, p, d)
    planes = reshape(x5, (n, c, dd, hh * ww), tape=tape)
    if (kd, s[0], p[0]) == (1, 1, 0):
        stack = planes                                   # (N, C, D, H*W): nothing to unfold
    else:                                                # (N, C*kd, OD*H*W), rows (c, i)
        stack = unfold(planes, (kd, 1), dilation=(d[0], 1), padding=(p[0], 0),
                       stride=(s[0], 1), tape=tape)
    stack = permute(reshape(stack, (n, c * kd, od, hh, ww), tape=tape), (0, 2, 1, 3, 4),
                    tape=tape)
    images = reshape(stack, (n * od, c * kd, hh, ww), tape=tape)
    w2 = reshape(weight, (cout, cin_g * kd, kh, kw), tape=tape)
    y = conv2d(images, w2, bias, stride=s[1:], padding=p[1:], dilation=d[1:], groups=groups,
               tape=tape)                                # (N*OD, cout, OH, OW)
    y = permute(reshape(y, (n, od, cout, oh * ow), tape=tape), (0, 2, 1, 3), tape=tape)
    return unbatch(reshape(y, (n, cout, od, oh, ow), tape=tape), batched, tape)


def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1, *, tape=None):
    """``torch.nn.functional.conv_transpose3d`` of ``x`` ``(N, C, D, H, W)`` or ``(C, D, H,
    W)`` with ``weight`` ``(cin, cout, kd, kh, kw)``: the gradient of ``conv3d`` with respect
    to its input. Each output dim is ``(n - 1)*stride - 2*padding + k + output_padding``
    (``output_padding < stride``). Only ``groups=1`` and ``dilation=1``, as
    ``conv_transpose2d``, which runs each input plane before ``fold`` sums them into depth.

    >>> tp.conv_transpose3d(x, tp.permute(w, (1, 0, 2, 3, 4)), stride=2).shape
    (2, 5, 9, 13, 13)
    """
    op = "conv_transpose3d"
    wshape = _check(op, x, weight, bias, groups, "(in_channels, out_channels, kd, kh, kw)")
    if groups != 1 or triple(op, "dilation", dilation) != (1, 1, 1):
        raise ShapeError(f"{op}: only groups=1 and dilation=1 are supported, got groups="
                         f"{groups!r}, dilation={dilation!r}")
    s, p = triple(op, "stride", stride), triple(op, "padding", padding, least=0)
    o = triple(op, "output_padding", output_padding, least=0)
    if any(a >= b for a, b in zip(o, s)):
        raise ShapeError(f"{op}: output_padding {o} must be smaller than the stride {s} (as "
                         "PyTorch)")
    x5, batched = batched5(op, x, tape)
    n, c, dd, hh, ww = x5.shape
    cin, cout, kd, kh, kw = wshape
    if c != cin:
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} has {c} channels, weight "
                         f"{wshape} expects {cin}")
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ShapeError(f"{op}: bias has shape {tuple(bias.shape)}, expected ({cout},) for "
                         f"weight {wshape}")
    out = tuple((m - 1) * st - 2 * pa + k + op_
                for m, st, pa, k, op_ in zip((dd, hh, ww), s, p, (kd, kh, kw), o))
    if min(out) < 1:
        raise ShapeError(f"{op}: input of spatial size {(dd, hh, ww)} with kernel "
                         f"{(kd, kh, kw)}, stride {s} and padding {p} gives no output "
                         f"({out})")
    od, oh, ow = out
    images = reshape(permute(x5, (0, 2, 1, 3, 4), tape=tape), (n * dd, c, hh, ww), tape=tape)
    w2 = reshape(weight, (cin, cout * kd, kh, kw), tape=tape)
    planes = conv_transpose2d(images, w2, None, stride=s[1:], padding=p[1:],
                              output_padding=o[1:], tape=tape)    # (N*D, cout*kd, OH, OW)
    cols = permute(reshape(planes, (n, dd, cout * kd, oh * ow), tape=tape), (0, 2, 1, 3),
                   tape=tape)                                     # (N, cout*kd, D, OH*OW)
    y = fold(reshape(cols, (n, cout * kd, dd * oh * ow), tape=tape), (od, oh * ow), (kd, 1),
             padding=(p[0], 0), stride=(s[0], 1), tape=tape)
    y = reshape(y, (n, cout, od, oh, ow), tape=tape)
    if bias is not None:
        y = add(y, reshape(bias, (1, cout, 1, 1, 1), tape=tape), tape=tape)
    return unbatch(y, batched, tape)
