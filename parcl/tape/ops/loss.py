"""Softmax and the class-index losses: ``softmax``, ``log_softmax``, ``mse_loss``,
``cross_entropy``, ``nll_loss`` (float-target losses: ``soft_loss``).

``cross_entropy`` fuses log-softmax and the negative log-likelihood, forward and backward
(``(softmax - smoothed onehot) / count``), and reduces to the mean over the rows that count
(not ``ignore_index``) inside one kernel; ``nll_loss`` is the same kernel without the softmax.

Out-of-range labels are found on the device, without a host round trip per step: the forward
kernel marks the first bad row in a 16-byte flag (and makes the loss NaN) and enqueues a
non-blocking read of the flag. The flag is checked, with a ``LabelError`` (a ``ShapeError``)
naming the op, the row (also as ``.row``), the label and the number of classes:

* before the first host read of the loss (``to_host``, ``item``): the loss Tensor carries
  the check in ``checks``, so an evaluation that records but never runs backward still
  raises; the read waits for the forward anyway, so the check costs no extra wait;
* in the backward of a recorded op (the forward has to be finished by then anyway, so the
  wait costs nothing but the first backward kernel's head start);
* at once (a host sync) when the op is not recorded (``no_grad`` evaluation: a value
  computed from the loss on the device would not carry the check), under
  ``tp.detect_anomaly`` (which syncs on every op anyway) or when ``check_labels=True``;
* in a replayed captured step whose labels are one of its inputs, on the host array before
  it is uploaded (a replay has no Python to read the flag back cheaply; nothing is enqueued
  when it fails); labels computed on the device are read again after each replay's forward.

>>> logits = tp.tensor(pc.Tensor.from_host(q, np.zeros((2, 3), np.float32)), True)
>>> labels = pc.Tensor.from_host(q, np.array([0, 2]))
>>> with tp.Tape() as tape:
...     loss = tp.cross_entropy(logits, labels)
>>> round(loss.item(), 4)
1.0986
"""

from __future__ import annotations

import numpy as np

from ...errors import DeviceError, LabelError, ParclError
from ...kernels import cross_entropy as cek
from ...kernels import softmax as smk
from ...kernels.strided import axis_int
from ...tensor import Tensor, keep_checks
from .. import mode
from ..node import Function, Node
from ..tape import defer
from . import elementwise, reduce, soft_loss
from .checks import FlagCheck
from .soft_loss import binary_cross_entropy_with_logits
from .torch_names import torch_names

__all__ = ["binary_cross_entropy_with_logits", "cross_entropy", "log_softmax", "mse_loss",
           "nll_loss", "softmax"]


class Softmax(Function):
    name = "softmax"
    log = False

    def forward(self, x: Tensor, axis: int = -1):
        self.axis = axis
        y = smk.softmax_forward(x, axis, log=self.log)
        if self.recording:
            self.y = y
        return y

    def backward(self, g: Tensor):
        return smk.softmax_backward(self.y, g, self.axis, log=self.log)


class LogSoftmax(Softmax):
    name = "log_softmax"
    log = True


@torch_names()
def softmax(x, axis: int = -1, *, tape=None):
    """``exp(x) / sum(exp(x))`` along ``axis`` (any axis), computed max-subtracted.

    >>> tp.softmax(x, axis=1).shape
    (2, 3)
    """
    return Softmax.apply(x, tape=tape, axis=axis_int("softmax", axis, x.shape))


@torch_names()
def log_softmax(x, axis: int = -1, *, tape=None):
    """``x - logsumexp(x)`` along ``axis`` (any axis), computed max-subtracted.

    >>> tp.log_softmax(x).shape
    (2, 3)
    """
    return LogSoftmax.apply(x, tape=tape, axis=axis_int("log_softmax", axis, x.shape))


class MseLoss(Function):
    name = "mse_loss"

    def forward(self, pred: Tensor, target: Tensor):
        loss = smk.mse_forward(pred, target)
        if self.recording:
            self.pred, self.target = pred, target
        return loss

    def backward(self, g: Tensor):
        return smk.mse_backward(self.pred, self.target, g, need_pred=self.needs_input_grad[0],
                                need_target=self.needs_input_grad[1])


def mse_loss(pred, target, *, reduction: str = "mean", tape=None):
    """``mean((pred - target) ** 2)`` over every element, a scalar (shape ``()``);
    ``reduction="sum"`` their sum, ``"none"`` each element's. ``target`` is usually a raw
    Tensor (or a Node without grad); shapes must match exactly.

    >>> tp.mse_loss(pred, target).shape
    ()
    """
    if reduction_arg("mse_loss", reduction) == "mean":
        return MseLoss.apply(pred, target, tape=tape)
    if tuple(pred.shape) != tuple(target.shape):
        smk.check_mse(pred.value if isinstance(pred, Node) else pred,
                      target.value if isinstance(target, Node) else target)   # raises
    d = elementwise.sub(pred, target, tape=tape)
    squares = elementwise.mul(d, d, tape=tape)
    return squares if reduction == "none" else reduce.sum(squares, tape=tape)


