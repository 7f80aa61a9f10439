"""PyTorch layer options parcl once refused: ``Conv1d``/``Conv2d`` ``padding_mode``, ...
Each layer is given a PyTorch layer's state dict and compared with it: outputs, gradients of
the input and of every parameter, buffers and state-dict keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl import nn


def torch_state(layer) -> dict:
    return {k: torch.from_numpy(np.array(v)) for k, v in layer.state_dict().items()}


def compare_with_torch(ours, theirs, x, rng, tol=1e-5, train=True):
    """ours(x) and theirs(x) agree, and so do the gradients of one random weighted sum for the
    input and every parameter; returns the two outputs."""
    nx = tp.tensor(pc.Tensor.from_host(pc.default_queue(), x.astype(np.float32)), True)
    tx = torch.tensor(x.astype(np.float32), requires_grad=True)
    with tp.Tape() as tape:
        y = ours(nx)
    want = theirs(tx)
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=tol, atol=tol)
    if not train:
        return y, want
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(pc.default_queue(), g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=tol, atol=tol)
    params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.to_host(), params[name].grad.numpy(), rtol=tol,
                                   atol=tol, err_msg=name)
    return y, want


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("kw", [dict(padding=2), dict(padding=(1, 2), stride=2),
                                dict(padding=1, dilation=2, groups=3)])
def test_conv2d_padding_mode_matches_pytorch(queue, rng, padding_mode, kw):
    nn.manual_seed(0)
    ours = nn.Conv2d(3, 6, 3, padding_mode=padding_mode, **kw)
    theirs = torch.nn.Conv2d(3, 6, 3, padding_mode=padding_mode, **kw)
    theirs.load_state_dict(torch_state(ours))
    compare_with_torch(ours, theirs, rng.standard_normal((2, 3, 7, 6)), rng)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert (f"padding_mode={padding_mode}" in repr(ours)) == (padding_mode != "zeros")


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("kw,shape", [(dict(padding=2), (2, 4, 9)),
                                      (dict(padding="same", dilation=2), (2, 4, 7)),
                                      (dict(padding="same", kernel_size=4), (4, 8)),
                                      (dict(padding="valid"), (2, 4, 5)),
                                      (dict(padding=1, stride=2, groups=2), (2, 4, 6))])
def test_conv1d_padding_mode_matches_pytorch(queue, rng, padding_mode, kw, shape):
    nn.manual_seed(0)
    kw = {"kernel_size": 3, **kw}
    ours = nn.Conv1d(4, 6, padding_mode=padding_mode, **kw)
    theirs = torch.nn.Conv1d(4, 6, padding_mode=padding_mode, **kw)
    theirs.load_state_dict(torch_state(ours))
    compare_with_torch(ours, theirs, rng.standard_normal(shape), rng)


def test_conv_layers_refuse_an_unknown_padding_mode(queue):
    with pytest.raises(ValueError):
        torch.nn.Conv2d(3, 3, 3, padding_mode="mirror")
    for layer in (nn.Conv1d, nn.Conv2d):
        with pytest.raises(pc.ShapeError, match="padding_mode must be one of"):
            layer(3, 3, 3, padding_mode="mirror")


def embed_and_backward(emb, idx, g):
    """emb(idx) and the weight's gradient for the upstream gradient g, accumulated into
    whatever gradient the weight already holds."""
    q = pc.default_queue()
    with tp.Tape() as tape:
        y = emb(pc.Tensor.from_host(q, idx))
    tape.backward(y, grad=pc.Tensor.from_host(q, g))
    return y.to_host(), emb.weight.grad.to_host()


@pytest.mark.parametrize("padding_idx", [0, 3, -1, -7])
def test_embedding_padding_idx_row_starts_at_zero_and_gets_no_gradient_as_pytorch(
        queue, rng, padding_idx):
    nn.manual_seed(0)
    ours = nn.Embedding(7, 5, padding_idx=padding_idx)
    theirs = torch.nn.Embedding(7, 5, padding_idx=padding_idx)
    row = padding_idx % 7
    assert ours.padding_idx == theirs.padding_idx == row
    assert not ours.weight.value.to_host()[row].any()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    theirs.load_state_dict(torch_state(ours))
    idx = rng.integers(0, 7, (3, 11))
    idx[0, :4] = row                                     # the padding row, picked repeatedly
    for _ in range(2):                                   # the second backward accumulates
        g = rng.standard_normal((3, 11, 5)).astype(np.float32)
        y, grad = embed_and_backward(ours, idx, g)
        want = theirs(torch.from_numpy(idx))
        want.backward(torch.from_numpy(g))
        np.testing.assert_array_equal(y, want.detach().numpy())
        np.testing.assert_allclose(grad, theirs.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
        assert not grad[row].any()


def test_embedding_padding_row_keeps_a_gradient_it_already_had(queue, rng):
    """The padding row gets nothing added: a gradient set there before stays as it was."""
    w = tp.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    before = rng.standard_normal((4, 3)).astype(np.float32)
    w.grad = pc.Tensor.from_host(queue, before)
    idx = pc.Tensor.from_host(queue, np.array([1, 2, 1, 2]))
    with tp.Tape() as tape:
        loss = tp.sum(tp.embedding(idx, w, padding_idx=2))
    tape.backward(loss)
    got = w.grad.to_host()
    np.testing.assert_array_equal(got[2], before[2])
    np.testing.assert_allclose(got[1], before[1] + 2, rtol=1e-6)


def test_embedding_padding_gradient_is_the_same_bits_run_after_run(queue, rng):
    idx = rng.integers(0, 6, (4, 50))
    g = rng.standard_normal((4, 50, 8)).astype(np.float32)
    grads = []
    for _ in range(2):
        nn.manual_seed(1)
        grads.append(embed_and_backward(nn.Embedding(6, 8, padding_idx=1), idx, g)[1])
    assert np.array_equal(grads[0], grads[1])


@pytest.mark.parametrize("padding_idx", [7, -8, 2.0])
def test_embedding_refuses_a_padding_idx_outside_the_table(queue, padding_idx):
    with pytest.raises((AssertionError, IndexError)):
        torch.nn.Embedding(7, 5, padding_idx=padding_idx)
    with pytest.raises(pc.ShapeError, match="padding_idx"):
        nn.Embedding(7, 5, padding_idx=padding_idx)
    with pytest.raises(pc.ShapeError, match="padding_idx"):
        tp.embedding(pc.Tensor.from_host(queue, np.array([0])),
                     pc.Tensor.zeros(queue, (7, 5)), padding_idx=padding_idx)


@pytest.mark.parametrize("kw", [dict(max_norm=1.0), dict(max_norm=2.5, norm_type=1),
                                dict(max_norm=0.7, norm_type=3.0, padding_idx=2),
                                dict(max_norm=1.5, norm_type=float("inf"))])
def test_embedding_max_norm_rescales_the_picked_rows_in_place_as_pytorch(queue, rng, kw):
    """Each call scales the rows it picks whose norm exceeds max_norm down to it (the others
    keep their bits), then looks them up; the gradient is the rescaled rows'."""
    nn.manual_seed(0)
    ours, theirs = nn.Embedding(9, 5, **kw), torch.nn.Embedding(9, 5, **kw)
    assert repr(ours) == repr(theirs)
    theirs.load_state_dict(torch_state(ours))
    for picks in ([[1, 2, 2, 4]], [[0, 1, 8], [8, 8, 3]]):
        idx = np.array(picks)
        before = ours.weight.value.to_host()
        g = rng.standard_normal((*idx.shape, 5)).astype(np.float32)
        y, grad = embed_and_backward(ours, idx, g)
        want = theirs(torch.from_numpy(idx))
        want.backward(torch.from_numpy(g))
        np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-6, atol=1e-6)
        after = ours.weight.value.to_host()
        np.testing.assert_allclose(after, theirs.weight.detach().numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grad, theirs.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
        untouched = np.setdiff1d(np.arange(9), idx)
        assert np.array_equal(after[untouched], before[untouched])


def test_a_max_norm_rescale_after_an_op_saved_the_weight_makes_its_backward_raise(queue, rng):
    """As PyTorch's version counter: the op saved the rows before the rescale, so its
    gradient would be taken at the new values."""
    w = tp.tensor(3 * rng.standard_normal((6, 4)).astype(np.float32), requires_grad=True)
    with tp.Tape() as tape:
        squares = w * w                                   # saves w
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([1, 2])), w, max_norm=1.0)
        loss = tp.sum(squares) + tp.sum(rows)
    with pytest.raises(pc.ParclError, match="embedding max_norm"):
        tape.backward(loss)


