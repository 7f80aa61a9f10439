"""The tensor API that PyTorch training scripts call, as PyTorch's: ``dim=`` and ``keepdim=``
on the ops whose own names are numpy's."""

from __future__ import annotations


import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import close, leaf, up


def _torch_grad(fn, *arrays):
    """``fn`` of float64 torch leaves, summed with fixed weights; (value, gradients)."""
    xs = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*xs)
    w = torch.tensor(np.linspace(-1, 1, out.numel()).reshape(out.shape))
    (out * w).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in xs], w.numpy()


# -- dim= / keepdim= on the ops ---------------------------------------------------------------
@pytest.mark.parametrize("name, kwargs", [
    ("sum", dict(dim=1)), ("sum", dict(dim=(0, 2), keepdim=True)), ("mean", dict(dim=-1)),
    ("mean", dict(dim=1, keepdim=True)), ("softmax", dict(dim=1)),
    ("log_softmax", dict(dim=-1)), ("logsumexp", dict(dim=2, keepdim=True)),
    ("cumsum", dict(dim=1)), ("var", dict(dim=1)), ("std", dict(dim=(1, 2), keepdim=True)),
])
def test_reductions_and_softmax_take_dim_and_keepdim_as_pytorch(queue, rng, name, kwargs):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x = leaf(queue, a)
    got = getattr(tp, name)(x, **kwargs)
    want, (grad,), w = _torch_grad(lambda t: getattr(torch, name)(t, **kwargs), a)
    close(got.to_host(), want)
    (got * up(queue, w)).sum().backward()
    close(x.grad.to_host(), grad)


def test_sum_over_dim_empty_reduces_every_dim_as_pytorch(queue, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    assert float(tp.sum(leaf(queue, a), dim=())) == pytest.approx(float(torch.sum(
        torch.tensor(a), dim=())), rel=1e-6)
    assert tp.sum(leaf(queue, a), axis=()).shape == (2, 3)       # numpy's axis=(): none


def test_joins_argmax_gather_flip_and_var_mean_take_pytorchs_names(queue, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    x, t = leaf(queue, a), torch.tensor(a)
    close(tp.cat([x, x], dim=1).to_host(), torch.cat([t, t], dim=1).numpy())
    close(tp.stack([x, x], dim=-1).to_host(), torch.stack([t, t], dim=-1).numpy())
    assert [p.shape for p in tp.split(x, 2, dim=1)] == [(2, 2), (2, 1)]
    np.testing.assert_array_equal(np.asarray(tp.argmax(x, dim=1, keepdim=True)),
                                  torch.argmax(t, dim=1, keepdim=True).numpy())
    index = np.array([[0, 2], [1, 0]])
    close(tp.gather(x, dim=1, index=up(queue, index, np.int64)).to_host(),
          torch.gather(t, dim=1, index=torch.tensor(index)).numpy())
    close(tp.flip(x, dims=(1,)).to_host(), torch.flip(t, dims=(1,)).numpy())
    var, mean = tp.var_mean(x, dim=1, keepdim=True)
    want_var, want_mean = torch.var_mean(t, dim=1, keepdim=True)
    close(var.to_host(), want_var.numpy())
    close(mean.to_host(), want_mean.numpy())


def test_a_dim_given_under_both_names_is_a_type_error(queue):
    x = leaf(queue, np.ones((2, 3)))
    with pytest.raises(TypeError, match="softmax: axis and dim given both"):
        tp.softmax(x, axis=0, dim=1)
    with pytest.raises(TypeError, match="sum: keepdims and keepdim given both"):
        tp.sum(x, 1, keepdims=True, keepdim=True)
