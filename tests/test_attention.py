"""scaled_dot_product_attention: against float64 numpy and against the unfused composition of
matmul and softmax; causal, boolean and additive masks (broadcast), T = 1, odd T and D,
dropout, finite differences, bit-identical repeats, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf


def reference(q, k, v, mask=None, causal=False, scale=None):
    """PyTorch's documented formula in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    with np.errstate(invalid="ignore"):              # fully masked rows: NaN, compared apart
        s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


CASES = [((2, 3, 5, 4), 5, 4, None), ((1, 1, 7), 7, 3, None), ((2, 1, 3), 1, 3, None),
         ((3, 9, 5), 9, 5, "causal"), ((2, 2, 1, 3), 1, 3, "causal"),
         ((2, 3, 6, 5), 7, 3, "bool"), ((2, 5, 4), 3, 4, "float"), ((2, 3, 5, 4), 5, 4, "bool4")]


def _mask(kind, rng, q_shape, tk):
    tq = q_shape[-2]
    if kind == "bool":                               # (Tq, Tk), broadcast over the batch
        m = rng.random((tq, tk)) < 0.7
        m[:, 0] = True                               # no fully masked row
        return m
    if kind == "bool4":                              # (B, 1, Tq, Tk): per batch, not per head
        m = rng.random((q_shape[0], 1, tq, tk)) < 0.6
        m[..., 0] = True
        return m
    if kind == "float":
        return rng.standard_normal((q_shape[0], 1, tk))
    return None


@pytest.mark.parametrize("q_shape,tk,dv,kind", CASES)
def test_attention_forward_backward(queue, rng, q_shape, tk, dv, kind):
    d = q_shape[-1]
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal((*q_shape[:-2], tk, d))
    v = rng.standard_normal((*q_shape[:-2], tk, dv))
    mask = _mask(kind, rng, q_shape, tk)
    causal = kind == "causal"
    nq, nk, nv = leaf(queue, q), leaf(queue, k), leaf(queue, v)
    m = None if mask is None else (mask if mask.dtype == np.bool_ else
                                   pc.Tensor.from_host(queue, mask.astype(np.float32)))
    with tp.Tape():
        y = tp.scaled_dot_product_attention(nq, nk, nv, attn_mask=m, is_causal=causal)
    assert y.op_name == "scaled_dot_product_attention"
    want = reference(q, k, v, None if mask is None else
                     (mask if mask.dtype == np.bool_ else mask.astype(np.float32)), causal)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-5)
    fn = lambda a, b, c: tp.scaled_dot_product_attention(a, b, c, attn_mask=m,   # noqa: E731
                                                         is_causal=causal)
    assert tp.gradcheck(fn, [nq, nk, nv])


def test_attention_matches_unfused_composition(queue, rng):
    """Forward and all three gradients against matmul + softmax recorded op by op."""
    q, k, v = (rng.standard_normal((2, 2, 6, 5)) for _ in range(3))
    mask = np.triu(np.full((6, 6), -np.inf), 1).astype(np.float32) + \
        rng.standard_normal((6, 6)).astype(np.float32)
    mt = pc.Tensor.from_host(queue, mask)
    g = pc.Tensor.from_host(queue, rng.standard_normal((2, 2, 6, 5)).astype(np.float32))
    grads = []
    for fused in (True, False):
        nodes = [leaf(queue, x) for x in (q, k, v)]
        with tp.Tape() as tape:
            if fused:
                y = tp.scaled_dot_product_attention(*nodes, attn_mask=mt, scale=0.3)
            else:
                s = tp.matmul(nodes[0], tp.transpose(nodes[1], (0, 1, 3, 2))) * 0.3 + mt
                y = tp.matmul(tp.softmax(s, -1), nodes[2])
        tape.backward(y, grad=g)
        grads.append([y.to_host()] + [n.grad.to_host() for n in nodes])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_attention_float_mask_gradient(queue, rng):
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    nm = leaf(queue, rng.standard_normal((3, 3)))
    nodes = [leaf(queue, x) for x in (q, k, v)]
    assert tp.gradcheck(lambda a, b, c, m: tp.scaled_dot_product_attention(a, b, c,
                                                                           attn_mask=m),
                        [*nodes, nm])


