"""A memory pool per command queue, with the counters tape-memory measurements read.

Why per queue: a buffer freed by one queue is only safe to hand to new work on *that* queue
(in-order queues run the new work after the old). Work that another queue enqueues on a buffer
must make the owner queue wait for it (``parcl.crossqueue.foreign_use``), so reuse stays ordered.

Freed buffers are binned by a rounded size (3 significant bits, at most ~25% slack) and reused;
when the device is out of memory the pool drops what it holds and tries again.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass

import pyopencl as cl

from . import recorder


def bin_size(nbytes: int) -> int:
    """Round an allocation up to its bin: 256 B minimum, 3 significant bits above that."""
    if nbytes <= 256:
        return 256
    step = 1 << max(nbytes.bit_length() - 3, 8)
    return (nbytes + step - 1) // step * step


class Allocation:
    """A buffer on loan from a pool; goes back when the last reference is dropped (to the
    recording it was made in, if any: a captured step reuses its buffers on every replay)."""

    __slots__ = ("pool", "buffer", "nbytes", "recording", "__weakref__")

    def __init__(self, pool: MemoryPool, buffer: cl.Buffer, nbytes: int, recording=None):
        self.pool = pool
        self.buffer = buffer
        self.nbytes = nbytes
        self.recording = recording          # a weakref to a recorder.Recording, or None

    def __del__(self):
        pool = self.pool
        if pool is None:
            return
        self.pool = None
        if pool.watched and pool.hand_to_watchers(self):
            return                          # a recording replays on it: held there
        if self.recording is not None:
            rec = self.recording()
            if rec is not None:
                rec.keep(pool, self.buffer, self.nbytes)
                return
        pool._give_back(self.buffer, self.nbytes)


_new = object.__new__


# ``Overwrite.what`` of a gradient zeroed in place (``zero_grad(set_to_none=False)``): a
# ``ReplicaGroup`` zeroes the other replicas' copies of it too (``StepBuffers.follow_zeroing``)
ZEROED = "zero_grad(set_to_none=False)"


@dataclass(slots=True)           # made for every parameter at every optimizer step
class Overwrite:
    """The latest in-place change of a buffer: when (a ``stamp()``), by ``what``
    (``"relu(inplace=True)"``, ``"an optimizer step or load_state_dict"``), and whether it
    was an ``update`` of a parameter rather than an op's in-place output."""

    when: int
    what: str
    update: bool


#: The next number of one process-wide sequence, ordering recorded ops against in-place
#: changes exactly (a clock's ticks could tie); ``next`` on ``itertools.count`` is atomic.
stamp = itertools.count(1).__next__


