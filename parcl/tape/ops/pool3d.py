"""3-D pools over ``(N, C, D, H, W)`` (or unbatched ``(C, D, H, W)``): PyTorch's
``max_pool3d``, ``avg_pool3d``, ``adaptive_avg_pool3d``, ``adaptive_max_pool3d``,
``lp_pool3d`` and ``max_unpool3d``.

A box window is the product of one window per dim, so each pool is two 2-D pools: one over
every depth plane ``(N, C*D, H, W)``, then one of ``(kd, 1)`` windows over depth on the
``(N, C, D, OH*OW)`` view. That is exact, not an approximation: a maximum is the maximum of
the planes' maxima (and the first maximum in ``(d, h, w)`` order, or the last NaN, is the
first plane's first, as PyTorch's pick), and an average's divisor is the product of the
dims' (padding counted or not, ``ceil_mode``'s clipped windows included), so the mean of the
planes' means is the box's. The gradients are the 2-D pools' (gathers, no atomics).
``return_indices=True`` joins the two pools' positions into PyTorch's flat ``(d * H + h) * W
+ w`` on the device (``kernels.pool3d``).

>>> x = tp.tensor(np.arange(64, dtype=np.float32).reshape(1, 1, 4, 4, 4))
>>> tp.max_pool3d(x, 2).to_host().ravel()
array([21., 23., 29., 31., 53., 55., 61., 63.], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ...kernels.conv_geometry import pool_out_len
from ...kernels.pool3d import join_positions
from ...tensor import Tensor
from .adaptive import _sizes, adaptive_max_pool2d
from .conv3d import batched5, check_volume, triple
from .elementwise import mul, pow
from .lp_pool import _norm_type, _root
from .nn import adaptive_avg_pool2d, avg_pool2d, max_pool2d, refuse_empty_windows
from .picks import constant
from .shape import reshape, unbatch
from .unary import abs, neg
from .unpool import _unpool

__all__ = ["adaptive_avg_pool3d", "adaptive_max_pool3d", "avg_pool3d", "lp_pool3d",
           "max_pool3d", "max_unpool3d"]


def _window(op: str, shape, kernel_size, stride, padding, dilation, ceil_mode: bool):
    """(kernel, stride, padding, dilation, out) triples of a pool over ``(N, C, D, H, W)``,
    PyTorch's rules: ``stride=None`` is the kernel, padding at most half the kernel."""
    k = triple(op, "kernel_size", kernel_size)
    s = k if stride is None else triple(op, "stride", stride)
    p = triple(op, "padding", padding, least=0)
    d = triple(op, "dilation", dilation)
    if any(a > b // 2 for a, b in zip(p, k)):
        raise ShapeError(f"{op}: padding {p} must be at most half the kernel size {k} (as "
                         "PyTorch)")
    sizes = tuple(shape[2:])
    out = tuple(pool_out_len(op, n, *w, ceil_mode) for n, *w in zip(sizes, k, s, p, d))
    if min(out) < 1:
        raise ShapeError(f"{op}: kernel {k} with padding {p}, stride {s}, dilation {d} does "
                         f"not fit the input's spatial size {sizes} (output {out})")
    return k, s, p, d, out


def _planes(x5, tape):
    """``(N, C*D, H, W)``: every depth plane an image."""
    n, c, dd, hh, ww = x5.shape
    return reshape(x5, (n, c * dd, hh, ww), tape=tape)


def _depth(y, n: int, c: int, dd: int, tape):
    """The planes' results ``(N, C*D, OH, OW)`` as ``(N, C, D, OH*OW)``: depth a pool's rows."""
    return reshape(y, (n, c, dd, y.shape[2] * y.shape[3]), tape=tape)


def _joined(depth_at: Tensor, plane_at: Tensor, x5, od: int, first_h, first_w) -> Tensor:
    """PyTorch's flat positions from the depth pool's ``(N, C, OD, P)`` and the plane pool's
    ``(N, C*D, OH, OW)`` positions; ``first_h``, ``first_w``: each plane window's first row
    and column (the position of a depth window that holds no input depth)."""
    n, c, dd, hh, ww = x5.shape
    starts = np.add.outer(first_h * ww, first_w).astype(np.int64).ravel()
    return join_positions(depth_at, plane_at, constant(x5.queue, starts), planes=n * c, od=od,
                          d=dd, p=starts.size, hw=hh * ww)


def _first_in_windows(out: int, stride: int, pad: int, dilation: int) -> np.ndarray:
    """Each window's first input position: its start, stepped on by the dilation out of the
    padding (PyTorch's ``while (start < 0) start += dilation``)."""
    start = np.arange(out) * stride - pad
    return np.where(start < 0, start + (-start + dilation - 1) // dilation * dilation, start)


def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False, *, tape=None):
    """``F.max_pool3d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)``: ``kernel_size``,
    ``stride`` (``None``: the kernel), ``padding`` (-inf, at most half the kernel) and
    ``dilation`` ints or triples; ``ceil_mode`` as PyTorch. ``return_indices=True`` also
    returns each maximum's int64 position ``(d * H + h) * W + w`` in its volume (not
    recorded; what ``max_unpool3d`` takes).

    >>> tp.max_pool3d(x, 3, stride=2, padding=1).shape       # x (1, 1, 4, 4, 4)
    (1, 1, 2, 2, 2)
    """
    op = "max_pool3d"
    x5, batched = batched5(op, x, tape)
    k, s, p, d, (od, oh, ow) = _window(op, x5.shape, kernel_size, stride, padding, dilation,
                                       bool(ceil_mode))
    n, c, dd = x5.shape[:3]
    first = max_pool2d(_planes(x5, tape), k[1:], s[1:], p[1:], d[1:], ceil_mode=ceil_mode,
                       return_indices=return_indices, tape=tape)
    y1, plane_at = first if return_indices else (first, None)
    second = max_pool2d(_depth(y1, n, c, dd, tape), (k[0], 1), (s[0], 1), (p[0], 0),
                        (d[0], 1), ceil_mode=ceil_mode, return_indices=return_indices,
                        tape=tape)
    y, depth_at = second if return_indices else (second, None)
    y = unbatch(reshape(y, (n, c, od, oh, ow), tape=tape), batched, tape=tape)
    if not return_indices:
        return y
    where = _joined(depth_at, plane_at, x5, od, _first_in_windows(oh, s[1], p[1], d[1]),
                    _first_in_windows(ow, s[2], p[2], d[2]))
    return y, where.reshape(tuple(y.shape))


def avg_pool3d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None, *,
               tape=None):
    """``F.avg_pool3d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)``, PyTorch's divisors: the
    window's size with ``count_include_pad`` (clipped to the padded input under
    ``ceil_mode``), the input elements it holds without; ``divisor_override`` (a nonzero int)
    divides every window's sum by itself instead.

    >>> tp.avg_pool3d(x, 2, divisor_override=1).to_host().ravel()[:2]   # sums of 8
    array([ 84., 100.], dtype=float32)
    """
    op = "avg_pool3d"
    if divisor_override is not None and (isinstance(divisor_override, bool) or not isinstance(
            divisor_override, (int, np.integer)) or divisor_override == 0):
        raise ShapeError(f"{op}: divisor_override must be a nonzero int or None, got "
                         f"{divisor_override!r}")
    x5, batched = batched5(op, x, tape)
    k, s, p, _, (od, oh, ow) = _window(op, x5.shape, kernel_size, stride, padding, 1,
                                       bool(ceil_mode))
    include = bool(count_include_pad) and divisor_override is None
    n, c, dd, hh, ww = x5.shape
    y = avg_pool2d(_planes(x5, tape), k[1:], s[1:], p[1:], ceil_mode=ceil_mode,
                   count_include_pad=include, tape=tape)
    y = avg_pool2d(_depth(y, n, c, dd, tape), (k[0], 1), (s[0], 1), (p[0], 0),
                   ceil_mode=ceil_mode, count_include_pad=include, tape=tape)
    y = reshape(y, (n, c, od, oh, ow), tape=tape)
    if divisor_override is not None:        # the mean over the input elements, times their
        counts = 1                          # number / divisor_override: each window's sum
        for axis, (size, out) in enumerate(zip((dd, hh, ww), (od, oh, ow))):
            start = np.arange(out) * s[axis] - p[axis]
            inside = np.minimum(start + k[axis], size) - np.maximum(start, 0)
            counts = np.multiply.outer(counts, inside)
        scale = (counts / float(divisor_override)).astype(np.float32)
        y = mul(y, constant(x5.queue, scale), tape=tape)
    return unbatch(y, batched, tape=tape)


