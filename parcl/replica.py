"""Data-parallel replicas: one long-lived thread per device, each with its own command queue,
thread-local tape, memory pool, kernel objects and model copy.

A step (``ReplicaGroup.step``) splits the batch, runs forward and backward in every replica at
once, sums the gradients with an OpenCL reduce kernel, takes one shared optimizer step on
replica 0's parameters and copies them to every replica. By default that end of the step is
shared by the replicas' queues, each summing, stepping and broadcasting its chunk of every
bucket in one kernel; across processes (``comm``) or with a named ``allreduce`` it runs as
``parcl.allreduce`` (then MPI), the optimizer on replica 0, and a broadcast. See
docs/architecture.md.

>>> from parcl.replica import ReplicaGroup
>>> with ReplicaGroup(lambda q: pc.nn.Linear(64, 10, queue=q)) as group:
...     opt = pc.optim.SGD(group.parameters(), lr=0.1)
...     loss = group.step(x, y, tp.cross_entropy, opt)
"""

from __future__ import annotations

import queue as queue_mod
import threading
import time
import traceback
import weakref

import numpy as np
import pyopencl as cl

from . import runtime
from .allreduce import ALGORITHMS, GradBuckets, allreduce_scaled
from .allreduce._common import chunk_bounds
from .allreduce.buckets import ParamBuckets, alignment_elems, plan_buckets
from .allreduce.mpi import hierarchical
from .errors import ParclError, ReplicaError, ShapeError
from .nn.module import capture_key
from .kernels.optim import MAX_REPLICAS, Split
from .optim import Optimizer
from .tape import Node, Tape, mode, tensor
from .tape.capture import ReplayFailed, capture, replay_together
from .tensor import Tensor

DEFAULT_TIMEOUT = 600.0       # seconds any dispatched call may take before the group gives up
MAX_CAPTURED_LOSSES = 4       # loss functions whose recorded steps a replica keeps
_launch_defaults: dict = {}   # set by parcl-launch: allreduce algorithm, MPI communicator


def configure_launch(**options) -> None:
    """Used by parcl-launch: defaults for ``ReplicaGroup.from_launch`` (allreduce, comm)."""
    _launch_defaults.update(options)


class Replica:
    """One replica: ``index``, ``device``, ``queue``, ``model`` (and its thread)."""

    def __init__(self, index: int, device: cl.Device, queue: cl.CommandQueue):
        self.index = index
        self.device = device
        self.queue = queue
        self.model = None
        self.inbox: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
        self.thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Replica({self.index}, {runtime.describe(self.device)})"


class _Job:
    """One dispatched call: a result or an error per replica.

    The caller is woken once, when the last replica finishes (or the first one fails), not
    at every replica's finish: each wake-up costs a context switch on the cores the devices
    may be computing on."""

    def __init__(self, k: int):
        self.results = [None] * k
        self.errors: list[tuple[int, BaseException, str]] = []
        self.finished = 0
        self.k = k
        self._mutex = threading.Lock()
        # Each held from here until its moment, then released for good: when every replica
        # finished; when every replica finished or one failed.
        self._all_done = threading.Lock()
        self._all_done.acquire()
        self._done_or_failed = threading.Lock()
        self._done_or_failed.acquire()
        self._stopped = False

    def finish(self, index: int, result=None, error=None, tb: str = "") -> None:
        with self._mutex:
            if error is None:
                self.results[index] = result
            else:
                self.errors.append((index, error, tb))
            self.finished += 1
            if self.finished == self.k:
                self._all_done.release()
            if not self._stopped and (self.finished == self.k or error is not None):
                self._stopped = True
                self._done_or_failed.release()

    def wait(self, deadline: float, stop_on_error: bool = True) -> bool:
        """True when every replica finished (or one failed and ``stop_on_error``)."""
        signal = self._done_or_failed if stop_on_error else self._all_done
        if not signal.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        signal.release()                            # stays signalled for later waits
        return True


def _worker(replica: Replica) -> None:
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
            job.finish(replica.index, error=exc, tb=traceback.format_exc())
        else:
            job.finish(replica.index, result=result)
        finally:
            mode.set_current_tape(None)
            del job, fn, args


