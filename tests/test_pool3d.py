"""tp.max_pool3d / avg_pool3d / adaptive_avg_pool3d / adaptive_max_pool3d / lp_pool3d /
max_unpool3d and their pc.nn layers against torch (values, indices and the input's gradient),
gradcheck through the two 2-D pools, values worked by hand, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_reference import against_torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl.errors import DTypeError, ParclError, ShapeError

POOLS = [
    ("max", dict(kernel_size=2)),
    ("max", dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=(1, 1, 1))),
    ("max", dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("max", dict(kernel_size=(2, 2, 3), dilation=(2, 1, 2), padding=(1, 0, 1))),
    ("avg", dict(kernel_size=2)),
    ("avg", dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=(1, 1, 1))),
    ("avg", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("avg", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("avg", dict(kernel_size=(2, 3, 2), stride=2, padding=1, ceil_mode=True, divisor_override=5)),
    ("avg", dict(kernel_size=2, divisor_override=-3)),
]


@pytest.mark.parametrize("kind,kw", POOLS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(POOLS)])
@pytest.mark.parametrize("shape", [(2, 3, 5, 6, 7), (3, 6, 5, 4)], ids=["batched", "unbatched"])
def test_pools_values_and_gradients_are_as_pytorch(queue, rng, kind, kw, shape):
    x = np.round(rng.standard_normal(shape) * 2)               # ties: the first maximum wins
    against_torch(queue, rng, lambda x: getattr(tp, f"{kind}_pool3d")(x, **kw),
                  lambda x: getattr(F, f"{kind}_pool3d")(x, **kw), [x], tol=1e-5)


ADAPTIVE = [2, (3, None, 4), (1, 5, 2), (5, 6, 7)]


@pytest.mark.parametrize("size", ADAPTIVE, ids=str)
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pools_values_and_gradients_are_as_pytorch(queue, rng, kind, size):
    x = np.round(rng.standard_normal((2, 3, 5, 6, 7)) * 2)
    against_torch(queue, rng, lambda x: getattr(tp, f"adaptive_{kind}_pool3d")(x, size),
                  lambda x: getattr(F, f"adaptive_{kind}_pool3d")(x, size), [x], tol=1e-5)


MAX_INDICES = [
    ("max_pool3d", dict(kernel_size=2)),
    ("max_pool3d", dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=1, dilation=(1, 2, 1),
                        ceil_mode=True)),
    ("adaptive_max_pool3d", dict(output_size=(3, None, 4))),
    ("adaptive_max_pool3d", dict(output_size=2)),
]


@pytest.mark.parametrize("op,kw", MAX_INDICES, ids=[f"{o}-{i}" for i, (o, _) in
                                                    enumerate(MAX_INDICES)])
def test_max_pool_indices_are_pytorchs_flat_positions_with_ties_and_nans(queue, rng, op, kw):
    x = np.round(rng.standard_normal((2, 3, 5, 6, 7)) * 2).astype(np.float32)
    x[0, 0, 1, 2, 3] = x[0, 0, 2, 2, 2] = x[1, 2, 3, 1, 1] = np.nan     # the last NaN wins
    y, where = getattr(tp, op)(tp.tensor(x), **kw, return_indices=True)
    ty, twhere = getattr(F, op)(torch.tensor(x), **kw, return_indices=True)
    assert where.dtype == np.int64 and where.shape == tuple(twhere.shape)
    np.testing.assert_array_equal(where.to_host(), twhere.numpy())
    np.testing.assert_array_equal(y.to_host(), ty.numpy())      # NaN where torch's NaN
    unbatched = getattr(tp, op)(tp.tensor(x[1]), **kw, return_indices=True)[1]
    np.testing.assert_array_equal(unbatched.to_host(), twhere.numpy()[1])



def test_max_pool3d_indices_of_a_depth_window_of_padding_only_are_pytorchs(queue, rng):
    """A depth window whose dilated taps all fall in the padding (depth 1, kernel 2, padding
    1, dilation 2: taps at -1 and 1) picks a depth past the input; its index was joined with
    the plane positions of that depth, read past their buffer, so max_pool3d gave indices
    such as 94685857039281 where PyTorch gives d * H*W plus the plane window's first
    position (12, 13, 14, ...), both with -inf values. (PyTorch's own backward of these
    indices writes past its gradient; parcl's gradient there is 0.)"""
    x = rng.standard_normal((2, 3, 1, 3, 4)).astype(np.float32)
    kw = dict(kernel_size=(2, 2, 2), stride=(1, 1, 2), padding=(1, 1, 0), dilation=(2, 1, 1))
    ty, twhere = F.max_pool3d(torch.tensor(x), **kw, return_indices=True)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y, where = tp.max_pool3d(node, **kw, return_indices=True)
        loss = tp.sum(y * 1.0)
    np.testing.assert_array_equal(y.to_host(), ty.numpy())          # all -inf
    np.testing.assert_array_equal(where.to_host()[0, 0, 0], [[12, 14], [12, 14], [16, 18],
                                                             [20, 22]])
    np.testing.assert_array_equal(where.to_host(), twhere.numpy())
    unbatched = tp.max_pool3d(tp.tensor(x[1]), **kw, return_indices=True)[1]
    np.testing.assert_array_equal(unbatched.to_host(), twhere.numpy()[1])
    tape.backward(loss)
    np.testing.assert_array_equal(node.grad.to_host(), np.zeros_like(x))

def test_max_pool3d_and_avg_pool3d_of_a_counting_volume_as_worked_by_hand(queue):
    x = tp.tensor(np.arange(64, dtype=np.float32).reshape(1, 1, 4, 4, 4))   # 16d + 4h + w
    np.testing.assert_array_equal(tp.max_pool3d(x, 2).to_host().ravel(),
                                  [21, 23, 29, 31, 53, 55, 61, 63])
    # each 2x2x2 box sums 8 * its first element + 8 * (16 + 4 + 1) / 2
    np.testing.assert_array_equal(tp.avg_pool3d(x, 2, divisor_override=1).to_host().ravel(),
                                  8 * np.array([0, 2, 8, 10, 32, 34, 40, 42]) + 84)
    np.testing.assert_array_equal(tp.adaptive_avg_pool3d(x, 1).to_host().ravel(), [31.5])
    y, where = tp.max_pool3d(x, 4, return_indices=True)
    assert where.to_host().ravel().tolist() == [63]


def test_pool_gradients_pass_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((1, 2, 4, 5, 4)))
    assert tp.gradcheck(lambda v: tp.max_pool3d(v, 2, stride=(1, 2, 1), padding=1), [x])
    assert tp.gradcheck(lambda v: tp.avg_pool3d(v, 3, stride=2, padding=1, ceil_mode=True,
                                                count_include_pad=False), [x])
    assert tp.gradcheck(lambda v: tp.adaptive_avg_pool3d(v, (3, 2, 3)), [x])
    assert tp.gradcheck(lambda v: tp.adaptive_max_pool3d(v, (3, 2, 3)), [x])
    pos = leaf(queue, rng.random((1, 2, 4, 5, 4)) + 0.5)
    assert tp.gradcheck(lambda v: tp.lp_pool3d(v, 2, (2, 2, 3), stride=1), [pos])


