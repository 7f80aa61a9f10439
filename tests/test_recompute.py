"""``tp.checkpoint``: activation checkpointing, as ``torch.utils.checkpoint``.

A checkpointed function keeps no activation for the backward and computes them again there:
less memory, the same gradients bit for bit (the same kernels, the same dropout masks),
running statistics updated once, and every way the second run could differ from the first
refused rather than backwarded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up
from parcl.replica import ReplicaGroup


class Block(pc.nn.Module):
    """A transformer-like block: layer norm, MLP with GELU and dropout, residual."""

    def __init__(self, width, queue, p=0.2):
        super().__init__()
        self.ln = pc.nn.LayerNorm(width, queue=queue)
        self.up = pc.nn.Linear(width, 2 * width, queue=queue)
        self.down = pc.nn.Linear(2 * width, width, queue=queue)
        self.drop = pc.nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.down(tp.gelu(self.up(self.ln(x)))))


class Net(pc.nn.Module):
    def __init__(self, queue, width=16, depth=3, checkpointed=False):
        super().__init__()
        self.blocks = pc.nn.ModuleList([Block(width, queue) for _ in range(depth)])
        self.bn = pc.nn.BatchNorm1d(width, queue=queue)
        self.head = pc.nn.Linear(width, 4, queue=queue)
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = tp.checkpoint(block, x) if self.checkpointed else block(x)
        return self.head(self.bn(x))


def build(queue, checkpointed):
    pc.manual_seed(0)
    return Net(queue, checkpointed=checkpointed)


def batch(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 16)).astype(np.float32), rng.integers(0, 4, n)


def train(queue, checkpointed, steps=2):
    """Losses, input gradients and final state of ``steps`` SGD steps."""
    model = build(queue, checkpointed)
    opt = pc.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        x, y = batch(seed=step)
        xs = leaf(queue, x)
        opt.zero_grad()
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(xs), up(queue, y, np.int64))
        tape.backward(loss)
        losses.append(float(loss.value))
        grads.append(xs.grad.to_host())
        opt.step()
    return losses, grads, model.state_dict(), tp.rng_state()


def test_checkpointed_blocks_train_bit_for_bit_as_the_plain_ones(queue):
    """Two steps with dropout, layer norm and batch norm: the same losses, input gradients,
    parameters, running statistics and dropout generator state, bit for bit."""
    plain, ckpt = train(queue, False), train(queue, True)
    assert plain[0] == ckpt[0]
    for a, b in zip(plain[1], ckpt[1]):
        np.testing.assert_array_equal(a, b)
    assert plain[2].keys() == ckpt[2].keys()
    for k in plain[2]:
        np.testing.assert_array_equal(plain[2][k], ckpt[2][k], err_msg=k)
    assert plain[3] == ckpt[3]


def test_the_recomputation_keeps_no_activation_of_the_segment(queue):
    """A deep checkpointed MLP holds only its segments' outputs for the backward: after the
    forward, 4 activations in use instead of 12."""
    def peak_after_forward(checkpointed):
        pc.manual_seed(0)
        layers = [pc.nn.Sequential(*[m for _ in range(3)
                                     for m in (pc.nn.Linear(256, 256, queue=queue),
                                               pc.nn.Tanh())])
                  for _ in range(4)]
        x = leaf(queue, np.random.default_rng(0).standard_normal((512, 256)))
        queue.finish()
        before = pc.memory_stats(queue)["bytes_in_use"]
        with tp.Tape() as tape:
            h = x
            for layer in layers:
                h = tp.checkpoint(layer, h) if checkpointed else layer(h)
            loss = tp.sum(h)
        held = pc.memory_stats(queue)["bytes_in_use"] - before
        tape.backward(loss)
        for p in (p for layer in layers for p in layer.parameters()):
            assert p.grad is not None
        return held

    plain, ckpt = peak_after_forward(False), peak_after_forward(True)
    activation = 512 * 256 * 4
    assert plain >= 12 * activation          # each Tanh's output (the next Linear's input)
    assert ckpt <= 4 * activation + 8192     # each segment's output only (and the loss)


def test_parameters_get_gradients_when_no_input_requires_grad_as_pytorch(queue):
    """As ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the first block
    of a network reads raw data, and its weights still get their gradients."""
    pc.manual_seed(0)
    lin = pc.nn.Linear(3, 2, queue=queue)
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    with tp.Tape() as tape:
        loss = tp.sum(tp.tanh(tp.checkpoint(lin, up(queue, x), use_reentrant=False)))
    tape.backward(loss)
    tl = torch.nn.Linear(3, 2)
    with torch.no_grad():
        tl.weight.copy_(torch.from_numpy(lin.weight.value.to_host()))
        tl.bias.copy_(torch.from_numpy(lin.bias.value.to_host()))
    out = torch.utils.checkpoint.checkpoint(tl, torch.from_numpy(x), use_reentrant=False)
    torch.tanh(out).sum().backward()
    np.testing.assert_allclose(lin.weight.grad.to_host(), tl.weight.grad.numpy(), atol=1e-5)
    np.testing.assert_allclose(lin.bias.grad.to_host(), tl.bias.grad.numpy(), atol=1e-5)


def test_checkpoint_sequential_equals_the_plain_sequential(queue):
    pc.manual_seed(0)
    net = pc.nn.Sequential(*[pc.nn.Linear(6, 6, queue=queue) if i % 2 == 0 else pc.nn.ReLU()
                             for i in range(7)])
    x = np.random.default_rng(2).standard_normal((4, 6))
    grads = []
    for run in (lambda h: net(h), lambda h: tp.checkpoint_sequential(net, 3, h)):
        net.zero_grad()
        xs = leaf(queue, x)
        with tp.Tape() as tape:
            loss = tp.sum(run(xs))
        tape.backward(loss)
        grads.append([xs.grad.to_host()] + [p.grad.to_host() for p in net.parameters()])
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


def test_batch_norm_counts_a_checkpointed_batch_once(queue):
    """momentum=None averages over ``num_batches_tracked`` batches: the recomputation
    neither counts the batch again nor moves the running statistics a second time."""
    def stats(checkpointed):
        pc.manual_seed(0)
        bn = pc.nn.BatchNorm1d(3, momentum=None, queue=queue)
        x = leaf(queue, np.random.default_rng(3).standard_normal((8, 3)) + 2.0)
        with tp.Tape() as tape:
            loss = tp.sum(tp.mul(tp.checkpoint(bn, x) if checkpointed else bn(x), 1.5))
        tape.backward(loss)
        return bn.state_dict(), x.grad.to_host()

    (plain, gp), (ckpt, gc) = stats(False), stats(True)
    assert int(ckpt["num_batches_tracked"]) == 1
    for k in plain:
        np.testing.assert_array_equal(plain[k], ckpt[k], err_msg=k)
    np.testing.assert_array_equal(gp, gc)


def test_a_parameter_stepped_before_the_backward_raises(queue):
    pc.manual_seed(0)
    lin = pc.nn.Linear(4, 4, queue=queue)
    opt = pc.optim.SGD(lin.parameters(), lr=0.1)
    x = leaf(queue, np.ones((2, 4)))
    with tp.Tape() as warm:
        tp.sum(lin(x)).backward()
    del warm
    with tp.Tape() as tape:
        loss = tp.sum(tp.checkpoint(lin, x))
    opt.step()                       # changes lin.weight in place
    with pytest.raises(pc.ParclError, match="checkpoint.*updated in place"):
        tape.backward(loss)


def test_a_raw_input_changed_in_place_before_the_backward_raises(queue):
    pc.manual_seed(0)
    lin = pc.nn.Linear(4, 4, queue=queue)
    data = up(queue, np.ones((2, 4)))
    with tp.Tape() as tape:
        loss = tp.sum(tp.tanh(tp.checkpoint(lin, data)))
    data.fill_(3.0)
    with pytest.raises(pc.ParclError, match="updated in place"):
        tape.backward(loss)


def test_a_numpy_argument_is_read_as_it_was_at_the_forward(queue):
    """The function uploads a numpy array it is passed: the backward's second run reads the
    copy taken at the forward, not the caller's array changed since."""
    pc.manual_seed(0)
    lin = pc.nn.Linear(4, 4, queue=queue)
    data = np.ones((2, 4), np.float32)

    def scaled(x, scale):
        return lin(x) * tp.tensor(scale)

    grads = []
    for change in (False, True):
        lin.zero_grad()
        with tp.Tape() as tape:
            loss = tp.sum(tp.tanh(tp.checkpoint(scaled, up(queue, data), np.full(4, 0.5))))
        if change:
            data[:] = 9.0
        tape.backward(loss)
        grads.append(lin.weight.grad.to_host())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_a_function_reading_an_activation_it_was_not_passed_is_refused(queue):
    x = leaf(queue, np.ones((2, 3)))
    with tp.Tape():
        h = tp.tanh(x)
        with pytest.raises(pc.ParclError, match="reads the output of 'tanh'.*Pass it as an "
                                                "argument"):
            tp.checkpoint(lambda y: y * h, x)


