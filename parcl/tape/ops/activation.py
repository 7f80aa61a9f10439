"""Activations with PyTorch's formulas and gradients: ``leaky_relu``, ``silu``, ``softplus``,
``elu``, ``erf``, ``sin``, ``cos``, ``clamp``.

Each is one ``UNARY_OPS`` kernel forward and one ``GRAD_OPS`` kernel backward
(``parcl/kernels/elementwise.py``), both reading the op's float parameters; the backward reads
the saved input. At the kinks the gradient is PyTorch's: ``leaky_relu`` takes the slope at 0,
``elu`` alpha at 0, ``clamp`` passes the gradient where ``min <= x <= max`` (ties included).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([-2.0, 3.0], np.float32)), True)
>>> with tp.Tape() as tape:
...     y = tp.sum(tp.leaky_relu(x, 0.1))
>>> tape.backward(y)
>>> x.grad.to_host()
array([0.1, 1. ], dtype=float32)
"""

from __future__ import annotations

import math

from ...errors import DTypeError, ParclError
from ...kernels import elementwise as ew
from ...kernels import select as sk
from ...kernels.reduction import sum_to_shape
from ...tensor import Tensor
from ..node import Function
from .elementwise import _is_scalar, check_broadcast

__all__ = ["clamp", "cos", "elu", "erf", "leaky_relu", "silu", "sin", "softplus"]


class _Activation(Function):
    """``unary(name, x, p, q)`` forward, ``grad(name + "_backward", x, g, p, q)`` backward."""

    def forward(self, x, p: float = 0.0, q: float = 0.0):
        self.p, self.q = p, q
        self.x = x if self.recording else None
        return ew.unary(self.name, x, p=p, q=q)

    def backward(self, g):
        return ew.grad(f"{self.name}_backward", self.x, g, p=self.p, q=self.q)


class LeakyRelu(_Activation):
    name = "leaky_relu"


class Silu(_Activation):
    name = "silu"


class Softplus(_Activation):
    name = "softplus"


class Elu(_Activation):
    name = "elu"


class Erf(_Activation):
    name = "erf"


class Sin(_Activation):
    name = "sin"


class Cos(_Activation):
    name = "cos"


class Clamp(_Activation):
    name = "clamp"


class ClampBounds(Function):
    """``clamp`` with a tensor bound (``lo``/``hi``: tensors, or None with the number, if any,
    in ``lo_s``/``hi_s``): ``minimum(maximum(x, lo), hi)`` forward, PyTorch's clamp.Tensor
    gradients backward: to ``x`` where ``lo <= x <= hi``, to ``lo`` where ``x < lo`` (and
    ``lo < hi``), to ``hi`` where ``x > hi`` (or ``hi < lo``). A NaN input or bound gives no
    side any; maximum/minimum's partials, which pass a NaN's gradient to both sides, gave
    all three the whole gradient there."""

    name = "clamp"

    def forward(self, x, lo, hi, lo_s=None, hi_s=None):
        lo = lo_s if lo is None else lo
        hi = hi_s if hi is None else hi
        out = x if lo is None else ew.binary("maximum", x, lo)
        out = out if hi is None else ew.binary("minimum", out, hi)
        if self.recording:
            self.x, self.lo, self.hi = x, lo, hi
        return out

    def _masked(self, g, mask, shape):
        # where, not g * mask: an infinite upstream gradient gives 0 outside, as PyTorch's
        return sum_to_shape(sk.where(mask, g, Tensor.zeros(g.queue, ())), shape)

    def backward(self, g):
        x, lo, hi = self.x, self.lo, self.hi
        need = self.needs_input_grad
        gx = glo = ghi = None
        if need[0]:
            mask = None if lo is None else ew.binary("ge", x, lo)
            if hi is not None:
                below = ew.binary("le", x, hi)
                mask = below if mask is None else ew.binary("mul", mask, below)
            gx = self._masked(g, mask, x.shape)
        if need[1]:
            mask = ew.binary("lt", x, lo)
            if hi is not None:
                mask = ew.binary("mul", mask, ew.binary("lt", lo, hi))
            glo = self._masked(g, mask, lo.shape)
        if need[2]:
            mask = ew.binary("gt", x, hi)
            if lo is not None:
                mask = ew.binary("maximum", mask, ew.binary("lt", hi, lo))
            ghi = self._masked(g, mask, hi.shape)
        return gx, glo, ghi


