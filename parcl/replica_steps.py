"""A replica's part of a data-parallel step: its shard of the batch, forward and backward on
its own thread, eagerly or replaying a recording (``parcl.tape.capture``).

``split_batch`` cuts this process's batch into one ``Shard`` per replica (and each shard into
micro-batches for gradient accumulation), each with the weight that makes the summed
gradients the gradient of the batch mean. ``Eager`` and ``Captured`` run a shard on the
replica's thread; ``ReplicaGroup`` picks one of the two when it is built.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from . import runtime
from .errors import ParclError, ReplicaError, ShapeError
from .gate import transfer
from .nn.keys import capture_key
from .nn.loss import CrossEntropyLoss, NLLLoss
from .nn.bags import EmbeddingBag
from .nn.sparse import Embedding
from .tape import Node, Tape, ops, tensor
from .tape.capture import capture
from .tensor import Tensor

MAX_CAPTURED_LOSSES = 4       # loss functions whose recorded steps a replica keeps


@dataclass
class Micro:
    """One micro-batch: its rows of the caller's batch and its weight (rows / global batch)."""

    x: np.ndarray
    y: np.ndarray
    weight: np.ndarray            # float32 0-d: the upstream gradient of its mean loss
    start: int                    # its first row in the caller's batch


@dataclass
class Outcome:
    """What a replica's part of the step gave: the pending host reads of its micro-batches'
    losses, which parameters (by index) got a gradient, the label value its loss op said it
    left out of its mean (``found_ignore``; None for a mean over rows), and that of a loss op
    with an ``ignore_index`` found under other ops of the loss (``ignore_inside``: the loss
    is then no mean the step can weigh by)."""

    losses: list[np.ndarray]
    reads: list[cl.Event]
    weights: list[float]
    reached: tuple[int, ...]
    found_ignore: int | None = None
    ignore_inside: int | None = None
    last_op: str = ""             # the op that reduced its batch (``batch_op``): a sum, a mean
    class_weighted: bool = False  # a class-weighted mean (cross_entropy's weight) in the loss


def ignored_label(loss_fn) -> int | None:
    """The label value ``loss_fn`` leaves out of its mean (``ignore_index``), or None: such a
    loss is a mean over the labels not ignored, so the shards are weighted by those. Seen
    from outside: the function itself, a partial or a module with an ``ignore_index``."""
    if loss_fn in (ops.cross_entropy, ops.nll_loss):
        return -100
    value = getattr(loss_fn, "ignore_index", None)
    if value is None and isinstance(loss_fn, functools.partial):
        value = loss_fn.keywords.get("ignore_index")
        if value is None and loss_fn.func in (ops.cross_entropy, ops.nll_loss):
            value = -100
    return int(value) if isinstance(value, (int, np.integer)) else None


def loss_ignore(loss: Node) -> int | None:
    """Seen from inside: the label value the op that made ``loss`` left out of its mean
    (``cross_entropy``/``nll_loss`` with class indices), or None."""
    return getattr(loss.grad_fn, "ignore_index", None)


def ignore_inside(visited) -> int | None:
    """The ``ignore_index`` of a ``cross_entropy``/``nll_loss`` among the graph entries a
    backward visited (``CE * w``, ``CE + aux``), or None."""
    for entry in visited:
        value = getattr(entry.grad_fn, "ignore_index", None)
        if value is not None:
            return value
    return None


