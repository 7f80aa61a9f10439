"""Data-parallel replicas on two PoCL sub-devices: equivalence with the single-replica run,
fault handling, thread isolation, desync detection."""

import threading
import time

import numpy as np
import pyopencl as cl
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.allreduce import shares_memory
from parcl.replica import ReplicaGroup
from parcl.testing import assert_dp_equivalent, seeded, train_replicated, train_single

from conftest import refused_here


def mlp(queue):
    return pc.nn.Sequential(pc.nn.Linear(64, 32, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 10, queue=queue))


def cnn(queue):
    return pc.nn.Sequential(
        pc.nn.Conv2d(1, 4, 3, padding=1, queue=queue), pc.nn.ReLU(), pc.nn.MaxPool2d(2),
        pc.nn.Flatten(), pc.nn.Linear(4 * 4 * 4, 10, queue=queue))


def batch(n, images=False, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 1, 8, 8) if images else (n, 64)
    return rng.random(shape, dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def sgd(params):
    return pc.optim.SGD(params, lr=0.1, momentum=0.9)


def adamw(params):
    return pc.optim.AdamW(params, lr=1e-2)


@pytest.mark.parametrize("make_opt", [sgd, adamw], ids=["sgd-momentum", "adamw"])
@pytest.mark.parametrize("build,images", [(mlp, False), (cnn, True)], ids=["mlp", "cnn"])
def test_two_replicas_match_single_replica(devices2, build, images, make_opt):
    assert_dp_equivalent(build, tp.cross_entropy, batch(16, images), replicas=2, steps=5,
                         make_optimizer=make_opt, devices=devices2)


def test_uneven_split_matches(devices2):
    assert_dp_equivalent(mlp, tp.cross_entropy, batch(7), replicas=2, steps=5,
                         make_optimizer=sgd, devices=devices2)


@pytest.mark.parametrize("algorithm", ["direct", "scatter", "ring"])
def test_every_algorithm_gives_the_same_training(devices2, algorithm):
    if refused_here(algorithm, devices2):
        with pytest.raises(ValueError, match=f"ReplicaGroup: allreduce '{algorithm}'"):
            ReplicaGroup(mlp, devices2, allreduce=algorithm)
        return
    ref = train_single(seeded(mlp), tp.cross_entropy, batch(12), 3, sgd)
    got = train_replicated(seeded(mlp), tp.cross_entropy, batch(12), 3, 2, sgd,
                           devices=devices2, allreduce=algorithm)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_an_optimizer_with_its_own_update_rule_is_not_sharded(devices2):
    """A subclass that overrides ``_update`` knows nothing of the sharded end of a step: the
    group reduces, steps replica 0 and broadcasts instead, and training stays right."""
    from parcl.kernels import optim as K

    class PlainSGD(pc.optim.SGD):
        def _update(self, p, grad, state, opts, fresh):      # SGD without momentum, by hand
            K.sgd_(p.value, grad, opts["lr"], opts["weight_decay"])

    def make(params):
        return PlainSGD(params, lr=0.1)

    assert not make([tp.tensor(pc.Tensor.zeros(pc.default_queue(), (1,)),
                               requires_grad=True)]).replicable
    assert pc.optim.SGD([tp.tensor(pc.Tensor.zeros(pc.default_queue(), (1,)),
                                   requires_grad=True)], lr=0.1).replicable
    ref = train_single(seeded(mlp), tp.cross_entropy, batch(12), 3, make)
    got = train_replicated(seeded(mlp), tp.cross_entropy, batch(12), 3, 2, make,
                           devices=devices2)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_bit_identical_across_runs(devices2):
    runs = [train_replicated(seeded(mlp), tp.cross_entropy, batch(16), 3, 2, adamw,
                             devices=devices2) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))


def test_replicas_start_identical_and_stay_identical(devices2):
    counter = iter(range(100))

    def unseeded(queue):                     # a different init in every replica
        pc.nn.manual_seed(next(counter))
        return mlp(queue)

    with ReplicaGroup(unseeded, devices2) as group:
        def params(r):
            return [p.value.to_host() for p in r.model.parameters()]
        p0, p1 = group.run(params)
        assert all(np.array_equal(a, b) for a, b in zip(p0, p1))
        opt = sgd(group.parameters())
        x, y = batch(10)
        group.step(x, y, tp.cross_entropy, opt)
        p0, p1 = group.run(params)
        assert all(np.array_equal(a, b) for a, b in zip(p0, p1))


