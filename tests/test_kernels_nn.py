"""NN kernels against float64 numpy: convolution (forward and all three gradients), pooling,
softmax, cross-entropy, MSE, batch norm and the dropout RNG, on awkward shapes."""

from __future__ import annotations

import nn_reference as ref
import numpy as np
import pyopencl as cl
import pytest

import parcl as pc
from parcl.kernels import batchnorm as bnk
from parcl.kernels import conv as convk
from parcl.kernels import cross_entropy as cek
from parcl.kernels import pool as poolk
from parcl.kernels import random as rndk
from parcl.kernels import softmax as smk
from conftest import close, up


# -- convolution --------------------------------------------------------------------------------
CONV_CASES = [
    # (x shape, weight shape, stride, padding)
    ((1, 1, 8, 8), (2, 1, 3, 3), 1, 1),
    ((2, 3, 7, 7), (5, 3, 3, 3), 2, 1),
    ((1, 5, 7, 9), (3, 5, 2, 3), (2, 1), (0, 1)),       # non-square kernel, strides, padding
    ((3, 3, 8, 8), (4, 3, 1, 1), 1, 0),                  # 1x1
    ((2, 1, 5, 5), (1, 1, 5, 5), 1, 0),                  # 1x1 output
    ((1, 2, 33, 7), (3, 2, 3, 3), (2, 2), 1),
    ((2, 2, 9, 9), (2, 2, 3, 3), 1, 2),                  # padding wider than half the kernel
    ((2, 2, 11, 12), (3, 2, 4, 3), (3, 2), (2, 1)),      # stride 3 > kernel height - 1
    ((3, 4, 10, 9), (2, 4, 3, 3), 1, 0),                 # the common unpadded 3x3
    # rows wide enough for col2im's 8-column blocks on CPUs (the last one overlapping)
    ((2, 3, 12, 29), (4, 3, 3, 3), 1, 1),
    ((2, 2, 9, 20), (3, 2, 3, 5), (2, 1), (1, 2)),
]


@pytest.mark.parametrize("xs, ws, stride, padding", CONV_CASES)
def test_conv2d_forward_and_backward(queue, rng, xs, ws, stride, padding):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    want = ref.conv2d(x, w, b, stride, padding)
    y = convk.conv2d_forward(up(queue, x), up(queue, w), up(queue, b), stride, padding)
    assert y.shape == want.shape
    close(y.to_host(), want)
    g = rng.standard_normal(want.shape).astype(np.float32)
    gx, gw, gb = convk.conv2d_backward(up(queue, x), up(queue, w), up(queue, g), stride,
                                       padding, need_input=True, need_weight=True,
                                       need_bias=True)
    rgx, rgw, rgb = ref.conv2d_grads(x, w, g, stride, padding)
    close(gx.to_host(), rgx)
    close(gw.to_host(), rgw)
    close(gb.to_host(), rgb)


def test_conv2d_chunked_over_batch(queue, rng, monkeypatch):
    """A tiny im2col budget forces one GEMM per image; results and gradients are unchanged."""
    x = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    g = rng.standard_normal((3, 4, 6, 6)).astype(np.float32)
    whole = convk.conv2d_forward(up(queue, x), up(queue, w), None, 1, 1).to_host()
    grads = [t.to_host() for t in convk.conv2d_backward(up(queue, x), up(queue, w),
                                                        up(queue, g), 1, 1)[:2]]
    monkeypatch.setattr(convk, "COLS_LIMIT", 36 * 18)
    assert len(list(convk._chunks(3, 36, 18))) == 3
    close(convk.conv2d_forward(up(queue, x), up(queue, w), None, 1, 1).to_host(), whole, 1e-6)
    chunked = convk.conv2d_backward(up(queue, x), up(queue, w), up(queue, g), 1, 1)[:2]
    for a, b in zip(chunked, grads):
        close(a.to_host(), b, 1e-5)


