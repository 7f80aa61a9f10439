"""The replicas' threads: one long-lived thread per replica, taking calls from its inbox.

A call is dispatched to every replica at once as a ``Job``; each thread runs it with the grad
and anomaly modes of the thread that dispatched it and with no current tape (the caller's
tape is never visible in a replica), and reports a result or an error. The dispatcher is
woken once, when the last replica finishes or the first one fails.
"""

from __future__ import annotations

import queue as queue_mod
import threading
import time
import traceback
from dataclasses import dataclass

import pyopencl as cl

from . import runtime
from .errors import ReplicaError
from .gate import release, release_all
from .tape import mode


class Replica:
    """One replica: ``index``, ``device``, ``queue``, ``model`` (and its thread);
    ``rng_at_step`` is its dropout generator's state when its part of the current step began
    (put back if the step fails)."""

    def __init__(self, index: int, device: cl.Device, queue: cl.CommandQueue):
        self.index = index
        self.device = device
        self.queue = queue
        self.model = None
        self.rng_at_step: tuple[int, int] | None = None
        self.inbox: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
        self.thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Replica({self.index}, {runtime.describe(self.device)})"


@dataclass
class Failure:
    """What a replica raised, with its traceback as text."""

    index: int
    error: BaseException
    traceback: str

    def error_in(self, replica: Replica) -> ReplicaError:
        """The ``ReplicaError`` the caller raises: the replica's index and device, the
        original error (with the batch row it names, if any) and its traceback."""
        dev = runtime.describe(replica.device)
        row = getattr(self.error, "batch_row", None)
        where = f" (row {row} of the batch given to step)" if row is not None else ""
        return ReplicaError(f"replica {self.index} on {dev} failed: "
                            f"{type(self.error).__name__}: {self.error}{where}\n"
                            f"--- traceback in replica {self.index} ---\n{self.traceback}",
                            index=self.index, device=dev, traceback_text=self.traceback)


class Job:
    """One dispatched call: a result or a failure per replica.

    The dispatcher is woken once, when the last replica finishes (or the first one fails), not
    at every replica's finish: each wake-up costs a context switch on the cores the devices
    may be computing on."""

    def __init__(self, k: int):
        self.results = [None] * k
        self.failures: list[Failure] = []
        self.finished = 0
        self.sent = 0              # replicas the job was handed to (``dispatch``)
        self.k = k
        self._mutex = threading.Lock()
        self.all_done = threading.Event()
        self.done_or_failed = threading.Event()

    def finish(self, index: int, result=None, failure: Failure | None = None) -> None:
        with self._mutex:
            if failure is None:
                self.results[index] = result
            else:
                self.failures.append(failure)
            self.finished += 1
            if self.finished == self.k:
                self.all_done.set()
            # A replica that only stopped because a failing one broke their shared barrier
            # (sync_batchnorm) does not wake the dispatcher: the cause it is waiting for
            # comes from the failing replica itself, maybe a moment later.
            if self.finished == self.k or failure is not None and not isinstance(
                    failure.error, threading.BrokenBarrierError):
                self.done_or_failed.set()

    def abandon(self) -> None:
        """The dispatch was interrupted (Ctrl-C) before every replica was handed the job:
        those never will be, so they count as finished. Otherwise a wait for the job (the
        next call's, or a failed step's rewind) waited for them until its timeout."""
        with self._mutex:
            self.finished += self.k - self.sent
            self.sent = self.k
            if self.finished >= self.k:
                self.all_done.set()
                self.done_or_failed.set()

    def wait(self, deadline: float, stop_on_error: bool = True) -> bool:
        """True when every replica finished (or one failed and ``stop_on_error``) before
        ``deadline`` (a ``time.monotonic()`` value)."""
        event = self.done_or_failed if stop_on_error else self.all_done
        return event.wait(wait_seconds(deadline))


def wait_seconds(deadline: float) -> float:
    """The seconds left until ``deadline`` (a ``time.monotonic()`` value, ``inf`` for none),
    as a lock's wait takes them: at most ``threading.TIMEOUT_MAX``, beyond which it raises
    OverflowError."""
    return min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)


def start(replica: Replica) -> None:
    """Start ``replica``'s thread."""
    replica.thread = threading.Thread(target=_work, args=(replica,), daemon=True,
                                      name=f"parcl-replica-{replica.index}")
    replica.thread.start()


def dispatch(replicas: list[Replica], job: Job, fn, per_replica_args) -> None:
    """Hand ``fn(replica, *args_i)`` to every replica's thread, with this thread's modes."""
    modes = mode.capture_modes()
    release_all()          # nothing this thread left held may stall a replica (parcl.gate)
    for i, r in enumerate(replicas):
        r.inbox.put((job, fn, tuple(a[i] for a in per_replica_args), modes))
        job.sent += 1


def _work(replica: Replica) -> None:
    """A replica thread: take calls from the inbox until the None sentinel."""
    runtime.set_default_queue(replica.queue)
    while True:
        item = replica.inbox.get()
        if item is None:
            break
        job, fn, args, modes = item
        del item
        mode.apply_modes(modes)            # the dispatching thread's grad/anomaly mode
        mode.set_current_tape(None)        # the caller's tape is never visible here
        try:
            result = fn(replica, *args)
        except BaseException as exc:       # noqa: BLE001 - everything is reported to the caller
            job.finish(replica.index, failure=Failure(replica.index, exc,
                                                      traceback.format_exc()))
        else:
            job.finish(replica.index, result=result)
        finally:
            release(replica.queue)         # what it launched runs now (parcl.gate)
            mode.set_current_tape(None)
            del job, fn, args


def shutdown(replicas: list[Replica], timeout: float = 10.0) -> None:
    """Stop every replica's thread; waits at most ``timeout`` seconds in all."""
    for r in replicas:
        r.inbox.put(None)
    deadline = time.monotonic() + timeout
    for r in replicas:
        if r.thread is not None:
            r.thread.join(max(0.0, deadline - time.monotonic()))