class _LabelCheck(FlagCheck):
    """The class-label flag (the first bad label's row and value, row -1 when all are fine),
    and the host-side version of the same check for captured steps' label inputs."""

    dtype, size = np.int64, 2

    def __init__(self, op: str, flag: Tensor, shape: tuple, what: str, labels: Tensor,
                 ignore_index: int):
        self.op, self.shape, self.input_name, self.ignore = op, shape, what, ignore_index
        self.labels_shape = labels.shape
        self.description = f"{op}'s label check"
        super().__init__(flag, checked=labels)

    def error(self, host: np.ndarray) -> LabelError | None:
        row, label = (int(v) for v in host)
        return self._error(row, label) if row >= 0 else None

    def check_host(self, labels: np.ndarray) -> None:
        """The same check on the labels' host array, before a replay uploads it."""
        c = self.shape[1]
        flat = labels.reshape(-1)
        if not flat.size or (flat.min() >= 0 and flat.max() < c):
            return
        bad = ((flat < 0) | (flat >= c)) & (flat != self.ignore)
        if bad.any():
            row = int(np.argmax(bad))
            raise self._error(row, int(flat[row]))

    def _error(self, row: int, label: int) -> LabelError:
        c = self.shape[1]
        where = f"row {row}"
        if len(self.labels_shape) > 1:
            pos = tuple(int(i) for i in np.unravel_index(row, self.labels_shape))
            where += f" (position {pos} of labels {self.labels_shape})"
        return LabelError(f"{self.op}: label {label} at {where} is out of range for {c} classes "
                          f"({self.input_name} {self.shape}); labels must be class indices in "
                          f"[0, {c}) or ignore_index ({self.ignore})", op=self.op, row=row,
                          label=label, num_classes=c)


class CrossEntropy(Function):
    """Class-index cross-entropy (``nll``: NLL of log-probabilities), fused with the label
    check described in the module docstring."""

    name = "cross_entropy"
    nll = False
    what = "logits"

    def forward(self, logits: Tensor, labels: Tensor, ignore_index: int = -100,
                label_smoothing: float = 0.0, check_labels: bool = False,
                weight: Tensor | None = None, reduction: str = "mean"):
        # A mean is over the labels not ignored, weighted by their class weights: replicas
        # weigh their shares by those (``ReplicaGroup.step``); a sum or per-row losses by rows.
        mean = reduction == "mean"
        self.reduction = reduction        # a sum over the batch is weighed as one
        self.ignore_index = ignore_index if mean else None
        self.class_weight = weight if mean else None
        opts = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, nll=self.nll,
                    weight=weight, reduction=reduction)
        loss, stats, flag = cek.cross_entropy_forward(logits, labels, **opts)
        check = _LabelCheck(self.name, flag, logits.shape, self.what, labels, ignore_index)
        check.guard(loss, not self.recording or check_labels)
        if weight is not None:    # a keyword input: Function.apply passes on only positional
            keep_checks(loss, weight)
        if self.recording:
            self.saved = (logits, labels, stats, check, opts)
        return loss

    def backward(self, g: Tensor):
        logits, labels, stats, check, opts = self.saved
        defer(check.check)            # after the whole backward is enqueued: no stall
        if not self.needs_input_grad[0]:
            return None, None
        return cek.cross_entropy_backward(logits, labels, stats, g, **opts), None


class NllLoss(CrossEntropy):
    name = "nll_loss"
    nll = True
    what = "log_probs"


def ignore_index_arg(op: str, ignore_index) -> int:
    """``ignore_index`` as an int; anything else is a TypeError. It is not truncated: where
    PyTorch takes ``weight`` (the third argument of ``cross_entropy``), class weights would
    become an ignored class, silently."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"{op}: ignore_index must be an int, got {ignore_index!r}; class "
                        "weights (PyTorch's weight, its third argument) go in weight=")
    return int(ignore_index)


def reduction_arg(op: str, reduction) -> str:
    """PyTorch's ``reduction``: ``"mean"``, ``"sum"`` or ``"none"``; anything else a
    ParclError."""
    if reduction not in cek.REDUCTIONS:
        raise ParclError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return reduction


def class_weight_arg(op: str, weight, logits, tape=None) -> Tensor | None:
    """Class weights as a float32 Tensor on the logits' queue (a Node's value; a numpy array
    is uploaded); None stays. No gradient goes to them: one that requires grad where the op
    records is refused, as PyTorch's ('not differentiable with respect to argument
    weight'), not left without a gradient."""
    if weight is None:
        return None
    if isinstance(weight, Node):
        if weight.requires_grad and (tape is not None or mode.state.grad):
            raise ParclError(f"{op}: weight {weight.shape} requires grad, but the loss is not "
                             f"differentiable with respect to its class weights (as PyTorch's); "
                             f"pass weight.detach() or a pc.Tensor")
        weight = weight.value
    queue = logits.value.queue if isinstance(logits, Node) else logits.queue
    if not isinstance(weight, Tensor):
        if not isinstance(weight, np.ndarray):
            raise TypeError(f"{op}: weight must be a pc.Tensor of one weight per class, got "
                            f"{type(weight).__name__}")
        weight = Tensor.from_host(queue, np.asarray(weight, np.float32))
    elif weight.queue is not queue and weight.queue != queue:
        # a ReplicaGroup's replicas each run on a queue (and maybe a context) of their own
        raise DeviceError(f"{op}: weight {weight.shape} is a pc.Tensor of another queue than "
                          f"the logits (another replica's or the caller's); pass the weights "
                          f"as a numpy array, or use pc.nn.CrossEntropyLoss(weight) / "
                          f"NLLLoss(weight), whose tensors reach every replica")
    return weight


