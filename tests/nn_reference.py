"""float64 numpy references for the NN kernels and ops (convolution, pooling, softmax, losses,
batch norm), written the slow, obvious way."""

from __future__ import annotations

import numpy as np


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d(x, w, b=None, stride=1, padding=0):
    (sh, sw), (ph, pw) = pair(stride), pair(padding)
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    if b is not None:
        out += np.asarray(b, np.float64)[None, :, None, None]
    return out


def conv2d_grads(x, w, g, stride=1, padding=0):
    """(grad_x, grad_w, grad_b) of ``sum(conv2d(x, w) * g)``."""
    (sh, sw), (ph, pw) = pair(stride), pair(padding)
    x, w, g = (a.astype(np.float64) for a in (x, w, g))
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    oh, ow = g.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(w)
    for i in range(kh):
        for j in range(kw):
            sl = (slice(None), slice(None), slice(i, i + sh * (oh - 1) + 1, sh),
                  slice(j, j + sw * (ow - 1) + 1, sw))
            gw[:, :, i, j] = np.einsum("nohw,nchw->oc", g, xp[sl])
            gxp[sl] += np.einsum("nohw,oc->nchw", g, w[:, :, i, j])
    return gxp[:, :, ph:ph + h, pw:pw + wd], gw, g.sum(axis=(0, 2, 3))


def _windows(shape, k, s, p):
    n, c, h, w = shape
    (kh, kw), (sh, sw), (ph, pw) = pair(k), pair(s), pair(p)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * sh - ph, ox * sw - pw
            yield oy, ox, (y0, x0, kh, kw)


def _out_hw(shape, k, s, p):
    (kh, kw), (sh, sw), (ph, pw) = pair(k), pair(s), pair(p)
    return (shape[2] + 2 * ph - kh) // sh + 1, (shape[3] + 2 * pw - kw) // sw + 1


def max_pool2d(x, k, s=None, p=0):
    """(y, flat argmax per window, -1-free) with -inf padding; first maximum wins."""
    s = k if s is None else s
    oh, ow = _out_hw(x.shape, k, s, p)
    y = np.empty(x.shape[:2] + (oh, ow))
    idx = np.empty(y.shape, np.int64)
    h, w = x.shape[2:]
    for oy, ox, (y0, x0, kh, kw) in _windows(x.shape, k, s, p):
        ys, ye, xs, xe = max(y0, 0), min(y0 + kh, h), max(x0, 0), min(x0 + kw, w)
        win = x[:, :, ys:ye, xs:xe].reshape(x.shape[0], x.shape[1], -1)
        a = win.argmax(axis=2)
        y[:, :, oy, ox] = np.take_along_axis(win, a[..., None], 2)[..., 0]
        idx[:, :, oy, ox] = (ys + a // (xe - xs)) * w + xs + a % (xe - xs)
    return y, idx


def window_index(idx, x_shape, k, s=None, p=0):
    """Flat positions in the plane (``max_pool2d``'s indices) as positions within each window,
    ``ky * kw + kx`` (what the kernel saves)."""
    s = k if s is None else s
    (_, kw), (sh, sw), (ph, pw) = pair(k), pair(s), pair(p)
    oh, ow = idx.shape[2:]
    y0 = (np.arange(oh) * sh - ph)[:, None]
    x0 = (np.arange(ow) * sw - pw)[None, :]
    w = x_shape[3]
    return (idx // w - y0) * kw + idx % w - x0


def max_pool2d_grad(x_shape, idx, g):
    gx = np.zeros(x_shape).reshape(x_shape[0], x_shape[1], -1)
    for n in range(x_shape[0]):
        for c in range(x_shape[1]):
            np.add.at(gx[n, c], idx[n, c].ravel(), g[n, c].ravel())
    return gx.reshape(x_shape)


def avg_pool2d(x, k, s=None, p=0):
    s = k if s is None else s
    (kh, kw), (ph, pw) = pair(k), pair(p)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = _out_hw(x.shape, k, s, p)
    y = np.empty(x.shape[:2] + (oh, ow))
    for oy, ox, (y0, x0, _, _) in _windows(x.shape, k, s, p):
        y[:, :, oy, ox] = xp[:, :, y0 + ph:y0 + ph + kh, x0 + pw:x0 + pw + kw].sum((2, 3))
    return y / (kh * kw)


def avg_pool2d_grad(x_shape, g, k, s=None, p=0):
    s = k if s is None else s
    (kh, kw), (ph, pw) = pair(k), pair(p)
    n, c, h, w = x_shape
    gxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for oy, ox, (y0, x0, _, _) in _windows(x_shape, k, s, p):
        gxp[:, :, y0 + ph:y0 + ph + kh, x0 + pw:x0 + pw + kw] += \
            g[:, :, oy, ox][:, :, None, None] / (kh * kw)
    return gxp[:, :, ph:ph + h, pw:pw + w]


def _bins(size, out):
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def adaptive_avg_pool2d(x, out):
    oh, ow = pair(out)
    y = np.empty(x.shape[:2] + (oh, ow))
    for i, (ys, ye) in enumerate(_bins(x.shape[2], oh)):
        for j, (xs, xe) in enumerate(_bins(x.shape[3], ow)):
            y[:, :, i, j] = x[:, :, ys:ye, xs:xe].astype(np.float64).mean((2, 3))
    return y


def adaptive_avg_pool2d_grad(x_shape, g):
    oh, ow = g.shape[2:]
    gx = np.zeros(x_shape)
    for i, (ys, ye) in enumerate(_bins(x_shape[2], oh)):
        for j, (xs, xe) in enumerate(_bins(x_shape[3], ow)):
            gx[:, :, ys:ye, xs:xe] += g[:, :, i, j][:, :, None, None] / ((ye - ys) * (xe - xs))
    return gx


def softmax(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    x = x.astype(np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def cross_entropy(logits, labels):
    lp = log_softmax(logits, 1)
    return -lp[np.arange(len(labels)), labels].mean()


def cross_entropy_grad(logits, labels):
    p = softmax(logits, 1)
    p[np.arange(len(labels)), labels] -= 1
    return p / len(labels)


def batch_norm_train(x, w, b, rm, rv, momentum=0.1, eps=1e-5):
    """(y, new running mean, new running var) with PyTorch semantics."""
    axes = (0,) + tuple(range(2, x.ndim))
    x = x.astype(np.float64)
    mean, var = x.mean(axes), x.var(axes)
    m = x.size // x.shape[1]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    y = y * w.reshape(shape) + b.reshape(shape)
    return (y, (1 - momentum) * rm + momentum * mean,
            (1 - momentum) * rv + momentum * var * m / (m - 1))


def batch_norm_eval(x, w, b, rm, rv, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x.astype(np.float64) - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + eps)
            * w.reshape(shape) + b.reshape(shape))


def batch_norm_train_grads(x, w, g, eps=1e-5):
    """(gx, gw, gb) of sum(batch_norm_train(x) * g)."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    x, g = x.astype(np.float64), g.astype(np.float64)
    m = x.size // x.shape[1]
    mean, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * inv
    gb, gw = g.sum(axes), (g * xhat).sum(axes)
    gx = w.reshape(shape) * inv / m * (m * g - gb.reshape(shape) - xhat * gw.reshape(shape))
    return gx, gw, gb
