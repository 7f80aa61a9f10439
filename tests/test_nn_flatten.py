"""``nn.Flatten(start_dim, end_dim)`` and ``nn.Unflatten`` against PyTorch's: shapes, values,
gradients, reprs and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn
from parcl.errors import ShapeError


@pytest.mark.parametrize("dims", [(), (0,), (1, 2), (0, -1), (-3, -2), (2, 2), (1, -2)])
def test_flatten_merges_start_to_end_dim_as_pytorch(queue, rng, dims):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    ours, theirs = nn.Flatten(*dims), torch.nn.Flatten(*dims)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = ours(nx)
    want = theirs(tx)
    assert y.shape == tuple(want.shape)
    np.testing.assert_array_equal(y.to_host(), want.detach().numpy())
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(nx.grad.to_host(), tx.grad.numpy())
    assert repr(ours) == repr(theirs)


def test_flatten_of_dims_one_and_two_gives_the_shapes_pytorch_gives(queue):
    x = pc.Tensor.from_host(queue, np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4))
    assert nn.Flatten(1, 2)(x).shape == (1, 6, 4)
    assert nn.Flatten(0, -1)(x).shape == (24,)
    assert nn.Flatten(-2)(x).shape == (1, 2, 12)
    np.testing.assert_array_equal(np.asarray(nn.Flatten(1, 2)(x))[0, 5], [20, 21, 22, 23])


@pytest.mark.parametrize("dims", [(2, 1), (0, 4), (-5, -1)])
def test_flatten_refuses_dims_pytorch_refuses(queue, dims):
    x = pc.Tensor.from_host(queue, np.zeros((2, 3, 4, 5), np.float32))
    with pytest.raises(ShapeError, match=r"flatten: .*\(2, 3, 4, 5\)"):
        nn.Flatten(*dims)(x)
    with pytest.raises((RuntimeError, IndexError)):
        torch.nn.Flatten(*dims)(torch.zeros(2, 3, 4, 5))


def test_unflatten_refuses_sizes_that_do_not_multiply_up(queue):
    x = pc.Tensor.from_host(queue, np.zeros((2, 6), np.float32))
    assert nn.Unflatten(1, (2, -1))(x).shape == (2, 2, 3)
    with pytest.raises(ShapeError, match=r"unflatten: sizes \(4, 2\)"):
        nn.Unflatten(1, (4, 2))(x)
    with pytest.raises(RuntimeError):
        torch.nn.Unflatten(1, (4, 2))(torch.zeros(2, 6))