class IgnoredLabels:
    """What each loss function's mean leaves out, as far as a step can tell: seen on the
    function (``ignored_label``), or found inside it by an earlier step (``check``)."""

    def __init__(self):
        self.found: dict = {}           # loss_fn's code -> the ignore_index its loss reported

    def ignored(self, loss_fn) -> int | None:
        ignore = ignored_label(loss_fn)
        return self.found.get(_code(loss_fn)) if ignore is None else ignore

    def check(self, loss_fn, y, ignore: int | None, outcomes: list[Outcome], comm) -> None:
        """Raise if the replicas' shares were weighted by the wrong count: ``loss_fn`` hid a
        loss that is a mean over the labels not ``ignore_index`` (a lambda around
        ``cross_entropy``), and this batch has such labels. Nothing is updated then; the
        next step with the same function weighs them right."""
        inside = outcomes[0].ignore_inside
        if inside is not None and inside != ignore and _has_labels(y, [inside], comm):
            raise ParclError(
                f"ReplicaGroup.step: loss_fn's loss contains a cross_entropy/nll_loss that is a "
                f"mean over the labels not {inside} (ignore_index) under other ops (a weight, an "
                f"auxiliary term), and this batch has such labels: the replicas' and micro-"
                f"batches' shares cannot be weighed to give the full-batch gradient, so nothing "
                f"was updated (every such step raises). Set loss_fn.ignore_index = {inside} to "
                f"weigh them by the labels counted (exact when the loss is that mean times a "
                f"constant), or keep ignored labels out of the batch")
        found = outcomes[0].found_ignore
        if found == ignore or inside is not None:
            return
        self.found[_code(loss_fn)] = found
        if _has_labels(y, [v for v in (ignore, found) if v is not None], comm):
            raise ParclError(
                f"ReplicaGroup.step: loss_fn's loss is a mean over the labels not {found} "
                f"(ignore_index), which the step could not see from loss_fn, so the replicas' "
                f"shares of this batch were weighted by rows and nothing was updated; steps "
                f"with this loss_fn now weigh by the labels counted. Pass the loss visibly "
                f"(pc.nn.CrossEntropyLoss(ignore_index=...), functools.partial(tp.cross_entropy"
                f", ignore_index=...), or set loss_fn.ignore_index) to get none of this")



def _has_labels(y, values: list, comm) -> bool:
    """Whether the batch's integer labels ``y`` (on any rank: every rank runs the same loss
    function, so all get here) hold any of ``values``."""
    y = np.asarray(y)
    found = bool(np.issubdtype(y.dtype, np.integer) and np.isin(y, values).any())
    return bool(comm.allreduce(int(found))) if comm is not None else found


def _code(loss_fn):
    """What identifies a loss function across steps: its code (a lambda made anew each step
    has the same), else its type."""
    while isinstance(loss_fn, functools.partial):
        loss_fn = loss_fn.func
    fn = getattr(loss_fn, "__func__", loss_fn)
    return getattr(fn, "__code__", None) or type(loss_fn)


def class_weights(loss_fn, host=Tensor.to_host) -> np.ndarray | None:
    """The class weights of a cross-entropy ``loss_fn`` that is a mean weighted by them,
    seen from outside: a ``CrossEntropyLoss``/``NLLLoss`` module's ``weight``, or the
    ``weight`` of a ``functools.partial`` of ``tp.cross_entropy``/``tp.nll_loss``; None.
    A weight tensor's values come from ``host`` (a ``HostValues``: read once per change)."""
    weight = None
    if isinstance(loss_fn, (CrossEntropyLoss, NLLLoss)):
        weight = loss_fn.weight if loss_fn.reduction == "mean" else None
    elif isinstance(loss_fn, functools.partial) and loss_fn.func in (ops.cross_entropy,
                                                                     ops.nll_loss):
        if loss_fn.keywords.get("reduction", "mean") == "mean":
            weight = loss_fn.keywords.get("weight")
    if weight is None:
        return None
    weight = weight.value if isinstance(weight, Node) else weight
    return (host(weight) if isinstance(weight, Tensor) else np.asarray(weight)).astype(
        np.float64)


def check_weightless_smoothing(loss_fn, shards: list[list[Micro]], total: int | float,
                                ignore: int | None, weights: np.ndarray | None, comm) -> None:
    """A class-weighted cross-entropy with ``label_smoothing`` counts the smoothing term of
    every row not ignored, even one whose label weighs 0, over the batch's weight sum
    (``total``); a micro-batch whose labels all weigh 0 is weighed by 0 (its own mean is
    over no weight), so those rows' terms would be dropped. Refused before anything runs, on
    every rank alike (a batch of no weight at all is the NaN of a mean over nothing)."""
    if weights is None or not total or not _label_smoothing(loss_fn):
        return
    found = None
    for i, micros in enumerate(shards):
        for m in micros:
            labels = m.y if ignore is None else m.y[m.y != ignore]
            labels = labels[(labels >= 0) & (labels < weights.size)]   # others: LabelError
            if found is None and labels.size and float(m.weight) == 0.0:
                found = (i, m.start, m.start + len(m.y))
    if not (comm.allreduce(int(found is not None)) if comm is not None else found):
        return
    where = (f"replica {found[0]}'s rows {found[1]}..{found[2] - 1}" if found else
             "another rank's micro-batch")
    raise ParclError(f"ReplicaGroup.step: {where} of the batch have labels that all weigh 0 "
                     f"(class weights), so that share's mean is over no weight and is weighed "
                     f"by 0, but with label_smoothing their smoothing terms count in the "
                     f"full-batch mean: the step cannot weigh them and nothing was run. Give "
                     f"such classes a small weight, shuffle them among the others, or run "
                     f"without label_smoothing")


