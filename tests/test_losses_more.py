"""l1, smooth_l1, huber, kl_div, binary_cross_entropy, soft_margin and cosine_embedding losses
and their pc.nn modules: every reduction against PyTorch in float64 (values and gradients to
input and target), finite differences, PyTorch's edge values (log clamped at -100, t = 0 in
kl_div) and its errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import AWKWARD_SIZES, leaf, up
from parcl.errors import DTypeError, ParclError, ShapeError

REDUCTIONS = ["none", "mean", "sum"]


def _inputs(rng, name, n):
    x = rng.standard_normal((n, 3)) * 2
    t = rng.standard_normal((n, 3)) * 2
    if name == "kl_div":
        x = np.log(rng.dirichlet(np.ones(3), n))
        t = rng.dirichlet(np.ones(3), n)
    if name == "binary_cross_entropy":
        x, t = rng.uniform(0.05, 0.95, (n, 3)), rng.uniform(0, 1, (n, 3))
    if name == "soft_margin_loss":
        t = np.sign(t) + (t == 0)
    if name in ("l1_loss", "smooth_l1_loss", "huber_loss"):      # off the kinks
        d = x - t
        x[np.abs(d) < 0.05] += 0.2
        x[np.abs(np.abs(d) - 1.0) < 0.05] += 0.2
    return x.astype(np.float32), t.astype(np.float32)


# name -> (parcl op, torch op) with keyword arguments applied
CASES = {
    "l1_loss": (tp.l1_loss, F.l1_loss),
    "smooth_l1_loss": (tp.smooth_l1_loss, F.smooth_l1_loss),
    "huber_loss": (tp.huber_loss, F.huber_loss),
    "kl_div": (tp.kl_div, F.kl_div),
    "binary_cross_entropy": (tp.binary_cross_entropy, F.binary_cross_entropy),
    "soft_margin_loss": (tp.soft_margin_loss, F.soft_margin_loss),
}
KWARGS = {"smooth_l1_loss": [{}, {"beta": 0.5}, {"beta": 0.0}],
          "huber_loss": [{}, {"delta": 2.0}], "kl_div": [{}, {"log_target": True}]}


def _run(queue, fn, tfn, x, t, g, need_target, **kw):
    nx, nt = leaf(queue, x), leaf(queue, t, need_target)
    with tp.Tape() as tape:
        y = fn(nx, nt, **kw)
    tape.backward(y, grad=up(queue, g))
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tt = torch.tensor(t, dtype=torch.float64, requires_grad=need_target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # torch's 'mean' kl_div warning
        ty = tfn(tx, tt, **kw)
    ty.backward(torch.tensor(g, dtype=torch.float64))
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=2e-5, atol=1e-6)
    if need_target:
        np.testing.assert_allclose(nt.grad.to_host(), tt.grad.numpy(), rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("n", AWKWARD_SIZES)
def test_losses_match_pytorch(queue, rng, name, reduction, n):
    fn, tfn = CASES[name]
    x, t = _inputs(rng, name, n)
    if name == "kl_div" and n == 257:
        t[0, 0] = 0.0                      # xlogy(0, 0) = 0 (the target's gradient: NaN)
    g = rng.standard_normal(x.shape if reduction == "none" else ()).astype(np.float32)
    for kw in KWARGS.get(name, [{}]):
        if name == "kl_div" and kw and n == 257:
            continue                       # log targets: t = 0 is probability 1, nothing odd
        need_target = not (name == "kl_div" and n == 257) and name != "soft_margin_loss"
        _run(queue, fn, tfn, x, np.log(t) if kw.get("log_target") else t, g, need_target,
             reduction=reduction, **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_input_and_target(queue, rng, name):
    fn, _ = CASES[name]
    x, t = _inputs(rng, name, 4)
    inputs = [leaf(queue, x), leaf(queue, t, name != "soft_margin_loss")]
    for kw in KWARGS.get(name, [{}]):
        if kw.get("beta") == 0.0:
            continue
        assert tp.gradcheck(lambda a, b, kw=kw: fn(a, b, reduction="sum", **kw), inputs), kw


def test_kl_div_batchmean_and_zero_targets(queue, rng):
    x, t = _inputs(rng, "kl_div", 6)
    t[0] = [0.0, 0.5, 0.5]
    for log_target in (False, True):
        tt = np.log(t + 1e-3) if log_target else t
        got = tp.kl_div(up(queue, x), up(queue, tt), "batchmean", log_target).item()
        want = F.kl_div(torch.tensor(x), torch.tensor(tt), reduction="batchmean",
                        log_target=log_target).item()
        np.testing.assert_allclose(got, want, rtol=1e-5)
    nt = leaf(queue, t)
    with tp.Tape() as tape:
        y = tp.kl_div(up(queue, x), nt, reduction="sum")
    tape.backward(y)
    tt = torch.tensor(t, requires_grad=True)
    F.kl_div(torch.tensor(x), tt, reduction="sum").backward()
    got, want = nt.grad.to_host(), tt.grad.numpy()
    assert np.isnan(got[0, 0]) and np.isnan(want[0, 0])       # PyTorch's NaN at t = 0
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                        # parcl's 'mean' does not warn
        tp.kl_div(up(queue, x), up(queue, t))
    scalar = tp.kl_div(up(queue, np.float32(-1.0)), up(queue, np.float32(0.5)), "batchmean")
    np.testing.assert_allclose(scalar.item(), F.kl_div(torch.tensor(-1.0), torch.tensor(0.5),
                                                       reduction="batchmean").item(), rtol=1e-6)


def test_binary_cross_entropy_edges_and_weight(queue, rng):
    x = np.array([0.0, 1.0, 0.0, 1.0, 0.5, 1e-30, 1 - 1e-7], np.float32)
    t = np.array([0.0, 1.0, 1.0, 0.0, 0.3, 1.0, 0.0], np.float32)
    nx, nt = leaf(queue, x), leaf(queue, t)
    with tp.Tape() as tape:
        y = tp.binary_cross_entropy(nx, nt, reduction="none")
    tape.backward(y, grad=up(queue, np.ones(7)))
    tx, tt = torch.tensor(x, requires_grad=True), torch.tensor(t, requires_grad=True)
    ty = F.binary_cross_entropy(tx, tt, reduction="none")
    ty.backward(torch.ones(7))
    np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=1e-5)    # 100, not inf
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(nt.grad.to_host(), tt.grad.numpy(), rtol=1e-4)  # +-inf at 0, 1
    xs, ts = _inputs(rng, "binary_cross_entropy", 5)
    w = rng.uniform(0, 2, (3,)).astype(np.float32)
    for reduction in REDUCTIONS:
        got = tp.binary_cross_entropy(up(queue, xs), up(queue, ts), up(queue, w), reduction)
        want = F.binary_cross_entropy(torch.tensor(xs), torch.tensor(ts), torch.tensor(w),
                                      reduction=reduction)
        np.testing.assert_allclose(got.to_host(), want.numpy(), rtol=1e-5, atol=1e-6)
        layer = pc.nn.BCELoss(up(queue, w), reduction=reduction)
        np.testing.assert_allclose(layer(up(queue, xs), up(queue, ts)).to_host(), want.numpy(),
                                   rtol=1e-5, atol=1e-6)
    assert list(pc.nn.BCELoss(up(queue, w)).state_dict()) == ["weight"]
    assert np.isnan(tp.binary_cross_entropy(up(queue, [1.5]), up(queue, [1.0])).item())


def test_soft_margin_loss_is_finite_where_pytorchs_overflows(queue):
    """PyTorch's log1p(exp(-y x)) is inf at y x = -100 (and its gradient NaN); parcl's
    -logsigmoid(y x) is 100 with gradient -1, the limit of both."""
    nx = leaf(queue, [-100.0, 100.0, 0.0])
    with tp.Tape() as tape:
        y = tp.soft_margin_loss(nx, up(queue, [1.0, 1.0, -1.0]), reduction="none")
    tape.backward(y, grad=up(queue, np.ones(3)))
    np.testing.assert_allclose(y.to_host(), [100.0, 3.8e-44, np.log(2.0)], rtol=1e-4, atol=1e-44)
    np.testing.assert_allclose(nx.grad.to_host(), [-1.0, -3.8e-44, 0.5], rtol=1e-4, atol=1e-44)
    with pytest.raises(ParclError, match="soft_margin_loss: is not differentiable with respect "
                                         "to target"):
        tp.soft_margin_loss(nx, leaf(queue, [1.0, 1.0, 1.0]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [0.0, 0.3, -0.5])
def test_cosine_embedding_loss_matches_pytorch(queue, rng, reduction, margin):
    a, b = rng.standard_normal((33, 5)), rng.standard_normal((33, 5))
    a, b = a.astype(np.float32), b.astype(np.float32)
    y = rng.choice([1.0, -1.0, 0.0], 33).astype(np.float32)   # 0: no loss, as PyTorch's
    g = rng.standard_normal((33,) if reduction == "none" else ()).astype(np.float32)
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape() as tape:
        out = tp.cosine_embedding_loss(na, nb, up(queue, y), margin, reduction)
    tape.backward(out, grad=up(queue, g))
    ta = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    tout = F.cosine_embedding_loss(ta, tb, torch.tensor(y, dtype=torch.float64), margin,
                                   reduction=reduction)
    tout.backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(out.to_host(), tout.detach().numpy(), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(na.grad.to_host(), ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nb.grad.to_host(), tb.grad.numpy(), rtol=1e-4, atol=1e-5)
    layer = pc.nn.CosineEmbeddingLoss(margin, reduction=reduction)
    np.testing.assert_allclose(layer(up(queue, a), up(queue, b), up(queue, y)).to_host(),
                               tout.detach().numpy(), rtol=2e-5, atol=1e-6)


def test_cosine_embedding_loss_one_pair_and_shape_errors(queue):
    a, b = np.array([1.0, 2.0, 0.5], np.float32), np.array([-1.0, 0.5, 2.0], np.float32)
    got = tp.cosine_embedding_loss(up(queue, a), up(queue, b), up(queue, np.float32(-1.0)),
                                   -0.2).item()
    want = F.cosine_embedding_loss(torch.tensor(a), torch.tensor(b), torch.tensor(-1.0), -0.2)
    np.testing.assert_allclose(got, want.item(), rtol=1e-5)
    m = up(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match="cosine_embedding_loss: 0D or 1D target"):
        tp.cosine_embedding_loss(m, m, up(queue, np.ones((2, 1))))
    with pytest.raises(ShapeError, match=r"cosine_embedding_loss: a 0D target \(\) expects 1D"):
        tp.cosine_embedding_loss(m, m, up(queue, np.float32(1.0)))
    with pytest.raises(ShapeError, match=r"input1 \(2, 3\) and input2 \(2, 2\)"):
        tp.cosine_embedding_loss(m, up(queue, np.ones((2, 2))), up(queue, np.ones(2)))


def test_broadcast_targets_warn_as_pytorch_and_mismatches_raise(queue):
    x, t = up(queue, [1.0, 2.0]), up(queue, [[1.0], [0.0]])
    for fn, tfn in ((tp.l1_loss, F.l1_loss), (tp.smooth_l1_loss, F.smooth_l1_loss),
                    (tp.huber_loss, F.huber_loss)):
        with pytest.warns(UserWarning, match="different to the input size"):
            got = fn(x, t, reduction="none").to_host()
        with pytest.warns(UserWarning):
            want = tfn(torch.tensor([1.0, 2.0]), torch.tensor([[1.0], [0.0]]), reduction="none")
        np.testing.assert_allclose(got, want.numpy())
    with pytest.raises(ShapeError, match=r"l1_loss: shapes \(2,\) and \(3,\)"):
        tp.l1_loss(x, up(queue, [1.0, 2.0, 3.0]))
    with pytest.raises(ShapeError, match=r"binary_cross_entropy: using a target size \(2, 1\)"):
        tp.binary_cross_entropy(x, t)                          # torch: ValueError
    with pytest.raises(ShapeError, match=r"binary_cross_entropy: weight of shape \(2, 1\)"):
        tp.binary_cross_entropy(x, x, weight=t)               # torch: RuntimeError
    with pytest.raises(ShapeError, match=r"soft_margin_loss: target \(2, 1\)"):
        tp.soft_margin_loss(x, t)
    with pytest.raises(ShapeError, match=r"kl_div: shapes \(2,\) and \(3,\)"):
        tp.kl_div(x, up(queue, [1.0, 2.0, 3.0]))


def test_argument_errors_are_pytorchs(queue):
    x = up(queue, [1.0, 2.0])
    with pytest.raises(ParclError, match="l1_loss: 'avg' is not a valid value for reduction"):
        tp.l1_loss(x, x, reduction="avg")
    with pytest.raises(ParclError, match="binary_cross_entropy: 'batchmean' is not a valid"):
        tp.binary_cross_entropy(x, x, reduction="batchmean")
    with pytest.raises(ParclError, match="smooth_l1_loss: does not support negative values"):
        tp.smooth_l1_loss(x, x, beta=-1.0)
    with pytest.raises(ParclError, match="huber_loss: does not support non-positive values"):
        tp.huber_loss(x, x, delta=0.0)
    with pytest.raises(DTypeError, match="l1_loss: target must be a tp.Node or pc.Tensor"):
        tp.l1_loss(x, np.ones(2))
    with pytest.raises(ParclError, match="KLDivLoss: 'avg' is not a valid value"):
        pc.nn.KLDivLoss(reduction="avg")
    with pytest.raises(TypeError):
        pc.nn.L1Loss("sum")                 # PyTorch's first positional is size_average


MODULES = [
    (pc.nn.L1Loss(reduction="sum"), torch.nn.L1Loss(reduction="sum"), "l1_loss"),
    (pc.nn.SmoothL1Loss(beta=0.5), torch.nn.SmoothL1Loss(beta=0.5), "smooth_l1_loss"),
    (pc.nn.HuberLoss(reduction="none", delta=1.5), torch.nn.HuberLoss("none", 1.5),
     "huber_loss"),
    (pc.nn.KLDivLoss(reduction="batchmean"), torch.nn.KLDivLoss(reduction="batchmean"),
     "kl_div"),
    (pc.nn.KLDivLoss(reduction="sum", log_target=True),
     torch.nn.KLDivLoss(reduction="sum", log_target=True), "kl_div_log"),
    (pc.nn.BCELoss(), torch.nn.BCELoss(), "binary_cross_entropy"),
    (pc.nn.SoftMarginLoss(), torch.nn.SoftMarginLoss(), "soft_margin_loss"),
]


@pytest.mark.parametrize("layer,torch_layer,name", MODULES, ids=[m[2] for m in MODULES])
def test_modules_match_pytorchs(queue, rng, layer, torch_layer, name):
    x, t = _inputs(rng, name.removesuffix("_log"), 7)
    if name == "kl_div_log":
        t = np.log(t)
    nx = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.sum(layer(nx, up(queue, t)))
    tape.backward(y)
    tx = torch.tensor(x, requires_grad=True)
    torch_layer(tx, torch.tensor(t)).sum().backward()
    np.testing.assert_allclose(y.item(), float(torch_layer(torch.tensor(x), torch.tensor(t))
                                               .sum()), rtol=1e-5)
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert layer.parameters() == [] and "reduction=" in repr(layer)


def test_a_captured_step_replays_the_new_losses(queue):
    """The losses' parameters (beta, delta) are kernel arguments and their reductions tape
    ops: a replay gives the eager step's loss and gradients."""
    w = tp.tensor(up(queue, [0.5, -1.5, 2.0]), True)
    w.grad = pc.Tensor.zeros(queue, (3,))
    t = up(queue, [0.2, 0.3, 0.5])

    def fn(x):
        with tp.Tape() as tape:
            h = w * x
            loss = (tp.smooth_l1_loss(h, t, beta=0.5) + tp.huber_loss(h, t, "sum", 2.0)
                    + tp.kl_div(tp.log_softmax(h), t, "batchmean")
                    + tp.binary_cross_entropy(tp.sigmoid(h), t) + tp.soft_margin_loss(h, t))
        tape.backward(loss)
        return loss.value

    step = tp.capture(fn, queue)
    xs = [np.array([i, -i, 0.5 * i], np.float32) for i in (1.0, 2.0, 3.0)]
    replayed = [step(x).to_host() for x in xs]
    grad_replayed = w.grad.to_host()
    w.grad.fill_(0)
    eager = [fn(up(queue, x)).to_host() for x in xs]
    assert step.replays == 2
    np.testing.assert_array_equal(replayed, eager)
    np.testing.assert_array_equal(grad_replayed, w.grad.to_host())
