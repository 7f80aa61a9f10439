"""PyTorch's spatial transformer ops (2-D): ``affine_grid`` (the sampling grid of a batch of
affine matrices) and ``grid_sample`` (the input read at a grid's points, bilinear or nearest,
with zeros, border or reflection padding).

Both are composed of tape ops, so their gradients (to ``theta``; to the input and the grid) are
the tape's and deterministic: ``affine_grid`` is one batched ``matmul`` of a constant base
grid; ``grid_sample`` unnormalises and pads the coordinates with elementwise ops, finds the
pixels each point reads with one small kernel (``parcl/kernels/grid_sample.py``), reads them
with ``take_along_dim`` (whose backward adds repeated reads in a fixed order) and weighs them.

>>> theta = tp.tensor(np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], np.float32))
>>> grid = tp.affine_grid(theta, (1, 1, 2, 2), align_corners=False)
>>> grid.to_host().reshape(4, 2).tolist()
[[-0.5, -0.5], [0.5, -0.5], [-0.5, 0.5], [0.5, 0.5]]
"""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import grid_sample as gsk
from ...tensor import FLOAT
from ..node import Node
from .activation import clamp
from .elementwise import add, div, mul, sub
from .join import stack
from .linalg import matmul
from .logical import logical_and
from .mathops import eq, floor, gt, lt
from .mathops_more import fmod, remainder
from .picks import constant
from .reduce import sum
from .scatters import take_along_dim
from .select import where
from .shape import reshape, transpose
from .unary import abs

__all__ = ["affine_grid", "grid_sample"]

_DEFAULT_CHANGED = ("Default grid_sample and affine_grid behavior has changed to "
                    "align_corners=False since 1.3.0. Please specify align_corners=True if the "
                    "old behavior is desired. See the documentation of grid_sample for details.")


def _raw(x):
    return x.value if isinstance(x, Node) else x


def _positions(n: int, align_corners: bool) -> np.ndarray:
    """The normalised centres of ``n`` pixels: -1 and 1 at the outer pixels' centres with
    ``align_corners``, at their outer edges without."""
    if n == 1:
        return np.zeros(1)
    steps = np.linspace(-1.0, 1.0, n)
    return steps if align_corners else steps * (n - 1) / n


def affine_grid(theta, size, align_corners: bool | None = None, *, tape=None):
    """``F.affine_grid`` (2-D): the ``(N, H, W, 2)`` grid of ``(x, y)`` points ``theta @ [x,
    y, 1]`` for the ``(N, 2, 3)`` affine matrices ``theta`` and each output pixel's normalised
    centre, ``size = (N, C, H, W)``; ``align_corners=None`` is False, with PyTorch's warning.

    >>> tp.affine_grid(theta, (1, 3, 4, 5), align_corners=True).shape   # theta (1, 2, 3)
    (1, 4, 5, 2)
    """
    if align_corners is None:
        warnings.warn(_DEFAULT_CHANGED, UserWarning, stacklevel=2)
        align_corners = False
    size = tuple(int(s) for s in size)
    shape = tuple(theta.shape)
    if theta.dtype != FLOAT:
        raise DTypeError(f"affine_grid: expected theta to have float32 type, got {theta.dtype}")
    if len(size) != 4:
        raise ShapeError(f"affine_grid: only 2-D affine transforms are supported, for a 4-d "
                         f"size (N, C, H, W); got size {size}")
    if len(shape) != 3 or shape[1:] != (2, 3) or shape[0] != size[0]:
        raise ShapeError(f"affine_grid: expected a batch of 2D affine matrices of shape "
                         f"({size[0]}, 2, 3) for size {size}, got theta of shape {shape}")
    if min(size) <= 0:
        raise ShapeError(f"affine_grid: expected non-zero, positive output size, got {size}")
    n, _, h, w = size
    xs, ys = _positions(w, align_corners), _positions(h, align_corners)
    base = np.stack([np.tile(xs, h), np.repeat(ys, w), np.ones(h * w)], 1)     # (H*W, 3)
    base = constant(theta.queue, base.astype(np.float32)[None])
    grid = matmul(base, transpose(theta, (0, 2, 1), tape=tape), tape=tape)     # (N, H*W, 2)
    return reshape(grid, (n, h, w, 2), tape=tape)


def _unnormalise(coord, size: int, align_corners: bool, tape):
    """Normalised coordinates in [-1, 1] as pixel coordinates (PyTorch's)."""
    if align_corners:
        return mul(add(coord, 1.0, tape=tape), (size - 1) / 2.0, tape=tape)
    return sub(mul(add(coord, 1.0, tape=tape), size / 2.0, tape=tape), 0.5, tape=tape)


def _reflect(coord, low2: int, high2: int, tape):
    """PyTorch's ``reflect_coordinates``: ``coord`` folded into ``[low2/2, high2/2]`` by
    reflections at its ends (gradient +-1 as the folds flip it)."""
    if low2 == high2:
        return mul(coord, 0.0, tape=tape)
    low, span = low2 / 2.0, (high2 - low2) / 2.0
    dist = abs(sub(coord, low, tape=tape), tape=tape)
    extra = fmod(dist, span, tape=tape)
    even = eq(remainder(floor(div(_raw(dist), span)), 2.0), 0.0)     # folds: no gradient
    return where(even, add(extra, low, tape=tape), sub(span + low, extra, tape=tape),
                 tape=tape)


