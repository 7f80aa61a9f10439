"""PyTorch's regression, divergence and margin losses with ``reduction=`` ('none', 'mean',
'sum'): ``l1_loss smooth_l1_loss huber_loss kl_div binary_cross_entropy soft_margin_loss
cosine_embedding_loss``.

Each is a pointwise term (one kernel forward and one backward, or a few tape ops) followed by
``tp.mean``/``tp.sum``; gradients reach the target too when it requires grad, as PyTorch's do.
Shapes follow PyTorch: ``l1_loss``, ``smooth_l1_loss`` and ``huber_loss`` broadcast a target
of another shape with its warning, ``binary_cross_entropy`` refuses one (``ShapeError``).

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([0.0, 2.0, -3.0], np.float32)), True)
>>> t = pc.Tensor.from_host(q, np.zeros(3, np.float32))
>>> tp.l1_loss(x, t, reduction="sum").item()
5.0
>>> tp.smooth_l1_loss(x, t, reduction="none").to_host()
array([0. , 1.5, 2.5], dtype=float32)
"""

from __future__ import annotations

import warnings

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels.broadcast import broadcast_shapes
from ...tensor import Tensor
from ..node import Node
from .activation import _Activation, _number, clamp
from .activation_more import logsigmoid
from .elementwise import DivScalar, _Partials, add, div, mul, sub
from .mathops import eq
from .reduce import mean, sum
from .select import where
from .unary import abs, neg, sqrt

__all__ = ["binary_cross_entropy", "cosine_embedding_loss", "huber_loss", "kl_div", "l1_loss",
           "smooth_l1_loss", "soft_margin_loss"]

_REDUCTIONS = ("none", "mean", "sum")


def check_reduction(op: str, reduction, allowed=_REDUCTIONS) -> str:
    """``reduction`` if it is one of ``allowed``, else PyTorch's error as a ParclError."""
    if reduction not in allowed:
        raise ParclError(f"{op}: {reduction!r} is not a valid value for reduction; expected "
                         f"one of {', '.join(repr(r) for r in allowed)}")
    return reduction


def _reduce(loss, reduction: str, tape):
    if reduction == "mean":
        return mean(loss, tape=tape)
    return sum(loss, tape=tape) if reduction == "sum" else loss


def _tensors(op: str, **named) -> None:
    for what, v in named.items():
        if not isinstance(v, (Node, Tensor)):
            raise DTypeError(f"{op}: {what} must be a tp.Node or pc.Tensor, got "
                             f"{type(v).__name__}")


def _warn_broadcast(op: str, input, target) -> None:
    """PyTorch's warning for a target of another shape (the loss still broadcasts)."""
    if tuple(input.shape) != tuple(target.shape):
        broadcast_shapes(op, tuple(input.shape), tuple(target.shape))   # ShapeError if not
        warnings.warn(f"{op}: using a target size {tuple(target.shape)} that is different "
                      f"to the input size {tuple(input.shape)}; this will likely lead to "
                      "incorrect results due to broadcasting. Please ensure they have the "
                      "same size.", UserWarning, stacklevel=3)


class SmoothL1(_Activation):
    name = "smooth_l1"


class Huber(_Activation):
    name = "huber"


def l1_loss(input, target, reduction: str = "mean", *, tape=None):  # noqa: A002
    """``|input - target|``, reduced (gradient 0 where they are equal, as PyTorch's).

    >>> tp.l1_loss(x, t).shape
    ()
    """
    check_reduction("l1_loss", reduction)
    _tensors("l1_loss", input=input, target=target)
    _warn_broadcast("l1_loss", input, target)
    return _reduce(abs(sub(input, target, tape=tape), tape=tape), reduction, tape)


