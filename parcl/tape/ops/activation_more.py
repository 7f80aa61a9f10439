"""More of PyTorch's activations, with its formulas, gradients and argument checks:
``hardtanh relu6 hardsigmoid hardswish mish softsign logsigmoid selu celu tanhshrink
threshold`` (one kernel forward, one backward each), ``glu`` and ``softmin`` (built on
``split``/``sigmoid`` and ``softmax``), and the row normalisations ``normalize`` and
``cosine_similarity``.

At the kinks the gradient is PyTorch's: ``hardtanh`` and ``relu6`` pass none at their bounds
(unlike ``clamp``), ``hardsigmoid`` none at +-3, ``hardswish`` 0 at -3 and 1 at 3,
``selu``/``celu`` their exponential piece at 0. ``logsigmoid`` and ``mish`` use the stable
softplus ``max(x, 0) + log1p(exp(-|x|))``: finite for any finite input.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([-4.0, 0.5, 7.0], np.float32)), True)
>>> tp.relu6(x).to_host()
array([0. , 0.5, 6. ], dtype=float32)
"""

from __future__ import annotations

import math
import warnings

from ...errors import ParclError, ShapeError
from ...kernels import elementwise as ew
from ...kernels.broadcast import broadcast_shapes
from ...kernels.strided import normalize_axis
from ..node import Function, Node
from .activation import _Activation, _number, clamp
from .elementwise import div, mul, pow, sub
from .indexing import expand
from .join import split
from .loss import softmax
from .mathops import gt, le, ne, square
from .reduce import sum
from .reduce_dims import amax
from .select import where
from .shape import reshape, wrap_dim
from .unary import abs, neg, sigmoid, sqrt

__all__ = ["celu", "cosine_similarity", "glu", "hardshrink", "hardsigmoid", "hardswish",
           "hardtanh", "mish", "softshrink",
           "logsigmoid", "normalize", "prelu", "relu6", "selu", "softmin", "softsign", "tanhshrink",
           "threshold"]


class Hardtanh(_Activation):
    """``clamp``'s kernel forward; no gradient at the bounds (PyTorch's hardtanh_backward)."""

    name = "hardtanh"

    def forward(self, x, p: float = -1.0, q: float = 1.0):
        self.p, self.q = p, q
        self.x = x if self.recording else None
        return ew.unary("clamp", x, p=p, q=q)


_KERNELS = {name: type(name.capitalize(), (_Activation,), {"name": name})
            for name in ("hardsigmoid", "hardswish", "mish", "softsign", "logsigmoid", "selu",
                         "celu", "tanhshrink", "threshold")}


def hardtanh(x, min_val: float = -1.0, max_val: float = 1.0, *, tape=None):
    """``x`` limited to ``[min_val, max_val]``; gradient 1 strictly inside, 0 elsewhere.
    ``min_val > max_val`` is a ``ParclError`` (PyTorch's ValueError).

    >>> tp.hardtanh(x, -2.0, 2.0).to_host()
    array([-2. ,  0.5,  2. ], dtype=float32)
    """
    lo = _number("hardtanh", "min_val", min_val)
    hi = _number("hardtanh", "max_val", max_val)
    if lo > hi:
        raise ParclError(f"hardtanh: min_val cannot be greater than max_val, got "
                         f"min_val={lo} > max_val={hi}")
    return Hardtanh.apply(x, tape=tape, p=lo, q=hi)


def relu6(x, *, tape=None):
    """``min(max(x, 0), 6)`` (``hardtanh(x, 0, 6)``; gradient 0 at 0 and 6)."""
    return Hardtanh.apply(x, tape=tape, p=0.0, q=6.0)


def hardsigmoid(x, *, tape=None):
    """``relu6(x + 3) / 6``; gradient 1/6 strictly inside (-3, 3)."""
    return _KERNELS["hardsigmoid"].apply(x, tape=tape)


def hardswish(x, *, tape=None):
    """``x * relu6(x + 3) / 6``."""
    return _KERNELS["hardswish"].apply(x, tape=tape)


def mish(x, *, tape=None):
    """``x * tanh(softplus(x))``."""
    return _KERNELS["mish"].apply(x, tape=tape)


def softsign(x, *, tape=None):
    """``x / (1 + |x|)``."""
    return _KERNELS["softsign"].apply(x, tape=tape)


def logsigmoid(x, *, tape=None):
    """``log(sigmoid(x))`` as ``min(x, 0) - log1p(exp(-|x|))``: -x's magnitude for very
    negative x, not -inf."""
    return _KERNELS["logsigmoid"].apply(x, tape=tape)


def selu(x, *, tape=None):
    """``scale * (x if x > 0 else alpha * (exp(x) - 1))`` with PyTorch's constants
    (alpha 1.6733, scale 1.0507)."""
    return _KERNELS["selu"].apply(x, tape=tape)


