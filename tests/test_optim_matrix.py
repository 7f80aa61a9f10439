"""Adafactor, Muon and LBFGS as torch.optim's: 25 steps against PyTorch from the same values
and gradients (Adafactor to float32 rounding, with matrices, a 3-D tensor and vectors; Muon
against PyTorch's with its Newton-Schulz iteration in float32, as parcl runs it; LBFGS through
closures, with the fixed step and the strong-Wolfe line search, counting the same evaluations
and iterations), PyTorch's defaults and state names, state dicts that continue a run bit for
bit, and refused options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.optim._muon as torch_muon

import parcl as pc
import parcl.tape as tp
from parcl.optim import LBFGS, Adafactor, Muon, OptimizerError
from parcl.optim.rules_matrix import orthogonalize
from parcl.replica import ReplicaGroup
from parcl.testing import seeded

SHAPES = [(7,), (33, 5), (3, 4, 6), (1,), (6, 9)]
STEPS = 25


def hosts_and_grads(shapes=SHAPES, steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    hosts = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(steps)]
    return hosts, grads


def params_of(queue, hosts):
    return [pc.nn.Parameter(pc.Tensor.from_host(queue, h)) for h in hosts]


def run_both(queue, make, make_torch, hosts, grads, dtype=torch.float32):
    ps = params_of(queue, hosts)
    tps = [torch.nn.Parameter(torch.tensor(h, dtype=dtype)) for h in hosts]
    opt, topt = make(ps), make_torch(tps)
    for step_grads in grads:
        for p, t, g in zip(ps, tps, step_grads):
            p.grad = pc.Tensor.from_host(queue, g)
            t.grad = torch.tensor(g, dtype=dtype)
        opt.step()
        topt.step()
    return ps, tps, opt, topt


def assert_params_close(ps, tps, atol=1e-6):
    for p, t in zip(ps, tps):
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=0, atol=atol)


# -- Adafactor -----------------------------------------------------------------------------
def test_adafactor_defaults_are_pytorchs(queue):
    opt = Adafactor(params_of(queue, [np.ones(3, np.float32)]))
    want = torch.optim.Adafactor([torch.nn.Parameter(torch.ones(3))]).defaults
    assert {k: v for k, v in opt.defaults.items()} == {**want, "eps": (None, 1e-3)}


@pytest.mark.parametrize("options", [
    {},
    {"lr": 0.1, "weight_decay": 0.1, "d": 2.0, "beta2_decay": -0.5, "maximize": True},
    {"eps": (1e-6, 1e-2)},
])
def test_adafactor_25_steps_equal_pytorchs_as_pytorch(queue, options):
    hosts, grads = hosts_and_grads()
    ps, tps, opt, topt = run_both(queue, lambda p: Adafactor(p, **options),
                                  lambda p: torch.optim.Adafactor(p, **options), hosts, grads)
    assert_params_close(ps, tps, atol=5e-7)
    for p, t in zip(ps, tps):
        assert sorted(opt.state[p]) == sorted(topt.state[t])
        for k, v in topt.state[t].items():
            np.testing.assert_allclose(np.asarray(opt.state[p][k].to_host() if k != "step"
                                                  else opt.state[p][k]),
                                       v.numpy(), rtol=1e-5, atol=1e-9)


def test_an_adafactor_step_reads_nothing_back_and_stays_pytorchs(queue, monkeypatch):
    # the parameter's and the update's RMS stay on the device; parcl read both back for
    # every parameter at every step (10 reads a step here), stalling the queue
    hosts, grads = hosts_and_grads(steps=3)
    options = {"lr": 0.1, "weight_decay": 0.1, "d": 2.0}
    reads = []
    real = pc.Tensor.to_host
    monkeypatch.setattr(pc.Tensor, "to_host", lambda self: reads.append(1) or real(self))
    ps, tps, _, _ = run_both(queue, lambda p: Adafactor(p, **options),
                             lambda p: torch.optim.Adafactor(p, **options), hosts, grads)
    assert reads == []
    monkeypatch.undo()
    assert_params_close(ps, tps, atol=5e-7)


def test_an_adafactor_rms_that_is_nan_spoils_only_its_element_as_pytorch(queue):
    # PyTorch takes max(eps2, RMS(p)) and max(1, RMS(u) / d) with Python's max, which gives
    # the number where the RMS is NaN: one NaN gradient element (or parameter element) of a
    # vector stays in its element, and the others move as they would. parcl's device clamp
    # propagated the NaN RMS, so every element of both vectors came out NaN
    hosts = [np.float32([0.5, -1.0, 2.0, 0.25]), np.float32([np.nan, -1.0, 2.0, 0.25])]
    grads = [[np.float32([0.3, -0.2, 0.1, 0.4]), np.float32([0.3, -0.2, 0.1, 0.4])],
             [np.float32([0.1, np.nan, 0.2, -0.3]), np.float32([0.1, 0.5, 0.2, -0.3])],
             [np.float32([-0.2, 0.1, 0.3, 0.2]), np.float32([-0.2, 0.1, 0.3, 0.2])]]
    ps, tps, _, _ = run_both(queue, lambda p: Adafactor(p, lr=0.1),
                             lambda p: torch.optim.Adafactor(p, lr=0.1), hosts, grads)
    first, second = (p.value.to_host() for p in ps)
    np.testing.assert_array_equal(np.isnan(first), [False, True, False, False])
    np.testing.assert_array_equal(np.isnan(second), [True, False, False, False])
    for p, t in zip(ps, tps):
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=0, atol=1e-6)


def test_adafactor_keeps_factored_moments_for_matrices_as_pytorch(queue):
    p = params_of(queue, [np.zeros((3, 4, 6), np.float32)])[0]
    opt = Adafactor([p])
    p.grad = pc.Tensor.from_host(queue, np.full((3, 4, 6), 2.0, np.float32))
    opt.step()
    assert opt.state[p]["row_var"].shape == (3, 4, 1)
    assert opt.state[p]["col_var"].shape == (3, 1, 6)
    # first step: w = 1, so each running mean is mean(g^2) = 4 (formed as norm^2 / 6, so
    # 4.0000005 in float32, PyTorch's too); v = 4, u = g / 2 = 1 (RMS 1, unclipped) and
    # alpha = eps2 * min(lr, 1) = 1e-5 (the parameter's RMS is 0)
    np.testing.assert_array_equal(opt.state[p]["row_var"].to_host(), np.float32(4.0000005))
    np.testing.assert_allclose(p.value.to_host(), -1e-5, rtol=1e-6)


def test_adafactor_state_dict_continues_the_run_bit_for_bit(queue):
    hosts, grads = hosts_and_grads(steps=10)

    def steps(opt, ps, gs):
        for step_grads in gs:
            for p, g in zip(ps, step_grads):
                p.grad = pc.Tensor.from_host(queue, g)
            opt.step()

    ps = params_of(queue, hosts)
    opt = Adafactor(ps, lr=0.05)
    steps(opt, ps, grads[:5])
    saved, values = opt.state_dict(), [p.value.to_host() for p in ps]
    steps(opt, ps, grads[5:])
    qs = params_of(queue, values)
    again = Adafactor(qs, lr=0.05)
    again.load_state_dict(saved)
    steps(again, qs, grads[5:])
    for p, r in zip(ps, qs):
        np.testing.assert_array_equal(p.value.to_host(), r.value.to_host())


def test_adafactor_refuses_pytorchs_bad_options_and_a_misshapen_state(queue):
    ps = params_of(queue, [np.ones((2, 3), np.float32)])
    for bad in ({"beta2_decay": 0.5}, {"d": 0.5}, {"eps": (-1.0, 1e-3)}, {"eps": 1e-3}):
        with pytest.raises(OptimizerError):
            Adafactor(ps, **bad)
    opt = Adafactor(ps)
    state = {"state": {0: {"step": 1, "row_var": np.zeros((3, 1), np.float32),
                           "col_var": np.zeros((1, 3), np.float32)}},
             "param_groups": opt.state_dict()["param_groups"]}
    with pytest.raises(OptimizerError, match=r"row_var.*\(3, 1\).*\(2, 1\)"):
        opt.load_state_dict(state)


# -- Muon ----------------------------------------------------------------------------------
def newton_schulz_float32(grad, coefficients, steps, eps):
    """PyTorch's iteration, as its docs state it, in float32 instead of bfloat16."""
    a, b, c = coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.float().T if tall else grad.float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def test_muon_defaults_are_pytorchs(queue):
    opt = Muon(params_of(queue, [np.ones((2, 3), np.float32)]))
    want = torch.optim.Muon([torch.nn.Parameter(torch.ones(2, 3))]).defaults
    assert opt.defaults == want


