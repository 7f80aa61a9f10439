"""margin_ranking, hinge_embedding, triplet_margin, multi_margin and multilabel_soft_margin
losses, pairwise_distance and their pc.nn modules: every reduction against PyTorch in float64
(values and gradients), finite differences, concrete values, PyTorch's errors, and a
data-parallel step through each equal to the single-replica full-batch step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up
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
    return [x, (rng.uniform(size=x.shape) > 0.5).astype(np.float32)]


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


def _step(devices, x, y, loss_fn, reduction="mean", capture=False):
    with ReplicaGroup(_mlp, devices, capture=capture) as g:
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
