"""Optimizers and schedulers against PyTorch where parcl raised or went its own way: each test
its reproducer, with what parcl did and what PyTorch does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.optim import SGD, Adam, AdamW, OptimizerError, RMSprop
from parcl.optim.lr_scheduler import CyclicLR, LinearLR


def test_nesterov_sgd_steps_through_a_momentum_a_scheduler_cycles_to_zero_as_pytorch(queue):
    """PyTorch checks nesterov against the momentum when the optimizer is made; a step takes
    the group's options as they are, so CyclicLR(base_momentum=0) under nesterov passes its
    momentum through 0 (a plain SGD step) and goes on. parcl checked it at every step and
    raised 'nesterov momentum requires momentum > 0' at the third step, mid-run, and a state
    saved there could not be loaded; now the weights follow PyTorch's: 0.981, 0.890, 0.790,
    0.694, 0.662, 0.554."""
    p = pc.nn.Parameter.from_host(queue, np.ones(2, np.float32))
    t = torch.nn.Parameter(torch.ones(2))
    opt = SGD([p], lr=0.1, momentum=0.9, nesterov=True)
    t_opt = torch.optim.SGD([t], lr=0.1, momentum=0.9, nesterov=True)
    sched = CyclicLR(opt, 0.01, 0.1, step_size_up=2, base_momentum=0.0, max_momentum=0.9)
    t_sched = torch.optim.lr_scheduler.CyclicLR(t_opt, 0.01, 0.1, step_size_up=2,
                                                base_momentum=0.0, max_momentum=0.9)
    momenta, weights = [], []
    for _ in range(6):
        p.grad = pc.Tensor.from_host(queue, np.ones(2, np.float32))
        t.grad = torch.ones(2)
        opt.step()
        t_opt.step()
        sched.step()
        t_sched.step()
        momenta.append(opt.param_groups[0]["momentum"])
        weights.append(p.value.to_host()[0])
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=1e-6)
    assert momenta == [0.45, 0.0, 0.45, 0.9, 0.45, 0.0]
    np.testing.assert_allclose(weights, [0.981, 0.8901, 0.7901, 0.6942, 0.6618, 0.5544],
                               atol=1e-4)
    fresh = SGD([pc.nn.Parameter.from_host(queue, p.value.to_host())], lr=0.1, momentum=0.9,
                nesterov=True)
    fresh.load_state_dict(opt.state_dict())          # saved at momentum 0
    assert fresh.param_groups[0]["momentum"] == 0.0 and fresh.param_groups[0]["nesterov"]


def test_an_optimizer_refuses_a_non_leaf_as_pytorch(queue):
    """PyTorch refuses ``SGD([leaf * 2])``: 'can't optimize a non-leaf Tensor'. parcl took it
    and stepped the product's buffer in place (2 -> 1.6 -> 1.28 -> 1.024 under sum(w * w))
    while the Parameter it came from stayed 1.0 and that Parameter's gradient, which no
    zero_grad of the optimizer reached, piled up (8, 14.4, 19.52), silently. Now an
    OptimizerError (a ValueError, as PyTorch's) names the op; so does add_param_group."""
    leaf = pc.nn.Parameter.from_host(queue, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="non-leaf"):
        torch.optim.SGD([torch.ones(3, requires_grad=True) * 2], lr=0.1)
    with pytest.raises(OptimizerError, match=r"shape \(3,\) is the output of 'mul', not a leaf"):
        SGD([leaf * 2.0], lr=0.1)
    opt = Adam([leaf])
    with pytest.raises(OptimizerError, match="not a leaf"):
        opt.add_param_group({"params": [tp.relu(leaf)]})
    assert len(opt.param_groups) == 1


def test_a_linear_decay_to_zero_steps_on_past_its_end_as_pytorch(queue):
    """LinearLR(start_factor=1/3, end_factor=0, total_iters=5) ends at -1.48e-18, not 0: its
    recursive form rounds a hair below, in PyTorch too, whose step takes it (a weight
    unchanged). parcl refused it at every step after ('invalid lr: -1.48e-18 (must be >= 0)'),
    so a run that trains on past the decay stopped there, and a state saved after the last
    scheduler step did not load; the range is checked where a group is made, as PyTorch's."""
    p = pc.nn.Parameter.from_host(queue, np.ones(2, np.float32))
    t = torch.nn.Parameter(torch.ones(2))
    opt, t_opt = SGD([p], lr=0.1), torch.optim.SGD([t], lr=0.1)
    sched = LinearLR(opt, start_factor=1 / 3, end_factor=0.0, total_iters=5)
    t_sched = torch.optim.lr_scheduler.LinearLR(t_opt, start_factor=1 / 3, end_factor=0.0,
                                                total_iters=5)
    for _ in range(7):
        p.grad = pc.Tensor.from_host(queue, np.ones(2, np.float32))
        t.grad = torch.ones(2)
        opt.step()
        t_opt.step()
        sched.step()
        t_sched.step()
        np.testing.assert_array_equal(p.value.to_host(), t.detach().numpy())
    assert sched.get_last_lr() == t_sched.get_last_lr() == [-1.480297366166875e-18]
    np.testing.assert_allclose(p.value.to_host(), [0.9, 0.9], rtol=1e-6)
    fresh = SGD([pc.nn.Parameter.from_host(queue, p.value.to_host())], lr=0.1)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.lr == -1.480297366166875e-18
    with pytest.raises(OptimizerError, match="invalid lr: -0.1"):
        SGD([p], lr=-0.1)                  # made with one: refused, as PyTorch's


@pytest.mark.parametrize("cls, options, moment", [
    (Adam, {}, "exp_avg_sq"), (AdamW, {}, "exp_avg_sq"), (RMSprop, {}, "square_avg"),
    (RMSprop, {"centered": True, "momentum": 0.5}, "square_avg")],
    ids=["Adam", "AdamW", "RMSprop", "RMSprop-centered"])
def test_a_gradient_spike_past_float32s_square_leaves_the_second_moment_finite_as_pytorch(
        queue, cls, options, moment):
    """PyTorch weighs g**2 as addcmul does, ((1 - beta2) * g) * g, so a spike of 3e19 in one
    step (a loss blow-up) leaves Adam's exp_avg_sq at 8.98e35, and the element trains on once
    the gradients are back to 1. parcl formed (1 - beta2) * (g * g), where g * g overflows
    float32 from |g| ~ 1.8e19: exp_avg_sq was inf, every later update of the element
    m / inf = 0, and its weight stayed 1.0 for good where PyTorch's went to 0.978 (RMSprop:
    1.0 where 0.9), silently. Now the moments and weights are PyTorch's (bit for bit here)."""
    p = pc.nn.Parameter.from_host(queue, np.ones(3, np.float32))
    t = torch.nn.Parameter(torch.ones(3))
    opt, t_opt = cls([p], lr=0.01, **options), getattr(torch.optim, cls.__name__)(
        [t], lr=0.01, **options)
    for g in ([3e19, 1e10, -2e19], [1.0, 1.0, 1.0], [1.0, -1.0, 1.0]):
        g = np.array(g, np.float32)
        p.grad, t.grad = pc.Tensor.from_host(queue, g), torch.from_numpy(g.copy())
        opt.step()
        t_opt.step()
    second = opt.state[p][moment].to_host()
    assert np.isfinite(second).all()
    np.testing.assert_allclose(second, t_opt.state[t][moment].numpy(), rtol=1e-6)
    np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=1e-6)
    assert p.value.to_host()[0] < 0.98


