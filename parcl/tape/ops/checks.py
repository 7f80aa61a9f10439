"""``FlagCheck``: an op's input check done on the device, read back without a stall.

Some inputs can only be validated where they are used: a class label, a gather or embedding
index. The op's kernel writes a small flag (the first bad position, or a sentinel); a
``FlagCheck`` starts the non-blocking read of it at once and raises, at the first host read of
what the op produced (``Tensor.checks``), in the backward (``defer``) or at once, the error the
flag means. Inside a captured step every replay reads the flag afresh; where the checked
tensor is an input of the step, its host array is checked before each replay instead
(``check_host``: no device read, no wait). A failed check fails again on every call: what it
guards is garbage.
"""

from __future__ import annotations

import numpy as np

from ... import recorder, runtime
from ...gate import transfer
from ...tensor import Tensor
from .. import mode


class FlagCheck:
    """Subclasses give ``description`` (named in a timed-out wait), the flag's host ``dtype`` and
    ``size``, ``error(host)`` (the exception the read flag means, or None) and, for checked
    tensors that may be a captured step's input, ``check_host(array)``."""

    description = "a device-side check"
    dtype, size = np.int32, 1

    def __init__(self, flag: Tensor, checked: Tensor | None = None):
        self.host = np.empty(self.size, self.dtype)
        self.reread(flag)
        if recorder.current() is None:
            return
        if checked is not None and hasattr(self, "check_host") and recorder.input_check(
                checked, self.check_host):
            return
        recorder.call(lambda: self.reread(flag))     # each replay reads it afresh
        recorder.host_hook(self.check)

    def reread(self, flag: Tensor) -> None:
        self.flag, self.failure = flag, None
        self.event = transfer(flag.queue, self.host, flag.data)

    def check(self) -> None:
        """Raise if the latest read of the flag found a bad input (waiting for it first)."""
        event = self.event
        if event is not None:
            runtime.wait_for_events([event], what=self.description)
            # The failure before the event is cleared: another thread reading a tensor that
            # shares this check meanwhile (``error`` may read the host) waits and finds it
            # too, never a cleared event with no failure yet.
            self.failure = self.error(self.host)
            self.event = self.flag = None
        if self.failure is not None:
            raise self.failure

    def guard(self, out: Tensor, at_once: bool) -> None:
        """Check now where ``at_once`` (an op that is not recorded: no backward will check)
        or under ``detect_anomaly``, and before every host read of ``out`` (a recorded result
        read without a backward)."""
        if at_once or mode.is_anomaly_enabled():
            self.check()
        out.checks = (self.check,)

    def error(self, host: np.ndarray) -> Exception | None:
        raise NotImplementedError


def read_checks(t: Tensor) -> None:
    """Run ``t``'s pending checks now (a wait, only where it has any) and at this point of
    every replay of the step being captured: before an update of state that outlives the
    step (running statistics), which a batch computed from a bad input (an embedding's id
    out of range, its error caught and the batch skipped) would leave NaN for good, where
    PyTorch's error comes before any update."""
    checks = t.checks
    if not checks:
        return

    def read():
        for check in checks:
            check()
    read()
    recorder.call(read)              # a replay raising here enqueues nothing after it
