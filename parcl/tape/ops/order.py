"""Order statistics: ``median``, ``nanmedian``, ``quantile``, ``nanquantile``, ``kthvalue``,
``mode``, ``msort`` and ``aminmax`` (PyTorch's names, arguments and results).

Each sorts along the dim (``parcl/kernels/sorting.py``: one stable order, NaN largest) and
picks from the sorted row on the device (``parcl/kernels/order.py``); the values are ``x``
gathered at the picked positions, so the gradient goes back to those positions (gather's
backward). Where PyTorch's index among equal values is its selection algorithm's (kthvalue),
parcl's is the stable order's: the k-th of ``argsort(x, stable=True)``.

>>> x = tp.tensor(np.array([[3.0, 1.0, 2.0, 1.0]], np.float32), requires_grad=True)
>>> tp.median(x, 1).indices.to_host()             # the lower median: the second 1
array([3])
>>> float(tp.quantile(x, 0.5))
1.5
"""

from __future__ import annotations

from numbers import Real
from typing import NamedTuple

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import elementwise as ew
from ...kernels import gather as gk
from ...kernels import order as ok
from ...kernels import reduction as rd
from ...kernels import scatter as sc
from ...kernels import select as sk
from ...kernels import sorting
from ...kernels import strided
from ...tensor import FLOAT, Tensor
from ..node import Function, Node
from .mathops import lerp
from .reduce_dims import amax, amin
from .shape import movedim, reshape, wrap_dim
from .sorting import SortResult, sort

__all__ = ["aminmax", "kthvalue", "median", "msort", "nanmedian", "nanquantile", "quantile"]
# ``mode`` (torch.mode) is defined here and reached as ``x.mode(dim)`` or ``tp.ops.order.mode``:
# the name ``tp.mode`` is parcl.tape's grad-mode module, which every part of parcl imports


class MinMax(NamedTuple):
    """``aminmax``'s result, as ``torch.return_types.aminmax``."""

    min: Node | Tensor
    max: Node | Tensor


class _Taken(Function):
    """``x`` at positions along ``axis`` that the op picked (in range by construction); the
    backward adds the gradient at them (repeated positions in index order)."""

    name = "kthvalue"

    def forward(self, x: Tensor, index: Tensor, axis: int = 0, shape: tuple | None = None):
        out, _ = gk.gather_forward(x, axis, index)
        if self.recording:
            self.saved = (x.shape, axis, index)
        return out if shape is None else out.reshape(shape)

    def backward(self, g: Tensor):
        x_shape, axis, index = self.saved
        return sc.gather_backward(g.reshape(index.shape), x_shape, axis, index), None


def _taken(name: str) -> type:
    return type(f"_Taken_{name}", (_Taken,), {"name": name})


_TAKEN = {name: _taken(name) for name in ("median", "nanmedian", "quantile", "nanquantile",
                                          "kthvalue", "mode")}


class _Shared(Function):
    """The median of every element: the gradient shared evenly among the elements equal to
    it (the NaNs, where it is NaN), as PyTorch's ``median()`` and ``nanmedian()``."""

    name = "median"

    def forward(self, x: Tensor, index: Tensor):
        out = gk.gather_forward(x, 0, index)[0].reshape(())
        if self.recording:
            self.saved = (x, out)
        return out

    def backward(self, g: Tensor):
        x, out = self.saved
        mask = ew.binary("eq", x, out)
        nan = ew.binary("mul", ew.unary("isnan", x), ew.unary("isnan", out))
        ew.binary("add", mask, nan, out=mask)
        share = ew.binary("div", g, rd.sum(mask))
        return ew.binary("mul", mask, share, out=mask), None


class _SharedNan(_Shared):
    name = "nanmedian"


def _input(op: str, x):
    if not isinstance(x, (Node, Tensor)):
        raise TypeError(f"{op}: expected a tp.Node or pc.Tensor, got {type(x).__name__}")
    if x.dtype != FLOAT:
        raise DTypeError(f"{op}: input {tuple(x.shape)} has dtype {x.dtype}, expected "
                         "float32")


