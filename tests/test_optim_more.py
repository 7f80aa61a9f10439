"""NAdam, RAdam, Adamax, Adadelta, Rprop and ASGD as torch.optim's: step for step against
PyTorch in float64 over 25 steps with several parameter groups and options (to float32's
precision), their state under PyTorch's names (a PyTorch state maps over), concrete first
steps, RAdam's switch to the rectified step, Rprop's step sizes and ASGD's average, state
dicts and checkpoints that continue a run bit for bit, the data-parallel step equal to the
single replica's on the full batch, and refused options."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.allreduce import shares_memory
from parcl.kernels._cache import trace_launches
from parcl.optim import ASGD, Adadelta, Adam, Adamax, NAdam, OptimizerError, RAdam, Rprop
from parcl.replica import ReplicaGroup
from parcl.testing import seeded

SHAPES = [(7,), (33, 5), (1,), (257,)]
STEPS = 25
NAMES = ["NAdam", "RAdam", "Adamax", "Adadelta", "Rprop", "ASGD"]

# Per optimizer: constructor options, and the options of the second group (the parameters
# 2 and 3), which override some of them, as PyTorch's groups do.
CASES = {
    "NAdam": [({}, {}),
              ({"lr": 1e-2, "weight_decay": 0.1, "momentum_decay": 0.01},
               {"decoupled_weight_decay": True, "betas": (0.8, 0.99)}),
              ({"maximize": True, "eps": 1e-6}, {"weight_decay": 0.05, "lr": 5e-3})],
    "RAdam": [({}, {}),
              ({"lr": 1e-2, "weight_decay": 0.1},
               {"decoupled_weight_decay": True, "betas": (0.8, 0.9)}),
              ({"maximize": True, "betas": (0.9, 0.6)}, {"betas": (0.5, 0.95)})],
    "Adamax": [({}, {}),
               ({"lr": 1e-2, "weight_decay": 0.1, "betas": (0.8, 0.99)}, {"eps": 1e-3}),
               ({"maximize": True}, {"weight_decay": 0.05, "lr": 0.1})],
    "Adadelta": [({}, {}),
                 ({"lr": 0.5, "rho": 0.5, "weight_decay": 0.1}, {"eps": 1e-4, "rho": 0.99}),
                 ({"maximize": True}, {"weight_decay": 0.05, "lr": 2.0})],
    "Rprop": [({}, {}),
              ({"lr": 0.1, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2)}, {"lr": 0.01}),
              ({"maximize": True}, {"etas": (0.9, 1.1), "step_sizes": (0.0, 0.05)})],
    "ASGD": [({}, {}),
             ({"lr": 0.05, "lambd": 1e-2, "alpha": 0.5, "t0": 5, "weight_decay": 0.1},
              {"t0": 12, "lr": 0.1}),
             ({"maximize": True, "t0": 0}, {"lambd": 0.0, "alpha": 1.0})],
}


def hosts_and_grads(seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    hosts = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(steps)]
    for t in range(5, min(steps, 12)):       # runs of one sign, so Rprop's step sizes grow
        grads[t][1][:10] = np.abs(grads[t][1][:10])
    return hosts, grads


def groups(params, second):
    return [{"params": params[:2]}, {"params": params[2:], **second}]


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


@pytest.mark.parametrize("name", NAMES)
def test_defaults_are_pytorchs(queue, name):
    ours = getattr(pc.optim, name)([pc.nn.Parameter.from_host(queue, np.zeros(1, np.float32))])
    theirs = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(1))])
    assert ours.defaults == theirs.defaults
    assert set(ours.state_dict()["param_groups"][0]) == set(theirs.state_dict()["param_groups"][0])


@pytest.mark.parametrize("name, options, second",
                         [(n, o, s) for n in NAMES for o, s in CASES[n]],
                         ids=lambda v: v if isinstance(v, str) else repr(v))
def test_25_steps_with_two_groups_equal_pytorchs_in_float64(queue, name, options, second):
    hosts, grads = hosts_and_grads()
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    opt = getattr(pc.optim, name)(groups(params, second), **options)
    t_params = torch_params(hosts)
    t_opt = getattr(torch.optim, name)(groups(t_params, second), **options)
    run(queue, params, opt, grads)
    run_torch(t_params, t_opt, grads)
    assert_like_torch(params, opt.state_dict()["state"], t_params, t_opt.state_dict()["state"])
    ours, theirs = opt.state_dict()["param_groups"], t_opt.state_dict()["param_groups"]
    for mine, their in zip(ours, theirs):
        assert mine == {k: list(v) if isinstance(v, tuple) else v for k, v in their.items()}


def test_first_steps_have_the_documented_values(queue):
    """p = 1, grad = 2, each rule's defaults: one step, worked out by hand."""
    def first_step(cls, **kw):
        p = pc.nn.Parameter.from_host(queue, np.ones(1, np.float32))
        p.grad = pc.Tensor.full(queue, (1,), 2.0)
        cls([p], **kw).step()
        return float(p.value.to_host()[0])

    mu1, mu2 = (0.9 * (1 - 0.5 * 0.96 ** (t * 4e-3)) for t in (1, 2))
    nadam = 1 - 2e-3 * (1 - mu1) / (1 - mu1) * 2 / 2 - 2e-3 * mu2 / (1 - mu1 * mu2) * 0.2 / 2
    assert first_step(NAdam) == pytest.approx(nadam, rel=3e-7)
    assert first_step(RAdam) == pytest.approx(1 - 1e-3 * 0.2 / 0.1, rel=3e-7)  # rho_1 = 1
    assert first_step(Adamax) == pytest.approx(1 - 2e-3 / 0.1 * 0.2 / (2 + 1e-8), rel=3e-7)
    delta = math.sqrt(1e-6) / math.sqrt(0.1 * 4 + 1e-6) * 2
    assert first_step(Adadelta) == pytest.approx(1 - delta, rel=3e-7)
    assert first_step(Rprop) == pytest.approx(1 - 1e-2, rel=3e-7)         # prev = 0: f = 1
    assert first_step(ASGD) == pytest.approx(1 * (1 - 1e-4 * 1e-2) - 1e-2 * 2, rel=3e-7)
    assert first_step(Adamax, maximize=True) == pytest.approx(1 + 2e-3 / 0.1 * 0.2 / 2, rel=3e-7)


