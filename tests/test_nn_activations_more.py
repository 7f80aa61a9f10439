"""``tp.prelu`` and the layers ``PReLU``, ``LogSoftmax``, ``Softmax2d`` and ``Unflatten``
against PyTorch's: outputs, gradients of the input and the slopes, state-dict keys, reprs and
refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn


def run(layer, x: np.ndarray, seed: int = 1):
    """``layer(x)``, the upstream gradient used and the input's gradient."""
    nx = leaf(pc.default_queue(), x)
    with tp.Tape() as tape:
        y = layer(nx)
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(pc.default_queue(), g))
    return y.to_host(), g, nx.grad.to_host()


def test_prelu_gives_slope_times_x_below_zero_and_pytorchs_gradients_at_zero(queue):
    x = leaf(queue, np.array([[-2.0, 0.0, 3.0]], np.float32))
    w = leaf(queue, np.array([0.25], np.float32))
    with tp.Tape() as tape:
        y = tp.prelu(x, w)
    tape.backward(tp.sum(y))
    np.testing.assert_array_equal(y.to_host(), [[-0.5, 0.0, 3.0]])
    np.testing.assert_array_equal(x.grad.to_host(), [[0.25, 0.25, 1.0]])   # x = 0: the slope
    np.testing.assert_array_equal(w.grad.to_host(), [-2.0])


@pytest.mark.parametrize("shape,num", [((2, 3, 4, 5), 3), ((2, 3, 4, 5), 1), ((4, 3), 3),
                                       ((5,), 1), ((2, 4, 6), 4)])
def test_prelu_layer_matches_pytorch_forward_and_gradients(queue, rng, shape, num):
    ours = nn.PReLU(num, init=0.1)
    theirs = torch.nn.PReLU(num, init=0.1)
    with torch.no_grad():              # distinct slopes per channel
        slopes = rng.uniform(-0.5, 0.5, num).astype(np.float32)
        theirs.weight.copy_(torch.from_numpy(slopes))
    ours.load_state_dict({"weight": slopes})
    x = rng.standard_normal(shape).astype(np.float32)
    y, g, gx = run(ours, x)
    tx = torch.tensor(x, requires_grad=True)
    want = theirs(tx)
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours.weight.grad.to_host(), theirs.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-5)


def test_prelu_layer_initialises_and_names_as_pytorch(queue):
    layer = nn.PReLU(3)
    assert list(layer.state_dict()) == ["weight"]
    np.testing.assert_array_equal(layer.state_dict()["weight"], [0.25, 0.25, 0.25])
    assert repr(layer) == repr(torch.nn.PReLU(3)) == "PReLU(num_parameters=3)"
    np.testing.assert_array_equal(nn.PReLU(init=-1.0).weight.to_host(), [-1.0])