class MemoryPool:
    """Buffers for one queue's context, reused by size bin; thread-safe. It also keeps the
    latest in-place change of each of the queue's buffers (``note_overwrite``): a backward
    through an op recorded before it that saved the buffer raises (PyTorch's version
    counters catch the same)."""

    def __init__(self, context: cl.Context):
        self.context = context
        self._free: dict[int, list[cl.Buffer]] = {}
        self.overwrites: dict[int, Overwrite] = {}      # buffer int_ptr -> its latest one
        self.last_overwrite = 0                          # the latest ``when`` of them all
        # The graph Entry owning a buffer -> [(when, a weakref to the Entry changed, what)]:
        # in-place ops on Nodes over that buffer (``tape.changes``); weak keys, so a note goes
        # with its graph.
        self.graph_changes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # The Allocation of a basic-indexing result (``x[key]``, ``x.narrow(...)``, ``x.T``: a
        # copy, where PyTorch's is a view) -> what made it: an in-place write to it would not
        # reach ``x``, so it is refused (``Tensor.not_a_copy``); weak keys, so a note goes with
        # its buffer's loan.
        self.copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Buffer int_ptr -> weakrefs to the recordings whose replays use that buffer without
        # having allocated it (a tensor a captured step read from a global): when its last
        # tensor goes, the buffer goes to them instead of to new tensors (``watch``).
        self.watched: dict[int, list] = {}
        # Reentrant: a garbage collection run while the lock is held may free an Allocation
        # (its __del__ gives the buffer back here, on the same thread).
        self._lock = threading.RLock()
        self.bytes_in_use = 0
        self.peak_bytes_in_use = 0
        self.allocations = 0
        self.pool_bytes = 0

    def allocate(self, nbytes: int) -> Allocation:
        size = 256 if nbytes <= 256 else bin_size(int(nbytes))     # small: one bin, no call
        rec = recorder.state.recording
        # Recording a step: reuse what the step itself freed (as the eager step would), and
        # never give the step's buffers back while the recording may be replayed.
        buf = rec.take(self, size) if rec is not None else None
        if buf is None:
            # ``acquire``/``release`` rather than ``with``: this runs for every tensor an op
            # makes, and the context manager costs twice as much host time here
            lock = self._lock
            lock.acquire()
            try:
                bucket = self._free.get(size)
                buf = bucket.pop() if bucket else None
                if buf is None:
                    buf = self._new_buffer(size)
                    self.pool_bytes += size
                self.bytes_in_use += size
                self.allocations += 1
                if self.bytes_in_use > self.peak_bytes_in_use:
                    self.peak_bytes_in_use = self.bytes_in_use
            finally:
                lock.release()
        if rec is not None:
            rec.own(buf)
            return Allocation(self, buf, size, rec.ref)
        alloc = _new(Allocation)          # the eager hot path: no __init__ call
        alloc.pool, alloc.buffer, alloc.nbytes, alloc.recording = self, buf, size, None
        return alloc

    def _new_buffer(self, size: int) -> cl.Buffer:
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size)
        except (cl.MemoryError, cl.Error):
            # Out of device memory: give back everything we hold and try once more.
            self._drop_free_locked()
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size)

    def _give_back(self, buf: cl.Buffer, size: int) -> None:
        lock = self._lock            # (acquire/release: see allocate)
        lock.acquire()
        try:
            bucket = self._free.get(size)
            if bucket is None:
                bucket = self._free[size] = []
            bucket.append(buf)
            self.bytes_in_use -= size
            self.allocations -= 1
        finally:
            lock.release()

    def watch(self, recording, buffers) -> None:
        """``recording`` replays on these buffers (int_ptrs) of this pool that it did not
        allocate: while it lives, one whose tensors are all dropped is handed to it
        (``Recording.lose``), never to another tensor, whose data a replay would read or
        overwrite; the recording, told so, is not replayed again."""
        ref = recording.ref
        with self._lock:
            for ptr in buffers:
                self.watched.setdefault(ptr, []).append(ref)
        weakref.finalize(recording, self._unwatch, ref, tuple(buffers))

    def _unwatch(self, ref, buffers) -> None:
        with self._lock:
            for ptr in buffers:
                refs = self.watched.get(ptr)
                if refs is not None:
                    refs[:] = [r for r in refs if r is not ref]
                    if not refs:
                        del self.watched[ptr]

    def free_among(self, buffers) -> bool:
        """Whether any of these buffers (int_ptrs) is free in this pool now."""
        with self._lock:
            return any(buf.int_ptr in buffers for bucket in self._free.values()
                       for buf in bucket)

    def hand_to_watchers(self, alloc: Allocation) -> bool:
        """Hand the buffer of ``alloc``, dropped now, to the live recordings that watch it
        (as a new Allocation, released as ``alloc`` would be once they are gone); False
        where none does."""
        refs = self.watched.get(alloc.buffer.int_ptr)     # no lock: run for every buffer
        if refs is None:                                   # dropped while any is watched
            return False
        with self._lock:
            recordings = [rec for rec in (ref() for ref in refs) if rec is not None]
        if not recordings:
            return False
        heir = Allocation(self, alloc.buffer, alloc.nbytes, alloc.recording)
        for rec in recordings:
            rec.lose(heir)
        return True

    def note_overwrite(self, buffer: cl.Buffer, what: str, update: bool) -> None:
        """``buffer`` (of this queue) was, or is about to be, changed in place now."""
        with self._lock:                 # threads of one queue: last_overwrite only grows
            when = stamp()
            self.overwrites[buffer.int_ptr] = Overwrite(when, what, update)
            self.last_overwrite = when
        recorder.written(buffer)

    def note_graph_change(self, owner, entry, what: str) -> None:
        """An in-place op ``what`` changes ``entry``'s value, a view of ``owner``'s buffer."""
        with self._lock:
            self.graph_changes.setdefault(owner, []).append(
                (stamp(), weakref.ref(entry), what))

    def graph_changes_by_owner(self) -> dict[int, list]:
        """``graph_changes`` keyed by the owner's ``id``, copied."""
        with self._lock:
            return {id(owner): list(c) for owner, c in self.graph_changes.items()}

    def _drop_free_locked(self) -> None:
        for size, bucket in self._free.items():
            self.pool_bytes -= size * len(bucket)
        self._free.clear()

    def free_held(self) -> None:
        """Release every buffer the pool holds but has not handed out."""
        with self._lock:
            self._drop_free_locked()

    def stats(self) -> dict:
        with self._lock:
            return {"bytes_in_use": self.bytes_in_use,
                    "peak_bytes_in_use": self.peak_bytes_in_use,
                    "allocations": self.allocations,
                    "pool_bytes": self.pool_bytes}

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes_in_use = self.bytes_in_use


_pools: dict[int, tuple[cl.CommandQueue, MemoryPool]] = {}
_pools_lock = threading.Lock()


def pool_of(queue: cl.CommandQueue) -> MemoryPool:
    """The pool of ``queue``: a parcl ``Queue`` carries its own; a plain pyopencl queue gets
    one registered on first use (``release_pool`` drops it)."""
    try:
        return queue.pool
    except AttributeError:
        pass
    with _pools_lock:
        entry = _pools.get(queue.int_ptr)
        if entry is None:
            entry = (queue, MemoryPool(queue.context))
            _pools[queue.int_ptr] = entry
        return entry[1]


def release_pool(queue: cl.CommandQueue) -> None:
    """Forget the pool registered for a plain pyopencl queue (its free buffers are released)."""
    with _pools_lock:
        entry = _pools.pop(queue.int_ptr, None)
    if entry is not None:
        entry[1].free_held()
