"""Activation layers with PyTorch's names and arguments: ``LeakyReLU``, ``SiLU``, ``Tanh``,
``Sigmoid``, ``ELU``, ``Softplus``, ``Hardtanh``, ``ReLU6``, ``Hardsigmoid``, ``Hardswish``,
``Mish``, ``Softsign``, ``LogSigmoid``, ``SELU``, ``CELU``, ``GLU``, ``Tanhshrink``,
``Softmin``, ``Threshold``, ``CosineSimilarity``. Each is a Module without parameters over one
op of ``parcl.tape`` (``ReLU`` lives in ``layers``). ``inplace=True`` is refused: parcl's ops
write new tensors, and a silent copy would not be what the caller asked for.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> act = pc.nn.LeakyReLU(0.1)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.array([-1.0, 2.0], np.float32))
>>> with tp.no_grad():
...     act(x).to_host()
array([-0.1,  2. ], dtype=float32)
"""

from __future__ import annotations

from ..errors import ParclError
from ..tape import ops
from .layers import _dim
from .module import Module

__all__ = ["CELU", "ELU", "GLU", "SELU", "CosineSimilarity", "Hardsigmoid", "Hardswish",
           "Hardtanh", "LeakyReLU", "LogSigmoid", "Mish", "ReLU6", "SiLU", "Sigmoid",
           "Softmin", "Softplus", "Softsign", "Tanh", "Tanhshrink", "Threshold"]


def _no_inplace(cls: str, inplace) -> None:
    if inplace:
        raise ParclError(f"{cls}: inplace=True is not supported; parcl's activations write a "
                         "new tensor (drop the argument)")


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


class Hardtanh(Module):
    """``x`` limited to ``[min_val, max_val]`` (see ``tp.hardtanh``)."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        _no_inplace("Hardtanh", inplace)
        self.min_val, self.max_val = float(min_val), float(max_val)
        if self.min_val > self.max_val:       # at construction, as PyTorch's module checks
            raise ParclError(f"Hardtanh: min_val cannot be greater than max_val, got "
                             f"min_val={self.min_val} > max_val={self.max_val}")

    def forward(self, x):
        return ops.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class _Plain(Module):
    """An activation without arguments: ``op`` of ``parcl.tape.ops``."""

    op = ""

    def __init__(self, inplace: bool = False):
        super().__init__()
        _no_inplace(type(self).__name__, inplace)

    def forward(self, x):
        return getattr(ops, self.op)(x)


class ReLU6(_Plain):
    """``min(max(x, 0), 6)`` (see ``tp.relu6``)."""

    op = "relu6"


class Hardsigmoid(_Plain):
    """``relu6(x + 3) / 6`` (see ``tp.hardsigmoid``)."""

    op = "hardsigmoid"


class Hardswish(_Plain):
    """``x * relu6(x + 3) / 6`` (see ``tp.hardswish``)."""

    op = "hardswish"


class Mish(_Plain):
    """``x * tanh(softplus(x))`` (see ``tp.mish``)."""

    op = "mish"


class SELU(_Plain):
    """Scaled ELU with PyTorch's constants (see ``tp.selu``)."""

    op = "selu"


class Softsign(Module):
    """``x / (1 + |x|)`` (see ``tp.softsign``)."""

    def forward(self, x):
        return ops.softsign(x)


class LogSigmoid(Module):
    """``log(sigmoid(x))``, stable (see ``tp.logsigmoid``)."""

    def forward(self, x):
        return ops.logsigmoid(x)


class Tanhshrink(Module):
    """``x - tanh(x)`` (see ``tp.tanhshrink``)."""

    def forward(self, x):
        return ops.tanhshrink(x)


class CELU(Module):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`` (see ``tp.celu``)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        _no_inplace("CELU", inplace)
        self.alpha = float(alpha)

    def forward(self, x):
        return ops.celu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class GLU(Module):
    """``a * sigmoid(b)`` over the halves of ``dim`` (see ``tp.glu``)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = _dim("GLU", dim)

    def forward(self, x):
        return ops.glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(Module):
    """``softmax(-x, dim)`` (see ``tp.softmin``)."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return ops.softmin(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Threshold(Module):
    """``x`` where ``x > threshold``, else ``value`` (see ``tp.threshold``)."""

    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        _no_inplace("Threshold", inplace)
        self.threshold, self.value = float(threshold), float(value)

    def forward(self, x):
        return ops.threshold(x, self.threshold, self.value)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}"


class CosineSimilarity(Module):
    """``tp.cosine_similarity(x1, x2, dim, eps)``."""

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim, self.eps = _dim("CosineSimilarity", dim), float(eps)

    def forward(self, x1, x2):
        return ops.cosine_similarity(x1, x2, self.dim, self.eps)
