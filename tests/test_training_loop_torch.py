"""Data-parallel steps against PyTorch's single-process training on the same global batches:
gradient accumulation with a micro-batch count that changes from step to step, clipping of
the reduced gradient with a parameter frozen mid-run and a head no forward uses, and
synchronised batch norm on uneven shards with accumulation (running statistics, the eval
output). Two replicas; batches whose size neither the replicas nor the micro-batches divide."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup


def _batches(sizes, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n, features)).astype(np.float32) * 2 + 0.5,
             rng.integers(0, classes, n).astype(np.int64)) for n in sizes]


def _as_torch(model, state):
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
                          strict=False)            # parcl keeps no num_batches_tracked
    return model


def _bounds(n, k):
    each, extra = divmod(n, k)
    return [i * each + min(i, extra) for i in range(k + 1)]


class Net(pc.nn.Module):
    def __init__(self, queue):
        super().__init__()
        pc.nn.manual_seed(0)
        self.a = pc.nn.Linear(6, 8, queue=queue)
        self.b = pc.nn.Linear(8, 4, queue=queue)
        self.unused = pc.nn.Linear(3, 2, queue=queue)     # no gradient: left out, as torch

    def forward(self, x):
        return self.b(tp.relu(self.a(x)))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.unused = (torch.nn.Linear(6, 8), torch.nn.Linear(8, 4),
                                       torch.nn.Linear(3, 2))

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_accumulation_and_clipping_follow_pytorchs_full_batch_steps(devices2, capture):
    """Micro-batch counts 1, 3, 2, 3, 1, 6 over batches of 13, 7, 12, 9 ... samples; the
    reduced gradient clipped to 0.3 (its norm torch's clip_grad_norm_'s); ``a.weight``
    frozen from the fourth step (torch's optimizer then skips it, momentum and all)."""
    data = _batches([13, 13, 7, 12, 9, 13], 6, 4)
    accumulate = [1, 3, 2, 3, 1, 6]
    with ReplicaGroup(Net, devices2, capture=capture) as group:
        ref = _as_torch(TorchNet(), group.model.state_dict())
        opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        for i, ((x, y), k) in enumerate(zip(data, accumulate)):
            if i == 3:
                for r in group.replicas:
                    r.model.a.weight.requires_grad = False
                ref.a.weight.requires_grad = False
            loss = group.step(x, y, tp.cross_entropy, opt, accumulation_steps=k,
                              max_grad_norm=0.3)
            ref_opt.zero_grad()
            want = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            want.backward()
            norm = torch.nn.utils.clip_grad_norm_(
                [p for p in ref.parameters() if p.grad is not None], 0.3)
            ref_opt.step()
            assert loss == pytest.approx(want.item(), rel=1e-5)
            assert group.last_grad_norm == pytest.approx(float(norm), rel=1e-5)
        got = dict(group.named_parameters())
        for name, p in ref.named_parameters():
            np.testing.assert_allclose(got[name].value.to_host(), p.detach().numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=name)


def _bn_net(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(6, 5, queue=queue),
                            pc.nn.BatchNorm1d(5, momentum=0.3, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(5, 3, queue=queue))


def _torch_bn_net():
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5, momentum=0.3),
                               torch.nn.ReLU(), torch.nn.Linear(5, 3))


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_sync_batchnorm_on_uneven_shards_follows_pytorchs_global_batch(devices2,
                                                                       accumulation_steps):
    """Every micro-batch's batch norm normalises with the statistics of that micro-batch of
    every replica together: PyTorch's BatchNorm1d on their concatenation (as DDP with
    SyncBatchNorm and ``no_sync`` accumulation), running mean and unbiased variance with
    momentum 0.3, then the eval output from the running statistics."""
    k = accumulation_steps
    data = _batches([13, 9, 12, 16], 6, 3, seed=1)
    with ReplicaGroup(_bn_net, devices2, sync_batchnorm=True) as group:
        ref = _as_torch(_torch_bn_net(), group.model.state_dict())
        opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for x, y in data:
            group.step(x, y, tp.cross_entropy, opt, accumulation_steps=k)
            ref_opt.zero_grad()
            shards = _bounds(len(x), 2)
            micro = [[lo + b for b in _bounds(hi - lo, k)] for lo, hi in zip(shards, shards[1:])]
            for j in range(k):
                rows = np.concatenate([np.arange(m[j], m[j + 1]) for m in micro])
                loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x[rows])),
                                                         torch.from_numpy(y[rows]))
                (loss * len(rows) / len(x)).backward()
            ref_opt.step()
        got = {name: np.array(v) for name, v in group.model.state_dict().items()}
        group.eval()
        out = group.run(lambda r, xs: r.model(pc.Tensor.from_host(r.queue, xs)).to_host(),
                        [data[0][0]] * 2)
    ref.eval()
    for name, value in ref.state_dict().items():
        if name in got:
            np.testing.assert_allclose(got[name], value.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=name)
    want = ref(torch.from_numpy(data[0][0])).detach().numpy()
    for o in out:
        np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)


