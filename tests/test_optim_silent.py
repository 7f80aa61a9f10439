"""Optimizer inputs that used to give silently wrong results, each test its reproducer, with
what parcl did and what PyTorch does."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.optim import SGD, Adam, AdamW, OptimizerError
from parcl.replica import ReplicaGroup


def params(queue, *shapes):
    return [pc.nn.Parameter.from_host(queue, np.full(s, i + 1.0, np.float32))
            for i, s in enumerate(shapes)]


@pytest.mark.parametrize("wrap", [
    lambda ps: set(ps), lambda ps: frozenset(ps), lambda ps: [{"params": set(ps)}],
    lambda ps: [{"params": [ps[0]]}, {"params": {ps[1], ps[2]}, "lr": 0.5}]],
    ids=["set", "frozenset", "set-in-group", "set-in-second-group"])
def test_parameters_in_a_set_are_refused(queue, wrap):
    """``SGD({a, b, c})`` used to be accepted: the parameters were numbered in the set's
    iteration order, which follows the objects' hashes (their addresses) and so changes from
    run to run. ``state_dict()`` numbers state by that order and ``load_state_dict`` maps it
    back by position, so a resumed run could give one parameter another's momentum buffer
    (same shapes: no error). PyTorch refuses sets: "optimizer parameters need to be organized
    in ordered collections"."""
    ps = params(queue, (3,), (3,), (3,))
    with pytest.raises(OptimizerError, match="set.*ordered"):
        SGD(wrap(ps), lr=0.1, momentum=0.9)
    SGD(list(ps), lr=0.1)                          # a list (or a dict's keys) is fine
    SGD({p: None for p in ps}.keys(), lr=0.1)


