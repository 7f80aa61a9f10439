"""Gradient clipping (``pc.nn.utils``): PyTorch's ``clip_grad_norm_`` and ``clip_grad_value_``,
computed on the device.

The global norm is formed in a fixed order, so it is the same bit for bit on every run: each
tensor's partial (sum of squares, sum of ``|g|**p``, or max of ``|g|``) in the reduction
kernels' order, then the partials folded left to right, then the root, by the fused kernels of
``parcl.kernels.gradnorm`` (one launch per tensor, one to finish); for a norm type above 1,
``get_total_norm`` first scales the gradients by ``min(2**40 / max|g|, 1)`` (exactly 1 for any
ordinary gradient), so powers that would overflow float32 cannot make the norm inf
(``clip_grad_norm_`` does so only when the plain norm it reads back overflowed).
``clip_grad_norm_`` reads the norm back once (its return value; twice where it overflowed);
the two halves it is made of, ``get_total_norm`` (a 0-d device tensor) and
``clip_grads_with_norm_`` (scales by a device scalar), never read anything, so a training step
can clip without waiting for the device (as PyTorch's functions of the same names do).

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> p = pc.nn.Parameter(pc.Tensor.from_host(q, np.zeros(2, np.float32)))
>>> p.grad = pc.Tensor.from_host(q, np.array([3.0, 4.0], np.float32))
>>> round(pc.nn.utils.clip_grad_norm_([p], max_norm=1.0), 4)
5.0
>>> np.round(p.grad.to_host(), 4)
array([0.6, 0.8], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..errors import ParclError
from ..kernels import elementwise as ew
from ..kernels import gradnorm
from ..tape.node import Node
from ..tensor import Tensor, check_same_queue

__all__ = ["ClipError", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_",
           "get_total_norm"]

EPS = 1e-6      # PyTorch's: clip_coef = max_norm / (total_norm + 1e-6)


class ClipError(ParclError, ValueError):
    """A norm type that is not a positive number, or a non-finite norm when it is refused."""


def _norm_type(norm_type) -> float:
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        raise ClipError(f"clip_grad_norm_: norm_type must be a number or inf, got "
                        f"{norm_type!r}") from None
    if not p > 0:
        raise ClipError(f"clip_grad_norm_: norm_type must be > 0 (2.0, 1.0, inf, ...), got {p}")
    return p


def get_total_norm(tensors: Iterable[Tensor], norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """The ``norm_type``-norm of all ``tensors`` together (as if concatenated), as a 0-d
    tensor on their queue; enqueued, nothing is read back, unless ``error_if_nonfinite``:
    then the norm is read and a NaN or infinite one is a ``ClipError``, as PyTorch's. All
    tensors must share one queue. ``foreach`` is taken for PyTorch's signature.

    >>> total = pc.nn.utils.get_total_norm([p.grad for p in model.parameters()])  # doctest: +SKIP
    >>> float(total.item())                                                        # doctest: +SKIP
    """
    _foreach("get_total_norm", foreach)
    p = _norm_type(norm_type)
    tensors = list(tensors)
    if not tensors:
        raise ClipError("get_total_norm: no tensors given")
    bad = [type(t).__name__ for t in tensors if not isinstance(t, Tensor)]
    if bad:
        raise TypeError(f"get_total_norm: expected pc.Tensors, got {bad[0]}")
    check_same_queue("get_total_norm", *tensors)
    total = _norm(tensors, p, scaled=True)
    if error_if_nonfinite:
        _check_finite("get_total_norm", float(total.item()), norm_type, len(tensors))
    return total


def _foreach(where: str, foreach) -> None:
    """PyTorch's ``foreach`` (None or a bool): each tensor is one kernel either way."""
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(f"{where}: foreach must be None or a bool, got {foreach!r}")


def _check_finite(where: str, value: float, norm_type, count: int) -> None:
    if not math.isfinite(value):
        raise ClipError(f"{where}: the total norm of order {norm_type} of {count} gradients "
                        f"is non-finite ({value}); nothing was clipped "
                        f"(error_if_nonfinite=False scales them anyway)")


def _norm(tensors: list[Tensor], p: float, scaled: bool) -> Tensor:
    """The norm; ``scaled``: for p > 1 of the tensors scaled by ``min(2**40 / max|g|, 1)``
    first (bit for bit the plain norm unless that overflows; see ``kernels.gradnorm``). One
    launch per tensor and one to finish (twice that scaled), in the order of summation of
    ``reduction.sum`` over each tensor's powers, folded left to right."""
    return gradnorm.total_norm(tensors, p, scaled)


def _grads(parameters) -> list[Tensor]:
    if isinstance(parameters, (Node, Tensor)):
        parameters = [parameters]
    grads = []
    for p in parameters:
        g = p if isinstance(p, Tensor) else p.grad
        if g is not None:
            grads.append(g)
    return grads


