"""More of PyTorch's pointwise math: ``remainder`` and ``fmod`` (Python's ``%`` and C's: the
result takes the divisor's sign, or the dividend's), ``hypot``, ``exp2``, ``frac``,
``addcmul``, ``addcdiv``, ``clamp_min``, ``clamp_max``, the test ``isinf`` (a float32 0/1
mask, as ``isnan``) and the truth reductions ``all`` and ``any`` (0/1 masks too; never
recorded).

``remainder``, ``fmod``, ``hypot``, ``exp2`` and ``frac`` are one kernel each
(``parcl/kernels/elementwise_ops.py``) with PyTorch's gradients: 1 for the dividend and
``-floor(a / b)`` (``remainder``) or ``-trunc(a / b)`` (``fmod``) for the divisor. ``addcmul``
and ``addcdiv`` are ``mul``/``div`` and ``add``, so their gradients are those ops'.

>>> x = tp.tensor(np.array([-3.0, 5.5]), requires_grad=True)
>>> tp.remainder(x, 2.0).to_host(), tp.fmod(x, 2.0).to_host()
(array([1. , 1.5], dtype=float32), array([-1. ,  1.5], dtype=float32))
>>> tp.any(tp.gt(x, 5.0)).to_host()
array(1., dtype=float32)
"""

from __future__ import annotations

from ...errors import DTypeError
from ...kernels import elementwise as ew
from ...kernels import reduction as rd
from ...tensor import Tensor, keep_checks
from ..node import Function, Node
from .activation import _Activation, clamp
from .elementwise import (_Binary, _is_scalar, _Partials, _Scalar, add, check_broadcast, div,
                          mul)
from .mathops import _raw
from .reduce_dims import _axes

__all__ = ["addcdiv", "addcmul", "all", "any", "clamp_max", "clamp_min", "exp2", "fmod",
           "frac", "hypot", "isinf", "remainder"]


class _Modulo(_Binary):
    """``a mod b`` of two tensors (broadcasting): gradient ``g`` for ``a`` and
    ``g * grad_b(a, b)`` for ``b``, each summed back to its input's shape."""

    grad_b = ""

    def forward(self, a, b):
        if self.recording and self.needs_input_grad[1]:
            self.a, self.b = a, b
        return super().forward(a, b)

    def backward(self, g):
        gb = None
        if self.needs_input_grad[1]:
            gb = self._reduce(1, ew.binary("mul", ew.binary(self.grad_b, self.a, self.b), g))
        return self._reduce(0, g), gb


class Remainder(_Modulo):
    name = kernel = "remainder"
    grad_b = "remainder_grad_b"


class Fmod(_Modulo):
    name = kernel = "fmod"
    grad_b = "fmod_grad_b"


class RemainderScalar(_Scalar):            # x mod s: the gradient passes unchanged
    name = kernel = "remainder"

    def backward(self, g):
        return g


class FmodScalar(RemainderScalar):
    name = kernel = "fmod"


def _modulo(tensor_fn, scalar_fn, a, b, tape):
    op = tensor_fn.name
    if _is_scalar(b):
        if _is_scalar(a):
            raise DTypeError(f"{op}: both operands are numbers; pass a tp.Node or pc.Tensor")
        _raw(op, a)
        return scalar_fn.apply(a, tape=tape, s=b)
    if _is_scalar(a):          # a number divided by a tensor: the number as a 0-d tensor
        a = Tensor.full(_raw(op, b).queue, (), float(a))
    for v in (a, b):
        _raw(op, v)
    return tensor_fn.apply(a, b, tape=tape)


def remainder(a, b, *, tape=None):
    """``torch.remainder``: ``a - b * floor(a / b)``, Python's ``%`` (also ``a % b`` on
    Nodes): the result has the divisor's sign; broadcasting; either side may be a number.
    Computed from ``fmod``, so exact. Gradients 1 and ``-floor(a / b)``.

    >>> tp.remainder(-3.0, tp.tensor(np.array([2.0, -2.0]))).to_host()
    array([ 1., -1.], dtype=float32)
    """
    return _modulo(Remainder, RemainderScalar, a, b, tape)


def fmod(a, b, *, tape=None):
    """``torch.fmod``: C's ``fmod``, the remainder with the dividend's sign (``a - b *
    trunc(a / b)``); broadcasting; either side may be a number. Gradients 1 and
    ``-trunc(a / b)``."""
    return _modulo(Fmod, FmodScalar, a, b, tape)


class Hypot(_Partials):
    name = kernel = "hypot"
    partials = ("hypot_grad_a", "hypot_grad_b")