def test_a_state_dict_listing_a_parameter_index_twice_is_refused(queue):
    """A state dict whose ``param_groups`` list the same index twice (``[[0, 1], [1]]`` for
    an optimizer of groups ``[a, b], [c]``, all of one shape) used to load: index 1 was mapped
    to ``b`` and then to ``c``, so ``c`` got ``b``'s Adam state, ``b`` lost its own, and ``a``
    kept ``a``'s, with no error. Every index names one parameter; such a dict fits no
    optimizer, and loading it must change nothing."""
    a, b, c = params(queue, (4,), (4,), (4,))
    opt = Adam([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    for i, p in enumerate((a, b, c)):
        p.grad = pc.Tensor.from_host(queue, np.full(4, i + 1.0, np.float32))
    opt.step()
    saved = opt.state_dict()
    bad = copy.deepcopy(saved)
    bad["param_groups"][1]["params"] = [1]
    fresh = Adam([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    with pytest.raises(OptimizerError, match="index 1 twice"):
        fresh.load_state_dict(bad)
    assert fresh.state == {}
    bad = copy.deepcopy(saved)
    bad["state"] = {0: saved["state"][0], "0": saved["state"][1], 2: saved["state"][2]}
    with pytest.raises(OptimizerError, match="index '0' twice"):
        fresh.load_state_dict(bad)
    assert fresh.state == {}
    fresh.load_state_dict(saved)                   # the real one still loads
    np.testing.assert_array_equal(fresh.state[c]["exp_avg"].to_host(),
                                  opt.state[c]["exp_avg"].to_host())


def _linear(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Linear(4, 2, queue=queue)


def _grads(w, b, x):
    """numpy: the gradients of ``mean((x @ w.T + b) ** 2)`` over the whole batch."""
    out = x.astype(np.float64) @ w.T + b
    d = 2 * out / out.size
    return d.T @ x, d.sum(0)


def _backward(replica, xs):
    with tp.Tape() as tape:
        out = replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, xs)))
        loss = tp.mean(out * out)
    tape.backward(loss)


@pytest.mark.parametrize("zero", ["optimizer", "model", "in-place"])
def test_zero_grad_of_the_optimizer_after_allreduce_grads_zeroes_every_replica(devices2, zero):
    """The custom loop of docs/api.md (``group.run`` backward, ``allreduce_grads``,
    ``opt.step()``), with PyTorch's ``opt.zero_grad()`` (``group.model.zero_grad()``,
    ``opt.zero_grad(set_to_none=False)``) in place of ``group.zero_grad()``: that zeroed
    replica 0's gradients only, and replica 1's next backward added to the reduced gradient
    it still held, so from the second step on every update was off (the weights by 0.09
    after 4 steps here), with no error. PyTorch's loop (each process zeroing its own model)
    gives plain SGD on the full-batch gradient."""
    rng = np.random.default_rng(0)
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(4)]
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        for x in xs:
            group.run(_backward, [x[:3], x[3:]])
            group.allreduce_grads(average=True)
            opt.step()
            if zero == "in-place":
                opt.zero_grad(set_to_none=False)
            else:
                (opt if zero == "optimizer" else group.model).zero_grad()
            group.broadcast_parameters()
            gw, gb = _grads(w, b, x)
            w, b = w - 0.1 * gw, b - 0.1 * gb
        for r in group.replicas:
            np.testing.assert_allclose(r.model.weight.value.to_host(), w, rtol=1e-5,
                                       atol=1e-6)
            np.testing.assert_allclose(r.model.bias.value.to_host(), b, rtol=1e-5, atol=1e-6)


def _start(group):
    """Replica 0's starting weights (float64) and an SGD over them."""
    w = group.model.weight.value.to_host().astype(np.float64)
    b = group.model.bias.value.to_host().astype(np.float64)
    return w, b, SGD(group.parameters(), lr=0.1)


def _reduced_once(group, x0):
    """Replica 0's starting weights (float64), an SGD over them, and one backward of ``x0``
    split over the two replicas, reduced by ``allreduce_grads``."""
    w, b, opt = _start(group)
    group.run(_backward, [x0[:3], x0[3:]])
    group.allreduce_grads(average=True)
    return w, b, opt


def _train_by_hand(group, opt, w, b, batches):
    """A custom loop's steps (run, allreduce_grads, opt.step(), opt.zero_grad()) on each
    batch, and the weights SGD(lr=0.1) should reach from ``w``, ``b`` (float64)."""
    for x in batches:
        group.run(_backward, [x[:3], x[3:]])
        group.allreduce_grads(average=True)
        opt.step()
        opt.zero_grad()
        gw, gb = _grads(w, b, x)
        w, b = w - 0.1 * gw, b - 0.1 * gb
    return w, b


def _assert_params(group, w, b):
    np.testing.assert_allclose(group.model.weight.value.to_host(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(group.model.bias.value.to_host(), b, rtol=1e-5, atol=1e-6)


def test_a_step_after_allreduce_grads_counts_the_left_gradient_once(devices2):
    """``allreduce_grads`` leaves every replica a copy of the reduced gradient; a
    ``group.step`` right after it (no ``zero_grad``) used to sum those copies as if each were
    a replica's own, so the left gradient entered the update twice (2 replicas), silently.
    PyTorch's ``backward`` adds to a ``.grad`` left in place once: the update is
    ``lr * (left + this step's gradient)``."""
    rng = np.random.default_rng(1)
    x0, x = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _reduced_once(group, x0)
        group.step(x, np.zeros(6, np.int64), lambda out, y: tp.mean(out * out), opt)
        lw, lb = _grads(w, b, x0)
        gw, gb = _grads(w, b, x)
        _assert_params(group, w - 0.1 * (lw + gw), b - 0.1 * (lb + gb))


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_step_after_a_backward_run_averages_the_runs_gradients_as_ddp(devices2, capture):
    """A backward ``run`` (each replica's mean loss over its shard, nothing reduced: DDP's
    ``no_sync``), then ``group.step``: the step summed the replicas' left gradients, so the
    run's batch entered the update once per replica (``lr * (2 * left + step)`` with 2
    replicas, ``lr * (left + step)`` with 1), silently. DDP's synced backward averages what
    ``no_sync`` accumulated: the update is ``lr * (mean of the left + this step's)``, the
    same for every replica count."""
    rng = np.random.default_rng(2)
    x0, x = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2, capture=capture) as group:
        w, b, opt = _start(group)
        for _ in range(2):                  # the second step is replayed where captured
            group.run(_backward, [x0[:3], x0[3:]])
            group.step(x, np.zeros(6, np.int64), lambda out, y: tp.mean(out * out), opt)
            lw, lb = _grads(w, b, x0)       # the mean of the two shards' mean gradients
            gw, gb = _grads(w, b, x)
            w, b = w - 0.1 * (lw + gw), b - 0.1 * (lb + gb)
            _assert_params(group, w, b)


def test_a_step_after_allreduce_grads_and_zero_grad_of_the_optimizer_starts_from_zero(devices2):
    """``allreduce_grads``, a ``run`` that only evaluates, ``opt.step()``, ``opt.zero_grad()``,
    then ``group.step``: replica 1 still held its copy of the reduced gradient, which the
    step summed into its update as if it were this batch's. PyTorch's ``zero_grad`` leaves
    nothing: the step is plain SGD on this batch."""
    rng = np.random.default_rng(2)
    x0, x = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _reduced_once(group, x0)
        group.run(lambda r: None)
        opt.step()
        opt.zero_grad()
        gw, gb = _grads(w, b, x0)
        w, b = w - 0.1 * gw, b - 0.1 * gb
        group.step(x, np.zeros(6, np.int64), lambda out, y: tp.mean(out * out), opt)
        gw, gb = _grads(w, b, x)
        _assert_params(group, w - 0.1 * gw, b - 0.1 * gb)


def _fails_in_replica_1(group):
    """A loss that raises in replica 1 only (after replica 0's backward may have run)."""
    def loss(out, y):
        if out.queue is group.replicas[1].queue:
            raise RuntimeError("a loss that fails in replica 1")
        return tp.mean(out * out)
    return loss


def _then_update(group, then, opt, w, b, lw, lb, x):
    """After a run that left the mean gradients ``lw``, ``lb``: ``allreduce_grads`` and
    ``opt.step()`` update by them alone, a group step on ``x`` by them plus its own."""
    if then == "allreduce_grads":
        group.allreduce_grads(average=True)
        np.testing.assert_allclose(group.model.weight.grad.to_host(), lw, rtol=1e-5)
        opt.step()
        _assert_params(group, w - 0.1 * lw, b - 0.1 * lb)
    else:
        group.step(x, np.zeros(6, np.int64), lambda out, y: tp.mean(out * out), opt)
        gw, gb = _grads(w, b, x)
        _assert_params(group, w - 0.1 * (lw + gw), b - 0.1 * (lb + gb))


def _evaluate(replica, xs):
    with tp.no_grad():
        replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, xs)))


