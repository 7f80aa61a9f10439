"""margin_ranking, hinge_embedding, triplet_margin, multi_margin, multilabel_margin and
multilabel_soft_margin losses, pairwise_distance, the Poisson and Gaussian NLL losses, the CTC
loss and their pc.nn modules: every reduction against PyTorch in float64 (values and
gradients), finite differences, concrete values, PyTorch's errors, and a data-parallel step
through each equal to the single-replica full-batch step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import assert_same_gradient_bits_twice, leaf, up
from parcl.errors import DTypeError, ParclError, ShapeError
from parcl.replica import ReplicaGroup

REDUCTIONS = ["none", "mean", "sum"]
W = np.array([0.5, 2.0, 1.0, 1.5, 0.25], np.float32)


def _inputs(rng, name, n):
    """float32 arrays (and int labels) for ``name``, ``n`` rows."""
    x = rng.standard_normal((n, 5)).astype(np.float32)
    signs = np.sign(rng.standard_normal(x.shape)).astype(np.float32)
    if name == "margin_ranking_loss":
        return [x, rng.standard_normal(x.shape).astype(np.float32), signs]
    if name == "hinge_embedding_loss":
        x[np.abs(x - 1.0) < 0.05] += 0.2                     # off the hinge at the margin
        return [x, signs]
    if name == "triplet_margin_loss":
        return [x, *(rng.standard_normal(x.shape).astype(np.float32) for _ in range(2))]
    if name == "multi_margin_loss":
        return [x, rng.integers(0, 5, n)]
    if name == "multilabel_margin_loss":
        return [x, _multilabels(rng, x.shape)]
    return [x, (rng.uniform(size=x.shape) > 0.5).astype(np.float32)]


def _multilabels(rng, shape):
    """Rows of class indices ended by -1 (some with a repeated label, one with none, one
    full), anything after the -1 in [-1, C) as PyTorch requires."""
    t = rng.integers(-1, shape[-1], shape)
    t.reshape(-1, shape[-1])[0, :2] = [1, 3]
    if t.ndim == 2 and len(t) > 3:
        t[1] = np.arange(shape[-1])[::-1]
        t[2, :3] = [2, 2, -1]
        t[3, 0] = -1
    return t


# name -> (parcl op, torch op, keyword sets, which inputs get a gradient)
CASES = {
    "margin_ranking_loss": (tp.margin_ranking_loss, F.margin_ranking_loss,
                            [{}, {"margin": 0.7}], (True, True, True)),
    "hinge_embedding_loss": (tp.hinge_embedding_loss, F.hinge_embedding_loss,
                             [{}, {"margin": 0.3}], (True, False)),
    "triplet_margin_loss": (tp.triplet_margin_loss, F.triplet_margin_loss,
                            [{}, {"margin": 2.0, "swap": True}, {"p": 1.0, "eps": 1e-3},
                             {"p": 3.0, "swap": True}], (True, True, True)),
    "multi_margin_loss": (tp.multi_margin_loss, F.multi_margin_loss,
                          [{}, {"p": 2, "margin": 0.6}, {"weight": W}, {"p": 2, "weight": W}],
                          (True, False)),
    "multilabel_margin_loss": (tp.multilabel_margin_loss, F.multilabel_margin_loss, [{}],
                               (True, False)),
    "multilabel_soft_margin_loss": (tp.multilabel_soft_margin_loss,
                                    F.multilabel_soft_margin_loss, [{}, {"weight": W}],
                                    (True, True)),
}


def _torch(a, grad):
    if a.dtype.kind == "i":
        return torch.tensor(a)
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def _parcl(queue, a, grad):
    return up(queue, a, a.dtype) if a.dtype.kind == "i" else leaf(queue, a, grad)


def _compare(queue, rng, name, arrays, reduction, kw):
    fn, tfn, _, grads = CASES[name]
    nodes = [_parcl(queue, a, g) for a, g in zip(arrays, grads)]
    tensors = [_torch(a, g) for a, g in zip(arrays, grads)]
    pkw, tkw = dict(kw), dict(kw)
    if "weight" in kw:
        pkw["weight"] = up(queue, kw["weight"])
        tkw["weight"] = torch.tensor(kw["weight"], dtype=torch.float64)
    with tp.Tape() as tape:
        y = fn(*nodes, reduction=reduction, **pkw)
    ty = tfn(*tensors, reduction=reduction, **tkw)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    tape.backward(y, grad=up(queue, g))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=2e-5, atol=1e-6)
    for node, t, need in zip(nodes, tensors, grads):
        if need:
            np.testing.assert_allclose(node.grad.to_host(), t.grad.numpy(), rtol=2e-5,
                                       atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("n", [1, 7, 64])
def test_margin_losses_and_their_gradients_hold_as_pytorch(queue, rng, name, reduction, n):
    for kw in CASES[name][2]:
        _compare(queue, rng, name, _inputs(rng, name, n), reduction, kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_sample_without_a_batch_dim_holds_as_pytorch(queue, rng, name):
    arrays = [a[0] for a in _inputs(rng, name, 3)]
    for reduction in REDUCTIONS:
        _compare(queue, rng, name, arrays, reduction, CASES[name][2][-1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_margin_losses_pass_gradcheck(queue, rng, name):
    fn, _, kws, grads = CASES[name]
    arrays = _inputs(rng, name, 3)
    inputs = [_parcl(queue, a, g) for a, g in zip(arrays, grads)]
    for kw in kws:
        if "weight" in kw:
            kw = {**kw, "weight": up(queue, kw["weight"])}
        assert tp.gradcheck(lambda *a, kw=kw: fn(*a, reduction="sum", **kw), inputs), kw


def test_concrete_values_hold_as_pytorchs_documentation(queue):
    scores = up(queue, [[0.1, 0.2, 0.4, 0.8]])
    label = up(queue, [3], np.int64)
    assert tp.multi_margin_loss(scores, label).item() == pytest.approx(0.325)   # PyTorch's doc
    assert tp.multi_margin_loss(scores, label, p=2).item() == pytest.approx(
        (0.3 ** 2 + 0.4 ** 2 + 0.6 ** 2) / 4)
    x1, x2, y = up(queue, [1.0, 2.0]), up(queue, [2.0, 0.0]), up(queue, [1.0, 1.0])
    np.testing.assert_allclose(
        tp.margin_ranking_loss(x1, x2, y, 0.5, reduction="none").to_host(), [1.5, 0.0])
    np.testing.assert_allclose(
        tp.hinge_embedding_loss(up(queue, [0.25, 3.0, 0.5]), up(queue, [-1.0, -1.0, 1.0]),
                                reduction="none").to_host(), [0.75, 0.0, 0.5])
    assert tp.pairwise_distance(x1, x2, eps=0.0).item() == pytest.approx(5 ** 0.5)
    np.testing.assert_allclose(tp.pairwise_distance(up(queue, [[0.0, 0.0], [3.0, 4.0]]),
                                                    up(queue, [0.0, 0.0]), p=1,
                                                    keepdim=True).to_host(),
                               [[2e-6], [7.0 + 2e-6]], rtol=1e-6)
    a, p, n = up(queue, [[0.0, 0.0]]), up(queue, [[1.0, 0.0]]), up(queue, [[2.0, 0.0]])
    assert tp.triplet_margin_loss(a, p, n, eps=0.0).item() == 0.0          # 1 + 1 - 2
    # swap: the positive is nearer the negative (1) than the anchor is (2): 1 + 1 - 1
    assert tp.triplet_margin_loss(a, p, n, eps=0.0, swap=True).item() == pytest.approx(1.0)
    logits, targets = up(queue, [[0.0, 0.0]]), up(queue, [[1.0, 0.0]])
    assert tp.multilabel_soft_margin_loss(logits, targets).item() == pytest.approx(np.log(2))
    # PyTorch's documented example: labels 3 and 0, the rest after -1 ignored
    assert tp.multilabel_margin_loss(scores, up(queue, [[3, 0, -1, 1]], np.int64)).item() == \
        pytest.approx(0.85)
    assert tp.multilabel_margin_loss(scores, up(queue, [[3, 3, -1, 1]], np.int64)).item() == \
        pytest.approx(2 * 1.3 / 4)                        # a label listed twice counts twice
    assert tp.multilabel_margin_loss(scores, up(queue, [[-1, 0, 1, 2]], np.int64)).item() == 0


def test_pairwise_distance_holds_as_pytorch_with_broadcasting(queue, rng):
    x1 = rng.standard_normal((4, 3)).astype(np.float32)
    x2 = rng.standard_normal((3,)).astype(np.float32)
    for p, keepdim in [(2.0, False), (1.0, True), (3.5, False)]:
        n1, n2 = leaf(queue, x1), leaf(queue, x2)
        with tp.Tape() as tape:
            d = tp.pairwise_distance(n1, n2, p, keepdim=keepdim)
        tape.backward(tp.sum(d * d))
        t1 = torch.tensor(x1, dtype=torch.float64, requires_grad=True)
        t2 = torch.tensor(x2, dtype=torch.float64, requires_grad=True)
        td = F.pairwise_distance(t1, t2, p, keepdim=keepdim)
        (td * td).sum().backward()
        np.testing.assert_allclose(d.to_host(), td.detach().numpy(), rtol=1e-5)
        np.testing.assert_allclose(n1.grad.to_host(), t1.grad.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(n2.grad.to_host(), t2.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_pairwise_distance_module_holds_as_pytorchs(queue, rng):
    x1, x2 = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    for args in [(), (1.0, 1e-3, True)]:
        got = pc.nn.PairwiseDistance(*args)(up(queue, x1), up(queue, x2)).to_host()
        want = torch.nn.PairwiseDistance(*args)(torch.tensor(x1), torch.tensor(x2)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_bad_arguments_raise_errors_naming_the_op_and_shapes(queue):
    x, y2 = up(queue, np.zeros((2, 3))), up(queue, np.zeros((2, 3)))
    labels = up(queue, [0, 2], np.int64)
    with pytest.raises(ParclError, match="margin_ranking_loss: 'avg' is not a valid value"):
        tp.margin_ranking_loss(x, y2, y2, reduction="avg")
    with pytest.raises(ShapeError, match=r"same number of dimensions.*\(2, 3\).*\(3,\)"):
        tp.margin_ranking_loss(x, y2, up(queue, np.ones(3)))
    with pytest.raises(ShapeError, match=r"hinge_embedding_loss: shapes \(2, 3\) and \(2,\)"):
        tp.hinge_embedding_loss(x, up(queue, np.ones(2)))
    with pytest.raises(ParclError, match="margin must be greater than 0, got 0"):
        tp.triplet_margin_loss(x, x, x, margin=0)
    with pytest.raises(ShapeError, match=r"anchor \(2, 3\), positive \(3,\)"):
        tp.triplet_margin_loss(x, up(queue, np.ones(3)), x)
    with pytest.raises(ParclError, match="only p == 1 and p == 2 supported, got p=3"):
        tp.multi_margin_loss(x, labels, p=3)
    with pytest.raises(ShapeError, match=r"inconsistent target size: got target \(3,\) for "
                                         r"input \(2, 3\), expected \(2,\)"):
        tp.multi_margin_loss(x, up(queue, [0, 1, 2], np.int64))
    with pytest.raises(DTypeError, match="multi_margin_loss: target has dtype float32"):
        tp.multi_margin_loss(x, up(queue, [0.0, 1.0]))
    with pytest.raises(ShapeError, match=r"one weight per class, \(3,\) for input \(2, 3\), "
                                         r"got \(2,\)"):
        tp.multi_margin_loss(x, labels, weight=up(queue, [1.0, 2.0]))
    with pytest.raises(ShapeError, match=r"target \(2, 1\) must have the input's shape"):
        tp.multilabel_soft_margin_loss(x, up(queue, np.ones((2, 1))))
    with pytest.raises(ParclError, match="TripletMarginLoss: margin must be greater than 0"):
        pc.nn.TripletMarginLoss(margin=-1.0)
    with pytest.raises(ParclError, match="MultiMarginLoss: only p == 1 and p == 2"):
        pc.nn.MultiMarginLoss(p=3)
    with pytest.raises(ParclError, match="not a valid value for reduction"):
        pc.nn.HingeEmbeddingLoss(reduction="batchmean")


def test_a_multilabel_target_out_of_range_is_a_shape_error_even_after_the_end(queue):
    """PyTorch checks every entry of the target, after a row's -1 too, against [-1, C)."""
    x = up(queue, np.zeros((2, 4)))
    with pytest.raises(ShapeError, match=r"multilabel_margin_loss: label 4 at position \(1, 3\) "
                                         r"of labels \(2, 4\) is out of range for input "
                                         r"\(2, 4\) \(4 classes, -1 ending"):
        tp.multilabel_margin_loss(x, up(queue, [[0, -1, 1, 1], [2, -1, 0, 4]], np.int64))
    node = leaf(queue, np.zeros(4))
    with tp.Tape() as tape:
        loss = tp.multilabel_margin_loss(node, up(queue, [1, -2, -1, 0], np.int64))
    with pytest.raises(ShapeError, match=r"label -2 at position \(1,\)"):
        tape.backward(loss)
    with pytest.raises(ShapeError, match=r"inconsistent target size: got target \(2, 3\) "
                                         r"for input \(2, 4\)"):
        tp.multilabel_margin_loss(x, up(queue, np.zeros((2, 3)), np.int64))
    with pytest.raises(DTypeError, match="multilabel_margin_loss: target has dtype float32"):
        tp.multilabel_margin_loss(x, up(queue, np.zeros((2, 4))))


