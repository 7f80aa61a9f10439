"""Softmax and losses: ``softmax``, ``log_softmax``, ``mse_loss``, ``cross_entropy``.

``cross_entropy`` fuses log-softmax and the negative log-likelihood, forward and backward
(``(softmax - onehot) / N``), and reduces to the batch mean inside one kernel.

Out-of-range labels are found on the device, without a host round trip per step: the forward
kernel marks the first bad row in a 16-byte flag (and makes the loss NaN) and enqueues a
non-blocking read of the flag. The flag is checked, with a clear ``ShapeError`` naming the
row and the label:

* in the backward of a recorded ``cross_entropy`` (the forward has to be finished by then
  anyway, so the wait costs nothing but the first backward kernel's head start);
* at once (a host sync) when the op is not recorded (``no_grad`` evaluation), under
  ``tp.detect_anomaly`` (which syncs on every op anyway) or when ``check_labels=True``;
* in a replayed captured step whose labels are one of its inputs, on the host array before
  it is uploaded (a replay has no Python to read the flag back cheaply; nothing is enqueued
  when it fails).

>>> logits = tp.tensor(pc.Tensor.from_host(q, np.zeros((2, 3), np.float32)), True)
>>> labels = pc.Tensor.from_host(q, np.array([0, 2]))
>>> with tp.Tape() as tape:
...     loss = tp.cross_entropy(logits, labels)
>>> round(loss.item(), 4)
1.0986
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ... import recorder, runtime
from ...errors import ShapeError
from ...kernels import softmax as smk
from ...tensor import Tensor
from .. import mode
from ..node import Function
from ..tape import defer

__all__ = ["cross_entropy", "log_softmax", "mse_loss", "softmax"]


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


def softmax(x, axis: int = -1, *, tape=None):
    """``exp(x) / sum(exp(x))`` along ``axis`` (any axis), computed max-subtracted.

    >>> tp.softmax(x, axis=1).shape
    (2, 3)
    """
    return Softmax.apply(x, tape=tape, axis=int(axis))


def log_softmax(x, axis: int = -1, *, tape=None):
    """``x - logsumexp(x)`` along ``axis`` (any axis), computed max-subtracted.

    >>> tp.log_softmax(x).shape
    (2, 3)
    """
    return LogSoftmax.apply(x, tape=tape, axis=int(axis))


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


def mse_loss(pred, target, *, tape=None):
    """``mean((pred - target) ** 2)`` over every element, a scalar (shape ``()``). ``target``
    is usually a raw Tensor (or a Node without grad); shapes must match exactly.

    >>> tp.mse_loss(pred, target).shape
    ()
    """
    return MseLoss.apply(pred, target, tape=tape)


class _LabelCheck:
    """The pending read of a cross-entropy label flag and what to say if it is set."""

    def __init__(self, flag: Tensor, logits_shape: tuple, labels: Tensor):
        self.host = np.empty(2, np.int64)
        self.event = cl.enqueue_copy(flag.queue, self.host, flag.data, is_blocking=False)
        self.flag = flag                 # keep the device buffer alive until the copy is done
        self.shape = logits_shape
        if recorder.current() is None or recorder.input_check(labels, self.check_host):
            return
        # A captured step whose labels are computed on the device: each replay reads the
        # flag again right after the forward kernel that wrote it (so the check waits for
        # the forward, not the backward), and checks it once the replay is enqueued. (Labels
        # that are an input of the step are checked on the host before each replay instead:
        # no read, no wait.)
        recorder.call(lambda: self.reread(flag))
        recorder.host_hook(self.check)

    def reread(self, flag: Tensor) -> None:
        self.flag = flag
        self.event = cl.enqueue_copy(flag.queue, self.host, flag.data, is_blocking=False)

    def check(self) -> None:
        if self.event is None:
            return
        runtime.wait_for_events([self.event], what="cross_entropy's label check")
        self.event = self.flag = None
        row, label = (int(v) for v in self.host)
        if row >= 0:
            self._raise(row, label)

    def check_host(self, labels: np.ndarray) -> None:
        """The same check on the labels' host array, before a replay uploads it."""
        c = self.shape[1]
        flat = labels.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= c):
            row = int(np.argmax((flat < 0) | (flat >= c)))
            self._raise(row, int(flat[row]))

    def _raise(self, row: int, label: int):
        n, c = self.shape
        raise ShapeError(f"cross_entropy: label {label} at row {row} is out of range for "
                         f"{c} classes (logits {self.shape}); labels must be class indices "
                         f"in [0, {c})")


class CrossEntropy(Function):
    name = "cross_entropy"

    def forward(self, logits: Tensor, labels: Tensor, check_labels: bool = False):
        loss, lse, flag = smk.cross_entropy_forward(logits, labels)
        check = _LabelCheck(flag, logits.shape, labels)
        if not self.recording or check_labels or mode.is_anomaly_enabled():
            check.check()
        if self.recording:
            self.saved = (logits, labels, lse, check)
        return loss

    def backward(self, g: Tensor):
        logits, labels, lse, check = self.saved
        defer(check.check)            # after the whole backward is enqueued: no stall
        if not self.needs_input_grad[0]:
            return None, None
        return smk.cross_entropy_backward(logits, labels, lse, g), None


def cross_entropy(logits, labels, *, check_labels: bool = False, tape=None):
    """Mean over the batch of ``-log_softmax(logits)[i, labels[i]]``: ``logits`` (N, C),
    ``labels`` (N,) int32 or int64 class indices (a raw Tensor or a Node without grad).

    A label outside ``[0, C)`` is a ``ShapeError`` naming it, raised in the backward (or at once
    when the op is not recorded, under ``detect_anomaly``, or with ``check_labels=True``); the
    loss of such a batch is NaN. See the module docstring for why it is checked there.

    >>> tp.cross_entropy(logits, labels).shape
    ()
    """
    return CrossEntropy.apply(logits, labels, tape=tape, check_labels=bool(check_labels))
