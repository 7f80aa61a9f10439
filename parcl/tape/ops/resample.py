"""Resampling as PyTorch's: ``interpolate`` (``torch.nn.functional.interpolate``: nearest,
nearest-exact, linear, bilinear, trilinear, bicubic and area), the pixel shuffles
(``pixel_shuffle``, ``pixel_unshuffle``) and ShuffleNet's ``channel_shuffle``.

Interpolation is separable: each spatial dim, last first, is one ``index_select`` of its
source positions (nearest), or two, weighed and added (linear). The positions and weights are
PyTorch's, computed in float32 on the host as its CPU kernels compute them; the backward of
``index_select`` adds the gradients of a source position picked several times in index order,
so gradients are bit-identical from run to run (no float atomics). The shuffles are a
reshape, a permute and a reshape, copied where that permute moves size-1 dims only.

>>> x = tp.tensor(np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2), requires_grad=True)
>>> tp.interpolate(x, scale_factor=2).to_host()[0, 0, 0]
array([0., 0., 1., 1.], dtype=float32)
>>> tp.pixel_shuffle(tp.tensor(np.zeros((1, 8, 3, 3), np.float32)), 2).shape
(1, 2, 6, 6)
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from ...errors import ShapeError
from ...tensor import Tensor
from ..node import Node
from .adaptive import adaptive_avg_pool1d
from .elementwise import add, mul
from .nn import adaptive_avg_pool2d
from .pool3d import adaptive_avg_pool3d
from .picks import constant, index_select
from .shape import permute, reshape

__all__ = ["channel_shuffle", "interpolate", "pixel_shuffle", "pixel_unshuffle"]

#: mode -> the input dims it takes (None: any of 3, 4 and 5)
INTERPOLATE_MODES = {"nearest": None, "nearest-exact": None, "linear": 3, "bilinear": 4,
                     "trilinear": 5, "bicubic": 4, "area": None}
#: PyTorch's cubic convolution constant (``upsample_bicubic2d``'s A)
CUBIC_A = np.float32(-0.75)


def interpolate(x, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False, *, tape=None):
    """``torch.nn.functional.interpolate`` over ``(N, C, *spatial)``: ``size`` (an int or one
    per spatial dim) or ``scale_factor`` (a number or one per dim; the output is
    ``floor(in * scale)``, and the positions use ``1 / scale`` unless
    ``recompute_scale_factor``). ``mode`` ``"nearest"``, ``"nearest-exact"`` (3-D to 5-D),
    ``"linear"`` (3-D), ``"bilinear"`` (4-D), ``"trilinear"`` (5-D) or ``"bicubic"`` (4-D:
    PyTorch's cubic convolution with A = -0.75 over four source positions per dim, clamped
    at the border; values may overshoot the input's range, as PyTorch's) or ``"area"`` (3-D
    to 5-D: adaptive average pooling to the output size, as PyTorch's); ``align_corners``
    (linear and bicubic modes only) maps the corner pixels' centres onto each other.
    ``antialias`` is refused.

    >>> tp.interpolate(x, size=(3, 5), mode="bilinear", align_corners=True).shape
    (1, 1, 3, 5)
    """
    if mode not in INTERPOLATE_MODES:
        raise ShapeError(f"interpolate: mode must be one of {tuple(INTERPOLATE_MODES)}, got "
                         f"{mode!r}")
    if antialias:
        raise ShapeError("interpolate: antialias=True is not supported")
    linear = mode in ("linear", "bilinear", "trilinear")
    if align_corners is not None and not linear and mode != "bicubic":
        raise ShapeError(f"interpolate: align_corners can only be set with the linear and "
                         f"bicubic modes (linear, bilinear, trilinear, bicubic), got mode "
                         f"{mode!r}")
    shape = tuple(x.shape)
    want = INTERPOLATE_MODES[mode]
    if len(shape) not in ((want,) if want else (3, 4, 5)):
        expected = f"{want}-D" if want else "3-D, 4-D or 5-D"
        raise ShapeError(f"interpolate: mode {mode!r} takes a {expected} (N, C, *spatial) "
                         f"input, got shape {shape}")
    sizes, scales = _output_sizes(shape, size, scale_factor, recompute_scale_factor)
    if mode == "area":
        pool = {3: adaptive_avg_pool1d, 4: adaptive_avg_pool2d, 5: adaptive_avg_pool3d}
        return pool[len(shape)](x, sizes[0] if len(shape) == 3 else tuple(sizes), tape=tape)
    out = x
    for k in reversed(range(len(sizes))):
        axis, n, m = 2 + k, shape[2 + k], sizes[k]
        if mode == "bicubic":
            out = _weighed_sum(out, axis, *_cubic_sources(n, m, scales[k],
                                                          bool(align_corners)), tape)
        elif linear:
            lo, hi, w_lo, w_hi = _linear_sources(n, m, scales[k], bool(align_corners))
            view = [1] * len(shape)
            view[axis] = m
            w_lo, w_hi = (constant(x.queue, w.reshape(view)) for w in (w_lo, w_hi))
            out = add(mul(index_select(out, axis, constant(x.queue, lo), tape=tape), w_lo,
                          tape=tape),
                      mul(index_select(out, axis, constant(x.queue, hi), tape=tape), w_hi,
                          tape=tape), tape=tape)
        else:
            # a dim of unchanged size can still move (nearest-exact at a scale_factor of 1.33)
            src = _nearest_sources(n, m, scales[k], exact=mode == "nearest-exact",
                                   shortcut=len(shape) == 4)
            if not np.array_equal(src, np.arange(n)) or k == 0 and out is x:
                # an op even at scale 1: a new Node, as torch's
                out = index_select(out, axis, constant(x.queue, src), tape=tape)
    return out


def _output_sizes(shape, size, scale_factor, recompute) -> tuple[list[int], list]:
    """The spatial output sizes and the scales the positions use (None: ``in / out``)."""
    d = len(shape) - 2
    if 0 in tuple(shape[2:]):        # x[..., W:]: no input position to read, as PyTorch
        raise ShapeError(f"interpolate: input of shape {tuple(shape)} has a spatial dim of "
                         "size 0; expected non-zero sizes there (as PyTorch)")
    if (size is None) == (scale_factor is None):
        raise ShapeError(f"interpolate: give exactly one of size and scale_factor, got "
                         f"size={size!r}, scale_factor={scale_factor!r}")
    if size is not None:
        if recompute:
            raise ShapeError("interpolate: recompute_scale_factor is not meaningful with an "
                             "explicit size")
        sizes = list(size) if isinstance(size, (tuple, list)) else [size] * d
        if len(sizes) != d or not all(isinstance(s, Integral) and s > 0 for s in sizes):
            raise ShapeError(f"interpolate: size must be a positive int or {d} of them (one "
                             f"per spatial dim of {shape}), got {size!r}")
        return [int(s) for s in sizes], [None] * d
    factors = list(scale_factor) if isinstance(scale_factor, (tuple, list)) \
        else [scale_factor] * d
    if len(factors) != d or not all(isinstance(f, Real) and f > 0 for f in factors):
        raise ShapeError(f"interpolate: scale_factor must be a positive number or {d} of them "
                         f"(one per spatial dim of {shape}), got {scale_factor!r}")
    sizes = [math.floor(float(n) * float(f)) for n, f in zip(shape[2:], factors)]
    if min(sizes) < 1:
        raise ShapeError(f"interpolate: scale_factor {scale_factor!r} gives an empty output "
                         f"{tuple(sizes)} from spatial dims {shape[2:]}")
    return sizes, [None if recompute else float(f) for f in factors]


def _scale(n: int, m: int, scale: float | None) -> np.float32:
    """PyTorch's ``compute_scales_value``: ``1 / scale_factor`` when given, else ``in / out``,
    as float32."""
    return np.float32(1.0 / scale) if scale is not None and scale > 0 \
        else np.float32(n) / np.float32(m)


def _nearest_sources(n: int, m: int, scale, exact: bool, shortcut: bool) -> np.ndarray:
    """PyTorch's ``nearest_idx`` (with ``shortcut``: its 2-D kernel's) /
    ``nearest_neighbor_exact_compute_source_index``."""
    dst = np.arange(m)
    # PyTorch's 2-D kernel copies a dim whose size is kept and halves the positions of a
    # doubled one whatever scale_factor says (2.1 on 5 -> 10); its 1-D and 3-D kernels
    # take floor(dst / scale_factor) there too. With a size (or a factor of 1 or 2) the same.
    if shortcut and not exact and m == n:
        return dst.astype(np.int32)
    if shortcut and not exact and m == 2 * n:
        return (dst >> 1).astype(np.int32)
    at = dst.astype(np.float32) + (np.float32(0.5) if exact else np.float32(0))
    src = np.floor(at * _scale(n, m, scale)).astype(np.int64)
    return np.minimum(src, n - 1).astype(np.int32)


def _source_positions(n: int, m: int, scale, align_corners: bool) -> np.ndarray:
    """Where each of ``m`` output positions reads the ``n`` input positions, in float32 as
    PyTorch's ``area_pixel_compute_source_index`` (not clamped)."""
    dst = np.arange(m).astype(np.float32)
    if align_corners:
        s = np.float32(n - 1) / np.float32(m - 1) if m > 1 else np.float32(0)
        return s * dst
    return _scale(n, m, scale) * (dst + np.float32(0.5)) - np.float32(0.5)


