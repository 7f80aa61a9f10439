"""PyTorch's deprecated layer names, kept so old code runs: ``NLLLoss2d`` (``NLLLoss``, which
takes ``(N, C, d1, ...)`` inputs itself), with PyTorch's ``FutureWarning``.

>>> import warnings, parcl as pc
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore")
...     loss = pc.nn.NLLLoss2d()
>>> isinstance(loss, pc.nn.NLLLoss)
True
"""

from __future__ import annotations

import warnings

from .loss import NLLLoss

__all__ = ["NLLLoss2d"]


class NLLLoss2d(NLLLoss):
    """``NLLLoss2d(weight=None, *, ignore_index=-100, reduction="mean")``: ``NLLLoss``, warned
    as deprecated (PyTorch's ``FutureWarning``)."""

    def __init__(self, weight=None, *, ignore_index: int = -100, reduction: str = "mean"):
        warnings.warn("`NLLLoss2d` has been deprecated. Please use `NLLLoss` instead as a "
                      "drop-in replacement (it takes (N, C, d1, ...) inputs).", FutureWarning,
                      stacklevel=2)
        super().__init__(weight, ignore_index=ignore_index, reduction=reduction)
