"""scaled_dot_product_attention's grouped-query attention (``enable_gqa=True``) and the batch
dimensions of q, k and v broadcasting against each other, as PyTorch's: values and the
gradients of q, k, v and a float mask against torch, finite differences, the head each query
head reads, dropout, and the shapes refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl.tape.ops.attention_batch import layout


def _mask(kind, rng, tq, tk):
    if kind == "bool":
        m = rng.random((tq, tk)) < 0.6
        m[:, 0] = True                               # no fully masked row
        return m
    if kind == "float":
        return rng.standard_normal((1, tq, tk)).astype(np.float32)
    return None


def _against_torch(queue, rng, q_shape, k_shape, v_shape, kind=None, enable_gqa=False):
    """Forward and every gradient (a float mask's too) of parcl and torch on the same data."""
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, k_shape, v_shape))
    mask = _mask(kind, rng, q_shape[-2], k_shape[-2])
    causal = kind == "causal"
    nodes = [leaf(queue, x) for x in (q, k, v)]
    nm = leaf(queue, mask) if kind == "float" else mask
    with tp.Tape() as tape:
        y = tp.scaled_dot_product_attention(*nodes, attn_mask=nm, is_causal=causal,
                                            enable_gqa=enable_gqa)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(queue, g))
    ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    tm = None if mask is None else torch.tensor(mask, requires_grad=kind == "float")
    want = F.scaled_dot_product_attention(*ts, attn_mask=tm, is_causal=causal,
                                          enable_gqa=enable_gqa)
    want.backward(torch.tensor(g))
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    pairs = list(zip(nodes, ts)) + ([(nm, tm)] if kind == "float" else [])
    for node, t in pairs:
        assert node.grad.shape == tuple(t.shape)
        np.testing.assert_allclose(node.grad.to_host(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


GQA = [((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)),            # 2 query heads per kv head
       ((2, 4, 6, 8), (2, 1, 6, 8), (2, 1, 6, 8)),            # multi-query: one kv head
       ((2, 6, 3, 8), (2, 2, 5, 8), (2, 3, 5, 4)),            # k and v head counts differ
       ((6, 3, 8), (3, 4, 8), (3, 4, 8)),                     # unbatched (H, T, D)
       ((4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)),               # q unbatched, k and v not
       ((2, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)),            # and k, v broadcast over B
       ((3, 1, 4, 3, 8), (1, 2, 2, 5, 8), (3, 1, 2, 5, 8))]   # 5-D, everything broadcast


@pytest.mark.parametrize("kind", [None, "causal", "bool", "float"])
@pytest.mark.parametrize("shapes", GQA, ids=str)
def test_grouped_query_attention_and_its_gradients_are_pytorchs(queue, rng, shapes, kind):
    _against_torch(queue, rng, *shapes, kind=kind, enable_gqa=True)


BROADCAST = [((2, 4, 3, 8), (1, 4, 5, 8), (1, 4, 5, 8)),      # k, v shared by the batch
             ((1, 4, 3, 8), (2, 4, 5, 8), (2, 4, 5, 8)),      # q shared
             ((2, 4, 3, 8), (1, 4, 5, 8), (2, 1, 5, 6)),      # k and v broadcast apart
             ((4, 3, 8), (2, 4, 5, 8), (2, 4, 5, 8)),         # q of fewer dimensions
             ((2, 4, 3, 8), (5, 8), (5, 8)),                  # one k, v for all
             ((2, 4, 3, 8), (2, 1, 5, 8), (2, 1, 5, 8))]      # one head of k, v, no GQA flag


@pytest.mark.parametrize("kind", [None, "causal", "float"])
@pytest.mark.parametrize("shapes", BROADCAST, ids=str)
def test_broadcast_batch_dimensions_and_their_gradients_are_pytorchs(queue, rng, shapes, kind):
    _against_torch(queue, rng, *shapes, kind=kind)


def test_query_head_h_reads_key_value_head_h_over_the_group_size_as_repeat_interleave(queue,
                                                                                     rng):
    """Value head j holds j + 1 everywhere: every attention of query head h averages its kv
    head's value, so the output is h // (Hq / Hkv) + 1 (torch's repeat_interleave)."""
    q = rng.standard_normal((1, 6, 4, 8)).astype(np.float32)
    k = rng.standard_normal((1, 3, 5, 8)).astype(np.float32)
    v = np.broadcast_to(np.arange(1, 4, dtype=np.float32)[:, None, None], (1, 3, 5, 2))
    y = tp.scaled_dot_product_attention(*(pc.Tensor.from_host(queue, np.ascontiguousarray(x))
                                          for x in (q, k, v)), enable_gqa=True)
    assert y.shape == (1, 6, 4, 2)
    np.testing.assert_allclose(y.to_host()[0, :, 0, 0], [1, 1, 2, 2, 3, 3], rtol=1e-6)
    kr, vr = (np.repeat(x, 2, axis=1) for x in (k, v))     # the same as k, v repeated
    want = tp.scaled_dot_product_attention(*(pc.Tensor.from_host(queue, np.ascontiguousarray(x))
                                             for x in (q, kr, vr)))
    np.testing.assert_allclose(y.to_host(), want.to_host(), rtol=1e-6, atol=1e-6)


def test_grouped_query_attention_folds_query_heads_into_rows_without_copying_k_and_v():
    """GQA's group and multi-query's heads become GEMM rows: k and v are read as they are."""
    lay = layout((2, 8, 3, 16), (2, 2, 5, 16), (2, 2, 5, 16), enable_gqa=True)
    assert (lay.q.gemm, lay.k.gemm, lay.v.gemm, lay.batch) == \
        ((4, 12, 16), (4, 5, 16), (4, 5, 16), (2, 8))
    assert all(s.view == s.full for op in (lay.q, lay.k, lay.v) for s in op.spreads)
    mqa = layout((2, 8, 3, 16), (2, 1, 5, 16), (2, 1, 5, 16))
    assert (mqa.q.gemm, mqa.k.gemm, mqa.batch) == ((2, 24, 16), (2, 5, 16), (2, 8))
    shared = layout((2, 8, 3, 16), (1, 8, 5, 16), (1, 8, 5, 16))     # copied per batch entry
    assert shared.k.gemm == (16, 5, 16) and shared.k.spreads[-1].full == (2, 8, 5, 16)


def test_grouped_and_broadcast_attention_pass_finite_differences(queue, rng):
    q = leaf(queue, rng.standard_normal((2, 4, 3, 4)))
    k, v = (leaf(queue, rng.standard_normal((1, 2, 5, 4))) for _ in range(2))
    m = leaf(queue, rng.standard_normal((3, 5)))
    assert tp.gradcheck(lambda a, b, c: tp.scaled_dot_product_attention(
        a, b, c, is_causal=True, enable_gqa=True), [q, k, v])
    assert tp.gradcheck(lambda a, b, c, d: tp.scaled_dot_product_attention(
        a, b, c, attn_mask=d, enable_gqa=True), [q, k, v, m])
    kb, vb = (leaf(queue, rng.standard_normal((4, 5, 4))) for _ in range(2))
    assert tp.gradcheck(lambda a, b, c: tp.scaled_dot_product_attention(a, b, c), [q, kb, vb])


def test_grouped_query_dropout_drops_the_weights_that_repeated_heads_drop(queue, rng):
    """The dropout mask is drawn over the (B, Hq, L, S) weights either way: GQA with a seed
    gives what k and v repeated give with that seed, and repeats bit for bit."""
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 5, 8)).astype(np.float32) for _ in range(2))
    runs = []
    for x, y in ((k, v), (k, v), (np.repeat(k, 2, 1), np.repeat(v, 2, 1))):
        tp.manual_seed(11)
        runs.append(tp.scaled_dot_product_attention(
            *(pc.Tensor.from_host(queue, np.ascontiguousarray(a)) for a in (q, x, y)),
            dropout_p=0.5, is_causal=True, enable_gqa=x is k).to_host())
    assert np.array_equal(runs[0], runs[1])
    np.testing.assert_allclose(runs[0], runs[2], rtol=1e-6, atol=1e-6)
    assert (runs[0] == 0).any()                       # some query rows lost every weight


