"""torch.Tensor's methods on raw ``pc.Tensor``s, the values ops return under ``tp.no_grad``
(evaluation, a model's ``generate``): ``size()``, ``transpose``, ``mT``, ``split``,
``masked_fill``, batched ``@``, ``contiguous``, ``dim``, ``numel``, ``tolist``, ``to`` and the
casts, each against torch and against a recorded Node's; last, a nanoGPT written the way its
users write it, whose evaluation forward and ``generate`` run under ``no_grad`` as torch's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import close, up
from parcl.errors import DeviceError, DTypeError, ShapeError
from parcl.tensor_methods import ElementCount


def test_size_called_gives_the_shape_and_read_gives_the_element_count(queue):
    t = up(queue, np.zeros((2, 3, 4)))
    B, T, C = t.size()
    assert (B, T, C) == (2, 3, 4) and t.size(-1) == 4 and t.size(0) == 2
    assert t.size == 24 and t.size * 4 == t.nbytes and isinstance(t.size, int)
    assert t.reshape(4, 6).size() == (4, 6) and up(queue, 5.0).size() == ()
    with pytest.raises(ShapeError, match=r"dim 3 is out of range .* \(2, 3, 4\)"):
        t.size(3)
    with pytest.raises(TypeError, match="dim must be an int"):
        t.size(1.0)


def test_size_is_one_shared_count_per_shape_and_float_sizes_stay_refused(queue):
    a, b = pc.Tensor.empty(queue, (5, 7)), pc.Tensor.empty(queue, [5, 7])
    assert a.size is b.size and type(a.size) is ElementCount and a.shape == b.shape == (5, 7)
    assert pc.Tensor.empty(queue, (np.int64(5), 7)).shape == (5, 7)
    for bad in ((5.0, 7), (5, -7)):
        with pytest.raises(ShapeError):
            pc.Tensor.empty(queue, bad)


def test_transpose_mT_and_swapaxes_match_pytorch(queue, rng):
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    t, ta = up(queue, a), torch.tensor(a)
    for d0, d1 in ((1, 2), (-2, -1), (0, 3), (2, 2)):
        np.testing.assert_array_equal(t.transpose(d0, d1).to_host(), ta.transpose(d0, d1))
    np.testing.assert_array_equal(t.mT.to_host(), ta.mT)
    np.testing.assert_array_equal(t.mH.to_host(), ta.mH)
    np.testing.assert_array_equal(t.swapaxes(0, 1).to_host(), ta.swapaxes(0, 1))
    assert up(queue, 2.0).transpose(0, -1).item() == 2.0          # a 0-d tensor, as torch's
    with pytest.raises(ShapeError, match="transpose: axis 4 is out of range"):
        t.transpose(1, 4)
    with pytest.raises(ShapeError, match="mT: a tensor of at least 2 dims"):
        _ = up(queue, np.ones(3)).mT


def test_transpose_of_a_recorded_node_and_of_its_value_are_the_same(queue, rng):
    a = rng.standard_normal((3, 4, 2)).astype(np.float32)
    x = tp.tensor(up(queue, a), requires_grad=True)
    recorded = x.transpose(0, 2)
    assert isinstance(recorded, tp.Node)
    np.testing.assert_array_equal(x.value.transpose(0, 2).to_host(), recorded.to_host())


def test_split_by_size_and_by_sections_matches_pytorch(queue, rng):
    a = rng.standard_normal((2, 5, 6)).astype(np.float32)
    t, ta = up(queue, a), torch.tensor(a)
    for size, dim in ((2, 1), ([1, 4], 1), (4, -1), (6, 2)):
        got, want = t.split(size, dim=dim), ta.split(size, dim=dim)
        assert isinstance(got, tuple) and len(got) == len(want)
        for p, tp_ in zip(got, want):
            np.testing.assert_array_equal(p.to_host(), tp_)
    with pytest.raises(ShapeError, match=r"sections \[1, 1\] must be non-negative"):
        t.split([1, 1], dim=1)
    with pytest.raises(ShapeError, match="split_size must be positive"):
        t.split(0)


def test_masked_fill_matches_pytorch(queue, rng):
    a = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    causal = np.tril(np.ones((3, 3), np.float32)).reshape(1, 1, 3, 3)
    t, ta = up(queue, a), torch.tensor(a)
    want = ta.masked_fill(torch.tensor(causal) == 0, float("-inf"))
    np.testing.assert_array_equal(t.masked_fill(up(queue, causal).eq(0), float("-inf")).to_host(),
                                  want)
    np.testing.assert_array_equal(t.masked_fill(causal == 0, float("-inf")).to_host(), want)
    np.testing.assert_array_equal(t.masked_fill(t > 0.5, up(queue, 7.0)).to_host(),
                                  ta.masked_fill(ta > 0.5, torch.tensor(7.0)))
    with pytest.raises(ShapeError, match=r"mask of shape \(1, 2, 3, 3\) does not broadcast"):
        t.masked_fill(np.ones((1, 2, 3, 3), bool), 0.0)
    with pytest.raises(ShapeError, match=r"masked_fill: shapes \(2, 2\) and \(2, 1, 3, 3\)"):
        t.masked_fill(np.ones((2, 2), bool), 0.0)
    with pytest.raises(ShapeError, match="value must be a number or a 0-d tensor"):
        t.masked_fill(t > 0, up(queue, np.ones(3)))


@pytest.mark.parametrize("a_shape,b_shape", [
    ((2, 3, 4, 5), (2, 3, 5, 4)),        # attention's q @ k^T
    ((2, 3, 4, 5), (5, 6)),              # a shared right operand
    ((6, 5), (2, 3, 5, 4)),              # a shared left operand
    ((2, 1, 4, 5), (1, 3, 5, 2)),        # broadcast batch dims
    ((5,), (2, 3, 5, 4)), ((2, 3, 4, 5), (5,)), ((3, 4, 5), (5, 2)), ((4, 5), (5, 3)),
])
def test_batched_matmul_matches_pytorch_and_the_recorded_product_bit_for_bit(queue, rng,
                                                                             a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    raw = up(queue, a) @ up(queue, b)
    close(raw.to_host(), (torch.tensor(a, dtype=torch.float64)
                          @ torch.tensor(b, dtype=torch.float64)).numpy())
    recorded = tp.tensor(up(queue, a), requires_grad=True) @ up(queue, b)
    assert isinstance(recorded, tp.Node)
    np.testing.assert_array_equal(raw.to_host(), recorded.to_host())


def test_batched_matmul_refuses_shapes_and_dtypes_as_tp_matmul(queue):
    with pytest.raises(ShapeError, match="matmul: batch sizes differ"):
        up(queue, np.ones((2, 3, 4))) @ up(queue, np.ones((3, 4, 2)))
    with pytest.raises(ShapeError, match="matmul: inner dimensions differ"):
        up(queue, np.ones((2, 2, 3, 4))) @ up(queue, np.ones((2, 2, 3, 4)))
    with pytest.raises(DTypeError, match="right operand .* int64"):
        up(queue, np.ones((2, 2, 3))) @ up(queue, np.ones((2, 3, 2)), np.int64)


def test_contiguous_dim_numel_tolist_match_pytorch(queue):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t, ta = up(queue, a), torch.tensor(a)
    assert t.contiguous() is t and t.dim() == ta.dim() == 2 and t.numel() == ta.numel() == 6
    assert t.tolist() == ta.tolist() and up(queue, 2.5).tolist() == 2.5


def test_to_and_the_casts_convert_as_pytorch(queue):
    a = np.array([[1.7, -2.2], [0.0, 3.9]], np.float32)
    t, ta = up(queue, a), torch.tensor(a)
    for got, want in ((t.long(), ta.long()), (t.int(), ta.int()), (t.to(np.int64), ta.long()),
                      (t.to("cpu", np.int32), ta.int()), (t.long().float(), ta.long().float())):
        np.testing.assert_array_equal(got.to_host(), want.numpy())
    labels = up(queue, [1, 2], np.int64)
    assert t.type_as(labels).dtype == np.int64 and labels.to(t).dtype == np.float32
    assert t.float() is t and t.to("cuda:0") is t and t.to(queue) is t
    copied = t.to(np.float32, copy=True)
    assert copied is not t and copied.tolist() == t.tolist()
    other = pc.new_queue(queue.device)
    with pytest.raises(DeviceError, match="is not this tensor's queue"):
        t.to(other)
    with pytest.raises(DTypeError, match="float32 to uint8 is not supported"):
        t.to(np.uint8)


# -- nanoGPT, written as its users write it, once with torch and once with parcl -------------
def _libraries():
    return {
        "parcl": SimpleNamespace(nn=pc.nn, softmax=tp.softmax, tril=tp.tril, ones=tp.ones,
                                 arange=lambda t: tp.arange(0, t, dtype=np.int64),
                                 cat=tp.cat, topk=tp.topk, multinomial=tp.multinomial,
                                 no_grad=tp.no_grad),
        "torch": SimpleNamespace(nn=torch.nn, softmax=torch.softmax, tril=torch.tril,
                                 ones=torch.ones, arange=lambda t: torch.arange(0, t),
                                 cat=torch.cat, topk=torch.topk,
                                 multinomial=torch.multinomial, no_grad=torch.no_grad),
    }


def _gpt(lib, vocab=11, block=8, n_layer=2, n_head=2, n_embd=8):
    nn = lib.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.mask = lib.tril(lib.ones(block, block)).view(1, 1, block, block)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
            q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
            v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T].eq(0), float("-inf"))
            y = lib.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(n_embd), Attention()
            self.ln_2, self.fc = nn.LayerNorm(n_embd), nn.Linear(n_embd, n_embd)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.fc(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab)

        def forward(self, idx):
            b, t = idx.size()
            x = self.wte(idx) + self.wpe(lib.arange(t))
            for block_ in self.h:
                x = block_(x)
            return self.lm_head(self.ln_f(x))

        def generate(self, idx, max_new_tokens, top_k):
            with lib.no_grad():
                for _ in range(max_new_tokens):
                    idx_cond = idx if idx.size(1) <= block else idx[:, -block:]
                    logits = self(idx_cond)[:, -1, :]
                    v, _ = lib.topk(logits, min(top_k, logits.size(-1)))
                    logits = logits.masked_fill(logits < v[:, -1:], -float("Inf"))
                    probs = lib.softmax(logits, dim=-1)
                    idx = lib.cat((idx, lib.multinomial(probs, num_samples=1)), dim=1)
            return idx

    return GPT()


def _gpt_pair():
    libs = _libraries()
    pc.nn.manual_seed(0)
    mine = _gpt(libs["parcl"])
    theirs = _gpt(libs["torch"])
    theirs.load_state_dict({k: torch.tensor(np.asarray(v))
                            for k, v in mine.state_dict().items()})
    return mine, theirs


def test_nanogpt_evaluation_under_no_grad_equals_the_recorded_forward_and_torch(queue, rng):
    mine, theirs = _gpt_pair()
    idx = rng.integers(0, 11, (3, 6))
    recorded = mine(tp.tensor(idx))
    assert isinstance(recorded, tp.Node)
    with tp.no_grad():
        raw = mine(tp.tensor(idx))
    assert type(raw) is pc.Tensor
    np.testing.assert_array_equal(raw.to_host(), recorded.to_host())     # the same bits
    close(raw.to_host(), theirs(torch.tensor(idx)).detach().numpy())


def test_nanogpt_generate_under_no_grad_picks_torchs_tokens(queue, rng):
    mine, theirs = _gpt_pair()
    idx = rng.integers(0, 11, (2, 3))
    tp.manual_seed(0)
    got = mine.generate(tp.tensor(idx), 7, top_k=1)        # past block: the window slides
    want = theirs.generate(torch.tensor(idx), 7, top_k=1)
    assert got.shape == (2, 10)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
