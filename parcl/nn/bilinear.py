"""PyTorch's ``Bilinear`` layer: ``y = x1^T A x2 + b`` over ``tp.bilinear``.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> layer = pc.nn.Bilinear(2, 3, 4)
>>> layer(tp.tensor(np.ones((5, 2), np.float32)), tp.tensor(np.ones((5, 3), np.float32))).shape
(5, 4)
"""

from __future__ import annotations

import math

from ..runtime import default_queue
from ..tape import ops
from .layers import _check_sizes, _param, redraw_uniform
from .module import Module, uniform_

__all__ = ["Bilinear"]


class Bilinear(Module):
    """``Bilinear(in1_features, in2_features, out_features, bias=True)``: weight ``(out, in1,
    in2)`` and bias ``(out,)``, both ~ U(-1/sqrt(in1), 1/sqrt(in1)) as PyTorch's.
    ``layer(input1, input2)`` takes ``(*, in1)`` and ``(*, in2)`` with the same leading dims."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, *, queue=None):
        super().__init__()
        _check_sizes("Bilinear", {"in1_features": in1_features, "in2_features": in2_features,
                                  "out_features": out_features})
        queue = queue if queue is not None else default_queue()
        self.in1_features, self.in2_features = int(in1_features), int(in2_features)
        self.out_features = int(out_features)
        bound = 1.0 / math.sqrt(self.in1_features)
        self.weight = _param(queue, uniform_((self.out_features, self.in1_features,
                                              self.in2_features), bound))
        if bias:
            self.bias = _param(queue, uniform_((self.out_features,), bound))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        """Draw ``weight`` and ``bias`` again as the constructor did, in place, as PyTorch's
        (see ``redraw_uniform``)."""
        redraw_uniform(self, 1.0 / math.sqrt(self.in1_features))

    def forward(self, input1, input2):
        return ops.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
