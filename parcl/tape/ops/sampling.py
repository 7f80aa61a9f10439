"""Random tensors, as PyTorch's: ``rand``, ``randn``, ``randint``, ``randperm``, their
``*_like`` forms, ``normal``, ``bernoulli`` and ``multinomial`` (and the Node methods
``normal_``, ``uniform_``, ``bernoulli_``).

Every draw comes from this thread's generator, the one dropout draws its masks from
(``tp.manual_seed``, ``pc.manual_seed``, ``tp.rng_state``): each call takes the generator's
next ``(seed, counter)`` and the device computes element ``i`` from that call's key and ``i``
(``parcl.kernels.draws``). A seed gives the same values on every run, device and thread, but
not PyTorch's values (another generator). Inside ``tp.capture`` every replay takes the next
key, so it draws what the eager call would, never the recording's values again; inside
``tp.checkpoint`` the recomputation draws the forward's values again (its generator rewound).

The results are leaf Nodes, as the creation functions' (``parcl.tape.ops.creation``); ``normal``
of tensors and ``bernoulli`` record their inputs with a gradient of zeros, as PyTorch's (no
reparameterisation: write ``mean + std * tp.randn_like(mean)`` for a gradient through the
draw).

>>> tp.manual_seed(0)
>>> tp.rand(2, 3).shape, tp.randint(10, (4,)).dtype, sorted(tp.randperm(4).to_host().tolist())
((2, 3), dtype('int64'), [0, 1, 2, 3])
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import draws
from ...kernels import elementwise as ew
from ...kernels import random as rndk
from ...kernels import scan, sorting
from ...kernels.broadcast import broadcast_shapes
from ...pool import pool_of
from ...tensor import FLOAT, Tensor
from ..node import Function, Node
from .checks import FlagCheck
from .creation import INT64, filled, leaf, queue_of, sizes, value_of
from .nn import dropout_generator

__all__ = ["bernoulli", "multinomial", "normal", "rand", "rand_like", "randint", "randint_like",
           "randn", "randn_like", "randperm"]


def key_source():
    """``next_key()``: the key of this thread's generator's next call (a replay of a captured
    step calls it again, on the recording thread's generator, as dropout's)."""
    gen = dropout_generator()

    def next_key():
        return np.uint64(rndk.mask_key(*gen.next_call()))
    return next_key


def _float_dtype(op: str, dtype):
    dt = FLOAT if dtype is None else np.dtype(dtype)
    if dt != FLOAT:
        raise DTypeError(f"{op}: draws float32 values, got dtype {dt}")
    return dt


# -- uniform and normal -----------------------------------------------------------------------
def rand(*args, size=None, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.rand``: float32 draws uniform in ``[0, 1)``.

    >>> tp.rand(2, 3).shape
    (2, 3)
    """
    shape = sizes("rand", args, size)
    out = Tensor.empty(queue_of(queue), shape, _float_dtype("rand", dtype))
    return leaf("rand", draws.uniform(out, 0.0, 1.0, key_source()), requires_grad)


def randn(*args, size=None, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.randn``: float32 draws from the standard normal distribution."""
    shape = sizes("randn", args, size)
    out = Tensor.empty(queue_of(queue), shape, _float_dtype("randn", dtype))
    return leaf("randn", draws.normal(out, 0.0, 1.0, key_source()), requires_grad)


def _like_out(op: str, input, dtype, queue) -> Tensor:  # noqa: A002
    t = value_of(op, input)
    return Tensor.empty(t.queue if queue is None else queue, t.shape,
                        t.dtype if dtype is None else dtype)


def rand_like(input, *, dtype=None, requires_grad: bool = False, queue=None) -> Node:  # noqa: A002
    """``torch.rand_like``: ``rand`` of ``input``'s shape, on its queue (float32)."""
    out = _like_out("rand_like", input, dtype, queue)
    _float_dtype("rand_like", out.dtype)
    return leaf("rand_like", draws.uniform(out, 0.0, 1.0, key_source()), requires_grad)


def randn_like(input, *, dtype=None, requires_grad: bool = False, queue=None) -> Node:  # noqa: A002
    """``torch.randn_like``: ``randn`` of ``input``'s shape, on its queue (float32)."""
    out = _like_out("randn_like", input, dtype, queue)
    _float_dtype("randn_like", out.dtype)
    return leaf("randn_like", draws.normal(out, 0.0, 1.0, key_source()), requires_grad)


# -- integers --------------------------------------------------------------------------------
def _bounds(op: str, low, high) -> tuple[int, int]:
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, Integral):
            raise TypeError(f"{op}: {name} must be an int, got {v!r}")
    if not high > low:
        raise ShapeError(f"{op}: random_ expects 'from' to be less than 'to', but got "
                         f"from={low} >= to={high} (as PyTorch's)")
    if high - low > 2**63:
        raise ShapeError(f"{op}: the range [{low}, {high}) is wider than 2**63")
    return int(low), int(high)


