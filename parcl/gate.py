"""Held launches: a CPU device's queue is woken once per batch of launches, not once per launch.

Why: when PoCL's CPU device has nothing queued, every launch wakes its worker threads, and that
costs the launching thread ~10-15 µs; a launch queued behind others costs ~2 µs. An eager tape
launches a few kernels per op, each small enough to finish before the host has the next one
ready, so it paid the wake-up on almost every launch: most of its host time per op (measured
with ``parcl-bench overhead``; see docs/performance.md).

How: a small launch (under ``BIG`` work-items) that finds the device idle enqueues a marker
that waits for a user event (the gate) first; it and the launches after it queue up behind the
marker, and the device sees none of them until the gate is released (the event completed),
which wakes it once for all of them. A launch that finds the device still busy with the last one
given to it queues behind that (which wakes nothing), and a big one goes at once, so a
device-bound run (a training step's GEMMs and convolutions) holds little. (Waiting for a few
idle findings in a row before holding anything left a host-bound step of small ops, an LSTM's,
paying a wake-up at every other launch: ~20 % of its host time.) A gate is released, and the
next taken:

* after ``LIMIT`` launches or ``AGE`` seconds, and by the next big launch;
* before every host wait parcl makes (``release_all``: ``runtime.watched``, which
  ``Tensor.to_host`` and ``runtime.wait_for_events`` wait in, ``Queue.finish``/``flush``);
  after every non-blocking copy between host and device (``transfer``: pyopencl waits for a
  dropped copy's event holding the interpreter lock, so the copy must be behind no gate) and
  before every blocking one;
  wherever another queue is made to wait for this one's work (``allreduce``,
  ``foreign_wait``/``foreign_use``, batch-norm statistics, the end of a step); before a
  ``ReplicaGroup`` dispatches a call, and when a replica's call returns;
* by a keeper thread, for a gate held longer than ``KEEPER_AGE``: a blocking pyopencl call on a
  parcl queue that parcl does not know of is delayed by at most that, never left to hang; at
  exit every gate is released.

Only in-order queues on CPU devices are gated (chosen by device type, once, when the queue is
made): a GPU driver batches submissions itself. The kernels, their order and their results are
those of an ungated queue; only when the device starts them changes.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

import pyopencl as cl

LIMIT = 64               # launches behind one gate
AGE = 1e-3               # seconds a gate is held before the next launch releases it
BIG = 4096               # work-items of a launch that starts the device at once
KEEPER_AGE = 5e-3        # seconds after which the keeper thread releases a gate itself

_COMPLETE = cl.command_execution_status.COMPLETE
_clock = time.perf_counter


class Gate:
    """The gate of one queue: ``hold(items)`` before each launch, ``release()`` to let the
    device run what is behind it. Safe to use from several threads."""

    __slots__ = ("queue", "event", "taken", "count", "busy", "lock")

    def __init__(self, queue: cl.CommandQueue):
        self.queue = queue
        self.event: cl.UserEvent | None = None
        self.taken = 0.0               # when the held gate was taken (``_clock``)
        self.count = 0                 # launches behind it
        self.busy: cl.Event | None = None  # the last launch that went to the device at once
        self.lock = threading.Lock()

    def hold(self, items: int) -> bool:
        """Before a launch of ``items`` work-items on the queue: True if it goes to the device
        at once (the caller keeps its event in ``busy``), False if it is held. A small launch
        is held behind the held gate (a new one if the held one is full or old), or behind a
        new gate if it finds the device idle; while the device still runs the last launch
        given to it, a new one queues behind that, which wakes nothing. A launch of ``BIG``
        work-items or more releases the gate and goes at once. (``Launcher`` inlines the
        first branch, the common case.)"""
        if self.event is not None and items < BIG:
            # The common case, without the lock: another thread releasing the gate meanwhile
            # only makes this launch go at once.
            self.count += 1
            if self.count < LIMIT and _clock() - self.taken < AGE:
                return False
        return self.decide(items)

    def decide(self, items: int) -> bool:
        """``hold`` past its common case (a small launch joining a held gate that is neither
        full nor old), under the lock: release, take a new gate, or let the launch go."""
        with self.lock:
            event = self.event
            if event is not None:            # big, or the held one full or old: released
                self.event = None
                event.set_status(_COMPLETE)
                if items >= BIG:
                    return True
            else:
                if items >= BIG or _keeper.closed:     # at exit nothing may be left held
                    return True
                busy = self.busy
                if busy is not None and busy.command_execution_status != _COMPLETE:
                    return True              # queued behind a running launch: wakes nothing
            self.busy = None                 # a small launch finding the device idle: held
            self.event = event = cl.UserEvent(self.queue.context)
            cl.enqueue_marker(self.queue, wait_for=[event])
            self.taken = _clock()
            self.count = 0
        _keeper.watch(self)
        return False

    def release(self) -> None:
        """Let the device run everything launched so far."""
        with self.lock:
            event, self.event = self.event, None
            if event is not None:
                event.set_status(_COMPLETE)


class _Keeper:
    """The process's held gates, and the thread that releases those held too long."""

    def __init__(self):
        self.held: dict[int, Gate] = {}
        self.lock = threading.Lock()
        self.busy = threading.Event()      # set while some gate may be held
        self.thread: threading.Thread | None = None
        self.closed = False                # at exit: no gate is taken any more

    def watch(self, gate: Gate) -> None:
        with self.lock:
            self.held[id(gate)] = gate
            if not self.busy.is_set():
                self.busy.set()
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="parcl-gate-keeper",
                                               daemon=True)
                self.thread.start()

    def release_all(self) -> None:
        with self.lock:
            gates = list(self.held.values())
            self.held.clear()
        for gate in gates:
            gate.release()

    def _run(self) -> None:
        while True:
            self.busy.wait()
            time.sleep(KEEPER_AGE)
            now = _clock()
            with self.lock:
                gates = list(self.held.values())
            for gate in gates:
                if gate.event is not None and now - gate.taken >= KEEPER_AGE:
                    gate.release()
            with self.lock:
                for key in [k for k, g in self.held.items() if g.event is None]:
                    del self.held[key]
                if not self.held:
                    self.busy.clear()


_keeper = _Keeper()


def release(queue: cl.CommandQueue) -> None:
    """Release ``queue``'s gate, if it has one: before a blocking copy (which would wait for
    the keeper), where another queue is to wait for this one, at the end of a replica's call."""
    gate = getattr(queue, "gate", None)
    if gate is not None:
        gate.release()


def transfer(queue: cl.CommandQueue, dst, src) -> cl.Event:
    """``cl.enqueue_copy(queue, dst, src, is_blocking=False)`` between host and device, with
    no gate left in front of it: pyopencl's event for such a copy waits for it when dropped,
    holding the interpreter lock, where the keeper thread could not run. Released after the
    enqueue, so that neither the gate held before it nor one another thread took meanwhile
    holds it back."""
    event = cl.enqueue_copy(queue, dst, src, is_blocking=False)
    release(queue)
    return event


def release_all() -> None:
    """Release every held gate of the process: before a host wait, which may depend on any
    queue's work."""
    _keeper.release_all()


@atexit.register
def _at_exit() -> None:
    """Before the interpreter tears down (and the keeper thread with it): a queue released
    then waits for its work, which must not be held behind a gate nobody will release."""
    _keeper.closed = True
    _keeper.release_all()


def _forget_keeper() -> None:
    """A forked child has none of the parent's threads (nor usable OpenCL objects)."""
    global _keeper
    _keeper = _Keeper()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_keeper)
