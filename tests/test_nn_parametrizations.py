"""pc.nn.utils.parametrizations.weight_norm / spectral_norm and pc.nn.utils.parametrize, as
torch.nn.utils's parametrization API: PyTorch's state-dict keys and class names, originals
equal to PyTorch's, outputs and every gradient equal to PyTorch's (Linear and Conv2d, dim 0,
1 and None; spectral norm over three training reads with the same u and v), gradients that
pass tp.gradcheck, an optimizer step through the originals, assignment through right_inverse,
removal, and refused arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.prune  # noqa: F401 - torch.nn.utils.prune, imported for the combinations
from torch.nn.utils import parametrizations as torch_parametrizations

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl.errors import ShapeError
from parcl.replica import ReplicaGroup
from parcl.testing import seeded

P = pc.nn.utils.parametrizations
parametrize = pc.nn.utils.parametrize


def twins(make, make_torch):
    layer, torch_layer = make(), make_torch()
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    return layer, torch_layer


def forward_backward(layer, torch_layer, x):
    with tp.Tape() as tape:
        y = layer(tp.tensor(x))
        loss = tp.sum(y * y)
    tape.backward(loss)
    ty = torch_layer(torch.tensor(x))
    (ty * ty).sum().backward()
    return y.value.to_host(), ty.detach().numpy()


def assert_grads_like_torch(layer, torch_layer, atol=5e-6):
    names = [n for n, _ in layer.named_parameters()]
    assert names == [n for n, _ in torch_layer.named_parameters()]
    for (name, p), (_, t) in zip(layer.named_parameters(), torch_layer.named_parameters()):
        np.testing.assert_allclose(p.grad.to_host(), t.grad.numpy(), rtol=2e-6, atol=atol,
                                   err_msg=name)


@pytest.mark.parametrize("make, make_torch, shape, dim, g_shape", [
    (lambda: pc.nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4), (5, 3), 0, (4, 1)),
    (lambda: pc.nn.Conv2d(2, 4, 3), lambda: torch.nn.Conv2d(2, 4, 3), (2, 2, 5, 5), 1,
     (1, 2, 1, 1)),
    (lambda: pc.nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4), (5, 3), None, ()),
    (lambda: pc.nn.Conv2d(2, 4, 3), lambda: torch.nn.Conv2d(2, 4, 3), (2, 2, 5, 5), -2,
     (1, 1, 3, 1)),
])
def test_weight_norm_equals_pytorchs_forward_and_gradients_as_pytorch(make, make_torch, shape,
                                                                      dim, g_shape):
    layer, torch_layer = twins(make, make_torch)
    weight = layer.weight.value.to_host()
    P.weight_norm(layer, dim=dim)
    torch_parametrizations.weight_norm(torch_layer, dim=dim)
    assert type(layer).__name__ == type(torch_layer).__name__
    assert type(layer).__name__ == f"Parametrized{make().__class__.__name__}"
    state, torch_state = layer.state_dict(), torch_layer.state_dict()
    assert list(state) == list(torch_state)
    for k, v in torch_state.items():
        np.testing.assert_allclose(state[k], v.numpy(), rtol=1e-6, err_msg=k)
    assert layer.parametrizations.weight.original0.shape == g_shape
    np.testing.assert_allclose(layer.weight.value.to_host(), weight, rtol=1e-6, atol=1e-7)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got, want = forward_backward(layer, torch_layer, x)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert_grads_like_torch(layer, torch_layer)


def test_weight_norm_gradients_pass_gradcheck():
    layer = P.weight_norm(pc.nn.Linear(3, 2))
    x = tp.tensor(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32))
    g, v = layer.parametrizations.weight.original0, layer.parametrizations.weight.original1
    assert tp.gradcheck(lambda g, v: layer(x), [g, v])


def test_spectral_norm_equals_pytorchs_over_training_reads_as_pytorch():
    layer, torch_layer = twins(lambda: pc.nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4))
    P.spectral_norm(layer)
    torch_parametrizations.spectral_norm(torch_layer)
    state = layer.state_dict()
    assert list(state) == list(torch_layer.state_dict()) == [
        "bias", "parametrizations.weight.original", "parametrizations.weight.0._u",
        "parametrizations.weight.0._v"]
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in state.items()})  # same u, v
    rng = np.random.default_rng(2)
    for _ in range(3):                # each read in training takes one power-iteration step
        layer.zero_grad()
        torch_layer.zero_grad()
        got, want = forward_backward(layer, torch_layer, rng.standard_normal((5, 3)).astype(
            np.float32))
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert_grads_like_torch(layer, torch_layer)
    np.testing.assert_allclose(layer.state_dict()["parametrizations.weight.0._u"],
                               torch_layer.parametrizations.weight[0]._u.numpy(), atol=1e-6)


def test_spectral_norm_makes_the_largest_singular_value_one_as_pytorch():
    pc.nn.manual_seed(0)
    conv = P.spectral_norm(pc.nn.Conv2d(3, 5, 3), n_power_iterations=5)
    for _ in range(10):                      # training reads: 5 more power-iteration steps each
        _ = conv.weight
    conv.eval()
    w = conv.weight.value.to_host().reshape(5, -1)
    assert np.linalg.svd(w, compute_uv=False)[0] == pytest.approx(1.0, abs=1e-4)
    deconv = P.spectral_norm(pc.nn.ConvTranspose2d(3, 4, 2))    # dim 1, as PyTorch's
    assert deconv.parametrizations.weight[0].dim == 1
    assert deconv.state_dict()["parametrizations.weight.0._u"].shape == (4,)


def test_spectral_norm_gradients_pass_gradcheck_in_evaluation():
    layer = P.spectral_norm(pc.nn.Linear(3, 2)).eval()       # u and v fixed: a function
    x = tp.tensor(np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32))
    assert tp.gradcheck(lambda w: layer(x), [layer.parametrizations.weight.original])


def test_an_optimizer_steps_the_originals_and_assignment_goes_through_right_inverse():
    pc.nn.manual_seed(0)
    layer = P.weight_norm(pc.nn.Linear(3, 2))
    opt = pc.optim.SGD(layer.parameters(), lr=0.1)
    before = layer.parametrizations.weight.original0.value.to_host()
    with tp.Tape() as tape:
        loss = tp.sum(layer(tp.tensor(np.ones((1, 3), np.float32))))
    tape.backward(loss)
    opt.step()
    assert not np.array_equal(layer.parametrizations.weight.original0.value.to_host(), before)
    target = np.array([[3.0, 0.0, 4.0], [0.0, 1.0, 0.0]], np.float32)
    layer.weight = pc.Tensor.from_host(layer.bias.value.queue, target)
    np.testing.assert_array_equal(layer.parametrizations.weight.original0.value.to_host(),
                                  [[5.0], [1.0]])
    np.testing.assert_allclose(layer.weight.value.to_host(), target, atol=1e-6)


def test_remove_parametrizations_leaves_a_plain_parameter_as_pytorch():
    layer = P.weight_norm(pc.nn.Linear(3, 2))
    value = layer.weight.value.to_host()
    assert parametrize.is_parametrized(layer, "weight")
    parametrize.remove_parametrizations(layer, "weight")
    assert type(layer) is pc.nn.Linear and not parametrize.is_parametrized(layer)
    assert isinstance(layer.weight, pc.nn.Parameter)
    assert list(layer.state_dict()) == ["bias", "weight"]             # PyTorch's order too
    np.testing.assert_array_equal(layer.weight.value.to_host(), value)


def test_parametrizations_refuse_bad_arguments():
    with pytest.raises(pc.ParclError, match="no parameter 'kernel'"):
        P.weight_norm(pc.nn.Linear(3, 2), name="kernel")
    with pytest.raises(ShapeError, match="dim 2 is out of range"):
        P.weight_norm(pc.nn.Linear(3, 2), dim=2)
    with pytest.raises(pc.ParclError, match="n_power_iterations"):
        P.spectral_norm(pc.nn.Linear(3, 2), n_power_iterations=0)
    with pytest.raises(pc.ParclError, match="no parametrization"):
        parametrize.remove_parametrizations(pc.nn.Linear(3, 2), "weight")


def parametrized_mlp(queue):
    return pc.nn.Sequential(P.weight_norm(pc.nn.Linear(64, 32, queue=queue)), pc.nn.ReLU(),
                            P.spectral_norm(pc.nn.Linear(32, 10, queue=queue)))


def test_a_group_step_over_parametrized_layers_equals_one_replica_on_the_full_batch(devices2):
    """Every replica's layers share one Parametrized class (a ReplicaGroup checks the
    replicas' classes), and the step reaches the originals as one replica's does."""
    assert type(P.weight_norm(pc.nn.Linear(2, 2))) is type(P.weight_norm(pc.nn.Linear(3, 2)))
    rng = np.random.default_rng(0)
    batches = [(rng.random((12, 64), dtype=np.float32), rng.integers(0, 10, 12))
               for _ in range(3)]
    queue = pc.new_queue(devices2[0])
    single = seeded(parametrized_mlp)(queue)
    opt = pc.optim.SGD(list(single.parameters()), lr=0.1)
    for x, y in batches:
        with tp.Tape() as tape:
            loss = tp.cross_entropy(single(tp.tensor(pc.Tensor.from_host(queue, x))),
                                    pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
    with ReplicaGroup(seeded(parametrized_mlp), devices2) as group:
        group_opt = pc.optim.SGD(group.parameters(), lr=0.1)
        for x, y in batches:
            group.step(x, y, tp.cross_entropy, group_opt)
        for r in group.replicas:
            for k, v in single.state_dict().items():
                np.testing.assert_allclose(r.model.state_dict()[k], v, atol=1e-6, err_msg=k)


# -- the older API: weight_g and weight_v on the module itself ------------------------------
@pytest.mark.parametrize("make, make_torch, shape, dim", [
    (lambda: pc.nn.Conv1d(2, 3, 2), lambda: torch.nn.Conv1d(2, 3, 2), (2, 2, 5), 0),
    (lambda: pc.nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4), (5, 3), None),
    (lambda: pc.nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4), (5, 3), 1),
])
def test_the_older_weight_norm_equals_pytorchs_and_is_removed_as_pytorch(make, make_torch,
                                                                         shape, dim):
    layer, torch_layer = twins(make, make_torch)
    with pytest.warns(FutureWarning, match="deprecated"):
        pc.nn.utils.weight_norm(layer, dim=dim)
    with pytest.warns(FutureWarning):
        torch.nn.utils.weight_norm(torch_layer, dim=dim)
    assert type(layer).__name__ == type(torch_layer).__name__       # PyTorch keeps its class
    state, torch_state = layer.state_dict(), torch_layer.state_dict()
    assert list(state) == list(torch_state) and "weight_g" in state
    for k, v in torch_state.items():
        np.testing.assert_array_equal(state[k], v.numpy(), err_msg=k)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    got, want = forward_backward(layer, torch_layer, x)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert_grads_like_torch(layer, torch_layer)
    pc.nn.utils.remove_weight_norm(layer)
    torch.nn.utils.remove_weight_norm(torch_layer)
    assert type(layer) is type(make()) and list(layer.state_dict()) == list(
        torch_layer.state_dict())
    np.testing.assert_allclose(layer.weight.value.to_host(), torch_layer.weight.detach().numpy(),
                               atol=1e-7)


def test_the_older_weight_norm_passes_gradcheck_and_refuses_bad_arguments():
    with pytest.warns(FutureWarning):
        layer = pc.nn.utils.weight_norm(pc.nn.Linear(3, 2))
    x = tp.tensor(np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32))
    assert tp.gradcheck(lambda g, v: layer(x), [layer.weight_g, layer.weight_v])
    with pytest.raises(pc.ParclError, match="already"), pytest.warns(FutureWarning):
        pc.nn.utils.weight_norm(layer)
    with pytest.raises(pc.ParclError, match="not found"):
        pc.nn.utils.remove_weight_norm(pc.nn.Linear(3, 2))


@pytest.mark.parametrize("make, make_torch, shape", [
    (lambda: pc.nn.Linear(3, 4), lambda: torch.nn.Linear(3, 4), (5, 3)),
    (lambda: pc.nn.Conv2d(2, 3, 2), lambda: torch.nn.Conv2d(2, 3, 2), (2, 2, 4, 4)),
])
def test_the_older_spectral_norm_equals_pytorchs_per_call_as_pytorch(make, make_torch, shape):
    layer, torch_layer = twins(make, make_torch)
    pc.nn.utils.spectral_norm(layer)
    torch.nn.utils.spectral_norm(torch_layer)
    assert type(layer).__name__ == type(torch_layer).__name__
    assert list(layer.state_dict()) == list(torch_layer.state_dict()) == [
        "bias", "weight_orig", "weight_u", "weight_v"]
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    rng = np.random.default_rng(6)
    for _ in range(3):                 # each call in training: one power-iteration step first
        layer.zero_grad()
        torch_layer.zero_grad()
        x = rng.standard_normal(shape).astype(np.float32)
        got, want = forward_backward(layer, torch_layer, x)
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert_grads_like_torch(layer, torch_layer, atol=2e-5)
        np.testing.assert_allclose(layer.weight_u.to_host(), torch_layer.weight_u.numpy(),
                                   atol=1e-6)
    pc.nn.utils.remove_spectral_norm(layer)
    torch.nn.utils.remove_spectral_norm(torch_layer)
    assert type(layer) is type(make()) and list(layer.state_dict()) == ["bias", "weight"]
    np.testing.assert_allclose(layer.weight.value.to_host(), torch_layer.weight.detach().numpy(),
                               atol=1e-6)


# -- parametrize, prune and the older norms on one module --------------------------------------
def _prune_bias(m, lib):
    lib.prune.l1_unstructured(m, "bias", 2)


def _unprune_bias(m, lib):
    lib.prune.remove(m, "bias")


def _weight_norm_weight(m, lib):
    lib.parametrizations.weight_norm(m, "weight")


def _unparametrize_weight(m, lib):
    lib.parametrize.remove_parametrizations(m, "weight")


def _old_weight_norm_weight(m, lib):
    lib.weight_norm(m, "weight")


def _remove_old_weight_norm(m, lib):
    lib.remove_weight_norm(m, "weight")


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("first, second, undo", [
    (_weight_norm_weight, _prune_bias, _unparametrize_weight),
    (_prune_bias, _weight_norm_weight, _unprune_bias),
    (_old_weight_norm_weight, _prune_bias, _remove_old_weight_norm),
    (_prune_bias, _old_weight_norm_weight, _unprune_bias),
])
def test_removing_one_of_two_reparametrizations_keeps_the_other_as_pytorch(first, second, undo):
    """Each of parametrize, prune and the older norms swaps the module's class; removing the
    first one applied used to reset the class to the plain layer's, dropping the other's
    computed attribute (the next forward raised AttributeError where PyTorch runs on)."""
    layer, torch_layer = twins(lambda: pc.nn.Linear(6, 5), lambda: torch.nn.Linear(6, 5))
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    for step in (first, second, undo):
        step(layer, pc.nn.utils)
        step(torch_layer, torch.nn.utils)
        y, ty = forward_backward(layer, torch_layer, x)
        np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-6)
        state, torch_state = layer.state_dict(), torch_layer.state_dict()
        assert list(state) == list(torch_state)
        for k, v in torch_state.items():
            np.testing.assert_allclose(state[k], v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert type(layer).__name__ == type(torch_layer).__name__


class _Symmetric(pc.nn.Module):
    def forward(self, x):
        return tp.triu(x) + tp.transpose(tp.triu(x, 1), (1, 0))


class _TorchSymmetric(torch.nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).T


def test_spectral_norm_of_a_parametrized_weight_normalises_what_it_reads_as_pytorch():
    """PyTorch's spectral_norm reads the attribute, so on a parametrized weight it is applied
    after the other parametrizations; parcl's refused it ("has no parameter 'weight'")."""
    layer, torch_layer = twins(lambda: pc.nn.Linear(5, 5), lambda: torch.nn.Linear(5, 5))
    parametrize.register_parametrization(layer, "weight", _Symmetric())
    torch.nn.utils.parametrize.register_parametrization(torch_layer, "weight", _TorchSymmetric())
    P.spectral_norm(layer)
    torch_parametrizations.spectral_norm(torch_layer)
    assert list(layer.state_dict()) == list(torch_layer.state_dict())
    # the same starting u and v (the generators differ)
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    for _ in range(3):
        y, ty = forward_backward(layer, torch_layer, x)
        np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.parametrizations.weight.original.grad.to_host(),
                               torch_layer.parametrizations.weight.original.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    w = layer.weight.value.to_host()
    np.testing.assert_allclose(w, w.T, atol=1e-7)
    np.testing.assert_allclose(np.linalg.svd(w, compute_uv=False)[0], 1.0, atol=0.05)