@pytest.mark.parametrize("q_shape,k_shape,gqa,match", [
    ((2, 6, 3, 8), (2, 4, 5, 8), True,
     r"key's heads \(4\) and the value's heads \(4\) must divide the query's heads \(6\)"),
    ((2, 2, 3, 8), (2, 4, 5, 8), True, r"must divide the query's heads \(2\)"),
    ((3, 8), (5, 8), True, r"enable_gqa needs a heads dimension.*query \(3, 8\)"),
    ((2, 4, 3, 8), (2, 2, 5, 8), False,
     r"batch dimensions of query \(2, 4, 3, 8\), key \(2, 2, 5, 8\), value \(2, 2, 5, 8\) "
     r"do not broadcast"),
    ((2, 4, 3, 8), (3, 2, 5, 8), True,
     r"do not broadcast .*the heads dimension apart, which enable_gqa groups")])
def test_heads_that_do_not_group_and_batches_that_do_not_broadcast_are_refused_as_pytorch(
        queue, q_shape, k_shape, gqa, match):
    q, k = pc.Tensor.zeros(queue, q_shape), pc.Tensor.zeros(queue, k_shape)
    with pytest.raises(pc.ShapeError, match="scaled_dot_product_attention: .*" + match):
        tp.scaled_dot_product_attention(q, k, k, enable_gqa=gqa)
    with pytest.raises(RuntimeError if len(q_shape) > 2 else IndexError):
        F.scaled_dot_product_attention(torch.zeros(q_shape), torch.zeros(k_shape),
                                       torch.zeros(k_shape), enable_gqa=gqa)


def test_a_mask_broadcasts_against_the_query_heads_not_the_key_heads(queue, rng):
    """With GQA the weights are (B, Hq, L, S): a per-head mask has Hq heads, one of Hkv heads
    does not broadcast (as PyTorch's)."""
    q = pc.Tensor.from_host(queue, rng.standard_normal((2, 4, 3, 8)).astype(np.float32))
    k = pc.Tensor.from_host(queue, rng.standard_normal((2, 2, 5, 8)).astype(np.float32))
    ok = tp.scaled_dot_product_attention(q, k, k, attn_mask=np.ones((4, 3, 5), bool),
                                         enable_gqa=True)
    assert ok.shape == (2, 4, 3, 8)
    with pytest.raises(pc.ShapeError, match=r"attn_mask of shape \(2, 2, 3, 5\) does not "
                                            r"broadcast to .*\(2, 4, 3, 5\)"):
        tp.scaled_dot_product_attention(q, k, k, attn_mask=np.ones((2, 2, 3, 5), bool),
                                        enable_gqa=True)