def test_a_recomputation_that_reads_other_parameters_raises(queue):
    pc.manual_seed(0)
    a, b = pc.nn.Linear(3, 3, queue=queue), pc.nn.Linear(3, 3, queue=queue)
    which = {"layer": a}
    x = leaf(queue, np.ones((2, 3)))
    with tp.Tape() as tape:
        loss = tp.sum(tp.checkpoint(lambda y: which["layer"](y), x))
    which["layer"] = b
    with pytest.raises(pc.ParclError, match="read parameters its forward did not"):
        tape.backward(loss)


def test_a_recomputation_that_reads_fewer_parameters_raises_as_pytorch(queue):
    """A branch on state changed between forward and backward leaves a layer out of the
    recomputation: PyTorch's checkpoint raises (a different number of tensors saved). It
    backwarded the other function: b got no gradient and a's weight gradient was 4 where 2
    is right, silently."""
    pc.manual_seed(0)
    a, b = pc.nn.Linear(3, 3, queue=queue), pc.nn.Linear(3, 3, queue=queue)
    both = {"layers": True}
    x = leaf(queue, np.ones((2, 3)))
    with tp.Tape() as tape:
        loss = tp.sum(tp.checkpoint(lambda y: a(y) + b(y) if both["layers"] else a(y) * 2.0,
                                    x))
    both["layers"] = False
    with pytest.raises(pc.ParclError, match="read 2 of the 4 parameters its forward read"):
        tape.backward(loss)
    assert a.weight.grad is None and b.weight.grad is None


