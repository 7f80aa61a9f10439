"""1-D convolution and pooling over ``(N, C, L)`` (or unbatched ``(C, L)``): PyTorch's
``conv1d``, ``conv_transpose1d``, ``max_pool1d`` and ``avg_pool1d``, each the 2-D op on an
``(N, C, 1, L)`` view (``unsqueeze``/``squeeze`` are views: no copies), so their gradients are
the 2-D ops'.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 4, 9), np.float32)), True)
>>> w = tp.tensor(pc.Tensor.from_host(q, np.ones((6, 4, 3), np.float32)), True)
>>> tp.conv1d(x, w, padding="same").shape, tp.max_pool1d(x, 2).shape
((2, 6, 9), (2, 4, 4))
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...kernels.conv_geometry import no_spatial_elements, pool_out_len
from .indexing import pad as pad_op
from .conv import conv_transpose2d
from .nn import avg_pool2d, conv2d, max_pool2d
from .shape import as_batched, squeeze, unbatch, unsqueeze

__all__ = ["avg_pool1d", "conv1d", "conv_transpose1d", "max_pool1d"]


def single(op: str, name: str, value, least: int = 1) -> int:
    """An int or a 1-tuple of one (at least ``least``) as an int, else a ShapeError."""
    v = value[0] if isinstance(value, (tuple, list)) and len(value) == 1 else value
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
        want = "a positive integer" if least else "a non-negative integer"
        raise ShapeError(f"{op}: {name} must be {want} or a 1-tuple of one, got {value!r}")
    return int(v)


def _as_2d(op: str, x, tape):
    """``x`` as ``(N, C, 1, L)`` and whether it was batched."""
    x3, batched = as_batched(op, x, "C, L", tape=tape)
    return unsqueeze(x3, 2, tape=tape), batched


def _check_window(op: str, length: int, k: int, s: int, p: int, d: int,
                  ceil_mode: bool) -> None:
    """A 1-D pool's window against its input, in the 1-D terms the caller gave (the 2-D pool
    underneath would name itself and (1, k) pairs). With ``ceil_mode`` a window longer than
    the padded input still gives one output, as PyTorch's, over what it covers."""
    if p > k // 2:
        raise ShapeError(f"{op}: padding {p} must be at most half the kernel size {k} "
                         "(as PyTorch)")
    if length < 1:
        raise ShapeError(no_spatial_elements(op, (length,)))
    if pool_out_len(op, length, k, s, p, d, ceil_mode) < 1:
        raise ShapeError(f"{op}: kernel {k} (dilation {d}) with padding {p} does not fit the "
                         f"input's length {length}")


def _back(y, batched: bool, tape):
    return unbatch(squeeze(y, 2, tape=tape), batched, tape=tape)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, *,
           tape=None):
    """``torch.nn.functional.conv1d``: cross-correlation of ``x`` ``(N, C, L)`` or ``(C, L)``
    with ``weight`` ``(cout, cin/groups, k)``; ``padding`` an int, ``"valid"`` (0) or
    ``"same"`` (stride 1; an odd total padding puts the extra zero on the right, as PyTorch).
    ``conv2d`` on an ``(N, C, 1, L)`` view.

    >>> tp.conv1d(x, w, stride=2, padding=1).shape      # x (2, 4, 9), w (6, 4, 3)
    (2, 6, 5)
    """
    wshape = tuple(weight.shape)
    if len(wshape) != 3:
        raise ShapeError(f"conv1d: weight must be 3-d (out_channels, in_channels/groups, "
                         f"kernel), got shape {wshape}")
    stride = single("conv1d", "stride", stride)
    dilation = single("conv1d", "dilation", dilation)
    x4, batched = _as_2d("conv1d", x, tape)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ShapeError(f"conv1d: padding {padding!r} is not 'same', 'valid' or an int")
        if padding == "same" and stride != 1:
            raise ShapeError(f"conv1d: padding='same' needs stride 1, got stride {stride} "
                             "(as PyTorch)")
        total = dilation * (wshape[2] - 1) if padding == "same" else 0
        left = total // 2
        if total - left != left:              # the odd zero goes right: pad explicitly
            x4 = pad_op(x4, (left, total - left), tape=tape)
            left = 0
    else:
        left = single("conv1d", "padding", padding, least=0)
    y = conv2d(x4, unsqueeze(weight, 2, tape=tape), bias, stride=(1, stride),
               padding=(0, left), dilation=(1, dilation), groups=groups, tape=tape)
    return _back(y, batched, tape)


