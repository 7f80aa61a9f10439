"""No silent wrong results: host arrays are owned until copied, freed graphs are not
backwarded quietly, captured steps are never replayed stale."""

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup


def linear(queue, n_in=3, n_out=2):
    pc.nn.manual_seed(0)
    return pc.nn.Linear(n_in, n_out, queue=queue)


# -- host arrays handed to parcl may change as soon as the call returns ------------------------
def test_from_host_copies_before_returning(queue):
    a = np.arange(6, dtype=np.float32)
    t = pc.Tensor.from_host(queue, a)
    a[:] = -1
    np.testing.assert_array_equal(t.to_host(), np.arange(6, dtype=np.float32))


def test_a_loader_refilling_one_buffer_uploads_every_batch(queue):
    rng = np.random.default_rng(0)
    buffer = np.empty((64, 32), np.float32)
    batches, tensors = [], []
    for _ in range(20):
        buffer[:] = rng.random(buffer.shape, dtype=np.float32)    # the loader refills it
        batches.append(buffer.copy())
        tensors.append(pc.Tensor.from_host(queue, buffer))
    for want, t in zip(batches, tensors):
        np.testing.assert_array_equal(t.to_host(), want)


def test_only_a_borrowing_caller_uploads_without_a_host_copy(queue):
    """``borrow=True`` (``ReplicaGroup.step``, which waits for its losses before returning)
    uploads from the array itself; everyone else, and any recorded upload, from a copy."""
    from parcl import recorder
    from parcl.uploads import own
    a = np.arange(6, dtype=np.float32)
    assert np.shares_memory(own(a, borrow=True), a)
    assert not np.shares_memory(own(a), a)
    recorder.start()
    try:
        assert not np.shares_memory(own(a, borrow=True), a)     # replayed later: copied
    finally:
        recorder.stop()
    t = pc.Tensor.from_host(queue, a, borrow=True)
    queue.finish()
    a[:] = -1
    np.testing.assert_array_equal(t.to_host(), np.arange(6, dtype=np.float32))


def mlp(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(16, 8, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(8, 4, queue=queue))


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_group_steps_train_on_the_batch_given_not_on_the_refilled_buffer(devices2, capture):
    rng = np.random.default_rng(1)
    data = [(rng.random((8, 16), dtype=np.float32), rng.integers(0, 4, 8)) for _ in range(6)]
    results = []
    for reuse in (False, True):
        xbuf, ybuf = np.empty((8, 16), np.float32), np.empty(8, np.int64)
        with ReplicaGroup(mlp, devices2, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            losses = []
            for x, y in data:
                if reuse:
                    xbuf[:], ybuf[:] = x, y
                    x, y = xbuf, ybuf
                losses.append(group.step(x, y, tp.cross_entropy, opt))
                if reuse:
                    xbuf[:], ybuf[:] = 0.0, 0             # refilled before the next step
            results.append((losses, [p.value.to_host() for p in group.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b)


# -- a graph that is gone cannot be backwarded ----------------------------------------------
def test_backward_of_a_loss_whose_tape_was_dropped_raises(queue):
    model = linear(queue)
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 3), np.float32)))
    tape = tp.Tape()
    with tape:
        loss = tp.mean(model(x))
    del tape                                           # the graph goes with it
    with pytest.raises(pc.ParclError, match="graph of this loss .* is gone"):
        tp.Tape().backward(loss)
    assert model.weight.grad is None


def test_an_intermediate_from_a_released_tape_is_not_backwarded_quietly(queue):
    model = linear(queue)
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 3), np.float32)))
    with tp.Tape() as first:
        h = model(x)
        first.backward(tp.sum(h))
    first.release()
    model.zero_grad()
    with tp.Tape() as second:
        loss = tp.mean(h * 2.0)
    with pytest.raises(pc.ParclError, match="tape that was released"):
        second.backward(loss)
    assert model.weight.grad is None                 # nothing was accumulated
    with tp.Tape() as third:                         # detached, it is a plain input
        loss = tp.mean(tp.tensor(h.detach(), requires_grad=True) * 2.0)
    third.backward(loss)


