"""Neural-network ops: ``linear``, ``conv2d``, ``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d``, ``batch_norm``, ``dropout`` (and ``manual_seed`` for dropout's RNG).

Layouts follow PyTorch: NCHW activations, ``(out, in)`` linear weights, ``(cout, cin, kh, kw)``
conv weights.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3, 8, 8), np.float32)))
>>> w = tp.tensor(pc.Tensor.from_host(q, np.ones((4, 3, 3, 3), np.float32)), True)
>>> with tp.Tape() as tape:
...     y = tp.sum(tp.max_pool2d(tp.conv2d(x, w, padding=1), 2))
>>> tape.backward(y)
>>> w.grad.shape
(4, 3, 3, 3)
"""

from __future__ import annotations

import threading

import numpy as np

from ... import recorder
from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import batchnorm as bnk
from ...kernels import batchnorm_sync as bns
from ...kernels import conv as convk
from ...kernels import elementwise as ew
from ...kernels import pool as poolk
from ...kernels import random as rndk
from ...kernels.gemm import product, product2
from ...kernels.reduction import sum as reduce_sum
from ...tensor import FLOAT, Tensor, check_same_queue
from .. import mode
from ..node import ACCUMULATED, Function, Node
from .checks import read_checks
from .shape import as_batched, unbatch

__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "conv2d", "dropout", "linear",
           "manual_seed", "max_pool2d", "rng_state", "set_rng_state"]


# -- linear ----------------------------------------------------------------------------------
class Linear(Function):
    takes_targets = True
    name = "linear"

    def forward(self, x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False):
        # every check here, once: the GEMM below is launched without checking again
        for nm, t in (("input", x), ("weight", weight), ("bias", bias)):
            if t is not None and t.dtype is not FLOAT and t.dtype != FLOAT:
                raise DTypeError(f"linear: {nm} {t.shape} has dtype {t.dtype}, expected float32")
        if weight.ndim != 2:
            raise ShapeError(f"linear: weight must be 2-D (out_features, in_features), got "
                             f"{weight.shape}")
        out_f, in_f = weight.shape
        if x.ndim == 0 or x.shape[-1] != in_f:
            raise ShapeError(f"linear: input of shape {x.shape} has {x.shape[-1] if x.ndim else 0}"
                             f" features in its last dimension, but the weight {weight.shape} "
                             f"expects in_features={in_f}")
        if bias is not None and bias.shape != (out_f,):
            raise ShapeError(f"linear: bias has shape {bias.shape}, expected ({out_f},) for "
                             f"weight {weight.shape}")
        if bias is None:
            check_same_queue("linear", x, weight)
        else:
            check_same_queue("linear", x, weight, bias)
        x2 = x if x.ndim == 2 else x.reshape(-1, in_f)
        y = product(x2, weight, trans_b=True, bias=bias, relu=relu)
        if self.recording:
            self.x2 = x2 if self.needs_input_grad[1] else None
            self.weight = weight if self.needs_input_grad[0] else None
            self.y = y if relu else None
            self.x_shape = x.shape
        return y if x.ndim == 2 else y.reshape(*x.shape[:-1], out_f)

    def backward(self, g: Tensor):
        g2 = g.reshape(-1, g.shape[-1])
        if self.y is not None:
            g2 = ew.relu_backward(self.y, g2)
        gx = gw = gb = None
        need = self.needs_input_grad
        # the weight's existing .grad takes g^T x in the GEMM itself (beta=1); the shapes were
        # checked in the forward, g's by the tape
        into = self.grad_targets.get(1) if need[1] else None
        if need[0] and need[1]:                # both products in one launch where small
            gx, gw = product2((g2, self.weight, False, False, None),
                              (g2, self.x2, True, False, into))
        elif need[0]:
            gx = product(g2, self.weight)
        elif need[1]:
            gw = product(g2, self.x2, trans_a=True, into=into)
        if gx is not None and len(self.x_shape) != 2:
            gx = gx.reshape(self.x_shape)
        if into is not None:
            gw = ACCUMULATED
        if need[2]:
            gb = reduce_sum(g2, axis=0)
        return gx, gw, gb


def linear(x, weight, bias=None, relu: bool = False, *, tape=None):
    """``x @ weight.T + bias`` (then ReLU when ``relu``), weight ``(out, in)``: one GEMM with
    the bias and ReLU fused in its epilogue. ``x`` may have any leading dimensions.

    >>> tp.linear(x, w, b).shape            # x (8, 4), w (3, 4), b (3,)
    (8, 3)
    """
    return Linear.apply(x, weight, bias, tape=tape, relu=bool(relu))


