"""float64 numpy references of PyTorch's pooling with dilation, ceil_mode and
count_include_pad (``torch.nn.functional.max_pool2d`` / ``avg_pool2d``), written from PyTorch's
CPU kernels: output sizes from ``pooling_output_shape``, the divisor from ``avg_pool2d``."""

from __future__ import annotations

import numpy as np


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def out_len(size, k, s, p, d, ceil_mode):
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _geometry(shape, k, s, p, d, ceil_mode):
    k, p, d = pair(k), pair(p), pair(d)
    s = k if s is None else pair(s)
    o = tuple(out_len(shape[2 + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(2))
    return k, s, p, d, o


def max_pool2d(x, k, s=None, p=0, d=1, ceil_mode=False):
    """(y, grad_fn): y and a function mapping an upstream gradient to the input gradient
    (each window's gradient to its first maximum, as PyTorch)."""
    k, s, p, d, (oh, ow) = _geometry(x.shape, k, s, p, d, ceil_mode)
    n, c, h, w = x.shape
    y = np.empty((n, c, oh, ow))
    arg = np.empty((n, c, oh, ow, 2), int)
    for oy in range(oh):
        for ox in range(ow):
            taps = [(oy * s[0] - p[0] + ky * d[0], ox * s[1] - p[1] + kx * d[1])
                    for ky in range(k[0]) for kx in range(k[1])]
            taps = [(iy, ix) for iy, ix in taps if 0 <= iy < h and 0 <= ix < w]
            vals = np.stack([x[:, :, iy, ix] for iy, ix in taps], -1)
            best = vals.argmax(-1)
            y[:, :, oy, ox] = vals.max(-1)
            arg[:, :, oy, ox] = np.asarray(taps)[best]

    def grad(g):
        gx = np.zeros(x.shape)
        for i in np.ndindex(g.shape):
            iy, ix = arg[i]
            gx[i[0], i[1], iy, ix] += g[i]
        return gx
    return y, grad


def avg_divisors(shape, k, s=None, p=0, ceil_mode=False, count_include_pad=True):
    k, s, p, _, (oh, ow) = _geometry(shape, k, s, p, 1, ceil_mode)
    h, w = shape[2:]
    div = np.empty((oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * s[0] - p[0], ox * s[1] - p[1]
            ye, xe = min(y0 + k[0], h + p[0]), min(x0 + k[1], w + p[1])
            if count_include_pad:
                div[oy, ox] = (ye - y0) * (xe - x0)
            else:
                div[oy, ox] = (min(ye, h) - max(y0, 0)) * (min(xe, w) - max(x0, 0))
    return div


def avg_pool2d(x, k, s=None, p=0, ceil_mode=False, count_include_pad=True):
    k, s, p, _, (oh, ow) = _geometry(x.shape, k, s, p, 1, ceil_mode)
    div = avg_divisors(x.shape, k, s, p, ceil_mode, count_include_pad)
    h, w = x.shape[2:]
    y = np.zeros((*x.shape[:2], oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * s[0] - p[0], ox * s[1] - p[1]
            win = x[:, :, max(y0, 0):min(y0 + k[0], h), max(x0, 0):min(x0 + k[1], w)]
            y[:, :, oy, ox] = win.sum((2, 3)) / div[oy, ox]
    return y