@pytest.mark.parametrize("set_to_none", [True, False], ids=["to-none", "in-place"])
def test_a_batch_discarded_with_opt_zero_grad_is_discarded_on_every_replica(devices2,
                                                                            set_to_none):
    """A backward, then ``opt.zero_grad()`` to discard it (a skipped batch: PyTorch's way),
    then the batch to keep: ``zero_grad`` zeroed replica 0's gradients only, replica 1 added
    the kept batch to the discarded one's, and the weights were 40 off after 3 steps, with
    no error. In PyTorch every process zeroes its own: only the kept batches count."""
    rng = np.random.default_rng(3)
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(3)]
    junk = rng.random((6, 4), dtype=np.float32) * 10
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        for x in xs:
            group.run(_backward, [junk[:3], junk[3:]])
            opt.zero_grad(set_to_none=set_to_none)
            group.run(_backward, [x[:3], x[3:]])
            group.allreduce_grads(average=True)
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
            group.broadcast_parameters()
            gw, gb = _grads(w, b, x)
            w, b = w - 0.1 * gw, b - 0.1 * gb
        for r in group.replicas:
            np.testing.assert_allclose(r.model.weight.value.to_host(), w, rtol=1e-5,
                                       atol=1e-6)
            np.testing.assert_allclose(r.model.bias.value.to_host(), b, rtol=1e-5, atol=1e-6)


def test_zero_grad_after_an_evaluation_run_zeroes_every_replica(devices2):
    """``allreduce_grads``, ``opt.step()``, a ``run`` that evaluates, then
    ``opt.zero_grad(set_to_none=False)``: the evaluation had already given replica 1 replica
    0's reduced gradient, the in-place zero reached replica 0 only, and replica 1's next
    backward added to the old gradient (weights 0.09 off after 4 steps, silently)."""
    rng = np.random.default_rng(4)
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(4)]
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        for x in xs:
            group.run(_backward, [x[:3], x[3:]])
            group.allreduce_grads(average=True)
            opt.step()
            group.broadcast_parameters()
            group.run(_evaluate, [x[:3], x[3:]])
            opt.zero_grad(set_to_none=False)
            gw, gb = _grads(w, b, x)
            w, b = w - 0.1 * gw, b - 0.1 * gb
        _assert_params(group, w, b)
        np.testing.assert_allclose(group.replicas[1].model.weight.value.to_host(), w,
                                   rtol=1e-5, atol=1e-6)


def test_group_step_after_a_discarded_run_counts_only_its_own_batch(devices2):
    """A ``run`` that backwards a batch, ``opt.zero_grad()`` to discard it, then
    ``group.step``: the step summed replica 1's discarded gradient into its update."""
    rng = np.random.default_rng(5)
    junk, x = rng.random((6, 4), dtype=np.float32) * 10, rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        group.run(_backward, [junk[:3], junk[3:]])
        opt.zero_grad()
        group.step(x, np.zeros(6, np.int64), lambda out, y: tp.mean(out * out), opt)
        gw, gb = _grads(w, b, x)
        _assert_params(group, w - 0.1 * gw, b - 0.1 * gb)


@pytest.mark.parametrize("then", ["allreduce_grads", "step"])
def test_a_failed_step_leaves_no_gradient_to_the_calls_after_it(devices2, then):
    """A step that failed in replica 1 after replica 0's backward, then a backward ``run``
    and ``allreduce_grads`` with ``opt.step()`` (or ``group.step``): the failed step's
    gradients were zeroed before the next step only, so the custom loop's update added
    replica 0's half of the failed batch (the weights 0.017 off), and the step after the
    run zeroed the run's gradients with them (0.064 off), silently. A failed step changes
    nothing: the calls after it see the gradients it found."""
    rng = np.random.default_rng(7)
    failed, x0, x = (rng.random((6, 4), dtype=np.float32) for _ in range(3))

    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        with pytest.raises(pc.ReplicaError, match="replica 1"):
            group.step(failed, np.zeros(6, np.int64), _fails_in_replica_1(group), opt)
        group.run(_backward, [x0[:3], x0[3:]])
        lw, lb = _grads(w, b, x0)                # the mean of the two shards' mean gradients
        _then_update(group, then, opt, w, b, lw, lb, x)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("then", ["allreduce_grads", "step"])
