"""Strided copies: one kernel that moves elements between two strided views, and the views of
basic indexing, slicing, flipping and padding built on it.

A ``View`` names elements of a contiguous tensor by ``offset + sum(index[k] * strides[k])``
(strides in elements, negative to walk backwards, 0 to repeat). ``copy_view`` copies the
elements of one view into another of the same shape; everything here is that copy with
different views: ``x[key]`` reads a view into a fresh contiguous tensor, its backward writes a
gradient into the same view of a zero tensor, ``cat`` writes each input into its slab of the
output, ``flip`` reads with negated strides, ``pad`` writes the kept part into the middle.

Dimensions that are contiguous in both views are merged first; on a CPU one work-item copies
a whole innermost run (a plain loop PoCL vectorises), on a GPU one element per work-item so
neighbouring work-items touch neighbouring words. Elements move as raw 1, 4 or 8-byte words,
so float32, int32, int64 and byte masks all copy unchanged.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import strided
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.arange(12, dtype=np.float32).reshape(3, 4))
>>> strided.getitem(x, (slice(None, None, -1), 1)).to_host()
array([9., 5., 1.], dtype=float32)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ..errors import DTypeError, ShapeError
from ..pool import pool_of
from ..runtime import on_gpu
from ..tensor import INTERNAL, Tensor, check_same_queue, dims
from ._cache import get_kernel, round_up
from .broadcast import collapse_dims, int8_vector

MAX_DIMS = 8           # after merging; an int8 of sizes and of strides per side
LOCAL = 64
# A CPU work-item copies one innermost run; longer runs than MAX_RUN are cut when there would
# be fewer than MIN_ITEMS work-items otherwise.
MAX_RUN, MIN_ITEMS = 1024, 256
_WORDS = {1: "uchar", 4: "uint", 8: "ulong"}


class IndexOutOfRangeError(ShapeError, IndexError):
    """An integer index outside its dimension. Also an ``IndexError``, so Python's iteration
    over ``x[0], x[1], ...`` stops where it should."""


def _source() -> str:
    parts = ["//CL//"]
    for nbytes, word in _WORDS.items():
        parts.append(rf"""
/* dst[dst_off + idx . sd] = src[src_off + idx . ss] for every idx in the nd outer dims d
   (outermost s0) and j < run along the innermost dim (strides rd, rs). */
__kernel void copy_{nbytes}(__global {word} *dst, const long dst_off,
                            __global const {word} *src, const long src_off, const int n,
                            const int nd, const int8 d, const int8 sd, const int8 ss,
                            const int run, const int rd, const int rs)
{{
    const int i = get_global_id(0);
    if (i >= n) return;
    int r = i, q;
    long od = dst_off, os = src_off;
    switch (nd) {{
    case 8: q = r % d.s7; r /= d.s7; od += (long)q * sd.s7; os += (long)q * ss.s7;
    case 7: q = r % d.s6; r /= d.s6; od += (long)q * sd.s6; os += (long)q * ss.s6;
    case 6: q = r % d.s5; r /= d.s5; od += (long)q * sd.s5; os += (long)q * ss.s5;
    case 5: q = r % d.s4; r /= d.s4; od += (long)q * sd.s4; os += (long)q * ss.s4;
    case 4: q = r % d.s3; r /= d.s3; od += (long)q * sd.s3; os += (long)q * ss.s3;
    case 3: q = r % d.s2; r /= d.s2; od += (long)q * sd.s2; os += (long)q * ss.s2;
    case 2: q = r % d.s1; r /= d.s1; od += (long)q * sd.s1; os += (long)q * ss.s1;
    case 1: od += (long)r * sd.s0; os += (long)r * ss.s0;
    default: break;
    }}
    for (int j = 0; j < run; ++j) dst[od + (long)j * rd] = src[os + (long)j * rs];
}}""")
    return "\n".join(parts)


SOURCE = _source()


@dataclass(frozen=True)
class View:
    """Elements ``offset + sum(i[k] * strides[k])`` for ``i`` over ``shape`` (in elements)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @classmethod
    def contiguous(cls, shape) -> View:
        """The whole of a contiguous (row-major) tensor of ``shape``."""
        strides, step = [0] * len(shape), 1
        for k in range(len(shape) - 1, -1, -1):
            strides[k] = step
            step *= shape[k]
        return cls(tuple(shape), tuple(strides), 0)

    def narrow(self, axis: int, start: int, length: int) -> View:
        """Elements ``start .. start+length`` along ``axis`` (a slab: cat's and split's)."""
        shape = list(self.shape)
        shape[axis] = length
        return View(tuple(shape), self.strides, self.offset + start * self.strides[axis])

    def flip(self, axes) -> View:
        """The same elements with ``axes`` walked backwards."""
        offset, strides = self.offset, list(self.strides)
        for a in axes:
            if self.shape[a] > 0:
                offset += (self.shape[a] - 1) * strides[a]
            strides[a] = -strides[a]
        return View(self.shape, tuple(strides), offset)


