"""Max pooling's ``return_indices=True`` (``tp.max_pool1d/2d``, ``MaxPool1d/2d``) and its
inverse ``tp.max_unpool1d/2d`` with ``MaxUnpool1d/2d``, against PyTorch's: indices, outputs,
gradients (duplicated indices of overlapping pools included), output sizes, reprs and
refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn

POOLS_2D = [((2, 3, 8, 8), dict(kernel_size=2)),
            ((1, 2, 7, 9), dict(kernel_size=3, stride=2, padding=1)),
            ((1, 2, 9, 9), dict(kernel_size=(2, 3), stride=(2, 1), dilation=2, ceil_mode=True)),
            ((1, 1, 20, 20), dict(kernel_size=17))]          # 289 > 256: int32 window indices


@pytest.mark.parametrize("shape,kw", POOLS_2D)
def test_max_pool2d_returns_pytorchs_indices(queue, rng, shape, kw):
    x = rng.standard_normal(shape).astype(np.float32)
    y, where = nn.MaxPool2d(**kw, return_indices=True)(tp.tensor(x))
    want, want_where = torch.nn.MaxPool2d(**kw, return_indices=True)(torch.from_numpy(x))
    assert isinstance(where, pc.Tensor) and where.dtype == np.int64
    np.testing.assert_array_equal(y.to_host(), want.numpy())
    np.testing.assert_array_equal(where.to_host(), want_where.numpy())


@pytest.mark.parametrize("shape", [(2, 3, 9), (3, 9)])
def test_max_pool1d_returns_pytorchs_indices_batched_or_not(queue, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    y, where = nn.MaxPool1d(3, stride=2, padding=1, return_indices=True)(tp.tensor(x))
    want, want_where = F.max_pool1d(torch.from_numpy(x), 3, stride=2, padding=1,
                                    return_indices=True)
    assert where.shape == tuple(want_where.shape)
    np.testing.assert_array_equal(y.to_host(), want.numpy())
    np.testing.assert_array_equal(where.to_host(), want_where.numpy())


def test_max_pool_with_indices_still_backpropagates(queue, rng):
    x = leaf(queue, rng.standard_normal((1, 2, 4, 4)))
    with tp.Tape() as tape:
        y, where = tp.max_pool2d(x, 2, return_indices=True)
    tape.backward(tp.sum(y))
    hits = np.zeros(32, np.float32)
    hits[(where.to_host() + np.array([0, 16])[None, :, None, None]).ravel()] = 1.0
    np.testing.assert_array_equal(x.grad.to_host().ravel(), hits)


@pytest.mark.parametrize("shape,kw", POOLS_2D[:2] + [((3, 6, 6), dict(kernel_size=2))])
def test_max_unpool2d_inverts_the_pool_and_backpropagates_as_pytorch(queue, rng, shape, kw):
    x = rng.standard_normal(shape).astype(np.float32)
    pooled, where = F.max_pool2d(torch.from_numpy(x), return_indices=True, **kw)
    unpool_kw = {k: v for k, v in kw.items() if k in ("kernel_size", "stride", "padding")}
    ours, theirs = nn.MaxUnpool2d(**unpool_kw), torch.nn.MaxUnpool2d(**unpool_kw)
    ny = leaf(queue, pooled.numpy())
    ty = pooled.clone().requires_grad_(True)
    with tp.Tape() as tape:
        out = ours(ny, pc.Tensor.from_host(queue, where.numpy()))
    want = theirs(ty, where)
    np.testing.assert_array_equal(out.to_host(), want.detach().numpy())
    g = rng.standard_normal(out.shape).astype(np.float32)
    tape.backward(out, grad=pc.Tensor.from_host(queue, g))
    want.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(ny.grad.to_host(), ty.grad.numpy())   # duplicates: each
    assert repr(ours) == repr(theirs)


def test_max_unpool_puts_values_back_and_zeros_elsewhere(queue):
    x = tp.tensor(np.array([[[1.0, 5.0, 2.0, 0.0, 3.0, 4.0]]], np.float32))
    y, where = tp.max_pool1d(x, 2, return_indices=True)
    assert where.to_host().tolist() == [[[1, 2, 5]]]
    back = nn.MaxUnpool1d(2)(y, where)
    assert back.to_host().tolist() == [[[0.0, 5.0, 2.0, 0.0, 0.0, 4.0]]]
    wider = tp.max_unpool1d(y, where, 2, output_size=[7])            # within a stride
    assert wider.shape == (1, 1, 7) and wider.to_host()[0, 0, 6] == 0.0


def test_max_unpool_passes_gradcheck(queue, rng):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    y, where = tp.max_pool2d(tp.tensor(x), 2, return_indices=True)
    assert tp.gradcheck(lambda v: tp.max_unpool2d(v, where, 2), [leaf(queue, y.to_host())])


def test_max_unpool_refuses_bad_indices_and_sizes(queue):
    y = tp.tensor(np.ones((1, 1, 2, 2), np.float32))
    good = pc.Tensor.from_host(queue, np.array([[[[0, 3], [8, 15]]]]))
    with pytest.raises(pc.DTypeError, match="max_unpool2d: indices must be the int64"):
        tp.max_unpool2d(y, pc.Tensor.from_host(queue, np.zeros((1, 1, 2, 2), np.float32)), 2)
    with pytest.raises(pc.ShapeError, match=r"indices of its shape, got input \(1, 1, 2, 2\) "
                                            r"and indices \(1, 1, 4\)"):
        tp.max_unpool2d(y, pc.Tensor.from_host(queue, np.zeros((1, 1, 4), np.int64)), 2)
    with pytest.raises(pc.ShapeError, match=r"invalid output_size \(6, 4\) \(dim 0 must be "
                                            r"between 2 and 6\)"):
        tp.max_unpool2d(y, good, 2, output_size=(6, 4))
    with pytest.raises(pc.ShapeError, match="index 16 .* out of range"):
        tp.max_unpool2d(y, pc.Tensor.from_host(queue, np.array([[[[0, 3], [8, 16]]]])), 2)
