"""pc.optim.lr_scheduler against numpy transcriptions of PyTorch's documented formulas, step by
step; PyTorch's call order (the constructor's initial step, step() after optimizer.step());
state dicts and checkpoints that continue a schedule bit for bit. Mostly no device needed: the
schedulers only read and write ``optimizer.param_groups``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import parcl as pc
from parcl.optim.lr_scheduler import (CosineAnnealingLR, LambdaLR, LinearLR, SchedulerError,
                                      SequentialLR, StepLR)
from scheduler_fakes import CheckpointedOptimizer, FakeModel, FakeOptimizer


def run(sched, opt, steps):
    """Learning rates after the constructor (step 0) and after each of ``steps`` steps, as
    get_last_lr() reports them; each must be what the optimizer's groups hold."""
    out = [sched.get_last_lr()]
    for _ in range(steps):
        sched.step()
        out.append(sched.get_last_lr())
        assert out[-1] == [g["lr"] for g in opt.param_groups]
    return np.array(out)


# --- numpy transcriptions of the formulas in PyTorch's documentation ------------------------

def ref_cosine(bases, T, eta_min, steps):     # noqa: N803
    """The docs' recursive form: eta_{t} from eta_{t-1}, with the (2k+1) T_max branch."""
    lrs = [np.array(bases, np.float64)]
    for t in range(1, steps + 1):
        prev, base = lrs[-1], np.array(bases, np.float64)
        if (t - 1 - T) % (2 * T) == 0:
            lrs.append(prev + (base - eta_min) * (1 - np.cos(np.pi / T)) / 2)
        else:
            lrs.append((1 + np.cos(np.pi * t / T)) / (1 + np.cos(np.pi * (t - 1) / T))
                       * (prev - eta_min) + eta_min)
    return np.array(lrs)


def ref_cosine_closed(bases, T, eta_min, steps):     # noqa: N803
    t = np.arange(steps + 1)[:, None]
    return eta_min + (np.array(bases) - eta_min) * (1 + np.cos(np.pi * t / T)) / 2


def ref_linear(bases, start, end, total, steps):
    t = np.minimum(np.arange(steps + 1), total)[:, None]
    return np.array(bases) * (start + (end - start) * t / total)


def test_lambda_lr_is_base_times_lambda():
    opt = FakeOptimizer(0.1, 0.02)
    got = run(LambdaLR(opt, [lambda t: 0.9 ** t, lambda t: 1.0 / (t + 1)]), opt, 25)
    t = np.arange(26)
    np.testing.assert_allclose(got, np.stack([0.1 * 0.9 ** t, 0.02 / (t + 1)], axis=1),
                               rtol=1e-15, atol=0)


def test_step_lr_decays_every_step_size():
    opt = FakeOptimizer(0.5)
    got = run(StepLR(opt, step_size=4, gamma=0.3), opt, 25)
    want = 0.5 * 0.3 ** (np.arange(26) // 4)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("T, eta_min", [(7, 0.0), (7, 0.004), (10, 0.01), (1, 0.0)])
def test_cosine_annealing_follows_the_recursive_formula_through_the_wrap(T, eta_min):  # noqa: N803
    opt = FakeOptimizer(0.1, 0.03)
    steps = max(40, 5 * T)                        # several periods of 2 T_max: the wrap
    got = run(CosineAnnealingLR(opt, T_max=T, eta_min=eta_min), opt, steps)
    np.testing.assert_allclose(got, ref_cosine([0.1, 0.03], T, eta_min, steps), rtol=1e-13,
                               atol=1e-17)
    # ... which stays on the closed form, down to eta_min at T_max and back up at 2 T_max.
    np.testing.assert_allclose(got, ref_cosine_closed([0.1, 0.03], T, eta_min, steps),
                               rtol=0, atol=1e-12)
    assert got[T, 0] == pytest.approx(eta_min, abs=1e-12)
    assert got[2 * T, 0] == pytest.approx(0.1, abs=1e-12)


def test_linear_lr_warms_up_then_holds():
    opt = FakeOptimizer(0.2)
    got = run(LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=6), opt, 25)
    np.testing.assert_allclose(got, ref_linear([0.2], 0.1, 1.0, 6, 25), rtol=1e-13)
    assert got[0, 0] == pytest.approx(0.02) and np.all(got[6:] == got[6])


