"""What data-parallel training loops rely on: gradient accumulation, ignored labels spread
unevenly over the replicas, errors that point at the caller's batch."""

import functools

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup
from parcl.testing import assert_dp_equivalent, seeded, train_single


def mlp(queue):
    return pc.nn.Sequential(pc.nn.Linear(16, 12, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(12, 5, queue=queue))


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 16), dtype=np.float32), rng.integers(0, 5, n).astype(np.int64)


def adamw(params):
    return pc.optim.AdamW(params, lr=1e-2)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("steps", [2, 3])
def test_accumulation_equals_the_full_batch_step(devices2, steps, capture):
    x, y = batch(13)
    ref = train_single(seeded(mlp), tp.cross_entropy, (x, y), 3, adamw)
    with ReplicaGroup(seeded(mlp), devices2, capture=capture) as group:
        opt = adamw(group.parameters())
        losses = [group.step(x, y, tp.cross_entropy, opt, accumulation_steps=steps)
                  for _ in range(3)]
        got = [p.value.to_host() for p in group.parameters()]
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    assert losses[0] > losses[2]


def test_accumulation_needs_a_sample_per_micro_batch(devices2):
    x, y = batch(5)
    with ReplicaGroup(mlp, devices2) as group:
        opt = adamw(group.parameters())
        with pytest.raises(pc.ShapeError, match="2 replicas x 3 micro-batches"):
            group.step(x, y, tp.cross_entropy, opt, accumulation_steps=3)
        group.step(x, y, tp.cross_entropy, opt, accumulation_steps=2)    # still usable


@pytest.mark.parametrize("loss_fn", [tp.cross_entropy, pc.nn.CrossEntropyLoss(ignore_index=3)],
                         ids=["function", "module"])
def test_ignored_labels_all_on_one_replica_weigh_as_in_the_full_batch(devices2, loss_fn):
    x, y = batch(12)
    ignore = -100 if loss_fn is tp.cross_entropy else 3
    y[:5] = ignore                            # replica 0 keeps one counted label, replica 1 six
    assert_dp_equivalent(mlp, loss_fn, (x, y), replicas=2, steps=3, make_optimizer=adamw,
                         devices=devices2)
    with ReplicaGroup(seeded(mlp), devices2) as group:
        loss = group.step(x, y, loss_fn, adamw(group.parameters()))
    q = pc.default_queue()
    pc.nn.manual_seed(0)
    model = mlp(q)
    with tp.no_grad():
        want = loss_fn(model(pc.Tensor.from_host(q, x)), pc.Tensor.from_host(q, y)).item()
    assert loss == pytest.approx(want, rel=1e-5)


def test_a_bad_label_is_reported_by_its_row_in_the_callers_batch(devices2):
    x, y = batch(8)
    y[6] = 99                                       # replica 1's shard: its row 2
    with ReplicaGroup(mlp, devices2) as group:
        with pytest.raises(pc.ReplicaError, match=r"label 99 .*row 6 of the batch"):
            group.step(x, y, tp.cross_entropy, adamw(group.parameters()))


