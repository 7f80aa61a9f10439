"""``Node``: one value in the autograd graph, and ``Function``: an op's forward and backward.

A Node carries the fields of netcl's Tape page: ``value`` (a ``pc.Tensor``), ``grad_fn``
(``upstream -> [grad per parent]``), ``parents`` (input Nodes in argument order),
``requires_grad``, ``grad`` and ``op_name``. Ops are ``Function`` subclasses: ``forward`` on raw
tensors saves what ``backward`` needs, both in one class, so reading an op tells everything.

The graph itself is made of each Node's ``Entry``: its graph fields without its value. The
tape and the children of a Node hold its Entry, never the Node, so the value of an
intermediate the caller no longer holds goes back to the pool at once unless its op's
backward saved it (as PyTorch frees every output its backward does not read); ``parents``
gives the Nodes back while they live.
"""

from __future__ import annotations

import weakref
import numpy as np

from .. import recorder
from ..errors import DTypeError, ParclError
from ..pool import ZEROED, pool_of, stamp
from ..runtime import default_queue
from ..tensor import Tensor, joined_checks
from ..tensor_methods import ElementCount
from . import mode
from .anomaly import call_site, check_finite
from .changes import note_change
from .hooks import GradHooks, RemovableHandle
from .node_methods import NodeMethods



class Entry:
    """A Node's place in the graph: everything but its value (``shape`` stands in for it),
    held by its tape and its children. ``node`` is a weak reference to the Node."""

    __slots__ = ("grad_fn", "parents", "requires_grad", "grad", "op_name", "where", "index",
                 "tape", "shape", "node", "recorded_at", "alias", "hooks", "__weakref__")

    @property
    def value(self) -> Tensor:
        """The Node's value while the Node lives; a clear error once it was let go."""
        node = self.node()
        if node is None:
            raise ParclError(f"the output of '{self.op_name}' (shape {self.shape}) was let "
                             "go: nothing held its Node, so the graph kept only what the "
                             "backward reads; keep a reference to the Node to read its value")
        return node.value

    def __repr__(self) -> str:
        return f"Entry(op={self.op_name}, shape={self.shape})"


def _entry(value: Tensor, grad_fn, parents: list, requires_grad: bool, op_name: str) -> Entry:
    e = _new(Entry)
    e.grad_fn = grad_fn
    e.parents = parents
    e.requires_grad = requires_grad
    e.grad = None
    e.op_name = op_name
    e.where = None          # "file:line in func" of the recording call (anomaly mode)
    e.index = None          # position on its tape
    e.tape = None           # weakref to the tape that recorded it; FREED once released
    e.shape = value.shape
    # when the op was recorded (a ``pool.stamp()``, on a tape or not): a backward raises for
    # an op whose saved tensors were changed in place after it (``MemoryPool.overwrites``)
    e.recorded_at = None if grad_fn is None else stamp()
    e.alias = None          # the parent whose buffer its value is (a reshape's input), if any
    e.hooks = None          # its gradient hooks and retain_grad (``hooks.GradHooks``), if any
    return e


def _graph_field(name: str, doc: str) -> property:
    def get(self):
        return getattr(self.entry, name)

    def set(self, v):
        setattr(self.entry, name, v)

    return property(get, set, doc=doc)


