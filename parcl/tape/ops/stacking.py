"""PyTorch's stacking, splitting and grid builders: ``atleast_1d``/``2d``/``3d``, ``hstack``,
``vstack``, ``row_stack``, ``dstack``, ``column_stack``, ``tensor_split``, ``hsplit``,
``vsplit``, ``dsplit``, ``block_diag`` and ``combinations`` (``cartesian_prod`` is
``creation``'s, beside ``meshgrid``).

All are ``reshape`` (a view), ``cat``, ``pad``, ``expand``, ``index_select`` or slab reads
(``tensor_split``'s pieces, each its own Node as ``split``'s), so their gradients are those
ops'. The stacks and splits give new tensors where PyTorch's splits give views: parcl's buffers
start at offset 0, so a slab is a copy, and an in-place change to a piece leaves the input as it
was. ``atleast_*d`` return their input itself where it has the dims already, as PyTorch's.

>>> x = tp.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
>>> tp.hstack([x, x]).shape, tp.vstack([x, x[0]]).shape, tp.dstack([x, x]).shape
((2, 6), (3, 3), (2, 3, 2))
>>> [p.shape for p in tp.tensor_split(x, 2, dim=1)]
[(2, 2), (2, 1)]
"""

from __future__ import annotations

import itertools

import numpy as np

from ...errors import ShapeError
from ...kernels.strided import View, axis_int
from ...tensor import LABEL_DTYPES, Tensor
from ..node import Node
from .composed import _tensor
from .indexing import pad
from .join import Piece, cat, stack
from .picks import constant, index_select
from .shape import reshape, wrap_dim
from .slices import narrow

__all__ = ["atleast_1d", "atleast_2d", "atleast_3d", "block_diag",
           "column_stack", "combinations", "dsplit", "dstack", "hsplit", "hstack", "row_stack",
           "tensor_split", "vsplit", "vstack"]


