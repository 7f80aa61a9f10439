"""Resampling, padding, pooling, convolution windows and embeddings: results that were
silently wrong, each checked against PyTorch (what it computes, or what it refuses)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from torch_reference import against_torch

WINDOW_CALLS = {
    "max_pool2d kernel_size": (lambda x, w: tp.max_pool2d(x, (2.5, 2)),
                               lambda x, w: F.max_pool2d(x, (2.5, 2))),
    "max_pool2d stride": (lambda x, w: tp.max_pool2d(x, 2, (1.5, 1)),
                          lambda x, w: F.max_pool2d(x, 2, (1.5, 1))),
    "max_pool2d dilation": (lambda x, w: tp.max_pool2d(x, 2, 1, 0, (1.5, 1)),
                            lambda x, w: F.max_pool2d(x, 2, 1, 0, (1.5, 1))),
    "avg_pool2d kernel_size": (lambda x, w: tp.avg_pool2d(x, (2.5, 2)),
                               lambda x, w: F.avg_pool2d(x, (2.5, 2))),
    "avg_pool2d padding": (lambda x, w: tp.avg_pool2d(x, 3, 1, (1.5, 1)),
                           lambda x, w: F.avg_pool2d(x, 3, 1, (1.5, 1))),
    "adaptive_avg_pool2d": (lambda x, w: tp.adaptive_avg_pool2d(x, (2.5, 2)),
                            lambda x, w: F.adaptive_avg_pool2d(x, (2.5, 2))),
    "conv2d stride": (lambda x, w: tp.conv2d(x, w, stride=(1.5, 1)),
                      lambda x, w: F.conv2d(x, w, stride=(1.5, 1))),
    "conv2d padding": (lambda x, w: tp.conv2d(x, w, padding=(1.5, 1)),
                       lambda x, w: F.conv2d(x, w, padding=(1.5, 1))),
    "conv2d dilation": (lambda x, w: tp.conv2d(x, w, dilation=(1.5, 1)),
                        lambda x, w: F.conv2d(x, w, dilation=(1.5, 1))),
    "conv_transpose2d stride": (lambda x, w: tp.conv_transpose2d(x, w, stride=(2.5, 2)),
                                lambda x, w: F.conv_transpose2d(x, w, stride=(2.5, 2))),
    "conv_transpose2d output_padding": (
        lambda x, w: tp.conv_transpose2d(x, w, stride=2, output_padding=(1.5, 1)),
        lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=(1.5, 1))),
    "MaxPool2d": (lambda x, w: pc.nn.MaxPool2d((2.5, 2))(x),
                  lambda x, w: torch.nn.MaxPool2d((2.5, 2))(x)),
    "AvgPool2d": (lambda x, w: pc.nn.AvgPool2d(2, (1.5, 1))(x),
                  lambda x, w: torch.nn.AvgPool2d(2, (1.5, 1))(x)),
    "AdaptiveAvgPool2d": (lambda x, w: pc.nn.AdaptiveAvgPool2d((2.5, 2))(x),
                          lambda x, w: torch.nn.AdaptiveAvgPool2d((2.5, 2))(x)),
}


@pytest.mark.parametrize("call", WINDOW_CALLS, ids=list(WINDOW_CALLS))
def test_a_float_in_a_window_pair_is_refused_not_truncated_as_pytorch(queue, call):
    """``tp.max_pool2d(x, (2.5, 2))`` pooled 2 x 2 windows (``int(2.5)``): on a 4 x 4 ramp
    [[5, 7], [13, 15]], where PyTorch refuses the float ('must be tuple of ints'); strides,
    paddings, dilations, output sizes and output paddings were truncated the same way."""
    ours, theirs = WINDOW_CALLS[call]
    a = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(TypeError):
        theirs(torch.from_numpy(a), torch.from_numpy(w))
    with pytest.raises(pc.ShapeError, match="must be an int or a pair of ints"):
        ours(tp.tensor(a), tp.tensor(w))


def test_window_pairs_of_any_integer_type_still_work(queue):
    x = tp.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(
        tp.max_pool2d(x, (np.int64(2), 2), stride=[2, np.int32(2)]).to_host()[0, 0],
        [[5, 7], [13, 15]])


def test_embedding_max_norm_with_norm_type_minus_inf_takes_the_least_magnitude_as_pytorch(queue):
    """PyTorch's -inf norm of a row is its least magnitude; parcl's renorm kernel took every
    infinite norm_type as +inf (the largest), so a row [3, -0.5, 2] under max_norm=1 was
    scaled to [1, -0.167, 0.667] where PyTorch leaves it (its -inf norm is 0.5), and [4, -2, 3]
    was scaled by 1/4 instead of 1/2."""
    table = np.array([[3.0, -0.5, 2.0], [4.0, -2.0, 3.0], [9.0, 9.0, 9.0]], np.float32)
    idx = np.array([[0, 1], [1, 0]])
    theirs = torch.nn.Embedding.from_pretrained(torch.from_numpy(table.copy()), freeze=False,
                                                max_norm=1.0, norm_type=float("-inf"))
    want = theirs(torch.from_numpy(idx))
    ours = pc.nn.Embedding(3, 3, max_norm=1.0, norm_type=float("-inf"))
    ours.load_state_dict({"weight": table})
    got = ours(pc.Tensor.from_host(queue, idx))
    np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours.weight.value.to_host(), theirs.weight.detach().numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(ours.weight.value.to_host()[:2],
                               [[3.0, -0.5, 2.0], [2.0, -1.0, 1.5]], rtol=1e-6)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_by_zero_in_every_mode_returns_new_memory_as_pytorch(queue, mode):
    """``tp.pad(x, (0, 0, 0, 0), mode="replicate")`` returned ``x`` itself (no dim moved, so
    no op ran), where PyTorch's F.pad returns a new tensor: ``y += 1`` under no_grad turned
    x's entries too, and ``relu(y, inplace=True)`` zeroed x's negative ones, so ``y + x`` of
    [[-1, 2], [3, -4]] came out [[0, 4], [6, 0]] where PyTorch gives [[-1, 4], [6, -4]]."""
    a = np.array([[[-1.0, 2.0], [3.0, -4.0]]], np.float32)
    x = tp.tensor(a)
    with tp.no_grad():
        y = tp.pad(x, (0, 0, 0, 0), mode=mode)
        y += 1
    np.testing.assert_array_equal(x.to_host(), a)
    np.testing.assert_array_equal(y.to_host(), a + 1)
    t = pc.Tensor.from_host(queue, a)
    tp.pad(t, (0, 0), mode=mode).fill_(7.0)
    np.testing.assert_array_equal(t.to_host(), a)

    x = tp.tensor(a, requires_grad=True)
    xt = torch.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        h = x * 1.0
        out = tp.relu(tp.pad(h, (0, 0), mode=mode), inplace=True) + h
        loss = tp.sum(out * out)
    tape.backward(loss)
    ht = xt * 1.0
    want = torch.relu_(F.pad(ht, (0, 0), mode=mode)) + ht
    (want * want).sum().backward()
    np.testing.assert_array_equal(out.to_host(), [[[-1.0, 4.0], [6.0, -4.0]]])
    np.testing.assert_array_equal(out.to_host(), want.detach().numpy())
    np.testing.assert_array_equal(x.grad.to_host(), xt.grad.numpy())


@pytest.mark.parametrize("shape,shuffle,r", [
    ((1, 2, 2, 2), "pixel_shuffle", 1), ((1, 2, 2, 2), "pixel_unshuffle", 1),
    ((2, 4, 1, 1), "pixel_shuffle", 2), ((2, 1, 2, 2), "pixel_unshuffle", 2)])
def test_pixel_shuffles_return_new_memory_as_pytorch(queue, shape, shuffle, r):
    """A factor of 1, or a 1 x 1 image shuffled up (and back), moves only size-1 dims, so the
    reshape-permute-reshape was a view of the input's buffer where PyTorch's shuffles return
    new memory: ``y += 1`` under no_grad added 1 to the input too ([0, 1, 2] became
    [1, 2, 3])."""
    a = np.arange(8, dtype=np.float32).reshape(shape)
    x = tp.tensor(a)
    want = getattr(F, shuffle)(torch.from_numpy(a), r).numpy()
    with tp.no_grad():
        y = getattr(tp, shuffle)(x, r)
        y += 1
    np.testing.assert_array_equal(x.to_host(), a)
    np.testing.assert_array_equal(y.to_host(), want + 1)
    t = pc.Tensor.from_host(queue, a)
    getattr(tp, shuffle)(t, r).fill_(7.0)
    np.testing.assert_array_equal(t.to_host(), a)


@pytest.mark.parametrize("pool,kw,length", [
    ("max_pool1d", dict(kernel_size=4, stride=3), 2),
    ("avg_pool1d", dict(kernel_size=4, stride=3), 2),
    ("avg_pool1d", dict(kernel_size=4, stride=3, count_include_pad=False), 2),
    ("max_pool1d", dict(kernel_size=6, stride=2, padding=1), 3),
    ("avg_pool1d", dict(kernel_size=6, stride=2, padding=1), 3),
    ("max_pool1d", dict(kernel_size=3, stride=2, padding=1, dilation=3), 4)])
def test_a_1d_pool_in_ceil_mode_over_a_window_longer_than_its_input_pools_as_pytorch(
        queue, rng, pool, kw, length):
    """With ceil_mode PyTorch pools a window longer than the (padded) input over what it
    covers; parcl's 1-D check refused every such window ('does not fit the input's length'),
    though the 2-D pools underneath give PyTorch's values and gradients."""
    against_torch(queue, rng, lambda t: getattr(tp, pool)(t, ceil_mode=True, **kw),
                  lambda t: getattr(F, pool)(t, ceil_mode=True, **kw),
                  [rng.standard_normal((2, 3, length))])


