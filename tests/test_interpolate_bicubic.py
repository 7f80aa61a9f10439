"""``tp.interpolate(mode="bicubic")``, ``nn.Upsample(mode="bicubic")`` and ``mode="area"``
against PyTorch's: values and gradients for sizes and scale factors up and down,
``align_corners`` both ways, the border clamp, A = -0.75 on a hand-checked row, gradcheck,
the 4-D requirement, and area as adaptive average pooling over 1 to 3 spatial dims."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn

SETTINGS = [dict(scale_factor=2), dict(scale_factor=2, align_corners=True),
            dict(size=(5, 9), align_corners=True), dict(size=(3, 4)),
            dict(scale_factor=(1.7, 0.6)), dict(size=(1, 1), align_corners=True),
            dict(scale_factor=1.5, recompute_scale_factor=True), dict(size=(6, 7))]


@pytest.mark.parametrize("kw", SETTINGS)
def test_bicubic_matches_pytorch_values_and_gradients(queue, rng, kw):
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = tp.interpolate(nx, mode="bicubic", **kw)
    want = F.interpolate(tx, mode="bicubic", **kw)
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=5e-6)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=5e-6)


def test_bicubic_weights_are_pytorchs_cubic_convolution(queue):
    # one row 0, 0, 1, 0, 0 doubled: output position 4 reads t = 0.75 around source 1, so its
    # four taps (sources 0..3) weigh f(1.75), f(0.75), f(0.25), f(1.25) with A = -0.75
    x = np.zeros((1, 1, 1, 5), np.float32)
    x[..., 2] = 1
    y = tp.interpolate(tp.tensor(x), scale_factor=(1, 2), mode="bicubic").to_host()[0, 0, 0]
    a = -0.75
    near = lambda t: ((a + 2) * t - (a + 3)) * t * t + 1          # noqa: E731
    far = lambda t: ((a * t - 5 * a) * t + 8 * a) * t - 4 * a      # noqa: E731
    assert y[4] == pytest.approx(near(0.25), abs=1e-6)            # source 2 is the third tap
    assert y[2] == pytest.approx(far(1.25), abs=1e-6)             # t = 0.25 around source 0
    assert y.min() < 0                                           # overshoot, as PyTorch's
    np.testing.assert_allclose(y, F.interpolate(torch.tensor(x), scale_factor=(1, 2),
                                                mode="bicubic").numpy()[0, 0, 0], atol=1e-6)


def test_bicubic_passes_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((1, 2, 4, 5)).astype(np.float32))
    assert tp.gradcheck(lambda v: tp.interpolate(v, size=(7, 3), mode="bicubic",
                                                 align_corners=True), [x])


def test_upsample_bicubic_matches_pytorch(queue, rng):
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    ours = nn.Upsample(scale_factor=3, mode="bicubic", align_corners=False)
    theirs = torch.nn.Upsample(scale_factor=3, mode="bicubic", align_corners=False)
    assert repr(ours) == repr(theirs)
    np.testing.assert_allclose(ours(pc.Tensor.from_host(queue, x)).to_host(),
                               theirs(torch.tensor(x)).numpy(), rtol=1e-5, atol=5e-6)


def test_bicubic_takes_4d_input_only(queue):
    with pytest.raises(pc.ShapeError, match=r"mode 'bicubic' takes a 4-D \(N, C, \*spatial\) "
                                            r"input, got shape \(2, 3, 4\)"):
        tp.interpolate(pc.Tensor.zeros(queue, (2, 3, 4)), size=5, mode="bicubic")
    with pytest.raises(NotImplementedError):
        F.interpolate(torch.zeros(2, 3, 4), size=5, mode="bicubic")


@pytest.mark.parametrize("shape,kw", [((1, 4, 6, 6), dict(size=(3, 4))),
                                      ((2, 3, 7), dict(scale_factor=0.5)),
                                      ((1, 2, 4, 5, 6), dict(size=(2, 3, 4))),
                                      ((1, 2, 5, 5), dict(scale_factor=1.5))])
def test_area_mode_is_adaptive_average_pooling_as_pytorch(queue, rng, shape, kw):
    x = rng.standard_normal(shape).astype(np.float32)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = tp.interpolate(nx, mode="area", **kw)
    want = F.interpolate(tx, mode="area", **kw)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
