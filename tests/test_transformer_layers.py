"""pc.nn.TransformerEncoderLayer / TransformerEncoder / TransformerDecoderLayer /
TransformerDecoder against torch.nn's (torch's state dict loaded, dropout 0): outputs and
every gradient for norm_first, relu/gelu/callable activations, batch_first, unbatched
inputs and masks; state-dict keys; the layer copies (clone_module)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from xfmr_reference import compare, load_torch

import parcl as pc
import parcl.tape as tp
from parcl.errors import ParclError

D, H, F, L, S, B = 8, 2, 16, 5, 4, 3


def _enc_pair(**kw):
    torch.manual_seed(0)
    t = torch.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, **kw)
    return t, pc.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, **kw)


def _dec_pair(**kw):
    torch.manual_seed(0)
    t = torch.nn.TransformerDecoderLayer(D, H, F, dropout=0.0, **kw)
    return t, pc.nn.TransformerDecoderLayer(D, H, F, dropout=0.0, **kw)


def _x(rng, n=L, batch_first=False, batched=True):
    shape = (n, D) if not batched else ((B, n, D) if batch_first else (n, B, D))
    return rng.standard_normal(shape).astype(np.float32)


def _t(v):
    return torch.tensor(v) if isinstance(v, np.ndarray) else v


UPPER = np.triu(np.ones((L, L), bool), 1)
KPM = np.zeros((B, L), bool)
KPM[0, -2:] = True


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_matches_torch(queue, rng, norm_first, activation, batch_first):
    tm, pm = _enc_pair(activation=activation, norm_first=norm_first, batch_first=batch_first)
    assert list(pm.state_dict()) == list(tm.state_dict())
    x = _x(rng, batch_first=batch_first)
    masks = {"src_mask": UPPER, "src_key_padding_mask": KPM}

    def t_run(m, x):
        return m(x, **{k: _t(v) for k, v in masks.items()})

    def p_run(m, x):
        return m(x, **masks)
    compare(queue, tm, pm, [x], t_run, p_run)


@pytest.mark.parametrize("masks", [{}, {"src_mask": UPPER, "is_causal": True},
                                   {"src_mask": np.where(UPPER, -np.inf, 0).astype(np.float32)},
                                   {"src_key_padding_mask": np.array([0, 0, 1, 0, 1], bool)}],
                         ids=["none", "causal", "float", "kpm"])
def test_encoder_layer_unbatched_matches_torch(queue, rng, masks):
    tm, pm = _enc_pair(batch_first=True)
    x = _x(rng, batched=False)

    def t_run(m, x):
        return m(x, **{k: _t(v) for k, v in masks.items()})

    def p_run(m, x):
        return m(x, **masks)
    out, = compare(queue, tm, pm, [x], t_run, p_run)
    assert out.shape == (L, D)


def test_callable_activation_and_bias_false(queue, rng):
    torch.manual_seed(0)
    tm = torch.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, bias=False,
                                          activation=torch.nn.functional.silu)
    pm = pc.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, bias=False, activation=tp.silu)
    assert list(pm.state_dict()) == list(tm.state_dict())
    assert not any(k.endswith("bias") for k in pm.state_dict())

    def run(m, x):
        return m(x)
    compare(queue, tm, pm, [_x(rng)], run, run)
    # a Module activation is a child, as in torch (GELU has no parameters: no new keys)
    mod = pc.nn.TransformerEncoderLayer(D, H, F, activation=pc.nn.GELU())
    assert isinstance(dict(mod.named_children())["activation"], pc.nn.GELU)
    with pytest.raises(ParclError, match="relu/gelu"):
        pc.nn.TransformerEncoderLayer(D, H, F, activation="tanh")


def test_assigning_the_activation_takes_effect(queue, rng):
    # the ReLU fused into linear1 is chosen per call, not fixed at construction
    tm, pm = _enc_pair(activation="gelu")
    pm.activation = tp.relu
    tm.activation = torch.nn.functional.relu

    def run(m, x):
        return m(x)
    compare(queue, tm, pm, [_x(rng)], run, run)
    tm.activation = torch.nn.functional.gelu
    pm.activation = tp.gelu
    compare(queue, tm, pm, [_x(rng)], run, run)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_torch(queue, rng, norm_first):
    torch.manual_seed(0)
    tl = torch.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, norm_first=norm_first,
                                          activation="gelu")
    tm = torch.nn.TransformerEncoder(tl, 2, norm=torch.nn.LayerNorm(D),
                                     enable_nested_tensor=False)
    pl = pc.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, norm_first=norm_first,
                                       activation="gelu")
    pm = pc.nn.TransformerEncoder(pl, 2, norm=pc.nn.LayerNorm(D))
    assert list(pm.state_dict()) == list(tm.state_dict())
    # torch's layers start as copies of one layer; so do parcl's
    sd = pm.state_dict()
    np.testing.assert_array_equal(sd["layers.0.linear1.weight"], sd["layers.1.linear1.weight"])
    for masks in ({"mask": UPPER}, {"mask": UPPER, "src_key_padding_mask": KPM},
                  {"mask": UPPER, "is_causal": True}):
        def t_run(m, x, masks=masks):
            return m(x, **{k: _t(v) for k, v in masks.items()})

        def p_run(m, x, masks=masks):
            return m(x, **masks)
        tm.zero_grad()
        pm.zero_grad()
        compare(queue, tm, pm, [_x(rng)], t_run, p_run)


def test_encoder_layers_are_independent_copies(queue):
    layer = pc.nn.TransformerEncoderLayer(D, H, F)
    enc = pc.nn.TransformerEncoder(layer, 3)
    params = [p for m in enc.layers for p in m.parameters()]
    assert len({id(p) for p in params}) == len(params) == 3 * len(layer.parameters())
    assert not {id(p) for p in params} & {id(p) for p in layer.parameters()}
    enc.layers[1].linear1.weight.value.fill_(2.0)
    assert not np.any(enc.layers[0].linear1.weight.value.to_host() == 2.0)
    assert not np.any(layer.linear1.weight.value.to_host() == 2.0)
    assert enc.layers[2].self_attn.out_proj.weight.value.queue is layer.linear1.weight.value.queue
    assert type(enc.layers[0]) is pc.nn.TransformerEncoderLayer
    assert enc.layers[0]._modules["self_attn"] is enc.layers[0].self_attn


def test_clone_module_keeps_ties_buffers_and_flags(queue):
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=8, block_size=4, n_layer=1, n_head=2, n_embd=8)
    model.transformer.wpe.weight.requires_grad = False
    copy = pc.nn.clone_module(model)
    assert copy.lm_head.weight is copy.transformer.wte.weight
    assert copy.lm_head.weight is not model.lm_head.weight
    assert not copy.transformer.wpe.weight.requires_grad
    for (k, a), (k2, b) in zip(model.state_dict().items(), copy.state_dict().items()):
        assert k == k2
        np.testing.assert_array_equal(a, b)
    bn = pc.nn.BatchNorm1d(4)
    bn2 = pc.nn.clone_module(bn)
    assert bn2.running_mean is not bn.running_mean
    assert bn2._buffers["running_mean"] is bn2.running_mean
    bn2.running_mean.fill_(5.0)
    assert not bn.running_mean.to_host().any()


def test_cloned_layers_do_not_share_mutable_attributes(queue):
    """``TransformerEncoder(layer, n)`` of a layer holding a numpy array, a dataclass config
    and a set: ``clone_module`` shared them between the copies, so setting one layer's gain
    (``enc.layers[0].gain[:] = 3``) set every layer's, silently; PyTorch's ``copy.deepcopy``
    gives each copy its own. Functions and the queue stay shared."""
    @dataclasses.dataclass
    class Cfg:
        scale: float = 1.0

    class Layer(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = pc.nn.Linear(4, 4, queue=queue)
            self.gain, self.cfg, self.tags = np.ones(4, np.float32), Cfg(), {"a"}
            self.act = tp.relu

        def forward(self, x):
            return self.act(self.fc(x) * tp.tensor(self.gain * self.cfg.scale))

    enc = pc.nn.TransformerEncoder(Layer(), 2)
    first, second = enc.layers[0], enc.layers[1]
    first.gain[:] = 3.0
    first.cfg.scale = 5.0
    first.tags.add("b")
    np.testing.assert_array_equal(second.gain, np.ones(4, np.float32))
    assert second.cfg.scale == 1.0 and second.tags == {"a"}
    assert second.act is tp.relu and second.fc.weight.value.queue is queue


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_decoder_layer_matches_torch(queue, rng, norm_first, batch_first):
    tm, pm = _dec_pair(norm_first=norm_first, batch_first=batch_first)
    assert list(pm.state_dict()) == list(tm.state_dict())
    tgt, mem = _x(rng, L, batch_first), _x(rng, S, batch_first)
    mkpm = np.zeros((B, S), bool)
    mkpm[1, 0] = True
    masks = {"tgt_mask": UPPER, "tgt_is_causal": True, "memory_key_padding_mask": mkpm,
             "tgt_key_padding_mask": KPM}

    def t_run(m, tgt, mem):
        return m(tgt, mem, **{k: _t(v) for k, v in masks.items()})

    def p_run(m, tgt, mem):
        return m(tgt, mem, **masks)
    compare(queue, tm, pm, [tgt, mem], t_run, p_run)


def test_decoder_stack_matches_torch(queue, rng):
    torch.manual_seed(0)
    tm = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(D, H, F, dropout=0.0),
                                     2, norm=torch.nn.LayerNorm(D))
    pm = pc.nn.TransformerDecoder(pc.nn.TransformerDecoderLayer(D, H, F, dropout=0.0), 2,
                                  norm=pc.nn.LayerNorm(D))
    assert list(pm.state_dict()) == list(tm.state_dict())
    mem_mask = rng.standard_normal((L, S)).astype(np.float32)

    def t_run(m, tgt, mem):
        return m(tgt, mem, tgt_mask=torch.tensor(UPPER), memory_mask=torch.tensor(mem_mask))

    def p_run(m, tgt, mem):
        return m(tgt, mem, tgt_mask=UPPER, memory_mask=mem_mask)
    compare(queue, tm, pm, [_x(rng, L), _x(rng, S)], t_run, p_run)


def test_dropout_in_training_only(queue, rng):
    torch.manual_seed(0)
    tm = torch.nn.TransformerEncoderLayer(D, H, F, dropout=0.3).eval()
    pm = pc.nn.TransformerEncoderLayer(D, H, F, dropout=0.3)
    load_torch(pm, tm)
    x = _x(rng)
    xd = pc.Tensor.from_host(queue, x)
    with tp.no_grad():
        train_out = pm(xd).to_host()
        pm.eval()
        eval_out = pm(xd).to_host()
    with torch.no_grad():
        want = tm(torch.tensor(x)).numpy()
    np.testing.assert_allclose(eval_out, want, rtol=2e-5, atol=2e-5)
    assert not np.allclose(train_out, eval_out, atol=1e-3)


class _Classifier(pc.nn.Module):
    """Encoder (causal mask from numpy, uploaded each call), mean over positions, a head."""

    def __init__(self, queue):
        super().__init__()
        layer = pc.nn.TransformerEncoderLayer(D, H, F, dropout=0.0, batch_first=True,
                                              queue=queue)
        self.encoder = pc.nn.TransformerEncoder(layer, 2)
        self.head = pc.nn.Linear(D, 3, queue=queue)

    def forward(self, x):
        return self.head(tp.mean(self.encoder(x, mask=UPPER), axis=1))


@pytest.mark.parametrize("capture", [False, True])
def test_encoder_data_parallel_matches_one_replica(devices2, capture):
    from parcl.testing import seeded, train_replicated, train_single
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((8, L, D)).astype(np.float32),
             rng.integers(0, 3, size=8).astype(np.int64))
    build = seeded(_Classifier)
    ref = train_single(build, tp.cross_entropy, batch, 3, device=devices2[0])
    got = train_replicated(build, tp.cross_entropy, batch, 3, 2, devices=devices2,
                           capture=capture)
    assert len(got) == len(ref) == 2 * 12 + 2
    moved = False
    for a, b, p0 in zip(ref, got, [p.value.to_host() for p in build(None).parameters()]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
        moved |= not np.allclose(a, p0)
    assert moved


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_matches_torch(queue, rng, batch_first):
    torch.manual_seed(0)
    kw = dict(d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=1,
              dim_feedforward=F, dropout=0.0, batch_first=batch_first)
    tm, pm = torch.nn.Transformer(**kw), pc.nn.Transformer(**kw)
    assert list(pm.state_dict()) == list(tm.state_dict())
    causal = pc.nn.Transformer.generate_square_subsequent_mask(L)
    np.testing.assert_array_equal(causal, torch.nn.Transformer.generate_square_subsequent_mask(L))
    skpm = np.zeros((B, S), bool)
    skpm[2, -1] = True
    masks = {"tgt_mask": causal, "src_key_padding_mask": skpm,
             "memory_key_padding_mask": skpm, "tgt_key_padding_mask": KPM}

    def t_run(m, src, tgt):
        return m(src, tgt, **{k: _t(v) for k, v in masks.items()})

    def p_run(m, src, tgt):
        return m(src, tgt, **masks)
    compare(queue, tm, pm, [_x(rng, S, batch_first), _x(rng, L, batch_first)], t_run, p_run)
    with pytest.raises(RuntimeError):
        tm(torch.zeros(S, B, D) if not batch_first else torch.zeros(B, S, D),
           torch.zeros(L, B + 1, D) if not batch_first else torch.zeros(B + 1, L, D))
    with pytest.raises(pc.ShapeError, match="batch number"):
        shape = (L, B + 1, D) if not batch_first else (B + 1, L, D)
        pm(tp.tensor(_x(rng, S, batch_first)), tp.tensor(np.zeros(shape, np.float32)))


def test_transformer_initialisation_is_xavier_on_matrices():
    pc.nn.manual_seed(0)
    model = pc.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=1,
                              dim_feedforward=32)
    sd = model.state_dict()
    w = sd["encoder.layers.0.linear1.weight"]                 # (32, 16): Linear's default
    bound = np.sqrt(6 / (32 + 16))                             # re-drawn as xavier_uniform_
    assert bound * 0.9 < np.abs(w).max() <= bound and np.abs(w).max() > 1 / 4
    assert not sd["encoder.layers.0.self_attn.in_proj_bias"].any()
    assert np.all(sd["decoder.norm.weight"] == 1)
    # the copies of a layer start equal, then the re-draw makes them differ, as torch's
    assert not np.array_equal(w, sd["encoder.layers.1.linear1.weight"])


def test_transformer_redraws_a_custom_parts_conv_weight_with_xavier_over_its_receptive_field():
    # torch's _reset_parameters re-draws every p.dim() > 1, a (cout, cin, k) conv weight
    # too, with fans cin*k and cout*k; it used to be skipped (only 2-d), keeping the conv's
    # own U(-1/sqrt(cin*k), ..) bound 1/24 where torch's is sqrt(6/(2*64*9)) = 0.072
    pc.nn.manual_seed(0)
    model = pc.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=32, custom_encoder=pc.nn.Conv1d(64, 64, 9))
    w = model.state_dict()["encoder.weight"]
    bound = np.sqrt(6 / (64 * 9 + 64 * 9))
    assert bound * 0.95 < np.abs(w).max() <= bound
    assert np.isclose(w.std(), bound / np.sqrt(3), rtol=0.05)


@pytest.mark.parametrize("make", [_enc_pair, _dec_pair])
def test_a_forward_hook_on_linear1_sees_its_output_before_the_relu_as_pytorch(queue, rng, make):
    """The feed-forward block ran ReLU in linear1's GEMM even where linear1 held a hook, so a
    forward hook there saw the ReLU's output (its minimum 0.0 where PyTorch's is negative) and
    a hook replacing it skipped the ReLU. A hooked linear1 now runs on its own."""
    tm, pm = make()
    load_torch(pm, tm)
    for m in (tm, pm):
        m.seen = []
        m.linear1.register_forward_hook(
            lambda mod, args, out, m=m: (m.seen.append(out), -out)[1])
    x = _x(rng)
    args = (x,) if make is _enc_pair else (x, _x(rng, S))
    got = pm(*(pc.Tensor.from_host(queue, a) for a in args)).to_host()
    want = tm(*(torch.from_numpy(a) for a in args)).detach().numpy()
    np.testing.assert_allclose(pm.seen[0].to_host(), tm.seen[0].detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    assert pm.seen[0].to_host().min() < 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