def test_prelu_passes_gradcheck_for_input_and_slopes(queue, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x[np.abs(x) < 0.05] = 0.5                          # away from the kink
    assert tp.gradcheck(tp.prelu, [leaf(queue, x), leaf(queue, [0.2, -0.3, 0.7])])


def test_prelu_refuses_a_slope_count_that_is_not_the_channels(queue):
    with pytest.raises(pc.ShapeError, match=r"prelu: weight has 2 slopes but the input of "
                                            r"shape \(4, 3\) has 3 channels"):
        nn.PReLU(2)(tp.tensor(np.ones((4, 3), np.float32)))
    with pytest.raises(pc.ShapeError, match="has 1 channels"):
        nn.PReLU(3)(tp.tensor(np.ones(3, np.float32)))        # 1-D: no channel dim (torch)
    with pytest.raises(pc.ShapeError, match="weight must be 0-d or 1-D"):
        tp.prelu(tp.tensor(np.ones((2, 3), np.float32)), tp.tensor(np.ones((1, 3), np.float32)))
    with pytest.raises(pc.ShapeError, match="num_parameters must be a positive integer"):
        nn.PReLU(0)


def test_node_prelu_method_is_tp_prelu(queue):
    x = tp.tensor(np.array([-4.0, 2.0], np.float32))
    np.testing.assert_array_equal(x.prelu(tp.tensor(np.array(0.5, np.float32))).to_host(),
                                  [-2.0, 2.0])


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_log_softmax_layer_matches_pytorch(queue, rng, dim):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    y, g, gx = run(nn.LogSoftmax(dim), x)
    tx = torch.tensor(x, requires_grad=True)
    want = torch.nn.LogSoftmax(dim)(tx)
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert repr(nn.LogSoftmax(dim)) == f"LogSoftmax(dim={dim})"


def test_log_softmax_without_dim_warns_and_takes_pytorchs_legacy_dim(queue, rng):
    for shape, dim in [((4,), 0), ((2, 5), 1), ((2, 3, 4), 0), ((2, 3, 4, 5), 1)]:
        x = rng.standard_normal(shape).astype(np.float32)
        with pytest.warns(UserWarning, match="implicit dimension"):
            y = nn.LogSoftmax()(tp.tensor(x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = torch.nn.LogSoftmax()(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.exp(y.to_host()).sum(dim), 1.0, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 2, 2)])
def test_softmax2d_normalises_over_channels_as_pytorch(queue, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    y, g, gx = run(nn.Softmax2d(), x)
    tx = torch.tensor(x, requires_grad=True)
    want = torch.nn.Softmax2d()(tx)
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum(-3), 1.0, rtol=1e-5)
    assert repr(nn.Softmax2d()) == "Softmax2d()"


def test_softmax2d_refuses_inputs_that_are_not_3d_or_4d(queue):
    with pytest.raises(pc.ShapeError, match=r"Softmax2d: expected a 3-d or 4-d input, got "
                                            r"shape \(2, 3\)"):
        nn.Softmax2d()(tp.tensor(np.ones((2, 3), np.float32)))


def test_unflatten_splits_a_dim_and_reshapes_the_gradient_back_as_pytorch(queue, rng):
    x = rng.standard_normal((4, 6, 2)).astype(np.float32)
    for dim, sizes in [(1, (2, 3)), (-2, (3, -1)), (0, [2, 2])]:
        ours, theirs = nn.Unflatten(dim, sizes), torch.nn.Unflatten(dim, sizes)
        y, g, gx = run(ours, x)
        want = theirs(torch.from_numpy(x)).numpy()
        assert y.shape == want.shape
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(gx, g.reshape(x.shape))
        assert repr(ours) == repr(theirs)


def test_unflatten_refuses_sizes_that_do_not_fit(queue):
    with pytest.raises(pc.ShapeError, match="unflatten: sizes .* do not multiply up to 6"):
        nn.Unflatten(1, (4, 2))(tp.tensor(np.ones((4, 6), np.float32)))
    with pytest.raises(pc.ShapeError, match="Unflatten: unflattened_size must be"):
        nn.Unflatten(1, 6)
    with pytest.raises(pc.ShapeError, match="Unflatten: dim must be an int"):
        nn.Unflatten(1.0, (2, 3))


@pytest.mark.parametrize("shape,groups", [((2, 6, 3), 2), ((1, 6, 2, 2), 3), ((3, 4, 5), 4),
                                          ((2, 4, 1), 1)])
def test_channel_shuffle_interleaves_the_groups_as_pytorch(queue, rng, shape, groups):
    x = rng.standard_normal(shape).astype(np.float32)
    y, g, gx = run(nn.ChannelShuffle(groups), x)
    np.testing.assert_array_equal(y, torch.nn.ChannelShuffle(groups)(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(                # the gradient is the inverse shuffle
        gx, torch.nn.ChannelShuffle(shape[1] // groups)(torch.from_numpy(g)).numpy())
    assert repr(nn.ChannelShuffle(groups)) == repr(torch.nn.ChannelShuffle(groups))


def test_channel_shuffle_moves_channel_g_i_to_i_g(queue):
    x = tp.tensor(np.arange(6, dtype=np.float32).reshape(1, 6, 1))
    assert tp.channel_shuffle(x, 2).to_host().ravel().tolist() == [0, 3, 1, 4, 2, 5]
    assert tp.channel_shuffle(x, 3).to_host().ravel().tolist() == [0, 2, 4, 1, 3, 5]


def test_channel_shuffle_refuses_channels_groups_do_not_divide(queue):
    with pytest.raises(pc.ShapeError, match=r"channel_shuffle: expected an \(N, C, \*\) input "
                                            r"with C divisible by groups=2, got shape \(1, 3, 2\)"):
        nn.ChannelShuffle(2)(tp.tensor(np.ones((1, 3, 2), np.float32)))
    with pytest.raises(pc.ShapeError, match=r"got shape \(4, 2\)"):       # torch: > 2 dims
        tp.channel_shuffle(tp.tensor(np.ones((4, 2), np.float32)), 2)
    with pytest.raises(pc.ShapeError, match="ChannelShuffle: groups must be a positive"):
        nn.ChannelShuffle(0)


@pytest.mark.parametrize("kw", [{}, {"p": 1.0}, {"p": 3.0, "keepdim": True},
                                {"p": float("inf"), "eps": 0.0}, {"p": 0.5}])
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((2, 3, 5), (3, 5)), ((5,), (5,))])
def test_pairwise_distance_matches_pytorch_with_broadcasting(queue, rng, kw, shapes):
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    na, nb = leaf(queue, a), leaf(queue, b)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    with tp.Tape() as tape:
        y = nn.PairwiseDistance(**kw)(na, nb)
    want = torch.nn.PairwiseDistance(**kw)(ta, tb)
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(na.grad.to_host(), ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nb.grad.to_host(), tb.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_pairwise_distance_is_the_norm_of_the_difference_plus_eps(queue):
    a = tp.tensor(np.array([[3.0, 4.0], [1.0, 1.0]], np.float32))
    zeros = tp.tensor(np.zeros((2, 2), np.float32))
    np.testing.assert_allclose(tp.pairwise_distance(a, zeros, eps=0.0).to_host(),
                               [5.0, 2 ** 0.5], rtol=1e-6)
    np.testing.assert_allclose(tp.pairwise_distance(a, a).to_host(), [2 ** 0.5 * 1e-6] * 2,
                               rtol=1e-4)                       # eps keeps it off zero
    assert repr(nn.PairwiseDistance()) == repr(torch.nn.PairwiseDistance()) == \
        "PairwiseDistance()"


def test_pairwise_distance_passes_gradcheck(queue, rng):
    a, b = (leaf(queue, rng.standard_normal((3, 4))) for _ in range(2))
    assert tp.gradcheck(lambda u, v: tp.pairwise_distance(u, v, 3.0), [a, b])


def test_softmax_without_dim_takes_pytorchs_legacy_dim_with_its_warning(queue, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)                 # 3-d: dim 0
    with pytest.warns(UserWarning, match="Softmax: implicit dimension"):
        y = nn.Softmax()(tp.tensor(x)).to_host()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.nn.Softmax()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)
    assert repr(nn.Softmax()) == repr(torch.nn.Softmax()) == "Softmax(dim=None)"


@pytest.mark.parametrize("name", ["Hardshrink", "Softshrink"])
@pytest.mark.parametrize("lambd", [0.5, 0.0, 1.2])
def test_shrinks_match_pytorch_gradients_at_the_bounds_included(queue, rng, name, lambd):
    x = np.concatenate([rng.standard_normal(20), [lambd, -lambd, 0.0]]).astype(np.float32)
    y, g, gx = run(getattr(nn, name)(lambd), x)
    tx = torch.tensor(x, requires_grad=True)
    want = getattr(torch.nn, name)(lambd)(tx)
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(gx, tx.grad.numpy())
    assert repr(getattr(nn, name)(lambd)) == repr(getattr(torch.nn, name)(lambd))


def test_shrinks_give_concrete_values_and_pass_gradcheck(queue, rng):
    x = tp.tensor(np.array([-1.0, -0.5, 0.2, 0.5, 0.7], np.float32))
    np.testing.assert_allclose(tp.hardshrink(x).to_host(), [-1.0, 0.0, 0.0, 0.0, 0.7])
    np.testing.assert_allclose(tp.softshrink(x).to_host(), [-0.5, 0.0, 0.0, 0.0, 0.2],
                               atol=1e-7)
    a = rng.uniform(0.6, 2.0, 8) * rng.choice([-1, 1], 8)          # away from the kinks
    for op in (tp.hardshrink, tp.softshrink):
        assert tp.gradcheck(op, [leaf(queue, a)])
    with pytest.raises(pc.ParclError, match="Softshrink: lambd must be >= 0"):
        nn.Softshrink(-1.0)
    with pytest.raises(pc.DTypeError, match="hardshrink: lambd must be a Python number"):
        tp.hardshrink(x, "0.5")