def _linear_sources(n: int, m: int, scale, align_corners: bool):
    """PyTorch's linear weights (``compute_indices_weights_linear``): the lower and upper
    source positions of each output position and their float32 weights."""
    if n == m:      # PyTorch copies a dim of unchanged size, whatever scale_factor says
        same = np.arange(m, dtype=np.int32)
        return same, same, np.ones(m, np.float32), np.zeros(m, np.float32)
    real = _source_positions(n, m, scale, align_corners)
    if not align_corners:
        real = np.maximum(real, np.float32(0))
    lo = np.minimum(np.floor(real).astype(np.int64), n - 1)
    lam = np.clip(real - lo.astype(np.float32), np.float32(0), np.float32(1))
    hi = lo + (lo < n - 1)
    return (lo.astype(np.int32), hi.astype(np.int32), (np.float32(1) - lam).astype(np.float32),
            lam.astype(np.float32))


def _weighed_sum(x, axis: int, sources: list, weights: list, tape):
    """``sum_i x[..., sources[i], ...] * weights[i]`` along ``axis`` (weights per output
    position), in the order given."""
    view = [1] * len(x.shape)
    view[axis] = len(sources[0])
    out = None
    for src, w in zip(sources, weights):
        term = mul(index_select(x, axis, constant(x.queue, src), tape=tape),
                   constant(x.queue, w.reshape(view)), tape=tape)
        out = term if out is None else add(out, term, tape=tape)
    return out