def hypot(a, b, *, tape=None):
    """``torch.hypot``: ``sqrt(a**2 + b**2)`` without overflow, broadcasting; both are
    tensors (as PyTorch's). Gradients ``a / hypot`` and ``b / hypot`` (NaN at ``(0, 0)``, as
    PyTorch's)."""
    for v in (a, b):
        if not isinstance(v, (Node, Tensor)):
            raise DTypeError(f"hypot: expected tp.Node or pc.Tensor operands, got "
                             f"{type(v).__name__} (wrap a number with pc.Tensor.full)")
    return Hypot.apply(a, b, tape=tape)


class Exp2(_Activation):
    name = "exp2"


class Frac(Function):
    name = "frac"

    def forward(self, x):
        return ew.unary("frac", x)

    def backward(self, g):
        return g


def exp2(x, *, tape=None):
    """``2 ** x``; gradient ``2 ** x * ln 2``."""
    return Exp2.apply(x, tape=tape)


def frac(x, *, tape=None):
    """``torch.frac``: ``x - trunc(x)``, with ``x``'s sign (NaN at +-inf); gradient 1."""
    return Frac.apply(x, tape=tape)


def addcmul(input, tensor1, tensor2, *, value: float = 1, tape=None):  # noqa: A002
    """``torch.addcmul``: ``input + value * tensor1 * tensor2``, all three broadcast;
    ``value`` keyword-only, as PyTorch's.

    >>> tp.addcmul(x, x, x, value=0.5).to_host()              # x = [-3, 5.5]
    array([ 1.5  , 20.625], dtype=float32)
    """
    check_broadcast("addcmul", input=input, tensor1=tensor1, tensor2=tensor2)
    # value weighs tensor1 before the product, (value * t1) * t2, as PyTorch's kernel: t1 * t2
    # first overflows float32 where the weighed product does not (1e20 * 1e20 * 1e-30)
    value = _value("addcmul", value)    # first: a tensor's != is identity, a TypeError
    if value != 1:
        tensor1 = mul(tensor1, value, tape=tape)
    return add(input, mul(tensor1, tensor2, tape=tape), tape=tape)


def addcdiv(input, tensor1, tensor2, *, value: float = 1, tape=None):  # noqa: A002
    """``torch.addcdiv``: ``input + value * (tensor1 / tensor2)``, all three broadcast."""
    check_broadcast("addcdiv", input=input, tensor1=tensor1, tensor2=tensor2)
    value = _value("addcdiv", value)
    if value != 1:              # (value * t1) / t2, as PyTorch's kernel (and addcmul's)
        tensor1 = mul(tensor1, value, tape=tape)
    return add(input, div(tensor1, tensor2, tape=tape), tape=tape)


def _value(op: str, value) -> float:
    if not _is_scalar(value):
        raise DTypeError(f"{op}: value must be a number, got {type(value).__name__}")
    return float(value)


def clamp_min(x, min, *, tape=None):  # noqa: A002
    """``torch.clamp_min``: ``clamp(x, min=min)``; ``min`` a number or a tensor."""
    return clamp(x, min, None, tape=tape)


def clamp_max(x, max, *, tape=None):  # noqa: A002
    """``torch.clamp_max``: ``clamp(x, max=max)``."""
    return clamp(x, None, max, tape=tape)


def isinf(x) -> Tensor:
    """1 where ``x`` is +inf or -inf, else 0 (float32 mask; not recorded)."""
    raw = _raw("isinf", x)
    return keep_checks(ew.unary("isinf", raw), raw)


def _truth(op: str, x, dim, keepdim: bool, every: bool) -> Tensor:
    x = _raw(op, x)
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a tp.Node or pc.Tensor, got a number")
    ew.check_float(op, x)
    # dim=() reduces no dim here (torch.all(x, dim=()) is x != 0 elementwise), where
    # amax's and sum's reduce every dim: _axes reads it as theirs
    axes = () if isinstance(dim, (tuple, list)) and not dim else _axes(op, dim, x.shape)
    # any: some element nonzero (NaN is); all: no element zero. Over no elements no hit (a
    # sum of nothing, 0: any 0, all 1, as PyTorch's), where a max of nothing is an error.
    count = rd.max if x.size else rd.sum
    hit = count(ew.scalar("eq" if every else "ne", x, 0.0), axes, bool(keepdim))
    return keep_checks(ew.scalar("rsub", hit, 1.0, out=hit) if every else hit, x)


def all(x, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """``torch.all``: 1 where every element over ``dim`` (None: all of them; an int or a
    tuple; ``()`` none, as PyTorch's) is nonzero (NaN counts as nonzero), else 0, as a
    float32 mask (parcl's comparisons' type). Not recorded.

    >>> tp.all(tp.gt(x, 0.0)).to_host()                      # x = [-3, 5.5]
    array(0., dtype=float32)
    """
    return _truth("all", x, dim, keepdim, every=True)


def any(x, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """``torch.any``: 1 where some element over ``dim`` is nonzero, else 0 (float32 mask).
    Not recorded."""
    return _truth("any", x, dim, keepdim, every=False)