def test_pool1d_of_two_elements_in_ceil_mode_with_a_window_of_four_gives_pytorchs_values(queue):
    x = tp.tensor(np.array([[[1.0, 5.0]]], np.float32))
    np.testing.assert_array_equal(tp.max_pool1d(x, 4, 3, ceil_mode=True).to_host(), [[[5.0]]])
    np.testing.assert_array_equal(tp.avg_pool1d(x, 4, 3, ceil_mode=True).to_host(), [[[3.0]]])


def _embedding_model(max_norm):
    def build(queue):
        pc.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Embedding(8, 3, max_norm=max_norm, queue=queue),
                                pc.nn.Linear(3, 2, queue=queue))
    return build


def test_an_embedding_with_max_norm_on_several_replicas_is_refused_before_the_update(
        devices2):
    """Each replica rescaled the rows its share picked in its own copy of the weight, and the
    update, made on replica 0's copy and broadcast, dropped the rescale of the rows only
    replica 1 picked: with max_norm=1 a row replica 1 looked up kept a norm of 2.70 where the
    full batch's step leaves 1.03, and the second step's loss was 0.6978 where the full
    batch's is 0.6899, silently. Refused now, nothing changed; max_norm=None still steps."""
    from parcl.replica import ReplicaGroup
    x = np.arange(8)
    y = np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32)
    with ReplicaGroup(_embedding_model(1.0), devices2) as g:
        before = [p.value.to_host().copy() for p in g.parameters()]
        with pytest.raises(pc.ParclError, match="model.0 is an Embedding with max_norm=1.0"):
            g.step(x, y, tp.mse_loss, pc.optim.SGD(g.parameters(), lr=0.5))
        for p, b in zip(g.parameters(), before):
            np.testing.assert_array_equal(p.value.to_host(), b)
    with ReplicaGroup(_embedding_model(None), devices2) as g:
        g.step(x, y, tp.mse_loss, pc.optim.SGD(g.parameters(), lr=0.5))


