"""Binary elementwise ops: ``add sub mul div`` (numpy broadcasting, Python scalars on either
side), ``pow`` (scalar or tensor exponent, scalar or tensor base), ``maximum``, ``minimum``
(the unary ones are in ``unary``). Broadcast inputs get their gradient summed back to
their own shape. Gradients at domain edges are PyTorch's (``pow(x, 0)`` has gradient 0 at
``x = 0``, not ``0 * inf``).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([2.0], np.float32)), requires_grad=True)
>>> with tp.Tape() as tape:
...     y = tp.mul(x, x) + 1.0
>>> tape.backward(y)
>>> x.grad.to_host()
array([4.], dtype=float32)
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from ...errors import ParclError, ShapeError
from ...kernels import elementwise as ew
from ...kernels.broadcast import broadcast_shapes
from ...kernels.reduction import sum_to_shape
from ...tensor import Tensor
from ..node import Function, Node

__all__ = ["add", "div", "maximum", "minimum", "mul", "pow", "sub"]


def _is_scalar(v) -> bool:
    return isinstance(v, (Real, np.number)) and not isinstance(v, bool)


def check_broadcast(op: str, **operands) -> None:
    """A ShapeError naming ``op`` and every operand's shape unless they broadcast together
    (numbers and None skipped): an op composed of binary ops would otherwise fail in one of
    them, naming that op and two shapes, one of them perhaps an intermediate result's."""
    shapes = {k: tuple(v.shape) for k, v in operands.items()
              if v is not None and not _is_scalar(v)}
    out: tuple = ()
    try:
        for shape in shapes.values():
            out = broadcast_shapes(op, out, shape)
    except ShapeError:
        named = ", ".join(f"{k} {s}" for k, s in shapes.items())
        raise ShapeError(f"{op}: shapes do not broadcast: {named} (numpy rules: trailing "
                         "dimensions must be equal or 1)") from None


def _mul_into(t, g):
    """t *= g elementwise, in place (t is a fresh temporary of the same shape)."""
    return ew.binary("mul", t, g, out=t)


# -- binary ops on two tensors --------------------------------------------------------------
class _Binary(Function):
    """Shared forward: the kernel op named ``kernel``; saves the input shapes."""

    kernel = ""

    def forward(self, a, b):
        self.shapes = (a.shape, b.shape)
        return ew.binary(self.kernel, a, b)

    def _reduce(self, i, g):
        if not self.needs_input_grad[i]:
            return None
        shape = self.shapes[i]
        return g if g.shape == shape else sum_to_shape(g, shape)   # (equal: the common case)


class Add(_Binary):
    name = kernel = "add"

    def backward(self, g):
        return self._reduce(0, g), self._reduce(1, g)

    def hands_on(self, i):
        return self.shapes[0] == self.shapes[1]


class Sub(_Binary):
    name = kernel = "sub"

    def backward(self, g):
        gb = ew.unary("neg", sum_to_shape(g, self.shapes[1])) if self.needs_input_grad[1] \
            else None
        return self._reduce(0, g), gb


class Mul(_Binary):
    name = kernel = "mul"

    def forward(self, a, b):
        if self.recording:
            self.a = a if self.needs_input_grad[1] else None
            self.b = b if self.needs_input_grad[0] else None
        return super().forward(a, b)

    def backward(self, g):
        ga = self._reduce(0, ew.binary("mul", g, self.b)) if self.needs_input_grad[0] else None
        gb = self._reduce(1, ew.binary("mul", g, self.a)) if self.needs_input_grad[1] else None
        return ga, gb


class Div(_Binary):
    name = kernel = "div"

    def forward(self, a, b):
        out = super().forward(a, b)
        if self.recording:
            self.b = b
            self.out = out if self.needs_input_grad[1] else None
        return out

    def backward(self, g):
        ga = self._reduce(0, ew.binary("div", g, self.b)) if self.needs_input_grad[0] else None
        gb = None
        if self.needs_input_grad[1]:                    # d(a/b)/db = -(a/b) / b
            t = ew.binary("mul", g, self.out)           # g and out have the broadcast shape
            ew.binary("div", t, self.b, out=t)
            gb = ew.scale_(self._reduce(1, t), -1.0)
        return ga, gb