def test_each_replica_has_own_thread_queue_and_tape(devices2):
    with tp.Tape() as caller_tape, ReplicaGroup(mlp, devices2) as group:
        def info(r):
            return (threading.get_ident(), r.queue, tp.get_current_tape(),
                    pc.default_queue() is r.queue)
        results = group.run(info)
        assert len({t for t, *_ in results}) == 2
        assert results[0][1] is not results[1][1]
        assert [q.device.int_ptr for _, q, *_ in results] == [d.int_ptr for d in devices2]
        assert all(tape is None for _, _, tape, _ in results)   # caller's tape is invisible
        assert all(own for *_, own in results)
        assert tp.get_current_tape() is caller_tape


def test_grad_mode_follows_the_dispatching_thread(devices2):
    with ReplicaGroup(mlp, devices2) as group:
        with tp.no_grad():
            assert group.run(lambda r: tp.is_grad_enabled()) == [False, False]
        assert group.run(lambda r: tp.is_grad_enabled()) == [True, True]


def test_no_grad_in_replica_1_does_not_disturb_replica_0(devices2):
    x, y = batch(8)
    with ReplicaGroup(mlp, devices2) as group:
        barrier = threading.Barrier(2, timeout=30)

        def work(r):
            q = r.queue
            xt = tp.tensor(pc.Tensor.from_host(q, x))
            yt = pc.Tensor.from_host(q, y)
            if r.index == 1:
                with tp.no_grad():
                    barrier.wait()
                    out = r.model(xt)
                    barrier.wait()
                    return isinstance(out, pc.Tensor)
            barrier.wait()
            with tp.Tape() as tape:
                loss = tp.cross_entropy(r.model(xt), yt)
            barrier.wait()
            tape.backward(loss)
            return [p.grad.to_host() for p in r.model.parameters()]

        group.zero_grad()
        grads0, evaluated_raw = group.run(work)
        assert evaluated_raw is True
        # reference: the same backward with nothing else running
        group.zero_grad()
        ref = group.run(lambda r: _grads_alone(r, x, y))[0]
        for a, b in zip(grads0, ref):
            np.testing.assert_array_equal(a, b)


def _grads_alone(r, x, y):
    if r.index != 0:
        return None
    q = r.queue
    with tp.Tape() as tape:
        loss = tp.cross_entropy(r.model(tp.tensor(pc.Tensor.from_host(q, x))),
                                pc.Tensor.from_host(q, y))
    tape.backward(loss)
    return [p.grad.to_host() for p in r.model.parameters()]


class Boom(RuntimeError):
    pass


def test_injected_faults_surface_fast_and_change_nothing(devices2):
    x, y = batch(8)
    with ReplicaGroup(mlp, devices2, timeout=60) as group:
        opt = pc.optim.AdamW(group.parameters(), lr=1e-2)
        group.step(x, y, tp.cross_entropy, opt)             # state exists before faults
        for rep in range(50):
            k, phase = rep % 2, (rep // 2) % 3
            before = [p.value.to_host() for p in group.parameters()]
            state = opt.state_dict()

            def faulty(pred, labels, k=k, phase=phase):
                index = 0 if pc.default_queue() is group.replicas[0].queue else 1
                if index == k and phase == 0:
                    raise Boom(f"injected in replica {k}")
                loss = tp.cross_entropy(pred, labels)
                if index == k and phase == 1:
                    raise Boom(f"injected after forward in replica {k}")
                if index != k and phase == 2:
                    time.sleep(0.3)                         # the other replica is still busy
                if index == k and phase == 2:
                    raise Boom(f"injected while the other replica is busy ({k})")
                return loss

            t0 = time.monotonic()
            with pytest.raises(pc.ReplicaError) as info:
                group.step(x, y, faulty, opt)
            assert time.monotonic() - t0 < 1.0
            assert info.value.index == k and f"replica {k}" in str(info.value)
            assert "Boom" in str(info.value) and "Traceback" in info.value.traceback_text
            after = [p.value.to_host() for p in group.parameters()]
            assert all(np.array_equal(a, b) for a, b in zip(before, after))
            st = opt.state_dict()["state"]
            assert all(np.array_equal(state["state"][i]["exp_avg"], st[i]["exp_avg"])
                       for i in st)
        # still usable: a good step after all the failures equals a fresh group's next step
        group.step(x, y, tp.cross_entropy, opt)
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("parcl-replica")]


