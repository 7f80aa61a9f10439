"""``Tape``: records the Nodes of one forward pass and walks them in reverse.

Backward is "topological order from the loss, then reversed" (micrograd), with an iterative
sort (deep graphs do not hit the recursion limit) over parents kept in argument order, so the
order in which gradients are summed is the same on every run and every replica.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from .. import recorder
from ..errors import DeviceError, DTypeError, ParclError, ShapeError
from ..kernels import compare, counting
from ..kernels import elementwise as ew
from ..pool import pool_of
from ..runtime import default_queue
from ..tensor import Tensor
from . import mode
from .anomaly import check_finite
from .changes import check_saved_unchanged
from .hooks import run_hooks
from .node import ACCUMULATED, FREED, Entry, Node

class _BackwardState(threading.local):
    deferred: list | None = None     # the checks of the running backward pass (``defer``)
    pending: tuple = ()              # the checks of what that pass starts from
    partial = False                  # that pass gives gradients to chosen inputs only
    leaf_hooks = True                # whether it runs leaves' hooks (not an op's own pass)
    leaf_passes = 0                  # the passes this thread ran that add into leaves' .grad


_backward_state = _BackwardState()


def leaf_passes() -> int:
    """How many backward passes this thread has run that add into leaves' ``.grad`` (not
    ``tp.grad``'s): a caller tells from it whether a function it called ran one."""
    return _backward_state.leaf_passes


def partial_pass() -> bool:
    """Whether the running backward gives gradients to chosen inputs only (``tp.grad``,
    ``backward(inputs=...)``): an op whose backward runs a pass of its own (``tp.checkpoint``)
    must then return its leaves' gradients for the outer pass to route, not add them into
    ``.grad``."""
    return _backward_state.partial


def defer(check) -> None:
    """Run ``check()`` once the current backward pass has enqueued all its work (now, outside
    a backward). Ops use it for checks that must wait for the device, so the wait overlaps with
    the rest of the backward instead of stalling it."""
    pending = _backward_state.deferred
    if pending is None:
        check()
    else:
        pending.append(check)