def test_loss_backward_runs_the_backward_of_its_tape(queue):
    model = linear(queue)
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 3), np.float32)))
    with tp.Tape() as tape:
        loss = tp.mean(model(x))
    loss.backward()
    np.testing.assert_allclose(model.weight.grad.to_host(), np.full((2, 3), 0.5))
    with pytest.raises(pc.ParclError, match="twice"):
        tape.backward(loss)                          # it was this tape's one backward


# -- a captured step is replayed only while the model's Python state is unchanged ---------------
class Branching(pc.nn.Module):
    """Entrenar's dynamic graph: a deeper path from some epoch on, and a temperature."""

    def __init__(self, queue):
        super().__init__()
        pc.nn.manual_seed(0)
        self.first = pc.nn.Linear(16, 16, queue=queue)
        self.extra = pc.nn.Linear(16, 16, queue=queue)
        self.head = pc.nn.Linear(16, 4, queue=queue)
        self.dropout = pc.nn.Dropout(0.25)
        self.deep = False
        self.temperature = 1.0

    def forward(self, x):
        h = tp.relu(self.first(x))
        h = self.dropout(h)
        if self.deep:
            h = tp.relu(self.extra(h))
        else:
            h = h + 0.0 * self.extra(h)            # every parameter gets a gradient either way
        return self.head(h) * (1.0 / self.temperature)


def _schedule(group, step):
    for r in group.replicas:
        r.model.deep = step >= 2
        r.model.temperature = 1.0 + 0.5 * step
        r.model.train(step % 3 != 1)


def _run(devices, capture):
    rng = np.random.default_rng(2)
    with ReplicaGroup(Branching, devices, capture=capture) as group:
        opt = pc.optim.AdamW(group.parameters(), lr=1e-2)
        losses = []
        for step in range(6):
            _schedule(group, step)
            x, y = rng.random((8, 16), dtype=np.float32), rng.integers(0, 4, 8)
            losses.append(group.step(x, y, tp.cross_entropy, opt))
        return losses, [p.value.to_host() for p in group.parameters()]


def test_captured_steps_follow_branches_floats_and_train_eval_like_eager_steps(devices2):
    eager = _run(devices2, capture=False)
    captured = _run(devices2, capture=True)
    assert captured[0] == eager[0]
    for a, b in zip(eager[1], captured[1]):
        np.testing.assert_array_equal(a, b)


