"""Step capture and replay: bit-identical to the eager step, eager where it cannot replay."""

import numpy as np
import pytest

import parcl as pc
from parcl import recorder
import parcl.tape as tp
from parcl.replica import ReplicaGroup


def mlp(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(64, 32, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 10, queue=queue))


def bn_cnn(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Conv2d(1, 4, 3, padding=1, queue=queue),
                            pc.nn.BatchNorm2d(4, queue=queue), pc.nn.ReLU(),
                            pc.nn.MaxPool2d(2), pc.nn.Flatten(),
                            pc.nn.Linear(4 * 4 * 4, 10, queue=queue))


def batch(n, images=False, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 1, 8, 8) if images else (n, 64)
    return rng.random(shape, dtype=np.float32), rng.integers(0, 10, n)


def train(build, devices, capture, batches, make_opt=None):
    with ReplicaGroup(build, devices, capture=capture) as group:
        opt = (make_opt or (lambda p: pc.optim.AdamW(p, lr=1e-2)))(group.parameters())
        losses = [group.step(x, y, tp.cross_entropy, opt) for x, y in batches]
        params = [p.value.to_host() for p in group.parameters()]
        buffers = [b.to_host() for _, b in group.model.named_buffers()]
        captured = group.captured_steps
    return losses, params, buffers, captured


@pytest.mark.parametrize("build,images", [(mlp, False), (bn_cnn, True)], ids=["mlp", "bn-cnn"])
def test_replay_is_bit_identical_to_eager(devices2, build, images):
    batches = [batch(12, images, seed=s) for s in range(5)]
    eager = train(build, devices2, False, batches)
    replayed = train(build, devices2, True, batches)
    assert eager[0] == replayed[0]                              # losses, exactly
    assert all(np.array_equal(a, b) for a, b in zip(eager[1], replayed[1]))
    assert all(np.array_equal(a, b) for a, b in zip(eager[2], replayed[2]))
    steps = [s for per_replica in replayed[3] for s in per_replica]
    assert steps and all(s.replays == 4 for s in steps)       # recorded once, replayed 4x


def test_a_new_batch_shape_is_recorded_anew(devices2):
    batches = [batch(12, seed=0), batch(12, seed=1), batch(7, seed=2), batch(12, seed=3),
               batch(7, seed=4)]
    eager = train(mlp, devices2, False, batches)
    replayed = train(mlp, devices2, True, batches)
    assert all(np.array_equal(a, b) for a, b in zip(eager[1], replayed[1]))
    step = replayed[3][0][0]
    assert step.replays == 3 and len(step._entries) == 2      # shards of 6, 6, 4, 6, 4


def dropout_mlp(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(64, 32, queue=queue), pc.nn.ReLU(), pc.nn.Dropout(0.5),
                            pc.nn.Linear(32, 10, queue=queue))


def test_dropout_replays_draw_the_next_mask_as_eager_calls_do(queue):
    """A replayed dropout takes the next call of the recording thread's generator, as an
    eager call would (and its backward that replay's mask): call after call, the same losses
    and gradients as running the step eagerly, and the same generator state after."""
    from parcl.tape.ops import nn as nn_ops

    def run(captured):
        model = dropout_mlp(queue)
        for p in model.parameters():           # persistent buffers: every call accumulates
            p.grad = pc.Tensor.zeros(queue, p.shape)

        def body(x, y):
            with tp.Tape() as tape:
                loss = tp.cross_entropy(model(tp.tensor(x)), y)
            tape.backward(loss)
            return loss.value
        nn_ops.manual_seed(7)
        step = tp.capture(body, queue) if captured else None
        losses = []
        for s in range(4):
            x, y = batch(8, seed=s)
            out = step(x, y) if captured else body(pc.Tensor.from_host(queue, x),
                                                    pc.Tensor.from_host(queue, y))
            losses.append(float(out.to_host()))
        grads = [p.grad.to_host() for p in model.parameters()]
        return losses, grads, nn_ops.rng_state(), step

    eager = run(False)
    replayed = run(True)
    step = replayed[3]
    assert step.replays == 3 and step.reason(*batch(8)) is None
    assert replayed[0] == eager[0]                          # losses, exactly
    assert all(np.array_equal(a, b) for a, b in zip(replayed[1], eager[1]))
    assert replayed[2] == eager[2] == (7, 4)                # four calls drawn
    x, y = batch(8)
    assert float(step(x, y).to_host()) != float(step(x, y).to_host())   # a new mask each call


def test_a_group_with_dropout_replays_bit_identically_to_eager(devices2):
    """Replica threads own their generators; the caller's replays advance them."""
    from parcl.tape.ops import nn as nn_ops

    def run(capture):
        with ReplicaGroup(dropout_mlp, devices2, capture=capture) as group:
            group.run(lambda r: nn_ops.manual_seed(10 + r.index))
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            losses = [group.step(*batch(12, seed=s), tp.cross_entropy, opt) for s in range(5)]
            params = [p.value.to_host() for p in group.parameters()]
            states = group.run(lambda r: nn_ops.rng_state())
            replays = [step.replays for per in group.captured_steps for step in per]
        return losses, params, states, replays

    eager, replayed = run(False), run(True)
    assert replayed[0] == eager[0]
    assert all(np.array_equal(a, b) for a, b in zip(replayed[1], eager[1]))
    assert replayed[2] == eager[2] == [(10, 5), (11, 5)]
    assert replayed[3] == [4, 4]


def test_dropout_with_a_fixed_seed_replays_the_same_mask(queue):
    x = np.ones((4, 8), np.float32)
    step = tp.capture(lambda t: tp.dropout(t, 0.5, seed=3), queue)
    first, second = step(x).to_host(), step(x).to_host()
    assert step.replays == 1 and np.array_equal(first, second)
    assert 0 < np.count_nonzero(first) < first.size


