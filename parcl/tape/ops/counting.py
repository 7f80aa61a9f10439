"""Counting and searching: ``searchsorted``, ``bucketize``, ``isin``, ``histc``,
``bincount``, ``unique``, ``unique_consecutive``, ``nonzero``, ``argwhere``,
``count_nonzero`` and ``unravel_index`` (PyTorch's names, arguments and results). None of
them is differentiable: the results are raw Tensors (int64 indices and counts, float32 masks
and histograms), never recorded.

Their kernels are in ``parcl/kernels/counting.py`` (binary searches, ordered compactions,
per-bin sums over stably sorted keys: no float atomics, the same bits on every run). Where
the size of the result depends on the data (``unique``, ``nonzero``, ``bincount``'s length,
``histc``'s data range) one small value is read back to the host first, as PyTorch syncs;
an input's pending checks (an embedding's index range) raise before that read, and every
result keeps them, as every other op's.
Sorting is float32 (``tp.sort``): integer inputs of ``unique``, ``isin``, ``searchsorted``
and ``bincount`` are sorted as float32 keys, after a check (a host read of their range) that
every value is below ``2**24`` in size, which float32 holds exactly.

>>> x = tp.tensor(np.array([[0.0, 2.0], [2.0, 5.0]], np.float32))
>>> tp.nonzero(x).to_host()
array([[0, 1],
       [1, 0],
       [1, 1]])
>>> tp.unique(x, return_counts=True)[1].to_host()
array([1, 2, 1])
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import counting as ck
from ...kernels import gather as gk
from ...kernels import layout
from ...kernels import reduction as rd
from ...kernels import sorting
from ...tensor import FLOAT, LABEL_DTYPES, Tensor, check_same_queue, keep_checks
from ..node import Node
from .shape import wrap_dims

__all__ = ["argwhere", "bincount", "bucketize", "count_nonzero", "histc", "isin", "nonzero",
           "searchsorted", "unique", "unique_consecutive", "unravel_index"]

EXACT = 2 ** 24          # float32 holds every integer below it: bincount's keys


def _raw(op: str, x, what: str = "input", dtypes=(FLOAT,)) -> Tensor:
    if isinstance(x, Node):
        x = x.value
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {what} must be a tp.Node or pc.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise DTypeError(f"{op}: {what} {x.shape} has dtype {x.dtype}, expected {names}")
    return x


def _read(x: Tensor) -> None:
    """``x``'s pending checks (an embedding's index range, a sampler's probabilities) run
    before a count or range read back from it sizes a result: a bad input raises there, as a
    host read of any value computed from it does, never sizes a result from garbage."""
    for check in x.checks:
        check()


def _keeping(out, *inputs):
    """``out`` (a Tensor or a tuple of them) with its inputs' pending checks, so that it
    raises at its host read where an input was bad, as every other op's result."""
    for t in out if isinstance(out, tuple) else (out,):
        keep_checks(t, *inputs)
    return out


def _keys(op: str, x: Tensor, what: str = "input") -> Tensor:
    """``x`` as float32 sort keys (with its checks): integers are converted, after a check (a
    host read of their range) that float32 holds each exactly."""
    if x.dtype == FLOAT:
        return x
    if x.size:
        _read(x)
        lo, hi = ck.int_range(x, op)
        if lo <= -EXACT or hi >= EXACT:
            raise ShapeError(f"{op}: integer {what} {x.shape} holds values in [{lo}, {hi}]; "
                             f"only |values| < 2**24 are supported (they are sorted as "
                             "float32)")
    return keep_checks(ck.cast(x, FLOAT), x)


def _values(op: str, v, queue, what: str = "values") -> Tensor:
    """A tensor as float32 keys, or a Python number as a 0-d float32 tensor (as PyTorch's
    Scalar arguments)."""
    if isinstance(v, Real) and not isinstance(v, bool):
        return Tensor.from_host(queue, np.float32(v))
    return _keys(op, _raw(op, v, what, (FLOAT, *LABEL_DTYPES)), what)


def _flat(x: Tensor) -> Tensor:
    return x.reshape((x.size,))


