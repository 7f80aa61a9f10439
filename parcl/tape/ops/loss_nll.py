"""PyTorch's likelihood losses with ``reduction=`` ('none', 'mean', 'sum'):
``poisson_nll_loss``, ``gaussian_nll_loss`` and ``ctc_loss``.

``ctc_loss`` is one op over the CTC kernels (``parcl/kernels/ctc.py``) giving each sample's
negative log-likelihood, reduced by tape ops. The Poisson and Gaussian losses are pointwise
terms of tape ops (their backwards are the gradient, to the target and the
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

import numpy as np

from ... import recorder
from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import ctc as ck
from ...kernels.broadcast import broadcast_shapes
from ...tensor import FLOAT, LABEL_DTYPES, Tensor
from .. import mode
from ..node import Function, Node
from ..tape import defer
from .checks import FlagCheck
from .activation import _number, clamp
from .elementwise import _is_scalar, add, div, mul, sub
from .loss_more import _reduce, _tensors, check_reduction
from .mathops import gt, lt, square
from .mathops_more import isinf
from .reduce import mean
from .reduce import sum as reduce_sum
from .select import where
from .shape import reshape
from .unary import exp, log

__all__ = ["ctc_loss", "gaussian_nll_loss", "poisson_nll_loss"]

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
    check_reduction(op, reduction)
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
    check_reduction(op, reduction)
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


class _CtcCheck(FlagCheck):
    """The CTC kernels' flag: the flat position in the targets of the first label out of
    range or equal to the blank, the first sample with an input length outside [0, T] and
    the first whose target length is outside [0, S] (padded) or runs past the concatenated
    targets."""

    description = "ctc_loss's label and length check"
    dtype, size = np.int32, 3

    def __init__(self, flag: Tensor, shape: tuple, targets: Tensor, input_lengths: Tensor,
                 target_lengths: Tensor, blank: int, padded: bool):
        self.shape, self.targets, self.blank, self.padded = shape, targets, blank, padded
        self.input_lengths, self.target_lengths = input_lengths, target_lengths
        super().__init__(flag)

    def error(self, host: np.ndarray) -> ShapeError | None:
        label, ilen, tlen = (int(v) for v in host)
        t, _, c = self.shape
        ts = self.targets.shape
        if ilen != ck.NO_ERROR:
            v = int(self.input_lengths.to_host()[ilen])
            return ShapeError(f"ctc_loss: input_lengths[{ilen}] = {v} is outside [0, {t}] "
                              f"(log_probs {self.shape}, T = {t})")
        if tlen != ck.NO_ERROR:
            v = int(self.target_lengths.to_host()[tlen])
            bound = (f"outside [0, {ts[1]}] (padded targets {ts})" if self.padded else
                     f"negative or runs past the concatenated targets {ts} (target_lengths "
                     f"{self.target_lengths.to_host().tolist()})")
            return ShapeError(f"ctc_loss: target_lengths[{tlen}] = {v} is {bound}")
        if label != ck.NO_ERROR:
            v = int(self.targets.to_host().reshape(-1)[label])
            where = tuple(int(i) for i in np.unravel_index(label, ts))
            if v == self.blank:
                return ShapeError(f"ctc_loss: label {v} at position {where} of targets {ts} "
                                  f"is the blank (blank={self.blank}); a target's labels "
                                  f"cannot be the blank (PyTorch's rule), give the blank an "
                                  f"index no label uses")
            return ShapeError(f"ctc_loss: label {v} at position {where} of targets {ts} is out "
                              f"of range for log_probs {self.shape} ({c} classes); labels "
                              f"must be in [0, {c})")
        return None


class CtcLoss(Function):
    """Each sample's ``-log p(target | input)`` (N,), from the alpha recursion; the backward
    runs the beta recursion and gives the gradient with respect to ``log_probs``."""

    name = "ctc_loss"

    def forward(self, log_probs: Tensor, targets: Tensor, input_lengths: Tensor,
                target_lengths: Tensor, blank: int = 0, padded: bool = True,
                zero_infinity: bool = False, per_label: bool = False,
                longest: int | None = None):
        args = (targets, input_lengths, target_lengths, blank, padded)
        nll, length, alpha, flag = ck.ctc_forward(log_probs, *args, longest)
        check = _CtcCheck(flag, log_probs.shape, targets, input_lengths, target_lengths,
                          blank, padded)
        if not self.recording or mode.is_anomaly_enabled():
            check.check()
        out = where(isinf(nll), 0.0, nll) if zero_infinity else nll
        if per_label:                         # 'mean': each loss over its target length
            out = div(out, length)
        out.checks = (check.check,)
        if self.recording:
            self.saved = (log_probs, args, nll, alpha, zero_infinity, length if per_label
                          else None, check)
        return out

    def backward(self, g: Tensor):
        log_probs, args, nll, alpha, zero_infinity, length, check = self.saved
        defer(check.check)
        if not self.needs_input_grad[0]:
            return None, None, None, None
        if length is not None:
            g = div(g, length)
        return ck.ctc_backward(log_probs, *args, nll, alpha, g, zero_infinity), None, None, \
            None


def _lengths(name: str, v, n: int, dtype, queue, unbatched: bool) -> Tensor:
    """A lengths argument as an int Tensor of ``dtype`` and shape (n,) on ``queue``: a
    pc.Tensor of that dtype as it is (read on the device), a sequence or int uploaded."""
    if isinstance(v, Node):
        v = v.value
    if isinstance(v, Tensor):
        if v.dtype != dtype:
            raise DTypeError(f"ctc_loss: {name} has dtype {v.dtype}, the targets {dtype}; "
                             f"pass both with one int dtype")
        if tuple(v.shape) not in ((n,), () if unbatched else (n,)):
            raise ShapeError(f"ctc_loss: {name} must have one length per sample, ({n},), got "
                             f"{v.shape}")
        return v.reshape((n,))
    if recorder.current() is not None:
        raise ParclError(f"ctc_loss: inside a captured step {name} must be a pc.Tensor (a "
                         f"host sequence would be frozen into the recording and replayed "
                         f"for every batch)")
    host = np.asarray(v)
    if not np.issubdtype(host.dtype, np.integer) or host.size != n or host.ndim > 1:
        raise ShapeError(f"ctc_loss: {name} must be {n} int lengths, one per sample, got "
                         f"{host.tolist()!r}")
    return Tensor.from_host(queue, host.reshape(n).astype(dtype))


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False, *, tape=None):
    """``torch.nn.functional.ctc_loss``: ``log_probs`` (T, N, C) (or (T, C), one sample)
    log-softmax outputs; ``targets`` int, padded rows (N, S) or all samples' labels
    concatenated (1-D); ``input_lengths`` and ``target_lengths`` one per sample (a pc.Tensor
    of the targets' int dtype, read on the device, or a sequence of ints; inside a captured
    step a pc.Tensor). Each sample's loss is ``-log`` of the summed probability of every
    alignment of its target (``blank`` between and around the labels); ``reduction="mean"``
    divides each by its target length (at least 1) before the mean over the batch, as PyTorch's.
    An impossible alignment's loss is inf (its gradient NaN), or 0 with a 0 gradient when
    ``zero_infinity``. A label outside ``[0, C)`` or equal to ``blank``, or a length out of
    range, is a ``ShapeError`` (at once when the op is not recorded, else in the backward or at
    the first host read).
    The gradient is that of the loss with respect to ``log_probs`` as given (PyTorch's adds
    ``exp(log_probs)``, which a ``log_softmax`` before it cancels: the same gradient reaches
    the logits).

    >>> lp = tp.log_softmax(tp.tensor(np.zeros((3, 1, 2))), axis=2)
    >>> round(tp.ctc_loss(lp, pc.Tensor.from_host(q, np.array([[1]])), [3], [1]).item(), 4)
    0.2877
    """
    op = "ctc_loss"
    check_reduction(op, reduction)
    _tensors(op, log_probs=log_probs, targets=targets)
    shape = tuple(log_probs.shape)
    raw_lp = _raw(log_probs)
    if raw_lp.dtype != FLOAT:
        raise DTypeError(f"{op}: log_probs has dtype {raw_lp.dtype}, expected float32")
    unbatched = len(shape) == 2
    if len(shape) not in (2, 3):
        raise ShapeError(f"{op}: log_probs must be (T, N, C) or (T, C), got {shape}")
    t, n, c = (shape[0], 1, shape[1]) if unbatched else shape
    labels = _raw(targets)
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"{op}: targets have dtype {labels.dtype} (shape {labels.shape}); "
                         "expected int32 or int64 class indices")
    ts = tuple(labels.shape)
    padded = not (len(ts) == 1 and not unbatched)
    if padded and (len(ts) != (1 if unbatched else 2) or (not unbatched and ts[0] != n)):
        raise ShapeError(f"{op}: targets must be padded rows ({n}, S) or 1-D concatenated "
                         f"labels for log_probs {shape}, got {ts}")
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) or \
            not 0 <= blank < c:
        raise ParclError(f"{op}: blank must be a class index in [0, {c}), got {blank!r}")
    if padded:
        labels = labels.reshape((n, ts[-1]))
    q = raw_lp.queue
    ilen = _lengths("input_lengths", input_lengths, n, labels.dtype, q, unbatched)
    tlen = _lengths("target_lengths", target_lengths, n, labels.dtype, q, unbatched)
    # host lengths (checked by _lengths: one int per sample) bound alpha's rows
    longest = None if isinstance(target_lengths, (Node, Tensor)) else int(
        np.max(np.asarray(target_lengths)))
    lp = reshape(log_probs, (t, 1, c), tape=tape) if unbatched else log_probs
    nll = CtcLoss.apply(lp, labels, ilen, tlen, tape=tape, blank=int(blank), padded=padded,
                        zero_infinity=bool(zero_infinity), per_label=reduction == "mean",
                        longest=longest)
    if reduction == "mean":
        return mean(nll, tape=tape)
    if reduction == "sum":
        return reduce_sum(nll, tape=tape)
    return reshape(nll, (), tape=tape) if unbatched else nll