# -- convolution -----------------------------------------------------------------------------
class Conv2d(Function):
    name = "conv2d"

    def forward(self, x: Tensor, weight: Tensor, bias: Tensor | None, stride=1, padding=0,
                relu: bool = False, dilation=1, groups: int = 1):
        y = convk.conv2d_forward(x, weight, bias, stride, padding, relu=relu,
                                 dilation=dilation, groups=groups)
        if self.recording:
            self.x, self.weight = x, weight
            self.stride, self.padding = stride, padding
            self.dilation, self.groups = dilation, groups
            self.out = y if relu else None
        return y

    def backward(self, g: Tensor):
        if self.out is not None:
            g = ew.relu_backward(self.out, g)        # the fused ReLU: out > 0 where pre > 0
        need = self.needs_input_grad
        return convk.conv2d_backward(self.x, self.weight, g, self.stride, self.padding,
                                     need_input=need[0], need_weight=need[1],
                                     need_bias=need[2], dilation=self.dilation,
                                     groups=self.groups)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, *,
           relu: bool = False, tape=None):
    """2-D convolution (cross-correlation, as PyTorch) of NCHW ``x`` (or unbatched CHW) with
    ``weight``
    ``(cout, cin/groups, kh, kw)``; ``stride`` and ``dilation`` are ints or pairs, ``padding``
    an int, a pair, ``"valid"`` (0) or ``"same"`` (stride 1; an odd total padding puts the
    extra zero on the right and bottom, as PyTorch). Forward is im2col and one GEMM over the
    batch (bias, and a ReLU with ``relu=True``, fused), one GEMM per group when ``groups >
    1``, and a direct kernel for depthwise convolutions (``groups == cin``); backward is
    deterministic (no atomics).

    >>> tp.conv2d(x, w, b, stride=2, padding=1).shape      # x (2, 3, 8, 8), w (4, 3, 3, 3)
    (2, 4, 4, 4)
    >>> tp.conv2d(x, wd, padding=2, dilation=2, groups=3).shape     # wd (6, 1, 3, 3)
    (2, 6, 8, 8)
    >>> tp.conv2d(x, tp.tensor(np.ones((1, 3, 2, 4), np.float32)), padding="same").shape
    (2, 1, 8, 8)
    """
    x, batched = as_batched("conv2d", x, "C, H, W", tape=tape)
    if isinstance(padding, str):
        pads = string_padding("conv2d", padding, tuple(weight.shape)[2:], stride, dilation)
        (top, bottom), (left, right) = pads
        if (top, left) == (bottom, right):
            padding = (top, left)
        else:                                     # the odd zero right and below: padded here
            from .indexing import pad
            x, padding = pad(x, (left, right, top, bottom), tape=tape), 0
    y = Conv2d.apply(x, weight, bias, tape=tape, stride=stride, padding=padding,
                     relu=bool(relu), dilation=dilation, groups=groups)
    return unbatch(y, batched, tape=tape)


