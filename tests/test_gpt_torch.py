"""pc.nn.GPT against nanoGPT's model.py, written here in torch (float64) with nanoGPT's module
structure and names: parcl's state dict loads into it by name (the tied head too), and the
logits, the loss (nanoGPT's targets-given path) and every parameter's gradient agree, with
and without biases; GPT.loss's ignored targets as nanoGPT's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import parcl as pc

VOCAB, BLOCK, LAYERS, HEADS, EMBD = 13, 8, 2, 2, 8


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD, bias=bias)
        self.c_proj = nn.Linear(EMBD, EMBD, bias=bias)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.c_attn(x).split(EMBD, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.c_fc = nn.Linear(EMBD, 4 * EMBD, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * EMBD, EMBD, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(EMBD, bias), CausalSelfAttention(bias)
        self.ln_2, self.mlp = LayerNorm(EMBD, bias), MLP(bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, EMBD), wpe=nn.Embedding(BLOCK, EMBD),
            h=nn.ModuleList([Block(bias) for _ in range(LAYERS)]), ln_f=LayerNorm(EMBD, bias)))
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss


def _pair(queue, bias):
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(VOCAB, BLOCK, LAYERS, HEADS, EMBD, bias=bias, queue=queue)
    ref = NanoGPT(bias).double()
    state = model.state_dict()
    assert list(state) == list(ref.state_dict())
    ref.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in state.items()})
    return model, ref


@pytest.mark.parametrize("bias", [True, False])
def test_logits_loss_and_every_gradient_match_nanogpt(queue, rng, bias):
    model, ref = _pair(queue, bias)
    idx = rng.integers(0, VOCAB, (3, 7))
    targets = rng.integers(0, VOCAB, (3, 7))
    want_logits, want_loss = ref(torch.tensor(idx), torch.tensor(targets))
    want_loss.backward()
    logits = model(idx)
    loss = pc.nn.GPT.loss(logits, pc.Tensor.from_host(queue, targets))
    loss.backward()
    np.testing.assert_allclose(logits.value.to_host(), want_logits.detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    assert float(loss.value.to_host()) == pytest.approx(want_loss.item(), rel=1e-5)
    grads = dict(ref.named_parameters())       # the tied weight once, as lm_head.weight
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(grads)
    for name, p in model.named_parameters():
        want = grads.get(name, grads.get(name.replace("transformer.wte", "lm_head")))
        np.testing.assert_allclose(p.grad.to_host(), want.grad.numpy(), rtol=1e-4,
                                   atol=2e-6, err_msg=name)


def test_ignored_targets_leave_the_mean_as_nanogpts(queue, rng):
    """nanoGPT ignores -1; GPT.loss ignores PyTorch's default -100 and refuses -1 (a label
    out of range), never counting it as a class."""
    model, ref = _pair(queue, True)
    idx = rng.integers(0, VOCAB, (2, 6))
    targets = rng.integers(0, VOCAB, (2, 6))
    targets[0, :4] = -1
    _, want = ref(torch.tensor(idx), torch.tensor(targets))
    ours = np.where(targets == -1, -100, targets)
    got = pc.nn.GPT.loss(model(idx), pc.Tensor.from_host(queue, ours))
    assert float(got.value.to_host()) == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(pc.errors.LabelError, match="-1"):
        float(pc.nn.GPT.loss(model(idx), pc.Tensor.from_host(queue, targets)).value.to_host())