def test_desync_is_reported(devices2):
    class Branchy(pc.nn.Module):
        def __init__(self, queue):
            super().__init__()
            self.a = pc.nn.Linear(64, 10, queue=queue)
            self.b = pc.nn.Linear(64, 10, queue=queue)
            self.queue = queue

        def forward(self, x):
            # a data-dependent branch: the replicas' shards differ
            first = float(x.value.to_host()[0, 0]) if isinstance(x, tp.Node) else 0.0
            return self.a(x) if first < 0.5 else self.b(x)

    x, y = batch(4)
    x[0, 0], x[2, 0] = 0.0, 0.9
    with ReplicaGroup(Branchy, devices2) as group:
        opt = sgd(group.parameters())
        before = [p.value.to_host() for p in group.parameters()]
        with pytest.raises(pc.ReplicaError, match="desync") as info:
            group.step(x, y, tp.cross_entropy, opt)
        assert "a.weight" in str(info.value) and "b.weight" in str(info.value)
        after = [p.value.to_host() for p in group.parameters()]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_batchnorm_running_stats_follow_replica_0(devices2):
    def build(queue):
        return pc.nn.Sequential(pc.nn.Conv2d(1, 3, 3, queue=queue),
                                pc.nn.BatchNorm2d(3, queue=queue), pc.nn.ReLU(),
                                pc.nn.Flatten(), pc.nn.Linear(3 * 6 * 6, 10, queue=queue))
    x, y = batch(8, images=True)
    with ReplicaGroup(build, devices2) as group:
        opt = sgd(group.parameters())
        group.step(x, y, tp.cross_entropy, opt)
        stats = group.run(lambda r: [b.to_host() for _, b in r.model.named_buffers()])
        assert all(np.array_equal(a, b) for a, b in zip(*stats))
        # replica 0 normalised its own half: its running mean is that half's batch mean
        assert not np.allclose(stats[0][0], 0.0)


def test_bad_use_gives_clear_errors(devices2):
    with ReplicaGroup(mlp, devices2) as group:
        opt = sgd(group.parameters())
        with pytest.raises(pc.ShapeError, match="at least 2"):
            group.step(*batch(1), tp.cross_entropy, opt)
        with pytest.raises(pc.ShapeError, match="one per replica"):
            group.run(lambda r, a: a, [1, 2, 3])
    with pytest.raises(pc.ParclError, match="closed"):
        group.run(lambda r: None)
    with pytest.raises(ValueError, match="unknown allreduce"):
        ReplicaGroup(mlp, devices2, allreduce="tree")


def test_a_hung_replica_times_out(devices2):
    group = ReplicaGroup(mlp, devices2, timeout=0.5)
    try:
        with pytest.raises(pc.ReplicaError, match="did not finish"):
            group.run(lambda r: time.sleep(1.0 if r.index == 1 else 0))
        with pytest.raises(pc.ParclError, match="unusable"):
            group.run(lambda r: None)
    finally:
        group.close()