def test_a_label_out_of_range_is_a_shape_error_naming_the_loss(queue):
    x = up(queue, np.zeros((2, 4)))
    with pytest.raises(ShapeError, match=r"multi_margin_loss: label 4 at position \(1,\) of "
                                         r"labels \(2,\) is out of range for input \(2, 4\) "
                                         r"\(4 classes\)"):
        tp.multi_margin_loss(x, up(queue, [1, 4], np.int64))      # not recorded: at once
    node = leaf(queue, np.zeros((2, 4)))
    with tp.Tape() as tape:
        loss = tp.multi_margin_loss(node, up(queue, [-1, 2], np.int64))
    with pytest.raises(ShapeError, match=r"label -1 at position \(0,\)"):
        tape.backward(loss)                                        # recorded: in the backward


MODULES = [
    (lambda q: pc.nn.MarginRankingLoss(0.5, reduction="sum"),
     torch.nn.MarginRankingLoss(0.5, reduction="sum"), "margin_ranking_loss",
     "margin=0.5, reduction='sum'"),
    (lambda q: pc.nn.HingeEmbeddingLoss(2.0), torch.nn.HingeEmbeddingLoss(2.0),
     "hinge_embedding_loss", "margin=2.0, reduction='mean'"),
    (lambda q: pc.nn.TripletMarginLoss(1.5, 1.0, swap=True, reduction="none"),
     torch.nn.TripletMarginLoss(1.5, 1.0, swap=True, reduction="none"), "triplet_margin_loss",
     "margin=1.5, p=1.0, eps=1e-06, swap=True, reduction='none'"),
    (lambda q: pc.nn.MultiMarginLoss(2, 0.5, up(q, W)),
     torch.nn.MultiMarginLoss(2, 0.5, torch.tensor(W)), "multi_margin_loss",
     "p=2, margin=0.5, reduction='mean'"),
    (lambda q: pc.nn.MultiLabelMarginLoss(reduction="sum"),
     torch.nn.MultiLabelMarginLoss(reduction="sum"), "multilabel_margin_loss",
     "reduction='sum'"),
    (lambda q: pc.nn.MultiLabelSoftMarginLoss(up(q, W)),
     torch.nn.MultiLabelSoftMarginLoss(torch.tensor(W)), "multilabel_soft_margin_loss",
     "reduction='mean'"),
]


