"""pc.nn.MultiheadAttention against torch.nn.MultiheadAttention (torch's state dict loaded):
outputs, attention weights and every gradient for batch_first and not, batched and
unbatched inputs, self- and cross-attention, kdim/vdim, bool, float, 3-d, causal and
key-padding masks; state-dict keys, initialisation, and errors where torch raises."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from xfmr_reference import compare, load_torch

import parcl as pc
import parcl.tape as tp
from parcl.errors import DTypeError, ParclError, ShapeError

E, H, L, S, B = 8, 2, 5, 4, 3


def _pair(**kw):
    torch.manual_seed(0)
    return (torch.nn.MultiheadAttention(E, H, **kw), pc.nn.MultiheadAttention(E, H, **kw))


def _seq(rng, batched, batch_first, n=L, e=E):
    shape = (n, e) if not batched else ((B, n, e) if batch_first else (n, B, e))
    return rng.standard_normal(shape).astype(np.float32)


def test_state_dict_keys_and_shapes_are_torchs():
    for kw in ({}, {"bias": False}, {"kdim": 6, "vdim": 4}, {"kdim": 6, "bias": False},
               {"add_bias_kv": True}, {"add_bias_kv": True, "kdim": 6}):
        tm, pm = _pair(**kw)
        want = {k: tuple(v.shape) for k, v in tm.state_dict().items()}
        got = {k: v.shape for k, v in pm.state_dict().items()}
        assert list(got) == list(want) and got == want, kw
        load_torch(pm, tm)          # loads without complaint, and back again
        tm.load_state_dict({k: torch.tensor(v) for k, v in pm.state_dict().items()})


def test_initialisation_is_torchs_scheme_and_seeded():
    pc.nn.manual_seed(3)
    a = pc.nn.MultiheadAttention(16, 4)
    pc.nn.manual_seed(3)
    b = pc.nn.MultiheadAttention(16, 4)
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k])
    w = sa["in_proj_weight"]
    bound = math.sqrt(6.0 / (16 + 48))                   # xavier_uniform_ on (3E, E)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound
    assert not sa["in_proj_bias"].any() and not sa["out_proj.bias"].any()
    out_bound = 1 / math.sqrt(16)                         # out_proj keeps Linear's default
    assert 0.8 * out_bound < np.abs(sa["out_proj.weight"]).max() <= out_bound
    pc.nn.manual_seed(4)
    assert not np.array_equal(pc.nn.MultiheadAttention(16, 4).state_dict()["in_proj_weight"], w)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_self_attention_matches_torch(queue, rng, batch_first, batched, need_weights, average):
    tm, pm = _pair(batch_first=batch_first)
    x = _seq(rng, batched, batch_first)

    def run(m, x):
        return m(x, x, x, need_weights=need_weights, average_attn_weights=average)
    out, w = compare(queue, tm, pm, [x], run, run)
    assert (w is None) == (not need_weights)
    if need_weights:
        lead = (() if not batched else (B,)) + (() if average else (H,))
        assert w.shape == lead + (L, L)
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
def test_cross_attention_matches_torch(queue, rng, batch_first):
    tm, pm = _pair(batch_first=batch_first)
    q, k, v = (_seq(rng, True, batch_first, n) for n in (L, S, S))

    def run(m, q, k, v):
        return m(q, k, v)
    out, w = compare(queue, tm, pm, [q, k, v], run, run)
    assert w.shape == (B, L, S)

    def run_kv(m, q, kv):           # key is value (torch's packed k/v projection)
        return m(q, kv, kv, need_weights=False)
    compare(queue, tm, pm, [q, k], run_kv, run_kv)


@pytest.mark.parametrize("batched", [True, False])
def test_kdim_vdim_matches_torch(queue, rng, batched):
    tm, pm = _pair(kdim=6, vdim=4)
    q, k, v = _seq(rng, batched, False), _seq(rng, batched, False, S, 6), \
        _seq(rng, batched, False, S, 4)
    for need in (True, False):
        def run(m, q, k, v, need=need):
            return m(q, k, v, need_weights=need)
        compare(queue, tm, pm, [q, k, v], run, run)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias_kv,zero_attn", [(True, False), (False, True), (True, True)])
def test_bias_kv_and_zero_attn_match_torch(queue, rng, batch_first, bias_kv, zero_attn):
    tm, pm = _pair(batch_first=batch_first, add_bias_kv=bias_kv, add_zero_attn=zero_attn)
    q, k = _seq(rng, True, batch_first), _seq(rng, True, batch_first, S)
    mask = rng.random((L, S)) < 0.3
    kpm = np.zeros((B, S), bool)
    kpm[1] = True                  # a whole row masked: only the added keys are left
    extra = int(bias_kv) + int(zero_attn)
    for need in (True, False):
        def t_run(m, q, k, need=need):
            return m(q, k, k, attn_mask=torch.tensor(mask), key_padding_mask=torch.tensor(kpm),
                     need_weights=need)

        def p_run(m, q, k, need=need):
            return m(q, k, k, attn_mask=mask, key_padding_mask=kpm, need_weights=need)
        tm.zero_grad()
        pm.zero_grad()
        out, w = compare(queue, tm, pm, [q, k], t_run, p_run)
        if need:
            assert w.shape == (B, L, S + extra) and w[:, :, S:].min() > 0
    if bias_kv:                    # torch's xavier_normal_: std 1/sqrt(E)
        pc.nn.manual_seed(0)
        big = pc.nn.MultiheadAttention(256, 4, add_bias_kv=True).bias_k.value.to_host()
        assert big.shape == (1, 1, 256) and abs(big.std() - 1 / 16) < 0.01


def _masks(rng):
    upper = np.triu(np.ones((L, L), bool), 1)
    kpm = np.zeros((B, L), bool)
    kpm[0, -2:] = True
    kpm[2, 0] = True
    return {
        "bool": {"attn_mask": upper},
        "float": {"attn_mask": rng.standard_normal((L, L)).astype(np.float32)},
        "float_inf": {"attn_mask": np.where(upper, -np.inf, 0.0).astype(np.float32)},
        "3d_bool": {"attn_mask": rng.random((B * H, L, L)) < 0.3},
        "kpm_bool": {"key_padding_mask": kpm},
        "kpm_float": {"key_padding_mask": np.where(kpm, -1e9, 0.5).astype(np.float32)},
        "both": {"attn_mask": upper, "key_padding_mask": kpm},
        "causal": {"attn_mask": upper, "is_causal": True},
        "causal_kpm": {"attn_mask": upper, "key_padding_mask": kpm, "is_causal": True},
        # torch's hint: without weights or padding it runs causal attention, not this mask
        "causal_hint": {"attn_mask": rng.standard_normal((L, L)).astype(np.float32),
                        "is_causal": True},
    }


@pytest.mark.parametrize("kind", list(_masks(np.random.default_rng(0))))
@pytest.mark.parametrize("need_weights", [True, False])
def test_masks_match_torch(queue, rng, kind, need_weights):
    masks = _masks(rng)[kind]
    if kind == "3d_bool":          # keep every row attending to something
        masks["attn_mask"][..., 0] = False
    tm, pm = _pair(batch_first=True)
    x = _seq(rng, True, True)

    def t_run(m, x):
        kw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in masks.items()}
        return m(x, x, x, need_weights=need_weights, **kw)

    def p_run(m, x):
        return m(x, x, x, need_weights=need_weights, **masks)
    compare(queue, tm, pm, [x], t_run, p_run)


def test_device_masks_and_unbatched_key_padding_match_torch(queue, rng):
    tm, pm = _pair()
    x = _seq(rng, False, False)
    kpm = np.array([False, True, False, False, True])
    upper = np.triu(np.ones((L, L), bool), 1)
    mask_dev = pc.Tensor.from_host(queue, upper)           # a boolean device mask

    def t_run(m, x):
        return m(x, x, x, key_padding_mask=torch.tensor(kpm), attn_mask=torch.tensor(upper))

    def p_run(m, x):
        return m(x, x, x, key_padding_mask=kpm, attn_mask=mask_dev)
    out, w = compare(queue, tm, pm, [x], t_run, p_run)
    assert w.shape == (L, L) and not w[:, [1, 4]].any()


def test_fully_masked_rows_match_torch(queue, rng):
    # torch: NaN with need_weights (its softmax of all -inf), the output bias without
    tm, pm = _pair(batch_first=True)
    load_torch(pm, tm)
    x = _seq(rng, True, True)
    kpm = np.zeros((B, L), bool)
    kpm[1] = True
    for need in (True, False):
        with torch.no_grad():
            want = tm(torch.tensor(x), torch.tensor(x), torch.tensor(x),
                      key_padding_mask=torch.tensor(kpm), need_weights=need)[0].numpy()
        with tp.no_grad():
            xd = pc.Tensor.from_host(queue, x)
            got = pm(xd, xd, xd, key_padding_mask=kpm, need_weights=need)[0].to_host()
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert np.isnan(got[1]).all() == need


def test_dropout_only_while_training(queue, rng):
    tm, pm = _pair(batch_first=True, dropout=0.5)
    tm.eval()
    pm.eval()
    x = _seq(rng, True, True)

    def run(m, x):
        return m(x, x, x)
    out_eval, w_eval = compare(queue, tm, pm, [x], run, run)
    pm.train()
    with tp.no_grad():
        xd = pc.Tensor.from_host(queue, x)
        out, w = (t.to_host() for t in pm(xd, xd, xd, average_attn_weights=False))
        out2 = pm(xd, xd, xd, need_weights=False)[0].to_host()
    zeros = (w == 0).mean()
    assert 0.3 < zeros < 0.7                          # about half the weights dropped
    kept = w[w != 0]
    assert np.all(kept > 0) and not np.allclose(out, out_eval)
    assert not np.allclose(out2, out_eval)


def test_no_grad_returns_raw_tensors(queue, rng):
    _, pm = _pair()
    xd = pc.Tensor.from_host(queue, _seq(rng, True, False))
    with tp.no_grad():
        out, w = pm(xd, xd, xd)
    assert isinstance(out, pc.Tensor) and isinstance(w, pc.Tensor)


def test_errors_where_torch_raises(queue, rng):
    with pytest.raises(AssertionError):
        torch.nn.MultiheadAttention(10, 3)
    with pytest.raises(ShapeError, match="divisible"):
        pc.nn.MultiheadAttention(10, 3)
    tm, pm = _pair()
    x = _seq(rng, True, False)
    xt, xd = torch.tensor(x), pc.Tensor.from_host(queue, x)
    upper = np.triu(np.ones((L, L), bool), 1)
    cases = [  # (torch kwargs, parcl kwargs, parcl error, torch error)
        ({"is_causal": True}, {"is_causal": True}, ParclError, RuntimeError),
        ({"attn_mask": torch.zeros(L, L + 1)}, {"attn_mask": np.zeros((L, L + 1), np.float32)},
         ShapeError, RuntimeError),
        ({"attn_mask": torch.zeros(2, L, L)}, {"attn_mask": np.zeros((2, L, L), np.float32)},
         ShapeError, RuntimeError),
        ({"attn_mask": torch.tensor(upper).int()}, {"attn_mask": upper.astype(np.int32)},
         DTypeError, AssertionError),
    ]
    for t_kw, p_kw, p_err, t_err in cases:
        with pytest.raises(t_err):
            tm(xt, xt, xt, **t_kw)
        with pytest.raises(p_err):
            pm(xd, xd, xd, **p_kw)
    with pytest.raises(ShapeError, match="embedding dimension"):
        pm(*(pc.Tensor.from_host(queue, np.ones((L, B, 6), np.float32)),) * 3)
    with pytest.raises(ShapeError, match="batch sizes"):
        other = pc.Tensor.from_host(queue, np.ones((L, B + 1, E), np.float32))
        pm(xd, other, other)
    with pytest.raises(ShapeError, match="key_padding_mask"):
        pm(xd, xd, xd, key_padding_mask=np.zeros((L,), bool))
    with pytest.raises(AssertionError):                # (S, B) for (B, S): torch refuses
        tm(xt, xt, xt, key_padding_mask=torch.zeros(L, B, dtype=torch.bool))
    with pytest.raises(ShapeError, match="key_padding_mask"):
        pm(xd, xd, xd, key_padding_mask=np.zeros((L, B), bool))


def test_captured_replays_follow_changing_masks(queue, rng):
    # masks given as step inputs: each replay reads the new ones, bit for bit the eager call's
    _, pm = _pair(batch_first=True)
    step = tp.capture(lambda x, kpm: pm(x, x, x, key_padding_mask=kpm, need_weights=False)[0],
                      queue)
    with tp.no_grad():
        for _ in range(3):
            x = _seq(rng, True, True)
            kpm = rng.random((B, L)) < 0.4
            kpm[:, 0] = False
            got = step(x, kpm, key=pc.nn.capture_key(pm)).to_host().copy()
            xd = pc.Tensor.from_host(queue, x)
            want = pm(xd, xd, xd, key_padding_mask=kpm, need_weights=False)[0].to_host()
            np.testing.assert_array_equal(got, want)
    assert step.replays == 2


@pytest.mark.parametrize("need_weights", [True, False])
def test_float_mask_gradient_matches_torch(queue, rng, need_weights):
    # a learnt additive mask (a relative-position bias): its gradient as torch's
    tm, pm = _pair()
    x = _seq(rng, True, False)
    bias = rng.standard_normal((B * H, L, L)).astype(np.float32)

    def run(m, x, bias):
        return m(x, x, x, attn_mask=bias, need_weights=need_weights)
    compare(queue, tm, pm, [x, bias], run, run)