@pytest.mark.parametrize("groups", [1, 3])
def test_channel_shuffle_of_1_or_c_groups_returns_new_memory_as_pytorch(queue, groups):
    """With 1 group, or as many groups as channels, the shuffle's permute moves only size-1
    dims, so the output was a view of the input's buffer where PyTorch's channel_shuffle
    returns new memory: ``y += 1`` under no_grad added 1 to the input too ([0, 1, 2] became
    [1, 2, 3]); the gradient is still the identity's."""
    a = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    x = tp.tensor(a)
    want = F.channel_shuffle(torch.from_numpy(a), groups).numpy()
    with tp.no_grad():
        y = tp.channel_shuffle(x, groups)
        y += 1
    np.testing.assert_array_equal(x.to_host(), a)
    np.testing.assert_array_equal(y.to_host(), want + 1)
    t = pc.Tensor.from_host(queue, a)
    pc.nn.ChannelShuffle(groups)(t).fill_(7.0)
    np.testing.assert_array_equal(t.to_host(), a)
    x = tp.tensor(a, requires_grad=True)
    g = np.arange(6, dtype=np.float32).reshape(1, 3, 2) * 0.5 - 1
    with tp.Tape() as tape:
        y = tp.channel_shuffle(x, groups)
    tape.backward(y, pc.Tensor.from_host(queue, g))
    np.testing.assert_array_equal(x.grad.to_host(), g)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("shuffle,shape,r", [("channel_shuffle", (1, 6, 2), 1),
                                             ("channel_shuffle", (1, 6, 2), 6),
                                             ("pixel_shuffle", (1, 8, 1, 1), 1),
                                             ("pixel_unshuffle", (1, 2, 2, 2), 2)])