def smooth_l1_loss(input, target, reduction: str = "mean", beta: float = 1.0, *,  # noqa: A002
                   tape=None):
    """``0.5 d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``d = input -
    target``); ``beta = 0`` is ``l1_loss``, a negative beta a ``ParclError``."""
    check_reduction("smooth_l1_loss", reduction)
    beta = _number("smooth_l1_loss", "beta", beta)
    if beta < 0:
        raise ParclError(f"smooth_l1_loss: does not support negative values for beta, got "
                         f"{beta}")
    if beta == 0.0:                                   # PyTorch's rule: gradient 0 at d = 0
        return l1_loss(input, target, reduction, tape=tape)
    _tensors("smooth_l1_loss", input=input, target=target)
    _warn_broadcast("smooth_l1_loss", input, target)
    d = sub(input, target, tape=tape)
    return _reduce(SmoothL1.apply(d, tape=tape, p=beta), reduction, tape)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, *,  # noqa: A002
               tape=None):
    """``0.5 d**2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``; ``delta <= 0``
    is a ``ParclError``."""
    check_reduction("huber_loss", reduction)
    delta = _number("huber_loss", "delta", delta)
    if not delta > 0:
        raise ParclError(f"huber_loss: does not support non-positive values for delta, got "
                         f"{delta}")
    _tensors("huber_loss", input=input, target=target)
    _warn_broadcast("huber_loss", input, target)
    d = sub(input, target, tape=tape)
    return _reduce(Huber.apply(d, tape=tape, p=delta), reduction, tape)


class KlDiv(_Partials):
    name, kernel = "kl_div", "kl_div"
    partials = ("kl_div_grad_input", "kl_div_grad_target")


class KlDivLogTarget(_Partials):
    name, kernel = "kl_div", "kl_div_log"
    partials = ("kl_div_log_grad_input", "kl_div_log_grad_target")


class BatchMean(DivScalar):
    """``kl_div``'s 'batchmean', its sum divided by the rows: named for the loss, as
    ``cross_entropy`` is, so a data-parallel step tells this mean over the batch from a sum
    (``ReplicaGroup.step`` refuses it with ``reduction='sum'``)."""
    name = "kl_div_batchmean"


def kl_div(input, target, reduction: str = "mean", log_target: bool = False, *,  # noqa: A002
           tape=None):
    """``torch.nn.functional.kl_div``: ``input`` log-probabilities, ``target`` probabilities
    (``log_target=True``: log-probabilities); pointwise ``t * (log t - input)`` (0 where
    ``t == 0``), broadcasting. ``reduction='batchmean'`` divides the sum by the batch size
    (the divergence's definition); ``'mean'`` is the mean over every element, as PyTorch's
    (which also warns about it; parcl does not).

    >>> tp.kl_div(tp.log_softmax(x), tp.softmax(x), reduction="batchmean").item()
    0.0
    """
    check_reduction("kl_div", reduction, (*_REDUCTIONS, "batchmean"))
    _tensors("kl_div", input=input, target=target)
    fn = KlDivLogTarget if log_target else KlDiv
    loss = fn.apply(input, target, tape=tape)
    if reduction != "batchmean":
        return _reduce(loss, reduction, tape)
    total = sum(loss, tape=tape)
    return BatchMean.apply(total, tape=tape, s=float(input.shape[0])) if input.shape else total


class BinaryCrossEntropy(_Partials):
    name, kernel = "binary_cross_entropy", "bce"
    partials = ("bce_grad_input", "bce_grad_target")


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean", *,  # noqa: A002
                         tape=None):
    """``-(t log(x) + (1 - t) log(1 - x))`` on probabilities ``x``, each log clamped at -100
    (PyTorch's: finite at 0 and 1), times ``weight`` (broadcast to the target's shape), reduced.
    The target must have the input's shape (a ``ShapeError`` otherwise). An input outside
    [0, 1] gives NaN (PyTorch raises; checking would cost a host read per step).

    >>> p = pc.Tensor.from_host(q, np.array([0.5, 1.0], np.float32))
    >>> round(tp.binary_cross_entropy(p, p).item(), 4)
    0.3466
    """
    op = "binary_cross_entropy"
    check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    if tuple(target.shape) != tuple(input.shape):
        raise ShapeError(f"{op}: using a target size {tuple(target.shape)} that is different "
                         f"to the input size {tuple(input.shape)}; ensure they have the "
                         "same size")
    loss = BinaryCrossEntropy.apply(input, target, tape=tape)
    if weight is not None:
        _tensors(op, weight=weight)
        if broadcast_shapes(op, tuple(weight.shape), tuple(target.shape)) != tuple(target.shape):
            raise ShapeError(f"{op}: weight of shape {tuple(weight.shape)} does not broadcast "
                             f"to the target's shape {tuple(target.shape)}")
        loss = mul(loss, weight, tape=tape)
    return _reduce(loss, reduction, tape)