def _max_norm(where: str, value) -> float:
    """``max_norm`` as a float >= 0 (``inf``: nothing is clipped). A negative one would flip
    every gradient's sign and a NaN make every gradient NaN, silently (PyTorch does both)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = float(value)
    except (TypeError, ValueError):
        raise ClipError(f"{where}: max_norm must be a number, got {value!r}") from None
    if not v >= 0:                 # also NaN
        raise ClipError(f"{where}: max_norm must be >= 0, got {v} (a negative one would flip "
                        "the gradients' sign, a NaN make them NaN)")
    return v


def clip_grads_with_norm_(parameters, max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """Scale the gradients of ``parameters`` in place by ``min(max_norm / (total_norm +
    1e-6), 1)``, ``total_norm`` a 0-d device tensor (from ``get_total_norm``): nothing is read
    back. Parameters without a gradient are skipped. ``foreach`` as PyTorch's (no effect)."""
    _foreach("clip_grads_with_norm_", foreach)
    max_norm = _max_norm("clip_grads_with_norm_", max_norm)
    if not isinstance(total_norm, Tensor):
        raise TypeError(f"clip_grads_with_norm_: total_norm must be a pc.Tensor (from "
                        f"get_total_norm), got {type(total_norm).__name__}")
    if total_norm.size != 1:
        # the kernel reads its first element: a norm per gradient would clip every gradient
        # by the first one's, where PyTorch's in-place multiply refuses the shape
        raise ClipError(f"clip_grads_with_norm_: total_norm must hold one number (a 0-d "
                        f"tensor from get_total_norm), got shape {tuple(total_norm.shape)}")
    grads = _grads(parameters)
    if grads:
        gradnorm.clip_by_norm_(grads, total_norm, max_norm, EPS)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> float:
    """Clip the global norm of the gradients of ``parameters`` (an iterable of Parameters,
    or one) to ``max_norm``, in place, as ``torch.nn.utils.clip_grad_norm_``; returns the norm
    before clipping, over every gradient together (parameters without one are skipped; with
    none the result is 0.0). ``norm_type`` 2.0, inf, 1.0 or any p > 0. The gradients are
    multiplied by ``min(max_norm / (norm + 1e-6), 1)`` on the device; the one host read is
    the returned norm. ``error_if_nonfinite=True`` raises ``ClipError`` for a NaN or infinite
    norm, before any gradient is changed. ``foreach`` as PyTorch's (no effect).

    >>> opt.zero_grad(); tape.backward(loss)                                  # doctest: +SKIP
    >>> norm = pc.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # doctest: +SKIP
    >>> opt.step()                                                            # doctest: +SKIP
    """
    _foreach("clip_grad_norm_", foreach)
    max_norm = _max_norm("clip_grad_norm_", max_norm)
    grads = _grads(parameters)
    if not grads:
        return 0.0
    p = _norm_type(norm_type)
    check_same_queue("clip_grad_norm_", *grads)
    # The plain norm first, read back (the one host read): only where it overflowed is the
    # scaled one formed, so an ordinary step enqueues no more kernels than it did.
    total = _norm(grads, p, scaled=False)
    value = float(total.item())
    if value == math.inf and p > 1.0:      # powers too large for float32, or an inf gradient
        total = _norm(grads, p, scaled=True)
        value = float(total.item())
    if error_if_nonfinite:
        _check_finite("clip_grad_norm_", value, norm_type, len(grads))
    gradnorm.clip_by_norm_(grads, total, max_norm, EPS)
    return value


def clip_grad_value_(parameters, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` (an iterable of Parameters, or one) into
    ``[-clip_value, clip_value]`` in place, as ``torch.nn.utils.clip_grad_value_``: one clamp
    kernel per gradient on its queue, nothing read back. A NaN gradient element stays NaN (as
    PyTorch's clamp keeps it); parameters without a gradient are skipped. ``clip_value`` must
    be a number >= 0 (``inf`` leaves the gradients as they are); a negative or NaN one is a
    ``ClipError`` (PyTorch would set every gradient to ``clip_value``, or to NaN).
    ``foreach`` is accepted for PyTorch's signature: each gradient is one kernel either way.

    >>> pc.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)     # doctest: +SKIP
    """
    _foreach("clip_grad_value_", foreach)
    try:
        if isinstance(clip_value, bool):
            raise TypeError
        c = float(clip_value)
    except (TypeError, ValueError):
        raise ClipError(f"clip_grad_value_: clip_value must be a number, got "
                        f"{clip_value!r}") from None
    if not c >= 0:                  # also NaN
        raise ClipError(f"clip_grad_value_: clip_value must be >= 0 (the gradients are clamped "
                        f"to [-clip_value, clip_value]), got {c}")
    grads = _grads(parameters)
    for g in grads:                 # every gradient checked before any is changed
        ew.check_float("clip_grad_value_", g)
    for g in grads:
        ew.unary("clamp", g, out=g, p=-c, q=c)