def test_shuffles_of_integer_tensors_that_move_no_data_copy_them_as_pytorch(queue, dtype,
                                                                            shuffle, shape, r):
    """The copy that gives such shuffles new memory was an ``index_select``, float32 only, so
    channel_shuffle of an int64 tensor with 1 or C groups (and a pixel shuffle by 1) raised
    'index_select: input has dtype int64' where PyTorch returns the same values, new memory."""
    a = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    t = pc.Tensor.from_host(queue, a)
    y = getattr(tp, shuffle)(t, r)
    np.testing.assert_array_equal(y.to_host(), getattr(F, shuffle)(torch.from_numpy(a),
                                                                    r).numpy())
    assert y.dtype == dtype
    y.fill_(7)
    np.testing.assert_array_equal(t.to_host(), a)


def test_an_embedding_with_max_norm_on_several_replicas_is_refused_by_allreduce_grads_too(
        devices2):
    """A custom DDP loop (``group.run`` forward and backward, ``allreduce_grads``,
    ``opt.step()``) has the same flaw the step refuses: the next call copies replica 0's
    stepped weight to every replica, so the rows only replica 1 picked lost their rescale:
    with max_norm=0.5 their norms were 1.58, 2.75, 1.29 and 1.56 where the full batch leaves
    each within 0.51 of it, silently. Refused now, before anything is reduced."""
    from parcl.replica import ReplicaGroup

    def build(queue):
        pc.manual_seed(0)
        return pc.nn.Sequential(pc.nn.Embedding(6, 4, max_norm=0.5, queue=queue),
                                pc.nn.Flatten(), pc.nn.Linear(8, 3, queue=queue))

    x, y = np.array([[0, 1], [0, 1], [2, 3], [4, 5]]), np.array([0, 1, 2, 0])

    def forward_backward(r, ids, labels):
        with tp.Tape() as tape:
            out = r.model(tp.tensor(pc.Tensor.from_host(r.queue, ids)))
            loss = tp.cross_entropy(out, pc.Tensor.from_host(r.queue, labels))
        tape.backward(loss)

    with ReplicaGroup(build, devices2) as g:
        g.run(forward_backward, [x[:2], x[2:]], [y[:2], y[2:]])
        grads = [p.grad.to_host() for p in g.parameters()]
        with pytest.raises(pc.ParclError, match="allreduce_grads: model.0 is an Embedding"):
            g.allreduce_grads()
        for p, before in zip(g.parameters(), grads):
            np.testing.assert_array_equal(p.grad.to_host(), before)


