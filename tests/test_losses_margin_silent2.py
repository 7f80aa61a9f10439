"""Silent wrong results found in the margin, likelihood and CTC losses: each test fails on the
code before its fix and checks PyTorch's values (float64 references)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import ShapeError


def test_tied_scores_at_the_hinge_get_pytorchs_gradient_in_the_ranking_and_triplet_losses(
        queue):
    """PyTorch's margin ranking and triplet losses end in ``clamp_min(0)``, whose gradient
    passes at the hinge itself: two tied scores at the default margin 0 (a ranker whose
    last layer starts at zero) still train."""
    x1, x2 = leaf(queue, [1.0, 2.0]), leaf(queue, [1.0, 2.0])
    with tp.Tape() as tape:
        loss = tp.margin_ranking_loss(x1, x2, up(queue, [1.0, -1.0]))
    tape.backward(loss)
    t1, t2 = (torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
              for _ in range(2))
    F.margin_ranking_loss(t1, t2, torch.tensor([1.0, -1.0], dtype=torch.float64)).backward()
    np.testing.assert_array_equal(x1.grad.to_host(), [-0.5, 0.5])
    np.testing.assert_array_equal(x1.grad.to_host(), t1.grad.numpy())
    np.testing.assert_array_equal(x2.grad.to_host(), t2.grad.numpy())

    # margin + d(a, p) - d(a, n) = 1 + 1 - 2 = 0
    points = [[[0.0, 0.0]], [[1.0, 0.0]], [[2.0, 0.0]]]
    nodes = [leaf(queue, v) for v in points]
    with tp.Tape() as tape:
        loss = tp.triplet_margin_loss(*nodes, eps=0.0)
    tape.backward(loss)
    tensors = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in points]
    F.triplet_margin_loss(*tensors, eps=0.0).backward()
    np.testing.assert_array_equal(nodes[1].grad.to_host(), [[1.0, 0.0]])
    np.testing.assert_array_equal(nodes[2].grad.to_host(), [[-1.0, 0.0]])
    for node, t in zip(nodes, tensors):
        np.testing.assert_allclose(node.grad.to_host(), t.grad.numpy())


def test_a_nan_log_probability_makes_the_ctc_loss_and_its_gradient_nan_as_pytorch(queue, rng):
    """A NaN among a sample's log-probabilities (a model that diverged) is NaN in its loss
    and its gradient, as PyTorch's, ``zero_infinity`` or not: the recursion's log-sum-exp
    took the larger of a NaN and an unreachable state's -inf as -inf, so the loss came out
    inf (0 under zero_infinity, with a zero gradient), and a NaN loss had its gradient
    zeroed."""
    logits = rng.standard_normal((6, 2, 3))
    lp = torch.tensor(logits).log_softmax(-1).numpy()
    lp[0, 0, 1] = np.nan                        # sample 0's first label at t = 0
    lp[2, 1, 2] = np.nan                        # sample 1's second label at t = 2
    targets, lengths = np.array([[1, 1], [1, 2]]), [6, 6]
    for zero_infinity, tlen in [(False, [1, 2]), (True, [1, 2]), (True, [2, 2])]:
        node = leaf(queue, lp)
        with tp.Tape() as tape:
            loss = tp.ctc_loss(node, up(queue, targets, np.int64), lengths, tlen,
                               reduction="none", zero_infinity=zero_infinity)
        tape.backward(loss, grad=up(queue, [1.0, 1.0]))
        t = torch.tensor(lp, requires_grad=True)
        want = F.ctc_loss(t, torch.tensor(targets), torch.tensor(lengths), torch.tensor(tlen),
                          reduction="none", zero_infinity=zero_infinity)
        want.sum().backward()
        np.testing.assert_array_equal(loss.to_host(), [np.nan, np.nan])
        np.testing.assert_array_equal(want.detach().numpy(), [np.nan, np.nan])
        grad = node.grad.to_host()
        np.testing.assert_array_equal(np.isnan(grad), np.isnan(t.grad.numpy()))
        assert np.isnan(grad[:, 0]).all() and np.isnan(grad[:, 1]).all()


def test_a_ctc_target_holding_the_blank_is_a_shape_error_naming_it(queue, rng):
    """PyTorch documents that a target cannot hold the blank (its kernels compute a number
    anyway, and parcl another): labels 0..C-1 with the default blank=0 are a common slip, so
    such a label is refused. Padding past a target's length may be anything (0, the blank,
    included)."""
    lp = up(queue, torch.tensor(rng.standard_normal((8, 2, 4))).log_softmax(-1).numpy())
    with pytest.raises(ShapeError, match=r"ctc_loss: label 0 at position \(0, 1\) of "
                                         r"targets \(2, 3\) is the blank \(blank=0\)"):
        tp.ctc_loss(lp, up(queue, [[1, 0, 2], [1, 2, 0]], np.int64), [8, 8], [3, 2])
    with pytest.raises(ShapeError, match=r"label 2 at position \(3,\) of targets \(4,\) is "
                                         r"the blank \(blank=2\)"):
        tp.ctc_loss(lp, up(queue, [1, 3, 1, 2], np.int32), [8, 8], [2, 2], blank=2)
    node = leaf(queue, lp.to_host())
    with tp.Tape() as tape:
        loss = tp.ctc_loss(node, up(queue, [[1, 0, 0], [0, 2, 0]], np.int64), [8, 8], [1, 2])
    with pytest.raises(ShapeError, match=r"label 0 at position \(1, 0\)"):
        tape.backward(loss)                                        # recorded: in the backward
    padded = np.array([[1, 0, 0], [3, 2, 0]])          # the blank only as padding
    want = F.ctc_loss(torch.tensor(lp.to_host()), torch.tensor(padded), torch.tensor([8, 8]),
                      torch.tensor([1, 2]))
    got = tp.ctc_loss(lp, up(queue, padded, np.int64), [8, 8], [1, 2])
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_a_swapped_triplet_whose_distances_tie_splits_the_gradient_as_pytorch(queue):
    """With ``swap=True`` the loss takes ``torch.minimum`` of d(anchor, negative) and
    d(positive, negative), which gives half the gradient to each where they tie (integer or
    quantised embeddings tie often); tp.minimum gave it all to d(anchor, negative)."""
    points = [[[0.0, 0.0], [1.0, 2.0]], [[2.0, 0.0], [1.0, 0.0]], [[1.0, 1.0], [3.0, 1.0]]]
    nodes = [leaf(queue, v) for v in points]
    with tp.Tape() as tape:
        loss = tp.triplet_margin_loss(*nodes, margin=2.0, eps=0.0, swap=True)
    tape.backward(loss)
    tensors = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in points]
    want = F.triplet_margin_loss(*tensors, margin=2.0, eps=0.0, swap=True)
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    # row 0 ties (both sqrt(2) from the negative): the anchor gets -(a - n) / sqrt(2) / 2 of
    # d(a, n) (halved by the mean), and half of that at the tie: 0.25 / sqrt(2) each
    half = 0.25 / np.sqrt(2.0)
    np.testing.assert_allclose(nodes[0].grad.to_host()[0], [-0.5 + half, half], rtol=1e-6)
    for node, t in zip(nodes, tensors):
        np.testing.assert_allclose(node.grad.to_host(), t.grad.numpy(), rtol=1e-6, atol=1e-7)
    raw = [up(queue, v) for v in points]                       # unrecorded, raw tensors
    assert tp.triplet_margin_loss(*raw, margin=2.0, eps=0.0, swap=True).item() == \
        pytest.approx(want.item(), rel=1e-6)