class Tape:
    """The autograd graph of one forward pass; ``with tp.Tape() as tape:`` makes it this
    thread's current tape and restores the previous one on exit.

    >>> with tp.Tape() as tape:
    ...     loss = tp.mse_loss(model(x), y)
    >>> tape.backward(loss)
    """

    def __init__(self):
        self.ref = weakref.ref(self)       # what the nodes it records point back through
        self.nodes: list[Entry] = []      # the recorded Nodes' graph entries
        self._previous: list = []
        self._backward_done = False
        self._released = False

    # -- recording ------------------------------------------------------------------------
    def __enter__(self) -> Tape:
        # Submit pending work (e.g. the last optimizer step) so the queue does not fill up
        # while the next forward is being enqueued. Not where small launches are held
        # (``parcl.gate``): the gate starts them within LIMIT launches or AGE seconds, and
        # releasing it here, to take a new one at the next launch, cost ~16 us per tape,
        # half the host time of a recorded op and its backward.
        queue = default_queue()
        if getattr(queue, "gate", None) is None:
            queue.flush()
        self._previous.append(mode.get_current_tape())
        mode.set_current_tape(self)
        return self

    def __exit__(self, *exc) -> bool:
        mode.set_current_tape(self._previous.pop())
        return False

    def record(self, entry: Entry) -> None:
        if self._released:
            raise ParclError(f"op '{entry.op_name}' recorded on a released tape")
        entry.index = len(self.nodes)
        entry.tape = self.ref
        self.nodes.append(entry)

    # -- backward ---------------------------------------------------------------------------
    def backward(self, loss: Node, grad: Tensor | None = None, *,
                 retain_grads: bool = True, retain_graph: bool = False) -> list[Entry]:
        """Reverse pass from ``loss``: every node's ``grad_fn`` once, gradients accumulated
        (``+=``) into parents and into parameters' ``.grad``.

        ``loss`` must be a scalar unless ``grad`` (the upstream gradient, shaped like ``loss``)
        is given. Once per tape. ``retain_grads=False`` frees intermediate nodes' gradients as
        soon as they are propagated (leaves still get ``.grad``, and so do the nodes
        ``retain_grad()`` was called on): less memory. Hooks (``register_hook``) run as each
        node's gradient is complete. ``retain_graph=True`` allows another backward through
        this tape (PyTorch's; the graph is kept until ``release`` anyway). Returns the graph
        entries the pass visited
        (``node.entry`` of those requiring grad), parents before children.
        """
        if self._released:
            raise ParclError("backward on a released tape: the graph was freed by "
                             "tape.release() (or the tape was dropped); record a new tape")
        if self._backward_done:
            raise ParclError("backward called twice on the same tape: the graph's gradients "
                             "were already propagated; record the forward again on a new tape")
        if not isinstance(loss, Node):
            raise ParclError("backward: loss is a raw pc.Tensor, not a tp.Node, so there is no "
                             "graph: was it computed under no_grad, or from inputs without "
                             "requires_grad?")
        if loss.freed:
            raise ParclError(f"backward: the graph of this loss ('{loss.op_name}', shape "
                             f"{loss.shape}) is gone: the tape that recorded it was released "
                             "(tape.release(), or the tape was dropped). Keep the tape until "
                             "its backward (with tp.Tape() as tape: ...; tape.backward(loss)), or "
                             "record the forward again")
        if not loss.requires_grad:
            raise ParclError("backward: loss does not require grad (no input required grad)")
        if grad is None:
            if loss.size != 1:
                raise ShapeError(f"backward: loss has shape {loss.shape}; a non-scalar loss "
                                 "needs the upstream gradient: tape.backward(loss, grad=...)")
            grad = Tensor.full(loss.queue, loss.shape, 1.0)
        elif tuple(grad.shape) != tuple(loss.shape):
            raise ShapeError(f"backward: upstream grad of shape {grad.shape} does not match "
                             f"loss shape {loss.shape}")
        else:
            grad = upstream_for("backward", grad, loss.value)
        # The pending checks of what the pass starts from (an embedding's index range):
        # a loss computed from a bad input outside this graph (activations passed on
        # detached, an upstream gradient made from them) has no op here that defers them.
        return run_backward([loss.entry], [grad], loss.value.checks + grad.checks,
                            retain_grads=retain_grads, tape=None if retain_graph else self)

    # -- cleanup and debugging -------------------------------------------------------------
    def release(self) -> None:
        """Free the graph: every node's grad_fn and parents dropped, so activation buffers
        return to the pool before the next forward."""
        for node in self.nodes:
            node.grad_fn = None
            node.parents = []
            node.tape = FREED
        self.nodes.clear()
        self._released = True

    def __del__(self):
        try:
            self.release()
        except Exception:   # interpreter shutdown: nothing left to free
            pass

    def summary(self) -> str:
        """One line per recorded node: index, op_name, input nodes, output shape."""
        lines = [f"Tape({len(self.nodes)} nodes)"]
        for node in self.nodes:
            ins = ", ".join(_describe_parent(p, self) for p in node.parents)
            lines.append(f"  [{node.index}] {node.op_name}({ins}) -> {node.shape}")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return f"<Tape {len(self.nodes)} nodes>"


def upstream_for(op: str, grad: Tensor, out: Tensor) -> Tensor:
    """``grad``, the upstream gradient of ``out``, on ``out``'s queue (else a DeviceError,
    as PyTorch's 'invalid gradient ... expected device') and as float32, as PyTorch casts one
    to its output's dtype: either was handed on as it was (an add or a reshape passes it
    through), so a leaf's ``.grad`` became an int32 tensor that every later step and ``+=``
    refused, or a tensor of another queue that its optimizer step read unsynchronised."""
    if grad.queue is not out.queue and grad.queue != out.queue:
        raise DeviceError(f"{op}: the upstream gradient {grad.shape} is on another command "
                          f"queue than its output {out.shape} (another replica's?); give it "
                          "on the output's queue")
    if grad.dtype == np.float32:
        return grad
    if grad.dtype == np.uint8:                    # a bool mask: its 0/1 as floats
        out = compare.compare("ne", grad, 0)
    elif grad.dtype in (np.int32, np.int64):
        out = counting.cast(grad, np.float32)
    else:
        raise DTypeError(f"{op}: upstream gradient {grad.shape} has dtype {grad.dtype}; "
                         "gradients are float32")
    out.checks = grad.checks
    return out


