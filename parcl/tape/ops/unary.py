"""Unary elementwise ops: ``neg exp log sqrt abs relu sigmoid tanh gelu``, each one kernel
forward and one backward (the other activations are in ``activation``).

>>> x = tp.tensor(np.array([0.5, -1.0]), requires_grad=True)
>>> with tp.Tape() as tape:
...     y = tp.sum(tp.tanh(x))
>>> tape.backward(y)
>>> x.grad.shape
(2,)
"""

from __future__ import annotations

from ...kernels import elementwise as ew
from ...kernels.gelu import gelu_backward, gelu_forward
from ..node import Function
from .elementwise import _mul_into

__all__ = ["abs", "exp", "gelu", "log", "neg", "relu", "sigmoid", "sqrt", "tanh"]


class Neg(Function):
    name = "neg"

    def forward(self, x):
        return ew.unary("neg", x)

    def backward(self, g):
        return ew.unary("neg", g)


class Exp(Function):
    name = "exp"

    def forward(self, x):
        self.out = ew.unary("exp", x)
        return self.out

    def backward(self, g):
        return ew.binary("mul", g, self.out)


class Log(Function):
    name = "log"

    def forward(self, x):
        self.x = x if self.recording else None
        return ew.unary("log", x)

    def backward(self, g):
        return ew.binary("div", g, self.x)


class Relu(Function):
    name = "relu"
    adds_into = True
    overwrites = ("inplace", 0)

    def forward(self, x, inplace: bool = False):
        if inplace:     # x[key], narrow, ...: a copy, where PyTorch's view passes it on
            x.not_a_copy("relu(inplace=True)")
        self.out = ew.unary("relu", x, out=x if inplace else None)
        return self.out

    def backward(self, g):
        # out > 0 exactly where x > 0
        return ew.relu_backward(self.out, g, acc=self.also_into)


class Sigmoid(Function):
    name = "sigmoid"
    adds_into = True

    def forward(self, x):
        self.out = ew.unary("sigmoid", x)
        return self.out

    def backward(self, g):
        return ew.sigmoid_backward(self.out, g, acc=self.also_into)


class Tanh(Function):
    name = "tanh"
    adds_into = True

    def forward(self, x):
        self.out = ew.unary("tanh", x)
        return self.out

    def backward(self, g):
        return ew.tanh_backward(self.out, g, acc=self.also_into)


class Gelu(Function):
    name = "gelu"

    def forward(self, x, approximate: str = "none"):
        self.x = x if self.recording else None
        self.op = "gelu" if approximate == "none" else "gelu_tanh"
        return gelu_forward(x) if self.op == "gelu" else ew.unary(self.op, x)

    def backward(self, g):
        if self.op == "gelu":
            return gelu_backward(self.x, g)
        return ew.binary("gelu_tanh_backward", self.x, g)


class Sqrt(Function):
    name = "sqrt"
    adds_into = True

    def forward(self, x):
        self.out = ew.unary("sqrt", x)
        return self.out

    def backward(self, g):
        return ew.sqrt_backward(self.out, g, acc=self.also_into)


class Abs(Function):
    name = "abs"

    def forward(self, x):
        self.x = x if self.recording else None
        return ew.unary("abs", x)

    def backward(self, g):
        return _mul_into(ew.unary("sign", self.x), g)


def neg(x, *, tape=None):
    """``-x``."""
    return Neg.apply(x, tape=tape)


def exp(x, *, tape=None):
    """``e ** x``."""
    return Exp.apply(x, tape=tape)


def log(x, *, tape=None):
    """Natural logarithm."""
    return Log.apply(x, tape=tape)


def relu(x, inplace: bool = False, *, tape=None):
    """``max(x, 0)``; gradient 0 at 0.

    ``inplace=True`` overwrites ``x``'s buffer (as PyTorch's ``inplace``) instead of
    allocating the output. A leaf that requires grad cannot be changed in place, and an op
    recorded before that saved ``x`` for its backward (``x * x``, say) makes the backward
    raise a ``ParclError`` instead of computing its gradient from the overwritten values.
    """
    return Relu.apply(x, tape=tape, inplace=bool(inplace))



def sigmoid(x, *, tape=None):
    """``1 / (1 + e ** -x)``."""
    return Sigmoid.apply(x, tape=tape)


def tanh(x, *, tape=None):
    """Hyperbolic tangent."""
    return Tanh.apply(x, tape=tape)


def gelu(x, approximate: str = "none", *, tape=None):
    """GELU as PyTorch: exact ``0.5 * x * (1 + erf(x / sqrt(2)))`` (``approximate="none"``),
    or GPT-2's ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` (``"tanh"``).

    >>> tp.gelu(x, approximate="tanh").shape
    (3,)
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(x, tape=tape, approximate=approximate)


def sqrt(x, *, tape=None):
    """Square root."""
    return Sqrt.apply(x, tape=tape)


def abs(x, *, tape=None):  # noqa: A001
    """``|x|``; gradient 0 at 0."""
    return Abs.apply(x, tape=tape)
