"""Ops that draw random numbers besides dropout: ``rrelu`` (random leaky slopes while training),
``gumbel_softmax`` (a softmax of logits plus Gumbel noise, optionally one-hot with the soft
gradient) and ``fractional_max_pool2d`` (max pooling over pseudo-random windows), as PyTorch's.

Every draw takes the next call of this thread's dropout generator (``tp.manual_seed``,
``tp.rng_state``): the same seed gives the same draws in every run and replica thread,
``tp.checkpoint``'s recomputation draws them again where the forward did, and each replay of a
captured step takes the generator's next call, as the eager call would (never the recording's
numbers again). The draws are kernels of ``parcl/kernels/draws.py``.

>>> tp.manual_seed(0)
>>> y = tp.rrelu(tp.tensor(np.array([-1.0, 2.0], np.float32)), 0.1, 0.3, training=True)
>>> bool(-0.3 <= y.to_host()[0] <= -0.1), float(y.to_host()[1])
(True, 2.0)
"""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import draws
from ...kernels import elementwise as ew
from ...kernels import fractional_pool as fpk
from ...tensor import FLOAT, Tensor
from ..node import Function, Node
from .activation import _number, leaky_relu
from .elementwise import add, mul, sub
from .gather import gather
from .loss import softmax
from .reductions import argmax
from .sampling import key_source
from .scatters import scatter
from .shape import as_batched, reshape, wrap_dim

__all__ = ["fractional_max_pool2d", "gumbel_softmax", "rrelu"]


class RReLU(Function):
    name = "rrelu"

    def forward(self, x: Tensor, lower: float = 0.125, upper: float = 1.0 / 3.0):
        y, noise = draws.rrelu(x, lower, upper, key_source())
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
    noise = draws.gumbel(logits.queue, shape, key_source())
    y_soft = softmax(mul(add(logits, noise, tape=tape), 1.0 / t, tape=tape), axis, tape=tape)
    if not hard:
        return y_soft
    soft = y_soft.value if isinstance(y_soft, Node) else y_soft
    index = argmax(soft, axis, keepdims=True)
    y_hard = scatter(Tensor.zeros(logits.queue, shape), axis, index, 1.0)
    # PyTorch's straight-through: y_hard's values, y_soft's gradient
    return add(sub(y_hard, soft), y_soft, tape=tape)


def _pair(op: str, name: str, value) -> tuple[int, int]:
    pair = (value, value) if np.ndim(value) == 0 else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                 and v > 0 for v in pair):
        raise ShapeError(f"{op}: {name} must be a positive int or a pair of them, got "
                         f"{value!r}")
    return int(pair[0]), int(pair[1])


def fractional_max_pool2d(x, kernel_size, output_size=None, output_ratio=None,
                          return_indices: bool = False, _random_samples=None, *, tape=None):
    """``F.fractional_max_pool2d`` over ``(N, C, H, W)`` or ``(C, H, W)``: the maximum of a
    ``kernel_size`` window per output element, the windows' starts pseudo-random per plane
    (Graham's fractional max pooling, PyTorch's intervals) from two uniform samples per plane
    drawn from this thread's dropout generator (``_random_samples`` ``(N, C, 2)`` instead, as
    PyTorch's). ``output_size`` (an int or pair) or ``output_ratio`` (in (0, 1): ``int(H *
    ratio)``). ``return_indices=True`` also returns each maximum's position ``h * W + w``
    (int64, not recorded). The gradient goes to each window's maximum (the first of ties), in
    a fixed order.

    >>> tp.manual_seed(0)
    >>> tp.fractional_max_pool2d(tp.tensor(np.ones((1, 2, 7, 7), np.float32)), 2,
    ...                          output_ratio=0.5).shape
    (1, 2, 3, 3)
    """
    op = "fractional_max_pool2d"
    x4, batched = as_batched(op, x, "C, H, W", tape=tape)      # (C, H, W): N = 1
    shape = tuple(x4.shape)
    if x4.dtype != FLOAT:
        raise DTypeError(f"{op}: input of shape {shape} has dtype {x4.dtype}, expected float32")
    kh, kw = _pair(op, "kernel_size", kernel_size)
    n, c, h, w = shape
    if output_size is None:
        if output_ratio is None:
            raise ParclError(f"{op}: requires specifying either an output_size or an "
                             "output_ratio")
        ratio = (output_ratio, output_ratio) if np.ndim(output_ratio) == 0 \
            else tuple(output_ratio)
        if len(ratio) != 2 or not all(0 < float(r) < 1 for r in ratio):
            raise ParclError(f"{op}: output_ratio must be between 0 and 1 (got "
                             f"{output_ratio!r})")
        output_size = (int(h * float(ratio[0])), int(w * float(ratio[1])))
    oh, ow = _pair(op, "output_size", output_size)
    if oh + kh - 1 > h or ow + kw - 1 > w:
        dim, k, size = ("height", kh, h) if oh + kh - 1 > h else ("width", kw, w)
        raise ShapeError(f"{op}: pool {dim} {k} too large relative to input {dim} {size} "
                         f"for an output of {(oh, ow)} (input {shape})")
    if _random_samples is None:
        samples = draws.open_uniform(x4.queue, (n, c, 2), key_source())
    else:
        samples = _random_samples.value if isinstance(_random_samples, Node) \
            else _random_samples
        if not isinstance(samples, Tensor):
            samples = Tensor.from_host(x4.queue, np.asarray(samples, np.float32))
        if tuple(samples.shape) != (n, c, 2):
            raise ShapeError(f"{op}: _random_samples must have shape ({n}, {c}, 2) for input "
                             f"{shape}, got {tuple(samples.shape)}")
    raw = x4.value if isinstance(x4, Node) else x4
    index = fpk.window_argmax(raw, samples, (kh, kw), (oh, ow))
    out = reshape(gather(reshape(x4, (n, c, h * w), tape=tape), 2, index, tape=tape),
                  (n, c, oh, ow) if batched else (c, oh, ow), tape=tape)
    return (out, index.reshape(out.shape)) if return_indices else out
