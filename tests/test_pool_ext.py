"""Pooling with PyTorch's options: ``dilation`` and ``ceil_mode`` for max pooling, ``ceil_mode``
and ``count_include_pad`` for average pooling, against float64 numpy references of PyTorch's
rules (output sizes, the divisor), gradients by ``tp.gradcheck``, repeated runs bit-identical."""

from __future__ import annotations

import numpy as np
import pool_reference as ref
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up


def distinct(rng, shape):
    """Values far enough apart that finite differences never swap a window's maximum."""
    return rng.permutation(np.prod(shape)).reshape(shape) * 0.1 + rng.uniform(0, 0.01, shape)


# (x shape, kernel, stride, padding, dilation, ceil_mode): odd and size-1 dims, overhanging
# ceil_mode windows, the input smaller than the window plus padding
MAX_CASES = [
    ((2, 3, 7, 9), 3, 2, 1, 1, True),
    ((1, 2, 8, 8), 3, 2, 0, 2, False),
    ((1, 2, 9, 7), (3, 2), (2, 1), (1, 0), (2, 3), True),
    ((2, 1, 5, 5), 2, 2, 0, 1, True),
    ((1, 2, 1, 1), 3, 1, 1, 1, False),
    ((1, 1, 2, 3), 2, 3, 1, 1, True),
    ((1, 2, 6, 6), 2, 2, 0, 1, False),
]


@pytest.mark.parametrize("xs, k, s, p, d, ceil", MAX_CASES)
def test_max_pool2d_options_forward_backward(queue, rng, xs, k, s, p, d, ceil):
    x = distinct(rng, xs)
    want, want_grad = ref.max_pool2d(x, k, s, p, d, ceil)
    nx = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.max_pool2d(nx, k, s, p, dilation=d, ceil_mode=ceil)
    assert y.shape == want.shape
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-6)
    g = rng.standard_normal(want.shape)
    tape.backward(y, grad=up(queue, g))
    np.testing.assert_allclose(nx.grad.to_host(), want_grad(g), rtol=1e-5, atol=1e-6)
    assert tp.gradcheck(lambda a: tp.max_pool2d(a, k, s, p, d, ceil), [leaf(queue, x)])


AVG_CASES = [
    ((2, 3, 7, 9), 3, 2, 1, True, True),
    ((2, 3, 7, 9), 3, 2, 1, True, False),
    ((2, 3, 7, 9), 3, 2, 1, False, False),
    ((1, 2, 5, 6), (3, 2), (2, 3), (1, 1), True, True),
    ((1, 2, 1, 1), 3, 1, 1, False, False),
    ((1, 2, 1, 1), 3, 1, 1, False, True),
    ((1, 1, 4, 5), 2, 3, 0, True, False),
    ((2, 1, 6, 6), 2, 2, 0, False, False),
]


@pytest.mark.parametrize("xs, k, s, p, ceil, include", AVG_CASES)
def test_avg_pool2d_options_forward_and_gradcheck(queue, rng, xs, k, s, p, ceil, include):
    x = rng.standard_normal(xs)
    want = ref.avg_pool2d(x, k, s, p, ceil, include)
    nx = leaf(queue, x)
    y = tp.avg_pool2d(nx, k, s, p, ceil_mode=ceil, count_include_pad=include)
    assert y.shape == want.shape
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-6)
    assert tp.gradcheck(lambda a: tp.avg_pool2d(a, k, s, p, ceil, include), [nx])


def test_ceil_mode_drops_a_window_that_would_start_in_the_padding(queue):
    # 5 wide, kernel 2, stride 2, padding 1: ceil((5 + 2 - 2) / 2) + 1 = 4, but the 4th
    # window would start at 5 = W + padding - 1 + 1 (in the right padding), so 3
    x = up(queue, np.arange(25).reshape(1, 1, 5, 5))
    assert tp.max_pool2d(x, 2, 2, 1, ceil_mode=True).shape == (1, 1, 3, 3)
    assert tp.avg_pool2d(x, 2, 2, 1, ceil_mode=True).shape == (1, 1, 3, 3)
    # 6 wide, kernel 3, stride 2: floor gives 2, ceil 3 (the last window hangs over by one)
    x6 = up(queue, np.ones((1, 1, 6, 6)))
    y = tp.avg_pool2d(x6, 3, 2, ceil_mode=True).to_host()
    assert y.shape == (1, 1, 3, 3)
    # the hanging window's divisor is the part inside the (unpadded) input: all ones stay 1
    np.testing.assert_array_equal(y, np.ones((1, 1, 3, 3), np.float32))


def test_pool_options_are_bit_identical_run_to_run(queue, rng):
    x = up(queue, rng.standard_normal((2, 3, 9, 8)))
    runs = []
    for _ in range(2):
        nx = tp.tensor(x, requires_grad=True)
        with tp.Tape() as tape:
            y = tp.sum(tp.max_pool2d(nx, 3, 2, 1, 2, True) * 1.5) + tp.sum(
                tp.avg_pool2d(nx, 3, 2, 1, True, False))
        tape.backward(y)
        runs.append((y.to_host(), nx.grad.to_host()))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_default_arguments_keep_their_results(queue, rng):
    """Defaults spelled out give the very bits of the old call (same kernels, same programs)."""
    x = up(queue, rng.standard_normal((2, 3, 8, 8)))
    for k, s, p in ((2, None, 0), (3, 2, 1), (3, 1, 1)):
        a = tp.max_pool2d(x, k, s, p).to_host()
        b = tp.max_pool2d(x, k, s, p, dilation=1, ceil_mode=False).to_host()
        np.testing.assert_array_equal(a, b)
        a = tp.avg_pool2d(x, k, s, p).to_host()
        b = tp.avg_pool2d(x, k, s, p, ceil_mode=False, count_include_pad=True).to_host()
        np.testing.assert_array_equal(a, b)


def test_pool_option_errors(queue):
    x = up(queue, np.zeros((1, 1, 4, 4)))
    with pytest.raises(pc.ShapeError, match=r"max_pool2d: padding \(2, 2\) must be at most half"):
        tp.max_pool2d(x, 3, 1, 2, dilation=2)
    with pytest.raises(pc.ShapeError, match=r"max_pool2d: .*dilation \(0, 0\)"):
        tp.max_pool2d(x, 2, dilation=0)
    with pytest.raises(pc.ShapeError, match=r"max_pool2d: kernel \(3, 3\) .*dilation \(2, 2\) "
                                            r"does not fit .*\(4, 4\)"):
        tp.max_pool2d(x, 3, dilation=2)