@pytest.mark.parametrize("make,torch_layer,name,shown", MODULES, ids=[m[2] for m in MODULES])
def test_modules_hold_as_pytorchs(queue, rng, make, torch_layer, name, shown):
    layer = make(queue)
    arrays = _inputs(rng, name, 7)
    grads = CASES[name][3]
    nodes = [_parcl(queue, a, g) for a, g in zip(arrays, grads)]
    with tp.Tape() as tape:
        y = tp.sum(layer(*nodes))
    tape.backward(y)
    tensors = [torch.tensor(a) if a.dtype.kind == "i" else torch.tensor(a, requires_grad=g)
               for a, g in zip(arrays, grads)]
    want = torch_layer(*tensors).sum()
    want.backward()
    np.testing.assert_allclose(y.item(), want.item(), rtol=1e-5)
    np.testing.assert_allclose(nodes[0].grad.to_host(), tensors[0].grad.numpy(), rtol=1e-5,
                               atol=1e-6)
    assert layer.parameters() == [] and repr(layer) == f"{type(layer).__name__}({shown})"
    assert list(layer.state_dict()) == list(torch_layer.state_dict())


def _mlp(queue):
    pc.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(6, 8, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(8, 4, queue=queue))


def _step(devices, x, y, loss_fn, reduction="mean", capture=False, build=_mlp):
    with ReplicaGroup(build, devices, capture=capture) as g:
        opt = pc.optim.SGD(g.parameters(), lr=0.1)
        losses = [g.step(x, y, loss_fn, opt, reduction=reduction) for _ in range(2)]
        return losses, g.model.state_dict()