def test_attention_dropout_replays_dropout_mask(queue, rng):
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    nodes = [leaf(queue, x) for x in (q, k, v)]
    tp.manual_seed(7)
    with tp.Tape():
        y = tp.scaled_dot_product_attention(*nodes, dropout_p=0.4, is_causal=True)
    tp.manual_seed(7)
    s = tp.matmul(nodes[0], tp.transpose(nodes[1], (0, 2, 1))) * (1 / 2.0)
    s = s + pc.Tensor.from_host(queue, np.triu(np.full((5, 5), -np.inf), 1).astype(np.float32))
    ref = tp.matmul(tp.dropout(tp.softmax(s, -1), 0.4), nodes[2])
    np.testing.assert_allclose(y.to_host(), ref.to_host(), rtol=1e-5, atol=1e-6)

    def fn(a, b, c):
        tp.manual_seed(3)                  # the same dropout mask on every evaluation
        return tp.scaled_dot_product_attention(a, b, c, dropout_p=0.3)
    assert tp.gradcheck(fn, nodes)


@pytest.mark.parametrize("variant", ["rows", "groups"])
@pytest.mark.parametrize("tk,kind", [(13, "bool"), (16, "float"), (8, "causal"), (3, None)])
def test_masked_softmax_variants(queue, rng, variant, tk, kind):
    """Both kernel variants (CPU rows, GPU work-groups) on this device, against numpy."""
    from parcl.kernels import attention as ak
    s = rng.standard_normal((2, 3, 5, tk))
    mask = _mask("bool4" if kind == "bool" else kind, rng, (2, 3, 5, 4), tk)
    if kind == "float":
        mask = rng.standard_normal((2, 1, 1, tk))        # per batch entry, not per head
    mt = None if mask is None else pc.Tensor.from_host(
        queue, mask.astype(np.int32 if kind == "bool" else np.float32))
    p = ak.masked_softmax(pc.Tensor.from_host(queue, s.reshape(6, 5, tk).astype(np.float32)),
                          0.7, mt, kind == "causal", (2, 3), variant=variant)
    z = s * 0.7
    if kind == "causal":
        z = np.where(np.tril(np.ones((5, tk), bool)), z, -np.inf)
    elif mask is not None:
        z = np.where(mask, z, -np.inf) if kind == "bool" else z + mask.astype(np.float32)
    e = np.exp(z - z.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(p.to_host().reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    dp = rng.standard_normal(want.shape)
    ds = ak.masked_softmax_backward(p, pc.Tensor.from_host(queue, dp.reshape(6, 5, tk)
                                                          .astype(np.float32)), 0.7,
                                    variant=variant)
    ref = want * (dp - (want * dp).sum(-1, keepdims=True)) * 0.7
    np.testing.assert_allclose(ds.to_host().reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["rows", "groups"])
def test_fully_masked_rows_are_zero(queue, rng, variant):
    """As PyTorch: a query that may attend to nothing gives zeros (not NaN), and so do its
    gradients, while the other rows are unchanged."""
    from parcl.kernels import attention as ak
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    allow = np.array([[True, True, False], [False, False, False], [True, False, True]])
    nodes = [leaf(queue, x) for x in (q, k, v)]
    with tp.Tape() as tape:
        y = tp.scaled_dot_product_attention(*nodes, attn_mask=allow)
    out = y.to_host()
    assert np.array_equal(out[:, 1], np.zeros((2, 4), np.float32))
    ref = reference(q, k, v, allow)
    np.testing.assert_allclose(out[:, [0, 2]], ref[:, [0, 2]], rtol=1e-5, atol=1e-6)
    tape.backward(y, grad=pc.Tensor.from_host(queue, np.ones((2, 3, 4), np.float32)))
    assert np.array_equal(nodes[0].grad.to_host()[:, 1], np.zeros((2, 4), np.float32))
    assert all(np.isfinite(n.grad.to_host()).all() for n in nodes)
    s = pc.Tensor.from_host(queue, np.zeros((1, 2, 9), np.float32))
    m = pc.Tensor.from_host(queue, np.array([[0] * 9, [1] * 9], np.int32))
    p = ak.masked_softmax(s, 1.0, m, variant=variant).to_host()
    assert np.array_equal(p[0, 0], np.zeros(9, np.float32))
    np.testing.assert_allclose(p[0, 1], np.full(9, 1 / 9), rtol=1e-6)


def test_a_query_whose_scores_are_nan_attends_as_pytorch_with_nan(queue, rng):
    """A NaN query (a diverged projection) gives NaN, as torch's: fmax passes over NaN, so a
    row of NaN scores looked fully masked and came out zeros, a finite output and gradient
    hiding the NaN."""
    import torch
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    q[1, 1, 2] = np.nan
    for causal in (False, True):
        xt = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        want = torch.nn.functional.scaled_dot_product_attention(*xt, is_causal=causal)
        want.sum().backward()
        nodes = [leaf(queue, x) for x in (q, k, v)]
        with tp.Tape() as tape:
            y = tp.scaled_dot_product_attention(*nodes, is_causal=causal)
        tape.backward(y, grad=pc.Tensor.from_host(queue, np.ones((2, 3, 4), np.float32)))
        got = y.to_host()
        assert np.isnan(got[1, 1]).all() and np.isnan(want[1, 1].detach().numpy()).all()
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(nodes[0].grad.to_host(), xt[0].grad.numpy(), rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("variant", ["rows", "groups"])
def test_a_row_of_nan_scores_is_nan_as_pytorchs_and_a_fully_masked_row_zeros(queue, variant):
    from parcl.kernels import attention as ak
    s = np.zeros((1, 4, 11), np.float32)
    s[0, 1] = np.nan                               # every score NaN
    s[0, 2, 3] = np.nan                            # the one score not masked NaN
    allow = np.ones((4, 11), np.int32)
    allow[2] = allow[3] = 0
    allow[2, 3] = 1
    p = ak.masked_softmax(pc.Tensor.from_host(queue, s), 1.0,
                          pc.Tensor.from_host(queue, allow), variant=variant).to_host()[0]
    np.testing.assert_allclose(p[0], np.full(11, 1 / 11), rtol=1e-6)
    assert np.isnan(p[1]).all()
    assert np.isnan(p[2]).all()                    # as torch.softmax of [-inf, nan, -inf]
    assert np.array_equal(p[3], np.zeros(11, np.float32))   # nothing to attend to


def test_attention_bit_identical_repeats(queue, rng):
    q, k, v = (rng.standard_normal((2, 4, 9, 8)) for _ in range(3))
    runs = []
    for _ in range(2):
        nodes = [leaf(queue, x) for x in (q, k, v)]
        with tp.Tape() as tape:
            y = tp.sum(tp.scaled_dot_product_attention(*nodes, is_causal=True))
        tape.backward(y)
        runs.append([y.to_host()] + [n.grad.to_host() for n in nodes])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_attention_raw_tensors_and_errors(queue, rng):
    q = pc.Tensor.from_host(queue, rng.standard_normal((3, 4)).astype(np.float32))
    out = tp.scaled_dot_product_attention(q, q, q)
    assert isinstance(out, pc.Tensor) and out.shape == (3, 4)
    allow = np.tril(np.ones((3, 3), bool))
    causal = tp.scaled_dot_product_attention(q, q, q, is_causal=True).to_host()
    for mask in (allow, pc.Tensor.from_host(queue, allow)):
        assert np.array_equal(
            tp.scaled_dot_product_attention(q, q, q, attn_mask=mask).to_host(), causal)
    with pytest.raises(pc.ShapeError, match="not both"):
        tp.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3), bool),
                                        is_causal=True)
    with pytest.raises(pc.ShapeError, match=r"attn_mask of shape \(2, 3\) does not broadcast"):
        tp.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((2, 3), bool))
    with pytest.raises(pc.ShapeError, match="same last dimension"):
        tp.scaled_dot_product_attention(q, pc.Tensor.zeros(queue, (3, 5)), q)
    with pytest.raises(pc.ShapeError, match=r"key \(2, 3, 4\), value \(3, 3, 4\) do not "):
        tp.scaled_dot_product_attention(q, pc.Tensor.zeros(queue, (2, 3, 4)),
                                        pc.Tensor.zeros(queue, (3, 3, 4)))