@pytest.mark.parametrize("seed", [lambda: tp.manual_seed(5), lambda: tp.set_rng_state((5, 2)),
                                  lambda: pc.manual_seed(5)],
                         ids=["tp.manual_seed", "tp.set_rng_state", "pc.manual_seed"])
def test_a_step_that_seeds_its_dropout_replays_the_seeds_masks_as_the_eager_call(queue, seed):
    """A step that seeds the dropout generator before its dropout (the same mask every
    call, as eagerly): its replays drew the generator on from where the last call left it,
    (5, 1), (5, 2), ..., a new mask each call, silently; now each replay seeds it where the
    eager call does, and draws the seed's mask."""
    def body(x):
        seed()
        return tp.dropout(x, 0.5, training=True)

    step = tp.capture(body, queue)
    x = np.ones((2, 16), np.float32)
    got = [step(x).to_host().copy() for _ in range(3)]
    after = tp.rng_state()
    want = body(pc.Tensor.from_host(queue, x)).to_host()
    assert step.replays == 2
    assert 0 < np.count_nonzero(want) < want.size
    for g in got:
        np.testing.assert_array_equal(g, want)
    assert after == tp.rng_state()


GIVEN = np.random.default_rng(3)          # a generator of the caller's, passed to an initialiser


@pytest.mark.parametrize("draw", [
    lambda lin: pc.nn.init.normal_(lin.weight),
    lambda lin: pc.nn.init.kaiming_uniform_(lin.weight),
    lambda lin: pc.nn.init.orthogonal_(lin.weight, generator=GIVEN),
    lambda lin: setattr(lin, "weight", pc.nn.Linear(3, 2, queue=lin.weight.value.queue).weight),
], ids=["normal_", "kaiming_uniform_", "orthogonal_ of a generator", "a layer built"])
def test_a_step_drawing_initial_values_runs_eagerly_as_each_call_draws_anew(queue, draw):
    """A step that re-initialises a head on every call (pc.nn.init) or builds a layer: the
    values are drawn on the host and uploaded, so its replays uploaded the recording's draw
    again: normal_'s gave the output [[-2.469, -2.237]] on every call where the eager calls
    give [[-2.469, -2.237]], [[-2.399, 1.403]], [[0.696, 1.614]], silently. Now such a step
    runs eagerly and says why."""
    def run(captured):
        pc.manual_seed(0)
        GIVEN.bit_generator.state = np.random.default_rng(3).bit_generator.state
        lin = pc.nn.Linear(3, 2, queue=queue)

        def body(x):
            draw(lin)
            return lin(tp.tensor(x)).value
        step = tp.capture(body, queue)
        x = np.ones((1, 3), np.float32)
        outs = [(step(x) if captured else body(pc.Tensor.from_host(queue, x))).to_host()
                for _ in range(3)]
        return outs, step

    (got, step), (want, _) = run(True), run(False)
    assert not np.array_equal(want[0], want[1])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert step.replays == 0
    assert "drawn on the host" in step.reason(np.ones((1, 3), np.float32))


def test_host_reads_and_anomaly_mode_stay_eager(queue):
    w = tp.tensor(pc.Tensor.from_host(queue, np.ones(3, np.float32)), requires_grad=True)

    def reads(x):
        if float(x.to_host()[0]) > 0:             # Python decides on a device value
            return tp.mul(w, x).value
        return x

    step = tp.capture(reads, queue)
    x = np.ones(3, np.float32)
    step(x)
    assert "host" in step.reason(x)
    twice = tp.capture(lambda x: tp.mul(w, x).value, queue)
    with tp.detect_anomaly():
        twice(x)
        assert "detect_anomaly" in twice.reason(x)


def test_each_replica_thread_replays_its_own_recording(devices2):
    x, y = batch(8)
    with ReplicaGroup(mlp, devices2, capture=True) as group, \
            ReplicaGroup(mlp, devices2) as eager:
        opts = [pc.optim.SGD(g.parameters(), lr=0.1) for g in (group, eager)]
        for _ in range(3):
            assert group.step(x, y, tp.cross_entropy, opts[0]) == \
                eager.step(x, y, tp.cross_entropy, opts[1])
        steps = [step for per in group.captured_steps for step in per]
        assert [s.replays for s in steps] == [2, 2]
        assert [s.queue for s in steps] == [r.queue for r in group.replicas]
        for a, b in zip(group.parameters(), eager.parameters()):      # bit-identical
            np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())


def test_a_group_replays_while_other_models_get_hooks_and_records_anew_for_its_own(devices2):
    # every hook registration in the process was part of each replica's recording key: a
    # hook registered and removed on another model between steps made every step a new
    # recording, replays [0, 0] where now [4, 4]
    x, y = batch(8)
    other = pc.nn.Linear(64, 32)
    with ReplicaGroup(mlp, devices2, capture=True) as group, \
            ReplicaGroup(mlp, devices2) as eager:
        opts = [pc.optim.SGD(g.parameters(), lr=0.1) for g in (group, eager)]

        def both():
            return [g.step(x, y, tp.cross_entropy, o) for g, o in zip((group, eager), opts)]

        for _ in range(5):
            other.register_forward_hook(lambda m, args, out: out * 2).remove()
            other.weight.register_hook(lambda g: g * 2).remove()
            losses = both()
            assert losses[0] == losses[1]
        steps = [step for per in group.captured_steps for step in per]
        assert [s.replays for s in steps] == [4, 4]
        for g in (group, eager):                   # on every replica: a new recording each
            for replica in g.replicas:
                replica.model[1].register_forward_hook(lambda m, args, out: out * 0.5)
        for _ in range(2):
            losses = both()
            assert losses[0] == losses[1]
        assert [s.replays for s in steps] == [5, 5]
        for a, b in zip(group.parameters(), eager.parameters()):      # bit-identical
            np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())