def test_linear_lr_defaults_and_decay():
    opt = FakeOptimizer(0.3)
    got = run(LinearLR(opt), opt, 10)                                   # 1/3 -> 1 over 5
    np.testing.assert_allclose(got, ref_linear([0.3], 1 / 3, 1.0, 5, 10), rtol=1e-13)
    opt = FakeOptimizer(0.3)
    got = run(LinearLR(opt, start_factor=1.0, end_factor=0.25, total_iters=8), opt, 20)
    np.testing.assert_allclose(got, ref_linear([0.3], 1.0, 0.25, 8, 20), rtol=1e-13)


def warmup_cosine(opt, warmup=5, total=30, eta_min=0.001):
    lin = LinearLR(opt, start_factor=0.1, total_iters=warmup)
    cos = CosineAnnealingLR(opt, T_max=total - warmup, eta_min=eta_min)
    return SequentialLR(opt, [lin, cos], milestones=[warmup])


def test_sequential_lr_warm_up_then_cosine():
    opt = FakeOptimizer(0.1, 0.05)
    got = run(warmup_cosine(opt), opt, 35)         # past the cosine's T_max too
    want = np.concatenate([ref_linear([0.1, 0.05], 0.1, 1.0, 5, 35)[:5],
                           ref_cosine([0.1, 0.05], 25, 0.001, 30)])
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert got[0, 0] == pytest.approx(0.01) and got[5, 0] == 0.1     # the milestone: step 0


def test_three_phases_and_constructor_order():
    opt = FakeOptimizer(1.0)
    s = SequentialLR(opt, [LinearLR(opt, start_factor=0.5, total_iters=2),
                           StepLR(opt, step_size=3, gamma=0.5),
                           LambdaLR(opt, lambda t: 0.01 * (t + 1))], milestones=[2, 8])
    got = run(s, opt, 12)[:, 0]
    want = [0.5, 0.75, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.01, 0.02, 0.03, 0.04, 0.05]
    np.testing.assert_allclose(got, want, rtol=1e-13)


# --- call order, state dicts --------------------------------------------------------------

def test_constructor_takes_the_initial_step():
    opt = FakeOptimizer(0.1)
    s = LinearLR(opt, start_factor=0.5, total_iters=4)
    assert s.last_epoch == 0 and opt.param_groups[0]["lr"] == 0.05 == s.get_last_lr()[0]
    assert opt.initial_lrs == [0.1] and s.base_lrs == [0.1]


@pytest.mark.parametrize("make", [
    lambda o: StepLR(o, 3, 0.5), lambda o: CosineAnnealingLR(o, 6, 0.01),
    lambda o: LinearLR(o, 0.2, 1.0, 7), warmup_cosine,
    lambda o: LambdaLR(o, lambda t: 1 / (1 + t))])
def test_state_dict_continues_the_schedule_bit_for_bit(make):
    opt = FakeOptimizer(0.1, 0.3)
    sched = make(opt)
    run(sched, opt, 11)
    saved = json.loads(json.dumps(sched.state_dict()))              # JSON-able, as saved
    group_lrs = [g["lr"] for g in opt.param_groups]                 # the optimizer's state
    rest = run(sched, opt, 20)[1:]

    fresh_opt = FakeOptimizer(0.1, 0.3)
    fresh = make(fresh_opt)
    for g, lr in zip(fresh_opt.param_groups, group_lrs):           # optimizer.load_state_dict
        g["lr"] = lr
    fresh.load_state_dict(saved)
    assert fresh.get_last_lr() == group_lrs and fresh.last_epoch == 11
    np.testing.assert_array_equal(run(fresh, fresh_opt, 20)[1:], rest)


def test_a_state_of_another_scheduler_is_refused_unchanged():
    opt = FakeOptimizer(0.1)
    cos = CosineAnnealingLR(opt, 10)
    before = cos.state_dict()
    with pytest.raises(SchedulerError, match="another scheduler"):
        cos.load_state_dict(StepLR(FakeOptimizer(0.1), 3).state_dict())
    with pytest.raises(SchedulerError, match="parameter groups"):
        cos.load_state_dict(CosineAnnealingLR(FakeOptimizer(0.1, 0.2), 10).state_dict())
    assert cos.state_dict() == before


@pytest.mark.parametrize("build, fragment", [
    (lambda o: StepLR(o, 0), "step_size must be a positive int"),
    (lambda o: CosineAnnealingLR(o, 0), "T_max must be a positive int"),
    (lambda o: LinearLR(o, start_factor=0.0), "start_factor must be in (0, 1]"),
    (lambda o: LambdaLR(o, [lambda t: 1.0] * 2), "expected 1 lr_lambdas"),
    (lambda o: SequentialLR(o, [StepLR(o, 2), StepLR(o, 3)], []), "need 1 milestones"),
    (lambda o: SequentialLR(o, [StepLR(FakeOptimizer(1.0), 2)], []), "another optimizer"),
])
def test_bad_options_are_scheduler_errors(build, fragment):
    with pytest.raises(SchedulerError) as info:
        build(FakeOptimizer(0.1))
    assert fragment in str(info.value)