def test_conv2d_is_deterministic(queue, rng):
    x = up(queue, rng.standard_normal((2, 3, 9, 9)))
    w = up(queue, rng.standard_normal((4, 3, 3, 3)))
    g = up(queue, rng.standard_normal((2, 4, 9, 9)))
    runs = [[t.to_host() for t in convk.conv2d_backward(x, w, g, 1, 1, need_bias=True)]
            for _ in range(2)]
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_conv2d_errors(queue):
    x = up(queue, np.zeros((1, 3, 8, 8)))
    with pytest.raises(pc.ShapeError, match=r"conv2d: input has 3 channels.*\(4, 2, 3, 3\)"):
        convk.conv2d_forward(x, up(queue, np.zeros((4, 2, 3, 3))))
    with pytest.raises(pc.ShapeError, match=r"conv2d: input must be 4-D"):
        convk.conv2d_forward(up(queue, np.zeros((3, 8, 8))), up(queue, np.zeros((4, 3, 3, 3))))
    with pytest.raises(pc.ShapeError, match=r"does not fit"):
        convk.conv2d_forward(x, up(queue, np.zeros((4, 3, 9, 9))))
    with pytest.raises(pc.ShapeError, match=r"bias has shape \(3,\)"):
        convk.conv2d_forward(x, up(queue, np.zeros((4, 3, 3, 3))), up(queue, np.zeros(3)))


# -- pooling ----------------------------------------------------------------------------------
POOL_CASES = [((1, 1, 8, 8), 2, None, 0), ((2, 3, 7, 7), 3, 2, 1), ((1, 5, 8, 8), 3, 1, 1),
              ((2, 1, 7, 9), (3, 2), (2, 1), (1, 0)), ((1, 2, 33, 7), 2, 2, 0)]


def _distinct(rng, shape):
    """Values at least 0.01 apart, so window maxima are unique (no ties)."""
    return (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.01).astype(np.float32)


@pytest.mark.parametrize("xs, k, s, p", POOL_CASES)
def test_max_pool(queue, rng, xs, k, s, p):
    x = _distinct(rng, xs)
    want, widx = ref.max_pool2d(x, k, s, p)
    y, idx = poolk.max_pool2d_forward(up(queue, x), k, s, p)
    close(y.to_host(), want, 0)
    assert idx.dtype == np.uint8
    assert np.array_equal(idx.to_host(), ref.window_index(widx, xs, k, s, p))
    g = rng.standard_normal(want.shape).astype(np.float32)
    gx = poolk.max_pool2d_backward(up(queue, g), idx, xs, k, s, p)
    close(gx.to_host(), ref.max_pool2d_grad(xs, widx, g))


def test_max_pool_nan_and_ties(queue):
    x = np.array([[[[1.0, 1.0], [0.0, np.nan]]]], np.float32)
    y, idx = poolk.max_pool2d_forward(up(queue, x), 2)
    assert np.isnan(y.to_host()).all() and idx.to_host().item() == 3      # (1, 1) of 2x2
    y, idx = poolk.max_pool2d_forward(up(queue, np.ones((1, 1, 2, 2))), 2)
    assert idx.to_host().item() == 0                      # first maximum wins


def _max_pool_loops(x, k, s, p):
    """PyTorch's CPU rule, element by element: take v when v > best or v is NaN (so NaN wins
    and a later NaN moves the index), padding skipped, index = first in-bounds position."""
    s = k if s is None else s
    (kh, kw), (sh, sw), (ph, pw) = [(v, v) if isinstance(v, int) else v for v in (k, s, p)]
    n, c, h, w = x.shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y, idx = np.empty((n, c, oh, ow), np.float32), np.empty((n, c, oh, ow), np.int64)
    for i, j, oy, ox in np.ndindex(n, c, oh, ow):
        y0, x0 = oy * sh - ph, ox * sw - pw
        best, arg = -np.inf, max(y0, 0) * w + max(x0, 0)
        for yy in range(max(y0, 0), min(y0 + kh, h)):
            for xx in range(max(x0, 0), min(x0 + kw, w)):
                v = x[i, j, yy, xx]
                if v > best or np.isnan(v):
                    best, arg = v, yy * w + xx
        y[i, j, oy, ox], idx[i, j, oy, ox] = best, arg
    return y, idx


# 2x2 at stride 2 runs 8 outputs of a row at a time on CPUs, the last block overlapping:
# rows of 2, 4, 6, 8, 13 and 20 outputs (odd input widths leave a column out)
POOL_2X2_ROWS = [((2, 3, 6, 5), 2, None, 0), ((2, 3, 10, 8), 2, 2, 0), ((2, 3, 12, 13), 2, 2, 0),
                 ((2, 3, 4, 16), 2, 2, 0), ((1, 2, 6, 27), 2, 2, 0), ((1, 1, 4, 41), 2, 2, 0)]