def test_the_key_of_a_step_re_records_it(devices2):
    scale = {"value": 1.0}

    def loss_fn(out, y):
        return tp.cross_entropy(out * scale["value"], y)

    x, y = np.ones((4, 16), np.float32), np.array([0, 1, 2, 3])
    results = []
    for capture in (False, True):
        with ReplicaGroup(mlp, devices2, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            losses = []
            for step in range(4):
                scale["value"] = 1.0 + step
                losses.append(group.step(x, y, loss_fn, opt, key=scale["value"]))
            results.append(losses)
    assert results[0] == results[1]


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_parameter_value_replaced_after_the_group_was_made_raises(devices2, capture):
    x, y = np.ones((4, 16), np.float32), np.array([0, 1, 2, 3])
    with ReplicaGroup(mlp, devices2, capture=capture) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        group.step(x, y, tp.cross_entropy, opt)
        weight = group.replicas[1].model.parameters()[0]
        weight.value = pc.Tensor.zeros(weight.value.queue, weight.shape)
        with pytest.raises(pc.ParclError, match=r"replica 1: parameters 0\.weight \(8, 16\)"):
            group.step(x, y, tp.cross_entropy, opt)


def test_capture_key_sees_plain_attributes_only(queue):
    """Plain values (numbers, strings, numpy scalars, and tuples, lists and dicts of them)
    are what a forward branches on; anything else (an object) is not, and inside a list it
    is keyed by identity, so the settings beside it still are."""
    model = Branching(queue)
    key = pc.nn.capture_key(model)
    model.helper = object()
    assert pc.nn.capture_key(model) == key
    model.helper = [object(), 1.0]
    key = pc.nn.capture_key(model)
    model.helper[1] = 2.0
    assert pc.nn.capture_key(model) != key
    model.notes = ["a list of plain values is plain"]
    assert pc.nn.capture_key(model) != key
    key = pc.nn.capture_key(model)
    model.notes.append("changed in place")
    assert pc.nn.capture_key(model) != key
    key = pc.nn.capture_key(model)
    model.temperature = 2.0
    assert pc.nn.capture_key(model) != key


def test_a_layer_thawed_after_the_step_was_recorded_trains(devices2, queue):
    """A frozen first layer is not in the recorded graph at all; thawing it must record the
    step anew, in a group and under tp.capture, as the eager steps do."""
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    y = np.arange(6) % 4
    results = []
    for capture in (False, True):
        with ReplicaGroup(mlp, devices2, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            first = [r.model[0].parameters() for r in group.replicas]
            for step in range(4):
                for p in (p for ps in first for p in ps):
                    p.requires_grad = step >= 2          # frozen for two steps, then thawed
                group.step(x, y, tp.cross_entropy, opt)
            results.append([p.value.to_host() for p in group.parameters()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    model = mlp(queue)

    def fwd_bwd(xt, yt):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(xt)), yt)
        tape.backward(loss)
        return loss.value

    step = tp.capture(fwd_bwd, queue)
    for p in model[0].parameters():
        p.requires_grad = False
    for _ in range(2):
        model.zero_grad()
        step(x, y)
    for p in model[0].parameters():
        p.requires_grad = True
    model.zero_grad()
    step(x, y)
    assert model[0].weight.grad is not None


def test_capture_key_sees_dicts_with_any_plain_keys_enums_and_named_tuples(queue):
    import collections
    import enum

    Mode = enum.Enum("Mode", "fast slow")
    Pair = collections.namedtuple("Pair", "a b")
    model = Branching(queue)
    for name, first, second in (("scale", {0: 1.0}, {0: 3.0}), ("mode", Mode.fast, Mode.slow),
                                ("pair", Pair(1, 2), Pair(1, 3))):
        setattr(model, name, first)
        key = pc.nn.capture_key(model)
        setattr(model, name, second)
        assert pc.nn.capture_key(model) != key, name


def test_a_failed_step_leaves_dropout_generators_and_running_statistics_as_it_found_them(
        devices2):
    """The eager step draws its dropout keys and updates batch norm's running statistics
    before the label check fails, the replay checks the labels first: either way the step
    that raised changes nothing, so eager and captured runs stay equal after it."""
    def model(queue):
        pc.nn.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Linear(16, 8, queue=queue),
                                pc.nn.BatchNorm1d(8, queue=queue), pc.nn.Dropout(0.5),
                                pc.nn.Linear(8, 4, queue=queue))

    x, y, bad = np.ones((4, 16), np.float32), np.array([0, 1, 2, 3]), np.array([0, 1, 2, 9])
    results = []
    for capture in (False, True):
        with ReplicaGroup(model, devices2, capture=capture) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            group.step(x, y, tp.cross_entropy, opt)
            group.step(x, y, tp.cross_entropy, opt)
            before = group.rng_state()
            stats = [dict(r.model.state_dict())
                     for r in group.replicas]
            with pytest.raises(pc.ReplicaError):
                group.step(x, bad, tp.cross_entropy, opt)
            assert group.rng_state() == before
            for r, kept in zip(group.replicas, stats):
                for k, v in r.model.state_dict().items():
                    np.testing.assert_array_equal(v, kept[k], err_msg=k)
            group.step(x, y, tp.cross_entropy, opt)
            results.append([p.value.to_host() for p in group.parameters()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


# -- an op whose input was bad is reported no later than the next host read -----------------
def test_recorded_index_ops_read_back_without_a_backward_raise(queue):
    w = tp.tensor(pc.Tensor.from_host(queue, np.ones((4, 3), np.float32)), requires_grad=True)
    bad = pc.Tensor.from_host(queue, np.array([1, 7]))
    with tp.Tape():
        rows = tp.embedding(bad, w)                     # recorded, never backwarded
    with pytest.raises(pc.ShapeError, match="embedding: index 7"):
        rows.to_host()
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 3), np.float32)), requires_grad=True)
    with tp.Tape():
        picked = tp.gather(x, 1, pc.Tensor.from_host(queue, np.array([[0], [5]])))
    with pytest.raises(pc.ShapeError, match="gather: index 5"):
        picked.to_host()


