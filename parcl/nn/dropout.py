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

from ..tape.ops.dropouts import alpha_drop, check_p, drop_channels
from .module import Module

__all__ = ["AlphaDropout", "Dropout1d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout"]



class _ChannelDropout(Module):
    """Zeroes whole channels (dim -1 - ``spatial``) of a batched or unbatched input
    (``tp.dropout1d`` ... ``tp.dropout3d``, errors naming the module)."""

    spatial = 1

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p, self.inplace = check_p(type(self).__name__, p, inplace), False

    def forward(self, x):
        # p again: one assigned after construction is checked as tp.dropout checks it
        name = type(self).__name__
        return drop_channels(name, x, check_p(name, self.p), self.training, self.spatial)

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


class Dropout3d(_ChannelDropout):
    """``Dropout3d(p=0.5, inplace=False)`` over ``(N, C, D, H, W)`` or unbatched
    ``(C, D, H, W)`` (``inplace=True`` refused; other ranks a ``ShapeError``)."""

    spatial = 3


class AlphaDropout(_ChannelDropout):
    """``AlphaDropout(p=0.5, inplace=False)``: while training each element is dropped with
    probability ``p`` to SELU's saturation and the result scaled and shifted so a standard
    normal input keeps mean 0 and variance 1: ``y = a * x + alpha * a * p`` where kept and
    ``alpha * a * (p - 1)`` where dropped, ``a = ((alpha**2 * p + 1) * (1 - p)) ** -0.5``
    (PyTorch's, ``tp.alpha_dropout``); the identity in evaluation, zeros at ``p = 1``."""

    feature = False

    def forward(self, x):
        name = type(self).__name__
        return alpha_drop(name, x, check_p(name, self.p), self.training, self.feature)


class FeatureAlphaDropout(AlphaDropout):
    """``FeatureAlphaDropout(p=0.5, inplace=False)``: ``AlphaDropout`` of whole channels (dims
    0 and 1 pick the mask entry, as PyTorch's; at least 2 dims; ``tp.feature_alpha_dropout``).
    """

    feature = True
