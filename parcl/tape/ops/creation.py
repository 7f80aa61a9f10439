"""Tensor creation, as PyTorch's factory functions: ``zeros``, ``ones``, ``full``, ``empty``,
their ``*_like`` forms, ``arange``, ``linspace``, ``logspace``, ``eye``, ``tril_indices``,
``triu_indices`` and ``meshgrid``.

Each returns a leaf ``tp.Node`` (as ``tp.tensor``; ``requires_grad=True`` for one that collects
a gradient), written on the device: a fill, or a kernel computing each element from its index
(``parcl.kernels.creation``), never a host array of the output's size uploaded. A shape is
given as ints or one tuple (``tp.zeros(2, 3)``, ``tp.zeros((2, 3))``, ``size=(2, 3)``); the
tensor goes to ``queue=`` or else to the calling thread's default queue (``pc.default_queue``);
``dtype=`` takes numpy dtypes (float32, int32, int64), float32 unless the op's PyTorch default
is an integer (``arange`` of ints, ``full`` of an int, the triangle indices: int64).

>>> tp.zeros(2, 3).shape, tp.arange(5).to_host(), tp.linspace(0, 1, 5).to_host()
((2, 3), array([0, 1, 2, 3, 4]), array([0.  , 0.25, 0.5 , 0.75, 1.  ], dtype=float32))
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import creation as ck
from ...runtime import default_queue
from ...tensor import FLOAT, Tensor, normalize_shape
from ..node import Node
from .indexing import expand
from .join import stack
from .shape import reshape

__all__ = ["arange", "cartesian_prod", "empty", "empty_like", "eye", "full", "full_like",
           "linspace", "logspace", "meshgrid", "ones", "ones_like", "tril_indices",
           "triu_indices", "zeros", "zeros_like"]

INT64 = np.dtype(np.int64)


# -- what every factory takes: a size, a dtype, a queue, requires_grad -----------------------
def sizes(op: str, args: tuple, size=None) -> tuple[int, ...]:
    """The shape given as ints (``zeros(2, 3)``), one sequence (``zeros((2, 3))``) or
    ``size=``; PyTorch's forms."""
    if size is not None:
        if args:
            raise TypeError(f"{op}: the size given both positionally {args} and as size={size}")
        args = (size,)
    if not args:
        raise TypeError(f"{op}: missing the size (ints or one tuple), as PyTorch's")
    if len(args) == 1 and isinstance(args[0], (tuple, list, np.ndarray)):
        args = tuple(args[0])
    for a in args:
        if isinstance(a, bool) or not isinstance(a, Integral):
            raise ShapeError(f"{op}: sizes must be integers, got {args}")
    return normalize_shape(op, args)


def queue_of(queue):
    """``queue``, or this thread's default queue."""
    return default_queue() if queue is None else queue


def leaf(op: str, t: Tensor, requires_grad: bool) -> Node:
    """``t`` as a leaf Node; only float32 may require grad (as ``tp.tensor``)."""
    if requires_grad and t.dtype != FLOAT:
        raise DTypeError(f"{op}: a {t.dtype} tensor {t.shape} cannot require grad; gradients "
                         "are float32 (pass dtype=np.float32)")
    return Node(t, requires_grad=bool(requires_grad))


def value_of(op: str, x) -> Tensor:
    """The tensor of a Node or Tensor argument (what a ``*_like`` copies the shape of)."""
    if isinstance(x, Node):
        return x.value
    if isinstance(x, Tensor):
        return x
    raise TypeError(f"{op}: expected a tp.Node or pc.Tensor, got {type(x).__name__}")


def filled(op: str, q, shape, value, dtype) -> Tensor:
    """A new tensor of ``shape`` with every element ``value`` (a fill on the device)."""
    if np.ndim(value) != 0 or isinstance(value, (Node, Tensor)):
        raise TypeError(f"{op}: fill_value must be a number, got {type(value).__name__}")
    t = Tensor.empty(q, shape, dtype)
    if t.size:                       # a fill of no bytes is an OpenCL error on some devices
        t.fill_owned(value)
    return t