def _tensors(op: str, tensors) -> tuple:
    """The operands of a variadic op: ``f(a, b)`` or ``f([a, b])``, each a Node or Tensor."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for i, t in enumerate(tensors):
        _tensor(op, f"tensor {i}", t)
    return tuple(tensors)


# -- atleast_nd ----------------------------------------------------------------------------------
def _at_least(op: str, tensors, new_shape, tape):
    single = len(tensors) == 1 and not isinstance(tensors[0], (list, tuple))
    out = tuple(t if tuple(t.shape) == new_shape(tuple(t.shape))
                else reshape(t, new_shape(tuple(t.shape)), tape=tape)
                for t in _tensors(op, tensors))
    return out[0] if single else out


def _one_d(s):
    return s if s else (1,)


def _two_d(s):
    return s if len(s) >= 2 else (1, *_one_d(s))


def _three_d(s):
    if len(s) >= 3:
        return s
    return {0: (1, 1, 1), 1: (1, *s, 1), 2: (*s, 1)}[len(s)]


def atleast_1d(*tensors, tape=None):
    """``torch.atleast_1d``: a 0-d tensor as ``(1,)``, others as they are (the same Node);
    several tensors (or one list) give a tuple. A view.

    >>> tp.atleast_1d(tp.tensor(5.0)).shape
    (1,)
    """
    return _at_least("atleast_1d", tensors, _one_d, tape)


def atleast_2d(*tensors, tape=None):
    """``torch.atleast_2d``: 0-d as ``(1, 1)``, 1-D ``(n,)`` as ``(1, n)``. A view.

    >>> tp.atleast_2d(x[0]).shape
    (1, 3)
    """
    return _at_least("atleast_2d", tensors, _two_d, tape)


def atleast_3d(*tensors, tape=None):
    """``torch.atleast_3d``: 0-d as ``(1, 1, 1)``, ``(n,)`` as ``(1, n, 1)``, ``(m, n)`` as
    ``(m, n, 1)``. A view.

    >>> tp.atleast_3d(x).shape
    (2, 3, 1)
    """
    return _at_least("atleast_3d", tensors, _three_d, tape)


# -- stacks --------------------------------------------------------------------------------------
def _sequence(op: str, tensors) -> tuple:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: expected a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise ShapeError(f"{op}: expected a non-empty sequence of tensors")
    return tuple(tensors)


def hstack(tensors, *, tape=None):
    """``torch.hstack``: joined along dim 1, or dim 0 where they are 1-D (0-d ones as 1-D).

    >>> tp.hstack([x[0], x[1]]).shape
    (6,)
    """
    ts = atleast_1d(list(_sequence("hstack", tensors)), tape=tape)
    return cat(list(ts), 0 if len(ts[0].shape) == 1 else 1, tape=tape)


def vstack(tensors, *, tape=None):
    """``torch.vstack``: joined along dim 0, 0-d and 1-D ones as rows ``(1, n)``.

    >>> tp.vstack([x[0], x[1]]).shape
    (2, 3)
    """
    return cat(list(atleast_2d(list(_sequence("vstack", tensors)), tape=tape)), 0, tape=tape)


def row_stack(tensors, *, tape=None):
    """``torch.row_stack``: ``vstack``.

    >>> tp.row_stack([x, x]).shape
    (4, 3)
    """
    return cat(list(atleast_2d(list(_sequence("row_stack", tensors)), tape=tape)), 0, tape=tape)


def dstack(tensors, *, tape=None):
    """``torch.dstack``: joined along dim 2, each first made at least 3-D (``atleast_3d``).

    >>> tp.dstack([x[0], x[1]]).shape
    (1, 3, 2)
    """
    return cat(list(atleast_3d(list(_sequence("dstack", tensors)), tape=tape)), 2, tape=tape)


def column_stack(tensors, *, tape=None):
    """``torch.column_stack``: 0-d and 1-D tensors as columns ``(n, 1)``, then joined along
    dim 1.

    >>> tp.column_stack([x[0], x[1]]).shape
    (3, 2)
    """
    ts = [reshape(t, (-1, 1), tape=tape) if len(t.shape) <= 1 else t
          for t in _tensors("column_stack", _sequence("column_stack", tensors))]
    return cat(ts, 1, tape=tape)


# -- splits --------------------------------------------------------------------------------------
class TensorSplit(Piece):
    name = "tensor_split"


def _cuts(op: str, indices_or_sections, n: int, shape, divisible: bool) -> list[tuple]:
    """``(start, length)`` of each piece of a dim of size ``n``."""
    spec = indices_or_sections
    if isinstance(spec, Node):
        spec = spec.value
    if isinstance(spec, Tensor):
        if spec.dtype not in LABEL_DTYPES or spec.ndim > 1:
            raise ShapeError(f"{op}: a tensor of indices_or_sections must be a 0-d or 1-D "
                             f"int tensor, got {spec.dtype} of shape {spec.shape}")
        host = spec.to_host()
        spec = int(host) if spec.ndim == 0 else [int(v) for v in host]
    listed = isinstance(spec, (list, tuple))
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer))
           for v in (spec if listed else (spec,))):
        raise ShapeError(f"{op}: indices_or_sections must be an int, a list of ints or an int "
                         f"tensor, got {indices_or_sections!r} (shape {shape})")
    if listed:
        bounds = [int(v) for v in spec]
        starts, stops = [0, *bounds], [*bounds, n]
        out = []
        for a, b in zip(starts, stops):
            start, stop, _ = slice(a, b).indices(n)
            out.append((start, max(0, stop - start)))
        return out
    sections = int(spec)
    if sections <= 0:
        raise ShapeError(f"{op}: the number of sections must be positive, got {sections} "
                         f"(shape {shape})")
    if divisible and n % sections:
        raise ShapeError(f"{op}: cannot split a dim of size {n} into {sections} equal "
                         f"sections (shape {shape}); give a divisor or a list of indices")
    size, extra = divmod(n, sections)
    out, start = [], 0
    for i in range(sections):
        length = size + (1 if i < extra else 0)
        out.append((start, length))
        start += length
    return out


def _split(op: str, x, spec, axis: int, divisible: bool, tape) -> tuple:
    shape = tuple(x.shape)
    whole = View.contiguous(shape)
    return tuple(TensorSplit.apply(x, tape=tape, view=whole.narrow(axis, start, length))
                 for start, length in _cuts(op, spec, shape[axis], shape, divisible))


def tensor_split(input, indices_or_sections, dim: int = 0, *, tape=None) -> tuple:  # noqa: A002
    """``torch.tensor_split``: an int ``n`` cuts ``dim`` into ``n`` pieces, the first
    ``size % n`` one longer; a list of indices cuts before each (Python slice rules: negative
    from the end, past the end empty). A tuple; each piece its own Node (op_name
    ``"tensor_split"``), a copy.

    >>> [p.shape for p in tp.tensor_split(x, [1, 5], dim=1)]
    [(2, 1), (2, 2), (2, 0)]
    """
    _tensor("tensor_split", "input", input)
    shape = tuple(input.shape)
    if not shape:
        raise ShapeError("tensor_split: expected a tensor of at least one dim, got shape ()")
    axis = wrap_dim("tensor_split", dim, len(shape), shape)
    return _split("tensor_split", input, indices_or_sections, axis, False, tape)


def _directional(op: str, x, spec, axis: int, least: int, tape) -> tuple:
    _tensor(op, "input", x)
    shape = tuple(x.shape)
    if len(shape) < least:
        raise ShapeError(f"{op}: expects a tensor of at least {least} dims, got shape {shape}")
    return _split(op, x, spec, axis, True, tape)


def hsplit(input, indices_or_sections, *, tape=None) -> tuple:  # noqa: A002
    """``torch.hsplit``: ``tensor_split`` along dim 1 (dim 0 of a 1-D tensor); an int must
    divide the dim.

    >>> [p.shape for p in tp.hsplit(x, [2])]
    [(2, 2), (2, 1)]
    """
    axis = 0 if len(getattr(input, "shape", ())) == 1 else 1
    return _directional("hsplit", input, indices_or_sections, axis, 1, tape)


def vsplit(input, indices_or_sections, *, tape=None) -> tuple:  # noqa: A002
    """``torch.vsplit``: ``tensor_split`` along dim 0 of a tensor of at least 2 dims; an int
    must divide the dim.

    >>> [p.shape for p in tp.vsplit(x, 2)]
    [(1, 3), (1, 3)]
    """
    return _directional("vsplit", input, indices_or_sections, 0, 2, tape)


def dsplit(input, indices_or_sections, *, tape=None) -> tuple:  # noqa: A002
    """``torch.dsplit``: ``tensor_split`` along dim 2 of a tensor of at least 3 dims; an int
    must divide the dim.

    >>> [p.shape for p in tp.dsplit(tp.atleast_3d(x), 1)]
    [(2, 3, 1)]
    """
    return _directional("dsplit", input, indices_or_sections, 2, 3, tape)


# -- block_diag, combinations ----------------------------------------------------
def block_diag(*tensors, tape=None):
    """``torch.block_diag``: the tensors (0-d as ``(1, 1)``, 1-D ``(n,)`` as ``(1, n)``,
    2-D) down the diagonal of a zero matrix. Each padded to the full width, then joined.

    >>> tp.block_diag(x, x[0]).shape
    (3, 6)
    """
    ts = [t if len(t.shape) == 2 else reshape(t, _two_d(tuple(t.shape)), tape=tape)
          for t in _tensors("block_diag", tensors)]
    if not ts:
        raise ShapeError("block_diag: expected at least one tensor")
    for i, t in enumerate(ts):
        if len(t.shape) > 2:
            raise ShapeError(f"block_diag: input {i} has shape {tuple(t.shape)}; expected "
                             "tensors of at most 2 dims")
    width = sum(t.shape[1] for t in ts)
    rows, left = [], 0
    for t in ts:
        cols = t.shape[1]
        rows.append(pad(t, (left, width - left - cols), tape=tape))
        left += cols
    return cat(rows, 0, tape=tape)


def _vectors(op: str, tensors) -> tuple:
    ts = _tensors(op, tensors)
    if not ts:
        raise ShapeError(f"{op}: expected at least one tensor")
    for i, t in enumerate(ts):
        if len(t.shape) != 1:
            raise ShapeError(f"{op}: expects 1-D tensors, input {i} has shape "
                             f"{tuple(t.shape)}")
    return ts


def combinations(input, r: int = 2, with_replacement: bool = False, *, tape=None):  # noqa: A002
    """``torch.combinations``: the length-``r`` combinations of a 1-D tensor's elements
    (``itertools.combinations`` order; ``with_replacement`` as
    ``itertools.combinations_with_replacement``), as rows ``(count, r)``. ``r=0`` gives an
    empty ``(0,)`` and no combination an empty ``(0, r)``, as PyTorch's. Each column is an
    ``index_select``, so repeated elements add their gradients in a fixed order.

    >>> tp.combinations(x[0]).to_host()
    array([[0., 1.],
           [0., 2.],
           [1., 2.]], dtype=float32)
    """
    (x,) = _vectors("combinations", (input,))
    r = axis_int("combinations", r, tuple(x.shape))
    if r < 0:
        raise ShapeError(f"combinations: r must be non-negative, got {r}")
    n = x.shape[0]
    pick = itertools.combinations_with_replacement if with_replacement else \
        itertools.combinations
    if r == 0:
        return narrow(x, 0, 0, 0, tape=tape)
    rows = np.array(list(pick(range(n), r)), np.int32).reshape(-1, r)
    if not rows.size:
        return reshape(narrow(x, 0, 0, 0, tape=tape), (0, r), tape=tape)
    q = x.queue
    return stack([index_select(x, 0, constant(q, np.ascontiguousarray(rows[:, k])), tape=tape)
                  for k in range(r)], 1, tape=tape)
