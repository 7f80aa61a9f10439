"""PyTorch's functional channel and alpha dropouts (``tp.dropout1d`` ... ``tp.dropout3d``,
``tp.alpha_dropout``, ``tp.feature_alpha_dropout``) and ``tp.instance_norm``: the modules'
masks and values, PyTorch's defaults (the alpha dropouts' ``training=False``), gradients
through the same mask, and refusals naming the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf

SELU_ALPHA = 1.7580993408473766


@pytest.mark.parametrize("fn,layer,shape", [(tp.dropout1d, pc.nn.Dropout1d, (4, 6, 5)),
                                            (tp.dropout2d, pc.nn.Dropout2d, (4, 6, 3, 3)),
                                            (tp.dropout3d, pc.nn.Dropout3d, (2, 6, 2, 3, 2))])
def test_channel_dropout_functionals_draw_the_modules_masks_as_pytorch(queue, rng, fn, layer,
                                                                       shape):
    x = rng.uniform(1.0, 2.0, shape).astype(np.float32)
    tp.manual_seed(4)
    y = fn(tp.tensor(x), 0.5).to_host()
    tp.manual_seed(4)
    np.testing.assert_array_equal(layer(0.5)(tp.tensor(x)).to_host(), y)
    rows = y.reshape(shape[0] * shape[1], -1)
    dropped = (rows == 0).all(1)
    assert ((rows == 0).any(1) == dropped).all() and 0 < dropped.sum() < len(rows)
    close(rows[~dropped], x.reshape(len(rows), -1)[~dropped] * 2.0, 1e-6)
    t = tp.tensor(x)
    assert fn(t, 0.5, training=False) is t and fn(t, 0.0) is t


def test_dropout2d_takes_a_3d_input_as_n_c_l_with_pytorchs_warning(queue):
    tp.manual_seed(0)
    with pytest.warns(UserWarning, match="dropout2d: Received a 3D input"):
        y = tp.dropout2d(tp.tensor(np.ones((4, 8, 5), np.float32)), 0.5).to_host()
    assert set(np.unique(y.std(2))) == {0.0}             # each (n, c) row all 0 or all 2


def test_channel_dropout_gradient_is_the_upstream_gradient_through_the_same_mask(queue, rng):
    x = leaf(queue, rng.uniform(1.0, 2.0, (2, 6, 4)))
    tp.manual_seed(2)
    with tp.Tape() as tape:
        y = tp.dropout1d(x, 0.5)
    tape.backward(tp.sum(y))
    mask = (y.to_host() != 0) * 2.0
    np.testing.assert_array_equal(x.grad.to_host(), mask)

    def seeded(v):
        tp.manual_seed(2)
        return tp.dropout1d(v, 0.5)
    assert tp.gradcheck(seeded, [x])


def test_alpha_dropout_defaults_to_evaluation_and_keeps_selus_statistics_as_pytorch(queue, rng):
    x = rng.standard_normal((200, 100)).astype(np.float32)
    t = tp.tensor(x)
    assert tp.alpha_dropout(t, 0.2) is t                   # PyTorch's training=False default
    assert tp.feature_alpha_dropout(t, 0.2) is t
    tp.manual_seed(0)
    y = tp.alpha_dropout(t, 0.2, training=True).to_host()
    a = ((SELU_ALPHA ** 2 * 0.2 + 1) * 0.8) ** -0.5
    kept = np.isclose(y, a * x + SELU_ALPHA * a * 0.2, rtol=1e-5, atol=1e-6)
    dropped = np.isclose(y, SELU_ALPHA * a * -0.8, rtol=1e-5, atol=1e-6)
    assert (kept | dropped).all() and abs(dropped.mean() - 0.2) < 0.01
    assert abs(y.mean()) < 0.02 and abs(y.std() - 1.0) < 0.02
    tp.manual_seed(0)
    np.testing.assert_array_equal(pc.nn.AlphaDropout(0.2)(t).to_host(), y)
    np.testing.assert_array_equal(tp.alpha_dropout(t, 1.0, training=True).to_host(), 0 * x)


def test_feature_alpha_dropout_drops_whole_channels_as_pytorch(queue, rng):
    x = rng.standard_normal((4, 10, 3, 3)).astype(np.float32)
    tp.manual_seed(1)
    y = tp.feature_alpha_dropout(tp.tensor(x), 0.5, training=True).to_host()
    a = ((SELU_ALPHA ** 2 * 0.5 + 1) * 0.5) ** -0.5
    dropped = np.isclose(y, SELU_ALPHA * a * -0.5).reshape(40, 9)
    assert ((dropped.all(1)) | (~dropped).all(1)).all() and 0 < dropped.all(1).sum() < 40
    tp.manual_seed(1)
    np.testing.assert_array_equal(
        pc.nn.FeatureAlphaDropout(0.5)(tp.tensor(x)).to_host(), y)


def test_functional_dropouts_refuse_bad_arguments_naming_the_op(queue):
    x = tp.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"dropout1d: dropout probability p must be in "):
        tp.dropout1d(x, 1.5)
    with pytest.raises(pc.ParclError, match="dropout3d: inplace=True is not supported"):
        tp.dropout3d(tp.tensor(np.ones((2, 3, 2, 2, 2), np.float32)), inplace=True)
    with pytest.raises(pc.ShapeError, match=r"dropout3d: expected a 4-d \(unbatched\) or 5-d "
                                            r"input, got shape \(2, 3\)"):
        tp.dropout3d(x)
    with pytest.raises(pc.ShapeError, match=r"dropout2d: expected a 4-d input"):
        tp.dropout2d(x)
    with pytest.raises(pc.ShapeError, match=r"feature_alpha_dropout: feature dropout needs at "
                                            r"least 2 dims \(N, C, \*\), got shape \(3,\)"):
        tp.feature_alpha_dropout(tp.tensor(np.ones(3, np.float32)), training=True)
    with pytest.raises(pc.ShapeError, match="Dropout1d: dropout probability"):
        pc.nn.Dropout1d(-0.1)


def test_instance_norm_normalises_each_map_and_moves_running_stats_as_pytorch(queue, rng):
    x = rng.standard_normal((3, 4, 5, 2)).astype(np.float32) * 2 + 1
    w, b = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    prm, prv = pc.Tensor.from_host(queue, rm), pc.Tensor.from_host(queue, rv)
    y = tp.instance_norm(tp.tensor(x), prm, prv, tp.tensor(w.astype(np.float32)),
                         tp.tensor(b.astype(np.float32)), momentum=0.3, eps=1e-4)
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    want = F.instance_norm(torch.tensor(x, dtype=torch.float64), trm.double(), trv.double(),
                           torch.tensor(w), torch.tensor(b), momentum=0.3, eps=1e-4)
    close(y.to_host(), want.numpy())
    F.instance_norm(torch.tensor(x), trm, trv, momentum=0.3)      # the float32 statistics
    close(prm.to_host(), trm.numpy(), 1e-5)
    close(prv.to_host(), trv.numpy(), 1e-5)
    evaluated = tp.instance_norm(tp.tensor(x), prm, prv, use_input_stats=False)
    close(evaluated.to_host(), F.instance_norm(torch.tensor(x), trm, trv,
                                               use_input_stats=False).numpy())


def test_instance_norm_gradient_matches_finite_differences_and_pytorch(queue, rng):
    x0 = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w0, b0 = rng.uniform(0.5, 1.5, 3).astype(np.float32), rng.standard_normal(3)
    x, w, b = leaf(queue, x0), leaf(queue, w0), leaf(queue, b0)
    assert tp.gradcheck(lambda *v: tp.instance_norm(v[0], weight=v[1], bias=v[2]), [x, w, b])
    g = rng.standard_normal(x0.shape).astype(np.float32)
    with tp.Tape() as tape:
        y = tp.instance_norm(x, weight=w, bias=b)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tx, tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True)
                  for v in (x0, w0, b0))
    (F.instance_norm(tx, weight=tw, bias=tb) * torch.tensor(g)).sum().backward()
    for got, want in ((x, tx), (w, tw), (b, tb)):
        close(got.grad.to_host(), want.grad.numpy())


def test_instance_norm_refuses_what_pytorch_refuses_naming_the_op(queue):
    x = tp.tensor(np.ones((2, 3, 1, 1), np.float32))
    with pytest.raises(pc.ShapeError, match=r"instance_norm: expected more than 1 spatial "
                                            r"element when training, got input of shape"):
        tp.instance_norm(x)
    with pytest.raises(pc.ShapeError, match=r"instance_norm: expected an \(N, C, \*\) input"):
        tp.instance_norm(tp.tensor(np.ones((2, 3), np.float32)))
    with pytest.raises(pc.ParclError, match="instance_norm: use_input_stats=False normalises"):
        tp.instance_norm(x, use_input_stats=False)
    with pytest.raises(pc.ShapeError, match=r"instance_norm: running_mean has shape \(4,\), "
                                            r"expected \(3,\)"):
        tp.instance_norm(tp.tensor(np.ones((2, 3, 4), np.float32)),
                         pc.Tensor.zeros(x.queue, (4,)), pc.Tensor.zeros(x.queue, (4,)))
