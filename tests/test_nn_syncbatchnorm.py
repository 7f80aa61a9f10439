"""``nn.SyncBatchNorm`` and ``SyncBatchNorm.convert_sync_batchnorm``: a plain batch norm on its
own (as PyTorch's on one process), the global batch's statistics in a ``ReplicaGroup`` through
the group's ``sync_batchnorm`` exchange (for those layers alone when the group was not asked to
sync every batch norm), PyTorch's conversion and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf
from parcl.replica import ReplicaGroup
from parcl.testing import seeded


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 4), (2, 3, 2, 3, 2)])
def test_sync_batchnorm_outside_a_group_is_a_batch_norm_as_pytorch(queue, rng, shape):
    x0 = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    layer = pc.nn.SyncBatchNorm(3, momentum=0.2)
    ref = torch.nn.BatchNorm1d(3, momentum=0.2).double()      # any (N, C, *) in float64
    x = leaf(queue, x0)
    with tp.Tape() as tape:
        y = layer(x)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tx = torch.tensor(x0.reshape(shape[0], 3, -1), dtype=torch.float64, requires_grad=True)
    want = ref(tx)
    (want * torch.tensor(g.reshape(tx.shape), dtype=torch.float64)).sum().backward()
    close(y.to_host(), want.detach().numpy().reshape(shape))
    close(x.grad.to_host(), tx.grad.numpy().reshape(shape))
    close(layer.weight.grad.to_host(), ref.weight.grad.numpy())
    close(layer.running_mean.to_host(), ref.running_mean.numpy(), 1e-5)
    close(layer.running_var.to_host(), ref.running_var.numpy(), 1e-5)
    layer.eval(), ref.eval()
    close(layer(tp.tensor(x0)).to_host(), ref(tx).detach().numpy().reshape(shape))


def test_convert_sync_batchnorm_swaps_batch_norms_keeping_their_tensors_as_pytorch(queue):
    model = pc.nn.Sequential(pc.nn.Conv2d(3, 4, 3), pc.nn.BatchNorm2d(4), pc.nn.ReLU(),
                             pc.nn.Sequential(pc.nn.Flatten(), pc.nn.BatchNorm1d(4 * 4 * 4,
                                                                               momentum=None)))
    model[1].eval()
    keys, weight = list(model.state_dict()), model[1].weight
    mean, count = model[1].running_mean, model[3][1].num_batches_tracked
    converted = pc.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted is model and list(converted.state_dict()) == keys
    assert [type(m).__name__ for m in model.modules()].count("SyncBatchNorm") == 2
    assert model[1].weight is weight and model[1].running_mean is mean
    assert model[3][1].num_batches_tracked is count and model[3][1].momentum is None
    assert not model[1].training and model[3][1].training
    lone = pc.nn.BatchNorm2d(5, affine=False)
    synced = pc.nn.SyncBatchNorm.convert_sync_batchnorm(lone)
    assert isinstance(synced, pc.nn.SyncBatchNorm) and synced is not lone
    assert synced.weight is None and synced.running_var is lone.running_var
    assert repr(synced) == repr(torch.nn.SyncBatchNorm.convert_sync_batchnorm(
        torch.nn.BatchNorm2d(5, affine=False)))


def test_a_converted_resnet_block_keeps_its_fused_residual_batch_norm(queue, rng):
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    pc.nn.manual_seed(0)
    block = pc.nn.BasicBlock(4, 8, stride=2)
    want = block(tp.tensor(x)).to_host()
    synced = pc.nn.SyncBatchNorm.convert_sync_batchnorm(block)
    assert isinstance(synced.bn2, pc.nn.SyncBatchNorm)          # bn2(out, residual=, relu=)
    np.testing.assert_array_equal(synced(tp.tensor(x)).to_host(), want)


def test_sync_batchnorm_refuses_what_it_cannot_do_naming_the_layer(queue):
    with pytest.raises(pc.ParclError, match="SyncBatchNorm: process_group is not supported"):
        pc.nn.SyncBatchNorm(3, process_group=object())
    layer = pc.nn.SyncBatchNorm(3)
    with pytest.raises(pc.ShapeError, match=r"SyncBatchNorm\(3, .*\): expected at least 2D "
                                            r"input \(got 1D input"):
        layer(tp.tensor(np.ones(3, np.float32)))
    with pytest.raises(pc.ShapeError, match=r"input has 4 features/channels at dim 1"):
        layer(tp.tensor(np.ones((2, 4), np.float32)))


def bn_cnn(queue, sync_first=False, sync_second=False):
    """A CNN with a 2-d and a 1-d batch norm, either of them a SyncBatchNorm."""
    first = pc.nn.SyncBatchNorm if sync_first else pc.nn.BatchNorm2d
    second = pc.nn.SyncBatchNorm if sync_second else pc.nn.BatchNorm1d
    return pc.nn.Sequential(pc.nn.Conv2d(1, 4, 3, padding=1, bias=False, queue=queue),
                            first(4, queue=queue), pc.nn.ReLU(), pc.nn.Flatten(),
                            pc.nn.Linear(4 * 8 * 8, 5, bias=False, queue=queue),
                            second(5, queue=queue))


def bn_run(devices, build, steps=2, **options):
    rng = np.random.default_rng(3)
    x = rng.random((10, 1, 8, 8), dtype=np.float32) * 3 + 1
    y = rng.integers(0, 5, 10)
    with ReplicaGroup(seeded(build), devices, **options) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.1)
        losses = [group.step(x, y, tp.cross_entropy, opt) for _ in range(steps)]
        params = [p.value.to_host() for p in group.parameters()]
        stats = [[b.to_host() for _, b in r.model.named_buffers()] for r in group.replicas]
    return losses, params, stats


def test_sync_batchnorm_layers_in_a_group_use_the_global_batch_as_sync_batchnorm_true(devices2):
    ref = bn_run(devices2[:1], bn_cnn)                      # one replica: the full batch
    synced = bn_run(devices2, lambda q: pc.nn.SyncBatchNorm.convert_sync_batchnorm(bn_cnn(q)))
    flagged = bn_run(devices2, bn_cnn, sync_batchnorm=True)
    close(synced[0], ref[0])
    for a, b, c in zip(ref[1], synced[1], flagged[1]):
        close(b, a, 1e-4)
        np.testing.assert_array_equal(b, c)               # the one exchange, bit for bit
    for copy in synced[2]:                                 # every replica's statistics
        for a, b in zip(ref[2][0], copy):
            close(b, a, 1e-4)


def test_a_group_syncs_only_its_sync_batchnorm_layers_unless_asked_for_all(devices2):
    # one step: after it the parameters differ (the plain layer's shards), and so would the
    # next step's statistics
    ref = bn_run(devices2[:1], bn_cnn, steps=1)
    plain = bn_run(devices2, bn_cnn, steps=1)              # each replica its own shard
    mixed = bn_run(devices2, lambda q: bn_cnn(q, sync_first=True), steps=1)
    first, second = slice(0, 2), slice(2, 4)               # each layer's running mean, var
    for a, b in zip(ref[2][0][first], mixed[2][0][first]):
        close(b, a, 1e-5)                                  # the SyncBatchNorm: full batch
    for a, b in zip(ref[2][0][second], mixed[2][0][second]):
        assert not np.allclose(b, a, rtol=1e-3)            # the BatchNorm1d: its shard's
    assert not all(np.allclose(a, b, rtol=1e-3) for a, b in zip(ref[2][0], plain[2][0]))
    all_synced = bn_run(devices2, lambda q: bn_cnn(q, sync_first=True), steps=1,
                        sync_batchnorm=True)
    for a, b in zip(ref[2][0], all_synced[2][0]):
        close(b, a, 1e-5)


@pytest.mark.parametrize("layer, sync_batchnorm", [(pc.nn.SyncBatchNorm, False),
                                                   (pc.nn.SyncBatchNorm, True),
                                                   (pc.nn.BatchNorm1d, True)])
def test_a_batch_norm_in_evaluation_normalises_with_its_own_batch_as_pytorch(
        devices2, layer, sync_batchnorm):
    # PyTorch's SyncBatchNorm never syncs in eval() (and ReplicaGroup(sync_batchnorm=True)
    # makes every batch norm one); without running statistics it normalises with each
    # process's batch. parcl exchanged there, so replica 0's shard [1, 2] of [1, 2, 5, 9]
    # came out [-1.04, -0.72], the full batch's, not [-1, 1]
    x = np.array([1.0, 2.0, 5.0, 9.0], np.float32).reshape(4, 1)
    build = seeded(lambda q: pc.nn.Sequential(
        layer(1, affine=False, track_running_stats=False, queue=q)))
    with ReplicaGroup(build, devices2, sync_batchnorm=sync_batchnorm) as group:
        for r in group.replicas:
            r.model.eval()
        shards = [pc.Tensor.from_host(r.queue, x[2 * i:2 * i + 2])
                  for i, r in enumerate(group.replicas)]
        outs = group.run(lambda r, shard: r.model(tp.tensor(shard)).to_host(), shards)
    for i, out in enumerate(outs):
        want = torch.nn.functional.batch_norm(torch.tensor(x[2 * i:2 * i + 2]), None, None,
                                              training=True)
        close(out, want.numpy(), 1e-5)