# --- checkpoints ---------------------------------------------------------------------------

def test_save_and_load_keep_the_schedule(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    opt = CheckpointedOptimizer(0.1)
    sched = warmup_cosine(opt)
    run(sched, opt, 8)                                   # past the warm-up
    pc.save(path, FakeModel(1.0), opt, step=8, scheduler=sched)
    rest = run(sched, opt, 25)[1:]

    opt2 = CheckpointedOptimizer(0.1)
    sched2 = warmup_cosine(opt2)
    assert pc.load(path, FakeModel(), opt2, scheduler=sched2)["step"] == 8
    np.testing.assert_array_equal(run(sched2, opt2, 25)[1:], rest)


def test_checkpoint_refuses_a_scheduler_it_does_not_hold(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    opt = CheckpointedOptimizer(0.1)
    pc.save(path, FakeModel(1.0), opt, scheduler=StepLR(opt, 3))
    model, opt2 = FakeModel(), CheckpointedOptimizer(0.5)
    cos = CosineAnnealingLR(opt2, 10)
    with pytest.raises(pc.CheckpointError, match="StepLR scheduler's state, got a Cosine"):
        pc.load(path, model, opt2, scheduler=cos)
    assert model.w[0] == 0.0 and opt2.param_groups[0]["lr"] == 0.5
    pc.save(path, FakeModel(1.0), opt)
    with pytest.raises(pc.CheckpointError, match="no scheduler state"):
        pc.load(path, model, opt2, scheduler=cos)
    assert model.w[0] == 0.0


def test_a_scheduler_refusal_rolls_model_and_optimizer_back(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    opt = CheckpointedOptimizer(0.1)
    pc.save(path, FakeModel(1.0), opt, scheduler=StepLR(opt, 3))
    opt2 = CheckpointedOptimizer(0.5)
    other = StepLR(CheckpointedOptimizer(0.5, 0.6), 3)      # same class, two groups
    other.optimizer = opt2
    model = FakeModel()
    with pytest.raises(pc.CheckpointError,
                       match="scheduler.load_state_dict refused.*nothing was changed"):
        pc.load(path, model, opt2, scheduler=other)
    assert model.w[0] == 0.0 and opt2.param_groups[0]["lr"] == 0.5


# --- with parcl's optimizers (one device) ----------------------------------------------------

def test_scheduler_drives_a_real_optimizer(queue):
    p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.ones(4, np.float32)))
    opt = pc.optim.SGD([p], lr=0.5)
    sched = pc.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 ** t)
    expected = np.ones(4)
    for t in range(4):
        p.grad = pc.Tensor.from_host(queue, np.ones(4, np.float32))
        opt.step()
        expected -= 0.5 * 0.5 ** t
        sched.step()
        assert opt.lr == 0.5 * 0.5 ** (t + 1)
    np.testing.assert_allclose(p.value.to_host(), expected, rtol=1e-6)
    # The optimizer's own state dict is PyTorch's layout: the scheduler's initial_lr joins
    # each group's options.
    assert opt.state_dict()["param_groups"][0].keys() == {"lr", "momentum", "weight_decay",
                                                          "nesterov", "initial_lr", "params"}
    fresh = pc.optim.SGD([p], lr=0.5)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.lr == opt.lr and fresh.initial_lrs == [0.5]


def test_an_optimizer_refusal_puts_the_scheduler_back(tmp_path):
    class Picky(CheckpointedOptimizer):
        def load_state_dict(self, d):
            raise ValueError("picky optimizer says no")

    path = tmp_path / "ckpt.safetensors"
    opt = CheckpointedOptimizer(0.1)
    sched = StepLR(opt, 3)
    run(sched, opt, 7)
    pc.save(path, FakeModel(1.0), opt, scheduler=sched)
    opt2 = Picky(0.1)
    sched2 = StepLR(opt2, 3)
    before = sched2.state_dict()
    with pytest.raises(pc.CheckpointError, match="picky optimizer says no"):
        pc.load(path, FakeModel(), opt2, scheduler=sched2)
    assert sched2.state_dict() == before and sched2.last_epoch == 0
