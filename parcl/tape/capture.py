"""Step capture and replay: run a step's Python once, then re-enqueue its kernels directly.

The first call with a new input signature runs ``fn`` eagerly while ``parcl.recorder`` notes
every launch, copy and fill it enqueues and pins every buffer it allocates. Later calls with the
same signature copy the new inputs into the same device buffers and replay the recording: the
same kernels on the same buffers in the same order, so the results are bit-identical to the
eager step, with a few microseconds of Python per kernel instead of the whole tape machinery.

A call whose recording cannot be replayed (it read a value back to the host, drew values on
the host (``pc.nn.init``), waited on another queue, dropped a tensor it read without being
passed it (``ema = ema * 0.9 + x`` of a global ``ema``), or ran under ``detect_anomaly``) says why
in ``reason`` and stays eager for that signature; so does a call whose ``key`` is (or holds
as an item) an ``Unkeyed``: state that cannot be compared by value. Dropout is replayed:
each replay takes the next key of the recording thread's generator, exactly as the eager call
would (and seeds it where the step seeds it), so captured and eager runs match bit for bit.
Like CUDA graphs, capture assumes ``fn`` does the same device work whenever its inputs have
the same shapes: Python state that changes what ``fn`` enqueues without changing the input
shapes (a step counter choosing a branch) must go into ``key``; ``key=pc.nn.capture_key(model)``
covers a model's plain attributes, its train/eval modes, which modules (of which types) it is
made of and which tensors it holds (a parameter or buffer replaced by a new one): the key kept
with a recording holds those tensors, so the memory its replays use goes to no other tensor.
A parameter frozen or thawed, or given a new ``.value``, is seen without a key, and so is a
tensor ``fn`` reads without being passed it (a global's, a closure's) rebound to a new one: the
recording keeps the dropped one's memory (no other tensor gets what a replay reads) and the next
call records anew; a rebound tensor still held elsewhere is replayed as it is (pass ``key=``).
A hook registered on or removed from a leaf or a module the step used between calls
(``register_hook``, ``register_forward_hook``) is seen without a key too (the recording notes
the hooks they hold, ``tape.hooks``): the next call records anew, unless an earlier recording
found them with those same hooks; one on another tensor or module changes nothing. A call
found unreplayable with a hook there (one that reads the gradient back to log it) runs eagerly
while that hook is there, and is replayed again once it is removed. A hook's
device work is replayed; its Python (a print, a list it appends to) runs only in the calls
that record.

A replay also gives every leaf the ``.grad`` its recording gave it. The recording noted the
state it found the leaves' gradients in (none, or buffers to accumulate into) and which leaves
required grad; a call that finds another state (``opt.zero_grad()`` dropped them, a second
micro-batch accumulates, a layer was frozen) is recorded again as another variant of the same
signature, so a replay always writes what the eager call would. An optimizer step inside
``fn`` makes it unreplayable: its learning rate and state change every call.

Like a CUDA graph, a replay writes into the same output tensors each time: the tensors
returned by one call, and the gradient tensors it gives the leaves, are overwritten by the
next (copy a value you want to keep).

>>> step = tp.capture(lambda x, y: train_step(model, x, y), queue)
>>> loss = step(x_batch, y_batch)      # eager and recorded; replayed from the next call on
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from .. import recorder
from ..errors import ParclError
from ..gate import transfer
from ..pool import pool_of
from ..tensor import INTERNAL, Tensor, _check_dtype
from ..uploads import own
from . import mode
from .hooks import HookState
from .tape import hold_back

MAX_SIGNATURES = 8          # input signatures kept per captured function (oldest dropped first)
MAX_VARIANTS = 4            # recordings per signature, one per state of the leaves' gradients


class Unkeyed:
    """A ``key`` part standing for Python state that cannot be compared by value (a config
    object holding a lock, a cycle); ``why`` names it. A replay could not tell whether that
    state changed, so a call whose key is one, or holds one as an item, runs eagerly, as an
    unreplayable recording does. Equal by ``why``: the eager verdict is kept per signature."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __eq__(self, other) -> bool:
        return type(other) is Unkeyed and other.why == self.why

    def __hash__(self) -> int:
        return hash(self.why)

    def __repr__(self) -> str:
        return f"Unkeyed({self.why!r})"