@pytest.mark.parametrize("p,kw", [(2, dict(kernel_size=2)),
                                  (3, dict(kernel_size=(3, 2, 2), stride=(1, 2, 2),
                                           ceil_mode=True)),
                                  (float("inf"), dict(kernel_size=2))], ids=["2", "3", "inf"])
def test_lp_pool3d_is_as_pytorch(queue, rng, p, kw):
    x = rng.random((2, 3, 5, 6, 7)) + 0.1
    against_torch(queue, rng, lambda x: tp.lp_pool3d(x, p, **kw),
                  lambda x: F.lp_pool3d(x, p, **kw), [x], tol=1e-4)


def test_max_unpool3d_puts_the_maxima_back_as_pytorch(queue, rng):
    x = rng.standard_normal((2, 3, 4, 6, 5)).astype(np.float32)
    y, where = tp.max_pool3d(tp.tensor(x), 2, return_indices=True)
    ty, twhere = F.max_pool3d(torch.tensor(x), 2, return_indices=True)
    want = F.max_unpool3d(ty, twhere, 2, output_size=(4, 6, 5)).numpy()
    np.testing.assert_array_equal(tp.max_unpool3d(y, where, 2, output_size=(4, 6, 5)).to_host(),
                                  want)
    layer = pc.nn.MaxUnpool3d(2)
    np.testing.assert_array_equal(layer(y, where, output_size=x.shape).to_host(), want)
    with pytest.raises(ShapeError, match="max_unpool3d: invalid output_size"):
        tp.max_unpool3d(y, where, 2, output_size=(4, 6, 9))