def string_padding(op: str, padding: str, kernel: tuple, stride, dilation) -> list:
    """PyTorch's ``padding="valid"`` (none) or ``"same"`` (the output as large as the input,
    stride 1 only) as ``(before, after)`` per spatial dim: ``dilation * (k - 1)`` in all,
    the odd one after."""
    n = len(kernel)
    if padding not in ("same", "valid"):
        raise ShapeError(f"{op}: padding {padding!r} is not 'same', 'valid', an int or a "
                         f"tuple")
    dilation = (dilation,) * n if isinstance(dilation, (int, np.integer)) else tuple(dilation)
    stride = (stride,) * n if isinstance(stride, (int, np.integer)) else tuple(stride)
    if padding == "valid":
        return [(0, 0)] * n
    if any(s != 1 for s in stride):
        raise ShapeError(f"{op}: padding='same' needs stride 1, got stride {stride} (as "
                         f"PyTorch)")
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    return [(t // 2, t - t // 2) for t in totals]


# -- pooling ---------------------------------------------------------------------------------
class MaxPool2d(Function):
    name = "max_pool2d"

    def forward(self, x: Tensor, kernel_size=2, stride=None, padding=0, dilation=1,
                ceil_mode: bool = False):
        y, idx = poolk.max_pool2d_forward(x, kernel_size, stride, padding,
                                          save_indices=self.recording, dilation=dilation,
                                          ceil_mode=ceil_mode)
        self.idx, self.x_shape = idx, x.shape
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode
        return y

    def backward(self, g: Tensor):
        return poolk.max_pool2d_backward(g, self.idx, self.x_shape, self.kernel_size,
                                         self.stride, self.padding, dilation=self.dilation,
                                         ceil_mode=self.ceil_mode)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False, *, tape=None):
    """Max pooling over NCHW (or CHW) ``x`` (stride defaults to the kernel size; padding is -inf and
    at most half the kernel; taps ``dilation`` apart). Output sizes as PyTorch: ``ceil_mode``
    rounds up, dropping a last window that would start in the right padding. The argmax of each
    window is saved for the backward. ``return_indices=True`` also returns each maximum's
    position ``h * W + w`` in its plane (int64, not recorded; what ``tp.max_unpool2d`` takes),
    found by a second pass of the pool kernel.

    >>> tp.max_pool2d(x, 2).shape      # x (2, 3, 8, 8)
    (2, 3, 4, 4)
    >>> tp.max_pool2d(x, 3, stride=2, ceil_mode=True).shape
    (2, 3, 4, 4)
    """
    x, batched = as_batched("max_pool2d", x, "C, H, W", tape=tape)
    y = MaxPool2d.apply(x, tape=tape, kernel_size=kernel_size, stride=stride,
                        padding=padding, dilation=dilation, ceil_mode=bool(ceil_mode))
    if not return_indices:
        return unbatch(y, batched, tape=tape)
    raw = x.value if isinstance(x, Node) else x
    where = poolk.max_pool2d_positions(raw, kernel_size, stride, padding, dilation=dilation,
                                       ceil_mode=bool(ceil_mode))
    return unbatch(y, batched, tape=tape), (where if batched else where.reshape(where.shape[1:]))


class AvgPool2d(Function):
    name = "avg_pool2d"

    def forward(self, x: Tensor, kernel_size=2, stride=None, padding=0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None):
        self.x_shape = x.shape
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override
        return poolk.avg_pool2d_forward(x, kernel_size, stride, padding, ceil_mode=ceil_mode,
                                        count_include_pad=count_include_pad,
                                        divisor_override=divisor_override)

    def backward(self, g: Tensor):
        return poolk.avg_pool2d_backward(g, self.x_shape, self.kernel_size, self.stride,
                                         self.padding, ceil_mode=self.ceil_mode,
                                         count_include_pad=self.count_include_pad,
                                         divisor_override=self.divisor_override)


def check_divisor_override(op: str, divisor_override) -> int | None:
    """PyTorch's ``divisor_override``: None, or a non-zero int every window's sum is divided by."""
    if divisor_override is None:
        return None
    if not isinstance(divisor_override, (int, np.integer)) or isinstance(divisor_override, bool) \
            or divisor_override == 0:
        raise ShapeError(f"{op}: divisor_override must be a non-zero int or None, got "
                         f"{divisor_override!r}")
    return int(divisor_override)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None, *,
               tape=None):
    """Average pooling over NCHW (or CHW) ``x``, PyTorch's divisor: with
    ``count_include_pad`` (the default) zero padding counts (``kh*kw``, a ``ceil_mode`` window
    clipped to the padded input), without it only the input elements in the window count;
    ``divisor_override`` (a non-zero int) divides every window's sum instead.

    >>> tp.avg_pool2d(x, 3, stride=2, padding=1).shape      # x (2, 3, 8, 8)
    (2, 3, 4, 4)
    """
    divisor_override = check_divisor_override("avg_pool2d", divisor_override)
    x, batched = as_batched("avg_pool2d", x, "C, H, W", tape=tape)
    y = AvgPool2d.apply(x, tape=tape, kernel_size=kernel_size, stride=stride,
                        padding=padding, ceil_mode=bool(ceil_mode),
                        count_include_pad=bool(count_include_pad),
                        divisor_override=divisor_override)
    return unbatch(y, batched, tape=tape)


class AdaptiveAvgPool2d(Function):
    name = "adaptive_avg_pool2d"

    def forward(self, x: Tensor, output_size=1):
        self.x_shape = x.shape
        return poolk.adaptive_avg_pool2d_forward(x, output_size)

    def backward(self, g: Tensor):
        return poolk.adaptive_avg_pool2d_backward(g, self.x_shape)