@pytest.mark.parametrize("xs, k, s, p", POOL_CASES + POOL_2X2_ROWS + [
    ((2, 2, 9, 11), 2, 1, 1), ((1, 2, 11, 10), 3, (1, 2), 1), ((1, 1, 7, 7), 4, 3, 2)])
def test_max_pool_specialised_windows_nan_inf_ties(queue, rng, xs, k, s, p):
    """Each window shape is its own program (constant loops, masked padding): check NaN
    (wins; the last NaN's index), -inf, ties (the first maximum) and padding on all of them,
    and the backward gather where windows overlap."""
    x = rng.integers(-3, 3, xs).astype(np.float32)
    m = rng.random(xs)
    x[m < 0.05] = np.nan
    x[(m > 0.05) & (m < 0.1)] = -np.inf
    x[0, 0] = -np.inf                                   # whole windows of -inf
    want, widx = _max_pool_loops(x, k, s, p)
    y, idx = poolk.max_pool2d_forward(up(queue, x), k, s, p)
    np.testing.assert_array_equal(y.to_host(), want)
    np.testing.assert_array_equal(idx.to_host(), ref.window_index(widx, xs, k, s, p))
    g = rng.standard_normal(want.shape).astype(np.float32)
    gx = poolk.max_pool2d_backward(up(queue, g), idx, xs, k, s, p)
    close(gx.to_host(), ref.max_pool2d_grad(xs, widx, g))


@pytest.mark.parametrize("xs, k, s, p, dtype", [((1, 2, 18, 20), 16, 2, 8, np.uint8),
                                                ((1, 2, 19, 18), (17, 16), 1, (8, 0), np.int32),
                                                ((2, 1, 40, 9), (20, 13), (3, 1), 6, np.int32),
                                                ((1, 2, 35, 41), (17, 20), None, 0, np.int32)])
def test_max_pool_window_index_types(queue, rng, xs, k, s, p, dtype):
    """Indices are positions within the window: one byte up to 256 elements (16x16 is the
    largest square), an int beyond, with padding, overlaps, NaN and -inf as above."""
    x = rng.integers(-3, 3, xs).astype(np.float32)
    m = rng.random(xs)
    x[m < 0.05] = np.nan
    x[(m > 0.05) & (m < 0.1)] = -np.inf
    want, widx = _max_pool_loops(x, k, s, p)
    y, idx = poolk.max_pool2d_forward(up(queue, x), k, s, p)
    assert idx.dtype == dtype == poolk.index_dtype(k)
    np.testing.assert_array_equal(y.to_host(), want)
    np.testing.assert_array_equal(idx.to_host(), ref.window_index(widx, xs, k, s, p))
    g = rng.standard_normal(want.shape).astype(np.float32)
    gx = poolk.max_pool2d_backward(up(queue, g), idx, xs, k, s, p)
    close(gx.to_host(), ref.max_pool2d_grad(xs, widx, g))
    with pytest.raises(pc.DTypeError, match="max_pool2d backward: indices"):
        poolk.max_pool2d_backward(up(queue, g), up(queue, widx, np.int64), xs, k, s, p)


@pytest.mark.parametrize("xs, k, s, p", POOL_CASES)
def test_avg_pool(queue, rng, xs, k, s, p):
    x = rng.standard_normal(xs).astype(np.float32)
    want = ref.avg_pool2d(x, k, s, p)
    close(poolk.avg_pool2d_forward(up(queue, x), k, s, p).to_host(), want)
    g = rng.standard_normal(want.shape).astype(np.float32)
    gx = poolk.avg_pool2d_backward(up(queue, g), xs, k, s, p)
    close(gx.to_host(), ref.avg_pool2d_grad(xs, g, k, s, p))


@pytest.mark.parametrize("xs, out", [((2, 3, 8, 8), 1), ((1, 2, 7, 7), 3), ((1, 1, 5, 9), (2, 4)),
                                     ((2, 5, 8, 8), 2), ((1, 1, 3, 3), 5)])
def test_adaptive_avg_pool(queue, rng, xs, out):
    x = rng.standard_normal(xs).astype(np.float32)
    want = ref.adaptive_avg_pool2d(x, out)
    y = poolk.adaptive_avg_pool2d_forward(up(queue, x), out)
    close(y.to_host(), want)
    g = rng.standard_normal(want.shape).astype(np.float32)
    close(poolk.adaptive_avg_pool2d_backward(up(queue, g), xs).to_host(),
          ref.adaptive_avg_pool2d_grad(xs, g))