def test_a_failed_step_keeps_the_gradients_a_run_left_before_it(devices2, then, capture):
    """A backward ``run`` (DDP's ``no_sync``), then a step that fails in replica 1: the
    step had already averaged the run's gradients into its own, and the calls after it
    zeroed them as the failed step's, so ``allreduce_grads`` gave a gradient of 0 where the
    run's mean is -0.236 (weight [0, 0]), and the next step left the run out (the weights
    0.061 off), silently. As PyTorch's ``.grad`` after a forward that raised, the run's
    gradients are there for the calls after the failed step."""
    rng = np.random.default_rng(0)
    x0, x = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)

    with ReplicaGroup(_linear, devices2, capture=capture) as group:
        w, b, opt = _start(group)
        group.run(_backward, [x0[:3], x0[3:]])
        with pytest.raises(pc.ReplicaError, match="replica 1"):
            group.step(x, np.zeros(6, np.int64), _fails_in_replica_1(group), opt)
        lw, lb = _grads(w, b, x0)                # the mean of the two shards' mean gradients
        _then_update(group, then, opt, w, b, lw, lb, x)



def test_a_failed_step_leaves_no_stale_check_on_the_gradients_it_restored(devices2):
    """A backward ``run``, then a step whose replica 1 read a label out of range (its
    backward's gradient held back behind a check): the step put the run's gradients back,
    but the bucket views kept the failed backward's check, so after ``allreduce_grads`` (which
    makes the views the gradients) the custom loop's next ``allreduce_grads`` raised
    'this gradient holds the contributions of a backward that failed (cross_entropy: label
    7 ...)' about gradients that hold none. The loop now goes on: the update is the two
    runs' mean gradients."""
    rng = np.random.default_rng(0)
    x0, x1, x = (rng.random((6, 4), dtype=np.float32) for _ in range(3))
    bad = np.array([0, 1, 0, 1, 0, 7])             # label 7 of 2 classes, in replica 1's rows

    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        group.run(_backward, [x0[:3], x0[3:]])
        with pytest.raises(pc.ReplicaError, match="label 7"):
            group.step(x, bad, tp.cross_entropy, opt)
        group.allreduce_grads(average=True)
        group.run(_backward, [x1[:3], x1[3:]])
        group.allreduce_grads(average=True)
        opt.step()
        (gw0, gb0), (gw1, gb1) = _grads(w, b, x0), _grads(w, b, x1)
        _assert_params(group, w - 0.1 * (gw0 + gw1), b - 0.1 * (gb0 + gb1))

def test_a_failed_step_leaves_a_dropped_gradient_none(devices2):
    """``opt.zero_grad()`` drops the gradients, a step fails, and a ``run`` backwards with
    the bias frozen: the failed step made every gradient a zero tensor, so the bias's was no
    longer None, ``allreduce_grads`` kept it and ``opt.step()`` decayed the bias no backward
    reached (weight_decay 0.5: [0.044, 0.435] became [0.041, 0.413]), where PyTorch's
    optimizer skips a None gradient."""
    rng = np.random.default_rng(0)
    x0, x = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)

    with ReplicaGroup(_linear, devices2) as group:
        w, b, _ = _start(group)
        opt = SGD(group.parameters(), lr=0.1, weight_decay=0.5)
        opt.zero_grad()
        with pytest.raises(pc.ReplicaError, match="replica 1"):
            group.step(x, np.zeros(6, np.int64), _fails_in_replica_1(group), opt)
        group.model.bias.requires_grad = False
        group.run(_backward, [x0[:3], x0[3:]])
        group.allreduce_grads(average=True)
        assert group.model.bias.grad is None
        opt.step()
        lw, _ = _grads(w, b, x0)
        _assert_params(group, w - 0.1 * (lw + 0.5 * w), b)


def test_a_step_refused_for_its_model_keeps_the_gradients_a_run_left(devices2):
    """A backward ``run``, then a step refused before anything runs (batch norm's running
    statistics taken away on replica 0 only: the replicas' buffers no longer line up): the
    step had averaged and marked the run's gradients as its own before its model check,
    and the next call zeroed them, so ``allreduce_grads`` after the statistics were put back
    gave 0 where the run's gradient is 0.033, silently. The refusal changes nothing."""
    def bn_net(queue):
        pc.nn.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Linear(4, 6, queue=queue),
                                pc.nn.BatchNorm1d(6, queue=queue), pc.nn.Linear(6, 3, queue=queue))

    def backward(replica, x, y):
        with tp.Tape() as tape:
            out = replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, x)))
            loss = tp.cross_entropy(out, pc.Tensor.from_host(replica.queue, y))
        tape.backward(loss)

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    grads = []
    for refused in (False, True):
        with ReplicaGroup(bn_net, devices2) as group:
            opt = SGD(group.parameters(), lr=0.1)
            group.run(backward, [x[:4], x[4:]], [y[:4], y[4:]])
            if refused:
                bn = group.model[1]
                kept = bn.running_mean, bn.running_var
                bn.running_mean = bn.running_var = None
                with pytest.raises(pc.ParclError, match="replica 1's model holds buffers"):
                    group.step(x, y, tp.cross_entropy, opt)
                bn.running_mean, bn.running_var = kept
            group.allreduce_grads()
            grads.append(group.model[0].weight.grad.to_host())
    assert np.abs(grads[0]).max() > 0.01
    np.testing.assert_array_equal(grads[1], grads[0])


