"""Padding layers with PyTorch's names and arguments: ``ZeroPad1d/2d/3d``,
``ConstantPad1d/2d/3d``, ``ReflectionPad1d/2d/3d``, ``ReplicationPad1d/2d/3d`` and
``CircularPad1d/2d/3d``. Each is a Module
without parameters over ``tp.pad`` in its mode, so its gradient is ``tp.pad``'s (a position
copied several times gets the sum of its copies' gradients, in a fixed order).

``padding`` is an int (every side) or a tuple: ``(left, right)`` for the 1-d layers,
``(left, right, top, bottom)`` for the 2-d ones, ``(left, right, top, bottom, front, back)``
for the 3-d ones. Negative padding crops, as PyTorch's.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> x = tp.tensor(np.arange(3, dtype=np.float32).reshape(1, 3))
>>> pc.nn.ReflectionPad1d((2, 1))(x).to_host()
array([[2., 1., 0., 1., 2., 1.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..tape import ops
from .module import Module

__all__ = ["CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
           "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
           "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d",
           "ZeroPad3d"]


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


class _PadNd(Module):
    """``tp.pad(x, self.padding, mode)`` of a ``(C, *)`` or ``(N, C, *)`` input with
    ``dims`` padded dims."""

    mode = "constant"
    dims = 1

    def __init__(self, padding):
        super().__init__()
        sides = 2 * self.dims
        pad = (padding,) * sides if _is_int(padding) else padding
        if not isinstance(pad, (tuple, list)) or len(pad) != sides \
                or not all(_is_int(p) for p in pad):
            raise ShapeError(f"{type(self).__name__}: padding must be an int or a tuple of "
                             f"{sides} ints, got {padding!r}")
        self.padding = tuple(int(p) for p in pad)

    def _check(self, x) -> None:
        if len(x.shape) not in (self.dims + 1, self.dims + 2):
            raise ShapeError(f"{type(self).__name__}: expected a {self.dims + 1}-d or "
                             f"{self.dims + 2}-d input, got shape {tuple(x.shape)}")

    def forward(self, x):
        self._check(x)
        return ops.pad(x, self.padding, mode=self.mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    """Fills the new positions with ``value`` (their gradient is dropped)."""

    def __init__(self, padding, value: float):
        super().__init__(padding)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ShapeError(f"{type(self).__name__}: value must be a number, got {value!r}")
        self.value = float(value)

    def _check(self, x) -> None:
        # as PyTorch's ConstantPadNd: any input with at least the padded dims
        if len(x.shape) < self.dims:
            raise ShapeError(f"{type(self).__name__}: expected at least {self.dims} dims, got "
                             f"shape {tuple(x.shape)}")

    def forward(self, x):
        self._check(x)
        return ops.pad(x, self.padding, mode="constant", value=self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """``ConstantPad1d(padding, value)``: the last dim padded with ``value``."""

    dims = 1


class ConstantPad2d(_ConstantPadNd):
    """``ConstantPad2d(padding, value)``: the last two dims padded with ``value``."""

    dims = 2


class ConstantPad3d(_ConstantPadNd):
    """``ConstantPad3d(padding, value)``: the last three dims padded with ``value``."""

    dims = 3


class ZeroPad1d(ConstantPad1d):
    """``ZeroPad1d(padding)``: the last dim padded with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad2d(ConstantPad2d):
    """``ZeroPad2d(padding)``: the last two dims padded with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad3d(ConstantPad3d):
    """``ZeroPad3d(padding)``: the last three dims padded with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ReflectionPad1d(_PadNd):
    """``ReflectionPad1d(padding)``: mirrored without repeating the edge (padding smaller
    than the dim); ``(C, W)`` or ``(N, C, W)``."""

    mode = "reflect"


class ReflectionPad2d(_PadNd):
    """``ReflectionPad2d(padding)`` over ``(C, H, W)`` or ``(N, C, H, W)``."""

    mode, dims = "reflect", 2


class ReflectionPad3d(_PadNd):
    """``ReflectionPad3d(padding)`` over ``(C, D, H, W)`` or ``(N, C, D, H, W)``."""

    mode, dims = "reflect", 3


class ReplicationPad1d(_PadNd):
    """``ReplicationPad1d(padding)``: the edge repeated; ``(C, W)`` or ``(N, C, W)``."""

    mode = "replicate"


class ReplicationPad2d(_PadNd):
    """``ReplicationPad2d(padding)`` over ``(C, H, W)`` or ``(N, C, H, W)``."""

    mode, dims = "replicate", 2


class ReplicationPad3d(_PadNd):
    """``ReplicationPad3d(padding)`` over ``(C, D, H, W)`` or ``(N, C, D, H, W)``."""

    mode, dims = "replicate", 3


class CircularPad1d(_PadNd):
    """``CircularPad1d(padding)``: wrapped around (at most once); ``(C, W)`` or
    ``(N, C, W)``."""

    mode = "circular"


class CircularPad2d(_PadNd):
    """``CircularPad2d(padding)`` over ``(C, H, W)`` or ``(N, C, H, W)``."""

    mode, dims = "circular", 2


class CircularPad3d(_PadNd):
    """``CircularPad3d(padding)`` over ``(C, D, H, W)`` or ``(N, C, D, H, W)``."""

    mode, dims = "circular", 3
