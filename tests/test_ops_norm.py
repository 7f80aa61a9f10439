"""layer_norm, rms_norm, group_norm: forward against float64 numpy (PyTorch's formulas),
backward against finite differences, the saved statistics, determinism and errors."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf


def ref_layer_norm(x, k, w=None, b=None, eps=1e-5, center=True):
    x = x.astype(np.float64)
    axes = tuple(range(x.ndim - k, x.ndim))
    m = x.mean(axis=axes, keepdims=True) if center else 0.0
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    y = (x - m) / np.sqrt(v + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def ref_group_norm(x, g, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, g, -1)
    m, v = xg.mean(-1, keepdims=True), xg.var(-1, keepdims=True)
    y = ((xg - m) / np.sqrt(v + eps)).reshape(x.shape)
    cs = (c,) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.reshape(cs)
    if b is not None:
        y = y + b.reshape(cs)
    return y


CASES = [((3, 5), (5,)), ((2, 3, 4), (3, 4)), ((1, 7), 7), ((4, 1, 33), (33,))]


@pytest.mark.parametrize("shape, ns", CASES)
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layer_norm_forward_and_gradcheck(queue, rng, shape, ns, affine):
    nsh = (ns,) if isinstance(ns, int) else ns
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(nsh).astype(np.float32) if affine != "none" else None
    b = rng.standard_normal(nsh).astype(np.float32) if affine == "both" else None
    nodes = [leaf(queue, a) for a in (x, w, b) if a is not None]

    def fn(*ts):
        return tp.layer_norm(ts[0], ns, *ts[1:])
    y = fn(*nodes)
    assert y.op_name == "layer_norm" and y.shape == shape
    np.testing.assert_allclose(y.to_host(), ref_layer_norm(x, len(nsh), w, b), atol=2e-5)
    assert tp.gradcheck(fn, nodes, atol=5e-3)


def test_layer_norm_saves_mean_and_inverse_std(queue, rng):
    x = rng.standard_normal((3, 6)).astype(np.float32) * 3 + 1
    with tp.Tape() as tape:
        y = tp.layer_norm(leaf(queue, x), 6)
    fn = tape.nodes[-1].grad_fn
    assert tape.nodes[-1] is y.entry
    np.testing.assert_allclose(fn.mean.to_host(), x.mean(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fn.rstd.to_host(), 1 / np.sqrt(x.var(-1) + 1e-5), rtol=1e-5)


def test_layer_norm_large_offset_and_bit_identical(queue, rng):
    # a mean far from zero against a small spread: the two-pass statistics keep it exact
    x = (rng.standard_normal((4, 9)) + 1000).astype(np.float32)
    w = rng.standard_normal(9).astype(np.float32)
    runs = []
    for _ in range(2):
        nx, nw = leaf(queue, x), leaf(queue, w)
        with tp.Tape() as tape:
            y = tp.layer_norm(nx, (9,), nw)
        tape.backward(y, grad=pc.Tensor.from_host(queue, np.cos(x)))
        runs.append((y.to_host(), nx.grad.to_host(), nw.grad.to_host()))
    np.testing.assert_allclose(runs[0][0], ref_layer_norm(x, 1, w), atol=2e-3)
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_layer_norm_accumulates_into_existing_grad(queue, rng):
    x = rng.standard_normal((2, 4)).astype(np.float32)
    nw, nb = leaf(queue, np.ones(4)), leaf(queue, np.zeros(4))
    grads = []
    for _ in range(2):                     # the second backward adds into .grad
        with tp.Tape() as tape:
            loss = tp.sum(tp.layer_norm(leaf(queue, x, False), 4, nw, nb))
        tape.backward(loss)
        grads.append((nw.grad.to_host().copy(), nb.grad.to_host().copy()))
    np.testing.assert_allclose(grads[1][0], 2 * grads[0][0], atol=1e-6)
    np.testing.assert_allclose(grads[1][1], [4.0] * 4)


def test_layer_norm_errors(queue):
    x = pc.Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"layer_norm: input of shape \(2, 3\) does not end "
                                            r"with normalized_shape \(4,\)"):
        tp.layer_norm(x, 4)
    w = pc.Tensor.from_host(queue, np.ones(2, np.float32))
    with pytest.raises(pc.ShapeError, match=r"layer_norm: weight has shape \(2,\), expected"):
        tp.layer_norm(x, 3, w)


@pytest.mark.parametrize("shape, ns", CASES[:3])
def test_rms_norm(queue, rng, shape, ns):
    nsh = (ns,) if isinstance(ns, int) else ns
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(nsh).astype(np.float32)
    nx, nw = leaf(queue, x), leaf(queue, w)
    y = tp.rms_norm(nx, ns, nw)
    assert y.op_name == "rms_norm"
    eps = np.finfo(np.float32).eps                      # PyTorch's default for eps=None
    np.testing.assert_allclose(y.to_host(), ref_layer_norm(x, len(nsh), w, eps=eps,
                                                           center=False), atol=2e-5)
    assert tp.gradcheck(lambda a, b: tp.rms_norm(a, ns, b, eps=1e-5), [nx, nw], atol=5e-3)
    assert tp.gradcheck(lambda a: tp.rms_norm(a, ns), [nx], atol=5e-3)


@pytest.mark.parametrize("shape, groups", [((2, 4, 3), 2), ((3, 6), 3), ((1, 4, 2, 3), 1),
                                           ((2, 3, 5), 3)])
@pytest.mark.parametrize("affine", [False, True])
def test_group_norm(queue, rng, shape, groups, affine):
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[1]
    w = rng.standard_normal(c).astype(np.float32) if affine else None
    b = rng.standard_normal(c).astype(np.float32) if affine else None
    nodes = [leaf(queue, a) for a in (x, w, b) if a is not None]

    def fn(*ts):
        return tp.group_norm(ts[0], groups, *ts[1:])
    y = fn(*nodes)
    assert y.op_name == "group_norm"
    np.testing.assert_allclose(y.to_host(), ref_group_norm(x, groups, w, b), atol=2e-5)
    assert tp.gradcheck(fn, nodes, atol=5e-3)


def test_group_norm_errors(queue):
    x = pc.Tensor.from_host(queue, np.zeros((2, 4, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"group_norm: 4 channels .* num_groups=3"):
        tp.group_norm(x, 3)


def test_group_norm_refuses_a_number_of_groups_that_is_no_int_as_pytorch(queue, rng):
    # int() took 1.9 groups for 1 (a channel count over 2.0): PyTorch's group_norm refuses a
    # float or a bool (TypeError) where parcl normalised the four channels as one group
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    tx = pc.Tensor.from_host(queue, x)
    for groups in (1.9, 2.0, True):
        with pytest.raises(pc.ShapeError, match=r"group_norm: num_groups must be an int, got "
                           + repr(groups)):
            tp.group_norm(tx, groups)
    np.testing.assert_allclose(tp.group_norm(tx, np.int64(2)).to_host(),
                               ref_group_norm(x, 2), atol=2e-5)


@pytest.mark.parametrize("workgroup", [False, True])
@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("D", [1, 5, 300])
def test_norm_kernel_variants(queue, rng, workgroup, center, D):
    """Both kernel variants (a work-item per row: CPUs; a work-group per row: GPUs) on this
    device, against numpy, forward and backward."""
    from parcl.kernels import norm as nk
    x = rng.standard_normal((3, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    g = rng.standard_normal((3, D)).astype(np.float32)
    tx, tw, tb, tg = (pc.Tensor.from_host(queue, a) for a in (x, w, b, g))
    y, mean, rstd = nk.norm_forward(tx, D, tw, tb if center else None, 1e-5, center,
                                    workgroup=workgroup)
    want = ref_layer_norm(x, 1, w, b if center else None, center=center)
    np.testing.assert_allclose(y.to_host(), want, atol=3e-5)
    gx, gw, gb = nk.norm_backward(tx, tg, D, mean, rstd, tw, center, need_weight=True,
                                  need_bias=True, workgroup=workgroup)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    m = x64.mean(-1, keepdims=True) if center else 0.0
    rs = 1 / np.sqrt(((x64 - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    h = (x64 - m) * rs
    gh = g64 * w
    want_gx = rs * (gh - (gh.mean(-1, keepdims=True) if center else 0)
                    - h * (gh * h).mean(-1, keepdims=True))
    np.testing.assert_allclose(gx.to_host(), want_gx, atol=1e-4)
    np.testing.assert_allclose(gw.to_host(), (g64 * h).sum(0), atol=1e-4)
    np.testing.assert_allclose(gb.to_host(), g64.sum(0), atol=1e-4)


@pytest.mark.parametrize("center", [True, False], ids=["layer", "rms"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("rows, D", [(8, 8), (16, 64), (24, 136), (1024, 128)])
def test_the_8_row_kernels_are_bit_for_bit_the_one_row_kernels(queue, rng, center, affine,
                                                                rows, D):
    """On CPUs, rows and D in whole multiples of 8 take 8 rows per work-item (each row
    walked in vectors by the row functions of the one-row kernels), and the weight and
    bias gradients 8 columns: the same sums in the same order, so the same bits, forward
    and backward, and numpy's layer norm."""
    from parcl.kernels import norm as nk
    x = (rng.standard_normal((rows, D)) * 3 + 1).astype(np.float32)
    tx, tg = (pc.Tensor.from_host(queue, a) for a in (x, rng.standard_normal((rows, D))
                                                       .astype(np.float32)))
    tw, tb = ((pc.Tensor.from_host(queue, rng.standard_normal(D).astype(np.float32))
               for _ in range(2)) if affine else (None, None))
    got = []
    for lanes in (False, True):
        y, mean, rstd = nk.norm_forward(tx, D, tw, tb, 1e-5, center, workgroup=False,
                                        lanes=lanes)
        gx, gw, gb = nk.norm_backward(tx, tg, D, mean, rstd, tw, center, workgroup=False,
                                      lanes=lanes, need_weight=True, need_bias=True)
        got.append([t.to_host().view(np.int32) for t in (y, mean, rstd, gx, gw, gb)])
    for one, eight in zip(*got):
        np.testing.assert_array_equal(eight, one)
    want = ref_layer_norm(x, 1, None if tw is None else tw.to_host(),
                          None if tb is None else tb.to_host(), center=center)
    np.testing.assert_allclose(got[1][0].view(np.float32), want, atol=3e-5)