def test_a_timeout_of_inf_waits_without_limit_and_one_not_above_0_is_refused(devices2):
    """timeout=float("inf") (no limit) made the group's first wait raise OverflowError while
    it was being built; 0, a negative timeout or NaN gave up at once, blaming replicas that
    had not started ("replicas [0, 1] did not finish within 0 s"), the group unusable."""
    def build(queue):
        return pc.nn.Sequential(pc.nn.Linear(64, 8, queue=queue),
                                pc.nn.BatchNorm1d(8, queue=queue), pc.nn.Linear(8, 10, queue=queue))

    x, y = batch(8)
    with ReplicaGroup(build, devices2, timeout=float("inf"), sync_batchnorm=True) as group:
        opt = sgd(group.parameters())
        assert np.isfinite(group.step(x, y, tp.cross_entropy, opt))   # the exchange's barrier
        assert group.run(lambda r: r.index, timeout=float("inf")) == [0, 1]
        for bad in (0, -1.0, float("nan"), "10"):
            with pytest.raises(pc.ParclError, match="ReplicaGroup.run: timeout must be (>|a)"):
                group.run(lambda r: r.index, timeout=bad)
        assert group.run(lambda r: r.index) == [0, 1]         # still usable
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(pc.ParclError, match=r"ReplicaGroup: timeout must be > 0 seconds"):
            ReplicaGroup(mlp, devices2, timeout=bad)


def test_calls_from_two_threads_run_one_after_the_other(devices2):
    """A thread's group.run (an evaluation) or step while another thread's step was being
    applied zeroed the gradients under the update (the step moved nothing) or summed the two
    steps' gradients, with no error: now each call waits for the other's, bounded by the
    group's timeout, and the result is that of the two calls in turn; a close waits for the
    step too."""
    from parcl.kernels import optim as K

    inside = threading.Event()

    class SlowSGD(pc.optim.SGD):                 # the fused end of step has the same window
        def _update(self, p, grad, state, opts, fresh):
            K.sgd_(p.value, grad, opts["lr"], opts["weight_decay"])

        def step(self, closure=None):
            inside.set()
            time.sleep(0.3)                      # the other thread calls meanwhile
            return super().step(closure)

    (xa, ya), (xb, yb) = batch(8, seed=1), batch(8, seed=2)

    def train(second=None):
        inside.clear()
        pc.manual_seed(0)
        with ReplicaGroup(mlp, devices2, timeout=60) as group:
            opt = SlowSGD(group.parameters(), lr=0.5)
            if second is None:                   # one thread: a, then b
                group.step(xa, ya, tp.cross_entropy, opt)
                group.step(xb, yb, tp.cross_entropy, opt)
            else:
                other = threading.Thread(target=lambda: (inside.wait(30), second(group, opt)))
                other.start()
                group.step(xa, ya, tp.cross_entropy, opt)
                other.join(60)
            return [p.value.to_host() for p in group.parameters()]

    in_turn = train()
    evaluated = train(lambda group, opt: group.run(lambda r: r.model(
        tp.tensor(pc.Tensor.from_host(r.queue, xa)))))
    stepped = train(lambda group, opt: group.step(xb, yb, tp.cross_entropy, opt))
    closed = train(lambda group, opt: group.close())
    inside.clear()
    pc.manual_seed(0)
    with ReplicaGroup(mlp, devices2) as group:
        opt = SlowSGD(group.parameters(), lr=0.5)
        group.step(xa, ya, tp.cross_entropy, opt)
        alone = [p.value.to_host() for p in group.parameters()]
    for a, b, c in zip(alone, evaluated, closed):
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(c, a)
    for a, b in zip(in_turn, stepped):
        np.testing.assert_array_equal(b, a)


def test_eval_from_another_thread_waits_for_a_step_whose_forward_it_would_change(devices2):
    """group.train/eval set the replicas' modes outside the group's lock: another thread's
    eval during a step's forwards switched them to eval mode half-way through."""
    inside = threading.Event()

    class Probe(pc.nn.Module):                    # the mode before and after a pause
        def forward(self, x):
            self.seen = [self.training]
            inside.set()
            time.sleep(0.3)                       # the other thread calls eval meanwhile
            self.seen.append(self.training)
            return x

    def build(queue):
        return pc.nn.Sequential(Probe(), pc.nn.Linear(64, 10, queue=queue))

    x, y = batch(8)
    with ReplicaGroup(build, devices2, timeout=60) as group:
        other = threading.Thread(target=lambda: (inside.wait(30), group.eval()))
        other.start()
        group.step(x, y, tp.cross_entropy, sgd(group.parameters()))
        other.join(60)
        assert [r.model[0].seen for r in group.replicas] == [[True, True], [True, True]]
        assert [r.model.training for r in group.replicas] == [False, False]