def test_pool_layers_are_pytorchs(queue, rng):
    x = np.round(rng.standard_normal((2, 3, 6, 6, 7)) * 2).astype(np.float32)
    pairs = [(pc.nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True),
              torch.nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True)),
             (pc.nn.AvgPool3d((2, 3, 3), stride=2, count_include_pad=False, divisor_override=4),
              torch.nn.AvgPool3d((2, 3, 3), stride=2, count_include_pad=False,
                                 divisor_override=4)),
             (pc.nn.AdaptiveAvgPool3d((2, None, 3)), torch.nn.AdaptiveAvgPool3d((2, None, 3))),
             (pc.nn.AdaptiveMaxPool3d(2), torch.nn.AdaptiveMaxPool3d(2)),
             (pc.nn.LPPool3d(2, 2), torch.nn.LPPool3d(2, 2))]
    for pm, tm in pairs:
        assert pm.state_dict() == {} and repr(pm).startswith(type(tm).__name__)
        np.testing.assert_allclose(pm(tp.tensor(x)).to_host(), tm(torch.tensor(x)).numpy(),
                                   rtol=1e-5, atol=1e-5)
    y, where = pc.nn.MaxPool3d(2, return_indices=True)(tp.tensor(x))
    _, twhere = torch.nn.MaxPool3d(2, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(where.to_host(), twhere.numpy())
    _, where = pc.nn.AdaptiveMaxPool3d(3, return_indices=True)(tp.tensor(x))
    _, twhere = torch.nn.AdaptiveMaxPool3d(3, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(where.to_host(), twhere.numpy())


def test_pool3d_refusals_name_the_op_and_shapes(queue, rng):
    x = leaf(queue, rng.standard_normal((2, 3, 4, 5, 6)))
    with pytest.raises(ShapeError, match=r"max_pool3d: padding \(2, 2, 2\) must be at most "
                                         r"half the kernel size \(3, 3, 3\)"):
        tp.max_pool3d(x, 3, padding=2)
    with pytest.raises(ShapeError, match=r"avg_pool3d: kernel \(5, 2, 2\) .* spatial size "
                                         r"\(4, 5, 6\)"):
        tp.avg_pool3d(x, (5, 2, 2))
    with pytest.raises(ShapeError, match="avg_pool3d: divisor_override must be a nonzero int"):
        tp.avg_pool3d(x, 2, divisor_override=0)
    with pytest.raises(ShapeError, match=r"max_pool3d: expected a 4-d .* got shape \(2, 3, 4\)"):
        tp.max_pool3d(leaf(queue, rng.standard_normal((2, 3, 4))), 2)
    with pytest.raises(ShapeError, match="max_pool3d: kernel_size must be a positive int or a "
                                         "tuple of three, got 2.5"):
        tp.max_pool3d(x, 2.5)
    with pytest.raises(ShapeError, match=r"adaptive_avg_pool3d: input of shape \(2, 3, 0, 5, "
                                         r"6\) has a spatial dim of size 0"):
        tp.adaptive_avg_pool3d(x[:, :, 4:], 2)
    with pytest.raises(ShapeError, match=r"max_pool3d: the input's spatial size \(0, 5, 6\)"):
        tp.max_pool3d(x[:, :, 4:], 2)
    with pytest.raises(ShapeError, match="adaptive_max_pool3d: output_size must be an int or a "
                                         "tuple of 3"):
        tp.adaptive_max_pool3d(x, (2, 2))
    with pytest.raises(ParclError, match="lp_pool3d: norm_type must be a nonzero number"):
        tp.lp_pool3d(x, 0, 2)


@pytest.mark.parametrize("pool", [lambda x: tp.max_pool3d(x, 2), lambda x: tp.avg_pool3d(x, 2),
                                  lambda x: tp.adaptive_avg_pool3d(x, 2),
                                  lambda x: tp.adaptive_max_pool3d(x, 2),
                                  lambda x: tp.lp_pool3d(x, 2, 2)],
                         ids=["max", "avg", "adaptive_avg", "adaptive_max", "lp"])
def test_a_pool3d_of_int_values_names_itself_and_the_volumes_shape(queue, pool):
    # the 2-D pools underneath named themselves and the planes: 'max_pool2d: input has dtype
    # int64 (shape (2, 12, 4, 4))' for tp.max_pool3d of a (2, 3, 4, 4, 4) volume
    x = pc.Tensor.from_host(queue, np.zeros((2, 3, 4, 4, 4), np.int64))
    with pytest.raises(DTypeError, match=r"^[a-z_]+pool3d: input has dtype int64 \(shape "
                                         r"\(2, 3, 4, 4, 4\)\), expected float32"):
        pool(x)


class _Queue:
    def __init__(self, gpu: bool):
        self.gpu = gpu


def test_indices_joined_with_the_gpu_geometry_are_pytorchs(queue, rng, monkeypatch):
    from parcl.kernels import pool3d as p3k
    monkeypatch.setattr(p3k, "on_gpu", lambda q: True)
    monkeypatch.setattr(p3k, "MAX_ITEMS", 256)          # several outputs per work-item
    x = rng.standard_normal((2, 3, 5, 6, 7)).astype(np.float32)
    _, where = tp.max_pool3d(tp.tensor(x), 2, stride=1, return_indices=True)
    _, twhere = F.max_pool3d(torch.tensor(x), 2, stride=1, return_indices=True)
    assert where.size > 256
    np.testing.assert_array_equal(where.to_host(), twhere.numpy())


def test_index_joining_grids_stay_under_2_to_the_31_work_items_on_any_device():
    from parcl.kernels.pool3d import MAX_ITEMS, _grid
    assert MAX_ITEMS < 2 ** 31
    # GPUs: one output per work-item up to MAX_ITEMS, then each steps on by the grid's size
    assert _grid(_Queue(True), 1000) == (1024, 256)
    assert _grid(_Queue(True), 1 << 40) == (MAX_ITEMS, 256)
    # CPUs: about one work-item per 4096 outputs, in groups of 16
    assert _grid(_Queue(False), 1000) == (16, 16)
    assert _grid(_Queue(False), 3 * 10 ** 9) == (732432, 16)
    assert _grid(_Queue(False), 1 << 50) == (MAX_ITEMS, 16)
