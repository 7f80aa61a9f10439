"""``tp.grad`` (``torch.autograd.grad``): gradients of outputs with respect to inputs,
returned; ``tp.backward`` (``torch.autograd.backward``): one pass from several outputs.

The same reverse pass as ``Tape.backward`` (``tape.run_backward``), walked only along the
paths from the outputs to the inputs, with nothing added into any ``.grad``: the inputs'
gradients come back as ``pc.Tensor``s. Hooks registered on the Nodes it walks run as in a
backward, and an input's hooks shape what it returns, as PyTorch's.

>>> x = tp.tensor(np.array([1.0, 2.0]), requires_grad=True)
>>> (gx,) = tp.grad((x * x).sum(), x)          # 2x; x.grad stays None
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ParclError, ShapeError
from ..tensor import Tensor
from .node import FREED, Node
from .tape import run_backward, topological_order, upstream_for

__all__ = ["backward", "grad"]


def _as_list(x, what: str) -> list:
    items = [x] if isinstance(x, (Node, Tensor)) or x is None else list(x)
    if not items:
        raise ParclError(f"{what} is empty: give a Node or a sequence of them")
    return items


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None, *,
         materialize_grads: bool = False) -> tuple:
    """The gradients of ``outputs`` (a Node or a sequence of them) with respect to ``inputs``
    (likewise), as ``torch.autograd.grad``: a tuple of ``pc.Tensor``, one per input, and no
    ``.grad`` changed. ``grad_outputs``: the upstream gradient of each output (None: ones, for
    a one-element output). An input no gradient reaches is an error unless ``allow_unused``
    (then None, or zeros with ``materialize_grads``). ``retain_graph=False`` (the default)
    ends the tape's graph for backward, as PyTorch frees it: a later ``tape.backward``
    raises. ``create_graph=True`` (higher-order gradients) is not supported: a
    ``ParclError``.

    >>> x = tp.tensor(np.array([3.0]), requires_grad=True)
    >>> tp.grad(x * x * x, [x])[0].to_host()       # 3x^2
    array([27.], dtype=float32)
    """
    _no_create_graph("tp.grad", create_graph)
    if allow_unused is None:
        allow_unused = materialize_grads
    elif materialize_grads and not allow_unused:
        raise ParclError("tp.grad: materialize_grads=True needs allow_unused=True (or left out)")
    outputs = _as_list(outputs, "outputs")
    inputs = _inputs("tp.grad", inputs)
    roots, seeds, pending = _roots("tp.grad", outputs, grad_outputs)
    _refuse_ended("tp.grad", outputs)
    targets = [x.entry for x in inputs]
    collect = _collected(roots, seeds, pending, targets)
    if not retain_graph:
        _end_tapes(outputs)
    result = []
    for i, (x, e) in enumerate(zip(inputs, targets)):
        g = collect[id(e)]
        if g is None and not allow_unused:
            raise ParclError(f"tp.grad: input {i} ('{x.op_name}', shape {x.shape}) was not "
                             "used in the graph of the outputs (no gradient reaches it); pass "
                             "allow_unused=True to get None for it")
        if g is None and materialize_grads:
            g = Tensor.zeros(x.queue, x.shape)
        result.append(g)
    return tuple(result)


def _collected(roots: list, seeds: list, pending: tuple, targets: list, *,
               leaf_hooks: bool = True) -> dict:
    """The pass of ``tp.grad``: the targets' gradients by id, no ``.grad`` changed."""
    collect = {id(e): None for e in targets}
    order = [e for root in roots for e in topological_order(root)]
    kept = [(e, e.grad) for e in order]          # nothing's .grad changes, inner ones too
    try:
        run_backward(roots, seeds, pending, wanted=_towards(order, collect), collect=collect,
                     leaf_hooks=leaf_hooks)
    finally:
        for e, g in kept:
            e.grad = g
    return collect


def own_pass_grads(out: Node, inputs: list, grad: Tensor) -> list:
    """For an op whose backward runs a pass of its own (``tp.checkpoint``): the gradients of
    ``inputs`` (Nodes requiring grad; None where none reaches) from ``out`` seeded with
    ``grad``, returned to the running pass, which runs the leaves' hooks and routes them."""
    targets = [x.entry for x in inputs]
    collect = _collected([out.entry], [grad], out.value.checks + grad.checks, targets,
                         leaf_hooks=False)
    _end_tapes([out])
    return [collect[id(e)] for e in targets]


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """``torch.autograd.backward``: one reverse pass from every Node of ``tensors`` (each
    seeded with its ``grad_tensors`` entry, None: ones for a one-element Node), its
    gradients added into the leaves' ``.grad`` (``inputs``: into those Nodes' only). A tape
    whose backward ran is refused a second one unless the first had ``retain_graph=True``.
    ``create_graph=True`` is a ``ParclError``.

    >>> x = tp.tensor(np.array([2.0]), requires_grad=True)
    >>> tp.backward([x * x, x * 3.0])                # x.grad: 2x + 3
    """
    _no_create_graph("tp.backward", create_graph)
    outputs = _as_list(tensors, "tensors")
    roots, seeds, pending = _roots("tp.backward", outputs, grad_tensors)
    _refuse_ended("tp.backward", outputs)
    wanted = None
    if inputs is not None:
        targets = {id(x.entry): None for x in _inputs("tp.backward", inputs)}
        wanted = _towards([e for root in roots for e in topological_order(root)], targets)
    run_backward(roots, seeds, pending, wanted=wanted,
                 keep=None if inputs is None else set(targets))
    if not retain_graph:
        _end_tapes(outputs)


