"""Silent wrong results found in the margin, likelihood and CTC losses: each test fails on the
code before its fix and checks PyTorch's values (float64 references)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import parcl.tape as tp
from conftest import leaf, up


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