def adaptive_avg_pool3d(x, output_size, *, tape=None):
    """``F.adaptive_avg_pool3d``: the mean of each adaptive window of ``(N, C, D, H, W)`` or
    ``(C, D, H, W)``; ``output_size`` an int or a triple (``None`` keeps that dim's size).

    >>> tp.adaptive_avg_pool3d(x, (1, None, 2)).shape       # x (1, 1, 4, 4, 4)
    (1, 1, 1, 4, 2)
    """
    op = "adaptive_avg_pool3d"
    refuse_empty_windows(op, x, 3)
    x5, batched = batched5(op, x, tape)
    n, c, dd, hh, ww = x5.shape
    od, oh, ow = _sizes(op, output_size, 3, (dd, hh, ww))
    y = adaptive_avg_pool2d(_planes(x5, tape), (oh, ow), tape=tape)
    y = adaptive_avg_pool2d(_depth(y, n, c, dd, tape), (od, oh * ow), tape=tape)
    return unbatch(reshape(y, (n, c, od, oh, ow), tape=tape), batched, tape=tape)


def adaptive_max_pool3d(x, output_size, return_indices: bool = False, *, tape=None):
    """``F.adaptive_max_pool3d``: the largest element of each adaptive window of ``(N, C, D,
    H, W)`` or ``(C, D, H, W)`` (the first, or the last NaN, as PyTorch's); with
    ``return_indices=True`` also its flat position ``(d * H + h) * W + w`` (int64, not
    recorded)."""
    op = "adaptive_max_pool3d"
    refuse_empty_windows(op, x, 3)
    x5, batched = batched5(op, x, tape)
    n, c, dd, hh, ww = x5.shape
    od, oh, ow = _sizes(op, output_size, 3, (dd, hh, ww))
    first = adaptive_max_pool2d(_planes(x5, tape), (oh, ow), return_indices, tape=tape)
    y1, plane_at = first if return_indices else (first, None)
    second = adaptive_max_pool2d(_depth(y1, n, c, dd, tape), (od, None), return_indices,
                                 tape=tape)
    y, depth_at = second if return_indices else (second, None)
    y = unbatch(reshape(y, (n, c, od, oh, ow), tape=tape), batched, tape=tape)
    if not return_indices:
        return y
    # adaptive windows always hold input, so the first positions are never read
    where = _joined(depth_at, plane_at, x5, od, np.arange(oh) * hh // oh,
                    np.arange(ow) * ww // ow)
    return y, where.reshape(tuple(y.shape))


def lp_pool3d(x, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False, *,
              tape=None):
    """``F.lp_pool3d``: ``(sum over each window of x ** p) ** (1/p)`` over ``(N, C, D, H, W)``
    or ``(C, D, H, W)``, composed as PyTorch's (``avg_pool3d`` of ``x ** p`` times the window
    size, then the root); ``p = inf`` is the max of ``abs(x)``."""
    op = "lp_pool3d"
    check_volume(op, x)
    p = _norm_type(op, norm_type)
    k = triple(op, "kernel_size", kernel_size)
    if math.isinf(p):
        y = max_pool3d(abs(x, tape=tape) if p > 0 else neg(abs(x, tape=tape), tape=tape), k,
                       stride, ceil_mode=ceil_mode, tape=tape)
        return y if p > 0 else neg(y, tape=tape)
    mean = avg_pool3d(pow(x, p, tape=tape), k, stride, ceil_mode=ceil_mode, tape=tape)
    return _root(mean, p, k[0] * k[1] * k[2], tape)


def max_unpool3d(x, indices, kernel_size, stride=None, padding=0, output_size=None, *,
                 tape=None):
    """``F.max_unpool3d``: ``(N, C, D, H, W)`` or ``(C, D, H, W)`` values written at their
    ``indices`` (``(d * H + h) * W + w``, as ``max_pool3d(..., return_indices=True)`` gives)
    into zeros; each output dim is ``(n - 1) * stride - 2 * padding + kernel`` unless
    ``output_size`` says (within a stride of that)."""
    return _unpool("max_unpool3d", x, indices, kernel_size, stride, padding, output_size, 3,
                   tape)