class Node(NodeMethods):
    """A recorded value: ``value``, ``grad_fn``, ``parents``, ``requires_grad``, ``grad``,
    ``op_name``. Supports ``+ - * / @``, unary ``-`` and ``.shape``.

    >>> x = tp.tensor(pc.Tensor.from_host(q, np.array([2.0], np.float32)), requires_grad=True)
    >>> y = x * x
    """

    __slots__ = ("value", "entry", "__weakref__")
    __array_priority__ = 1000       # so `ndarray * node` defers to Node.__rmul__

    def __init__(self, value: Tensor, grad_fn=None, parents=None, requires_grad=False,
                 op_name: str = "leaf"):
        if not isinstance(value, Tensor):
            raise TypeError(f"Node value must be a pc.Tensor, got {type(value).__name__}")
        self.value = value
        graph = [p.entry if isinstance(p, Node) else p for p in parents] if parents else []
        self.entry = _entry(value, grad_fn, graph, bool(requires_grad), op_name)
        self.entry.node = weakref.ref(self)

    grad_fn = _graph_field("grad_fn", "upstream -> [gradient per parent]; None for a leaf")
    @property
    def requires_grad(self) -> bool:
        """Whether a gradient flows to this Node."""
        return self.entry.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        # PyTorch's checks (``requires_grad_``'s): an op's output that stopped requiring
        # grad would drop every gradient through it, without a word
        self.requires_grad_(flag)

    @property
    def grad(self):
        """The accumulated gradient (a pc.Tensor), None before backward."""
        e = self.entry
        rec = recorder.state.recording
        if rec is not None and e.grad_fn is None:
            # a captured step that reads a leaf's gradient (a norm it logs) replays only
            # while the leaf holds that same tensor: a new one (an eager backward's, the
            # old one kept elsewhere) would otherwise be read stale from the old buffer
            rec.note_grad_read(e)
        return e.grad

    @grad.setter
    def grad(self, value) -> None:
        e = self.entry
        rec = recorder.state.recording
        if rec is not None and e.grad_fn is None:
            # a captured step that sets a leaf's gradient (p.grad = None) sets it in every
            # replay, whatever an eager step between calls left there
            rec.note_grad_assigned(e)
        e.grad = value

    op_name = _graph_field("op_name", "the op that made it: 'matmul', 'relu', ...; 'leaf'")
    where = _graph_field("where", "where the op was recorded (under detect_anomaly)")
    index = _graph_field("index", "its position on its tape (None for a leaf)")
    tape = _graph_field("tape", "weakref to the tape that recorded it (FREED once released)")

    @property
    def parents(self) -> list:
        """The input Nodes in argument order (an input nothing holds any more is its
        ``Entry``: the graph without the value)."""
        return [_node_of(e) for e in self.entry.parents]

    @parents.setter
    def parents(self, nodes) -> None:
        self.entry.parents = [p.entry if isinstance(p, Node) else p for p in nodes]

    # -- tensor-like properties ---------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def dtype(self):
        return self.value.dtype

    @property
    def queue(self):
        return self.value.queue

    @property
    def device(self):
        """The OpenCL device of its queue (``pc.Tensor.device``)."""
        return self.value.device

    @property
    def size(self) -> ElementCount:
        """The element count (an int, as numpy's); called, torch's ``size()``: ``x.size()``
        the shape, ``x.size(d)`` one dim's size (``ElementCount``)."""
        return self.value.size

    @property
    def ndim(self) -> int:
        return self.value.ndim

    def to_host(self) -> np.ndarray:
        return self.value.to_host()

    def item(self) -> float:
        return self.value.item()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop ``.grad`` (``set_to_none``) or fill it with zeros."""
        if set_to_none:
            # assigned without reading it first: a captured step that starts by clearing its
            # gradients then replays whatever they held (a read made it depend on them)
            self.grad = None
            return
        g = self.grad
        if g is not None:              # noted: a ReplicaGroup zeroes the other replicas' too
            g.fill_owned(0)
            pool_of(g.queue).note_overwrite(g.data, ZEROED, update=True)

    @property
    def freed(self) -> bool:
        """Whether the tape that recorded this node was released: its graph is gone."""
        return self.entry.tape is FREED

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None, *, grad: Tensor | None = None) -> None:
        """``loss.backward()``: the backward of the tape that recorded this node (a new tape's
        when none did, e.g. ops recorded with no tape current), with PyTorch's arguments
        (``tp.backward``); ``grad=`` is ``gradient``."""
        if grad is not None:
            if gradient is not None:
                raise TypeError("backward: gradient and grad given both; they are one argument")
            gradient = grad
        if isinstance(gradient, Node):
            gradient = gradient.value
        if create_graph or inputs is not None:
            from .autograd import backward
            return backward(self, gradient, retain_graph, create_graph, inputs)
        from .tape import Tape
        tape = self.entry.tape
        recorded = tape() if tape is not None and tape is not FREED else None
        (recorded if recorded is not None else Tape()).backward(
            self, gradient, retain_graph=bool(retain_graph))

    def detach(self) -> Tensor:
        """The value, outside the graph."""
        return self.value

    # -- autograd API (PyTorch's Tensor methods) -------------------------------------------
    @property
    def is_leaf(self) -> bool:
        """True for a Node no recorded op made (a parameter, ``tp.tensor``) and for one that
        does not require grad, as PyTorch's."""
        e = self.entry
        return not e.requires_grad or (e.grad_fn is None and e.tape is not FREED)

    def __deepcopy__(self, memo: dict) -> Node:
        """``copy.deepcopy`` of a leaf, as PyTorch's: its value and ``.grad`` copied on the
        same queue, ``requires_grad`` kept. An op's output is refused, as PyTorch's: a copy of
        its graph would take the gradients its inputs never get."""
        if not self.is_leaf:
            raise ParclError(f"copy.deepcopy of the output of '{self.entry.op_name}' (shape "
                             f"{self.shape}): only a leaf can be deep-copied, as in PyTorch; "
                             "deep-copy its .detach()")
        new = Node(self.value.copy(), requires_grad=self.requires_grad)
        if self.grad is not None:
            new.grad = self.grad.copy()
        return new

    def requires_grad_(self, requires_grad: bool = True) -> Node:
        """Set ``requires_grad`` on a leaf, in place, as PyTorch's; returns the Node. An op's
        output cannot stop requiring grad (``detach()`` it instead)."""
        flag = bool(requires_grad)
        e = self.entry
        if not self.is_leaf and not flag:
            raise ParclError(f"requires_grad_(False) on the output of '{e.op_name}' (shape "
                             f"{e.shape}): only a leaf's flag can change; use .detach() for "
                             "a value outside the graph")
        if flag and self.value.dtype != np.float32:
            raise DTypeError(f"requires_grad_: a {self.value.dtype} Node {e.shape} cannot "
                             "require grad; gradients are float32")
        e.requires_grad = flag
        return self

    def register_hook(self, hook) -> RemovableHandle:
        """Call ``hook(grad)`` in every backward once this Node's gradient (a ``pc.Tensor``)
        is complete; a returned tensor (same shape) replaces it. On a leaf it runs before the
        gradient is added into ``.grad``. Returns a handle: ``handle.remove()``."""
        e = self.entry
        if not e.requires_grad:
            raise ParclError(f"register_hook on a Node that does not require grad ('{e.op_name}'"
                             f", shape {e.shape}): no gradient ever reaches it")
        if not callable(hook):
            raise TypeError(f"register_hook: expected a callable, got {type(hook).__name__}")
        if e.hooks is None:
            e.hooks = GradHooks(e)
        handle = RemovableHandle(e.hooks, e.hooks.fns)
        e.hooks.fns[handle.id] = hook
        e.hooks.renew()
        return handle

    def register_post_accumulate_grad_hook(self, hook) -> RemovableHandle:
        """Call ``hook(leaf)`` in every backward once this leaf's gradient of the pass was
        added into its ``.grad`` (an optimizer step per parameter, as PyTorch's); not in
        ``tp.grad``, which adds into nothing. Returns a handle: ``handle.remove()``."""
        e = self.entry
        if not e.requires_grad or e.grad_fn is not None:
            what = "does not require grad" if not e.requires_grad else "is not a leaf"
            raise ParclError(f"register_post_accumulate_grad_hook on a Node that {what} "
                             f"('{e.op_name}', shape {e.shape}): only a leaf's .grad is "
                             "accumulated")
        if not callable(hook):
            raise TypeError(f"register_post_accumulate_grad_hook: expected a callable, got "
                            f"{type(hook).__name__}")
        if e.hooks is None:
            e.hooks = GradHooks(e)
        handle = RemovableHandle(e.hooks, e.hooks.post)
        e.hooks.post[handle.id] = hook
        e.hooks.renew()
        return handle

    def retain_grad(self) -> None:
        """Keep this inner Node's ``.grad`` in a backward with ``retain_grads=False`` (a
        leaf's is always kept), as PyTorch's."""
        e = self.entry
        if not e.requires_grad:
            raise ParclError(f"retain_grad on a Node that does not require grad ('{e.op_name}'"
                             f", shape {e.shape})")
        if e.grad_fn is None:
            return
        if e.hooks is None:
            e.hooks = GradHooks(e)
        e.hooks.retain = True

    @property
    def retains_grad(self) -> bool:
        """Whether ``retain_grad()`` was called on this inner Node."""
        e = self.entry
        return e.grad_fn is not None and e.hooks is not None and e.hooks.retain

    def detach_(self) -> Node:
        """Make this Node a leaf that does not require grad, in place, as PyTorch's; the ops
        already recorded from it keep their graph."""
        e = _entry(self.value, None, [], False, "leaf")
        e.node = weakref.ref(self)
        self.entry = e
        return self

    def __repr__(self) -> str:
        return (f"Node(op={self.op_name}, shape={self.shape}, "
                f"requires_grad={self.requires_grad})")


