"""Ops that draw random numbers besides dropout: ``rrelu`` (random leaky slopes while training)
and ``gumbel_softmax`` (a softmax of logits plus Gumbel noise, optionally one-hot with the soft
gradient), as PyTorch's.

Every draw takes the next call of this thread's dropout generator (``tp.manual_seed``,
``tp.rng_state``): the same seed gives the same draws in every run and replica thread,
``tp.checkpoint``'s recomputation draws them again where the forward did, and each replay of a
captured step takes the generator's next call, as the eager call would (never the recording's
numbers again). The draws are kernels of ``parcl/kernels/random_draws.py``.

>>> tp.manual_seed(0)
>>> y = tp.rrelu(tp.tensor(np.array([-1.0, 2.0], np.float32)), 0.1, 0.3, training=True)
>>> bool(-0.3 <= y.to_host()[0] <= -0.1), float(y.to_host()[1])
(True, 2.0)
"""

from __future__ import annotations

import warnings

import numpy as np

from ... import recorder
from ...errors import ParclError
from ...kernels import elementwise as ew
from ...kernels import random_draws as rd
from ...kernels.random import mask_key
from ...tensor import Tensor
from ..node import Function, Node
from .activation import _number, leaky_relu
from .elementwise import add, mul, sub
from .loss import softmax
from .nn import dropout_generator
from .reductions import argmax
from .scatters import scatter
from .shape import wrap_dim

__all__ = ["gumbel_softmax", "rrelu"]


def draw_key() -> int:
    """The key of this thread's generator's next call, for the launch about to be enqueued
    (``redraw`` after the launch: every replay of a captured step takes the next call)."""
    return mask_key(*dropout_generator().next_call())


def redraw(index: int) -> None:
    """Have every replay set argument ``index`` of the launch just recorded to the key of the
    recording thread's generator's next call (nothing when not recording)."""
    if recorder.current() is None:
        return
    gen = dropout_generator()
    recorder.replay_arg(index, lambda: np.uint64(mask_key(*gen.next_call())))


class RReLU(Function):
    name = "rrelu"

    def forward(self, x: Tensor, lower: float = 0.125, upper: float = 1.0 / 3.0):
        y, noise = rd.rrelu(x, lower, upper, draw_key())
        redraw(rd.RRELU_KEY_ARG)
        # the slopes live in a buffer the replays of a captured step write again, so a
        # recorded backward reads the replay's own slopes
        self.noise = noise if self.recording else None
        return y

    def backward(self, g: Tensor):
        return ew.binary("mul", g, self.noise)


def rrelu(x, lower: float = 1.0 / 8.0, upper: float = 1.0 / 3.0, training: bool = False,
          inplace: bool = False, *, tape=None):
    """``F.rrelu`` (note PyTorch's default ``training=False``): while training ``x`` where
    ``x > 0``, else ``a * x`` with a slope ``a`` drawn uniformly from ``[lower, upper]`` for
    every element (from this thread's seeded generator; the gradient is the same slope); in
    evaluation ``leaky_relu`` with the mean slope ``(lower + upper) / 2``. ``inplace=True`` is
    refused.

    >>> tp.rrelu(tp.tensor(np.array([-2.0, 3.0], np.float32)), 0.1, 0.3).to_host()
    array([-0.4,  3. ], dtype=float32)
    """
    lo, hi = _number("rrelu", "lower", lower), _number("rrelu", "upper", upper)
    if not lo <= hi:
        raise ParclError(f"rrelu: lower bound must be less than or equal to upper bound, got "
                         f"lower={lower}, upper={upper}")
    if inplace:
        raise ParclError("rrelu: inplace=True is not supported; parcl's rrelu writes a new "
                         "tensor (drop the argument)")
    if not training:
        return leaky_relu(x, (lo + hi) / 2.0, tape=tape)
    return RReLU.apply(x, tape=tape, lower=lo, upper=hi)


def gumbel_softmax(logits, tau: float = 1.0, hard: bool = False, eps: float = 1e-10,
                   dim: int = -1, *, tape=None):
    """``F.gumbel_softmax``: ``softmax((logits + g) / tau, dim)`` with ``g`` standard Gumbel
    noise from this thread's seeded generator; with ``hard=True`` the one-hot of each
    sample's largest entry (the first of ties) in the forward and the soft sample's gradient
    (``y_hard - y_soft.detach() + y_soft``, PyTorch's straight-through). ``eps`` is unused, as
    PyTorch's (a value other than 1e-10 warns).

    >>> tp.manual_seed(0)
    >>> y = tp.gumbel_softmax(tp.tensor(np.zeros((2, 4), np.float32)), hard=True)
    >>> y.to_host().sum(1).tolist()
    [1.0, 1.0]
    """
    if eps != 1e-10:
        warnings.warn("gumbel_softmax: `eps` parameter is deprecated and has no effect.",
                      DeprecationWarning, stacklevel=2)
    t = _number("gumbel_softmax", "tau", tau)
    if not t > 0:
        raise ParclError(f"gumbel_softmax: tau must be positive, got {tau}")
    shape = tuple(logits.shape)
    axis = wrap_dim("gumbel_softmax", dim, len(shape), shape)
    noise = rd.gumbel(logits.queue, shape, draw_key())
    redraw(rd.GUMBEL_KEY_ARG)
    y_soft = softmax(mul(add(logits, noise, tape=tape), 1.0 / t, tape=tape), axis, tape=tape)
    if not hard:
        return y_soft
    soft = y_soft.value if isinstance(y_soft, Node) else y_soft
    index = argmax(soft, axis, keepdims=True)
    y_hard = scatter(Tensor.zeros(logits.queue, shape), axis, index, 1.0)
    # PyTorch's straight-through: y_hard's values, y_soft's gradient
    return add(sub(y_hard, soft), y_soft, tape=tape)