def _fits(op: str, low: int, high: int, out: Tensor) -> None:
    """PyTorch's check that ``[low, high)`` fits an integer ``out``: an int32 tensor would
    hold ``low + offset`` wrapped (negative numbers for ``randint(0, 2**40)``)."""
    if out.dtype.kind != "i":
        return
    info = np.iinfo(out.dtype)
    if low < info.min or high - 1 > info.max:
        raise ShapeError(f"{op}: the range [{low}, {high}) does not fit {out.dtype} (shape "
                         f"{out.shape}): from and to - 1 must be in [{info.min}, {info.max}], "
                         "as PyTorch's")


def randint(*args, size=None, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.randint(low=0, high, size)``: integers uniform in ``[low, high)``, int64 unless
    ``dtype`` (int32, or float32 for integer-valued floats); ``randint(high, size)`` starts at
    0."""
    if size is not None:
        args = (*args, size)
    if len(args) == 2:
        args = (0, *args)
    if len(args) != 3:
        raise TypeError("randint: expected (high, size) or (low, high, size), as PyTorch's")
    low, high = _bounds("randint", args[0], args[1])
    out = Tensor.empty(queue_of(queue), sizes("randint", (args[2],)),
                       INT64 if dtype is None else dtype)
    _fits("randint", low, high, out)
    return leaf("randint", draws.randint(out, low, high, key_source()), requires_grad)


def randint_like(input, low=0, high=None, *, dtype=None, requires_grad: bool = False,  # noqa: A002
                 queue=None) -> Node:
    """``torch.randint_like(input, low=0, high)``: ``randint`` of ``input``'s shape and dtype
    (unless ``dtype``), on its queue; ``randint_like(input, high)`` starts at 0."""
    if high is None:
        low, high = 0, low
    low, high = _bounds("randint_like", low, high)
    out = _like_out("randint_like", input, dtype, queue)
    _fits("randint_like", low, high, out)
    return leaf("randint_like", draws.randint(out, low, high, key_source()), requires_grad)


def randperm(n: int, *, dtype=None, requires_grad: bool = False, queue=None) -> Node:
    """``torch.randperm``: a uniform random permutation of ``0 .. n - 1``, int64 (the argsort
    of random keys)."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 0:
        raise ShapeError(f"randperm: n must be a non-negative int, got {n!r}")
    dt = INT64 if dtype is None else np.dtype(dtype)
    if dt != INT64:
        raise DTypeError(f"randperm: indices are int64, got dtype {dt}")
    q = queue_of(queue)
    keys = draws.permutation_keys(q, int(n), key_source())
    perm = sorting.argsort(keys, 0) if n else Tensor.empty(q, (0,), INT64)
    return leaf("randperm", perm, requires_grad)


# -- distributions with tensor parameters ----------------------------------------------------
class _ValueCheck(FlagCheck):
    """The first element of a parameter outside its range: ``error`` names it."""

    description = "a random op's parameter check"

    def __init__(self, flag: Tensor, message: str, shape):
        self.message, self.shape = message, shape
        super().__init__(flag)

    def error(self, host: np.ndarray) -> Exception | None:
        at = int(host[0])
        if at == draws.NO_ERROR:
            return None
        index = tuple(int(i) for i in np.unravel_index(at, self.shape)) if self.shape else ()
        return ShapeError(f"{self.message} (element {index} of shape {tuple(self.shape)})")


def _checked(out: Tensor, x: Tensor, lo: float, hi: float, message: str) -> None:
    """``out`` raises at its host read (or a backward) where ``x`` leaves ``[lo, hi]``."""
    check = _ValueCheck(draws.check_range(x, lo, hi), message, x.shape)
    check.guard(out, at_once=False)


class _Drawn(Function):
    """A draw from tensor parameters; their gradient is zeros, as PyTorch's."""

    def backward(self, g: Tensor):
        return tuple(None if not need else Tensor.zeros(g.queue, shape)
                     for need, shape in zip(self.needs_input_grad, self.shapes))


class _Normal(_Drawn):
    name = "normal"

    def forward(self, mean, std, *, mean_value, std_value, next_key):
        self.shapes = tuple(() if t is None else t.shape for t in (mean, std))
        shapes = [t.shape for t in (mean, std) if t is not None]
        shape = shapes[0] if len(shapes) == 1 else broadcast_shapes("normal", *shapes)
        q = (mean if mean is not None else std).queue
        # z ~ N(0, std) for a number std, else N(0, 1) times the tensor; then plus the mean
        out = draws.normal(Tensor.empty(q, shape), 0.0, 1.0 if std is not None else std_value,
                           next_key)
        if std is not None:
            ew.binary("mul", out, std, out=out)
        if mean is not None:
            ew.binary("add", out, mean, out=out)
        elif mean_value:
            ew.scalar("add", out, mean_value, out=out)
        if std is not None:
            _checked(out, std, 0.0, np.inf, "normal: expects all elements of std >= 0.0, "
                     "got a negative or NaN std")
        return out


def normal(mean=0.0, std=1.0, size=None, *, dtype=None, requires_grad: bool = False,
           queue=None):
    """``torch.normal``: draws from N(mean, std^2), ``mean`` and ``std`` each a tensor or a
    number (tensors broadcast together; two numbers need ``size``). A negative or NaN
    ``std`` element is a ``ShapeError`` at the first host read of the result. The gradient to
    tensor ``mean`` and ``std`` is zeros, as PyTorch's.

    >>> tp.normal(2.0, 3.0, (2,)).shape
    (2,)
    """
    tensors = [isinstance(v, (Node, Tensor)) for v in (mean, std)]
    if not any(tensors):
        m, s = (float(v) for v in (mean, std))
        if not s >= 0:
            raise ShapeError(f"normal: expects std >= 0.0, got {std}")
        if size is None:
            raise TypeError("normal: a mean and std that are both numbers need a size")
        out = Tensor.empty(queue_of(queue), sizes("normal", (size,)),
                           _float_dtype("normal", dtype))
        return leaf("normal", draws.normal(out, m, s, key_source()), requires_grad)
    if size is not None:
        raise TypeError("normal: size is given only with a number mean and std; a tensor's "
                        "shape is the result's")
    for name, v, is_tensor in (("mean", mean, tensors[0]), ("std", std, tensors[1])):
        if is_tensor and v.dtype != FLOAT:
            raise DTypeError(f"normal: {name} {tuple(v.shape)} has dtype {v.dtype}, expected "
                             "float32")
    if not tensors[1] and not float(std) >= 0:
        raise ShapeError(f"normal: expects std >= 0.0, got {std}")
    out = _Normal.apply(mean if tensors[0] else None, std if tensors[1] else None,
                        mean_value=None if tensors[0] else float(mean),
                        std_value=None if tensors[1] else float(std), next_key=key_source())
    return out if isinstance(out, Node) else leaf("normal", out, False)


class _Bernoulli(_Drawn):
    name = "bernoulli"

    def forward(self, p, *, next_key):
        self.shapes = (p.shape,)
        out = draws.bernoulli(Tensor.empty(p.queue, p.shape), p, next_key)
        _checked(out, p, 0.0, 1.0, "bernoulli: expects 0 <= p <= 1, got a probability outside "
                 "[0, 1] or NaN")
        return out


def bernoulli(input, p=None):  # noqa: A002
    """``torch.bernoulli``: 1 with the probability each element of ``input`` holds, else 0
    (float32, ``input``'s shape), a ``ShapeError`` at the first host read where one is outside
    ``[0, 1]``; the gradient to ``input`` is zeros, as PyTorch's. With a number ``p``: 1 with
    probability ``p`` in ``input``'s shape, a leaf (PyTorch has no derivative for it)."""
    t = value_of("bernoulli", input)
    if t.dtype != FLOAT:
        raise DTypeError(f"bernoulli: input {t.shape} has dtype {t.dtype}, expected float32")
    if p is None:
        out = _Bernoulli.apply(input, next_key=key_source())
        return out if isinstance(out, Node) else leaf("bernoulli", out, False)
    if not (isinstance(p, Real) and 0.0 <= float(p) <= 1.0):
        raise ShapeError(f"bernoulli: expects 0 <= p <= 1, got {p}")
    probs = filled("bernoulli", t.queue, t.shape, float(p), FLOAT)
    out = draws.bernoulli(Tensor.empty(t.queue, t.shape), probs, key_source())
    return leaf("bernoulli", out, False)


class _ProbabilityCheck(FlagCheck):
    description = "multinomial's probability check"
    size = 2

    def __init__(self, flag: Tensor, shape):
        self.shape = shape
        super().__init__(flag)

    def error(self, host: np.ndarray) -> Exception | None:
        bad, row = int(host[0]), int(host[1])
        where = f"(probabilities of shape {tuple(self.shape)})"
        if bad != draws.NO_ERROR:
            index = tuple(int(i) for i in np.unravel_index(bad, self.shape))
            return ShapeError(f"multinomial: probability tensor contains either inf, nan or "
                              f"element < 0: element {index} {where}")
        if row != draws.NO_ERROR:
            return ShapeError(f"multinomial: invalid multinomial distribution (sum of "
                              f"probabilities <= 0) in row {row} {where}")
        return None


def multinomial(input, num_samples: int, replacement: bool = False) -> Node:  # noqa: A002
    """``torch.multinomial``: ``num_samples`` int64 category indices drawn from each row of
    the non-negative weights ``input`` (1-D, or 2-D: one row per draw), without replacement
    unless ``replacement``: then each row's indices are distinct, in the order drawn (the
    ``num_samples`` largest Gumbel-perturbed log-weights); with replacement a binary search of
    the row's cumulative sums. Weights need not sum to 1; a negative, inf or NaN weight or a
    row of zeros is a ``ShapeError`` at the first host read of the result."""
    t = value_of("multinomial", input)
    if t.dtype != FLOAT:
        raise DTypeError(f"multinomial: input {t.shape} has dtype {t.dtype}, expected float32")
    if t.ndim not in (1, 2):
        raise ShapeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {t.shape}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, Integral):
        raise TypeError(f"multinomial: num_samples must be an int, got {num_samples!r}")
    rows, k = (1, t.shape[0]) if t.ndim == 1 else t.shape
    if k == 0:
        raise ShapeError(f"multinomial: no categories to draw from (shape {t.shape})")
    if num_samples <= 0:
        raise ShapeError(f"multinomial: cannot sample n_sample <= 0 samples, got "
                         f"{num_samples}")
    if not replacement and num_samples > k:
        raise ShapeError(f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples "
                         f"without replacement ({num_samples} > {k}, shape {t.shape})")
    p = t.reshape(rows, k)
    check = _ProbabilityCheck(draws.check_probabilities(p), t.shape)
    if rows == 0:
        out = Tensor.empty(t.queue, (0, num_samples), INT64)
    elif replacement:
        out = draws.multinomial(scan.cumsum(p, 1), int(num_samples), key_source())
    else:
        out = sorting.argsort(draws.gumbel_keys(p, key_source()), 1, True, int(num_samples))
    check.guard(out, at_once=False)
    return leaf("multinomial", out.reshape(num_samples) if t.ndim == 1 else out, False)