@pytest.mark.parametrize("api", ["parametrizations", "older"])
def test_spectral_norm_of_a_conv_transpose3d_normalises_over_its_output_channels_as_pytorch(
        api):
    """dim defaults to 1 for every transposed convolution, ConvTranspose3d's too: parcl took
    dim 0 for it, so u had in_channels entries and sigma was another matrix's (the output
    differed from PyTorch's by 0.4, silently)."""
    layer, torch_layer = twins(lambda: pc.nn.ConvTranspose3d(2, 3, 2),
                               lambda: torch.nn.ConvTranspose3d(2, 3, 2))
    if api == "parametrizations":
        P.spectral_norm(layer)
        torch_parametrizations.spectral_norm(torch_layer)
    else:
        pc.nn.utils.spectral_norm(layer)
        torch.nn.utils.spectral_norm(torch_layer)
    state = layer.state_dict()
    u = next(k for k in state if k.endswith("_u"))
    assert state[u].shape == (3,)
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3, 3)).astype(np.float32)
    for _ in range(2):
        y, ty = forward_backward(layer, torch_layer, x)
        np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_older_norms_make_new_trained_parameters_of_a_frozen_weight_as_pytorch():
    """PyTorch's weight_norm registers weight_g and weight_v as new Parameters (requiring
    grad), and both removals register a new Parameter: on a frozen layer they are trained.
    parcl's copied the frozen flag, so an SGD step left weight_g where PyTorch moved it."""
    layer, torch_layer = twins(lambda: pc.nn.Linear(3, 2), lambda: torch.nn.Linear(3, 2))
    layer.requires_grad_(False)
    torch_layer.requires_grad_(False)
    pc.nn.utils.weight_norm(layer)
    torch.nn.utils.weight_norm(torch_layer)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    g_before = layer.weight_g.value.to_host().copy()
    forward_backward(layer, torch_layer, x)
    pc.optim.SGD(layer.parameters(), lr=0.1).step()
    torch.optim.SGD([p for p in torch_layer.parameters() if p.requires_grad], lr=0.1).step()
    for k in ("weight_g", "weight_v"):
        np.testing.assert_allclose(layer.state_dict()[k], torch_layer.state_dict()[k].numpy(),
                                   rtol=1e-6, atol=1e-7, err_msg=k)
    assert not np.allclose(layer.weight_g.value.to_host(), g_before)      # it was trained
    pc.nn.utils.remove_weight_norm(layer)
    torch.nn.utils.remove_weight_norm(torch_layer)
    assert layer.weight.requires_grad is torch_layer.weight.requires_grad is True
    frozen, torch_frozen = twins(lambda: pc.nn.Linear(3, 2), lambda: torch.nn.Linear(3, 2))
    frozen.requires_grad_(False)
    torch_frozen.requires_grad_(False)
    pc.nn.utils.spectral_norm(frozen)
    torch.nn.utils.spectral_norm(torch_frozen)
    assert frozen.weight_orig.requires_grad is torch_frozen.weight_orig.requires_grad is False
    pc.nn.utils.remove_spectral_norm(frozen)
    torch.nn.utils.remove_spectral_norm(torch_frozen)
    assert frozen.weight.requires_grad is torch_frozen.weight.requires_grad is True


@pytest.mark.parametrize("legacy", [False, True])
def test_spectral_norm_under_checkpoint_runs_its_power_iteration_once_as_without(queue, legacy):
    """tp.checkpoint's recomputation ran the power iteration again, moving u and v in place,
    so the backward differentiated a weight scaled by another sigma than the forward's (the
    legacy hook's input gradient 0.55 off) and u advanced twice per step."""
    import warnings

    from parcl.nn.utils import parametrizations

    def run(checkpointed):
        pc.nn.manual_seed(0)
        lin = pc.nn.Linear(6, 5, queue=queue)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (pc.nn.utils.spectral_norm if legacy else parametrizations.spectral_norm)(lin)
        x = leaf(queue, np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32))
        with tp.Tape() as tape:
            loss = tp.sum(tp.checkpoint(lin, x) if checkpointed else lin(x))
        tape.backward(loss)
        u = lin.weight_u if legacy else lin.parametrizations.weight[0]._u
        return x.grad.to_host(), u.to_host()

    (g0, u0), (g1, u1) = run(False), run(True)
    np.testing.assert_allclose(g1, g0, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(u1, u0)