def _clipped_reference(x, y, steps, max_norm):
    """One replica, the whole batch: backward, ``clip_grad_norm_``, step (PyTorch's loop)."""
    q = pc.default_queue()
    pc.nn.manual_seed(0)
    model = mlp(q)
    opt = adamw(model.parameters())
    norms = []
    for _ in range(steps):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(pc.Tensor.from_host(q, x)), pc.Tensor.from_host(q, y))
        tape.backward(loss)
        norms.append(pc.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        opt.step()
        opt.zero_grad()
    return [p.value.to_host() for p in model.parameters()], norms


@pytest.mark.parametrize("options", [{}, {"capture": True}, {"allreduce": "ring"}],
                         ids=["fused", "captured", "ring"])
def test_clipping_the_reduced_gradient_equals_clipping_the_full_batch(devices2, options):
    x, y = batch(12)
    want, norms = _clipped_reference(x, y, 3, max_norm=0.05)
    assert all(n > 0.05 for n in norms)                        # every step was clipped
    with ReplicaGroup(seeded(mlp), devices2, **options) as group:
        assert group.last_grad_norm is None
        opt = adamw(group.parameters())
        got_norms = []
        for _ in range(3):
            group.step(x, y, tp.cross_entropy, opt, max_grad_norm=0.05)
            got_norms.append(group.last_grad_norm)
        got = [p.value.to_host() for p in group.parameters()]
        copies = [[p.value.to_host() for p in r.model.parameters()] for r in group.replicas]
    np.testing.assert_allclose(got_norms, norms, rtol=1e-5)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    for a, b in zip(*copies):                                  # every replica the same
        np.testing.assert_array_equal(a, b)


def test_max_grad_norm_must_be_positive(devices2):
    x, y = batch(4)
    with ReplicaGroup(mlp, devices2) as group:
        with pytest.raises(pc.ParclError, match="max_grad_norm must be > 0"):
            group.step(x, y, tp.cross_entropy, adamw(group.parameters()), max_grad_norm=0)


def bn_cnn(queue):
    # no bias before a batch norm: its gradient is 0 up to rounding, which Adam would amplify
    return pc.nn.Sequential(pc.nn.Conv2d(1, 4, 3, padding=1, bias=False, queue=queue),
                            pc.nn.BatchNorm2d(4, queue=queue), pc.nn.ReLU(),
                            pc.nn.Flatten(), pc.nn.Linear(4 * 8 * 8, 5, bias=False, queue=queue),
                            pc.nn.BatchNorm1d(5, queue=queue))


def _bn_run(devices, steps=3, **options):
    rng = np.random.default_rng(3)
    x = rng.random((10, 1, 8, 8), dtype=np.float32) * 3 + 1
    y = rng.integers(0, 5, 10)
    with ReplicaGroup(seeded(bn_cnn), devices, **options) as group:
        opt = adamw(group.parameters())
        losses = [group.step(x, y, tp.cross_entropy, opt) for _ in range(steps)]
        params = [p.value.to_host() for p in group.parameters()]
        stats = [[b.to_host() for _, b in r.model.named_buffers()] for r in group.replicas]
    return losses, params, stats


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_sync_batchnorm_equals_the_full_batch_step(devices2, capture):
    ref = _bn_run(devices2[:1])
    synced = _bn_run(devices2, sync_batchnorm=True, capture=capture)
    plain = _bn_run(devices2)
    np.testing.assert_allclose(synced[0], ref[0], rtol=1e-4)
    for a, b in zip(ref[1], synced[1]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    for copy in synced[2]:                       # every replica: the full batch's statistics
        for a, b in zip(ref[2][0], copy):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    # without it each replica normalises its own shard: the statistics differ
    assert not all(np.allclose(a, b, rtol=1e-4) for a, b in zip(ref[2][0], plain[2][0]))


def test_sync_batchnorm_in_a_custom_loop_of_runs_equals_the_full_batch_step(devices2, queue):
    """Forward and backward by hand (run, then allreduce_grads), as PyTorch's
    SyncBatchNorm syncs in any training forward: run's batch norms normalised each shard with
    its own statistics, so the first layer's gradient was 0.152 off the full batch's and the
    running mean [-0.056, -0.015, ...] where the full batch gives [-0.175, 0.042, ...]."""
    def build(q):
        return pc.nn.Sequential(pc.nn.Linear(3, 4, queue=q), pc.nn.BatchNorm1d(4, queue=q),
                                pc.nn.Linear(4, 2, queue=q))

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 3)) + np.arange(8)[:, None]).astype(np.float32)
    y = rng.integers(0, 2, 8)

    def fwd_bwd(r, xs, ys):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(r.model(tp.tensor(pc.Tensor.from_host(r.queue, xs))),
                                    pc.Tensor.from_host(r.queue, ys))
        tape.backward(loss)
        return loss.item()

    ref = seeded(build)(queue)
    want = fwd_bwd(type("Replica", (), {"model": ref, "queue": queue}), x, y)
    with ReplicaGroup(seeded(build), devices2, sync_batchnorm=True) as group:
        for _ in range(2):                       # the second after a failed run, too
            losses = group.run(fwd_bwd, [x[:4], x[4:]], [y[:4], y[4:]])
            group.allreduce_grads()
            np.testing.assert_allclose(np.mean(losses), want, rtol=1e-5)   # even shards
            for r in group.replicas:
                for p, q in zip(r.model.parameters(), ref.parameters()):
                    np.testing.assert_allclose(p.grad.to_host(), q.grad.to_host(), rtol=1e-4,
                                               atol=1e-6)
                np.testing.assert_allclose(r.model[1].running_mean.to_host(),
                                           ref[1].running_mean.to_host(), rtol=1e-5, atol=1e-7)
            group.zero_grad()
            with pytest.raises(pc.ReplicaError, match="lost"):   # replica 0 left waiting
                group.run(_fails_in_replica_1, [x[:4], x[4:]])
            for p in ref.parameters():
                p.grad = None
            want = fwd_bwd(type("Replica", (), {"model": ref, "queue": queue}), x, y)