def test_gradients_accumulated_over_runs_still_add_up(devices2):
    """What the group follows is the caller's ``zero_grad`` between calls only: two backward
    runs accumulate (as two backwards in PyTorch), and a ``zero_grad`` each replica makes in
    its own call is its own."""
    rng = np.random.default_rng(6)
    x1, x2 = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        group.run(_backward, [x1[:3], x1[3:]])
        group.run(lambda r: r.model.zero_grad(set_to_none=False))
        group.run(_backward, [x1[:3], x1[3:]])
        group.run(_backward, [x2[:3], x2[3:]])
        group.allreduce_grads(average=True)
        opt.step()
        g1, g2 = _grads(w, b, x1), _grads(w, b, x2)
        _assert_params(group, w - 0.1 * (g1[0] + g2[0]), b - 0.1 * (g1[1] + g2[1]))


def test_a_run_after_opt_step_reads_the_stepped_parameters_on_every_replica(devices2):
    """The custom loop of docs/api.md (``group.run`` backward, ``allreduce_grads``,
    ``opt.step()``) without ``group.broadcast_parameters()``, as a DDP loop has none: the
    optimizer updates replica 0's parameters only, and replica 1's next backward used the
    parameters of before the step, so every later gradient was off (replica 1's weights 0.34
    from replica 0's after 3 steps, the trained model 0.03 from ``group.step``'s), with no
    error. A ``run`` now copies replica 0's parameters changed in place since the replicas
    were last made equal first, as ``step`` does."""
    rng = np.random.default_rng(0)
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(4)]
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        w, b = _train_by_hand(group, opt, w, b, xs)
        _assert_params(group, w, b)
        group.run(lambda r: None)
        for r in group.replicas:
            np.testing.assert_allclose(r.model.weight.value.to_host(), w, rtol=1e-5,
                                       atol=1e-6)


def test_parameters_each_replica_steps_in_a_run_stay_its_own(devices2):
    """What replicas do to their own parameters inside a ``run`` (local SGD: each replica
    stepping its own optimizer, averaging now and then) is not undone by the next ``run``:
    only replica 0's parameters changed between calls (the caller's ``opt.step()``) are
    copied to the others."""
    rng = np.random.default_rng(0)
    x = rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        opts = [SGD(r.model.parameters(), lr=0.1) for r in group.replicas]

        def local_step(replica, xs):
            _backward(replica, xs)
            opts[replica.index].step()
            opts[replica.index].zero_grad()
            return replica.model.weight.value.to_host()

        first = group.run(local_step, [x[:3], x[3:]])
        assert not np.array_equal(first[0], first[1])
        group.run(lambda r: None)
        for r, w in zip(group.replicas, first):
            np.testing.assert_array_equal(r.model.weight.value.to_host(), w)


@pytest.mark.parametrize("then", ["run", "allreduce_grads", "step"])
def test_an_opt_step_on_a_runs_unreduced_gradients_is_refused_not_trained_on_replica_0s_share(
        devices2, then):
    """The custom loop of docs/api.md without ``allreduce_grads`` (a DDP loop has none: its
    backward reduces): ``opt.step()`` stepped replica 0's parameters on replica 0's half of
    the batch alone, and the next call dropped replica 1's gradient with the zeroing it
    followed, so three steps ended with weight row 0 at [0.152, -0.171, -0.388, -0.430]
    where the whole batch's give [0.371, 0.017, -0.211, -0.257], with no error. The next
    call now refuses, naming allreduce_grads; with it the same loop trains on the whole
    batch, and group.zero_grad() discards the run's gradients as before."""
    rng = np.random.default_rng(3)
    x = rng.random((6, 4), dtype=np.float32) + np.array([0, 0, 0, 2, 2, 2], np.float32)[:, None]
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        group.run(_backward, [x[:3], x[3:]])
        opt.step()
        opt.zero_grad()
        with pytest.raises(pc.ParclError, match="allreduce_grads"):
            if then == "run":
                group.run(_backward, [x[:3], x[3:]])
            elif then == "allreduce_grads":
                group.allreduce_grads()
            else:
                group.step(x, np.zeros((6, 2), np.float32), tp.mse_loss, opt)
        group.zero_grad()
        group.broadcast_parameters()
        w, b = (group.model.weight.value.to_host().astype(np.float64),
                group.model.bias.value.to_host().astype(np.float64))
        _assert_params(group, *_train_by_hand(group, opt, w, b, [x] * 3))


