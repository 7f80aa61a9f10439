"""PyTorch's special functions and the rest of its unary math: ``acosh asinh atanh`` (and
numpy's names ``arccos arcsin arctan arccosh arcsinh arctanh``), ``deg2rad rad2deg erfc erfinv
lgamma digamma polygamma mvlgamma i0 sinc logit``, ``sgn`` and the mask ``signbit``.

Each is one kernel forward and one backward (``parcl/kernels/elementwise_special.py``) with
PyTorch's values at the poles and its gradients: lgamma's is digamma, digamma's polygamma(1, x),
polygamma(n)'s polygamma(n + 1), erfinv's ``sqrt(pi) / 2 * exp(erfinv(x)**2)``, i0's i1.
The series (digamma, polygamma, erfinv, i0) are float32 and agree with ``torch.special`` in
float64 to about 1e-6 relative.

>>> x = tp.tensor(np.array([0.5, 3.0]), requires_grad=True)
>>> tp.lgamma(x).to_host()
array([0.5723649, 0.6931472], dtype=float32)
>>> tp.digamma(x).to_host()
array([-1.9635105,  0.9227844], dtype=float32)
"""

from __future__ import annotations

import math
from numbers import Integral

from ...errors import DTypeError, ParclError
from ...kernels import elementwise as ew
from ...tensor import Tensor, keep_checks
from ..node import Function
from .activation import _Activation
from .elementwise import _is_scalar
from .mathops import _raw, acos, asin, atan, sign

__all__ = ["acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctanh", "asinh",
           "atanh", "deg2rad", "digamma", "erfc", "erfinv", "i0", "lgamma", "logit",
           "mvlgamma", "polygamma", "rad2deg", "sgn", "signbit", "sinc"]

# unary(name) forward, grad(name + "_backward") on the saved input; a class each so that a
# Node's op_name (and an anomaly report) names the op
_SMOOTH = {name: type(name.capitalize(), (_Activation,), {"name": name})
           for name in ("acosh", "asinh", "atanh", "deg2rad", "rad2deg", "erfc", "lgamma",
                        "digamma", "polygamma", "mvlgamma", "i0", "sinc", "logit",
                        "i1", "i0e", "i1e", "entr")}


class Erfinv(Function):
    """erfinv's gradient reads its output: ``sqrt(pi) / 2 * exp(out ** 2)``."""

    name = "erfinv"

    def forward(self, x):
        out = ew.unary("erfinv", x)
        self.out = out if self.recording else None
        return out

    def backward(self, g):
        return ew.grad("erfinv_backward", self.out, g)


class Ndtr(Function):
    """The standard normal CDF (the family's ``normal_cdf``), the density its gradient."""

    name = "ndtr"

    def forward(self, x):
        self.x = x if self.recording else None
        return ew.unary("normal_cdf", x)

    def backward(self, g):
        return ew.grad("ndtr_backward", self.x, g)


def acosh(x, *, tape=None):
    """Inverse hyperbolic cosine (NaN below 1; gradient ``1 / sqrt(x**2 - 1)``)."""
    return _SMOOTH["acosh"].apply(x, tape=tape)


def asinh(x, *, tape=None):
    """Inverse hyperbolic sine (gradient ``1 / sqrt(x**2 + 1)``)."""
    return _SMOOTH["asinh"].apply(x, tape=tape)


def atanh(x, *, tape=None):
    """Inverse hyperbolic tangent (+-inf at +-1, NaN beyond; gradient ``1 / (1 - x**2)``)."""
    return _SMOOTH["atanh"].apply(x, tape=tape)


# numpy's names, which PyTorch has as aliases
arccos, arcsin, arctan = acos, asin, atan
arccosh, arcsinh, arctanh = acosh, asinh, atanh


def deg2rad(x, *, tape=None):
    """Degrees to radians, ``x * pi / 180`` (the constant rounded to float32, as PyTorch)."""
    return _SMOOTH["deg2rad"].apply(x, tape=tape)


def rad2deg(x, *, tape=None):
    """Radians to degrees, ``x * 180 / pi``."""
    return _SMOOTH["rad2deg"].apply(x, tape=tape)


def erfc(x, *, tape=None):
    """``1 - erf(x)``, accurate where ``erf(x)`` is near 1; gradient ``-2/sqrt(pi) exp(-x**2)``."""
    return _SMOOTH["erfc"].apply(x, tape=tape)


def erfinv(x, *, tape=None):
    """The inverse of ``erf`` on ``(-1, 1)``: +-inf at +-1, NaN beyond, as PyTorch's.

    >>> tp.erfinv(tp.tensor(np.array([0.0, 0.5, 1.0]))).to_host()
    array([0.        , 0.47693628,        inf], dtype=float32)
    """
    return Erfinv.apply(x, tape=tape)


def lgamma(x, *, tape=None):
    """``log(|gamma(x)|)``: +inf at 0 and the negative integers; gradient ``digamma(x)``."""
    return _SMOOTH["lgamma"].apply(x, tape=tape)


