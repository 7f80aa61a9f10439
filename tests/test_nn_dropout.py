"""``pc.nn.Dropout1d``, ``Dropout2d`` and ``Dropout3d``: whole channels zeroed, the rest scaled by
``1/(1-p)``, the identity in evaluation, masks from the seeded dropout generator, gradients
through the same mask; PyTorch's shapes, reprs and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn


def channel_values(y: np.ndarray, spatial: int) -> np.ndarray:
    """Each channel's map as one row."""
    return y.reshape(-1, int(np.prod(y.shape[len(y.shape) - spatial:])))


@pytest.mark.parametrize("layer,shape,spatial", [(nn.Dropout1d, (4, 16, 5), 1),
                                                 (nn.Dropout1d, (16, 5), 1),
                                                 (nn.Dropout2d, (4, 16, 3, 3), 2),
                                                 (nn.Dropout3d, (2, 16, 2, 3, 2), 3),
                                                 (nn.Dropout3d, (16, 2, 2, 2), 3)])
def test_channel_dropout_zeroes_whole_channels_and_scales_the_rest(queue, rng, layer, shape,
                                                                   spatial):
    tp.manual_seed(0)
    x = rng.uniform(1.0, 2.0, shape).astype(np.float32)
    y = layer(0.25)(tp.tensor(x)).to_host()
    rows, xrows = channel_values(y, spatial), channel_values(x, spatial)
    dropped = (rows == 0).all(1)
    kept = ~dropped
    assert ((rows == 0).any(1) == dropped).all()                  # all of a channel or none
    np.testing.assert_allclose(rows[kept], xrows[kept] / 0.75, rtol=1e-6)
    assert 0 < dropped.sum() < len(rows)


def test_channel_dropout_drops_about_p_of_the_channels(queue):
    tp.manual_seed(1)
    y = nn.Dropout2d(0.3)(tp.tensor(np.ones((50, 40, 2, 2), np.float32))).to_host()
    assert abs((y[:, :, 0, 0] == 0).mean() - 0.3) < 0.03


def test_channel_dropout_masks_follow_the_seeded_dropout_generator(queue, rng):
    x = tp.tensor(rng.standard_normal((3, 8, 4)).astype(np.float32))
    layer = nn.Dropout1d(0.5)
    pc.manual_seed(7)
    first, second = layer(x).to_host(), layer(x).to_host()
    pc.manual_seed(7)
    np.testing.assert_array_equal(layer(x).to_host(), first)       # same seed: same mask
    assert not np.array_equal(first, second)                       # each call a new mask


def test_channel_dropout_gradient_is_the_upstream_gradient_through_the_same_mask(queue, rng):
    x = leaf(queue, rng.uniform(1.0, 2.0, (2, 6, 3, 4)))
    with tp.Tape() as tape:
        y = nn.Dropout2d(0.5)(x)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    mask = y.to_host() / x.value.to_host()
    assert set(np.unique(mask).round(5)) <= {0.0, 2.0}
    np.testing.assert_allclose(x.grad.to_host(), g * mask, rtol=1e-6)


def test_channel_dropout_passes_gradcheck_with_a_fixed_mask(queue, rng):
    layer = nn.Dropout1d(0.4)

    def fixed_mask(v):
        tp.manual_seed(3)                      # every evaluation draws the same mask
        return layer(v)
    assert tp.gradcheck(fixed_mask, [leaf(queue, rng.standard_normal((2, 5, 3)))])


def test_channel_dropout_is_the_identity_in_eval_and_at_p_0_and_zeros_at_p_1(queue, rng):
    x = tp.tensor(rng.standard_normal((2, 3, 4, 4)).astype(np.float32))
    assert nn.Dropout2d(0.5).eval()(x) is x
    assert nn.Dropout2d(0.0)(x) is x
    np.testing.assert_array_equal(nn.Dropout2d(1.0)(x).to_host(), np.zeros((2, 3, 4, 4)))
    with torch.no_grad():                                          # torch's agrees
        torch_x = torch.from_numpy(x.to_host())
        assert torch.equal(torch.nn.Dropout2d(0.5).eval()(torch_x), torch_x)
        assert not torch.nn.Dropout2d(1.0)(torch_x).any()


def test_dropout2d_takes_a_3d_input_as_n_c_l_with_pytorchs_warning(queue):
    tp.manual_seed(0)
    x = tp.tensor(np.ones((6, 8, 5), np.float32))
    with pytest.warns(UserWarning, match=r"interpreted as shape \(N, C, L\)"):
        y = nn.Dropout2d(0.5)(x).to_host()
    with pytest.warns(UserWarning, match=r"interpreted as shape \(N, C, L\)"):
        torch.nn.Dropout2d(0.5)(torch.ones(6, 8, 5))
    assert (y == y[:, :, :1]).all()                      # one mask value per (n, c) row