def _fails_in_replica_1(r, xs):
    if r.index == 1:
        raise RuntimeError("replica lost")
    r.model(pc.Tensor.from_host(r.queue, xs))


def test_a_failing_replica_does_not_leave_the_others_waiting_at_a_batch_norm(devices2):
    import time

    class Fails(pc.nn.Module):
        def __init__(self, queue):
            super().__init__()
            self.net = seeded(bn_cnn)(queue)

        def forward(self, x):
            if x.queue is self.failing_queue:
                raise RuntimeError("replica lost")
            return self.net(x)

    with ReplicaGroup(Fails, devices2, sync_batchnorm=True, timeout=60) as group:
        for r in group.replicas:
            r.model.failing_queue = group.replicas[1].queue
        x = np.ones((4, 1, 8, 8), np.float32)
        t0 = time.monotonic()
        with pytest.raises(pc.ReplicaError, match="replica 1 .*replica lost"):
            group.step(x, np.zeros(4, np.int64), tp.cross_entropy, adamw(group.parameters()))
        assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_a_run_resumes_on_another_replica_count(devices2, tmp_path, before, after):
    """A checkpoint of a run on R replicas continues on R' replicas with the same global
    batches: the same data order, and parameters equal to the uninterrupted run's."""
    x, y = batch(48, seed=5)
    loader = pc.data.DataLoader((x, y), batch_size=12, shuffle=True, seed=1)

    def train(group, opt, sched, steps, loader):
        it = iter(loader)
        for _ in range(steps):
            xb, yb = next(it)
            group.step(xb, yb, tp.cross_entropy, opt, max_grad_norm=1.0)
            sched.step()

    def make(devices):
        group = ReplicaGroup(seeded(mlp), devices)
        opt = adamw(group.parameters())
        return group, opt, pc.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)

    group, opt, sched = make(devices2[:2])            # uninterrupted, on 2 replicas
    with group:
        train(group, opt, sched, 4, loader)
        want = [p.value.to_host() for p in group.parameters()]
    loader = pc.data.DataLoader((x, y), batch_size=12, shuffle=True, seed=1)
    group, opt, sched = make(devices2[:before])
    with group:
        train(group, opt, sched, 2, loader)
        pc.save(tmp_path / "ckpt.safetensors", group.model, opt, step=2, scheduler=sched,
                loader=loader.state_dict())
    group, opt, sched = make(devices2[:after])
    with group:
        meta = pc.load(tmp_path / "ckpt.safetensors", group.model, opt, scheduler=sched)
        group.broadcast_parameters()
        loader = pc.data.DataLoader((x, y), batch_size=12, shuffle=True, seed=1)
        loader.load_state_dict(meta["loader"])
        train(group, opt, sched, 2, loader)
        got = [p.value.to_host() for p in group.parameters()]
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_lambda_hiding_ignored_labels_raises_once_then_weighs_them(devices2, capture):
    """``lambda out, y: cross_entropy(out, y)`` hides its ignore_index from the step: the
    first batch with ignored labels raises before anything is updated (weighting the
    replicas by rows would be silently wrong), and the same lambda is weighed right after."""
    x, y = batch(12)
    y[:5] = -100                              # replica 0 keeps one counted label, replica 1 six
    want = train_single(seeded(mlp), tp.cross_entropy, (x, y), 2, adamw)
    with ReplicaGroup(seeded(mlp), devices2, capture=capture) as group:
        opt = adamw(group.parameters())
        before = [p.value.to_host() for p in group.parameters()]
        failed = []
        for i in range(3):                     # a new lambda each step, as in a user's loop
            try:
                group.step(x, y, lambda out, t: tp.cross_entropy(out, t), opt)
            except pc.ParclError as exc:
                assert "mean over the labels not -100" in str(exc)
                for a, p in zip(before, group.parameters()):
                    np.testing.assert_array_equal(p.value.to_host(), a)
                failed.append(i)
        assert failed == [0]
        got = [p.value.to_host() for p in group.parameters()]
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_a_lambda_without_ignored_labels_in_its_batch_just_trains(devices2):
    x, y = batch(12)
    want = train_single(seeded(mlp), tp.cross_entropy, (x, y), 2, adamw)
    with ReplicaGroup(seeded(mlp), devices2) as group:
        opt = adamw(group.parameters())
        for _ in range(2):
            group.step(x, y, lambda out, t: tp.cross_entropy(out, t), opt)
        got = [p.value.to_host() for p in group.parameters()]
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss_fn", [functools.partial(tp.cross_entropy, ignore_index=3),
                                     pc.nn.GPT.loss], ids=["partial", "gpt-loss"])
