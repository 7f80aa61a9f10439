"""ReduceLROnPlateau, CosineAnnealingWarmRestarts, PolynomialLR and CyclicLR against PyTorch's
own schedulers, step by step and bit for bit (float64 learning rates): each case builds the
same schedule with ``torch.optim.lr_scheduler`` and ``pc.optim.lr_scheduler``. Also inside
SequentialLR and ChainedScheduler, fractional epochs, momentum cycled on parcl's optimizers,
state dicts and checkpoints that continue a schedule bit for bit, and refused options. Mostly
no device needed: the schedulers only read and write ``optimizer.param_groups``."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import parcl as pc
from parcl.optim import lr_scheduler as P
from parcl.optim.lr_scheduler import SchedulerError
from scheduler_fakes import CheckpointedOptimizer, FakeModel, FakeOptimizer, torch_optimizer

T = torch.optim.lr_scheduler
LRS = (0.1, 0.03)                  # two parameter groups


def parcl_optimizer(cls, *lrs, **kw):
    q = pc.default_queue()
    return cls([{"params": [pc.nn.Parameter(pc.Tensor.zeros(q, (2,)))], "lr": lr}
                for lr in lrs], lr=lrs[0], **kw)


def trace(sched, opt, steps, key="lr", args=()):
    """``group[key]`` of every group after the constructor and after each step (``args``: one
    tuple of step arguments per step, where given)."""
    out = [[g[key] for g in opt.param_groups]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # torch: "step() before optimizer.step()", epoch
        for i in range(steps):
            sched.step(*(args[i] if args else ()))
            out.append([tuple(g[key]) if key == "betas" else g[key] for g in opt.param_groups])
            assert list(sched.get_last_lr()) == [g["lr"] for g in opt.param_groups]
    return out


CASES = {
    "polynomial": lambda S, o: S.PolynomialLR(o, total_iters=8, power=2.0),
    "polynomial-defaults": lambda S, o: S.PolynomialLR(o),
    "polynomial-power-0.5": lambda S, o: S.PolynomialLR(o, total_iters=13, power=0.5),
    "warm-restarts": lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=3),
    "warm-restarts-mult": lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2,
                                                                     eta_min=0.01),
    "cyclic-triangular": lambda S, o: S.CyclicLR(o, 0.01, 0.1, step_size_up=3,
                                                 cycle_momentum=False),
    "cyclic-triangular2-per-group": lambda S, o: S.CyclicLR(
        o, [0.01, 0.002], [0.1, 0.05], step_size_up=4, step_size_down=2, mode="triangular2",
        cycle_momentum=False),
    "cyclic-exp-range": lambda S, o: S.CyclicLR(o, 0.01, 0.1, step_size_up=2, mode="exp_range",
                                                gamma=0.9, cycle_momentum=False),
    "cyclic-scale-fn-iterations": lambda S, o: S.CyclicLR(
        o, 0.01, 0.1, step_size_up=3, scale_fn=lambda x: 1.0 / (1.0 + x),
        scale_mode="iterations", cycle_momentum=False),
    "cyclic-down-0": lambda S, o: S.CyclicLR(o, 0.01, 0.1, step_size_up=3, step_size_down=0,
                                             cycle_momentum=False),
    "sequential-linear-then-warm-restarts": lambda S, o: S.SequentialLR(
        o, [S.LinearLR(o, 0.5, total_iters=2), S.CosineAnnealingWarmRestarts(o, T_0=3,
                                                                             T_mult=2)],
        milestones=[4]),
    "sequential-warm-restarts-then-polynomial": lambda S, o: S.SequentialLR(
        o, [S.CosineAnnealingWarmRestarts(o, T_0=2), S.PolynomialLR(o, 5)], milestones=[5]),
    "sequential-polynomial-then-cyclic": lambda S, o: S.SequentialLR(
        o, [S.PolynomialLR(o, 4), S.CyclicLR(o, 0.01, 0.1, 2, cycle_momentum=False)],
        milestones=[6]),
    "chained-cyclic-exponential": lambda S, o: S.ChainedScheduler(
        [S.CyclicLR(o, 0.01, 0.1, 3, cycle_momentum=False), S.ExponentialLR(o, 0.95)]),
    "chained-warm-restarts-constant": lambda S, o: S.ChainedScheduler(
        [S.ConstantLR(o, 0.5, 4), S.CosineAnnealingWarmRestarts(o, T_0=3)]),
}


def build(name, S, o):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CASES[name](S, o)


STEPS = 21


@pytest.mark.parametrize("name", CASES)
def test_each_schedule_equals_pytorchs_bit_for_bit(name):
    t_opt, p_opt = torch_optimizer(*LRS), FakeOptimizer(*LRS)
    want = trace(build(name, T, t_opt), t_opt, STEPS)
    got = trace(build(name, P, p_opt), p_opt, STEPS)
    assert got == want


@pytest.mark.parametrize("T_mult", [1, 2, 3])
def test_warm_restarts_take_fractional_epochs_as_pytorch(T_mult):  # noqa: N803
    """step(epoch) jumps (SGDR's per-batch use: epoch + i / iters), forwards and back."""
    epochs = [(e,) for e in (0.25, 0.5, 1.0, 1.75, 2, 2.5, 3.0, 7.25, 20, 3, 0.0, 14.5, 100.75)]
    epochs += [()] * 4 + [(5.5,)] + [()] * 3       # plain steps after a fractional one
    make = lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=T_mult,  # noqa: E731
                                                      eta_min=0.001)
    t_opt, p_opt = torch_optimizer(*LRS), FakeOptimizer(*LRS)
    t_sched, p_sched = make(T, t_opt), make(P, p_opt)
    assert trace(p_sched, p_opt, len(epochs), args=epochs) == trace(t_sched, t_opt,
                                                                    len(epochs), args=epochs)
    assert (p_sched.T_cur, p_sched.T_i, p_sched.last_epoch) == (t_sched.T_cur, t_sched.T_i,
                                                                t_sched.last_epoch)