def run_backward(roots: list[Entry], grads: list[Tensor], pending: tuple, *,
                 retain_grads: bool = True, tape: Tape | None = None, wanted: set | None = None,
                 collect: dict | None = None, keep: set | None = None,
                 leaf_hooks: bool = True) -> list[Entry]:
    """The reverse pass from ``roots`` (each seeded with its gradient) that ``Tape.backward``
    and ``tp.grad`` run; returns the entries walked, parents first. ``wanted`` (ids of
    entries): only these are walked and given gradients, and no leaf outside ``collect``
    is written; ``collect`` (id -> None): the entries whose gradient of this pass is stored
    there instead of being added into a leaf's ``.grad`` (``tp.grad``); ``keep`` (ids of
    inner entries): those whose ``.grad`` of this pass is added to the one they had
    (``tp.backward``'s inputs), as a ``retain_grad()`` node's is. ``leaf_hooks=False``: the
    leaves' hooks are left to the pass that returns to (a checkpoint's own pass)."""
    order = topological_order(roots[0]) if len(roots) == 1 else _order_from(roots)
    if wanted is not None:
        order = [e for e in order if id(e) in wanted]
    for node in order:
        if node.tape is FREED:
            raise ParclError(
                f"backward: the graph reaches the output of '{node.op_name}' (shape "
                f"{node.shape}) recorded on a tape that was released since, so nothing "
                "behind it would get a gradient. Record it again on this tape, or pass "
                "it on with .detach() where no gradient should flow through it")
    check_saved_unchanged(order, pool_of(grads[0].queue))
    if tape is not None:
        tape._backward_done = True
    rec = recorder.current() if collect is None else None     # tp.grad gives leaves nothing
    if rec is not None:
        rec.note_leaves(order)
    state = _backward_state
    if collect is None:
        state.leaf_passes += 1
    outer = state.deferred, state.pending, state.partial, state.leaf_hooks
    state.deferred = deferred = []
    state.pending, state.partial, state.leaf_hooks = pending, wanted is not None, leaf_hooks
    # the walk runs with grad mode off, as PyTorch's engine (create_graph=False): the hooks
    # it calls record nothing, and may update a parameter in place (an optimizer step in a
    # post-accumulate hook)
    outer_modes = mode.set_modes(False, mode.state.inference)
    try:
        _reverse(order, roots, grads, retain_grads, wanted, collect, keep)
    except ParclError as exc:
        # raised amid the walk (a checkpoint's recomputation found its input bad, or the
        # checks before a post-accumulate hook): the leaves reached before hold
        # contributions from it, as after a deferred check
        if collect is None:
            hold_back(order, exc)
        raise
    finally:
        state.deferred, state.pending, state.partial, state.leaf_hooks = outer
        mode.set_modes(*outer_modes)
    if rec is not None:
        rec.note_grads()
    try:
        for check in deferred:
            check()
        for check in pending:
            check()
    except ParclError as exc:
        if collect is None:
            hold_back(order, exc)
        raise
    return order


def _order_from(roots: list[Entry]) -> list[Entry]:
    """``topological_order`` of several roots: each entry once, after its parents."""
    order, seen = [], set()
    for root in roots:
        for e in topological_order(root):
            if id(e) not in seen:
                seen.add(id(e))
                order.append(e)
    return order


def _reverse(order: list[Entry], roots: list[Entry], grads: list[Tensor], retain_grads: bool,
             wanted: set | None, collect: dict | None, keep: set | None) -> None:
    anomaly = mode.is_anomaly_enabled()
    owned: dict[int, int] = {}     # buffer -> how many nodes' .grad it is in this pass
    apart = None          # leaf id -> (leaf, its .grad), while its pass's gradient is summed
    carried = None        # (inner node, its .grad) where PyTorch's .grad accumulates
    for entry in order:
        # An inner node's .grad is this pass's own: one left by an earlier pass through
        # the same graph (another tape's backward, or loss.backward() again with no
        # tape) would be propagated a second time. Leaves keep theirs: they accumulate,
        # and so do retain_grad()'s inner nodes and backward's inner inputs, once the pass
        # is done, as PyTorch's.
        if entry.grad_fn is not None:
            if entry.grad is not None and ((entry.hooks is not None and entry.hooks.retain)
                                           or (keep is not None and id(entry) in keep)):
                if carried is None:
                    carried = []
                carried.append((entry, entry.grad))
            entry.grad = None
        elif (entry.hooks is not None and (entry.hooks.fns or entry.hooks.post)) or (
                collect is not None and id(entry) in collect):
            # a leaf whose hooks see its whole gradient of this pass (or are told it was
            # added), or whose gradient tp.grad returns: summed on its own, its .grad set
            # aside meanwhile
            if apart is None:
                apart = {}
            apart[id(entry)] = (entry, entry.grad)
            entry.grad = None
    try:
        for root, grad in zip(roots, grads):
            if root.grad_fn is None and root.grad is None:
                grad = grad.copy()     # a leaf's .grad outlives the pass: not the caller's
            elif root.grad_fn is not None:
                _held_by_caller(grad, owned)     # another root's backward may add into it
            _accumulate(root, grad, owned)
        _walk(order, roots[0], retain_grads, owned, anomaly, apart, wanted, collect)
        for entry, kept in carried or ():
            entry.grad = kept if entry.grad is None else ew.binary("add", kept, entry.grad)
    finally:
        if apart:        # a hook or a backward raised: those leaves keep the .grad they had
            for entry, kept in apart.values():
                entry.grad = kept