def _group_cases(queue):
    rng = np.random.default_rng(3)
    n = 7                           # shards of 4 and 3 rows
    signs = np.sign(rng.standard_normal(n)).astype(np.float32)
    return [
        ("margin_ranking_loss", signs,
         lambda o, y: tp.margin_ranking_loss(o[:, 0], o[:, 1], y, 0.5)),
        ("hinge_embedding_loss", np.sign(rng.standard_normal((n, 4))).astype(np.float32),
         pc.nn.HingeEmbeddingLoss(0.5)),
        ("triplet_margin_loss", rng.standard_normal((n, 2)).astype(np.float32),
         lambda o, y: tp.triplet_margin_loss(o[:, :2], o[:, 2:], y, swap=True)),
        ("multi_margin_loss", rng.integers(0, 4, n),
         pc.nn.MultiMarginLoss(2, weight=up(queue, W[:4]))),
        ("multilabel_margin_loss", _multilabels(rng, (n, 4)), pc.nn.MultiLabelMarginLoss()),
        ("multilabel_soft_margin_loss", (rng.uniform(size=(n, 4)) > 0.5).astype(np.float32),
         pc.nn.MultiLabelSoftMarginLoss(up(queue, W[:4]))),
    ]


def test_a_two_replica_step_through_each_loss_equals_the_full_batch_step(devices2, queue):
    """Every loss is a mean over its rows (a per-row term, then ``tp.mean``): the group
    weighs the replicas' shares by their rows, and two uneven shards step as the whole batch
    on one replica, eagerly and replaying a captured step."""
    x = np.random.default_rng(0).standard_normal((7, 6)).astype(np.float32)
    for name, y, loss_fn in _group_cases(queue):
        one, p1 = _step(devices2[:1], x, y, loss_fn)
        for capture in (False, True):
            two, p2 = _step(devices2, x, y, loss_fn, capture=capture)
            np.testing.assert_allclose(two, one, rtol=1e-5, err_msg=name)
            for k in p1:
                np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6, err_msg=name)
        assert one[1] < one[0], name                      # it trains


def test_a_summed_margin_loss_is_weighed_as_a_sum_and_refused_as_a_mean(devices2, queue):
    x = np.random.default_rng(1).standard_normal((7, 6)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 4, 7)
    loss_fn = pc.nn.MultiMarginLoss(reduction="sum")
    one, p1 = _step(devices2[:1], x, y, loss_fn, reduction="sum")
    two, p2 = _step(devices2, x, y, loss_fn, reduction="sum")
    np.testing.assert_allclose(two, one, rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(ParclError, match="returned a sum"):
        _step(devices2, x, y, loss_fn)
    with pytest.raises(ParclError, match="returned a mean"):
        _step(devices2, x, y, pc.nn.MultiMarginLoss(), reduction="sum")


POISSON_KWARGS = [{}, {"full": True}, {"log_input": False}, {"log_input": False, "full": True,
                                                            "eps": 1e-3}]


def _poisson_inputs(rng, n, log_input=True):
    x = rng.standard_normal((n, 4)).astype(np.float32)
    if not log_input:
        x = np.abs(x) + 0.1                                  # rates
    t = rng.poisson(2.0, (n, 4)).astype(np.float32)
    t.flat[:3] = [0.0, 1.0, 0.5]                             # around Stirling's mask
    return x, t


def _grads_hold(nodes, tensors):
    for node, t in zip(nodes, tensors):
        if t.requires_grad:
            np.testing.assert_allclose(node.grad.to_host(), t.grad.numpy(), rtol=2e-5,
                                       atol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("n", [1, 7, 64])
def test_poisson_nll_loss_and_its_gradients_hold_as_pytorch(queue, rng, reduction, n):
    for kw in POISSON_KWARGS:
        x, t = _poisson_inputs(rng, n, kw.get("log_input", True))
        t[t == 0] = 3.0          # PyTorch's target gradient at 0 with full=True is NaN (below)
        nodes = [leaf(queue, x), leaf(queue, t)]
        tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, t)]
        with tp.Tape() as tape:
            y = tp.poisson_nll_loss(*nodes, reduction=reduction, **kw)
        ty = F.poisson_nll_loss(*tensors, reduction=reduction, **kw)
        g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
        tape.backward(y, grad=up(queue, g))
        ty.backward(torch.tensor(g, dtype=torch.float64))
        np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=2e-5, atol=1e-6)
        _grads_hold(nodes, tensors)