def test_a_recording_made_with_no_gradients_replays_beside_a_verdict_made_with_them(queue):
    # the verdicts were tried first: one found while the weight had a gradient (which the
    # step reads back) ran the call eagerly once the gradients were None again, as the
    # recording made then expects: replays 1, eager 1 of 4 calls, where now replays 2
    x, y = batch(8)
    model, eager = mlp(queue), mlp(queue)

    def step(m, xb, yb):
        if m[0].weight.grad is not None:
            m[0].weight.grad.to_host()                # logs a norm once there is a gradient
        loss = tp.cross_entropy(m(xb), yb)
        loss.backward()
        return loss.value

    captured = tp.capture(lambda xb, yb: step(model, xb, yb), queue)
    for i in range(4):
        loss = captured(x, y).to_host()
        ref = step(eager, pc.Tensor.from_host(queue, x), pc.Tensor.from_host(queue, y))
        np.testing.assert_array_equal(loss, ref.to_host())
        for a, b in zip(model.parameters(), eager.parameters()):
            np.testing.assert_array_equal(a.grad.to_host(), b.grad.to_host())
        if i != 1:                                    # call 2 finds the gradients of call 1
            for m in (model, eager):
                m.zero_grad()
    assert (captured.replays, captured.eager_calls) == (2, 0)
    assert captured.reason(x, y) is None


def test_hooks_on_inner_nodes_leave_the_hook_generation_as_it_was(queue):
    # every hook moved it: a full backward hook (one on an inner node each forward) made
    # each eager forward 1 more, and each captured call after it compare every leaf's and
    # module's hooks (+3 us a call, 4 Linear layers); only leaves' and modules' move it now
    from parcl.tape import hooks
    model = mlp(queue)
    model[0].register_full_backward_hook(lambda m, gi, go: None)
    x, _ = batch(8)
    before = hooks.generation()
    for _ in range(3):
        with tp.Tape():
            h = model(tp.tensor(x))
            h.register_hook(lambda g: None).remove()
    assert hooks.generation() == before
    model[2].weight.register_hook(lambda g: None).remove()
    model[2].register_forward_hook(lambda m, args, out: None)
    assert hooks.generation() == before + 3


def test_a_verdict_keeps_no_leaf_or_gradient_of_a_dropped_model_alive(queue):
    # the verdict's hook state held its leaves' entries, and with them their .grad buffers,
    # for as long as the captured step lived: both alive after the model was dropped
    import gc
    import weakref
    models = {"m": mlp(queue)}

    def step(xb, yb):
        loss = tp.cross_entropy(models["m"](xb), yb)
        loss.backward()
        float(loss.value.to_host())                   # read back: a verdict, no recording
        return loss.value

    captured = tp.capture(step, queue)
    x, y = batch(8)
    captured(x, y)
    assert captured.reason(x, y).startswith("a value was read back to the host")
    weight = models["m"][0].weight
    entry, grad = weakref.ref(weight.entry), weakref.ref(weight.grad)
    del weight
    models["m"] = mlp(queue)
    gc.collect()
    assert (entry(), grad()) == (None, None)
    assert captured.reason(x, y).startswith("a value was read back to the host")


def test_a_step_replays_again_once_a_hook_reading_the_host_is_removed(queue):
    # the verdict "not replayable" found with a logging hook on the weight was kept for the
    # whole signature and the replayable recording dropped: replays 0 of 3 after the hook's
    # removal, reason "a value was read back to the host", where now 3 of 3
    x, y = batch(8)
    model = mlp(queue)
    eager = mlp(queue)

    def step(m, xb, yb):
        loss = tp.cross_entropy(m(xb), yb)
        loss.backward()
        return loss

    captured = tp.capture(lambda xb, yb: step(model, xb, yb), queue)
    norms = []

    def calls(n, hooked=False):
        replays = captured.replays
        for _ in range(n):
            for m in (model, eager):
                m.zero_grad()
            loss = captured(x, y).value.to_host()
            ref = step(eager, pc.Tensor.from_host(queue, x), pc.Tensor.from_host(queue, y))
            np.testing.assert_array_equal(loss, ref.value.to_host())
            for a, b in zip(model.parameters(), eager.parameters()):
                np.testing.assert_array_equal(a.grad.to_host(), b.grad.to_host())
        return captured.replays - replays

    assert calls(3) == 2
    handle = model[0].weight.register_hook(lambda g: norms.append(g.to_host().sum()))
    assert calls(2) == 0 and len(norms) == 2
    assert captured.reason(x, y).startswith("a value was read back to the host")
    handle.remove()
    assert captured.reason(x, y) is None
    assert calls(3) == 3 and len(norms) == 2
    model[0].weight.register_hook(lambda g: norms.append(g.to_host().sum()))
    assert calls(1) == 0 and len(norms) == 3       # another hook: recorded, eager again