def _rows(op: str, x, dim, tape):
    """``(x as at least 1-D, axis, its raw value, the stable ascending permutation)``; a dim
    of no elements is a ShapeError (there is nothing to pick)."""
    _input(op, x)
    shape = tuple(x.shape)
    axis = wrap_dim(op, dim, len(shape), shape)
    flat = x if shape else reshape(x, (1,), tape=tape)
    if flat.shape[axis] == 0:
        raise ShapeError(f"{op}: dim {axis} of input {shape} has no elements to pick from")
    raw = flat.value if isinstance(flat, Node) else flat
    perm = sorting.argsort(raw, axis)
    perm.checks = raw.checks
    return flat, axis, raw, perm


def _result(op: str, x, flat, axis: int, index: Tensor, keepdim: bool, tape) -> SortResult:
    """``(values, indices)`` for one position per row (``index``: 1 along ``axis``)."""
    shape = tuple(x.shape)
    # a 0-d input stays 0-d with keepdim, as PyTorch's: it has no dim to keep
    out_shape = shape[:axis] + ((1,) if keepdim and shape else ()) + shape[axis + 1:]
    values = _TAKEN[op].apply(flat, index, tape=tape, axis=axis, shape=out_shape)
    index = index.reshape(out_shape)
    # the input's pending checks (an embedding's index range) raise at the indices' host read
    index.checks = (flat.value if isinstance(flat, Node) else flat).checks
    return SortResult(values, index)


def _whole(op: str, x, tape):
    """The median of every element (``median()``, ``nanmedian()``): a 0-d value."""
    _input(op, x)
    flat = reshape(x, (-1,), tape=tape)
    if flat.shape[0] == 0:
        raise ShapeError(f"{op}: input {tuple(x.shape)} has no elements")
    raw = flat.value if isinstance(flat, Node) else flat
    perm = sorting.argsort(raw, 0)
    lo = ok.pick(raw, perm, 0, op)[0]
    return (_Shared if op == "median" else _SharedNan).apply(flat, lo, tape=tape)


def median(x, dim=None, keepdim: bool = False, *, tape=None):
    """``torch.median``: without ``dim`` the lower median of every element (a 0-d value,
    NaN if any element is; the gradient shared evenly among the elements equal to it); with
    ``dim`` ``(values, indices)`` along it: the lower median of each row, or its first NaN.
    The index is the median's position in the stable order (PyTorch's on CPU).

    >>> tp.median(x, 1).indices.to_host()            # x [[3, 1, 2, 1]]
    array([3])
    """
    if dim is None:
        return _whole("median", x, tape)
    flat, axis, raw, perm = _rows("median", x, dim, tape)
    lo = ok.pick(raw, perm, axis, "median")[0]
    return _result("median", x, flat, axis, lo, keepdim, tape)


def nanmedian(x, dim=None, keepdim: bool = False, *, tape=None):
    """``torch.nanmedian``: ``median`` of the elements that are not NaN (NaN where a row has
    none, with index 0).

    >>> float(tp.nanmedian(tp.tensor(np.array([1.0, np.nan, 3.0], np.float32))))
    1.0
    """
    if dim is None:
        return _whole("nanmedian", x, tape)
    flat, axis, raw, perm = _rows("nanmedian", x, dim, tape)
    lo = ok.pick(raw, perm, axis, "nanmedian")[0]
    return _result("nanmedian", x, flat, axis, lo, keepdim, tape)


class _Level(Function):
    """The weight of ``linear`` quantiles as a function of the levels ``q``: the rank
    ``q * (m - 1)`` moves the weight one for one, so ``q``'s gradient is the weight's times
    ``m - 1`` (``slope``: the row's length, or its count of non-NaNs for nanquantile, less
    one) summed over the rows, as PyTorch's. A row that gives NaN (PyTorch masks its rank to
    the last position) has slope 0 and passes nothing back."""

    name = "quantile"

    def forward(self, q: Tensor, weight: Tensor, slope: Tensor, axis: int = 0):
        if self.recording:
            self.saved = (q.shape, slope, axis)
        return weight

    def backward(self, g: Tensor):
        q_shape, slope, axis = self.saved
        # where the slope is 0 the weight's gradient may be NaN (a NaN row's x[hi] - x[lo])
        rows = sk.where(slope, ew.binary("mul", g, slope), Tensor.zeros(g.queue, ()))
        axes = tuple(d for d in range(g.ndim) if d != axis)
        return (rd.sum(rows, axes) if axes else rows).reshape(q_shape)


