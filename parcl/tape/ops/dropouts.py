"""PyTorch's functional dropouts beside ``dropout``: ``dropout1d``, ``dropout2d``, ``dropout3d``
(whole channels), ``alpha_dropout`` and ``feature_alpha_dropout`` (SELU's). The modules
``pc.nn.Dropout1d`` ... ``FeatureAlphaDropout`` call these.

Every mask is ``tp.dropout`` of ones, so it comes from this thread's dropout generator
(``tp.manual_seed``), is drawn anew by each replay of a captured step and again, the same, by
``tp.checkpoint``'s recomputation; the input is multiplied by it broadcast, so the gradient is
the upstream gradient times the same mask.

>>> tp.manual_seed(0)
>>> y = tp.dropout2d(tp.tensor(np.ones((2, 3, 4, 4), np.float32)), 0.5)
>>> sorted(set(y.to_host().reshape(6, 16).std(1).tolist()))    # each map all 0 or all 2
[0.0]
"""

from __future__ import annotations

import math
import warnings
from numbers import Real

from ...errors import ParclError, ShapeError
from ...tensor import Tensor
from .elementwise import add, mul
from .nn import dropout

__all__ = ["alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "feature_alpha_dropout"]

#: SELU's ``scale * alpha``: its negative saturation is minus this.
SELU_ALPHA = 1.7580993408473766


def check_p(op: str, p, inplace: bool = False) -> float:
    """``p`` as a float in [0, 1] (a ShapeError otherwise); ``inplace=True`` refused."""
    if isinstance(p, bool) or not isinstance(p, Real) or not 0.0 <= p <= 1.0:
        raise ShapeError(f"{op}: dropout probability p must be in [0, 1], got {p!r}")
    if inplace:
        raise ParclError(f"{op}: inplace=True is not supported; parcl's dropout writes a new "
                         "tensor (drop the argument)")
    return float(p)


def channel_mask_shape(op: str, shape: tuple, spatial: int) -> tuple:
    """The keep mask of a channel dropout over ``spatial`` dims: ``(N, C, 1, ...)`` batched,
    ``(C, 1, ...)`` unbatched; other ranks a ShapeError. Two spatial dims take a 3-d input as
    ``(N, C, L)``, with PyTorch's warning."""
    if spatial == 2 and len(shape) == 3:
        warnings.warn(f"{op}: Received a 3D input and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), as "
                      "PyTorch's dropout2d does. To drop the channels of an unbatched (C, H, W) "
                      "input, add the batch dim (x[None])", UserWarning, stacklevel=4)
        return shape[:2] + (1,)
    if spatial == 2 and len(shape) != 4:
        raise ShapeError(f"{op}: expected a 4-d input (N, C, H, W) (or a 3-d one, taken as "
                         f"(N, C, L) as PyTorch), got shape {shape}")
    if len(shape) not in (spatial + 1, spatial + 2):
        raise ShapeError(f"{op}: expected a {spatial + 1}-d (unbatched) or {spatial + 2}-d "
                         f"input, got shape {shape}")
    return shape[:len(shape) - spatial] + (1,) * spatial


def drop_channels(op: str, x, p: float, training: bool, spatial: int, tape=None):
    """The channel dropouts' body (``p`` checked): ``x`` times a broadcast keep mask of
    ``channel_mask_shape``, or ``x`` itself when not training or ``p == 0``."""
    mask_shape = channel_mask_shape(op, tuple(x.shape), spatial)
    if not training or p == 0.0:
        return x
    mask = dropout(Tensor.full(x.queue, mask_shape, 1.0), p, training=True)
    return mul(x, mask, tape=tape)


def dropout1d(x, p: float = 0.5, training: bool = True, inplace: bool = False, *, tape=None):
    """``F.dropout1d``: each channel of ``(N, C, L)`` (or unbatched ``(C, L)``) zeroed with
    probability ``p``, the others scaled by ``1/(1-p)``; ``x`` itself when not training.

    >>> tp.dropout1d(x, 0.5).shape                  # x (2, 3, 5)
    (2, 3, 5)
    """
    return drop_channels("dropout1d", x, check_p("dropout1d", p, inplace), training, 1, tape)


def dropout2d(x, p: float = 0.5, training: bool = True, inplace: bool = False, *, tape=None):
    """``F.dropout2d`` over ``(N, C, H, W)``. A 3-d input is taken as ``(N, C, L)``, each
    ``(n, c)`` row zeroed, with PyTorch's warning (PyTorch's historical behaviour, kept so
    results match; add the batch dim to an unbatched ``(C, H, W)``); other ranks a
    ``ShapeError``."""
    return drop_channels("dropout2d", x, check_p("dropout2d", p, inplace), training, 2, tape)


def dropout3d(x, p: float = 0.5, training: bool = True, inplace: bool = False, *, tape=None):
    """``F.dropout3d`` over ``(N, C, D, H, W)`` or unbatched ``(C, D, H, W)``."""
    return drop_channels("dropout3d", x, check_p("dropout3d", p, inplace), training, 3, tape)


def alpha_drop(op: str, x, p: float, training: bool, feature: bool, tape=None):
    """The alpha dropouts' body (``p`` checked): ``a * (x * m + alpha * (m - 1)) + alpha * a *
    p`` with ``m`` the 0/1 keep mask (PyTorch's), from a ``dropout`` of ones whose kept
    entries are ``1/(1-p)``; per element, or per channel (dims 0 and 1) with ``feature``."""
    shape = tuple(x.shape)
    if feature and len(shape) < 2:
        raise ShapeError(f"{op}: feature dropout needs at least 2 dims (N, C, *), got shape "
                         f"{shape}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return mul(x, 0.0, tape=tape)
    mask_shape = shape[:2] + (1,) * (len(shape) - 2) if feature else shape
    a = 1.0 / math.sqrt((SELU_ALPHA * SELU_ALPHA * p + 1.0) * (1.0 - p))
    keep = dropout(Tensor.full(x.queue, mask_shape, 1.0), p, training=True)
    scale = mul(keep, a * (1.0 - p))
    shift = add(mul(keep, SELU_ALPHA * a * (1.0 - p)), SELU_ALPHA * a * (p - 1.0))
    return add(mul(x, scale, tape=tape), shift, tape=tape)


def alpha_dropout(x, p: float = 0.5, training: bool = False, inplace: bool = False, *,
                  tape=None):
    """``F.alpha_dropout`` (note PyTorch's default ``training=False``): each element dropped
    with probability ``p`` to SELU's saturation, then scaled and shifted so a standard normal
    input keeps mean 0 and variance 1: ``a * x + alpha * a * p`` where kept and
    ``alpha * a * (p - 1)`` where dropped, ``a = ((alpha**2 * p + 1) * (1 - p)) ** -0.5``;
    zeros at ``p = 1``.

    >>> tp.alpha_dropout(x, 0.2, training=True).shape       # x (2, 3, 5)
    (2, 3, 5)
    """
    p = check_p("alpha_dropout", p, inplace)
    return alpha_drop("alpha_dropout", x, p, training, False, tape)


def feature_alpha_dropout(x, p: float = 0.5, training: bool = False, inplace: bool = False,
                          *, tape=None):
    """``F.feature_alpha_dropout``: ``alpha_dropout`` of whole channels (dims 0 and 1 pick the
    mask entry, as PyTorch's; at least 2 dims)."""
    p = check_p("feature_alpha_dropout", p, inplace)
    return alpha_drop("feature_alpha_dropout", x, p, training, True, tape)
