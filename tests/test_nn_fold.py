"""``tp.unfold``/``tp.fold`` and ``pc.nn.Unfold``/``Fold`` against PyTorch's: outputs and
gradients over kernels, strides, paddings, dilations and unbatched inputs; the round trip's
window counts, gradcheck, reprs and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn
from torch_reference import check_as_torch

WINDOWS = [((2, 3, 5, 6), dict(kernel_size=2)),
           ((1, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1)),
           ((2, 2, 6, 5), dict(kernel_size=(2, 3), dilation=2, padding=(1, 0), stride=(1, 2))),
           ((3, 5, 5), dict(kernel_size=3, stride=3)),
           ((1, 1, 4, 4), dict(kernel_size=1, stride=3))]


@pytest.mark.parametrize("shape,kw", WINDOWS)
def test_unfold_matches_pytorch(queue, rng, shape, kw):
    ours, theirs = nn.Unfold(**kw), torch.nn.Unfold(**kw)
    check_as_torch(ours, theirs, [rng.standard_normal(shape).astype(np.float32)], rng,
                   tol=1e-6, grad_tol=1e-5)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("shape,kw", WINDOWS)
def test_fold_matches_pytorch(queue, rng, shape, kw):
    columns = torch.nn.Unfold(**kw)(torch.zeros(shape)).shape
    ours, theirs = nn.Fold(shape[-2:], **kw), torch.nn.Fold(shape[-2:], **kw)
    check_as_torch(ours, theirs, [rng.standard_normal(tuple(columns)).astype(np.float32)],
                   rng, tol=1e-6, grad_tol=1e-5)
    assert repr(ours) == repr(theirs)


def test_unfold_lays_each_window_out_as_a_column(queue):
    x = tp.tensor(np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3))
    np.testing.assert_array_equal(tp.unfold(x, 2).to_host()[0].T,
                                  [[0, 1, 3, 4], [1, 2, 4, 5], [3, 4, 6, 7], [4, 5, 7, 8]])


def test_fold_of_unfold_multiplies_by_the_window_count(queue, rng):
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    back = tp.fold(tp.unfold(tp.tensor(x), 3, padding=1), (5, 5), 3, padding=1).to_host()
    counts = tp.fold(tp.unfold(tp.tensor(np.ones_like(x)), 3, padding=1), (5, 5), 3,
                     padding=1).to_host()
    np.testing.assert_allclose(back, x * counts, rtol=1e-5, atol=1e-6)
    assert counts[0, 0].tolist()[0] == [4, 6, 6, 6, 4]


def test_unfold_and_fold_pass_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((1, 2, 4, 4)))
    assert tp.gradcheck(lambda v: tp.unfold(v, 2, stride=1, dilation=(1, 2)), [x])
    cols = leaf(queue, rng.standard_normal((1, 8, 6)))
    assert tp.gradcheck(lambda v: tp.fold(v, (3, 4), 2), [cols])


def test_fold_and_unfold_refuse_what_does_not_fit(queue):
    with pytest.raises(pc.ShapeError, match=r"fold: input of shape \(1, 8, 5\) needs .* dim -1 "
                                            r"= 6"):
        nn.Fold((3, 4), 2)(tp.tensor(np.ones((1, 8, 5), np.float32)))
    with pytest.raises(pc.ShapeError, match="divisible by kh\\*kw = 4"):
        tp.fold(tp.tensor(np.ones((1, 7, 6), np.float32)), (3, 4), 2)
    with pytest.raises(pc.ShapeError, match=r"unfold: expected a 3-d \(C, H, W\) or 4-d "
                                            r"\(N, C, H, W\) input, got shape \(4, 4\)"):
        tp.unfold(tp.tensor(np.ones((4, 4), np.float32)), 2)
    with pytest.raises(pc.ShapeError, match=r"fold: expected a 2-d \(C\*kh\*kw, L\) or 3-d "
                                            r"\(N, C\*kh\*kw, L\) input, got shape \(4,\)"):
        tp.fold(tp.tensor(np.ones(4, np.float32)), (3, 4), 2)
    with pytest.raises(pc.ShapeError, match="unfold: kernel_size must be a positive int"):
        nn.Unfold(0)(tp.tensor(np.ones((1, 1, 4, 4), np.float32)))
    with pytest.raises(pc.ShapeError, match="does not fit"):
        tp.unfold(tp.tensor(np.ones((1, 1, 2, 2), np.float32)), 3)
