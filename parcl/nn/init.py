"""``pc.nn.init``: PyTorch's weight initialisers, in place on a Parameter, Node or Tensor.

Values are drawn on the host from this thread's seeded generator (``pc.nn.manual_seed``; or
the numpy ``generator=`` given) in float64, rounded to float32 and copied into the tensor, so
the same program initialises bit-identical models in every run and in every replica thread
(``ReplicaGroup`` builds each replica's model from a copy of its caller's generator). The copy
is noted as an in-place change, as ``Tensor.copy_``: a replica group copies replica 0's new
values to the others before its next step. Each function returns its argument, as PyTorch's.

The distributions, fans and gains are PyTorch's (``torch.nn.init``); the random streams are
numpy's, so the values are not PyTorch's own draws.

>>> lin = pc.nn.Linear(64, 32)
>>> _ = pc.nn.init.kaiming_normal_(lin.weight, mode="fan_out", nonlinearity="relu")
>>> _ = pc.nn.init.zeros_(lin.bias)
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from .. import recorder
from ..errors import DTypeError, ParclError, ShapeError
from ..tape.node import Node, leaf_viewed
from ..tensor import Tensor
from .module import HOST_DRAW, default_generator

__all__ = ["InitError", "calculate_gain", "constant_", "dirac_", "eye_", "kaiming_normal_",
           "kaiming_uniform_", "normal_", "ones_", "orthogonal_", "sparse_", "trunc_normal_",
           "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_"]


class InitError(ParclError, ValueError):
    """An initialiser's option PyTorch refuses: an unknown nonlinearity or fan mode."""


_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for ``nonlinearity`` (PyTorch's table): 1 for linear layers and
    sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope^2)) for leaky_relu (slope
    ``param``, 0.01 if None), 3/4 for selu."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, Real) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise InitError(f"calculate_gain: negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise InitError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


# -- the tensor written -------------------------------------------------------------------
def _target(tensor, name: str) -> Tensor:
    if isinstance(tensor, Node) and tensor.grad_fn is not None and leaf_viewed(tensor) is None:
        # PyTorch's init_(w[0]) writes through a view into w; parcl's indexing copies, so the
        # write would change a temporary and no parameter
        raise ParclError(f"nn.init.{name}: the tensor is the output of '{tensor.op_name}' "
                         f"(shape {tensor.shape}), a new tensor (parcl's indexing, transpose "
                         "and permute copy: tensors have no strides), so the write would reach "
                         "no parameter, where PyTorch's writes through the view. Initialise "
                         "the parameter itself, or set its rows with copy_ of new values")
    t = tensor.value if isinstance(tensor, Node) else tensor
    if not isinstance(t, Tensor):
        raise DTypeError(f"nn.init.{name}: expected a Parameter, Node or pc.Tensor, got "
                         f"{type(tensor).__name__}")
    if t.dtype != np.float32:
        raise DTypeError(f"nn.init.{name}: only float32 tensors are initialised, got "
                         f"{t.dtype} of shape {t.shape}")
    return t


def _write(tensor, name: str, draw) -> object:
    """``draw(shape)`` (a host array) into ``tensor``'s buffer, in place; returns ``tensor``."""
    t = _target(tensor, name)
    values = np.asarray(draw(tuple(t.shape)), dtype=np.float32)
    t.copy_(Tensor.from_host(t.queue, values.reshape(t.shape)))
    return tensor


def _generator(generator) -> np.random.Generator:
    if generator is None:
        return default_generator()      # its draws keep a captured step eager
    recorder.unsafe(HOST_DRAW)          # a given generator's draws too
    return generator


def _fans(shape, name: str) -> tuple[int, int]:
    """(fan_in, fan_out) as PyTorch reads them: dims 1 and 0, times the receptive field (the
    product of the dims after 1)."""
    if len(shape) < 2:
        raise ShapeError(f"nn.init.{name}: fan in and fan out can not be computed for a "
                         f"tensor of fewer than 2 dimensions, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _fan(shape, mode: str, name: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise InitError(f"nn.init.{name}: mode {mode!r} not supported, use 'fan_in' or "
                        "'fan_out'")
    fan_in, fan_out = _fans(shape, name)
    return fan_in if mode == "fan_in" else fan_out


