"""PyTorch's ``unfold`` (im2col: every sliding window of an image as a column) and ``fold``
(col2im: the columns summed back into an image), each the other's backward, on the patch
kernels the convolutions use (``kernels.conv.im2col`` / ``col2im``: a gather per output
element, no atomics, so bit-reproducible).

``unfold`` of ``(N, C, H, W)`` is ``(N, C*kh*kw, L)``, rows ordered ``(c, i, j)`` and columns
the ``L`` window positions row-major, as PyTorch's; ``fold`` takes that layout and an
``output_size`` back to ``(N, C, H, W)``, overlapping windows summed.

>>> x = tp.tensor(np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3))
>>> tp.unfold(x, 2).to_host()[0]
array([[0., 1., 3., 4.],
       [1., 2., 4., 5.],
       [3., 4., 6., 7.],
       [4., 5., 7., 8.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...kernels.conv import col2im, im2col, swap01
from ...kernels.conv_geometry import out_size
from ...kernels.elementwise import check_float
from ...tensor import Tensor
from ..node import Function
from .shape import as_batched, unbatch

__all__ = ["fold", "unfold"]


def _pair(op: str, name: str, value, least: int) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                 and v >= least for v in pair):
        want = "positive" if least else "non-negative"
        raise ShapeError(f"{op}: {name} must be a {want} int or a pair of them, got {value!r}")
    return int(pair[0]), int(pair[1])


def _window(op: str, kernel_size, dilation, padding, stride) -> dict:
    return {"kernel": _pair(op, "kernel_size", kernel_size, 1),
            "dilation": _pair(op, "dilation", dilation, 1),
            "padding": _pair(op, "padding", padding, 0),
            "stride": _pair(op, "stride", stride, 1)}


def _positions(op: str, hw, w: dict) -> tuple[int, int]:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = w["kernel"], w["stride"], w["padding"], w["dilation"]
    return out_size(op, hw[0], hw[1], kh, kw, sh, sw, ph, pw, dh, dw)


def _im2col(x: Tensor, w: dict, blocks: tuple[int, int]) -> Tensor:
    """``(N, C*kh*kw, L)`` windows of ``x``."""
    n, c = x.shape[:2]
    k, L = c * w["kernel"][0] * w["kernel"][1], blocks[0] * blocks[1]
    cols = im2col(x, 0, n, *w["kernel"], w["stride"], w["padding"], blocks, w["dilation"])
    out = Tensor.empty(x.queue, (n, k, L))
    swap01(cols, 0, out, 0, k, n, L)                    # (K, N, L) -> (N, K, L)
    return out


def _col2im(cols: Tensor, image_shape: tuple, w: dict, blocks: tuple[int, int]) -> Tensor:
    """The ``(N, C*kh*kw, L)`` columns summed into an ``image_shape`` image."""
    n, k, L = cols.shape
    packed = Tensor.empty(cols.queue, (k, n * L))
    swap01(cols, 0, packed, 0, n, k, L)                 # (N, K, L) -> (K, N, L)
    image = Tensor.empty(cols.queue, image_shape)
    col2im(packed, image, 0, n, *w["kernel"], w["stride"], w["padding"], blocks,
           w["dilation"])
    return image


class Unfold(Function):
    name = "unfold"

    def forward(self, x: Tensor, window=None):
        check_float("unfold", x)
        self.window, self.x_shape = window, x.shape
        self.blocks = _positions("unfold", x.shape[2:], window)
        return _im2col(x, window, self.blocks)

    def backward(self, g: Tensor):
        return _col2im(g, self.x_shape, self.window, self.blocks)


class Fold(Function):
    name = "fold"

    def forward(self, x: Tensor, image_shape=(), window=None, blocks=()):
        check_float("fold", x)
        self.window, self.blocks = window, blocks
        return _col2im(x, image_shape, window, blocks)

    def backward(self, g: Tensor):
        return _im2col(g, self.window, self.blocks)


def unfold(x, kernel_size, dilation=1, padding=0, stride=1, *, tape=None):
    """``F.unfold``: the ``kh x kw`` windows of ``(N, C, H, W)`` (or ``(C, H, W)``) as the
    columns of ``(N, C*kh*kw, L)``; its gradient sums each window's gradient back (``fold``)."""
    window = _window("unfold", kernel_size, dilation, padding, stride)
    x4, batched = as_batched("unfold", x, "C, H, W", tape=tape)
    y = Unfold.apply(x4, tape=tape, window=window)
    return unbatch(y, batched, tape=tape)


def fold(x, output_size, kernel_size, dilation=1, padding=0, stride=1, *, tape=None):
    """``F.fold``: the columns of ``(N, C*kh*kw, L)`` (or ``(C*kh*kw, L)``) summed into
    ``(N, C) + output_size`` images; ``L`` must be the number of window positions that
    ``output_size`` holds. Its gradient is ``unfold``."""
    window = _window("fold", kernel_size, dilation, padding, stride)
    size = _pair("fold", "output_size", output_size, 1)
    x3, batched = as_batched("fold", x, "C*kh*kw, L", tape=tape)
    n, k, L = x3.shape
    kh, kw = window["kernel"]
    blocks = _positions("fold", size, window)
    if k % (kh * kw) or L != blocks[0] * blocks[1]:
        raise ShapeError(f"fold: input of shape {tuple(x.shape)} needs dim -2 divisible by "
                         f"kh*kw = {kh * kw} and dim -1 = {blocks[0] * blocks[1]}, the "
                         f"{blocks[0]} x {blocks[1]} window positions of output_size {size}")
    y = Fold.apply(x3, tape=tape, image_shape=(n, k // (kh * kw), *size), window=window,
                   blocks=blocks)
    return unbatch(y, batched, tape=tape)