@pytest.mark.parametrize("name, moments", [
    ("NAdam", ["exp_avg_sq"]), ("RAdam", ["exp_avg_sq"]),
    ("Adadelta", ["square_avg", "acc_delta"])])
def test_a_gradient_spike_past_float32s_square_leaves_nadam_radam_adadelta_finite_as_pytorch(
        queue, name, moments):
    """NAdam, RAdam and Adadelta weigh their squares as PyTorch's addcmul, ((1 - beta2) * g)
    * g (Adadelta's delta too): a spike of 3e19 leaves NAdam's exp_avg_sq at 9.0e35 and the
    element trains on. parcl formed (1 - beta2) * (g * g), inf from |g| ~ 1.8e19, and froze
    the element for good: after the spike and 8 gradients of 1, NAdam's weight stayed 1.0
    where PyTorch's is 0.9955, Adadelta's 1.0 where PyTorch's is 0.99684 (its acc_delta 0
    where PyTorch's is 4.3e-7), silently."""
    p = pc.nn.Parameter.from_host(queue, np.ones(3, np.float32))
    t = torch.nn.Parameter(torch.ones(3))
    opt, t_opt = getattr(pc.optim, name)([p]), getattr(torch.optim, name)([t])
    for g in [[3e19, 1e10, -2e19]] + [[1.0, 1.0, 1.0]] * 8:
        g = np.array(g, np.float32)
        p.grad, t.grad = pc.Tensor.from_host(queue, g), torch.from_numpy(g.copy())
        opt.step()
        t_opt.step()
    for moment in moments:
        second = opt.state[p][moment].to_host()
        assert np.isfinite(second).all()
        np.testing.assert_allclose(second, t_opt.state[t][moment].numpy(), rtol=1e-6)
    np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=1e-6)
    assert p.value.to_host()[0] != 1.0


