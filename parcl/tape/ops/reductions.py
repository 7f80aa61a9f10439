"""More reductions: ``max``, ``min`` (torch.max's: ``(values, indices)`` along a dim, the
gradient to the first extreme element; over all shared among ties), ``argmax``, ``argmin``
(int64, no gradient), ``var``, ``std`` (``correction`` as PyTorch), ``logsumexp``
(max-shifted) and ``cumsum``. ``axis`` is None (everything), an int or a tuple of ints,
negative counting from the end, as numpy; ``max``/``min``/``argmax``/``argmin``/``cumsum``
take one.

All are built from the fixed-order reduction kernels (``parcl.kernels.reduction``) and
elementwise ops, so results are bit-identical run to run.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([[1.0, 5.0], [5.0, 2.0]], np.float32)), True)
>>> with tp.Tape() as tape:
...     m = tp.max(x)
>>> tape.backward(m)
>>> x.grad.to_host()                     # two maximal elements: half each, as torch.max(x)
array([[0. , 0.5],
       [0.5, 0. ]], dtype=float32)
"""

from __future__ import annotations

from ...errors import ParclError
from ...kernels import elementwise as ew
from ...kernels import layout
from ...kernels import reduction as rd
from ...kernels import scan
from ...kernels import select as sk
from ...kernels.moments import correction_of, unbiased_alone, variance
from ...kernels.strided import axis_int
from ...tensor import SortResult, Tensor
from ..node import Function, Node
from .creation import value_of
from .elementwise import maximum, minimum
from .reduce_dims import Amax, Amin
from .shape import wrap_dim
from .torch_names import torch_names

__all__ = ["argmax", "argmin", "cumsum", "logsumexp", "max", "min", "std", "var"]


class _Extreme(Function):
    """max / min along one dim, of values and indices ``first_extreme`` found before (the
    caller returns the indices); the backward puts the gradient at each row's index."""

    def forward(self, x: Tensor, found: Tensor = None, indices: Tensor = None, axis: int = 0):
        if self.recording:
            self.saved = (indices, x.shape, axis)
        return found

    def backward(self, g: Tensor):
        indices, shape, axis = self.saved
        if not shape:                  # a 0-d input: its one element
            return scan.put_rows(g, indices, 1).reshape(())
        R = shape[axis]
        t = scan.put_rows(g, indices, R).reshape(shape[:axis] + shape[axis + 1:] + (R,))
        if axis != len(shape) - 1:     # the reduced axis back from last to its place
            t = layout.transpose(t, [*range(axis), len(shape) - 1, *range(axis, len(shape) - 1)])
        return t


class Max(_Extreme):
    name = "max"


class Min(_Extreme):
    name = "min"


class MaxAll(Amax):
    """``torch.max(x)`` of every element: ties share the gradient evenly (``amax``'s rule),
    and NaN extremes are ties as torch.max's (torch.amax gives every element NaN there)."""

    name = "max"
    nan_ties = True


class MinAll(Amin):
    name = "min"
    nan_ties = True


def _refuse_axis(op: str, axis) -> None:
    """numpy's ``axis=`` named the values alone here, where PyTorch's ``dim`` (positional or
    by keyword) returns ``(values, indices)``: code written for either reading would misread
    the other's result, so the numpy name is refused rather than given a second meaning."""
    if axis is not None:
        raise ParclError(f"{op}: axis={axis!r} is not taken: tp.{op}(x, dim) returns "
                         f"(values, indices) as torch.{op}; use tp.{op}(x, dim).values for the "
                         f"values (gradient to the first extreme) or tp.a{op}(x, dim) (ties "
                         "share it)")


def _extreme(op: str, per_dim, over_all, pick, x, dim, keepdim, axis, keepdims, tape):
    """torch.max's / torch.min's overloads: every element (0-d), ``(values, indices)`` along
    the int ``dim``, or the elementwise extreme of a tensor ``other`` in ``dim``'s place."""
    _refuse_axis(op, axis)
    keepdim = bool(keepdim if keepdims is None else keepdims)
    if isinstance(dim, (Node, Tensor)):
        return pick(x, dim, tape=tape)
    if dim is None:
        return over_all.apply(x, tape=tape, dim=None, keepdim=keepdim)
    raw = value_of(op, x)
    # the Tensor's max(dim) / min(dim): one kernel for both; recorded, the backward reads these
    # indices (a write into them is a write into what it reads, which it then refuses)
    values, indices = getattr(raw, op)(dim, keepdim)
    (axis,) = rd.normalize_axes(op, dim, raw.ndim, raw.shape) or (0,)      # a 0-d x: ()
    return SortResult(per_dim.apply(x, tape=tape, found=values, indices=indices, axis=axis),
                      indices)


