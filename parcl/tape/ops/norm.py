"""Normalisation ops: ``layer_norm``, ``rms_norm`` and ``group_norm`` (PyTorch's functional
forms). Each forward saves the per-row mean and inverse standard deviation its kernel computed,
and the backward reads them (Entrenar's LayerNorm metadata); nothing is recomputed but the
normalised values themselves.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3)), True)
>>> with tp.Tape() as tape:
...     y = tp.layer_norm(x, 3)
>>> np.round(y.to_host()[0], 3)
array([-1.225,  0.   ,  1.225], dtype=float32)
"""

from __future__ import annotations

from math import prod

import numpy as np

from ...errors import ShapeError
from ...kernels import batchnorm as bnk
from ...kernels import elementwise as ew
from ...kernels import norm as nk
from ...kernels.elementwise import check_float
from ...tensor import Tensor, check_same_queue, dims
from ..node import ACCUMULATED, Function

__all__ = ["group_norm", "layer_norm", "rms_norm"]

#: PyTorch's default ``eps`` of ``rms_norm``: ``torch.finfo(torch.float32).eps``.
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def _normalized_shape(op: str, x: Tensor, normalized_shape, **params) -> tuple[int, int]:
    """``normalized_shape`` as a tuple, checked against ``x``'s trailing dims and the shapes of
    ``params``; returns it with D, the number of elements per row."""
    shape = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) \
        else dims(op, normalized_shape)
    if not shape or x.ndim < len(shape) or tuple(x.shape[-len(shape):]) != shape:
        raise ShapeError(f"{op}: input of shape {x.shape} does not end with normalized_shape "
                         f"{shape}")
    for name, t in params.items():
        if t is None:
            continue
        check_float(op, t)
        if tuple(t.shape) != shape:
            raise ShapeError(f"{op}: {name} has shape {t.shape}, expected normalized_shape "
                             f"{shape}")
    check_float(op, x)
    check_same_queue(op, x, *[t for t in params.values() if t is not None])
    return shape, prod(shape)


class _RowNorm(Function):
    """layer_norm / rms_norm: one fused kernel per direction over (rows, D)."""

    takes_targets = True

    center = True

    def forward(self, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                normalized_shape=(), eps: float = 1e-5):
        shape, D = _normalized_shape(self.name, x, normalized_shape, weight=weight, bias=bias)
        y, mean, rstd = nk.norm_forward(x, D, weight, bias, eps, center=self.center)
        if self.recording:
            # the op's metadata: each row's mean and inverse std, read by the backward
            self.mean, self.rstd = mean, rstd
            self.x, self.weight, self.shape, self.D = x, weight, shape, D
        return y

    def backward(self, g: Tensor):
        shape, D = self.shape, self.D
        need = self.needs_input_grad
        into_w, into_b = self.grad_targets.get(1), self.grad_targets.get(2)
        gx, gw, gb = nk.norm_backward(self.x, g, D, self.mean, self.rstd, self.weight,
                                      center=self.center,
                                      need_input=need[0], need_weight=need[1],
                                      need_bias=len(need) > 2 and need[2],
                                      weight_into=into_w, bias_into=into_b)
        # A parameter's existing .grad took the sum in the kernel itself: nothing left to add
        gw = ACCUMULATED if into_w is not None and gw is not None else \
            (gw.reshape(shape) if gw is not None else None)
        gb = ACCUMULATED if into_b is not None and gb is not None else \
            (gb.reshape(shape) if gb is not None else None)
        return gx, gw, gb


class LayerNorm(_RowNorm):
    name = "layer_norm"