def test_a_launch_failing_in_a_replay_names_its_replica(devices2):
    x, y = batch(8)
    with ReplicaGroup(mlp, devices2, capture=True) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        group.step(x, y, tp.cross_entropy, opt)            # replayed: its calls are bound
        before = [p.value.to_host() for p in group.parameters()]
        (step,) = group.captured_steps[1]
        ((entry,),) = step._entries.values()

        def lost():                                     # e.g. CL_OUT_OF_RESOURCES
            raise RuntimeError("simulated enqueue failure")
        entry.recording.calls().insert(3, lost)
        with pytest.raises(pc.ReplicaError, match="replica 1 .*simulated") as info:
            group.step(x, y, tp.cross_entropy, opt)
        assert info.value.index == 1
        after = [p.value.to_host() for p in group.parameters()]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_bad_labels_are_still_caught_on_replay(devices2):
    x, y = batch(8)
    with ReplicaGroup(mlp, devices2, capture=True) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        group.step(x, y, tp.cross_entropy, opt)            # replayed
        before = [p.value.to_host() for p in group.parameters()]
        bad = y.copy()
        bad[6] = 12
        with pytest.raises(pc.ReplicaError, match="label 12") as info:
            group.step(x, bad, tp.cross_entropy, opt)       # replayed, with a bad label
        assert info.value.index == 1                        # row 6 is replica 1's
        after = [p.value.to_host() for p in group.parameters()]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_capture_of_a_plain_function(queue):
    w = tp.tensor(pc.Tensor.from_host(queue, np.array([2.0, 3.0], np.float32)),
                  requires_grad=True)
    w.grad = pc.Tensor.zeros(queue, (2,))                  # a persistent gradient buffer

    def fn(x):
        with tp.Tape() as tape:
            loss = tp.sum(w * x)
        tape.backward(loss)
        return loss.value

    step = tp.capture(fn, queue)
    for i in range(1, 4):
        loss = step(np.array([i, 2 * i], np.float32))
        assert loss.item() == 2.0 * i + 6.0 * i
    np.testing.assert_array_equal(w.grad.to_host(), [6.0, 12.0])   # 1+2+3, 2+4+6
    assert step.replays == 2


def test_a_new_loss_function_every_step_keeps_memory_bounded(devices2):
    x, y = batch(8)
    with ReplicaGroup(mlp, devices2, capture=True) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        used = []
        for _ in range(12):
            group.step(x, y, lambda p, t: tp.cross_entropy(p, t), opt)   # a new lambda
            used.append(pc.memory_stats(group.replicas[1].queue)["bytes_in_use"])
        assert all(len(per_replica) <= 4 for per_replica in group.captured_steps)
        assert used[-1] == used[5]


def _loss_step(queue, labels_of=lambda y: y):
    model = mlp(queue)

    def body(x, y):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(x)), labels_of(y))
        tape.backward(loss)
        return loss.value
    return model, tp.capture(body, queue)


def _op_names(step):
    ops = next(iter(step._entries.values()))[-1].recording.ops
    return [op.kernel.function_name if isinstance(op, recorder.Launch)
            else type(op).__name__.lower() for op in ops]


def test_replayed_labels_are_checked_on_the_host_before_anything_is_enqueued(queue):
    """Labels that are an input of the captured step are range-checked on their host array
    before a replay uploads them: no flag read in the replay, and a bad label raises with
    nothing enqueued (the gradients the step accumulates stay as they were)."""
    model, step = _loss_step(queue)
    x, y = batch(8)
    step(x, y)                    # recorded: the gradients assigned (there were none)
    step(x, y)                    # recorded again: now they are accumulated into
    assert "call" not in _op_names(step)                   # no device read to replay
    step(x, y)                                             # replayed: checked, no error
    before = [p.grad.to_host() for p in model.parameters()]
    bad = y.copy()
    bad[3] = 99
    with pytest.raises(pc.ShapeError, match="label 99 at row 3 is out of range for 10"):
        step(x, bad)
    bad[3], bad[5] = -1, 10
    with pytest.raises(pc.ShapeError, match="label -1 at row 3"):     # the first bad row
        step(x, bad)
    after = [p.grad.to_host() for p in model.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert step.replays == 1


def test_labels_computed_on_the_device_are_read_right_after_the_forward(queue):
    """Labels that are not an input (computed by the step) are checked on the device: the
    flag read is re-enqueued at its place among the recorded launches, before any backward
    kernel, and checked once the replay is enqueued."""
    model, step = _loss_step(queue, labels_of=lambda y: y.copy())
    x, y = batch(8)
    step(x, y)
    names = _op_names(step)
    read = names.index("call")
    assert names[read - 1].startswith("ce_sum")   # right after the forward kernel writing it
    assert any(n.startswith("ce_bwd") for n in names[read:])
    step(x, y)                                             # replayed: checked, no error
    bad = y.copy()
    bad[3] = 99
    with pytest.raises(pc.ShapeError, match="label 99 at row 3"):
        step(x, bad)


def test_every_replay_uploads_the_arrays_it_is_given(queue):
    """A replay copies the inputs of its own call: never those of an earlier one."""
    w = tp.tensor(pc.Tensor.from_host(queue, np.array([2.0, 3.0], np.float32)))

    def fn(x):
        with tp.no_grad():
            return tp.sum(w * x)

    step = tp.capture(fn, queue)
    step(np.array([1.0, 1.0], np.float32))                  # recorded
    a, b = np.array([1.0, 2.0], np.float32), np.array([5.0, 7.0], np.float32)
    assert step(a).item() == 8.0
    assert step(b).item() == 31.0
    a[:] = 0.0                                              # the same array, refilled
    assert step(a).item() == 0.0
    assert step.replays == 3


def wide_mlp(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(512, 256, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(256, 10, queue=queue))


def test_a_wide_mlp_on_two_sub_devices_replays_bit_identically(devices2):
    """Big GEMMs on both sub-devices of one CPU: replayed steps equal eager ones bit for bit."""
    rng = np.random.default_rng(0)
    batches = [(rng.random((128, 512), dtype=np.float32), rng.integers(0, 10, 128))
               for _ in range(4)]
    sgd = lambda p: pc.optim.SGD(p, lr=0.1, momentum=0.9)      # noqa: E731
    eager = train(wide_mlp, devices2, False, batches, sgd)
    replayed = train(wide_mlp, devices2, True, batches, sgd)
    assert eager[0] == replayed[0]
    for a, b in zip(eager[1], replayed[1]):
        np.testing.assert_array_equal(a, b)


# -- what a replay writes into the leaves' gradients --------------------------------------------
def _captured_loop(queue, captured, *, set_to_none=True, accumulate=1, make_opt=None,
                   freeze_at=None, steps=5):
    """``steps`` training steps of ``mlp``: forward and backward through ``tp.capture`` (or
    plainly), ``accumulate`` calls per update, the optimizer outside, as ReplicaGroup does;
    ``freeze_at``: from that step on the first layer's weight is frozen."""
    model = mlp(queue)
    opt = (make_opt or (lambda p: pc.optim.AdamW(p, lr=1e-2)))(model.parameters())

    def body(x, y):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(x)), y)
        tape.backward(loss)
        return loss.value
    step = tp.capture(body, queue) if captured else None
    losses = []
    for s in range(steps):
        if s == freeze_at:
            model[0].weight.requires_grad = False
        for a in range(accumulate):
            x, y = batch(8, seed=10 * s + a)
            out = step(x, y) if captured else body(pc.Tensor.from_host(queue, x),
                                                    pc.Tensor.from_host(queue, y))
            losses.append(float(out.to_host()))
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return losses, [p.value.to_host() for p in model.parameters()], step


