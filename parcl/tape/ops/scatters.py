"""Writing and reading by index along one dim: ``scatter``, ``scatter_add``, ``index_add``
and ``take_along_dim`` (PyTorch's), with gradients to the input and to the source.

The scatter kernels (``parcl/kernels/scatter.py``) walk each line of the index along the dim
in order, so repeated indices are deterministic: ``scatter_add`` and ``index_add`` sum them in
index order (bit-identical run to run) and ``scatter``, where PyTorch leaves it undefined, keeps
the value of the last one along the dim; the gradient goes to that one only (the others leave
no trace in the output). ``take_along_dim`` is ``gather`` after broadcasting.

Indices are checked on the device, as ``gather``'s (``parcl/tape/ops/gather.py``): an index
outside the dim is a ``ShapeError`` at once when the op is not recorded, else in the backward
or at the first host read of the result, whichever comes first.

>>> x = tp.tensor(np.zeros((2, 3), np.float32), requires_grad=True)
>>> i = pc.Tensor.from_host(q, np.array([[2, 2], [0, 1]]))
>>> tp.scatter_add(x, 1, i, tp.tensor(np.ones((2, 2), np.float32))).to_host()
array([[0., 0., 2.],
       [1., 1., 0.]], dtype=float32)
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import scatter as sc
from ...kernels import strided
from ...kernels.strided import View
from ...kernels.gather import broadcast_index
from ...tensor import LABEL_DTYPES, Tensor
from ..node import Function, Node
from ..tape import defer
from .gather import Gather
from .indexing import expand
from .picks import _RangeCheck
from .shape import reshape, wrap_dim

__all__ = ["index_add", "scatter", "scatter_add", "take_along_dim"]


def _same_position(full_shape, shape):
    """A flat position in ``full_shape`` to the flat position in ``shape`` (the index before
    it was broadcast to ``full_shape``, same number of dims)."""
    def where(at: int) -> int:
        coords = np.unravel_index(at, full_shape)
        return int(np.ravel_multi_index([c if s > 1 else 0 for c, s in zip(coords, shape)],
                                         shape))
    return where


class _Scatter(Function):
    """``x`` with ``scale * src`` set or added at ``index`` along ``axis``."""

    kind = "set"

    def forward(self, x: Tensor, index: Tensor, src: Tensor | None, axis: int = 0,
                value: float = 0.0, scale: float = 1.0, origin=None):
        out, flag = sc.scatter(x, axis, index, src if src is not None else value, self.kind,
                               scale, op=self.name)
        # origin: (the index as given, its position of a flat position of ``index``)
        given, where = origin or (index, lambda at: at)
        c = _RangeCheck(self.name, flag, given, x.shape[axis],
                        f"dim {axis} of size {x.shape[axis]} (input {x.shape})", where)
        c.guard(out, not self.recording)
        if self.recording:
            self.saved = (axis, index, None if src is None else src.shape, scale, c)
        return out

    def backward(self, g: Tensor):
        axis, index, src_shape, scale, c = self.saved
        defer(c.check)
        need = self.needs_input_grad
        gx = gsrc = None
        if need[0]:
            gx = g if self.kind == "add" else sc.scatter(g, axis, index, 0.0, "set",
                                                         op=self.name)[0]
        if src_shape is not None and need[2]:
            gsrc = sc.src_grad(g, axis, index, src_shape, self.kind, scale)
        return gx, None, gsrc


class Scatter(_Scatter):
    name = "scatter"


class ScatterAdd(_Scatter):
    name, kind = "scatter_add", "add"


class IndexAdd(_Scatter):
    name, kind = "index_add", "add"


def _index(op: str, index, queue) -> Tensor:
    if isinstance(index, Node):
        index = index.value
    if isinstance(index, np.ndarray):
        index = Tensor.from_host(queue, index)
    if not isinstance(index, Tensor) or index.dtype not in LABEL_DTYPES:
        what = (f"dtype {index.dtype}" if isinstance(index, Tensor)
                else type(index).__name__)
        raise DTypeError(f"{op}: index must be an int32 or int64 pc.Tensor, got {what}")
    return index


def _scatter(fn, x, dim, index, src, tape, scale: float = 1.0):
    op = fn.name
    if not isinstance(x, (Node, Tensor)):
        raise TypeError(f"{op}: expected a tp.Node or pc.Tensor input, got "
                        f"{type(x).__name__}")
    index = _index(op, index, x.queue)
    value = 0.0
    if isinstance(src, (Real, np.number)) and not isinstance(src, bool):
        src, value = None, float(src)
    elif not isinstance(src, (Node, Tensor)):
        raise TypeError(f"{op}: src must be a tp.Node, pc.Tensor or number, got "
                        f"{type(src).__name__}")
    shape = tuple(x.shape)
    ndims = (len(shape), index.ndim) + ((len(src.shape),) if src is not None else ())
    if 0 in ndims and max(ndims) <= 1:
        # PyTorch takes a 0-d input, index or src beside 1-D ones as 1-D of one element
        x, index = reshape(x, (-1,), tape=tape), index.reshape((index.size,))
        src = reshape(src, (-1,), tape=tape) if src is not None else None
    axis = wrap_dim(op, dim, len(shape), shape)
    out = fn.apply(x, index, src, tape=tape, axis=axis, value=value, scale=scale)
    return out if shape else reshape(out, (), tape=tape)


def scatter(x, dim: int, index, src, *, tape=None):
    """``torch.scatter``: a copy of ``x`` with ``src[i][j]`` written at
    ``[index[i][j]][j]`` for ``dim=0`` (and so on); ``src`` a tensor at least as large as
    ``index`` or a number. Where ``index`` names one element several times, the last along
    ``dim`` wins (PyTorch leaves it undefined) and only it receives a gradient; ``x``'s
    gradient is zero where it was overwritten. op_name ``"scatter"``.

    >>> tp.scatter(x, 1, i, 5.0).to_host()
    array([[0., 0., 5.],
           [5., 5., 0.]], dtype=float32)
    """
    return _scatter(Scatter, x, dim, index, src, tape)


def scatter_add(x, dim: int, index, src, *, tape=None):
    """``torch.scatter_add``: a copy of ``x`` with ``src[i][j]`` added at
    ``[index[i][j]][j]`` for ``dim=0`` (and so on); repeated indices add up in index order
    (bit-reproducibly). op_name ``"scatter_add"``.

    >>> rows = pc.Tensor.from_host(q, np.array([[1, 0, 1]]))
    >>> tp.scatter_add(x, 0, rows, tp.tensor(np.ones((1, 3), np.float32))).to_host()
    array([[0., 1., 0.],
           [1., 0., 1.]], dtype=float32)
    """
    if not isinstance(src, (Node, Tensor)):
        raise TypeError(f"scatter_add: src must be a tp.Node or pc.Tensor, got "
                        f"{type(src).__name__}")
    return _scatter(ScatterAdd, x, dim, index, src, tape)


def index_add(x, dim: int, index, source, alpha: float = 1, *, tape=None):
    """``torch.index_add``: a copy of ``x`` with ``alpha * source`` added at the entries
    ``index`` (1-D, int32/int64) along ``dim``; ``source`` has ``x``'s shape with
    ``len(index)`` at ``dim``. Repeated indices add up in index order. op_name
    ``"index_add"``.

    >>> tp.index_add(x, 0, pc.Tensor.from_host(q, np.array([1, 1])),
    ...              tp.tensor(np.ones((2, 3), np.float32)), alpha=2).to_host()
    array([[0., 0., 0.],
           [4., 4., 4.]], dtype=float32)
    """
    if not isinstance(x, (Node, Tensor)) or not isinstance(source, (Node, Tensor)):
        raise TypeError("index_add: input and source must be tp.Nodes or pc.Tensors, got "
                        f"{type(x).__name__} and {type(source).__name__}")
    index = _index("index_add", index, x.queue)
    shape, sshape = tuple(x.shape), tuple(source.shape)
    axis = wrap_dim("index_add", dim, len(shape), shape)
    if index.ndim > 1:
        raise ShapeError(f"index_add: index must be 0-d or 1-D, got {index.shape} (input "
                         f"{shape}, source {sshape})")
    n = index.size
    want = (*shape[:axis], n, *shape[axis + 1:]) if shape else ()
    if sshape != want or (not shape and n != 1):
        raise ShapeError(f"index_add: source {sshape} must have the input's shape {shape} "
                         f"with the index's length {n} at dim {axis} (index {index.shape})")
    if not shape:                          # a 0-d input adds as a 1-D one of one element
        x, source = reshape(x, (1,), tape=tape), reshape(source, (1,), tape=tape)
        want = (1,)
    full, where = broadcast_index(index, want, axis)
    out = IndexAdd.apply(x, full, source, tape=tape, axis=axis, scale=float(alpha),
                         origin=(index, where))
    return out if shape else reshape(out, (), tape=tape)


class TakeAlongDim(Gather):
    name = "take_along_dim"


def take_along_dim(x, indices, dim: int | None = None, *, tape=None):
    """``torch.take_along_dim``: ``x`` picked at ``indices`` along ``dim``, ``x`` and
    ``indices`` (same number of dims) broadcast against each other everywhere else; with
    ``dim=None`` both are flattened first. The gradient is summed back over repeated indices
    (in a fixed order) and over broadcasting. op_name ``"take_along_dim"``.

    >>> tp.take_along_dim(x, pc.Tensor.from_host(q, np.array([[1], [0]])), 1).shape
    (2, 1)
    """
    if not isinstance(x, (Node, Tensor)):
        raise TypeError(f"take_along_dim: expected a tp.Node or pc.Tensor input, got "
                        f"{type(x).__name__}")
    index = _index("take_along_dim", indices, x.queue)
    if dim is None:
        x, index, axis = reshape(x, (-1,), tape=tape), index.reshape((index.size,)), 0
        return TakeAlongDim.apply(x, index, tape=tape, axis=0,
                                  origin=(index, lambda at: at))
    shape, ishape = tuple(x.shape), tuple(index.shape)
    if len(shape) != len(ishape):
        raise ShapeError(f"take_along_dim: input {shape} and indices {ishape} must have the "
                         "same number of dimensions")
    if not shape:
        return reshape(take_along_dim(x, index, None, tape=tape), (), tape=tape)
    axis = wrap_dim("take_along_dim", dim, len(shape), shape)
    full = []
    for k, (a, b) in enumerate(zip(shape, ishape)):
        if k != axis and a != b and 1 not in (a, b):
            raise ShapeError(f"take_along_dim: input {shape} and indices {ishape} do not "
                             f"broadcast in dimension {k} (only dim {axis} may differ)")
        full.append(max(a, b))
    x_full = tuple(shape[axis] if k == axis else s for k, s in enumerate(full))
    i_full = tuple(ishape[axis] if k == axis else s for k, s in enumerate(full))
    if x_full != shape:
        x = expand(x, x_full, tape=tape)
    full_index = index
    if i_full != ishape:
        step = View.contiguous(ishape).strides
        full_index = strided.read_view(index, View(i_full, tuple(
            0 if s == 1 and f != 1 else st for s, f, st in zip(ishape, i_full, step))))
    return TakeAlongDim.apply(x, full_index, tape=tape, axis=axis,
                              origin=(index, _same_position(i_full, ishape)))
