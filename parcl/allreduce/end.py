"""The end of a data-parallel step: the replicas' gradients summed, one optimizer update, the
new parameters in every replica, the gradients zeroed for the next step.

Every kind is a small class with one method, ``finish(buffers, optimizer, max_norm=None)``
(returning the gradient norm, a 0-d device tensor, when it clips); ``ReplicaGroup`` picks one
when it is built (``end_of_step``):

* ``Reduced``: a named allreduce algorithm (or, across processes, MPI) sums each gradient
  bucket in place, the optimizer steps replica 0's parameters, and they are copied to the
  other replicas;
* ``Fused`` (``fused.py``, one process, the default): each replica's queue takes its chunk of
  every bucket through that whole end in one kernel.

They are bit-identical: every element is summed in replica order and updated by the same
arithmetic. Clipping the reduced gradient (``max_norm``) needs its norm before the update, so
a clipped step always ends as ``Reduced`` does.

>>> end = end_of_step("auto", comm=None, replicas=2, devices=group_devices)
>>> end.finish(buffers, optimizer)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyopencl as cl

from ..nn.buffer_slots import ABSENT, ModelSlots
from ..nn.follow import ModelFollower
from ..nn.module import Module
from ..nn.clip import clip_grads_with_norm_, get_total_norm
from ..errors import ParclError
from .. import runtime
from ..gate import release_all, transfer
from ..kernels.elementwise import scale_
from ..optim import FlatBucket, Optimizer
from ..pool import ZEROED, pool_of, stamp
from ..tensor import Tensor
from . import ALGORITHMS, allreduce_scaled, check_algorithm, shares_memory
from ._common import order_after, pending, wait_limit
from .buckets import GradBuckets, ParamBuckets, alignment_elems, plan_buckets
from .mpi import hierarchical


# What ``allreduce_grads`` left on the replicas (``StepBuffers.follow_first``): nothing, or
# every replica a copy of the reduced gradient.
SYNCED, REDUCED = 0, 1


@dataclass
class Seen:
    """Replica 0's gradients as the group's last call left them (``StepBuffers.seen``): when
    (a ``pool.stamp``), and which parameters had one."""

    when: int
    held: list[bool]


@dataclass
class StepBuffers:
    """Every replica's flat buffers (replica 0's first), which the end of a step works on:
    gradient and parameter buckets, other state to copy from replica 0 (BatchNorm's running
    statistics), and replica 0's buckets as the optimizer sees them. ``slots``: per
    replica, the Parameters and buffers its model held when the buckets were made and what
    it holds now (``pc.nn.buffer_slots.ModelSlots``); none: the models are not checked and
    ``buffers`` are fixed."""

    queues: list[cl.CommandQueue]
    grads: list[GradBuckets]
    values: list[ParamBuckets]
    buffers: list[list[Tensor]]
    buckets: list[FlatBucket]
    slots: list = field(default_factory=list)
    kept: list = field(init=False)     # per replica: its buffers as its last step found them
    follower: ModelFollower | None = field(init=False, default=None)   # replica 0's state
    stale: bool = field(init=False, default=False)   # re-read, not yet taken (or refused)

    @classmethod
    def build(cls, models: list, queues: list[cl.CommandQueue], params: list[list],
              bucket_mb: float) -> StepBuffers:
        """Every replica's buckets for its ``params`` (replica 0's first) in one layout, and
        the buffers each model holds (checked before every step: a replaced one is re-read)."""
        # one layout for every replica: the strictest sub-buffer alignment among their devices
        align = max(alignment_elems(q.device) for q in queues)
        plan = plan_buckets([tuple(p.shape) for p in params[0]], bucket_mb, align)
        grads = [GradBuckets(ps, q, bucket_mb, plan=plan, align=align)
                 for q, ps in zip(queues, params)]
        # Parameter values in the same flat layout: the broadcast is one copy per bucket.
        values = [ParamBuckets(ps, q, plan, align) for q, ps in zip(queues, params)]
        buckets = [FlatBucket(value, grad, [params[0][i] for i, _ in members],
                              [off for _, off in members])
                   for value, grad, members in zip(values[0].flats, grads[0].flats, plan)]
        modules = all(isinstance(m, Module) for m in models)
        return cls(list(queues), grads, values,
                   [[b for _, b in m.named_buffers()] if hasattr(m, "named_buffers") else []
                    for m in models], buckets,
                   [ModelSlots(m) for m in models] if modules else [])

    def __post_init__(self):
        self.kept = [None] * len(self.queues)
        self.follower = ModelFollower(self.slots[0]) if self.slots else None
        if self.slots:
            self._take([s.tensors for s in self.slots])

    def follow_model(self, fresh: bool = False) -> None:
        """Replica 0's modes and newly assigned plain attributes made every replica's
        (``nn.follow``); their module trees as the last ``look`` saw them, or walked now."""
        if self.follower is not None:
            self.follower.follow(self.slots, fresh)

    def note_model(self) -> None:
        """After a call: what its forwards set on replica 0's model is not the caller's."""
        if self.follower is not None:
            self.follower.note()

    def refresh(self) -> bool:
        """Before a step: a model that holds other Parameters or buffer slots than the
        buckets were made with raises (nothing is changed: the step would train Parameters
        the model no longer reads). If a model's buffers were replaced by new tensors since
        they were read (a reset of the running statistics), every replica's are taken again,
        so the step copies, keeps and restores the tensors the models read now; True then
        (replica 0's must then be copied to the others: ``broadcast``). One comparison per
        module registry otherwise. Buffers that do not line up across the replicas raise, at
        every step until fixed."""
        changes = [s.look() for s in self.slots]
        # a look that re-read a model's buffers says so once: taken below, or at the first
        # refresh that does not raise
        self.stale = self.stale or any(changes)
        for r, change in enumerate(changes):
            if change is not None and change.structural:
                raise ParclError(_changed_model(r, change))
        self.follow_model()
        if not self.stale:
            return False
        self._take([s.tensors for s in self.slots])
        self.stale = False
        return True

    def _take(self, buffers: list[list[Tensor]]) -> None:
        # Replica 0's are copied onto the others' by position, byte for byte: a replica whose
        # buffers do not line up with them would be written out of bounds or not at all.
        first = [(tuple(b.shape), b.dtype) for b in buffers[0]]
        for r, bs in enumerate(buffers[1:], 1):
            got = [(tuple(b.shape), b.dtype) for b in bs]
            if got != first:
                raise ParclError(
                    f"ReplicaGroup: replica {r}'s model holds buffers {_shapes(got)} but "
                    f"replica 0's {_shapes(first)}: every replica's model must hold the same "
                    "buffers (replica 0's are copied onto them in order); replace a buffer in "
                    "every replica alike (for r in group.replicas: ...), or copy new values "
                    "in place (b.copy_(t), load_state_dict)")
        self.buffers = buffers
        self.kept = [None] * len(self.queues)

    def keep(self, r: int) -> None:
        """Before replica ``r``'s part of a step, on its queue: a copy of its buffers (batch
        norm's running statistics, which a training forward updates in place), for
        ``restore``."""
        if not self.buffers[r]:
            return
        if self.kept[r] is None:
            self.kept[r] = [Tensor.empty(b.queue, b.shape, b.dtype) for b in self.buffers[r]]
        for copy, b in zip(self.kept[r], self.buffers[r]):
            copy.copy_owned(b)

    def restore(self, r: int) -> None:
        """After a failed step: replica ``r``'s buffers as ``keep`` found them."""
        if self.kept[r] is not None:
            for copy, b in zip(self.kept[r], self.buffers[r]):
                b.copy_owned(copy)

    def changed_since(self, when: int) -> bool:
        """Whether replica 0's parameters or buffers were changed in place after ``when`` (a
        ``pool.stamp``), by ``load_state_dict`` or ``p.value.copy_`` between steps: the
        other replicas then still hold the old values until a ``broadcast``."""
        pool = pool_of(self.queues[0])
        if pool.last_overwrite <= when:
            return False
        changes = pool.overwrites
        return any(c is not None and c.when > when for c in (
            changes.get(t.data.int_ptr) for t in [*self.values[0].views, *self.buffers[0]]))

    def follow_first(self) -> None:
        """The first call after ``allreduce_grads`` left every replica a copy of the reduced
        gradient: replica 0's gradients, as its optimizer and ``zero_grad`` left them, become
        every replica's, so the others' next backward does not add to a copy replica 0
        zeroed (a gradient replica 0 dropped is zero in every bucket, and stays ``None`` on
        replica 0, so the optimizer still skips it, as PyTorch's)."""
        first = self.grads[0]
        none = [p for p in first.params if p.grad is None]
        first.gather()                     # a dropped gradient is zero in the bucket
        for grads in self.grads[1:]:
            grads.gather(keep=False)
        ready = [pending(self.queues[0])]
        order_after(self.queues[0], [e for grads in self.grads[1:]
                                     for e in grads.copy_from(first, ready)])
        release_all()
        for p in none:
            p.grad = None
        self.drop_with_first()

    def drop_with_first(self) -> None:
        """Every other replica's ``.grad`` None where replica 0's is, while their buckets hold
        zeros there (after a step, ``zero_grad`` or ``follow_first``'s copies): a gradient no
        replica's next backward reaches then stays None on every replica (``unused``)."""
        for j, p in enumerate(self.grads[0].params):
            if p.grad is None:
                for grads in self.grads[1:]:
                    grads.params[j].grad = None

    def check_left(self, op: str) -> None:
        """Before the gradients the calls before left are reduced: one that holds a failed
        backward's contributions (``tape.hold_back``, a check that raises) is refused, as
        an optimizer step refuses it, until the caller zeroes it (``zero_grad`` on replica 0
        is every replica's: ``follow_zeroing``). The reduction would otherwise carry its
        garbage into replica 0's gradient, whose own check says nothing of it."""
        for r, grads in enumerate(self.grads):
            for j, p in enumerate(grads.params):
                try:
                    for check in () if p.grad is None else p.grad.checks:
                        check()
                except ParclError as exc:
                    raise ParclError(f"{op}: replica {r}'s gradient of parameter {j} "
                                     f"{tuple(p.shape)}: {exc}; nothing was reduced "
                                     f"(group.zero_grad() zeroes every replica's too)") from exc

    def held(self) -> tuple[list[int], list[int]]:
        """Before a step, what the calls since the last one left (a run's backward): the
        parameters (by index) whose ``.grad`` on some replica is a tensor of its own (a
        backward made it), and those whose ``.grad`` is its bucket view, given since or
        still the zero the last step left (``nonzero`` tells)."""
        own, views = set(), set()
        for grads in self.grads:
            for j, (p, view) in enumerate(zip(grads.params, grads.views)):
                if p.grad is view:
                    views.add(j)
                elif p.grad is not None:
                    own.add(j)
        return sorted(own), sorted(views - own)

    def nonzero(self, indices: list[int]) -> list[int]:
        """Of ``indices``, the parameters whose gradient bucket holds something other than
        zeros on some replica. Read back per bucket and replica, the span of the buckets that
        holds them (one wait each, not one per parameter: a model with tens of layers a step
        does not reach would wait tens of times)."""
        wanted, found = set(indices), set()
        for grads in self.grads:
            for flat, bucket in zip(grads.flats, grads.plan):
                members = [(j, off) for j, off in bucket if j in wanted and j not in found]
                if not members:
                    continue
                lo = min(off for _, off in members)
                hi = max(off + grads.views[j].size for j, off in members)
                span = flat.view_of(flat.data.get_sub_region(lo * 4, (hi - lo) * 4),
                                    (hi - lo,)).to_host()
                found.update(j for j, off in members
                             if span[off - lo:off - lo + grads.views[j].size].any())
        return [j for j in indices if j in found]

    def keep_grads(self, buckets: bool) -> list:
        """Before a step: every replica's ``.grad`` objects (None where a gradient was
        dropped), and where the calls before it left gradients it scales and adds to (a
        run's backward, ``allreduce_grads``' copies; ``buckets``) a copy of its buckets, for
        ``restore_grads``. Without ``buckets`` they hold the zeros the last step left."""
        kept = []
        for grads in self.grads:
            copies = [Tensor.empty(flat.queue, flat.shape, flat.dtype) for flat in grads.flats
                      ] if buckets else []
            for copy, flat in zip(copies, grads.flats):
                copy.copy_owned(flat)
            kept.append(([p.grad for p in grads.params], copies))
        return kept

    def restore_grads(self, kept: list) -> None:
        """After a failed step: every replica's gradients as ``keep_grads`` found them."""
        for grads, (objects, copies) in zip(self.grads, kept):
            if copies:
                for flat, copy in zip(grads.flats, copies):
                    flat.copy_owned(copy)
                for view in grads.views:    # the failed backward's checks guard nothing now
                    view.checks = ()
            else:
                grads.zero_()
            for p, grad in zip(grads.params, objects):
                p.grad = grad
                if grad is not None:        # its values as found: not the failed backward's
                    grad.checks = ()

    def unused(self, comm) -> list[int]:
        """The parameters (by index) whose ``.grad`` is None on every replica, and on every
        rank through ``comm``: no backward reached them since they were dropped. They stay
        None after ``allreduce_grads``, as DDP leaves a globally unused parameter's."""
        missing = set(range(len(self.grads[0].params)))
        for grads in self.grads:
            missing &= {j for j, p in enumerate(grads.params) if p.grad is None}
        if comm is not None:
            missing = set.intersection(*map(set, comm.allgather(sorted(missing))))
        return sorted(missing)

    def seen(self) -> Seen:
        """Replica 0's gradients now, for ``follow_zeroing`` at the group's next call."""
        return Seen(stamp(), [p.grad is not None for p in self.grads[0].params])

    def follow_zeroing(self, seen: Seen) -> None:
        """Zero on every other replica each gradient the caller zeroed on replica 0 since
        ``seen`` (``zero_grad``, to ``None`` or in place, between the group's calls). The
        model and optimizer the caller holds are replica 0's, and in PyTorch every process
        zeroes its own: a gradient the caller discards (a skipped batch, the next step's
        ``opt.zero_grad()``) is discarded everywhere, not kept by the other replicas for
        their next backward to add to. Other changes to replica 0's gradients (assigned or
        written by hand) stay replica 0's."""
        first = self.grads[0]
        pool = pool_of(self.queues[0])
        recent = pool.last_overwrite > seen.when     # one comparison when nothing was zeroed
        dropped = [j for j, (p, had) in enumerate(zip(first.params, seen.held))
                   if p.grad is None and (had or getattr(p, "zeroed_at", 0) > seen.when)]
        zeroed = [j for j, p in enumerate(first.params)
                  if recent and p.grad is not None and _zeroed(pool, p.grad, seen.when)]
        for grads in self.grads[1:]:
            for j in dropped:              # to None as on replica 0 (``unused``)
                grads.params[j].grad = None
            for j in zeroed:
                g = grads.params[j].grad
                if g is not None:
                    g.fill_owned(0)

    def average_left(self, count: int) -> None:
        """Before a step after a ``run`` that left each replica its own, unreduced gradients (a
        backward per replica, as under DDP's ``no_sync``): every replica's divided by
        ``count`` (the replicas of every rank), so the step's sum adds their mean, as DDP's
        next synced backward averages what ``no_sync`` accumulated."""
        if count == 1:
            return
        for grads in self.grads:
            grads.gather()                 # gradients replaced since: into the buckets
            for flat in grads.flats:
                scale_(flat, 1.0 / count)

    def forget_copies(self) -> None:
        """Zero the other replicas' copies of the reduced gradient (replica 0's is kept): a
        step sums every replica's gradient, so the left one counts once, as in PyTorch."""
        for grads in self.grads[1:]:
            grads.gather(keep=False)
            grads.zero_()

    def broadcast(self) -> None:
        """Copy replica 0's parameters and buffers to every other replica; replica 0's queue
        waits for those reads before it changes anything again."""
        ready = [pending(self.queues[0])]
        reads = []
        for r in range(1, len(self.queues)):
            reads += self.values[r].copy_from(self.values[0], ready)
        order_after(self.queues[0], reads + self.copy_buffers(ready))
        release_all()              # queues wait for each other's work: none of it held

    def broadcast_ranks(self, comm) -> None:
        """Rank 0's replica 0 parameters and buffers onto every rank's replica 0 (then
        ``broadcast`` takes them to the other replicas), as DDP broadcasts rank 0's module
        when it is built: a model initialised per rank (``manual_seed(rank)``, for dropout
        masks of its own) would otherwise start apart, and the same reduced update on every
        rank would keep the ranks' parameters apart for good."""
        for t in [*self.values[0].flats, *self.buffers[0]]:      # a Bcast each: a flat
            _from_rank_0(comm, [t], "replica 0's parameters")   # may be a large bucket

    def buffers_from_rank_0(self, comm, spread: bool = True) -> None:
        """Rank 0's replica 0 buffers onto every rank's replica 0, and with ``spread`` onto
        every replica (a step's end leaves that to its ``broadcast``). A training forward
        updates batch norm's running statistics from its own shard, so without this each
        rank kept its own (replica 0's are every replica's within a process after a step)
        and a rank evaluating its model normalised with statistics rank 0's never saw; DDP
        (``broadcast_buffers=True``) likewise gives every rank rank 0's buffers."""
        if not self.buffers[0]:
            return
        # one Bcast for them all (one each would be dozens a step in a ResNet)
        _from_rank_0(comm, self.buffers[0], "replica 0's buffers")
        if spread:
            order_after(self.queues[0], self.copy_buffers([pending(self.queues[0])]))
            release_all()

    def copy_buffers(self, wait_for=None) -> list[cl.Event]:
        """Copy replica 0's buffers (batch norm's running statistics) to every other
        replica, each on its own queue after ``wait_for``; the copies' events."""
        return [cl.enqueue_copy(self.queues[r], d.data, s.data, byte_count=s.nbytes,
                                wait_for=wait_for)
                for r in range(1, len(self.queues))
                for s, d in zip(self.buffers[0], self.buffers[r])]


def _from_rank_0(comm, tensors: list[Tensor], what: str) -> None:
    """Rank 0's ``tensors`` onto every rank's, their bytes end to end in one Bcast: only rank 0
    reads them and only the others write theirs, each side's copies enqueued together
    (``gate.transfer``: no gate left in front of a copy whose dropped event would wait for it)
    and waited for once, for as long as ``comm``'s collectives may take."""
    packed = np.empty(sum(t.nbytes for t in tensors), np.uint8)
    spans, start = [], 0
    for t in tensors:
        spans.append((t, packed[start:start + t.nbytes]))
        start += t.nbytes
    rank = comm.Get_rank()
    if rank == 0:
        for t in tensors:           # as to_host: an op that found its input bad raises first
            for check in t.checks:
                check()
        reads = [transfer(t.queue, host, t.data) for t, host in spans]
        runtime.wait_for_events(reads, wait_limit(comm), f"reading {what}")
    comm.Bcast(packed, root=0)
    if rank != 0:
        writes = [transfer(t.queue, t.data, host) for t, host in spans]
        runtime.wait_for_events(writes, wait_limit(comm), f"writing rank 0's {what}")


def _changed_model(r: int, change) -> str:
    """The error for replica ``r``'s model holding other Parameters or buffer slots (a
    ``ModelChange``): each changed path, old and new, and what to do."""
    changes = [*change.parameters, *change.buffer_slots]
    what = "; ".join(f"{c.path}: {_describe(c.old)} -> {_describe(c.new, c.old)}"
                     for c in changes[:6]) + (f"; {len(changes) - 6} more" if len(changes) > 6
                                              else "")
    return (f"ReplicaGroup: replica {r}'s model no longer holds the Parameters and buffer "
            f"slots the group was built with ({what}). The group's buckets and its optimizer "
            "hold the Parameters the models held then, so a step would train objects the "
            "model no longer reads; nothing was changed. After changing a model's structure "
            "build a new ReplicaGroup (and optimizer) whose build_model makes the new model; "
            "to put new values into the same parameters and buffers use load_state_dict or "
            "p.value.copy_(t), which keep the objects")


def _describe(obj, old=None) -> str:
    """How the error names what a slot holds (``old``: what it held, to say "another")."""
    if obj is ABSENT:
        return "nothing"
    if isinstance(obj, Tensor):
        return f"Tensor(shape={tuple(obj.shape)})"
    return f"another {obj!r}" if type(obj) is type(old) else repr(obj)


def _shapes(entries) -> str:
    return "[" + ", ".join(f"{shape} {dtype}" for shape, dtype in entries) + "]"


class Reduced:
    """Sum every bucket with an allreduce (``algorithm`` over the replicas, then ``comm``
    across ranks), step replica 0's parameters, zero the gradients, broadcast."""

    def __init__(self, algorithm: str = "auto", comm=None):
        self.algorithm, self.comm = algorithm, comm

    def finish(self, buffers: StepBuffers, optimizer, max_norm: float | None = None,
               plan=None):
        """``plan``: the optimizer's step, prepared already (``Fused`` falling back here)."""
        # Validate before anything changes: a bad gradient leaves every replica as it was.
        if plan is None and _plannable(optimizer):
            plan = optimizer.prepare(buffers.buckets)
        self.reduce(buffers)
        norm = None
        if max_norm is not None:
            # The reduced gradient is the same on every replica and rank: replica 0's, the
            # one the optimizer reads, is clipped (its norm over the buckets in their order).
            grads = buffers.grads[0].flats
            norm = get_total_norm(grads)
            clip_grads_with_norm_(grads, max_norm, norm)
        if plan is not None:
            optimizer.launch(plan)
        else:
            optimizer.step()
        for grads in buffers.grads:
            grads.zero_()
        if self.comm is not None:
            buffers.buffers_from_rank_0(self.comm, spread=False)   # broadcast spreads
        buffers.broadcast()
        return norm

    def reduce(self, buffers: StepBuffers, scale: float = 1.0) -> None:
        """Every replica's gradient buckets become ``scale *`` their sum (the loss weights
        already make the sum the batch mean)."""
        for b in range(len(buffers.grads[0].flats)):
            flats = [grads.flats[b] for grads in buffers.grads]
            if self.comm is not None:
                hierarchical(flats, self.comm, scale)
            else:
                allreduce_scaled(flats, scale, self.algorithm)


def _plannable(optimizer) -> bool:
    return isinstance(optimizer, Optimizer) and optimizer.plannable


def end_of_step(allreduce: str, comm, replicas: int, devices):
    """The end of step for a group: ``Fused`` on one process with ``allreduce="auto"`` where
    the ``devices`` share one memory (the host's cores), else ``Reduced`` with that algorithm
    (and MPI when ``comm`` is given). ``Fused`` writes every replica's buffers from every queue
    at once: on devices with memories of their own (GPUs) that is undefined, so they end as
    ``Reduced``, whose ``auto`` picks ``direct`` there."""
    if allreduce != "auto" and allreduce not in ALGORITHMS:
        raise ValueError(f"ReplicaGroup: unknown allreduce {allreduce!r}; choose one of "
                         f"{sorted(ALGORITHMS)} or 'auto'")
    check_algorithm(allreduce, devices, "ReplicaGroup")
    if comm is None and allreduce == "auto" and shares_memory(devices):
        from .fused import MAX_REPLICAS, Fused
        if replicas <= MAX_REPLICAS:
            return Fused()
    return Reduced(allreduce, comm)


def _zeroed(pool, grad: Tensor, since: int) -> bool:
    """Whether ``grad`` was zeroed in place (``zero_grad(set_to_none=False)``) after ``since``."""
    change = pool.overwrites.get(grad.data.int_ptr)
    return change is not None and change.when > since and change.what == ZEROED