def test_local_sgd_averaging_its_replicas_into_replica_0_between_runs_is_not_refused(devices2):
    """Local SGD: each replica steps and zeroes its own optimizer inside the run, and the
    caller writes the replicas' average into replica 0 for the next run to spread. The run
    left no gradient, yet the next run raised the unreduced-gradients error (it noted that a
    backward ran, not what the run left): it now goes on, each run starting from the last
    average."""
    x = np.random.default_rng(0).random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        w, b, _ = _start(group)
        opts = [SGD(r.model.parameters(), lr=0.1) for r in group.replicas]

        def local_step(replica, xs):
            _backward(replica, xs)
            opts[replica.index].step()
            opts[replica.index].zero_grad()
            return replica.model.weight.value.to_host(), replica.model.bias.value.to_host()

        for _ in range(3):
            got = group.run(local_step, [x[:3], x[3:]])
            stepped = [(w - 0.1 * gw, b - 0.1 * gb) for gw, gb in (_grads(w, b, x[:3]),
                                                                    _grads(w, b, x[3:]))]
            for (gw, gb), (ew, eb) in zip(got, stepped):
                np.testing.assert_allclose(gw, ew, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(gb, eb, rtol=1e-5, atol=1e-6)
            for i, p in enumerate(group.parameters()):     # weight, bias: the average
                p.value.copy_(pc.Tensor.from_host(p.value.queue, np.mean([g[i] for g in got], 0)))
            w, b = (np.mean([e[i] for e in stepped], 0) for i in (0, 1))
        group.run(lambda r: None)
        for r in group.replicas:
            np.testing.assert_allclose(r.model.weight.value.to_host(), w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(r.model.bias.value.to_host(), b, rtol=1e-5, atol=1e-6)


def test_a_skipped_batch_then_a_forward_only_run_lets_the_caller_roll_replica_0_back(devices2):
    """A backward run whose batch the caller skips (``opt.zero_grad()``, PyTorch's way), a
    forward-only run (its following of the zeroing drops replica 1's gradients), then the
    weights set back by hand: the next run raised the unreduced-gradients error though no
    gradient was left to reduce; it now goes on and the loop trains from the weights set."""
    rng = np.random.default_rng(3)
    x, x2 = rng.random((6, 4), dtype=np.float32), rng.random((6, 4), dtype=np.float32)
    with ReplicaGroup(_linear, devices2) as group:
        w, b, opt = _start(group)
        group.run(_backward, [x[:3], x[3:]])
        opt.zero_grad()
        group.run(lambda r: None)
        assert [p.grad for r in group.replicas for p in r.model.parameters()] == [None] * 4
        w = (w * 0.5).astype(np.float32)
        group.model.weight.value.copy_(pc.Tensor.from_host(group.model.weight.value.queue, w))
        w = w.astype(np.float64)
        _assert_params(group, *_train_by_hand(group, opt, w, b, [x2] * 2))


class _WithUnusedHead(pc.nn.Module):
    """A linear layer and a head its forward does not use (an auxiliary head, a frozen
    branch switched off)."""

    def __init__(self, queue):
        super().__init__()
        pc.nn.manual_seed(0)
        self.body = pc.nn.Linear(4, 2, queue=queue)
        self.unused = pc.nn.Linear(2, 2, queue=queue)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("zero", ["before the backward", "after the step"])
def test_a_parameter_no_backward_reached_keeps_no_gradient_through_allreduce_grads(devices2,
                                                                                  zero):
    """The custom loop of docs/api.md with a parameter the forward does not use: after
    ``group.run`` backward its ``.grad`` is None on replica 0 (as in PyTorch), but
    ``allreduce_grads`` made it a zero gradient, so ``opt.step()`` updated it: weight decay
    shrank the unused head by lr * weight_decay every step (and a fresh group's gradients
    were zero views, not None, so a loop zeroing after the step did it on its first step),
    with no error. In PyTorch the head's ``.grad`` stays None and the optimizer skips it (DDP
    leaves a parameter no rank used None too), as ``group.step`` does. Now it stays None on
    every replica, and the loop trains what the same loop on one model trains."""
    rng = np.random.default_rng(0)
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(3)]
    queue = pc.new_queue(devices2[0])
    one = SimpleNamespace(model=_WithUnusedHead(queue), queue=queue)    # the same loop, one
    one_opt = SGD(one.model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)   # model
    with ReplicaGroup(_WithUnusedHead, devices2) as group:
        head = group.model.unused.weight.value.to_host()
        opt = SGD(group.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)
        for x in xs:
            if zero == "before the backward":
                opt.zero_grad()
                one_opt.zero_grad()
            group.run(_backward, [x[:3], x[3:]])
            group.allreduce_grads(average=True)
            for r in group.replicas:
                assert r.model.unused.weight.grad is None
            opt.step()
            _backward(one, x)
            one_opt.step()
            if zero == "after the step":
                opt.zero_grad()
                one_opt.zero_grad()
        np.testing.assert_array_equal(group.model.unused.weight.value.to_host(), head)
        for (name, p), q in zip(group.model.named_parameters(), one.model.parameters()):
            np.testing.assert_allclose(p.value.to_host(), q.value.to_host(), rtol=1e-5,
                                       atol=1e-6, err_msg=name)



def test_group_zero_grad_leaves_a_gradient_no_backward_reached_none_as_pytorch(devices2):
    """``group.zero_grad()`` at the top of the custom loop (PyTorch's ``model.zero_grad()``)
    made the unused head's None gradient a zero on every replica, ``allreduce_grads`` kept
    it (it was no longer None) and AdamW's ``opt.step()`` decayed the head, which PyTorch's
    optimizer skips (its ``zero_grad`` never makes a gradient): after 3 steps at lr 0.1 and
    weight_decay 0.5 the head's weights had moved by up to 0.078 where they must not move.
    Now a None gradient stays None; the body's are zeroed and train as the one model's."""
    rng = np.random.default_rng(0)
    xs = [rng.random((6, 4), dtype=np.float32) for _ in range(3)]
    queue = pc.new_queue(devices2[0])
    one = SimpleNamespace(model=_WithUnusedHead(queue), queue=queue)
    one_opt = AdamW(one.model.parameters(), lr=0.1, weight_decay=0.5)
    with ReplicaGroup(_WithUnusedHead, devices2) as group:
        head = group.model.unused.weight.value.to_host()
        opt = AdamW(group.parameters(), lr=0.1, weight_decay=0.5)
        for x in xs:
            group.zero_grad()
            one.model.zero_grad(set_to_none=False)
            for r in group.replicas:
                assert r.model.unused.weight.grad is None
                body = r.model.body.weight.grad        # None before the first backward
                assert body is None or not body.to_host().any()
            group.run(_backward, [x[:3], x[3:]])
            group.allreduce_grads(average=True)
            opt.step()
            _backward(one, x)
            one_opt.step()
        np.testing.assert_array_equal(group.model.unused.weight.value.to_host(), head)
        for (name, p), q in zip(group.model.named_parameters(), one.model.parameters()):
            np.testing.assert_allclose(p.value.to_host(), q.value.to_host(), rtol=1e-5,
                                       atol=1e-6, err_msg=name)

def _adam_run(queue, save_cls, load_cls, cut=5, steps=10):
    """Ten steps of ``save_cls`` (weight_decay 0.5), its state dict loaded into a fresh
    ``load_cls`` after ``cut`` of them; the final weights (``cut=None``: uninterrupted)."""
    rng = np.random.default_rng(0)
    w0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(steps)]
    p = pc.nn.Parameter.from_host(queue, w0.astype(np.float32))
    opt = save_cls([p], lr=0.1, weight_decay=0.5)
    for t, g in enumerate(grads):
        if t == cut:
            saved = opt.state_dict()
            opt = load_cls([p], lr=0.1, weight_decay=0.5)
            opt.load_state_dict(saved)
        p.grad = pc.Tensor.from_host(queue, g.astype(np.float32))
        opt.step()
    return p.value.to_host()


