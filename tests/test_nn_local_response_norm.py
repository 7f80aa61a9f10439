"""``tp.local_response_norm`` and ``pc.nn.LocalResponseNorm`` against PyTorch's: outputs and
input gradients over sizes, ranks and constants; concrete values, gradcheck, repr and
refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn


@pytest.mark.parametrize("shape", [(2, 5, 3), (2, 6, 3, 4), (1, 4, 2, 3, 2)])
@pytest.mark.parametrize("size,kw", [(3, {}), (2, {"alpha": 0.1, "beta": 0.5, "k": 2.0}),
                                     (5, {"alpha": 1.0}), (1, {})])
def test_local_response_norm_matches_pytorch(queue, rng, shape, size, kw):
    x = rng.standard_normal(shape).astype(np.float32)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = nn.LocalResponseNorm(size, **kw)(nx)
    want = torch.nn.LocalResponseNorm(size, **kw)(tx)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert repr(nn.LocalResponseNorm(size, **kw)) == repr(torch.nn.LocalResponseNorm(size, **kw))


def test_local_response_norm_divides_by_the_neighbouring_channels_squares(queue):
    x = tp.tensor(np.array([1.0, 2.0, 3.0], np.float32).reshape(1, 3, 1))
    # size 3: channel c averages the squares of c - 1, c, c + 1 (zeros past the ends) over 3
    y = tp.local_response_norm(x, 3, alpha=3.0, beta=1.0, k=1.0).to_host().ravel()
    np.testing.assert_allclose(y, [1 / (1 + 5), 2 / (1 + 14), 3 / (1 + 13)], rtol=1e-6)
    assert tp.gradcheck(lambda v: tp.local_response_norm(v, 3, alpha=0.5),
                        [leaf(queue, np.random.default_rng(0).standard_normal((2, 4, 3)))])


def test_local_response_norm_refuses_inputs_below_3d_and_bad_sizes(queue):
    with pytest.raises(pc.ShapeError, match=r"local_response_norm: expected an \(N, C, \*\) "
                                            r"input of 3 or more dims, got shape \(2, 3\)"):
        nn.LocalResponseNorm(2)(tp.tensor(np.ones((2, 3), np.float32)))
    with pytest.raises(pc.ShapeError, match="LocalResponseNorm: size must be a positive"):
        nn.LocalResponseNorm(0)
