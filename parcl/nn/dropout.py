"""Channel dropout with PyTorch's names: ``Dropout1d``, ``Dropout2d`` and ``Dropout3d``, and
SELU's ``AlphaDropout`` and ``FeatureAlphaDropout``. While
training, each channel of each sample (the whole ``L``, ``H x W`` or ``D x H x W`` map) is
zeroed with probability ``p`` and the others are scaled by ``1/(1-p)``; in evaluation the layer
is the identity.

The ``(N, C)`` keep mask is ``tp.dropout`` of ones, so it comes from this thread's dropout
generator (``pc.manual_seed``): the same seed gives the same channels dropped, in every run
and replica thread. The input is multiplied by it broadcast, so the gradient is the upstream
gradient times the same mask. The alpha dropouts set dropped elements (or channels) to SELU's
negative saturation and rescale, PyTorch's ``a * (x * m + alpha * (m - 1)) + alpha * a * p``,
which keeps a standard-normal input's mean and variance.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> pc.manual_seed(0)
>>> y = pc.nn.Dropout2d(0.5)(tp.tensor(np.ones((2, 3, 4, 4), np.float32)))
>>> sorted(set(y.to_host().reshape(6, 16).std(1).tolist()))    # each map all 0 or all 2
[0.0]
"""

from __future__ import annotations

import math
import warnings
from numbers import Real

from ..errors import ParclError, ShapeError
from ..tape import ops
from ..tensor import Tensor
from .module import Module

__all__ = ["AlphaDropout", "Dropout1d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout"]


class _ChannelDropout(Module):
    """Zeroes whole channels (dim -1 - ``spatial``) of a batched or unbatched input."""

    spatial = 1

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        name = type(self).__name__
        if isinstance(p, bool) or not isinstance(p, Real) or not 0.0 <= p <= 1.0:
            raise ShapeError(f"{name}: dropout probability p must be in [0, 1], got {p!r}")
        if inplace:
            raise ParclError(f"{name}: inplace=True is not supported; parcl's dropout writes a "
                             "new tensor (drop the argument)")
        self.p, self.inplace = float(p), False

    def _mask_shape(self, shape: tuple) -> tuple:
        """The keep mask's shape: ``(N, C, 1, ...)`` batched, ``(C, 1, ...)`` unbatched."""
        name, s = type(self).__name__, self.spatial
        if len(shape) not in (s + 1, s + 2):
            raise ShapeError(f"{name}: expected a {s + 1}-d (unbatched) or {s + 2}-d input, "
                             f"got shape {shape}")
        return shape[:len(shape) - s] + (1,) * s

    def forward(self, x):
        shape = tuple(x.shape)
        mask_shape = self._mask_shape(shape)
        if not self.training or self.p == 0.0:
            return x
        mask = ops.dropout(Tensor.full(x.queue, mask_shape, 1.0), self.p, training=True)
        return ops.mul(x, mask)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_ChannelDropout):
    """``Dropout1d(p=0.5, inplace=False)`` over ``(N, C, L)`` or unbatched ``(C, L)``
    (``inplace=True`` refused)."""

    spatial = 1


class Dropout2d(_ChannelDropout):
    """``Dropout2d(p=0.5, inplace=False)`` over ``(N, C, H, W)``. A 3-d input is taken as
    ``(N, C, L)``, each ``(n, c)`` row zeroed, with PyTorch's warning: PyTorch's historical
    behaviour, kept so results match (an unbatched ``(C, H, W)`` is dropped per row, not per
    channel; add the batch dim). Other ranks are a ``ShapeError``."""

    spatial = 2

    def _mask_shape(self, shape: tuple) -> tuple:
        if len(shape) == 3:
            warnings.warn("Dropout2d: Received a 3D input and assuming that channel-wise 1D "
                          "dropout behavior is desired - input is interpreted as shape (N, C, "
                          "L), as PyTorch's dropout2d does. To drop the channels of an "
                          "unbatched (C, H, W) input, add the batch dim (x[None])",
                          UserWarning, stacklevel=4)
            return shape[:2] + (1,)
        if len(shape) != 4:
            raise ShapeError(f"Dropout2d: expected a 4-d input (N, C, H, W) (or a 3-d one, "
                             f"taken as (N, C, L) as PyTorch), got shape {shape}")
        return shape[:2] + (1, 1)


class Dropout3d(_ChannelDropout):
    """``Dropout3d(p=0.5, inplace=False)`` over ``(N, C, D, H, W)`` or unbatched
    ``(C, D, H, W)`` (``inplace=True`` refused; other ranks a ``ShapeError``)."""

    spatial = 3


SELU_ALPHA = 1.7580993408473766     # SELU's scale * alpha: its negative saturation is -this


class AlphaDropout(_ChannelDropout):
    """``AlphaDropout(p=0.5, inplace=False)``: while training each element is dropped with
    probability ``p`` to SELU's saturation and the result scaled and shifted so a standard
    normal input keeps mean 0 and variance 1: ``y = a * x + alpha * a * p`` where kept and
    ``alpha * a * (p - 1)`` where dropped, ``a = ((alpha**2 * p + 1) * (1 - p)) ** -0.5``
    (PyTorch's); the identity in evaluation, zeros at ``p = 1``."""

    def _mask_shape(self, shape: tuple) -> tuple:
        return shape

    def forward(self, x):
        mask_shape = self._mask_shape(tuple(x.shape))
        p = self.p
        if not self.training or p == 0.0:
            return x
        if not 0.0 <= p <= 1.0:         # a p assigned after construction, as tp.dropout checks
            raise ShapeError(f"{type(self).__name__}: dropout probability p must be in [0, 1], "
                             f"got {p!r}")
        if p == 1.0:
            return ops.mul(x, 0.0)
        a = 1.0 / math.sqrt((SELU_ALPHA * SELU_ALPHA * p + 1.0) * (1.0 - p))
        # the mask's kept entries are 1/(1-p): scaled, they give a * m and the shift
        keep = ops.dropout(Tensor.full(x.queue, mask_shape, 1.0), p, training=True)
        scale = ops.mul(keep, a * (1.0 - p))
        shift = ops.add(ops.mul(keep, SELU_ALPHA * a * (1.0 - p)), SELU_ALPHA * a * (p - 1.0))
        return ops.add(ops.mul(x, scale), shift)


class FeatureAlphaDropout(AlphaDropout):
    """``FeatureAlphaDropout(p=0.5, inplace=False)``: ``AlphaDropout`` of whole channels (dims
    0 and 1 pick the mask entry, as PyTorch's; at least 2 dims)."""

    def _mask_shape(self, shape: tuple) -> tuple:
        if len(shape) < 2:
            raise ShapeError(f"FeatureAlphaDropout: feature dropout needs at least 2 dims "
                             f"(N, C, *), got shape {shape}")
        return shape[:2] + (1,) * (len(shape) - 2)