def test_a_group_called_inside_a_replicas_own_call_raises_at_once(devices2):
    """group.run called by a replica's fn waited for that replica, which was running it,
    until the group's timeout, and left the group unusable."""
    with ReplicaGroup(mlp, devices2, timeout=60) as group:
        t0 = time.monotonic()
        with pytest.raises(pc.ReplicaError, match="called by replica 0's own thread"):
            group.run(lambda r: group.run(lambda s: None) if r.index == 0 else None)
        assert time.monotonic() - t0 < 10
        assert group.run(lambda r: r.index) == [0, 1]          # still usable


def test_three_replicas_sharing_devices_match(devices2):
    devs = [devices2[0], devices2[1], devices2[0]]
    assert_dp_equivalent(mlp, tp.cross_entropy, batch(9), replicas=3, steps=3,
                         make_optimizer=sgd, devices=devs)


@pytest.mark.parametrize("algorithm", ["scatter", "shared"])
def test_nine_replicas_match_single_replica(devices2, algorithm):
    """More replicas than one reduce kernel reads (8): the 9th replica's chunk of every
    bucket was summed with its own gradient lost and the first 8 replicas' counted twice."""
    devs = [devices2[i % 2] for i in range(9)]
    if refused_here(algorithm, devs):
        with pytest.raises(ValueError, match=f"ReplicaGroup: allreduce '{algorithm}'"):
            ReplicaGroup(mlp, devs, allreduce=algorithm)
        return
    assert_dp_equivalent(mlp, tp.cross_entropy, batch(18), replicas=9, steps=3,
                         make_optimizer=sgd, devices=devs, allreduce=algorithm)


def test_nan_under_detect_anomaly_names_the_replica(devices2):
    x, y = batch(8)
    x[5, 3] = np.nan                                       # in replica 1's half only
    with ReplicaGroup(mlp, devices2) as group:
        opt = sgd(group.parameters())
        before = [p.value.to_host() for p in group.parameters()]
        with tp.detect_anomaly(), pytest.raises(pc.ReplicaError) as info:
            group.step(x, y, tp.cross_entropy, opt)
        assert info.value.index == 1
        assert "AnomalyError" in str(info.value) and "linear" in str(info.value)
        after = [p.value.to_host() for p in group.parameters()]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_a_dropped_group_leaves_no_threads(devices2):
    import gc

    def replica_threads():
        return [t for t in threading.enumerate() if t.name.startswith("parcl-replica")]

    group = ReplicaGroup(mlp, devices2)
    opt = sgd(group.parameters())
    group.step(*batch(4), tp.cross_entropy, opt)
    assert len(replica_threads()) == 2
    del group, opt
    gc.collect()
    deadline = time.monotonic() + 10
    while replica_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not replica_threads()


def test_one_model_shared_by_replicas_is_refused(devices2):
    shared = mlp(pc.new_queue(devices2[0]))
    with pytest.raises(pc.ParclError, match="new model"):
        ReplicaGroup(lambda q: shared, devices2)


def test_the_broadcast_is_one_copy_per_bucket(devices2):
    with ReplicaGroup(mlp, devices2, bucket_mb=1) as group:
        flats = group._buffers.values[1].flats
        assert len(flats) == len(group._buffers.grads[1].flats) == 1
        views = [p.value.data for p in group.replicas[1].model.parameters()]
        assert all(v.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) == flats[0].data
                   for v in views)


@pytest.mark.parametrize("make_opt", [sgd, adamw], ids=["sgd-momentum", "adamw"])
def test_fused_bucket_optimizer_step_equals_the_per_parameter_step(devices2, make_opt):
    from parcl.kernels._cache import trace_launches

    def run(fused):
        with ReplicaGroup(seeded(mlp), devices2) as group:
            opt = make_opt(group.parameters())
            if not fused:
                opt.__class__ = _per_parameter(type(opt))
            for s in range(3):
                with trace_launches() as launches:
                    group.step(*batch(8, seed=s), tp.cross_entropy, opt)
            updates = [(name, q) for name, q, _ in launches if _is_update(name)]
            params = [p.value.to_host() for p in group.parameters()]
            state = opt.state_dict()["state"]
        return updates, params, state

    fused_updates, fused_params, fused_state = run(True)
    plain_updates, plain_params, plain_state = run(False)
    # 1 bucket, split over the 2 replicas' queues where they share the host's memory (on GPUs
    # replica 0 updates it whole); 4 parameters one by one on replica 0's
    shards = 2 if shares_memory(devices2) else 1
    assert len(fused_updates) == shards and len({q for _, q in fused_updates}) == shards
    assert len(plain_updates) == 4
    assert all(np.array_equal(a, b) for a, b in zip(fused_params, plain_params))
    for i in plain_state:
        for k, v in plain_state[i].items():
            assert np.array_equal(np.asarray(fused_state[i][k]), np.asarray(v))


