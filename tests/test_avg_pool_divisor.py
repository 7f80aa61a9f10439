"""``tp.avg_pool2d(..., divisor_override=d)`` and ``nn.AvgPool2d(divisor_override=d)`` as
PyTorch's: every window's sum over ``d`` (padding, ``ceil_mode`` windows and negative ``d``
included), its gradient, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn

SETTINGS = [dict(kernel_size=2, divisor_override=3),
            dict(kernel_size=3, stride=2, padding=1, divisor_override=2),
            dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=5),
            dict(kernel_size=(2, 3), padding=1, count_include_pad=False, divisor_override=-4),
            dict(kernel_size=2, divisor_override=None)]


@pytest.mark.parametrize("kw", SETTINGS)
def test_divisor_override_divides_every_window_sum_as_pytorch(queue, rng, kw):
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = tp.avg_pool2d(nx, **kw)
    want = F.avg_pool2d(tx, **kw)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_divisor_override_gives_window_sums_over_the_divisor(queue):
    x = pc.Tensor.from_host(queue, np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    np.testing.assert_allclose(tp.avg_pool2d(x, 2, divisor_override=1).to_host()[0, 0],
                               [[10, 18], [42, 50]])
    y = nn.AvgPool2d(2, divisor_override=2)(x)
    np.testing.assert_allclose(y.to_host()[0, 0], [[5, 9], [21, 25]])


def test_divisor_override_passes_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((1, 2, 5, 5)).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.avg_pool2d(v, 3, 2, 1, True, divisor_override=4), [x])


@pytest.mark.parametrize("bad", [0, 2.5, True])
def test_divisor_override_refuses_zero_and_non_ints(queue, bad):
    x = pc.Tensor.from_host(queue, np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(pc.ShapeError, match="avg_pool2d: divisor_override must be a non-zero "
                                            "int or None"):
        tp.avg_pool2d(x, 2, divisor_override=bad)
    with pytest.raises(pc.ShapeError, match="AvgPool2d: divisor_override"):
        nn.AvgPool2d(2, divisor_override=bad)