def _walk(order: list[Entry], loss: Entry, retain_grads: bool, owned: dict[int, int],
          anomaly: bool, apart: dict | None = None, wanted: set | None = None,
          collect: dict | None = None) -> None:
    # the in-place fast paths write into leaves' .grad: none where tp.grad leaves them be
    fast = not anomaly and wanted is None
    # the node whose gradient to a leaf was added into that leaf's .grad already, and the leaf
    handed_by = handed_to = None
    for pos in range(len(order) - 1, -1, -1):
        node = order[pos]
        fn = node.grad_fn
        if fn is None:
            if apart is not None and id(node) in apart:
                _leaf_done(node, apart.pop(id(node))[1], owned, collect)
            continue                          # a leaf: its .grad is final
        upstream = node.grad
        if upstream is None:
            continue                          # no path from loss carried a gradient
        # tp.grad's inner input: PyTorch captures its gradient before its hooks where the
        # pass goes on through it to another input, after them where the pass ends there
        captured = collect is not None and id(node) in collect
        goes_on = captured and any(id(p) in wanted for p in node.parents)
        if goes_on:
            collect[id(node)] = upstream
        if node.hooks is not None and node.hooks.fns:
            hooked = run_hooks(node, upstream)
            if hooked is not upstream:       # the hook's tensor, in node.grad now too
                _held_by_caller(hooked, owned, holders=2)
            upstream = node.grad = hooked
        if captured and not goes_on:
            collect[id(node)] = upstream
        targets = None                        # anomaly: every gradient is checked
        if fn.takes_targets and fast:
            targets = _grad_targets(node, owned)
        if targets:
            fn.grad_targets = targets
        leaf = None
        if fn.adds_into and pos and fast:
            leaf = _handed_on(node, order[pos - 1], owned)
            if leaf is not None:
                fn.also_into = leaf.grad
        try:
            # ``fn(upstream)`` (``Function.__call__``) inlined: a frame less per node
            parent_grads = fn.backward(upstream)
            if not isinstance(parent_grads, (tuple, list)):
                parent_grads = (parent_grads,)
            slots = fn.parent_slots
            if len(slots) != len(parent_grads):     # Tensor inputs between the Nodes
                parent_grads = [parent_grads[i] for i in slots]
        finally:    # also when it raises: a later backward must not see this walk's
            if targets:
                del fn.grad_targets             # back to the class's empty default
            if leaf is not None:
                del fn.also_into
        if leaf is not None:
            handed_by, handed_to = order[pos - 1], leaf
        if not retain_grads and node is not loss and (node.hooks is None or not node.hooks.retain):
            node.grad = None
            # its buffer may go to a parent uncopied, and be added into there: not one a
            # hook was given, which the hook may keep (PyTorch's stays as the hook saw it)
            if node.hooks is None or not node.hooks.fns:
                key = id(upstream.data)
                if owned.get(key, 0) > 1:
                    owned[key] -= 1
                else:
                    owned.pop(key, None)
        if wanted is not None:               # tp.grad: no gradient off the paths to its inputs
            parent_grads = [g if id(p) in wanted else None
                            for p, g in zip(node.parents, parent_grads)]
        for parent, g in zip(node.parents, parent_grads):
            if g is None or g is ACCUMULATED or not parent.requires_grad:
                continue
            if node is handed_by and parent is handed_to:
                continue
            if anomaly:
                check_finite(g, "backward", node)
            if g.shape != parent.shape and tuple(g.shape) != tuple(parent.shape):
                raise ShapeError(f"backward of '{node.op_name}': gradient shape {g.shape} "
                                 f"does not match input shape {parent.shape} (a bug in the "
                                 "op's backward)")
            if parent.grad is None and parent.grad_fn is not None:
                # ``_accumulate``'s most common case inlined: an inner node's first
                # gradient, adopted without a copy (shared buffers are counted)
                key = id(g.data)
                owned[key] = owned.get(key, 0) + 1
                parent.grad = g
            else:
                if parent.grad is None and parent.grad_fn is None and _shared_beyond(
                        node, parent, g, parent_grads):
                    g = g.copy()              # the leaf's own: see _leaf_lock
                _accumulate(parent, g, owned)


