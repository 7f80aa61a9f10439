"""MultiStepLR, ExponentialLR, ConstantLR, OneCycleLR and ChainedScheduler against PyTorch's
own schedulers, step by step and bit for bit (float64 learning rates): each case below builds
the same schedule with ``torch.optim.lr_scheduler`` and ``pc.optim.lr_scheduler`` (same
names, same arguments). Also inside ``SequentialLR``, state dicts that resume bit for bit, and
the options PyTorch accepts only to fail later, refused up front. No device needed: the
schedulers only read and write ``optimizer.param_groups``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import parcl as pc
from parcl.optim import lr_scheduler as P
from parcl.optim.lr_scheduler import SchedulerError
from scheduler_fakes import FakeModel, FakeOptimizer, torch_optimizer

T = torch.optim.lr_scheduler
LRS = (0.1, 0.03)                  # two parameter groups


def trace(sched, opt, steps, key="lr"):
    """``group[key]`` of every group after the constructor and after each step."""
    out = [[g[key] for g in opt.param_groups]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # torch: "step() before optimizer.step()"
        for _ in range(steps):
            sched.step()
            out.append([g[key] for g in opt.param_groups])
            assert list(sched.get_last_lr()) == [g["lr"] for g in opt.param_groups]
    return out


# Each case: the same call on torch's module and on parcl's (S), the optimizer o.
CASES = {
    "multistep": lambda S, o: S.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.3),
    "multistep-repeats-unsorted": lambda S, o: S.MultiStepLR(o, [9, 5, 2, 5], gamma=0.5),
    "multistep-numpy-milestones": lambda S, o: S.MultiStepLR(o, np.arange(2, 12, 3), 0.5),
    "exponential": lambda S, o: S.ExponentialLR(o, gamma=0.9),
    "multiplicative": lambda S, o: S.MultiplicativeLR(o, lambda t: 0.9 if t % 3 else 1.1),
    "multiplicative-per-group": lambda S, o: S.MultiplicativeLR(
        o, [lambda t: 0.95, lambda t: 1.0 / (1 + 0.1 * t)]),
    "chained-multiplicative-step": lambda S, o: S.ChainedScheduler(
        [S.MultiplicativeLR(o, lambda t: 0.97), S.StepLR(o, 4, 0.5)]),
    "constant": lambda S, o: S.ConstantLR(o, factor=0.25, total_iters=4),
    "constant-defaults": lambda S, o: S.ConstantLR(o),
    "onecycle": lambda S, o: S.OneCycleLR(o, max_lr=0.5, total_steps=25,
                                          cycle_momentum=False),
    "onecycle-epochs-linear-three-phase": lambda S, o: S.OneCycleLR(
        o, max_lr=[0.5, 0.2], epochs=3, steps_per_epoch=7, pct_start=0.25,
        anneal_strategy="linear", three_phase=True, div_factor=10.0, final_div_factor=100.0,
        cycle_momentum=False),
    "onecycle-pct-0": lambda S, o: S.OneCycleLR(o, 1.0, total_steps=12, pct_start=0.0,
                                                cycle_momentum=False),
    "chained-constant-exponential": lambda S, o: S.ChainedScheduler(
        [S.ConstantLR(o, factor=0.1, total_iters=20), S.ExponentialLR(o, gamma=0.9)]),
    "chained-three": lambda S, o: S.ChainedScheduler(
        [S.MultiStepLR(o, [3, 6], 0.5), S.ExponentialLR(o, 0.95), S.LinearLR(o, 0.2, 1.0, 5)],
        optimizer=o),
    "sequential-constant-then-exponential": lambda S, o: S.SequentialLR(
        o, [S.ConstantLR(o, factor=0.1, total_iters=20), S.ExponentialLR(o, gamma=0.9)],
        milestones=[20]),
    "sequential-exponential-then-multistep": lambda S, o: S.SequentialLR(
        o, [S.ExponentialLR(o, 0.8), S.MultiStepLR(o, [2, 4], 0.5)], milestones=[6]),
    "sequential-warmup-then-onecycle": lambda S, o: S.SequentialLR(
        o, [S.LinearLR(o, 0.5, total_iters=2),
            S.OneCycleLR(o, 2.0, total_steps=20, cycle_momentum=False)], milestones=[3]),
    "sequential-of-a-chain": lambda S, o: S.SequentialLR(
        o, [S.ChainedScheduler([S.ConstantLR(o, 0.5, 3), S.ExponentialLR(o, 0.9)]),
            S.StepLR(o, 2)], milestones=[4]),
    # Before SequentialLR undid its parts' initial steps recursively (PyTorch's
    # recursive_undo), this one began above the base learning rate: 1.5x, then 2x
    # (PyTorch: 0.5x, 1x), silently.
    "sequential-of-a-sequential": lambda S, o: S.SequentialLR(
        o, [S.SequentialLR(o, [S.LinearLR(o, 0.5, total_iters=2), S.StepLR(o, 2, 0.5)],
                           milestones=[2]),
            S.LinearLR(o, 0.25, total_iters=3)], milestones=[6]),
}


def build(name, S, o):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # torch: "step() before optimizer.step()"
        return CASES[name](S, o)


STEPS = 21                        # OneCycleLR's 25 / 21 / 12 steps: the last ones included


def steps_for(name: str) -> int:
    return {"onecycle-pct-0": 12}.get(name, STEPS)


@pytest.mark.parametrize("name", CASES)
def test_each_schedule_equals_pytorchs_bit_for_bit(name):
    """The learning rate of every group after every step is PyTorch's, to the last bit."""
    t_opt, p_opt = torch_optimizer(*LRS), FakeOptimizer(*LRS)
    want = trace(build(name, T, t_opt), t_opt, steps_for(name))
    got = trace(build(name, P, p_opt), p_opt, steps_for(name))
    assert got == want


