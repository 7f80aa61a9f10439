"""Reductions: ``sum(x, axis=None, keepdims=False)`` and ``mean(...)`` (numpy semantics; a full
reduction has shape ``()``). The backward broadcasts the upstream gradient back over the reduced
axes (scaled by 1/count for the mean).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3), np.float32)), requires_grad=True)
>>> with tp.Tape() as tape:
...     loss = tp.mean(x)
>>> tape.backward(loss)
>>> round(float(x.grad.to_host()[0, 0]), 4)   # 1/6
0.1667
"""

from __future__ import annotations

from math import prod

from ...kernels import elementwise as ew
from ...kernels import reduction as rd
from ..node import Function
from .torch_names import torch_names

__all__ = ["mean", "sum"]


class _Reduce(Function):
    def forward(self, x, axis=None, keepdims=False):
        out = self.kernel(x, axis, keepdims)      # checks the axes (its plan is kept per shape)
        if self.recording:
            self.shape = x.shape
            self.axes = rd.normalize_axes(self.name, axis, x.ndim, x.shape)
        return out

    def _expand(self, g, alpha):
        kept = rd.reduced_shape(self.shape, self.axes, keepdims=True)
        return ew.broadcast_to(g.reshape(kept), self.shape, alpha)


class Sum(_Reduce):
    name = "sum"
    kernel = staticmethod(rd.sum)

    def backward(self, g):
        return self._expand(g, 1.0)


class Mean(_Reduce):
    name = "mean"
    kernel = staticmethod(rd.mean)

    def backward(self, g):
        count = prod(self.shape[k] for k in self.axes)
        return self._expand(g, 1.0 / count if count else 0.0)   # 0: a gradient of nothing


@torch_names(empty_dim_is_all=True)
def sum(x, axis=None, keepdims: bool = False, *, tape=None):  # noqa: A001
    """Sum over ``axis`` (None: everything, an int or a tuple of ints)."""
    return Sum.apply(x, tape=tape, axis=axis, keepdims=keepdims)


@torch_names(empty_dim_is_all=True)
def mean(x, axis=None, keepdims: bool = False, *, tape=None):
    """Mean over ``axis`` (None: everything, an int or a tuple of ints)."""
    return Mean.apply(x, tape=tape, axis=axis, keepdims=keepdims)