class RoundedDiv(Function):
    """``div`` with a ``rounding_mode``: ``"floor"`` PyTorch's floor division (``div_floor``,
    through fmod), ``"trunc"`` the quotient truncated toward 0. Both are steps, so both inputs
    get the gradient 0, as PyTorch's (where ``floor_divide``'s backward raises)."""

    name = "div"

    def forward(self, a, b, rounding_mode: str = "floor"):
        self.shapes = (a.shape, b.shape)
        if rounding_mode == "floor":
            return ew.binary("floor_divide", a, b)
        out = ew.binary("div", a, b)
        return ew.unary("trunc", out, out=out)

    def backward(self, g):
        return tuple(Tensor.zeros(g.queue, shape) if need else None
                     for shape, need in zip(self.shapes, self.needs_input_grad))


class _Partials(_Binary):
    """An op whose gradient for input i is ``partials[i](a, b) * g``, one kernel each
    (broadcast shape, then reduced to the input's shape)."""

    partials = ("", "")

    def forward(self, a, b):
        if self.recording:
            self.a, self.b = a, b
        return super().forward(a, b)

    def backward(self, g):
        return tuple(self._reduce(i, _mul_into(ew.binary(op, self.a, self.b), g))
                     if self.needs_input_grad[i] else None
                     for i, op in enumerate(self.partials))


class Pow(_Partials):
    """``a ** b``; PyTorch's partials, zero where it has zeros (``pow_grad_*`` kernels)."""

    name = kernel = "pow"
    partials = ("pow_grad_base", "pow_grad_exponent")


class Maximum(_Partials):
    """The gradient goes to the winning side (ties: half to each; a NaN: to both), as
    PyTorch's."""

    name = kernel = "maximum"
    partials = ("maximum_grad_a", "maximum_grad_b")


class Minimum(_Partials):
    name = kernel = "minimum"
    partials = ("minimum_grad_a", "minimum_grad_b")


# -- tensor-scalar ops ----------------------------------------------------------------------
class _Scalar(Function):
    """``kernel(x, s)`` for a Python scalar ``s``; the public op's name is ``name``."""

    kernel = ""
    reads_x = reads_out = False     # what backward reads: only that is kept for it

    def forward(self, x, s):
        self.s = float(s)
        out = ew.scalar(self.kernel, x, self.s)
        if self.recording:
            self.x = x if self.reads_x else None
            self.out = out if self.reads_out else None
        return out


class AddScalar(_Scalar):
    name = kernel = "add"

    def backward(self, g):
        return g


class SubScalar(_Scalar):
    name, kernel = "sub", "sub"

    def backward(self, g):
        return g


class RSubScalar(_Scalar):                 # s - x
    name, kernel = "sub", "rsub"

    def backward(self, g):
        return ew.unary("neg", g)


class MulScalar(_Scalar):
    name = kernel = "mul"

    def backward(self, g):
        return ew.scalar("mul", g, self.s)


class DivScalar(_Scalar):                  # x / s
    name = kernel = "div"

    def backward(self, g):
        return ew.scalar("div", g, self.s)


class RDivScalar(_Scalar):                 # s / x: d/dx = -(s/x) / x
    name, kernel = "div", "rdiv"
    reads_x = reads_out = True

    def backward(self, g):
        t = ew.binary("div", self.out, self.x)
        return ew.scale_(_mul_into(t, g), -1.0)


class PowScalar(_Scalar):                  # x ** p: d/dx = p * x**(p-1), and 0 for p == 0
    name = kernel = "pow"
    reads_x = True

    def backward(self, g):
        if self.s == 0.0:                  # PyTorch: zeros, whatever x (0 * x**-1 is NaN at 0)
            return Tensor.zeros(g.queue, g.shape)
        return _mul_into(ew.scalar("pow_grad_base", self.x, self.s), g)


class RPowScalar(_Scalar):                 # s ** x: d/dx = s**x * ln(s), 0 for s == 0, x >= 0
    name, kernel = "pow", "rpow"
    reads_x = True

    def backward(self, g):
        return _mul_into(ew.scalar("rpow_grad_exponent", self.x, self.s), g)


class MaximumScalar(_Scalar):
    name = kernel = "maximum"
    reads_x = True

    def backward(self, g):
        return _mul_into(ew.scalar("ge", self.x, self.s), g)


class MinimumScalar(_Scalar):
    name = kernel = "minimum"
    reads_x = True

    def backward(self, g):
        return _mul_into(ew.scalar("le", self.x, self.s), g)


_OPERANDS = (Node, Tensor)

