"""RMSprop and Adagrad step for step against torch.optim in float64 (to float32's precision),
their state under PyTorch's names (a PyTorch optimizer's state maps over), frozen parameters
skipped, state dicts and checkpoints that continue a run bit for bit, captured data-parallel
steps that replay the eager ones bit for bit, and refused options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.optim import Adagrad, OptimizerError, RMSprop
from parcl.replica import ReplicaGroup

SHAPES = [(7,), (33, 5), (1,), (257,)]
STEPS = 10

RMSPROP_CASES = [{}, {"momentum": 0.9}, {"centered": True},
                 {"lr": 3e-3, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1, "momentum": 0.5,
                  "centered": True}]
ADAGRAD_CASES = [{}, {"lr": 0.1, "lr_decay": 0.1, "weight_decay": 0.05,
                      "initial_accumulator_value": 0.3, "eps": 1e-6}]


def hosts_and_grads(seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    hosts = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(steps)]
    return hosts, grads


def run(queue, params, opt, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = pc.Tensor.from_host(queue, g)
        opt.step()
        opt.zero_grad()


def run_torch(params, opt, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()


def torch_params(hosts):
    return [torch.nn.Parameter(torch.tensor(h, dtype=torch.float64)) for h in hosts]


def assert_like_torch(params, state, t_params, t_state):
    for p, t in zip(params, t_params):
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=2e-5, atol=2e-6)
    assert sorted(state) == sorted(t_state)
    for i, entry in state.items():
        assert sorted(entry) == sorted(t_state[i])            # PyTorch's state names
        for name, value in entry.items():
            want = t_state[i][name]
            if name == "step":
                assert value == int(want)
            else:
                np.testing.assert_allclose(value, want.numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("cls, t_cls, options", [
    *[(RMSprop, torch.optim.RMSprop, o) for o in RMSPROP_CASES],
    *[(Adagrad, torch.optim.Adagrad, o) for o in ADAGRAD_CASES]],
    ids=lambda v: v.__name__ if isinstance(v, type) else repr(v))
def test_ten_steps_equal_pytorchs_in_float64(queue, cls, t_cls, options):
    hosts, grads = hosts_and_grads()
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    opt = cls(params, **options)
    t_params = torch_params(hosts)
    t_opt = t_cls(t_params, **options)
    run(queue, params, opt, grads)
    run_torch(t_params, t_opt, grads)
    assert_like_torch(params, opt.state_dict()["state"], t_params, t_opt.state_dict()["state"])


def test_defaults_are_pytorchs():
    for cls, t_cls in ((RMSprop, torch.optim.RMSprop), (Adagrad, torch.optim.Adagrad)):
        ours = cls([torch_free_param()]).defaults
        theirs = t_cls([torch.nn.Parameter(torch.zeros(1))]).defaults
        assert ours == {k: theirs[k] for k in ours}


def torch_free_param():
    return pc.nn.Parameter.from_host(pc.default_queue(), np.zeros(1, np.float32))


@pytest.mark.parametrize("cls, t_cls, options", [
    (RMSprop, torch.optim.RMSprop, RMSPROP_CASES[-1]),
    (Adagrad, torch.optim.Adagrad, ADAGRAD_CASES[-1])], ids=["RMSprop", "Adagrad"])
def test_a_pytorch_state_maps_over_and_goes_on_alike(queue, cls, t_cls, options):
    """Five steps in PyTorch, its state (tensors, the 0-d step) loaded into parcl's optimizer
    with the same groups, five more steps in each."""
    hosts, grads = hosts_and_grads()
    t_params = torch_params(hosts)
    t_opt = t_cls(t_params, **options)
    run_torch(t_params, t_opt, grads[:5])
    params = [pc.nn.Parameter.from_host(queue, t.detach().numpy().astype(np.float32))
              for t in t_params]
    opt = cls(params, **options)
    sd = opt.state_dict()
    sd["state"] = {i: {k: v.numpy() if v.dim() else v for k, v in entry.items()}
                   for i, entry in t_opt.state_dict()["state"].items()}
    opt.load_state_dict(sd)
    run(queue, params, opt, grads[5:])
    run_torch(t_params, t_opt, grads[5:])
    assert_like_torch(params, opt.state_dict()["state"], t_params, t_opt.state_dict()["state"])


@pytest.mark.parametrize("cls", [RMSprop, Adagrad])
def test_a_frozen_parameter_is_skipped(queue, cls):
    hosts, grads = hosts_and_grads(steps=3)
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    params[1].requires_grad = False
    opt = cls(params, lr=0.1, **({"momentum": 0.9} if cls is RMSprop else {}))
    for step_grads in grads:
        for i, (p, g) in enumerate(zip(params, step_grads)):
            p.grad = None if i == 1 else pc.Tensor.from_host(queue, g)
        opt.step()
    assert sorted(opt.state_dict()["state"]) == [0, 2, 3]
    np.testing.assert_array_equal(params[1].value.to_host(), hosts[1])


MAKERS = [lambda ps: RMSprop(ps, lr=0.01, momentum=0.9, centered=True, weight_decay=0.01),
          lambda ps: Adagrad(ps, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)]


@pytest.mark.parametrize("make", MAKERS, ids=["RMSprop", "Adagrad"])
def test_a_checkpoint_continues_the_run_bit_for_bit(queue, tmp_path, make):
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(6, 4, queue=queue)
    opt = make(list(model.parameters()))
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 4, 5))
               for _ in range(6)]

    def train(m, o, part):
        for x, y in part:
            with tp.Tape() as tape:
                loss = tp.cross_entropy(m(tp.tensor(x)), pc.Tensor.from_host(queue, y))
            tape.backward(loss)
            o.step()
            o.zero_grad()

    train(model, opt, batches[:3])
    path = tmp_path / "ckpt.safetensors"
    pc.save(path, model, opt, step=3)
    train(model, opt, batches[3:])

    pc.nn.manual_seed(5)
    fresh = pc.nn.Linear(6, 4, queue=queue)
    fresh_opt = make(list(fresh.parameters()))
    assert pc.load(path, fresh, fresh_opt)["step"] == 3
    train(fresh, fresh_opt, batches[3:])
    for a, b in zip(model.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())
    want, got = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert sorted(want) == sorted(got)
    for i in want:
        assert sorted(want[i]) == sorted(got[i])
        for k in want[i]:
            np.testing.assert_array_equal(want[i][k], got[i][k])


def test_a_state_of_the_other_rule_is_refused_unchanged(queue):
    hosts, grads = hosts_and_grads(steps=2)
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    rms, ada = RMSprop(params), Adagrad(params)
    run(queue, params, ada, grads)
    before = rms.state_dict()
    with pytest.raises(OptimizerError, match="options"):
        rms.load_state_dict(ada.state_dict())
    sd = rms.state_dict()
    sd["state"] = ada.state_dict()["state"]
    with pytest.raises(OptimizerError, match="square_avg"):
        rms.load_state_dict(sd)
    assert rms.state_dict() == before


@pytest.mark.parametrize("build, fragment", [
    (lambda ps: RMSprop(ps, lr=-1.0), "invalid lr"),
    (lambda ps: RMSprop(ps, alpha=-0.5), "invalid alpha"),
    (lambda ps: RMSprop(ps, eps=-1e-8), "invalid eps"),
    (lambda ps: RMSprop(ps, momentum=-0.9), "invalid momentum"),
    (lambda ps: RMSprop(ps, weight_decay=float("nan")), "invalid weight_decay"),
    (lambda ps: RMSprop(ps, centered=1), "expected a bool"),
    (lambda ps: Adagrad(ps, lr_decay=-0.1), "invalid lr_decay"),
    (lambda ps: Adagrad(ps, initial_accumulator_value=-1), "invalid initial_accumulator_value"),
    (lambda ps: Adagrad(ps, eps="tiny"), "eps must be a number"),
])
def test_bad_options_are_refused(queue, build, fragment):
    with pytest.raises(OptimizerError, match=fragment):
        build([pc.nn.Parameter.from_host(queue, np.zeros(3, np.float32))])


# -- data-parallel steps, captured and eager (two devices) -------------------------------------
def mlp(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(64, 32, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 10, queue=queue))


def train_group(devices, capture, make, batches):
    with ReplicaGroup(mlp, devices, capture=capture) as group:
        opt = make(group.parameters())
        losses = [group.step(x, y, tp.cross_entropy, opt) for x, y in batches]
        params = [p.value.to_host() for p in group.parameters()]
        state = opt.state_dict()["state"]
        replays = [s.replays for per_replica in group.captured_steps for s in per_replica]
    return losses, params, state, replays


@pytest.mark.parametrize("make", MAKERS, ids=["RMSprop", "Adagrad"])
def test_captured_steps_replay_the_eager_ones_bit_for_bit(devices2, make):
    rng = np.random.default_rng(0)
    batches = [(rng.random((12, 64), dtype=np.float32), rng.integers(0, 10, 12))
               for _ in range(4)]
    eager = train_group(devices2, False, make, batches)
    replayed = train_group(devices2, True, make, batches)
    assert eager[0] == replayed[0]
    for a, b in zip(eager[1], replayed[1]):
        np.testing.assert_array_equal(a, b)
    for i, entry in eager[2].items():
        for k, v in entry.items():
            np.testing.assert_array_equal(v, replayed[2][i][k])
    assert replayed[3] and all(r == 3 for r in replayed[3])
