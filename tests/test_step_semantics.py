"""What a data-parallel step means where a loss is not a plain mean, a shard is tiny, or replica
0 was changed between steps: the 2-replica step still equals the single-replica full batch."""

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup


def mlp(queue, bn=False):
    pc.manual_seed(0)
    layers = [pc.nn.Linear(6, 8, queue=queue)]
    if bn:
        layers.append(pc.nn.BatchNorm1d(8, queue=queue))
    return pc.nn.Sequential(*layers, pc.nn.ReLU(), pc.nn.Linear(8, 4, queue=queue))


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 4, n)


def one_step(devices, x, y, loss_fn, bn=False, sync_batchnorm=False, **kwargs):
    with ReplicaGroup(lambda q: mlp(q, bn), devices, sync_batchnorm=sync_batchnorm) as g:
        loss = g.step(x, y, loss_fn, pc.optim.SGD(g.parameters(), lr=0.1), **kwargs)
        return loss, {k: v for k, v in g.model.state_dict().items()}


def sum_loss(out, target):
    onehot = pc.Tensor.from_host(target.queue, np.eye(4, dtype=np.float32)[target.to_host()])
    d = out - onehot
    return tp.sum(d * d)


def test_a_loss_summed_over_the_batch_is_refused_unless_the_step_is_told(devices2):
    x, y = batch(5)
    with ReplicaGroup(mlp, devices2) as g:
        before = g.model.state_dict()
        with pytest.raises(pc.ParclError, match="reduction='sum'"):
            g.step(x, y, sum_loss, pc.optim.SGD(g.parameters(), lr=0.1))
        for k, v in g.model.state_dict().items():        # refused before the update
            np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("loss_fn", [tp.cross_entropy, pc.nn.L1Loss(),
                                     lambda o, y: tp.mean(o * o),
                                     pc.nn.KLDivLoss(reduction="batchmean")],
                         ids=["cross_entropy", "L1Loss", "tp.mean", "KLDivLoss batchmean"])
def test_a_mean_loss_with_reduction_sum_is_refused(devices2, loss_fn):
    """``reduction="sum"`` tells the step each shard's loss is a sum, so each counts once:
    for a mean loss (``tp.cross_entropy``) the step then trained on the sum of the replicas'
    means, a gradient that grows with the replica count (2 replicas: loss 2.92 for the
    single replica's 1.46 on the same batch), with no error. Refused before the update, as a
    sum with ``reduction="mean"`` is. ``kl_div``'s 'batchmean' (its sum divided by the
    shard's rows) is such a mean too: its last op was a plain division, so it got through
    (loss 1.36 on 2 replicas for 0.68 on one)."""
    x, y = batch(6)
    y = y if loss_fn is tp.cross_entropy else np.eye(4, dtype=np.float32)[y]
    with ReplicaGroup(mlp, devices2) as g:
        before = g.model.state_dict()
        with pytest.raises(pc.ParclError, match="returned a mean"):
            g.step(x, y, loss_fn, pc.optim.SGD(g.parameters(), lr=0.1), reduction="sum")
        for k, v in g.model.state_dict().items():
            np.testing.assert_array_equal(v, before[k])


def test_kl_div_batchmean_is_weighed_as_the_mean_it_is(devices2):
    """With the default ``reduction="mean"`` a 'batchmean' KL divergence (the sum over the
    shard divided by its rows) is weighed by rows like any mean: the 2-replica step on an
    uneven batch equals one replica's."""
    x, y = batch(7)
    target = np.eye(4, dtype=np.float32)[y] * 0.7 + 0.3 / 4

    def loss_fn(out, t):
        return tp.kl_div(tp.log_softmax(out), t, reduction="batchmean")

    one, p1 = one_step(devices2[:1], x, target, loss_fn)
    two, p2 = one_step(devices2, x, target, loss_fn)
    np.testing.assert_allclose(two, one, rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)


def test_a_summed_loss_with_reduction_sum_equals_the_full_batch(devices2):
    x, y = batch(5)
    one, p1 = one_step(devices2[:1], x, y, sum_loss, reduction="sum")
    two, p2 = one_step(devices2, x, y, sum_loss, reduction="sum")
    np.testing.assert_allclose(two, one, rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)