def searchsorted(sorted_sequence, input, *, out_int32: bool = False,  # noqa: A002
                 right: bool = False, side: str | None = None, sorter=None) -> Tensor:
    """``torch.searchsorted``: for each element of ``input`` (a tensor or a number), the
    index where it would be inserted into ``sorted_sequence`` to keep it sorted: before the
    equal elements, or after them with ``right=True`` / ``side="right"``; NaN after all.
    ``sorted_sequence`` is 1-D (shared) or has ``input``'s leading dims (one row each);
    ``sorter`` (int64) sorts it along its last dim, checked on the host. int64, or int32
    with ``out_int32``.

    >>> seq = tp.tensor(np.array([1.0, 3.0, 5.0], np.float32))
    >>> tp.searchsorted(seq, tp.tensor(np.array([3.0, 6.0], np.float32))).to_host()
    array([1, 3])
    """
    seq = _raw("searchsorted", sorted_sequence, "sorted_sequence", (FLOAT, *LABEL_DTYPES))
    seq = _keys("searchsorted", seq, "sorted_sequence")
    values = _values("searchsorted", input, seq.queue)
    if side is not None:
        if side not in ("left", "right"):
            raise ShapeError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        if right and side == "left":
            raise ShapeError("searchsorted: side='left' and right=True contradict each other")
        right = side == "right"
    if seq.ndim == 0:
        raise ShapeError("searchsorted: sorted_sequence must have at least one dim, got a 0-d "
                         "tensor")
    if seq.ndim > 1 and (values.ndim != seq.ndim or values.shape[:-1] != seq.shape[:-1]):
        raise ShapeError(f"searchsorted: sorted_sequence {seq.shape} must be 1-D or have the "
                         f"leading dims of input {values.shape}")
    check_same_queue("searchsorted", seq, values)
    if sorter is not None:
        sorter = _raw("searchsorted", sorter, "sorter", (np.dtype(np.int64),))
        if sorter.shape != seq.shape:
            raise ShapeError(f"searchsorted: sorter {sorter.shape} must have the shape of "
                             f"sorted_sequence {seq.shape}")
        # Read back, as PyTorch's aminmax().item() check: a sorter index outside the row
        # would make the kernel read past it, and a device-side flag would raise only at a
        # later read of the result, not here where PyTorch raises.
        host = sorter.to_host()
        if host.size and (host.min() < 0 or host.max() >= seq.shape[-1]):
            raise ShapeError(f"searchsorted: sorter holds {int(host.min())}..{int(host.max())}"
                             f", expected indices in [0, {seq.shape[-1]})")
    return _keeping(ck.searchsorted(seq, values, right, sorter, out_int32), seq, values,
                    sorter)


def bucketize(input, boundaries, *, out_int32: bool = False,  # noqa: A002
              right: bool = False) -> Tensor:
    """``torch.bucketize``: the bucket of each element of ``input`` among the 1-D sorted
    ``boundaries`` (``boundaries[i-1] < x <= boundaries[i]``; ``right=True``: ``<= x <``),
    as ``searchsorted(boundaries, input, right=right)``.

    >>> b = tp.tensor(np.array([1.0, 3.0, 5.0], np.float32))
    >>> tp.bucketize(tp.tensor(np.array([3.0, 6.0], np.float32)), b, right=True).to_host()
    array([2, 3])
    """
    bounds = _raw("bucketize", boundaries, "boundaries", (FLOAT, *LABEL_DTYPES))
    if bounds.ndim != 1:
        raise ShapeError(f"bucketize: boundaries must be 1-D, got {bounds.shape}")
    return searchsorted(bounds, input, out_int32=out_int32, right=right)


def isin(elements, test_elements, *, assume_unique: bool = False,
         invert: bool = False) -> Tensor:
    """``torch.isin``: a float32 0/1 mask (parcl's masks), ``elements``'s shape: whether
    each is equal to some element of ``test_elements`` (NaN never is); ``invert`` flips it.
    Either may be a number. ``test_elements`` is sorted, then searched.

    >>> tp.isin(tp.tensor(np.array([1.0, 2.0], np.float32)), 2.0).to_host()
    array([0., 1.], dtype=float32)
    """
    queue = next((t.queue for t in (elements, test_elements) if isinstance(t, (Node, Tensor))),
                 None)
    if queue is None:
        raise TypeError("isin: elements or test_elements must be a tensor")
    x = _values("isin", elements, queue, "elements")
    test = _flat(_values("isin", test_elements, queue, "test_elements"))
    check_same_queue("isin", x, test)
    order = sorting.argsort(test, 0)
    sorted_test = gk.gather_forward(test, 0, order)[0]
    return _keeping(ck.isin(x, sorted_test, invert), x, test)