def test_embedding_refuses_scale_grad_by_freq_and_sparse(queue):
    for kw in (dict(scale_grad_by_freq=True), dict(sparse=True)):
        with pytest.raises(pc.ShapeError, match="not supported"):
            nn.Embedding(7, 5, **kw)


def assert_same_state(ours, theirs, tol=1e-5):
    """The same state-dict keys (PyTorch's num_batches_tracked only where parcl keeps it) and
    values."""
    want = {k: v for k, v in theirs.state_dict().items()
            if not k.endswith("num_batches_tracked") or k in ours.state_dict()}
    got = ours.state_dict()
    assert list(got) == list(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v.numpy(), rtol=tol, atol=tol, err_msg=k)
        assert got[k].dtype == v.numpy().dtype, k


BN_CASES = [(nn.BatchNorm1d, torch.nn.BatchNorm1d, (6, 3)),
            (nn.BatchNorm1d, torch.nn.BatchNorm1d, (5, 3, 7)),
            (nn.BatchNorm2d, torch.nn.BatchNorm2d, (3, 3, 5, 3))]


@pytest.mark.parametrize("ours_cls,theirs_cls,shape", BN_CASES)
@pytest.mark.parametrize("kw", [dict(momentum=None), dict(track_running_stats=False),
                                dict(affine=False), dict(affine=False, momentum=None),
                                dict(affine=False, track_running_stats=False), dict(bias=False)])