def _per_parameter(cls):
    """``cls`` with a ``step()`` of its own: not plannable, so the group calls ``step()``,
    which updates parameter by parameter."""
    class PerParameter(cls):
        def step(self, closure=None):
            return super().step(closure)
    return PerParameter


def _is_update(kernel_name: str) -> bool:
    return kernel_name.split("_x")[0] in ("adam", "sgd_momentum", "sgd")


def plain_sgd(params):
    return pc.optim.SGD(params, lr=0.1, weight_decay=0.01)


@pytest.mark.parametrize("make_opt", [plain_sgd, sgd, adamw],
                         ids=["sgd", "sgd-momentum", "adamw"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_sharded_step_equals_replica_0_stepping_everything(devices2, make_opt, k):
    """The default step shares the reduce, optimizer update, broadcast and zeroing among the
    replicas' queues; with allreduce="shared" replica 0 steps every parameter itself. Both
    sum in replica order with the same kernels: bit-identical parameters and state, and every
    replica ends with replica 0's values and zero gradients. On GPUs (memories of their own)
    the default step is replica 0 stepping everything after a "direct" allreduce."""
    from parcl.kernels._cache import trace_launches

    devs = [devices2[i % 2] for i in range(k)]
    sharded = shares_memory(devs)

    def run(allreduce):
        with ReplicaGroup(seeded(mlp), devs, allreduce=allreduce, bucket_mb=0.004) as group:
            assert len(group._buffers.grads[0].flats) > 1            # several buckets
            opt = make_opt(group.parameters())
            for s in range(3):
                with trace_launches() as launches:
                    group.step(*batch(9, seed=s), tp.cross_entropy, opt)
            queues = {q for name, q, _ in launches if _is_update(name)}
            kernels = {name for name, _, _ in launches}
            replicas = [[p.value.to_host() for p in r.model.parameters()]
                        for r in group.replicas]
            grads = [p.grad.to_host() for r in group.replicas for p in r.model.parameters()]
            return len(queues), kernels, replicas, grads, opt.state_dict()["state"]

    n_sharded, kernels, copies, grads, sharded_state = run("auto")
    n_plain, _, plain, _, plain_state = run("shared" if sharded else "direct")
    assert n_sharded == (k if sharded else 1) and n_plain == 1
    if sharded:   # one kernel per queue and bucket does the whole end: no reduce, no copies
        assert not any(name.startswith("reduce") for name in kernels)
        assert all(name.endswith(f"_x{k}") for name in kernels if _is_update(name))
    for copy in copies:
        assert all(np.array_equal(a, b) for a, b in zip(copy, plain[0]))
    assert all(not g.any() for g in grads)
    for i in plain_state:
        for name, v in plain_state[i].items():
            assert np.array_equal(np.asarray(sharded_state[i][name]), np.asarray(v)), name


def test_a_step_after_a_failure_does_not_see_a_straggler_s_gradients(devices2):
    def run(fail_first):
        with ReplicaGroup(seeded(mlp), devices2) as group:
            opt = sgd(group.parameters())
            if fail_first:
                def slow_fail(pred, labels):
                    if pc.default_queue() is group.replicas[0].queue:
                        raise Boom("replica 0 fails at once")
                    time.sleep(0.5)                     # replica 1 still works on
                    return tp.cross_entropy(pred, labels)
                with pytest.raises(pc.ReplicaError):
                    group.step(*batch(8, seed=1), slow_fail, opt)
            group.step(*batch(8), tp.cross_entropy, opt)
            return [p.value.to_host() for p in group.parameters()]

    for a, b in zip(run(False), run(True)):
        np.testing.assert_array_equal(a, b)


def test_a_batch_skipped_after_a_failed_run_leaves_no_straggler_gradient_as_pytorch(devices2):
    """A DDP-style loop skips a batch whose ``group.run`` raised (``opt.zero_grad()``, next
    batch): the run raised as soon as replica 1 failed, while replica 0 was still in its
    backward, so the caller's zero_grad came first and replica 0's gradient of the skipped
    batch was written after it and added into the next batch's: the bias gradient was 3 where
    2 is right (PyTorch's parallel_apply joins every thread before it raises)."""
    x = np.ones((2, 3), np.float32)

    def forward_backward(r, fail, slow):
        if fail:
            raise Boom("a bad batch on replica 1")
        if slow:
            time.sleep(0.3)                   # replica 0 still works on when replica 1 fails
        with tp.Tape() as tape:
            loss = tp.sum(r.model(tp.tensor(pc.Tensor.from_host(r.queue, x))))
        tape.backward(loss)

    with ReplicaGroup(lambda q: pc.nn.Linear(3, 2, queue=q), devices2) as group:
        opt = sgd(group.parameters())
        with pytest.raises(pc.ReplicaError, match="a bad batch"):
            group.run(forward_backward, [False, True], [True, False])
        opt.zero_grad()                       # the batch is skipped
        group.run(forward_backward, [False, False], [False, False])
        group.allreduce_grads()
        np.testing.assert_array_equal(group.parameters()[1].grad.to_host(), [2.0, 2.0])


def test_after_close_the_optimizer_steps_parameters_one_by_one(devices2):
    group = ReplicaGroup(mlp, devices2)
    group.close()
    model = group.model
    opt = sgd(model.parameters())
    q = group.replicas[0].queue
    x, y = batch(4)
    with tp.Tape() as tape:
        loss = tp.cross_entropy(model(tp.tensor(pc.Tensor.from_host(q, x))),
                                pc.Tensor.from_host(q, y))
    tape.backward(loss)
    before = [p.value.to_host() for p in model.parameters()]
    opt.step()
    after = [p.value.to_host() for p in model.parameters()]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))


