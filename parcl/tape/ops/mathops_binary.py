"""PyTorch's remaining binary pointwise math: ``xlogy logaddexp logaddexp2 fmax fmin ldexp
copysign`` (differentiable, PyTorch's gradients), ``floor_divide`` and ``heaviside`` (whose
backward is an error, as PyTorch's), and the aliases ``true_divide`` (``div``) and
``float_power`` (``pow`` in float32: parcl holds float32 data, where PyTorch's result is
float64).

Each is one broadcasting kernel forward (``parcl/kernels/elementwise_special.py``) and one
kernel per input's partial derivative backward; a number on either side becomes a 0-d tensor.

>>> a = tp.tensor(np.array([0.0, 2.0, np.nan]), requires_grad=True)
>>> tp.xlogy(a, 4.0).to_host()
array([0.       , 2.7725887,       nan], dtype=float32)
>>> tp.fmax(a, 1.0).to_host()                               # a NaN loses to a number
array([1., 2., 1.], dtype=float32)
"""

from __future__ import annotations

from ...errors import DTypeError, ParclError
from ...kernels import elementwise as ew
from ...tensor import Tensor
from ..node import Function, Node
from .elementwise import _is_scalar, _Partials, div, pow

__all__ = ["copysign", "float_power", "floor_divide", "fmax", "fmin", "heaviside", "ldexp",
           "logaddexp", "logaddexp2", "true_divide", "xlogy"]

# op name -> the kernels of its two partial derivatives (broadcast, then summed back)
_PARTIALS = {"xlogy": ("xlogy_grad_a", "xlogy_grad_b"),
             "xlog1py": ("xlog1py_grad_a", "xlog1py_grad_b"),
             "logaddexp": ("logaddexp_grad_a", "logaddexp_grad_b"),
             "logaddexp2": ("logaddexp2_grad_a", "logaddexp2_grad_b"),
             "fmax": ("fmax_grad_a", "fmax_grad_b"),
             "fmin": ("fmin_grad_a", "fmin_grad_b"),
             "ldexp": ("ldexp_grad_a", "ldexp_grad_b"),
             "copysign": ("copysign_grad_a", "copysign_grad_b")}
_OPS = {name: type(name.capitalize(), (_Partials,), {"name": name, "kernel": name,
                                                     "partials": partials})
        for name, partials in _PARTIALS.items()}


class _NotDifferentiable(Function):
    """A binary op PyTorch gives no derivative: its backward raises, as PyTorch's does."""

    def forward(self, a, b):
        return ew.binary(self.name, a, b)

    def backward(self, g):
        raise ParclError(f"{self.name}: the derivative is not implemented (as PyTorch's); "
                         "compute it outside the tape (tp.no_grad) or detach its inputs")


class FloorDivide(_NotDifferentiable):
    name = "floor_divide"


class Heaviside(_NotDifferentiable):
    name = "heaviside"


def _operands(op: str, a, b) -> tuple:
    """``a`` and ``b`` as tensors or Nodes: a number becomes a 0-d tensor on the other's
    queue; two numbers, or anything else, are a DTypeError naming ``op``."""
    for v in (a, b):
        if not isinstance(v, (Node, Tensor)) and not _is_scalar(v):
            raise DTypeError(f"{op}: expected tp.Node, pc.Tensor or number operands, got "
                             f"{type(v).__name__}")
    if _is_scalar(a) and _is_scalar(b):
        raise DTypeError(f"{op}: both operands are numbers; pass a tp.Node or pc.Tensor")
    if _is_scalar(a):
        a = Tensor.full(b.queue, (), float(a))
    elif _is_scalar(b):
        b = Tensor.full(a.queue, (), float(b))
    return a, b


def _apply(op: str, a, b, tape):
    return _OPS[op].apply(*_operands(op, a, b), tape=tape)


def xlogy(input, other, *, tape=None):  # noqa: A002
    """``torch.xlogy``: ``input * log(other)``, 0 where ``input == 0`` (NaN where ``other``
    is); broadcasting, either side a number. Gradients ``log(other)`` (0 where ``input ==
    0`` and ``other <= 0``, as PyTorch's) and ``input / other``."""
    return _apply("xlogy", input, other, tape)


def xlog1py(input, other, *, tape=None):  # noqa: A002
    """``torch.special.xlog1py`` (``tp.special``): ``input * log1p(other)`` with ``xlogy``'s
    rules (0 where ``input == 0``, NaN where ``other`` is NaN)."""
    return _apply("xlog1py", input, other, tape)


def logaddexp(input, other, *, tape=None):  # noqa: A002
    """``log(exp(input) + exp(other))`` without overflow (``max + log1p(exp(-|d|))``); two
    equal infinities give themselves. Gradients ``sigmoid(input - other)`` and its mirror.

    >>> tp.logaddexp(tp.tensor(np.array([1000.0])), 1000.0).to_host()
    array([1000.6932], dtype=float32)
    """
    return _apply("logaddexp", input, other, tape)


def logaddexp2(input, other, *, tape=None):  # noqa: A002
    """``log2(2**input + 2**other)`` without overflow."""
    return _apply("logaddexp2", input, other, tape)


def fmax(input, other, *, tape=None):  # noqa: A002
    """``torch.fmax``: the larger of the two, where a NaN loses to a number (``maximum``
    propagates it); NaN only where both are. The gradient goes to ``input`` where
    ``input >= other`` or ``other`` is NaN, else to ``other``, as PyTorch's."""
    return _apply("fmax", input, other, tape)


def fmin(input, other, *, tape=None):  # noqa: A002
    """``torch.fmin``: the smaller, a NaN losing to a number; gradient to ``input`` where
    ``input <= other`` or ``other`` is NaN, else to ``other``."""
    return _apply("fmin", input, other, tape)


def ldexp(input, other, *, tape=None):  # noqa: A002
    """``input * 2 ** other`` (PyTorch's ``ldexp``, float exponents too); gradients
    ``2 ** other`` and ``input * 2 ** other * ln 2``."""
    return _apply("ldexp", input, other, tape)


def copysign(input, other, *, tape=None):  # noqa: A002
    """``|input|`` with ``other``'s sign (``-0`` and negative NaNs count as negative).
    Gradient ``copysign(input, other) / input`` (0 where ``input == 0``) for ``input``, zero
    for ``other``, as PyTorch's."""
    return _apply("copysign", input, other, tape)


def floor_divide(input, other, *, tape=None):  # noqa: A002
    """``torch.floor_divide``: ``floor(input / other)``, computed as PyTorch's (through fmod,
    so ``floor_divide(-7, 2)`` is -4 exactly). Its backward raises, as PyTorch's."""
    return FloorDivide.apply(*_operands("floor_divide", input, other), tape=tape)


def heaviside(input, values, *, tape=None):  # noqa: A002
    """``torch.heaviside``: 0 where ``input < 0``, ``values`` where ``input == 0``, 1 where
    ``input > 0`` (and 0 for NaN, as PyTorch's); broadcasting. Its backward raises, as
    PyTorch's."""
    return Heaviside.apply(*_operands("heaviside", input, values), tape=tape)


def true_divide(dividend, divisor, *, tape=None):
    """``torch.true_divide``: ``div``."""
    return div(dividend, divisor, tape=tape)


def float_power(input, exponent, *, tape=None):  # noqa: A002
    """``torch.float_power`` as ``pow``, but in float32: PyTorch computes and returns
    float64; parcl holds float32 data only, so the result (and its precision) is float32."""
    return pow(input, exponent, tape=tape)