def _label_smoothing(loss_fn) -> float:
    """The ``label_smoothing`` of a ``CrossEntropyLoss`` or a partial of
    ``tp.cross_entropy`` (0 for anything else)."""
    if isinstance(loss_fn, functools.partial):
        return float(loss_fn.keywords.get("label_smoothing", 0.0))
    return float(getattr(loss_fn, "label_smoothing", 0.0) or 0.0) \
        if isinstance(loss_fn, CrossEntropyLoss) else 0.0


def count_samples(y: np.ndarray, ignore: int | None, weights: np.ndarray | None = None):
    """What a shard's mean loss is a mean over: its rows, or its labels not ``ignore``, or
    with class ``weights`` the sum of those labels' weights (a label out of range, which
    the loss reports, adds nothing here)."""
    if not np.issubdtype(y.dtype, np.integer) or (ignore is None and weights is None):
        return int(y.shape[0])
    labels = y if ignore is None else y[y != ignore]
    if weights is None:
        return int(labels.size)
    labels = labels[(labels >= 0) & (labels < weights.size)]
    return float(weights[labels].sum())


def shard_batch(x, y, replicas: int, comm, ignore: int | None, accumulation_steps: int,
                reduction: str, weights: np.ndarray | None = None
                ) -> tuple[list[list[Micro]], int | float]:
    """Every replica's micro-batches of this process's batch (``split_batch``), and the
    samples of the global batch, every rank's (``count_samples``). A batch one rank cannot
    split is refused on every rank, before any of them runs its part: raised on that rank
    alone, it left the step while the others waited for it (in their step's collectives, or
    their batch norms' exchange) until the watchdog ended the job."""
    if reduction not in ("mean", "sum"):
        raise ParclError(f"ReplicaGroup.step: reduction must be 'mean' or 'sum', got "
                         f"{reduction!r}")
    x, y = np.asarray(x), np.asarray(y)
    count = count_samples(y, ignore, weights) if y.ndim else 0
    if comm is None:
        total = count
    else:
        refused = None
        try:
            check_split(x, y, replicas, accumulation_steps)
        except ShapeError as exc:
            refused = exc
        # a refusing rank counts NaN, so the sum tells every rank; who refused, and why,
        # takes a second collective only then
        total = comm.allreduce(math.nan if refused is not None else count)
        if total != total:
            agreed(comm, lambda: None, refused, "batch was refused")
    return split_batch(x, y, replicas, total, accumulation_steps, ignore, reduction,
                       weights), total


def same_model_on_ranks(comm, replicas: int, layout: list[tuple]) -> int:
    """The replicas of every rank, summed, once every rank is known to hold rank 0's model:
    ``layout`` is this rank's parameters and buffers (name, shape, dtype) in order. Where a
    rank's differs every rank raises, as DDP's constructor does: rank 0's values would be
    broadcast byte for byte into other shapes and the gradient buckets reduced position by
    position, so a rank whose layer width (or vocabulary, read from its own data) differed
    trained on garbage without a word. One ``allgather``, when the group is built."""
    everyone = comm.allgather((replicas, layout))
    first = everyone[0][1]
    for rank, (_, theirs) in enumerate(everyone):
        if theirs != first:
            i = next((i for i, (a, b) in enumerate(zip(first, theirs)) if a != b),
                     min(len(first), len(theirs)))
            raise ParclError(
                f"ReplicaGroup: rank {rank} built a model other than rank 0's: its parameter "
                f"or buffer {i} is {_entry(theirs, i)} where rank 0's is {_entry(first, i)} "
                f"({len(theirs)} parameters and buffers, rank 0's {len(first)}). Every rank "
                f"must build the same model (rank 0's values are broadcast to the others and "
                f"the gradients summed position by position); derive sizes such as a "
                f"vocabulary from data every rank reads alike")
    return sum(count for count, _ in everyone)


def _entry(layout: list[tuple], i: int) -> str:
    if i >= len(layout):
        return "missing"
    name, shape, dtype = layout[i]
    return f"{name} {shape} {dtype}"


