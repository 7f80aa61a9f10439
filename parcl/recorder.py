"""Recording of enqueued device work, for step capture and replay (``parcl.tape.capture``).

While a thread records, every kernel launch, copy and fill it enqueues is appended to a
``Recording`` (and still executed), every buffer it allocates belongs to the recording for as
long as the recording lives (reused within the step as eagerly, never handed to other work, so
replays find their buffers untouched), the buffers it uses without allocating them (a tensor
read from a global) are handed to it when their tensors are dropped (``MemoryPool.watch``: it is
then not replayed again, and no other tensor gets that memory meanwhile), and anything a replay
could not reproduce (a host read whose value steers Python code, an event wait between queues)
marks the recording unusable.
A launch whose argument must change on every call (dropout's random key) says so with
``replay_arg``, and the replay sets it before enqueueing that launch.
This module only holds that state; it knows nothing of autograd.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field, replace
from functools import partial

import pyopencl as cl

class _Local(threading.local):
    # Class defaults: reading an attribute a thread never set is then a plain lookup (a
    # getattr with a default raises and catches inside, ~8x slower, on every allocation and
    # launch of an eager op).
    recording: Recording | None = None


# This thread's recording: ``state.recording`` is read directly where every launch and every
# allocation asks (``kernels._cache.get_kernel``, ``MemoryPool.allocate``), as a call to
# ``current()`` there costs more than the read itself.
state = _Local()


@dataclass
class LeafGrad:
    """A leaf a recorded backward met: the ``.grad`` it found (None, or the tensor it
    accumulated into), whether it required grad then, the ``.grad`` it left, its ``.value``
    (weakly: dropped with its Node, a global rebound to a new one, its memory goes to the
    recording, which is then not replayed: ``Recording.lose``), whether a backward's pass
    reached it (``met``: its ``.grad`` holds that pass's contributions), whether the call
    assigned its ``.grad`` (``assigned``: ``p.grad = None``), whether the recording depends on
    the ``.grad`` it found (``depends``: met or read before any assignment; compared before a
    replay) and, once the call returns (``Recording.note_end``), whether it leaves one
    (``writes``: met, read or assigned; given after a replay). An evaluation's leaves do
    neither, and the recording keeps no gradient of theirs."""

    entry: object
    before: object
    requires_grad: bool
    after: object = None
    value: object = None
    met: bool = False
    assigned: bool = False
    depends: bool = False
    after_checks: tuple = ()
    writes: bool = True

    @classmethod
    def of(cls, entry) -> LeafGrad:
        """``entry`` as found; the ``.grad`` it leaves is that one until a recorded backward
        says otherwise (``note_grads``): a call that runs none (an evaluation) keeps it."""
        node = entry.node()
        return cls(entry, entry.grad, entry.requires_grad, after=entry.grad,
                   value=None if node is None else weakref.ref(node.value))


@dataclass(frozen=True)
class Launch:
    """A kernel launch: the recording's own kernel object, its arguments set once; ``updates``
    are (argument index, value()) pairs set again before each replay (``replay_arg``);
    ``pieces``, where the device's grid is too small for ``gsize``, the (offset, size)
    launches it was enqueued as (``kernels._grid``)."""

    kernel: cl.Kernel
    queue: cl.CommandQueue
    gsize: tuple
    lsize: tuple | None
    args: tuple
    updates: tuple = ()
    pieces: tuple | None = None

    def bind(self):
        if not all(self.gsize):     # no work-items: a marker (some devices refuse the launch)
            return partial(cl.enqueue_marker, self.queue)
        if not self.updates and self.pieces is None:
            return partial(cl.enqueue_nd_range_kernel, self.queue, self.kernel, self.gsize,
                           self.lsize)
        kernel, updates = self.kernel, self.updates
        pieces = ((None, self.gsize),) if self.pieces is None else self.pieces

        def launch():
            for index, value in updates:
                kernel.set_arg(index, value())
            for offset, size in pieces:
                event = cl.enqueue_nd_range_kernel(self.queue, kernel, size, self.lsize, offset)
            return event
        return launch


@dataclass(frozen=True)
class Copy:
    """An ``enqueue_copy(queue, dst, src, **options)`` between buffers or from host memory."""

    queue: cl.CommandQueue
    dst: object
    src: object
    options: dict = field(default_factory=dict)

    def bind(self):
        return partial(cl.enqueue_copy, self.queue, self.dst, self.src, **self.options)


@dataclass(frozen=True)
class Fill:
    """An ``enqueue_fill_buffer`` of ``size`` bytes at ``offset`` with ``pattern``."""

    queue: cl.CommandQueue
    buffer: cl.MemoryObject
    pattern: object
    offset: int
    size: int

    def bind(self):
        return partial(cl.enqueue_fill_buffer, self.queue, self.buffer, self.pattern,
                       self.offset, self.size)


@dataclass(frozen=True)
class Call:
    """Python run at this point of every replay (e.g. enqueueing the read of a flag)."""

    fn: object

    def bind(self):
        return self.fn


class Recording:
    """The device work of one captured call, replayable in order on the same buffers."""

    def __init__(self):
        self.ops: list[Launch | Copy | Fill | Call] = []
        self.host_hooks: list = []          # callables re-run after every replay
        self.inputs: list = []              # the captured call's input tensors
        self.input_checks: list = []        # (input index, check(host array)) before a replay
        self.written: set[int] = set()      # buffers the call wrote in place (``written``)
        self.unsafe: str | None = None      # why this call cannot be replayed, if it cannot
        # id(leaf entry) -> every leaf the recorded backward passes met: a replay writes the
        # gradients the recording wrote
        self.leaves: dict[int, LeafGrad] = {}
        # id(module) -> weakref to it: every module the call ran or looked at the hooks of
        # (``note_hooked``), whose hooks, with the leaves', are a condition of its replays
        self.hooked: dict[int, weakref.ref] = {}
        self._calls: list | None = None     # the ops bound for replay (made by the first one)
        self.ref = weakref.ref(self)
        self._kept: dict[tuple, list] = {}  # (pool, size) -> buffers the step freed
        # int_ptr of each buffer the step allocated -> how many ops were recorded before then
        self.owned: dict[int, int] = {}
        # Allocations of buffers the step used but did not allocate (a tensor read from a
        # global) whose tensors were all dropped since: held, so no other tensor gets the
        # memory the replays would read; a recording that holds any is not replayed again
        self.lost: list = []
        self._lock = threading.RLock()        # see MemoryPool._lock

    # -- buffers: the step's own, reused within it, held for its replays ---------------------
    def keep(self, pool, buffer, size: int) -> None:
        """A buffer the step allocated was freed: hold it for reuse and for the replays."""
        with self._lock:
            self._kept.setdefault((pool, size), []).append(buffer)

    def take(self, pool, size: int):
        """A buffer of ``size`` the step freed earlier (reused in the same order on replay)."""
        if state.recording is not self:
            return None                     # recording over: kept buffers are the replays'
        with self._lock:
            bucket = self._kept.get((pool, size))
            return bucket.pop() if bucket else None

    def own(self, buffer) -> None:
        """The step allocated ``buffer`` (from the pool, or again from ``take``)."""
        self.owned.setdefault(buffer.int_ptr, len(self.ops))

    def foreign_buffers(self) -> dict:
        """queue -> the int_ptrs of the buffers the recorded ops use that the step did not
        allocate (its inputs, parameters, a tensor read from a global or a closure), each
        sub-buffer as its parent: the buffers a replay relies on others to keep. One the ops
        used before the step allocated it was another tensor's, dropped during the call:
        the recording is marked unsafe (``DROPPED``)."""
        used: dict = {}
        for i, op in enumerate(self.ops):
            if isinstance(op, Launch):
                buffers = op.args
            elif isinstance(op, Copy):
                buffers = (op.dst, op.src)
            elif isinstance(op, Fill):
                buffers = (op.buffer,)
            else:
                continue
            for buf in buffers:
                if isinstance(buf, cl.MemoryObjectHolder):
                    parent = buf.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
                    ptr = (buf if parent is None else parent).int_ptr
                    allocated_at = self.owned.get(ptr)
                    if allocated_at is None:
                        used.setdefault(op.queue, set()).add(ptr)
                    elif allocated_at > i:
                        unsafe_recording(self, DROPPED)
        return used

    def lose(self, alloc) -> None:
        """The last tensor over a buffer the step used and did not allocate is gone: hold its
        memory (``alloc``) for as long as this recording lives, and replay it no more."""
        with self._lock:
            self.lost.append(alloc)

    def __del__(self):
        for (pool, size), buffers in self._kept.items():
            for buf in buffers:
                pool._give_back(buf, size)

    def replay(self) -> None:
        """Enqueue the recorded work again (no Python above the launches). The host hooks
        are the caller's to run after it (``check``, then the gradients' settling:
        ``CapturedStep._replay``). A ``Call`` may raise (a batch norm reading its input's
        checks): the work recorded after it is not enqueued."""
        for call in self.calls():
            call()

    def calls(self) -> list:
        """The recorded ops as calls with everything bound, in order (a replay makes them)."""
        calls = self._calls
        if calls is None:
            calls = self._calls = [op.bind() for op in self.ops]
        return calls

    def check(self) -> None:
        """Run the host hooks, as after every replay (each may raise)."""
        for hook in self.host_hooks:
            hook()

    # -- the leaves' gradients: what the replay writes, and when it is still right -----------
    def note_leaves(self, entries) -> None:
        """Before a recorded backward over the graph ``entries``: each leaf's (and each
        leaf input's) ``.grad`` and ``requires_grad`` as it finds them."""
        for e in entries:
            for p in (e, *e.parents):
                if p.grad_fn is None and id(p) not in self.leaves:
                    self.leaves[id(p)] = LeafGrad.of(p)
            if e.grad_fn is None:
                leaf = self.leaves[id(e)]
                # accumulating into the .grad it found, unless the call assigned it first
                # (p.grad = None: a gradient of its own)
                leaf.met, leaf.depends = True, leaf.depends or not leaf.assigned

    def note_inputs(self, entries) -> None:
        """Leaves an op read, noted as the op reads them: a frozen layer's (no backward
        reaches them) and those of a call that runs no backward, so a thaw or a new
        ``.value`` records the call anew."""
        for p in entries:
            if p.grad_fn is None and id(p) not in self.leaves:
                self.leaves[id(p)] = LeafGrad.of(p)

    def note_grad_read(self, entry) -> None:
        """The call read a leaf's ``.grad`` (``Node.grad``): unless it assigned one first, a
        condition of its replays, as for a leaf whose gradient a backward met."""
        leaf = self._leaf(entry)
        leaf.depends = leaf.depends or not leaf.assigned

    def note_grad_assigned(self, entry) -> None:
        """The call is about to assign a leaf's ``.grad`` (``Node.grad = g``; noted before,
        so the leaf is found as it was): its replays assign it too."""
        self._leaf(entry).assigned = True

    def _leaf(self, entry) -> LeafGrad:
        leaf = self.leaves.get(id(entry))
        if leaf is None:
            leaf = self.leaves[id(entry)] = LeafGrad.of(entry)
        return leaf

    def forget_leaves(self, entries) -> None:
        """Leaves the call made and dropped for itself (``tp.checkpoint``'s stand-ins for
        its inputs): nothing outside holds them, so the gradients they were left with are
        no condition of a replay, and noted they made every call a new recording."""
        for e in entries:
            self.leaves.pop(id(e), None)

    def note_grads(self) -> None:
        """After a recorded backward, and again when the call returns: the ``.grad`` each
        leaf ended with (a call may clear one after its backward, ``p.grad = None`` after a
        manual update, which its replays must leave cleared too)."""
        for leaf in self.leaves.values():
            leaf.after = leaf.entry.grad
            leaf.after_checks = () if leaf.after is None else leaf.after.checks

    def note_hooked(self, module) -> None:
        """A module the call ran, or whose hooks steered it (a fused path taken where it
        holds none): a replay needs the hooks the call left it with (``tape.hooks``)."""
        seen = self.hooked.get(id(module))
        if seen is None or seen() is not module:         # not another one's id, reused
            self.hooked[id(module)] = weakref.ref(module)

    def hooked_modules(self) -> list:
        """The modules ``note_hooked`` noted that are still alive."""
        return [m for m in (ref() for ref in self.hooked.values()) if m is not None]

    def note_end(self) -> None:
        """When the call returns: the ``.grad`` every leaf ended with (``note_grads``), and
        which leaves' gradients the replays write (``LeafGrad``). A leaf whose ``.grad`` the
        call neither met nor read before assigning it (a parameter an evaluation read, or
        one whose gradient it cleared first) is no condition of a replay: its gradient
        replaced between calls (an eager training step's) is not a new recording, and the
        recording keeps no old one; a replay leaves it as it is, or, where the call assigned
        it, as the call did."""
        self.note_grads()
        for leaf in self.leaves.values():
            # after is not before: a write the setter did not see
            leaf.writes = (leaf.met or leaf.depends or leaf.assigned
                           or leaf.after is not leaf.before)
            if not leaf.depends:
                leaf.before = None
            if not leaf.writes:
                leaf.after = None
                leaf.after_checks = ()

    def unchanged(self) -> bool:
        """Whether every leaf has the ``.grad`` (the same tensor, or None: for those whose
        gradient the recording depends on), the ``requires_grad`` and the ``.value`` tensor
        the recording found: only then does a replay compute what the eager call would (an
        accumulation into the same buffer, or a gradient assigned anew, at the values the
        model holds: ``p.value = t`` between calls is another recording); and no tensor it
        read without allocating it has been dropped since (``lose``: a global rebound to a
        new tensor, which the eager call would read). The hooks on its leaves and modules
        are its caller's to check (``tape.hooks.HookState``)."""
        if self.lost:
            return False
        for leaf in self.leaves.values():          # a plain loop: run before every replay
            e = leaf.entry
            if (leaf.depends and e.grad is not leaf.before) or (
                    e.requires_grad != leaf.requires_grad):
                return False
            node = e.node()       # None: nobody holds the Node, nobody gave it a new value
            if node is not None and node.value is not leaf.value():
                return False
        return True

    def give_grads(self) -> None:
        """After a replay: every leaf's ``.grad`` is the tensor the recorded call left it
        (which the replay just wrote, or None where it cleared it), as after the eager call;
        one whose gradient it did not write keeps its own."""
        for leaf in self.leaves.values():
            if not leaf.writes:
                continue
            leaf.entry.grad = after = leaf.after
            if after is not leaf.before and after is not None:
                # written anew by the replay: none of the checks a failed replay left on it
                # (``tape.hold_back``), which would refuse every later step
                after.checks = leaf.after_checks

    def met_leaves(self) -> list:
        """The leaves the recorded backward passes reached: a replay adds into their
        ``.grad`` (``tape.hold_back`` marks them where its input turns out bad)."""
        return [leaf.entry for leaf in self.leaves.values() if leaf.met]

    def check_inputs(self, arrays) -> None:
        """Run the input checks on the host arrays a replay is about to upload (each may
        raise; nothing has been enqueued then)."""
        for index, check in self.input_checks:
            check(arrays[index])


