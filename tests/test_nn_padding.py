"""The padding layers (``pc.nn.ZeroPad1d`` ... ``CircularPad2d``) against PyTorch's: outputs,
input gradients, reprs and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn

LAYERS_1D = [("ZeroPad1d", ()), ("ConstantPad1d", (1.5,)), ("ReflectionPad1d", ()),
             ("ReplicationPad1d", ()), ("CircularPad1d", ())]
LAYERS_2D = [("ZeroPad2d", ()), ("ConstantPad2d", (-2.0,)), ("ReflectionPad2d", ()),
             ("ReplicationPad2d", ()), ("CircularPad2d", ())]
LAYERS_3D = [("ZeroPad3d", ()), ("ConstantPad3d", (0.5,)), ("ReflectionPad3d", ()),
             ("ReplicationPad3d", ()), ("CircularPad3d", ())]


def forward_and_grad(layer, x: np.ndarray, g_seed: int = 1):
    """``layer(x)`` and the input's gradient for a fixed random upstream gradient."""
    nx = leaf(pc.default_queue(), x)
    with tp.Tape() as tape:
        y = layer(nx)
    g = np.random.default_rng(g_seed).standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(pc.default_queue(), g))
    return y.to_host(), nx.grad.to_host(), g


def check_as_torch(name: str, extra: tuple, padding, x: np.ndarray) -> None:
    ours, theirs = getattr(nn, name)(padding, *extra), getattr(torch.nn, name)(padding, *extra)
    y, gx, g = forward_and_grad(ours, x)
    tx = torch.tensor(x, requires_grad=True)
    want = theirs(tx)
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("name,extra", LAYERS_1D)
@pytest.mark.parametrize("padding,shape", [(2, (2, 3, 5)), ((1, 3), (3, 4)), ((0, 2), (1, 2, 3))])
def test_pad1d_layers_pad_and_backpropagate_as_pytorch(queue, rng, name, extra, padding, shape):
    check_as_torch(name, extra, padding, rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("name,extra", LAYERS_2D)
@pytest.mark.parametrize("padding,shape", [(1, (2, 2, 4, 5)), ((2, 0, 1, 3), (3, 4, 4))])
def test_pad2d_layers_pad_and_backpropagate_as_pytorch(queue, rng, name, extra, padding, shape):
    check_as_torch(name, extra, padding, rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("name,extra", LAYERS_3D)
@pytest.mark.parametrize("padding,shape", [(1, (1, 2, 3, 4, 3)),
                                           ((2, 0, 1, 2, 0, 1), (2, 3, 4, 3))])
def test_pad3d_layers_pad_and_backpropagate_as_pytorch(queue, rng, name, extra, padding, shape):
    check_as_torch(name, extra, padding, rng.standard_normal(shape).astype(np.float32))


def test_constant_pads_crop_with_negative_padding_as_pytorch(queue, rng):
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    check_as_torch("ConstantPad1d", (0.5,), (-1, 2), x)
    check_as_torch("ZeroPad2d", (), (1, -2, -1, 0), x)


def test_reflection_pad1d_mirrors_without_repeating_the_edge_as_pytorch(queue):
    x = tp.tensor(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    np.testing.assert_array_equal(nn.ReflectionPad1d((3, 1))(x).to_host(),
                                  [[4.0, 3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0]])
    np.testing.assert_array_equal(nn.ReplicationPad1d(2)(x).to_host(),
                                  [[1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0]])
    np.testing.assert_array_equal(nn.CircularPad1d((1, 2))(x).to_host(),
                                  [[4.0, 1.0, 2.0, 3.0, 4.0, 1.0, 2.0]])
    np.testing.assert_array_equal(nn.ConstantPad1d(1, 9)(x).to_host(),
                                  [[9.0, 1.0, 2.0, 3.0, 4.0, 9.0]])


def test_replication_pad2d_passes_gradcheck(queue, rng):
    pad = nn.ReplicationPad2d((1, 2, 2, 0))
    assert tp.gradcheck(pad, [leaf(queue, rng.standard_normal((1, 2, 3, 3)))])
    assert tp.gradcheck(nn.CircularPad1d((2, 1)),
                        [leaf(queue, rng.standard_normal((2, 4)))])


def test_padding_layers_have_no_parameters_and_export_their_names(queue):
    for name, extra in LAYERS_1D + LAYERS_2D + LAYERS_3D:
        assert name in nn.__all__
        assert list(getattr(nn, name)(1, *extra).state_dict()) == []


@pytest.mark.parametrize("bad", [1.5, (1,), (1, 2, 3), True, "same", (1, 2.0)])
def test_padding_layers_refuse_a_bad_padding(queue, bad):
    with pytest.raises(pc.ShapeError, match="ReflectionPad1d: padding must be an int or a "
                                            "tuple of 2 ints"):
        nn.ReflectionPad1d(bad)


def test_padding_layers_refuse_inputs_of_the_wrong_rank_naming_the_layer(queue):
    with pytest.raises(pc.ShapeError, match=r"ReflectionPad2d: expected a 3-d or 4-d input, "
                                            r"got shape \(4, 5\)"):
        nn.ReflectionPad2d(1)(tp.tensor(np.ones((4, 5), np.float32)))
    with pytest.raises(pc.ShapeError, match=r"ReplicationPad1d: expected a 2-d or 3-d input"):
        nn.ReplicationPad1d(1)(tp.tensor(np.ones((1, 2, 4, 5), np.float32)))
    with pytest.raises(pc.ShapeError, match="reflect.*smaller than the dimension"):
        nn.ReflectionPad1d(3)(tp.tensor(np.ones((2, 3), np.float32)))
    with pytest.raises(pc.ShapeError, match="value must be a number"):
        nn.ConstantPad2d(1, "zero")
