"""State dicts saved by ``torch.optim`` (tensors converted to numpy) load into parcl's ``Adam``,
``AdamW``, ``SGD``, ``RMSprop`` and ``Adagrad`` and the next steps continue as PyTorch's;
PyTorch's extra group options (``foreach``, ``fused``, ``capturable``, ``maximize``,
``amsgrad``, ``dampening``, ...) are accepted, in the constructors too, where their value is
what parcl does, and refused otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.optim import OptimizerError

RULES = [("Adam", dict(lr=1e-2, weight_decay=0.1)),
         ("AdamW", dict(lr=1e-2, betas=(0.8, 0.99))),
         ("Adam", dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
         ("AdamW", dict(lr=1e-2, amsgrad=True)),
         ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
         ("RMSprop", dict(lr=1e-2, momentum=0.5, centered=True)),
         ("Adagrad", dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.2))]


def as_numpy(state_dict):
    """A torch optimizer state dict with every tensor a numpy array (what a checkpoint
    converted for parcl holds)."""
    return {"state": {k: {n: (v.numpy() if isinstance(v, torch.Tensor) else v)
                          for n, v in entry.items()}
                      for k, entry in state_dict["state"].items()},
            "param_groups": [dict(g) for g in state_dict["param_groups"]]}


@pytest.mark.parametrize("rule,kw", RULES, ids=[r + ("_amsgrad" if kw.get("amsgrad") else "")
                                                for r, kw in RULES])
def test_a_torch_optimizer_state_loads_and_steps_on_as_pytorch(queue, rng, rule, kw):
    shapes = [(3, 2), (2,)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4)]
    theirs = [torch.nn.Parameter(torch.tensor(v)) for v in values]
    topt = getattr(torch.optim, rule)(theirs, **kw)
    for g in grads[:3]:
        for p, gi in zip(theirs, g):
            p.grad = torch.tensor(gi)
        topt.step()
    ours = [tp.tensor(pc.Tensor.from_host(queue, p.detach().numpy()), requires_grad=True)
            for p in theirs]
    opt = getattr(pc.optim, rule)(ours, **kw)
    opt.load_state_dict(as_numpy(topt.state_dict()))
    for p, gi in zip(theirs, grads[3]):
        p.grad = torch.tensor(gi)
    topt.step()
    for p, gi in zip(ours, grads[3]):
        p.grad = pc.Tensor.from_host(queue, gi)
    opt.step()
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("rule,option,value", [
    ("Adam", "maximize", True), ("AdamW", "maximize", True), ("SGD", "dampening", 0.5),
    ("RMSprop", "differentiable", True), ("Adagrad", "maximize", True)])
def test_a_torch_option_parcl_does_not_do_is_refused_by_name(queue, rule, option, value):
    p = tp.tensor(pc.Tensor.from_host(queue, np.ones(2, np.float32)), requires_grad=True)
    kw = {"lr": 0.1}
    t = torch.nn.Parameter(torch.ones(2))
    saved = as_numpy(getattr(torch.optim, rule)([t], **kw, **{option: value}).state_dict())
    opt = getattr(pc.optim, rule)([p], **kw)
    with pytest.raises(OptimizerError, match=rf"load_state_dict: param_groups\[0\] has "
                                             rf"PyTorch's {option}={value!r}, which {rule} "
                                             r"does not do"):
        opt.load_state_dict(saved)
    with pytest.raises(OptimizerError, match=rf"{rule} has PyTorch's {option}={value!r}"):
        getattr(pc.optim, rule)([p], **kw, **{option: value})


def test_constructors_take_torchs_arguments_with_the_values_parcl_does(queue):
    p = tp.tensor(pc.Tensor.from_host(queue, np.ones(2, np.float32)), requires_grad=True)
    pc.optim.AdamW([p], 1e-3, (0.9, 0.999), 1e-8, 0.01, False, foreach=True, fused=False,
                   capturable=True)
    pc.optim.Adam([p], amsgrad=False, maximize=False, differentiable=False)
    pc.optim.SGD([p], lr=0.1, dampening=0, foreach=False)
    pc.optim.RMSprop([p], 0.01, 0.99, 1e-8, 0.0, 0.0, False, False, None)
    pc.optim.Adagrad([p], 0.01, 0.0, 0.0, 0.0, 1e-10, None, fused=None)
    # the state dict keeps parcl's options only (amsgrad is one of Adam's)
    assert "foreach" not in pc.optim.Adam([p], foreach=True).state_dict()["param_groups"][0]


@pytest.mark.parametrize("rule", ["Adam", "AdamW"])
def test_amsgrad_steps_as_pytorch_from_the_first_step(queue, rng, rule):
    # gradients that shrink, so the largest exp_avg_sq so far is not the current one
    value = rng.standard_normal((4, 3)).astype(np.float32)
    grads = [rng.standard_normal((4, 3)).astype(np.float32) * s for s in (3, 2, 1, 0.5, 0.1)]
    theirs = torch.nn.Parameter(torch.tensor(value))
    ours = tp.tensor(pc.Tensor.from_host(queue, value), requires_grad=True)
    topt = getattr(torch.optim, rule)([theirs], lr=0.05, betas=(0.5, 0.9), amsgrad=True,
                                      weight_decay=0.1)
    opt = getattr(pc.optim, rule)([ours], lr=0.05, betas=(0.5, 0.9), amsgrad=True,
                                  weight_decay=0.1)
    for g in grads:
        theirs.grad = torch.tensor(g)
        topt.step()
        ours.grad = pc.Tensor.from_host(queue, g)
        opt.step()
    np.testing.assert_allclose(ours.value.to_host(), theirs.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(opt.state_dict()["state"][0]["max_exp_avg_sq"],
                               topt.state_dict()["state"][0]["max_exp_avg_sq"].numpy(),
                               rtol=1e-5)
    assert opt.state_dict()["param_groups"][0]["amsgrad"] is True


def test_a_state_saved_without_amsgrad_loads_as_amsgrad_off(queue):
    p = tp.tensor(pc.Tensor.from_host(queue, np.ones(2, np.float32)), requires_grad=True)
    opt = pc.optim.AdamW([p], amsgrad=True)
    saved = opt.state_dict()
    del saved["param_groups"][0]["amsgrad"]
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["amsgrad"] is False


def test_amsgrad_steps_data_parallel_replicas_captured_as_eager(devices2):
    from parcl.replica import ReplicaGroup

    def mlp(queue):
        pc.nn.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Linear(16, 8, queue=queue), pc.nn.ReLU(),
                                pc.nn.Linear(8, 4, queue=queue))

    rng = np.random.default_rng(0)
    batches = [(rng.random((8, 16), dtype=np.float32), rng.integers(0, 4, 8))
               for _ in range(3)]
    results = []
    for capture in (False, True):
        with ReplicaGroup(mlp, devices2, capture=capture) as group:
            opt = pc.optim.AdamW(group.parameters(), lr=0.01, amsgrad=True)
            losses = [group.step(x, y, tp.cross_entropy, opt) for x, y in batches]
            results.append((losses, [p.value.to_host() for p in group.parameters()],
                            opt.state_dict()["state"]))
    (eager_losses, eager_params, state), (losses, params, _) = results
    assert eager_losses == losses
    for a, b in zip(eager_params, params):
        np.testing.assert_array_equal(a, b)
    assert all("max_exp_avg_sq" in entry for entry in state.values())
    assert all(np.all(entry["max_exp_avg_sq"] >= entry["exp_avg_sq"])
               for entry in state.values())


def test_sgd_takes_pytorchs_positional_order_and_default_lr(queue):
    p = tp.tensor(pc.Tensor.from_host(queue, np.ones(2, np.float32)), requires_grad=True)
    opt = pc.optim.SGD([p], 0.1, 0.9, 0, 0.01, True)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == \
        (0.1, 0.9, 0.01, True)
    assert pc.optim.SGD([p]).param_groups[0]["lr"] == torch.optim.SGD(
        [torch.nn.Parameter(torch.ones(2))]).param_groups[0]["lr"] == 1e-3


def test_adam_with_decoupled_weight_decay_is_adamw_as_pytorch(queue, rng):
    value = rng.standard_normal(3).astype(np.float32)
    runs = []
    for make in (lambda ps: pc.optim.Adam(ps, lr=0.1, weight_decay=0.5,
                                          decoupled_weight_decay=True),
                 lambda ps: pc.optim.AdamW(ps, lr=0.1, weight_decay=0.5)):
        p = tp.tensor(pc.Tensor.from_host(queue, value), requires_grad=True)
        opt = make([p])
        for _ in range(2):
            p.grad = pc.Tensor.from_host(queue, np.ones(3, np.float32))
            opt.step()
        runs.append((p.value.to_host(), opt.state_dict()["param_groups"][0]))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1]["decoupled_weight_decay"] is True
    t = torch.nn.Parameter(torch.tensor(value))
    topt = torch.optim.Adam([t], lr=0.1, weight_decay=0.5, decoupled_weight_decay=True)
    for _ in range(2):
        t.grad = torch.ones(3)
        topt.step()
    np.testing.assert_allclose(runs[0][0], t.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("rule, options, key, value, torch_weight", [
    ("SGD", {}, "maximize", True, 1.0),
    ("SGD", {"momentum": 0.9}, "dampening", 0.5, 0.52),
    ("Adam", {}, "maximize", True, 0.90526),
    ("AdamW", {"weight_decay": 0.5}, "decoupled_weight_decay", False, 0.74996),
    ("RMSprop", {}, "maximize", True, 0.70888),
    ("Adagrad", {}, "maximize", True, 0.97071)])
def test_a_pytorch_option_set_on_a_group_by_hand_is_refused_rather_than_ignored(
        queue, rule, options, key, value, torch_weight):
    """PyTorch's step reads each group's options anew, so ``group["maximize"] = True`` set by
    hand after the optimizer was made ascends from that step on. parcl's groups do not hold
    the options it does not do (a constructor or a loaded state with one is refused), and a
    step did not look: a weight of 1 with gradient 2, one step, the option set, a second step
    (lr 0.1) ended at 0.6 under SGD where PyTorch's comes back to 1.0 (maximize), 0.42 where
    PyTorch's is 0.52 (dampening 0.5 left out of the momentum), 0.8 under Adam where it is
    0.905, -0.709 under RMSprop where it is 0.709, and AdamW(weight_decay=0.5) switched to
    L2 decay ended at 0.7075 where PyTorch's is 0.74996. Now the step raises an
    OptimizerError naming the option, before anything changed."""
    def second_step(opt, p, grad):
        p.grad = grad
        opt.step()
        opt.param_groups[0][key] = value
        p.grad = grad
        opt.step()

    t = torch.nn.Parameter(torch.ones(1))
    second_step(getattr(torch.optim, rule)([t], lr=0.1, **options), t, torch.full((1,), 2.0))
    assert t.item() == pytest.approx(torch_weight, abs=1e-5)

    p = pc.nn.Parameter.from_host(queue, np.ones(1, np.float32))
    opt = getattr(pc.optim, rule)([p], lr=0.1, **options)
    with pytest.raises(OptimizerError, match=rf"{rule}.step: param_groups\[0\] has PyTorch's "
                                             rf"{key}={value!r}, which {rule} does not do"):
        second_step(opt, p, pc.Tensor.full(queue, (1,), 2.0))
    before = p.value.to_host().copy()
    with pytest.raises(OptimizerError):
        opt.step()                                   # the refused step changed nothing
    np.testing.assert_array_equal(p.value.to_host(), before)
    opt.param_groups[0][key] = {"maximize": False, "dampening": 0}.get(key, True)
    opt.step()                                       # set back to what parcl does: steps on
    assert not np.array_equal(p.value.to_host(), before)