def test_pool_errors(queue):
    x = up(queue, np.zeros((1, 1, 4, 4)))
    with pytest.raises(pc.ShapeError, match=r"max_pool2d: padding \(2, 2\) must be at most half"):
        poolk.max_pool2d_forward(x, 3, 1, 2)
    with pytest.raises(pc.ShapeError, match=r"avg_pool2d: input must be 4-D"):
        poolk.avg_pool2d_forward(up(queue, np.zeros((4, 4))), 2)
    with pytest.raises(pc.ShapeError, match=r"does not fit"):
        poolk.max_pool2d_forward(x, 5)


# -- softmax and losses -------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((1, 7), -1), ((33, 10), 1), ((4, 5, 3), 1),
                                         ((2, 3, 4), 0), ((257,), 0)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(queue, rng, shape, axis, log):
    x = (rng.standard_normal(shape) * 5 + 50).astype(np.float32)      # large: needs max-shift
    fn = ref.log_softmax if log else ref.softmax
    y = smk.softmax_forward(up(queue, x), axis, log=log)
    close(y.to_host(), fn(x, axis))
    g = rng.standard_normal(shape).astype(np.float32)
    gx = smk.softmax_backward(y, up(queue, g), axis, log=log).to_host()
    s = ref.softmax(x, axis)
    if log:
        want = g - s * g.sum(axis, keepdims=True)
    else:
        want = s * (g - (g * s).sum(axis, keepdims=True))
    close(gx, want)


# softmax_fwd as it was when it computed each exp twice (once for the sum, once for the output):
# the kernel that keeps them in y must give its bits
# softmax_fwd without keeping its exps: each computed again for the output, by the same
# helpers (8 at a time along a contiguous line on a CPU)
_TWO_PASS_SOFTMAX = smk.ROW_HELPERS + r"""
__kernel void two_pass(__global const float* restrict x, __global float* restrict y,
                       const long lines, const int C, const int inner, const int vec)
{
    const long gid = get_global_id(0);
    if (gid >= lines)
        return;
    const long o = gid / inner;
    const int i = (int)(gid - o * inner);
    const global float* xl = x + o * C * inner + i;
    global float* yl = y + o * C * inner + i;
    float m, s;
    ROW_MAX(m, c, LOAD8(xl + c), xl[(long)c * inner]);
    ROW_SUM(s, c, exp(LOAD8(xl + c) - m), exp(xl[(long)c * inner] - m));
    const float inv = 1.0f / s;
    ROW_EACH(c, STORE8(yl + c, exp(LOAD8(xl + c) - m) * inv),
             yl[(long)c * inner] = exp(xl[(long)c * inner] - m) * inv);
}
"""


def test_softmax_keeping_its_exps_gives_the_two_pass_kernels_bits(queue, rng):
    kernel = cl.Program(queue.context, _TWO_PASS_SOFTMAX).build().two_pass
    for shape, axis in [((8, 64), -1), ((33, 10), 1), ((4, 5, 3), 1), ((2, 3, 4), 0),
                        ((257,), 0), ((16, 4, 64), -1), ((3, 50257), 1)]:
        x = (rng.standard_normal(shape) * 8).astype(np.float32)
        x.flat[::7] = -np.inf                               # masked entries
        if x.ndim > 1:
            x[(0,) * (x.ndim - 1)] = np.float32(1e30)       # a huge value beside them
        got = smk.softmax_forward(up(queue, x), axis).to_host()
        outer = int(np.prod(shape[:axis % x.ndim]))
        inner = int(np.prod(shape[axis % x.ndim + 1:]))
        want = pc.Tensor.empty(queue, shape)
        kernel(queue, (outer * inner,), None, up(queue, x).data, want.data,
               np.int64(outer * inner), np.int32(shape[axis]), np.int32(inner),
               np.int32(smk._contiguous_rows(queue, inner)))
        assert got.tobytes() == want.to_host().tobytes(), shape


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n, c", [(1, 2), (7, 10), (300, 33)])
def test_cross_entropy(queue, rng, dtype, n, c):
    x = (rng.standard_normal((n, c)) * 3).astype(np.float32)
    labels = rng.integers(0, c, n)
    loss, lse, flag = cek.cross_entropy_forward(up(queue, x), up(queue, labels, dtype))
    close(loss.to_host(), ref.cross_entropy(x, labels))
    assert loss.shape == () and flag.to_host()[0] == -1
    gx = cek.cross_entropy_backward(up(queue, x), up(queue, labels, dtype), lse,
                                    up(queue, np.float32(2.0)))
    close(gx.to_host(), 2 * ref.cross_entropy_grad(x, labels))


