"""``Module.register_buffer(name, tensor, persistent=False)`` as PyTorch's: in ``buffers()``,
out of ``state_dict`` and of what ``load_state_dict`` expects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
from parcl import nn


class WithMask(nn.Module):
    def __init__(self, persistent: bool):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.register_buffer("mask", pc.Tensor.from_host(pc.default_queue(),
                                                         np.ones(2, np.float32)), persistent)
        self.register_buffer("scale", pc.Tensor.from_host(pc.default_queue(),
                                                          np.full(1, 2.0, np.float32)))


class TorchWithMask(torch.nn.Module):
    def __init__(self, persistent: bool):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.register_buffer("mask", torch.ones(2), persistent)
        self.register_buffer("scale", torch.full((1,), 2.0))


@pytest.mark.parametrize("persistent", [True, False])
def test_a_non_persistent_buffer_stays_out_of_state_dict_as_pytorch(queue, persistent):
    ours, theirs = nn.Sequential(WithMask(persistent)), torch.nn.Sequential(
        TorchWithMask(persistent))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()] \
        == ["0.mask", "0.scale"]
    # a state dict without the mask loads strictly; the mask keeps its own value
    state = {k: v.numpy() for k, v in theirs.state_dict().items()}
    state["0.scale"][:] = 5.0
    ours.load_state_dict(state)
    assert float(ours[0].scale.to_host()[0]) == 5.0
    np.testing.assert_array_equal(ours[0].mask.to_host(), [1.0, 1.0])


def test_a_buffer_registered_again_as_persistent_comes_back_into_state_dict(queue):
    m = WithMask(persistent=False)
    assert "mask" not in m.state_dict()
    m.mask = pc.Tensor.from_host(queue, np.zeros(2, np.float32))   # stays non-persistent
    assert "mask" not in m.state_dict()
    m.register_buffer("mask", m.mask)
    assert list(m.state_dict()) == ["mask", "scale", "fc.weight", "fc.bias"]
    del m.scale
    m.register_buffer("scale", None, persistent=False)
    assert list(m.state_dict()) == ["mask", "fc.weight", "fc.bias"]


def test_modules_without_non_persistent_buffers_keep_their_attributes(queue):
    # capture keys and replica followers read a module's __dict__: nothing new there
    m = nn.Linear(2, 2)
    m.register_buffer("scale", pc.Tensor.from_host(queue, np.ones(1, np.float32)))
    del m.scale
    assert "_non_persistent" not in vars(m)
