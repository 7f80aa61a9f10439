"""PyTorch's unbatched ``(C, H, W)`` inputs to ``tp.conv2d``, the 2-d pools and their modules:
the same values and gradients as torch's, the output without a batch dim, and a clear
ShapeError for other ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn
from torch_reference import check_as_torch

W = np.random.default_rng(7).standard_normal((4, 3, 3, 3)).astype(np.float32)
B = np.random.default_rng(8).standard_normal(4).astype(np.float32)

CASES = {
    "conv2d": (lambda x: tp.conv2d(x, tp.tensor(W), tp.tensor(B), stride=2, padding=1),
               lambda x: F.conv2d(x, torch.tensor(W), torch.tensor(B), stride=2, padding=1)),
    "conv2d_same": (lambda x: tp.conv2d(x, tp.tensor(W[:, :, :2]), padding="same"),
                    lambda x: F.conv2d(x, torch.tensor(W[:, :, :2]), padding="same")),
    "max_pool2d": (lambda x: tp.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
                   lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True)),
    "avg_pool2d": (lambda x: tp.avg_pool2d(x, 2, padding=1, count_include_pad=False),
                   lambda x: F.avg_pool2d(x, 2, padding=1, count_include_pad=False)),
    "adaptive_avg_pool2d": (lambda x: tp.adaptive_avg_pool2d(x, (3, 2)),
                            lambda x: F.adaptive_avg_pool2d(x, (3, 2))),
    "adaptive_max_pool2d": (lambda x: tp.adaptive_max_pool2d(x, 3),
                            lambda x: F.adaptive_max_pool2d(x, 3)),
    "lp_pool2d": (lambda x: tp.lp_pool2d(x, 2, 2), lambda x: F.lp_pool2d(x, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_unbatched_input_gives_pytorchs_values_and_gradients(queue, rng, name):
    ours, theirs = CASES[name]
    check_as_torch(ours, theirs, [rng.standard_normal((3, 7, 6)).astype(np.float32)], rng)


@pytest.mark.parametrize("name", ["conv2d", "avg_pool2d", "max_pool2d"])
def test_an_unbatched_op_passes_gradcheck(queue, rng, name):
    x = leaf(queue, rng.standard_normal((3, 5, 4)).astype(np.float32))
    assert tp.gradcheck(CASES[name][0], [x], atol=2e-3)


MODULES = [
    (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
     lambda: torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")),
    (lambda: nn.MaxPool2d(2), lambda: torch.nn.MaxPool2d(2)),
    (lambda: nn.AvgPool2d(3, stride=1, padding=1), lambda: torch.nn.AvgPool2d(3, 1, 1)),
    (lambda: nn.AdaptiveAvgPool2d((None, 2)), lambda: torch.nn.AdaptiveAvgPool2d((None, 2))),
    (lambda: nn.AdaptiveMaxPool2d(2), lambda: torch.nn.AdaptiveMaxPool2d(2)),
    (lambda: nn.LPPool2d(3, 2), lambda: torch.nn.LPPool2d(3, 2)),
]


@pytest.mark.parametrize("index", range(len(MODULES)))
def test_modules_take_an_unbatched_input_as_pytorch(queue, rng, index):
    ours, theirs = MODULES[index][0](), MODULES[index][1]()
    if isinstance(ours, nn.Conv2d):
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(ours.weight.to_host()))
            theirs.bias.copy_(torch.tensor(ours.bias.to_host()))
    x = np.abs(rng.standard_normal((3, 6, 6))).astype(np.float32) + 0.1
    check_as_torch(ours, theirs, [x], rng)


def test_an_unbatched_max_pool_returns_indices_without_a_batch_dim(queue):
    x = np.arange(32, dtype=np.float32).reshape(2, 4, 4)[:, ::-1].copy()
    y, where = tp.max_pool2d(pc.Tensor.from_host(queue, x), 2, return_indices=True)
    ty, twhere = F.max_pool2d(torch.tensor(x), 2, return_indices=True)
    assert where.shape == (2, 2, 2)
    np.testing.assert_array_equal(where.to_host(), twhere.numpy())
    np.testing.assert_array_equal(y.to_host(), ty.numpy())
    np.testing.assert_array_equal(y.to_host()[0], [[13, 15], [5, 7]])


@pytest.mark.parametrize("op", ["conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"])
def test_other_ranks_are_a_shape_error_naming_the_op(queue, op):
    x = pc.Tensor.from_host(queue, np.zeros((6, 6), np.float32))
    args = {"conv2d": (pc.Tensor.from_host(queue, W),), "adaptive_avg_pool2d": (2,)}.get(op, (2,))
    with pytest.raises(pc.ShapeError, match=rf"{op}: expected a 3-d \(C, H, W\) or 4-d "
                                            r"\(N, C, H, W\) input, got shape \(6, 6\)"):
        getattr(tp, op)(x, *args)