def test_interpolate_of_a_spatial_dim_with_no_elements_is_refused_at_the_call_as_pytorch(queue):
    """``x[..., 4:]`` (a width of 0) to size (2, 2): the nearest and linear position tables
    picked index -1 of the empty dim, so the call returned a (2, 3, 2, 2) read from outside
    the input and only the deferred index check raised later ('index_select: index -1 ...
    out of range'), where PyTorch refuses at the call ('Input and output sizes should be
    greater than 0'); an empty batch or channel dim still gives the empty result."""
    x = tp.tensor(np.ones((2, 3, 4, 4), np.float32), requires_grad=True)
    for mode in ("nearest", "bilinear"):
        with tp.Tape(), pytest.raises(pc.ShapeError, match=r"interpolate: input of shape "
                                                           r"\(2, 3, 4, 0\) has a spatial dim"):
            tp.interpolate(x[..., 4:], size=(2, 2), mode=mode)
        with pytest.raises(RuntimeError, match="sizes should be greater than 0"):
            F.interpolate(torch.ones(2, 3, 4, 0), size=(2, 2), mode=mode)
    assert tp.interpolate(x[2:], size=(2, 2)).shape == (0, 3, 2, 2)
    assert tp.interpolate(x[:, 3:], scale_factor=2).shape == (2, 0, 8, 8)


@pytest.mark.parametrize("shape,scale", [((1, 2, 5), 2.1), ((2, 1, 5), 1.1),
                                         ((1, 2, 3, 5, 2), (1.1, 2.1, 1.0))],
                         ids=["1d-doubled", "1d-kept", "3d"])
def test_nearest_1d_and_3d_take_floor_of_dst_over_scale_factor_as_pytorch(queue, shape, scale):
    """PyTorch's 1-D and 3-D nearest kernels pick floor(dst / scale_factor) even where the
    output keeps or doubles the size; parcl took its 2-D kernel's shortcuts (copy, dst >> 1)
    there, so 5 positions at scale_factor=2.1 read [0, 0, 1, 1, 2, 2, 3, 3, 4, 4] where
    PyTorch reads [0, 0, 0, 1, 1, 2, 2, 3, 3, 4], and at 1.1 [0, 1, 2, 3, 4] where PyTorch
    reads [0, 0, 1, 2, 3]. The gradient is that of those picks (PyTorch's CPU backward
    keeps the shortcuts, unlike its forward)."""
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    want = F.interpolate(torch.from_numpy(x), scale_factor=scale, mode="nearest").numpy()
    node = tp.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = tp.interpolate(node, scale_factor=scale, mode="nearest")
        loss = tp.sum(y * 1.0)
    np.testing.assert_array_equal(y.to_host(), want)
    if shape == (1, 2, 5) and scale == 2.1:
        np.testing.assert_array_equal(want[0, 0], [0, 0, 0, 1, 1, 2, 2, 3, 3, 4])
    tape.backward(loss)
    picks = np.bincount(want.astype(np.int64).ravel(), minlength=x.size).reshape(shape)
    np.testing.assert_array_equal(node.grad.to_host(), picks)      # each pick adds 1


def test_nearest_2d_keeps_pytorchs_2d_shortcuts(queue):
    x = np.arange(10, dtype=np.float32).reshape(1, 1, 2, 5)
    want = F.interpolate(torch.from_numpy(x), scale_factor=(1.1, 2.1), mode="nearest")
    got = tp.interpolate(tp.tensor(x), scale_factor=(1.1, 2.1), mode="nearest").to_host()
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(got[0, 0, 0], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
