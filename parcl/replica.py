"""Data-parallel replicas: one long-lived thread per device, each with its own command queue,
thread-local tape, memory pool, kernel objects and model copy.

A step (``ReplicaGroup.step``) splits the batch, runs forward and backward in every replica's
thread at once (eagerly, or replaying a recording of it), then ends the step: the gradients
summed by an OpenCL kernel (and across processes through MPI), one optimizer update of
replica 0's parameters, the new values in every replica. How each stage runs is chosen once,
when the group is built. See docs/architecture.md.

>>> from parcl.replica import ReplicaGroup
>>> with ReplicaGroup(lambda q: pc.nn.Linear(64, 10, queue=q)) as group:
...     opt = pc.optim.SGD(group.parameters(), lr=0.1)
...     loss = group.step(x, y, tp.cross_entropy, opt)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import numbers
import threading
import time
import weakref

import numpy as np
import pyopencl as cl

from . import distributed
from . import replica_threads as threads
from . import runtime
from .allreduce.bounded import Bounded
from .allreduce.end import REDUCED, SYNCED, Reduced, StepBuffers, end_of_step
from .errors import ParclError, ReplicaError, ShapeError
from .gate import transfer
from .nn.keys import loss_key
from .nn.module import default_generator, lazy_layers, set_default_generator
from .nn.syncbn import SyncBatchNorm
from .pool import stamp
from .replica_steps import (Captured, Eager, IgnoredLabels, agreed, check_class_weights,
                            check_optimizer, check_reduction, check_renorms, check_signatures,
                            class_weights, check_weightless_smoothing, positive,
                            same_model_on_ranks, shard_batch, skip_unreached, weighted_loss)
from .replica_losses import LossCopies
from .replica_stats import StatsExchange
from .replica_threads import Replica
from .tape.ops import nn as nn_ops
from .tape.tape import leaf_passes

DEFAULT_TIMEOUT = 600.0       # seconds any dispatched call may take before the group gives up


def _one_call_at_a_time(method):
    """``method`` of a ``ReplicaGroup`` holding the group's lock: the calls of several threads
    run one after another, each as if alone. Interleaved, one thread's ``run`` zeroed the
    gradients another thread's ``step`` was about to apply, and two steps summed each other's
    gradients, with no error."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if not _take_turn(self, name):
            raise ReplicaError(f"ReplicaGroup.{name}: another thread's call on this group did "
                               f"not finish within {self.timeout:.0f} s")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._calls.release()
    return call


def _take_turn(group, name: str) -> bool:
    """Wait for another thread's call on ``group`` to finish (at most its timeout) and take
    the group's lock: whether it was taken. Called by a replica thread (inside its own call)
    it raises at once: it would wait for that replica, which is running it."""
    here = threading.current_thread()
    inside = [r.index for r in group.replicas if r.thread is here]
    if inside:
        raise ParclError(f"ReplicaGroup.{name} was called by replica {inside[0]}'s own thread "
                         f"(in group.run's fn, the model's forward or the loss of a step): it "
                         f"would wait for that replica, which is running it; call the group "
                         f"from the thread that called it")
    return group._calls.acquire(timeout=min(group.timeout, threading.TIMEOUT_MAX))


def _noting_backwards(fn, ran: list[bool]):
    """``fn`` run in a replica's thread, noting in ``ran[replica.index]`` whether it ran a
    backward pass into its ``.grad``."""
    @functools.wraps(fn)
    def call(replica, *args):
        before = leaf_passes()
        try:
            return fn(replica, *args)
        finally:
            ran[replica.index] = leaf_passes() != before
    return call