# Why a call that drops a tensor it read without being passed it stays eager
DROPPED = ("it drops a tensor it read without being passed it (a global or a closure's "
           "variable rebound inside it: ema = ema * 0.9 + x), whose memory goes to other "
           "tensors, which a replay would read; change that tensor in place "
           "(ema.copy_(ema * 0.9 + x)) or pass it as an input")


def unsafe_recording(rec: Recording, reason: str) -> None:
    """Mark ``rec`` as not replayable, unless it is already, and say why."""
    if rec.unsafe is None:
        rec.unsafe = reason


def current() -> Recording | None:
    """The recording of this thread, or None."""
    return state.recording


def start(inputs=()) -> Recording:
    """Record this thread's device work; ``inputs`` are the tensors the recorded call's host
    arrays are uploaded into on every replay (see ``input_check``)."""
    rec = Recording()
    rec.inputs = list(inputs)
    state.recording = rec
    return rec


def stop() -> None:
    state.recording = None


def unsafe(reason: str) -> None:
    """Mark the current recording (if any) as not replayable, and say why."""
    rec = state.recording
    if rec is not None:
        unsafe_recording(rec, reason)


def kernel(kernel, queue, gsize, lsize, args: tuple, wait_for, pieces=None) -> None:
    rec = state.recording
    if rec is None:
        return
    if wait_for:
        unsafe("a kernel waits on events of another queue")
    rec.ops.append(Launch(kernel, queue, gsize, lsize, args, pieces=pieces))