def test_poisson_full_gives_a_zero_count_its_gradient_where_pytorchs_is_nan(queue):
    """With ``full=True`` PyTorch masks Stirling's term ``t log t`` where ``t <= 1`` after
    computing it, so a count of 0 gets the target gradient ``0 * log 0``, NaN; the term does
    not depend on a count <= 1 at all, so parcl's is that of ``exp(x) - t x``: ``-x``."""
    x = up(queue, [0.1, 0.2, 0.3, 0.4])
    t = leaf(queue, [0.0, 0.5, 1.0, 3.0])
    with tp.Tape() as tape:
        loss = tp.poisson_nll_loss(x, t, full=True, reduction="sum")
    tape.backward(loss)
    tt = torch.tensor([0.0, 0.5, 1.0, 3.0], dtype=torch.float64, requires_grad=True)
    want = F.poisson_nll_loss(torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), tt,
                              full=True, reduction="sum")
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert np.isnan(tt.grad[0].item())
    np.testing.assert_allclose(t.grad.to_host(), [-0.1, *tt.grad.numpy()[1:]], rtol=1e-6)


VAR_SHAPES = [(7, 4), (7,), (7, 1), (1, 4)]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("var_shape", VAR_SHAPES, ids=str)
def test_gaussian_nll_loss_and_its_gradients_hold_as_pytorch(queue, rng, reduction,
                                                             var_shape):
    """Variances of every shape PyTorch takes, one of them below ``eps``: clamped in value,
    its gradient passed through as PyTorch's."""
    x, t = (rng.standard_normal((7, 4)).astype(np.float32) for _ in range(2))
    var = rng.uniform(0.1, 2.0, var_shape).astype(np.float32)
    var.flat[0] = 1e-8
    for kw in [{}, {"full": True, "eps": 1e-3}]:
        nodes = [leaf(queue, a) for a in (x, t, var)]
        tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True)
                   for a in (x, t, var)]
        with tp.Tape() as tape:
            y = tp.gaussian_nll_loss(*nodes, reduction=reduction, **kw)
        ty = F.gaussian_nll_loss(*tensors, reduction=reduction, **kw)
        g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
        tape.backward(y, grad=up(queue, g))
        ty.backward(torch.tensor(g, dtype=torch.float64))
        assert y.shape == tuple(ty.shape)
        np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=2e-5, atol=1e-5)
        _grads_hold(nodes, tensors)


def test_gaussian_nll_loss_with_a_number_as_variance_holds_as_pytorch(queue, rng):
    x, t = (rng.standard_normal((5, 3)).astype(np.float32) for _ in range(2))
    for var in (0.5, 1e-9):
        got = tp.gaussian_nll_loss(up(queue, x), up(queue, t), var, full=True).item()
        want = F.gaussian_nll_loss(torch.tensor(x, dtype=torch.float64),
                                   torch.tensor(t, dtype=torch.float64), var, full=True)
        assert got == pytest.approx(want.item(), rel=2e-5)


def test_likelihood_losses_pass_gradcheck(queue, rng):
    x, t = _poisson_inputs(rng, 3)
    t[(t == 0) | (t == 1)] = 2.5                   # off 0 and Stirling's switch at 1
    inputs = [leaf(queue, x), leaf(queue, t)]
    for kw in POISSON_KWARGS[:2]:
        assert tp.gradcheck(lambda a, b, kw=kw: tp.poisson_nll_loss(a, b, reduction="sum", **kw),
                            inputs), kw
    var = leaf(queue, rng.uniform(0.5, 2.0, (3,)))
    assert tp.gradcheck(lambda a, b, v: tp.gaussian_nll_loss(a, b, v, full=True,
                                                             reduction="sum"),
                        [leaf(queue, x), leaf(queue, t), var])


def test_likelihood_concrete_values(queue):
    rate, counts = up(queue, [0.0, 1.0]), up(queue, [2.0, 0.0])
    np.testing.assert_allclose(tp.poisson_nll_loss(rate, counts, reduction="none").to_host(),
                               [1.0, np.e], rtol=1e-6)
    stirling = 2 * np.log(2) - 2 + 0.5 * np.log(2 * np.pi * 2)
    assert tp.poisson_nll_loss(rate, counts, full=True).item() == pytest.approx(
        (1.0 + stirling + np.e) / 2)
    assert tp.poisson_nll_loss(up(queue, [2.0]), up(queue, [1.0]), log_input=False,
                               eps=0.0).item() == pytest.approx(2.0 - np.log(2.0))
    mu, var = up(queue, [[0.0, 1.0]]), up(queue, [1.0])
    assert tp.gaussian_nll_loss(mu, up(queue, [[2.0, 0.0]]), var, reduction="sum").item() == 2.5
    assert tp.gaussian_nll_loss(mu, mu, up(queue, [[np.e ** 2, 1.0]])).item() == \
        pytest.approx(0.5)