def test_values_computed_from_a_bad_index_or_label_raise_at_their_read(queue):
    # An evaluation loop records but never backwards: what it reads is computed from the
    # checked op's output, so the check travels with every value made from it.
    pc.nn.manual_seed(0)
    emb, head = pc.nn.Embedding(4, 3, queue=queue), pc.nn.Linear(3, 2, queue=queue)
    with tp.Tape():
        logits = head(emb(pc.Tensor.from_host(queue, np.array([1, 4]))))
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        logits.to_host()
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        float(tp.sum(logits))
    gpt = pc.nn.GPT(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4, queue=queue)
    with pytest.raises(pc.ShapeError, match="embedding: index 5"):
        gpt(np.array([[1, 5]])).to_host()
    ce = pc.nn.CrossEntropyLoss()
    x = tp.tensor(pc.Tensor.from_host(queue, np.zeros((2, 3), np.float32)), requires_grad=True)
    with tp.Tape():
        half = ce(x, pc.Tensor.from_host(queue, np.array([0, 3]))) * 0.5
    with pytest.raises(pc.LabelError, match="label 3"):
        float(half)
    with tp.no_grad():                           # unrecorded ops of a checked value too
        with pytest.raises(pc.ShapeError, match="embedding: index 4"):
            tp.relu(logits.value).to_host()


RAW_READS = {
    "argmax": lambda v: v.argmax(1), "mul": lambda v: v * 1.0, "rsub": lambda v: 1.0 - v,
    "gt": lambda v: v > 1, "sum": lambda v: v.sum(), "mean": lambda v: v.mean(0),
    "max": lambda v: v.max(), "exp": lambda v: v.exp(), "log": lambda v: v.log(),
    "neg": lambda v: -v, "T": lambda v: v.T, "getitem": lambda v: v[1],
    "matmul": lambda v: v @ v.T, "copy": lambda v: v.copy(), "reshape": lambda v: v.reshape(-1),
}