def test_a_parameter_frozen_before_the_backward_gets_no_gradient_as_in_the_plain_graph(queue):
    """Freezing is no different function: the recomputation reads the frozen layer without
    requiring grad, and the others get the plain graph's gradients, bit for bit."""
    grads = []
    for checkpointed in (False, True):
        pc.manual_seed(0)
        a, b = pc.nn.Linear(3, 3, queue=queue), pc.nn.Linear(3, 3, queue=queue)
        x = leaf(queue, np.ones((2, 3)))
        f = pc.nn.Sequential(a, pc.nn.Tanh(), b)
        with tp.Tape() as tape:
            loss = tp.sum(tp.checkpoint(f, x) if checkpointed else f(x))
        a.requires_grad_(False)
        tape.backward(loss)
        assert a.weight.grad is None
        grads.append((b.weight.grad.to_host(), x.grad.to_host()))
    for plain, ckpt in zip(*grads):
        np.testing.assert_array_equal(plain, ckpt)


def test_under_no_grad_and_without_gradients_it_is_the_plain_call(queue):
    pc.manual_seed(0)
    lin = pc.nn.Linear(3, 2, queue=queue)
    x = up(queue, np.ones((2, 3)))
    with tp.no_grad():
        out = tp.checkpoint(lin, x)
    assert isinstance(out, pc.Tensor)
    lin.requires_grad_(False)
    assert isinstance(tp.checkpoint(lin, x), pc.Tensor)
    np.testing.assert_array_equal(tp.checkpoint(lin, x).to_host(), out.to_host())
    constant = tp.checkpoint(lambda y: tp.tensor(y.value * 2.0), leaf(queue, np.ones(2)))
    assert not constant.requires_grad and constant.to_host().tolist() == [2.0, 2.0]
    with pytest.raises(pc.ParclError, match="one Node or Tensor, got tuple"):
        tp.checkpoint(lambda y: (y, y), leaf(queue, np.ones(2)))


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_replica_group_trains_checkpointed_blocks_as_plain_ones(devices2, capture):
    """Two replicas, checkpointed blocks with dropout: the same parameters after three steps
    as the plain model in the same group setting, bit for bit (captured: replays included)."""
    results = []
    for checkpointed in (False, True):
        pc.manual_seed(0)
        with ReplicaGroup(lambda q, c=checkpointed: build(q, c), devices2,
                          capture=capture) as group:
            opt = pc.optim.AdamW(group.parameters(), lr=1e-2)
            for step in range(3):
                group.step(*batch(seed=step), tp.cross_entropy, opt)
            results.append(group.replicas[0].model.state_dict())
    for k in results[0]:
        np.testing.assert_array_equal(results[0][k], results[1][k], err_msg=k)


def test_gradcheck_passes_through_a_checkpoint(queue):
    pc.manual_seed(0)
    lin = pc.nn.Linear(3, 3, queue=queue)
    x = leaf(queue, np.random.default_rng(0).standard_normal((2, 3)))
    assert tp.gradcheck(lambda v: tp.sum(tp.tanh(tp.checkpoint(
        lambda y: tp.gelu(lin(y)) * y, v))), [x])