def test_a_negative_variance_is_nan_or_refused(queue):
    """PyTorch raises on a negative variance (a host read); parcl's loss and gradients are
    NaN there, never the clamped, finite value, and a negative number is refused."""
    x = up(queue, np.zeros((2, 2)))
    var = leaf(queue, [1.0, -0.5])
    with tp.Tape() as tape:
        loss = tp.gaussian_nll_loss(x, up(queue, np.ones((2, 2))), var, reduction="none")
    tape.backward(tp.sum(loss))
    rows = loss.to_host()                   # var (2,): one per row of the (2, 2) input
    assert np.isfinite(rows[0]).all() and np.isnan(rows[1]).all()
    assert np.isfinite(var.grad.to_host()[0]) and np.isnan(var.grad.to_host()[1])
    with pytest.raises(ParclError, match=r"gaussian_nll_loss: var has a negative entry"):
        tp.gaussian_nll_loss(x, x, -1.0)


def test_likelihood_losses_bad_arguments_name_the_op_and_shapes(queue):
    x = up(queue, np.zeros((4, 3)))
    with pytest.raises(ShapeError, match=r"gaussian_nll_loss: var is of incorrect size: "
                                         r"\(4, 2\) for input \(4, 3\)"):
        tp.gaussian_nll_loss(x, x, up(queue, np.ones((4, 2))))
    with pytest.raises(ShapeError, match=r"var is of incorrect size: \(1, 1\)"):
        tp.gaussian_nll_loss(x, x, up(queue, np.ones((1, 1))))      # two dims shared: no
    with pytest.raises(DTypeError, match="gaussian_nll_loss: var must be"):
        tp.gaussian_nll_loss(x, x, "1.0")
    with pytest.raises(ParclError, match="gaussian_nll_loss: 'avg' is not a valid value"):
        tp.gaussian_nll_loss(x, x, 1.0, reduction="avg")
    with pytest.raises(ShapeError, match=r"poisson_nll_loss: shapes \(4, 3\) and \(2,\)"):
        tp.poisson_nll_loss(x, up(queue, np.ones(2)))
    with pytest.raises(ParclError, match="not a valid value for reduction"):
        pc.nn.PoissonNLLLoss(reduction="batchmean")


def test_likelihood_modules_hold_as_pytorchs(queue, rng):
    x, t = _poisson_inputs(rng, 6)
    poisson = pc.nn.PoissonNLLLoss(full=True, eps=1e-4, reduction="sum")
    assert poisson(up(queue, x), up(queue, t)).item() == pytest.approx(
        torch.nn.PoissonNLLLoss(full=True, eps=1e-4, reduction="sum")(
            torch.tensor(x), torch.tensor(t)).item(), rel=1e-5)
    assert repr(poisson) == "PoissonNLLLoss(log_input=True, full=True, eps=0.0001, " \
                            "reduction='sum')"
    var = rng.uniform(0.5, 2.0, (6, 1)).astype(np.float32)
    gauss = pc.nn.GaussianNLLLoss(full=True, eps=1e-3, reduction="none")
    np.testing.assert_allclose(
        gauss(up(queue, x), up(queue, t), up(queue, var)).to_host(),
        torch.nn.GaussianNLLLoss(full=True, eps=1e-3, reduction="none")(
            torch.tensor(x), torch.tensor(t), torch.tensor(var)).numpy(), rtol=1e-5)
    assert repr(gauss) == "GaussianNLLLoss(full=True, eps=0.001, reduction='none')"
    assert poisson.state_dict() == {} and gauss.parameters() == []


