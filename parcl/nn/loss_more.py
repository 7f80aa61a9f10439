"""More loss modules: PyTorch's ``MarginRankingLoss``, ``HingeEmbeddingLoss``,
``TripletMarginLoss``, ``MultiMarginLoss``, ``MultiLabelMarginLoss`` and
``MultiLabelSoftMarginLoss`` over the ops of
``parcl.tape.ops.loss_margin``, ``PoissonNLLLoss``, ``GaussianNLLLoss`` and ``CTCLoss`` over
those of ``loss_nll`` (``reduction=`` keyword-only, as the siblings in ``loss.py``;
``weight`` a buffer in ``state_dict``, as PyTorch's ``_WeightedLoss``).

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> scores = pc.Tensor.from_host(q, np.array([[0.1, 0.2, 0.4, 0.8]], np.float32))
>>> round(pc.nn.MultiMarginLoss()(scores, pc.Tensor.from_host(q, np.array([3]))).item(), 4)
0.325
"""

from __future__ import annotations

from ..errors import ParclError, ShapeError
from ..tape import ops
from ..tensor import Tensor
from .loss import _Reduced

__all__ = ["CTCLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "MarginRankingLoss",
           "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss", "MultiMarginLoss",
           "PoissonNLLLoss", "TripletMarginLoss"]


def _weight(cls: str, weight) -> Tensor | None:
    """PyTorch's ``weight``: a 1-D pc.Tensor or None (kept as a buffer)."""
    if weight is None:
        return None
    if not isinstance(weight, Tensor):
        raise TypeError(f"{cls}: weight must be a pc.Tensor or None, got "
                        f"{type(weight).__name__}")
    if weight.ndim != 1:
        raise ShapeError(f"{cls}: weight must be one-dimensional, got {weight.shape}")
    return weight


class MarginRankingLoss(_Reduced):
    """``tp.margin_ranking_loss(input1, input2, target, margin, reduction=)``."""

    def __init__(self, margin: float = 0.0, *, reduction: str = "mean"):
        super().__init__(reduction)
        self.margin = float(margin)

    def forward(self, input1, input2, target):
        return ops.margin_ranking_loss(input1, input2, target, self.margin,
                                       reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


class HingeEmbeddingLoss(_Reduced):
    """``tp.hinge_embedding_loss(input, target, margin, reduction=)``."""

    def __init__(self, margin: float = 1.0, *, reduction: str = "mean"):
        super().__init__(reduction)
        self.margin = float(margin)

    def forward(self, input, target):
        return ops.hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


class TripletMarginLoss(_Reduced):
    """``tp.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap,
    reduction=)``; ``margin`` must be > 0 (checked here, as PyTorch's)."""

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6,
                 swap: bool = False, *, reduction: str = "mean"):
        super().__init__(reduction)
        if not float(margin) > 0:
            raise ParclError(f"TripletMarginLoss: margin must be greater than 0, got {margin}")
        self.margin, self.p, self.eps, self.swap = float(margin), float(p), float(eps), \
            bool(swap)

    def forward(self, anchor, positive, negative):
        return ops.triplet_margin_loss(anchor, positive, negative, self.margin, self.p,
                                       self.eps, self.swap, reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"margin={self.margin}, p={self.p}, eps={self.eps}, swap={self.swap}, "
                f"reduction={self.reduction!r}")


class MultiMarginLoss(_Reduced):
    """``tp.multi_margin_loss(input, target, p, margin, weight, reduction=)``; ``p`` 1 or 2
    (checked here, as PyTorch's), ``weight`` (C,) class weights."""

    def __init__(self, p: int = 1, margin: float = 1.0, weight: Tensor | None = None, *,
                 reduction: str = "mean"):
        super().__init__(reduction)
        if isinstance(p, bool) or p not in (1, 2):
            raise ParclError(f"MultiMarginLoss: only p == 1 and p == 2 supported, got p={p!r}")
        self.p, self.margin = int(p), float(margin)
        self.register_buffer("weight", _weight("MultiMarginLoss", weight))

    def forward(self, input, target):
        return ops.multi_margin_loss(input, target, self.p, self.margin, self.weight,
                                     reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"p={self.p}, margin={self.margin}, reduction={self.reduction!r}"


class MultiLabelMarginLoss(_Reduced):
    """``tp.multilabel_margin_loss(input, target, reduction=)``: int targets of the input's
    shape, each row's labels up to its first -1."""

    def __init__(self, *, reduction: str = "mean"):
        super().__init__(reduction)

    def forward(self, input, target):
        return ops.multilabel_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_Reduced):
    """``tp.multilabel_soft_margin_loss(input, target, weight, reduction=)``."""

    def __init__(self, weight: Tensor | None = None, *, reduction: str = "mean"):
        super().__init__(reduction)
        if weight is not None and not isinstance(weight, Tensor):
            raise TypeError(f"MultiLabelSoftMarginLoss: weight must be a pc.Tensor or None, "
                            f"got {type(weight).__name__}")
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return ops.multilabel_soft_margin_loss(input, target, self.weight,
                                               reduction=self.reduction)


class PoissonNLLLoss(_Reduced):
    """``tp.poisson_nll_loss(input, target, log_input, full, eps=, reduction=)``."""

    def __init__(self, log_input: bool = True, full: bool = False, *, eps: float = 1e-8,
                 reduction: str = "mean"):
        super().__init__(reduction)
        self.log_input, self.full, self.eps = bool(log_input), bool(full), float(eps)

    def forward(self, log_input, target):
        return ops.poisson_nll_loss(log_input, target, self.log_input, self.full, eps=self.eps,
                                    reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"log_input={self.log_input}, full={self.full}, eps={self.eps}, "
                f"reduction={self.reduction!r}")


class GaussianNLLLoss(_Reduced):
    """``tp.gaussian_nll_loss(input, target, var, full, eps, reduction)``, called with
    ``input, target, var``; every argument keyword-only, as PyTorch's."""

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
        super().__init__(reduction)
        self.full, self.eps = bool(full), float(eps)

    def forward(self, input, target, var):
        return ops.gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)

    def extra_repr(self) -> str:
        return f"full={self.full}, eps={self.eps}, reduction={self.reduction!r}"


class CTCLoss(_Reduced):
    """``tp.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction,
    zero_infinity)``; PyTorch's positional order."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction)
        if isinstance(blank, bool) or not isinstance(blank, int) or blank < 0:
            raise ParclError(f"CTCLoss: blank must be a class index, got {blank!r}")
        self.blank, self.zero_infinity = blank, bool(zero_infinity)

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return ops.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                            self.reduction, self.zero_infinity)

    def extra_repr(self) -> str:
        return (f"blank={self.blank}, reduction={self.reduction!r}, "
                f"zero_infinity={self.zero_infinity}")