def agreed(comm, call, refused: Exception | None = None, what: str = "replicas failed",
           settled=None):
    """``call()`` (the replicas' part of a step), its failure known to every rank: a rank
    whose replicas failed (a bad batch of its own) raises its error, and every other rank a
    ``ReplicaError`` naming it, so a loop that catches a failed step on every rank goes on
    with all ranks at the same step. (Alone, the failing rank skipped the step's collectives
    and the others waited for it in theirs until the watchdog ended the job.) ``refused``:
    this rank's failure found before (a batch it cannot split), raised instead of calling;
    ``what`` says in the others' error what happened on that rank. One small ``allgather``
    per step, which ranks still in a batch norm exchange meet there: ``settled()``
    (``StatsExchange.settled``) gives what that collective told them."""
    if comm is None:
        return call()
    failure = None
    try:
        if refused is not None:
            raise refused
        result = call()
    except Exception as exc:     # noqa: BLE001 - told to the other ranks, then raised here
        failure = exc
    told = settled() if settled is not None else None
    if told is None:
        told = comm.allgather(None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
    for rank, said in enumerate(told):
        if isinstance(said, str):
            raise ReplicaError(f"ReplicaGroup.step: rank {rank}'s {what}, so this "
                               f"rank's step was not applied either (every rank stays at the "
                               f"same step): {said.splitlines()[0]}")
    for rank, said in enumerate(told):
        if (said is None) == (failure is None):
            continue
        # batch statistics where this rank agreed (that rank was in a sync_batchnorm
        # exchange), or an agreement where this rank was in one
        raise ReplicaError(f"ReplicaGroup.step: rank {rank}'s step "
                           + ("reached a batch norm" if said is not None else
                              "ended before a batch norm") +
                           " (sync_batchnorm) that this rank's did not, so no rank's step was "
                           "applied: every rank must run the same layers")
    return result


def weighted_loss(outcomes: list[Outcome], total: int, comm) -> float:
    """The step's loss from the replicas' read losses: the weighted sum over every rank (a
    micro-batch with no sample to count, every label ignored, adds nothing); NaN for a
    batch with no label to count at all, as PyTorch's mean over no labels."""
    local = sum(w * float(h.sum()) for o in outcomes for w, h in zip(o.weights, o.losses)
                if w)
    if total == 0:
        return float("nan")
    return float(comm.allreduce(local)) if comm is not None else float(local)


def split_batch(x: np.ndarray, y: np.ndarray, replicas: int, total: int | float,
                accumulation_steps: int = 1, ignore: int | None = None,
                reduction: str = "mean", weights: np.ndarray | None = None
                ) -> list[list[Micro]]:
    """Per replica its micro-batches: contiguous rows, the first ``n % replicas`` replicas
    (and micro-batches) one row longer, each weighted by its share of ``total``, the samples
    of the global batch (all ranks; see ``count_samples``), or by 1 for a summed loss."""
    n = check_split(x, y, replicas, accumulation_steps)
    x, y = _as_supported(x), _as_supported(y)
    shards = _bounds(n, replicas)
    out = []
    for lo, hi in zip(shards, shards[1:]):
        micro = [lo + b for b in _bounds(hi - lo, int(accumulation_steps))]
        out.append([Micro(x[a:b], y[a:b], np.array(
            1.0 if reduction == "sum" else count_samples(y[a:b], ignore, weights) / (total or 1),
            np.float32), a) for a, b in zip(micro, micro[1:])])
    return out


def check_split(x: np.ndarray, y: np.ndarray, replicas: int, accumulation_steps) -> int:
    """The batch's samples, where ``split_batch`` can split it, else a ``ShapeError``."""
    n = int(x.shape[0]) if x.ndim else 0
    if y.ndim == 0 or y.shape[0] != n:
        raise ShapeError(f"ReplicaGroup.step: x has {n} samples but y has shape {y.shape}")
    if int(accumulation_steps) != accumulation_steps or accumulation_steps < 1:
        raise ShapeError(f"ReplicaGroup.step: accumulation_steps must be a whole number >= 1, "
                         f"got {accumulation_steps!r}")
    k = replicas * int(accumulation_steps)
    if n < k:
        raise ShapeError(f"ReplicaGroup.step: a batch of {n} samples cannot be split over "
                         f"{replicas} replicas x {accumulation_steps} micro-batches; use a "
                         f"batch of at least {k}")
    return n


def _bounds(n: int, k: int) -> list[int]:
    each, extra = divmod(n, k)
    return [i * each + min(i, extra) for i in range(k + 1)]


def _as_supported(a: np.ndarray) -> np.ndarray:
    """float64 batches become float32 (the data dtype); integer labels keep their dtype."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype == np.float64 else a


class Eager:
    """Forward and backward of every micro-batch through the tape, on the replica's thread."""

    def __init__(self, param_index: list[dict[int, int]], buffers):
        self.param_index = param_index          # per replica: id(p.entry) -> index
        self.buffers = buffers                  # the group's StepBuffers

    def prepare(self, replica) -> None:
        """Before the replica's forward: its gradient buckets its parameters' ``.grad`` again
        (copying in any gradient replaced since), and its parameters still its buckets'
        views. Each replica does its own, on its own thread, so none of it delays the
        others' start."""
        replica.rng_at_step = ops.nn.rng_state()       # a failed step puts it back
        self.buffers.keep(replica.index)                # and the running statistics
        values = self.buffers.values[replica.index]
        replaced = values.replaced()
        if replaced:
            names = {id(p): name for name, p in replica.model.named_parameters()} \
                if hasattr(replica.model, "named_parameters") else {}
            shapes = ", ".join(f"{names.get(id(values.params[i]), i)} "
                               f"{tuple(values.params[i].shape)}" for i in replaced[:4])
            raise ParclError(
                f"ReplicaGroup.step: replica {replica.index}: parameters {shapes} had .value "
                "replaced after the group was made, so the step would train tensors the model "
                "no longer reads; copy new values in place (p.value.copy_(t), "
                "load_state_dict) or make a new ReplicaGroup")
        self.buffers.grads[replica.index].gather()

    def rewind(self, replica) -> None:
        """After a failed step: the replica's dropout generator and buffers as its part of
        the step found them (``prepare``), so a failed step changes nothing. A step that
        failed before the replica's part began (``rng_at_step`` None) left them as they
        are: what ``prepare`` kept then is an earlier step's."""
        if replica.rng_at_step is None:
            return
        ops.nn.set_rng_state(replica.rng_at_step)
        self.buffers.restore(replica.index)

    def run(self, replica, micros: list[Micro], loss_fn, key) -> Outcome:
        self.prepare(replica)
        body = self.body(replica, loss_fn)
        q = replica.queue
        # The caller's arrays are borrowed, not copied: step returns only after every
        # replica's loss read, which the queue runs after these uploads. A step that raises
        # may leave an upload pending; it only feeds that step's gradients, which the next
        # step zeroes on the same queue after it.
        return _run_micros(replica, micros, lambda m: body(
            Tensor.from_host(q, m.x, borrow=True), Tensor.from_host(q, m.y, borrow=True),
            Tensor.from_host(q, m.weight, borrow=True)))

    def body(self, replica, loss_fn):
        """``(x, y, weight) -> (loss, reached, found_ignore, ignore_inside, last_op)`` on device
        tensors: forward on a fresh tape, backward with the sample weight as upstream
        gradient, the graph released."""
        index = self.param_index[replica.index]

        def body(xt: Tensor, yt: Tensor, wt: Tensor):
            with Tape() as tape:
                loss = loss_fn(replica.model(tensor(xt)), yt)
            if not isinstance(loss, Node) or loss.size != 1:
                raise ShapeError(f"ReplicaGroup.step: loss_fn must return a scalar Node, got "
                                 f"{getattr(loss, 'shape', type(loss).__name__)}")
            visited = tape.backward(loss, grad=wt.reshape(loss.shape), retain_grads=False)
            reached = sorted(index[id(node)] for node in visited if id(node) in index)
            found = loss_ignore(loss)
            inside = None if found is not None else ignore_inside(visited)
            weighted = any(getattr(e.grad_fn, "class_weight", None) is not None
                           for e in visited)
            last_op = batch_op(loss, xt.shape[0])
            tape.release()
            return loss.value, tuple(reached), found, inside, last_op, weighted

        return body


class Captured(Eager):
    """Each replica records its step once per input signature and key and replays it after
    (``tp.capture``), on its own thread; recordings are kept per loss function."""

    def __init__(self, param_index: list[dict[int, int]], buffers):
        super().__init__(param_index, buffers)
        self.steps: list[dict] = [{} for _ in param_index]

    def run(self, replica, micros: list[Micro], loss_fn, key) -> Outcome:
        """``key``: the group's part of the lookup key (a loss module's state, the caller's
        ``key``); the replica's model state (``capture_key``) is added here."""
        self.prepare(replica)
        step = self.step(replica, loss_fn)
        # the model's key before each micro-batch: a forward may change what it reads
        # itself (a counter annealing a temperature), so the next micro-batch's is another
        return _run_micros(replica, micros,          # borrowed, as in Eager.run
                           lambda m: step(m.x, m.y, m.weight, borrow=True,
                                          key=(capture_key(replica.model), *key)))

    def step(self, replica, loss_fn):
        # Recordings per loss function, holding it (an id alone could be reused by a new
        # function once the old one is gone) and at most a few (a new lambda every step
        # would otherwise pin a new recording every step).
        steps = self.steps[replica.index]
        entry = steps.pop(id(loss_fn), None)
        if entry is None or entry[0] is not loss_fn:
            entry = (loss_fn, capture(self.body(replica, loss_fn), replica.queue))
        steps[id(loss_fn)] = entry                 # most recently used last
        while len(steps) > MAX_CAPTURED_LOSSES:
            steps.pop(next(iter(steps)))
        return entry[1]


# ops of one operand and a Python constant (``x * s``, ``x / s``, ``x + s``, ``s - x``,
# ``-x``), exactly these types: ``kl_div``'s BatchMean, a DivScalar, is a mean of its own
_CONSTANT_AFFINE = frozenset((ops.elementwise.MulScalar, ops.elementwise.DivScalar,
                              ops.elementwise.AddScalar, ops.elementwise.SubScalar,
                              ops.elementwise.RSubScalar, ops.unary.Neg))


def batch_op(loss: Node, rows: int) -> str:
    """The op that reduced the batch in ``loss`` (``check_reduction``): under nested sums and
    means the one whose axes took the rows (dim 0 of the first reduction's input, followed
    through the others' axes), not the last: ``tp.mean(tp.sum(d * d, axis=0))`` is a sum over
    the batch, ``tp.sum(tp.mean(d * d, axis=0))`` a mean. Where the rows cannot be followed
    (the first reduction's input does not start with them), the last op, a mean that is not
    over the whole batch named "mean of no batch". A constant scaling or shift on top
    (``tp.sum(d * d) / 8``, ``-tp.sum(...)``, ``tp.mean(...) * 8``) leaves what reduced the
    batch as it was: looked through, or a sum divided by a constant was weighed as a mean
    (half the full-batch gradient on 2 replicas) and a mean times one summed per replica.
    A loss that adds terms (``cross_entropy(...) + 0.01 * tp.sum(out * out)``) is each
    term's: their ops joined by " + ", so a sum beside a mean is weighed (refused) as the
    sum it is, not let through as an "add"."""
    return _batch_op(loss.entry, rows)


def _batch_op(top, rows: int, term: bool = False) -> str:
    while type(top.grad_fn) in _CONSTANT_AFFINE and len(top.parents) == 1:
        top = top.parents[0]
    if top.op_name in ("add", "sub") and len(top.parents) == 2 and np.prod(top.shape) == 1:
        return " + ".join(sorted({_batch_op(t, rows, term=True) for t in top.parents}))
    chain, entry = [], top
    while entry.op_name in ("sum", "mean") and entry.parents:
        chain.append(entry)                  # outermost first
        entry = entry.parents[0]
    if chain and _rows_lead(entry, rows):
        axis = 0                             # where the rows are in the next one's input
        for e in reversed(chain):
            f = e.grad_fn
            if axis in f.axes:
                return e.op_name
            if len(e.shape) < len(f.shape):  # the reduced axes dropped (no keepdims)
                axis -= sum(1 for a in f.axes if a < axis)
    last_op = top.op_name
    if term and last_op == "sum":
        # an added sum not over the batch's rows (a penalty on a weight) counts once, as the
        # step's weights add up to 1: not refused as a sum over the batch
        return "sum of no batch"
    if getattr(top.grad_fn, "reduction", None) == "sum":    # cross_entropy(reduction="sum")
        return "sum"
    mean_of = tuple(getattr(top.grad_fn, "shape", ()))
    if last_op == "mean" and not (_rows_lead(top.parents[0], rows)
                                  and len(top.grad_fn.axes) == len(mean_of)):
        last_op = "mean of no batch"         # e.g. of a sum over the batch (feature means)
    return last_op


# views that keep the batch's rows in dim 0 when dim 0 becomes a multiple of them
# (``tp.flatten(d)``, ``d.view(-1, 2)`` of ``d`` with the rows in dim 0)
_MERGES = frozenset(("reshape", "flatten"))


def _rows_lead(entry, rows: int) -> bool:
    """Whether dim 0 of ``entry``'s value holds the batch's rows: it has ``rows`` entries, or
    it is a C-order view of a value that starts with them, of a multiple of ``rows`` (each
    index then lies in one row: ``tp.mean(tp.flatten(d * d))`` is a mean over the batch),
    followed back through elementwise ops of the same shape."""
    while entry.shape[:1] != (rows,):
        shape = entry.shape
        if not shape or not entry.parents or shape[0] % rows:
            return False
        parent = entry.parents[0]
        if entry.op_name in _MERGES and parent.shape[:1] == (rows,):
            return True         # C order: each index of dim 0 (a multiple of rows) in one row
        same = [p for p in entry.parents if p.shape == shape]
        if not same:
            return False
        entry = same[0]
    return True


def _run_micros(replica, micros: list[Micro], run) -> Outcome:
    """Run every micro-batch in turn (gradients accumulate in the replica's buckets) and
    enqueue the read of each loss right after it (a replay overwrites its outputs)."""
    losses, reads, reached, found, inside, last_op = [], [], set(), None, None, ""
    weighted = False
    for m in micros:
        try:
            loss, got, found, inside, last_op, weighted = run(m)
        except ParclError as exc:
            row = getattr(exc, "row", None)          # a flat index into the labels
            if row is not None and getattr(exc, "batch_row", None) is None:
                per_sample = max(1, int(np.prod(m.y.shape[1:])))
                exc.batch_row = m.start + int(row) // per_sample   # the caller's sample
            raise
        host = np.empty(loss.shape, np.float32)
        reads.append(transfer(replica.queue, host, loss.data))
        losses.append(host)
        reached.update(got)
    return Outcome(losses, reads, [float(m.weight) for m in micros], tuple(sorted(reached)),
                   found, inside, last_op, weighted)


# ops whose result is a mean over their batch (parcl's losses take no reduction= or end in mean)
MEANS = frozenset(("mean", "cross_entropy", "nll_loss", "mse_loss",
                   "binary_cross_entropy_with_logits", "kl_div_batchmean"))


def check_class_weights(weights: np.ndarray | None, outcomes: list[Outcome]) -> None:
    """A loss that is a mean weighted by class weights (``cross_entropy(..., weight=w)``)
    must be one the step weighed its shares by, ``class_weights``: by rows or labels instead,
    each replica's mean would count by its row share, not its share of the weights. Refused
    before the update."""
    if weights is None and any(o.class_weighted for o in outcomes):
        raise ParclError("ReplicaGroup.step: loss_fn's loss is a cross_entropy/nll_loss mean "
                         "weighted by class weights that the step could not see from "
                         "loss_fn, so the replicas' shares were weighed by their labels and "
                         "nothing was updated; pass the loss as pc.nn.CrossEntropyLoss(w) (or "
                         "NLLLoss) or functools.partial(tp.cross_entropy, weight=w), with no "
                         "other op around it")


def check_reduction(reduction: str, outcomes: list[Outcome]) -> None:
    """A mean-weighted step whose loss is a ``tp.sum`` over its batch would scale each
    shard's gradient by its share of the batch, and a summed step whose loss is a mean would
    add the shards' means: wrong updates, different for every replica count. Refused before
    the update."""
    ops = {op for o in outcomes for op in o.last_op.split(" + ")}    # each added term's
    if reduction == "mean" and "sum" in ops:
        raise ParclError("ReplicaGroup.step: loss_fn returned a sum (the op over its batch is "
                         "'sum'), but the step weighs each replica's loss as a mean over its "
                         "share of the batch; return the mean (tp.mean), or pass "
                         "reduction='sum' to step for a loss summed over the batch")
    if reduction == "sum" and ops & MEANS:
        raise ParclError(f"ReplicaGroup.step: reduction='sum', but loss_fn returned a mean "
                         f"(the op over its batch is {sorted(ops & MEANS)[0]!r}): each "
                         f"replica's mean would count once, a sum of means that grows with the "
                         f"replica count; leave reduction='mean' for a mean loss, or return "
                         f"its sum")


def check_signatures(signatures: list[tuple], names: list[str], params: list,
                     replicas: list) -> tuple[int, ...]:
    """Desync check: every replica must have given gradients to the same parameters
    (returned, by index; ``names`` and ``params`` are replica 0's)."""
    def describe(j: int) -> str:
        return f"{names[j]} {tuple(params[j].shape)}"

    ref = signatures[0]
    for i, sig in enumerate(signatures[1:], start=1):
        if sig != ref:
            only0 = [describe(j) for j in sorted(set(ref) - set(sig))]
            only_i = [describe(j) for j in sorted(set(sig) - set(ref))]
            raise ReplicaError(
                f"replica desync before allreduce: replica 0 gave gradients to "
                f"{len(ref)} parameters, replica {i} to {len(sig)}; only on replica 0: "
                f"{only0 or 'none'}; only on replica {i}: {only_i or 'none'} (did the "
                "model take a data-dependent branch?). Nothing was reduced or stepped.",
                index=i, device=runtime.describe(replicas[i].device))
    return ref


def skip_unreached(params: list, reached: tuple[int, ...], comm) -> None:
    """A parameter of ``params`` (replica 0's, the optimizer's) that no replica of any rank
    gave a gradient this step (``reached``: the indices that got one) gets ``.grad`` None, so
    the update skips it as ``torch.optim`` does (and DDP with ``find_unused_parameters``):
    weight decay and momentum move nothing that had no gradient, and Adam starts no state for
    it. The next step points it back at its bucket view."""
    missing = set(range(len(params))) - set(reached)
    if comm is not None:                   # what no rank reached (usually nothing to send)
        missing = set.intersection(*map(set, comm.allgather(sorted(missing))))
    for j in missing:
        params[j].grad = None


def check_renorms(model, replicas: int, op: str = "ReplicaGroup.step") -> None:
    """Refuse an ``Embedding`` or ``EmbeddingBag`` with ``max_norm`` on several replicas: its
    forward rescales the rows it picks in place, each replica in its own copy of the weight,
    and the update is made on replica 0's copy and broadcast, so the rows only other replicas
    picked would lose the rescale the full batch's step keeps (the replicas' results would
    part from it). ``op``: the step, or ``allreduce_grads`` ending a custom loop's ``run``."""
    if replicas < 2:
        return
    for name, m in model.named_modules():
        if isinstance(m, (Embedding, EmbeddingBag)) and m.max_norm is not None:
            where = f"model.{name}" if name else "the model"
            raise ParclError(
                f"{op}: {where} is an {type(m).__name__} with max_norm={m.max_norm}, "
                f"which rescales the rows each replica picks in that replica's copy of the "
                f"weight; the update broadcasts replica 0's copy, so the rows only the other "
                f"{replicas - 1} replica(s) picked would lose their rescale. Use "
                f"max_norm=None in the group (or train on one replica)")


def check_optimizer(optimizer, params: list[list]) -> None:
    """The step reduces the gradients into replica 0's parameters (``params[0]``) and copies
    them to the others after the update: an optimizer holding any other parameter (another
    replica's, an earlier group's, another model's) would train nothing the step keeps, so it
    is refused before anything runs. A custom optimizer without ``param_groups`` is trusted."""
    held = [p for group in getattr(optimizer, "param_groups", None) or ()
            for p in group.get("params", ())]
    ours = {id(p) for p in params[0]}
    foreign = [p for p in held if id(p) not in ours]
    if not foreign:
        return
    owner = {id(p): i for i, ps in enumerate(params) for p in ps}
    where = sorted({f"replica {owner[id(p)]}'s" if id(p) in owner else "not this group's"
                    for p in foreign})
    raise ParclError(f"ReplicaGroup.step: the optimizer holds {len(foreign)} of its {len(held)} "
                     f"parameters ({', '.join(where)}; shapes "
                     f"{[tuple(p.shape) for p in foreign[:4]]}) that are not replica 0's, "
                     f"which the step updates and copies to every replica: it would train "
                     f"nothing. Build it over group.parameters() (after making a new group, "
                     f"make a new optimizer too)")


def positive(name: str, value) -> float:
    """``value`` as a float, which must be > 0 (``step``'s ``max_grad_norm``)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ParclError(f"ReplicaGroup.step: {name} must be a number, got {value!r}") from None
    if not value > 0:
        raise ParclError(f"ReplicaGroup.step: {name} must be > 0, got {value}")
    return value