def _slopes(op: str, raw: Tensor, axis: int) -> Tensor:
    """``m - 1`` for each row of ``raw`` along ``axis`` (1 there), 0 where the row gives NaN:
    ``m`` the row's length (quantile: no NaN in it) or its count of non-NaNs (nanquantile)."""
    nans = rd.sum(ew.unary("isnan", raw), axis, keepdims=True)
    last = float(raw.shape[axis] - 1)
    if op == "quantile":
        return ew.scalar("mul", ew.scalar("eq", nans, 0.0), last)
    return ew.scalar("maximum", ew.scalar("rsub", nans, last), 0.0)


def _quantile(op: str, x, q, dim, keepdim: bool, interpolation: str, tape):
    _input(op, x)
    if interpolation not in ok.INTERPOLATIONS:
        raise ShapeError(f"{op}: interpolation must be one of {', '.join(ok.INTERPOLATIONS)},"
                         f" got {interpolation!r}")
    # only linear's weight moves with q; the other interpolations are steps in it
    level = q if isinstance(q, Node) and q.requires_grad and interpolation == "linear" else None
    if isinstance(q, Node):
        q = q.value
    if isinstance(q, Tensor):
        if q.dtype != FLOAT or q.ndim > 1:
            raise ShapeError(f"{op}: q must be a float32 tensor of at most 1 dim, got "
                             f"{q.shape} of dtype {q.dtype}")
        # read back for the range check below, as PyTorch's (its all().item() waits too)
        qs, scalar = q.to_host().reshape(-1), q.ndim == 0
    elif isinstance(q, Real) and not isinstance(q, bool):
        qs, scalar = np.array([q], np.float32), True
    else:
        raise DTypeError(f"{op}: q must be a number or a tensor, got {type(q).__name__}")
    if qs.size == 0 or not ((qs >= 0) & (qs <= 1)).all():
        raise ShapeError(f"{op}: q must be in the range [0, 1], got {qs.tolist()}")
    shape = tuple(x.shape)
    whole = dim is None
    flat = reshape(x, (-1,), tape=tape) if whole else x
    flat, axis, raw, perm = _rows(op, flat, 0 if whole else dim, tape)
    # a non-blocking upload from parcl's own snapshot (a captured step replays it): no wait
    lo, hi, w = ok.pick(raw, perm, axis, op, Tensor.from_host(raw.queue, qs), interpolation)
    taken = _TAKEN[op]
    values = taken.apply(flat, lo, tape=tape, axis=axis)
    if level is not None:
        w = _Level.apply(level, tape=tape, weight=w, slope=_slopes(op, raw, axis), axis=axis)
    if interpolation in ("linear", "midpoint"):
        values = lerp(values, taken.apply(flat, hi, tape=tape, axis=axis), w, tape=tape)
    # values: the input's shape with len(q) along axis; q's dim first, then the reduced shape
    if whole:
        rest = (1,) * len(shape) if keepdim else ()
    else:
        rest = shape[:axis] + ((1,) if keepdim else ()) + shape[axis + 1:]
        if not shape:
            rest = ()
        values = movedim(values, axis, 0, tape=tape) if len(flat.shape) > 1 else values
    return reshape(values, rest if scalar else (qs.size, *rest), tape=tape)