def histc(input, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """``torch.histc``: the float32 counts of ``input``'s elements in ``bins`` equal bins
    between ``min`` and ``max`` (the last includes ``max``); elements outside (and NaN) are
    not counted. ``min == max`` uses the data's range (read back), widened by 1 each way
    when it is one value. Bins are computed in float32 as PyTorch's.

    >>> tp.histc(tp.tensor(np.array([1.0, 2.0, 1.0], np.float32)), bins=4, min=0, max=3).to_host()
    array([0., 2., 1., 0.], dtype=float32)
    """
    x = _flat(_raw("histc", input))
    if isinstance(bins, bool) or not isinstance(bins, Integral) or bins <= 0:
        raise ShapeError(f"histc: bins must be a positive int, got {bins!r}")
    lo, hi = float(np.float32(min)), float(np.float32(max))
    if lo == hi and x.size:
        _read(x)
        lo = float(rd.min(x).to_host())
        hi = float(rd.max(x).to_host())
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ShapeError(f"histc: range of [{lo}, {hi}] is not finite (input {input.shape})")
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    if lo > hi:
        raise ShapeError(f"histc: max must be larger than min, got min={min}, max={max}")
    if not x.size:
        return Tensor.zeros(x.queue, (int(bins),))
    keys = ck.hist_keys(x, lo, hi, int(bins))
    order = sorting.argsort(keys, 0)
    counts = ck.bin_sums(gk.gather_forward(keys, 0, order)[0], None, int(bins), as_float=True)
    return _keeping(counts, x)


def bincount(input, weights=None, minlength: int = 0) -> Tensor:  # noqa: A002
    """``torch.bincount``: how often each value ``0 .. max(input)`` (at least ``minlength``
    bins) occurs in the 1-D non-negative integer ``input`` (int64), or the ``weights`` (1-D,
    float32, ``input``'s length) of its occurrences summed in index order (float32). Reads
    the input's range back; values must be below ``2**24``.

    >>> tp.bincount(pc.Tensor.from_host(q, np.array([0, 2, 2]))).to_host()
    array([1, 0, 2])
    """
    x = _raw("bincount", input, "input", LABEL_DTYPES)
    if x.ndim != 1:
        raise ShapeError(f"bincount: input must be 1-D, got {x.shape}")
    if isinstance(minlength, bool) or not isinstance(minlength, Integral) or minlength < 0:
        raise ShapeError(f"bincount: minlength must be a non-negative int, got {minlength!r}")
    w = None
    if weights is not None:
        w = _raw("bincount", weights, "weights")
        if w.shape != x.shape:
            raise ShapeError(f"bincount: weights {w.shape} must have input's shape {x.shape}")
        check_same_queue("bincount", x, w)
    if not x.size:
        return Tensor.zeros(x.queue, (int(minlength),), np.int64 if w is None else FLOAT)
    _read(x)
    lo, hi = ck.int_range(x, "bincount")
    if lo < 0:
        raise ShapeError(f"bincount: input must be non-negative, got a value {lo} (input "
                         f"{x.shape})")
    if hi >= EXACT:
        raise ShapeError(f"bincount: values up to {EXACT - 1} are supported, got {hi}")
    keys = ck.cast(x, FLOAT)
    order = sorting.argsort(keys, 0)
    sorted_w = None if w is None else gk.gather_forward(w, 0, order)[0]
    bins = max(hi + 1, int(minlength))
    sums = ck.bin_sums(gk.gather_forward(keys, 0, order)[0], sorted_w, bins, as_float=False)
    return _keeping(sums, x, w)


def _unique(op: str, x, return_inverse: bool, return_counts: bool, dim):
    if dim is not None:
        raise ShapeError(f"{op}: dim={dim} is not supported (only dim=None: the flattened "
                         "input)")
    x = _raw(op, x, "input", (FLOAT, *LABEL_DTYPES))
    _read(x)
    flat = _keys(op, _flat(x))
    perm = sorting.argsort(flat, 0)
    keys = gk.gather_forward(flat, 0, perm)[0]
    starts = ck.positions(keys, "run_start", op)
    values, inverse, counts = ck.runs(keys, starts, perm, return_inverse, return_counts)
    values = ck.cast(values, x.dtype)
    if inverse is not None:
        inverse = inverse.reshape(x.shape)
    out = _keeping((values,) + ((inverse,) if return_inverse else ()) + (
        (counts,) if return_counts else ()), x)
    return out[0] if len(out) == 1 else out


def unique(input, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim=None):
    """``torch.unique`` of the flattened ``input`` (float32 or int): its distinct values
    ascending (NaNs each their own, last; sorted whatever ``sorted`` says, as PyTorch's), with
    ``return_inverse`` each element's position among them (``input``'s shape) and with
    ``return_counts`` how often each occurs; a tuple when either is asked for. Reads the
    number of distinct values back. ``dim`` other than None is a ShapeError.

    >>> tp.unique(x).to_host()                    # x [[0, 2], [2, 5]]
    array([0., 2., 5.], dtype=float32)
    """
    return _unique("unique", input, return_inverse, return_counts, dim)


def unique_consecutive(input, return_inverse: bool = False,  # noqa: A002
                       return_counts: bool = False, dim=None):
    """``torch.unique_consecutive`` of the flattened ``input`` (float32 or int): the first
    element of each run of equal values, with ``return_inverse`` each element's run and with
    ``return_counts`` each run's length. Reads the number of runs back.

    >>> tp.unique_consecutive(tp.tensor(np.array([1.0, 1.0, 2.0, 1.0], np.float32))).to_host()
    array([1., 2., 1.], dtype=float32)
    """
    if dim is not None:
        raise ShapeError(f"unique_consecutive: dim={dim} is not supported (only dim=None: "
                         "the flattened input)")
    x = _raw("unique_consecutive", input, "input", (FLOAT, *LABEL_DTYPES))
    _read(x)
    flat = _flat(x)
    starts = ck.positions(flat, "run_start", "unique_consecutive")
    values, inverse, counts = ck.runs(flat, starts, None, return_inverse, return_counts)
    if inverse is not None:
        inverse = inverse.reshape(x.shape)
    out = _keeping((values,) + ((inverse,) if return_inverse else ()) + (
        (counts,) if return_counts else ()), x)
    return out[0] if len(out) == 1 else out


def nonzero(input, *, as_tuple: bool = False):  # noqa: A002
    """``torch.nonzero``: the int64 coordinates of the nonzero elements (NaN is nonzero) in
    row-major order, ``(count, ndim)``; ``as_tuple=True``: one 1-D tensor per dim (a 0-d
    input as 1-D). Reads the count back.

    >>> tp.nonzero(x, as_tuple=True)[1].to_host()          # x [[0, 2], [2, 5]]
    array([1, 0, 1])
    """
    x = _raw("nonzero", input, "input", (FLOAT, *LABEL_DTYPES))
    _read(x)
    pos = ck.positions(_flat(x), "nonzero", "nonzero")
    dims = x.shape or (1,)
    if as_tuple:
        coords = ck.unravel(pos, dims, by_dim=True)
        return _keeping(tuple(coords[k] for k in range(len(dims))), x)
    return _keeping(ck.unravel(pos, x.shape, by_dim=False), x)


def argwhere(input) -> Tensor:  # noqa: A002
    """``torch.argwhere``: ``nonzero(input)``.

    >>> tp.argwhere(x).shape                   # x [[0, 2], [2, 5]]
    (3, 2)
    """
    return nonzero(input)


def count_nonzero(input, dim=None) -> Tensor:  # noqa: A002
    """``torch.count_nonzero``: the int64 number of nonzero elements (NaN counts) over
    every dim or over ``dim`` (an int or a tuple), counted exactly.

    >>> tp.count_nonzero(x, 0).to_host()        # x [[0, 2], [2, 5]]
    array([1, 2])
    """
    x = _raw("count_nonzero", input, "input", (FLOAT, *LABEL_DTYPES))
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return _keeping(ck.count(_flat(x), "nonzero", "count_nonzero")[1].reshape(()), x)
    axes = wrap_dims("count_nonzero", dim, x.ndim, x.shape)
    if not x.shape:
        return _keeping(ck.count(_flat(x), "nonzero", "count_nonzero")[1].reshape(()), x)
    mask = ck.nonzero_mask(x)
    keep = [k for k in range(x.ndim) if k not in axes]
    perm = keep + list(axes)
    if perm != list(range(x.ndim)):
        mask = layout.transpose(mask, perm)
    R = int(np.prod([x.shape[k] for k in axes], dtype=np.int64))
    rows = int(np.prod([x.shape[k] for k in keep], dtype=np.int64))
    return _keeping(ck.count_rows(mask, rows, R).reshape(tuple(x.shape[k] for k in keep)), x)


def unravel_index(indices, shape) -> tuple[Tensor, ...]:
    """``torch.unravel_index``: the coordinates of flat ``indices`` (an int tensor) in a
    tensor of ``shape``, one int64 tensor per dim of ``indices``'s shape. As PyTorch's, each
    coordinate is taken modulo its dim (``-1`` is the last element; an index past the end
    wraps).

    >>> [c.to_host() for c in tp.unravel_index(pc.Tensor.from_host(q, np.array([5])), (2, 3))]
    [array([1]), array([2])]
    """
    idx = _raw("unravel_index", indices, "indices", LABEL_DTYPES)
    if isinstance(shape, Integral):
        shape = (shape,)
    shape = tuple(shape)
    if any(isinstance(s, bool) or not isinstance(s, Integral) or s < 0 for s in shape):
        raise ShapeError(f"unravel_index: shape must be non-negative ints, got {shape}")
    if idx.size and int(np.prod(shape, dtype=np.int64)) == 0:
        raise ShapeError(f"unravel_index: shape {shape} has no elements to index "
                         f"(indices {idx.shape})")
    pos = ck.cast(idx, np.int64)
    coords = ck.unravel(_flat(pos), shape, by_dim=True)
    return _keeping(tuple(coords[k].reshape(idx.shape) for k in range(len(shape))), idx)