def adaptive_avg_pool2d(x, output_size, *, tape=None):
    """Average pooling of NCHW (or CHW) ``x`` to ``output_size`` (int or pair; ``None`` in a pair
    keeps that dim's size) with PyTorch's bins ``[floor(i*H/out), ceil((i+1)*H/out))`` (any
    sizes; overlapping bins when H % out != 0).

    >>> tp.adaptive_avg_pool2d(x, 1).shape      # x (2, 3, 8, 8)
    (2, 3, 1, 1)
    """
    refuse_empty_windows("adaptive_avg_pool2d", x, 2)
    x, batched = as_batched("adaptive_avg_pool2d", x, "C, H, W", tape=tape)
    y = AdaptiveAvgPool2d.apply(x, tape=tape, output_size=output_size)
    return unbatch(y, batched, tape=tape)


def refuse_empty_windows(op: str, x, spatial: int) -> None:
    """An adaptive pool's spatial dims of size 0 (``x[..., W:]``) leave windows of nothing, a
    mean 0 / 0 and a maximum of none: a ShapeError, as PyTorch refuses them."""
    shape = tuple(x.shape)
    if 0 in shape[len(shape) - spatial:]:
        raise ShapeError(f"{op}: input of shape {shape} has a spatial dim of size 0, so its "
                         "windows hold no elements; expected non-zero sizes there (as PyTorch)")