def _cubic_sources(n: int, m: int, scale, align_corners: bool) -> tuple[list, list]:
    """PyTorch's bicubic taps (``upsample_bicubic2d``): for each output position the four
    source positions ``floor(real) - 1 .. floor(real) + 2`` clamped into ``[0, n)`` and
    their cubic-convolution weights (A = -0.75), in float32 as PyTorch's CPU kernels. The
    source position is not clamped at 0 first, unlike the linear modes'."""
    real = _source_positions(n, m, scale, align_corners)
    base = np.floor(real)
    t = (real - base).astype(np.float32)
    a, one = CUBIC_A, np.float32(1)

    def near(x):        # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + one

    def far(x):         # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = [far(t + one), near(t), near(one - t), far((one - t) + one)]
    base = base.astype(np.int64)
    sources = [np.clip(base - 1 + i, 0, n - 1).astype(np.int32) for i in range(4)]
    return sources, [w.astype(np.float32) for w in weights]


def _factor(op: str, name: str, r) -> int:
    if not isinstance(r, Integral) or isinstance(r, bool) or r < 1:
        raise ShapeError(f"{op}: {name} must be a positive int, got {r!r}")
    return int(r)


def pixel_shuffle(x, upscale_factor: int, *, tape=None):
    """``torch.nn.functional.pixel_shuffle``: ``(*, C * r**2, H, W)`` to ``(*, C, H * r,
    W * r)``, channel ``c * r**2 + i * r + j`` going to offset ``(i, j)`` of each block.

    >>> tp.pixel_shuffle(tp.tensor(np.zeros((4, 2, 2), np.float32)), 2).shape
    (1, 4, 4)
    """
    r = _factor("pixel_shuffle", "upscale_factor", upscale_factor)
    shape = tuple(x.shape)
    if len(shape) < 3 or shape[-3] % (r * r):
        raise ShapeError(f"pixel_shuffle: expected an input (*, C * {r * r}, H, W) (channels "
                         f"divisible by upscale_factor**2 = {r * r}), got shape {shape}")
    *lead, c, h, w = shape
    b = len(lead)
    y = reshape(x, (*lead, c // (r * r), r, r, h, w), tape=tape)
    y = permute(y, (*range(b), b, b + 3, b + 1, b + 4, b + 2), tape=tape)
    return _own_buffer(reshape(y, (*lead, c // (r * r), h * r, w * r), tape=tape), x, tape)


def pixel_unshuffle(x, downscale_factor: int, *, tape=None):
    """``torch.nn.functional.pixel_unshuffle``, ``pixel_shuffle`` undone: ``(*, C, H * r,
    W * r)`` to ``(*, C * r**2, H, W)``.

    >>> tp.pixel_unshuffle(tp.tensor(np.zeros((1, 1, 4, 6), np.float32)), 2).shape
    (1, 4, 2, 3)
    """
    r = _factor("pixel_unshuffle", "downscale_factor", downscale_factor)
    shape = tuple(x.shape)
    if len(shape) < 3 or shape[-2] % r or shape[-1] % r:
        raise ShapeError(f"pixel_unshuffle: expected an input (*, C, H * {r}, W * {r}) "
                         f"(height and width divisible by downscale_factor = {r}), got shape "
                         f"{shape}")
    *lead, c, h, w = shape
    b = len(lead)
    y = reshape(x, (*lead, c, h // r, r, w // r, r), tape=tape)
    y = permute(y, (*range(b), b, b + 2, b + 4, b + 1, b + 3), tape=tape)
    return _own_buffer(reshape(y, (*lead, c * r * r, h // r, w // r), tape=tape), x, tape)


def channel_shuffle(x, groups: int, *, tape=None):
    """``F.channel_shuffle``: the channels (dim 1) of ``(N, C, *)`` split into ``groups``
    groups and interleaved, channel ``g * (C / groups) + i`` moving to ``i * groups + g``
    (ShuffleNet's). A reshape, a ``permute`` (one copy) and a reshape, so their gradient; new
    memory as PyTorch's where ``groups`` is 1 or ``C`` (the permute moves size-1 dims only).

    >>> tp.channel_shuffle(tp.reshape(x, (1, 6, 1)), 2).to_host().ravel()  # x = 0 .. 5
    array([0., 3., 1., 4., 2., 5.], dtype=float32)
    """
    shape = tuple(x.shape)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ShapeError(f"channel_shuffle: groups must be a positive integer, got {groups!r}")
    if len(shape) < 3 or shape[1] % groups:
        raise ShapeError(f"channel_shuffle: expected an (N, C, *) input with C divisible by "
                         f"groups={groups}, got shape {shape}")
    n, c, rest = shape[0], shape[1], shape[2:]
    split = reshape(x, (n, groups, c // groups, math.prod(rest)), tape=tape)
    return _own_buffer(reshape(permute(split, (0, 2, 1, 3), tape=tape), shape, tape=tape),
                       x, tape)


def _own_buffer(y, x, tape):
    """``y``, copied where it is a view of ``x``'s buffer (the permute moved only size-1
    dims: a factor of 1, a 1 x 1 image, 1 or C channel groups): PyTorch's shuffles return
    new memory, so an in-place change to the output (``+=`` under no_grad,
    ``relu(inplace=True)``) must not reach the input."""
    if _buffer(y) is not _buffer(x):
        return y
    if not isinstance(y, Node):         # nothing to differentiate (no_grad, integer tensors)
        return y.copy()
    axis = len(y.shape) - 1
    same = Tensor.from_host(x.queue, np.arange(y.shape[axis], dtype=np.int32))
    return index_select(y, axis, same, tape=tape)


def _buffer(t):
    return (t.value if isinstance(t, Node) else t).data