def test_a_loss_scaled_by_a_constant_is_weighed_as_the_sum_or_mean_under_it(devices2):
    """``tp.sum(...) / 8`` (a sum over the batch divided by a constant) ended in a division,
    so the step weighed it as a mean: on 2 replicas loss 2.58 for the single replica's 5.15
    and other parameters, with no error; ``tp.mean(...) * 8`` with ``reduction="sum"`` added
    the replicas' means (20.6 for 10.3). The constant is looked through now: the first is
    refused as the sum it is, and equals the full batch with ``reduction="sum"``; the second
    is refused as a mean."""
    x, y = batch(7)
    scaled_sum = [lambda o, t: sum_loss(o, t) / 8.0, lambda o, t: -(sum_loss(o, t) * -0.5)]
    for loss_fn in scaled_sum:
        with pytest.raises(pc.ParclError, match="reduction='sum'"):
            one_step(devices2, x, y, loss_fn)
        one, p1 = one_step(devices2[:1], x, y, loss_fn, reduction="sum")
        two, p2 = one_step(devices2, x, y, loss_fn, reduction="sum")
        np.testing.assert_allclose(two, one, rtol=1e-5)
        for k in p1:
            np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)
    for loss_fn in (lambda o, t: tp.cross_entropy(o, t) * 8.0,
                    lambda o, t: 1.0 - tp.mean(o * o)):
        with pytest.raises(pc.ParclError, match="returned a mean"):
            one_step(devices2, x, y, loss_fn, reduction="sum")


def test_a_batch_whose_every_label_is_ignored_returns_nan_as_pytorch(devices2):
    x, _ = batch(4)
    loss, _ = one_step(devices2, x, np.full(4, -100), tp.cross_entropy)
    assert isinstance(loss, float) and np.isnan(loss)


def test_sync_batchnorm_takes_a_shard_of_one_sample_when_the_global_batch_has_more(devices2):
    x, y = batch(3)                      # shards of 2 and 1: the statistics are over all 3
    one, p1 = one_step(devices2[:1], x, y, tp.cross_entropy, bn=True)
    two, p2 = one_step(devices2, x, y, tp.cross_entropy, bn=True, sync_batchnorm=True)
    np.testing.assert_allclose(two, one, rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-4, atol=1e-6)


def test_sync_batchnorm_still_refuses_one_sample_in_all(devices2):
    x, y = batch(2)
    with ReplicaGroup(lambda q: mlp(q, True), devices2[:1], sync_batchnorm=True) as g:
        with pytest.raises(pc.ReplicaError, match="more than 1 value per channel"):
            g.step(x[:1], y[:1], tp.cross_entropy, pc.optim.SGD(g.parameters(), lr=0.1))


@pytest.mark.parametrize("capture", [False, True])
def test_a_state_loaded_into_replica_0_between_steps_reaches_every_replica(devices2, capture):
    x, y = batch(6)
    with ReplicaGroup(mlp, devices2[:1]) as ref:
        pc.manual_seed(1)
        loaded = mlp(pc.default_queue()).state_dict()     # another model's weights
        ref.model.load_state_dict(loaded)
        want = ref.step(x, y, tp.cross_entropy, pc.optim.SGD(ref.parameters(), lr=0.1))
        want_params = ref.model.state_dict()
    with ReplicaGroup(mlp, devices2, capture=capture) as g:
        opt = pc.optim.SGD(g.parameters(), lr=0.1)
        g.step(x, y, tp.cross_entropy, opt)
        g.model.load_state_dict(loaded)                   # no broadcast_parameters()
        opt.zero_grad()
        got = g.step(x, y, tp.cross_entropy, pc.optim.SGD(g.parameters(), lr=0.1))
        np.testing.assert_allclose(got, want, rtol=1e-5)
        for k, v in g.model.state_dict().items():
            np.testing.assert_allclose(v, want_params[k], rtol=1e-5, atol=1e-7)
        other = g.replicas[1].model.state_dict()
        for k, v in g.model.state_dict().items():
            np.testing.assert_array_equal(other[k], v)