class TinyAttention(pc.nn.Module):
    """Rows of a digit as a sequence: split, heads, causal attention with dropout, indexing,
    gather, cat and pad, so a captured step replays every new op."""

    def __init__(self, queue):
        super().__init__()
        self.qkv = pc.nn.Linear(8, 24, queue=queue)
        self.head = pc.nn.Linear(20, 10, queue=queue)
        self.blocks = pc.nn.ModuleList([pc.nn.Identity()])

    def forward(self, x):
        n = x.shape[0]
        h = tp.reshape(x, (n, 8, 8))
        q, k, v = (tp.transpose(tp.reshape(t, (n, 8, 2, 4)), (0, 2, 1, 3))
                   for t in tp.split(self.qkv(h), 8, axis=-1))
        y = tp.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        y = tp.reshape(tp.transpose(y, (0, 2, 1, 3)), (n, 8, 8))
        for block in self.blocks:
            y = block(y)
        last = y[:, -1]
        picks = pc.Tensor.from_host(last.queue, np.tile(np.array([[7, 0]]), (n, 1)))
        return self.head(tp.pad(tp.cat([last, y[:, 0, ::-1], tp.gather(last, 1, picks)],
                                       axis=1), (0, 2)))


def test_attention_step_capture_bit_identical(devices2):
    from parcl.replica import ReplicaGroup

    def build(queue):
        pc.nn.manual_seed(0)
        return TinyAttention(queue)

    rng = np.random.default_rng(0)
    batches = [(rng.random((6, 64), dtype=np.float32), rng.integers(0, 10, 6))
               for _ in range(4)]
    results = []
    for capture in (False, True):
        with ReplicaGroup(build, devices2[:1], capture=capture) as group:
            group.run(lambda r: tp.manual_seed(5))
            opt = pc.optim.AdamW(group.parameters(), lr=1e-2)
            losses = [group.step(x, y, tp.cross_entropy, opt) for x, y in batches]
            results.append((losses, [p.value.to_host() for p in group.parameters()]))
            steps = [st for per in group.captured_steps for st in per]
    assert steps and all(st.replays == 3 for st in steps)      # recorded once, replayed 3x
    assert results[0][0] == results[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    assert np.isfinite(results[0][0]).all()


@pytest.mark.parametrize("dtype,where", [(np.int32, "numpy"), (np.int64, "numpy"),
                                         (np.uint8, "numpy"), (np.int32, "device"),
                                         (np.int64, "device")])
def test_an_integer_attention_mask_is_refused_as_pytorch(queue, rng, dtype, where):
    """PyTorch takes a boolean or a float mask. An additive mask that happens to be integer,
    ``np.where(pad, -10000, 0)``, was read as boolean (nonzero = may attend): the padded key
    was the only one attended to. Now a DTypeError."""
    q = pc.Tensor.from_host(queue, rng.standard_normal((3, 4)).astype(np.float32))
    additive = np.where(np.array([False, False, True]), -10000, 0).astype(dtype)
    mask = additive if where == "numpy" else pc.Tensor.from_host(queue, additive)
    with pytest.raises(pc.DTypeError, match="attn_mask .* has dtype .*boolean mask .* or a "
                                            "float one"):
        tp.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_attention_with_a_head_dim_of_no_elements_attends_uniformly_as_pytorch(queue):
    """Queries and keys of head dim 0 (``x[..., 4:]``): the default scale 1 / sqrt(0) was a
    ZeroDivisionError, where PyTorch's scores (no products, 0) give each query the mean of
    the values (softmax of the mask alone with a mask); values and gradients as torch's."""
    import torch
    import torch.nn.functional as F
    a = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    m = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    for kw in ({}, {"is_causal": True}, {"attn_mask": m}):
        x, xt = tp.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        ours = {k: tp.tensor(v) if k == "attn_mask" else v for k, v in kw.items()}
        theirs = {k: torch.tensor(v) if k == "attn_mask" else v for k, v in kw.items()}
        with tp.Tape() as tape:
            y = tp.scaled_dot_product_attention(x[..., 4:], x[..., 4:], x, **ours)
        tape.backward(tp.sum(y * y))
        yt = F.scaled_dot_product_attention(xt[..., 4:], xt[..., 4:], xt, **theirs)
        (yt * yt).sum().backward()
        np.testing.assert_allclose(y.to_host(), yt.detach().numpy(), atol=1e-6)
        np.testing.assert_allclose(x.grad.to_host(), xt.grad.numpy(), atol=1e-5)
    np.testing.assert_allclose(tp.scaled_dot_product_attention(x[..., 4:], x[..., 4:], x)
                               .to_host()[0, 0, 0], a[0, 0].mean(0), rtol=1e-5)


def test_a_tensor_scale_is_refused_and_number_scales_are_pytorchs(queue, rng):
    """A learnt temperature passed as ``scale=`` (a Node, ``tp.exp(log_scale)``) was read
    with ``float()``: the attention used its value and its gradient was dropped, so after
    the backward ``log_scale.grad`` was None and it never trained, silently. PyTorch refuses
    a tensor there ('argument 'scale' must be float, not Tensor'); now a DTypeError. Numbers
    (numpy's and ints too) scale the scores as torch's."""
    import torch
    import torch.nn.functional as F
    a = [rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3)]
    x = [leaf(queue, v) for v in a]
    log_scale = leaf(queue, np.array(-0.5, np.float32))
    with tp.Tape():
        for scale in (tp.exp(log_scale), log_scale.value):
            with pytest.raises(pc.DTypeError, match="scaled_dot_product_attention: scale must "
                                                    "be a number"):
                tp.scaled_dot_product_attention(*x, scale=scale)
    for scale in (np.float32(0.5), 2, np.float64(0.25)):
        want = F.scaled_dot_product_attention(*map(torch.tensor, a), scale=scale)
        got = tp.scaled_dot_product_attention(*x, scale=scale).to_host()
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