def _no_create_graph(op: str, create_graph: bool) -> None:
    if create_graph:
        raise ParclError(f"{op}: create_graph=True (higher-order gradients) is not supported: "
                         "parcl's backward computes on raw tensors and records no graph")


def _inputs(op: str, inputs) -> list[Node]:
    inputs = _as_list(inputs, "inputs")
    for i, x in enumerate(inputs):
        if not isinstance(x, Node) or not x.requires_grad:
            what = type(x).__name__ if not isinstance(x, Node) else f"a {x.op_name} Node " \
                f"{x.shape} that does not require grad"
            raise ParclError(f"{op}: input {i} is {what}: inputs must be Nodes that require "
                             "grad")
    return inputs


def _roots(op: str, outputs: list, grad_outputs) -> tuple[list, list, tuple]:
    """The outputs' graph entries, their upstream gradients and their pending checks."""
    grads = _as_list(grad_outputs, "grad_outputs") if grad_outputs is not None else (
        [None] * len(outputs))
    if len(grads) != len(outputs):
        raise ParclError(f"{op}: {len(grads)} upstream gradients for {len(outputs)} outputs")
    roots, seeds, pending = [], [], ()
    for i, (out, g) in enumerate(zip(outputs, grads)):
        if not isinstance(out, Node) or not out.requires_grad:
            raise ParclError(f"{op}: output {i} does not require grad (a raw pc.Tensor, or "
                             "computed from no input that requires grad): it has no graph")
        if out.freed:
            raise ParclError(f"{op}: the graph of output {i} ('{out.op_name}', shape "
                             f"{out.shape}) was released (tape.release(), or the tape was "
                             "dropped); keep the tape until the gradients are taken")
        g = _seed(op, i, out, g)
        roots.append(out.entry)
        seeds.append(g)
        pending = pending + out.value.checks + g.checks
    return roots, seeds, pending


def _refuse_ended(op: str, outputs: list) -> None:
    """Refuse outputs whose tape already ran its backward (or a ``tp.grad``) without
    ``retain_graph``, as PyTorch's 'Trying to backward through the graph a second time'."""
    for i, out in enumerate(outputs):
        tape = _tape_of(out)
        if tape is not None and tape._backward_done:
            raise ParclError(f"{op}: the tape of output {i} ('{out.op_name}') already ran its "
                             "backward; pass retain_graph=True to the first to run another, "
                             "or record the forward again")


def _tape_of(out: Node):
    tape = out.entry.tape
    return tape() if tape is not None and tape is not FREED else None


def _end_tapes(outputs: list) -> None:
    """No further backward through the outputs' tapes (PyTorch frees the graph)."""
    for out in outputs:
        tape = _tape_of(out)
        if tape is not None:
            tape._backward_done = True


def _seed(op: str, i: int, out: Node, g) -> Tensor:
    if g is None:
        if out.size != 1:
            raise ShapeError(f"{op}: output {i} has shape {out.shape}; a gradient can be "
                             "implied only for a one-element output: pass grad_outputs")
        return Tensor.full(out.queue, out.shape, 1.0)
    g = g.value if isinstance(g, Node) else g
    if not isinstance(g, Tensor):
        raise ParclError(f"{op}: grad_outputs[{i}] is a {type(g).__name__}, expected a "
                         "pc.Tensor (or None)")
    if tuple(g.shape) != tuple(out.shape):
        raise ShapeError(f"{op}: grad_outputs[{i}] has shape {g.shape}, output {i} has "
                         f"shape {out.shape}")
    return upstream_for(op, g, out.value)


def _towards(order: Sequence, targets: dict) -> set:
    """Ids of the entries of ``order`` (parents first) from which an input is reached: the
    only ones the pass walks."""
    wanted = set()
    for e in order:
        if id(e) in targets or any(id(p) in wanted for p in e.parents):
            wanted.add(id(e))
    return wanted