def replay_arg(index: int, value) -> None:
    """Have every replay set argument ``index`` of the kernel launch just recorded to
    ``value()`` before enqueueing it (e.g. a fresh random key: dropout stays replayable).
    ``value`` is called in replay order, on the replaying thread."""
    rec = state.recording
    if rec is None:
        return
    op = rec.ops[-1] if rec.ops else None
    if not isinstance(op, Launch):
        raise RuntimeError("recorder.replay_arg: the last recorded op is not a kernel launch")
    rec.ops[-1] = replace(op, updates=(*op.updates, (index, value)))


def copy(queue, dst, src, **kwargs) -> None:
    rec = state.recording
    if rec is None:
        return
    if kwargs.get("wait_for"):
        unsafe("a copy waits on events of another queue")
    kwargs = {k: v for k, v in kwargs.items() if k != "wait_for"}
    rec.ops.append(Copy(queue, dst, src, kwargs))


def fill(queue, buf, pattern, offset: int, size: int) -> None:
    rec = state.recording
    if rec is not None:
        rec.ops.append(Fill(queue, buf, pattern, offset, size))


def call(fn) -> None:
    """Have ``fn()`` run at this point of every replay, between the recorded launches (e.g. to
    enqueue the read of a flag the launches before it wrote). Not called now."""
    rec = state.recording
    if rec is not None:
        rec.ops.append(Call(fn))


def input_check(tensor, check) -> bool:
    """If ``tensor`` is a whole input of the call being recorded (its very buffer, shape and
    dtype), have ``check(host_array)`` run on that input's host array before every replay,
    ahead of any upload, and return True: a value that only has to be validated is then
    checked on the host, with no device read and no wait. False otherwise (not recording, or
    not an input): check it on the device."""
    rec = state.recording
    if rec is None:
        return False
    for index, t in enumerate(rec.inputs):
        if (t.data is tensor.data and t.dtype == tensor.dtype and t.size == tensor.size):
            if t.data.int_ptr in rec.written:
                return False        # the call changed it (y[:, :2] = -100): not its array
            rec.input_checks.append((index, check))
            return True
    return False


def written(buffer) -> None:
    """``buffer`` is written in place by the call being recorded (if any): an input so
    written holds other values than its host array from then on, so ``input_check`` leaves
    its later checks to the device."""
    rec = state.recording
    if rec is not None:
        rec.written.add(buffer.int_ptr)


def host_hook(hook) -> None:
    """Have ``hook()`` run after each replay (e.g. a check of a value the step wrote)."""
    rec = state.recording
    if rec is not None:
        rec.host_hooks.append(hook)