@pytest.mark.parametrize("set_to_none", [True, False], ids=["zero_grad", "zero_grad(False)"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_captured_backward_in_a_training_loop_equals_the_eager_one(queue, set_to_none,
                                                                    accumulate):
    """With ``opt.zero_grad()`` dropping the gradients (PyTorch's default) a replay gives
    every parameter its gradient again; gradients accumulated over several calls add up; a
    call that finds the gradients otherwise than the recording did is recorded anew."""
    eager = _captured_loop(queue, False, set_to_none=set_to_none, accumulate=accumulate)
    replayed = _captured_loop(queue, True, set_to_none=set_to_none, accumulate=accumulate)
    assert replayed[0] == eager[0]
    assert all(np.array_equal(a, b) for a, b in zip(eager[1], replayed[1]))
    assert replayed[2].replays >= 5 * accumulate - 3


def test_freezing_a_parameter_records_the_step_anew(queue):
    eager = _captured_loop(queue, False, freeze_at=2)
    replayed = _captured_loop(queue, True, freeze_at=2)
    assert replayed[0] == eager[0]
    assert all(np.array_equal(a, b) for a, b in zip(eager[1], replayed[1]))


def test_an_optimizer_step_inside_a_captured_function_stays_eager(queue):
    """Its learning rate and state (Adam's step count, momentum's first step) change every
    call: a replay would repeat the first call's update."""
    model = mlp(queue)
    opt = pc.optim.Adam(model.parameters(), lr=1e-2)

    def body(x, y):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(x)), y)
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        return loss.value
    step = tp.capture(body, queue)
    for s in range(3):
        step(*batch(8, seed=s))
    assert step.replays == 0 and "optimizer step (Adam)" in step.reason(*batch(8))
    assert opt.state[model[0].weight]["step"] == 3


def test_a_group_notices_a_frozen_parameter(devices2):
    """ReplicaGroup(capture=True): freezing a layer between steps is seen (the recorded
    backward gave it a gradient) and the step is recorded again: the captured run equals
    the eager one."""
    got = {}
    for capture in (False, True):
        with ReplicaGroup(mlp, devices2, capture=capture) as group:
            opt = pc.optim.AdamW(group.parameters(), lr=1e-2)
            for s in range(4):
                if s == 2:
                    for r in group.replicas:
                        r.model[0].weight.requires_grad = False
                group.step(*batch(12, seed=s), tp.cross_entropy, opt)
            got[capture] = [p.value.to_host() for p in group.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(got[False], got[True]))


