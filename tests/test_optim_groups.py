"""Optimizer.add_param_group as PyTorch's, with torch.optim beside it: options a group leaves
out come from the constructor's; a parameter already in a group is refused and a refused
group changes nothing; the added parameters are numbered after the others in state dicts;
training with a group added half-way equals PyTorch's, also through a ReplicaGroup's flat
buckets; schedulers made before the group was added do what PyTorch's do."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.optim import SGD, Adam, AdamW, FlatBucket, OptimizerError
from parcl.optim import lr_scheduler as P
from parcl.optim.lr_scheduler import SchedulerError
from parcl.replica import ReplicaGroup

SHAPES = [(3, 4), (4,), (2,)]
OPTIMIZERS = {"sgd-momentum": (SGD, torch.optim.SGD, dict(momentum=0.9, weight_decay=1e-2)),
              "adam": (Adam, torch.optim.Adam, dict(betas=(0.8, 0.99), weight_decay=1e-2)),
              "adamw": (AdamW, torch.optim.AdamW, dict(eps=1e-6))}


def both(queue, rng, shapes=SHAPES):
    """The same starting values as parcl Parameters and as torch Parameters."""
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return ([pc.nn.Parameter.from_host(queue, v) for v in values],
            [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values])


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_added_group_takes_the_constructors_options_as_pytorch(queue, rng, name):
    cls, tcls, kw = OPTIMIZERS[name]
    ps, ts = both(queue, rng)
    opt, topt = cls([ps[0]], lr=0.1, **kw), tcls([ts[0]], lr=0.1, **kw)
    opt.add_param_group({"params": ps[1], "lr": 0.01})        # one Parameter, not a list
    topt.add_param_group({"params": ts[1], "lr": 0.01})
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["params"] == [ps[1]]
    for mine, theirs in zip(opt.param_groups, topt.param_groups):
        assert set(mine) <= set(theirs)
        for key in set(mine) - {"params"}:
            assert mine[key] == theirs[key], key
    assert opt.defaults == {k: opt.param_groups[0][k] for k in opt.defaults}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_training_with_a_group_added_half_way_equals_pytorch(queue, rng, name):
    """Two steps of the first parameter, then the others join with their own options, three
    more steps of all: values after every step and the state dict's numbering as PyTorch's."""
    cls, tcls, kw = OPTIMIZERS[name]
    ps, ts = both(queue, rng)
    opt, topt = cls([ps[0]], lr=0.05, **kw), tcls([ts[0]], lr=0.05, **kw)
    for step in range(5):
        if step == 2:
            opt.add_param_group({"params": ps[1:], "lr": 0.02, "weight_decay": 0.0})
            topt.add_param_group({"params": ts[1:], "lr": 0.02, "weight_decay": 0.0})
        for p, t in zip(ps, ts):
            g = rng.standard_normal(t.shape).astype(np.float32)
            p.grad, t.grad = pc.Tensor.from_host(queue, g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        for p, t in zip(ps, ts):
            np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=2e-5,
                                       atol=2e-6)
    mine, theirs = opt.state_dict(), topt.state_dict()
    assert [g["params"] for g in mine["param_groups"]] == [[0], [1, 2]]
    assert [g["params"] for g in mine["param_groups"]] == [g["params"]
                                                          for g in theirs["param_groups"]]
    assert sorted(mine["state"]) == sorted(theirs["state"]) == [0, 1, 2]
    for i, entry in mine["state"].items():
        for key, value in entry.items():
            want = theirs["state"][i][key]
            if key == "step":
                assert value == int(want) == (5 if i == 0 else 3)
            else:
                np.testing.assert_allclose(value, want.numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("group, error, fragment", [
    (lambda ps: {"params": [ps[2], ps[0]]}, OptimizerError,
     "appears more than once (in two parameter groups"),
    (lambda ps: {"params": [ps[2], ps[2]]}, OptimizerError, "appears more than once"),
    (lambda ps: {"params": [ps[2]], "momentun": 0.9}, OptimizerError,
     "unknown options ['momentun']; SGD has ['lr', 'momentum', 'nesterov', 'weight_decay']"),
    (lambda ps: {"params": [ps[2]], "lr": -1.0}, OptimizerError, "invalid lr: -1.0"),
    (lambda ps: {"params": [ps[2]], "nesterov": True, "momentum": 0.0}, OptimizerError,
     "nesterov momentum requires momentum > 0"),
    (lambda ps: {"params": {ps[2]}}, OptimizerError, "set"),
    (lambda ps: {"lr": 0.1}, OptimizerError, "'params' entry"),
    (lambda ps: [ps[2]], TypeError, "param_group must be a dict, got list"),
    (lambda ps: {"params": [ps[2], np.zeros(2)]}, TypeError, "got ndarray"),
], ids=["already-in-a-group", "twice", "unknown-option", "bad-lr", "bad-combination", "set",
        "no-params", "not-a-dict", "not-a-parameter"])
def test_a_refused_group_changes_nothing(queue, rng, group, error, fragment):
    ps, _ = both(queue, rng)
    opt = SGD(ps[:2], lr=0.1)
    with pytest.raises(error) as info:
        opt.add_param_group(group(ps))
    assert fragment in str(info.value)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == ps[:2]
    opt.add_param_group({"params": [ps[2]]})       # the refused one's new parameter still can
    assert opt.param_groups[1]["params"] == [ps[2]]


def test_a_state_saved_after_adding_fits_optimizers_with_those_groups_only(queue, rng):
    ps, _ = both(queue, rng)
    opt = Adam([ps[0]], lr=0.1)
    opt.add_param_group({"params": ps[1:], "lr": 0.01})
    for p in ps:
        p.grad = pc.Tensor.from_host(queue, rng.standard_normal(p.shape).astype(np.float32))
    opt.step()
    saved = opt.state_dict()

    same = Adam([{"params": [ps[0]]}, {"params": ps[1:], "lr": 0.5}], lr=0.1)
    same.load_state_dict(saved)
    assert same.param_groups[1]["lr"] == 0.01
    np.testing.assert_array_equal(same.state[ps[2]]["exp_avg"].to_host(),
                                  saved["state"][2]["exp_avg"])
    grown = Adam([ps[0]], lr=0.1)
    with pytest.raises(OptimizerError, match="2 param_groups given, the optimizer has 1"):
        grown.load_state_dict(saved)
    assert grown.state == {}
    grown.add_param_group({"params": ps[1:]})
    grown.load_state_dict(saved)
    assert grown.state[ps[1]]["step"] == 1


def test_a_flat_bucket_split_over_two_groups_is_stepped_parameter_by_parameter(queue):
    """Two parameters viewing one flat buffer, in two groups with their own learning rates:
    no whole-bucket update (it would apply one lr to both), each its own, both right."""
    n = 64                           # 256 bytes: sub-buffers start at aligned offsets
    value, grad = pc.Tensor.zeros(queue, (2 * n,)), pc.Tensor.full(queue, (2 * n,), 1.0)

    def view(t, off):
        return t.view_of(t.data.get_sub_region(off * 4, n * 4), (n,))

    a, b = pc.nn.Parameter(view(value, 0)), pc.nn.Parameter(view(value, n))
    a.grad, b.grad = view(grad, 0), view(grad, n)
    bucket = FlatBucket(value, grad, [a, b], [0, n])
    opt = SGD([a], lr=0.5)
    opt.add_param_group({"params": [b], "lr": 0.25})
    plan = opt.prepare([bucket])
    assert not plan.whole and len(plan.single) == 2
    opt.launch(plan)
    np.testing.assert_array_equal(value.to_host(), [-0.5] * n + [-0.25] * n)


def _linear(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Linear(4, 2, queue=queue)


@pytest.mark.parametrize("name", ["sgd-momentum", "adam"])
def test_a_group_added_to_a_replica_groups_optimizer_trains_as_pytorch(devices2, rng, name):
    """Fine-tuning's unfreezing through a ReplicaGroup: the optimizer steps the weight only,
    then the bias joins with its own learning rate. The group's flat buckets hold both; the
    data-parallel steps equal PyTorch's full-batch ones on every replica."""
    cls, tcls, kw = OPTIMIZERS[name]
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(4)]
    with ReplicaGroup(_linear, devices2) as group:
        tw = torch.nn.Parameter(torch.from_numpy(group.model.weight.value.to_host()))
        tb = torch.nn.Parameter(torch.from_numpy(group.model.bias.value.to_host()))
        opt, topt = cls([group.model.weight], lr=0.1, **kw), tcls([tw], lr=0.1, **kw)
        for i, x in enumerate(xs):
            if i == 2:
                opt.add_param_group({"params": [group.model.bias], "lr": 0.05})
                topt.add_param_group({"params": [tb], "lr": 0.05})
            group.step(x, np.zeros(6, np.int64), lambda out, y: tp.mean(out * out), opt)
            topt.zero_grad()
            out = torch.from_numpy(x) @ tw.T + tb
            (out * out).mean().backward()
            topt.step()
            for r in group.replicas:
                np.testing.assert_allclose(r.model.weight.value.to_host(), tw.detach().numpy(),
                                           rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(r.model.bias.value.to_host(), tb.detach().numpy(),
                                           rtol=1e-5, atol=1e-6)
        assert not np.allclose(tb.detach().numpy(), _linear(None).bias.value.to_host())


SCHEDULES = {
    "StepLR": lambda S, o: S.StepLR(o, 2, 0.5),
    "MultiStepLR": lambda S, o: S.MultiStepLR(o, [1, 3], 0.5),
    "ExponentialLR": lambda S, o: S.ExponentialLR(o, 0.5),
    "ConstantLR": lambda S, o: S.ConstantLR(o, 0.5, 3),
    "LinearLR": lambda S, o: S.LinearLR(o, 0.5, 1.0, 4),
    "LambdaLR": lambda S, o: S.LambdaLR(o, lambda t: 0.5 ** t),
    "CosineAnnealingLR": lambda S, o: S.CosineAnnealingLR(o, 3),
    "OneCycleLR": lambda S, o: S.OneCycleLR(o, 1.0, total_steps=10, cycle_momentum=False),
}


def _outcomes(S, opt, make, add):
    """The schedule's learning rates step by step, a group added after the first step; the
    step that raises ends it with the word "raised"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = make(S, opt)
        sched.step()
        add()
        out = []
        for _ in range(5):
            try:
                sched.step()
            except (ValueError, KeyError) as e:       # SchedulerError is a ValueError
                assert S is torch.optim.lr_scheduler or isinstance(e, SchedulerError)
                return out + ["raised"]
            out.append([g["lr"] for g in opt.param_groups])
    return out


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_scheduler_made_before_add_param_group_does_what_pytorchs_does(queue, rng, name):
    """A recursive schedule carries the new group along; one that computes from the base
    learning rates it was made with cannot, and raises (PyTorch: ValueError from its strict
    zip, or KeyError) rather than leave the group unscheduled."""
    ps, ts = both(queue, rng)
    opt, topt = SGD([ps[0]], lr=0.1), torch.optim.SGD([ts[0]], lr=0.1)
    got = _outcomes(P, opt, SCHEDULES[name],
                    lambda: opt.add_param_group({"params": [ps[1]], "lr": 1.0}))
    want = _outcomes(torch.optim.lr_scheduler, topt, SCHEDULES[name],
                     lambda: topt.add_param_group({"params": [ts[1]], "lr": 1.0}))
    assert got == want


def test_a_scheduler_made_after_add_param_group_schedules_the_new_group(queue, rng):
    ps, ts = both(queue, rng)
    opt, topt = SGD([ps[0]], lr=0.1), torch.optim.SGD([ts[0]], lr=0.1)
    P.StepLR(opt, 2)
    T = torch.optim.lr_scheduler
    T.StepLR(topt, 2)
    opt.add_param_group({"params": [ps[1]], "lr": 1.0})
    topt.add_param_group({"params": [ts[1]], "lr": 1.0})
    sched, tsched = P.LambdaLR(opt, lambda t: 0.5 ** t), T.LambdaLR(topt, lambda t: 0.5 ** t)
    assert sched.base_lrs == tsched.base_lrs == [0.1, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            sched.step()
            tsched.step()
    assert sched.get_last_lr() == tsched.get_last_lr() == [0.1 / 8, 1.0 / 8]