# -- ReduceLROnPlateau -----------------------------------------------------------------------
PLATEAU_METRICS = [1.0, 0.9, 0.95, 0.95, 0.9, 0.9, 0.91, 0.5, 0.5, 0.5, 0.5, 0.49999, 0.6,
                   0.7, 0.8, 0.4, 0.41, 0.42, 0.43, 0.44, 0.45, 0.45, 0.45, 0.45, 0.3, float("nan"),
                   0.3, 0.3, 0.3, 0.3]
PLATEAU_CASES = {
    "defaults": {},
    "min-rel-patience-1": {"patience": 1, "factor": 0.5},
    "min-abs-cooldown": {"patience": 0, "threshold": 0.01, "threshold_mode": "abs",
                         "cooldown": 2, "factor": 0.3},
    "max-rel": {"mode": "max", "patience": 2, "factor": 0.5},
    "max-abs-min-lr-per-group": {"mode": "max", "threshold_mode": "abs", "patience": 0,
                                 "min_lr": [0.02, 0.001], "factor": 0.5},
    "eps-skips-small-reductions": {"patience": 0, "factor": 0.9, "eps": 0.004},
    "factor-0-min-lr": {"patience": 1, "factor": 0.0, "min_lr": 0.005},
}


@pytest.mark.parametrize("options", PLATEAU_CASES.values(), ids=PLATEAU_CASES)
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["metrics", "negated"])
def test_reduce_on_plateau_equals_pytorchs(options, sign):
    metrics = [(sign * m,) for m in PLATEAU_METRICS]
    t_opt, p_opt = torch_optimizer(*LRS), FakeOptimizer(*LRS)
    t_sched = T.ReduceLROnPlateau(t_opt, **options)
    p_sched = P.ReduceLROnPlateau(p_opt, **options)
    got = trace(p_sched, p_opt, len(metrics), args=metrics)
    assert got == trace(t_sched, t_opt, len(metrics), args=metrics)
    want = t_sched.state_dict()
    mine = p_sched.state_dict()
    assert set(mine) <= set(want)                                  # PyTorch's keys
    for key, value in mine.items():
        assert value == want[key] or (value != value and want[key] != want[key]), key


