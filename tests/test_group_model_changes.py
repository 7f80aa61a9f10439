"""A ReplicaGroup trains the Parameters it was built with; a model whose structure changed after
that is refused, not trained stale.

The group's flat buckets hold the Parameters every replica's model held when the group was
built: the optimizer steps those, and the broadcast copies those. A model given another
Parameter, a new layer in place of one with parameters, or a layer with parameters or buffers
where there was none would otherwise go on training objects it no longer reads, with no
error. Every step (eager or captured) therefore checks, before it updates anything, that every
replica's model holds the same Parameters at the same paths and the same buffer slots; a
changed model raises a ``ParclError`` naming the path, and the step changes nothing. Replacing
a module without parameters (an activation) or a buffer's tensor (a reset of batch norm's
statistics) stays allowed; new values go in through ``load_state_dict`` or ``copy_``.
"""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup

MODES = pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
WHERE = pytest.mark.parametrize("where", ["replica 0", "every replica"])


def build(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(8, 6, queue=queue), pc.nn.Identity(), pc.nn.ReLU(),
                            pc.nn.Linear(6, 4, queue=queue))


def batch(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 4, n)


def new_weight(model, queue):
    model[0].weight = pc.nn.Parameter.from_host(queue, np.zeros((6, 8), np.float32))


def new_layer(model, queue):
    model.add_module("3", pc.nn.Linear(6, 4, queue=queue))


def new_layer_by_setattr(model, queue):
    setattr(model, "3", pc.nn.Linear(6, 4, queue=queue))


def batchnorm_for_identity(model, queue):
    setattr(model, "1", pc.nn.BatchNorm1d(6, queue=queue))


def weight_dropped(model, queue):
    model[0].bias = None


CHANGES = pytest.mark.parametrize("change, path", [
    (new_weight, "0.weight"), (new_layer, "3.weight"), (new_layer_by_setattr, "3.weight"),
    (batchnorm_for_identity, "1.weight"), (weight_dropped, "0.bias")],
    ids=["new Parameter", "new layer", "setattr", "Identity -> BatchNorm1d", "None"])


def change_models(group, change, where):
    replicas = group.replicas[:1] if where == "replica 0" else group.replicas
    for r in replicas:
        change(r.model, r.queue)


@MODES
@WHERE
@CHANGES
def test_a_step_after_a_structural_change_raises_and_changes_nothing(devices2, capture, where,
                                                                      change, path):
    x, y = batch()
    with ReplicaGroup(build, devices2, capture=capture) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.9)
        group.step(x, y, tp.cross_entropy, opt)
        group.step(x, y, tp.cross_entropy, opt)          # captured: a replay
        before = [p.value.to_host() for p in group.parameters()]
        state = opt.state_dict()["state"]
        change_models(group, change, where)
        for _ in range(2):                                # every step, not only the first
            with pytest.raises(pc.ParclError, match="new ReplicaGroup") as info:
                group.step(x, y, tp.cross_entropy, opt)
            assert path in str(info.value) and "replica 0" in str(info.value)
        for a, p in zip(before, group.parameters()):
            np.testing.assert_array_equal(a, p.value.to_host())
        after = opt.state_dict()["state"]
        for i in state:
            np.testing.assert_array_equal(state[i]["momentum_buffer"],
                                          after[i]["momentum_buffer"])


@MODES
def test_a_change_in_another_replica_only_is_refused_too(devices2, capture):
    x, y = batch()
    with ReplicaGroup(build, devices2, capture=capture) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        new_weight(group.replicas[1].model, group.replicas[1].queue)
        with pytest.raises(pc.ParclError, match=r"replica 1's model.*0\.weight"):
            group.step(x, y, tp.cross_entropy, opt)


def test_the_error_says_what_changed_and_what_to_do(devices2):
    with ReplicaGroup(build, devices2) as group:
        new_layer(group.model, group.replicas[0].queue)
        with pytest.raises(pc.ParclError) as info:
            group.step(*batch(), tp.cross_entropy, pc.optim.SGD(group.parameters(), lr=0.1))
    message = str(info.value)
    assert "3.weight" in message and "3.bias" in message
    assert "another Parameter" in message and "Parameter(shape=(4, 6))" in message
    assert "load_state_dict" in message and "copy_" in message


def test_putting_the_old_parameter_back_makes_the_group_usable_again(devices2):
    x, y = batch()
    with ReplicaGroup(build, devices2) as group, ReplicaGroup(build, devices2) as ref:
        opt, ref_opt = (pc.optim.SGD(g.parameters(), lr=0.1) for g in (group, ref))
        old = group.model[3]
        new_layer(group.model, group.replicas[0].queue)
        with pytest.raises(pc.ParclError):
            group.step(x, y, tp.cross_entropy, opt)
        group.model.add_module("3", old)
        assert group.step(x, y, tp.cross_entropy, opt) == ref.step(x, y, tp.cross_entropy,
                                                                   ref_opt)


@MODES
def test_a_new_group_after_the_change_trains_the_new_parameters(devices2, capture):
    """The way out the error names: build the group again with the model as it is now."""
    def changed(queue):
        model = build(queue)
        new_weight(model, queue)
        return model

    x, y = batch()
    with ReplicaGroup(changed, devices2, capture=capture) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        assert np.abs(group.model[0].weight.value.to_host()).max() > 0   # from zeros