def test_batch_norm_options_match_pytorch_over_steps_and_in_evaluation(
        queue, rng, ours_cls, theirs_cls, shape, kw):
    """momentum=None averages every batch so far (num_batches_tracked counts them), no
    running statistics normalise with the batch's in evaluation too, affine=False has no
    parameters: outputs, gradients, buffers and keys as PyTorch's, over 3 training steps and
    an evaluation."""
    ours, theirs = ours_cls(3, **kw), theirs_cls(3, **kw)
    assert repr(ours) == repr(theirs)
    for _ in range(3):
        compare_with_torch(ours, theirs, 2 + 3 * rng.standard_normal(shape), rng)
        assert_same_state(ours, theirs)
    ours.eval(), theirs.eval()
    compare_with_torch(ours, theirs, rng.standard_normal(shape), rng, train=False)
    assert_same_state(ours, theirs)


def test_batch_norm_momentum_none_resumes_its_count_from_a_pytorch_state_dict(queue, rng):
    theirs = torch.nn.BatchNorm2d(3, momentum=None)
    for _ in range(4):
        theirs(torch.from_numpy(rng.standard_normal((2, 3, 4, 4)).astype(np.float32)))
    ours = nn.BatchNorm2d(3, momentum=None)
    ours.load_state_dict(theirs.state_dict())
    assert int(ours.num_batches_tracked.to_host()) == 4
    compare_with_torch(ours, theirs, rng.standard_normal((2, 3, 4, 4)), rng)
    assert_same_state(ours, theirs)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_switched_to_untracked_statistics_keeps_them_as_pytorch(queue, rng,
                                                                           momentum):
    """track_running_stats set False after some training (the buffers kept), as a frozen
    fine-tune does: PyTorch then normalises with the batch's statistics in training and leaves
    the running ones and the count as they are, and evaluation uses them. parcl went on
    updating them: from x1 below the running mean became [0.735, 0.28, 0.29] where PyTorch
    keeps [0.15, 0.2, 0.1], and row 0 of the evaluation [0.222, 1.628, 2.430] for PyTorch's
    [0.823, 1.666, 2.611]."""
    x0 = np.array([[1, 2, 3], [3, 0, -1], [0, 4, 2], [2, 2, 0]], np.float64)
    x1 = np.array([[4, 0, 1], [6, 2, 1], [5, 1, 3], [9, 1, 3]], np.float64)
    ours = nn.BatchNorm1d(3, momentum=momentum)
    theirs = torch.nn.BatchNorm1d(3, momentum=momentum)
    compare_with_torch(ours, theirs, x0, rng)
    ours.track_running_stats = theirs.track_running_stats = False
    for x in (x1, 3 * x1):
        compare_with_torch(ours, theirs, x, rng)
        assert_same_state(ours, theirs)
    first = x0.mean(0) * (1.0 if momentum is None else momentum)    # x0's alone
    np.testing.assert_allclose(ours.running_mean.to_host(), first, rtol=1e-6)
    ours.eval(), theirs.eval()
    compare_with_torch(ours, theirs, x0, rng, train=False)
    assert_same_state(ours, theirs)


