"""PyTorch's likelihood losses with ``reduction=`` ('none', 'mean', 'sum'):
``poisson_nll_loss`` and ``gaussian_nll_loss``.

Both are pointwise terms of tape ops (their backwards are the gradient, to the target and the
variance too where those require grad, as PyTorch's) followed by ``tp.mean``/``tp.sum``, so
``ReplicaGroup.step`` weighs a mean by the replicas' rows, as any mean. PyTorch raises on a
negative variance, which needs a host read of it per step; here such an entry's loss and
gradients are NaN instead (as ``binary_cross_entropy`` does for a probability outside
[0, 1]), never a clamped, finite value.

>>> rate = pc.Tensor.from_host(q, np.array([0.0, 1.0], np.float32))
>>> counts = pc.Tensor.from_host(q, np.array([2.0, 0.0], np.float32))
>>> tp.poisson_nll_loss(rate, counts, reduction="none").to_host()
array([1.       , 2.7182817], dtype=float32)
"""

from __future__ import annotations

import math

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels.broadcast import broadcast_shapes
from ...tensor import Tensor
from ..node import Node
from .activation import _number, clamp
from .elementwise import _is_scalar, add, div, mul, sub
from .loss_more import _check_reduction, _reduce, _tensors
from .mathops import gt, lt, square
from .select import where
from .shape import reshape
from .unary import exp, log

__all__ = ["gaussian_nll_loss", "poisson_nll_loss"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _raw(v) -> Tensor:
    return v.value if isinstance(v, Node) else v


def poisson_nll_loss(input, target, log_input: bool = True, full: bool = False, *,  # noqa: A002
                     eps: float = 1e-8, reduction: str = "mean", tape=None):
    """``exp(input) - target * input`` (``log_input=True``: ``input`` is the log-rate), else
    ``input - target * log(input + eps)``; ``full=True`` adds Stirling's term ``t log(t) - t +
    0.5 log(2 pi t)`` where ``target > 1`` (0 elsewhere). Input and target broadcast.
    ``eps`` and ``reduction`` keyword-only (PyTorch's deprecated arguments come first).

    >>> round(tp.poisson_nll_loss(rate, counts, full=True).item(), 4)
    2.185
    """
    op = "poisson_nll_loss"
    _check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    broadcast_shapes(op, tuple(input.shape), tuple(target.shape))
    eps = _number(op, "eps", eps)
    if log_input:
        loss = sub(exp(input, tape=tape), mul(target, input, tape=tape), tape=tape)
    else:
        loss = sub(input, mul(target, log(add(input, eps, tape=tape), tape=tape), tape=tape),
                   tape=tape)
    if full:
        # Stirling's approximation of log(t!) where t > 1; elsewhere 0, with no gradient (the
        # term is evaluated at 2 there, so its log never sees a 0)
        big = gt(_raw(target), 1.0)
        t = where(big, target, 2.0, tape=tape)
        stirling = add(sub(mul(t, log(t, tape=tape), tape=tape), t, tape=tape),
                       add(mul(log(t, tape=tape), 0.5, tape=tape), _HALF_LOG_2PI, tape=tape),
                       tape=tape)
        loss = add(loss, where(big, stirling, 0.0, tape=tape), tape=tape)
    return _reduce(loss, reduction, tape)


def _var_shape(op: str, shape: tuple, vshape: tuple) -> tuple:
    """PyTorch's rules for ``var``: the input's shape; the input's without its last dim (one
    variance per row, unsqueezed); or the input's number of dims with exactly one dim of size
    1 where the input's is not (shared along it). Anything else a ShapeError."""
    if vshape == shape:
        return vshape
    if vshape == shape[:-1]:
        return (*vshape, 1)
    if len(vshape) == len(shape) and \
            sum(v for s, v in zip(shape, vshape) if s != v) == 1:
        return vshape
    raise ShapeError(f"{op}: var is of incorrect size: {vshape} for input {shape}; expected "
                     f"the input's shape, {shape[:-1]} (one per row), or the input's with one "
                     f"dim of size 1")


def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6,  # noqa: A002
                      reduction: str = "mean", *, tape=None):
    """``0.5 (log(var) + (input - target) ** 2 / var)`` (plus ``0.5 log(2 pi)`` with
    ``full=True``), ``var`` clamped at ``eps`` in value only: its gradient passes the clamp
    unchanged, as PyTorch's. ``var`` is a number, a tensor of the input's shape, of its shape
    without the last dim, or of its dims with one of them 1; the target broadcasts. A negative
    variance gives NaN (PyTorch raises; a number is refused here).

    >>> mu = pc.Tensor.from_host(q, np.array([[0.0, 1.0]], np.float32))
    >>> var = pc.Tensor.from_host(q, np.array([1.0], np.float32))
    >>> tp.gaussian_nll_loss(mu, counts.reshape((1, 2)), var, reduction="sum").item()
    2.5
    """
    op = "gaussian_nll_loss"
    _check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    eps = _number(op, "eps", eps)
    shape = tuple(input.shape)
    broadcast_shapes(op, shape, tuple(target.shape))
    sq = square(sub(input, target, tape=tape), tape=tape)
    if _is_scalar(var) and not isinstance(var, bool):
        if var < 0:
            raise ParclError(f"{op}: var has a negative entry ({var})")
        v = max(float(var), eps)
        loss = add(div(sq, v, tape=tape), math.log(v), tape=tape)
    elif isinstance(var, (Node, Tensor)):
        vshape = _var_shape(op, shape, tuple(var.shape))
        if vshape != tuple(var.shape):
            var = reshape(var, vshape, tape=tape)
        raw = _raw(var)
        # the clamp as a constant shift, so the gradient passes it; a negative entry NaN
        shift = where(lt(raw, 0.0), math.nan, sub(clamp(raw, min=eps), raw))
        v = add(var, shift, tape=tape)
        loss = add(div(sq, v, tape=tape), log(v, tape=tape), tape=tape)
    else:
        raise DTypeError(f"{op}: var must be a tp.Node, pc.Tensor or number, got "
                         f"{type(var).__name__}")
    loss = mul(loss, 0.5, tape=tape)
    if full:
        loss = add(loss, _HALF_LOG_2PI, tape=tape)
    return _reduce(loss, reduction, tape)