def celu(x, alpha: float = 1.0, *, tape=None):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``; ``alpha = 0`` is a
    ``ParclError`` (PyTorch refuses it too)."""
    a = _number("celu", "alpha", alpha)
    if a == 0.0:
        raise ParclError("celu: alpha cannot be 0 (it divides x)")
    return _KERNELS["celu"].apply(x, tape=tape, p=a, q=1.0 / a)


def tanhshrink(x, *, tape=None):
    """``x - tanh(x)``."""
    return _KERNELS["tanhshrink"].apply(x, tape=tape)


def threshold(x, threshold: float, value: float, *, tape=None):
    """``x`` where ``x > threshold``, else ``value`` (NaN stays NaN; gradient 0 where
    replaced)."""
    t = _number("threshold", "threshold", threshold)
    return _KERNELS["threshold"].apply(x, tape=tape, p=t,
                                       q=_number("threshold", "value", value))


def glu(x, dim: int = -1, *, tape=None):
    """``a * sigmoid(b)``, ``a`` and ``b`` the two halves of ``x`` along ``dim`` (which must
    have an even size; a ``ShapeError`` otherwise, as PyTorch's error).

    >>> tp.glu(tp.tensor(pc.Tensor.from_host(q, np.ones((2, 4), np.float32)))).shape
    (2, 2)
    """
    shape = tuple(x.shape)
    if not shape:
        raise ShapeError("glu: does not support scalars because halving size must be even")
    axis = normalize_axis("glu", dim, len(shape), shape)
    if shape[axis] % 2:
        raise ShapeError(f"glu: halving dimension must be even, but dimension {axis} is size "
                         f"{shape[axis]} (shape {shape})")
    a, b = split(x, shape[axis] // 2, axis, tape=tape)
    return mul(a, sigmoid(b, tape=tape), tape=tape)


def hardshrink(x, lambd: float = 0.5, *, tape=None):
    """``F.hardshrink``: ``x`` where ``|x| > lambd``, else 0; gradient 1 there, 0 elsewhere
    (at ``|x| = lambd`` too), as PyTorch's. A ``where`` over a mask of ``|x|``: the zeros are
    where ``|x| <= lambd``, so a NaN stays NaN, as PyTorch's (gradient 1, as its scalar loop).

    >>> tp.hardshrink(tp.tensor(np.array([-1.0, 0.5, 0.7], np.float32))).to_host()
    array([-1. ,  0. ,  0.7], dtype=float32)
    """
    lambd = _number("hardshrink", "lambd", lambd)
    raw = x.value if isinstance(x, Node) else x
    return where(le(abs(raw), lambd), 0.0, x, tape=tape)


def softshrink(x, lambd: float = 0.5, *, tape=None):
    """``F.softshrink``: ``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0
    (``x - clamp(x, -lambd, lambd)``); gradient 1 outside, 0 inside and at the bounds, as
    PyTorch's. A negative ``lambd`` is a ``ParclError``, as PyTorch refuses it."""
    lambd = _number("softshrink", "lambd", lambd)
    if not lambd >= 0:
        raise ParclError(f"softshrink: lambd must be >= 0, got {lambd}")
    return sub(x, clamp(x, -lambd, lambd, tape=tape), tape=tape)


def prelu(x, weight, *, tape=None):
    """``torch.nn.functional.prelu``: ``x`` where ``x > 0``, else ``weight * x``, with one
    learnt slope per channel (dim 1 of ``x``; no channel dim below 2-D) or one for all.
    ``weight`` is 0-d or 1-D with 1 or ``channels`` elements, else a ``ShapeError``. At 0 the
    gradient is PyTorch's: ``weight`` for ``x`` and ``x = 0`` for the slope. A ``where`` of
    ``x`` and ``weight`` times the non-positive part, so the slope's gradient is ``mul``'s
    broadcast sum over ``x <= 0`` only (an infinite ``x > 0`` adds 0 to it, as PyTorch's).

    >>> tp.prelu(tp.tensor(np.array([[-2.0, 3.0]], np.float32)), tp.tensor(np.array([0.25],
    ...          np.float32))).to_host()
    array([[-0.5,  3. ]], dtype=float32)
    """
    xs, ws = tuple(x.shape), tuple(weight.shape)
    if len(ws) > 1:
        raise ShapeError(f"prelu: weight must be 0-d or 1-D, got shape {ws} (input {xs})")
    count = ws[0] if ws else 1
    channels = xs[1] if len(xs) >= 2 else 1
    if count not in (1, channels):
        raise ShapeError(f"prelu: weight has {count} slopes but the input of shape {xs} has "
                         f"{channels} channels (dim 1; 1 below 2-D): give 1 or {channels}")
    w = reshape(weight, () if count == 1 else (count,) + (1,) * (len(xs) - 2), tape=tape)
    positive = gt(x, 0.0)
    # weight * x over every x made an infinite x > 0 add inf * 0 = NaN to the slope's
    # gradient, which PyTorch's leaves out: the slope multiplies the non-positive part only
    rest = where(positive, 0.0, x, tape=tape)
    return where(positive, x, mul(w, rest, tape=tape), tape=tape)


def softmin(x, dim: int | None = None, *, tape=None):
    """``softmax(-x, dim)``. ``dim=None`` takes PyTorch's legacy choice (0 for 0-, 1- and 3-D
    inputs, else 1) with its deprecation warning; pass ``dim``."""
    if dim is None:
        dim = 0 if len(x.shape) in (0, 1, 3) else 1
        warnings.warn("softmin: implicit dimension choice has been deprecated; pass dim",
                      UserWarning, stacklevel=2)
    return softmax(neg(x, tape=tape), dim, tape=tape)


class _ClampMinUnrecorded(Function):
    """``max(n, eps)`` forward, ``n``'s gradient unchanged backward: PyTorch's
    ``cosine_similarity`` clamps its norms in place under ``no_grad``, so its gradient goes
    through a norm below ``eps`` as if no clamp were there."""

    name = "clamp"

    def forward(self, n, eps: float):
        return ew.unary("clamp", n, p=eps, q=math.inf)

    def backward(self, g):
        return g


def _norm(x, p: float, dim: int, eps: float, tape, clamp_recorded: bool = True):
    """``max(||x||_p, eps)`` along ``dim`` (kept), as PyTorch's ``norm().clamp_min(eps)``
    (without ``clamp_recorded``, the clamp passes the norm's gradient: ``_ClampMinUnrecorded``).
    The root is taken of the nonzero sums only: ``sqrt`` and ``pow(s, 1/p)`` have infinite
    slope at 0, so a zero row would give 0 * inf = NaN where PyTorch's gradient is 0 (its norm
    backward masks zero norms). Not by clamping the sum at ``eps ** p`` first: that is 0 in
    float32 for p >= 4 (``1e-12 ** 4``), and a zero row divided by it gave NaN."""
    if p == math.inf:
        # amax, not max: elements tied for the largest |x| share the gradient evenly, as in
        # PyTorch's inf-norm backward (max gave it all to the first of them)
        return clamp(amax(abs(x, tape=tape), dim, keepdim=True, tape=tape), min=eps, tape=tape)
    if p == 2.0:
        s = sum(square(x, tape=tape), dim, keepdims=True, tape=tape)
    else:
        s = sum(pow(abs(x, tape=tape), p, tape=tape), dim, keepdims=True, tape=tape)
    positive = ne(s, 0.0)      # the sums are >= 0: a NaN one keeps its root, NaN, as PyTorch
    s = where(positive, s, 1.0, tape=tape)
    root = sqrt(s, tape=tape) if p == 2.0 else pow(s, 1.0 / p, tape=tape)
    norm = where(positive, root, 0.0, tape=tape)
    if not clamp_recorded:
        return _ClampMinUnrecorded.apply(norm, tape=tape, eps=eps)
    return clamp(norm, min=eps, tape=tape)


def normalize(x, p: float = 2.0, dim: int = 1, eps: float = 1e-12, *, tape=None):
    """``torch.nn.functional.normalize``: ``x / max(||x||_p, eps)`` along ``dim`` (p >= 1 or
    inf). A zero row gives zeros, with PyTorch's gradient ``1 / eps``.

    >>> tp.normalize(tp.tensor(pc.Tensor.from_host(q, np.array([[3.0, 4.0]], np.float32)))
    ...              ).to_host()
    array([[0.6, 0.8]], dtype=float32)
    """
    p = _number("normalize", "p", p)
    eps = _number("normalize", "eps", eps)
    if not p >= 1.0:
        raise ParclError(f"normalize: p must be >= 1 (or inf) here, got {p}")
    dim = wrap_dim("normalize", dim, len(x.shape), x.shape)
    return div(x, _norm(x, p, dim, eps, tape), tape=tape)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8, *, tape=None):
    """``torch.nn.functional.cosine_similarity``: ``sum(x1 * x2) / (max(||x1||, eps) *
    max(||x2||, eps))`` along ``dim`` (reduced), the inputs broadcast first.

    >>> a = pc.Tensor.from_host(q, np.array([[1.0, 0.0], [1.0, 1.0]], np.float32))
    >>> tp.cosine_similarity(a, a).to_host()
    array([1., 1.], dtype=float32)
    """
    eps = _number("cosine_similarity", "eps", eps)
    shape1, shape2 = tuple(x1.shape), tuple(x2.shape)
    shape = broadcast_shapes("cosine_similarity", shape1, shape2)
    dim = wrap_dim("cosine_similarity", dim, len(shape), shape)
    # each side is normalised along dim of the broadcast shape (a side broadcast along dim
    # itself is normalised over its repeated values, as PyTorch expands before the norm);
    # PyTorch clamps the norms at eps under no_grad, so a norm below eps keeps its gradient
    sides = [div(v, _norm(v, 2.0, dim, eps, tape, clamp_recorded=False), tape=tape)
             for v in (x1 if shape1 == shape else expand(x1, shape, tape=tape),
                       x2 if shape2 == shape else expand(x2, shape, tape=tape))]
    return sum(mul(sides[0], sides[1], tape=tape), dim, tape=tape)
