"""Activation layers with PyTorch's names and arguments: ``LeakyReLU``, ``SiLU``, ``Tanh``,
``Sigmoid``, ``ELU``, ``Softplus``, ``Hardtanh``, ``ReLU6``, ``Hardsigmoid``, ``Hardswish``,
``Mish``, ``Softsign``, ``LogSigmoid``, ``SELU``, ``CELU``, ``GLU``, ``Tanhshrink``,
``Softmin``, ``Threshold``, ``CosineSimilarity``, ``PairwiseDistance``, ``LogSoftmax``,
``Softmax2d``, ``Hardshrink``, ``Softshrink`` and ``PReLU``.
Each is a Module over one op of ``parcl.tape``, without parameters but ``PReLU``'s slopes
(``ReLU`` lives in ``layers``, ``Softmax`` in ``containers``). ``inplace=True`` is refused:
parcl's ops write new tensors, and a silent copy would not be what the caller asked for.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> act = pc.nn.LeakyReLU(0.1)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.array([-1.0, 2.0], np.float32))
>>> with tp.no_grad():
...     act(x).to_host()
array([-0.1,  2. ], dtype=float32)
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import ops
from .layers import _check_sizes, _dim, _param
from .module import Module

__all__ = ["CELU", "ELU", "GLU", "SELU", "CosineSimilarity", "Hardshrink", "Hardsigmoid",
           "Hardswish", "Softshrink",
           "Hardtanh", "LeakyReLU", "LogSigmoid", "LogSoftmax", "Mish", "PReLU",
           "PairwiseDistance", "ReLU6", "SiLU", "Sigmoid", "Softmax2d", "Softmin", "Softplus",
           "Softsign", "Tanh", "Tanhshrink", "Threshold"]


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


class ReLU6(Hardtanh):
    """``min(max(x, 0), 6)``: PyTorch's ``Hardtanh(0, 6)``, its ``min_val`` and ``max_val``
    attributes read by each call (see ``tp.relu6``)."""

    def __init__(self, inplace: bool = False):
        _no_inplace("ReLU6", inplace)
        super().__init__(0.0, 6.0)

    def extra_repr(self) -> str:
        return ""


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


class Hardshrink(Module):
    """``x`` where ``|x| > lambd``, else 0 (see ``tp.hardshrink``)."""

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = float(lambd)

    def forward(self, x):
        return ops.hardshrink(x, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    """``x`` moved ``lambd`` towards 0, 0 within ``lambd`` of it (see ``tp.softshrink``);
    ``lambd >= 0``."""

    def __init__(self, lambd: float = 0.5):
        super().__init__(lambd)
        if not self.lambd >= 0:
            raise ParclError(f"Softshrink: lambd must be >= 0, got {self.lambd}")

    def forward(self, x):
        return ops.softshrink(x, self.lambd)


class PairwiseDistance(Module):
    """``tp.pairwise_distance(x1, x2, p, eps, keepdim)``: the ``p``-norm of ``x1 - x2 + eps``
    over the last dim."""

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
        super().__init__()
        self.norm, self.eps, self.keepdim = float(p), float(eps), bool(keepdim)

    def forward(self, x1, x2):
        return ops.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class PReLU(Module):
    """``x`` where ``x > 0``, else ``weight * x`` (see ``tp.prelu``): ``weight`` holds
    ``num_parameters`` learnt slopes, all ``init`` at first: one for every channel (dim 1 of
    the input; ``num_parameters`` must then be its size) or one shared by all."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, *, queue=None):
        super().__init__()
        _check_sizes("PReLU", {"num_parameters": num_parameters})
        queue = queue if queue is not None else default_queue()
        self.num_parameters, self.init = int(num_parameters), float(init)
        self.weight = _param(queue, np.full(self.num_parameters, self.init, np.float32))

    def reset_parameters(self) -> None:
        """Every slope ``init`` again, in place, as PyTorch's."""
        self.weight.value.fill_(self.init)

    def forward(self, x):
        return ops.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


def legacy_softmax_dim(layer: str, ndim: int) -> int:
    """PyTorch's choice for ``dim=None`` (0 for 0-, 1- and 3-D inputs, else 1), warned."""
    warnings.warn(f"{layer}: implicit dimension choice has been deprecated; pass dim",
                  UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


class LogSoftmax(Module):
    """``tp.log_softmax`` along ``dim``; ``dim=None`` takes PyTorch's legacy choice with its
    deprecation warning."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = None if dim is None else _dim("LogSoftmax", dim)

    def forward(self, x):
        dim = self.dim if self.dim is not None else legacy_softmax_dim("LogSoftmax",
                                                                       len(x.shape))
        return ops.log_softmax(x, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax2d(Module):
    """``tp.softmax`` over the channels (dim -3) of a ``(C, H, W)`` or ``(N, C, H, W)``
    input, at every position."""

    def forward(self, x):
        if len(x.shape) not in (3, 4):
            raise ShapeError(f"Softmax2d: expected a 3-d or 4-d input, got shape "
                             f"{tuple(x.shape)}")
        return ops.softmax(x, -3)
