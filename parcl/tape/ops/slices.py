"""PyTorch's slicing and tiling ops: ``narrow``, ``chunk``, ``unbind``, ``roll``, ``repeat``,
``tile``, ``tril`` and ``triu``.

All are strided copies (``parcl.kernels.strided``) or a select against a triangular mask, with
the copy the other way as the backward: ``narrow``/``chunk``/``unbind`` read a slab (each
piece its own Node, as ``split``'s), ``roll`` copies two slabs per rolled dim, ``repeat`` reads
its input through stride-0 views and its backward sums the gradient over the repeats. The
results are new contiguous tensors: parcl's buffers start at offset 0, so a slab is not a view.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3)), True)
>>> tp.narrow(x, 1, 1, 2).shape, [p.shape for p in tp.chunk(x, 2, 1)]
((2, 2), [(2, 2), (2, 1)])
>>> tp.repeat(x, 2, 1).shape, tp.roll(x, 1, 1).to_host()[0]
((4, 3), array([2., 0., 1.], dtype=float32))
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...kernels import elementwise as ew
from ...kernels import reduction as rd
from ...kernels import select as sk
from ...kernels import strided
from ...kernels.strided import View, axis_int
from ...tensor import Tensor, dims
from ..node import Function
from .shape import wrap_dim

__all__ = ["chunk", "narrow", "repeat", "roll", "tile", "tril", "triu", "unbind"]


class Slab(Function):
    """One slab ``view`` of ``x`` as a new tensor of ``shape``; the backward writes the
    gradient into that slab of a zero tensor."""

    name = "narrow"

    def forward(self, x: Tensor, view: View | None = None, shape=()):
        self.in_shape, self.view = x.shape, view
        return strided.view_copy(strided.read_view(x, view).reshape(shape), x, self.name)

    def backward(self, g: Tensor):
        return strided.write_view(g, self.in_shape, self.view)


class Chunk(Slab):
    name = "chunk"


class Unbind(Slab):
    name = "unbind"


def _shape_of(op: str, x) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: expected a tp.Node or pc.Tensor input, got {type(x).__name__}")
    return tuple(x.shape)


def narrow(x, dim: int, start: int, length: int, *, tape=None):
    """``torch.narrow``: elements ``start .. start+length`` along ``dim`` (``start`` negative
    from the end) as a new tensor. op_name ``"narrow"``.

    >>> tp.narrow(x, 0, -1, 1).shape
    (1, 3)
    """
    shape = _shape_of("narrow", x)
    if not shape:
        raise ShapeError("narrow: cannot be applied to a 0-d tensor")
    axis = wrap_dim("narrow", dim, len(shape), shape)
    n = shape[axis]
    start, length = axis_int("narrow", start, shape), axis_int("narrow", length, shape)
    if not -n <= start <= n:
        raise ShapeError(f"narrow: start {start} is out of range for dim {axis} of size {n} "
                         f"(shape {shape}; expected start in [{-n}, {n}])")
    if start < 0:
        start += n
    if length < 0 or start + length > n:
        raise ShapeError(f"narrow: start {start} + length {length} does not fit dim {axis} of "
                         f"size {n} (shape {shape}; length must be in [0, {n - start}])")
    view = View.contiguous(shape).narrow(axis, start, length)
    return Slab.apply(x, tape=tape, view=view, shape=view.shape)


def chunk(x, chunks: int, dim: int = 0, *, tape=None) -> tuple:
    """``torch.chunk``: ``x`` cut along ``dim`` into pieces of ``ceil(size / chunks)`` (the last
    may be smaller, and there may be fewer than ``chunks``). A tuple; each piece is its own
    Node (op_name ``"chunk"``).

    >>> [p.shape for p in tp.chunk(x, 3, 1)]
    [(2, 1), (2, 1), (2, 1)]
    """
    shape = _shape_of("chunk", x)
    chunks = axis_int("chunk", chunks, shape)
    if chunks <= 0:
        raise ShapeError(f"chunk: chunks must be positive, got {chunks} (shape {shape})")
    if not shape:
        raise ShapeError("chunk: expects at least a 1-dimensional tensor, got shape ()")
    axis = wrap_dim("chunk", dim, len(shape), shape)
    n = shape[axis]
    size = -(-n // chunks)
    whole = View.contiguous(shape)
    if n == 0:                                 # PyTorch: `chunks` empty pieces
        views = [whole.narrow(axis, 0, 0)] * chunks
    else:
        views = [whole.narrow(axis, s, min(size, n - s)) for s in range(0, n, size)]
    return tuple(Chunk.apply(x, tape=tape, view=v, shape=v.shape) for v in views)


def unbind(x, dim: int = 0, *, tape=None) -> tuple:
    """``torch.unbind``: the slices of ``x`` along ``dim``, that dim removed. A tuple; each
    slice is its own Node (op_name ``"unbind"``).

    >>> [r.shape for r in tp.unbind(x)]
    [(3,), (3,)]
    """
    shape = _shape_of("unbind", x)
    if not shape:
        raise ShapeError("unbind: a 0-d tensor has no dimension to unbind")
    axis = wrap_dim("unbind", dim, len(shape), shape)
    whole, rest = View.contiguous(shape), shape[:axis] + shape[axis + 1:]
    return tuple(Unbind.apply(x, tape=tape, view=whole.narrow(axis, i, 1), shape=rest)
                 for i in range(shape[axis]))


# -- roll -----------------------------------------------------------------------------------------
def _rolled(x: Tensor, shifts: tuple, axes: tuple) -> Tensor:
    """``x`` rolled by ``shifts[i]`` along ``axes[i]``, one dim after the other (each two slab
    copies); ``axes`` None rolls the flattened tensor."""
    if axes is None:
        return _rolled(x.reshape((x.size,)), shifts, (0,)).reshape(x.shape)
    whole = View.contiguous(x.shape)
    for shift, axis in zip(shifts, axes):
        n = x.shape[axis]
        s = shift % n if n else 0
        if s == 0:
            continue
        out = Tensor.empty(x.queue, x.shape, x.dtype)
        strided.copy_view(out, whole.narrow(axis, s, n - s), x, whole.narrow(axis, 0, n - s))
        strided.copy_view(out, whole.narrow(axis, 0, s), x, whole.narrow(axis, n - s, s))
        x = out
    return x if x.shape else x.reshape(())


class Roll(Function):
    name = "roll"

    def forward(self, x: Tensor, shifts=(), dims=None):
        self.shifts, self.axes = shifts, dims
        if x.size == 0:                                  # nothing to move (nor to copy)
            return Tensor.empty(x.queue, x.shape, x.dtype)
        out = _rolled(x, shifts, dims)
        return x.copy() if out.data is x.data else out   # a new buffer even for no shift

    def backward(self, g: Tensor):
        if g.size == 0:
            return Tensor.empty(g.queue, g.shape)
        return _rolled(g, tuple(-s for s in self.shifts), self.axes)


def roll(x, shifts, dims=None, *, tape=None):
    """``torch.roll``: elements shifted by ``shifts`` along ``dims`` (ints or equally long
    tuples; a dim may repeat), wrapping around; ``dims=None`` rolls the flattened tensor by
    one shift. op_name ``"roll"``.

    >>> tp.roll(x, (1, -1), (0, 1)).to_host()[0]
    array([4., 5., 3.], dtype=float32)
    """
    shape = _shape_of("roll", x)
    shift_t = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    shift_t = tuple(axis_int("roll", s, shape) for s in shift_t)
    if dims is None:
        if len(shift_t) != 1:
            raise ShapeError(f"roll: without dims, shifts must be one int, got {shifts} "
                             f"(shape {shape})")
        return Roll.apply(x, tape=tape, shifts=shift_t, dims=None)
    dim_t = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if not shift_t or len(shift_t) != len(dim_t):
        raise ShapeError(f"roll: shifts {shifts} and dims {dims} must be equally long and "
                         f"non-empty (shape {shape})")
    if not shape:
        raise ShapeError("roll: a 0-d tensor has no dims to roll along; use dims=None")
    axes = tuple(wrap_dim("roll", d, len(shape), shape) for d in dim_t)
    return Roll.apply(x, tape=tape, shifts=shift_t, dims=axes)


# -- repeat and tile ------------------------------------------------------------------------------
class Repeat(Function):
    """``out`` viewed as ``(r0, s0, r1, s1, ...)`` is ``x`` read with stride 0 along each
    ``r``; the backward sums the gradient over those axes."""

    name = "repeat"

    def forward(self, x: Tensor, sizes=()):
        lead = len(sizes) - x.ndim
        padded = (1,) * lead + tuple(x.shape)
        base = View.contiguous(padded)
        split = tuple(v for pair in zip(sizes, padded) for v in pair)
        src = View(split, tuple(v for st in base.strides for v in (0, st)))
        out = Tensor.empty(x.queue, tuple(r * s for r, s in zip(sizes, padded)), x.dtype)
        strided.copy_view(out, View.contiguous(split), x, src)
        self.in_shape, self.split = x.shape, split
        return out

    def backward(self, g: Tensor):
        axes = tuple(range(0, len(self.split), 2))
        return rd.sum(g.reshape(self.split), axes).reshape(self.in_shape)


def _sizes(op: str, sizes, shape) -> tuple[int, ...]:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    sizes = dims(op, sizes)
    if any(s < 0 for s in sizes):
        raise ShapeError(f"{op}: sizes {sizes} must be non-negative (shape {shape})")
    return sizes


def repeat(x, *sizes, tape=None):
    """``torch.Tensor.repeat``: ``x`` repeated ``sizes[i]`` times along dim ``i``; ``sizes``
    (ints or one sequence) has at least ``x``'s number of dims, more add leading dims. The
    gradient is summed over the repeats. op_name ``"repeat"``.

    >>> tp.repeat(x, 2, 1, 2).shape
    (2, 2, 6)
    """
    shape = _shape_of("repeat", x)
    sizes = _sizes("repeat", sizes, shape)
    if len(sizes) < len(shape):
        raise ShapeError(f"repeat: {len(sizes)} sizes {sizes} for a tensor of {len(shape)} "
                         f"dims (shape {shape}); give at least one per dim (tp.tile pads them)")
    return Repeat.apply(x, tape=tape, sizes=sizes)


def tile(x, dims, *, tape=None):
    """``torch.tile``: as ``repeat``, except that fewer ``dims`` than ``x`` has are padded with
    leading 1s. op_name ``"tile"``.

    >>> tp.tile(x, (2,)).shape
    (2, 6)
    """
    shape = _shape_of("tile", x)
    sizes = _sizes("tile", (dims,) if not isinstance(dims, (tuple, list)) else (dims,), shape)
    sizes = (1,) * (len(shape) - len(sizes)) + sizes
    return Tile.apply(x, tape=tape, sizes=sizes)


# -- tril and triu --------------------------------------------------------------------------------
class Tile(Repeat):
    name = "tile"


class _Triangle(Function):
    """``x`` where the last two dims' triangular mask is 1, else 0 (``sk.where``); the
    gradient passes through the same mask."""

    upper = False

    def forward(self, x: Tensor, diagonal: int = 0):
        ew.check_float(self.name, x)
        if x.ndim < 2:
            raise ShapeError(f"{self.name}: expects at least 2 dims, got shape {x.shape}")
        rows, cols = x.shape[-2:]
        self.mask = None
        if x.size == 0:                  # nothing to mask (and no empty mask to upload)
            return Tensor.empty(x.queue, x.shape)
        keep = (np.triu(np.ones((rows, cols), np.bool_), diagonal) if self.upper
                else np.tril(np.ones((rows, cols), np.bool_), diagonal))
        self.mask = Tensor.from_host(x.queue, keep)
        self.zero = Tensor.zeros(x.queue, ())
        return sk.where(self.mask, x, self.zero)

    def backward(self, g: Tensor):
        if self.mask is None:
            return Tensor.empty(g.queue, g.shape)
        return sk.where(self.mask, g, self.zero)


class Tril(_Triangle):
    name = "tril"


class Triu(_Triangle):
    name = "triu"
    upper = True


def tril(x, diagonal: int = 0, *, tape=None):
    """``torch.tril``: the lower triangle of the last two dims (``diagonal`` > 0 keeps more
    diagonals above, < 0 fewer), zeros elsewhere; float32. op_name ``"tril"``.

    >>> tp.tril(x).to_host()
    array([[0., 0., 0.],
           [3., 4., 0.]], dtype=float32)
    """
    return Tril.apply(x, tape=tape, diagonal=axis_int("tril", diagonal, _shape_of("tril", x)))


def triu(x, diagonal: int = 0, *, tape=None):
    """``torch.triu``: the upper triangle of the last two dims, zeros elsewhere; float32.
    op_name ``"triu"``.

    >>> tp.triu(x, 1).to_host()[0]
    array([0., 1., 2.], dtype=float32)
    """
    return Triu.apply(x, tape=tape, diagonal=axis_int("triu", diagonal, _shape_of("triu", x)))
