"""``tp.affine_grid`` and ``tp.grid_sample`` (2-D): PyTorch's values and gradients (to theta; to
the input and the grid) in float64 over every mode, padding mode and ``align_corners``, finite
differences, the default's warning and refusals naming the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_values_and_theta_gradient_as_pytorch(queue, rng, align_corners):
    theta0 = rng.standard_normal((2, 2, 3)).astype(np.float32)
    theta = leaf(queue, theta0)
    with tp.Tape() as tape:
        grid = tp.affine_grid(theta, (2, 3, 4, 5), align_corners=align_corners)
    g = rng.standard_normal(grid.shape).astype(np.float32)
    tape.backward(tp.sum(tp.mul(grid, tp.tensor(g))))
    t = torch.tensor(theta0, dtype=torch.float64, requires_grad=True)
    want = F.affine_grid(t, (2, 3, 4, 5), align_corners=align_corners)
    (want * torch.tensor(g, dtype=torch.float64)).sum().backward()
    assert grid.shape == (2, 4, 5, 2)
    close(grid.to_host(), want.detach().numpy(), 1e-5)
    close(theta.grad.to_host(), t.grad.numpy(), 1e-5)
    assert tp.gradcheck(lambda v: tp.affine_grid(v, (2, 1, 3, 2), align_corners=True), [theta])


def test_the_identity_affine_grid_samples_the_input_back_as_pytorch(queue, rng):
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    identity = tp.tensor(np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], np.float32))
    for align_corners in (False, True):
        grid = tp.affine_grid(identity, (1, 2, 3, 4), align_corners=align_corners)
        got = tp.grid_sample(tp.tensor(x), grid, align_corners=align_corners).to_host()
        close(got, x, 1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_values_and_gradients_as_pytorch(queue, rng, mode, padding_mode,
                                                     align_corners):
    x0 = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    grid0 = rng.uniform(-1.4, 1.4, (2, 6, 7, 2)).astype(np.float32)   # some points outside
    g = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    x, grid = leaf(queue, x0), leaf(queue, grid0)
    with tp.Tape() as tape:
        y = tp.grid_sample(x, grid, mode, padding_mode, align_corners)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tx, tgrid = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x0, grid0))
    want = F.grid_sample(tx, tgrid, mode, padding_mode, align_corners)
    (want * torch.tensor(g, dtype=torch.float64)).sum().backward()
    close(y.to_host(), want.detach().numpy(), 1e-5)
    close(x.grad.to_host(), tx.grad.numpy(), 1e-5)
    if mode == "bilinear":
        close(grid.grad.to_host(), tgrid.grad.numpy(), 1e-4)
    else:
        assert grid.grad is None and not tgrid.grad.numpy().any()    # PyTorch's zeros


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_gradients_match_finite_differences(queue, rng, padding_mode):
    x = leaf(queue, rng.standard_normal((1, 2, 3, 4)))
    grid = leaf(queue, rng.uniform(-1.2, 1.2, (1, 2, 3, 2)))
    assert tp.gradcheck(lambda a, b: tp.grid_sample(a, b, padding_mode=padding_mode,
                                                    align_corners=False), [x, grid])


def test_grid_ops_warn_for_the_default_align_corners_and_refuse_bad_input(queue):
    x = tp.tensor(np.ones((1, 1, 2, 2), np.float32))
    grid = tp.tensor(np.zeros((1, 2, 2, 2), np.float32))
    with pytest.warns(UserWarning, match="Default grid_sample and affine_grid behavior has "
                                         "changed to align_corners=False"):
        tp.grid_sample(x, grid)
    with pytest.raises(pc.ParclError, match="grid_sample: expected mode to be 'bilinear' or "
                                            "'nearest' .'bicubic' is not supported."):
        tp.grid_sample(x, grid, "bicubic", align_corners=False)
    with pytest.raises(pc.ParclError, match="grid_sample: expected padding_mode to be"):
        tp.grid_sample(x, grid, padding_mode="wrap", align_corners=False)
    with pytest.raises(pc.ShapeError, match=r"grid_sample: expected grid of shape \(1, "
                                            r"H_out, W_out, 2\) for input \(1, 1, 2, 2\), "
                                            r"got grid of shape \(1, 2, 2, 3\)"):
        tp.grid_sample(x, tp.tensor(np.zeros((1, 2, 2, 3), np.float32)), align_corners=False)
    with pytest.raises(pc.ShapeError, match=r"grid_sample: only 2-D sampling"):
        tp.grid_sample(tp.tensor(np.ones((1, 1, 2, 2, 2), np.float32)), grid,
                       align_corners=False)
    theta = tp.tensor(np.zeros((2, 2, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"affine_grid: expected a batch of 2D affine "
                                            r"matrices of shape \(1, 2, 3\) for size "
                                            r"\(1, 1, 2, 2\), got theta of shape \(2, 2, 3\)"):
        tp.affine_grid(theta, (1, 1, 2, 2), align_corners=False)
    with pytest.raises(pc.ShapeError, match=r"affine_grid: only 2-D affine transforms"):
        tp.affine_grid(theta, (2, 1, 2, 2, 2), align_corners=False)
    with pytest.raises(pc.ShapeError, match=r"affine_grid: expected non-zero, positive"):
        tp.affine_grid(theta, (2, 1, 0, 2), align_corners=False)


@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_gives_points_on_the_border_no_grid_gradient_across_it_as_pytorch(
        queue, rng, padding_mode, align_corners):
    # PyTorch's clip stops the gradient at the clamp's bounds (coordinate <= 0 or >= size - 1),
    # where torch.clamp's passes it: at the corner (1, 1) with align_corners parcl's grid
    # gradient was about [-0.06, -0.04] (+ for reflection) and PyTorch's [0, 0]
    x0 = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    edge = 1.0 if align_corners else 0.75                   # x = 3 = W - 1 without: (0.75+1)*2-.5
    grid0 = np.array([[[[-1.0, -1.0], [1.0, 1.0], [edge, 0.0], [0.0, 1.0], [-0.3, 0.2]]]],
                     np.float32)
    x, grid = leaf(queue, x0), leaf(queue, grid0)
    with tp.Tape() as tape:
        y = tp.grid_sample(x, grid, "bilinear", padding_mode, align_corners)
    tape.backward(tp.sum(y))
    tx, tgrid = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x0, grid0))
    want = F.grid_sample(tx, tgrid, "bilinear", padding_mode, align_corners)
    want.sum().backward()
    close(y.to_host(), want.detach().numpy(), 1e-5)
    close(x.grad.to_host(), tx.grad.numpy(), 1e-5)
    close(grid.grad.to_host(), tgrid.grad.numpy(), 1e-5)
    assert tgrid.grad.numpy()[0, 0, 2, 0] == 0.0             # the case in question


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_reads_nothing_outside_the_input_so_an_infinite_pixel_stays_put_as_pytorch(
        queue, mode, padding_mode):
    # a corner outside the input read pixel 0 at weight 0: inf * 0 made every point outside
    # the input (and, with border, every point on its right or bottom edge) NaN where
    # PyTorch's is 0 (zeros) or the edge pixel's value
    x0 = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    x0[0, 0, 0, 0] = np.inf
    grid0 = np.array([[[[-3.0, -3.0], [5.0, 0.0], [1.0, 1.0], [0.2, 0.1]]]], np.float32)
    got = tp.grid_sample(tp.tensor(x0), tp.tensor(grid0), mode, padding_mode, False)
    want = F.grid_sample(torch.tensor(x0), torch.tensor(grid0), mode, padding_mode, False)
    np.testing.assert_allclose(got.to_host(), want.numpy(), rtol=1e-6)