class ReplicaGroup:
    """One replica per device, each a long-lived thread with its own queue, tape and model.

    ``build_model(queue)`` builds one model copy per replica (inside that replica's thread);
    replica 0's parameters are then broadcast so every replica starts identical (rank 0's
    replica 0's on every rank, through ``comm``, as DDP does).
    ``devices=None`` takes ``pc.devices()`` (or what parcl-launch set). ``allreduce`` names the
    algorithm (``"auto"``, ``"direct"``, ``"shared"``, ``"scatter"``, ``"ring"``; ``None``:
    parcl-launch's ``--allreduce``, else ``"auto"``); with
    ``"auto"`` on one process the end of each step is fused (``parcl.allreduce.fused``),
    bit-identical to the named algorithms. Gradients are packed into buckets of ``bucket_mb``;
    ``comm`` is an mpi4py communicator for multi-process runs; ``None`` takes the run's
    (``parcl.distributed.comm()``: ``MPI.COMM_WORLD`` under ``mpiexec``, none in one process),
    as DDP's default process group; ``MPI.COMM_SELF`` keeps the group to this rank.
    Every wait is bounded by ``timeout`` seconds: a replica thread that does not finish
    raises ``ReplicaError``; a device that does not finish a step ends the process with a
    message naming the replica (``parcl.runtime.wait_for_events``: a blocked OpenCL wait
    cannot be interrupted), and so does a collective across ranks that waits longer
    (``allreduce.bounded``: every rank must make the same steps). Calls from several threads
    (a step in one, an evaluating ``run`` in another) run one after the other, each as if
    alone; a replica's own thread may not call its group. ``capture=True`` records
    each replica's forward and backward once and replays the recorded kernels afterwards
    (``parcl.tape.capture``): bit-identical results, far less Python per step; a step is
    recorded again whenever the batch shapes, the grad modes, the model's Python state
    (``pc.nn.capture_key``) or ``step``'s ``key`` change; steps that cannot be replayed
    (host reads in the model) stay eager.
    ``sync_batchnorm=True``: every training-mode batch norm normalises with the statistics of
    the global batch (every replica's, and every rank's through ``comm``), combined on the
    devices in a fixed order (``parcl.replica_stats``), so a step equals the single-replica
    full-batch step, running statistics included (such steps are not replayed). A model with
    ``pc.nn.SyncBatchNorm`` layers gets the same for those layers alone without the flag
    (PyTorch's ``SyncBatchNorm`` under DDP); its other batch norms use their replica's batch.
    """

    _buffers: StepBuffers | None = None      # the models' buckets, once built
    _called = 0                              # when the last call's replicas were done (stamp)

    def __init__(self, build_model, devices=None, *, allreduce: str | None = None,
                 bucket_mb: float = 25.0, comm=None, timeout: float = DEFAULT_TIMEOUT,
                 capture: bool = False, sync_batchnorm: bool = False):
        timeout = _seconds(timeout, "ReplicaGroup")
        self._calls = threading.RLock()     # one call at a time (_one_call_at_a_time)
        devs = list(devices) if devices is not None else runtime.devices()
        if not devs:
            raise ParclError("ReplicaGroup: no devices given")
        # Under mpiexec a group without the run's communicator trained each rank's replicas
        # apart from the other ranks', silently: every rank ended with its own weights.
        if comm is None:
            comm = distributed.comm()
        # across ranks every collective is bounded by ``timeout`` as the threads' waits are: a
        # rank that stopped making steps would otherwise hold the others in MPI for ever
        self.comm = (Bounded(comm, timeout) if comm is not None and comm.Get_size() > 1
                     else None)
        # Where the devices are the host's own cores, a step waits for every queue before it
        # returns: letting the end of a step run on while the host enqueues the next one only
        # makes the host's threads compete with the device's (measured: 4 % slower steps).
        self._host_cores = any(d.type & cl.device_type.CPU for d in devs)
        if allreduce is None:    # parcl-launch --allreduce ring ran "auto" here, unsaid
            choice = runtime.launched()
            allreduce = choice.allreduce if choice is not None else "auto"
        self._end = end_of_step(allreduce, self.comm, len(devs), devices=devs)
        self.allreduce_algorithm = allreduce
        self.timeout = timeout
        self.capture = bool(capture)
        self._closed = False
        self._broken: str | None = None
        self._last_job: threads.Job | None = None
        self._grads_dirty, self._reduced = False, SYNCED   # see StepBuffers.follow_first
        self._unreduced = False  # a run's backwards left what no reduction summed yet
        self._seen = None        # replica 0's gradients after the last call (None: all zero)
        self._labels = IgnoredLabels()
        self._last_norm: np.ndarray | None = None
        self.replicas = [Replica(i, d, runtime.new_queue(d)) for i, d in enumerate(devs)]
        for r in self.replicas:
            threads.start(r)
        self._finalizer = weakref.finalize(self, threads.shutdown, list(self.replicas))
        try:
            # each replica builds from a copy of the caller's initialisation generator, and
            # draws dropout masks from the caller's dropout generator's state: the replica
            # threads' own start at seed 0 whatever the caller seeded, so a seed sweep
            # (pc.manual_seed(s); ReplicaGroup(build)) built one model for every s. The
            # caller's generator then moves on as the build's did, as after a build in its
            # own thread: a second group (a student beside a teacher) gets other weights.
            init, dropout = default_generator(), nn_ops.rng_state()
            built = self._call(_replica_0_first(
                lambda r: _seeded(build_model, r.queue, init, dropout), self.timeout), ())
            for r, (m, _) in zip(self.replicas, built):
                r.model = m
            _refuse_lazy(built[0][0])
            set_default_generator(built[0][1])
            self._setup_parameters(bucket_mb)
            # every rank's replica count: ranks may run different numbers (their own
            # ``devices``), and a mean over all replicas must divide by their sum on each
            self._all_replicas = len(self.replicas)
            if self.comm is not None:
                self._all_replicas = same_model_on_ranks(self.comm, len(self.replicas),
                                                         self._layout())
                self._buffers.broadcast_ranks(self.comm)
            self._buffers.broadcast()
            for grads in self._buffers.grads:   # no gradient yet, as a new PyTorch model
                grads.detach()                  # (a step makes them its views again)
            self._synced = stamp()          # when the replicas' parameters were last made equal
        except BaseException:
            self.close()
            raise
        self._losses = LossCopies([r.queue for r in self.replicas])
        index = [{id(p.entry): i for i, p in enumerate(ps)} for ps in self._params]
        self._backward = (Captured if self.capture else Eager)(index, self._buffers)
        # SyncBatchNorm layers ask for the exchange themselves: then only they exchange
        sync_layers = any(isinstance(m, SyncBatchNorm) for m in self.replicas[0].model.modules())
        self._stats = StatsExchange([r.queue for r in self.replicas], self.comm, self.timeout,
                                    every_layer=sync_batchnorm) \
            if sync_batchnorm or sync_layers else None
        self._replica_step = (self._stats.synced(self._backward.run) if self._stats is not None
                              else self._backward.run)

    @classmethod
    def from_launch(cls, build_model, **kwargs) -> ReplicaGroup:
        """The group parcl-launch prepared (``runtime.launched()``): its devices and
        allreduce algorithm, and under ``mpiexec`` the job's communicator
        (``parcl.distributed.comm()``). Outside the launcher: ``pc.devices()``, one process."""
        choice = runtime.launched()
        if choice is not None:
            kwargs.setdefault("allreduce", choice.allreduce)
        kwargs.setdefault("comm", distributed.comm())
        return cls(build_model, None, **kwargs)

    # -- set-up -------------------------------------------------------------------------
    def _setup_parameters(self, bucket_mb: float) -> None:
        named = [list(r.model.named_parameters()) for r in self.replicas]
        self._names = [n for n, _ in named[0]]
        shapes = [tuple(p.shape) for _, p in named[0]]
        for r, entries in zip(self.replicas, named):
            got = [tuple(p.shape) for _, p in entries]
            if got != shapes:
                raise ParclError(f"ReplicaGroup: build_model gave replica {r.index} parameters "
                                 f"{got} but replica 0 {shapes}; it must build the same model "
                                 "every time")
        self._params = [[p for _, p in entries] for entries in named]
        seen = {id(p) for p in self._params[0]}
        for r, ps in zip(self.replicas[1:], self._params[1:]):
            if any(id(p) in seen for p in ps):
                raise ParclError(f"ReplicaGroup: build_model returned replica 0's parameters "
                                 f"again for replica {r.index}; it must build a new model on "
                                 "the queue it is given each time it is called")
            seen.update(id(p) for p in ps)
        self._buffers = StepBuffers.build([r.model for r in self.replicas],
                                          [r.queue for r in self.replicas], self._params,
                                          bucket_mb)

    def _layout(self) -> list[tuple[str, tuple[int, ...], str]]:
        """Replica 0's parameters and buffers: name, shape and dtype of each, in order."""
        model = self.replicas[0].model
        buffers = list(model.named_buffers()) if hasattr(model, "named_buffers") else []
        return [(name, tuple(t.shape), str(t.dtype))
                for name, t in [*zip(self._names, self._params[0]), *buffers]]

    # -- dispatch -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ParclError("ReplicaGroup is closed: create a new one")
        if self._broken:
            raise ParclError(f"ReplicaGroup is unusable: {self._broken}; close it and create "
                             "a new one")

    def _wait_idle(self) -> None:
        """Let every replica finish the previous call (it may still run after a failure)."""
        job = self._last_job
        if job is not None and not job.wait(time.monotonic() + self.timeout, False):
            self._broken = (f"a replica did not finish its previous call within "
                            f"{self.timeout:.0f} s")
            raise ReplicaError(f"ReplicaGroup: {self._broken}")

    @_one_call_at_a_time
    def run(self, fn, *per_replica_args, timeout: float | None = None) -> list:
        """Call ``fn(replica, a[i], b[i], ...)`` in every replica's thread at once and return
        the results in replica order. A failure in any replica is raised here as
        ``ReplicaError`` (replica index, device, original traceback) once the other replicas
        stopped too (a failure ends a sync_batchnorm exchange at once), so none still writes
        its gradients after the caller goes on.
        With ``sync_batchnorm`` its training-mode batch norms use the global batch's
        statistics too, as a step's (and PyTorch's ``SyncBatchNorm`` in a custom loop)."""
        self._check_open()
        if timeout is not None:
            timeout = _seconds(timeout, "ReplicaGroup.run")
        k = len(self.replicas)
        for j, arg in enumerate(per_replica_args):
            if len(arg) != k:
                raise ShapeError(f"ReplicaGroup.run: argument {j} has {len(arg)} entries; "
                                 f"expected one per replica ({k})")
        self._wait_idle()
        self._follow()
        if self._stats is not None:
            self._stats.start()            # a barrier broken by a failed call made whole
            fn = self._stats.synced(fn)
        ran = [False] * k                  # a replica a failed call never reached ran none
        fn = _noting_backwards(fn, ran)
        try:
            return self._call(fn, per_replica_args, timeout)
        except ReplicaError:
            # The first failure is raised at once, but the other replicas may still be in
            # their backward: what the caller does next (zero_grad to skip the batch) must
            # come after their gradients, not before, or those survive into the next step.
            if self._broken is None:
                with contextlib.suppress(ReplicaError):
                    self._wait_idle()
            raise
        finally:
            self._seen = self._buffers.seen()
            # what another replica's backward (under MPI any) left and no reduction summed:
            # none where the run itself consumed it (each replica stepped and zeroed its own)
            first = 0 if self.comm is not None else 1
            self._unreduced = ((self._unreduced or any(ran[first:]))
                               and self._unreduced_held())

    def _call(self, fn, per_replica_args, timeout: float | None = None) -> list:
        """``run`` without the checks and the following of replica 0's gradients: building
        the models, and a step (which zeroes its gradients itself: ``_begin``)."""
        job = threads.Job(len(self.replicas))
        try:
            self._last_job = job
            threads.dispatch(self.replicas, job, fn, per_replica_args)
        except BaseException:          # Ctrl-C amid the hand-over: none waits for the rest
            job.abandon()
            raise
        limit = self.timeout if timeout is None else timeout
        if not job.wait(time.monotonic() + limit):
            busy = [r.index for r, res in zip(self.replicas, job.results) if res is None]
            self._broken = f"replicas {busy} did not finish within {limit:.0f} s"
            raise ReplicaError(f"ReplicaGroup.run: {self._broken}")
        failure = None
        if job.failures:
            # The cause, not a replica that only stopped because another one failed
            failure = min(job.failures, key=lambda f: (
                isinstance(f.error, threading.BrokenBarrierError), f.index))
            # The first failure ends the wait, and replica 0 may still be inside its call:
            # noted now, what it set there for the call alone would pass for the model's
            # state, and the caller's assigning the same value later would not be followed.
            with contextlib.suppress(ReplicaError):
                self._wait_idle()
        if self._buffers is not None:
            self._buffers.note_model()      # what the forwards set is theirs (nn.follow)
        self._called = stamp()              # and what they did to their own parameters
        if failure is not None:
            raise failure.error_in(self.replicas[failure.index]) from failure.error
        return list(job.results)

    def _follow(self, op: str = "ReplicaGroup.run") -> None:
        """Before a call, what the caller did to replica 0 since the last one, to every replica:
        gradients reduced copied (``follow_first``) or zeroed zeroed (``follow_zeroing``),
        parameters stepped copied (a DDP loop has no broadcast), modes (``nn.follow``); a
        failed step's gradients zeroed."""
        self._buffers.follow_model(fresh=True)
        self._refuse_a_step_on_replica_0s_share(op)
        if len(self.replicas) > 1 and self._buffers.changed_since(max(self._synced,
                                                                       self._called)):
            self._buffers.broadcast()
            self._synced = stamp()
        if self._grads_dirty:              # a failed step's gradients: discarded before any
            self.zero_grad()               # call, as before a step (``_begin``), or a run's
            self._grads_dirty = False      # would add to them and a step zero the run's
        if self._reduced:
            self._buffers.follow_first()
            self._reduced = SYNCED
        elif self._seen is not None:
            self._buffers.follow_zeroing(self._seen)
        else:                              # every bucket zero: what replica 0 dropped, too
            self._buffers.drop_with_first()
        # what the caller discarded on replica 0 (a skipped batch) is no longer unreduced
        self._unreduced = self._unreduced and self._unreduced_held()

    def _unreduced_held(self) -> bool:
        """Whether another replica (under MPI any, this rank's share) holds a gradient."""
        first = 0 if self.comm is not None else 1
        return self._all_replicas > 1 and any(p.grad is not None
                                              for ps in self._params[first:] for p in ps)

    def _refuse_a_step_on_replica_0s_share(self, op: str) -> None:
        """Refuse to go on where the caller changed replica 0's parameters (``opt.step()``)
        after a ``run`` in which another replica's backward (or any, under MPI) left
        gradients the group never reduced: the step read replica 0's share of the batch
        alone (this rank's), and the others' were about to be dropped (``follow_zeroing``),
        silently (DDP reduces in its backward; here ``allreduce_grads`` does)."""
        if (not self._unreduced or self._reduced or self._grads_dirty
                or not self._buffers.changed_since(max(self._synced, self._called))):
            return
        raise ParclError(
            f"{op}: replica 0's parameters changed (opt.step()?) after a run whose backwards "
            f"left the replicas' gradients unreduced, so a step read replica 0's share of the "
            f"batch alone and the other {self._all_replicas - 1} replicas' gradients would "
            f"be dropped; call group.allreduce_grads() after the backward run and before "
            f"opt.step(), as DDP reduces in backward (group.zero_grad() discards what the "
            f"replicas hold; group.broadcast_parameters() keeps replica 0's parameters)")

    # -- gradients and parameters -----------------------------------------------------
    def parameters(self) -> list:
        """The parameters the shared optimizer steps: replica 0's."""
        return list(self._params[0])

    def named_parameters(self) -> list:
        return list(zip(self._names, self._params[0]))

    @property
    def model(self):
        """Replica 0's model (the one the optimizer steps; the others are copies)."""
        return self.replicas[0].model

    @property
    def captured_steps(self) -> list[list]:
        """Per replica its recorded steps (``tp.CapturedStep``, one per loss function, most
        recently used last), to see how often each was replayed and why one was not; empty
        lists without ``capture=True``."""
        steps = getattr(self._backward, "steps", None)
        if steps is None:
            return [[] for _ in self.replicas]
        return [[step for _, step in per.values()] for per in steps]

    @_one_call_at_a_time
    def train(self, mode: bool = True) -> ReplicaGroup:
        """``model.train(mode)`` on every replica's model, after another thread's call (a
        step whose forwards would otherwise change mode half-way)."""
        for r in self.replicas:
            r.model.train(mode)
        return self

    def eval(self) -> ReplicaGroup:
        """``model.eval()`` on every replica's model."""
        return self.train(False)

    @_one_call_at_a_time
    def zero_grad(self) -> None:
        """Zero every replica's gradient buckets (after any straggling replica finished). A
        ``.grad`` that is None stays None, as PyTorch's ``zero_grad`` never makes one: a
        zero would have ``allreduce_grads`` keep it and ``opt.step()`` decay a parameter no
        backward reached."""
        self._wait_idle()
        for grads in self._buffers.grads:
            dropped = [p for p in grads.params if p.grad is None]
            grads.gather(keep=False)        # every view back, then zeroed: nothing to copy
            grads.zero_()
            for p in dropped:
                p.grad = None
        self._reduced, self._seen, self._unreduced = SYNCED, None, False

    @_one_call_at_a_time
    def allreduce_grads(self, average: bool = True) -> None:
        """Sum (``average=True``: average) the replicas' gradients with the OpenCL reduce
        kernel, bucket by bucket in a fixed order (then across processes through ``comm``);
        every replica ends with the same gradients."""
        self._check_open()
        check_renorms(self.model, self._all_replicas, "ReplicaGroup.allreduce_grads")
        self._wait_idle()
        if self._buffers.refresh():        # raises for a model holding other Parameters
            self._buffers.broadcast()      # replaced buffers: replica 0's, as a step would
        self._follow("ReplicaGroup.allreduce_grads")
        self._buffers.check_left("ReplicaGroup.allreduce_grads")
        unused = self._buffers.unused(self.comm)
        for grads in self._buffers.grads:
            grads.gather()                 # gradients the replicas' own backwards replaced
        self._reduced, self._unreduced = REDUCED, False
        scale = 1.0 / self._all_replicas if average else 1.0
        Reduced(self.allreduce_algorithm, self.comm).reduce(self._buffers, scale)
        if self.comm is not None:          # running statistics: rank 0's, as a step's end
            self._buffers.buffers_from_rank_0(self.comm)
        for params in self._params:        # no replica's backward reached them: the
            for j in unused:               # optimizer skips them, as after a step
                params[j].grad = None

    @_one_call_at_a_time
    def broadcast_parameters(self) -> None:
        """Copy replica 0's parameters (and buffers such as BatchNorm running statistics) to
        every other replica."""
        self._check_open()
        self._wait_idle()
        self._buffers.refresh()
        self._buffers.broadcast()
        self._synced = stamp()

    @_one_call_at_a_time
    def rng_state(self) -> list[list[int]]:
        """Every replica's dropout generator, ``[seed, counter]`` per replica (JSON-able: save
        it in a checkpoint's meta). With ``set_rng_state`` a resumed run draws the dropout
        masks the uninterrupted run would have drawn."""
        self._check_open()
        return [list(state) for state in self.run(lambda r: nn_ops.rng_state())]

    @_one_call_at_a_time
    def set_rng_state(self, states) -> None:
        """Put back every replica's dropout generator from ``rng_state()``."""
        self._check_open()
        states = list(states)
        if len(states) != len(self.replicas):
            raise ParclError(f"ReplicaGroup.set_rng_state: expected {len(self.replicas)} "
                             f"[seed, counter] pairs (one per replica), got {states!r}")
        # every pair checked before any replica's generator changes
        states = [nn_ops.checked_rng_state(s) for s in states]
        self.run(lambda r, state: nn_ops.set_rng_state(state), states)

    # -- the data-parallel step -----------------------------------------------------------
    @_one_call_at_a_time
    def step(self, x: np.ndarray, y: np.ndarray, loss_fn, optimizer, *, key=None,
             accumulation_steps: int = 1, max_grad_norm: float | None = None,
             reduction: str = "mean") -> float:
        """One data-parallel step on this process's numpy batch; returns the mean loss.

        The batch is split along dim 0 (uneven splits weighted by sample count, or for a loss
        with an ``ignore_index`` by the labels it does not ignore, so the result equals the
        single-replica full-batch step; a ``loss_fn`` that hides such a loss, a lambda around
        ``cross_entropy``, raises on the first batch with ignored labels, before any update,
        and is weighed right from then on); each replica computes
        ``loss_fn(model(x_i), y_i)`` on its own tape and runs backward, as
        ``accumulation_steps`` micro-batches one after another when asked (gradients
        accumulate on the replica; nothing is communicated in between); then the gradients
        are summed, ``optimizer.step()`` runs once, gradients are zeroed and the parameters
        broadcast. ``max_grad_norm`` clips the summed gradient's global 2-norm (the same on
        every replica and rank) before the update, as ``pc.nn.utils.clip_grad_norm_`` would on
        the full batch; the norm before clipping is then ``last_grad_norm``. A failed step
        leaves parameters, optimizer state, batch norm's running statistics, the dropout
        generators and the gradients (a run's, None ones) unchanged. A model given other
        Parameters or buffer slots since the group was built (``model.fc = Linear(...)``)
        raises before anything: make a new group.

        ``loss_fn`` returns the mean loss over its batch (``reduction="mean"``; a loss that
        ends in ``tp.sum`` is refused, as it would be weighed wrongly), or, with
        ``reduction="sum"``, the sum over its batch: each shard's sum then counts once, and
        the step returns the sum over the global batch. A batch whose every label is ignored
        returns NaN, as PyTorch's mean over no labels (its update has zero gradients).

        With ``capture=True`` a replica's recorded step is replayed only while its model's
        Python state (``pc.nn.capture_key``: its modules and their types, ``training`` flags,
        plain attributes and tensors by identity), the batch shapes and dtypes, the grad and
        anomaly modes and ``key`` (any hashable value, for state the model does not hold) are
        those it was recorded with; otherwise the step is recorded again.
        """
        self._check_open()
        check_optimizer(optimizer, self._params)
        check_renorms(self.model, self._all_replicas)
        max_norm = None if max_grad_norm is None else positive("max_grad_norm", max_grad_norm)
        k = len(self.replicas)
        self._losses.check(loss_fn)           # refused before anything, as the checks above
        ignore = self._labels.ignored(loss_fn) if reduction == "mean" else None
        weights = class_weights(loss_fn, self._losses.host) if reduction == "mean" else None
        shards, total = shard_batch(x, y, k, self.comm, ignore, accumulation_steps,   # 1.
                                    reduction, weights)
        check_weightless_smoothing(loss_fn, shards, total, ignore, weights, self.comm)
        keys = self._keys(key, loss_fn, reduction)
        self._wait_idle()
        own, views, found = self._begin()
        for r in self.replicas:         # set by each replica's part of this step (``prepare``)
            r.rng_at_step = None
        try:
            losses = self._losses.for_replicas(loss_fn)   # a loss module's tensors on each
            outcomes = agreed(self.comm, lambda: self._in_step(                      # 2.
                self._call(self._replica_step, (shards, losses, keys))),
                settled=self._stats.settled if self._stats is not None else None)
            self._labels.check(loss_fn, y, ignore, outcomes, self.comm)            # 3.
            check_class_weights(weights, outcomes)
            check_reduction(reduction, outcomes)
            reached = {*outcomes[0].reached, *own}
            # a gradient a run left in a bucket this step's backwards did not reach: updated
            reached.update(self._buffers.nonzero([j for j in views if j not in reached]))
            skip_unreached(self._params[0], tuple(reached), self.comm)
            norm = self._end.finish(self._buffers, optimizer, max_norm)            # 4.
            self._synced = stamp()
        except BaseException:
            self._rewind(found)                # dropout generators and running statistics too
            raise
        # the end zeroed every gradient, a run's unreduced ones counted in
        self._grads_dirty, self._seen, self._unreduced = False, None, False
        return self._finish(outcomes, norm, total)                                 # 5.

    def _in_step(self, outcomes: list) -> list:
        """The replicas' outcomes, refused where they gave gradients to different parameters
        (a model that took a data-dependent branch on this rank's batch): inside ``agreed``,
        so every rank fails the step with this one (alone, this rank left the step while the
        others waited for it in their next collective until the watchdog ended the job)."""
        check_signatures([o.reached for o in outcomes], self._names, self._params[0],
                         self.replicas)
        return outcomes

    def _rewind(self, found) -> None:
        """After a failed step: every replica's dropout generator and buffers as the step
        found them, so the next step computes what it would have (eager or replayed alike),
        and the gradients the calls before it left (``found``: ``_begin``'s) too."""
        if self._broken is None:
            try:
                self._wait_idle()              # no replica still adds to its buckets
                kept, self._reduced, self._seen = found
                self._buffers.restore_grads(kept)
                self._grads_dirty = False
                self._call(self._backward.rewind, ())   # not run: no following of replica 0
            except ParclError as exc:  # the step's own error is still the one raised
                self._broken = (f"a failed step could not restore the replicas' dropout "
                                f"generators and running statistics ({exc})")

    def _begin(self) -> tuple[list[int], list[int], tuple]:
        """Before the replicas start: a failed step's gradients zeroed (each replica makes
        its buckets its gradients again in its own call: ``Eager.prepare``), or the copies
        ``allreduce_grads`` left, or a run's unreduced gradients averaged; replica 0's
        parameters and buffers copied to the others if changed in place since they were last
        made equal, or a buffer replaced; a batch-statistics exchange broken by a failed step
        reset. Returns what the calls before left (``StepBuffers.held``): the step updates
        those parameters whether or not its own backwards reach them, as DDP's synced
        backward reduces what ``no_sync`` accumulated; and what a failed step puts back
        (``_rewind``): the gradients as found and the group's note of them."""
        # first: a model refused here (other Parameters, buffers that no longer line up) is
        # refused before anything changed, the gradients a run left included
        refreshed = self._buffers.refresh()
        self._refuse_a_step_on_replica_0s_share("ReplicaGroup.step")
        left: tuple[list[int], list[int]] = ([], [])
        if self._grads_dirty:
            self.zero_grad()
        if self._reduced:                  # allreduce_grads' copies: the gradient counts once
            left = self._buffers.held()
            found = (self._buffers.keep_grads(True), self._reduced, self._seen)
            self._buffers.forget_copies()
        elif self._seen is not None:       # what the caller zeroed on replica 0 is zeroed
            self._buffers.follow_zeroing(self._seen)
            self._buffers.check_left("ReplicaGroup.step")
            left = self._buffers.held()
            found = (self._buffers.keep_grads(True), SYNCED, self._buffers.seen())
            # and what a run's backwards left, unreduced, counts as their mean (as DDP's)
            self._buffers.average_left(self._all_replicas)
        else:                              # the zeros the last step left, None where dropped
            found = (self._buffers.keep_grads(False), SYNCED, None)
        self._grads_dirty, self._reduced, self._seen = True, SYNCED, None
        if refreshed or (len(self.replicas) > 1 and self._buffers.changed_since(self._synced)):
            self._buffers.broadcast()
        if self._stats is not None:
            self._stats.start()
        return (*left, found)

    def _keys(self, key, loss_fn, reduction: str) -> list:
        """Per replica what its recorded step is looked up by beside shapes, modes and
        ``capture_key``: a loss module's state, ``key`` and the ``reduction``."""
        if not self.capture:
            return [reduction] * len(self.replicas)
        loss_state = loss_key(loss_fn)
        return [(loss_state, key, reduction)] * len(self.replicas)

    def _finish(self, outcomes, norm, total: int) -> float:
        """Wait for the losses (and the norm), the step's one host synchronisation; where the
        devices are the host's own cores, for every queue too. The sample-weighted loss."""
        reads = [e for o in outcomes for e in o.reads]
        labels = [f"replica {i}" for i, o in enumerate(outcomes) for _ in o.reads]
        if norm is not None:
            host_norm = np.empty((), np.float32)
            reads.append(transfer(norm.queue, host_norm, norm.data))
            labels.append("replica 0")
        if self._host_cores:
            reads += [cl.enqueue_marker(r.queue) for r in self.replicas]
            labels += [f"replica {r.index}" for r in self.replicas]
        runtime.wait_for_events(reads, self.timeout, "ReplicaGroup.step", labels=labels)
        if norm is not None:                 # only once read: a failed wait leaves the last one
            self._last_norm = host_norm
        return weighted_loss(outcomes, total, self.comm)

    @property
    def last_grad_norm(self) -> float | None:
        """The global 2-norm of the summed gradient before the last ``step`` clipped it (with
        ``max_grad_norm``); None before any clipped step."""
        return None if self._last_norm is None else float(self._last_norm)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and join every replica thread (bounded wait); the group is unusable after.
        Another thread's call finishes first (closed under it anyway past the timeout)."""
        if self._closed:
            return
        turn = _take_turn(self, "close")
        try:
            self._closed = True
            self._finalizer()              # join the threads first: none may still write grads
            if self.comm is not None:
                self.comm.close()
            for grads in getattr(getattr(self, "_buffers", None), "grads", []):
                grads.detach()
        finally:
            if turn:
                self._calls.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ReplicaGroup:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __len__(self) -> int:
        return len(self.replicas)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ReplicaGroup {len(self.replicas)} replicas, {state}>"