def _shutdown(replicas: list[Replica], timeout: float = 10.0) -> None:
    for r in replicas:
        r.inbox.put(None)
    deadline = time.monotonic() + timeout
    for r in replicas:
        if r.thread is not None:
            r.thread.join(max(0.0, deadline - time.monotonic()))


class ReplicaGroup:
    """One replica per device, each a long-lived thread with its own queue, tape and model.

    ``build_model(queue)`` builds one model copy per replica (inside that replica's thread);
    replica 0's parameters are then broadcast so every replica starts identical.
    ``devices=None`` takes ``pc.devices()`` (or what parcl-launch set). ``allreduce`` names the
    algorithm (``"auto"``, ``"direct"``, ``"shared"``, ``"scatter"``, ``"ring"``); with
    ``"auto"``, ``step`` shares the reduce, update and broadcast among the replicas' queues
    (bit-identical to the named algorithms) whenever the optimizer steps whole buckets.
    Gradients are packed into buckets of ``bucket_mb``; ``comm`` is an mpi4py communicator for
    multi-process runs.
    Every wait is bounded by ``timeout`` seconds: a replica thread that does not finish
    raises ``ReplicaError``; a device that does not finish a step ends the process with a
    message naming the replica (``parcl.runtime.wait_for_events``: a blocked OpenCL wait
    cannot be interrupted). ``capture=True`` records each replica's
    forward and backward once per batch shape and replays the recorded kernels afterwards
    (``parcl.tape.capture``): bit-identical results, far less Python per step; steps that
    cannot be replayed (host reads in the model) stay eager; dropout is replayed.
    """

    def __init__(self, build_model, devices=None, *, allreduce: str = "auto",
                 bucket_mb: float = 25.0, comm=None, timeout: float = DEFAULT_TIMEOUT,
                 capture: bool = False):
        devs = list(devices) if devices is not None else runtime.devices()
        if not devs:
            raise ParclError("ReplicaGroup: no devices given")
        if allreduce != "auto" and allreduce not in ALGORITHMS:
            raise ValueError(f"ReplicaGroup: unknown allreduce {allreduce!r}; choose one of "
                             f"{sorted(ALGORITHMS)} or 'auto'")
        self.allreduce_algorithm = allreduce
        self.comm = comm if comm is not None and comm.Get_size() > 1 else None
        self.timeout = float(timeout)
        self.capture = bool(capture)
        self._closed = False
        self._broken: str | None = None
        self._last_job: _Job | None = None
        self._grads_dirty = False
        self.replicas = [Replica(i, d, runtime.new_queue(d)) for i, d in enumerate(devs)]
        self._devices_share_host_cores = any(d.type & cl.device_type.CPU for d in devs)
        self._captured: list[dict] = [{} for _ in devs]
        for r in self.replicas:
            r.thread = threading.Thread(target=_worker, args=(r,), daemon=True,
                                        name=f"parcl-replica-{r.index}")
            r.thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, list(self.replicas))
        try:
            models = self.run(lambda r: build_model(r.queue))
            for r, m in zip(self.replicas, models):
                r.model = m
            self._setup_parameters(bucket_mb)
            self.broadcast_parameters()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_launch(cls, build_model, **kwargs) -> ReplicaGroup:
        """The group parcl-launch prepared: its devices, allreduce algorithm and MPI comm."""
        for key in ("allreduce", "comm"):
            if key in _launch_defaults and key not in kwargs:
                kwargs[key] = _launch_defaults[key]
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
        self._param_index = [{id(p): i for i, p in enumerate(ps)} for ps in self._params]
        self._buffers = [[b for _, b in r.model.named_buffers()] if hasattr(
            r.model, "named_buffers") else [] for r in self.replicas]
        # one layout for every replica: the strictest sub-buffer alignment among their devices
        align = max(alignment_elems(r.device) for r in self.replicas)
        plan = plan_buckets(shapes, bucket_mb, align)
        self._buckets = [GradBuckets(ps, r.queue, bucket_mb, plan=plan, align=align)
                         for r, ps in zip(self.replicas, self._params)]
        # Parameter values in the same flat layout: the broadcast is one copy per bucket.
        self._param_flats = [ParamBuckets(ps, r.queue, plan, align, grads)
                             for r, ps, grads in zip(self.replicas, self._params,
                                                     self._buckets)]

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

    def run(self, fn, *per_replica_args, timeout: float | None = None) -> list:
        """Call ``fn(replica, a[i], b[i], ...)`` in every replica's thread at once and return
        the results in replica order. A failure in any replica is raised here as
        ``ReplicaError`` (replica index, device, original traceback) as soon as it happens."""
        self._check_open()
        k = len(self.replicas)
        for j, arg in enumerate(per_replica_args):
            if len(arg) != k:
                raise ShapeError(f"ReplicaGroup.run: argument {j} has {len(arg)} entries; "
                                 f"expected one per replica ({k})")
        self._wait_idle()
        job = _Job(k)
        self._last_job = job
        modes = mode.capture_modes()
        for i, r in enumerate(self.replicas):
            r.inbox.put((job, fn, tuple(a[i] for a in per_replica_args), modes))
        limit = self.timeout if timeout is None else timeout
        if not job.wait(time.monotonic() + limit):
            busy = [r.index for r, res in zip(self.replicas, job.results) if res is None]
            self._broken = f"replicas {busy} did not finish within {limit:.0f} s"
            raise ReplicaError(f"ReplicaGroup.run: {self._broken}")
        if job.errors:
            index, exc, tb = min(job.errors, key=lambda e: e[0])
            raise self._failure(index, exc, tb) from exc
        return list(job.results)

    def _failure(self, index: int, exc: BaseException, tb: str) -> ReplicaError:
        dev = runtime.describe(self.replicas[index].device)
        return ReplicaError(f"replica {index} on {dev} failed: {type(exc).__name__}: {exc}\n"
                            f"--- traceback in replica {index} ---\n{tb}",
                            index=index, device=dev, traceback_text=tb)

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

    def zero_grad(self) -> None:
        """Zero every replica's gradient buckets (after any straggling replica finished)."""
        self._wait_idle()
        for b in self._buckets:
            b.zero_()

    def allreduce_grads(self, average: bool = True) -> None:
        """Sum (``average=True``: average) the replicas' gradients with the OpenCL reduce
        kernel, bucket by bucket in a fixed order (then across processes through ``comm``);
        every replica ends with the same gradients."""
        self._check_open()
        self._wait_idle()
        self._reduce(average)

    def _reduce(self, average: bool) -> None:
        k = len(self.replicas)
        world = self.comm.Get_size() if self.comm is not None else 1
        scale = 1.0 / (k * world) if average else 1.0
        for b in range(len(self._buckets[0].flats)):
            flats = [bk.flats[b] for bk in self._buckets]
            if self.comm is not None:
                hierarchical(flats, self.comm, scale)
            else:
                allreduce_scaled(flats, scale, self.allreduce_algorithm)

    def broadcast_parameters(self) -> None:
        """Copy replica 0's parameters (and buffers such as BatchNorm running statistics) to
        every other replica."""
        self._check_open()
        self._wait_idle()
        q0 = self.replicas[0].queue
        ready = [cl.enqueue_marker(q0)]
        reads = []
        for r in self.replicas[1:]:
            reads += self._param_flats[r.index].copy_from(self._param_flats[0], ready)
            for s, d in zip(self._buffers[0], self._buffers[r.index]):
                reads.append(cl.enqueue_copy(r.queue, d.data, s.data, byte_count=s.nbytes,
                                             wait_for=ready))
        if reads:
            # replica 0 must not update its parameters before the copies have read them
            cl.enqueue_barrier(q0, wait_for=reads)

    # -- the data-parallel step -----------------------------------------------------------
    def step(self, x: np.ndarray, y: np.ndarray, loss_fn, optimizer, *, key=None) -> float:
        """One data-parallel step on this process's numpy batch; returns the mean loss.

        The batch is split along dim 0 (uneven splits weighted by sample count, so the result
        equals the single-replica full-batch step); each replica computes
        ``loss_fn(model(x_i), y_i)`` on its own tape and runs backward; gradients are
        allreduced, ``optimizer.step()`` runs once, gradients are zeroed and the parameters
        broadcast. A failed step leaves parameters and optimizer state unchanged.

        With ``capture=True`` a replica's recorded step is replayed only while its model's
        Python state (``pc.nn.capture_key``: every module's ``training`` flag and plain
        attributes), the batch shapes and dtypes, the grad and anomaly modes and ``key`` (any
        hashable value, for state the model does not hold) are those it was recorded with;
        otherwise the step is recorded again.
        """
        self._check_open()
        x = np.asarray(x)
        y = np.asarray(y)
        k = len(self.replicas)
        n = int(x.shape[0]) if x.ndim else 0
        if y.ndim == 0 or y.shape[0] != n:
            raise ShapeError(f"ReplicaGroup.step: x has {n} samples but y has shape {y.shape}")
        if n < k:
            raise ShapeError(f"ReplicaGroup.step: batch of {n} samples cannot be split over "
                             f"{k} replicas; use a batch of at least {k}")
        total = n if self.comm is None else int(self.comm.allreduce(n))
        each, extra = divmod(n, k)              # the first `extra` replicas take one more
        bounds = [i * each + min(i, extra) for i in range(k + 1)]
        xs = [_as_supported(x[bounds[i]:bounds[i + 1]]) for i in range(k)]
        ys = [_as_supported(y[bounds[i]:bounds[i + 1]]) for i in range(k)]
        shares = [(bounds[i + 1] - bounds[i]) / total for i in range(k)]
        weights = [np.array(share, np.float32) for share in shares]   # the upstream gradients
        if self._grads_dirty:
            self.zero_grad()
        self._grads_dirty = True
        results = None
        if self.capture:
            keys = [(capture_key(r.model), key) for r in self.replicas]
            self._prefetch(loss_fn, xs, ys, weights, keys)
            results = self._replay_here(loss_fn, xs, ys, weights, keys)
        if results is None:
            keys = [(capture_key(r.model), key) for r in self.replicas] if self.capture \
                else [None] * k
            results = self.run(self._replica_step, xs, ys, weights, [loss_fn] * k, keys)
        self._check_signatures([sig for _, sig in results])
        # The step's one host synchronisation is reading every replica's loss, in one wait.
        # The reads are enqueued before the end of the step. On a GPU only they are waited
        # for: the reduce, update and broadcast run on while this returns and the next step
        # is dispatched (the queues order it after them). Where the devices are the host's
        # own cores, that overlap only makes the host's threads compete with the device's
        # (measured: 2-replica digits steps 4 % slower), so there the whole step is waited for.
        hosts = [np.empty(loss.shape, np.float32) for loss, _ in results]
        reads = [cl.enqueue_copy(loss.queue, h, loss.data, is_blocking=False)
                 for h, (loss, _) in zip(hosts, results)]
        self._update(optimizer)
        self._grads_dirty = False
        if self._devices_share_host_cores:
            reads += [cl.enqueue_marker(r.queue) for r in self.replicas]
        runtime.wait_for_events(reads, self.timeout, "ReplicaGroup.step",
                                labels=[f"replica {i % k}" for i in range(len(reads))])
        local = sum(share * float(h.sum()) for share, h in zip(shares, hosts))
        return float(self.comm.allreduce(local)) if self.comm is not None else local

    def _update(self, optimizer) -> None:
        """The end of a step, after every replica's backward: sum the gradients (the loss
        weights already make the sum the batch mean), one optimizer step, zero the gradients,
        broadcast the parameters. Sharded over the replicas' queues where it can be."""
        plan = None
        if isinstance(optimizer, Optimizer) and type(optimizer).step is Optimizer.step:
            plan = optimizer._prepare()       # validates first: a bad grad changes nothing
            if self._shardable(optimizer, plan):
                self._sharded_update(optimizer, plan)
                return
        self._reduce(average=False)
        if plan is not None:
            optimizer._launch(plan)
        else:
            optimizer.step()
        self.zero_grad()
        self.broadcast_parameters()

    def _shardable(self, optimizer, plan) -> bool:
        """Whether a prepared step covers exactly replica 0's flat buckets, one kernel each,
        on one process with the default allreduce."""
        k = len(self.replicas)
        if self.comm is not None or self.allreduce_algorithm != "auto":
            return False
        if not 1 <= k <= MAX_REPLICAS:
            return False
        if plan.single or not optimizer.can_split:
            return False
        ours = {id(p._bucket) for p in self._params[0] if getattr(p, "_bucket", None)}
        return ours == {id(b) for b, _, _ in plan.flat}

    def _sharded_update(self, optimizer, plan) -> None:
        """Replica r's queue takes chunk r of every bucket through the whole end of the step,
        in one kernel: it sums that chunk of every replica's gradients (in replica order),
        zeroes them, steps replica 0's parameters and optimizer state there and writes the new
        values into every other replica. The replicas share that work instead of replica 0
        stepping everything while the others wait, and each element is read and written once;
        it gets exactly the arithmetic of the unsharded step (same sums, same update), so
        results are bit-identical to it."""
        queues = [r.queue for r in self.replicas]
        k = len(queues)
        # Every replica's backward, and any optimizer state just allocated on replica 0,
        # comes before the chunks are touched. (One replica: its in-order queue does that.)
        if k > 1:
            ready = [cl.enqueue_marker(q) for q in queues]
            for r, q in enumerate(queues):
                cl.enqueue_barrier(q, wait_for=[e for i, e in enumerate(ready) if i != r])
        where = {id(b): i for i, b in enumerate(self._buckets[0].flats)}

        def split(bucket) -> Split:
            b = where[id(bucket.grad)]
            shards = [(q, off, cnt) for q, (off, cnt) in
                      zip(queues, chunk_bounds(bucket.value.size, k))]
            return Split([pf.flats[b] for pf in self._param_flats],
                         [bk.flats[b] for bk in self._buckets], shards)

        optimizer._launch(plan, split=split)
        for r, q in enumerate(queues[1:], start=1):      # buffers: BatchNorm statistics
            for s, d in zip(self._buffers[0], self._buffers[r]):
                cl.enqueue_copy(q, d.data, s.data, byte_count=s.nbytes)
        # Nothing of the next step may start on a queue before every chunk is done. Where
        # the devices are the host's cores, step() waits for every queue before it returns,
        # so nothing of the next step is even enqueued before then: no fence needed.
        if k > 1 and not self._devices_share_host_cores:
            done = [cl.enqueue_marker(q) for q in queues]
            for r, q in enumerate(queues):
                cl.enqueue_barrier(q, wait_for=[e for i, e in enumerate(done) if i != r])

    def _prefetch(self, loss_fn, xs, ys, weights, keys) -> None:
        """Start every replay's input copies from this thread before the replicas wake: the
        copies run on the devices while the replica threads start, and the replica threads do
        not hand the interpreter lock back and forth around them (measured: that ping-pong
        made the second replica's upload take 2-4x as long as the first's)."""
        for r, x, y, w, key in zip(self.replicas, xs, ys, weights, keys):
            step = self._captured_step(r, loss_fn)
            if step is not None:
                try:
                    step.prefetch(x, y, w, key=key)     # checks the inputs (labels) first
                except Exception as exc:
                    raise self._failure(r.index, exc, traceback.format_exc()) from exc

    def _captured_step(self, replica: Replica, loss_fn):
        """The replica's ``CapturedStep`` for ``loss_fn`` (None before it recorded one)."""
        entry = self._captured[replica.index].get(id(loss_fn))
        return entry[1] if entry is not None and entry[0] is loss_fn else None

    def _replay_here(self, loss_fn, xs, ys, weights, keys) -> list | None:
        """Once every replica has recorded this step (and ``_prefetch`` copied its inputs),
        replay them all from this thread, their launches enqueued in turn: a replay is only
        pre-bound enqueue calls, so waking the replica threads for it would cost more than
        it spreads (each thread waits for the interpreter lock before its first launch, the
        devices idle meanwhile). The replica threads record; None when one has not."""
        calls = []
        for r, x, y, w, key in zip(self.replicas, xs, ys, weights, keys):
            step = self._captured_step(r, loss_fn)
            if step is None:
                return None
            calls.append((step, (x, y, w), key))
        self._wait_idle()
        try:
            replayed = replay_together(calls)
        except ReplayFailed as err:
            cause = err.__cause__
            raise self._failure(err.index, cause, traceback.format_exc()) from cause
        if replayed is None:
            return None
        for index, (_, check) in enumerate(replayed):
            try:
                check()          # e.g. the range of labels computed on the device
            except Exception as exc:
                raise self._failure(index, exc, traceback.format_exc()) from exc
        return [outputs for outputs, _ in replayed]

    def _replica_step(self, replica: Replica, x, y, w, loss_fn, key):
        body = self._forward_backward(replica, loss_fn)
        if not self.capture:
            q = replica.queue
            return body(Tensor.from_host(q, x), Tensor.from_host(q, y), Tensor.from_host(q, w))
        # Recordings per loss function, holding it (an id alone could be reused by a new
        # function once the old one is gone) and at most a few (a new lambda every step
        # would otherwise pin a new recording every step).
        steps = self._captured[replica.index]
        entry = steps.pop(id(loss_fn), None)
        if entry is None or entry[0] is not loss_fn:
            entry = (loss_fn, capture(body, replica.queue))
        steps[id(loss_fn)] = entry                 # most recently used last
        while len(steps) > MAX_CAPTURED_LOSSES:
            steps.pop(next(iter(steps)))
        return entry[1](x, y, w, key=key)

    def _forward_backward(self, replica: Replica, loss_fn):
        """The replica's part of a step on device tensors: forward on a fresh tape, backward
        with the sample weight as upstream gradient; returns (loss, signature)."""
        index = self._param_index[replica.index]

        def body(xt: Tensor, yt: Tensor, wt: Tensor):
            with Tape() as tape:
                loss = loss_fn(replica.model(tensor(xt)), yt)
            if not isinstance(loss, Node) or loss.size != 1:
                raise ShapeError(f"ReplicaGroup.step: loss_fn must return a scalar Node, got "
                                 f"{getattr(loss, 'shape', type(loss).__name__)}")
            visited = tape.backward(loss, grad=wt.reshape(loss.shape), retain_grads=False)
            reached = sorted(index[id(node)] for node in visited if id(node) in index)
            tape.release()
            return loss.value, tuple(reached)

        return body

    def _check_signatures(self, signatures: list[tuple]) -> None:
        """Desync check: every replica must have given gradients to the same parameters."""
        ref = signatures[0]
        for i, sig in enumerate(signatures[1:], start=1):
            if sig != ref:
                only0 = [self._describe_param(j) for j in sorted(set(ref) - set(sig))]
                only_i = [self._describe_param(j) for j in sorted(set(sig) - set(ref))]
                self._grads_dirty = True
                raise ReplicaError(
                    f"replica desync before allreduce: replica 0 gave gradients to "
                    f"{len(ref)} parameters, replica {i} to {len(sig)}; only on replica 0: "
                    f"{only0 or 'none'}; only on replica {i}: {only_i or 'none'} (did the "
                    "model take a data-dependent branch?). Nothing was reduced or stepped.",
                    index=i, device=runtime.describe(self.replicas[i].device))

    def _describe_param(self, j: int) -> str:
        return f"{self._names[j]} {tuple(self._params[0][j].shape)}"

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and join every replica thread (bounded wait); the group is unusable after."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()                  # join the threads first: none may still write grads
        for b in getattr(self, "_buckets", []):
            b.detach()
        for ps in getattr(self, "_params", []):
            for p in ps:
                vars(p).pop("_bucket", None)     # optimizers step them one by one again

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


def _as_supported(a: np.ndarray) -> np.ndarray:
    """float64 batches become float32 (the data dtype); integer labels keep their dtype."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype == np.float64 else a
