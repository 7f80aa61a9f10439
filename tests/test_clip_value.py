"""pc.nn.utils.clip_grad_value_ against torch.nn.utils.clip_grad_value_, bit for bit in
float32: gradients clamped in place into [-clip_value, clip_value], NaN kept NaN, infinities
clamped, parameters without a gradient skipped, nothing read back; a clip_value PyTorch would
turn into a silent surprise (negative, NaN) refused before any gradient changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
from parcl.nn.utils import ClipError, clip_grad_value_

SHAPES = [(3, 4), (5,), (), (2, 2, 3), (1000,)]


def awkward(rng, shape):
    """Normal values with NaN, +-inf, -0.0 and values at +-1 sprinkled in."""
    g = (rng.standard_normal(shape) * 2).astype(np.float32)
    flat = g.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1.0, -1.0, 0.1, -0.1], np.float32)
    flat[rng.integers(0, flat.size, min(flat.size, 6))] = rng.choice(specials,
                                                                     min(flat.size, 6))
    return g


def pair(queue, rng, with_grad=(True, True, False, True, True)):
    ps, ts, grads = [], [], []
    for shape, has in zip(SHAPES, with_grad):
        p = pc.nn.Parameter(pc.Tensor.from_host(queue, np.zeros(shape, np.float32)))
        t = torch.nn.Parameter(torch.zeros(shape))
        if has:
            g = awkward(rng, shape)
            p.grad, t.grad = pc.Tensor.from_host(queue, g), torch.from_numpy(g.copy())
            grads.append(g)
        ps.append(p)
        ts.append(t)
    return ps, ts, grads


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("clip_value", [1.0, 0.1, 0.0, 3, np.inf])
@pytest.mark.parametrize("foreach", [None, True, False])
def test_matches_pytorch_bit_for_bit(queue, rng, clip_value, foreach):
    ps, ts, grads = pair(queue, rng)
    before = [p.grad for p in ps]
    assert clip_grad_value_(ps, clip_value, foreach=foreach) is None
    torch.nn.utils.clip_grad_value_(ts, clip_value, foreach=foreach)
    assert [p.grad for p in ps] == before                 # in place: the same tensors
    assert ps[2].grad is None and ts[2].grad is None      # skipped, not created
    for p, t in zip(ps, ts):
        if t.grad is not None:
            assert_same_bits(p.grad.to_host(), t.grad.numpy())
    got = np.concatenate([p.grad.to_host().ravel() for p in ps if p.grad is not None])
    kept = ~np.isnan(got)
    assert np.isnan(got).sum() == sum(np.isnan(g).sum() for g in grads)   # NaN stays NaN
    assert np.all(np.abs(got[kept]) <= clip_value)


def test_one_parameter_and_a_flat_bucket_view(queue, rng):
    """A single Parameter (not a list) is clipped; a gradient that views part of a flat
    buffer (a ReplicaGroup's bucket) changes only its own part."""
    flat = pc.Tensor.from_host(queue, np.full(128, 5.0, np.float32))
    p = pc.nn.Parameter(pc.Tensor.zeros(queue, (64,)))
    p.grad = flat.view_of(flat.data.get_sub_region(0, 256), (64,))
    clip_grad_value_(p, 2.0)
    np.testing.assert_array_equal(flat.to_host(), [2.0] * 64 + [5.0] * 64)


@pytest.mark.parametrize("clip_value, error, fragment", [
    (-1.0, ClipError, "clip_value must be >= 0 (the gradients are clamped to [-clip_value, "
                      "clip_value]), got -1.0"),
    (float("nan"), ClipError, "clip_value must be >= 0"),
    ("big", ClipError, "clip_value must be a number, got 'big'"),
    (True, ClipError, "clip_value must be a number, got True"),
])
def test_a_bad_clip_value_is_refused_before_any_gradient_changes(queue, rng, clip_value,
                                                                 error, fragment):
    """PyTorch takes clip_value=-1 and clamps to [1, -1]: every gradient becomes -1, the
    sign of descent reversed; a NaN bound makes every gradient NaN. parcl refuses both."""
    ps, ts, grads = pair(queue, rng)
    if isinstance(clip_value, float):                     # what PyTorch does with it
        torch.nn.utils.clip_grad_value_(ts, clip_value)
        g = ts[0].grad
        kept = ~torch.from_numpy(np.isnan(grads[0]))
        assert torch.all(g[kept] == -1.0) if clip_value == -1.0 else torch.all(g.isnan())
    with pytest.raises(error) as info:
        clip_grad_value_(ps, clip_value)
    assert fragment in str(info.value)
    for p, g in zip([p for p in ps if p.grad is not None], grads):
        assert_same_bits(p.grad.to_host(), g)


def test_foreach_must_be_a_bool_or_none(queue, rng):
    ps, _, _ = pair(queue, rng)
    with pytest.raises(TypeError, match="foreach must be None or a bool, got 'yes'"):
        clip_grad_value_(ps, 1.0, foreach="yes")
