"""float64 numpy references of PyTorch's ``conv2d`` (stride, padding, dilation, groups) and
``conv_transpose2d`` (stride, padding, output_padding), written directly from their
definitions: a sum over taps of strided slices of the zero-padded input."""

from __future__ import annotations

import numpy as np


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """y[n, o] = sum over c in o's group and taps of w[o, c, ky, kx] * x[n, c, iy, ix]."""
    s, p, d = pair(stride), pair(padding), pair(dilation)
    n, c, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    y = np.zeros((n, cout, oh, ow))
    og = cout // groups
    for o in range(cout):
        g = o // og
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * d[0], kx * d[1]
                patch = xp[:, g * cg:(g + 1) * cg, y0:y0 + s[0] * (oh - 1) + 1:s[0],
                           x0:x0 + s[1] * (ow - 1) + 1:s[1]]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, ky, kx])
    return y if b is None else y + b[None, :, None, None]


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0):
    """Each input pixel scatters ``x[n, ci, iy, ix] * w[ci, :, ky, kx]`` to output position
    ``(iy*s - p + ky, ix*s - p + kx)``; the output is cropped to PyTorch's size."""
    s, p, op = pair(stride), pair(padding), pair(output_padding)
    n, _, h, wd = x.shape
    _, cout, kh, kw = w.shape
    oh = (h - 1) * s[0] - 2 * p[0] + kh + op[0]
    ow = (wd - 1) * s[1] - 2 * p[1] + kw + op[1]
    full = np.zeros((n, cout, (h - 1) * s[0] + kh + op[0], (wd - 1) * s[1] + kw + op[1]))
    for ky in range(kh):
        for kx in range(kw):
            full[:, :, ky:ky + s[0] * (h - 1) + 1:s[0], kx:kx + s[1] * (wd - 1) + 1:s[1]] += \
                np.einsum("nchw,cd->ndhw", x, w[:, :, ky, kx])
    y = full[:, :, p[0]:p[0] + oh, p[1]:p[1] + ow]
    return y if b is None else y + b[None, :, None, None]
