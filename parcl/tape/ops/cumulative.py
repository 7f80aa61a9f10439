"""Running extremes and sums along one dim: ``cummax``, ``cummin`` (``(values, indices)``,
PyTorch's) and ``logcumsumexp`` (``log(cumsum(exp(x)))`` without overflow).

One work-item per row in order along it (``parcl/kernels/order.py``), so the results are the
same bits on every run. ``cummax``'s values are ``x`` at its indices, so the gradient of each
goes to the element it came from (gather's backward, repeated positions added in order);
``logcumsumexp``'s gradient is summed from the end of the row in log space.

>>> x = tp.tensor(np.array([1.0, 3.0, 2.0, 3.0], np.float32), requires_grad=True)
>>> tp.cummax(x, 0).indices.to_host()
array([0, 1, 1, 3])
>>> tp.logcumsumexp(x, 0).shape
(4,)
"""

from __future__ import annotations

from ...errors import DTypeError
from ...kernels import gather as gk
from ...kernels import order as ok
from ...kernels import scatter as sc
from ...tensor import FLOAT, Tensor
from ..node import Function, Node
from .shape import reshape, wrap_dim
from .sorting import SortResult

__all__ = ["cummax", "cummin", "logcumsumexp"]


class _Reached(Function):
    """``x`` at the positions where the running extreme was reached; the backward adds the
    gradient there."""

    name = "cummax"

    def forward(self, x: Tensor, index: Tensor, axis: int = 0):
        out, _ = gk.gather_forward(x, axis, index)
        if self.recording:
            self.saved = (x.shape, axis, index)
        return out

    def backward(self, g: Tensor):
        x_shape, axis, index = self.saved
        return sc.gather_backward(g, x_shape, axis, index), None


class _ReachedMin(_Reached):
    name = "cummin"


class LogCumSumExp(Function):
    name = "logcumsumexp"

    def forward(self, x: Tensor, axis: int = 0):
        out = ok.logcumsumexp(x, axis)
        if self.recording:
            self.saved = (x, out, axis)
        return out

    def backward(self, g: Tensor):
        x, out, axis = self.saved
        return ok.logcumsumexp_backward(x, out, g, axis)


def _along(op: str, x, dim, tape):
    if not isinstance(x, (Node, Tensor)):
        raise TypeError(f"{op}: expected a tp.Node or pc.Tensor, got {type(x).__name__}")
    if x.dtype != FLOAT:
        raise DTypeError(f"{op}: input {tuple(x.shape)} has dtype {x.dtype}, expected "
                         "float32")
    shape = tuple(x.shape)
    axis = wrap_dim(op, dim, len(shape), shape)
    return (x if shape else reshape(x, (1,), tape=tape)), axis


def _cumextreme(op: str, fn, x, dim, tape) -> SortResult:
    flat, axis = _along(op, x, dim, tape)
    raw = flat.value if isinstance(flat, Node) else flat
    index = ok.cumextreme(raw, axis, largest=op == "cummax")[1]
    index.checks = raw.checks
    values = fn.apply(flat, index, tape=tape, axis=axis)
    if not x.shape:
        return SortResult(reshape(values, (), tape=tape), index.reshape(()))
    return SortResult(values, index)


def cummax(x, dim: int, *, tape=None) -> SortResult:
    """``torch.cummax``: ``(values, indices)``, the running maximum along ``dim`` and the
    index where it was last reached (an equal value moves it on; a NaN takes over and stays,
    as PyTorch's). The gradient of each value goes to that index. op_name ``"cummax"``.

    >>> tp.cummax(x, 0).values.to_host()               # x [1, 3, 2, 3]
    array([1., 3., 3., 3.], dtype=float32)
    """
    return _cumextreme("cummax", _Reached, x, dim, tape)


def cummin(x, dim: int, *, tape=None) -> SortResult:
    """``torch.cummin``: ``cummax`` with the running minimum.

    >>> tp.cummin(x, 0).indices.to_host()              # x [1, 3, 2, 3]
    array([0, 0, 0, 0])
    """
    return _cumextreme("cummin", _ReachedMin, x, dim, tape)


def logcumsumexp(x, dim: int, *, tape=None):
    """``torch.logcumsumexp``: ``log(cumsum(exp(x)))`` along ``dim``, as a running
    log-add-exp (no overflow; ``-inf`` and ``+inf`` as their limits). Its gradient,
    ``sum_{j >= k} g_j exp(x_k - out_j)``, is summed in log space too. op_name
    ``"logcumsumexp"``.

    >>> tp.logcumsumexp(tp.tensor(np.array([0.0, 0.0], np.float32)), 0).to_host()
    array([0.       , 0.6931472], dtype=float32)
    """
    flat, axis = _along("logcumsumexp", x, dim, tape)
    out = LogCumSumExp.apply(flat, tape=tape, axis=axis)
    return out if x.shape else reshape(out, (), tape=tape)