def _clip(coord, size: int, tape):
    """PyTorch's ``clip_coordinates_set_grad``: ``coord`` clamped to ``[0, size - 1]``, its
    gradient passing only strictly inside. ``tp.clamp``'s (torch.clamp's) passes at the bounds
    too, which gave a point on the border (align_corners' -1 and 1) a grid gradient."""
    high = float(size - 1)
    inside = logical_and(gt(coord, 0.0), lt(coord, high))
    return where(inside, coord, clamp(_raw(coord), 0.0, high), tape=tape)


def _source(coord, size: int, padding_mode: str, align_corners: bool, tape):
    """PyTorch's ``grid_sampler_compute_source_index``: pixel coordinates, padded."""
    coord = _unnormalise(coord, size, align_corners, tape)
    if padding_mode == "border":
        return _clip(coord, size, tape)
    if padding_mode == "reflection":
        coord = _reflect(coord, 0 if align_corners else -1,
                         2 * (size - 1) if align_corners else 2 * size - 1, tape)
        return _clip(coord, size, tape)
    return coord


def grid_sample(input, grid, mode: str = "bilinear", padding_mode: str = "zeros",  # noqa: A002
                align_corners: bool | None = None, *, tape=None):
    """``F.grid_sample`` (2-D): ``input`` ``(N, C, H, W)`` read at the ``(N, Ho, Wo, 2)``
    ``grid`` of normalised ``(x, y)`` points (-1 the left/top, 1 the right/bottom: pixel
    centres with ``align_corners``, outer edges without): ``(N, C, Ho, Wo)``. ``mode``
    ``"bilinear"`` or ``"nearest"`` (``"bicubic"`` refused); ``padding_mode`` ``"zeros"``
    (points outside read 0), ``"border"`` (clamped to the edge) or ``"reflection"``
    (reflected at the edges); ``align_corners=None`` is False, with PyTorch's warning.
    Gradients to the input and (bilinear) to the grid, as PyTorch's; nearest gives the grid
    none.

    >>> tp.grid_sample(x, grid, align_corners=False).shape     # x (1, 1, 2, 2), grid above
    (1, 1, 2, 2)
    """
    if mode not in ("bilinear", "nearest"):
        raise ParclError(f"grid_sample: expected mode to be 'bilinear' or 'nearest' "
                         f"('bicubic' is not supported), got {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ParclError(f"grid_sample: expected padding_mode to be 'zeros', 'border', or "
                         f"'reflection', but got: {padding_mode!r}")
    if align_corners is None:
        warnings.warn(_DEFAULT_CHANGED, UserWarning, stacklevel=2)
        align_corners = False
    xs, gs = tuple(input.shape), tuple(grid.shape)
    for name, t in (("input", input), ("grid", grid)):
        if t.dtype != FLOAT:
            raise DTypeError(f"grid_sample: {name} of shape {tuple(t.shape)} has dtype "
                             f"{t.dtype}, expected float32")
    if len(xs) != 4:
        raise ShapeError(f"grid_sample: only 2-D sampling of a 4-d input (N, C, H, W) is "
                         f"supported, got input of shape {xs}")
    if len(gs) != 4 or gs[3] != 2 or gs[0] != xs[0]:
        raise ShapeError(f"grid_sample: expected grid of shape ({xs[0]}, H_out, W_out, 2) for "
                         f"input {xs}, got grid of shape {gs}")
    if 0 in xs[2:]:
        raise ShapeError(f"grid_sample: input of shape {xs} has a spatial dim of size 0")
    n, c, h, w = xs
    points = gs[1] * gs[2]
    flat = reshape(grid, (n, points, 2), tape=tape)
    ix = _source(reshape(flat[:, :, 0], (n, points), tape=tape), w, padding_mode,
                 align_corners, tape)
    iy = _source(reshape(flat[:, :, 1], (n, points), tape=tape), h, padding_mode,
                 align_corners, tape)
    nearest = mode == "nearest"
    index, valid = gsk.corners(_raw(ix), _raw(iy), h, w, nearest)
    k = 1 if nearest else 4
    picked = take_along_dim(reshape(input, (n, c, h * w), tape=tape),
                            index.reshape((n, 1, k * points)), 2, tape=tape)
    # a corner outside the input reads pixel 0, which an inf or NaN there would turn into
    # NaN even at weight 0: PyTorch reads nothing there, so it reads 0 here
    picked = where(reshape(valid, (n, 1, k, points)), reshape(picked, (n, c, k, points),
                                                               tape=tape), 0.0, tape=tape)
    if nearest:
        weights = valid
    else:
        fx = sub(ix, floor(_raw(ix)), tape=tape)          # the gradient to the grid is theirs
        fy = sub(iy, floor(_raw(iy)), tape=tape)
        gx, gy = sub(1.0, fx, tape=tape), sub(1.0, fy, tape=tape)
        corner = [mul(gy, gx, tape=tape), mul(gy, fx, tape=tape), mul(fy, gx, tape=tape),
                  mul(fy, fx, tape=tape)]
        weights = mul(stack(corner, 1, tape=tape), valid, tape=tape)     # (N, 4, P)
    out = sum(mul(picked, reshape(weights, (n, 1, k, points), tape=tape), tape=tape), 2,
              tape=tape)
    return reshape(out, (n, c, gs[1], gs[2]), tape=tape)