def test_reduce_on_plateau_takes_a_tensor_metric(queue):
    opt = FakeOptimizer(0.1)
    sched = P.ReduceLROnPlateau(opt, patience=0)
    sched.step(pc.Tensor.from_host(queue, np.array(2.0, np.float32)))
    sched.step(pc.Tensor.from_host(queue, np.array(3.0, np.float32)))
    assert sched.best == 2.0 and opt.param_groups[0]["lr"] == pytest.approx(0.01)
    with pytest.raises(SchedulerError, match="metrics must be a number"):
        sched.step("low")


def test_reduce_on_plateau_follows_a_group_added_later_as_pytorch():
    """A single min_lr covers a group added with add_param_group (PyTorch's default_min_lr);
    a list of them does not: a SchedulerError, nothing changed."""
    for min_lr in (0.0, [0.0]):
        opt = FakeOptimizer(0.1)
        sched = P.ReduceLROnPlateau(opt, patience=0, min_lr=min_lr)
        sched.step(1.0)
        opt.param_groups.append({"lr": 0.5, "params": [1]})
        if isinstance(min_lr, list):
            before = sched.state_dict()
            with pytest.raises(SchedulerError, match="set scheduler.min_lrs"):
                sched.step(2.0)
            assert sched.state_dict() == before
        else:
            sched.step(2.0)
            assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01, 0.05])


@pytest.mark.parametrize("compose", [
    lambda o, r: P.SequentialLR(o, [P.StepLR(o, 2), r], milestones=[3]),
    lambda o, r: P.ChainedScheduler([P.StepLR(o, 2), r])])
def test_reduce_on_plateau_cannot_be_composed_as_in_pytorch(compose):
    opt = FakeOptimizer(0.1)
    with pytest.raises(SchedulerError, match=r"schedulers\[1\] is a ReduceLROnPlateau"):
        compose(opt, P.ReduceLROnPlateau(opt))


# -- momentum cycled on parcl's optimizers ----------------------------------------------------
@pytest.mark.parametrize("t_cls, p_cls, key, kw", [
    (torch.optim.SGD, pc.optim.SGD, "momentum", {"momentum": 0.0}),
    (torch.optim.RMSprop, pc.optim.RMSprop, "momentum", {}),
    (torch.optim.Adam, pc.optim.Adam, "betas", {"betas": (0.9, 0.99)})],
    ids=["SGD", "RMSprop", "Adam"])
def test_cyclic_lr_cycles_momentum_or_beta1_as_pytorch(queue, t_cls, p_cls, key, kw):
    make = lambda S, o: S.CyclicLR(o, [0.01, 0.02], 0.1, step_size_up=3,  # noqa: E731
                                   mode="triangular2", base_momentum=[0.8, 0.7])
    t_opt, p_opt = torch_optimizer(*LRS, cls=t_cls, **kw), parcl_optimizer(p_cls, *LRS, **kw)
    t_sched, p_sched = make(T, t_opt), make(P, p_opt)
    assert trace(p_sched, p_opt, 15, key) == trace(t_sched, t_opt, 15, key)
    assert [g["lr"] for g in p_opt.param_groups] == [g["lr"] for g in t_opt.param_groups]
    assert "max_momentum" not in p_opt.param_groups[0]             # the optimizer's options only
    p_opt.step()                                   # the options it set are valid ones


def test_cyclic_lr_refuses_momentum_on_adagrad_as_pytorch(queue):
    with pytest.raises(ValueError, match="momentum"):
        T.CyclicLR(torch_optimizer(0.1, cls=torch.optim.Adagrad), 0.01, 0.1)
    opt = parcl_optimizer(pc.optim.Adagrad, 0.1)
    with pytest.raises(SchedulerError, match="pass cycle_momentum=False"):
        P.CyclicLR(opt, 0.01, 0.1)
    P.CyclicLR(opt, 0.01, 0.1, cycle_momentum=False)


