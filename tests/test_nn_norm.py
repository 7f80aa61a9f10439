"""Layers LayerNorm, RMSNorm, GroupNorm, BatchNorm1d, Embedding and GELU: PyTorch's parameter
names, initialisation, state dicts, outputs against numpy and BatchNorm1d's running stats."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import up


def test_layer_norm_layer(queue, rng):
    ln = pc.nn.LayerNorm((3, 4), eps=1e-6, queue=queue)
    sd = ln.state_dict()
    assert list(sd) == ["weight", "bias"]
    assert (sd["weight"] == 1).all() and (sd["bias"] == 0).all() and sd["weight"].shape == (3, 4)
    w, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    ln.load_state_dict({"weight": w, "bias": b})
    x = rng.standard_normal((2, 3, 4))
    m, v = x.mean((1, 2), keepdims=True), x.var((1, 2), keepdims=True)
    want = (x - m) / np.sqrt(v + 1e-6) * w + b
    with tp.no_grad():
        got = ln(up(queue, x))
    np.testing.assert_allclose(got.to_host(), want, atol=3e-5)
    assert list(pc.nn.LayerNorm(4, bias=False, queue=queue).state_dict()) == ["weight"]
    assert pc.nn.LayerNorm(4, elementwise_affine=False, queue=queue).parameters() == []
    with pytest.raises(pc.ShapeError, match="layer_norm"):
        ln(up(queue, np.zeros((2, 4, 3))))


def test_rms_norm_and_group_norm_layers(queue, rng):
    rms = pc.nn.RMSNorm(5, queue=queue)
    assert list(rms.state_dict()) == ["weight"] and rms.eps is None
    x = rng.standard_normal((3, 5))
    want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + np.finfo(np.float32).eps)
    np.testing.assert_allclose(rms(up(queue, x)).to_host(), want, atol=2e-5)

    gn = pc.nn.GroupNorm(2, 4, queue=queue)
    assert list(gn.state_dict()) == ["weight", "bias"] and gn.weight.shape == (4,)
    x = rng.standard_normal((2, 4, 3))
    xg = x.reshape(2, 2, -1)
    want = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5))
    np.testing.assert_allclose(gn(up(queue, x)).to_host(), want.reshape(x.shape), atol=2e-5)
    with pytest.raises(pc.ShapeError, match="not divisible"):
        pc.nn.GroupNorm(3, 4, queue=queue)
    with pytest.raises(pc.ShapeError, match=r"expected input \(N, 4, \*\)"):
        gn(up(queue, np.zeros((2, 3))))


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5)])
def test_batch_norm_1d(queue, rng, shape):
    bn = pc.nn.BatchNorm1d(3, momentum=0.2, queue=queue)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var"]
    x = rng.standard_normal(shape) * 2 + 1
    axes = (0,) if len(shape) == 2 else (0, 2)
    cs = (1, 3) if len(shape) == 2 else (1, 3, 1)
    xn = tp.tensor(up(queue, x), True)
    with tp.Tape() as tape:
        y = bn(xn)
    m, v = x.mean(axes), x.var(axes)
    want = (x - m.reshape(cs)) / np.sqrt(v.reshape(cs) + 1e-5)
    np.testing.assert_allclose(y.to_host(), want, atol=3e-5)
    n = x.size // 3
    np.testing.assert_allclose(bn.running_mean.to_host(), 0.2 * m, atol=1e-5)
    np.testing.assert_allclose(bn.running_var.to_host(), 0.8 + 0.2 * v * n / (n - 1), atol=1e-5)
    tape.backward(y, grad=up(queue, np.cos(x)))
    assert xn.grad.shape == shape and bn.weight.grad.shape == (3,)
    bn.eval()
    with tp.no_grad():
        ye = bn(up(queue, x)).to_host()
    rm, rv = bn.running_mean.to_host(), bn.running_var.to_host()
    np.testing.assert_allclose(ye, (x - rm.reshape(cs)) / np.sqrt(rv.reshape(cs) + 1e-5),
                               atol=3e-5)
    with pytest.raises(pc.ShapeError, match=r"expected input \(N, 3\) or \(N, 3, L\)"):
        bn(up(queue, np.zeros((2, 3, 4, 4))))


def test_embedding_layer(queue):
    pc.nn.manual_seed(0)
    emb = pc.nn.Embedding(200, 64, queue=queue)
    w = emb.state_dict()["weight"]
    assert list(emb.state_dict()) == ["weight"] and w.shape == (200, 64)
    assert abs(w.mean()) < 0.02 and abs(w.std() - 1.0) < 0.02      # N(0, 1), as PyTorch
    pc.nn.manual_seed(0)
    assert np.array_equal(pc.nn.Embedding(200, 64, queue=queue).state_dict()["weight"], w)
    idx = np.array([[3, 3, 199]])
    with tp.no_grad():
        out = emb(up(queue, idx, np.int64)).to_host()
    np.testing.assert_array_equal(out, w[idx])


def test_gelu_layer(queue):
    x = np.linspace(-3, 3, 7)
    exact = pc.nn.GELU()(up(queue, x)).to_host()
    approx = pc.nn.GELU(approximate="tanh")(up(queue, x)).to_host()
    np.testing.assert_allclose(approx, 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (
        x + 0.044715 * x ** 3))), atol=2e-6)
    assert np.abs(exact - approx).max() > 1e-5
    with pytest.raises(ValueError, match="approximate"):
        pc.nn.GELU("erf")
