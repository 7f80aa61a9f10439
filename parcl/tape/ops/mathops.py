"""PyTorch's pointwise math: ``reciprocal rsqrt square log1p expm1 log2 log10 tan sinh cosh
asin acos atan atan2 lerp``, the rounding ops ``floor ceil round trunc sign`` (gradient zero
everywhere, as PyTorch's), the comparisons ``eq ne lt le gt ge`` and the tests ``isnan
isfinite`` (float32 0/1 masks, as ``Tensor < x`` gives and ``tp.where`` takes; never
recorded; the comparisons take int32/int64 tensors too, ``parcl/kernels/compare.py``), and
``clip`` (``clamp``).

Each differentiable one is a ``UNARY_OPS`` kernel forward and a ``GRAD_OPS`` kernel backward on
the saved input (``parcl/kernels/elementwise_ops.py``), with PyTorch's formulas and edge
values: ``rsqrt(0)`` is inf, ``log1p(-1)`` is -inf, ``atan2(0, 0)`` has gradient 0.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([0.25, 4.0], np.float32)), True)
>>> tp.rsqrt(x).to_host()
array([2. , 0.5], dtype=float32)
>>> tp.gt(x, 1.0).to_host()
array([0., 1.], dtype=float32)
"""

from __future__ import annotations

from ...errors import DTypeError
from ...kernels import compare as int_compare
from ...kernels import elementwise as ew
from ...tensor import Tensor, keep_checks
from ..node import Function, Node
from .activation import _Activation, clamp
from .elementwise import _is_scalar, _Partials, add, check_broadcast, mul, sub
from .select import where

__all__ = ["acos", "asin", "atan", "atan2", "ceil", "clip", "cosh", "eq", "expm1", "floor",
           "ge", "gt", "isfinite", "isnan", "le", "lerp", "log10", "log1p", "log2", "lt", "ne",
           "reciprocal", "round", "rsqrt", "sign", "sinh", "square", "tan", "trunc"]

# Ops whose backward is the GRAD_OPS kernel "<name>_backward" on the saved input; one class
# each so that a Node's op_name (and an anomaly report) names the op.
_SMOOTH = {name: type(name.capitalize(), (_Activation,), {"name": name})
           for name in ("reciprocal", "rsqrt", "square", "log1p", "expm1", "log2", "log10",
                        "tan", "sinh", "cosh", "asin", "acos", "atan")}


class _Step(Function):
    """A piecewise-constant op: its gradient is zero everywhere (PyTorch's, at the jumps too)."""

    kernel = ""

    def forward(self, x, p: float = 0.0, q: float = 0.0):
        return ew.unary(self.kernel, x, p=p, q=q)

    def backward(self, g):
        return Tensor.zeros(g.queue, g.shape)


_STEP = {name: type(name.capitalize(), (_Step,), {"name": name, "kernel": name})
         for name in ("floor", "ceil", "trunc", "sign", "round")}


class RoundDecimals(_Step):
    name, kernel = "round", "round_decimals"


class Atan2(_Partials):
    name = kernel = "atan2"
    partials = ("atan2_grad_a", "atan2_grad_b")


def reciprocal(x, *, tape=None):
    """``1 / x`` (inf at 0)."""
    return _SMOOTH["reciprocal"].apply(x, tape=tape)


def rsqrt(x, *, tape=None):
    """``1 / sqrt(x)`` (inf at 0, NaN below)."""
    return _SMOOTH["rsqrt"].apply(x, tape=tape)


def square(x, *, tape=None):
    """``x * x``."""
    return _SMOOTH["square"].apply(x, tape=tape)


def log1p(x, *, tape=None):
    """``log(1 + x)``, accurate for small ``x``."""
    return _SMOOTH["log1p"].apply(x, tape=tape)


def expm1(x, *, tape=None):
    """``exp(x) - 1``, accurate for small ``x``."""
    return _SMOOTH["expm1"].apply(x, tape=tape)


def log2(x, *, tape=None):
    """Base-2 logarithm."""
    return _SMOOTH["log2"].apply(x, tape=tape)


def log10(x, *, tape=None):
    """Base-10 logarithm."""
    return _SMOOTH["log10"].apply(x, tape=tape)


def tan(x, *, tape=None):
    """Tangent (radians)."""
    return _SMOOTH["tan"].apply(x, tape=tape)


def sinh(x, *, tape=None):
    """Hyperbolic sine."""
    return _SMOOTH["sinh"].apply(x, tape=tape)


def cosh(x, *, tape=None):
    """Hyperbolic cosine."""
    return _SMOOTH["cosh"].apply(x, tape=tape)


def asin(x, *, tape=None):
    """Arcsine (NaN outside [-1, 1]; gradient inf at +-1, as PyTorch's)."""
    return _SMOOTH["asin"].apply(x, tape=tape)


def acos(x, *, tape=None):
    """Arccosine (NaN outside [-1, 1])."""
    return _SMOOTH["acos"].apply(x, tape=tape)


def atan(x, *, tape=None):
    """Arctangent."""
    return _SMOOTH["atan"].apply(x, tape=tape)


def atan2(a, b, *, tape=None):
    """``torch.atan2(a, b)``: the angle of ``(b, a)`` in ``[-pi, pi]``, broadcasting; both are
    tensors (as PyTorch's). Gradients ``b / (a^2 + b^2)`` and ``-a / (a^2 + b^2)``, 0 at
    ``(0, 0)``.

    >>> tp.atan2(x, x).shape
    (2,)
    """
    for v in (a, b):
        if not isinstance(v, (Node, Tensor)):
            raise DTypeError(f"atan2: expected tp.Node or pc.Tensor operands, got "
                             f"{type(v).__name__} (wrap a number with pc.Tensor.full)")
    return Atan2.apply(a, b, tape=tape)