@MODES
def test_modules_without_parameters_and_buffer_tensors_may_still_be_replaced(devices2, capture):
    x, y = batch()
    with ReplicaGroup(build, devices2, capture=capture) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        for r in group.replicas:
            setattr(r.model, "2", pc.nn.Tanh())           # an activation: nothing to train
        group.step(x, y, tp.cross_entropy, opt)
        group.model.load_state_dict({"0.weight": np.ones((6, 8), np.float32)}, strict=False)
        group.step(x, y, tp.cross_entropy, opt)           # new values, same objects


def test_broadcast_parameters_and_allreduce_grads_refuse_a_changed_model_too(devices2):
    with ReplicaGroup(build, devices2) as group:
        new_weight(group.model, group.replicas[0].queue)
        with pytest.raises(pc.ParclError, match="0.weight"):
            group.broadcast_parameters()
        with pytest.raises(pc.ParclError, match="0.weight"):
            group.allreduce_grads()


def test_model_slots_say_what_changed(queue):
    """``pc.nn.buffer_slots.ModelSlots``, the record the group checks: a few identity checks
    while nothing changed, the paths and objects once something did."""
    from parcl.nn.buffer_slots import ModelSlots
    model = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.BatchNorm1d(3), pc.nn.ReLU())
    slots = ModelSlots(model)
    assert slots.look() is None
    model.add_module("2", pc.nn.SiLU())                   # nothing to train or keep
    assert slots.look() is None
    model[1].running_mean = pc.Tensor.zeros(queue, (3,))  # a reset: a buffer's new tensor
    change = slots.look()
    assert change.parameters == [] and change.buffer_slots == [] and change.buffers_replaced
    assert slots.tensors[0] is model[1].running_mean
    old = model[0].weight
    model[0].weight = pc.nn.Parameter.from_host(queue, np.zeros((3, 4), np.float32))
    change = slots.look()
    assert [(c.path, c.old, c.new) for c in change.parameters] == [
        ("0.weight", old, model[0].weight)]
    model[0].weight = old
    assert slots.look() is None


def test_statistics_reset_during_a_refused_step_still_reach_every_replica(devices2):
    """Replica 0's buffers replaced while replica 1's model was changed: once replica 1 is
    put right, the next step copies replica 0's new statistics, as it would have."""
    def bn_model(queue):
        pc.nn.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Linear(8, 6, queue=queue),
                                pc.nn.BatchNorm1d(6, queue=queue), pc.nn.Linear(6, 4, queue=queue))

    x, y = batch()
    with ReplicaGroup(bn_model, devices2) as group:
        group.eval()                                      # statistics read, not updated
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        bn, other = group.model[1], group.replicas[1].model
        bn.running_mean = pc.Tensor.full(bn.running_mean.queue, (6,), 3.0)
        old = other[2]
        other.add_module("2", pc.nn.Linear(6, 4, queue=group.replicas[1].queue))
        with pytest.raises(pc.ParclError, match="replica 1's model"):
            group.step(x, y, tp.cross_entropy, opt)
        other.add_module("2", old)
        group.step(x, y, tp.cross_entropy, opt)
        np.testing.assert_array_equal(other[1].running_mean.to_host(), np.full(6, 3.0))


def test_a_model_with_an_empty_parameter_slot_steps_and_follows_replica_0(devices2):
    """``Linear(bias=False)`` keeps a bias slot holding None (as PyTorch's): the group's
    follower, which gives every replica replica 0's ``requires_grad``, skips it."""
    def model(queue):
        pc.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Linear(4, 3, bias=False, queue=queue),
                                pc.nn.Linear(3, 3, queue=queue))

    x = np.ones((4, 4), np.float32)
    y = np.array([0, 1, 2, 0])
    with ReplicaGroup(model, devices2) as g:
        opt = pc.optim.SGD(g.parameters(), lr=0.1)
        assert np.isfinite(g.step(x, y, tp.cross_entropy, opt))
        g.model[0].requires_grad_(False)         # followed by replica 1 too
        g.step(x, y, tp.cross_entropy, opt)
        assert [r.model[0].weight.requires_grad for r in g.replicas] == [False, False]


def test_a_dict_holding_a_lock_or_a_module_set_on_replica_0_is_not_copied_to_the_others(
        devices2):
    """Only plain values set on replica 0's model are copied to the other replicas: a dict
    holding a lock beside a setting could not be copied (the step raised "cannot pickle
    '_thread.lock' object"), and one holding a module gave the others replica 0's module."""
    import threading

    x, y = batch()
    with ReplicaGroup(build, devices2) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        group.model.settings = {"lock": threading.Lock(), "scale": 2.0}
        group.model.extra = {"acts": [pc.nn.ReLU()]}
        loss = group.step(x, y, tp.cross_entropy, opt)
        assert np.isfinite(loss)
        other = group.replicas[1].model
        assert not hasattr(other, "settings") and not hasattr(other, "extra")
        group.model.plain = {"scale": 2.0}
        group.step(x, y, tp.cross_entropy, opt)
        assert other.plain == {"scale": 2.0}