def test_norms_of_a_slice_with_no_elements_give_pytorchs_empty_output_and_zero_grads(queue):
    """A group norm of a batch with no samples (``x[2:]`` of a batch of 2) took its group
    size as x.size // N, and a layer or RMS norm over a normalized_shape holding a 0
    (``x[:, :, 3:]`` normalised over its last dim) x.size // D, both ZeroDivisionErrors, where
    PyTorch gives the empty output and zero gradients for input, weight and bias."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    wa, ba = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    cases = [("group_norm", lambda x, w, b, m: m.group_norm(x[2:], 2, w, b)),
             ("layer_norm", lambda x, w, b, m: m.layer_norm(x[:, :, 3:], (0,))),
             ("layer_norm", lambda x, w, b, m: m.layer_norm(x[:, :, 3:], (4, 0))),
             ("rms_norm", lambda x, w, b, m: m.rms_norm(x[:, :, 3:], (0,)))]
    for name, call in cases:
        x, w, b = (tp.tensor(v, requires_grad=True) for v in (a, wa, ba))
        with tp.Tape() as tape:
            y = call(x, w, b, tp)
        tape.backward(tp.sum(y))
        xt, wt, bt = (torch.tensor(v, requires_grad=True) for v in (a, wa, ba))
        yt = call(xt, wt, bt, F)
        yt.sum().backward()
        assert y.shape == tuple(yt.shape), name
        np.testing.assert_array_equal(x.grad.to_host(), xt.grad.numpy())
        if wt.grad is not None:
            np.testing.assert_array_equal(w.grad.to_host(), wt.grad.numpy())
            np.testing.assert_array_equal(b.grad.to_host(), bt.grad.numpy())
