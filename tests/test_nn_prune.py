"""pc.nn.utils.prune as torch.nn.utils.prune: masks, originals and state-dict keys equal
PyTorch's for l1_unstructured, ln_structured (n = 1, 2, inf; dims 0 and 1), repeated pruning
through a PruningContainer, global_unstructured over several layers and custom_from_mask;
outputs and gradients of a pruned layer equal PyTorch's; remove leaves a plain Parameter;
random pruning prunes the asked-for count from the seeded generator; bad amounts refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as torch_prune

import parcl as pc
import parcl.tape as tp
from parcl.errors import ShapeError

prune = pc.nn.utils.prune


def twins(make, make_torch):
    layer, torch_layer = make(), make_torch()
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    return layer, torch_layer


def assert_same_state(layer, torch_layer):
    state, torch_state = layer.state_dict(), torch_layer.state_dict()
    assert list(state) == list(torch_state)
    for k, v in torch_state.items():
        np.testing.assert_array_equal(state[k], v.numpy(), err_msg=k)
    assert type(layer).__name__ == type(torch_layer).__name__


def linears():
    return twins(lambda: pc.nn.Linear(6, 5), lambda: torch.nn.Linear(6, 5))


def convs():
    return twins(lambda: pc.nn.Conv2d(4, 6, 3), lambda: torch.nn.Conv2d(4, 6, 3))


@pytest.mark.parametrize("steps", [
    [("l1_unstructured", {"amount": 0.3})],
    [("l1_unstructured", {"amount": 0.3}), ("l1_unstructured", {"amount": 4})],
    [("ln_structured", {"amount": 0.4, "n": 2, "dim": 0}),
     ("l1_unstructured", {"amount": 0.5})],
    [("l1_unstructured", {"amount": 7}), ("ln_structured", {"amount": 2, "n": 1, "dim": 1})],
])
def test_pruning_a_linear_layer_equals_pytorchs_as_pytorch(steps):
    layer, torch_layer = linears()
    for fn, kwargs in steps:
        getattr(prune, fn)(layer, "weight", **kwargs)
        getattr(torch_prune, fn)(torch_layer, "weight", **kwargs)
        assert_same_state(layer, torch_layer)
    np.testing.assert_array_equal(layer.weight.value.to_host(),
                                  torch_layer.weight.detach().numpy())
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    with tp.Tape() as tape:
        y = layer(tp.tensor(x))
        loss = tp.sum(y * y)
    tape.backward(loss)
    ty = torch_layer(torch.tensor(x))
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.value.to_host(), ty.detach().numpy(), atol=1e-6)
    assert [n for n, _ in layer.named_parameters()] == ["bias", "weight_orig"]
    for p, t in zip(layer.parameters(), torch_layer.parameters()):
        np.testing.assert_allclose(p.grad.to_host(), t.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, float("inf")])
def test_ln_structured_on_a_convolution_equals_pytorchs_as_pytorch(n):
    layer, torch_layer = convs()
    prune.ln_structured(layer, "weight", amount=2, n=n, dim=1)
    torch_prune.ln_structured(torch_layer, "weight", amount=2, n=n, dim=1)
    prune.ln_structured(layer, "weight", amount=0.5, n=n, dim=0)       # among what is left
    torch_prune.ln_structured(torch_layer, "weight", amount=0.5, n=n, dim=0)
    assert_same_state(layer, torch_layer)
    kept = layer.weight_mask.to_host().sum(axis=(2, 3)) > 0
    assert kept.sum(axis=0).tolist().count(0) == 2 and kept.any(axis=1).sum() == 3


def test_global_unstructured_prunes_across_layers_as_pytorch():
    pairs = [linears() for _ in range(2)] + [convs()]
    prune.l1_unstructured(pairs[0][0], "weight", amount=5)
    torch_prune.l1_unstructured(pairs[0][1], "weight", amount=5)
    prune.global_unstructured([(m, "weight") for m, _ in pairs], prune.L1Unstructured,
                              amount=0.5)
    torch_prune.global_unstructured([(t, "weight") for _, t in pairs],
                                    torch_prune.L1Unstructured, amount=0.5)
    for layer, torch_layer in pairs:
        assert_same_state(layer, torch_layer)


def test_custom_from_mask_and_remove_as_pytorch():
    layer, torch_layer = linears()
    mask = (np.arange(5) % 2).astype(np.float32)
    prune.custom_from_mask(layer, "bias", mask)
    torch_prune.custom_from_mask(torch_layer, "bias", torch.tensor(mask))
    prune.l1_unstructured(layer, "weight", amount=0.5)
    torch_prune.l1_unstructured(torch_layer, "weight", amount=0.5)
    assert_same_state(layer, torch_layer)
    assert prune.is_pruned(layer) and torch_prune.is_pruned(torch_layer)
    orig = layer.weight_orig
    prune.remove(layer, "weight")
    torch_prune.remove(torch_layer, "weight")
    assert layer.weight is orig and isinstance(layer.weight, pc.nn.Parameter)
    assert_same_state(layer, torch_layer)
    prune.remove(layer, "bias")
    torch_prune.remove(torch_layer, "bias")
    assert type(layer) is pc.nn.Linear and not prune.is_pruned(layer)
    assert_same_state(layer, torch_layer)


def test_random_pruning_prunes_the_count_asked_from_the_seeded_generator():
    def pruned(seed):
        pc.nn.manual_seed(seed)
        layer = pc.nn.Conv2d(4, 6, 3)
        prune.random_unstructured(layer, "bias", amount=0.5)
        prune.random_structured(layer, "weight", amount=1, dim=1)
        return layer.bias_mask.to_host(), layer.weight_mask.to_host()

    bias_mask, weight_mask = pruned(0)
    assert bias_mask.sum() == 3
    assert (weight_mask.sum(axis=(0, 2, 3)) == 0).sum() == 1
    for a, b in zip(pruned(0), pruned(0)):
        np.testing.assert_array_equal(a, b)


def test_an_optimizer_steps_the_original_and_pruned_entries_stay_zero():
    layer = prune.l1_unstructured(pc.nn.Linear(4, 3), "weight", amount=6)
    opt = pc.optim.SGD(layer.parameters(), lr=0.5)
    with tp.Tape() as tape:
        loss = tp.sum(layer(tp.tensor(np.ones((2, 4), np.float32))))
    tape.backward(loss)
    opt.step()
    mask = layer.weight_mask.to_host()
    assert (layer.weight.value.to_host()[mask == 0] == 0).all()
    assert (layer.weight_orig.grad.to_host()[mask == 0] == 0).all()


def test_pruning_refuses_bad_arguments():
    layer = pc.nn.Linear(4, 3)
    with pytest.raises(prune.PruningError, match="amount"):
        prune.l1_unstructured(layer, "weight", amount=1.5)
    with pytest.raises(prune.PruningError, match="more than the 12"):
        prune.l1_unstructured(layer, "weight", amount=13)
    with pytest.raises(ShapeError, match="2 or more dims"):
        prune.ln_structured(layer, "bias", amount=1, n=2, dim=0)
    with pytest.raises(prune.PruningError, match="has to be pruned"):
        prune.remove(layer, "weight")
    with pytest.raises(prune.PruningError, match="no parameter 'kernel'"):
        prune.identity(layer, "kernel")