def test_a_two_replica_step_through_the_likelihood_losses_equals_the_full_batch(devices2):
    """Both are means over their elements, the same number per row: the group weighs them by
    rows, and two uneven shards step as the whole batch on one replica."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, 6)).astype(np.float32)
    cases = [
        ("poisson", rng.poisson(2.0, (7, 4)).astype(np.float32),
         pc.nn.PoissonNLLLoss(full=True)),
        ("gaussian, a variance per row", rng.standard_normal((7, 3)).astype(np.float32),
         lambda o, y: tp.gaussian_nll_loss(o[:, :3], y, tp.exp(o[:, 3]))),
        ("gaussian, a variance per output", rng.standard_normal((7, 2)).astype(np.float32),
         lambda o, y: pc.nn.GaussianNLLLoss(full=True)(o[:, :2], y, tp.exp(o[:, 2:]))),
    ]
    for name, y, loss_fn in cases:
        one, p1 = _step(devices2[:1], x, y, loss_fn)
        for capture in (False, True):
            two, p2 = _step(devices2, x, y, loss_fn, capture=capture)
            np.testing.assert_allclose(two, one, rtol=1e-5, err_msg=name)
            for k in p1:
                np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6, err_msg=name)
        assert one[1] < one[0], name


def _ctc_batch(rng, t=12, n=4, c=6, s=5):
    """Logits (T, N, C), padded targets (a repeated label in row 0, an empty row 2) and their
    lengths; the concatenated targets too."""
    logits = rng.standard_normal((t, n, c)).astype(np.float32)
    targets = rng.integers(1, c, (n, s))
    targets[0, 1] = targets[0, 0]
    input_lengths, target_lengths = np.array([t, t - 2, 7, t]), np.array([s, 3, 0, 4])
    concat = np.concatenate([targets[i, :target_lengths[i]] for i in range(n)])
    return logits, targets, concat, input_lengths, target_lengths


def _ctc_against_torch(queue, rng, logits, targets, ilen, tlen, lengths_as, **kw):
    """The loss of ``log_softmax(logits)`` and the logits' gradient against PyTorch's."""
    node = leaf(queue, logits)
    lengths = [up(queue, v, targets.dtype) if lengths_as == "tensor" else np.asarray(v).tolist()
               for v in (ilen, tlen)]
    with tp.Tape() as tape:
        y = tp.ctc_loss(tp.log_softmax(node, axis=-1), up(queue, targets, targets.dtype),
                        *lengths, **kw)
    tx = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    ty = F.ctc_loss(tx.log_softmax(-1), torch.tensor(targets), torch.tensor(ilen),
                    torch.tensor(tlen), **kw)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    tape.backward(y, grad=up(queue, g))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(node.grad.to_host(), tx.grad.numpy(), rtol=2e-4, atol=1e-5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("form", ["padded", "concatenated"])
def test_ctc_loss_and_its_gradient_hold_as_pytorch(queue, rng, reduction, form):
    logits, padded, concat, ilen, tlen = _ctc_batch(rng)
    targets = padded if form == "padded" else concat
    for lengths_as, dtype in [("tensor", np.int64), ("sequence", np.int32)]:
        _ctc_against_torch(queue, rng, logits, targets.astype(dtype), ilen, tlen, lengths_as,
                           reduction=reduction)


def test_ctc_loss_over_a_large_batch_of_concatenated_targets_holds_as_pytorch(queue, rng):
    """Concatenated targets with lengths from the host: the alphas take the longest target's
    states, not the whole concatenation's (2 * 16272 + 1 states for each of 1024 samples and
    80 steps was a tensor of 2.7e9 elements, refused, where PyTorch gives the loss)."""
    t, n, c, s = 80, 1024, 5, 16
    logits = rng.standard_normal((t, n, c)).astype(np.float32)
    tlen = np.full(n, s)
    tlen[::64] = 9
    targets = rng.integers(1, c, int(tlen.sum()))
    _ctc_against_torch(queue, rng, logits, targets, np.full(n, t), tlen, "sequence")


def test_ctc_loss_with_another_blank_and_one_sample_holds_as_pytorch(queue, rng):
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    _ctc_against_torch(queue, rng, logits, np.array([0, 1, 1]), 6, 3, "sequence", blank=2)
    _ctc_against_torch(queue, rng, logits[:, None], np.array([[3, 3, 0]]), [6], [3],
                       "sequence", blank=1, reduction="none")


def test_an_impossible_alignment_is_inf_or_zero_with_zero_infinity_as_pytorch(queue, rng):
    """[1, 1] needs 3 frames (a blank between the repeats): in 2 the loss is inf and its
    gradient NaN, as PyTorch's; ``zero_infinity`` makes both 0 and leaves the other sample."""
    logits = rng.standard_normal((4, 2, 3)).astype(np.float32)
    targets = np.array([[1, 1], [2, 1]])
    _ctc_against_torch(queue, rng, logits, targets, [4, 4], [2, 2], "sequence",
                       reduction="none", zero_infinity=False)
    out = tp.ctc_loss(up(queue, logits), up(queue, targets, np.int64), [2, 4], [2, 2],
                      reduction="none")
    assert np.isinf(out.to_host()[0]) and np.isfinite(out.to_host()[1])
    _ctc_against_torch(queue, rng, logits, targets, [2, 4], [2, 2], "sequence",
                       reduction="sum", zero_infinity=True)


def test_ctc_loss_concrete_value_and_gradcheck(queue, rng):
    # uniform over {blank, 1} for 3 frames: 6 of the 8 paths collapse to [1]
    lp = tp.log_softmax(tp.tensor(np.zeros((3, 1, 2))), axis=2)
    loss = tp.ctc_loss(lp, up(queue, [[1]], np.int64), [3], [1])
    assert loss.item() == pytest.approx(-np.log(6 / 8))
    # the gradient with respect to log_probs as given (no log_softmax before it)
    log_probs = leaf(queue, rng.standard_normal((5, 2, 3)) - 1.0)
    targets = up(queue, [[1, 2], [2, 2]], np.int64)
    assert tp.gradcheck(lambda a: tp.ctc_loss(a, targets, [5, 4], [2, 2], reduction="sum"),
                        [log_probs])