def test_radam_takes_the_rectified_step_once_rho_t_exceeds_5_as_pytorch(queue):
    """A constant gradient keeps m / (1 - beta1^t) at 1 and v / (1 - beta2^t) at 1: while
    rho_t <= 5 each step moves p by lr, from then on by lr times the rectification r_t."""
    rho_inf = 2 / (1 - 0.999) - 1
    rho = [rho_inf - 2 * t * 0.999 ** t / (1 - 0.999 ** t) for t in range(1, 9)]
    switch = next(t for t, r in enumerate(rho, 1) if r > 5)
    assert switch == 6 and rho[4] > 4.99      # step 5 (rho 4.996) unrectified, as PyTorch's
    p = pc.nn.Parameter.from_host(queue, np.zeros(1, np.float32))
    t_p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt, t_opt = RAdam([p], lr=0.1), torch.optim.RAdam([t_p], lr=0.1)
    moves = []
    for _ in range(8):
        before = float(p.value.to_host()[0])
        p.grad = pc.Tensor.full(queue, (1,), 1.0)
        t_p.grad = torch.ones(1, dtype=torch.float64)
        opt.step()
        t_opt.step()
        moves.append(before - float(p.value.to_host()[0]))
        assert float(p.value.to_host()[0]) == pytest.approx(t_p.item(), rel=1e-6)
    r = [math.sqrt((x - 4) * (x - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * x))
         for x in rho[5:]]
    np.testing.assert_allclose(moves[:5], 0.1, rtol=1e-5)
    np.testing.assert_allclose(moves[5:], [0.1 * x for x in r], rtol=1e-4)
    assert moves[5] < 0.01                             # r_6 is small: a careful first step