def _full_dtype(op: str, value, dtype):
    """PyTorch's dtype of ``full``: given, or int64 for an int value, else float32."""
    if dtype is not None:
        return dtype
    if isinstance(value, (bool, np.bool_)):
        raise DTypeError(f"{op}: a bool fill_value makes a bool tensor in PyTorch; parcl's "
                         "masks are float32 0/1 (pass dtype=np.float32)")
    return INT64 if isinstance(value, Integral) else FLOAT


# -- fills -----------------------------------------------------------------------------------
def zeros(*args, size=None, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.zeros``: a tensor of zeros (float32 unless ``dtype``).

    >>> tp.zeros(2, 3).to_host()
    array([[0., 0., 0.],
           [0., 0., 0.]], dtype=float32)
    """
    shape = sizes("zeros", args, size)
    return leaf("zeros", filled("zeros", queue_of(queue), shape, 0, dtype or FLOAT),
                requires_grad)


def ones(*args, size=None, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.ones``: a tensor of ones (float32 unless ``dtype``)."""
    shape = sizes("ones", args, size)
    return leaf("ones", filled("ones", queue_of(queue), shape, 1, dtype or FLOAT),
                requires_grad)


def full(size, fill_value, *, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.full``: every element ``fill_value``; int64 for an int value, float32 for a
    float, unless ``dtype``."""
    shape = sizes("full", (size,))
    dt = _full_dtype("full", fill_value, dtype)
    return leaf("full", filled("full", queue_of(queue), shape, fill_value, dt), requires_grad)


def empty(*args, size=None, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.empty``: a tensor whose values are whatever its memory held (write it before
    reading it)."""
    shape = sizes("empty", args, size)
    return leaf("empty", Tensor.empty(queue_of(queue), shape, dtype or FLOAT), requires_grad)


def _like(op: str, x, value, dtype, requires_grad: bool, queue) -> Node:
    t = value_of(op, x)
    q = t.queue if queue is None else queue
    dt = t.dtype if dtype is None else dtype
    out = Tensor.empty(q, t.shape, dt) if value is None else filled(op, q, t.shape, value, dt)
    return leaf(op, out, requires_grad)


def zeros_like(input, *, dtype=None, requires_grad: bool = False,  # noqa: A002
               queue=None) -> Node:
    """``torch.zeros_like``: zeros of ``input``'s shape and dtype, on its queue."""
    return _like("zeros_like", input, 0, dtype, requires_grad, queue)


def ones_like(input, *, dtype=None, requires_grad: bool = False,  # noqa: A002
              queue=None) -> Node:
    """``torch.ones_like``: ones of ``input``'s shape and dtype, on its queue."""
    return _like("ones_like", input, 1, dtype, requires_grad, queue)


def full_like(input, fill_value, *, dtype=None, requires_grad: bool = False,  # noqa: A002
              queue=None) -> Node:
    """``torch.full_like``: ``fill_value`` in ``input``'s shape and dtype, on its queue."""
    return _like("full_like", input, fill_value, dtype, requires_grad, queue)


def empty_like(input, *, dtype=None, requires_grad: bool = False,  # noqa: A002
               queue=None) -> Node:
    """``torch.empty_like``: uninitialised, of ``input``'s shape and dtype, on its queue."""
    return _like("empty_like", input, None, dtype, requires_grad, queue)


def new_tensor(q, data, dtype, requires_grad: bool) -> Node:
    """``x.new_tensor(data)`` (``Node.new_tensor``): a copy of ``data`` (numbers, nested lists,
    an array, a Node or Tensor) as ``dtype`` on ``q``."""
    if isinstance(data, Node):
        data = data.value
    dt = np.dtype(dtype)
    if isinstance(data, Tensor) and data.dtype == dt and data.queue == q:
        t = data.copy()
        t.checks = data.checks
    else:
        t = Tensor.from_host(q, np.asarray(data.to_host() if isinstance(data, Tensor) else data,
                                           dtype=dt))
    return leaf("new_tensor", t, requires_grad)


# -- ranges ----------------------------------------------------------------------------------
def _number(op: str, name: str, v) -> Real:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, Real):
        raise TypeError(f"{op}: {name} must be a number, got {type(v).__name__}")
    if not math.isfinite(v):
        raise ShapeError(f"{op}: {name} must be finite, got {v}")
    return v


def arange(start, end=None, step=1, *, dtype=None, requires_grad: bool = False,
           queue=None) -> Node:
    """``torch.arange``: ``start, start + step, ...`` up to ``end`` (excluded);
    ``arange(end)`` starts at 0. ``ceil((end - start) / step)`` elements, as PyTorch's.
    int64 when every argument is an int, else float32 (unless ``dtype``; an integer dtype
    truncates the arguments first, as PyTorch's). A zero step, or one that walks away from
    ``end``, is a ``ShapeError``.

    >>> tp.arange(1, 2.5, 0.5).to_host()
    array([1. , 1.5, 2. ], dtype=float32)
    """
    if end is None:
        start, end = 0, start
    start, end, step = (_number("arange", n, v)
                        for n, v in (("start", start), ("end", end), ("step", step)))
    if dtype is None:
        ints = all(isinstance(v, Integral) for v in (start, end, step))
        dt = INT64 if ints else FLOAT
    else:
        dt = np.dtype(dtype)
    if dt != FLOAT:                          # PyTorch computes integer ranges in integers
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise ShapeError(f"arange: step must be nonzero (start={start}, end={end})")
    if (end - start) * step < 0:
        raise ShapeError(f"arange: upper bound and lower bound inconsistent with step sign "
                         f"(start={start}, end={end}, step={step}), as PyTorch's")
    n = math.ceil((end - start) / step) if dt == FLOAT else -((start - end) // step)
    t = ck.arange(queue_of(queue), start, step, n, dt)
    return leaf("arange", t, requires_grad)


def _spaced(op: str, start, end, steps, dtype, base=None):
    _number(op, "start", start), _number(op, "end", end)
    if isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 0:
        raise ShapeError(f"{op}: steps must be a non-negative int, got {steps!r}")
    if dtype is not None and np.dtype(dtype) != FLOAT:
        raise DTypeError(f"{op}: only float32 is supported, got dtype {np.dtype(dtype)}")
    return int(steps)


def linspace(start, end, steps: int, *, dtype=None, requires_grad: bool = False,
             queue=None) -> Node:
    """``torch.linspace``: ``steps`` float32 values evenly spaced from ``start`` to ``end``,
    both included (the second half counted back from ``end``, as PyTorch's, so both ends are
    exact)."""
    steps = _spaced("linspace", start, end, steps, dtype)
    return leaf("linspace", ck.linspace(queue_of(queue), start, end, steps), requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None,
             requires_grad: bool = False, queue=None) -> Node:
    """``torch.logspace``: ``base ** linspace(start, end, steps)``, float32 (computed in
    double where the device has it, PyTorch's values)."""
    steps = _spaced("logspace", start, end, steps, dtype)
    base = _number("logspace", "base", base)
    return leaf("logspace", ck.linspace(queue_of(queue), start, end, steps, float(base)),
                requires_grad)


# -- matrices and their indices --------------------------------------------------------------
def _count(op: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, Integral) or v < 0:
        raise ShapeError(f"{op}: {name} must be a non-negative int, got {v!r}")
    return int(v)


def eye(n: int, m: int | None = None, *, dtype=None, requires_grad: bool = False,
        queue=None) -> Node:
    """``torch.eye``: the ``n x m`` (``n x n``) identity: ones on the main diagonal."""
    n = _count("eye", "n", n)
    m = n if m is None else _count("eye", "m", m)
    return leaf("eye", ck.eye(queue_of(queue), n, m, dtype or FLOAT), requires_grad)


def _triangle(op: str, row, col, offset, dtype, queue, upper: bool) -> Node:
    row, col = _count(op, "row", row), _count(op, "col", col)
    if isinstance(offset, bool) or not isinstance(offset, Integral):
        raise ShapeError(f"{op}: offset must be an int, got {offset!r}")
    dt = INT64 if dtype is None else np.dtype(dtype)
    if dt == FLOAT:
        raise DTypeError(f"{op}: indices are int32 or int64, got dtype float32")
    return leaf(op, ck.tri_indices(queue_of(queue), row, col, int(offset), upper, dt), False)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, queue=None) -> Node:
    """``torch.tril_indices``: the ``(2, N)`` int64 row and column indices of the lower
    triangle of a ``row x col`` matrix (``offset`` diagonals above the main one included;
    negative: below), row by row."""
    return _triangle("tril_indices", row, col, offset, dtype, queue, upper=False)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, queue=None) -> Node:
    """``torch.triu_indices``: the upper triangle's (from ``offset`` diagonals above the main
    one), as ``tril_indices``."""
    return _triangle("triu_indices", row, col, offset, dtype, queue, upper=True)