# -- in place, for Node.normal_ / uniform_ / bernoulli_ ---------------------------------------
def draw_into(t: Tensor, what: str, *params) -> None:
    """Draw into ``t``'s own buffer (``"normal"``, ``"uniform"``: two numbers; ``"bernoulli"``:
    a number or a tensor broadcast to ``t``), noted as an in-place change (as ``t.fill_``)."""
    t.not_a_copy(f"{what}_")
    if t.dtype != FLOAT:
        raise DTypeError(f"{what}_: draws float32 values, the tensor {t.shape} is {t.dtype}")
    if what == "normal":
        mean, std = (float(v) for v in params)
        if not std >= 0:
            raise ShapeError(f"normal_: expects std >= 0.0, got {std}")
        draws.normal(t, mean, std, key_source())
    elif what == "uniform":
        low, high = (float(v) for v in params)
        biggest = float(np.finfo(np.float32).max)
        for name, v in (("from", low), ("to", high)):
            if not abs(v) <= biggest:
                raise ShapeError(f"uniform_: {name}={v} is out of bounds for float32 (tensor "
                                 f"{t.shape}), as PyTorch's")
        if not low <= high:
            raise ShapeError(f"uniform_: expects from <= to, got from={low} > to={high}")
        if not high - low <= biggest:       # the span low + span * u would be inf: inf and NaN
            raise ShapeError(f"uniform_: expects to - from <= float32's max, got from={low} "
                             f"and to={high} (tensor {t.shape}), as PyTorch's")
        draws.uniform(t, low, high, key_source())
    else:
        (p,) = params
        if isinstance(p, (Node, Tensor)):
            probs = value_of("bernoulli_", p)
            if probs.dtype != FLOAT:            # the kernel would read its bits as floats
                raise DTypeError(f"bernoulli_: p {probs.shape} has dtype {probs.dtype}, "
                                 f"expected float32 (the tensor {t.shape})")
            broadcast_shapes("bernoulli_", probs.shape, t.shape)
            if probs.shape != t.shape:
                probs = ew.broadcast_to(probs, t.shape)
            _checked(t, probs, 0.0, 1.0, "bernoulli_: expects 0 <= p <= 1, got a probability "
                     "outside [0, 1] or NaN")
        else:
            if not isinstance(p, Real) or not 0.0 <= float(p) <= 1.0:
                raise ShapeError(f"bernoulli_: expects 0 <= p <= 1, got {p}")
            probs = filled("bernoulli_", t.queue, t.shape, float(p), FLOAT)
            t.checks = ()
        draws.bernoulli(t, probs, key_source())
    if what != "bernoulli":
        t.checks = ()
    pool_of(t.queue).note_overwrite(t.data, f"Node.{what}_", update=True)