# torch.max(x, 1) is the pair (values, indices), so `_, pred = tp.max(logits, 1)` must not
# unpack a batch of 2's two row maxima into `_` and `pred`, as numpy's values-only reading did.
def max(x, dim=None, keepdim: bool = False, *,  # noqa: A001
        axis=None, keepdims: bool | None = None, tape=None):
    """``torch.max``: ``tp.max(x)`` the largest element (NaN propagates; tied maxima share the
    gradient evenly); ``tp.max(x, dim, keepdim=False)`` the named tuple ``(values, indices)``
    along ``dim``, the gradient to the first maximal element of each row; a tensor in
    ``dim``'s place is ``torch.max(input, other)``: ``tp.maximum(x, other)``. numpy's
    ``axis=`` is refused (``tp.amax`` takes it for the values).

    >>> values, indices = tp.max(x, 1)     # x [[1, 5], [5, 2]]
    >>> values.to_host(), indices.to_host()
    (array([5., 5.], dtype=float32), array([1, 0]))
    """
    return _extreme("max", Max, MaxAll, maximum, x, dim, keepdim, axis, keepdims, tape)


def min(x, dim=None, keepdim: bool = False, *,  # noqa: A001
        axis=None, keepdims: bool | None = None, tape=None):
    """``torch.min``: the smallest element, ``(values, indices)`` along ``dim``, or
    ``tp.minimum(x, other)``; the gradients as ``max``'s.

    >>> tp.min(x, 0).indices.to_host()     # x [[1, 5], [5, 2]]
    array([0, 1])
    """
    return _extreme("min", Min, MinAll, minimum, x, dim, keepdim, axis, keepdims, tape)