def test_channel_dropout_reprs_match_pytorchs(queue):
    assert repr(nn.Dropout1d(0.3)) == repr(torch.nn.Dropout1d(0.3)) == \
        "Dropout1d(p=0.3, inplace=False)"
    assert repr(nn.Dropout2d()) == repr(torch.nn.Dropout2d()) == "Dropout2d(p=0.5, inplace=False)"
    assert repr(nn.Dropout3d(0.1)) == repr(torch.nn.Dropout3d(0.1))
    assert nn.Dropout1d(np.float32(0.25)).p == 0.25                # a numpy number too
    assert list(nn.Dropout2d().state_dict()) == []


def test_channel_dropout_refuses_bad_p_inplace_and_ranks(queue):
    with pytest.raises(pc.ShapeError, match=r"Dropout1d: dropout probability p must be in "
                                            r"\[0, 1\], got 1.5"):
        nn.Dropout1d(1.5)
    with pytest.raises(pc.ParclError, match="Dropout2d: inplace=True is not supported"):
        nn.Dropout2d(0.5, inplace=True)
    with pytest.raises(pc.ShapeError, match=r"Dropout1d: expected a 2-d \(unbatched\) or 3-d "
                                            r"input, got shape \(2, 3, 4, 5\)"):
        nn.Dropout1d()(tp.tensor(np.ones((2, 3, 4, 5), np.float32)))
    with pytest.raises(pc.ShapeError, match=r"Dropout3d: expected a 4-d \(unbatched\) or 5-d"):
        nn.Dropout3d()(tp.tensor(np.ones((2, 3, 4), np.float32)))
    with pytest.raises(pc.ShapeError, match=r"Dropout2d: expected a 4-d input"):
        nn.Dropout2d().eval()(tp.tensor(np.ones((2, 3), np.float32)))   # checked in eval too


def test_channel_dropout_replays_under_capture_as_eager_calls(queue):
    """A captured step draws each replay's channel mask from the generator as an eager call
    would: the same losses and gradients call after call, the same generator state after."""
    from parcl.tape.ops import nn as nn_ops

    def run(captured):
        pc.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 24), nn.Unflatten(1, (6, 4)), nn.Dropout1d(0.5),
                              nn.Flatten(), nn.Linear(24, 3))
        for p in model.parameters():
            p.grad = pc.Tensor.zeros(queue, p.shape)

        def body(x, y):
            with tp.Tape() as tape:
                loss = tp.cross_entropy(model(tp.tensor(x)), y)
            tape.backward(loss)
            return loss.value
        nn_ops.manual_seed(5)
        step = tp.capture(body, queue) if captured else body
        losses = []
        for s in range(3):
            data = np.random.default_rng(s)
            x = pc.Tensor.from_host(queue, data.standard_normal((4, 16)).astype(np.float32))
            y = pc.Tensor.from_host(queue, data.integers(0, 3, 4))
            losses.append(float(step(x, y).to_host()))
        return losses, [p.grad.to_host() for p in model.parameters()], nn_ops.rng_state(), step

    eager, replayed = run(False), run(True)
    assert replayed[3].replays == 2                         # the calls after the recording
    assert replayed[0] == eager[0] and replayed[2] == eager[2] == (5, 3)
    assert all(np.array_equal(a, b) for a, b in zip(replayed[1], eager[1]))


SELU_ALPHA = 1.7580993408473766


def alpha_dropout_branches(x: np.ndarray, y: np.ndarray, p: float):
    """Which elements took PyTorch's kept value ``a * x + alpha * a * p`` and which its
    dropped value ``alpha * a * (p - 1)``; and ``a``."""
    a = ((SELU_ALPHA ** 2 * p + 1) * (1 - p)) ** -0.5
    kept = np.isclose(y, a * x + SELU_ALPHA * a * p, rtol=1e-5, atol=1e-6)
    dropped = np.isclose(y, SELU_ALPHA * a * (p - 1), rtol=1e-5, atol=1e-6)
    return kept, dropped, a