# -- state dicts and checkpoints ---------------------------------------------------------------
class Scale:
    """A callable object: its attributes are saved (PyTorch saves a callable's __dict__)."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, x):
        return self.rate ** x


RESUMABLE = {
    "polynomial": CASES["polynomial"],
    "warm-restarts-mult": CASES["warm-restarts-mult"],
    "cyclic-triangular2-per-group": CASES["cyclic-triangular2-per-group"],
    "cyclic-scale-object": lambda S, o: S.CyclicLR(o, 0.01, 0.1, 3, scale_fn=Scale(0.8),
                                                   cycle_momentum=False),
    "sequential-linear-then-warm-restarts": CASES["sequential-linear-then-warm-restarts"],
    "chained-cyclic-exponential": CASES["chained-cyclic-exponential"],
}


@pytest.mark.parametrize("name", RESUMABLE)
def test_a_saved_state_continues_the_schedule_bit_for_bit(name):
    opt = FakeOptimizer(*LRS)
    sched = RESUMABLE[name](P, opt)
    trace(sched, opt, 7)
    saved = json.loads(json.dumps(sched.state_dict()))
    lrs = [g["lr"] for g in opt.param_groups]
    rest = trace(sched, opt, 15)

    fresh_opt = FakeOptimizer(*LRS)
    fresh = RESUMABLE[name](P, fresh_opt)
    if name == "cyclic-scale-object":
        fresh._scale_fn_custom.rate = 0.1                # restored by the load
    for g, lr in zip(fresh_opt.param_groups, lrs):
        g["lr"] = lr
    fresh.load_state_dict(saved)
    assert trace(fresh, fresh_opt, 15) == rest


def test_a_plateau_state_continues_bit_for_bit_through_a_checkpoint(tmp_path):
    """Through pc.save / pc.load, its infinite best (before any step) included."""
    path = tmp_path / "ckpt.safetensors"
    metrics = [(m,) for m in PLATEAU_METRICS]
    for done in (0, 9):
        opt = CheckpointedOptimizer(*LRS)
        sched = P.ReduceLROnPlateau(opt, patience=1, cooldown=1, factor=0.5)
        trace(sched, opt, done, args=metrics)
        pc.save(path, FakeModel(1.0), opt, step=done, scheduler=sched)
        saved = sched.state_dict()
        rest = trace(sched, opt, 12, args=metrics[done:])
        opt2 = CheckpointedOptimizer(*LRS)
        sched2 = P.ReduceLROnPlateau(opt2, patience=1, cooldown=1, factor=0.5)
        pc.load(path, FakeModel(), opt2, scheduler=sched2)
        assert sched2.state_dict() == saved
        assert sched2.best == (math.inf if done == 0 else 0.5)
        assert trace(sched2, opt2, 12, args=metrics[done:]) == rest


@pytest.mark.parametrize("name", ["warm-restarts-mult", "cyclic-exp-range", "polynomial"])
def test_a_checkpoint_keeps_the_schedule(tmp_path, name):
    path = tmp_path / "ckpt.safetensors"
    opt = CheckpointedOptimizer(*LRS)
    sched = build(name, P, opt)
    trace(sched, opt, 5)
    pc.save(path, FakeModel(1.0), opt, step=5, scheduler=sched)
    rest = trace(sched, opt, 12)
    opt2 = CheckpointedOptimizer(*LRS)
    sched2 = build(name, P, opt2)
    pc.load(path, FakeModel(), opt2, scheduler=sched2)
    assert trace(sched2, opt2, 12) == rest


def test_a_plateau_state_of_another_scheduler_is_refused_unchanged():
    opt = FakeOptimizer(*LRS)
    sched = P.ReduceLROnPlateau(opt)
    sched.step(1.0)
    before = sched.state_dict()
    with pytest.raises(SchedulerError, match="another scheduler"):
        sched.load_state_dict(P.StepLR(FakeOptimizer(*LRS), 3).state_dict())
    with pytest.raises(SchedulerError, match="parameter groups"):
        sched.load_state_dict(P.ReduceLROnPlateau(FakeOptimizer(0.1)).state_dict())
    assert sched.state_dict() == before


# -- refused options -------------------------------------------------------------------------
@pytest.mark.parametrize("build_, fragment", [
    (lambda o: P.ReduceLROnPlateau(o, factor=1.0), "factor must be in [0, 1)"),
    (lambda o: P.ReduceLROnPlateau(o, mode="lowest"), "mode must be 'min' or 'max'"),
    (lambda o: P.ReduceLROnPlateau(o, threshold_mode="relative"), "threshold_mode must be"),
    (lambda o: P.ReduceLROnPlateau(o, min_lr=[0.0, 0.0]), "expected 1 min_lrs"),
    (lambda o: P.ReduceLROnPlateau(o, patience=-1), "patience must be an int >= 0"),
    (lambda o: P.ReduceLROnPlateau(o, cooldown=1.5), "cooldown must be an int >= 0"),
    (lambda o: P.CosineAnnealingWarmRestarts(o, T_0=0), "T_0 must be a positive int"),
    (lambda o: P.CosineAnnealingWarmRestarts(o, T_0=2.0), "T_0 must be a positive int"),
    (lambda o: P.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=0), "T_mult must be a positive"),
    (lambda o: P.CosineAnnealingWarmRestarts(o, 2, eta_min="0"), "eta_min must be a number"),
    (lambda o: P.CosineAnnealingWarmRestarts(o, 2).step(-1), "non-negative epoch"),
    (lambda o: P.CosineAnnealingWarmRestarts(o, 2).step(math.nan), "epoch must be finite"),
    (lambda o: P.PolynomialLR(o, total_iters=0), "total_iters must be a positive int"),
    (lambda o: P.PolynomialLR(o, power=-1.0), "power must be >= 0"),
    (lambda o: P.CyclicLR(o, 0.01, 0.1, mode="sawtooth", cycle_momentum=False), "mode must be"),
    (lambda o: P.CyclicLR(o, 0.01, 0.1, step_size_up=0, cycle_momentum=False),
     "step_size_up must be > 0"),
    (lambda o: P.CyclicLR(o, [0.01, 0.02], 0.1, cycle_momentum=False), "base_lr has 2 values"),
    (lambda o: P.CyclicLR(o, 0.01, 0.1, scale_fn=lambda x: 1.0, scale_mode="epoch",
                          cycle_momentum=False), "scale_mode must be"),
    (lambda o: P.CyclicLR(o, 0.01, 0.1), "cycle_momentum=True needs an optimizer"),
])
def test_bad_options_are_scheduler_errors(build_, fragment):
    with pytest.raises(SchedulerError) as info:
        build_(FakeOptimizer(0.1))
    assert fragment in str(info.value)


@pytest.mark.parametrize("make_sched", [
    lambda o: P.CyclicLR(o, 0.01, 0.1, step_size_up=3, base_momentum=0.5, max_momentum=0.9),
    lambda o: P.ReduceLROnPlateau(o, patience=0, factor=0.5)], ids=["CyclicLR", "Plateau"])
def test_a_real_optimizer_and_its_schedule_resume_from_a_checkpoint_bit_for_bit(
        queue, tmp_path, make_sched):
    """RMSprop's parameters, state, learning rate and momentum, stepped by the schedule, go
    on after pc.load exactly as without the checkpoint."""
    rng = np.random.default_rng(0)
    grads = [(rng.standard_normal((1, 5)).astype(np.float32),
              rng.standard_normal(1).astype(np.float32)) for _ in range(10)]
    metrics = [1.0, 0.9, 0.95, 0.97, 0.5, 0.6, 0.7, 0.4, 0.45, 0.5]

    def setup(seed):
        pc.nn.manual_seed(seed)
        model = pc.nn.Linear(5, 1, queue=queue)
        opt = pc.optim.RMSprop(model.parameters(), lr=0.05, centered=True)
        return model, opt, make_sched(opt)

    def go(model, opt, sched, steps):
        for i in steps:
            for p, g in zip(model.parameters(), grads[i]):
                p.grad = pc.Tensor.from_host(queue, g)
            opt.step()
            sched.step(*([metrics[i]] if isinstance(sched, P.ReduceLROnPlateau) else []))
        return ([p.value.to_host() for p in model.parameters()],
                dict(opt.param_groups[0], params=None))

    model, opt, sched = setup(0)
    go(model, opt, sched, range(4))
    path = tmp_path / "ckpt.safetensors"
    pc.save(path, model, opt, step=4, scheduler=sched)
    want = go(model, opt, sched, range(4, 10))
    model2, opt2, sched2 = setup(1)
    pc.load(path, model2, opt2, scheduler=sched2)
    got = go(model2, opt2, sched2, range(4, 10))
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]