def test_a_sum_over_the_batch_of_feature_means_still_takes_reduction_sum(devices2):
    """A loss summed over the batch whose last op is a mean over the features (``tp.mean(
    tp.sum(d * d, axis=0))``) is a sum: ``reduction="sum"`` takes it, and equals one
    replica."""
    def loss_fn(out, target):
        onehot = pc.Tensor.from_host(target.queue, np.eye(4, dtype=np.float32)[target.to_host()])
        d = out - onehot
        return tp.mean(tp.sum(d * d, axis=0))

    x, y = batch(5)
    one, p1 = one_step(devices2[:1], x, y, loss_fn, reduction="sum")
    two, p2 = one_step(devices2, x, y, loss_fn, reduction="sum")
    np.testing.assert_allclose(two, one, rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)


def weighed_as(devices2, x, y, loss_fn, right: str, wrong: str, message: str) -> None:
    """With the step's reduction ``right`` 2 replicas equal one on the batch; with ``wrong``
    the step is refused with ``message``."""
    one, p1 = one_step(devices2[:1], x, y, loss_fn, reduction=right)
    two, p2 = one_step(devices2, x, y, loss_fn, reduction=right)
    np.testing.assert_allclose(two, one, rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(pc.ParclError, match=message):
        one_step(devices2, x, y, loss_fn, reduction=wrong)


def _onehot_diff(out, target):
    return out - pc.Tensor.from_host(target.queue, np.eye(4, dtype=np.float32)[target.to_host()])


def test_the_op_that_reduces_the_batch_decides_how_a_nested_loss_is_weighed(devices2):
    """Under nested reductions the step weighs a loss by the one over its batch, not the
    last: a feature mean of batch sums (``tp.mean(tp.sum(d * d, axis=0))``) with
    reduction='mean' trained on 1.11 where one replica has 2.17 (7 samples), silently, and a
    feature sum of batch means (``tp.sum(tp.mean(d * d, axis=0))``) was refused as a sum with
    'mean' but trained on 2.47 for one replica's 1.24 with 'sum'."""
    def mean_of_sums(out, target):
        d = _onehot_diff(out, target)
        return tp.mean(tp.sum(d * d, axis=0))

    def sum_of_means(out, target):
        d = _onehot_diff(out, target)
        return tp.sum(tp.mean(d * d, axis=0))

    x, y = batch(7)               # shards of 4 and 3 rows: replica 0's as many as features
    for loss_fn, right, wrong, message in [(mean_of_sums, "sum", "mean", "returned a sum"),
                                           (sum_of_means, "mean", "sum", "returned a mean")]:
        weighed_as(devices2, x, y, loss_fn, right, wrong, message)


def _weighted_bce(queue):
    return pc.nn.BCEWithLogitsLoss(
        weight=pc.Tensor.from_host(queue, np.array([1.0, 0.5, 2.0, 1.0], np.float32)),
        pos_weight=pc.Tensor.from_host(queue, np.array([3.0, 1.0, 0.5, 2.0], np.float32)))


def _torch_bce(x, y, crit, lr=0.1, steps=2):
    """``steps`` SGD steps of ``mlp`` in PyTorch on the full batch: the parameters."""
    import torch
    model = mlp(pc.default_queue())
    tm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    tm.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    loss_fn = torch.nn.BCEWithLogitsLoss(weight=torch.tensor(crit.weight.to_host()),
                                         pos_weight=torch.tensor(crit.pos_weight.to_host()))
    opt = torch.optim.SGD(tm.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(tm(torch.tensor(x)), torch.tensor(y)).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in tm.state_dict().items()}


@pytest.mark.parametrize("capture", [False, True])
def test_a_loss_module_holding_tensors_runs_on_every_replica_as_on_the_full_batch(
        devices2, capture):
    """``BCEWithLogitsLoss(weight=w, pos_weight=p)``, its tensors made on the caller's queue,
    failed on every replica ('tensors live in different OpenCL contexts'): each replica now
    runs a copy of the loss module with its tensors on its own queue, and two steps on 2
    replicas equal PyTorch's on the full batch. A value changed in place on the caller's
    module (``crit.pos_weight.fill_(1.5)``) reaches the copies at the next step."""
    x, _ = batch(7)
    y = (np.random.default_rng(1).random((7, 4)) > 0.5).astype(np.float32)
    crit = _weighted_bce(pc.default_queue())
    with ReplicaGroup(mlp, devices2, capture=capture) as g:
        opt = pc.optim.SGD(g.parameters(), lr=0.1)
        for _ in range(2):
            g.step(x, y, crit, opt)
        got = g.model.state_dict()
        want = _torch_bce(x, y, crit)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
        crit.pos_weight.fill_(1.5)
        loss = g.step(x, y, crit, opt)
    with ReplicaGroup(mlp, devices2[:1]) as one:
        one.model.load_state_dict(got)
        assert loss == pytest.approx(one.step(x, y, crit, pc.optim.SGD(one.parameters(), lr=0.1)),
                                     rel=1e-5)


def test_a_loss_module_with_parameters_is_refused_before_the_step(devices2):
    """A loss module's parameters would be updated by no replica's optimizer alike."""
    class Scaled(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = pc.nn.Parameter.from_host(None, np.ones(1, np.float32))

        def forward(self, out, y):
            return tp.cross_entropy(out, y)

    x, y = batch(6)
    with ReplicaGroup(mlp, devices2) as g, pytest.raises(pc.ParclError, match="parameters"):
        g.step(x, y, Scaled(), pc.optim.SGD(g.parameters(), lr=0.1))


@pytest.mark.parametrize("capture", [False, True])
def test_a_class_weighted_cross_entropy_is_weighed_by_the_weights_of_each_shards_labels(
        devices2, capture):
    """A mean weighted by class weights (``CrossEntropyLoss(w)``) is a mean over the
    weights of the labels that count: each replica's share is weighed by its labels' weights,
    so 2 replicas equal PyTorch's full-batch step, an ignored label included."""
    import torch
    x, y = batch(7)
    y[1] = -100
    w = np.array([0.5, 2.0, 1.0, 3.0], np.float32)
    crit = pc.nn.CrossEntropyLoss(pc.Tensor.from_host(pc.default_queue(), w))
    model = mlp(pc.default_queue())
    tm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    tm.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    want = torch.nn.CrossEntropyLoss(torch.tensor(w))(tm(torch.tensor(x)), torch.tensor(y))
    want.backward()
    with ReplicaGroup(mlp, devices2, capture=capture) as g:
        for _ in range(2):     # the second step is a replay when captured
            g.model.load_state_dict(model.state_dict())
            loss = g.step(x, y, crit, pc.optim.SGD(g.parameters(), lr=1.0))
            assert loss == pytest.approx(want.item(), rel=1e-5)
            got = g.model.state_dict()
            for k, p in tm.named_parameters():
                np.testing.assert_allclose(got[k], (p - p.grad).detach().numpy(), rtol=1e-5,
                                           atol=1e-6)


@pytest.mark.parametrize("capture", [False, True])
def test_a_shard_whose_labels_all_weigh_nothing_adds_nothing_as_in_the_full_batch(devices2,
                                                                                   capture):
    """With a class weighing 0 (``CrossEntropyLoss(w)``, ``w[0] = 0``), a replica's shard
    whose labels are all of that class (or ignored) has a mean over no weight: the step
    weighs it by 0, but its backward divided that 0 by its weight sum 0 and the NaN went into
    the summed gradient, so the second step's loss was NaN where PyTorch's full batch trains
    on (0.931), silently. Such a share now adds nothing, and two steps with accumulation
    equal PyTorch's."""
    import torch
    x, y = batch(9)
    y[:4], y[4] = 0, -100            # replica 0's micro-batches: no weight at all
    w = np.array([0.0, 2.0, 1.0, 3.0], np.float32)
    crit = pc.nn.CrossEntropyLoss(pc.Tensor.from_host(pc.default_queue(), w))
    model = mlp(pc.default_queue())
    tm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    tm.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    topt = torch.optim.SGD(tm.parameters(), lr=0.5)
    with ReplicaGroup(mlp, devices2, capture=capture) as g:
        opt = pc.optim.SGD(g.parameters(), lr=0.5)
        for _ in range(2):
            loss = g.step(x, y, crit, opt, accumulation_steps=2)
            topt.zero_grad()
            want = torch.nn.CrossEntropyLoss(torch.tensor(w))(tm(torch.tensor(x)),
                                                              torch.tensor(y))
            want.backward()
            topt.step()
            assert loss == pytest.approx(want.item(), rel=1e-5)
        got = g.model.state_dict()
    for k, v in tm.state_dict().items():
        np.testing.assert_allclose(got[k], v.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("partial", [False, True])
def test_label_smoothing_over_a_share_that_weighs_nothing_is_refused_before_the_update(
        devices2, partial):
    """With label smoothing, a row whose label weighs 0 still adds its smoothing term to
    PyTorch's weighted mean; a replica's share of only such rows is weighed by 0 (its own
    mean is over no weight), so those terms were dropped: 2 replicas trained on 1.078 where
    the full batch has 1.392, weights 0.034 off, silently. Refused, nothing updated; the same
    loss on a batch whose every share has weight equals the single replica."""
    import functools
    x, y = batch(9)
    y[:5] = 0                                  # replica 0's rows: all of the class weighing 0
    w = np.array([0.0, 2.0, 1.0, 3.0], np.float32)
    crit = functools.partial(tp.cross_entropy, weight=w, label_smoothing=0.3) if partial \
        else pc.nn.CrossEntropyLoss(pc.Tensor.from_host(pc.default_queue(), w),
                                    label_smoothing=0.3)
    with ReplicaGroup(mlp, devices2) as g:
        before = g.model.state_dict()
        with pytest.raises(pc.ParclError, match=r"replica 0's rows 0\.\.4 .* label_smoothing"):
            g.step(x, y, crit, pc.optim.SGD(g.parameters(), lr=0.5))
        for k, v in g.model.state_dict().items():
            np.testing.assert_array_equal(v, before[k])
    y[0] = 1
    one, p1 = one_step(devices2[:1], x, y, crit)
    two, p2 = one_step(devices2, x, y, crit)
    assert two == pytest.approx(one, rel=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)


def test_class_weights_the_step_cannot_see_are_refused_before_the_update(devices2):
    """Hidden in a lambda, the weights were unknown to the step, which weighed the shards by
    their labels: refused, nothing updated, with the visible ways to pass them."""
    x, y = batch(7)
    w = np.array([0.5, 2.0, 1.0, 3.0], np.float32)
    with ReplicaGroup(mlp, devices2) as g:
        before = g.model.state_dict()
        with pytest.raises(pc.ParclError, match="weighted by class weights"):
            g.step(x, y, lambda out, t: tp.cross_entropy(out, t, weight=w),
                   pc.optim.SGD(g.parameters(), lr=0.1))
        for k, v in g.model.state_dict().items():
            np.testing.assert_array_equal(v, before[k])


def test_a_cross_entropy_summed_over_the_batch_is_weighed_as_a_sum(devices2):
    """``CrossEntropyLoss(reduction='sum')`` ends in the cross-entropy op, which was taken for
    a mean: with the step's default reduction='mean' it trained on 4.63 where one replica has
    9.07, silently. It is a sum: refused with 'mean', one replica's result with 'sum'."""
    x, y = batch(7)
    weighed_as(devices2, x, y, pc.nn.CrossEntropyLoss(reduction="sum"), "sum", "mean",
               "returned a sum")


@pytest.mark.parametrize("flat", [lambda d: tp.reshape(d, (-1,)), lambda d: tp.flatten(d),
                                  lambda d: d.view(-1, 2)], ids=["reshape", "flatten", "view"])
def test_a_loss_over_the_flattened_batch_is_weighed_by_its_reduction(devices2, flat):
    """A mean over the batch flattened first (``tp.mean(d.reshape(-1))``) was taken for a
    mean over no batch (its input did not start with the rows), so ``reduction="sum"`` let
    it through and each replica's mean counted once: 2 replicas trained on loss 2.61 where
    one replica has 1.31 (6 samples), with no error. The rows are followed through the
    views now: refused as the mean it is with 'sum', and with 'mean' (uneven shards) it
    equals one replica; the flattened sum likewise takes 'sum' and is refused with 'mean'."""
    def flat_mean(out, target):
        d = _onehot_diff(out, target)
        return tp.mean(flat(d * d))

    def flat_sum(out, target):
        d = _onehot_diff(out, target)
        return tp.sum(flat(d * d))

    x, y = batch(7)
    for loss_fn, right, wrong, message in [(flat_mean, "mean", "sum", "returned a mean"),
                                           (flat_sum, "sum", "mean", "returned a sum")]:
        weighed_as(devices2, x, y, loss_fn, right, wrong, message)


def test_class_weights_of_another_context_in_a_partial_name_the_ways_that_work(devices2):
    """A pc.Tensor of weights in ``functools.partial(tp.cross_entropy, weight=w)`` lives in
    the caller's context, not a replica's: refused with the two ways that reach every
    replica (a numpy array, or the loss module), which both equal one replica."""
    import functools
    x, y = batch(7)
    w = np.array([0.5, 2.0, 1.0, 3.0], np.float32)
    on_caller = pc.Tensor.from_host(pc.default_queue(), w)
    with pytest.raises(pc.ParclError, match="numpy array, or use pc.nn.CrossEntropyLoss"):
        one_step(devices2, x, y, functools.partial(tp.cross_entropy, weight=on_caller))
    one, _ = one_step(devices2[:1], x, y, pc.nn.CrossEntropyLoss(on_caller))
    two, _ = one_step(devices2, x, y, functools.partial(tp.cross_entropy, weight=w))
    assert two == pytest.approx(one, rel=1e-5)


def test_class_weights_changed_in_place_between_steps_weigh_the_next_step(devices2):
    """The class weights' host values are read again only after a change through parcl
    (``copy_``, ``fill_``, ``load_state_dict``), not at every step: a change must still reach
    both the shards' weighting and every replica's copy of the loss at the next step."""
    x, y = batch(7)
    w1, w2 = np.array([0.5, 2, 1, 3], np.float32), np.array([3, 1, 0.25, 1], np.float32)
    crit = pc.nn.CrossEntropyLoss(pc.Tensor.from_host(pc.default_queue(), w1))
    with ReplicaGroup(mlp, devices2) as g:
        g.step(x, y, crit, pc.optim.SGD(g.parameters(), lr=0.1))
        params = g.model.state_dict()
        crit.weight.copy_(pc.Tensor.from_host(pc.default_queue(), w2))
        got = g.step(x, y, crit, pc.optim.SGD(g.parameters(), lr=0.1))
    with ReplicaGroup(mlp, devices2[:1]) as one:
        one.model.load_state_dict(params)
        want = one.step(x, y, pc.nn.CrossEntropyLoss(pc.Tensor.from_host(pc.default_queue(), w2)),
                        pc.optim.SGD(one.parameters(), lr=0.1))
    assert got == pytest.approx(want, rel=1e-5)


def _mean_plus_sum(out, target):
    return tp.cross_entropy(out, target) + 0.01 * tp.sum(out * out)


def _sum_plus_sum(out, target):
    return tp.cross_entropy(out, target, reduction="sum") + 0.01 * tp.sum(out * out)


def test_a_sum_added_to_a_mean_loss_is_weighed_as_the_sum_it_is(devices2):
    """A loss that adds terms is weighed by each term's reduction over the batch: a logit
    penalty summed over the batch beside the mean cross-entropy (``cross_entropy(out, y) +
    0.01 * tp.sum(out * out)``) got through as an 'add' and each shard's penalty was weighed
    as a mean, so 2 replicas trained on 1.313 where one has 1.329 (7 samples), and a sum of
    two sums on 4.64 for one replica's 9.10, silently, though either sum alone is refused
    with reduction='mean'. Now the mean plus a sum is refused with either reduction, and the
    sum of sums takes reduction='sum' and equals one replica."""
    x, y = batch(7)
    weighed_as(devices2, x, y, _sum_plus_sum, "sum", "mean", "returned a sum")
    for reduction, message in (("mean", "returned a sum"), ("sum", "returned a mean")):
        with pytest.raises(pc.ParclError, match=message):
            one_step(devices2, x, y, _mean_plus_sum, reduction=reduction)
    # a sum that is not over the batch (a penalty on each replica's own weight) counts once,
    # as the step's weights add up to 1: trained as on one replica
    losses, weights = [], []
    for devices in (devices2, devices2[:1]):
        with ReplicaGroup(mlp, devices) as g:
            own = {r.queue: r.model[0].weight for r in g.replicas}

            def penalized(out, target, own=own):
                w = own[out.queue]
                return tp.cross_entropy(out, target) + 0.01 * tp.sum(w * w)
            losses.append(g.step(x, y, penalized, pc.optim.SGD(g.parameters(), lr=0.1)))
            weights.append(g.model[0].weight.value.to_host())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    np.testing.assert_allclose(weights[0], weights[1], rtol=1e-5, atol=1e-6)