def test_momentum_switched_on_later_uses_the_fused_path_correctly(devices2):
    def run(fused):
        with ReplicaGroup(seeded(mlp), devices2) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.0)
            if not fused:
                opt.__class__ = _per_parameter(type(opt))
            for s in range(3):
                if s == 1:
                    opt.param_groups[0]["momentum"] = 0.9       # a momentum warm-up
                group.step(*batch(8, seed=s), tp.cross_entropy, opt)
            return [p.value.to_host() for p in group.parameters()]

    for a, b in zip(run(True), run(False)):
        np.testing.assert_array_equal(a, b)


def test_a_replica_stopped_by_a_broken_barrier_waits_for_the_cause():
    """sync_batchnorm's barrier breaks for every replica when one fails; the dispatcher is
    woken by the failure that caused it, so the error names the replica that failed."""
    import threading

    from parcl.replica_threads import Failure, Job
    job = Job(2)
    job.finish(0, failure=Failure(0, threading.BrokenBarrierError(), ""))
    assert not job.done_or_failed.is_set()
    job.finish(1, failure=Failure(1, RuntimeError("replica lost"), ""))
    assert job.done_or_failed.is_set() and job.all_done.is_set()


def test_ctrl_c_while_a_call_is_handed_out_does_not_hang_the_next_call(devices2):
    """Ctrl-C that landed while a call was being handed to the replicas (one had it, the
    other not) left a job no replica would finish: the failed step's rewind then waited for
    it until the group's timeout (parcl-launch's Ctrl-C test hung, under load). The replicas
    never handed the job count as finished; the next call runs at once."""
    class Interrupted:                  # replica 1's inbox: Ctrl-C at its first hand-over
        def __init__(self, inbox):
            self.inbox, self.fired = inbox, False

        def put(self, item):
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt
            self.inbox.put(item)

        def get(self):
            return self.inbox.get()

    with ReplicaGroup(mlp, devices2, timeout=20) as group:
        real = group.replicas[1].inbox
        group.replicas[1].inbox = Interrupted(real)
        with pytest.raises(KeyboardInterrupt):
            group.run(lambda r: r.index)
        t0 = time.monotonic()
        assert group.run(lambda r: r.index) == [0, 1]
        assert time.monotonic() - t0 < 5


