"""``tp.checkpoint``: activation checkpointing, PyTorch's ``torch.utils.checkpoint``.

A checkpointed function keeps none of its intermediate values for the backward: its forward
runs on a tape of its own, which is released at once (the activations go back to the pool),
and the graph gets one ``checkpoint`` Node whose parents are the function's inputs and the
leaves it read (a module's parameters). Its backward runs the function again, recorded, from
the same inputs and with the dropout generator where the forward found it, and backwards
that: one more forward per segment buys the memory of every activation inside it, the trade
that lets a deep transformer train at a larger batch.

What keeps the recomputation the forward's, never silently another:
- the dropout generator is put back (``preserve_rng_state``), so the masks are the same, and
  moved on afterwards as the forward left it: the run draws what it draws without checkpoints;
- batch norm's running statistics (and ``num_batches_tracked``) are updated by the forward
  only (``mode.state.recompute``);
- a parameter or input changed in place between forward and backward raises, as for any op
  that saved them (the ``checkpoint`` Node saves them all);
- a recomputation that reads other leaves, or gives another shape, raises;
- a function that reads a recorded Node it was not passed (a closure over an activation) is
  refused at the forward: its gradient could only reach that Node outside the graph.
"""

from __future__ import annotations

import numpy as np

from .. import recorder
from ..errors import ParclError, ShapeError
from ..tensor import Tensor
from . import mode
from .autograd import own_pass_grads
from .node import Function, Node
from .ops.nn import dropout_generator, rng_state
from .tape import Tape, partial_pass, topological_order

__all__ = ["checkpoint", "checkpoint_sequential"]


class _Segment:
    """One checkpointed call: the function, its arguments (the Node ones stood in for by
    leaves at each run), the leaves it read and the dropout state it started from."""

    def __init__(self, function, args: tuple, kwargs: dict, preserve_rng_state: bool):
        # numpy arguments copied: the backward reads them again, when the caller's may have
        # changed
        self.function = function
        self.args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        self.kwargs = {k: v.copy() if isinstance(v, np.ndarray) else v
                       for k, v in kwargs.items()}
        self.rng = rng_state() if preserve_rng_state else None
        self.leaves: list[Node] = []         # the leaves read beside the arguments
        self.shape: tuple[int, ...] = ()

    def note_rng_on_replays(self) -> None:
        """Under a recording, have each replay note the dropout state its forward starts
        from, as ``rng`` was noted here: that replay's recomputation (or a backward after
        it) then draws the masks that replay's forward drew, not the recording's."""
        if self.rng is None or recorder.current() is None:
            return
        gen = dropout_generator()

        def note():
            self.rng = (gen.seed, gen.counter)
        recorder.call(note)

    def rewind_on_replays(self):
        """Under a recording, have each replay put the dropout generator back to ``rng``
        before the recomputation, as the backward does here; returns what records putting
        it where the replay found it, after. Without both, a replayed recomputation's
        dropout drew the generator's next masks, not its forward's."""
        if self.rng is None or recorder.current() is None:
            return lambda: None
        gen, found = dropout_generator(), []

        def rewind():
            found[:] = [(gen.seed, gen.counter)]
            gen.seed, gen.counter = self.rng

        def resume():
            gen.seed, gen.counter = found[0]
        recorder.call(rewind)
        return lambda: recorder.call(resume)

    def tensors(self) -> list:
        """The Node and Tensor arguments, in order: the ``checkpoint`` Node's first inputs."""
        return [a for a in self.args if isinstance(a, (Node, Tensor))]

    def run(self, needs) -> tuple[Node | Tensor, list[Node]]:
        """``function`` on the current tape, each Node argument replaced by a leaf over its
        value that requires grad as ``needs`` says (one entry per ``tensors()``). Returns the
        output and those leaves."""
        stand_ins, args = [], []
        needs = iter(needs)
        for a in self.args:
            if isinstance(a, Node):
                a = Node(a.value, requires_grad=next(needs))
                stand_ins.append(a)
            elif isinstance(a, Tensor):
                next(needs)
            args.append(a)
        return self.function(*args, **self.kwargs), stand_ins

    def read_leaves(self, out: Node, stand_ins: list[Node], tape: Tape, name: str) -> list:
        """The leaves requiring grad ``out`` was computed from, other than ``stand_ins``; a
        recorded Node from outside ``tape`` is refused."""
        inputs = {id(s.entry) for s in stand_ins}
        leaves = []
        for e in topological_order(out):
            if e.grad_fn is None:
                if id(e) not in inputs:
                    leaves.append(e)
            elif e.tape is not tape.ref:
                raise ParclError(
                    f"{name}: the function reads the output of '{e.op_name}' (shape "
                    f"{e.shape}), recorded outside it, without being passed it: its gradient "
                    f"would not reach that graph. Pass it as an argument of {name}")
        return leaves


