"""A data-parallel run saved with pc.save mid-epoch and resumed in a fresh ReplicaGroup ends
bit-identical to the uninterrupted run, eager and captured, and either way round: parameters,
BatchNorm running statistics, every Adam/SGD state entry (step counts, moments, momentum),
param groups whose learning rate, betas and weight decay were changed by hand before the
checkpoint, the scheduler, the loader's position and the replicas' dropout generators."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.optim.lr_scheduler import StepLR
from parcl.replica import ReplicaGroup

RNG = np.random.default_rng(0)
X = RNG.standard_normal((40, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 40)
STEPS, SAVE_AT, CHANGE_AT = 9, 4, 2       # 5 batches an epoch: the resume is mid-epoch 0


def build(queue):
    pc.nn.manual_seed(1)
    return pc.nn.Sequential(pc.nn.Linear(6, 8, queue=queue), pc.nn.BatchNorm1d(8, queue=queue),
                            pc.nn.ReLU(), pc.nn.Dropout(0.3), pc.nn.Linear(8, 3, queue=queue))


def optimizer(kind, params):
    if kind == "adam":
        return pc.optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 0.02}],
                             lr=0.01)
    return pc.optim.SGD([{"params": params[:2]},
                         {"params": params[2:], "lr": 0.02, "momentum": 0.5, "nesterov": True}],
                        lr=0.01, momentum=0.9)


def train(devices, kind, capture, path, *, stop=STEPS, resume=False):
    """The run's end state; saves at SAVE_AT, or starts from the checkpoint with ``resume``."""
    with ReplicaGroup(build, devices, capture=capture) as group:
        opt = optimizer(kind, group.model.parameters())
        sched = StepLR(opt, step_size=2, gamma=0.5)
        loader = pc.data.DataLoader((X, Y), batch_size=8, shuffle=True, seed=3)
        step = 0
        if resume:
            meta = pc.load(path, group.model, opt, scheduler=sched)
            loader.load_state_dict(meta["loader"])
            group.set_rng_state(meta["dropout"])
            step = meta["step"]
        while step < stop:
            for xb, yb in loader:
                if step == CHANGE_AT:             # by hand, mid-run: only the checkpoint knows
                    opt.param_groups[0]["weight_decay"] = 0.1
                    if kind == "adam":
                        opt.param_groups[1]["betas"] = (0.5, 0.9)
                    else:
                        opt.param_groups[0]["momentum"] = 0.7
                group.step(xb, yb, tp.cross_entropy, opt)
                sched.step()
                step += 1
                if step == SAVE_AT and not resume:
                    pc.save(path, group.model, opt, step=step, scheduler=sched,
                            loader=loader.state_dict(), dropout=group.rng_state())
                if step >= stop:
                    break
        replica1 = group.run(lambda r: r.model.state_dict())[1]
        return (group.model.state_dict(), replica1, opt.state_dict(), sched.state_dict(),
                loader.state_dict(), group.rng_state())


def assert_same(a, b, where="state"):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b)):
            assert_same(u, v, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, where


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("capture_before, capture_after", [(False, False), (True, True),
                                                           (False, True)])
def test_a_resumed_group_run_ends_where_the_uninterrupted_one_does(
        devices2, tmp_path, kind, capture_before, capture_after):
    path = str(tmp_path / "ckpt.safetensors")
    whole = train(devices2, kind, capture_after, path + ".unused")
    train(devices2, kind, capture_before, path, stop=SAVE_AT)
    resumed = train(devices2, kind, capture_after, path, resume=True)
    assert_same(resumed, whole)
    assert whole[4] == {**whole[4], "epoch": 1, "batch_index": 4}      # crossed an epoch


def launches(monkeypatch):
    """Counts of the optimizer kernels' launches: the fused end of a step's (one per bucket,
    over every replica) and the others (one per parameter, or per bucket when clipping)."""
    import parcl.kernels.optim as optim_kernels
    counts = {"fused": 0, "plain": 0}
    launch = optim_kernels._launch

    def counting(name, param, grad, state, scalars, target=None, *rest):
        counts["fused" if target is not None else "plain"] += 1
        return launch(name, param, grad, state, scalars, target, *rest)
    monkeypatch.setattr(optim_kernels, "_launch", counting)
    return counts


def build_plain(queue):
    pc.nn.manual_seed(2)
    return pc.nn.Sequential(pc.nn.Linear(6, 8, queue=queue), pc.nn.Tanh(),
                            pc.nn.Linear(8, 3, queue=queue))


OPTIMIZERS = {"sgd momentum": lambda ps: pc.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
              "adam": lambda ps: pc.optim.Adam(ps, lr=0.01),
              "adamw amsgrad": lambda ps: pc.optim.AdamW(ps, lr=0.01, amsgrad=True)}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("capture, max_grad_norm", [(False, None), (True, None), (False, 0.5)])
def test_a_resumed_group_steps_its_whole_bucket_in_one_kernel_as_the_uninterrupted_one(
        devices2, tmp_path, monkeypatch, kind, capture, max_grad_norm):
    counts = launches(monkeypatch)
    path = str(tmp_path / "ckpt.safetensors")

    def train(steps, start=0, load=False, save=False):
        with ReplicaGroup(build_plain, devices2, capture=capture) as group:
            opt = OPTIMIZERS[kind](group.model.parameters())
            if load:
                pc.load(path, group.model, opt)
            for i in range(start, steps):
                counts.update(fused=0, plain=0)
                group.step(X[8 * i:8 * i + 8], Y[8 * i:8 * i + 8], tp.cross_entropy, opt,
                           max_grad_norm=max_grad_norm)
            if save:
                pc.save(path, group.model, opt)
            return group.model.state_dict(), opt.state_dict(), dict(counts)

    train(2, save=True)
    resumed = train(4, start=2, load=True)
    whole = train(4)
    assert_same(resumed[:2], whole[:2])
    # one bucket: fused over both replicas, or (clipping) one kernel on replica 0's bucket;
    # the per-parameter steps the resumed run fell back to were 4 launches
    want = {"fused": 0, "plain": 1} if max_grad_norm else {"fused": 1, "plain": 0}
    assert resumed[2] == whole[2] == want


def test_a_group_added_with_the_same_options_joins_its_bucket_s_fused_step(
        devices2, monkeypatch):
    counts = launches(monkeypatch)

    def train(fused: bool):
        if not fused:           # the per-parameter steps, as before: the reference
            monkeypatch.setattr(pc.optim.Optimizer, "_states_agree", lambda self, b: False,
                                raising=False)
        with ReplicaGroup(build_plain, devices2) as group:
            ps = list(group.model.parameters())
            opt = pc.optim.SGD(ps[:2], lr=0.05, momentum=0.9)
            log = []
            for i in range(5):
                if i == 2:      # the head unfrozen into the optimizer, with its options
                    opt.add_param_group({"params": ps[2:]})
                counts.update(fused=0, plain=0)
                group.step(X[8 * i:8 * i + 8], Y[8 * i:8 * i + 8], tp.cross_entropy, opt)
                log.append((counts["fused"], counts["plain"]))
            return group.model.state_dict(), opt.state_dict(), log

    fused, per_parameter = train(True), train(False)
    assert_same(fused[:2], per_parameter[:2])
    # 2 parameters of the bucket's 4 stepped, then all 4 (the new ones' momentum buffers
    # made), then the whole bucket in one kernel over both replicas
    assert fused[2] == [(0, 2), (0, 2), (0, 4), (1, 0), (1, 0)]
    assert per_parameter[2] == [(0, 2), (0, 2), (0, 4), (0, 4), (0, 4)]