@pytest.mark.parametrize("saved,loaded", [("AdamW", "Adam"), ("Adam", "AdamW")])
def test_an_adam_state_dict_is_refused_by_adamw_and_the_other_way(queue, saved, loaded):
    """Adam's and AdamW's state dicts had the same keys, so an AdamW state loaded into Adam
    (a resume script naming the other class) was taken, and the run went on with L2 weight
    decay where it had trained with decoupled decay: weights [0.662, -0.143, 0.526, -0.230]
    after 10 steps where the uninterrupted AdamW run ends at [0.593, -0.134, 0.463, -0.214],
    silently. (PyTorch's Adam and AdamW state dicts carry ``decoupled_weight_decay``.) Each
    group now carries it too, and a state of the other rule is refused, the optimizer
    unchanged; ``pc.load`` refused this already."""
    save_cls, load_cls = getattr(pc.optim, saved), getattr(pc.optim, loaded)
    with pytest.raises(OptimizerError, match=f"{loaded}.load_state_dict: param_groups\\[0\\] "
                                             f"was saved by {saved}"):
        _adam_run(queue, save_cls, load_cls)
    groups = _run_state(queue, save_cls)["param_groups"]
    assert groups[0]["decoupled_weight_decay"] is (saved == "AdamW")
    np.testing.assert_allclose(_adam_run(queue, save_cls, save_cls),
                               _adam_run(queue, save_cls, save_cls, cut=None), rtol=1e-6)


def test_an_adam_state_dict_saved_without_the_flag_still_loads(queue):
    """A state dict saved before the flag was written (no ``decoupled_weight_decay``) loads
    as before."""
    p = params(queue, (3,))
    opt = Adam(p, lr=0.1)
    p[0].grad = pc.Tensor.from_host(queue, np.ones(3, np.float32))
    opt.step()
    old = opt.state_dict()
    for g in old["param_groups"]:
        del g["decoupled_weight_decay"]
    fresh = Adam(p, lr=0.1)
    fresh.load_state_dict(old)
    assert fresh.state[p[0]]["step"] == 1