def _unkeyed(key) -> str | None:
    # the key's top level only: capture_key and loss_key return an Unkeyed whole, and a
    # group step's key is a tuple of them
    parts = key if type(key) is tuple else (key,)
    found = next((p for p in parts if type(p) is Unkeyed), None)
    return None if found is None else f"its key cannot be compared by value: {found.why}"


class _Entry:
    """A recording of one signature, or (``reason`` set, no recording) the verdict that its
    calls run eagerly; either stands while ``hooks`` hold (``HookState``)."""

    __slots__ = ("inputs", "recording", "outputs", "reason", "uploads", "hooks")

    def __init__(self, inputs, recording, outputs, reason):
        self.inputs = inputs
        self.recording = recording
        self.outputs = outputs
        self.reason = reason
        self.uploads = []
        self.hooks = HookState()


def _as_input(a) -> np.ndarray:
    """A call's host array as its recorded input holds it: C-contiguous, a ``np.bool_`` mask
    as uint8 0/1 (as ``Tensor.from_host`` stores it)."""
    a = np.asarray(a, order="C")          # not ascontiguousarray: that makes a 0-d array (1,)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    _check_dtype("capture", a.dtype)
    return a


class CapturedStep:
    """``fn(*device_tensors)`` captured per input signature; call it with numpy arrays."""

    def __init__(self, fn, queue: cl.CommandQueue):
        self.fn = fn
        self.queue = queue
        # signature -> its recordings, one per state of the leaves' gradients the recorded
        # backward found (none yet, or accumulating into given buffers), newest last
        self._entries: dict[tuple, list[_Entry]] = {}
        self.replays = 0
        self.eager_calls = 0

    def reason(self, *arrays, key=()) -> str | None:
        """Why calls with these inputs run eagerly (None when they are replayed)."""
        arrays = tuple(_as_input(a) for a in arrays)       # as a call takes them: masks uint8
        entry = self._standing(self._key(arrays, key))
        return None if entry is None else entry.reason

    def _standing(self, k) -> _Entry | None:
        """What decides a call of signature ``k``: a recording made in the state the call
        finds (the hooks on its leaves and modules, and its leaves' gradients: ``unchanged``)
        first, so a verdict found in another state (a gradient that was None then) hides no
        recording of this one; else a verdict found with the hooks there are now; else None
        (record)."""
        held = [e for e in self._entries.get(k, ()) if e.hooks.hold()]
        return next((e for e in held if e.reason is None and e.recording.unchanged()),
                    next((e for e in held if e.reason is not None), None))

    def _key(self, arrays, key):
        return tuple((a.shape, a.dtype.str) for a in arrays), mode.capture_modes(), key

    def __call__(self, *arrays, key=(), borrow: bool = False):
        """Run the step on these numpy inputs (see the module docstring). ``borrow=True``:
        the caller keeps the arrays unchanged until the uploads are done (it waits for the
        step's outputs), so they are uploaded without a host copy (``Tensor.from_host``)."""
        arrays = tuple(_as_input(a) for a in arrays)
        if recorder.current() is not None:
            # Called by a step being captured: its work must go into that recording, which a
            # replay or a recording of this step's own would leave out (an enclosing replay
            # then skipped it). Eager, as that step's own uploads: its inputs are frozen there.
            self.eager_calls += 1
            return self.fn(*self._fresh_inputs(arrays, borrow))
        k = self._key(arrays, key)
        entry = self._standing(k)
        if entry is None:
            return self._record(k, arrays, borrow)
        if entry.reason is not None:                      # not replayable: plain eager
            self.eager_calls += 1
            return self.fn(*self._fresh_inputs(arrays, borrow))
        # a replay writes what its recording wrote: the leaves' gradients as they are now
        # (none, or these buffers to accumulate into), the same parameters frozen, the hooks
        entry.recording.check_inputs(arrays)             # may raise: nothing is enqueued then
        self._upload(entry, arrays, borrow)
        self._replay(entry.recording)
        self.replays += 1
        return entry.outputs

    @staticmethod
    def _replay(rec: recorder.Recording) -> None:
        # a Call that raises stops the replay where the eager call raised: before the work
        # after it, the leaves' gradients as found
        rec.replay()
        try:
            rec.check()
        except ParclError as exc:
            # A check found this call's input bad (an index out of range) after the replay
            # had added its garbage into the leaves' gradients: as after the eager call's
            # failed backward, they hold it and refuse an optimizer step until zeroed, so a
            # loop that catches the error and goes on never trains on it.
            rec.give_grads()
            hold_back(rec.met_leaves(), exc)
            raise
        rec.give_grads()

    def _fresh_inputs(self, arrays, borrow: bool) -> list[Tensor]:
        # a uint8 array here is a bool mask viewed by _as_input (uint8 itself is refused)
        return [Tensor.from_host(self.queue, a.view(np.bool_) if a.dtype == np.uint8 else a,
                                 borrow=borrow) for a in arrays]

    def _record(self, k, arrays, borrow: bool):
        inputs = [Tensor.empty(self.queue, a.shape, _check_dtype("capture", a.dtype, INTERNAL))
                  for a in arrays]
        entry = _Entry(inputs, None, None, None)
        self._upload(entry, arrays, borrow)
        unkeyed = _unkeyed(k[-1])
        if unkeyed is not None or mode.is_anomaly_enabled():
            entry.reason = unkeyed or "detect_anomaly reads every value back to the host"
            self.eager_calls += 1
            outputs = self.fn(*inputs)
        else:
            tape = mode.get_current_tape()
            taped = None if tape is None else len(tape.nodes)
            rec = recorder.start(inputs)
            try:
                outputs = self.fn(*inputs)
                rec.note_end()          # as the call left them, not as its last backward did
            finally:
                recorder.stop()
            if taped is not None and len(tape.nodes) > taped:
                # a replay would hand back this graph, which the caller's tape releases
                recorder.unsafe_recording(rec, "its ops are recorded on the caller's tape, "
                                          "whose backward releases them; open the tp.Tape "
                                          "inside the captured function")
            foreign = rec.foreign_buffers()
            if any(pool_of(queue).free_among(buffers) for queue, buffers in foreign.items()):
                recorder.unsafe_recording(rec, recorder.DROPPED)     # dropped during fn
            entry.recording, entry.outputs, entry.reason = rec, outputs, rec.unsafe
            entry.hooks = HookState([leaf.entry for leaf in rec.leaves.values()],
                                    rec.hooked_modules())
            if rec.unsafe is not None:
                entry.recording = entry.outputs = None     # unpin the buffers
            else:
                # a tensor fn read from a global or a closure and the caller then dropped
                # (rebound the name) keeps its memory for the replays, which see it dropped
                # and record anew, reading what the eager call would read
                for queue, buffers in foreign.items():
                    pool_of(queue).watch(rec, buffers)
        # Verdicts and recordings, each newest last; a verdict leaves the recordings be (they
        # are tried first: one made in another state of the gradients or hooks is replayed
        # again when it comes back). Recordings that lost a tensor they read are never
        # replayed again: dropped.
        old = self._entries.pop(k, [])
        verdicts = [e for e in old if e.reason is not None]
        recordings = [e for e in old if e.reason is None and not e.recording.lost]
        if entry.reason is not None:
            verdicts = (verdicts + [entry])[-MAX_VARIANTS:]
        else:
            recordings = (recordings + [entry])[-MAX_VARIANTS:]
        if len(self._entries) >= MAX_SIGNATURES:
            self._entries.pop(next(iter(self._entries)))
        self._entries[k] = verdicts + recordings
        return outputs

    def _upload(self, entry: _Entry, arrays, borrow: bool) -> None:
        # Non-blocking copies from parcl's own host copies (the caller may refill its arrays
        # as soon as the call returns) unless it borrows them; the events keep them alive.
        entry.uploads = [transfer(self.queue, t.data, own(a, borrow))
                         for t, a in zip(entry.inputs, arrays)]

    def clear(self) -> None:
        """Drop every recording (their pinned buffers go back to the pool)."""
        self._entries.clear()


def capture(fn, queue: cl.CommandQueue) -> CapturedStep:
    """Capture ``fn(*tensors)`` on ``queue``: see the module docstring."""
    return CapturedStep(fn, queue)
