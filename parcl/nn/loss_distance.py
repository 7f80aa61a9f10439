"""``TripletMarginWithDistanceLoss``: PyTorch's triplet loss with any distance function
(``tp.triplet_margin_with_distance_loss``; every argument keyword-only, as PyTorch's).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> a = tp.tensor(np.zeros((2, 3), np.float32))
>>> far = tp.tensor(np.full((2, 3), 4.0, np.float32))
>>> loss = pc.nn.TripletMarginWithDistanceLoss(distance_function=tp.pairwise_distance)
>>> loss(a, a, far).item()                      # max(0, 1 + 0 - 6.93)
0.0
"""

from __future__ import annotations

from ..errors import ParclError
from ..tape import ops
from .loss import _Reduced

__all__ = ["TripletMarginWithDistanceLoss"]


class TripletMarginWithDistanceLoss(_Reduced):
    """``TripletMarginWithDistanceLoss(*, distance_function=None, margin=1.0, swap=False,
    reduction="mean")``: ``max(0, margin + d(a, p) - d(a, n))`` with ``d`` the callable
    ``distance_function`` (None: ``tp.pairwise_distance``), ``swap`` as
    ``TripletMarginLoss``'s; ``margin`` must be > 0 (checked here, as PyTorch's)."""

    def __init__(self, *, distance_function=None, margin: float = 1.0, swap: bool = False,
                 reduction: str = "mean"):
        super().__init__(reduction)
        name = "TripletMarginWithDistanceLoss"
        if not float(margin) > 0:
            raise ParclError(f"{name}: margin must be greater than 0, got {margin}")
        if distance_function is not None and not callable(distance_function):
            raise ParclError(f"{name}: distance_function must be a callable of two inputs (or "
                             f"None), got {type(distance_function).__name__}")
        self.distance_function = distance_function
        self.margin, self.swap = float(margin), bool(swap)

    def forward(self, anchor, positive, negative):
        return ops.triplet_margin_with_distance_loss(
            anchor, positive, negative, distance_function=self.distance_function,
            margin=self.margin, swap=self.swap, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, swap={self.swap}, reduction={self.reduction!r}"