def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1, *, tape=None):
    """``torch.nn.functional.conv_transpose1d`` of ``x`` ``(N, C, L)`` or ``(C, L)`` with
    ``weight`` ``(cin, cout/groups, k)``: the gradient of ``conv1d`` with respect to its
    input. The output is ``(L - 1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1``
    long (``output_padding`` below the stride or the dilation). ``conv_transpose2d`` on an
    ``(N, C, 1, L)`` view.

    >>> tp.conv_transpose1d(x, tp.reshape(w, (4, 6, 3)), stride=2).shape   # x (2, 4, 9)
    (2, 6, 19)
    """
    wshape = tuple(weight.shape)
    if len(wshape) != 3:
        raise ShapeError(f"conv_transpose1d: weight must be 3-d (in_channels, out_channels, "
                         f"kernel), got shape {wshape}")
    d = single("conv_transpose1d", "dilation", dilation)
    s = single("conv_transpose1d", "stride", stride)
    p = single("conv_transpose1d", "padding", padding, least=0)
    op = single("conv_transpose1d", "output_padding", output_padding, least=0)
    if op >= max(s, d):
        raise ShapeError(f"conv_transpose1d: output_padding {op} must be smaller than the "
                         f"stride {s} or the dilation {d} (as PyTorch)")
    x4, batched = _as_2d("conv_transpose1d", x, tape)
    if x4.shape[1] != wshape[0]:
        raise ShapeError(f"conv_transpose1d: input of shape {tuple(x.shape)} has "
                         f"{x4.shape[1]} channels, weight {wshape} expects {wshape[0]}")
    y = conv_transpose2d(x4, unsqueeze(weight, 2, tape=tape), bias, stride=(1, s),
                         padding=(0, p), output_padding=(0, op), groups=groups,
                         dilation=(1, d), tape=tape)
    return _back(y, batched, tape)


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False, *, tape=None):
    """``torch.nn.functional.max_pool1d`` over ``(N, C, L)`` or ``(C, L)`` (``stride=None``
    means ``kernel_size``; padding counts as -inf, at most half the kernel); ``max_pool2d`` on
    an ``(N, C, 1, L)`` view. ``return_indices=True`` also returns each maximum's position in
    ``L`` (int64, not recorded).

    >>> tp.max_pool1d(x, 3, stride=2, padding=1).shape      # x (2, 4, 9)
    (2, 4, 5)
    """
    k = single("max_pool1d", "kernel_size", kernel_size)
    s = k if stride is None else single("max_pool1d", "stride", stride)
    p = single("max_pool1d", "padding", padding, least=0)
    d = single("max_pool1d", "dilation", dilation)
    x4, batched = _as_2d("max_pool1d", x, tape)
    _check_window("max_pool1d", x4.shape[-1], k, s, p, d, bool(ceil_mode))
    y = max_pool2d(x4, (1, k), stride=(1, s), padding=(0, p), dilation=(1, d),
                   ceil_mode=ceil_mode, return_indices=return_indices, tape=tape)
    if not return_indices:
        return _back(y, batched, tape)
    y, where = y                                    # positions in the (1, L) plane: in L
    shape = where.shape[:2] + where.shape[3:] if batched else where.shape[1:2] + where.shape[3:]
    return _back(y, batched, tape), where.reshape(shape)


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, *, tape=None):
    """``torch.nn.functional.avg_pool1d`` over ``(N, C, L)`` or ``(C, L)``, PyTorch's divisors;
    ``avg_pool2d`` on an ``(N, C, 1, L)`` view.

    >>> tp.avg_pool1d(x, 2).shape      # x (2, 4, 9)
    (2, 4, 4)
    """
    k = single("avg_pool1d", "kernel_size", kernel_size)
    s = k if stride is None else single("avg_pool1d", "stride", stride)
    p = single("avg_pool1d", "padding", padding, least=0)
    x4, batched = _as_2d("avg_pool1d", x, tape)
    _check_window("avg_pool1d", x4.shape[-1], k, s, p, 1, bool(ceil_mode))
    y = avg_pool2d(x4, (1, k), stride=(1, s), padding=(0, p), ceil_mode=ceil_mode,
                   count_include_pad=count_include_pad, tape=tape)
    return _back(y, batched, tape)