def _freed():
    """Stands in ``Node.tape`` for a node whose tape was released (never called)."""
    raise AssertionError("a freed node's tape is gone")


FREED = _freed


def _overwriting(cls, x) -> None:
    """Before ``cls``'s forward overwrites input ``x`` in place (``Function.overwrites``)."""
    what = f"{cls.name}({cls.overwrites[0]}=True)"
    if isinstance(x, Node) and x.requires_grad and leaf_viewed(x) is not None:
        through = "" if x.grad_fn is None else f" (through a view of it: {x.op_name})"
        raise ParclError(f"{what} on a leaf that requires grad{through}: its value is what its "
                         f"gradient is taken with respect to; use {cls.overwrites[0]}=False")
    note_change(x, what)


def leaf_viewed(x: Node) -> Entry | None:
    """The leaf requiring grad whose buffer ``x`` is: ``x`` itself, or a leaf that ``x``
    views through ops whose output is their input's buffer (``reshape``, ``flatten``); else
    None."""
    e = x.entry
    while e.grad_fn is not None:
        if e.alias is None:
            return None
        e = e.parents[e.alias]
    return e if e.requires_grad else None


def _node_of(e: Entry):
    node = e.node()
    return e if node is None else node


def host_copy(value, dtype) -> np.ndarray:
    """A C-contiguous numpy copy of a Node, a Tensor or anything array-like (state dicts take
    all three); raises TypeError/ValueError when it is not numeric."""
    if isinstance(value, Node):
        value = value.value
    if isinstance(value, Tensor):
        value = value.to_host()
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":      # None (np.array: NaN), strings, objects
        raise TypeError(f"expected numbers, got {type(value).__name__} of dtype {array.dtype}")
    return np.array(array, dtype=dtype, order="C", copy=True)