def test_cross_entropy_flags_first_bad_label(queue):
    x = up(queue, np.zeros((5, 3)))
    loss, _, flag = cek.cross_entropy_forward(x, up(queue, [0, 1, 7, -1, 2], np.int64))
    assert np.isnan(loss.item())
    assert flag.to_host().tolist() == [2, 7]


def test_mse(queue, rng):
    p, t = rng.standard_normal((2, 3, 7)), rng.standard_normal((2, 3, 7))
    loss = smk.mse_forward(up(queue, p), up(queue, t))
    close(loss.to_host(), ((p - t) ** 2).mean())
    gp, gt = smk.mse_backward(up(queue, p), up(queue, t), up(queue, np.float32(0.5)), True, True)
    close(gp.to_host(), (p - t) / p.size)
    close(gt.to_host(), -(p - t) / p.size)
    with pytest.raises(pc.ShapeError, match=r"mse_loss: prediction \(2, 3\) and target \(3, 2\)"):
        smk.mse_forward(up(queue, np.zeros((2, 3))), up(queue, np.zeros((3, 2))))


# -- batch norm -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 1, 7, 7), (16, 5), (1, 3, 8, 8)])
def test_batch_norm_train_and_eval(queue, rng, shape):
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    w, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    rm0, rv0 = rng.standard_normal(c).astype(np.float32), rng.random(c).astype(np.float32) + 0.5
    rm, rv = up(queue, rm0), up(queue, rv0)
    y, mean, invstd = bnk.batch_norm_forward(up(queue, x), up(queue, w), up(queue, b), rm, rv,
                                             True, 0.2, 1e-5)
    wy, wrm, wrv = ref.batch_norm_train(x, w, b, rm0, rv0, 0.2)
    close(y.to_host(), wy)
    close(rm.to_host(), wrm)
    close(rv.to_host(), wrv)
    g = rng.standard_normal(shape).astype(np.float32)
    gx, gw, gb = bnk.batch_norm_backward(up(queue, x), up(queue, g), up(queue, w), mean, invstd,
                                         True)
    for got, want in zip((gx, gw, gb), ref.batch_norm_train_grads(x, w, g)):
        close(got.to_host(), want, 2e-4)
    ye, _, _ = bnk.batch_norm_forward(up(queue, x), up(queue, w), up(queue, b), rm, rv, False)
    close(ye.to_host(), ref.batch_norm_eval(x, w, b, wrm, wrv))
    close(rm.to_host(), wrm)                                  # eval leaves running stats alone


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (16, 5), (1, 3, 8, 8)])
@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_residual_epilogue(queue, rng, shape, relu):
    """bn(x) + r (then ReLU) in the apply pass, into a new tensor or over r itself: the same
    bits as bn(x) followed by the add and the ReLU kernels, and NaN in r stays NaN."""
    from parcl.kernels import elementwise as ew
    c = shape[1]
    x = rng.standard_normal(shape).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    r.flat[0] = np.nan
    w, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    want, _, _ = bnk.batch_norm_forward(up(queue, x), up(queue, w), up(queue, b), None, None,
                                        True)
    ew.axpy(want, up(queue, r), 1.0)
    if relu:
        ew.unary("relu", want, out=want)
    want = want.to_host()
    wy = ref.batch_norm_train(x, w, b, np.zeros(c), np.ones(c), 0.1)[0] + r
    close(want, np.maximum(wy, 0) if relu else wy)
    assert np.isnan(want.flat[0])
    rt = up(queue, r)
    y, _, _ = bnk.batch_norm_forward(up(queue, x), up(queue, w), up(queue, b), None, None, True,
                                     residual=rt, relu=relu)
    np.testing.assert_array_equal(y.to_host(), want)
    np.testing.assert_array_equal(rt.to_host(), r)                # r itself untouched
    y, _, _ = bnk.batch_norm_forward(up(queue, x), up(queue, w), up(queue, b), None, None, True,
                                     residual=rt, relu=relu, overwrite_residual=True)
    assert y is rt
    np.testing.assert_array_equal(rt.to_host(), want)