def quantile(x, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear",
             tape=None):
    """``torch.quantile``: the ``q``-th quantiles (a number, or a 0-d or 1-D tensor of them
    in ``[0, 1]``: read to the host once) of every element (``dim=None``) or along ``dim``;
    a 1-D ``q`` adds a first dim. Between two sorted elements ``interpolation`` is
    ``"linear"``, ``"lower"``, ``"higher"``, ``"midpoint"`` or ``"nearest"`` (halves to the
    even position), the rank ``q * (n - 1)`` computed in float32 as PyTorch's. A row holding
    NaN gives NaN. The gradient goes to the sorted elements, weighted as interpolated, and
    with ``"linear"`` to a ``q`` that requires grad, as PyTorch's.

    >>> tp.quantile(x, 0.25, interpolation="higher").item()       # x [[3, 1, 2, 1]]
    1.0
    """
    return _quantile("quantile", x, q, dim, bool(keepdim), interpolation, tape)


def nanquantile(x, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear",
                tape=None):
    """``torch.nanquantile``: ``quantile`` of the elements that are not NaN (NaN where a
    row has none).

    >>> float(tp.nanquantile(tp.tensor(np.array([1.0, np.nan, 3.0], np.float32)), 0.5))
    2.0
    """
    return _quantile("nanquantile", x, q, dim, bool(keepdim), interpolation, tape)


def kthvalue(x, k: int, dim: int = -1, keepdim: bool = False, *, tape=None) -> SortResult:
    """``torch.kthvalue``: ``(values, indices)`` of the ``k``-th smallest element along
    ``dim`` (``1 <= k <= size``; NaN the largest). Among equal values the index is the k-th of
    the stable order (PyTorch's is its selection's, any of them).

    >>> tp.kthvalue(x, 2, 1).indices.to_host()       # x [[3, 1, 2, 1]]
    array([3])
    """
    _input("kthvalue", x)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ShapeError(f"kthvalue: k must be an int, got {k!r} (input {tuple(x.shape)})")
    shape = tuple(x.shape)
    axis = wrap_dim("kthvalue", dim, len(shape), shape)
    n = shape[axis] if shape else 1
    if not 1 <= k <= n:
        raise ShapeError(f"kthvalue: k={k} is out of range for dim {dim} of size {n} (input "
                         f"{shape}); expected 1 <= k <= {n}")
    flat = x if shape else reshape(x, (1,), tape=tape)
    raw = flat.value if isinstance(flat, Node) else flat
    first = sorting.argsort(raw, axis, False, int(k))
    key = tuple(slice(k - 1, k) if d == axis else slice(None) for d in range(raw.ndim))
    picked = strided.read_view(first, strided.parse_key("kthvalue", first.shape, key))
    return _result("kthvalue", x, flat, axis, picked, keepdim, tape)


def mode(x, dim: int = -1, keepdim: bool = False, *, tape=None) -> SortResult:
    """``torch.mode``: ``(values, indices)``: the most frequent value along ``dim`` (the
    smallest of equally frequent ones; NaNs all count as different) and the index of its
    last occurrence, as PyTorch's. Reached as ``x.mode(dim)`` (``tp.mode`` is the grad-mode
    module).

    >>> x.mode(1).values.item(), x.mode(1).indices.item()           # x [[3, 1, 2, 1]]
    (1.0, 3)
    """
    flat, axis, raw, perm = _rows("mode", x, dim, tape)
    return _result("mode", x, flat, axis, ok.mode_pick(raw, perm, axis), keepdim, tape)


def msort(x, *, tape=None):
    """``torch.msort``: ``x`` sorted along its first dim (``sort(x, 0).values``).

    >>> tp.msort(tp.tensor(np.array([[2.0], [1.0]], np.float32))).to_host()
    array([[1.],
           [2.]], dtype=float32)
    """
    return sort(x, 0, tape=tape).values


def aminmax(x, *, dim=None, keepdim: bool = False, tape=None) -> MinMax:
    """``torch.aminmax``: ``(min, max)`` (a named tuple) over every element or along
    ``dim``, as ``amin`` and ``amax`` (tied extremes share the gradient evenly, as torch's).

    >>> tp.aminmax(x).max.item()                    # x [[3, 1, 2, 1]]
    3.0
    """
    return MinMax(amin(x, dim, keepdim, tape=tape), amax(x, dim, keepdim, tape=tape))