@torch_names()
def argmax(x, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the first largest element along ``axis`` (None: of the flattened tensor), as
    an int64 ``pc.Tensor``: no gradient, never recorded.

    >>> tp.argmax(x, axis=1).to_host()      # x [[1, 5], [5, 2]]
    array([1, 0])
    """
    return value_of("argmax", x).argmax(axis, keepdims)


@torch_names()
def argmin(x, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the first smallest element along ``axis`` (None: flattened), int64.

    >>> tp.argmin(x, axis=1).to_host()      # x [[1, 5], [5, 2]]
    array([0, 1])
    """
    return value_of("argmin", x).argmin(axis, keepdims)


# -- variance and standard deviation ----------------------------------------------------------
class Var(Function):
    """``sum((x - mean)**2) / (N - correction)``; saves ``x`` and the kept-dims mean, and
    the backward is ``2 (x - mean) / (N - correction) * g``."""

    name = "var"
    root = False

    def forward(self, x: Tensor, axis=None, keepdims: bool = False, correction: float = 1):
        out, mean, axes, self.scale = variance(self.name, x, axis, keepdims, correction,
                                               self.root)
        if self.recording:
            self.saved = (x, mean, out if self.root else None,    # only std's reads it
                          rd.reduced_shape(x.shape, axes, True))
        return out

    def backward(self, g: Tensor):
        x, mean, out, kept = self.saved
        if self.root:
            # d std = d var / (2 std); 0 where std is 0 (PyTorch's std_backward: no NaN)
            gv = ew.scale_(ew.binary("div", g, out), 0.5)
            zero = Tensor.zeros(g.queue, ())
            g = sk.where(ew.scalar("le", out, 0.0), zero, gv)
        t = ew.binary("sub", x, mean)
        ew.binary("mul", t, g.reshape(kept), out=t)
        return ew.scale_(t, 2.0 * self.scale)


class Std(Var):
    name = "std"
    root = True


# var's and std's positional arguments are torch.var's (input, dim, unbiased, keepdim):
# torch.var(x, 1, False) is the biased variance, so tp.var(x, 1, False) must not read its
# False as keepdims and return the unbiased one.
@torch_names(empty_dim_is_all=True)
def var(x, axis=None, unbiased: bool | None = None, keepdims: bool = False, *,
        correction: float | None = None, tape=None):
    """Variance over ``axis`` with ``correction`` (1, PyTorch's default: unbiased; 0: the
    population variance) or PyTorch's ``unbiased`` (True or False). Fewer elements than
    ``correction`` + 1 give NaN or inf, as PyTorch.

    >>> tp.var(x, axis=0, correction=0).shape      # x (2, 3)
    (3,)
    """
    axis, unbiased = unbiased_alone(axis, unbiased)
    return Var.apply(x, tape=tape, axis=axis, keepdims=bool(keepdims),
                     correction=correction_of("var", unbiased, correction))


@torch_names(empty_dim_is_all=True)
def std(x, axis=None, unbiased: bool | None = None, keepdims: bool = False, *,
        correction: float | None = None, tape=None):
    """``sqrt(var(x, axis, keepdims=..., correction=...))`` (or ``unbiased=``); its gradient
    is 0 (not NaN) where the standard deviation is 0, as PyTorch's.

    >>> tp.std(x).shape
    ()
    """
    axis, unbiased = unbiased_alone(axis, unbiased)
    return Std.apply(x, tape=tape, axis=axis, keepdims=bool(keepdims),
                     correction=correction_of("std", unbiased, correction))


# -- logsumexp and cumsum -----------------------------------------------------------------------
class LogSumExp(Function):
    name = "logsumexp"

    def forward(self, x: Tensor, axis=None, keepdims: bool = False):
        ew.check_float(self.name, x)
        axes = rd.normalize_axes(self.name, axis, x.ndim, x.shape)
        # over no elements a shift of 0 (a sum of nothing): log(0) = -inf, as PyTorch's
        m = rd.max(x, axes, keepdims=True) if x.size else rd.sum(x, axes, keepdims=True)
        # Shift by the max, except where it is infinite (as PyTorch): then by 0, so +inf
        # stays +inf and an all -inf block gives -inf instead of NaN
        infinite = ew.scalar("ge", ew.unary("abs", m), float("inf"))
        m = sk.where(infinite, Tensor.zeros(x.queue, ()), m)
        t = ew.binary("sub", x, m)
        ew.unary("exp", t, out=t)
        out = rd.sum(t, axes, keepdims=True)
        ew.unary("log", out, out=out)
        ew.binary("add", out, m, out=out)
        if self.recording:
            self.saved = (x, out)
        return out.reshape(rd.reduced_shape(x.shape, axes, keepdims))

    def backward(self, g: Tensor):
        x, out = self.saved                       # out with kept dims
        t = ew.binary("sub", x, out)
        ew.unary("exp", t, out=t)                 # softmax over the reduced block
        return ew.binary("mul", t, g.reshape(out.shape), out=t)


@torch_names(empty_dim_is_all=True)
def logsumexp(x, axis=None, keepdims: bool = False, *, tape=None):
    """``log(sum(exp(x)))`` over ``axis``, computed shifted by the max: no overflow for large
    inputs, ``-inf`` for an all ``-inf`` block. ``torch.logsumexp``.

    >>> tp.logsumexp(x, axis=-1).shape      # x (2, 3)
    (2,)
    """
    return LogSumExp.apply(x, tape=tape, axis=axis, keepdims=bool(keepdims))


class CumSum(Function):
    name = "cumsum"

    def forward(self, x: Tensor, axis: int = 0):
        self.axis = axis
        if x.ndim == 0:               # its own sum (the scan kernel wants an axis)
            return scan.cumsum(x.reshape((1,)), 0).reshape(())
        return scan.cumsum(x, axis)

    def backward(self, g: Tensor):
        if g.ndim == 0:
            return g
        return scan.cumsum(g, self.axis, reverse=True)


@torch_names()
def cumsum(x, axis: int, *, tape=None):
    """Inclusive cumulative sum along ``axis`` (``torch.cumsum``), summed in order in blocks of
    256 (about 20 ulps over 1e6 terms); a 0-d tensor takes 0 and -1 and is its own sum, as
    PyTorch's.

    >>> tp.cumsum(x, axis=1).shape         # x (2, 3)
    (2, 3)
    """
    axis = axis_int("cumsum", axis, x.shape)
    if not x.shape:
        wrap_dim("cumsum", axis, 0, ())
    return CumSum.apply(x, tape=tape, axis=axis)

