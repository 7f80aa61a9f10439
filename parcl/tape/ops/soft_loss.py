"""Losses on float targets: cross-entropy with class probabilities (reached through
``tp.cross_entropy`` when the target is float32) and ``binary_cross_entropy_with_logits``.

Both are means over their rows (elements) reduced inside one kernel, and both give gradients
to the target too when it requires grad (as PyTorch does); ``weight`` and ``pos_weight`` are
constants.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.zeros((2, 3), np.float32)), True)
>>> t = pc.Tensor.from_host(q, np.ones((2, 3), np.float32))
>>> round(tp.binary_cross_entropy_with_logits(x, t).item(), 4)
0.6931
"""

from __future__ import annotations

import numpy as np

from ...errors import ParclError
from ...kernels import elementwise as ew
from ...kernels import loss as lk
from ...tensor import Tensor
from ..node import Function

__all__ = ["binary_cross_entropy_with_logits"]


class SoftCrossEntropy(Function):
    """``mean_r -sum_c t'[r, c] log_softmax(x)[r, c]``, ``t' = (1 - e) t + e / C``."""

    name = "cross_entropy"

    def forward(self, logits: Tensor, target: Tensor, label_smoothing: float = 0.0):
        loss, stats = lk.soft_cross_entropy_forward(logits, target, label_smoothing)
        if self.recording:
            self.saved = (logits, target, stats, label_smoothing)
        return loss

    def backward(self, g: Tensor):
        logits, target, stats, eps = self.saved
        return lk.soft_cross_entropy_backward(logits, target, stats, g, eps,
                                              need_logits=self.needs_input_grad[0],
                                              need_target=self.needs_input_grad[1])


class BinaryCrossEntropyWithLogits(Function):
    name = "binary_cross_entropy_with_logits"

    def forward(self, logits: Tensor, target: Tensor, weight: Tensor | None = None,
                pos_weight: Tensor | None = None, reduction: str = "mean"):
        if self.recording and any(self.needs_input_grad[2:]):
            raise ParclError(f"{self.name}: weight and pos_weight are constants here; pass "
                             "tensors that do not require grad (e.g. a raw pc.Tensor)")
        weight = _broadcast(weight, logits.shape)
        pos_weight = _broadcast(pos_weight, logits.shape)
        loss = lk.bce_forward(logits, target, weight, pos_weight, reduction)
        self.reduction = reduction        # a sum over the batch is weighed as one
        if self.recording:
            self.saved = (logits, target, weight, pos_weight)
        return loss

    def backward(self, g: Tensor):
        logits, target, weight, pos_weight = self.saved
        gx, gt = lk.bce_backward(logits, target, weight, pos_weight, g,
                                 need_logits=self.needs_input_grad[0],
                                 need_target=self.needs_input_grad[1],
                                 reduction=self.reduction)
        return gx, gt, None, None


def binary_cross_entropy_with_logits(logits, target, weight=None, pos_weight=None, *,
                                     reduction: str = "mean", tape=None):
    """``torch.nn.functional.binary_cross_entropy_with_logits``, reduced as ``reduction``
    says (``"mean"``, ``"sum"``, or ``"none"``: each element's loss), in its numerically
    stable form ``(1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)`` (no NaN or
    inf for any finite logit). ``target`` has the logits' shape (float32, usually in [0, 1]);
    ``weight`` and ``pos_weight`` broadcast to the logits as PyTorch's: ``(C,)`` per class,
    ``(N, 1)`` per sample for logits ``(N, C)``.

    >>> tp.binary_cross_entropy_with_logits(x, t, pos_weight=pw).shape
    ()
    """
    if reduction not in lk.REDUCTIONS:
        raise ParclError(f"binary_cross_entropy_with_logits: reduction must be 'mean', 'sum' "
                         f"or 'none', got {reduction!r}")
    return BinaryCrossEntropyWithLogits.apply(logits, target, weight, pos_weight, tape=tape,
                                              reduction=reduction)


def _broadcast(t: Tensor | None, shape: tuple) -> Tensor | None:
    """A weight that broadcasts to ``shape`` other than from the trailing dims (a per-sample
    ``(N, 1)``), made ``shape`` (the kernels repeat a weight along the flat input, which only
    trailing dims do); None and trailing weights as they are."""
    if t is None:
        return None
    own = tuple(t.shape)
    while own and own[0] == 1:
        own = own[1:]
    if not own or tuple(shape[len(shape) - len(own):]) == own or len(own) > len(shape):
        return t                          # trailing (or not broadcastable: the kernel says)
    try:
        np.broadcast_shapes(tuple(t.shape), tuple(shape))
    except ValueError:
        return t
    return ew.broadcast_to(t, tuple(shape))