def test_capture_key_sees_numpy_scalars_lists_and_a_loss_modules_state(devices2):
    """A scale set from numpy (np.float64 is a float), a list attribute changed in place, and
    a CrossEntropyLoss whose label_smoothing changes: each records the step again, so the
    captured run equals the eager one."""
    class Scaled(pc.nn.Module):
        def __init__(self, queue=None):
            super().__init__()
            self.body = mlp(queue)
            self.scale, self.shifts = 1.0, [0.0]

        def forward(self, x):
            return self.body(x) * self.scale + self.shifts[0]

    got = {}
    for capture in (False, True):
        crit = pc.nn.CrossEntropyLoss()
        with ReplicaGroup(Scaled, devices2, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            for s in range(4):
                for r in group.replicas:
                    if s == 1:
                        r.model.scale = np.sqrt(np.float64(2.0))
                    if s == 2:
                        r.model.shifts[0] = 0.5
                crit.label_smoothing = 0.1 if s == 3 else 0.0
                group.step(*batch(12, seed=s), crit, opt)
            got[capture] = [p.value.to_host() for p in group.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(got[False], got[True]))
    model = pc.nn.Dropout(0.5)
    before = pc.nn.capture_key(model)
    model.p = np.float32(0.25)
    assert pc.nn.capture_key(model) != before


def test_a_bool_mask_input_is_taken_as_tensor_from_host_takes_it(queue):
    x = np.arange(6, dtype=np.float32)
    mask = np.array([True, False, True, True, False, False])
    zeros = pc.Tensor.zeros(queue, (6,))
    step = tp.capture(lambda xt, mt: tp.where(mt, xt, zeros), queue)
    eager = tp.where(pc.Tensor.from_host(queue, mask), pc.Tensor.from_host(queue, x), zeros)
    for _ in range(3):
        np.testing.assert_array_equal(step(x, mask).to_host(), eager.to_host())
    assert step.replays == 2


@pytest.mark.parametrize("inner_recorded_first", [False, True], ids=["new", "recorded"])
def test_a_captured_step_called_inside_another_capture_is_replayed_with_it(
        queue, inner_recorded_first):
    three = np.full(4, 3.0, np.float32)
    inner = tp.capture(lambda c: c * 2.0, queue)
    if inner_recorded_first:
        inner(three), inner(three)                # recorded, then replayed on its own
    outer = tp.capture(lambda x: (x + 1.0) * inner(three), queue)
    for i in range(4):
        x = np.full(4, float(i), np.float32)
        np.testing.assert_array_equal(outer(x).to_host(), (x + 1.0) * 6.0)
    assert outer.replays == 3


def test_a_captured_forward_without_backward_sees_a_parameters_new_value(queue):
    """A step that only runs a forward with grad enabled (no backward noted the leaves it
    read): a new ``.value`` records it anew, as documented, instead of replaying a read of the
    old buffer, which went back to the pool and was reused (it gave 9, a later tensor's)."""
    w = tp.tensor(pc.Tensor.from_host(queue, np.full(3, 2.0, np.float32)), requires_grad=True)
    step = tp.capture(lambda x: tp.mul(x, w), queue)
    x = np.ones(3, np.float32)
    step(x), step(x)
    w.value = pc.Tensor.from_host(queue, np.full(3, 5.0, np.float32))   # the old one freed
    reused = [pc.Tensor.full(queue, (3,), 9.0) for _ in range(4)]       # noqa: F841
    np.testing.assert_array_equal(step(x).to_host(), [5.0, 5.0, 5.0])
    w.requires_grad = False                                             # frozen: recorded anew
    assert isinstance(step(x), pc.Tensor)
    assert step.replays == 1


def test_a_0d_input_stays_0d_as_in_the_eager_call(queue):
    """A 0-d host array reaches the captured function 0-d, as ``Tensor.from_host`` makes it:
    it was made (1,), so a stack of it broadcast otherwise and the sum below was 21, not 33."""
    def fn(t, x):
        return tp.sum(tp.stack([t, t * 2.0]) * x)

    t, x = np.array(1.0, np.float32), np.array([[1.0], [10.0]], np.float32)
    eager = fn(pc.Tensor.from_host(queue, t), pc.Tensor.from_host(queue, x)).item()
    step = tp.capture(fn, queue)
    assert eager == 33.0
    assert [step(t, x).item() for _ in range(3)] == [33.0] * 3
    assert step.replays == 2


def test_a_captured_evaluation_between_accumulating_backwards_keeps_the_gradients(queue):
    """A replay gives the leaves the ``.grad`` its recording left them; one that ran no
    backward over them (an evaluation under no_grad) leaves theirs as it found them. It gave
    them None, so a gradient accumulated over three backward passes was [2] (the last one)
    where the eager loop has [6], silently."""
    w = tp.tensor(pc.Tensor.from_host(queue, np.ones(4, np.float32)), requires_grad=True)
    evaluate = tp.capture(lambda x: tp.mul(x, w), queue)
    x = np.full(4, 2.0, np.float32)
    for step in range(3):
        with tp.Tape() as tape:
            loss = tp.sum(tp.mul(pc.Tensor.from_host(queue, x), w))
        tape.backward(loss)
        with tp.no_grad():
            evaluate(x)
        np.testing.assert_array_equal(w.grad.to_host(), np.full(4, 2.0 * (step + 1)))
    assert evaluate.replays == 2


def test_a_captured_evaluation_replays_between_eager_training_steps_and_keeps_no_gradient(
        queue):
    """A replay's leaves had to hold the ``.grad`` tensors the recording found even where it
    ran no backward: an eager training step gives every parameter a new one, so a captured
    evaluation after each was a new recording every time (0 replays of 5) and each recording
    held a whole set of old gradients. It leaves gradients it never touched alone now."""
    import weakref

    model = mlp(queue)
    opt = pc.optim.SGD(model.parameters(), lr=0.1)
    evaluate = tp.capture(lambda x: model(x), queue)
    x, y = batch(8)
    first = None
    labels = pc.Tensor.from_host(queue, y.astype(np.int32))
    for _ in range(5):
        opt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(pc.Tensor.from_host(queue, x)), labels)
        tape.backward(loss)
        opt.step()
        grads = [p.grad for p in model.parameters()]
        first = first or weakref.ref(grads[0])
        with tp.no_grad():
            got = evaluate(x).to_host()
            want = model(pc.Tensor.from_host(queue, x)).to_host()
        np.testing.assert_array_equal(got, want)
        assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert evaluate.replays == 4 and first() is None


def test_a_captured_evaluation_clearing_the_gradients_clears_them_in_every_replay(queue):
    # p.grad = None was not noted (the setter told the recording nothing) and the leaves
    # counted as untouched: a replay after an eager training step left that step's
    # gradients in place (replays 2 of 3, each leaving a .grad the eager call clears)
    model = mlp(queue)
    x, y = batch(8)

    def evaluate(xb):
        for p in model.parameters():
            p.grad = None                      # the call clears the gradients, as eagerly
        with tp.no_grad():
            return model(xb)

    captured = tp.capture(evaluate, queue)
    labels = pc.Tensor.from_host(queue, y.astype(np.int32))
    for _ in range(3):
        tp.cross_entropy(model(pc.Tensor.from_host(queue, x)), labels).backward()
        assert all(p.grad is not None for p in model.parameters())
        got = captured(x).to_host()
        assert [p.grad for p in model.parameters()] == [None] * 4
        np.testing.assert_array_equal(got, evaluate(pc.Tensor.from_host(queue, x)).to_host())
    assert captured.replays == 2