# -- plain distributions ------------------------------------------------------------------
def uniform_(tensor, a: float = 0.0, b: float = 1.0, *, generator=None):
    """Fill ``tensor`` with values drawn from U(a, b)."""
    gen = _generator(generator)
    return _write(tensor, "uniform_", lambda shape: gen.uniform(a, b, size=shape))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, *, generator=None):
    """Fill ``tensor`` with values drawn from N(mean, std^2)."""
    gen = _generator(generator)
    return _write(tensor, "normal_", lambda shape: mean + std * gen.standard_normal(shape))


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  *, generator=None):
    """Fill ``tensor`` with N(mean, std^2) truncated to [a, b] (``a`` and ``b`` are values,
    not multiples of ``std``, as PyTorch's). Drawn by the inverse CDF, so bounds far out in
    a tail cost nothing more; an interval whose mass lies past 5.4 ``std`` on one side, where
    that loses its precision, by rejection from an exponential (``_tail_draw``)."""
    if not a < b:
        raise InitError(f"nn.init.trunc_normal_: the bounds must have a < b, got a={a}, b={b}")
    gen = _generator(generator)

    def draw(shape):
        alpha, beta = (a - mean) / std, (b - mean) / std
        if _in_far_tail(alpha, beta):
            x = _tail_draw(gen, alpha, beta, shape) if alpha >= 0 else \
                -_tail_draw(gen, -beta, -alpha, shape)
            return np.clip(mean + std * x, a, b)
        lo, hi = _normal_cdf(alpha), _normal_cdf(beta)
        u = gen.uniform(2 * lo - 1, 2 * hi - 1, size=shape)      # erf of the standard value
        return np.clip(mean + std * math.sqrt(2.0) * _erfinv(u), a, b)

    return _write(tensor, "trunc_normal_", draw)


def constant_(tensor, val: float):
    """Fill ``tensor`` with ``val``."""
    return _fill(tensor, val, "constant_")


def ones_(tensor):
    """Fill ``tensor`` with ones."""
    return _fill(tensor, 1.0, "ones_")


def zeros_(tensor):
    """Fill ``tensor`` with zeros."""
    return _fill(tensor, 0.0, "zeros_")


def _fill(tensor, val: float, name: str):
    _target(tensor, name).fill_(float(val))
    return tensor


def eye_(tensor):
    """The identity in a 2-D ``tensor`` (ones on the diagonal of a rectangular one too)."""
    def draw(shape):
        if len(shape) != 2:
            raise ShapeError(f"nn.init.eye_: only 2-D tensors are supported, got shape {shape}")
        return np.eye(*shape)

    return _write(tensor, "eye_", draw)