def test_ctc_bad_labels_and_lengths_raise_shape_errors_naming_them(queue):
    zeros = up(queue, np.zeros((5, 1, 3)))
    cases = [
        ([[1, 3]], [5], [2], r"label 3 at position \(0, 1\) of targets \(1, 2\) is out of "
                             r"range for log_probs \(5, 1, 3\) \(3 classes\)"),
        ([[1, 2]], [6], [2], r"input_lengths\[0\] = 6 is outside \[0, 5\]"),
        ([[1, 2]], [5], [3], r"target_lengths\[0\] = 3 is outside \[0, 2\] \(padded"),
        ([1, 2], [5], [3], r"target_lengths\[0\] = 3 is negative or runs past the "
                           r"concatenated targets \(2,\)"),
    ]
    for targets, ilen, tlen, message in cases:
        with pytest.raises(ShapeError, match="ctc_loss: " + message):
            tp.ctc_loss(zeros, up(queue, targets, np.int64), ilen, tlen)
    node = leaf(queue, np.zeros((5, 1, 3)))
    with tp.Tape() as tape:
        loss = tp.ctc_loss(node, up(queue, [[1, 5]], np.int64), [5], [2])
    with pytest.raises(ShapeError, match="label 5"):
        tape.backward(loss)                                        # recorded: in the backward
    with pytest.raises(ParclError, match=r"blank must be a class index in \[0, 3\), got 3"):
        tp.ctc_loss(zeros, up(queue, [[1]], np.int64), [5], [1], blank=3)
    with pytest.raises(DTypeError, match="input_lengths has dtype int32, the targets int64"):
        tp.ctc_loss(zeros, up(queue, [[1]], np.int64), up(queue, [5], np.int32), [1])
    with pytest.raises(ShapeError, match=r"targets must be padded rows \(1, S\)"):
        tp.ctc_loss(zeros, up(queue, [[1], [2]], np.int64), [5], [1])
    with pytest.raises(ShapeError, match=r"input_lengths must be 1 int lengths"):
        tp.ctc_loss(zeros, up(queue, [[1]], np.int64), [5, 5], [1])


def test_ctc_lengths_from_the_host_are_refused_inside_a_captured_step(queue):
    """A replay would reuse the lengths uploaded when the step was recorded, whatever the
    batch: inside ``tp.capture`` they must be pc.Tensors (read on the device each replay)."""
    w = leaf(queue, np.zeros((5, 1, 3)))
    targets = up(queue, [[1, 2]], np.int64)

    def step(lengths):
        with tp.Tape() as tape:
            loss = tp.ctc_loss(w * 1.0, targets, lengths, [2])
        tape.backward(loss)
        return loss.value

    with pytest.raises(ParclError, match="inside a captured step input_lengths must be a "
                                         "pc.Tensor"):
        tp.capture(lambda x: step([5]), queue)(up(queue, [0.0]))


def test_ctc_module_holds_as_pytorchs(queue, rng):
    logits, targets, _, ilen, tlen = _ctc_batch(rng)
    layer = pc.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    lp = np.log(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    got = layer(up(queue, lp), up(queue, targets, np.int64), ilen, tlen).item()
    want = torch.nn.CTCLoss(0, "sum", True)(torch.tensor(lp), torch.tensor(targets),
                                           torch.tensor(ilen), torch.tensor(tlen))
    assert got == pytest.approx(want.item(), rel=1e-5)
    assert repr(layer) == "CTCLoss(blank=0, reduction='sum', zero_infinity=True)"


def test_the_kernel_losses_give_the_same_gradient_bits_twice(queue, rng):
    """CTC's recursions and the multi-label counts use no float atomics: the same inputs give
    the same gradient, bit for bit."""
    logits, _, concat, ilen, tlen = _ctc_batch(rng)
    targets = up(queue, concat, np.int64)
    assert_same_gradient_bits_twice(queue, logits, lambda x: tp.ctc_loss(
        tp.log_softmax(x, axis=2), targets, ilen, tlen))
    labels = up(queue, _multilabels(rng, (9, 5)), np.int64)
    assert_same_gradient_bits_twice(queue, rng.standard_normal((9, 5)).astype(np.float32),
                                    lambda x: tp.multilabel_margin_loss(x, labels))


def _sequence_model(queue):
    pc.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(6, 8, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(8, 5 * 3, queue=queue))


def _ctc_from_rows(out, y):
    """(N, 15) outputs as (T=5, N, C=3) log-probabilities; ``y`` rows are [input length,
    target length, padded targets...]."""
    n = out.shape[0]
    lp = tp.log_softmax(tp.permute(tp.reshape(out, (n, 5, 3)), (1, 0, 2)), axis=2)
    return pc.nn.CTCLoss()(lp, y[:, 2:], y[:, 0], y[:, 1])


def test_a_two_replica_step_through_ctc_loss_equals_the_full_batch_step(devices2):
    """The 'mean' CTC loss is a mean over its samples of each one's loss over its target
    length: the group weighs the shares by rows, eagerly and replaying a captured step (the
    lengths are pc.Tensors, part of each step's labels)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 6)).astype(np.float32)
    y = np.concatenate([rng.integers(3, 6, (7, 1)), rng.integers(0, 3, (7, 1)),
                        rng.integers(1, 3, (7, 2))], axis=1)
    one, p1 = _step(devices2[:1], x, y, _ctc_from_rows, build=_sequence_model)
    for capture in (False, True):
        two, p2 = _step(devices2, x, y, _ctc_from_rows, capture=capture, build=_sequence_model)
        np.testing.assert_allclose(two, one, rtol=1e-5)
        for k in p1:
            np.testing.assert_allclose(p2[k], p1[k], rtol=1e-5, atol=1e-6)
    assert one[1] < one[0]