def _held_by_caller(g: Tensor, owned: dict[int, int], holders: int = 1) -> None:
    """Count ``g`` (a root's upstream gradient, a hook's return) as held outside the pass
    too, so that its buffer is copied before a leaf adopts it or a ``+=`` writes into it: the
    caller's tensor stays as it was."""
    key = id(g.data)
    owned[key] = owned.get(key, 0) + holders


def _leaf_done(leaf: Entry, kept: Tensor | None, owned: dict[int, int],
               collect: dict | None) -> None:
    """A leaf whose gradient of this pass was summed apart (``_reverse``): through its hooks,
    then returned (``collect``, ``tp.grad``) or added into the ``.grad`` it had (``kept``),
    and its post-accumulate hooks called with the leaf."""
    g = leaf.grad
    leaf.grad = kept
    if g is None:
        return
    if leaf.hooks is not None and leaf.hooks.fns and _backward_state.leaf_hooks:
        hooked = run_hooks(leaf, g)
        if hooked is not g and kept is None:
            hooked = hooked.copy()            # the hook's tensor stays the caller's
        g = hooked
    if collect is not None and id(leaf) in collect:
        collect[id(leaf)] = g
        return
    _accumulate(leaf, g, owned)
    if leaf.hooks is not None and leaf.hooks.post:
        _check_so_far()
        node = leaf.node()
        for hook in tuple(leaf.hooks.post.values()):
            hook(node if node is not None else leaf)


def _check_so_far() -> None:
    """Run the running pass's checks deferred so far (every op that gave a leaf its gradient
    has run) and those of what it starts from: a post-accumulate hook acts on the gradient (an
    optimizer step), so one computed from a bad input must raise first, not after."""
    deferred = _backward_state.deferred
    checks = tuple(deferred)
    deferred.clear()                  # each once: the pass's end runs those deferred later
    for check in checks:
        check()
    for check in _backward_state.pending:
        check()


def _describe_parent(p: Entry, tape: Tape) -> str:
    if p.index is not None and p.index < len(tape.nodes) and tape.nodes[p.index] is p:
        return f"#{p.index}"
    kind = "leaf" if p.requires_grad else "input"
    return f"{kind}{p.shape}"


def _grad_targets(node: Entry, owned: dict[int, int]) -> dict | None:
    """Input index -> the existing ``.grad`` of each leaf parent that appears once and owns
    its buffer alone (None when there is none: most nodes, and no allocation for them). A
    ``.grad`` still shared with another node (pass-through backwards hand one buffer to
    several parents) may be this node's own upstream gradient: accumulating into it in
    place would overwrite what the backward reads, so that leaf gets the usual copy-on-write
    ``+=`` (``_accumulate``) instead."""
    targets = None
    parents = node.parents
    for slot, p in zip(node.grad_fn.parent_slots, parents):
        # (``parents.count`` compares by identity: an Entry has no ``__eq__``)
        if p.grad is not None and p.grad_fn is None and p.requires_grad and owned.get(
                id(p.grad.data), 0) <= 1 and parents.count(p) == 1:
            if targets is None:
                targets = {}
            targets[slot] = p.grad
    return targets


def _handed_on(node: Entry, after: Entry, owned: dict[int, int]) -> Entry | None:
    """The leaf whose ``.grad`` gets exactly ``node``'s input gradient, added by ``node``'s
    backward kernel itself (``Function.also_into``), or None. ``after``, the next node of the
    walk, must be ``node``'s one parent with no gradient yet (so, the walk being in reverse
    order, ``node``'s is all it gets) and hand it on unchanged (``hands_on``) to a leaf that
    appears once among its parents and owns its ``.grad`` alone: adding it now sums the same
    values, in the same order, as the ``+=`` after ``after``'s backward, one launch fewer."""
    parents = node.parents
    if len(parents) != 1 or parents[0] is not after or after.grad is not None:
        return None
    fn = after.grad_fn
    if fn is None or (after.hooks is not None and after.hooks.fns):
        return None           # ``after``'s hooks may change the gradient it hands on
    parents = after.parents
    for slot, p in zip(fn.parent_slots, parents):
        if p.grad is not None and p.grad_fn is None and p.requires_grad and fn.hands_on(
                slot) and owned.get(id(p.grad.data), 0) <= 1 and parents.count(p) == 1:
            return p
    return None


