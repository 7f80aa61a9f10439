"""Shape layers beyond ``Flatten`` (in ``layers``): PyTorch's ``Unflatten`` and
``ChannelShuffle``.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> pc.nn.Unflatten(1, (2, 3))(tp.tensor(np.ones((4, 6), np.float32))).shape
(4, 2, 3)
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..tape import ops
from .layers import _dim
from .module import Module

__all__ = ["ChannelShuffle", "Unflatten"]


class Unflatten(Module):
    """``tp.unflatten(x, dim, unflattened_size)``: dim ``dim`` split into the sizes given (one
    may be -1); a view, so its gradient is a reshape. The sizes must be a tuple or list of
    ints (PyTorch's named-tensor form, a tuple of ``(name, size)`` pairs, is refused)."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim = _dim("Unflatten", dim)
        sizes = unflattened_size
        if not isinstance(sizes, (tuple, list)) or not sizes or not all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in sizes):
            raise ShapeError(f"Unflatten: unflattened_size must be a non-empty tuple or list "
                             f"of ints, got {unflattened_size!r}")
        self.unflattened_size = tuple(int(s) for s in sizes) if isinstance(sizes, tuple) \
            else [int(s) for s in sizes]

    def forward(self, x):
        return ops.unflatten(x, self.dim, tuple(self.unflattened_size))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class ChannelShuffle(Module):
    """``tp.channel_shuffle(x, groups)``: the channels of ``(N, C, *)`` interleaved across
    ``groups`` groups (ShuffleNet's); no parameters."""

    def __init__(self, groups: int):
        super().__init__()
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
            raise ShapeError(f"ChannelShuffle: groups must be a positive integer, got "
                             f"{groups!r}")
        self.groups = int(groups)

    def forward(self, x):
        return ops.channel_shuffle(x, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"