@pytest.mark.parametrize("name", NAMES)
def test_nan_and_inf_go_where_pytorchs_go(queue, name):
    """NaN, +-inf and signed zeros in the gradients, then an infinite parameter stepped on,
    against PyTorch in float32: the same NaNs and infinities, the rest to float32 rounding."""
    value = np.array([1.0, -1.0, 0.5, 2.0, 0.0, 1.0], np.float32)
    grads = [np.array([np.nan, np.inf, -np.inf, 1.0, 0.0, -0.0], np.float32),
             np.array([1.0, 1.0, 1.0, np.nan, 1.0, 1.0], np.float32),
             np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0], np.float32)]
    p = pc.nn.Parameter.from_host(queue, value)
    t = torch.nn.Parameter(torch.tensor(value))
    opt, t_opt = getattr(pc.optim, name)([p]), getattr(torch.optim, name)([t])
    for g in grads:
        p.grad, t.grad = pc.Tensor.from_host(queue, g), torch.tensor(g)
        opt.step()
        t_opt.step()
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_rprop_grows_and_shrinks_its_step_sizes_as_pytorch(queue):
    """Gradients +1, +1, -1, -1 from p = 0 (lr 0.1, etas (0.5, 1.2)): the step grows while the
    sign holds, halves when it flips (that step moves nothing and forgets the gradient), and
    stays the next."""
    p = pc.nn.Parameter.from_host(queue, np.zeros(1, np.float32))
    opt = Rprop([p], lr=0.1)
    values, sizes = [], []
    for g in (1.0, 1.0, -1.0, -1.0):
        p.grad = pc.Tensor.full(queue, (1,), g)
        opt.step()
        values.append(float(p.value.to_host()[0]))
        sizes.append(float(opt.state[p]["step_size"].to_host()[0]))
    np.testing.assert_allclose(sizes, [0.1, 0.12, 0.06, 0.06], rtol=1e-6)
    np.testing.assert_allclose(values, [-0.1, -0.22, -0.22, -0.16], rtol=1e-6)
    assert opt.state_dict()["state"][0]["prev"].tolist() == [-1.0]


def test_asgd_averages_the_parameter_from_t0_on(queue):
    """lambd = 0 keeps eta at lr; a constant gradient 1 from p = 0 gives p_t = -0.1 t, and
    with t0 = 0 ax after step t is the mean of p_2 .. p_t (mu = 1 / max(1, t - t0))."""
    p = pc.nn.Parameter.from_host(queue, np.zeros(2, np.float32))
    opt = ASGD([p], lr=0.1, lambd=0.0, t0=0)
    for _ in range(4):
        p.grad = pc.Tensor.full(queue, (2,), 1.0)
        opt.step()
    state = opt.state_dict()["state"][0]
    np.testing.assert_allclose(p.value.to_host(), [-0.4, -0.4], rtol=1e-6)
    np.testing.assert_allclose(state["ax"], [-0.3, -0.3], rtol=1e-6)
    assert (state["step"], state["eta"], state["mu"]) == (4, 0.1, 0.25)


@pytest.mark.parametrize("name", NAMES)
def test_maximize_is_the_step_on_the_negated_gradient(queue, name):
    hosts, grads = hosts_and_grads(steps=4)
    up = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    down = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    cls = getattr(pc.optim, name)
    run(queue, up, cls(up, maximize=True), grads)
    run(queue, down, cls(down), [[-g for g in step] for step in grads])
    for a, b in zip(up, down):
        np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())


@pytest.mark.parametrize("name", ["NAdam", "RAdam", "Adamax"])
def test_a_one_cycle_schedule_cycling_beta1_trains_as_pytorchs(queue, name):
    hosts, grads = hosts_and_grads(steps=12)
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    t_params = torch_params(hosts)
    opt, t_opt = getattr(pc.optim, name)(params), getattr(torch.optim, name)(t_params)
    sched = pc.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=12)
    t_sched = torch.optim.lr_scheduler.OneCycleLR(t_opt, max_lr=0.05, total_steps=12)
    for step_grads in grads:
        run(queue, params, opt, [step_grads])
        run_torch(t_params, t_opt, [step_grads])
        sched.step()
        t_sched.step()
        assert opt.param_groups[0]["betas"][0] == t_opt.param_groups[0]["betas"][0]
    assert_like_torch(params, opt.state_dict()["state"], t_params, t_opt.state_dict()["state"])


def _options(name):
    return CASES[name][1][0]