def test_a_captured_step_with_a_cumulative_batch_norm_stays_eager_and_counts_every_batch(
        queue, rng):
    """momentum=None reads its count back each training forward: the step cannot be replayed
    (a replay would keep the first count's weight), so it runs eagerly every time."""
    bn = nn.BatchNorm1d(3, momentum=None)

    def step(x):
        with tp.Tape() as tape:
            loss = tp.sum(bn(x))
        tape.backward(loss)
        return loss

    captured = tp.capture(step, queue)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    for x in xs:
        captured(pc.Tensor.from_host(queue, x))
    assert captured.replays == 0 and int(bn.num_batches_tracked.to_host()) == 4
    np.testing.assert_allclose(bn.running_mean.to_host(), np.mean([x.mean(0) for x in xs], 0),
                               rtol=1e-5, atol=1e-6)


def test_a_checkpoint_keeps_a_cumulative_batch_norms_count(queue, rng, tmp_path):
    def make():
        return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=None))

    model, x = make(), tp.tensor(rng.standard_normal((5, 3)).astype(np.float32))
    for _ in range(3):
        model(x)
    pc.save(tmp_path / "ckpt.safetensors", model, pc.optim.SGD(model.parameters(), lr=0.1))
    again = make()
    pc.load(tmp_path / "ckpt.safetensors", again, pc.optim.SGD(again.parameters(), lr=0.1))
    for k, v in model.state_dict().items():
        assert np.array_equal(again.state_dict()[k], v) and again.state_dict()[k].dtype == v.dtype
    assert int(again[1].num_batches_tracked.to_host()) == 3


def test_batch_norm_refuses_a_momentum_outside_zero_to_one(queue):
    with pytest.raises(ValueError, match="momentum"):
        nn.BatchNorm1d(3, momentum=1.5)


IN_CASES = [(nn.InstanceNorm1d, torch.nn.InstanceNorm1d, (3, 4, 7)),
            (nn.InstanceNorm1d, torch.nn.InstanceNorm1d, (4, 9)),
            (nn.InstanceNorm2d, torch.nn.InstanceNorm2d, (2, 4, 5, 3)),
            (nn.InstanceNorm2d, torch.nn.InstanceNorm2d, (4, 3, 6))]


@pytest.mark.parametrize("ours_cls,theirs_cls,shape", IN_CASES)
@pytest.mark.parametrize("kw", [dict(), dict(affine=True), dict(track_running_stats=True),
                                dict(affine=True, track_running_stats=True, momentum=0.3),
                                dict(track_running_stats=True, momentum=None)])
def test_instance_norm_matches_pytorch_in_training_and_evaluation(
        queue, rng, ours_cls, theirs_cls, shape, kw):
    ours, theirs = ours_cls(4, **kw), theirs_cls(4, **kw)
    assert repr(ours) == repr(theirs)
    if ours.affine:
        for p, q in ((ours.weight, theirs.weight), (ours.bias, theirs.bias)):
            q.data = torch.from_numpy(rng.standard_normal(4).astype(np.float32))
            p.value.copy_(pc.Tensor.from_host(queue, q.data.numpy()))
    for _ in range(2):
        compare_with_torch(ours, theirs, 1 + 2 * rng.standard_normal(shape), rng, tol=2e-5)
        assert_same_state(ours, theirs)
    ours.eval(), theirs.eval()
    compare_with_torch(ours, theirs, rng.standard_normal(shape), rng, tol=2e-5)
    assert_same_state(ours, theirs)