def digamma(x, *, tape=None):
    """``d/dx lgamma(x)``: PyTorch's ``copysign(inf, -x)`` at 0 and NaN at the negative
    integers; gradient ``polygamma(1, x)``."""
    return _SMOOTH["digamma"].apply(x, tape=tape)


def _count(op: str, name: str, v, least: int) -> int:
    if not isinstance(v, Integral) or isinstance(v, bool):
        raise DTypeError(f"{op}: {name} must be an int, got {type(v).__name__}")
    if v < least:
        raise ParclError(f"{op}: {name} must be at least {least}, got {v}")
    return int(v)


def polygamma(n: int, x, *, tape=None):
    """``torch.polygamma(n, x)``: the ``n``-th derivative of digamma (``n = 0``: digamma),
    ``(-1)**(n+1) n! zeta(n + 1, x)``; gradient ``polygamma(n + 1, x)``. A negative ``n`` is
    refused, as PyTorch; ``x`` below -4096 gives NaN (its series would take too many terms).

    >>> tp.polygamma(1, tp.tensor(np.array([1.0]))).to_host()          # pi**2 / 6
    array([1.6449342], dtype=float32)
    """
    n = _count("polygamma", "n", n, 0)
    return _SMOOTH["polygamma"].apply(x, tape=tape, p=float(n))


def mvlgamma(x, p: int, *, tape=None):
    """``torch.mvlgamma(x, p)``: the multivariate log-gamma of dimension ``p``,
    ``p (p - 1) / 4 log(pi) + sum(lgamma(x - i / 2) for i < p)``; gradient the sum of the
    digammas. (PyTorch 2.13 no longer checks ``x > (p - 1) / 2``; neither does parcl.)"""
    p = _count("mvlgamma", "p", p, 1)
    return _SMOOTH["mvlgamma"].apply(x, tape=tape, p=float(p),
                                     q=p * (p - 1) / 4 * math.log(math.pi))


def i0(x, *, tape=None):
    """The modified Bessel function of the first kind, order 0; gradient ``i1(x)``."""
    return _SMOOTH["i0"].apply(x, tape=tape)


def sinc(x, *, tape=None):
    """The normalized sinc, ``sin(pi x) / (pi x)``, 1 at 0; gradient 0 at 0, as PyTorch's."""
    return _SMOOTH["sinc"].apply(x, tape=tape)


def logit(x, eps: float | None = None, *, tape=None):
    """``log(z / (1 - z))``, ``z = x`` clamped to ``[eps, 1 - eps]`` when ``eps`` is given
    (then the gradient is 0 outside that range; without it NaN outside ``[0, 1]``, as
    PyTorch's).

    >>> tp.logit(tp.tensor(np.array([0.5, 0.0])), eps=0.25).to_host()
    array([ 0.       , -1.0986123], dtype=float32)
    """
    if eps is None:
        return _SMOOTH["logit"].apply(x, tape=tape, p=-1.0)
    if not _is_scalar(eps):
        raise DTypeError(f"logit: eps must be a number or None, got {type(eps).__name__}")
    # PyTorch takes a negative eps as none
    return _SMOOTH["logit"].apply(x, tape=tape, p=float(eps) if eps >= 0 else -1.0)


def sgn(x, *, tape=None):
    """``torch.sgn``: for real tensors ``sign`` (gradient 0)."""
    return sign(x, tape=tape)


def signbit(x) -> Tensor:
    """1 where ``x``'s sign bit is set (``-0`` included), else 0: a float32 mask, never
    recorded (PyTorch's is a bool tensor)."""
    raw = _raw("signbit", x)
    if not isinstance(raw, Tensor):
        raise DTypeError("signbit: expected a tp.Node or pc.Tensor, got a number")
    return keep_checks(ew.unary("signbit", raw), raw)


# torch.special's own (tp.special; not in tp's namespace, as torch has them only there)
def i1(x, *, tape=None):
    """The modified Bessel function of the first kind, order 1; gradient ``i0 - i1 / x``
    (1/2 at 0)."""
    return _SMOOTH["i1"].apply(x, tape=tape)


def i0e(x, *, tape=None):
    """``exp(-|x|) * i0(x)``, finite where ``i0`` overflows."""
    return _SMOOTH["i0e"].apply(x, tape=tape)


def i1e(x, *, tape=None):
    """``exp(-|x|) * i1(x)``."""
    return _SMOOTH["i1e"].apply(x, tape=tape)


def entr(x, *, tape=None):
    """``-x * log(x)``: 0 at 0, -inf below; gradient ``-(1 + log(x))``."""
    return _SMOOTH["entr"].apply(x, tape=tape)


def ndtr(x, *, tape=None):
    """The standard normal CDF, ``(1 + erf(x / sqrt(2))) / 2``."""
    return Ndtr.apply(x, tape=tape)