def test_captured_replays_of_checkpointed_dropout_train_as_the_eager_calls(queue):
    """Each replay's recomputation draws the masks that replay's forward drew, and leaves the
    generator where the eager call does: four calls of a captured step (three replays), the
    same losses and accumulated gradients as four eager calls of the plain model, bit for
    bit, and four calls drawn."""
    def run(captured, checkpointed):
        pc.manual_seed(0)
        model = pc.nn.Sequential(pc.nn.Linear(16, 12, queue=queue), pc.nn.ReLU(),
                                 pc.nn.Dropout(0.5), pc.nn.Linear(12, 4, queue=queue))
        for p in model.parameters():           # persistent buffers: every call accumulates
            p.grad = pc.Tensor.zeros(queue, p.shape)

        def body(x, y):
            with tp.Tape() as tape:
                h = tp.tensor(x)
                loss = tp.cross_entropy(tp.checkpoint(model, h) if checkpointed else model(h), y)
            tape.backward(loss)
            return loss.value
        tp.manual_seed(7)
        step = tp.capture(body, queue) if captured else body
        losses = []
        for s in range(4):
            x, y = batch(8, seed=s)
            args = (x, y) if captured else (up(queue, x), up(queue, y, np.int64))
            losses.append(float(step(*args).to_host()))
        assert not captured or step.replays == 3
        return losses, [p.grad.to_host() for p in model.parameters()], tp.rng_state()

    eager, replayed = run(False, False), run(True, True)
    assert replayed[0] == eager[0]
    for a, b in zip(replayed[1], eager[1]):
        np.testing.assert_array_equal(a, b)
    assert replayed[2] == eager[2] == (7, 4)


def test_a_captured_group_replays_its_checkpointed_steps_as_the_eager_plain_ones(devices2):
    """Checkpointed blocks whose inputs require grad (all but the first) do not make every
    step a new recording: five steps of two replicas are recorded once and replayed four
    times, with the losses, parameters, statistics and dropout generators of the eager plain
    model, bit for bit."""
    from parcl.tape.ops import nn as nn_ops

    def run(capture, checkpointed):
        pc.manual_seed(0)
        with ReplicaGroup(lambda q: build(q, checkpointed), devices2, capture=capture) as group:
            opt = pc.optim.AdamW(group.parameters(), lr=1e-2)
            losses = [group.step(*batch(seed=s), tp.cross_entropy, opt) for s in range(5)]
            replays = [s.replays for per in group.captured_steps for s in per]
            return (losses, group.replicas[0].model.state_dict(),
                    group.run(lambda r: nn_ops.rng_state()), replays)

    eager, replayed = run(False, False), run(True, True)
    assert replayed[3] == [4, 4]
    assert replayed[0] == eager[0]
    for k in eager[1]:
        np.testing.assert_array_equal(replayed[1][k], eager[1][k], err_msg=k)
    assert replayed[2] == eager[2] == [(0, 15), (0, 15)]


def test_a_backward_after_a_replayed_forward_recomputes_that_replays_masks(queue):
    """A captured forward returning a checkpointed graph, backwarded after the call (no
    tape): the recomputation draws the masks the replay's forward drew, as in the eager loop.
    It drew the recording's, so the replays' gradients were up to 0.84 off, silently."""
    def run(captured):
        tp.manual_seed(0)
        w = tp.tensor(up(queue, np.linspace(0.5, 1.5, 64)), requires_grad=True)

        def forward(x):
            return tp.checkpoint(lambda v: tp.tanh(tp.dropout(tp.mul(v, w), 0.5)), x)

        step = tp.capture(forward, queue) if captured else (lambda x: forward(up(queue, x)))
        grads = []
        for i in range(3):
            tp.sum(step(np.full(64, 0.3 * (i + 1.0), np.float32))).backward()
            grads.append(w.grad.to_host())
            w.grad = None
        assert not captured or step.replays == 2
        return grads, tp.rng_state()

    (eager, eager_rng), (replayed, replayed_rng) = run(False), run(True)
    for e, r in zip(eager, replayed):
        np.testing.assert_array_equal(r, e)
    assert replayed_rng == eager_rng == (0, 3)


def test_pytorchs_checkpoint_keywords_are_taken_not_passed_to_the_function(queue):
    """``determinism_check`` and ``debug`` are torch.utils.checkpoint's own: they reached the
    function as keyword arguments (a TypeError, or swallowed by a ``**kwargs``)."""
    pc.manual_seed(0)
    lin = pc.nn.Linear(3, 2, queue=queue)
    x = leaf(queue, np.ones((2, 3)))
    with tp.Tape() as tape:
        loss = tp.sum(tp.checkpoint(lin, x, use_reentrant=False, determinism_check="none",
                                    debug=False))
    tape.backward(loss)
    assert x.grad is not None
    with pytest.raises(pc.ParclError, match="context_fn"):
        tp.checkpoint(lin, x, context_fn=lambda: None)
