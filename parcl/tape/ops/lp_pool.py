"""PyTorch's power-average pools ``lp_pool1d`` and ``lp_pool2d``: ``(sum over the window of
x ** p) ** (1/p)``, composed as PyTorch composes them (``avg_pool`` of ``x ** p`` times the
window's size, ``sign(s) * relu(|s|)``, then the ``1/p`` power), so values and gradients are
those ops' and match PyTorch's, the windows ``ceil_mode`` clips at the edge included (scaled
by the full window size, as PyTorch's). ``p = inf`` is ``max_pool`` of ``|x|``; ``-inf`` the
smallest ``|x|``.

>>> x = tp.tensor(np.array([[[3.0, 4.0, 1.0, 0.0]]], np.float32))
>>> tp.lp_pool1d(x, 2, 2).to_host()
array([[[5., 1.]]], dtype=float32)
"""

from __future__ import annotations

import math
from numbers import Real

from ...errors import ParclError, ShapeError
from .elementwise import mul, pow
from .mathops import sign
from .nn import avg_pool2d, max_pool2d
from .sequence import avg_pool1d, max_pool1d, single
from .shape import as_batched, unbatch
from .unary import abs, neg, relu

__all__ = ["lp_pool1d", "lp_pool2d"]


def _norm_type(op: str, norm_type) -> float:
    if isinstance(norm_type, bool) or not isinstance(norm_type, Real) or norm_type == 0 \
            or math.isnan(norm_type):
        raise ParclError(f"{op}: norm_type must be a nonzero number (or +-inf), got "
                         f"{norm_type!r}")
    return float(norm_type)


def _root(summed, p: float, size: int, tape):
    """``(sign(s) * relu(|s|) * size) ** (1/p)`` of the window means ``s``, PyTorch's steps."""
    s = mul(sign(summed, tape=tape), relu(abs(summed, tape=tape), tape=tape), tape=tape)
    return pow(mul(s, float(size), tape=tape), 1.0 / p, tape=tape)


def lp_pool1d(x, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False, *,
              tape=None):
    """``F.lp_pool1d`` over ``(N, C, L)`` or ``(C, L)``; ``stride=None`` means
    ``kernel_size``."""
    p = _norm_type("lp_pool1d", norm_type)
    k = single("lp_pool1d", "kernel_size", kernel_size)
    if math.isinf(p):
        y = max_pool1d(abs(x, tape=tape) if p > 0 else neg(abs(x, tape=tape), tape=tape), k,
                       stride, ceil_mode=ceil_mode, tape=tape)
        return y if p > 0 else neg(y, tape=tape)
    mean = avg_pool1d(pow(x, p, tape=tape), k, stride, ceil_mode=ceil_mode, tape=tape)
    return _root(mean, p, k, tape)


def lp_pool2d(x, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False, *,
              tape=None):
    """``F.lp_pool2d`` over ``(N, C, H, W)`` or ``(C, H, W)``; ``kernel_size`` and ``stride``
    ints or pairs (``stride=None`` means ``kernel_size``)."""
    p = _norm_type("lp_pool2d", norm_type)
    pair = tuple(kernel_size) if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * 2
    kh, kw = (single("lp_pool2d", "kernel_size", k) for k in pair) if len(pair) == 2 else (0, 0)
    if not kh:
        raise ShapeError(f"lp_pool2d: kernel_size must be an int or a pair, got {kernel_size!r}")
    x4, batched = as_batched("lp_pool2d", x, "C, H, W", tape=tape)
    if math.isinf(p):
        y = max_pool2d(abs(x4, tape=tape) if p > 0 else neg(abs(x4, tape=tape), tape=tape),
                       (kh, kw), stride, ceil_mode=ceil_mode, tape=tape)
        y = y if p > 0 else neg(y, tape=tape)
    else:
        mean = avg_pool2d(pow(x4, p, tape=tape), (kh, kw), stride, ceil_mode=ceil_mode,
                          tape=tape)
        y = _root(mean, p, kh * kw, tape)
    return unbatch(y, batched, tape=tape)