def test_a_chain_multiplies_its_schedules():
    """ConstantLR(0.1, 20) under ExponentialLR(0.9): lr 0.05 * 0.1 * 0.9^t while the constant
    factor holds, then at step 20 the factor is undone (the lr rises by 0.9 / 0.1)."""
    opt = FakeOptimizer(0.05)
    got = np.array(trace(build("chained-constant-exponential", P, opt), opt, 21))[:, 0]
    t = np.arange(22)
    want = 0.05 * 0.9 ** t * np.where(t < 20, 0.1, 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert got[20] == pytest.approx(got[19] * 9.0, rel=1e-12)


@pytest.mark.parametrize("name", ["multistep-numpy-milestones", "exponential", "constant",
                                  "onecycle", "chained-three", "sequential-warmup-then-onecycle",
                                  "sequential-of-a-chain", "sequential-of-a-sequential"])
def test_a_saved_state_continues_the_schedule_bit_for_bit(name):
    opt = FakeOptimizer(*LRS)
    sched = build(name, P, opt)
    trace(sched, opt, 7)
    saved = json.loads(json.dumps(sched.state_dict()))              # JSON-able, as saved
    group_lrs = [g["lr"] for g in opt.param_groups]                 # the optimizer's state
    rest = trace(sched, opt, 12)

    fresh_opt = FakeOptimizer(*LRS)
    fresh = build(name, P, fresh_opt)
    for g, lr in zip(fresh_opt.param_groups, group_lrs):           # optimizer.load_state_dict
        g["lr"] = lr
    fresh.load_state_dict(saved)
    assert fresh.get_last_lr() == group_lrs
    assert trace(fresh, fresh_opt, 12) == rest


def test_a_nested_sequential_starts_below_its_base_learning_rate():
    opt = FakeOptimizer(1.0)
    got = trace(build("sequential-of-a-sequential", P, opt), opt, 9)
    assert [lr for lr, in got] == [0.5, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("make", [
    lambda o: P.OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=20),
    lambda o: P.ChainedScheduler([P.ConstantLR(o, 0.5, 6), P.ExponentialLR(o, 0.9)]),
], ids=["onecycle-cycling-momentum", "chained"])
def test_a_checkpoint_resumes_the_schedule_and_momentum_bit_for_bit(tmp_path, make):
    """pc.save / pc.load with a real SGD: the learning rates and (OneCycleLR's) momenta of a
    resumed run are the uninterrupted run's."""
    def fresh():
        q = pc.default_queue()
        opt = pc.optim.SGD([{"params": [pc.nn.Parameter(pc.Tensor.zeros(q, (2,)))], "lr": lr}
                            for lr in LRS], lr=0.1, momentum=0.5)
        return opt, make(opt)

    def run(sched, opt, steps):
        out = []
        for _ in range(steps):
            sched.step()
            out.append([(g["lr"], g["momentum"]) for g in opt.param_groups])
        return out

    path = tmp_path / "ckpt.safetensors"
    opt, sched = fresh()
    run(sched, opt, 5)
    pc.save(path, FakeModel(1.0), opt, step=5, scheduler=sched)
    rest = run(sched, opt, 14)
    opt2, sched2 = fresh()
    pc.load(path, FakeModel(), opt2, scheduler=sched2)
    assert run(sched2, opt2, 14) == rest


@pytest.mark.parametrize("last_epoch", [-1, 2], ids=["restarted", "resumed-by-last-epoch"])
@pytest.mark.parametrize("via", ["checkpoint", "state_dict"])
def test_a_scheduler_made_after_loading_the_optimizer_starts_from_the_initial_lr(
        tmp_path, last_epoch, via):
    """PyTorch's optimizer state dict keeps the first scheduler's ``initial_lr`` in every
    group, so a scheduler made after loading it (without its own state) computes from the
    run's initial learning rates. parcl's left them out: the new LambdaLR took the loaded,
    already decayed rates as its base (0.0125 where PyTorch restarts at 0.1, decaying twice
    from then on), and ``last_epoch=2`` was refused."""
    def lam(epoch):
        return 0.5 ** epoch

    topt = torch_optimizer(*LRS)
    tsched = T.LambdaLR(topt, lam)
    trace(tsched, topt, 3)
    fresh = torch_optimizer(*LRS)
    fresh.load_state_dict(topt.state_dict())
    want = trace(T.LambdaLR(fresh, lam, last_epoch=last_epoch), fresh, 4)

    q = pc.default_queue()

    def sgd():
        return pc.optim.SGD([{"params": [pc.nn.Parameter(pc.Tensor.zeros(q, (2,)))], "lr": lr}
                             for lr in LRS], lr=LRS[0])

    opt = sgd()
    trace(P.LambdaLR(opt, lam), opt, 3)
    opt2 = sgd()
    if via == "checkpoint":
        pc.save(tmp_path / "ckpt.safetensors", FakeModel(1.0), opt, step=3)
        pc.load(tmp_path / "ckpt.safetensors", FakeModel(), opt2)
    else:
        opt2.load_state_dict(json.loads(json.dumps(opt.state_dict())))
    assert trace(P.LambdaLR(opt2, lam, last_epoch=last_epoch), opt2, 4) == want


def test_a_chained_state_of_other_parts_is_refused_unchanged():
    opt = FakeOptimizer(*LRS)
    chain = build("chained-three", P, opt)
    before = json.dumps(chain.state_dict())
    other = P.ChainedScheduler([P.ExponentialLR(FakeOptimizer(*LRS), 0.5)])
    with pytest.raises(SchedulerError, match="1 schedulers' states given, this one holds 3"):
        chain.load_state_dict(other.state_dict())
    bad = json.loads(before)
    bad["_schedulers"][2] = P.StepLR(FakeOptimizer(*LRS), 3).state_dict()   # the last part
    with pytest.raises(SchedulerError, match="another scheduler"):
        chain.load_state_dict(bad)
    assert json.dumps(chain.state_dict()) == before                 # the first parts too


def test_onecycle_cycles_sgd_momentum_as_pytorch():
    """cycle_momentum (PyTorch's default): SGD's momentum goes from max_momentum down to
    base_momentum while the learning rate climbs, and back; parcl's SGD has the option."""
    torch_opt = torch_optimizer(0.1, cls=torch.optim.SGD, momentum=0.0)
    q = pc.default_queue()
    opt = pc.optim.SGD([pc.nn.Parameter(pc.Tensor.zeros(q, (2,)))], lr=0.1)
    make = lambda S, o: S.OneCycleLR(o, max_lr=0.4, total_steps=15, base_momentum=0.8,  # noqa: E731
                                     max_momentum=0.9)
    t_sched, p_sched = make(T, torch_opt), make(P, opt)
    assert trace(p_sched, opt, 15, "momentum") == trace(t_sched, torch_opt, 15, "momentum")
    assert opt.param_groups[0]["lr"] == torch_opt.param_groups[0]["lr"]
    assert "max_lr" not in opt.param_groups[0]            # the optimizer's options only
    saved = opt.state_dict()["param_groups"][0]        # and the initial_lr, as PyTorch's
    assert saved.keys() == {"lr", "momentum", "weight_decay", "nesterov", "initial_lr", "params"}
    assert saved["initial_lr"] == torch_opt.state_dict()["param_groups"][0]["initial_lr"]


def test_onecycle_cycles_adams_first_beta_as_pytorch():
    torch_opt = torch_optimizer(1e-3, 2e-3, cls=torch.optim.Adam, betas=(0.9, 0.99))
    q = pc.default_queue()
    opt = pc.optim.Adam([{"params": [pc.nn.Parameter(pc.Tensor.zeros(q, (2,)))], "lr": lr}
                         for lr in (1e-3, 2e-3)], betas=(0.9, 0.99))
    make = lambda S, o: S.OneCycleLR(o, max_lr=[0.01, 0.02], total_steps=10)  # noqa: E731
    t_sched, p_sched = make(T, torch_opt), make(P, opt)
    got, want = trace(p_sched, opt, 10, "betas"), trace(t_sched, torch_opt, 10, "betas")
    assert [[tuple(b) for b in row] for row in got] == want
    assert got[0][0] == (0.95, 0.99) and got[3][0][0] < 0.9     # beta2 kept; beta1 cycles


def test_onecycle_is_refused_past_its_last_step_unchanged():
    """PyTorch raises ValueError at step total_steps + 1; parcl raises there too, and the
    schedule stays where it was."""
    t_opt, opt = torch_optimizer(0.1), FakeOptimizer(0.1)
    t_sched = T.OneCycleLR(t_opt, 1.0, total_steps=5, cycle_momentum=False)
    sched = P.OneCycleLR(opt, 1.0, total_steps=5, cycle_momentum=False)
    assert trace(sched, opt, 5) == trace(t_sched, t_opt, 5)
    with pytest.raises(ValueError, match="Tried to step 6 times"):
        t_sched.step()
    before = sched.state_dict()
    with pytest.raises(SchedulerError, match="tried to step 6 times, total_steps is 5"):
        sched.step()
    assert sched.state_dict() == before and opt.param_groups[0]["lr"] == before["_last_lr"][0]


@pytest.mark.parametrize("kw", [dict(total_steps=10, pct_start=0.1),
                                dict(total_steps=10, pct_start=1.0),
                                dict(total_steps=10, pct_start=0.55, three_phase=True)],
                         ids=["warm-up-of-0-steps", "no-annealing", "third-phase-of-0"])
def test_onecycle_phases_of_no_step_are_refused_where_pytorch_divides_by_zero(kw):
    t_opt = torch_optimizer(0.1)
    with pytest.raises(ZeroDivisionError):                 # at the constructor or a step
        s = T.OneCycleLR(t_opt, 1.0, cycle_momentum=False, **kw)
        trace(s, t_opt, kw["total_steps"])
    with pytest.raises(SchedulerError, match="spans no step"):
        P.OneCycleLR(FakeOptimizer(0.1), 1.0, cycle_momentum=False, **kw)


def test_constant_factor_zero_is_refused_where_pytorch_divides_by_zero():
    t_opt = torch_optimizer(0.1)
    with pytest.raises(ZeroDivisionError):
        trace(T.ConstantLR(t_opt, factor=0.0, total_iters=2), t_opt, 2)
    with pytest.raises(SchedulerError, match=r"factor must be in \(0, 1\], got 0.0"):
        P.ConstantLR(FakeOptimizer(0.1), factor=0.0, total_iters=2)


def test_a_chain_after_a_milestone_is_refused_where_pytorch_fails_there():
    """SequentialLR restarts a scheduler at its milestone from its closed form; a
    ChainedScheduler has none and PyTorch raises NotImplementedError at that step."""
    t_opt = torch_optimizer(0.1)
    seq = T.SequentialLR(t_opt, [T.StepLR(t_opt, 2), T.ChainedScheduler(
        [T.ExponentialLR(t_opt, 0.9)])], milestones=[3])
    with pytest.raises(NotImplementedError):
        trace(seq, t_opt, 3)
    opt = FakeOptimizer(0.1)
    with pytest.raises(SchedulerError, match=r"schedulers\[1\] is a ChainedScheduler"):
        P.SequentialLR(opt, [P.StepLR(opt, 2), P.ChainedScheduler([P.ExponentialLR(opt, 0.9)])],
                       milestones=[3])


def test_a_fractional_milestone_is_refused():
    """SequentialLR(milestones=[2.5]) used to switch at step 2 (int() truncated it), silently;
    PyTorch switches after step 2 without ever restarting the next scheduler (no step equals
    2.5), so its StepLR continues from the warm-up's lr. Neither is a schedule anyone meant."""
    t_opt = torch_optimizer(1.0)
    seq = T.SequentialLR(t_opt, [T.LinearLR(t_opt, 0.5, total_iters=10),
                                 T.StepLR(t_opt, 1, 0.5)], milestones=[2.5])
    np.testing.assert_allclose(np.array(trace(seq, t_opt, 4))[:, 0],
                               [0.5, 0.55, 0.6, 0.6, 0.3], rtol=1e-12)   # never back to 1.0
    opt = FakeOptimizer(1.0)
    with pytest.raises(SchedulerError, match=r"milestones must be ints .* got \[2.5\]"):
        P.SequentialLR(opt, [P.LinearLR(opt, 0.5, total_iters=10), P.StepLR(opt, 1, 0.5)],
                       milestones=[2.5])


def test_a_fractional_last_epoch_is_refused_not_truncated():
    """StepLR(step_size=2, gamma=0.5, last_epoch=2.5) used to resume at step 2 (int()
    truncated it): 0.05, 0.05, 0.025, ... from a base of 0.1, silently; PyTorch keeps 2.5,
    its steps never land on a multiple of 2 again and the lr stays 0.1 forever. Neither is
    the run that was saved; a whole number given as a float (3.0) still resumes."""
    t_opt = torch_optimizer(0.1)
    t_opt.param_groups[0]["initial_lr"] = 0.1
    np.testing.assert_allclose(np.array(trace(T.StepLR(t_opt, 2, 0.5, last_epoch=2.5), t_opt,
                                              5))[:, 0], [0.1] * 6, rtol=1e-12)
    opt = FakeOptimizer(0.1)
    opt.initial_lrs = [0.1]
    with pytest.raises(SchedulerError, match=r"last_epoch must be an int .* got 2\.5"):
        P.StepLR(opt, 2, 0.5, last_epoch=2.5)
    assert opt.param_groups[0]["lr"] == 0.1
    parts = [P.ExponentialLR(opt, 0.5), P.ConstantLR(opt, 0.1, 2)]
    with pytest.raises(SchedulerError, match=r"SequentialLR: last_epoch must be an int"):
        P.SequentialLR(opt, parts, [3], last_epoch=0.5)
    opt = FakeOptimizer(0.1)
    opt.initial_lrs = [0.1]
    assert P.StepLR(opt, 2, 0.5, last_epoch=3.0).last_epoch == 4


@pytest.mark.parametrize("build, fragment", [
    (lambda o: P.MultiStepLR(o, [2, "5"]), "milestones must be ints >= 0, got [2, '5']"),
    (lambda o: P.MultiStepLR(o, [-1]), "milestones must be ints >= 0"),
    (lambda o: P.MultiStepLR(o, 3), "milestones must be a list of ints, got 3"),
    (lambda o: P.MultiStepLR(o, [2], gamma="x"), "gamma must be a number, got 'x'"),
    (lambda o: P.ExponentialLR(o, float("nan")), "gamma must be finite, got nan"),
    (lambda o: P.ConstantLR(o, factor=1.5), "factor must be in (0, 1], got 1.5"),
    (lambda o: P.ConstantLR(o, total_iters=0), "total_iters must be a positive int, got 0"),
    (lambda o: P.OneCycleLR(o, 0.1), "give total_steps, or epochs and steps_per_epoch; got "
                                     "total_steps=None, epochs=None, steps_per_epoch=None"),
    (lambda o: P.OneCycleLR(o, 0.1, total_steps=0), "expected a positive int total_steps, "
                                                    "got 0"),
    (lambda o: P.OneCycleLR(o, 0.1, epochs=2, steps_per_epoch=1.5),
     "positive int steps_per_epoch, got 1.5"),
    (lambda o: P.OneCycleLR(o, 0.1, 10, pct_start=1.5), "pct_start must be in [0, 1], got 1.5"),
    (lambda o: P.OneCycleLR(o, 0.1, 10, anneal_strategy="exp"),
     "anneal_strategy must be 'cos' or 'linear', got 'exp'"),
    (lambda o: P.OneCycleLR(o, [0.1, 0.2, 0.3], 10, cycle_momentum=False),
     "max_lr has 3 values, the optimizer has 2 parameter groups"),
    (lambda o: P.OneCycleLR(o, 0.1, 10, div_factor=0), "div_factor and final_div_factor "
                                                       "must be > 0"),
    (lambda o: P.OneCycleLR(o, 0.1, 10), "cycle_momentum=True needs an optimizer with a "
                                         "'momentum' (SGD, RMSprop) or 'betas' (Adam) option"),
    (lambda o: P.SequentialLR(o, [P.StepLR(o, 2), P.ExponentialLR(o, 0.9)], [2.5]),
     "milestones must be ints (the steps at which to switch), got [2.5]"),
    (lambda o: P.ChainedScheduler([]), "ChainedScheduler expects at least one scheduler"),
    (lambda o: P.ChainedScheduler([P.ExponentialLR(o, 0.9)], optimizer=FakeOptimizer(0.1)),
     "schedulers[0] (ExponentialLR) belongs to another optimizer"),
])
def test_bad_options_are_scheduler_errors_that_say_what_was_given(build, fragment):
    with pytest.raises(SchedulerError) as info:
        build(FakeOptimizer(*LRS))
    assert fragment in str(info.value)


@pytest.mark.parametrize("cls, tcls", [(pc.optim.SGD, torch.optim.SGD),
                                       (pc.optim.Adam, torch.optim.Adam)], ids=["sgd", "adam"])
def test_onecycle_trains_as_pytorchs(cls, tcls):
    """The schedule and the cycled momentum reach the update kernels: parameters after every
    step of a OneCycleLR run equal PyTorch's (float32)."""
    rng = np.random.default_rng(3)
    q = pc.default_queue()
    start = rng.standard_normal(5).astype(np.float32)
    p, t = pc.nn.Parameter(pc.Tensor.from_host(q, start)), torch.nn.Parameter(
        torch.from_numpy(start.copy()))
    opt, topt = cls([p], lr=0.01), tcls([t], lr=0.01)
    sched = P.OneCycleLR(opt, max_lr=0.3, total_steps=12)
    tsched = T.OneCycleLR(topt, max_lr=0.3, total_steps=12)
    for _ in range(12):
        g = rng.standard_normal(5).astype(np.float32)
        p.grad, t.grad = pc.Tensor.from_host(q, g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=2e-5, atol=2e-6)
    assert not np.allclose(p.value.to_host(), start, atol=0.05)


def test_multiplicative_lr_resumed_or_restarted_at_a_milestone_multiplies_as_pytorch():
    """MultiplicativeLR keeps the rate only at its constructor's step: made with last_epoch=3
    it used to multiply once more there (0.1 * 0.5^4 = 0.00625 where PyTorch keeps 0.0125),
    and restarted at a SequentialLR milestone it skipped lr_lambda(0) (0.1 where PyTorch's is
    0.05), every later rate twice PyTorch's, silently."""
    def resumed(S, o):
        first = S.MultiplicativeLR(o, lambda t: 0.5)
        trace(first, o, 3)
        return S.MultiplicativeLR(o, lambda t: 0.5, last_epoch=3)

    def restarted(S, o):
        return S.SequentialLR(o, [S.ConstantLR(o, 0.5, total_iters=3),
                                  S.MultiplicativeLR(o, lambda t: 0.5)], milestones=[4])

    for make, first in ((resumed, 0.0125), (restarted, 0.05)):
        t_opt, p_opt = torch_optimizer(0.1), FakeOptimizer(0.1)
        want = trace(make(T, t_opt), t_opt, 8)
        got = trace(make(P, p_opt), p_opt, 8)
        assert got == want
        # the rate the run continues at: the resumed constructor's, the milestone's
        assert want[0 if make is resumed else 4] == [pytest.approx(first)]
