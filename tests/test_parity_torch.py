"""End-to-end training against PyTorch: the same model built in parcl and in torch (parcl's
initial state dict loaded into torch), trained on the same batches with the same optimizer,
schedule and clipping; the losses of every step and the final parameters agree.

One workload per test, a few steps each: a transformer classifier over padded sequences, GPT
data-parallel with nanoGPT's parameter groups and gradient accumulation, a CNN with batch norm
switched between training and evaluation and resumed from a checkpoint mid-run, and a masked
LSTM classifier on one replica and on two.

The key third of an attention layer's input bias gets no gradient but float32 noise (the
softmax of each query's scores does not change when a key bias adds the same ``q . b_k`` to all
of them), which Adam scales up to steps of the learning rate's size in both libraries alike;
those slices are compared with what Adam could have moved them by noise alone (about the
learning rate per step, so a bound of 2.5 times the sum of the rates the steps took)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.replica import ReplicaGroup
from test_gpt_torch import BLOCK, EMBD, HEADS, LAYERS, VOCAB, NanoGPT


def _to_torch(model, tmodel) -> None:
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in
                            model.state_dict().items()}, strict=False)


def _assert_same_parameters(state, tmodel, key_bias_dim=None, key_bias_tol=0.0):
    for name, want in tmodel.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        got, want = np.array(state[name]), want.detach().numpy()
        if key_bias_dim and name.endswith(("in_proj_bias", "c_attn.bias")):
            keys = slice(key_bias_dim, 2 * key_bias_dim)
            np.testing.assert_allclose(got[keys], want[keys], atol=key_bias_tol, err_msg=name)
            got, want = np.delete(got, np.r_[keys]), np.delete(want, np.r_[keys])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5, err_msg=name)


# -- a transformer classifier over padded sequences -------------------------------------------
V, T, D, C = 20, 10, 16, 5


class Classifier(pc.nn.Module):
    def __init__(self, norm_first: bool, activation: str):
        super().__init__()
        self.tok = pc.nn.Embedding(V, D, padding_idx=0)
        self.pos = pc.nn.Embedding(T, D)
        layer = pc.nn.TransformerEncoderLayer(D, 4, 32, dropout=0.0, activation=activation,
                                              batch_first=True, norm_first=norm_first)
        self.enc = pc.nn.TransformerEncoder(layer, 2,
                                            pc.nn.LayerNorm(D) if norm_first else None)
        self.head = pc.nn.Linear(D, C)

    def forward(self, idx, pad):
        q = self.head.weight.queue
        x = self.tok(pc.Tensor.from_host(q, idx))
        x = x + self.pos(pc.Tensor.from_host(q, np.arange(idx.shape[1])))
        h = self.enc(x, src_key_padding_mask=pad)
        keep = (~pad).astype(np.float32)                  # mean over the tokens not padded
        pooled = tp.sum(h * pc.Tensor.from_host(q, keep[..., None]), axis=1)
        return self.head(pooled / pc.Tensor.from_host(q, keep.sum(1, keepdims=True)))


class TorchClassifier(torch.nn.Module):
    def __init__(self, norm_first: bool, activation: str):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D, padding_idx=0)
        self.pos = torch.nn.Embedding(T, D)
        layer = torch.nn.TransformerEncoderLayer(D, 4, 32, dropout=0.0, activation=activation,
                                                 batch_first=True, norm_first=norm_first)
        self.enc = torch.nn.TransformerEncoder(layer, 2,
                                               torch.nn.LayerNorm(D) if norm_first else None,
                                               enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, C)

    def forward(self, idx, pad):
        idx = torch.from_numpy(idx)
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        h = self.enc(x, src_key_padding_mask=torch.from_numpy(pad))
        keep = torch.from_numpy((~pad).astype(np.float32))[..., None]
        return self.head((h * keep).sum(1) / keep.sum(1))


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_a_transformer_classifier_over_padded_sequences_trains_as_pytorch(queue, rng,
                                                                         norm_first,
                                                                         activation):
    pc.nn.manual_seed(0)
    model, ref = Classifier(norm_first, activation), TorchClassifier(norm_first, activation)
    _to_torch(model, ref)
    steps, warmup = 8, 3

    def warm_cosine(s):
        return min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))

    opt = pc.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.85, 0.98), weight_decay=0.05)
    topt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.85, 0.98), weight_decay=0.05)
    sched = pc.optim.lr_scheduler.LambdaLR(opt, warm_cosine)
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, warm_cosine)
    rates = []
    for _ in range(steps):
        lengths = rng.integers(3, T + 1, 8)
        pad = np.arange(T)[None] >= lengths[:, None]
        idx = np.where(pad, 0, rng.integers(1, V, (8, T)))
        y = rng.integers(0, C, 8)
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(idx, pad), pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        norm = pc.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        opt.zero_grad()
        want = torch.nn.functional.cross_entropy(ref(idx, pad), torch.from_numpy(y))
        topt.zero_grad()
        want.backward()
        want_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        topt.step()
        tsched.step()
        assert loss.item() == pytest.approx(want.item(), rel=1e-5)
        assert float(norm) == pytest.approx(want_norm.item(), rel=1e-4)
    _assert_same_parameters(model.state_dict(), ref, key_bias_dim=D,
                            key_bias_tol=2.5 * sum(rates))


# -- GPT, data-parallel, with nanoGPT's parameter groups --------------------------------------
def _nanogpt_groups(params, weight_decay):
    params = list(params)
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def test_gpt_trains_data_parallel_with_accumulation_and_clipping_as_nanogpt(devices2, rng):
    def build(q):
        pc.nn.manual_seed(0)
        return pc.nn.GPT(VOCAB, BLOCK, LAYERS, HEADS, EMBD, queue=q)

    ref = NanoGPT(True)
    steps = 6
    with ReplicaGroup(build, devices2, capture=True) as group:
        _to_torch(group.model, ref)
        opt = pc.optim.AdamW(_nanogpt_groups(group.parameters(), 0.1), lr=6e-3,
                             betas=(0.9, 0.95))
        topt = torch.optim.AdamW(_nanogpt_groups(ref.parameters(), 0.1), lr=6e-3,
                                 betas=(0.9, 0.95))
        sched = pc.optim.lr_scheduler.OneCycleLR(opt, max_lr=6e-3, total_steps=steps)
        tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=6e-3, total_steps=steps)
        rates = []
        for _ in range(steps):
            x, y = rng.integers(0, VOCAB, (2, 10, BLOCK))       # 5 rows a replica, 3 + 2
            rates.append(opt.param_groups[0]["lr"])
            loss = group.step(x, y, pc.nn.GPT.loss, opt, accumulation_steps=2,
                              max_grad_norm=1.0)
            sched.step()
            _, want = ref(torch.from_numpy(x), torch.from_numpy(y))
            topt.zero_grad()
            want.backward()
            want_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            topt.step()
            tsched.step()
            assert loss == pytest.approx(want.item(), rel=1e-5)
            assert float(group.last_grad_norm) == pytest.approx(want_norm.item(), rel=1e-4)
        _assert_same_parameters(group.model.state_dict(), ref, key_bias_dim=EMBD,
                                key_bias_tol=2.5 * sum(rates))


# -- a CNN with batch norm, evaluated and resumed mid-run -------------------------------------
def _cnn():
    pc.nn.manual_seed(0)
    nn = pc.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Dropout(0.0), nn.Conv2d(8, 12, 3, padding=1),
                         nn.BatchNorm2d(12, momentum=None), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(12, 4))


def _torch_cnn():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Dropout(0.0), nn.Conv2d(8, 12, 3, padding=1),
                         nn.BatchNorm2d(12, momentum=None), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(12, 4))


def _sgd(optim, params):
    opt = optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return opt, optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 6], gamma=0.3)


def _cnn_steps(queue, model, opt, sched, batches):
    """Train on each batch, evaluating on it after every other: the losses and outputs."""
    seen = []
    for i, (x, y) in batches:
        model.train()
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(x)), pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        sched.step()
        seen.append(loss.item())
        if i % 2:
            model.eval()
            with tp.no_grad():
                seen.append(np.asarray(model(pc.Tensor.from_host(queue, x))))
    return seen


def test_a_cnn_trains_evaluates_and_resumes_as_pytorch_and_as_the_uninterrupted_run(
        queue, rng, tmp_path):
    batches = list(enumerate((rng.standard_normal((6, 3, 10, 10)).astype(np.float32) + 0.3,
                              rng.integers(0, 4, 6)) for _ in range(8)))
    model, ref = _cnn(), _torch_cnn()
    _to_torch(model, ref)
    opt, sched = _sgd(pc.optim, model.parameters())
    full = _cnn_steps(queue, model, opt, sched, batches)
    topt, tsched = _sgd(torch.optim, ref.parameters())
    want = []
    for i, (x, y) in batches:
        ref.train()
        loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        topt.zero_grad()
        loss.backward()
        topt.step()
        tsched.step()
        want.append(loss.item())
        if i % 2:
            ref.eval()
            with torch.no_grad():
                want.append(ref(torch.from_numpy(x)).numpy())
    for got, expected in zip(full, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    _assert_same_parameters(model.state_dict(), ref)

    first = _cnn()
    opt1, sched1 = _sgd(pc.optim, first.parameters())
    _cnn_steps(queue, first, opt1, sched1, batches[:5])
    path = os.path.join(tmp_path, "cnn.safetensors")
    pc.save(path, first, opt1, step=5, scheduler=sched1)
    resumed = _cnn()
    opt2, sched2 = _sgd(pc.optim, resumed.parameters())
    pc.load(path, resumed, opt2, scheduler=sched2)
    rest = _cnn_steps(queue, resumed, opt2, sched2, batches[5:])
    for got, expected in zip(rest, full[-len(rest):], strict=True):
        np.testing.assert_array_equal(got, expected)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


# -- a masked LSTM classifier on one replica and on two ---------------------------------------
F, H, L = 5, 12, 7


class SequenceClassifier(pc.nn.Module):
    """x holds the features and, as its last channel, 1 where a step is not padding."""

    def __init__(self, queue=None):
        super().__init__()
        pc.nn.manual_seed(0)
        self.rnn = pc.nn.LSTM(F, H, num_layers=2, batch_first=True, queue=queue)
        self.fc = pc.nn.Linear(H, 3, queue=queue)

    def forward(self, x):
        out, _ = self.rnn(x[..., :F])
        keep = x[..., F:]
        return self.fc(tp.sum(out * keep, axis=1) / tp.sum(keep, axis=1))


class TorchSequenceClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(F, H, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(H, 3)

    def forward(self, x):
        out, _ = self.rnn(x[..., :F])
        keep = x[..., F:]
        return self.fc((out * keep).sum(1) / keep.sum(1))


def test_a_masked_lstm_trains_as_pytorch_on_one_replica_and_on_two(queue, devices2, rng):
    batches = []
    for _ in range(5):
        keep = (np.arange(L)[None] < rng.integers(2, L + 1, 9)[:, None]).astype(np.float32)
        x = rng.standard_normal((9, L, F)).astype(np.float32) * keep[..., None]
        batches.append((np.concatenate([x, keep[..., None]], -1), rng.integers(0, 3, 9)))
    model, ref = SequenceClassifier(), TorchSequenceClassifier()
    _to_torch(model, ref)
    opt = pc.optim.Adam(model.parameters(), lr=1e-2)
    topt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(tp.tensor(x)), pc.Tensor.from_host(queue, y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        want = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        topt.zero_grad()
        want.backward()
        topt.step()
        losses.append(loss.item())
        assert losses[-1] == pytest.approx(want.item(), rel=1e-5)
    _assert_same_parameters(model.state_dict(), ref)
    with ReplicaGroup(SequenceClassifier, devices2) as group:       # 9 rows: 5 + 4
        gopt = pc.optim.Adam(group.parameters(), lr=1e-2)
        got = [group.step(x, y, tp.cross_entropy, gopt) for x, y in batches]
        np.testing.assert_allclose(got, losses, rtol=1e-5)
        _assert_same_parameters(group.model.state_dict(), ref)