@pytest.mark.parametrize("name", list(RAW_READS))
def test_raw_tensor_operators_on_rows_of_a_bad_id_raise_as_the_rows_do(queue, name):
    """``logits.detach().argmax(1)``, ``node.value * 1.0``, ``.sum()``, ``.T``, ``t[1]``: a
    pc.Tensor operator or method computed from the rows of a token id outside ``[0, V)``
    returned the garbage row's values with no error (the argmax of the rows of ids [0, 4]
    was [0, 0]), where every tp op on them raises the embedding's error."""
    weight = pc.nn.Parameter.from_host(queue, np.full((4, 3), 2.0, np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        RAW_READS[name](rows.detach()).to_host()


def test_a_tensor_written_from_rows_of_a_bad_id_raises_at_its_read(queue):
    """In place (``t += rows``, ``t.copy_(rows)``) the target takes on the pending check."""
    weight = pc.nn.Parameter.from_host(queue, np.full((4, 3), 2.0, np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight).detach()
    for write in (lambda t: t.__iadd__(rows), lambda t: t.copy_(rows)):
        target = pc.Tensor.zeros(queue, (2, 3))
        write(target)
        with pytest.raises(pc.ShapeError, match="embedding: index 4"):
            target.to_host()


def test_a_backward_from_a_value_computed_from_rows_of_a_bad_id_raises(queue):
    """Activations passed on detached (``tp.tensor(h.detach(), requires_grad=True)``, a
    truncated-BPTT or pipeline stage) or an upstream gradient (``tape.backward(y, g)``) made
    from the rows of a token id outside ``[0, V)``: the backward ran without an error and left
    NaN gradients ([[nan, nan, nan], [nan, nan, nan]] for a Linear's weight) for the next
    ``opt.step()`` to write into the weights, where PyTorch's embedding raised."""
    weight = pc.nn.Parameter.from_host(queue, np.full((4, 3), 2.0, np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight).detach()
    pc.nn.manual_seed(0)
    head = pc.nn.Linear(3, 2, queue=queue)
    h = tp.tensor(rows, requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(head(h))
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        tape.backward(loss)
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 3), np.float32)), requires_grad=True)
    with tp.Tape() as tape:
        y = tp.mul(x, 2.0)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        tape.backward(y, rows)
    x.grad = None
    with tp.Tape() as tape:                     # a good backward is as before
        y = tp.mul(x, 2.0)
    tape.backward(y, pc.Tensor.full(queue, (2, 3), 0.5))
    np.testing.assert_array_equal(x.grad.to_host(), np.full((2, 3), 1.0, np.float32))


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss", "CrossEntropyLoss"])
def test_a_loss_weighted_by_class_weights_from_a_bad_label_raises_at_its_read(queue, loss):
    """Class weights counted from labels by ``tp.one_hot`` (``n / (C * counts)``) carry the
    one_hot's label check; weighed by weights counted from a label outside ``[0, C)`` the loss
    read 0.5259 with no error (``weight=`` was the one input whose check the loss dropped),
    where PyTorch's one_hot raised ('Class values must be smaller than num_classes')."""
    counted = pc.Tensor.from_host(queue, np.array([0, 1, 3]))
    weight = tp.one_hot(counted, 3).sum(0) + 1.0           # garbage: label 3 of 3 classes
    logits = pc.Tensor.from_host(queue, np.array([[2, 0, 0], [0, 0, 0]], np.float32))
    labels = pc.Tensor.from_host(queue, np.array([0, 2]))
    losses = {"cross_entropy": lambda: tp.cross_entropy(logits, labels, weight=weight),
              "nll_loss": lambda: tp.nll_loss(logits, labels, weight=weight),
              "CrossEntropyLoss": lambda: pc.nn.CrossEntropyLoss(weight)(logits, labels)}
    with pytest.raises(pc.ShapeError, match="one_hot: label 3"):
        float(losses[loss]())
    good = tp.one_hot(counted, 4).sum(0)[:3] + 1.0         # weights [2, 2, 1], in range
    np.testing.assert_allclose(float(tp.cross_entropy(logits, labels, weight=good)),
                               0.525900661945343, rtol=1e-6)       # torch's, weight [2, 2, 1]


def test_a_tensor_wholly_overwritten_after_rows_of_a_bad_id_reads_its_new_values(queue):
    """A buffer reused across batches (``buf.copy_(rows)`` each step): after one batch of a
    bad id (its error caught, the batch skipped), ``buf.copy_(good_rows)`` or ``fill_`` left
    the bad batch's check on ``buf``, so every later read raised 'embedding: index 4' for
    good values ([[2, 2, 2], [2, 2, 2]]), where PyTorch reads them; a partial write
    (``buf += rows``) keeps the checks of both."""
    weight = pc.nn.Parameter.from_host(queue, np.full((4, 3), 2.0, np.float32))

    def rows(ids):
        with tp.Tape():
            return tp.embedding(pc.Tensor.from_host(queue, np.array(ids)), weight).detach()

    buf = pc.Tensor.zeros(queue, (2, 3))
    buf.copy_(rows([0, 4]))
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        buf.to_host()
    buf.copy_(rows([0, 3]))
    np.testing.assert_array_equal(buf.to_host(), np.full((2, 3), 2.0))
    buf.copy_(rows([4, 0]))
    buf.fill_(1.0)
    np.testing.assert_array_equal(buf.to_host(), np.ones((2, 3)))
    buf.copy_(rows([4, 0]))
    buf += rows([0, 1])
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        buf.to_host()


def test_a_skipped_batch_of_a_bad_id_leaves_batch_norms_running_statistics_as_pytorch(queue):
    """Embedding -> BatchNorm1d -> Linear trained with a loop that skips a batch whose
    backward raises: the batch of ids [0, 4, 2] had already moved the running mean, with
    its NaN row, to [nan, nan, nan] for good, so the model evaluated to NaN ever after,
    silently, where PyTorch's embedding raises before the batch norm sees the batch. Now the
    batch norm reads its input's checks before updating its statistics."""
    pc.nn.manual_seed(0)
    emb, bn = pc.nn.Embedding(4, 3, queue=queue), pc.nn.BatchNorm1d(3, queue=queue)
    head = pc.nn.Linear(3, 2, queue=queue)
    labels = pc.Tensor.from_host(queue, np.array([0, 1, 0]))
    for ids in ([0, 1, 2], [0, 4, 2], [1, 2, 3]):
        try:
            with tp.Tape() as tape:
                logits = head(bn(emb(pc.Tensor.from_host(queue, np.array(ids)))))
                loss = tp.cross_entropy(logits, labels)
            tape.backward(loss)
        except pc.ShapeError as e:
            assert "embedding: index 4" in str(e) and ids == [0, 4, 2]
    w = emb.weight.value.to_host()                   # no step taken: the weights as made
    batches = np.stack([w[[0, 1, 2]].mean(0), w[[1, 2, 3]].mean(0)])
    np.testing.assert_allclose(bn.running_mean.to_host(),
                               0.9 * 0.1 * batches[0] + 0.1 * batches[1], rtol=1e-5)


def test_a_skipped_batch_of_a_bad_id_is_not_counted_by_a_cumulative_batch_norm_as_pytorch(queue):
    """BatchNorm1d(momentum=None) weighs the n-th batch 1/n, n counted in
    num_batches_tracked: the batch [0, 4, 2], whose embedding raised, was counted before the
    batch norm read its input's checks, so after it and [1, 2, 3] the count was 3 and the
    running mean [0.357, 0.0385, 0.0329] where PyTorch's (its error before the batch norm)
    counts 2 and averages the two good batches, [0.2797, 0.0112, -0.0004]. Now the count
    waits for the checks too."""
    pc.nn.manual_seed(0)
    emb = pc.nn.Embedding(4, 3, queue=queue)
    bn = pc.nn.BatchNorm1d(3, momentum=None, queue=queue)
    for ids in ([0, 1, 2], [0, 4, 2], [1, 2, 3]):
        try:
            with tp.Tape() as tape:
                loss = tp.sum(bn(emb(pc.Tensor.from_host(queue, np.array(ids)))))
            tape.backward(loss)
        except pc.ShapeError as e:
            assert "embedding: index 4" in str(e) and ids == [0, 4, 2]
    want = torch.nn.BatchNorm1d(3, momentum=None)
    w = torch.tensor(emb.weight.value.to_host())        # no step taken: the weights as made
    for ids in ([0, 1, 2], [1, 2, 3]):
        want(w[ids])
    assert int(bn.num_batches_tracked.to_host()) == int(want.num_batches_tracked) == 2
    np.testing.assert_allclose(bn.running_mean.to_host(), want.running_mean.numpy(),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(bn.running_var.to_host(), want.running_var.numpy(), rtol=1e-5)


def test_a_replay_of_a_bad_id_leaves_batch_norms_running_statistics_as_the_eager_call(queue):
    """The same model in a captured step whose ids are sliced from its input (checked on
    the device): the replay of the batch [0, 4, 2] updated the running statistics before
    its check raised after the replay, so the running mean was [nan, nan, nan] for good
    where the eager call's batch norm raises before its update. Now every replay reads the
    input's checks where the batch norm does, and stops there."""
    pc.nn.manual_seed(0)
    emb, bn = pc.nn.Embedding(4, 3, queue=queue), pc.nn.BatchNorm1d(3, queue=queue)
    head = pc.nn.Linear(3, 2, queue=queue)

    def body(ids, labels):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(head(bn(emb(tp.tensor(ids[:-1])))), labels)
        tape.backward(loss)
        return loss.value

    step = tp.capture(body, queue)
    labels = np.array([0, 1, 0])
    for ids in ([0, 1, 2, 0], [1, 2, 3, 0], [0, 4, 2, 0], [3, 2, 1, 0]):
        for p in (*emb.parameters(), *bn.parameters(), *head.parameters()):
            p.grad = None
        try:
            step(np.array(ids), labels)
        except pc.ShapeError as e:
            assert "embedding: index 4" in str(e) and ids == [0, 4, 2, 0]
    assert step.replays == 2
    w = emb.weight.value.to_host()                   # no step taken: the weights as made
    means = [w[ids].mean(0) for ids in ([0, 1, 2], [1, 2, 3], [3, 2, 1])]
    np.testing.assert_allclose(bn.running_mean.to_host(),
                               0.1 * (0.9 ** 2 * means[0] + 0.9 * means[1] + means[2]),
                               rtol=1e-5)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_a_skipped_batch_of_a_bad_id_leaves_instance_norms_running_statistics_as_pytorch(
        queue, captured):
    """InstanceNorm1d(track_running_stats=True) after an Embedding, trained by a loop that
    skips the batch whose embedding raises: the batch [0, 4, 2] moved the running mean with
    its NaN row and passed it the embedding's check, so every later read of it, and every
    evaluation, raised 'embedding: index 4' for good (the running mean NaN) where PyTorch's
    error comes before the update and batch [1, 2, 3] moves it on. Now the update reads the
    input's checks first, in every replay of a captured step too."""
    pc.nn.manual_seed(0)
    emb = pc.nn.Embedding(4, 3, queue=queue)
    norm = pc.nn.InstanceNorm1d(3, track_running_stats=True, queue=queue)

    def body(ids):
        with tp.Tape() as tape:
            loss = tp.sum(norm(tp.permute(emb(tp.tensor(ids[:, :-1])), (0, 2, 1))))
        tape.backward(loss)
        return loss.value

    step = tp.capture(body, queue) if captured else None
    for ids in ([[0, 1, 2, 0]], [[0, 4, 2, 0]], [[1, 2, 3, 0]]):
        emb.weight.grad = None
        try:
            step(np.array(ids)) if captured else body(pc.Tensor.from_host(queue, np.array(ids)))
        except pc.ShapeError as e:
            assert "embedding: index 4" in str(e) and ids == [[0, 4, 2, 0]]
    assert not captured or step.replays == 1
    want = torch.nn.InstanceNorm1d(3, track_running_stats=True)
    w = torch.tensor(emb.weight.value.to_host())        # no step taken: the weights as made
    for ids in ([0, 1, 2], [1, 2, 3]):
        want(w[ids].T[None])
    np.testing.assert_allclose(norm.running_mean.to_host(), want.running_mean.numpy(),
                               rtol=1e-5)
    np.testing.assert_allclose(norm.running_var.to_host(), want.running_var.numpy(),
                               rtol=1e-5)


def test_gradients_of_a_failed_backward_are_held_back_from_the_next_step(queue):
    """A loop that catches a backward's error (rows of a bad token id) and goes on: the
    leaves' gradients already held that backward's contributions, computed from garbage,
    and the next good batch's step applied them (the head's weight all NaN, silently). Now
    an optimizer step refuses them until they are zeroed; then training goes on as if the
    bad batch never ran."""
    def build():
        pc.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Embedding(4, 3, queue=queue), pc.nn.Linear(3, 2,
                                                                                 queue=queue))

    def backward(model, ids):
        with tp.Tape() as tape:
            loss = tp.sum(model(pc.Tensor.from_host(queue, np.array(ids))))
        tape.backward(loss)

    model = build()
    opt = pc.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        backward(model, [0, 4])
    backward(model, [1, 2])                           # accumulates onto the held-back sum
    with pytest.raises(pc.ParclError, match="a backward that failed.*zero it"):
        opt.step()
    opt.zero_grad()
    backward(model, [1, 2])
    opt.step()

    clean = build()
    clean_opt = pc.optim.SGD(clean.parameters(), lr=0.1)
    backward(clean, [1, 2])
    clean_opt.step()
    for got, want in zip(model.parameters(), clean.parameters()):
        np.testing.assert_array_equal(got.value.to_host(), want.value.to_host())


def test_gradients_of_a_failed_replay_are_held_back_from_the_next_step(queue):
    """The same loop with a captured step that accumulates into kept gradients: the replay
    of a batch with a bad id (the ids sliced from the input, so checked on the device after
    the replay) had added its garbage into the gradients and raised, and the next good
    batch's step applied it (every weight NaN, silently, where the eager step raises). Now a
    replay's gradients are held back as the eager backward's: the step refuses them until
    they are zeroed, then training goes on as if the bad batch never ran."""
    def build():
        pc.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Embedding(5, 3, queue=queue), pc.nn.Flatten(),
                                pc.nn.Linear(6, 2, queue=queue))

    def run(batches):
        model = build()
        opt = pc.optim.SGD(model.parameters(), lr=0.1)
        for p in model.parameters():            # kept buffers: every call accumulates
            p.grad = pc.Tensor.zeros(queue, p.shape)

        def body(tokens):
            with tp.Tape() as tape:
                loss = tp.mean(tp.square(model(tp.tensor(tokens[:, :-1]))))
            tape.backward(loss)
            return loss.value
        return model, opt, tp.capture(body, queue)

    good = [np.array([[1, 2, 0], [3, 4, 0]]), np.array([[0, 2, 0], [3, 1, 0]])]
    model, opt, step = run(good)
    for tokens in good:
        step(tokens)
        opt.step()
        opt.zero_grad(set_to_none=False)
    with pytest.raises(pc.ShapeError, match="embedding: index 7"):
        step(np.array([[0, 7, 0], [3, 1, 0]]))
    step(good[0])                                 # accumulates onto the held-back sum
    with pytest.raises(pc.ParclError, match="a backward that failed.*zero it"):
        opt.step()
    opt.zero_grad(set_to_none=False)
    step(good[0])
    opt.step()
    assert step.replays == 3                      # the failed one not counted

    clean, clean_opt, _ = run(good)
    for tokens in good + good[:1]:
        with tp.Tape() as tape:
            loss = tp.mean(tp.square(clean(pc.Tensor.from_host(queue, tokens[:, :-1]))))
        tape.backward(loss)
        clean_opt.step()
        clean_opt.zero_grad(set_to_none=False)
    for got, want in zip(model.parameters(), clean.parameters()):
        np.testing.assert_array_equal(got.value.to_host(), want.value.to_host())