def test_ignore_index_is_seen_through_partials_and_gpt_loss(loss_fn):
    from parcl.replica_steps import ignored_label
    assert ignored_label(loss_fn) == (3 if isinstance(loss_fn, functools.partial) else -100)


def test_momentum_with_parameter_groups_splitting_a_bucket_equals_the_named_allreduce(devices2):
    """Two parameter groups that split one gradient bucket make the fused end of the step
    fall back to the plain one for that step; the bucket that stayed whole must not have its
    (uninitialised) momentum buffer taken as already started: the results equal the
    ``direct`` allreduce's bit for bit, and the single-replica run's."""
    def build(q):
        return pc.nn.Sequential(*(pc.nn.Linear(8, 8, queue=q) for _ in range(3)))

    def sgd(params):         # 0.weight 0.bias 1.weight 1.bias 2.weight 2.bias: layer 0 split
        params = list(params)
        a = [params[i] for i in (4, 5, 1)]
        b = [params[i] for i in (0, 2, 3)]
        return pc.optim.SGD([{"params": a}, {"params": b, "weight_decay": 0.1}], lr=0.1,
                            momentum=0.9)

    rng = np.random.default_rng(0)
    x, y = rng.random((8, 8), dtype=np.float32), rng.integers(0, 8, 8).astype(np.int64)
    got = {}
    for allreduce in ("auto", "direct"):
        with ReplicaGroup(seeded(build), devices2, allreduce=allreduce,
                          bucket_mb=100 * 4 / 2**20) as group:     # a bucket per layer
            opt = sgd(group.parameters())
            for _ in range(3):
                group.step(x, y, tp.cross_entropy, opt)
            got[allreduce] = [p.value.to_host() for p in group.parameters()]
    want = train_single(seeded(build), tp.cross_entropy, (x, y), 3, sgd)
    for a, b, w in zip(got["auto"], got["direct"], want):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-6)


class TwoHeads(pc.nn.Module):
    """A head the forward never uses (an auxiliary or conditional branch)."""

    def __init__(self, queue=None):
        super().__init__()
        self.body = pc.nn.Linear(16, 12, queue=queue)
        self.head = pc.nn.Linear(12, 5, queue=queue)
        self.aux = pc.nn.Linear(12, 5, queue=queue)

    def forward(self, x):
        return self.head(tp.relu(self.body(x)))


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("make", [
    lambda p: pc.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    lambda p: pc.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1)], ids=["adamw", "sgd"])
def test_a_parameter_without_a_gradient_is_not_updated(devices2, make, capture):
    """As in torch.optim (and DDP with find_unused_parameters): weight decay and momentum do
    not move a parameter the forward never used, and Adam keeps no state for it."""
    x, y = batch(8)
    want = train_single(seeded(TwoHeads), tp.cross_entropy, (x, y), 3, make)
    with ReplicaGroup(seeded(TwoHeads), devices2, capture=capture) as group:
        opt = make(group.parameters())
        aux = group.model.aux.weight.value.to_host()
        for _ in range(3):
            group.step(x, y, tp.cross_entropy, opt)
        np.testing.assert_array_equal(group.model.aux.weight.value.to_host(), aux)
        assert group.model.aux.weight.grad is None
        assert group.model.aux.weight not in opt.state
        got = [p.value.to_host() for p in group.parameters()]
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss_fn", [
    lambda out, t: tp.cross_entropy(out, t) * 1.0,
    lambda out, t: tp.cross_entropy(out, t) + 0.01 * tp.mean(out * out)], ids=["scaled", "aux"])