@pytest.mark.parametrize("name,kw", [
    ("SGD", {"lr": 0.1}), ("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.1}),
    ("RMSprop", {"lr": 0.1}), ("Adagrad", {"lr": 0.1})])
def test_no_weight_decay_leaves_an_infinite_weight_infinite_as_pytorch(queue, name, kw):
    """PyTorch adds ``weight_decay * p`` only when weight_decay is not 0: with none, an
    infinite weight stays infinite (and its neighbours train on). parcl always added it, and
    0 * inf made the weight NaN."""
    start = np.array([np.inf, 1.0, -np.inf], np.float32)
    p = pc.nn.Parameter.from_host(queue, start)
    t = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt, t_opt = getattr(pc.optim, name)([p], **kw), getattr(torch.optim, name)([t], **kw)
    for _ in range(2):
        p.grad = pc.Tensor.from_host(queue, np.array([0.5, 0.5, -0.5], np.float32))
        t.grad = torch.tensor([0.5, 0.5, -0.5])
        opt.step()
        t_opt.step()
    np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=1e-6)
    assert np.isinf(p.value.to_host()[[0, 2]]).all()


@pytest.mark.parametrize("name", ["SGD", "LBFGS"])
def test_a_step_with_a_closure_under_no_grad_records_the_closure_as_pytorch(queue, name):
    """PyTorch's step runs its closure with grad mode on, so ``with torch.no_grad():
    opt.step(closure)`` trains; parcl ran the closure under the caller's no_grad and its
    backward raised 'loss is a raw pc.Tensor ... no graph' for SGD and LBFGS alike."""
    start = np.array([1.0, -2.0], np.float32)
    w = pc.nn.Parameter(pc.Tensor.from_host(queue, start))
    tw = torch.nn.Parameter(torch.tensor(start))
    opt, topt = getattr(pc.optim, name)([w], lr=0.1), getattr(torch.optim, name)([tw], lr=0.1)

    def closure():
        opt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.sum(w * w)
        tape.backward(loss)
        return loss

    def torch_closure():
        topt.zero_grad()
        loss = (tw * tw).sum()
        loss.backward()
        return loss

    with tp.no_grad():
        loss = opt.step(closure)
        assert not tp.is_grad_enabled()           # the caller's mode is back after the step
    with torch.no_grad():
        want = topt.step(torch_closure)
    assert float(loss.item()) == pytest.approx(float(want.detach())) == 5.0
    np.testing.assert_allclose(w.value.to_host(), tw.detach().numpy(), rtol=1e-6)
    if name == "SGD":
        np.testing.assert_allclose(w.value.to_host(), [0.8, -1.6], rtol=1e-6)