def test_alpha_dropout_takes_pytorchs_kept_and_dropped_values(queue, rng):
    tp.manual_seed(0)
    x = rng.standard_normal((40, 50)).astype(np.float32)
    nx = leaf(queue, x)
    with tp.Tape() as tape:
        y = nn.AlphaDropout(0.3)(nx)
    tape.backward(tp.sum(y))
    kept, dropped, a = alpha_dropout_branches(x, y.to_host(), 0.3)
    assert (kept | dropped).all() and abs(dropped.mean() - 0.3) < 0.03
    np.testing.assert_allclose(nx.grad.to_host(), np.where(kept, a, 0.0), rtol=1e-6)  # a * m
    torch.manual_seed(0)                          # torch's layer takes the same two values
    ty = torch.nn.AlphaDropout(0.3)(torch.from_numpy(x)).numpy()
    t_kept, t_dropped, _ = alpha_dropout_branches(x, ty, 0.3)
    assert (t_kept | t_dropped).all()


def test_alpha_dropouts_keep_a_standard_normal_inputs_mean_and_variance(queue, rng):
    pc.manual_seed(1)
    x = tp.tensor(rng.standard_normal((64, 64, 8, 8)).astype(np.float32))
    for layer in (nn.AlphaDropout(0.2), nn.FeatureAlphaDropout(0.2)):
        y = layer(x).to_host()
        assert abs(y.mean()) < 0.03 and abs(y.std() - 1.0) < 0.03, type(layer).__name__


def test_feature_alpha_dropout_drops_whole_channels(queue, rng):
    tp.manual_seed(2)
    x = rng.standard_normal((4, 16, 3, 3)).astype(np.float32)
    y = nn.FeatureAlphaDropout(0.5)(tp.tensor(x)).to_host()
    kept, dropped, _ = alpha_dropout_branches(x, y, 0.5)
    per_channel = dropped.reshape(64, 9)
    assert (per_channel.all(1) | ~per_channel.any(1)).all()          # a channel all or none
    assert 0 < per_channel.all(1).sum() < 64 and (kept | dropped).all()


def test_alpha_dropouts_are_the_identity_in_eval_zeros_at_p_1_and_torchs_reprs(queue, rng):
    x = tp.tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    assert nn.AlphaDropout(0.5).eval()(x) is x and nn.FeatureAlphaDropout(0.0)(x) is x
    np.testing.assert_array_equal(nn.AlphaDropout(1.0)(x).to_host(), np.zeros((2, 3, 4)))
    assert repr(nn.AlphaDropout(0.2)) == repr(torch.nn.AlphaDropout(0.2))
    assert repr(nn.FeatureAlphaDropout()) == repr(torch.nn.FeatureAlphaDropout())
    with pytest.raises(pc.ShapeError, match="FeatureAlphaDropout: feature dropout needs at "
                                            "least 2 dims"):
        nn.FeatureAlphaDropout()(tp.tensor(np.ones(5, np.float32)))
    with pytest.raises(pc.ShapeError, match=r"AlphaDropout: dropout probability p must be in "
                                            r"\[0, 1\]"):
        nn.AlphaDropout(-0.1)


@pytest.mark.parametrize("cls", ["AlphaDropout", "FeatureAlphaDropout"])
@pytest.mark.parametrize("p", [1.5, -0.5])
def test_alpha_dropout_refuses_a_p_assigned_out_of_range_as_pytorch(queue, cls, p):
    """A ``p`` set after construction (``layer.p = 1.5``) reached the scale's square root and
    raised Python's bare 'ValueError: math domain error'; PyTorch's forward refuses it naming
    the probability, as parcl's ``tp.dropout`` does for the channel dropouts."""
    layer = getattr(nn, cls)(0.5)
    layer.p = p
    with pytest.raises(pc.ShapeError, match=rf"{cls}: dropout probability p must be in "
                                            rf"\[0, 1\], got {p}"):
        layer(tp.tensor(np.ones((2, 3, 4), np.float32)))
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        theirs = getattr(torch.nn, cls)(0.5)
        theirs.p = p
        theirs(torch.ones(2, 3, 4))


def test_the_first_dropout_of_a_seed_0_thread_does_not_always_drop_element_0(queue):
    """The mask of call (seed, counter) mixes ``key + i * golden``; the key of seed 0's first
    call (every unseeded thread's) was 0, splitmix64's fixed point, so element 0 got the bits
    0 and was dropped whatever p: ``tp.dropout(ones(8), 0.01)`` gave [0, 1.01, ...]."""
    pc.manual_seed(0)
    y = tp.dropout(tp.tensor(np.ones(8, np.float32)), 1e-6, True).to_host()
    np.testing.assert_array_equal(y, np.full(8, np.float32(1 / (1 - 1e-6))))
