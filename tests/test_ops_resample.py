"""Padding modes, interpolation and pixel shuffles as PyTorch's: ``tp.pad`` in reflect,
replicate and circular mode; outputs and gradients against ``torch.nn.functional`` on odd
sizes, finite differences, bit-identical reruns, and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from torch_reference import against_torch, raises_like_torch

MODES = ("reflect", "replicate", "circular")
PAD_CASES = [((2, 3, 7), (2, 3)), ((3, 5), (4, 1)), ((2, 3, 5, 4), (1, 2, 3, 0)),
             ((3, 4, 5), (0, 1, 3, 2)), ((1, 2, 3, 4, 5), (1, 2, 2, 1, 1, 0)),
             ((2, 3, 4, 5, 3), (2, 0, 1, 3, 1, 1)), ((2, 3, 6), (-2, 3)),
             ((2, 2, 5, 6), (1, -2, -1, 2)), ((2, 3, 1), (0, 0))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,pad", PAD_CASES)
def test_pad_in_every_mode_matches_pytorch_with_gradients(queue, rng, mode, shape, pad):
    x = rng.standard_normal(shape)
    against_torch(queue, rng, lambda t: tp.pad(t, pad, mode=mode),
                  lambda t: F.pad(t, pad, mode=mode), [x])


@pytest.mark.parametrize("mode", MODES)
def test_pad_gradients_pass_finite_differences(queue, rng, mode):
    node = leaf(queue, rng.standard_normal((2, 3, 4)))
    assert tp.gradcheck(lambda t: tp.pad(t, (3, 2, 1, 2), mode=mode), [node])


@pytest.mark.parametrize("mode", MODES)
def test_a_padded_gradient_is_the_same_bits_run_after_run(queue, rng, mode):
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = pc.Tensor.from_host(queue, rng.standard_normal((2, 3, 13, 15)).astype(np.float32))
    grads = []
    for _ in range(2):
        node = leaf(queue, x)
        with tp.Tape() as tape:
            loss = tp.sum(tp.pad(node, (7, 0, 2, 2), mode=mode) * w)
        tape.backward(loss)
        grads.append(node.grad.to_host())
    assert np.array_equal(grads[0], grads[1])


def test_constant_pad_takes_mode_and_value_as_pytorch(queue, rng):
    x = rng.standard_normal((2, 3))
    against_torch(queue, rng, lambda t: tp.pad(t, (1, 2), "constant", 0.5),
                  lambda t: F.pad(t, (1, 2), "constant", 0.5), [x])
    against_torch(queue, rng, lambda t: tp.pad(t, (1, 2), value=None),
                  lambda t: F.pad(t, (1, 2), value=None), [x])


@pytest.mark.parametrize("shape,pad,mode", [
    ((2, 3, 5), (5, 0), "reflect"), ((2, 3, 5), (0, 6), "circular"),
    ((5,), (1, 1), "replicate"), ((2, 3, 4, 5), (1, 1), "reflect"),
    ((4, 5), (1, 1, 1, 1), "circular"), ((2, 3, 1), (1, 0), "reflect"),
    ((2, 3, 5), (0, -5), "replicate"), ((2, 3, 5), (1, 1, 1), "reflect")])
def test_pad_refuses_what_pytorch_refuses(queue, shape, pad, mode):
    t = pc.Tensor.zeros(queue, shape)
    raises_like_torch(lambda: tp.pad(t, pad, mode=mode),
                      lambda: F.pad(torch.zeros(shape), pad, mode=mode), "pad")


def test_pad_refuses_a_fill_value_outside_constant_mode_and_an_unknown_mode(queue):
    t = pc.Tensor.zeros(queue, (2, 3, 5))
    raises_like_torch(lambda: tp.pad(t, (1, 1), mode="reflect", value=2.0),
                      lambda: F.pad(torch.zeros(2, 3, 5), (1, 1), mode="reflect", value=2.0),
                      "pad")
    with pytest.raises(pc.ShapeError, match="value="):
        tp.pad(t, (1, 1), 0.5)
    with pytest.raises(pc.ShapeError, match="mode must be one of"):
        tp.pad(t, (1, 1), mode="symmetric")
