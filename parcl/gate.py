"""Launch gates: let a burst of small launches queue up before the device starts on them.

Why: PoCL's CPU device wakes its worker threads for every command that is ready to run. When
the device has caught up with the host (tiny tensors: every kernel is done before the next one
is enqueued) each enqueue wakes the workers, which then compete with the host thread for the
cores: measured on the 2-core reference machine, an enqueue costs ~1.5 us while the queue is
busy and 12-20 us once it has drained. Behind an unsignalled user event nothing is ready, so
the enqueues stay cheap; opening the gate hands the device the whole burst at once.

``hold(queue)`` closes a gate on ``queue`` for the calling thread (a no-op on GPUs, whose
drivers batch submissions themselves, and where the thread already holds a closed one on that
queue); it opens on exit (also on an exception), after every ``EVERY`` calls of ``tick()`` (so
a long burst still overlaps with the device), and whenever the thread is about to wait for the
device or to copy from the host: ``release()``, which ``Tensor.to_host`` and
``Tensor.from_host`` call. Nothing changes what runs or in which order: the in-order queue runs
the same kernels.

Held: a recorded forward (``with tp.Tape()``) and the tape's reverse pass. A thread must not
wait for a held queue by other means than those, nor drop the event of a non-blocking host
copy it enqueued behind the gate (pyopencl's ``NannyEvent`` waits in its destructor): parcl's
own waits and copies (``Tensor.to_host``/``from_host``, ``Queue.finish``,
``runtime.wait_for_events``, the label and index checks' reads) call ``release()`` first. A
``no_grad`` block is not held: loading a state dict there drops such an event at once.

>>> import parcl as pc
>>> from parcl import gate
>>> with gate.hold(pc.default_queue()):
...     gate.tick()          # after each unit of work (e.g. one op)
"""

from __future__ import annotations

import threading

import pyopencl as cl

EVERY = 32          # ticks (ops, or backward nodes) between openings of a held gate
# Work this large (elements of an op's output) keeps the device busy at least about as long as
# a wake-up costs, so holding it back only makes the device wait for the host: the first such
# op opens the gates for the rest of the block. Measured on eager training steps, gated over
# ungated per round: MLP batch 256 (outputs of 131K elements) 2 % slower with 1M here, even
# with 64K; ResNet-18 and the CNN (first outputs over 1M) 1-1.5 % slower held throughout.
LARGE = 1 << 16
_COMPLETE = cl.command_execution_status.COMPLETE
_GPU = cl.device_type.GPU


class _Held(threading.local):
    gates: tuple = ()        # this thread's closed gates, innermost last
    off = False              # inside ``disabled()``


_held = _Held()


class _Gate:
    """One queue's gate: new commands wait behind ``event`` until it is set complete."""

    __slots__ = ("queue", "count", "event")

    def __init__(self, queue: cl.CommandQueue):
        self.queue = queue
        self.count = 0
        self.event = None

    def close(self) -> None:
        self.count = 0
        self.event = cl.UserEvent(self.queue.context)
        cl.enqueue_barrier(self.queue, wait_for=[self.event])

    def open(self) -> None:
        event, self.event = self.event, None
        if event is not None:
            event.set_status(_COMPLETE)


class hold:
    """``with hold(queue):`` hold ``queue``'s new commands (see the module docstring)."""

    __slots__ = ("gate",)

    def __init__(self, queue: cl.CommandQueue):
        self.gate = None
        if _held.off or queue.device.type & _GPU or any(g.queue is queue and g.event is not None
                                           for g in _held.gates):
            return
        self.gate = _Gate(queue)

    def __enter__(self) -> hold:
        if self.gate is not None:
            self.gate.close()
            _held.gates = (*_held.gates, self.gate)
        return self

    def __exit__(self, *exc) -> bool:
        gate = self.gate
        if gate is not None:
            gate.open()
            _held.gates = tuple(g for g in _held.gates if g is not gate)
        return False


def tick(elements: int = 0) -> None:
    """One unit of work enqueued (``elements``: the size of what it produced): every ``EVERY``
    ticks each held gate lets the device run what it holds; work of ``LARGE`` elements or more
    opens the gates for good (see ``LARGE``)."""
    gates = _held.gates
    if not gates:
        return
    if elements >= LARGE:
        release()
        return
    for gate in gates:
        if gate.event is not None:
            gate.count += 1
            if gate.count >= EVERY:
                gate.open()
                gate.close()


def release() -> None:
    """Open every gate this thread holds (before it waits for the device); they stay open
    until their ``hold`` block ends."""
    for gate in _held.gates:
        gate.open()


class disabled:
    """``with gate.disabled():`` no gate is held in this thread (every launch goes to the device
    at once, as without this module): what ``parcl-bench overhead --steps`` compares against.
    Thread-local."""

    def __enter__(self) -> disabled:
        self.previous = _held.off
        _held.off = True
        return self

    def __exit__(self, *exc) -> bool:
        _held.off = self.previous
        return False


def holding() -> bool:
    """Whether this thread holds a closed gate now."""
    return any(g.event is not None for g in _held.gates)