class RmsNorm(_RowNorm):
    name = "rms_norm"
    center = False

    def forward(self, x, weight, normalized_shape=(), eps=FLOAT32_EPS):
        return super().forward(x, weight, None, normalized_shape, eps)

    def backward(self, g):
        gx, gw, _ = super().backward(g)
        return gx, gw


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *, tape=None):
    """``torch.nn.functional.layer_norm``: normalise over the last ``len(normalized_shape)``
    dims (mean and biased variance), then ``* weight + bias`` (each of ``normalized_shape``,
    or None).

    >>> tp.layer_norm(x, (3,), w, b).shape           # x (2, 3)
    (2, 3)
    """
    return LayerNorm.apply(x, weight, bias, tape=tape, normalized_shape=normalized_shape,
                           eps=float(eps))


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None, *, tape=None):
    """``torch.nn.functional.rms_norm``: ``x / sqrt(mean(x**2) + eps) * weight`` over the last
    ``len(normalized_shape)`` dims; ``eps=None`` is ``torch.finfo(torch.float32).eps``.

    >>> tp.rms_norm(x, 3).shape                      # x (2, 3)
    (2, 3)
    """
    return RmsNorm.apply(x, weight, tape=tape, normalized_shape=normalized_shape,
                         eps=FLOAT32_EPS if eps is None else float(eps))


class GroupNorm(Function):
    """Rows are (sample, group) blocks of ``C/G * spatial`` elements, normalised without an
    affine step by the row kernels; the per-channel affine follows as broadcast elementwise
    ops (its gradients are channel sums of the usual kind)."""

    name = "group_norm"

    def forward(self, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                num_groups: int = 1, eps: float = 1e-5):
        check_float("group_norm", x, *[t for t in (weight, bias) if t is not None])
        if x.ndim < 2:
            raise ShapeError(f"group_norm: expects input (N, C, *), got shape {x.shape}")
        c = x.shape[1]
        if num_groups < 1 or c % num_groups:
            raise ShapeError(f"group_norm: {c} channels (input {x.shape}) are not divisible "
                             f"into num_groups={num_groups}")
        for nm, t in (("weight", weight), ("bias", bias)):
            if t is not None and tuple(t.shape) != (c,):
                raise ShapeError(f"group_norm: {nm} has shape {t.shape}, expected ({c},) for "
                                 f"input {x.shape}")
        check_same_queue("group_norm", x, *[t for t in (weight, bias) if t is not None])
        D = prod(x.shape[1:]) // num_groups      # not x.size // N: a batch x[n:] has N = 0
        h, mean, rstd = nk.norm_forward(x, D, None, None, eps, center=True)
        self.cshape = (c,) + (1,) * (x.ndim - 2)         # a per-channel vector, broadcastable
        y = h
        if weight is not None:
            y = ew.binary("mul", h, weight.reshape(self.cshape))
        if bias is not None:
            y = ew.binary("add", y, bias.reshape(self.cshape), out=y if y is not h else None)
        if self.recording:
            self.mean, self.rstd = mean, rstd          # per (sample, group)
            self.saved = (x, weight, D, h if weight is not None else None)
        return y

    def backward(self, g: Tensor):
        x, weight, D, h = self.saved
        mean, rstd = self.mean, self.rstd
        need = self.needs_input_grad
        gw = gb = gx = None
        # Per-channel sums in batch norm's blocked order: a plain reduction's long running
        # sums lose ~10x torch's accuracy over N * spatial values
        if need[1]:
            gw = bnk.channel_sum(ew.binary("mul", g, h))
        if need[2]:
            gb = bnk.channel_sum(g)
        if need[0]:
            gh = ew.binary("mul", g, weight.reshape(self.cshape)) if weight is not None else g
            gx, _, _ = nk.norm_backward(x, gh, D, mean, rstd, None, center=True)
        return gx, gw, gb


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5, *, tape=None):
    """``torch.nn.functional.group_norm``: ``x`` (N, C, *) normalised over each group of
    ``C // num_groups`` channels (and all spatial positions), then a per-channel ``weight``
    and ``bias`` (each (C,), or None).

    >>> tp.group_norm(x, 2).shape                   # x (2, 4, 3)
    (2, 4, 3)
    """
    # int() would take 1.9 groups for 1 (num_channels / 2.0 computed as a float): PyTorch's
    # group_norm refuses a float or a bool
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
        raise ShapeError(f"group_norm: num_groups must be an int, got {num_groups!r}")
    return GroupNorm.apply(x, weight, bias, tape=tape, num_groups=int(num_groups),
                           eps=float(eps))
