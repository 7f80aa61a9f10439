"""Distances between rows: ``pdist`` (every pair of rows of one matrix) and
``triplet_margin_with_distance_loss`` (the triplet loss with any distance function), as
PyTorch's. Both are composed of tape ops, whose backwards are the gradient.

>>> x = tp.tensor(np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], np.float32))
>>> tp.pdist(x).to_host()
array([ 5., 10.,  5.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ParclError, ShapeError
from ...tensor import FLOAT
from .activation import _number, clamp
from .composed import linalg_vector_norm
from .elementwise import add, minimum, sub
from .loss_margin import check_triplet, pairwise_distance
from .loss_more import _reduce, _tensors
from .picks import constant, index_select

__all__ = ["pdist", "triplet_margin_with_distance_loss"]


def pdist(x, p: float = 2.0, *, tape=None):
    """``torch.pdist``: the ``p``-norm distance between every pair of rows ``i < j`` of an
    ``(N, M)`` input, in row-major order of the pairs: ``(N * (N - 1) / 2,)`` (empty below two
    rows). ``p >= 0`` (``inf`` too); the gradient is 0 where two rows are equal, as PyTorch's.

    >>> tp.pdist(x, p=1).to_host()                 # x (3, 2) above
    array([ 7., 14.,  7.], dtype=float32)
    """
    _tensors("pdist", input=x)
    shape = tuple(x.shape)
    if len(shape) != 2:
        raise ShapeError(f"pdist: only supports 2D tensors (N, M), got input of shape {shape}")
    if x.dtype != FLOAT:
        raise DTypeError(f"pdist: input of shape {shape} has dtype {x.dtype}, expected float32")
    p = _number("pdist", "p", p)
    if not p >= 0:
        raise ParclError(f"pdist: only supports non-negative p values, got p={p}")
    n = shape[0]
    if n < 2:                       # no pairs: an empty result, still a function of x
        return linalg_vector_norm(x[:0], p, 1, tape=tape)
    first, second = np.triu_indices(n, 1)
    pick = [index_select(x, 0, constant(x.queue, rows.astype(np.int32)), tape=tape)
            for rows in (first, second)]
    return linalg_vector_norm(sub(pick[0], pick[1], tape=tape), p, 1, tape=tape)


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None,
                                      margin: float = 1.0, swap: bool = False,
                                      reduction: str = "mean", tape=None):
    """``F.triplet_margin_with_distance_loss``: ``max(0, margin + d(anchor, positive) -
    d(anchor, negative))`` with ``d = distance_function`` (a callable of two inputs giving one
    distance per triplet; default ``tp.pairwise_distance``); ``swap=True`` takes the smaller
    of ``d(anchor, negative)`` and ``d(positive, negative)``. The three have the same number of
    dims; ``margin`` must be > 0.

    >>> cos = lambda a, b: 1.0 - tp.cosine_similarity(a, b)
    >>> tp.triplet_margin_with_distance_loss(a, p, n, distance_function=cos).shape
    ()
    """
    op = "triplet_margin_with_distance_loss"
    m = check_triplet(op, anchor, positive, negative, margin, reduction)
    if distance_function is None:
        def distance_function(a, b):
            return pairwise_distance(a, b, tape=tape)
    elif not callable(distance_function):
        raise ParclError(f"{op}: distance_function must be a callable of two inputs (or None "
                         f"for tp.pairwise_distance), got {type(distance_function).__name__}")
    d_pos = distance_function(anchor, positive)
    d_neg = distance_function(anchor, negative)
    if swap:
        d_neg = minimum(d_neg, distance_function(positive, negative), tape=tape)
    if tuple(d_pos.shape) != tuple(d_neg.shape):
        raise ShapeError(f"{op}: distance_function gave d(anchor, positive) of shape "
                         f"{tuple(d_pos.shape)} but d(anchor, negative) of shape "
                         f"{tuple(d_neg.shape)}; expected one distance per triplet")
    # PyTorch's clamp_min, whose gradient passes at the hinge
    return _reduce(clamp(add(sub(d_pos, d_neg, tape=tape), m, tape=tape), min=0.0, tape=tape),
                   reduction, tape)
