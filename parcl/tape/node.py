"""``Node``: one value in the autograd graph, and ``Function``: an op's forward and backward.

A Node carries the fields of netcl's Tape page: ``value`` (a ``pc.Tensor``), ``grad_fn``
(``upstream -> [grad per parent]``), ``parents`` (input Nodes in argument order),
``requires_grad``, ``grad`` and ``op_name``. Ops are ``Function`` subclasses: ``forward`` on raw
tensors saves what ``backward`` needs, both in one class, so reading an op tells everything.
"""

from __future__ import annotations

import os
import traceback

import numpy as np

from ..errors import AnomalyError
from ..runtime import default_queue
from ..tensor import Tensor
from . import mode

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Node:
    """A recorded value: ``value``, ``grad_fn``, ``parents``, ``requires_grad``, ``grad``,
    ``op_name``. Supports ``+ - * / @``, unary ``-`` and ``.shape``.

    >>> x = tp.tensor(pc.Tensor.from_host(q, np.array([2.0], np.float32)), requires_grad=True)
    >>> y = x * x
    """

    __slots__ = ("value", "grad_fn", "parents", "requires_grad", "grad", "op_name", "where",
                 "index", "tape", "__weakref__")
    __array_priority__ = 1000       # so `ndarray * node` defers to Node.__rmul__

    def __init__(self, value: Tensor, grad_fn=None, parents=None, requires_grad=False,
                 op_name: str = "leaf"):
        if not isinstance(value, Tensor):
            raise TypeError(f"Node value must be a pc.Tensor, got {type(value).__name__}")
        self.value = value
        self.grad_fn = grad_fn
        self.parents = list(parents) if parents else []
        self.requires_grad = bool(requires_grad)
        self.grad: Tensor | None = None
        self.op_name = op_name
        self.where = None          # "file:line in func" of the recording call (anomaly mode)
        self.index = None          # position on its tape
        self.tape = None           # weakref to the tape that recorded it; FREED once released

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
    def size(self) -> int:
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
        if self.grad is None:
            return
        if set_to_none:
            self.grad = None
        else:
            self.grad.fill_(0)

    @property
    def freed(self) -> bool:
        """Whether the tape that recorded this node was released: its graph is gone."""
        return self.tape is FREED

    def backward(self, grad: Tensor | None = None) -> None:
        """``loss.backward()``: the backward of the tape that recorded this node (a new tape's
        when none did, e.g. ops recorded with no tape current)."""
        from .tape import Tape
        recorded = self.tape() if self.tape is not None and self.tape is not FREED else None
        (recorded if recorded is not None else Tape()).backward(self, grad)

    def detach(self) -> Tensor:
        """The value, outside the graph."""
        return self.value

    def __repr__(self) -> str:
        return (f"Node(op={self.op_name}, shape={self.shape}, "
                f"requires_grad={self.requires_grad})")

    # -- operators: thin wrappers over the ops in parcl.tape.ops ------------------------
    def __add__(self, other):
        return _ops().add(self, other)

    def __radd__(self, other):
        return _ops().add(other, self)

    def __sub__(self, other):
        return _ops().sub(self, other)

    def __rsub__(self, other):
        return _ops().sub(other, self)

    def __mul__(self, other):
        return _ops().mul(self, other)

    def __rmul__(self, other):
        return _ops().mul(other, self)

    def __truediv__(self, other):
        return _ops().div(self, other)

    def __rtruediv__(self, other):
        return _ops().div(other, self)

    def __matmul__(self, other):
        return _ops().matmul(self, other)

    def __rmatmul__(self, other):
        return _ops().matmul(other, self)

    def __neg__(self):
        return _ops().neg(self)

    def sum(self, axis=None, keepdims=False):
        return _ops().sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return _ops().mean(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        return _ops().reshape(self, shape)

    # -- PyTorch conveniences: x ** y, float(x), int(x), np.asarray(x) ------------------
    def __pow__(self, other):
        return _ops().pow(self, other)

    def __rpow__(self, other):
        return _ops().pow(other, self)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(node)``: a host copy of the value (see ``pc.Tensor.__array__``)."""
        return self.value.__array__(dtype, copy)

    def __getitem__(self, key):
        """``x[key]``: basic indexing (ints, slices with steps, None, ...), ``tp.getitem``."""
        return _ops().getitem(self, key)


def _freed():
    """Stands in ``Node.tape`` for a node whose tape was released (never called)."""
    raise AssertionError("a freed node's tape is gone")


FREED = _freed


def _ops():
    from . import ops
    return ops


def host_copy(value, dtype) -> np.ndarray:
    """A C-contiguous numpy copy of a Node, a Tensor or anything array-like (state dicts take
    all three); raises TypeError/ValueError when it is not numeric."""
    if isinstance(value, Node):
        value = value.value
    if isinstance(value, Tensor):
        value = value.to_host()
    return np.array(value, dtype=dtype, order="C", copy=True)


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
    return Node(t, requires_grad=requires_grad)


def _call_site() -> str:
    """The first stack frame outside parcl: where the user recorded the op."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<parcl internal>"


def check_finite(t: Tensor, what: str, node: Node) -> None:
    """Raise AnomalyError if ``t`` holds NaN or inf (anomaly mode only: reads back to host)."""
    host = t.to_host()
    if not np.all(np.isfinite(host)):
        bad = "NaN" if np.isnan(host).any() else "inf"
        raise AnomalyError(f"{what} of op '{node.op_name}' (output shape {node.shape}) produced "
                           f"{bad}; the op was recorded at {node.where}")


#: What ``Function.backward`` returns for an input whose gradient it already added into
#: ``self.grad_targets[i]`` itself (the tape then has nothing left to accumulate).
ACCUMULATED = object()


class Function:
    """Base of every differentiable op: ``forward`` on raw tensors, ``backward`` beside it.

    ``forward(*tensors, **options)`` returns the output Tensor and saves on ``self`` what
    backward needs (only when ``self.needs_input_grad`` is not None, i.e. when recording).
    ``backward(grad)`` returns one gradient (or None) per tensor input, shaped like it.

    Before ``backward`` the tape fills ``grad_targets`` (input index -> Tensor) with the
    existing gradients of leaf inputs (a parameter's persistent ``.grad``). A backward that can
    add its result straight into one (a GEMM accumulating with ``beta=1``) may do so and return
    ``ACCUMULATED`` for that input: one pass over the gradient instead of a temporary and a
    separate ``+=``.
    """

    name = "function"
    grad_targets: dict = {}        # set per backward by the tape; never mutated in place

    def __init__(self, needs_input_grad: tuple[bool, ...] | None):
        self.needs_input_grad = needs_input_grad
        self.parent_slots: tuple[int, ...] = ()

    @property
    def recording(self) -> bool:
        return self.needs_input_grad is not None

    def forward(self, *args, **kwargs) -> Tensor:
        raise NotImplementedError

    def backward(self, grad: Tensor):
        raise NotImplementedError

    def __call__(self, upstream: Tensor) -> list:
        """grad_fn: the gradient for each parent Node, in argument order."""
        grads = self.backward(upstream)
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        return [grads[i] for i in self.parent_slots]

    @classmethod
    def apply(cls, *inputs, tape=None, **kwargs):
        """Run the op; record a Node when some input requires grad and grad mode is on (or an
        explicit ``tape`` is given), else return the raw output Tensor."""
        # The hot path of every eager op: one pass over the inputs, one read of the
        # thread's modes, and the Node built without re-checking what was checked here.
        values, needs, slots = [], [], []
        record = False
        for i, x in enumerate(inputs):
            if isinstance(x, Node):
                values.append(x.value)
                needs.append(x.requires_grad)
                slots.append(i)
                record = record or x.requires_grad
            elif x is None or isinstance(x, Tensor):
                values.append(x)
                needs.append(False)
            else:
                raise TypeError(f"{cls.name}: expected a tp.Node or pc.Tensor input, got "
                                f"{type(x).__name__}")
        state = mode.state
        if not (record and (tape is not None or state.grad)):
            return cls(None).forward(*values, **kwargs)
        fn = cls(tuple(needs))
        out = fn.forward(*values, **kwargs)
        fn.parent_slots = tuple(slots)
        node = _recorded(out, fn, [inputs[i] for i in slots], cls.name)
        if tape is None:
            tape = state.tape
        if tape is not None:
            tape.record(node)
        if state.anomaly:
            node.where = _call_site()
            check_finite(out, "forward", node)
        return node


_new = object.__new__


def _recorded(value: Tensor, fn: Function, parents: list, op_name: str) -> Node:
    """The Node of a recorded op: ``Node(value, fn, parents, True, op_name)`` without the
    checks ``Function.apply`` already made."""
    node = _new(Node)
    node.value = value
    node.grad_fn = fn
    node.parents = parents
    node.requires_grad = True
    node.grad = None
    node.op_name = op_name
    node.where = None
    node.index = None
    node.tape = None
    return node