def _smoothing(op: str, label_smoothing) -> float:
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ParclError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    return eps


def cross_entropy(logits, labels, ignore_index: int = -100, label_smoothing: float = 0.0, *,
                  weight=None, reduction: str = "mean", check_labels: bool = False, tape=None):
    """``torch.nn.functional.cross_entropy``: ``logits`` (N, C) or (N, C, d1, ...) (classes
    along dim 1), and either class indices ``labels`` (N,) or (N, d1, ...), int32/int64 (a
    raw Tensor or a Node without grad), or class probabilities: a float32 target of the
    logits' shape (a Node may require grad).

    With class indices, rows labelled ``ignore_index`` take no part: the mean is over the
    others (NaN when every row is ignored, as in PyTorch), and they get no gradient.
    ``label_smoothing`` ``e`` mixes in the uniform distribution: the target becomes
    ``(1 - e) * onehot + e / C`` (PyTorch's formula, for probabilities too; an
    ``ignore_index`` other than -100 is refused with them, as PyTorch). ``weight``: class
    weights (C,) with class indices, as PyTorch's: each row's loss times its label's weight,
    the mean divided by the weights of the rows that count (no gradient goes to them; one
    that requires grad is refused, as PyTorch's).
    ``reduction``: ``"mean"``, ``"sum"`` or ``"none"`` (each row's loss, of the labels'
    shape, 0 for an ignored row); class probabilities take ``"mean"`` without weights only.

    A label outside ``[0, C)`` other than ``ignore_index`` is a ``LabelError`` (a
    ``ShapeError``) naming the label, its row (also ``.row``) and C, raised at the first
    host read of the loss, in the backward, or at once when the op is not recorded, under
    ``detect_anomaly`` or with ``check_labels=True``; the loss of such a batch is NaN.

    >>> tp.cross_entropy(logits, labels, label_smoothing=0.1).shape
    ()
    """
    eps = _smoothing("cross_entropy", label_smoothing)
    ignore_index = ignore_index_arg("cross_entropy", ignore_index)
    reduction = reduction_arg("cross_entropy", reduction)
    shape = tuple(getattr(labels, "shape", ()))
    if len(shape) > 1 and shape == tuple(getattr(logits, "shape", ())):   # PyTorch's rule
        if ignore_index != -100:      # no row has a label to ignore; PyTorch raises too
            raise ParclError(f"cross_entropy: ignore_index={ignore_index} is not supported "
                             f"for class probabilities (a float target of the logits' shape "
                             f"{shape}), as in PyTorch; leave it at -100")
        if weight is not None or reduction != "mean":
            raise ParclError(f"cross_entropy: class probabilities (a float target of the "
                             f"logits' shape {shape}) take reduction='mean' without class "
                             f"weights in parcl; got reduction={reduction!r}, weight "
                             f"{'given' if weight is not None else 'None'}")
        return soft_loss.SoftCrossEntropy.apply(logits, labels, tape=tape, label_smoothing=eps)
    return CrossEntropy.apply(logits, labels, tape=tape, ignore_index=ignore_index,
                              label_smoothing=eps, check_labels=bool(check_labels),
                              weight=class_weight_arg("cross_entropy", weight, logits, tape),
                              reduction=reduction)


def nll_loss(log_probs, labels, ignore_index: int = -100, *, weight=None,
             reduction: str = "mean", check_labels: bool = False, tape=None):
    """``torch.nn.functional.nll_loss``: ``-log_probs[r, labels[r]]`` per row, reduced as
    ``reduction`` says (``"mean"`` over rows not labelled ``ignore_index``); shapes, ignored
    rows, class ``weight`` and the label check as ``cross_entropy``.
    ``nll_loss(log_softmax(x, 1), y)`` equals ``cross_entropy(x, y)``.

    >>> tp.nll_loss(tp.log_softmax(logits, axis=1), labels).shape
    ()
    """
    ignore_index = ignore_index_arg("nll_loss", ignore_index)
    return NllLoss.apply(log_probs, labels, tape=tape, ignore_index=ignore_index,
                         check_labels=bool(check_labels),
                         weight=class_weight_arg("nll_loss", weight, log_probs, tape),
                         reduction=reduction_arg("nll_loss", reduction))