@pytest.mark.parametrize("clear", ["assign", "zero_grad"])
def test_a_captured_training_step_clearing_the_gradients_first_replays_as_eager(queue, clear):
    # the leaves' gradients as found were a condition of every replay even where the step
    # cleared them before its backward: each call found the last one's and recorded anew
    # (0 replays of 5); cleared first, they are no condition now (4 of 5). p.zero_grad()
    # read .grad before dropping it, which made the replays depend on it again.
    model, eager = mlp(queue), mlp(queue)
    x, y = batch(8)

    def step(m, xb, yb):
        for p in m.parameters():
            if clear == "assign":
                p.grad = None
            else:
                p.zero_grad()
        loss = tp.cross_entropy(m(xb), yb)
        loss.backward()
        return loss

    captured = tp.capture(lambda xb, yb: step(model, xb, yb), queue)
    for _ in range(5):
        got = captured(x, y).value.to_host()
        want = step(eager, pc.Tensor.from_host(queue, x), pc.Tensor.from_host(queue, y))
        np.testing.assert_array_equal(got, want.value.to_host())
        for a, b in zip(model.parameters(), eager.parameters()):
            np.testing.assert_array_equal(a.grad.to_host(), b.grad.to_host())
    assert captured.replays == 4


def test_a_backward_through_the_graph_a_replay_returned_uses_the_replays_dropout_mask(queue):
    """A captured forward whose loss is formed and backwarded after the call (no tape): the
    dropout backward regenerates the mask the replay drew, as in the eager loop. It took the
    recorded call's mask, so w.grad summed 124 where the eager step's sums 116, silently."""
    def run(captured):
        tp.manual_seed(0)
        w = tp.tensor(pc.Tensor.from_host(queue, np.ones(64, np.float32)), requires_grad=True)

        def forward(x):
            return tp.dropout(tp.mul(x, w), 0.5)

        step = tp.capture(forward, queue) if captured else (
            lambda x: forward(pc.Tensor.from_host(queue, x)))
        grads = []
        for i in range(3):
            tp.sum(step(np.full(64, i + 1.0, np.float32))).backward()
            grads.append(w.grad.to_host())
            w.grad = None
        return grads, getattr(step, "replays", 2)

    (eager, _), (captured, replays) = run(False), run(True)
    assert replays == 2
    for e, c in zip(eager, captured):
        np.testing.assert_array_equal(c, e)


def test_a_step_that_clears_the_gradients_after_its_update_leaves_them_cleared_on_replay(queue):
    """A step that updates its parameters by hand and sets ``p.grad = None`` after its
    backward: every replay leaves the gradients None, as the eager call does. A replay gave
    them the gradient its recorded backward wrote, the next call added into it, and w after
    three calls was -0.558 where the eager loop's (and numpy's) is -0.131, silently."""
    def run(captured):
        w = tp.tensor(pc.Tensor.from_host(queue, np.ones(4, np.float32)), requires_grad=True)

        def train_step(x):
            with tp.Tape() as tape:
                loss = tp.sum(tp.mul(x, w) ** 2)
            tape.backward(loss)
            with tp.no_grad():
                for p in [w]:
                    p -= 0.1 * p.grad
                    p.grad = None
            return loss.value

        step = tp.capture(train_step, queue) if captured else (
            lambda x: train_step(pc.Tensor.from_host(queue, x)))
        values = []
        for i in range(4):
            step(np.full(4, 0.5 + i, np.float32))
            assert w.grad is None
            values.append(w.value.to_host()[0])
        return values, getattr(step, "replays", 3)

    want, v = [], 1.0
    for i in range(4):
        v -= 0.1 * 2 * (0.5 + i) ** 2 * v
        want.append(v)
    (eager, _), (captured, replays) = run(False), run(True)
    assert replays == 3
    np.testing.assert_array_equal(captured, eager)
    np.testing.assert_allclose(captured, want, rtol=1e-6)        # [0.95, 0.5225, -0.1306, ...]


@pytest.mark.parametrize("write", ["op=", "fill_", "setitem"])
def test_a_leaf_written_in_place_and_given_a_new_value_records_the_step_anew(queue, write):
    """A step that only writes a leaf in place under no_grad (an average kept beside the
    model: ``e *= 0.5; e += x``) sees the leaf given a new ``.value`` between calls, as it
    sees one an op reads. The in-place write went to the value without noting the leaf, so
    the replay wrote into the dropped buffer: after ``ema.value = [10, ...]`` ema stayed 10
    where the eager call gives 6, and a tensor made since, given that buffer, became 5.5
    instead of its 9, silently."""
    ema = tp.tensor(pc.Tensor.from_host(queue, np.zeros(4, np.float32)))

    def update(x):
        with tp.no_grad():
            e = ema
            if write == "op=":
                e *= 0.5
                e += x
            elif write == "fill_":
                e.fill_(6.0)
            else:
                e[:] = x * 6.0
        return x

    step = tp.capture(update, queue)
    ones = np.ones(4, np.float32)
    step(ones), step(ones)
    ema.value = pc.Tensor.from_host(queue, np.full(4, 10.0, np.float32))   # the old one freed
    others = [pc.Tensor.full(queue, (4,), 9.0) for _ in range(4)]
    step(ones)
    np.testing.assert_array_equal(ema.value.to_host(), np.full(4, 6.0))
    for t in others:
        np.testing.assert_array_equal(t.to_host(), np.full(4, 9.0))
    assert step.replays == 1