def _hooked(leaf: Node) -> bool:
    hooks = leaf.entry.hooks
    return hooks is not None and bool(hooks.fns or hooks.post)


class Checkpoint(Function):
    """The Node of a checkpointed call: its forward hands on the output computed already
    (``_Segment``); it saves its inputs and the leaves read, so a backward after any of them
    changed in place raises (``tape.changes``)."""

    name = "checkpoint"

    def forward(self, *tensors, segment: _Segment, out: Tensor):
        if self.recording:
            self.segment, self.saved = segment, tensors
        return out

    def backward(self, g: Tensor):
        seg = self.segment
        count = len(self.needs_input_grad) - len(seg.leaves)     # the tensors() ones
        # the generator set directly, not by set_rng_state, which a replay would repeat with
        # the recording's state: each replay rewinds it to its own (rewind_on_replays)
        gen = dropout_generator()
        found = (gen.seed, gen.counter)
        if seg.rng is not None:
            gen.seed, gen.counter = seg.rng
        resume = seg.rewind_on_replays()
        previous = mode.state.recompute
        mode.state.recompute = True
        try:
            with mode.enable_grad(), Tape() as tape:
                out, stand_ins = seg.run(self.needs_input_grad[:count])
            self._check_same(out, stand_ins, tape, seg)
            if partial_pass() or any(_hooked(p) for p in seg.leaves):
                # tp.grad or backward(inputs=...), or leaves with hooks: the leaves'
                # gradients go back to the outer pass, which gives them only to its inputs
                # and runs their hooks once, on their whole gradient
                return self._returned(out, g, stand_ins, seg)
            # the upstream gradient copied: the pass below hands it on uncopied, and a leaf
            # of this graph could then share it with a Node of the outer one
            tape.backward(out, grad=g.copy(), retain_grads=False)
            rec = recorder.current()
            if rec is not None:
                rec.forget_leaves(s.entry for s in stand_ins)
        finally:
            mode.state.recompute = previous
            if seg.rng is not None:
                gen.seed, gen.counter = found
            resume()
        grads = iter(s.grad for s in stand_ins)
        return (*(next(grads) if isinstance(a, Node) else None for a in seg.tensors()),
                *([None] * len(seg.leaves)))

    @staticmethod
    def _returned(out: Node, g: Tensor, stand_ins: list, seg: _Segment) -> tuple:
        """The gradients of the inputs and of the leaves read, returned, none added."""
        targets = [n for n in (*stand_ins, *seg.leaves) if n.requires_grad]
        found = dict(zip(map(id, targets), own_pass_grads(out, targets, g.copy())))
        grads = iter(found.get(id(s)) for s in stand_ins)
        return (*(next(grads) if isinstance(a, Node) else None for a in seg.tensors()),
                *(found.get(id(p)) for p in seg.leaves))

    @staticmethod
    def _check_same(out, stand_ins, tape: Tape, seg: _Segment) -> None:
        """The recomputation read the forward's leaves and gave its shape."""
        if not isinstance(out, Node) or tuple(out.shape) != seg.shape:
            got = tuple(out.shape) if isinstance(out, (Node, Tensor)) else type(out).__name__
            raise ShapeError(f"checkpoint: the function recomputed for the backward gave "
                             f"{got} where its forward gave {seg.shape}: it must compute the "
                             "same thing from the same inputs")
        read = {id(e) for e in seg.read_leaves(out, stand_ins, tape, "checkpoint")}
        # (a parameter frozen since is read without requiring grad, as in the plain graph)
        forward = {id(p.entry) for p in seg.leaves if p.requires_grad}
        if read != forward:
            # fewer is as wrong as others: the ones left out would get no gradient, and the
            # rest that of another function (PyTorch counts the saved tensors)
            what = "parameters its forward did not" if read - forward else \
                f"{len(read)} of the {len(forward)} parameters its forward read"
            raise ParclError(f"checkpoint: the function recomputed for the backward read "
                             f"{what}: it must compute the same thing from the same inputs (a "
                             "branch on state that changed since?)")