def _seconds(timeout, where: str) -> float:
    """``timeout`` as seconds to wait, which must be > 0; ``float("inf")`` waits without
    limit. Zero, a negative number or NaN would give up on every call at once, blaming
    replicas that had not even started ("did not finish within 0 s") and leaving the group
    unusable."""
    if not isinstance(timeout, numbers.Real):
        raise ParclError(f"{where}: timeout must be a number of seconds, got {timeout!r}")
    seconds = float(timeout)
    if not seconds > 0:
        raise ParclError(f"{where}: timeout must be > 0 seconds (float('inf') waits without "
                         f"limit), got {timeout!r}")
    return seconds


def _replica_0_first(build, timeout: float):
    """``build(replica)`` for every replica, replica 0's alone before the others start. The
    model every replica gets is replica 0's, and a build that draws from a generator the
    replicas share (numpy's global one, one the caller's ``build_model`` holds) drew in the
    order the threads happened to run: after ``np.random.seed(0)`` the group's weights
    changed from run to run and were not those of the same build in one thread."""
    done = threading.Event()

    def call(replica):
        if replica.index:
            done.wait(min(timeout, threading.TIMEOUT_MAX))
        try:
            return build(replica)
        finally:
            if not replica.index:
                done.set()        # built or failed: the others go on (a failure is raised)
    return call


def _seeded(build_model, queue, init: np.random.Generator, dropout: tuple[int, int]):
    """``build_model(queue)`` drawing from a copy of ``init`` (in the replica's thread), the
    replica's dropout generator at the caller's state ``dropout``: pc.manual_seed(s) seeds
    both in the caller's thread, and a replica thread's own started at seed 0 whatever s was,
    so a seed sweep drew the same dropout masks for every s. Returns the model and a copy of
    the generator where the build left it."""
    set_default_generator(copy.deepcopy(init))
    nn_ops.set_rng_state(dropout)
    model = build_model(queue)
    return model, copy.deepcopy(default_generator())


def _refuse_lazy(model) -> None:
    """A lazy layer has no parameters before its first call: the group would broadcast and
    reduce none of its weights (PyTorch's DDP refuses one too)."""
    lazy = lazy_layers(model)
    if lazy:
        name, m = lazy[0]
        where = f"model.{name}" if name else "the model"
        raise ParclError(f"ReplicaGroup: {where} is a {type(m).__name__}, whose parameters "
                         "do not exist before its first call; run a batch through the model "
                         "in build_model (PyTorch's dry run) before the group is built")