def test_batchnorm_without_sync_follows_ddp_running_statistics_of_replica_0(devices2):
    """Without ``sync_batchnorm`` each replica normalises with its own shard's statistics
    and the gradients are averaged (DDP without SyncBatchNorm); the running statistics are
    replica 0's, as DDP broadcasts rank 0's buffers at every forward."""
    data = _batches([8, 12, 6], 6, 3, seed=2)
    with ReplicaGroup(_bn_net, devices2) as group:
        ref = _as_torch(_torch_bn_net(), group.model.state_dict())
        opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for x, y in data:
            group.step(x, y, tp.cross_entropy, opt)
            ref_opt.zero_grad()
            other, half = copy.deepcopy(ref), len(x) // 2
            for model, rows in ((ref, slice(None, half)), (other, slice(half, None))):
                loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[rows])),
                                                         torch.from_numpy(y[rows]))
                (loss / 2).backward()
            for p, q in zip(ref.parameters(), other.parameters()):
                p.grad += q.grad
            ref_opt.step()
        got = [{n: np.array(v) for n, v in r.model.state_dict().items()}
               for r in group.replicas]
    for name, value in ref.state_dict().items():
        for state in got:
            if name in state:
                np.testing.assert_allclose(state[name], value.numpy(), rtol=1e-5, atol=1e-6,
                                           err_msg=name)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_an_optimizer_over_frozen_parameters_skips_them_until_they_are_unfrozen(devices2,
                                                                                capture):
    """Gradual unfreezing, as with PyTorch: ``a`` frozen before the optimizer is built over
    every parameter (its steps skip ``a``: no update, no weight decay, no momentum), then
    unfrozen at the third step and trained from there on. Frozen and unfrozen on
    ``group.model`` alone, as a DDP loop does on its one module: every replica follows."""
    data = _batches([10, 8, 12, 9, 11], 6, 4, seed=2)
    with ReplicaGroup(Net, devices2, capture=capture) as group:
        ref = _as_torch(TorchNet(), group.model.state_dict())
        group.model.a.requires_grad_(False)
        ref.a.requires_grad_(False)
        opt = pc.optim.AdamW(group.parameters(), lr=0.01, weight_decay=0.1)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
        frozen = group.model.a.weight.value.to_host()
        for i, (x, y) in enumerate(data):
            if i == 2:
                np.testing.assert_array_equal(group.model.a.weight.value.to_host(), frozen)
                group.model.a.requires_grad_(True)
                ref.a.requires_grad_(True)
            loss = group.step(x, y, tp.cross_entropy, opt)
            ref_opt.zero_grad()
            want = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            want.backward()
            ref_opt.step()
            assert loss == pytest.approx(want.item(), rel=1e-5)
        got = dict(group.named_parameters())
        for name, p in ref.named_parameters():
            np.testing.assert_allclose(got[name].value.to_host(), p.detach().numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_two_optimizers_each_step_their_part_on_its_own_gradients_as_pytorch(devices2, capture):
    """Two optimizers stepped in turn, each over a part of the model (a GAN's generator and
    discriminator, an embedding with its own optimizer), each part in buckets of its own
    (``bucket_mb`` small here, any model over 25 MB by default): every step's gradients are
    those of its batch alone, as PyTorch's loop that zeroes the model's gradients. The
    fused end of a step zeroed only the buckets its optimizer stepped, so the other part's
    gradients were added to its next step's."""
    data = _batches([12, 9, 10, 13, 8, 11], 6, 4, seed=3)
    with ReplicaGroup(Net, devices2, capture=capture, bucket_mb=1e-4) as group:
        ref = _as_torch(TorchNet(), group.model.state_dict())
        opts = [pc.optim.SGD(group.model.a.parameters(), lr=0.1),
                pc.optim.SGD(group.model.b.parameters(), lr=0.1)]
        ref_opts = [torch.optim.SGD(ref.a.parameters(), lr=0.1),
                    torch.optim.SGD(ref.b.parameters(), lr=0.1)]
        for i, (x, y) in enumerate(data):
            loss = group.step(x, y, tp.cross_entropy, opts[i % 2])
            ref.zero_grad()
            want = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            want.backward()
            ref_opts[i % 2].step()
            assert loss == pytest.approx(want.item(), rel=1e-5)
        got = dict(group.named_parameters())
        for name, p in ref.named_parameters():
            np.testing.assert_allclose(got[name].value.to_host(), p.detach().numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=name)


class AuxNet(pc.nn.Module):
    """A body with a main head and an auxiliary one; ``aux`` picks the head."""

    def __init__(self, queue):
        super().__init__()
        pc.nn.manual_seed(0)
        self.a, self.main, self.side = (pc.nn.Linear(6, 8, queue=queue),
                                        pc.nn.Linear(8, 4, queue=queue),
                                        pc.nn.Linear(8, 2, queue=queue))
        self.aux = False

    def forward(self, x):
        h = tp.relu(self.a(x))
        return self.side(h) if self.aux else self.main(h)


class TorchAuxNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.main, self.side = (torch.nn.Linear(6, 8), torch.nn.Linear(8, 4),
                                        torch.nn.Linear(8, 2))
        self.aux = False

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.side(h) if self.aux else self.main(h)


def _aux_backward(replica, x, y):
    replica.model.aux = True
    with tp.Tape() as tape:
        out = replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, x)))
        loss = tp.cross_entropy(out, pc.Tensor.from_host(replica.queue, y))
    tape.backward(loss)
    replica.model.aux = False


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_a_step_updates_what_a_run_before_it_gave_a_gradient_as_ddp(devices2, capture):
    """An auxiliary loss backwarded in a ``run`` (DDP's ``no_sync`` backward), then the main
    loss's ``group.step``, whose backward does not reach the auxiliary head: the step left
    out of the update every parameter its own backwards did not reach, so the run's
    gradient of the head was dropped: the head never moved and the body's weights were
    0.0085 off PyTorch's after three steps, silently. As DDP's synced backward, the update
    adds the mean of what the run left, the head's included."""
    data = _batches([12, 8, 10], 6, 4, seed=4)
    with ReplicaGroup(AuxNet, devices2, capture=capture) as group:
        ref = _as_torch(TorchAuxNet(), group.model.state_dict())
        opt = pc.optim.SGD(group.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for x, y in data:
            shards = _bounds(len(x), 2)
            rows = [slice(lo, hi) for lo, hi in zip(shards, shards[1:])]
            group.run(_aux_backward, [x[r] for r in rows], [y[r] % 2 for r in rows])
            group.step(x, y, tp.cross_entropy, opt)
            ref_opt.zero_grad()
            left = []
            for r in rows:                        # each replica's auxiliary backward
                other = copy.deepcopy(ref)
                other.aux = True
                torch.nn.functional.cross_entropy(other(torch.from_numpy(x[r])),
                                                  torch.from_numpy(y[r] % 2)).backward()
                left.append([p.grad for p in other.parameters()])
            torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)),
                                              torch.from_numpy(y)).backward()
            for p, *grads in zip(ref.parameters(), *left):
                if grads[0] is not None:
                    mean = sum(grads) / len(grads)
                    p.grad = mean if p.grad is None else p.grad + mean
            ref_opt.step()
        got = dict(group.named_parameters())
        for name, p in ref.named_parameters():
            np.testing.assert_allclose(got[name].value.to_host(), p.detach().numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=name)
