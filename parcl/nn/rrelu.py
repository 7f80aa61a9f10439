"""``RReLU``: the randomized leaky ReLU (``tp.rrelu``): random slopes while training, the mean
slope in evaluation.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> layer = pc.nn.RReLU(0.1, 0.3).eval()
>>> layer(tp.tensor(np.array([-2.0, 3.0], np.float32))).to_host()
array([-0.4,  3. ], dtype=float32)
"""

from __future__ import annotations

from ..errors import ParclError
from ..tape import ops
from .module import Module

__all__ = ["RReLU"]


class RReLU(Module):
    """``RReLU(lower=1/8, upper=1/3, inplace=False)``: while training each non-positive
    element is multiplied by a slope drawn uniformly from ``[lower, upper]`` (this thread's
    seeded dropout generator; a captured step's replays draw anew), in evaluation by
    ``(lower + upper) / 2``; ``inplace=True`` refused."""

    def __init__(self, lower: float = 1.0 / 8.0, upper: float = 1.0 / 3.0,
                 inplace: bool = False):
        super().__init__()
        if inplace:
            raise ParclError("RReLU: inplace=True is not supported; parcl's rrelu writes a new "
                             "tensor (drop the argument)")
        if not float(lower) <= float(upper):
            raise ParclError(f"RReLU: lower bound must be less than or equal to upper bound, "
                             f"got lower={lower}, upper={upper}")
        self.lower, self.upper, self.inplace = float(lower), float(upper), False

    def forward(self, x):
        return ops.rrelu(x, self.lower, self.upper, self.training)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}"