@pytest.mark.parametrize("name", NAMES)
def test_a_pytorch_state_maps_over_and_goes_on_alike(queue, name):
    """Five steps in PyTorch, its state (tensors, the 0-d step and NAdam's 0-d mu_product)
    loaded into parcl's optimizer with the same groups, twenty more steps in each."""
    hosts, grads = hosts_and_grads()
    t_params = torch_params(hosts)
    t_opt = getattr(torch.optim, name)(t_params, **_options(name))
    run_torch(t_params, t_opt, grads[:5])
    params = [pc.nn.Parameter.from_host(queue, t.detach().numpy().astype(np.float32))
              for t in t_params]
    opt = getattr(pc.optim, name)(params, **_options(name))
    sd = opt.state_dict()
    sd["state"] = {i: {k: v.numpy() if v.dim() else v for k, v in entry.items()}
                   for i, entry in t_opt.state_dict()["state"].items()}
    opt.load_state_dict(sd)
    run(queue, params, opt, grads[5:])
    run_torch(t_params, t_opt, grads[5:])
    assert_like_torch(params, opt.state_dict()["state"], t_params, t_opt.state_dict()["state"])


@pytest.mark.parametrize("name", NAMES)
def test_a_state_dict_loaded_into_a_fresh_optimizer_continues_bit_for_bit(queue, name):
    hosts, grads = hosts_and_grads(steps=8)
    cls = getattr(pc.optim, name)
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    opt = cls(groups(params, {"lr": 0.05}), **_options(name))
    run(queue, params, opt, grads[:4])
    saved = opt.state_dict()
    copies = [pc.nn.Parameter.from_host(queue, p.value.to_host()) for p in params]
    fresh = cls(groups(copies, {}))
    fresh.load_state_dict(saved)
    assert fresh.param_groups[1]["lr"] == 0.05
    run(queue, params, opt, grads[4:])
    run(queue, copies, fresh, grads[4:])
    for a, b in zip(params, copies):
        np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())
    want, got = opt.state_dict(), fresh.state_dict()
    assert want["param_groups"] == got["param_groups"]
    for i in want["state"]:
        for k, v in want["state"][i].items():
            np.testing.assert_array_equal(v, got["state"][i][k])


MAKERS = {
    "NAdam": lambda ps: NAdam(ps, lr=1e-2, weight_decay=0.01, decoupled_weight_decay=True),
    "RAdam": lambda ps: RAdam(ps, lr=1e-2, weight_decay=0.01),
    "Adamax": lambda ps: Adamax(ps, lr=1e-2, weight_decay=0.01),
    "Adadelta": lambda ps: Adadelta(ps, lr=0.5, weight_decay=0.01),
    "Rprop": lambda ps: Rprop(ps, lr=1e-3, step_sizes=(1e-5, 1e-2)),
    "ASGD": lambda ps: ASGD(ps, lr=0.05, t0=2, weight_decay=0.01),
}


@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_continues_the_run_bit_for_bit(queue, tmp_path, name):
    make = MAKERS[name]
    pc.nn.manual_seed(0)
    model = pc.nn.Linear(6, 4, queue=queue)
    opt = make(list(model.parameters()))
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 4, 5))
               for _ in range(8)]

    def train(m, o, part):
        for x, y in part:
            with tp.Tape() as tape:
                loss = tp.cross_entropy(m(tp.tensor(x)), pc.Tensor.from_host(queue, y))
            tape.backward(loss)
            o.step()
            o.zero_grad()

    train(model, opt, batches[:4])
    path = tmp_path / "ckpt.safetensors"
    pc.save(path, model, opt, step=4)
    train(model, opt, batches[4:])

    pc.nn.manual_seed(5)
    fresh = pc.nn.Linear(6, 4, queue=queue)
    fresh_opt = make(list(fresh.parameters()))
    assert pc.load(path, fresh, fresh_opt)["step"] == 4
    train(fresh, fresh_opt, batches[4:])
    for a, b in zip(model.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())
    want, got = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert sorted(want) == sorted(got)
    for i in want:
        assert sorted(want[i]) == sorted(got[i])
        for k in want[i]:
            np.testing.assert_array_equal(want[i][k], got[i][k])


def test_a_checkpoint_of_another_rule_is_refused(queue, tmp_path):
    model = pc.nn.Linear(3, 2, queue=queue)
    pc.save(tmp_path / "adam.safetensors", model, Adam(model.parameters()))
    with pytest.raises(pc.CheckpointError, match="Adam optimizer's state"):
        pc.load(tmp_path / "adam.safetensors", model, NAdam(model.parameters()))


