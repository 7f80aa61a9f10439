"""``tp.adaptive_avg_pool1d``, ``tp.adaptive_max_pool1d``, ``tp.adaptive_max_pool2d`` and
``tp.conv_transpose1d`` with their layers, against PyTorch's: outputs, gradients (ties
included), initialisation bounds, state-dict keys, reprs and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn
from torch_reference import check_as_torch


@pytest.mark.parametrize("shape,size", [((2, 3, 10), 3), ((2, 3, 10), 4), ((3, 7), 7),
                                        ((2, 3, 5), 8), ((1, 2, 9), 1)])
@pytest.mark.parametrize("name", ["adaptive_avg_pool1d", "adaptive_max_pool1d"])
def test_adaptive_pool1d_matches_pytorch_with_overlapping_windows(queue, rng, shape, size,
                                                                  name):
    x = rng.standard_normal(shape).astype(np.float32)
    check_as_torch(lambda v: getattr(tp, name)(v, size), lambda v: getattr(F, name)(v, size),
                   [x], rng)


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 5), (3, 2)), ((2, 3, 7, 5), (2, None)),
                                        ((3, 8, 6), (4, 3)), ((1, 2, 5, 9), (5, 1)),
                                        ((1, 2, 9, 5), (1, 5)), ((2, 2, 6, 6), 3),
                                        ((1, 1, 4, 4), (3, 3)), ((1, 1, 3, 3), 5)])
def test_adaptive_max_pool2d_matches_pytorch(queue, rng, shape, size):
    x = rng.standard_normal(shape).astype(np.float32)
    check_as_torch(lambda v: tp.adaptive_max_pool2d(v, size),
                   lambda v: F.adaptive_max_pool2d(v, size), [x], rng)


def test_adaptive_max_pools_send_a_tie_gradient_to_the_first_maximum_as_pytorch(queue, rng):
    x = np.ones((1, 1, 5, 7), np.float32)
    x[0, 0, 3, 1] = x[0, 0, 4, 6] = 2.0
    check_as_torch(lambda v: tp.adaptive_max_pool2d(v, (2, 3)),
                   lambda v: F.adaptive_max_pool2d(v, (2, 3)), [x], rng)
    check_as_torch(lambda v: tp.adaptive_max_pool1d(v, 3),
                   lambda v: F.adaptive_max_pool1d(v, 3), [np.zeros((2, 1, 8), np.float32)],
                   rng)


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 5), (3, 2)), ((3, 8, 6), (4, None)),
                                        ((1, 2, 5, 9), (5, 1)), ((1, 1, 3, 3), 5)])
def test_adaptive_max_pool2d_returns_pytorchs_indices(queue, rng, shape, size):
    x = rng.standard_normal(shape).astype(np.float32)
    nx = leaf(queue, x)
    with tp.Tape() as tape:
        y, indices = nn.AdaptiveMaxPool2d(size, return_indices=True)(nx)
    want, want_indices = torch.nn.AdaptiveMaxPool2d(size, return_indices=True)(
        torch.from_numpy(x))
    assert isinstance(indices, pc.Tensor) and indices.dtype == np.int64
    np.testing.assert_array_equal(indices.to_host(), want_indices.numpy())
    np.testing.assert_array_equal(y.to_host(), want.numpy())
    tape.backward(tp.sum(y))                                  # the output is still recorded
    flat = nx.grad.to_host().reshape(x.shape[:-2] + (-1,))
    counts = np.zeros_like(flat)
    np.add.at(counts.reshape(-1, flat.shape[-1]),
              (np.arange(counts.size // flat.shape[-1])[:, None],
               want_indices.numpy().reshape(counts.size // flat.shape[-1], -1)), 1.0)
    np.testing.assert_array_equal(flat, counts)       # the gradient lands on the indices


def test_adaptive_max_pool_indices_point_at_the_first_maximum_as_pytorchs(queue):
    x = np.ones((1, 1, 5, 7), np.float32)
    x[0, 0, 3, 1] = x[0, 0, 4, 6] = 2.0
    got = tp.adaptive_max_pool2d(tp.tensor(x), (2, 3), return_indices=True)[1]
    want = F.adaptive_max_pool2d(torch.from_numpy(x), (2, 3), return_indices=True)[1]
    np.testing.assert_array_equal(got.to_host(), want.numpy())
    line = tp.tensor(np.array([[[5.0, 1.0, 2.0, 9.0, 3.0, 0.0, 4.0]]], np.float32))
    values, where = nn.AdaptiveMaxPool1d(3, return_indices=True)(line)
    assert where.to_host().tolist() == [[[0, 3, 6]]] and values.to_host().tolist() == [
        [[5.0, 9.0, 4.0]]]
    values, where = tp.adaptive_max_pool1d(line[0], 2, return_indices=True)   # unbatched
    assert where.to_host().tolist() == [[3, 3]]               # [0, 4) and [3, 7) share 9


def test_adaptive_max_pools_pick_the_last_nan_of_a_window_as_pytorch(queue, rng):
    """PyTorch's max pools let every NaN replace the pick (``val > maxval || isnan(val)``),
    so a window with several NaNs gives the last one's index and gradient; ``max`` over the
    gathered windows took the first."""
    nan = np.nan
    line = np.array([[[nan, nan, 1.0, 2.0, nan, 7.0, nan]]], np.float32)   # [0, 4), [3, 7)
    values, where = tp.adaptive_max_pool1d(tp.tensor(line), 2, return_indices=True)
    want, want_where = F.adaptive_max_pool1d(torch.from_numpy(line), 2, return_indices=True)
    assert want_where.tolist() == [[[1, 6]]] and where.to_host().tolist() == [[[1, 6]]]
    np.testing.assert_array_equal(values.to_host(), want.numpy())
    x = rng.integers(-2, 3, (2, 3, 7, 6)).astype(np.float32)
    x[rng.random(x.shape) < 0.3] = nan
    for size in [(3, 4), (7, 7), (2, 3)]:
        got = tp.adaptive_max_pool2d(tp.tensor(x), size, return_indices=True)[1]
        want = F.adaptive_max_pool2d(torch.from_numpy(x), size, return_indices=True)[1]
        np.testing.assert_array_equal(got.to_host(), want.numpy())
        check_as_torch(lambda v, size=size: tp.adaptive_max_pool2d(v, size),
                       lambda v, size=size: F.adaptive_max_pool2d(v, size), [x], rng)
    check_as_torch(lambda v: tp.adaptive_max_pool1d(v, 3),
                   lambda v: F.adaptive_max_pool1d(v, 3), [line], rng)


def test_adaptive_max_pool1d_takes_the_largest_of_each_window(queue):
    x = tp.tensor(np.array([[[5.0, 1.0, 2.0, 9.0, 3.0, 0.0, 4.0]]], np.float32))
    # windows of 7 into 3: [0, 3), [2, 5), [4, 7)
    np.testing.assert_array_equal(tp.adaptive_max_pool1d(x, 3).to_host(), [[[5.0, 9.0, 4.0]]])
    np.testing.assert_allclose(tp.adaptive_avg_pool1d(x, 3).to_host(),
                               [[[8.0 / 3, 14.0 / 3, 7.0 / 3]]], rtol=1e-6)


def test_adaptive_pools_pass_gradcheck(queue, rng):
    x = rng.permutation(60).reshape(1, 3, 4, 5).astype(np.float32) / 10   # no ties
    assert tp.gradcheck(lambda v: tp.adaptive_max_pool2d(v, (3, 2)), [leaf(queue, x)])
    assert tp.gradcheck(lambda v: tp.adaptive_max_pool1d(v, 4), [leaf(queue, x[0])])
    assert tp.gradcheck(lambda v: tp.adaptive_avg_pool1d(v, 3), [leaf(queue, x[0])])


@pytest.mark.parametrize("layer,size,shape", [("AdaptiveAvgPool1d", 4, (2, 3, 9)),
                                              ("AdaptiveMaxPool1d", 4, (3, 9)),
                                              ("AdaptiveMaxPool2d", (None, 2), (2, 3, 5, 7))])
def test_adaptive_pool_layers_match_pytorch(queue, rng, layer, size, shape):
    ours, theirs = getattr(nn, layer)(size), getattr(torch.nn, layer)(size)
    check_as_torch(ours, theirs, [rng.standard_normal(shape).astype(np.float32)], rng)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == []


@pytest.mark.parametrize("size", [(None, 3), (4, None), (None, None)])
def test_adaptive_avg_pool2d_keeps_a_dim_given_as_none_as_pytorch(queue, rng, size):
    """None in output_size keeps that dim's input size, as PyTorch's (and parcl's adaptive max
    pool); it was a ShapeError 'output_size must be an int or a pair of ints'."""
    check_as_torch(nn.AdaptiveAvgPool2d(size), torch.nn.AdaptiveAvgPool2d(size),
                   [rng.standard_normal((2, 3, 5, 7)).astype(np.float32)], rng)
    x = np.arange(10, dtype=np.float32).reshape(1, 1, 2, 5)
    np.testing.assert_allclose(tp.adaptive_avg_pool2d(leaf(queue, x), (None, 2)).to_host(),
                               [[[[1.0, 3.0], [6.0, 8.0]]]])


def test_adaptive_pools_refuse_bad_sizes_and_ranks(queue):
    x = tp.tensor(np.ones((2, 3, 4), np.float32))
    with pytest.raises(pc.ShapeError, match="adaptive_max_pool1d: output_size must hold "
                                            "positive integers"):
        tp.adaptive_max_pool1d(x, 0)
    with pytest.raises(pc.ShapeError, match=r"adaptive_max_pool2d: expected a 3-d \(C, H, W\) "
                                            r"or 4-d \(N, C, H, W\) input, got shape \(4,\)"):
        tp.adaptive_max_pool2d(tp.tensor(np.ones(4, np.float32)), 2)
    with pytest.raises(pc.ShapeError, match="output_size must be an int or a tuple of 2"):
        tp.adaptive_max_pool2d(x, (1, 2, 3))
    with pytest.raises(pc.ShapeError, match=r"adaptive_avg_pool1d: expected a 2-d \(C, L\) or "
                                            r"3-d"):
        nn.AdaptiveAvgPool1d(2)(tp.tensor(np.ones((1, 2, 3, 4), np.float32)))


@pytest.mark.parametrize("kw,shape", [(dict(stride=2), (2, 4, 9)),
                                      (dict(stride=3, padding=1, output_padding=2), (4, 9)),
                                      (dict(), (2, 4, 5)), (dict(bias=False, stride=2), (1, 4, 3))])
def test_conv_transpose1d_layer_matches_pytorch(queue, rng, kw, shape):
    nn.manual_seed(0)
    ours = nn.ConvTranspose1d(4, 6, 3, **kw)
    theirs = torch.nn.ConvTranspose1d(4, 6, 3, **kw)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = rng.standard_normal(shape).astype(np.float32)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = ours(nx)
    want = theirs(tx)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), grads[name].grad.numpy(), rtol=1e-5,
                                   atol=1e-5, err_msg=name)
    assert repr(ours) == repr(theirs)


def test_conv_transpose1d_initialises_within_pytorchs_bound(queue):
    nn.manual_seed(0)
    layer = nn.ConvTranspose1d(8, 5, 4)                    # fan_in = out_channels * k = 20
    weight, bias = layer.weight.to_host(), layer.bias.to_host()
    assert weight.shape == (8, 5, 4) and bias.shape == (5,)
    bound = 1 / np.sqrt(20)
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.9 * bound
    assert np.abs(bias).max() <= bound


def test_conv_transpose1d_op_passes_gradcheck(queue, rng):
    x, w, b = (leaf(queue, rng.standard_normal(s)) for s in ((2, 3, 4), (3, 2, 3), (2,)))
    assert tp.gradcheck(lambda *a: tp.conv_transpose1d(*a, stride=2, padding=1), [x, w, b])


def test_conv_transpose1d_refuses_what_it_does_not_support(queue):
    with pytest.raises(pc.ShapeError, match="ConvTranspose1d: only padding_mode='zeros'"):
        nn.ConvTranspose1d(4, 4, 3, padding_mode="reflect")
    with pytest.raises(pc.ShapeError, match="output_padding .* must be smaller than the stride"):
        nn.ConvTranspose1d(4, 4, 3, stride=2, output_padding=2)
    with pytest.raises(pc.ShapeError, match=r"has 3 features/channels at dim -2"):
        nn.ConvTranspose1d(4, 4, 3)(tp.tensor(np.ones((2, 3, 5), np.float32)))
    with pytest.raises(pc.ShapeError, match="conv_transpose1d: weight must be 3-d"):
        tp.conv_transpose1d(tp.tensor(np.ones((2, 3, 5), np.float32)),
                            tp.tensor(np.ones((3, 2), np.float32)))


def test_conv_transpose1d_output_size_picks_the_output_padding_as_pytorch(queue, rng):
    nn.manual_seed(0)
    ours = nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1)
    theirs = torch.nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = rng.standard_normal((1, 2, 5)).astype(np.float32)
    for size in ([9], [10], (1, 3, 10), 10):
        want = theirs(torch.from_numpy(x), output_size=[size] if isinstance(size, int) else size)
        got = ours(tp.tensor(x), output_size=size)
        np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert ours(tp.tensor(x[0]), output_size=[3, 10]).shape == (3, 10)     # unbatched
    with pytest.raises(pc.ShapeError, match=r"requested an output size of \[11\], but valid "
                                            r"sizes range from \[9\] to \[10\]"):
        ours(tp.tensor(x), output_size=[11])


def test_conv_transpose2d_output_size_picks_the_output_padding_as_pytorch(queue, rng):
    nn.manual_seed(0)
    ours = nn.ConvTranspose2d(2, 3, 3, stride=(2, 3), padding=1)
    theirs = torch.nn.ConvTranspose2d(2, 3, 3, stride=(2, 3), padding=1)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = rng.standard_normal((1, 2, 4, 3)).astype(np.float32)      # smallest output (7, 7)
    for size in ([7, 7], (8, 9), (1, 3, 8, 8)):                    # as a U-Net's skip.shape
        want = theirs(torch.from_numpy(x), output_size=size)
        got = ours(tp.tensor(x), output_size=size)
        assert got.shape == tuple(want.shape)
        np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(pc.ShapeError, match=r"requested an output size of \[9, 7\], but valid "
                                            r"sizes range from \[7, 7\] to \[8, 9\]"):
        ours(tp.tensor(x), output_size=(9, 7))


LP_CASES = [("LPPool1d", (2, 3, 9), 2, 3, None, False), ("LPPool1d", (3, 9), 1.5, 2, 1, True),
            ("LPPool1d", (2, 3, 8), float("inf"), 3, 2, False),
            ("LPPool2d", (2, 3, 7, 6), 2, 3, None, False),
            ("LPPool2d", (3, 7, 6), 3, (2, 3), (1, 2), True),
            ("LPPool2d", (2, 3, 6, 6), -float("inf"), 2, None, False)]


@pytest.mark.parametrize("name,shape,p,k,stride,ceil_mode", LP_CASES)
def test_lp_pools_match_pytorch_ceil_mode_and_infinite_norms_included(queue, rng, name, shape,
                                                                      p, k, stride, ceil_mode):
    x = rng.uniform(0.1, 2.0, shape).astype(np.float32)     # positive: x ** 1.5 is real
    ours = getattr(nn, name)(p, k, stride=stride, ceil_mode=ceil_mode)
    theirs = getattr(torch.nn, name)(p, k, stride=stride, ceil_mode=ceil_mode)
    check_as_torch(ours, theirs, [x], rng)
    assert repr(ours) == repr(theirs)


def test_lp_pool_of_norm_2_is_the_windows_euclidean_norm(queue, rng):
    x = tp.tensor(np.array([[[3.0, 4.0, 1.0, 0.0, 2.0]]], np.float32))
    np.testing.assert_allclose(tp.lp_pool1d(x, 2, 2).to_host(), [[[5.0, 1.0]]], rtol=1e-6)
    np.testing.assert_allclose(tp.lp_pool1d(x, 1, 2, ceil_mode=True).to_host(),
                               [[[7.0, 1.0, 4.0]]], rtol=1e-6)    # the clipped window times 2
    a = rng.uniform(0.5, 2.0, (1, 2, 4, 4)).astype(np.float32)
    assert tp.gradcheck(lambda v: tp.lp_pool2d(v, 3, 2), [leaf(queue, a)])


def test_lp_pools_refuse_a_zero_norm_and_bad_ranks(queue):
    with pytest.raises(pc.ParclError, match="lp_pool1d: norm_type must be a nonzero number"):
        nn.LPPool1d(0, 2)(tp.tensor(np.ones((1, 2, 4), np.float32)))
    with pytest.raises(pc.ShapeError, match=r"lp_pool2d: expected a 3-d \(C, H, W\) or 4-d "
                                            r"\(N, C, H, W\) input, got shape \(2, 4\)"):
        nn.LPPool2d(2, 2)(tp.tensor(np.ones((2, 4), np.float32)))
    with pytest.raises(pc.ShapeError, match="lp_pool2d: kernel_size must be"):
        tp.lp_pool2d(tp.tensor(np.ones((1, 2, 4, 4), np.float32)), 2, (2, 2, 2))


def test_adaptive_pools_refuse_a_spatial_dim_with_no_elements_as_pytorch(queue):
    """``x[..., W:]`` (a slice past the end) through an adaptive pool: the average pools gave
    windows of nothing their mean 0 / 0, NaN, silently (tp.adaptive_avg_pool1d of a (2, 3, 0)
    input a (2, 3, 2) of NaN), and the max pools a ZeroDivisionError, where PyTorch refuses
    ('Expected input to have non-zero size for non-batch dimensions'); an empty batch or
    channel dim still gives PyTorch's empty result."""
    x3 = tp.tensor(np.ones((2, 3, 16), np.float32))
    x4 = tp.tensor(np.ones((2, 3, 4, 4), np.float32))
    for op, x in (("adaptive_avg_pool1d", x3[:, :, 16:]), ("adaptive_max_pool1d", x3[:, :, 16:]),
                  ("adaptive_avg_pool2d", x4[..., 4:]), ("adaptive_max_pool2d", x4[:, :, 4:])):
        with pytest.raises(pc.ShapeError, match=f"{op}: input of shape .* has a spatial dim "
                                                "of size 0"):
            getattr(tp, op)(x, 2)
        with pytest.raises(RuntimeError, match="non-zero size"):
            getattr(F, op)(torch.ones(tuple(x.shape)), 2)
    assert tp.adaptive_avg_pool2d(x4[2:], 2).shape == (0, 3, 2, 2)
    assert tp.adaptive_max_pool2d(x4[:, 3:], 2).shape == (2, 0, 2, 2)