def test_replays_after_a_failed_one_and_zero_grad_train_as_the_eager_calls(queue):
    """A loop that zeroes the gradients (set to None) before every batch and skips one whose
    replay raised: the next replays write their gradients anew, into the buffers the failed
    replay had held back, and step with them as the eager calls do (no refusal left on
    them), the weights bit for bit those of a run that never saw the bad batch."""
    def build():
        pc.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Embedding(5, 3, queue=queue), pc.nn.Flatten(),
                                pc.nn.Linear(6, 2, queue=queue))

    def train(batches, captured):
        model = build()
        opt = pc.optim.SGD(model.parameters(), lr=0.1)

        def body(tokens):
            with tp.Tape() as tape:
                loss = tp.mean(tp.square(model(tp.tensor(tokens[:, :-1]))))
            tape.backward(loss)
            return loss.value
        step = tp.capture(body, queue)
        for tokens in batches:
            opt.zero_grad()
            try:
                step(tokens) if captured else body(pc.Tensor.from_host(queue, tokens))
            except pc.ShapeError:
                continue
            opt.step()
        return [p.value.to_host() for p in model.parameters()], step.replays

    good = [np.array([[1, 2, 0], [3, 4, 0]]), np.array([[0, 2, 0], [3, 1, 0]]),
            np.array([[4, 2, 0], [1, 0, 0]])]
    bad = np.array([[0, 7, 0], [3, 1, 0]])
    got, replays = train(good[:2] + [bad] + good[2:], captured=True)
    want, _ = train(good, captured=False)
    assert replays == 2                          # the failed one not counted
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_head_trained_on_a_checkpointed_embedding_of_a_bad_id_is_held_back(queue):
    """The same loop with the embedding checkpointed (``tp.checkpoint``) and only the head
    trained (the embedding frozen from the optimizer): the index error was raised by the
    recomputation's backward, amid the outer walk, which held back only the embedding's
    own gradient, so the head's, computed from the bad id's garbage row, went to the step
    unchecked and its weight became [nan, nan, nan], silently, where the plain graph's step
    refuses it. Now held back as there; after zero_grad the head trains as if the bad batch
    never ran."""
    def build():
        pc.manual_seed(0)
        return pc.nn.Embedding(4, 3, queue=queue), pc.nn.Linear(3, 2, queue=queue)

    def backward(emb, head, ids):
        with tp.Tape() as tape:
            rows = tp.checkpoint(emb, pc.Tensor.from_host(queue, np.array(ids)))
            loss = tp.sum(head(rows))
        tape.backward(loss)

    emb, head = build()
    opt = pc.optim.SGD(head.parameters(), lr=0.1)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        backward(emb, head, [0, 4])
    with pytest.raises(pc.ParclError, match="a backward that failed.*zero it"):
        opt.step()
    opt.zero_grad()
    backward(emb, head, [1, 2])
    opt.step()

    clean_emb, clean = build()
    clean_opt = pc.optim.SGD(clean.parameters(), lr=0.1)
    backward(clean_emb, clean, [1, 2])
    clean_opt.step()
    for got, want in zip(head.parameters(), clean.parameters()):
        np.testing.assert_array_equal(got.value.to_host(), want.value.to_host())