def test_batch_norm_residual_errors(queue):
    x, r = up(queue, np.ones((2, 3, 4, 4))), up(queue, np.ones((2, 3, 4, 4)))
    with pytest.raises(pc.ShapeError, match="residual"):
        bnk.batch_norm_forward(x, None, None, None, None, True, residual=r.reshape(2, 3, 16))
    with pytest.raises(pc.ShapeError, match="backward reads the input"):
        bnk.batch_norm_forward(x, None, None, None, None, True, residual=x,
                               overwrite_residual=True)
    with pytest.raises(pc.ShapeError, match="needs a residual"):
        bnk.batch_norm_forward(x, None, None, None, None, True, overwrite_residual=True)


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("shape", [(3, 4, 5, 2), (7, 3), (2, 5, 8), (3, 2, 33), (4, 3, 26, 26),
                                   (1, 1, 257)])
def test_channel_sum(queue, rng, monkeypatch, shape, gpu):
    """Both variants (CPU: 8 lanes per channel; GPU: a work-group tree), runs of every length
    against the 8 lanes (shorter, a multiple, a tail)."""
    monkeypatch.setattr(bnk, "on_gpu", lambda queue: gpu)
    x = rng.standard_normal(shape)
    close(bnk.channel_sum(up(queue, x)).to_host(), x.sum(tuple(i for i in range(x.ndim) if i != 1)))


# -- dropout RNG ----------------------------------------------------------------------------
def test_dropout_mask_statistics_and_determinism(queue):
    x = up(queue, np.ones(100_000))
    y = rndk.dropout_forward(x, 0.25, seed=3, counter=5).to_host()
    assert set(np.unique(y).tolist()) == {0.0, np.float32(1 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.01
    assert np.array_equal(y, rndk.dropout_forward(x, 0.25, seed=3, counter=5).to_host())
    other = rndk.dropout_forward(x, 0.25, seed=3, counter=6).to_host()
    assert not np.array_equal(y, other)
    mask = rndk.dropout_mask(queue, (100_000,), 0.25, 3, 5).to_host()
    assert np.array_equal(mask == 1, y != 0)
    assert (rndk.dropout_forward(x, 1.0, 0, 0).to_host() == 0).all()


# -- the GPU launch shapes, run on the CPU device -------------------------------------------
def test_gpu_grids_give_the_same_results(queue, rng, monkeypatch):
    """The GPU work-item layouts (one element per work-item, 256-wide reductions) are chosen
    by device type; force them here so they are exercised without a GPU."""
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    g = rng.standard_normal((2, 4, 4, 9)).astype(np.float32)
    logits, labels = rng.standard_normal((9, 5)), rng.integers(0, 5, 9)

    def run():
        y = convk.conv2d_forward(up(queue, x), up(queue, w), up(queue, b), 2, 1)
        grads = convk.conv2d_backward(up(queue, x), up(queue, w), up(queue, g), 2, 1,
                                      need_bias=True)
        mp, idx = poolk.max_pool2d_forward(up(queue, x), 3, 2, 1)
        mpg = poolk.max_pool2d_backward(mp, idx, x.shape, 3, 2, 1)
        tiled, tidx = poolk.max_pool2d_forward(up(queue, x), 2)      # tiling windows, tails
        tiled_g = poolk.max_pool2d_backward(tiled, tidx, x.shape, 2)
        ap = poolk.adaptive_avg_pool2d_forward(up(queue, x), (2, 4))
        bn, mean, invstd = bnk.batch_norm_forward(up(queue, x), None, None, None, None, True)
        bn_grads = bnk.batch_norm_backward(up(queue, x), up(queue, x[::-1].copy()),
                                           up(queue, b[:3]), mean, invstd, True)
        ce = cek.cross_entropy_forward(up(queue, logits), up(queue, labels, np.int64))[0]
        return [t.to_host() for t in (y, *grads, mp, mpg, tiled, tiled_g, ap, bn, *bn_grads,
                                      ce)]

    cpu = run()
    for mod in (convk, bnk, smk):
        monkeypatch.setattr(mod, "on_gpu", lambda queue: True)
    for a, b_ in zip(run(), cpu):
        close(a, b_, 1e-5)