def _number(op: str, what: str, value) -> float:
    if not _is_scalar(value):
        raise DTypeError(f"{op}: {what} must be a Python number, got {type(value).__name__}")
    return float(value)


def leaky_relu(x, negative_slope: float = 0.01, *, tape=None):
    """``x`` where ``x > 0``, else ``negative_slope * x`` (gradient ``negative_slope`` at 0).

    >>> tp.leaky_relu(x, 0.2).to_host()           # x = [-2, 3]
    array([-0.4,  3. ], dtype=float32)
    """
    slope = _number("leaky_relu", "negative_slope", negative_slope)
    return LeakyRelu.apply(x, tape=tape, p=slope)


def silu(x, *, tape=None):
    """``x * sigmoid(x)`` (swish).

    >>> tp.silu(x).shape
    (2,)
    """
    return Silu.apply(x, tape=tape)


def softplus(x, beta: float = 1.0, threshold: float = 20.0, *, tape=None):
    """``log(1 + exp(beta * x)) / beta``, and ``x`` itself where ``beta * x > threshold``
    (PyTorch's rule: no overflow for large inputs; 0, not NaN, for very negative ones).

    >>> tp.softplus(x, beta=2.0).shape
    (2,)
    """
    beta = _number("softplus", "beta", beta)
    threshold = _number("softplus", "threshold", threshold)
    if beta == 0.0:
        raise ParclError("softplus: beta must be nonzero (it divides the result), got 0")
    return Softplus.apply(x, tape=tape, p=beta, q=threshold)


def elu(x, alpha: float = 1.0, *, tape=None):
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)`` (gradient ``alpha`` at 0).

    >>> tp.elu(x).shape
    (2,)
    """
    return Elu.apply(x, tape=tape, p=_number("elu", "alpha", alpha))


def erf(x, *, tape=None):
    """The Gauss error function.

    >>> tp.erf(x).shape
    (2,)
    """
    return Erf.apply(x, tape=tape)


def sin(x, *, tape=None):
    """Sine (radians).

    >>> tp.sin(x).shape
    (2,)
    """
    return Sin.apply(x, tape=tape)


def cos(x, *, tape=None):
    """Cosine (radians).

    >>> tp.cos(x).shape
    (2,)
    """
    return Cos.apply(x, tape=tape)


def clamp(x, min: float | None = None, max: float | None = None, *, tape=None):  # noqa: A002
    """``x`` limited to ``[min, max]`` (either bound may be None), as ``torch.clamp``: NaN
    stays NaN, a NaN bound gives NaN everywhere, ``min > max`` gives ``max`` everywhere,
    and the gradient passes where ``min <= x <= max`` (at a bound too), else 0. Tensor
    bounds (broadcast) are ``minimum(maximum(x, min), max)`` with PyTorch's gradients: to
    ``x`` at ties, to ``min`` where ``x < min < max``, none at a NaN.

    >>> tp.clamp(x, min=0.0).to_host()            # x = [-2, 3]
    array([0., 3.], dtype=float32)
    """
    if min is None and max is None:
        raise ParclError("clamp: at least one of min and max must be given")
    if not all(b is None or _is_scalar(b) for b in (min, max)):
        check_broadcast("clamp", input=x, min=min, max=max)
        lo_s = None if min is None or not _is_scalar(min) else _number("clamp", "min", min)
        hi_s = None if max is None or not _is_scalar(max) else _number("clamp", "max", max)
        return ClampBounds.apply(x, None if lo_s is not None else min,
                                 None if hi_s is not None else max, tape=tape,
                                 lo_s=lo_s, hi_s=hi_s)
    lo = -math.inf if min is None else _number("clamp", "min", min)
    hi = math.inf if max is None else _number("clamp", "max", max)
    return Clamp.apply(x, tape=tape, p=lo, q=hi)
