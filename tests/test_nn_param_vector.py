"""``pc.nn.utils.parameters_to_vector`` and ``vector_to_parameters`` against PyTorch's: the
same vector for the same parameters, gradients through it, the round trip, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl import nn
from parcl.nn.utils import parameters_to_vector, vector_to_parameters


def models():
    nn.manual_seed(0)
    ours = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4),
                                 torch.nn.Linear(4, 2, bias=False))
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    return ours, theirs


def test_parameters_to_vector_flattens_in_order_as_pytorch(queue):
    ours, theirs = models()
    vec = parameters_to_vector(ours.parameters())
    want = torch.nn.utils.parameters_to_vector(theirs.parameters()).detach().numpy()
    assert vec.shape == (12 + 4 + 4 + 4 + 8,)
    np.testing.assert_array_equal(vec.to_host(), want)


def test_parameters_to_vector_is_differentiable_as_pytorchs(queue, rng):
    ours, theirs = models()
    w = rng.standard_normal(32).astype(np.float32)
    with tp.Tape() as tape:
        loss = tp.sum(tp.mul(parameters_to_vector(ours.parameters()) ** 2,
                             pc.Tensor.from_host(queue, w)))
    tape.backward(loss)
    (torch.nn.utils.parameters_to_vector(theirs.parameters()) ** 2
     * torch.from_numpy(w)).sum().backward()
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), grads[name].grad.numpy(), rtol=1e-6,
                                   err_msg=name)


def test_vector_to_parameters_copies_slices_back_in_order_as_pytorch(queue):
    ours, theirs = models()
    new = np.arange(32, dtype=np.float32) / 10
    vector_to_parameters(pc.Tensor.from_host(queue, new), ours.parameters())
    torch.nn.utils.vector_to_parameters(torch.from_numpy(new), theirs.parameters())
    for name, value in theirs.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[name], value.numpy(), err_msg=name)
    np.testing.assert_array_equal(ours[0].bias.value.to_host(), new[12:16])     # after weight


def test_a_vector_round_trip_leaves_the_parameters_unchanged(queue):
    ours, _ = models()
    before = {k: v.copy() for k, v in ours.state_dict().items()}
    with tp.no_grad():
        vec = parameters_to_vector(ours.parameters())          # a raw Tensor
    assert isinstance(vec, pc.Tensor)
    vector_to_parameters(vec, ours.parameters())
    for name, value in ours.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_vector_to_parameters_refuses_a_vector_that_does_not_fit(queue):
    ours, _ = models()
    for shape in [(31,), (33,), (4, 8)]:
        with pytest.raises(pc.ShapeError, match=r"vector_to_parameters: vec has shape "
                                                r".*, expected \(32,\)"):
            vector_to_parameters(pc.Tensor.zeros(queue, shape), ours.parameters())
    with pytest.raises(pc.DTypeError, match="expected vec to be a pc.Tensor or tp.Node, got "
                                            "ndarray"):
        vector_to_parameters(np.zeros(32, np.float32), ours.parameters())
    with pytest.raises(pc.ShapeError, match="parameters_to_vector: no parameters given"):
        parameters_to_vector([])
    with pytest.raises(pc.DTypeError, match="expected Parameters"):
        parameters_to_vector([np.zeros(3)])