def test_a_seed_set_before_the_group_seeds_the_model_it_builds(devices2):
    """``pc.manual_seed(s)`` and then ``ReplicaGroup(build)`` builds the model ``build`` gives
    after that seed in the caller's own thread: the replica threads' generators started at
    seed 0 whatever the caller had seeded, so a seed sweep trained one model for every seed."""
    def build(queue):
        return pc.nn.Linear(4, 3, queue=queue)

    weights = []
    for seed in (1, 2, 1):
        pc.manual_seed(seed)
        with ReplicaGroup(build, devices2) as group:
            weights.append(group.model.weight.value.to_host())
    pc.manual_seed(2)
    alone = build(pc.default_queue()).weight.value.to_host()
    # two groups after one seed: the second's weights follow the first's draws, as a
    # second build in the caller's own thread does (a student beside a teacher)
    pc.manual_seed(3)
    with ReplicaGroup(build, devices2) as first, ReplicaGroup(build, devices2) as second:
        pair = [g.model.weight.value.to_host() for g in (first, second)]
    pc.manual_seed(3)
    in_caller = [build(pc.default_queue()).weight.value.to_host() for _ in range(2)]
    pc.manual_seed(0)
    assert not np.array_equal(weights[0], weights[1])
    np.testing.assert_array_equal(weights[0], weights[2])
    np.testing.assert_array_equal(weights[1], alone)
    assert not np.array_equal(pair[0], pair[1])
    np.testing.assert_array_equal(pair[0], in_caller[0])
    np.testing.assert_array_equal(pair[1], in_caller[1])


def test_the_group_builds_replica_0s_model_alone_first_as_one_thread_would(devices2):
    """The replicas' builds ran at once, so a build_model drawing from a generator they share
    (numpy's global one after np.random.seed(0), or one it holds) gave replica 0, and so the
    group, whichever draw its thread came to first: weights that changed from run to run."""
    shared = np.random.default_rng(0)

    def build(queue):
        if queue.device == devices2[0]:
            time.sleep(0.2)                 # replica 0's thread comes to the draw second
        m = pc.nn.Linear(64, 10, queue=queue)
        m.weight.value.copy_(pc.Tensor.from_host(
            queue, shared.standard_normal((10, 64)).astype(np.float32)))
        return m

    want = np.random.default_rng(0).standard_normal((10, 64)).astype(np.float32)
    with ReplicaGroup(build, devices2) as group:
        got = group.run(lambda r: r.model.weight.value.to_host())
    for weight in got:
        np.testing.assert_array_equal(weight, want)


def test_a_seed_set_before_the_group_seeds_its_dropout_masks(devices2):
    """``pc.manual_seed(s)`` seeds the caller's dropout generator too; the replica threads'
    own started at seed 0 whatever s was, so a seed sweep drew the same masks for every s and
    a one-replica group's step differed from the same step on the caller's queue."""
    def build(queue):
        return pc.nn.Sequential(pc.nn.Linear(6, 16, queue=queue), pc.nn.Dropout(0.5),
                                pc.nn.Linear(16, 3, queue=queue))

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    losses = []
    for seed in (1, 2):
        pc.manual_seed(seed)
        with ReplicaGroup(build, devices2[:1]) as group:
            assert group.rng_state() == [[seed, 0]]
            losses.append(group.step(x, y, tp.cross_entropy,
                                     pc.optim.SGD(group.parameters(), lr=0.1)))
    pc.manual_seed(2)
    q = pc.default_queue()
    model = build(q)
    with tp.Tape():
        alone = tp.cross_entropy(model(pc.Tensor.from_host(q, x)), pc.Tensor.from_host(q, y))
    pc.manual_seed(0)
    assert losses[0] != losses[1]
    assert losses[1] == pytest.approx(alone.item(), abs=1e-6)
