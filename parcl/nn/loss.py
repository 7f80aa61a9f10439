"""Loss modules: PyTorch's ``CrossEntropyLoss``, ``NLLLoss``, ``BCEWithLogitsLoss`` and
``MSELoss`` over the ops of ``parcl.tape.ops`` (mean reduction).

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> loss_fn = pc.nn.CrossEntropyLoss(label_smoothing=0.1)
>>> x = pc.Tensor.from_host(q, np.zeros((2, 3), np.float32))
>>> round(loss_fn(x, pc.Tensor.from_host(q, np.array([0, 2]))).item(), 4)
1.0986
"""

from __future__ import annotations

from ..errors import ParclError
from ..tape import ops
from ..tensor import Tensor
from .module import Module

__all__ = ["BCEWithLogitsLoss", "CrossEntropyLoss", "MSELoss", "NLLLoss"]


def _reduction(cls: str, reduction: str) -> str:
    if reduction != "mean":
        raise ParclError(f"{cls}: reduction={reduction!r} is not supported; parcl's losses "
                         "are means (reduction='mean')")
    return reduction


class CrossEntropyLoss(Module):
    """``tp.cross_entropy(input, target, ignore_index, label_smoothing)``: class indices or
    class probabilities as target."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean"):
        super().__init__()
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.reduction = _reduction("CrossEntropyLoss", reduction)

    def forward(self, input, target):
        return ops.cross_entropy(input, target, ignore_index=self.ignore_index,
                                 label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}"


class NLLLoss(Module):
    """``tp.nll_loss(input, target, ignore_index)`` on log-probabilities."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.ignore_index = int(ignore_index)
        self.reduction = _reduction("NLLLoss", reduction)

    def forward(self, input, target):
        return ops.nll_loss(input, target, ignore_index=self.ignore_index)


class BCEWithLogitsLoss(Module):
    """``tp.binary_cross_entropy_with_logits`` with optional ``weight`` and ``pos_weight``
    tensors, registered as buffers (in ``state_dict`` under those names, as PyTorch)."""

    def __init__(self, weight: Tensor | None = None, reduction: str = "mean",
                 pos_weight: Tensor | None = None):
        super().__init__()
        self.reduction = _reduction("BCEWithLogitsLoss", reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return ops.binary_cross_entropy_with_logits(input, target, self.weight,
                                                    self.pos_weight)


class MSELoss(Module):
    """``tp.mse_loss(input, target)``: the mean of the squared differences."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = _reduction("MSELoss", reduction)

    def forward(self, input, target):
        return ops.mse_loss(input, target)