def _piece(run: int) -> int:
    """A divisor of ``run`` between 64 and MAX_RUN (1 when there is none: one element per
    work-item, still parallel)."""
    for piece in range(MAX_RUN, 63, -1):
        if run % piece == 0:
            return piece
    return 1



def copy_view(dst: Tensor, dst_view: View, src: Tensor, src_view: View, *,
              _per_element: bool | None = None) -> Tensor:
    """Copy the elements of ``src_view`` of ``src`` into ``dst_view`` of ``dst`` (same shape,
    same dtype), enqueued on ``dst``'s queue; returns ``dst``. (``_per_element`` forces the
    GPU layout, one element per work-item, or the CPU one; tests run both.)"""
    if dst_view.shape != src_view.shape:
        raise ShapeError(f"copy_view: views of shape {dst_view.shape} and {src_view.shape} "
                         "differ")
    if dst.dtype != src.dtype:
        raise DTypeError(f"copy_view: dtypes differ: {dst.dtype} and {src.dtype}")
    if dst.itemsize not in _WORDS:
        raise DTypeError(f"copy_view: dtype {dst.dtype} is not supported")
    check_same_queue("copy_view", dst, src)
    n_total = prod(dst_view.shape)
    if n_total == 0:
        return dst
    dims, (sd, ss) = collapse_dims(dst_view.shape, dst_view.strides, src_view.strides)
    q = dst.queue
    run, rd, rs = 1, 0, 0
    per_element = on_gpu(q) if _per_element is None else _per_element
    if dims and not per_element:
        run, rd, rs = dims.pop(), sd.pop(), ss.pop()
        if run > MAX_RUN and n_total // run < MIN_ITEMS:
            # One long run (a slab of cat, a row of a big tensor) would be one work-item's
            # serial copy: cut it into pieces so every core copies a share.
            piece = _piece(run)
            dims.append(run // piece)
            sd.append(rd * piece)
            ss.append(rs * piece)
            run = piece
    if len(dims) > MAX_DIMS:
        raise ShapeError(f"copy_view: a view of shape {dst_view.shape} needs {len(dims)} "
                         f"strided dimensions; at most {MAX_DIMS} are supported")
    n = n_total // run
    k = get_kernel(q, SOURCE, f"copy_{dst.itemsize}")
    k(q, (round_up(n, LOCAL),), (LOCAL,), dst.data, np.int64(dst_view.offset), src.data,
      np.int64(src_view.offset), np.int32(n), np.int32(len(dims)), int8_vector(dims),
      int8_vector(sd), int8_vector(ss), np.int32(run), np.int32(rd), np.int32(rs))
    return dst


def read_view(x: Tensor, view: View) -> Tensor:
    """A new contiguous tensor holding ``view`` of ``x``."""
    out = Tensor.empty(x.queue, view.shape, x.dtype)
    return copy_view(out, View.contiguous(view.shape), x, view)


def write_view(g: Tensor, shape, view: View, fill: float = 0.0) -> Tensor:
    """A new tensor of ``shape`` filled with ``fill`` except ``view``, which holds ``g``."""
    out = Tensor.full(g.queue, tuple(shape), fill, g.dtype)
    return copy_view(out, view, g.reshape(view.shape), View.contiguous(view.shape))


# -- basic indexing ----------------------------------------------------------------------------
def _is_int(k) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def parse_key(op: str, shape: tuple[int, ...], key) -> View:
    """The view numpy's basic indexing ``x[key]`` selects from a contiguous ``shape``: ints
    (negative from the end), slices (any step, negative too), ``None`` and one ``...``."""
    key = key if isinstance(key, tuple) else (key,)
    for k in key:
        if not (_is_int(k) or k is None or k is Ellipsis or isinstance(k, slice)):
            more = (", or one 1-D int list/array in one position" if op == "getitem" else
                    " (and t[mask] = number for a mask of t's shape)" if op == "setitem" else "")
            raise DTypeError(f"{op}: index {k!r} of type {type(k).__name__} is not supported "
                             f"(shape {shape}); parcl does basic indexing only: ints, slices, "
                             f"None and ...{more} (use tp.gather for index tensors)")
    if sum(k is Ellipsis for k in key) > 1:
        raise ShapeError(f"{op}: an index can only have a single ellipsis (...), got {key!r}")
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > len(shape):
        raise IndexOutOfRangeError(f"{op}: too many indices for a tensor of shape {shape}: "
                                   f"{used} were indexed, it has {len(shape)} dimensions")
    if Ellipsis not in key:
        key = key + (Ellipsis,)
    at = key.index(Ellipsis)
    key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
    base = View.contiguous(shape)
    offset, out_shape, out_strides, dim = 0, [], [], 0
    for k in key:
        if k is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        n, stride = shape[dim], base.strides[dim]
        if isinstance(k, slice):
            try:
                start, stop, step = k.indices(n)
            except ValueError as exc:            # step 0
                raise ShapeError(f"{op}: {exc} (index {k!r}, shape {shape})") from None
            length = len(range(start, stop, step))
            if length:
                offset += start * stride
            out_shape.append(length)
            out_strides.append(step * stride)
        else:
            i = int(k)
            if not -n <= i < n:
                raise IndexOutOfRangeError(f"{op}: index {i} is out of range for dimension "
                                           f"{dim} of size {n} (shape {shape})")
            offset += (i % n) * stride
        dim += 1
    return View(tuple(out_shape), tuple(out_strides), offset)


def _is_index_array(k) -> bool:
    # a list, a numpy array, a pc.Tensor or a tp.Node (not a numpy int, which has a dtype too)
    return isinstance(k, (list, np.ndarray)) or (not _is_int(k) and hasattr(k, "dtype")
                                                 and hasattr(k, "shape"))


_BASIC = frozenset((int, slice, type(None), type(Ellipsis)))


def split_array_key(op: str, shape: tuple[int, ...], key):
    """``None`` where ``key`` is basic; else ``(basic, dim, index)`` for a key with one 1-D int
    list, numpy array or int tensor in one position (PyTorch's advanced indexing with one index
    array): ``x[key]`` is ``x[basic]`` (a full slice in that position) with the entries
    ``index`` (int64 on the host, negatives wrapped, range checked) picked along its ``dim``.
    A tensor index is read to the host (a wait). A bool or float mask, two index arrays or an
    index of more dims is a DTypeError."""
    key = key if isinstance(key, tuple) else (key,)
    if all(type(k) in _BASIC for k in key):          # the usual key: nothing more to look at
        return None
    at = [p for p, k in enumerate(key) if _is_index_array(k)]
    if not at:
        return None
    index = [i.to_host() if hasattr(i, "to_host") else i for i in
             [getattr(key[p], "value", key[p]) for p in at]]
    index = [np.asarray(i) for i in index]
    if len(at) > 1 or index[0].ndim != 1 or index[0].dtype.kind not in "iu" and index[0].size:
        got = ", ".join(f"{i.dtype} {i.shape}" for i in index)
        raise DTypeError(f"{op}: index arrays ({got}) in key of shape {shape} are not "
                         "supported; parcl takes ints, slices, None, ... and one 1-D int "
                         "list/array/tensor in one position (a bool or 0/1 mask only as "
                         "t[mask] = number; use tp.gather, tp.where or tp.masked_fill for "
                         "more)")
    p, index = at[0], index[0].astype(np.int64)
    basic = key[:p] + (slice(None),) + key[p + 1:]
    parse_key(op, shape, basic)                  # the basic part's errors first
    used = sum(1 for k in basic if k is not None and k is not Ellipsis)
    fill = len(shape) - used                     # dims an ellipsis stands for
    before = basic[:p]
    dim = sum(fill if k is Ellipsis else 1 for k in before if not _is_int(k))
    axis = sum(fill if k is Ellipsis else 1 for k in before if k is not None)
    n = shape[axis]
    bad = (index < -n) | (index >= n)
    if bad.any():
        raise IndexOutOfRangeError(f"{op}: index {int(index[bad][0])} is out of range for "
                                   f"dimension {axis} of size {n} (shape {shape})")
    return basic, dim, index % n if n else index


def index_runs(index: np.ndarray):
    """``(at, start, step, length)``: ``index`` cut greedily into arithmetic runs, each one
    strided copy (``[-1]``, ``[0, 1, 2]`` and ``[3, 1]`` are one run)."""
    at = 0
    while at < len(index):
        step = int(index[at + 1] - index[at]) if at + 1 < len(index) else 1
        end = at + 1
        while end < len(index) and index[end] - index[end - 1] == step:
            end += 1
        yield at, int(index[at]), step, end - at
        at = end


# More arithmetic runs than this in an index (a shuffled batch's rows) take one gather launch
# instead of a strided copy per run.
MAX_RUNS = 8


def select_view(x: Tensor, view: View, dim: int, index: np.ndarray) -> Tensor:
    """A new contiguous tensor: ``view`` of ``x`` with the entries ``index`` (non-negative)
    picked along ``dim``: one strided copy per arithmetic run of ``index`` (``[-1]``,
    ``[0, 1, 2]``), or for a float32 ``x`` and an index of many runs one gather kernel."""
    shape = view.shape[:dim] + (len(index),) + view.shape[dim + 1:]
    steps = np.diff(index)
    if x.dtype == np.float32 and np.count_nonzero(np.diff(steps)) >= MAX_RUNS:
        from .gather import broadcast_index, gather_forward    # gather imports this module
        picks = Tensor.from_host(x.queue, np.ascontiguousarray(index, np.int64))
        full, _ = broadcast_index(picks, shape, dim)
        # x itself where the basic part is all of it (x[perm]): a copy of the view otherwise
        src = x if view == View.contiguous(x.shape) else read_view(x, view)
        return gather_forward(src, dim, full)[0]            # in range: checked above
    out, whole = Tensor.empty(x.queue, shape, x.dtype), View.contiguous(shape)
    stride = view.strides[dim]
    for at, start, step, length in index_runs(index):
        strides = view.strides[:dim] + (step * stride,) + view.strides[dim + 1:]
        src = View(whole.narrow(dim, at, length).shape, strides, view.offset + start * stride)
        copy_view(out, whole.narrow(dim, at, length), x, src)
    return out


def getitem(x: Tensor, key) -> Tensor:
    """``x[key]`` (basic indexing, or one 1-D int index array: ``split_array_key``) as a new
    contiguous tensor on ``x``'s queue."""
    if not isinstance(x, Tensor):
        raise TypeError(f"getitem: expected a pc.Tensor, got {type(x).__name__}")
    if x.dtype not in INTERNAL:
        raise DTypeError(f"getitem: dtype {x.dtype} is not supported")
    picked = split_array_key("getitem", x.shape, key)
    if picked is not None:       # a copy in PyTorch too: not noted as one
        basic, dim, index = picked
        return select_view(x, parse_key("getitem", x.shape, basic), dim, index)
    return indexed_copy(read_view(x, parse_key("getitem", x.shape, key)), key)


def indexed_copy(out: Tensor, key) -> Tensor:
    """``out``, ``x[key]`` by basic indexing, noted in its pool as a copy where PyTorch's is a
    view: writing into it in place would leave ``x`` as it was (``emb.weight[0].fill_(0)``
    zeroing nothing), so ``Tensor.not_a_copy`` refuses that."""
    # the key, formatted only where a write is refused: x[:, -1] runs in training steps
    pool_of(out.queue).copies[out._alloc] = ("an indexing result (index {!r})", key)
    return out


def view_copy(out: Tensor, x: Tensor, op: str) -> Tensor:
    """``out``, what ``op`` made of ``x`` (narrow, select, chunk, a transpose, ...), noted as
    a copy where PyTorch's is a view, as ``indexed_copy``; nothing is noted where ``out`` is
    ``x``'s own buffer (a permute moving only size-1 dims: a view in parcl too)."""
    if out._alloc is not x._alloc:
        pool_of(out.queue).copies[out._alloc] = f"{op}'s result"
    return out


def setitem(x: Tensor, key, value) -> None:
    """``x[key] = value`` in place: the elements basic indexing selects get ``value`` (a number,
    or a tensor of ``x``'s dtype broadcast to the selection, numpy's rules)."""
    view = parse_key("setitem", x.shape, key)
    if isinstance(value, Tensor):
        if value.dtype != x.dtype:
            raise DTypeError(f"setitem: a {value.dtype} value {value.shape} into a {x.dtype} "
                             f"tensor {x.shape}")
        check_same_queue("setitem", x, value)
        if value.data == x.data:          # read while written (x[1:] = x[:-1]): copied first
            value = value.copy()
        src = value
    else:
        if np.ndim(value) != 0:
            raise ShapeError(f"setitem: the value must be a number or a tensor, got shape "
                             f"{np.shape(value)} (index {key!r} of shape {x.shape})")
        src = Tensor.full(x.queue, (1,), value, x.dtype)
    shape, lead = tuple(src.shape) if isinstance(value, Tensor) else (), len(view.shape)
    while len(shape) > lead and shape[0] == 1:      # leading 1s dropped first, as PyTorch's
        shape = shape[1:]
    if len(shape) > lead or any(s not in (1, v) for s, v in zip(shape[::-1], view.shape[::-1])):
        raise ShapeError(f"setitem: a value of shape {shape} cannot be broadcast to the "
                         f"selection {view.shape} (index {key!r} of shape {x.shape})")
    strides = View.contiguous(shape).strides if shape else ()
    padded = (0,) * (lead - len(shape)) + tuple(
        0 if s == 1 else st for s, st in zip(shape, strides))
    copy_view(x, view, src, View(view.shape, padded, 0))


def axis_int(op: str, axis, shape=None) -> int:
    """``axis`` as an int; a float (``1.7``) or a bool is a ShapeError, as numpy refuses it,
    not truncated to another axis."""
    if not _is_int(axis):
        raise ShapeError(f"{op}: axis must be an int, got {axis!r} (shape {shape})")
    return int(axis)


def normalize_axis(op: str, axis: int, ndim: int, shape) -> int:
    """``axis`` in ``[0, ndim)`` (negative counts from the end), or ShapeError."""
    axis = axis_int(op, axis, shape)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op}: axis {axis} is out of range for a tensor of shape "
                         f"{tuple(shape)} ({ndim} dimensions)")
    return axis % ndim


def split_sizes(shape: tuple, split_size_or_sections, axis: int) -> tuple[int, list[int]]:
    """``torch.split``'s pieces of a tensor of ``shape``: ``axis`` in ``[0, ndim)`` and each
    piece's size along it (an int: pieces of that size, the last smaller; a list: as given,
    adding up to the dim)."""
    if len(shape) == 0:
        raise ShapeError("split: a zero-dimensional tensor cannot be split")
    axis = normalize_axis("split", axis, len(shape), shape)
    n = shape[axis]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = list(dims("split", split_size_or_sections))
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ShapeError(f"split: sections {sizes} must be non-negative and add up to "
                             f"{n}, the size of axis {axis} (shape {shape})")
    else:
        size, = dims("split", (split_size_or_sections,))
        if size <= 0:
            raise ShapeError(f"split: split_size must be positive, got {size} (shape {shape})")
        sizes = [min(size, n - s) for s in range(0, n, size)] or [0]
    return axis, sizes