def tensor(t, requires_grad: bool = False) -> Node:
    """A leaf Node (``requires_grad=True`` to get its ``.grad``) wrapping a ``pc.Tensor``, or
    holding a numpy array (or nested list, or number) uploaded to the calling thread's default
    queue, as ``torch.tensor``: float64 becomes float32 (parcl's float type), integer labels
    stay int32/int64.

    >>> w = tp.tensor(np.zeros((3, 2)), requires_grad=True)     # float32, on pc.default_queue()
    """
    if isinstance(t, Node):
        t = t.value
    if not isinstance(t, Tensor):
        array = np.asarray(t)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        t = Tensor.from_host(default_queue(), array)
    if requires_grad and t.dtype != np.float32:
        raise DTypeError(f"tp.tensor: a {t.dtype} tensor {t.shape} cannot require grad; "
                         "gradients are float32 (convert with .astype(np.float32))")
    return Node(t, requires_grad=requires_grad)


#: What ``Function.backward`` returns for an input whose gradient it already added into
#: ``self.grad_targets[i]`` itself (the tape then has nothing left to accumulate).
ACCUMULATED = object()


class Function:
    """Base of every differentiable op: ``forward`` on raw tensors, ``backward`` beside it.

    ``forward(*tensors, **options)`` returns the output Tensor and saves on ``self`` what
    backward needs (only when ``self.needs_input_grad`` is not None, i.e. when recording).
    ``backward(grad)`` returns one gradient (or None) per tensor input, shaped like it.

    Before ``backward`` of an op whose class sets ``takes_targets`` the tape fills
    ``grad_targets`` (input index -> Tensor) with the existing gradients of leaf inputs (a
    parameter's persistent ``.grad``). A backward that can add its result straight into one
    (a GEMM accumulating with ``beta=1``) may do so and return ``ACCUMULATED`` for that input:
    one pass over the gradient instead of a temporary and a separate ``+=``.
    """

    name = "function"
    grad_targets: dict = {}        # set per backward by the tape; never mutated in place
    takes_targets = False          # whether backward reads grad_targets (else none are found)
    # An op of one input whose backward can also add its input gradient into another tensor
    # in the same kernel (``also_into``, set by the tape for one call; ``tape._walk``).
    adds_into = False
    also_into: Tensor | None = None
    # (option, input position): the input that a truthy option makes the forward overwrite
    # in place (``relu(inplace=True)``); ``apply`` refuses a leaf that requires grad there
    # and notes the change (``note_change``): a backward then raises for ops that saved it.
    overwrites: tuple[str, int] | None = None

    # the positions of the Node inputs among all inputs (``apply`` sets it when recording)
    parent_slots: tuple[int, ...] = ()

    def __init__(self, needs_input_grad: tuple[bool, ...] | None):
        self.needs_input_grad = needs_input_grad

    @property
    def recording(self) -> bool:
        return self.needs_input_grad is not None

    def forward(self, *args, **kwargs) -> Tensor:
        raise NotImplementedError

    def backward(self, grad: Tensor):
        raise NotImplementedError

    def hands_on(self, i: int) -> bool:
        """Whether input ``i``'s gradient is the upstream gradient itself, unchanged (an add
        of equal shapes): the tape may then add it into a leaf's ``.grad`` early."""
        return False

    def __call__(self, upstream: Tensor) -> list:
        """grad_fn: the gradient for each parent Node, in argument order."""
        grads = self.backward(upstream)
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        slots = self.parent_slots
        # increasing input positions: as many as there are gradients means every one of them
        return grads if len(slots) == len(grads) else [grads[i] for i in slots]

    @classmethod
    def apply(cls, *inputs, tape=None, **kwargs):
        """Run the op; record a Node when some input requires grad and grad mode is on (or an
        explicit ``tape`` is given), else return the raw output Tensor."""
        # The hot path of every eager op: one pass over the inputs, one read of the
        # thread's modes, and the Node built without re-checking what was checked here.
        if cls.overwrites is not None and kwargs.get(cls.overwrites[0]):
            _overwriting(cls, inputs[cls.overwrites[1]])
        values, needs, slots, parents = [], [], [], []
        record = False
        checks = ()            # the inputs' pending device-side checks (``Tensor.checks``)
        i = 0
        for x in inputs:
            if isinstance(x, Node):
                v = x.value
                e = x.entry
                if e.requires_grad:
                    record = True
                needs.append(e.requires_grad)
                slots.append(i)
                parents.append(e)
            elif x is None or isinstance(x, Tensor):
                v = x
                needs.append(False)
            else:
                raise TypeError(f"{cls.name}: expected a tp.Node or pc.Tensor input, got "
                                f"{type(x).__name__}")
            values.append(v)
            if v is not None and v.checks:
                checks = joined_checks(checks, v.checks)
            i += 1
        if parents:
            rec = recorder.state.recording
            if rec is not None:       # inside tp.capture: the leaves its ops read, recorded
                rec.note_inputs(parents)     # or not, with a backward or without
        state = mode.state
        recorded = record and (tape is not None or state.grad)
        needs = tuple(needs) if recorded else None
        if cls.__init__ is _plain_init:      # __init__'s one field set here, without its call
            fn = _new(cls)
            fn.needs_input_grad = needs
        else:
            fn = cls(needs)
        out = fn.forward(*values, **kwargs)
        if checks:
            _inherit(out, checks)
        if not recorded:
            return out
        fn.parent_slots = tuple(slots)
        # the Node, without the checks of Node.__init__, which were made here
        node = _new(Node)
        node.value = out
        entry = node.entry = _entry(out, fn, parents, True, cls.name)
        entry.node = weakref.ref(node)
        data = out.data
        for k, i in enumerate(slots):
            if values[i].data is data:        # a view (reshape) or an in-place op's output
                entry.alias = k
                break
        if tape is None:
            tape = state.tape
        if tape is not None:
            tape.record(entry)
        if state.anomaly:
            entry.where = call_site()
            check_finite(out, "forward", node)
        return node


_new = object.__new__
_plain_init = Function.__init__


def _inherit(out, checks: tuple) -> None:
    """An op's output keeps its inputs' pending checks (an embedding's index range, a loss's
    labels): a value computed from a bad input raises at its first host read too, not only
    the checked op's own output."""
    if isinstance(out, Tensor):
        out.checks = joined_checks(out.checks, checks)
    elif isinstance(out, (tuple, list)):
        for t in out:
            if isinstance(t, Tensor):
                t.checks = joined_checks(t.checks, checks)
