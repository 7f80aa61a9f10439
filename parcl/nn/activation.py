"""Activation layers with PyTorch's names and arguments: ``LeakyReLU``, ``SiLU``, ``Tanh``,
``Sigmoid``, ``ELU``, ``Softplus``. Each is a Module without parameters over one op of
``parcl.tape`` (``ReLU`` lives in ``layers``).

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> act = pc.nn.LeakyReLU(0.1)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.array([-1.0, 2.0], np.float32))
>>> with tp.no_grad():
...     act(x).to_host()
array([-0.1,  2. ], dtype=float32)
"""

from __future__ import annotations

from ..tape import ops
from .module import Module

__all__ = ["ELU", "LeakyReLU", "SiLU", "Sigmoid", "Softplus", "Tanh"]


class LeakyReLU(Module):
    """``x`` where ``x > 0``, else ``negative_slope * x`` (see ``tp.leaky_relu``)."""

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        return ops.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class SiLU(Module):
    """``x * sigmoid(x)`` (see ``tp.silu``)."""

    def forward(self, x):
        return ops.silu(x)


class Tanh(Module):
    """Hyperbolic tangent (see ``tp.tanh``)."""

    def forward(self, x):
        return ops.tanh(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))`` (see ``tp.sigmoid``)."""

    def forward(self, x):
        return ops.sigmoid(x)


class ELU(Module):
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)`` (see ``tp.elu``)."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        return ops.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold`` (see ``tp.softplus``)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x):
        return ops.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"