def checkpoint(function, *args, use_reentrant: bool | None = None,
               preserve_rng_state: bool = True, context_fn=None,
               determinism_check: str = "default", debug: bool = False, **kwargs):
    """``function(*args, **kwargs)`` without keeping its intermediate values: they are
    computed again in the backward (``torch.utils.checkpoint.checkpoint``). Returns what
    ``function`` returns, which must be one Node or Tensor.

    Gradients are those of the plain call, bit for bit: the same kernels in the same order,
    the dropout masks drawn again from where the forward drew them (``preserve_rng_state``;
    False draws new ones, as PyTorch's), batch norm's running statistics updated once. Under
    ``no_grad``, or when nothing it reads requires grad, it is the plain call.
    ``use_reentrant`` is accepted for PyTorch's signature and changes nothing: parameters
    get their gradients whichever inputs require grad, as PyTorch's ``use_reentrant=False``.
    So are ``determinism_check`` (``"default"`` or ``"none"``: the recomputation's shape and
    parameters are always checked) and ``debug``; a ``context_fn`` (PyTorch's selective
    checkpointing) is refused. None of the four reaches ``function``.

    >>> h = tp.checkpoint(block, x)      # block: a Module or function of Nodes
    """
    if context_fn is not None:
        raise ParclError("checkpoint: context_fn (PyTorch's selective checkpointing) is not "
                         "supported: every activation of the function is recomputed")
    if determinism_check not in ("default", "none"):
        raise ParclError(f"checkpoint: determinism_check must be 'default' or 'none', got "
                         f"{determinism_check!r}")
    if not mode.state.grad:
        return function(*args, **kwargs)
    if mode.batch_stats_sync() is not None:
        raise ParclError("checkpoint: not supported in a replica group with "
                         "sync_batchnorm=True or SyncBatchNorm layers: the recomputation "
                         "would exchange batch statistics again, in the backward")
    seg = _Segment(function, args, kwargs, preserve_rng_state)
    seg.note_rng_on_replays()
    tensors = seg.tensors()
    with Tape() as tape:
        out, stand_ins = seg.run([isinstance(t, Node) and t.requires_grad for t in tensors])
    if not isinstance(out, (Node, Tensor)):
        tape.release()
        raise ParclError(f"checkpoint: the function must return one Node or Tensor, got "
                         f"{type(out).__name__}")
    if not isinstance(out, Node) or not out.requires_grad:
        tape.release()
        return out                                  # nothing it read requires grad
    leaves = seg.read_leaves(out, stand_ins, tape, "checkpoint")
    seg.leaves = [e.node() for e in leaves]         # alive: the function's module holds them
    seg.shape = tuple(out.shape)
    value = out.value
    tape.release()                                  # the activations back to the pool
    del out
    return Checkpoint.apply(*tensors, *seg.leaves, segment=seg, out=value)


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None,
                          **kwargs):
    """``torch.utils.checkpoint.checkpoint_sequential``: ``functions`` (a Sequential or a
    list of modules) run in ``segments`` chunks, each but the last checkpointed."""
    functions = list(functions.children()) if hasattr(functions, "children") else \
        list(functions)
    if not 0 < segments <= len(functions):
        raise ParclError(f"checkpoint_sequential: segments must be between 1 and the "
                         f"{len(functions)} functions, got {segments}")
    size = len(functions) // segments

    def chunk(start: int, end: int):
        def run(x):
            for f in functions[start:end]:
                x = f(x)
            return x
        return run

    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        input = checkpoint(chunk(start, end), input, **kwargs)
    return chunk(end, len(functions))(input)
