"""PyTorch layer options parcl once refused: ``Conv1d``/``Conv2d`` ``padding_mode``, ...
Each layer is given a PyTorch layer's state dict and compared with it: outputs, gradients of
the input and of every parameter, buffers and state-dict keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl import nn


def torch_state(layer) -> dict:
    return {k: torch.from_numpy(np.array(v)) for k, v in layer.state_dict().items()}


def compare_with_torch(ours, theirs, x, rng, tol=1e-5, train=True):
    """ours(x) and theirs(x) agree, and so do the gradients of one random weighted sum for the
    input and every parameter; returns the two outputs."""
    nx = tp.tensor(pc.Tensor.from_host(pc.default_queue(), x.astype(np.float32)), True)
    tx = torch.tensor(x.astype(np.float32), requires_grad=True)
    with tp.Tape() as tape:
        y = ours(nx)
    want = theirs(tx)
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=tol, atol=tol)
    if not train:
        return y, want
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(pc.default_queue(), g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=tol, atol=tol)
    params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), params[name].grad.numpy(), rtol=tol,
                                   atol=tol, err_msg=name)
    return y, want


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("kw", [dict(padding=2), dict(padding=(1, 2), stride=2),
                                dict(padding=1, dilation=2, groups=3)])
def test_conv2d_padding_mode_matches_pytorch(queue, rng, padding_mode, kw):
    nn.manual_seed(0)
    ours = nn.Conv2d(3, 6, 3, padding_mode=padding_mode, **kw)
    theirs = torch.nn.Conv2d(3, 6, 3, padding_mode=padding_mode, **kw)
    theirs.load_state_dict(torch_state(ours))
    compare_with_torch(ours, theirs, rng.standard_normal((2, 3, 7, 6)), rng)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert (f"padding_mode={padding_mode}" in repr(ours)) == (padding_mode != "zeros")


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("kw,shape", [(dict(padding=2), (2, 4, 9)),
                                      (dict(padding="same", dilation=2), (2, 4, 7)),
                                      (dict(padding="same", kernel_size=4), (4, 8)),
                                      (dict(padding="valid"), (2, 4, 5)),
                                      (dict(padding=1, stride=2, groups=2), (2, 4, 6))])
def test_conv1d_padding_mode_matches_pytorch(queue, rng, padding_mode, kw, shape):
    nn.manual_seed(0)
    kw = {"kernel_size": 3, **kw}
    ours = nn.Conv1d(4, 6, padding_mode=padding_mode, **kw)
    theirs = torch.nn.Conv1d(4, 6, padding_mode=padding_mode, **kw)
    theirs.load_state_dict(torch_state(ours))
    compare_with_torch(ours, theirs, rng.standard_normal(shape), rng)


def test_conv_layers_refuse_an_unknown_padding_mode(queue):
    with pytest.raises(ValueError):
        torch.nn.Conv2d(3, 3, 3, padding_mode="mirror")
    for layer in (nn.Conv1d, nn.Conv2d):
        with pytest.raises(pc.ShapeError, match="padding_mode must be one of"):
            layer(3, 3, 3, padding_mode="mirror")