def test_a_loss_with_ignored_labels_under_other_ops_raises_every_step(devices2, loss_fn):
    """``CE * w`` or ``CE + aux`` with ignored labels spread unevenly: weighing the replicas by
    rows or by labels cannot give the full-batch gradient of every such loss, so each step
    with such labels raises before anything is updated."""
    x, y = batch(8)
    y[:3] = -100
    with ReplicaGroup(seeded(mlp), devices2) as group:
        opt = adamw(group.parameters())
        before = [p.value.to_host() for p in group.parameters()]
        for _ in range(2):
            with pytest.raises(pc.ParclError, match="under other ops"):
                group.step(x, y, loss_fn, opt)
        for a, p in zip(before, group.parameters()):
            np.testing.assert_array_equal(p.value.to_host(), a)
        group.step(x, np.where(y < 0, 0, y), loss_fn, opt)      # no ignored label: trains


def test_a_declared_ignore_index_weighs_a_scaled_loss_by_its_labels(devices2):
    x, y = batch(8)
    y[:3] = -100

    def loss_fn(out, t):
        return tp.cross_entropy(out, t) * 2.0
    loss_fn.ignore_index = -100
    want = train_single(seeded(mlp), loss_fn, (x, y), 2, adamw)
    with ReplicaGroup(seeded(mlp), devices2) as group:
        opt = adamw(group.parameters())
        for _ in range(2):
            group.step(x, y, loss_fn, opt)
        got = [p.value.to_host() for p in group.parameters()]
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_resumed_run_with_dropout_draws_the_same_masks(devices2, tmp_path, capture):
    """Saving ``group.rng_state()`` with the checkpoint and putting it back makes 4 steps,
    a save and a load, then 4 more, bit for bit 8 straight steps."""
    x, y = batch(16, seed=7)

    def build(q):
        return pc.nn.Sequential(pc.nn.Linear(16, 12, queue=q), pc.nn.ReLU(),
                                pc.nn.Dropout(0.3), pc.nn.Linear(12, 5, queue=q))

    def run(steps, group, opt):
        for _ in range(steps):
            group.step(x, y, tp.cross_entropy, opt)

    with ReplicaGroup(seeded(build), devices2, capture=capture) as group:
        opt = adamw(group.parameters())
        run(8, group, opt)
        want = [p.value.to_host() for p in group.parameters()]
    path = tmp_path / "ckpt.safetensors"
    with ReplicaGroup(seeded(build), devices2, capture=capture) as group:
        opt = adamw(group.parameters())
        run(4, group, opt)
        pc.save(path, group.model, opt, step=4, dropout=group.rng_state())
    with ReplicaGroup(seeded(build), devices2, capture=capture) as group:
        opt = adamw(group.parameters())
        meta = pc.load(path, group.model, opt)
        group.broadcast_parameters()
        group.set_rng_state(meta["dropout"])
        run(4, group, opt)
        got = [p.value.to_host() for p in group.parameters()]
        with pytest.raises(pc.ParclError, match="one per replica"):
            group.set_rng_state(meta["dropout"][:1])
    for a, b in zip(want, got):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("bad", [[1.5, 0], [0, 2.5], ["1", 0], [True, 0], [0, -1]])
def test_a_group_dropout_state_that_is_not_ints_is_refused(devices2, bad):
    """group.set_rng_state ran int() over every value before checking, so [1.5, 0] became
    seed 1 and "1" or True did too: a resume drew other masks than the saved run, silently.
    Refused now, as tp.set_rng_state refuses it, and no replica's generator changes."""
    with ReplicaGroup(mlp, devices2) as group:
        before = group.rng_state()
        with pytest.raises(pc.ParclError, match="set_rng_state: expected"):
            group.set_rng_state([[3, 0], bad])
        assert group.rng_state() == before


def test_clipping_a_reduced_gradient_too_large_to_square_scales_it(devices2):
    """A loss scaled by 1e20 (gradients ~1e19 and more): the reduced gradient's norm summed
    its squares in float32 and overflowed to inf, so max_grad_norm zeroed the update, and
    the parameters did not move, silently. Clipped, the gradient's direction is the
    unscaled one's: the same step as the unscaled loss clipped to the same norm."""
    x, y = batch(12)
    runs = []
    for scale in (1.0, 1e20):
        def loss_fn(out, target, scale=scale):
            return tp.cross_entropy(out, target) * scale

        with ReplicaGroup(seeded(mlp), devices2) as group:
            group.step(x, y, loss_fn, pc.optim.SGD(group.parameters(), lr=0.1),
                       max_grad_norm=1e-3)
            runs.append((group.last_grad_norm, [p.value.to_host() for p in group.parameters()]))
    (norm, want), (big_norm, got) = runs
    assert big_norm == pytest.approx(norm * 1e20, rel=1e-5)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