def _run_state(queue, cls):
    p = params(queue, (3,))
    opt = cls(p, lr=0.1)
    p[0].grad = pc.Tensor.from_host(queue, np.ones(3, np.float32))
    opt.step()
    return opt.state_dict()


_ENTRY_ORDER = r"""
import numpy as np, parcl as pc
q = pc.default_queue()
p = pc.nn.Parameter(pc.Tensor.zeros(q, (3,)))
opt = pc.optim.Adam([p], lr=0.1)
p.grad = pc.Tensor.from_host(q, np.ones(3, np.float32))
opt.step()
fresh = pc.optim.Adam([p], lr=0.1)
fresh.load_state_dict(opt.state_dict())
print(list(opt.state_dict()["state"][0]), list(fresh.state_dict()["state"][0]))
"""


def test_a_loaded_state_lists_its_entries_in_the_same_order_in_every_process():
    """load_state_dict ordered each parameter's state tensors by a set's order, which
    changes with the process's string hashing: a loaded Adam state listed exp_avg_sq before
    exp_avg in some processes, so a checkpoint saved after a resume named its tensors in
    another order (other header bytes) from run to run. Results did not change (updates read
    the state by name). Now PyTorch's order, the one a fresh state has, in every process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    orders = set()
    for seed in ("1", "2", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        r = subprocess.run([sys.executable, "-c", _ENTRY_ORDER], capture_output=True,
                           text=True, env=env, timeout=120, check=True)
        orders.add(r.stdout.strip())
    assert orders == {"['step', 'exp_avg', 'exp_avg_sq'] ['step', 'exp_avg', 'exp_avg_sq']"}


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("betas", [(0.9, 0.99999), (0.99999, 0.999), (0.9, 0.9999)])
def test_adam_with_a_beta_near_1_weighs_the_gradient_by_1_minus_beta_as_pytorch(queue, cls,
                                                                                 betas):
    """The kernel formed ``1 - beta`` on the device from the float32 beta, so beta2=0.99999
    weighed g**2 by 1 - 0.99999f = 1.00136e-5 instead of 1e-5: exp_avg_sq came out 0.14%
    too large and, the bias correction being 1 - 0.99999 in double, the first step of
    Adam(lr=0.01) moved every weight by 0.0099932 instead of lr * g / (|g| + eps) = 0.01,
    0.07% short on every step from then on (beta1=0.99999 put 0.14% into the first moment;
    beta2=0.9999 was 0.017% off), silently. PyTorch computes ``1 - beta`` in double; so
    does the host now, and the kernel takes it as its own argument."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(64).astype(np.float32)
    grads = [rng.standard_normal(64).astype(np.float32) for _ in range(10)]
    p = pc.nn.Parameter.from_host(queue, w0.copy())
    t = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = cls([p], lr=0.01, betas=betas, weight_decay=0.0)
    topt = getattr(torch.optim, cls.__name__)([t], lr=0.01, betas=betas, weight_decay=0.0)
    for i, g in enumerate(grads):
        p.grad, t.grad = pc.Tensor.from_host(queue, g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        if i == 0:
            np.testing.assert_allclose(w0 - p.value.to_host(), 0.01 * np.sign(g), rtol=0,
                                       atol=5e-7)
            np.testing.assert_array_equal(opt.state[p]["exp_avg_sq"].to_host(),
                                          (np.float32(1.0 - betas[1]) * g) * g)  # addcmul's
        np.testing.assert_allclose(p.value.to_host(), t.detach().numpy(), rtol=0, atol=1e-6)
    for name in ("exp_avg", "exp_avg_sq"):     # PyTorch's lerp rounds m's small entries apart
        want = topt.state[t][name].numpy()
        np.testing.assert_allclose(opt.state[p][name].to_host(), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())


def test_sgd_refuses_pytorchs_positional_dampening_rather_than_reading_it_as_weight_decay(queue):
    """PyTorch's ``SGD(params, lr, momentum, dampening, weight_decay, nesterov)`` takes
    dampening fourth; parcl's took weight_decay there, so ``SGD(ps, 0.1, 0.9, 0.5)`` (torch:
    dampening 0.5, no decay) trained with weight_decay=0.5: after 3 steps of a unit gradient
    the weight 1.0 was 0.1941 where PyTorch's is 0.5840, silently. The arguments sit in
    PyTorch's order now, and a dampening other than 0 is refused by name."""
    p, = params(queue, (4,))
    with pytest.raises(OptimizerError, match="dampening=0.5"):
        SGD([p], 0.1, 0.9, 0.5)
    opt = SGD([p], 0.1, 0.9, weight_decay=0.5, nesterov=True)
    assert opt.param_groups[0]["weight_decay"] == 0.5 and opt.param_groups[0]["nesterov"]
    opt = SGD([p], 0.1, 0.9, 0, 0.25, True)
    assert opt.param_groups[0]["weight_decay"] == 0.25 and opt.param_groups[0]["nesterov"]