def test_orthogonalize_brings_singular_values_near_one_as_pytorch(queue):
    g = np.random.default_rng(3).standard_normal((12, 5)).astype(np.float32)
    got = orthogonalize(pc.Tensor.from_host(queue, g)).to_host()
    want = newton_schulz_float32(torch.tensor(g), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    np.testing.assert_allclose(got, want.numpy(), atol=2e-6)
    s = np.linalg.svd(got, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5


@pytest.mark.parametrize("options", [
    {"lr": 0.02},
    {"lr": 0.05, "weight_decay": 0.0, "nesterov": False, "adjust_lr_fn": "match_rms_adamw"},
    {"momentum": 0.5, "ns_steps": 3, "ns_coefficients": (2.0, -1.5, 0.5)},
])
def test_muon_25_steps_equal_pytorchs_with_a_float32_iteration_as_pytorch(queue, monkeypatch,
                                                                          options):
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz_float32)
    hosts, grads = hosts_and_grads(shapes=[(33, 5), (6, 9), (4, 4)])
    ps, tps, opt, topt = run_both(queue, lambda p: Muon(p, **options),
                                  lambda p: torch.optim.Muon(p, **options), hosts, grads)
    assert_params_close(ps, tps, atol=2e-6)
    for p, t in zip(ps, tps):
        np.testing.assert_allclose(opt.state[p]["momentum_buffer"].to_host(),
                                   topt.state[t]["momentum_buffer"].numpy(), atol=1e-6)


def test_muon_stays_within_bfloat16_of_pytorchs_own(queue):
    hosts, grads = hosts_and_grads(shapes=[(33, 5)], steps=5)
    ps, tps, _, _ = run_both(queue, lambda p: Muon(p, lr=0.02),
                             lambda p: torch.optim.Muon(p, lr=0.02), hosts, grads)
    assert_params_close(ps, tps, atol=3e-3)


def test_muon_refuses_parameters_that_are_not_matrices_as_pytorch(queue):
    with pytest.raises(OptimizerError, match=r"2-D parameters.*\(7,\)"):
        Muon(params_of(queue, [np.ones((2, 3), np.float32), np.ones(7, np.float32)]))
    opt = Muon(params_of(queue, [np.ones((2, 3), np.float32)]))
    with pytest.raises(OptimizerError, match="2-D"):
        opt.add_param_group({"params": params_of(queue, [np.ones((1, 2, 3), np.float32)])})
    with pytest.raises(OptimizerError, match="adjust_lr_fn"):
        Muon(opt.param_groups[0]["params"], adjust_lr_fn="other")


# -- LBFGS ---------------------------------------------------------------------------------
START = np.array([-1.5, 2.0, -0.5, 1.2], np.float32)


def rosenbrock_closures(queue, opt_of):
    """(parcl parameter, optimizer, closure) and PyTorch's, on the 4-D Rosenbrock function."""
    x = pc.nn.Parameter(pc.Tensor.from_host(queue, START))
    tx = torch.nn.Parameter(torch.tensor(START))
    opt, topt = opt_of(x, tx)

    def closure():
        opt.zero_grad()
        with tp.Tape() as tape:
            a, b = tp.narrow(x, 0, 0, 3), tp.narrow(x, 0, 1, 3)
            loss = tp.sum(100 * (b - a * a) ** 2 + (1 - a) ** 2)
        tape.backward(loss)
        return loss

    def torch_closure():
        topt.zero_grad()
        a, b = tx[:3], tx[1:]
        loss = (100 * (b - a * a) ** 2 + (1 - a) ** 2).sum()
        loss.backward()
        return loss

    return (x, opt, closure), (tx, topt, torch_closure)


@pytest.mark.parametrize("options, atol", [
    ({"lr": 1e-3, "max_iter": 5}, 0.0),
    ({"line_search_fn": "strong_wolfe", "max_iter": 3}, 2e-6),
    ({"line_search_fn": "strong_wolfe", "history_size": 2, "max_eval": 4}, 2e-6),
])
def test_lbfgs_steps_follow_pytorchs_as_pytorch(queue, options, atol):
    (x, opt, closure), (tx, topt, tclosure) = rosenbrock_closures(
        queue, lambda x, tx: (LBFGS([x], **options), torch.optim.LBFGS([tx], **options)))
    for _ in range(5):
        loss, tloss = opt.step(closure), topt.step(tclosure)
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
        np.testing.assert_allclose(x.value.to_host(), tx.detach().numpy(), rtol=0, atol=atol)
        for k in ("func_evals", "n_iter"):
            assert opt.state[x][k] == topt.state[tx][k]
    assert sorted(opt.state[x]) == sorted(topt.state[tx])


def test_lbfgs_defaults_are_pytorchs(queue):
    opt = LBFGS(params_of(queue, [np.ones(3, np.float32)]))
    assert opt.defaults == torch.optim.LBFGS([torch.nn.Parameter(torch.ones(3))]).defaults


def test_lbfgs_minimises_a_quadratic_in_one_step(queue):
    target = np.array([1.0, -2.0, 3.0], np.float32)
    x = params_of(queue, [np.zeros(3, np.float32)])[0]
    opt = LBFGS([x], line_search_fn="strong_wolfe")
    t = pc.Tensor.from_host(queue, target)

    def closure():
        opt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.sum((x - t) ** 2)
        tape.backward(loss)
        return loss

    assert opt.step(closure).item() == 14.0
    np.testing.assert_allclose(x.value.to_host(), target, atol=1e-5)


def test_lbfgs_state_dict_continues_the_run_bit_for_bit(queue):
    options = {"line_search_fn": "strong_wolfe", "max_iter": 4}
    (x, opt, closure), _ = rosenbrock_closures(
        queue, lambda x, tx: (LBFGS([x], **options), None))
    opt.step(closure)
    saved, value = opt.state_dict(), x.value.to_host()
    assert isinstance(saved["state"][0]["old_dirs"][0], np.ndarray)
    opt.step(closure)
    (y, again, closure2), _ = rosenbrock_closures(
        queue, lambda x, tx: (LBFGS([x], **options), None))
    y.value.copy_(pc.Tensor.from_host(queue, value))
    again.load_state_dict(saved)
    again.step(closure2)
    np.testing.assert_array_equal(y.value.to_host(), x.value.to_host())


def test_lbfgs_refuses_groups_a_missing_closure_and_bad_options(queue):
    ps = params_of(queue, [np.ones(2, np.float32), np.ones(3, np.float32)])
    with pytest.raises(OptimizerError, match="one parameter group"):
        LBFGS([{"params": ps[:1]}, {"params": ps[1:]}])
    opt = LBFGS(ps)
    with pytest.raises(OptimizerError, match="closure"):
        opt.step()
    with pytest.raises(OptimizerError, match="line_search_fn"):
        LBFGS(ps, line_search_fn="armijo")
    with pytest.raises(OptimizerError, match="max_iter"):
        LBFGS(ps, max_iter=0)


def test_lbfgs_line_search_bisects_past_a_trial_step_whose_gradient_is_nan_as_pytorch(queue):
    """The naive softplus pair log(1 + e^x) + log(1 + e^-x) (lowest at 0) from [3, -2, 5]
    with lr=100: the line search's first trial overflows e^-x, its loss is inf and its
    gradient NaN (inf / inf), so the cubic's discriminant is NaN. PyTorch's ``d2_square >=
    0`` is False for a NaN and it bisects; parcl's ``disc < 0`` was False too and it took the
    cubic's NaN step, so the parameters became [nan, nan, nan] (silently, in every later step
    too) where PyTorch's reach [-2.400, 2.544, -0.886] after 7 evaluations. Now it bisects:
    PyTorch's iterates and counts."""
    start = np.array([3.0, -2.0, 5.0], np.float32)
    x = params_of(queue, [start])[0]
    tx = torch.nn.Parameter(torch.tensor(start))
    options = {"lr": 100.0, "line_search_fn": "strong_wolfe", "max_iter": 5}
    opt, topt = LBFGS([x], **options), torch.optim.LBFGS([tx], **options)

    def closure():
        opt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.sum(tp.log(1 + tp.exp(x)) + tp.log(1 + tp.exp(-x)))
        tape.backward(loss)
        return loss

    def torch_closure():
        topt.zero_grad()
        loss = (torch.log(1 + torch.exp(tx)) + torch.log(1 + torch.exp(-tx))).sum()
        loss.backward()
        return loss

    for want in ([-2.400216, 2.543756, -0.886252], [-0.450975, 0.683514, 0.529056]):
        opt.step(closure)
        topt.step(torch_closure)
        np.testing.assert_allclose(x.value.to_host(), tx.detach().numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(x.value.to_host(), want, atol=1e-5)
        assert opt.state[x]["func_evals"] == topt.state[tx]["func_evals"]


# -- in a ReplicaGroup ---------------------------------------------------------------------
def mlp(queue, bias=True):
    return pc.nn.Sequential(pc.nn.Linear(64, 32, bias=bias, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 10, bias=bias, queue=queue))


def matrices_only(queue):
    return mlp(queue, bias=False)


@pytest.mark.parametrize("model, make", [
    (mlp, lambda ps: Adafactor(ps, lr=0.05)),
    (matrices_only, lambda ps: Muon(ps, lr=0.02)),
])
def test_the_group_step_equals_one_replica_on_the_full_batch(devices2, model, make):
    """Two replicas, each half of every batch: the flat buckets are stepped parameter by
    parameter (each rule needs the shapes), to one replica's full-batch values."""
    rng = np.random.default_rng(0)
    batches = [(rng.random((12, 64), dtype=np.float32), rng.integers(0, 10, 12))
               for _ in range(4)]
    queue = pc.new_queue(devices2[0])
    single = seeded(model)(queue)
    opt = make(list(single.parameters()))
    for x, y in batches:
        with tp.Tape() as tape:
            loss = tp.cross_entropy(single(tp.tensor(pc.Tensor.from_host(queue, x))),
                                    pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
    with ReplicaGroup(seeded(model), devices2) as group:
        group_opt = make(group.parameters())
        for x, y in batches:
            group.step(x, y, tp.cross_entropy, group_opt)
        for r in group.replicas:
            for a, b in zip(r.model.parameters(), single.parameters()):
                np.testing.assert_allclose(a.value.to_host(), b.value.to_host(), atol=1e-6)


def test_lbfgs_in_a_group_step_says_to_run_it_on_one_replica(devices2):
    with ReplicaGroup(seeded(mlp), devices2) as group:
        opt = LBFGS(group.parameters())
        x = np.zeros((4, 64), np.float32)
        with pytest.raises(OptimizerError, match="run it on one replica"):
            group.step(x, np.zeros(4, np.int64), tp.cross_entropy, opt)


# -- checkpoints ---------------------------------------------------------------------------
@pytest.mark.parametrize("make, closure_step", [
    (lambda ps: Adafactor(ps), False),
    (lambda ps: LBFGS(ps, max_iter=3, history_size=2), True),
])
def test_a_checkpoint_continues_the_run_bit_for_bit(queue, tmp_path, make, closure_step):
    x = pc.Tensor.from_host(queue, np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    y = pc.Tensor.from_host(queue, np.ones((4, 2), np.float32))

    def train(model, opt, steps):
        def closure():
            opt.zero_grad()
            with tp.Tape() as tape:
                loss = tp.mse_loss(model(tp.tensor(x)), y)
            tape.backward(loss)
            return loss

        for _ in range(steps):
            if closure_step:
                opt.step(closure)
            else:
                closure()
                opt.step()

    runs = []
    for steps in (4, 2):                         # the whole run, and the one saved halfway
        pc.nn.manual_seed(0)
        model = pc.nn.Linear(3, 2, queue=queue)
        opt = make(model.parameters())
        train(model, opt, steps)
        runs.append(model)
    pc.save(tmp_path / "ckpt.safetensors", model, opt, step=2)
    fresh = pc.nn.Linear(3, 2, queue=queue)
    fresh_opt = make(fresh.parameters())
    assert pc.load(tmp_path / "ckpt.safetensors", fresh, fresh_opt)["step"] == 2
    train(fresh, fresh_opt, 2)
    for k, v in runs[0].state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v, err_msg=k)