def floor(x, *, tape=None):
    """Largest integer ``<= x`` (gradient 0)."""
    return _STEP["floor"].apply(x, tape=tape)


def ceil(x, *, tape=None):
    """Smallest integer ``>= x`` (gradient 0)."""
    return _STEP["ceil"].apply(x, tape=tape)


def trunc(x, *, tape=None):
    """``x`` rounded toward zero (gradient 0)."""
    return _STEP["trunc"].apply(x, tape=tape)


def sign(x, *, tape=None):
    """-1, 0 or 1 by the sign of ``x`` (0 for NaN, as PyTorch's CPU kernel; gradient 0)."""
    return _STEP["sign"].apply(x, tape=tape)


def round(x, decimals: int = 0, *, tape=None):  # noqa: A001
    """``torch.round``: halves to even; ``decimals`` digits after the point (negative: before
    it), as ``rint(x * 10**d) / 10**d``. Gradient 0.

    >>> tp.round(x).to_host()                 # x = [0.25, 4]
    array([0., 4.], dtype=float32)
    """
    if not isinstance(decimals, int) or isinstance(decimals, bool):
        raise DTypeError(f"round: decimals must be an int, got {type(decimals).__name__}")
    if decimals == 0:
        return _STEP["round"].apply(x, tape=tape)
    ten_pow = 10.0 ** abs(decimals)
    return RoundDecimals.apply(x, tape=tape, p=ten_pow, q=1.0 if decimals > 0 else -1.0)


def lerp(a, b, weight, *, tape=None):
    """``torch.lerp``: ``a + weight * (b - a)``, broadcasting; ``weight`` a number or a tensor.
    PyTorch's two-sided form (``b - (b - a) * (1 - weight)`` for ``weight >= 0.5``), so that
    ``weight = 1`` gives ``b`` exactly; gradients reach all three.

    >>> tp.lerp(x, x * 3.0, 0.5).to_host()
    array([0.5, 8. ], dtype=float32)
    """
    check_broadcast("lerp", input=a, end=b,
                    weight=weight if isinstance(weight, (Node, Tensor)) else None)
    diff = sub(b, a, tape=tape)
    if _is_scalar(weight):
        w = float(weight)
        if w < 0.5:
            return add(a, mul(diff, w, tape=tape), tape=tape)
        return sub(b, mul(diff, 1.0 - w, tape=tape), tape=tape)
    if not isinstance(weight, (Node, Tensor)):
        raise DTypeError(f"lerp: weight must be a number or a tensor, got "
                         f"{type(weight).__name__}")
    low = ew.binary("lt", weight.value if isinstance(weight, Node) else weight, 0.5)
    near_a = add(a, mul(diff, weight, tape=tape), tape=tape)
    near_b = sub(b, mul(diff, sub(1.0, weight, tape=tape), tape=tape), tape=tape)
    return where(low, near_a, near_b, tape=tape)


def _raw(op: str, v):
    if isinstance(v, Node):
        return v.value
    if isinstance(v, Tensor) or _is_scalar(v):
        return v
    raise DTypeError(f"{op}: expected a tp.Node, pc.Tensor or number, got {type(v).__name__}")


def _compare(op: str, a, b) -> Tensor:
    a, b = _raw(op, a), _raw(op, b)
    if _is_scalar(a) and _is_scalar(b):
        raise DTypeError(f"{op}: both operands are numbers; pass a tp.Node or pc.Tensor")
    if int_compare.is_integer(a) or int_compare.is_integer(b):      # int32/int64 labels
        return keep_checks(int_compare.compare(op, a, b), a, b)
    return keep_checks(ew.binary(op, a, b), a, b)


def eq(a, b) -> Tensor:
    """``a == b`` as a float32 0/1 mask, broadcasting (NaN equals nothing); not recorded.

    >>> tp.eq(x, 4.0).to_host()
    array([0., 1.], dtype=float32)
    """
    return _compare("eq", a, b)


def ne(a, b) -> Tensor:
    """``a != b`` as a float32 0/1 mask (1 where either is NaN)."""
    return _compare("ne", a, b)


def lt(a, b) -> Tensor:
    """``a < b`` as a float32 0/1 mask."""
    return _compare("lt", a, b)


def le(a, b) -> Tensor:
    """``a <= b`` as a float32 0/1 mask."""
    return _compare("le", a, b)


def gt(a, b) -> Tensor:
    """``a > b`` as a float32 0/1 mask."""
    return _compare("gt", a, b)


def ge(a, b) -> Tensor:
    """``a >= b`` as a float32 0/1 mask."""
    return _compare("ge", a, b)


def isnan(x) -> Tensor:
    """1 where ``x`` is NaN, else 0 (float32 mask; not recorded)."""
    raw = _raw("isnan", x)
    return keep_checks(ew.unary("isnan", raw), raw)


def isfinite(x) -> Tensor:
    """1 where ``x`` is neither inf nor NaN, else 0 (float32 mask; not recorded)."""
    raw = _raw("isfinite", x)
    return keep_checks(ew.unary("isfinite", raw), raw)


def clip(x, min: float | None = None, max: float | None = None, *, tape=None):  # noqa: A002
    """``torch.clip``: the same op as ``clamp``."""
    return clamp(x, min, max, tape=tape)
