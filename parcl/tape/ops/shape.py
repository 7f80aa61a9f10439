"""Shape ops: ``reshape(x, shape)`` (a zero-copy view forward and backward) and
``transpose(x, axes=None)`` (numpy semantics; the backward applies the inverse permutation).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3), np.float32)), requires_grad=True)
>>> tp.transpose(tp.reshape(x, (3, 2))).shape
(2, 3)
"""

from __future__ import annotations

from ...kernels import layout
from ..node import Function

__all__ = ["reshape", "transpose"]


class Reshape(Function):
    name = "reshape"

    def forward(self, x, shape):
        self.in_shape = x.shape
        return x.reshape(shape)

    def backward(self, g):
        return g.reshape(self.in_shape)


class Transpose(Function):
    name = "transpose"

    def forward(self, x, axes=None):
        self.perm = layout.normalize_axes(axes, x.ndim, x.shape)
        return layout.transpose(x, self.perm)

    def backward(self, g):
        inverse = [0] * len(self.perm)
        for i, a in enumerate(self.perm):
            inverse[a] = i
        return layout.transpose(g, inverse)


def reshape(x, shape, *, tape=None):
    """``x`` viewed with a new shape (one dimension may be -1); no copy."""
    if isinstance(shape, int):
        shape = (shape,)
    return Reshape.apply(x, tape=tape, shape=tuple(shape))


def transpose(x, axes=None, *, tape=None):
    """``x`` with its axes permuted (``axes=None`` reverses them), as ``np.transpose``."""
    return Transpose.apply(x, tape=tape, axes=axes)