def soft_margin_loss(input, target, reduction: str = "mean", *, tape=None):  # noqa: A002
    """``log(1 + exp(-target * input))``, targets +-1 (constants), computed as
    ``-logsigmoid(target * input)``: finite for any finite input (PyTorch's direct form
    overflows to inf past ``target * input < -88``)."""
    check_reduction("soft_margin_loss", reduction)
    _tensors("soft_margin_loss", input=input, target=target)
    if isinstance(target, Node) and target.requires_grad:
        raise ParclError("soft_margin_loss: is not differentiable with respect to target (as "
                         "PyTorch's); pass a target that does not require grad")
    if tuple(target.shape) != tuple(input.shape):
        raise ShapeError(f"soft_margin_loss: target {tuple(target.shape)} and input "
                         f"{tuple(input.shape)} must have the same shape")
    margin = logsigmoid(mul(input, target, tape=tape), tape=tape)
    return _reduce(neg(margin, tape=tape), reduction, tape)


def cosine_embedding_loss(input1, input2, target, margin: float = 0.0,
                          reduction: str = "mean", *, tape=None):
    """``1 - cos(x1, x2)`` where ``target == 1``, ``max(0, cos - margin)`` where ``target ==
    -1`` (0 for other targets), rows along dim 1 of (N, D) inputs with a float32 (N,) target,
    or one (D,) pair with a 0-d target. ``cos`` is PyTorch's: ``sum(x1 x2) / sqrt((|x1|^2 +
    1e-12) (|x2|^2 + 1e-12))``."""
    op = "cosine_embedding_loss"
    check_reduction(op, reduction)
    _tensors(op, input1=input1, input2=input2, target=target)
    s1, s2, st = tuple(input1.shape), tuple(input2.shape), tuple(target.shape)
    if s1 != s2:
        raise ShapeError(f"{op}: input1 {s1} and input2 {s2} must have the same shape")
    if len(st) > 1:
        raise ShapeError(f"{op}: 0D or 1D target tensor expected, multi-target not "
                         f"supported (target {st})")
    if len(s1) != len(st) + 1 or (st and st[0] != s1[0]):
        raise ShapeError(f"{op}: a {len(st)}D target {st} expects {len(st) + 1}D inputs with "
                         f"{st[0] if st else 'D'} rows, got inputs of shape {s1}")
    dim = len(s1) - 1
    prod = sum(mul(input1, input2, tape=tape), dim, tape=tape)
    mag1 = add(sum(mul(input1, input1, tape=tape), dim, tape=tape), 1e-12, tape=tape)
    mag2 = add(sum(mul(input2, input2, tape=tape), dim, tape=tape), 1e-12, tape=tape)
    cos = div(prod, sqrt(mul(mag1, mag2, tape=tape), tape=tape), tape=tape)
    m = _number(op, "margin", margin)
    pos = where(eq(target, 1.0), sub(1.0, cos, tape=tape), 0.0, tape=tape)
    neg_part = where(eq(target, -1.0), clamp(sub(cos, m, tape=tape), min=0.0, tape=tape), 0.0,
                     tape=tape)
    return _reduce(add(pos, neg_part, tape=tape), reduction, tape)