# -- batch norm ------------------------------------------------------------------------------
class BatchNorm(Function):
    name = "batch_norm"
    overwrites = ("overwrite_residual", 3)

    def forward(self, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                residual: Tensor | None = None, running_mean: Tensor | None = None,
                running_var: Tensor | None = None, training: bool = True,
                momentum: float = 0.1, eps: float = 1e-5, relu: bool = False,
                overwrite_residual: bool = False, sync_layer: bool = False):
        check_same_queue("batch_norm", *[t for t in (x, weight, bias, residual, running_mean,
                                                     running_var) if t is not None])
        if residual is not None and tuple(residual.shape) != tuple(x.shape):
            raise ShapeError(f"batch_norm: residual of shape {residual.shape} does not match "
                             f"the input {x.shape}")
        if training and running_mean is not None:
            read_checks(x)          # before the running statistics, which outlive the step
        # The fused epilogue, relu(bn(x) + residual) in one pass: the normalised value itself
        # never becomes a graph node, so it is not kept alive for backward (one activation
        # less per residual block), and with overwrite_residual not even a new buffer.
        # sync_batchnorm: the statistics of every replica's batch (mode.batch_stats_sync)
        # (a group that exchanges only for SyncBatchNorm layers: those pass sync_layer)
        sync = mode.batch_stats_sync() if training else None
        if sync is not None and not (sync_layer or getattr(sync, "every_layer", True)):
            sync = None
        stats, count = None, 0
        if sync is not None:
            update = running_mean is not None and running_var is not None
            parts, counts = sync.gather(bns.partial_stats(x), x.size // x.shape[1])
            *stats, count = bns.combine_stats(parts, counts, running_mean, running_var, eps,
                                              momentum, update)
        y, mean, invstd = bnk.batch_norm_forward(
            x, weight, bias, running_mean, running_var, training, momentum, eps,
            residual=residual, relu=relu, overwrite_residual=overwrite_residual, stats=stats)
        if self.recording:
            batch_stats = mean is not running_mean
            # Evaluation normalises with the running mean itself: keep a copy, a later
            # training forward may update the running statistics before this backward runs.
            self.saved = (x, weight, mean if batch_stats else mean.copy(), invstd, batch_stats,
                          y if relu else None, count, sync)
        return y

    def backward(self, g: Tensor):
        x, weight, mean, invstd, batch_stats, out, count, sync = self.saved
        need = self.needs_input_grad
        if out is not None:
            g = ew.relu_backward(out, g)            # out > 0 exactly where the sum was > 0
        gx, gw, gb = bnk.batch_norm_backward(x, g, weight, mean, invstd, batch_stats,
                                             need_input=need[0], need_weight=need[1],
                                             need_bias=need[2], count=count, sync=sync)
        return gx, gw, gb, (g if need[3] else None)


def batch_norm(x, weight, bias, running_mean, running_var, training: bool,
               momentum: float = 0.1, eps: float = 1e-5, *, residual=None, relu: bool = False,
               overwrite_residual: bool = False, sync: bool = False, tape=None):
    """Batch normalisation over the channels (axis 1) of an (N, C) or (N, C, H, W) input.

    Training: normalises with the batch mean and biased variance, and updates
    ``running_mean``/``running_var`` (raw Tensors, or None) in place on the device:
    ``r = (1 - momentum) * r + momentum * batch`` with the *unbiased* variance, as PyTorch.
    Evaluation: normalises with the running statistics, which it needs (None is refused, as
    PyTorch's). ``weight``/``bias`` may be None.
    Fused epilogue (ResNet's ``relu(bn(x) + identity)``): ``residual`` is added to the output
    and ``relu=True`` applies a ReLU, in one op whose intermediate values are not kept for
    backward. ``overwrite_residual=True`` writes the result over the residual's buffer (as
    torchvision's ``out += identity``): one activation less, but only correct when nothing
    else reads the residual afterwards, such as a downsample BatchNorm's output (BatchNorm's
    backward needs its input, not its output). A leaf that requires grad cannot be
    overwritten.
    In a replica group that exchanges batch statistics, training normalises with the global
    batch's: every call with ``ReplicaGroup(sync_batchnorm=True)``, only calls with
    ``sync=True`` (``pc.nn.SyncBatchNorm``'s) in a group that exchanges for its
    ``SyncBatchNorm`` layers alone; outside a group ``sync`` changes nothing.

    >>> tp.batch_norm(x, gamma, beta, rm, rv, training=True).shape      # x (2, 3, 8, 8)
    (2, 3, 8, 8)
    """
    rm, rv = _running_stats(running_mean, running_var, bool(training))
    if training and mode.state.recompute:      # tp.checkpoint's second run: updated once
        rm = rv = None
    return BatchNorm.apply(x, weight, bias, residual, tape=tape, running_mean=rm,
                           running_var=rv, training=bool(training), momentum=float(momentum),
                           eps=float(eps), relu=bool(relu),
                           overwrite_residual=bool(overwrite_residual), sync_layer=bool(sync))



def _running_stats(running_mean, running_var, training: bool) -> tuple:
    """The running statistics as raw Tensors (or both None), refused as PyTorch's
    ``F.batch_norm`` refuses them. A parameter there is PyTorch's argument order
    (``input, running_mean, running_var, weight, bias``): taken as statistics, the weights
    would be overwritten by the running averages and the output scaled by the running mean,
    silently. One without the other would leave that one stale in training, silently."""
    for name, r in (("running_mean", running_mean), ("running_var", running_var)):
        if isinstance(r, Node) and r.requires_grad:
            raise ParclError(f"batch_norm: {name} requires grad (a parameter?); the running "
                             f"statistics are buffers updated in place. parcl's order is "
                             f"batch_norm(x, weight, bias, running_mean, running_var, "
                             f"training), PyTorch's F.batch_norm takes running_mean and "
                             f"running_var before weight and bias")
    if (running_mean is None) != (running_var is None):
        raise ParclError("batch_norm: running_mean and running_var must either both be None "
                         "or neither be None (as PyTorch)")
    if running_mean is None and not training:
        # Evaluation without statistics would normalise with the batch's, ignoring
        # training=False; PyTorch's order, batch_norm(x, running_mean, running_var, None,
        # None, False), lands here, and took the statistics as weight and bias.
        raise ParclError("batch_norm: training=False normalises with the running statistics, "
                         "but running_mean and running_var are None (PyTorch: running_mean "
                         "must be defined in evaluation mode). parcl's order is batch_norm(x, "
                         "weight, bias, running_mean, running_var, training); PyTorch's "
                         "F.batch_norm takes running_mean and running_var before weight and "
                         "bias. For the batch's statistics pass training=True")
    return tuple(r.value if isinstance(r, Node) else r for r in (running_mean, running_var))

# -- dropout ---------------------------------------------------------------------------------
class _Generator:
    """A thread's dropout generator: ``seed`` and the ``counter`` of calls so far. An object,
    not bare thread-local values, so a captured step can advance its recording thread's
    generator when another thread replays it."""

    __slots__ = ("seed", "counter")

    def __init__(self):
        self.seed, self.counter = 0, 0

    def next_call(self) -> tuple[int, int]:
        counter = self.counter
        self.counter = counter + 1
        return self.seed, counter


_rng = threading.local()


def _generator() -> _Generator:
    gen = getattr(_rng, "generator", None)
    if gen is None:
        gen = _rng.generator = _Generator()
    return gen


def dropout_generator() -> _Generator:
    """This thread's dropout generator itself: what a recorded call holds that moves it on
    every replay, whichever thread replays (dropout's keys, ``tp.checkpoint``'s rewind)."""
    return _generator()


def manual_seed(seed: int) -> None:
    """Seed this thread's dropout generator and restart its call counter. Thread-local: each
    replica thread has its own (seed them differently, e.g. ``manual_seed(base + index)``, if
    replicas should drop different units). Unseeded threads start at seed 0."""
    _set_state(_generator(), int(seed), 0)


def _set_state(gen: _Generator, seed: int, counter: int) -> None:
    gen.seed, gen.counter = seed, counter
    # a captured step's replays set it here too, as its eager call does: they would draw on
    # from where the last call left it (other masks than the seed's, every call)
    recorder.call(lambda: _reset(gen, seed, counter))


def _reset(gen: _Generator, seed: int, counter: int) -> None:
    gen.seed, gen.counter = seed, counter


def rng_state() -> tuple[int, int]:
    """This thread's dropout generator state ``(seed, counter)``: saved in a checkpoint's
    meta (``pc.save(..., dropout=tp.rng_state())``) and put back with ``set_rng_state``, a
    resumed run draws the dropout masks the uninterrupted run would."""
    gen = _generator()
    return gen.seed, gen.counter


def checked_rng_state(state) -> tuple[int, int]:
    """``state`` as the ``(seed, counter)`` pair of ints ``rng_state`` gives (a list, as JSON
    gives it back, too); anything else (a float, a string, a bool, a negative counter) is a
    ``ParclError``: rounded, it would draw other masks than the saved run."""
    try:
        seed, counter = state
        ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                 for v in (seed, counter)) and counter >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ParclError(f"set_rng_state: expected a (seed, counter) pair of ints from "
                         f"rng_state(), got {state!r}")
    return int(seed), int(counter)