@pytest.mark.parametrize("ours_cls,theirs_cls,shape", IN_CASES[:3])
def test_instance_norm_switched_to_untracked_statistics_evaluates_as_pytorch(
        queue, rng, ours_cls, theirs_cls, shape):
    """track_running_stats set False after training (the buffers kept): PyTorch's evaluation
    then uses each input's own statistics (and, as its instance_norm does, still moves the
    running ones); parcl normalised with the running statistics, so an InstanceNorm1d's
    evaluation of an input around 3 came out around 3 where PyTorch's is centred at 0."""
    ours = ours_cls(4, affine=True, track_running_stats=True)
    theirs = theirs_cls(4, affine=True, track_running_stats=True)
    compare_with_torch(ours, theirs, 1 + 2 * rng.standard_normal(shape), rng, tol=2e-5)
    ours.track_running_stats = theirs.track_running_stats = False
    ours.eval(), theirs.eval()
    for _ in range(2):
        y, _ = compare_with_torch(ours, theirs, 3 + rng.standard_normal(shape), rng, tol=2e-5)
        assert_same_state(ours, theirs)
    assert abs(float(y.to_host().mean())) < 1e-5            # each channel centred at 0
    ours.train(), theirs.train()
    compare_with_torch(ours, theirs, 1 + 2 * rng.standard_normal(shape), rng, tol=2e-5)
    assert_same_state(ours, theirs)


def test_instance_norm_gradients_pass_finite_differences(queue, rng):
    norm = nn.InstanceNorm2d(3, affine=True)
    x = tp.tensor(rng.standard_normal((2, 3, 4, 3)).astype(np.float32), requires_grad=True)
    assert tp.gradcheck(lambda t: norm(t), [x], atol=2e-3)


def test_instance_norm_refuses_an_input_without_its_channels(queue):
    with pytest.raises(pc.ShapeError, match="expected input"):
        nn.InstanceNorm2d(4)(pc.Tensor.zeros(queue, (2, 3, 5, 5)))
    with pytest.raises(pc.ShapeError, match="expected input"):
        nn.InstanceNorm1d(4)(pc.Tensor.zeros(queue, (2, 4, 5, 5)))


@pytest.mark.parametrize("ours_cls,theirs_cls,shape", [
    (nn.InstanceNorm2d, torch.nn.InstanceNorm2d, (3, 4, 1, 1)),
    (nn.InstanceNorm1d, torch.nn.InstanceNorm1d, (3, 4, 1)),
    (nn.InstanceNorm1d, torch.nn.InstanceNorm1d, (4, 1))])
def test_instance_norm_refuses_one_spatial_element_where_it_uses_the_inputs_statistics_as_pytorch(
        queue, ours_cls, theirs_cls, shape):
    """A sample's channel of one element (InstanceNorm2d after global pooling) normalises to
    0 and its unbiased variance is 0/0: PyTorch refuses it in training, and with no running
    statistics in evaluation too, where parcl gave all zeros and, tracked, wrote NaN into
    running_var, silently. Refused, the running statistics left as they were; evaluation
    with running statistics normalises as PyTorch's."""
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    for kw in (dict(), dict(track_running_stats=True, affine=True)):
        ours, theirs = ours_cls(4, **kw), theirs_cls(4, **kw)
        with pytest.raises(ValueError, match="more than 1 spatial element"):
            theirs(torch.from_numpy(x))
        with pytest.raises(pc.ShapeError, match="more than 1 spatial element"):
            ours(pc.Tensor.from_host(queue, x))
        ours.eval(), theirs.eval()
        if kw:
            np.testing.assert_allclose(ours(pc.Tensor.from_host(queue, x)).to_host(),
                                       theirs(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
            np.testing.assert_array_equal(ours.running_var.to_host(), np.ones(4, np.float32))
        else:
            with pytest.raises(pc.ShapeError, match="more than 1 spatial element"):
                ours(pc.Tensor.from_host(queue, x))


@pytest.mark.parametrize("make", [
    lambda m: m.Upsample(scale_factor=2), lambda m: m.Upsample(size=(5, 3), mode="bilinear"),
    lambda m: m.Upsample(scale_factor=(1.5, 2), mode="bilinear", align_corners=True),
    lambda m: m.UpsamplingNearest2d(size=7), lambda m: m.UpsamplingBilinear2d(scale_factor=3),
    lambda m: m.PixelShuffle(2), lambda m: m.PixelUnshuffle(2)])
def test_resampling_layers_match_pytorch(queue, rng, make):
    ours, theirs = make(nn), make(torch.nn)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []
    compare_with_torch(ours, theirs, rng.standard_normal((2, 4, 6, 4)), rng, tol=2e-5)