def meshgrid(*tensors, indexing: str = "ij", tape=None) -> tuple:
    """``torch.meshgrid``: from 0-d or 1-D tensors of lengths ``n0, n1, ...`` the grids
    ``(n0, n1, ...)`` where grid ``i`` repeats tensor ``i`` along its own dim; with
    ``indexing="xy"`` the first two dims swap (``(n1, n0, ...)``, numpy's default). Each grid
    is an ``expand`` of its tensor, so gradients sum back to it (integer grids are copies).

    >>> gx, gy = tp.meshgrid(tp.arange(3.0), tp.arange(2.0), indexing="xy")
    >>> gx.shape
    (2, 3)
    """
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ShapeError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if not tensors:
        raise ShapeError("meshgrid: expects a non-empty list of tensors")
    for i, t in enumerate(tensors):
        value = value_of("meshgrid", t)
        if value.ndim > 1:
            raise ShapeError(f"meshgrid: expects 0-D or 1-D tensors, tensor {i} has shape "
                             f"{value.shape}")
        if value.dtype != value_of("meshgrid", tensors[0]).dtype:
            raise DTypeError(f"meshgrid: expects all tensors to have the same dtype, tensor "
                             f"{i} is {value.dtype}, tensor 0 {tensors[0].dtype}")
    swap = indexing == "xy" and len(tensors) > 1
    order = (1, 0, *range(2, len(tensors))) if swap else tuple(range(len(tensors)))
    ordered = [tensors[i] for i in order]
    shape = tuple(value_of("meshgrid", t).size for t in ordered)     # a 0-d tensor: 1
    grids = []
    for d, t in enumerate(ordered):
        value = value_of("meshgrid", t)
        if value.dtype != FLOAT:          # integers: copied along, no gradient to carry
            grids.append(ck.grid(value, shape, d))
            continue
        view = [1] * len(shape)
        view[d] = shape[d]
        grids.append(expand(reshape(t, tuple(view), tape=tape), shape, tape=tape))
    return tuple(grids[order.index(i)] for i in range(len(tensors)))


def cartesian_prod(*tensors, tape=None):
    """``torch.cartesian_prod``: the ``(n0 * n1 * ..., k)`` rows of every combination of the
    elements of ``k`` 1-D tensors, the last varying fastest (``itertools.product``); one
    tensor is returned as it is. The columns of ``meshgrid``'s grids, so gradients sum back.

    >>> tp.cartesian_prod(tp.arange(2), tp.arange(3)).shape
    (6, 2)
    """
    for i, t in enumerate(tensors):
        if value_of("cartesian_prod", t).ndim != 1:
            raise ShapeError(f"cartesian_prod: expects 1-D tensors, tensor {i} has shape "
                             f"{tuple(t.shape)}")
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij", tape=tape)
    return stack([reshape(g, (-1,), tape=tape) for g in grids], 1, tape=tape)
