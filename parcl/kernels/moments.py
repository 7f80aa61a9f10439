"""Variance and standard deviation over axes (``correction`` as PyTorch's), built from the
fixed-order reduction kernels, so bit-identical run to run: ``tp.var``/``tp.std``'s forward
and a raw Tensor's ``var``/``std`` alike.
"""

from __future__ import annotations

from math import prod

import numpy as np

from ..tensor import Tensor
from . import elementwise as ew
from . import reduction as rd


def unbiased_alone(axis, unbiased) -> tuple:
    """torch.var's (std's, var_mean's, std_mean's) overload of one bool, ``torch.var(x,
    False)``: ``unbiased`` over every dim, not a dim."""
    if isinstance(axis, (bool, np.bool_)) and unbiased is None:
        return None, axis
    return axis, unbiased


def correction_of(op: str, unbiased, correction) -> float:
    """The divisor's correction from PyTorch's older ``unbiased`` (True: 1, False: 0) or its
    ``correction`` (None: 1); both given is a TypeError, as PyTorch refuses them."""
    if unbiased is None:
        return float(1 if correction is None else correction)
    if correction is not None:
        raise TypeError(f"{op}: unbiased={unbiased!r} and correction={correction!r} given "
                        "both; give one (unbiased=False is correction=0)")
    if not isinstance(unbiased, (bool, np.bool_)):
        raise TypeError(f"{op}: unbiased must be a bool, got {type(unbiased).__name__}")
    return float(unbiased)


def variance(op: str, x: Tensor, axis, keepdims: bool, correction: float,
             root: bool = False) -> tuple[Tensor, Tensor, tuple[int, ...], float]:
    """``sum((x - mean)**2) / (N - correction)`` over ``axis`` (its square root if ``root``):
    the result, the kept-dims mean, the normalised axes and the scale ``1 / (N -
    correction)``, which a backward reads."""
    ew.check_float(op, x)
    axes = rd.normalize_axes(op, axis, x.ndim, x.shape)
    n = prod(x.shape[k] for k in axes)
    dof = n - correction
    # N <= correction divides by zero, as PyTorch: 0/0 = NaN, otherwise inf
    scale = 1.0 / dof if dof > 0 else float("inf")
    # the mean refined by the mean of what is left: a float32 sum of 5000 values near 1e6
    # is off by about 1 (its rounding), which would add 1 to a variance of 1 (torch sums
    # in double); after one refinement the residual is what the deviations' sum rounds
    mean = rd.mean(x, axes, keepdims=True)
    d = ew.binary("sub", x, mean)
    ew.binary("add", mean, rd.mean(d, axes, keepdims=True), out=mean)
    ew.binary("sub", x, mean, out=d)
    ew.unary("square", d, out=d)
    out = ew.scale_(rd.sum(d, axes, keepdims), scale)
    if root:
        ew.unary("sqrt", out, out=out)
    return out, mean, axes, scale