# tensor op, scalar on the right, scalar on the left
_BINARY = {
    "add": (Add, AddScalar, AddScalar),
    "sub": (Sub, SubScalar, RSubScalar),
    "mul": (Mul, MulScalar, MulScalar),
    "div": (Div, DivScalar, RDivScalar),
    "pow": (Pow, PowScalar, RPowScalar),
    "maximum": (Maximum, MaximumScalar, MaximumScalar),
    "minimum": (Minimum, MinimumScalar, MinimumScalar),
}


def _binary(op: str, a, b, tape):
    tensor_fn, right_fn, left_fn = _BINARY[op]
    if isinstance(a, _OPERANDS) and isinstance(b, _OPERANDS):   # the common case: no ABC
        return tensor_fn.apply(a, b, tape=tape)
    if _is_scalar(b):
        if _is_scalar(a):
            raise TypeError(f"{op}: both operands are Python scalars; pass a tp.Node or "
                            "pc.Tensor")
        return right_fn.apply(a, tape=tape, s=b)
    if _is_scalar(a):
        return left_fn.apply(b, tape=tape, s=a)
    return tensor_fn.apply(a, b, tape=tape)


def _times_alpha(op: str, b, alpha, tape):
    """``alpha * b``, torch.add's and torch.sub's ``alpha`` (a number); ``b`` for 1."""
    if not _is_scalar(alpha):
        raise TypeError(f"{op}: alpha must be a number, got {type(alpha).__name__}")
    if alpha == 1:
        return b
    return b * alpha if _is_scalar(b) else mul(b, alpha, tape=tape)


def add(a, b, *, alpha=1, tape=None):
    """``a + alpha * b`` with broadcasting, as ``torch.add``; either side may be a Python
    scalar."""
    if type(alpha) is not int or alpha != 1:    # the default: every a + b, no check
        b = _times_alpha("add", b, alpha, tape)
    return _binary("add", a, b, tape)


def sub(a, b, *, alpha=1, tape=None):
    """``a - alpha * b`` with broadcasting, as ``torch.sub``; either side may be a Python
    scalar."""
    if type(alpha) is not int or alpha != 1:
        b = _times_alpha("sub", b, alpha, tape)
    return _binary("sub", a, b, tape)


def mul(a, b, *, tape=None):
    """``a * b`` with broadcasting; either side may be a Python scalar."""
    return _binary("mul", a, b, tape)


def div(a, b, *, rounding_mode: str | None = None, tape=None):
    """``a / b`` with broadcasting; either side may be a Python scalar. ``rounding_mode``
    ``"floor"`` or ``"trunc"`` rounds the quotient, as ``torch.div``'s (gradient 0).

    >>> tp.div(tp.tensor(np.array([-7.0, 7.0])), 2.0, rounding_mode="trunc").to_host()
    array([-3.,  3.], dtype=float32)
    """
    if rounding_mode is None:
        return _binary("div", a, b, tape)
    if rounding_mode not in ("floor", "trunc"):
        raise ParclError(f"div: rounding_mode must be None, 'floor' or 'trunc', got "
                         f"{rounding_mode!r}")
    if _is_scalar(a) and _is_scalar(b):
        raise TypeError("div: both operands are Python scalars; pass a tp.Node or pc.Tensor")
    a = Tensor.full(b.queue, (), float(a)) if _is_scalar(a) else a
    b = Tensor.full(a.queue, (), float(b)) if _is_scalar(b) else b
    return RoundedDiv.apply(a, b, tape=tape, rounding_mode=rounding_mode)


def pow(x, p, *, tape=None):  # noqa: A001
    """``x ** p`` with broadcasting: the base, the exponent or both may be tensors (either may
    be a Python scalar); gradients reach both, with PyTorch's values at ``x = 0``.

    >>> x = tp.tensor(np.array([0.0, 2.0]), requires_grad=True)
    >>> (x ** 2).to_host(), (2 ** x).to_host(), tp.pow(x, x).to_host()
    (array([0., 4.], dtype=float32), array([1., 4.], dtype=float32), array([1., 4.], dtype=float32))
    """
    return _binary("pow", x, p, tape)


def maximum(a, b, *, tape=None):
    """Elementwise maximum with broadcasting (gradient to the larger side; at a tie half to
    each; where either side is NaN, to both, as ``torch.maximum``). A number on either side is
    a bound, as ``torch.clamp_min``'s: the tensor gets the whole gradient at a tie."""
    return _binary("maximum", a, b, tape)


def minimum(a, b, *, tape=None):
    """Elementwise minimum with broadcasting (gradient to the smaller side; at a tie half to
    each; where either side is NaN, to both); a number is a bound, as ``torch.clamp_max``'s."""
    return _binary("minimum", a, b, tape)
