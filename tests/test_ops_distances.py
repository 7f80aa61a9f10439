"""``tp.pdist`` and ``tp.triplet_margin_with_distance_loss`` / ``nn.TripletMarginWithDistanceLoss``:
PyTorch's values (float64 references), gradients (finite differences and torch's), defaults
and refusals naming the op."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 0.5, 0.0, math.inf])
def test_pdist_gives_every_pair_of_rows_distance_as_pytorch(queue, rng, p):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    x[3] = x[1]                                   # one pair at distance 0
    got = tp.pdist(tp.tensor(x), p).to_host()
    want = torch.pdist(torch.tensor(x, dtype=torch.float64), p).numpy()
    assert got.shape == (10,)
    close(got, want, 1e-5)


def test_pdist_gradient_matches_finite_differences_and_pytorch(queue, rng):
    x0 = rng.standard_normal((4, 3)).astype(np.float32)
    for p in (2.0, 1.5, 1.0):
        x = leaf(queue, x0)
        assert tp.gradcheck(lambda v, p=p: tp.pdist(v, p), [x])
    x0[2] = x0[0]                                  # equal rows: gradient 0 there, as PyTorch
    g = rng.standard_normal(6).astype(np.float32)
    x = leaf(queue, x0)
    with tp.Tape() as tape:
        y = tp.pdist(x)
    tape.backward(tp.sum(tp.mul(y, tp.tensor(g))))
    tx = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    (torch.pdist(tx) * torch.tensor(g)).sum().backward()
    close(x.grad.to_host(), tx.grad.numpy())


def test_pdist_of_one_row_is_empty_and_bad_input_is_refused(queue):
    assert tp.pdist(tp.tensor(np.ones((1, 3), np.float32))).shape == (0,)
    with pytest.raises(pc.ShapeError, match=r"pdist: only supports 2D tensors \(N, M\), got "
                                            r"input of shape \(2, 2, 2\)"):
        tp.pdist(tp.tensor(np.ones((2, 2, 2), np.float32)))
    with pytest.raises(pc.ParclError, match="pdist: only supports non-negative p values"):
        tp.pdist(tp.tensor(np.ones((2, 2), np.float32)), -1.0)


def cosine_distance(a, b):
    return 1.0 - tp.cosine_similarity(a, b)


def torch_cosine_distance(a, b):
    return 1.0 - F.cosine_similarity(a, b)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_triplet_margin_with_distance_loss_values_and_gradients_as_pytorch(queue, rng, swap,
                                                                           reduction):
    arrays = [rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3)]
    nodes = [leaf(queue, a) for a in arrays]
    with tp.Tape() as tape:
        loss = tp.triplet_margin_with_distance_loss(
            *nodes, distance_function=cosine_distance, margin=0.7, swap=swap,
            reduction=reduction)
        total = tp.sum(loss)
    tape.backward(total)
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    want = F.triplet_margin_with_distance_loss(*ts, distance_function=torch_cosine_distance,
                                               margin=0.7, swap=swap, reduction=reduction)
    want.sum().backward()
    close(loss.to_host(), want.detach().numpy())
    for node, t in zip(nodes, ts):
        close(node.grad.to_host(), t.grad.numpy())


def test_triplet_margin_with_distance_loss_defaults_to_pairwise_distance(queue, rng):
    arrays = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(3)]
    nodes = [leaf(queue, a) for a in arrays]
    got = tp.triplet_margin_with_distance_loss(*nodes)
    close(got.to_host(), tp.triplet_margin_loss(*nodes).to_host(), 1e-6)
    want = F.triplet_margin_with_distance_loss(*(torch.tensor(a) for a in arrays))
    close(got.to_host(), want.numpy())
    assert tp.gradcheck(lambda *v: tp.triplet_margin_with_distance_loss(*v, swap=True), nodes)


def test_triplet_margin_with_distance_loss_module_takes_pytorchs_keyword_arguments(queue, rng):
    arrays = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3)]
    layer = pc.nn.TripletMarginWithDistanceLoss(distance_function=cosine_distance, margin=0.5,
                                                swap=True, reduction="sum")
    assert repr(layer) == ("TripletMarginWithDistanceLoss(margin=0.5, swap=True, "
                           "reduction='sum')")
    want = torch.nn.TripletMarginWithDistanceLoss(distance_function=torch_cosine_distance,
                                                  margin=0.5, swap=True, reduction="sum")
    close(layer(*(tp.tensor(a) for a in arrays)).to_host(),
          want(*(torch.tensor(a) for a in arrays)).numpy())
    with pytest.raises(TypeError):
        pc.nn.TripletMarginWithDistanceLoss(cosine_distance)          # keyword-only
    with pytest.raises(pc.ParclError, match="TripletMarginWithDistanceLoss: margin must be "
                                            "greater than 0, got 0"):
        pc.nn.TripletMarginWithDistanceLoss(margin=0)


def test_triplet_margin_with_distance_loss_refuses_bad_input_naming_the_op(queue):
    a, b = tp.tensor(np.ones((2, 3), np.float32)), tp.tensor(np.ones(3, np.float32))
    op = "triplet_margin_with_distance_loss"
    with pytest.raises(pc.ShapeError, match=rf"{op}: the anchor, positive, and negative "
                                            r"tensors .* got anchor \(2, 3\), positive "
                                            r"\(2, 3\), negative \(3,\)"):
        tp.triplet_margin_with_distance_loss(a, a, b)
    with pytest.raises(pc.ParclError, match=f"{op}: margin must be greater than 0"):
        tp.triplet_margin_with_distance_loss(a, a, a, margin=-1.0)
    with pytest.raises(pc.ParclError, match=f"{op}: distance_function must be a callable"):
        tp.triplet_margin_with_distance_loss(a, a, a, distance_function=2.0)
    with pytest.raises(pc.ParclError, match=f"{op}: .avg. is not a valid value for reduction"):
        tp.triplet_margin_with_distance_loss(a, a, a, reduction="avg")