def dirac_(tensor, groups: int = 1):
    """The Dirac delta in a 3-, 4- or 5-D convolution weight: the convolution passes input
    channel d on to output channel d of each of ``groups`` groups, where both exist."""
    def draw(shape):
        if len(shape) not in (3, 4, 5):
            raise ShapeError(f"nn.init.dirac_: only 3-, 4- or 5-D tensors are supported, got "
                             f"shape {shape}")
        if shape[0] % groups:
            raise ShapeError(f"nn.init.dirac_: dim 0 ({shape[0]}) must be divisible by groups "
                             f"({groups})")
        out = np.zeros(shape)
        per_group = shape[0] // groups
        centre = tuple(s // 2 for s in shape[2:])
        for g in range(groups):
            for d in range(min(per_group, shape[1])):
                out[(g * per_group + d, d, *centre)] = 1.0
        return out

    return _write(tensor, "dirac_", draw)


# -- scaled by the fans ---------------------------------------------------------------------
def xavier_uniform_(tensor, gain: float = 1.0, *, generator=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    gen = _generator(generator)

    def draw(shape):
        fan_in, fan_out = _fans(shape, "xavier_uniform_")
        bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
        return gen.uniform(-bound, bound, size=shape)

    return _write(tensor, "xavier_uniform_", draw)


def xavier_normal_(tensor, gain: float = 1.0, *, generator=None):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    gen = _generator(generator)

    def draw(shape):
        fan_in, fan_out = _fans(shape, "xavier_normal_")
        return gain * math.sqrt(2.0 / (fan_in + fan_out)) * gen.standard_normal(shape)

    return _write(tensor, "xavier_normal_", draw)


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", *, generator=None):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al., 2015); ``a`` is the
    negative slope of a leaky_relu, ``mode`` picks fan_in (the forward pass's variance) or
    fan_out (the backward pass's)."""
    gen = _generator(generator)

    def draw(shape):
        fan = _fan(shape, mode, "kaiming_uniform_")
        bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
        return gen.uniform(-bound, bound, size=shape)

    return _write(tensor, "kaiming_uniform_", draw)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", *, generator=None):
    """N(0, std^2) with std = gain / sqrt(fan); arguments as ``kaiming_uniform_``."""
    gen = _generator(generator)

    def draw(shape):
        fan = _fan(shape, mode, "kaiming_normal_")
        return calculate_gain(nonlinearity, a) / math.sqrt(fan) * gen.standard_normal(shape)

    return _write(tensor, "kaiming_normal_", draw)


def orthogonal_(tensor, gain: float = 1.0, *, generator=None):
    """A (semi-)orthogonal matrix times ``gain`` (Saxe et al., 2013): dims after the first
    are flattened, and the rows (or the columns, whichever are fewer) are orthonormal. The Q
    of a Gaussian matrix's QR, signs fixed by R's diagonal, so it is uniformly distributed."""
    gen = _generator(generator)

    def draw(shape):
        if len(shape) < 2:
            raise ShapeError(f"nn.init.orthogonal_: only tensors of 2 or more dimensions are "
                             f"supported, got shape {shape}")
        rows = shape[0]
        cols = math.prod(shape) // rows
        flat = gen.standard_normal((rows, cols))
        if rows < cols:
            flat = flat.T
        q, r = np.linalg.qr(flat)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return gain * q.reshape(shape)

    return _write(tensor, "orthogonal_", draw)


def sparse_(tensor, sparsity: float, std: float = 0.01, *, generator=None):
    """A 2-D ``tensor`` drawn from N(0, std^2) with ceil(sparsity * rows) of each column's
    elements zero, at rows chosen at random per column (Martens, 2010)."""
    gen = _generator(generator)

    def draw(shape):
        if len(shape) != 2:
            raise ShapeError(f"nn.init.sparse_: only 2-D tensors are supported, got shape "
                             f"{shape}")
        rows, cols = shape
        out = std * gen.standard_normal(shape)
        zeros = math.ceil(sparsity * rows)
        for col in range(cols):
            out[gen.permutation(rows)[:zeros], col] = 0.0
        return out

    return _write(tensor, "sparse_", draw)


# -- the normal distribution's CDF and erf's inverse, for trunc_normal_ ----------------------
def _normal_cdf(x: float) -> float:
    return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0


# Beyond this many standard deviations _erfinv's polynomial leaves float32's precision (w > 16)
# and erf's values lie within a few float64 steps of 1
_FAR = 5.4


def _upper(t: float) -> float:
    """P(X > t) for a standard normal X, to float64's precision far in the tail too."""
    return math.erfc(t / math.sqrt(2.0)) / 2.0


def _mass(lo: float, hi: float) -> float:
    """P(lo < X < hi) for a standard normal X, each tail from its own side."""
    if lo >= 0:
        return _upper(lo) - _upper(hi)
    if hi <= 0:
        return _upper(-hi) - _upper(-lo)
    return 1.0 - _upper(-lo) - _upper(hi)


def _in_far_tail(alpha: float, beta: float) -> bool:
    """Whether more than a millionth of the standard normal's mass on [alpha, beta] lies past
    +-_FAR, where the inverse CDF misplaces it (bounds 7 and 9 put a quarter of the draws
    on 7); a bound that far with the bulk inside (timm's std=0.02 within +-2) is not."""
    far = _mass(max(alpha, _FAR), max(beta, _FAR)) + _mass(min(alpha, -_FAR), min(beta, -_FAR))
    return far > 1e-6 * _mass(alpha, beta)


def _tail_draw(gen: np.random.Generator, lo: float, hi: float, shape) -> np.ndarray:
    """A standard normal truncated to [lo, hi], 0 <= lo: exponential proposals from lo,
    accepted with the normal's remaining factor (Robert, "Simulation of truncated normal
    variables", 1995), exact however far out the interval lies."""
    rate = (lo + math.sqrt(lo * lo + 4.0)) / 2.0
    out = np.empty(int(np.prod(shape)))
    todo = np.arange(out.size)
    while todo.size:
        x = lo + gen.exponential(1.0 / rate, todo.size)
        keep = (x <= hi) & (gen.uniform(size=todo.size) <= np.exp(-(x - rate) ** 2 / 2.0))
        out[todo[keep]] = x[keep]
        todo = todo[~keep]
    return out.reshape(shape)


def _erfinv(y: np.ndarray) -> np.ndarray:
    """erf's inverse on (-1, 1): M. Giles's polynomial approximation ("Approximating the
    erfinv function", GPU Computing Gems Jade, 2011), accurate to float32's precision, which
    is what the drawn weights keep."""
    y = np.clip(y, -1 + 1e-15, 1 - 1e-15)
    w = -np.log((1.0 - y) * (1.0 + y))
    centre = w < 5.0
    t = np.where(centre, w - 2.5, np.sqrt(w) - 3.0)
    near = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
            -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
    tail = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
            -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
    p_near = np.zeros_like(t)
    p_tail = np.zeros_like(t)
    for c_near, c_tail in zip(near, tail):
        p_near = p_near * t + c_near
        p_tail = p_tail * t + c_tail
    return np.where(centre, p_near, p_tail) * y
