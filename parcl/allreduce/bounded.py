"""Collectives bounded in time: an MPI communicator whose every collective call is watched.

An MPI collective waits without limit. A rank whose script caught a failed step and went on, or
that left its loop a step early, leaves the others waiting forever in their next ``Allreduce``
(under ``parcl-launch`` only an *uncaught* exception aborts the job). ``Bounded(comm, timeout)``
runs each collective under a deadline, and a watchdog thread ends the whole job
(``MPI_Abort``) when one passes it, after one line on stderr naming the rank, the collective and
the wait, as PyTorch's NCCL watchdog does: a call blocked inside MPI cannot be interrupted from
Python, so aborting the job is the one way to end the wait that leaves no rank behind.

>>> class Solo:                                  # a one-rank stand-in for mpi4py's comm
...     def Get_rank(self): return 0
...     def allreduce(self, value): return value
>>> comm = Bounded(Solo(), timeout=60.0)
>>> comm.allreduce(3), comm.Get_rank()
(3, 0)
>>> comm.close()
"""

from __future__ import annotations

import itertools
import sys
import threading
import time

__all__ = ["ABORTED", "COLLECTIVES", "Bounded"]

#: mpi4py's collective calls (object and buffer forms) that parcl's step makes or a script may
COLLECTIVES = frozenset((
    "allreduce", "Allreduce", "bcast", "Bcast", "allgather", "Allgather", "gather", "Gather",
    "reduce", "Reduce", "scatter", "Scatter", "alltoall", "Alltoall", "barrier", "Barrier"))

#: the exit status of a job the watchdog aborted
ABORTED = 3


class Bounded:
    """``comm`` (an mpi4py communicator) with each collective in ``COLLECTIVES`` bounded by
    ``timeout`` seconds; every other attribute is ``comm``'s own. ``close()`` stops the
    watchdog (a daemon thread, started at the first collective)."""

    def __init__(self, comm, timeout: float):
        self.comm = comm
        self.timeout = float(timeout)
        self._cond = threading.Condition()
        self._waits: dict[int, tuple[float, str]] = {}     # token -> (deadline, collective)
        self._tokens = itertools.count()
        self._watchdog: threading.Thread | None = None
        self._closed = False

    def __getattr__(self, name: str):
        attr = getattr(self.comm, name)
        if name not in COLLECTIVES:
            return attr

        def bounded(*args, **kwargs):
            token = self._enter(name)
            try:
                return attr(*args, **kwargs)
            finally:
                self._leave(token)
        return bounded

    def _enter(self, name: str) -> int:
        token = next(self._tokens)
        with self._cond:
            self._waits[token] = (time.monotonic() + self.timeout, name)
            if self._watchdog is None and not self._closed:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name="parcl-collective-watchdog")
                self._watchdog.start()
            self._cond.notify()
        return token

    def _leave(self, token: int) -> None:
        with self._cond:
            del self._waits[token]

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._waits:
                    self._cond.wait()
                    continue
                deadline, name = min(self._waits.values())
                left = deadline - time.monotonic()
                if left > 0:
                    # woken early by a new call or close(); a lock's wait takes at most
                    # TIMEOUT_MAX (a timeout of inf: no deadline passes)
                    self._cond.wait(min(left, threading.TIMEOUT_MAX))
                    continue
                self._abort(name)
                return

    def _abort(self, name: str) -> None:
        rank = self.comm.Get_rank()
        sys.stderr.write(
            f"parcl: [rank {rank}] {name} waited more than {self.timeout:g} s for the other "
            f"ranks (one failed, or its script caught a step's error and went on, or left "
            f"its loop early: every rank must make the same steps); aborting the job\n")
        sys.stderr.flush()
        time.sleep(0.5)                       # mpiexec forwards the line before the teardown
        self.comm.Abort(ABORTED)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