def test_labels_a_step_writes_into_are_checked_as_written_as_in_the_eager_call(queue):
    """Labels an input holds are checked on its host array before a replay, but where the
    step writes into them first (``y[:, :1] = z``, ``y[:, :2] = -100``) the written labels
    are checked, as the eager call checks them. The host array's were: a replay wrote the
    out-of-range z = 9 in and gave the loss NaN where the eager call raises LabelError,
    silently, and refused -1 labels the step overwrote with -100 where the eager call gives
    its loss."""
    rng = np.random.default_rng(0)
    w = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((5, 4)).astype(np.float32)),
                  requires_grad=True)

    def fn(x, y, z):
        y[:, :1] = z                  # labels from another input
        y[:, 1:2] = -100              # and a position that counts in no loss
        with tp.Tape() as tape:
            loss = tp.cross_entropy(tp.matmul(x, w).reshape(12, 4), y.reshape(12))
        tape.backward(loss)
        w.grad = None
        return loss.value

    def eager(*arrays):
        return fn(*[pc.Tensor.from_host(queue, a) for a in arrays]).to_host()

    step = tp.capture(fn, queue)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    y = np.array([[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1]])
    padded = np.array([[-1, -1, 2, 3], [-1, -1, 3, 0], [-1, -1, 0, 1]])
    for labels, z in [(y, [[0], [1], [2]]), (padded, [[3], [3], [0]])]:
        np.testing.assert_array_equal(step(x, labels, np.array(z)).to_host(),
                                      eager(x, labels, np.array(z)))
    with pytest.raises(pc.LabelError, match="label 9 at row 0"):
        eager(x, y, np.array([[9], [0], [0]]))
    with pytest.raises(pc.LabelError, match="label 9 at row 0"):
        step(x, y, np.array([[9], [0], [0]]))
    assert step.replays >= 1


def test_reason_takes_the_inputs_as_a_call_does(queue):
    """``step.reason(x, mask)`` with a bool mask (held as uint8, as the call holds it) and
    with a list names why the call stays eager: it looked the mask's bool signature up,
    found nothing, and said None (replayed) for a step that ran eagerly every call."""
    def fn(x, mask):
        x.to_host()                                       # a host read: never replayed
        return tp.where(mask, x, x * 2.0)

    step = tp.capture(fn, queue)
    x, mask = np.ones(4, np.float32), np.array([True, False, True, False])
    step(x, mask), step(x, mask)
    assert step.replays == 0 and step.eager_calls == 1
    assert "read back to the host" in step.reason(x, mask)
    assert "read back to the host" in step.reason(x, mask.tolist())


def test_a_forward_recorded_on_the_callers_tape_runs_eagerly_and_says_why(queue):
    """A captured forward called inside the caller's ``with tp.Tape()``, whose backward
    runs after the call: its graph is on that tape, which the backward releases, so the
    replays' backward raised 'recorded on a tape that was released since' where the eager
    loop trains. Such a call now runs eagerly (its gradients the eager loop's, bit for bit)
    and ``reason`` says why; a step that opens its tape inside is still replayed."""
    def run(captured):
        pc.nn.manual_seed(0)
        tp.manual_seed(0)
        model = dropout_mlp(queue)
        step = tp.capture(model, queue) if captured else (
            lambda x: model(pc.Tensor.from_host(queue, x)))
        grads = []
        for s in range(3):
            x = batch(4, seed=s)[0]
            with tp.Tape() as tape:
                loss = tp.sum(step(x) ** 2)
            tape.backward(loss)
            grads.append([p.grad.to_host() for p in model.parameters()])
            model.zero_grad()
        return grads, step, x

    (eager, _, _), (captured, step, x) = run(False), run(True)
    for e, c in zip(eager, captured):
        for a, b in zip(e, c):
            np.testing.assert_array_equal(b, a)
    assert step.replays == 0 and "caller's tape" in step.reason(x)

    w = tp.tensor(pc.Tensor.from_host(queue, np.ones(4, np.float32)), requires_grad=True)

    def fwd_bwd(x):
        with tp.Tape() as inner:
            loss = tp.sum(tp.mul(x, w))
        inner.backward(loss)
        w.grad = None
        return loss.value

    own_tape = tp.capture(fwd_bwd, queue)
    for _ in range(3):
        with tp.Tape():
            assert own_tape(np.ones(4, np.float32)).item() == 4.0
    assert own_tape.replays == 2


def test_a_captured_step_reading_a_gradient_records_anew_when_the_leaf_holds_a_new_one(queue):
    """A captured step that reads a parameter's ``.grad`` (a gradient norm it logs) replayed
    the buffer of the gradient its recording read while that old tensor lived on elsewhere (a
    list of past gradients): 52.7 at every step, where the eager norms were 52.7, 210.8,
    474.4, 843.4. Reading a leaf's gradient makes it a condition of the replay."""
    lin = pc.nn.Linear(4, 3)
    opt = pc.optim.SGD(lin.parameters(), lr=0.1)
    norm = tp.capture(lambda: tp.sum(tp.tensor(lin.weight.grad) * tp.tensor(lin.weight.grad)),
                      queue)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    kept = []
    for i in range(4):
        opt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.sum(lin(pc.Tensor.from_host(queue, x * (i + 1))))
        tape.backward(loss)
        kept.append(lin.weight.grad)
        want = float((lin.weight.grad.to_host().astype(np.float64) ** 2).sum())
        for _ in range(2):                       # recorded, then replayed
            with tp.no_grad():
                got = float(norm().to_host())
            assert got == pytest.approx(want, rel=1e-5)
    assert norm.replays == 4
