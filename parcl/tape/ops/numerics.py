"""PyTorch's covariance, integration and matrix builders: ``cov``, ``corrcoef``,
``trapezoid``, ``cumulative_trapezoid``, ``vander`` and ``renorm``.

All are composed of recorded ops (``sum``, ``mul``, ``mm``, ``narrow``, ``cumsum``,
``cumprod``, ``linalg_vector_norm``, ``where``), so their gradients are those ops' and their
sums run in a fixed order. They follow PyTorch's formulas term for term (``trapezoid`` with a
spacing ``dx`` is ``(sum(y) - (y[0] + y[-1]) / 2) * dx``, ``vander`` a cumulative product, so
its gradient at 0 is finite; ``renorm`` scales by ``maxnorm / (norm + 1e-7)``), and so round
as PyTorch's float32 does. ``cov``'s weights are checked on the host, as PyTorch checks them
(a wait for weights that live on the device).

>>> y = tp.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
>>> float(tp.trapezoid(y)), tp.cumulative_trapezoid(y).to_host()
(4.0, array([1.5, 4. ], dtype=float32))
>>> tp.vander(y, 3).to_host()[2]
array([9., 3., 1.], dtype=float32)
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from ...errors import DTypeError, ParclError, ShapeError
from ...tensor import LABEL_DTYPES, Tensor
from ..node import Node
from .activation import clamp
from .composed import _number, _tensor, linalg_vector_norm
from .diagonals import diagonal
from .elementwise import add, div, mul, sub
from .indexing import expand, flip, getitem
from .join import cat
from .linalg import mm
from .mathops_more import clamp_min
from .reduce import mean, sum
from .reductions import cumsum
from .scans import cumprod
from .select import where
from .shape import reshape, squeeze, transpose, unsqueeze, wrap_dim
from .slices import narrow
from .unary import sqrt

__all__ = ["corrcoef", "cov", "cumulative_trapezoid", "renorm", "trapezoid", "vander"]


# -- cov and corrcoef ------------------------------------------------------------------------
def _host_weights(what: str, w, observations: int, shape) -> np.ndarray:
    """A weight vector's host values, checked as PyTorch checks them (a device one is read
    back: a wait)."""
    if isinstance(w, (Node, Tensor)):
        value = w.value if isinstance(w, Node) else w
        host, dtype = value.to_host(), value.dtype
    else:
        host = np.asarray(w)
        dtype = host.dtype
    if host.ndim > 1:
        raise ShapeError(f"cov: expected {what} to have one or fewer dimensions, got shape "
                         f"{host.shape} (input {shape})")
    if host.size != observations:
        raise ShapeError(f"cov: expected {what} to have as many elements as the input has "
                         f"observations, got {host.size} != {observations} (input {shape})")
    if what == "fweights" and dtype not in LABEL_DTYPES and not np.issubdtype(dtype,
                                                                             np.integer):
        raise DTypeError(f"cov: expected fweights to have an integral dtype, got {dtype} "
                         f"(input {shape})")
    if (host < 0).any():
        raise ParclError(f"cov: {what} cannot be negative, got {host.reshape(-1).tolist()}")
    return host.reshape(observations)


def cov(input, *, correction: int = 1, fweights=None, aweights=None, tape=None):  # noqa: A002
    """``torch.cov``: the covariance matrix ``(V, V)`` of the variables (rows) of ``input``
    ``(V, N)`` (a 1-D input is one variable: a 0-d result, as is one row). ``correction``
    (1: Bessel's, 0: none) and the optional ``fweights`` (integer observation counts, 0-d or
    ``(N,)``: a numpy array or an int tensor) and ``aweights`` (float importance weights: a
    Node gets its gradient) as PyTorch: ``w = fweights * aweights``, the mean weighted by
    ``w``, divided by ``sum(w) - correction * sum(w * aweights) / sum(w)`` (``sum(w) -
    correction`` without aweights), or by 0 where that is not positive (inf and NaN, as
    PyTorch's). Negative weights are a ``ParclError``.

    >>> tp.cov(tp.stack([y, y * 2])).to_host()
    array([[1., 2.],
           [2., 4.]], dtype=float32)
    """
    _tensor("cov", "input", input)
    shape = tuple(input.shape)
    if len(shape) > 2:
        raise ShapeError(f"cov: expected an input of two or fewer dimensions (variables, "
                         f"observations), got shape {shape}")
    corr = _number("cov", "correction", correction)
    x = reshape(input, (1, -1) if len(shape) < 2 else shape, tape=tape)
    observations = tuple(x.shape)[1]
    q = input.queue
    w = None
    if fweights is not None:
        host = _host_weights("fweights", fweights, observations, shape)
        w = Tensor.from_host(q, host.astype(np.float32))
    if aweights is not None:
        _host_weights("aweights", aweights, observations, shape)
        aw = aweights
        if isinstance(aw, np.ndarray):
            aw = Tensor.from_host(q, aw.astype(np.float32))
        aw = reshape(aw, (observations,), tape=tape)
        w = aw if w is None else mul(w, aw, tape=tape)
    if w is None:
        avg = mean(x, 1, tape=tape)
        factor = max(observations - corr, 0.0)
    else:
        w_sum = sum(w, tape=tape)
        avg = div(sum(mul(x, w, tape=tape), 1, tape=tape), w_sum, tape=tape)
        if aweights is None:
            factor = sub(w_sum, corr, tape=tape)
        else:
            shrink = div(sum(mul(w, aw, tape=tape), tape=tape), w_sum, tape=tape)
            factor = sub(w_sum, mul(shrink, corr, tape=tape), tape=tape)
        factor = clamp_min(factor, 0.0, tape=tape)
    xm = sub(x, unsqueeze(avg, 1, tape=tape), tape=tape)
    weighted = xm if w is None else mul(xm, w, tape=tape)
    c = div(mm(xm, transpose(weighted, tape=tape), tape=tape), factor, tape=tape)
    return squeeze(c, tape=tape)


def corrcoef(input, *, tape=None):  # noqa: A002
    """``torch.corrcoef``: Pearson's correlation coefficients ``cov / sqrt(var_i * var_j)`` of
    the rows of ``input (V, N)``, clipped to ``[-1, 1]`` as PyTorch; a single variable gives
    ``c / c`` (1, or NaN for a constant one).

    >>> tp.corrcoef(tp.stack([y, -y])).to_host()
    array([[ 1., -1.],
           [-1.,  1.]], dtype=float32)
    """
    c = cov(input, tape=tape)
    if not tuple(c.shape):
        return div(c, c, tape=tape)
    std = sqrt(diagonal(c, tape=tape), tape=tape)
    c = div(c, unsqueeze(std, 1, tape=tape), tape=tape)
    c = div(c, unsqueeze(std, 0, tape=tape), tape=tape)
    return clamp(c, -1.0, 1.0, tape=tape)


# -- trapezoid and cumulative_trapezoid ------------------------------------------------------
def _select(x, axis: int, index: int, tape):
    return getitem(x, (slice(None),) * axis + (index,), tape=tape)


def _spacing(op: str, y, x, dx, dim, tape):
    """``(y, axis, n, spacing)``: the samples' dim and a number ``dx`` or the tensor of
    ``x``'s differences along it (``x`` 1-D of ``n``, or broadcasting against ``y``)."""
    _tensor(op, "y", y)
    shape = tuple(y.shape)
    if not shape:
        raise ShapeError(f"{op}: y must have at least one dim, got shape ()")
    axis = wrap_dim(op, dim, len(shape), shape)
    n = shape[axis]
    if x is None:
        return axis, n, 1.0 if dx is None else _number(op, "dx", dx)
    if dx is not None:
        raise ParclError(f"{op}: x and dx given both; give the sample points or their "
                         f"spacing (y {shape})")
    _tensor(op, "x", x)
    xs = tuple(x.shape)
    if len(xs) == 1:
        if xs[0] != n:
            raise ShapeError(f"{op}: x {xs} must hold one value per sample point: {n} along "
                             f"dim {axis} of y {shape}")
        x = reshape(x, tuple(n if k == axis else 1 for k in range(len(shape))), tape=tape)
    elif len(xs) < len(shape):
        x = reshape(x, (1,) * (len(shape) - len(xs)) + xs, tape=tape)
    xs = tuple(x.shape)
    ax = wrap_dim(op, dim, len(xs), xs)
    if xs[ax] != n:
        raise ShapeError(f"{op}: x {xs} must hold one value per sample point: {n} along dim "
                         f"{axis} of y {shape}")
    return axis, n, x


def trapezoid(y, x=None, *, dx: float | None = None, dim: int = -1, tape=None):
    """``torch.trapezoid``: the trapezoidal rule along ``dim``, with the sample points ``x``
    (1-D, one per sample, or broadcasting against ``y``; they get a gradient too) or a
    constant spacing ``dx`` (1 when neither is given). One sample gives 0.

    >>> float(tp.trapezoid(y, dx=0.5)), float(tp.trapezoid(y, y))
    (2.0, 4.0)
    """
    axis, n, spacing = _spacing("trapezoid", y, x, dx, dim, tape)
    if n <= 1:                 # no interval: 0, y kept in the graph with a zero gradient
        return where(0.0, sum(y, axis, tape=tape), 0.0, tape=tape)
    if isinstance(spacing, Real):
        ends = add(_select(y, axis, 0, tape), _select(y, axis, -1, tape), tape=tape)
        inner = sub(sum(y, axis, tape=tape), mul(ends, 0.5, tape=tape), tape=tape)
        return mul(inner, spacing, tape=tape)
    pairs = _pair_sums(y, axis, n, tape)
    return div(sum(mul(_differences(spacing, dim, n, tape), pairs, tape=tape), axis,
                   tape=tape), 2.0, tape=tape)


def _pair_sums(y, axis, n, tape):
    return add(narrow(y, axis, 1, n - 1, tape=tape), narrow(y, axis, 0, n - 1, tape=tape),
               tape=tape)


def _differences(x, dim, n, tape):
    ax = wrap_dim("trapezoid", dim, len(x.shape), tuple(x.shape))
    return sub(narrow(x, ax, 1, n - 1, tape=tape), narrow(x, ax, 0, n - 1, tape=tape),
               tape=tape)


def cumulative_trapezoid(y, x=None, *, dx: float | None = None, dim: int = -1, tape=None):
    """``torch.cumulative_trapezoid``: the running trapezoidal sums along ``dim`` (one fewer
    than the samples), with ``x`` or ``dx`` as ``trapezoid``'s; summed in order.

    >>> tp.cumulative_trapezoid(y, dx=2).to_host()
    array([3., 8.], dtype=float32)
    """
    axis, n, spacing = _spacing("cumulative_trapezoid", y, x, dx, dim, tape)
    pairs = _pair_sums(y, axis, n, tape)
    if isinstance(spacing, Real):
        return cumsum(mul(pairs, spacing / 2.0, tape=tape), axis, tape=tape)
    areas = div(mul(_differences(spacing, dim, n, tape), pairs, tape=tape), 2.0, tape=tape)
    return cumsum(areas, axis, tape=tape)


# -- vander and renorm -----------------------------------------------------------------------
def vander(x, N: int | None = None, increasing: bool = False, *, tape=None):  # noqa: N803
    """``torch.vander``: the Vandermonde matrix ``(n, N)`` of a 1-D ``x``, its columns the
    powers ``x ** (N-1) ... x ** 0`` (``increasing=True``: ``x ** 0`` first); ``N`` defaults to
    ``len(x)``. The powers are a cumulative product, as PyTorch's, so the gradient at 0 is
    finite.

    >>> tp.vander(y, 2, increasing=True).to_host()[1]
    array([1., 2.], dtype=float32)
    """
    _tensor("vander", "x", x)
    shape = tuple(x.shape)
    if len(shape) != 1:
        raise ShapeError(f"vander: x must be a one-dimensional tensor, got shape {shape}")
    n = shape[0]
    cols = n if N is None else N
    if isinstance(cols, bool) or not isinstance(cols, (int, np.integer)) or cols < 0:
        raise ShapeError(f"vander: N must be a non-negative int, got {N!r} (x {shape})")
    column = unsqueeze(x, 1, tape=tape)
    ones = where(0.0, column, 1.0, tape=tape)      # x ** 0, x kept with a zero gradient
    if cols <= 1:
        out = narrow(ones, 1, 0, int(cols), tape=tape)
    else:
        powers = cumprod(expand(column, (n, int(cols) - 1), tape=tape), 1, tape=tape)
        out = cat([ones, powers], 1, tape=tape)
    return out if increasing else flip(out, 1, tape=tape)


def renorm(input, p: float, dim: int, maxnorm: float, *, tape=None):  # noqa: A002
    """``torch.renorm``: each slice of ``input`` along ``dim`` (``input.select(dim, i)``)
    whose ``p``-norm exceeds ``maxnorm`` scaled by ``maxnorm / (norm + 1e-7)``, the others
    as they are; the gradient runs through the norm, as PyTorch's.

    >>> tp.renorm(tp.stack([y, y / 10]), 2, 0, 1.0).to_host()[1]
    array([0.1, 0.2, 0.3], dtype=float32)
    """
    _tensor("renorm", "input", input)
    shape = tuple(input.shape)
    if len(shape) < 2:
        raise ShapeError(f"renorm: input needs at least 2 dimensions, got shape {shape}")
    axis = wrap_dim("renorm", dim, len(shape), shape)
    p = _number("renorm", "p", p)
    maxnorm = _number("renorm", "maxnorm", maxnorm)
    if not p > 0:
        raise ParclError(f"renorm: p must be positive, got {p} (input {shape})")
    if not maxnorm >= 0:
        raise ParclError(f"renorm: maxnorm must be >= 0, got {maxnorm} (input {shape})")
    others = tuple(k for k in range(len(shape)) if k != axis)
    norm = linalg_vector_norm(input, p, others, True, tape=tape)
    raw = norm.value if isinstance(norm, Node) else norm
    over = raw > maxnorm
    factor = where(over, div(maxnorm, add(norm, 1e-7, tape=tape), tape=tape), 1.0, tape=tape)
    return mul(input, factor, tape=tape)
