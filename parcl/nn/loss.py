"""Loss modules: PyTorch's ``CrossEntropyLoss``, ``NLLLoss`` (with class weights),
``BCEWithLogitsLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``,
``HuberLoss``, ``KLDivLoss``, ``BCELoss``, ``SoftMarginLoss``, ``CosineEmbeddingLoss``
(``reduction=`` 'none', 'mean' or 'sum'; keyword-only where PyTorch's deprecated
``size_average``/``reduce`` come first), over the ops of ``parcl.tape.ops``.

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> loss_fn = pc.nn.CrossEntropyLoss(label_smoothing=0.1)
>>> x = pc.Tensor.from_host(q, np.zeros((2, 3), np.float32))
>>> round(loss_fn(x, pc.Tensor.from_host(q, np.array([0, 2]))).item(), 4)
1.0986
"""

from __future__ import annotations

from ..tape import ops
from ..tape.ops.loss import ignore_index_arg, reduction_arg
from ..tape.ops.loss_more import check_reduction
from ..tensor import Tensor
from .module import Module

__all__ = ["BCELoss", "BCEWithLogitsLoss", "CosineEmbeddingLoss", "CrossEntropyLoss",
           "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss", "NLLLoss", "SmoothL1Loss",
           "SoftMarginLoss"]


class CrossEntropyLoss(Module):
    """``tp.cross_entropy(input, target, ignore_index, label_smoothing, weight=,
    reduction=)``: class indices or class probabilities as target. ``weight``, class weights
    (C,), is PyTorch's first argument and, as there, a buffer (in ``state_dict``); the rest
    are keyword-only (PyTorch's deprecated ``size_average``/``reduce`` come between)."""

    def __init__(self, weight: Tensor | None = None, *, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        self.register_buffer("weight", _class_weight("CrossEntropyLoss", weight))
        self.ignore_index = ignore_index_arg("CrossEntropyLoss", ignore_index)
        self.reduction = reduction_arg("CrossEntropyLoss", reduction)
        self.label_smoothing = float(label_smoothing)

    def forward(self, input, target):
        return ops.cross_entropy(input, target, ignore_index=self.ignore_index,
                                 label_smoothing=self.label_smoothing, weight=self.weight,
                                 reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}")


class NLLLoss(Module):
    """``tp.nll_loss(input, target, ignore_index, weight=, reduction=)`` on
    log-probabilities; ``weight`` as ``CrossEntropyLoss``'s."""

    def __init__(self, weight: Tensor | None = None, *, ignore_index: int = -100,
                 reduction: str = "mean"):
        super().__init__()
        self.register_buffer("weight", _class_weight("NLLLoss", weight))
        self.ignore_index = ignore_index_arg("NLLLoss", ignore_index)
        self.reduction = reduction_arg("NLLLoss", reduction)

    def forward(self, input, target):
        return ops.nll_loss(input, target, ignore_index=self.ignore_index, weight=self.weight,
                            reduction=self.reduction)


def _class_weight(cls: str, weight) -> Tensor | None:
    """PyTorch's ``weight``, the first argument: a pc.Tensor of one weight per class or None
    (an int there, parcl's ``ignore_index`` of old, is a TypeError, not a weight)."""
    if weight is not None and not isinstance(weight, Tensor):
        raise TypeError(f"{cls}: weight, the first argument as in PyTorch, must be a "
                        f"pc.Tensor of one weight per class or None, got {weight!r} (pass "
                        f"ignore_index= and the rest by keyword)")
    return weight


class BCEWithLogitsLoss(Module):
    """``tp.binary_cross_entropy_with_logits`` with optional ``weight`` and ``pos_weight``
    tensors, registered as buffers (in ``state_dict`` under those names, as PyTorch)."""

    def __init__(self, weight: Tensor | None = None, reduction: str = "mean",
                 pos_weight: Tensor | None = None):
        super().__init__()
        self.reduction = reduction_arg("BCEWithLogitsLoss", reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return ops.binary_cross_entropy_with_logits(input, target, self.weight,
                                                    self.pos_weight, reduction=self.reduction)


class MSELoss(Module):
    """``tp.mse_loss(input, target, reduction=)``: the squared differences, their mean by
    default."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction_arg("MSELoss", reduction)

    def forward(self, input, target):
        return ops.mse_loss(input, target, reduction=self.reduction)


class _Reduced(Module):
    """A loss with ``reduction=`` checked at construction, as PyTorch's checks it (late)."""

    allowed = ("none", "mean", "sum")

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = check_reduction(type(self).__name__, reduction, self.allowed)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class L1Loss(_Reduced):
    """``tp.l1_loss(input, target, reduction)``."""

    def __init__(self, *, reduction: str = "mean"):
        super().__init__(reduction)

    def forward(self, input, target):
        return ops.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Reduced):
    """``tp.smooth_l1_loss(input, target, reduction, beta)``."""

    def __init__(self, *, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        self.beta = float(beta)

    def forward(self, input, target):
        return ops.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Reduced):
    """``tp.huber_loss(input, target, reduction, delta)`` (positional, as PyTorch's)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        self.delta = float(delta)

    def forward(self, input, target):
        return ops.huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(_Reduced):
    """``tp.kl_div(input, target, reduction, log_target)``; 'batchmean' too."""

    allowed = ("none", "mean", "sum", "batchmean")

    def __init__(self, *, reduction: str = "mean", log_target: bool = False):
        super().__init__(reduction)
        self.log_target = bool(log_target)

    def forward(self, input, target):
        return ops.kl_div(input, target, self.reduction, self.log_target)


class BCELoss(_Reduced):
    """``tp.binary_cross_entropy(input, target, weight, reduction)``; ``weight`` is a buffer
    (in ``state_dict``, as PyTorch's)."""

    def __init__(self, weight: Tensor | None = None, *, reduction: str = "mean"):
        super().__init__(reduction)
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return ops.binary_cross_entropy(input, target, self.weight, self.reduction)


class SoftMarginLoss(_Reduced):
    """``tp.soft_margin_loss(input, target, reduction)``."""

    def __init__(self, *, reduction: str = "mean"):
        super().__init__(reduction)

    def forward(self, input, target):
        return ops.soft_margin_loss(input, target, self.reduction)


class CosineEmbeddingLoss(_Reduced):
    """``tp.cosine_embedding_loss(input1, input2, target, margin, reduction)``."""

    def __init__(self, margin: float = 0.0, *, reduction: str = "mean"):
        super().__init__(reduction)
        self.margin = float(margin)

    def forward(self, input1, input2, target):
        return ops.cosine_embedding_loss(input1, input2, target, self.margin, self.reduction)
