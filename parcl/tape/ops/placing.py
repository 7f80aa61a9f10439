"""PyTorch's selecting and placing ops: ``select``, ``select_scatter``, ``slice_scatter``,
``diagonal_scatter``, ``diag_embed``, ``diagflat``, ``take``, ``masked_select``,
``masked_scatter``, ``index_copy`` and ``index_fill``.

The ``*_scatter`` ops are one class: ``input`` copied, and ``src`` written into a strided view
of the copy (a row, a slice with a step, a diagonal); the backward reads the gradient of
``src`` out of that view and passes ``input``'s elsewhere (zeros in the view). ``diag_embed``
writes into a view of zeros. ``take`` is ``gather`` on the flattened input, ``index_copy`` and
``index_fill`` are ``scatter`` with the 1-D index repeated along the other dims, so their index
checks and fixed-order gradients are those ops'. ``masked_select`` and ``masked_scatter``
read the mask back to the host (a wait, as PyTorch's: the result's size or the source
positions depend on it) and are then ``take`` and ``where``.

Where PyTorch's ``select`` returns a view, parcl's is a copy (an in-place change to it leaves
the input as it was). Negative indices count from the end for ``select``, and for ``take`` and
``index_fill`` where the indices are host values (numpy arrays, lists); indices on the device
must lie in ``[0, size)`` there (checked on the device, as ``gather``'s).

>>> x = tp.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
>>> tp.select(x, 1, -1).to_host(), tp.take(x, np.array([[0, -1]])).to_host()
(array([2., 5.], dtype=float32), array([[0., 5.]], dtype=float32))
>>> tp.slice_scatter(x, tp.tensor(np.zeros((2, 2), np.float32)), 1, step=2).to_host()
array([[0., 1., 0.],
       [0., 4., 0.]], dtype=float32)
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import strided
from ...kernels.strided import IndexOutOfRangeError, View, axis_int
from ...kernels.gather import broadcast_index
from ...tensor import LABEL_DTYPES, Tensor
from ..node import Function, Node
from .composed import _tensor
from .diagonals import DiagEmbed, _offset, diag
from .gather import Gather
from .indexing import expand
from .scatters import Scatter
from .select import where
from .shape import reshape, wrap_dim
from .slices import Slab, narrow

__all__ = ["diag_embed", "diagflat", "diagonal_scatter", "index_copy", "index_fill",
           "masked_scatter", "masked_select", "select", "select_scatter", "slice_scatter",
           "take"]


# -- views of one dim, a slice, a diagonal -------------------------------------------------------
def _row_view(op: str, shape, dim, index) -> View:
    """The elements at ``index`` of dim ``dim`` (that dim removed)."""
    if not shape:
        raise ShapeError(f"{op}: cannot select from a 0-d tensor")
    axis = wrap_dim(op, dim, len(shape), shape)
    n = shape[axis]
    i = axis_int(op, index, shape)
    if not -n <= i < n:
        raise IndexOutOfRangeError(f"{op}: index {i} is out of range for dim {axis} of size "
                                   f"{n} (shape {shape}); expected an index in [{-n}, {n})")
    whole = View.contiguous(shape)
    s = whole.strides
    keep = [k for k in range(len(shape)) if k != axis]
    return View(tuple(shape[k] for k in keep), tuple(s[k] for k in keep), (i % n) * s[axis])


def _slice_view(op: str, shape, dim, start, end, step) -> View:
    if not shape:
        raise ShapeError(f"{op}: cannot slice a 0-d tensor")
    axis = wrap_dim(op, dim, len(shape), shape)
    step = axis_int(op, step, shape)
    if step <= 0:
        raise ShapeError(f"{op}: step must be positive, got {step} (shape {shape})")
    first, stop, _ = slice(start, end, step).indices(shape[axis])
    length = len(range(first, stop, step))
    whole = View.contiguous(shape)
    s = whole.strides
    return View(tuple(length if k == axis else v for k, v in enumerate(shape)),
                tuple(step * v if k == axis else v for k, v in enumerate(s)), first * s[axis])


def _diagonal_view(op: str, shape, offset, dim1, dim2) -> View:
    if len(shape) < 2:
        raise ShapeError(f"{op}: expects a tensor of at least 2 dims, got shape {shape}")
    d1, d2 = wrap_dim(op, dim1, len(shape), shape), wrap_dim(op, dim2, len(shape), shape)
    if d1 == d2:
        raise ShapeError(f"{op}: dim1 and dim2 are both dim {d1} (shape {shape})")
    offset = _offset(op, offset)
    row, col = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(shape[d1] - row, shape[d2] - col))
    s = View.contiguous(shape).strides
    others = [k for k in range(len(shape)) if k not in (d1, d2)]
    return View((*(shape[k] for k in others), length),
                (*(s[k] for k in others), s[d1] + s[d2]),
                (row * s[d1] + col * s[d2]) if length else 0)


def select(input, dim: int, index: int, *, tape=None):  # noqa: A002
    """``torch.select``: the slice at ``index`` (negative from the end) of dim ``dim``, that
    dim removed: ``x[:, index]`` for ``dim=1``. A copy (PyTorch's is a view). An index out of
    range is a ``ShapeError`` (also an ``IndexError``). op_name ``"select"``.

    >>> tp.select(x, 0, 1).to_host()
    array([3., 4., 5.], dtype=float32)
    """
    _tensor("select", "input", input)
    view = _row_view("select", tuple(input.shape), dim, index)
    return Select.apply(input, tape=tape, view=view, shape=view.shape)


class Select(Slab):
    name = "select"


class _ViewScatter(Function):
    """``input`` with ``src`` written into ``view`` of it."""

    def forward(self, x: Tensor, src: Tensor, view: View | None = None):
        if src.dtype != x.dtype:
            raise DTypeError(f"{self.name}: src has dtype {src.dtype}, input {x.dtype}")
        if tuple(src.shape) != view.shape:
            raise ShapeError(f"{self.name}: src has shape {src.shape}, expected {view.shape} "
                             f"for input {x.shape}")
        self.view = view
        out = x.copy()
        return strided.copy_view(out, view, src, View.contiguous(view.shape))

    def backward(self, g: Tensor):
        gx = gsrc = None
        need = self.needs_input_grad
        if need[0]:
            gx = g.copy()
            zeros = Tensor.zeros(g.queue, self.view.shape, g.dtype)
            strided.copy_view(gx, self.view, zeros, View.contiguous(self.view.shape))
        if need[1]:
            gsrc = strided.read_view(g, self.view)
        return gx, gsrc


class SelectScatter(_ViewScatter):
    name = "select_scatter"


class SliceScatter(_ViewScatter):
    name = "slice_scatter"


class DiagonalScatter(_ViewScatter):
    name = "diagonal_scatter"


def _scatter_args(op: str, input, src):
    _tensor(op, "input", input)
    _tensor(op, "src", src)
    return tuple(input.shape)


def select_scatter(input, src, dim: int, index: int, *, tape=None):  # noqa: A002
    """``torch.select_scatter``: a copy of ``input`` with ``src`` (``input``'s shape without
    ``dim``) written at ``index`` of dim ``dim``. Gradients to both.

    >>> tp.select_scatter(x, tp.tensor(np.zeros(2, np.float32)), 1, 0).to_host()[:, 0]
    array([0., 0.], dtype=float32)
    """
    shape = _scatter_args("select_scatter", input, src)
    return SelectScatter.apply(input, src, tape=tape,
                               view=_row_view("select_scatter", shape, dim, index))


def slice_scatter(input, src, dim: int = 0, start: int | None = None,  # noqa: A002
                  end: int | None = None, step: int = 1, *, tape=None):
    """``torch.slice_scatter``: a copy of ``input`` with ``src`` written into
    ``input[start:end:step]`` along ``dim`` (Python slice rules; ``step`` positive).

    >>> tp.slice_scatter(x, tp.tensor(np.ones((1, 3), np.float32)), start=-1).to_host()[1]
    array([1., 1., 1.], dtype=float32)
    """
    shape = _scatter_args("slice_scatter", input, src)
    return SliceScatter.apply(input, src, tape=tape,
                              view=_slice_view("slice_scatter", shape, dim, start, end, step))


def diagonal_scatter(input, src, offset: int = 0, dim1: int = 0, dim2: int = 1,  # noqa: A002
                     *, tape=None):
    """``torch.diagonal_scatter``: a copy of ``input`` with ``src`` written onto its diagonal
    ``offset`` of ``dim1`` and ``dim2`` (``src`` shaped as ``tp.diagonal``'s result).

    >>> tp.diagonal_scatter(x, tp.tensor(np.array([9.0, 9.0], np.float32))).to_host()[1]
    array([3., 9., 5.], dtype=float32)
    """
    shape = _scatter_args("diagonal_scatter", input, src)
    return DiagonalScatter.apply(input, src, tape=tape, view=_diagonal_view(
        "diagonal_scatter", shape, offset, dim1, dim2))


# -- diag_embed and diagflat ---------------------------------------------------------------------
class DiagEmbedded(DiagEmbed):
    name = "diag_embed"


def diag_embed(input, offset: int = 0, dim1: int = -2, dim2: int = -1, *, tape=None):  # noqa: A002
    """``torch.diag_embed``: the last dim of ``input`` written onto diagonal ``offset`` of the
    new dims ``dim1`` and ``dim2`` (of size ``n + |offset|``) of a zero tensor with one more
    dim; the other dims are ``input``'s leading ones, in order.

    >>> tp.diag_embed(x).shape
    (2, 3, 3)
    """
    _tensor("diag_embed", "input", input)
    shape = tuple(input.shape)
    if not shape:
        raise ShapeError("diag_embed: expects a tensor of at least 1 dim, got shape ()")
    nd = len(shape) + 1
    d1, d2 = wrap_dim("diag_embed", dim1, nd, shape), wrap_dim("diag_embed", dim2, nd, shape)
    if d1 == d2:
        raise ShapeError(f"diag_embed: dim1 and dim2 are both dim {d1} of the result (input "
                         f"{shape})")
    k = _offset("diag_embed", offset)
    m = shape[-1] + abs(k)
    batch = iter(shape[:-1])
    out_shape = tuple(m if j in (d1, d2) else next(batch) for j in range(nd))
    s = View.contiguous(out_shape).strides
    others = [j for j in range(nd) if j not in (d1, d2)]
    row, col = (0, k) if k >= 0 else (-k, 0)
    view = View(shape, (*(s[j] for j in others), s[d1] + s[d2]), row * s[d1] + col * s[d2])
    return DiagEmbedded.apply(input, tape=tape, view=view, shape=out_shape)


def diagflat(input, offset: int = 0, *, tape=None):  # noqa: A002
    """``torch.diagflat``: ``input`` flattened onto diagonal ``offset`` of a square zero
    matrix (``tp.diag`` of the flattened input).

    >>> tp.diagflat(x).shape
    (6, 6)
    """
    _tensor("diagflat", "input", input)
    return diag(reshape(input, (-1,), tape=tape), offset, tape=tape)


# -- take, masked_select, masked_scatter ---------------------------------------------------------
class Take(Gather):
    name = "take"


def _host_or_device_index(op: str, index, n: int, queue) -> Tensor:
    """An int32/int64 device index; host values (numpy, lists) with negatives wrapped by
    ``n`` first, as PyTorch wraps them (out-of-range ones are left to the device check)."""
    if isinstance(index, Node):
        index = index.value
    if isinstance(index, Tensor):
        if index.dtype not in LABEL_DTYPES:
            raise DTypeError(f"{op}: index must be int32 or int64, got {index.dtype}")
        return index
    host = np.asarray(index)
    if host.dtype.kind not in "iu":
        raise DTypeError(f"{op}: index must hold integers, got {host.dtype}")
    host = np.where((host < 0) & (host >= -n), host + n, host).astype(np.int64)
    return Tensor.from_host(queue, host)


def take(input, index, *, tape=None):  # noqa: A002
    """``torch.take``: the elements of ``input`` flattened at ``index`` (any shape; the
    result has its shape). Host indices may be negative (from the end); an index out of
    range is a ``ShapeError`` naming ``take`` (checked on the device, as ``gather``'s).
    Repeated indices add their gradients in a fixed order. op_name ``"take"``.

    >>> tp.take(x, np.array([5, 0])).to_host()
    array([5., 0.], dtype=float32)
    """
    _tensor("take", "input", input)
    n = int(np.prod(tuple(input.shape), dtype=np.int64))
    idx = _host_or_device_index("take", index, n, input.queue)
    flat = reshape(input, (-1,), tape=tape)
    out = Take.apply(flat, idx.reshape((idx.size,)), tape=tape, axis=0,
                     origin=(idx, lambda at: at))
    return reshape(out, tuple(idx.shape), tape=tape)


def _host_mask(op: str, mask, queue) -> np.ndarray:
    if isinstance(mask, Node):
        mask = mask.value
    if isinstance(mask, Tensor):
        return mask.to_host() != 0
    if isinstance(mask, np.ndarray):
        return mask != 0
    raise TypeError(f"{op}: mask must be a numpy array, pc.Tensor or tp.Node, got "
                    f"{type(mask).__name__}")


def masked_select(input, mask, *, tape=None):  # noqa: A002
    """``torch.masked_select``: the elements of ``input`` where ``mask`` (nonzero is True)
    holds, ``input`` and ``mask`` broadcast together, as a 1-D tensor in row-major order. The
    mask is read back to the host (a wait, as PyTorch's). The gradient goes back to the
    selected elements. op_name ``"take"``.

    >>> tp.masked_select(x, np.array([True, False, True])).to_host()
    array([0., 2., 3., 5.], dtype=float32)
    """
    _tensor("masked_select", "input", input)
    host = _host_mask("masked_select", mask, input.queue)
    shape = _broadcast("masked_select", tuple(input.shape), host.shape)
    full = input if tuple(input.shape) == shape else expand(input, shape, tape=tape)
    picks = np.flatnonzero(np.broadcast_to(host, shape))
    if not picks.size:
        return narrow(reshape(full, (-1,), tape=tape), 0, 0, 0, tape=tape)
    return take(full, picks, tape=tape)


def _broadcast(op: str, a, b) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise ShapeError(f"{op}: input {a} and mask {b} do not broadcast") from None


def masked_scatter(input, mask, source, *, tape=None):  # noqa: A002
    """``torch.masked_scatter``: ``input`` (broadcast with ``mask``) with the elements of
    ``source``, in order, written where ``mask`` is nonzero; ``source`` needs at least as
    many elements as the mask has. The mask is read back to the host (a wait). Gradients to
    ``input`` (where the mask is False) and to ``source``'s elements used.

    >>> tp.masked_scatter(x, np.array([False, True, False]), tp.tensor(np.array([7.0, 8.0]))
    ...                   ).to_host()
    array([[0., 7., 2.],
           [3., 8., 5.]], dtype=float32)
    """
    _tensor("masked_scatter", "input", input)
    _tensor("masked_scatter", "source", source)
    host = _host_mask("masked_scatter", mask, input.queue)
    shape = _broadcast("masked_scatter", tuple(input.shape), host.shape)
    full_mask = np.broadcast_to(host, shape)
    count = int(full_mask.sum())
    available = int(np.prod(tuple(source.shape), dtype=np.int64))
    if count > available:
        raise ShapeError(f"masked_scatter: the mask {host.shape} has {count} True elements but "
                         f"source {tuple(source.shape)} only {available}; source needs at "
                         "least one element per True")
    full = input if tuple(input.shape) == shape else expand(input, shape, tape=tape)
    if not count:
        return where(np.ascontiguousarray(full_mask), 0.0, full, tape=tape)
    positions = np.zeros(full_mask.size, np.int64)
    positions[full_mask.reshape(-1)] = np.arange(count)
    picked = take(source, positions.reshape(shape), tape=tape)
    return where(np.ascontiguousarray(full_mask), picked, full, tape=tape)


# -- index_copy, index_fill ----------------------------------------------------------------------
class IndexCopy(Scatter):
    name = "index_copy"


class IndexFill(Scatter):
    name = "index_fill"


def _line_index(op: str, input, dim, index, wrap: bool):
    """``(axis, index)``: the dim and the 0-d or 1-D int index (host values wrapped where
    ``wrap``), checked."""
    shape = tuple(input.shape)
    axis = wrap_dim(op, dim, len(shape), shape)
    n = shape[axis] if shape else 1
    if wrap:
        index = _host_or_device_index(op, index, n, input.queue)
    else:
        if isinstance(index, Node):
            index = index.value
        if isinstance(index, (np.ndarray, list, tuple)):
            index = Tensor.from_host(input.queue, np.asarray(index, np.int64))
        if not isinstance(index, Tensor) or index.dtype not in LABEL_DTYPES:
            raise DTypeError(f"{op}: index must be an int32 or int64 tensor or array")
    if index.ndim > 1:
        raise ShapeError(f"{op}: index must be 0-d or 1-D, got {index.shape} (input {shape})")
    return axis, index


def index_copy(input, dim: int, index, source, *, tape=None):  # noqa: A002
    """``torch.index_copy``: a copy of ``input`` with ``source``'s slices written at the
    entries ``index`` (0-d or 1-D, in ``[0, size)``) along ``dim``; ``source`` has
    ``input``'s shape with ``len(index)`` at ``dim``. Where an index repeats, the last one
    wins (PyTorch leaves it undefined) and gets the gradient. op_name ``"index_copy"``.

    >>> tp.index_copy(x, 1, np.array([2]), tp.tensor(np.zeros((2, 1), np.float32))).to_host()
    array([[0., 1., 0.],
           [3., 4., 0.]], dtype=float32)
    """
    _tensor("index_copy", "input", input)
    _tensor("index_copy", "source", source)
    shape, sshape = tuple(input.shape), tuple(source.shape)
    if not shape:
        raise ShapeError("index_copy: expects an input of at least 1 dim, got shape ()")
    axis, idx = _line_index("index_copy", input, dim, index, wrap=False)
    want = (*shape[:axis], idx.size, *shape[axis + 1:])
    if sshape != want:
        raise ShapeError(f"index_copy: source {sshape} must have the input's shape {shape} "
                         f"with the index's length {idx.size} at dim {axis}")
    full, at = broadcast_index(idx, want, axis)
    return IndexCopy.apply(input, full, source, tape=tape, axis=axis, origin=(idx, at))


def index_fill(input, dim: int, index, value, *, tape=None):  # noqa: A002
    """``torch.index_fill``: a copy of ``input`` with ``value`` (a number, or a 0-d Node or
    Tensor, which then gets the gradient of the filled elements) at the entries ``index``
    along ``dim`` (host indices may be negative). op_name ``"index_fill"`` (``"where"`` for a
    tensor value).

    >>> tp.index_fill(x, 0, np.array([-1]), 9.0).to_host()
    array([[0., 1., 2.],
           [9., 9., 9.]], dtype=float32)
    """
    _tensor("index_fill", "input", input)
    shape = tuple(input.shape)
    if not shape:
        raise ShapeError("index_fill: expects an input of at least 1 dim, got shape ()")
    axis, idx = _line_index("index_fill", input, dim, index, wrap=True)
    want = (*shape[:axis], idx.size, *shape[axis + 1:])
    full, at = broadcast_index(idx, want, axis)
    if isinstance(value, (Node, Tensor)):
        if tuple(value.shape):
            raise ShapeError(f"index_fill: value must be a number or a 0-d tensor, got shape "
                             f"{tuple(value.shape)} (input {shape})")
        raw = input.value if isinstance(input, Node) else input
        mask = IndexFill.apply(Tensor.zeros(raw.queue, shape), full, None, axis=axis,
                               value=1.0, origin=(idx, at))
        return where(mask, value, input, tape=tape)
    if isinstance(value, bool) or not isinstance(value, (Real, np.number)):
        raise DTypeError(f"index_fill: value must be a number or a 0-d tensor, got "
                         f"{type(value).__name__}")
    return IndexFill.apply(input, full, None, tape=tape, axis=axis, value=float(value),
                           origin=(idx, at))