# -- data-parallel steps (two devices) ---------------------------------------------------------
def mlp(queue):
    return pc.nn.Sequential(pc.nn.Linear(64, 32, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 10, queue=queue))


def _batches():
    rng = np.random.default_rng(0)
    return [(rng.random((12, 64), dtype=np.float32), rng.integers(0, 10, 12))
            for _ in range(4)]


def _single(devices, make, batches):
    queue = pc.new_queue(devices[0])
    model = seeded(mlp)(queue)
    opt = make(list(model.parameters()))
    for x, y in batches:
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(pc.Tensor.from_host(queue, x))),
                                    pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
    return [p.value.to_host() for p in model.parameters()], opt.state_dict()["state"]


@pytest.mark.parametrize("name", NAMES)
def test_the_group_step_equals_one_replica_on_the_full_batch(devices2, name):
    """Two replicas, each half of every batch, the update run as one kernel per bucket (the
    fused end of the step): parameters and state (NAdam's mu_product too) as one replica's
    full-batch steps, every replica holding the same values."""
    batches = _batches()
    want, want_state = _single(devices2, MAKERS[name], batches)
    with ReplicaGroup(seeded(mlp), devices2) as group:
        opt = MAKERS[name](group.parameters())
        for x, y in batches:
            with trace_launches() as launches:
                group.step(x, y, tp.cross_entropy, opt)
        updates = [n for n, _, _ in launches if n.split("_x")[0] == name.lower()]
        assert len(updates) == (2 if shares_memory(devices2) else 1)     # one bucket
        for r in group.replicas:
            for a, b in zip(r.model.parameters(), want):
                np.testing.assert_allclose(a.value.to_host(), b, rtol=1e-4, atol=1e-6)
        state = opt.state_dict()["state"]
    assert sorted(state) == sorted(want_state)
    for i, entry in state.items():
        assert entry["step"] == 4
        for k, v in entry.items():
            np.testing.assert_allclose(v, want_state[i][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_the_sharded_step_equals_replica_0_stepping_everything_bit_for_bit(devices2, name):
    """Three replicas, several buckets: the default end of the step (the ``_x3`` kernels, each
    queue its share of a bucket) against replica 0 updating every bucket itself after a
    shared allreduce; on GPUs (no shared memory) a "direct" allreduce instead."""
    devs = [devices2[i % 2] for i in range(3)]
    sharded = shares_memory(devs)

    def run(allreduce):
        with ReplicaGroup(seeded(mlp), devs, allreduce=allreduce, bucket_mb=0.004) as group:
            opt = MAKERS[name](group.parameters())
            for x, y in _batches()[:3]:
                with trace_launches() as launches:
                    group.step(x, y, tp.cross_entropy, opt)
            kernels = {n for n, _, _ in launches if n.split("_x")[0] == name.lower()}
            copies = [[p.value.to_host() for p in r.model.parameters()] for r in group.replicas]
            return kernels, copies, opt.state_dict()["state"]

    kernels, copies, state = run("auto")
    _, plain, plain_state = run("shared" if sharded else "direct")
    assert kernels == ({f"{name.lower()}_x3"} if sharded else {name.lower()})
    for copy in copies:
        assert all(np.array_equal(a, b) for a, b in zip(copy, plain[0]))
    for i, entry in plain_state.items():
        for k, v in entry.items():
            assert np.array_equal(np.asarray(state[i][k]), np.asarray(v)), k


@pytest.mark.parametrize("name", NAMES)
def test_captured_steps_replay_the_eager_ones_bit_for_bit(devices2, name):
    def train(capture):
        with ReplicaGroup(seeded(mlp), devices2, capture=capture) as group:
            opt = MAKERS[name](group.parameters())
            losses = [group.step(x, y, tp.cross_entropy, opt) for x, y in _batches()]
            params = [p.value.to_host() for p in group.parameters()]
            replays = [s.replays for per in group.captured_steps for s in per]
            return losses, params, opt.state_dict()["state"], replays

    eager, replayed = train(False), train(True)
    assert eager[0] == replayed[0]
    assert all(np.array_equal(a, b) for a, b in zip(eager[1], replayed[1]))
    for i, entry in eager[2].items():
        for k, v in entry.items():
            np.testing.assert_array_equal(v, replayed[2][i][k])
    assert replayed[3] and all(r == 3 for r in replayed[3])


# -- refusals ------------------------------------------------------------------------------
@pytest.mark.parametrize("build, fragment", [
    (lambda ps: NAdam(ps, momentum_decay=-1e-3), "invalid momentum_decay"),
    (lambda ps: NAdam(ps, betas=(1.0, 0.999)), "invalid beta parameter at index 0"),
    (lambda ps: NAdam(ps, decoupled_weight_decay=1), "expected a bool"),
    (lambda ps: RAdam(ps, betas=(0.9,)), "betas must be a pair"),
    (lambda ps: RAdam(ps, eps=-1.0), "invalid eps"),
    (lambda ps: RAdam(ps, differentiable=True), "differentiable=True is not supported"),
    (lambda ps: Adamax(ps, lr=float("nan")), "invalid lr"),
    (lambda ps: Adamax(ps, foreach="yes"), "expected a bool"),
    (lambda ps: Adadelta(ps, rho=1.5), r"invalid rho: 1.5 \(must be in \[0, 1\]\)"),
    (lambda ps: Adadelta(ps, maximize=None), "expected a bool"),
    (lambda ps: Adadelta(ps, weight_decay=-0.1), "invalid weight_decay"),
    (lambda ps: Rprop(ps, etas=(1.2, 0.5)), "invalid eta values: 1.2, 0.5"),
    (lambda ps: Rprop(ps, step_sizes=(1.0, 0.1)), r"invalid step_sizes: \(1.0, 0.1\)"),
    (lambda ps: Rprop(ps, step_sizes=1e-6), "step_sizes must be a pair"),
    (lambda ps: ASGD(ps, t0=-1), "invalid t0"),
    (lambda ps: ASGD(ps, lambd=float("nan")), "invalid lambd"),
    (lambda ps: ASGD(ps, differentiable=True), "differentiable=True is not supported"),
])
def test_bad_options_are_refused(queue, build, fragment):
    with pytest.raises(OptimizerError, match=fragment):
        build([pc.nn.Parameter.from_host(queue, np.zeros(3, np.float32))])


def test_pytorchs_switches_are_taken(queue):
    p = pc.nn.Parameter.from_host(queue, np.zeros(3, np.float32))
    opt = Adamax([p], 2e-3, (0.9, 0.999), 1e-8, 0.0, True, capturable=True)   # foreach 5th
    assert (opt.defaults["foreach"], opt.defaults["capturable"]) == (True, True)
    assert Adadelta([p], foreach=False).defaults["differentiable"] is False


def test_a_state_that_does_not_fit_is_refused_unchanged(queue):
    hosts, grads = hosts_and_grads(steps=2)
    params = [pc.nn.Parameter.from_host(queue, h) for h in hosts]
    nadam = NAdam(params)
    run(queue, params, nadam, grads)
    before = nadam.state_dict()
    with pytest.raises(OptimizerError, match="options"):
        nadam.load_state_dict(Adam(params).state_dict())
    sd = nadam.state_dict()
    sd["state"] = {i: {k: v for k, v in e.items() if k != "mu_product"}
                   for i, e in sd["state"].items()}
    with pytest.raises(OptimizerError, match="mu_product"):
        nadam.load_state_dict(sd)
    sd = nadam.state_dict()
    sd["state"][0]["mu_product"] = float("nan")
    with pytest.raises(OptimizerError, match=r"state\[0\]\['mu_product'\] must be a finite"):
        nadam.load_state_dict(sd)
    sd = RAdam(params).state_dict()         # Adamax's state names
    sd["state"] = {i: {"step": e["step"], "exp_avg": e["exp_avg"], "exp_inf": e["exp_avg_sq"]}
                   for i, e in before["state"].items()}
    with pytest.raises(OptimizerError, match="exp_inf"):
        RAdam(params).load_state_dict(sd)
    after = nadam.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for i in before["state"]:
        for k, v in before["state"][i].items():
            np.testing.assert_array_equal(v, after["state"][i][k])