def set_rng_state(state) -> None:
    """Restore a state returned by ``rng_state`` (``checked_rng_state``). Anything else is a
    ``ParclError``, the generator unchanged."""
    seed, counter = checked_rng_state(state)
    _set_state(_generator(), seed, counter)


class Dropout(Function):
    name = "dropout"

    def forward(self, x: Tensor, p: float = 0.5, seed: int | None = None):
        # A fixed seed (counter 0) gives the same mask every call; otherwise each call,
        # replays included, takes the next call of this thread's generator.
        gen = _generator() if seed is None else None
        self.p, (self.seed, self.counter) = p, (gen.next_call() if gen else (int(seed), 0))
        y = rndk.dropout_forward(x, p, self.seed, self.counter)
        if gen is not None and recorder.current() is not None:
            # Each replay draws its own key, as the eager call would, and the recorded
            # backward launch regenerates that replay's mask; so does a backward run after
            # the replay through the graph it returned (``seed``, ``counter`` follow it).
            key = [0]

            def next_key():
                self.seed, self.counter = gen.next_call()
                key[0] = np.uint64(rndk.mask_key(self.seed, self.counter))
                return key[0]
            recorder.replay_arg(rndk.KEY_ARG, next_key)
            self.replay_key = key
        return y

    def backward(self, g: Tensor):
        # The mask is a pure function of (seed, counter, index): regenerated, never stored.
        grad = rndk.dropout_backward(g, self.p, self.seed, self.counter)
        key = getattr(self, "replay_key", None)
        if key is not None:
            recorder.replay_arg(rndk.KEY_ARG, lambda: key[0])
        return grad


def dropout(x, p: float = 0.5, training: bool = True, *, seed: int | None = None, tape=None):
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``; the input
    itself when not ``training`` or ``p == 0``.

    The mask comes from a counter-based hash of ``(seed, counter, element index)`` on the
    device: ``seed`` and ``counter`` are this thread's generator (``manual_seed``; each call
    advances the counter) unless ``seed=`` is given (then counter 0: the same mask every call).
    The backward regenerates the mask, so nothing but two integers is saved.

    >>> tp.manual_seed(0)
    >>> y = tp.dropout(x, 0.5, training=True)
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ShapeError(f"dropout: probability p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    return Dropout.apply(x, tape=tape, p=p, seed=None if seed is None else int(seed))