# Leaves (parameters) may be shared by backward passes in several threads at once (threads
# training one model on one queue): a leaf's first gradient is adopted under this lock, or two
# passes could both find none and one replace the other's (PyTorch's AccumulateGrad locks).
# A leaf never adopts a buffer an inner node of the pass also holds (``b + h`` hands one to
# both): another thread's pass adding into the leaf in place would change what that node's
# backward still reads, so the leaf gets a copy, as AccumulateGrad clones a gradient that
# something else still holds.
_leaf_lock = threading.Lock()


def _shared_beyond(node: Entry, leaf: Entry, g: Tensor, parent_grads) -> bool:
    """Whether ``node``'s backward hands ``g``'s buffer on beyond ``leaf``'s one slot: to an
    inner node too, or to ``leaf`` again (``x + x``), whose second add would then read the
    leaf's own ``.grad``, with whatever another thread's pass added into it meanwhile."""
    data = g.data
    holders = [p for p, h in zip(node.parents, parent_grads)
               if h is not None and h is not ACCUMULATED and h.data is data and p.requires_grad]
    # (``list.count`` compares by identity: an Entry has no ``__eq__``)
    return any(p.grad_fn is not None for p in holders) or holders.count(leaf) > 1


def _accumulate(node: Entry, g: Tensor, owned: dict[int, int]) -> None:
    """node.grad += g. ``owned`` counts, per buffer, the nodes whose ``.grad`` it is in this
    pass. A first contribution is adopted without a copy. A buffer that is already another
    node's grad (pass-through backwards such as add hand the upstream tensor to several
    parents) is copied for a leaf, whose ``.grad`` outlives the pass and is updated in place
    (optimizers, GEMM accumulation); an inner node shares it and copies on write: its first
    ``+=`` adds into a new buffer (one launch, as the in-place add; the same sum)."""
    if node.grad is None:
        key = id(g.data)
        if node.grad_fn is not None:
            owned[key] = owned.get(key, 0) + 1
            node.grad = g
            return
        if key in owned:
            g = g.copy()
            key = id(g.data)
        with _leaf_lock:
            adopted = node.grad is None
            if adopted:
                node.grad = g
        if adopted:
            owned[key] = owned.get(key, 0) + 1
            return
        # another thread's pass gave the leaf its first gradient meanwhile: add to it
    key = id(node.grad.data)
    if owned.get(key, 0) > 1:
        owned[key] -= 1
        node.grad = ew.binary("add", node.grad, g)
        owned[id(node.grad.data)] = 1
    else:
        ew.axpy(node.grad, g, 1.0)


def hold_back(order: list[Entry], exc: ParclError) -> None:
    """After a backward whose input was found bad (a deferred check raised): the leaves'
    ``.grad`` already hold its contributions, computed from garbage. Each gets a check that
    raises until it is overwritten or dropped (``zero_grad``), so an optimizer step refuses
    it (``Optimizer.prepare``) instead of applying it, and the next backward's sum with it
    raises at its read: a loop that catches the error and goes on never trains on it."""
    def refuse():
        raise ParclError(f"this gradient holds the contributions of a backward that failed "
                         f"({exc}); zero it (optimizer.zero_grad()) before the next step")

    for entry in order:
        g = entry.grad
        if entry.grad_fn is None and g is not None:
            g.checks = (*g.checks, refuse)


def topological_order(root: Node | Entry) -> list[Entry]:
    """The graph entries reachable from ``root`` that require grad, each after all of its
    parents."""
    if isinstance(root, Node):
        root = root.entry
    order: list[Entry] = []
    visited = {root}                   # by identity: an Entry has no __eq__
    stack = [(root, iter(root.parents))]
    while stack:
        node, parents = stack[-1]
        for parent in parents:        # resumes where this node's last visit left off
            if parent.requires_grad and parent not in visited:
                visited.add(parent)
                stack.append((parent, iter(parent.parents)))
                break
        else:
            stack.pop()
            order.append(node)
    return order
