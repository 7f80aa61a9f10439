"""tp.conv3d / conv_transpose3d and pc.nn.Conv3d / ConvTranspose3d against torch (outputs and
the gradients of the input, weight and bias), gradcheck, a value worked by hand, batches
split into chunks, the GPU grid's bound, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_reference import against_torch
from xfmr_reference import compare

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl.errors import DTypeError, ShapeError

CONV = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1, 3), padding=(1, 0, 2), dilation=(2, 1, 1)),
    dict(padding="same"),
    dict(padding="same", dilation=(1, 2, 3)),
    dict(padding="valid", stride=(1, 2, 2)),
    dict(groups=2, padding=1),
    dict(groups=4, padding=(0, 1, 1)),                 # one input channel per group
]


def _id(kw):
    return "-".join(f"{k}{v}" for k, v in kw.items()) or "default"


@pytest.mark.filterwarnings("ignore:Using padding='same'")   # torch's note on its own copy
@pytest.mark.parametrize("kw", CONV, ids=_id)
@pytest.mark.parametrize("kernel", [(3, 3, 3), (2, 1, 3)], ids=["k333", "k213"])
def test_conv3d_values_and_gradients_are_as_pytorch(queue, rng, kw, kernel):
    groups = kw.get("groups", 1)
    x = rng.standard_normal((2, 4, 5, 6, 7))
    w = rng.standard_normal((8, 4 // groups) + kernel)
    b = rng.standard_normal(8)
    against_torch(queue, rng, lambda x, w, b: tp.conv3d(x, w, b, **kw),
                  lambda x, w, b: F.conv3d(x, w, b, **kw), [x, w, b], tol=1e-4)


def test_conv3d_of_an_unbatched_volume_without_bias_is_as_pytorch(queue, rng):
    against_torch(queue, rng, lambda x, w: tp.conv3d(x, w, stride=2, padding=1),
                  lambda x, w: F.conv3d(x, w, stride=2, padding=1),
                  [rng.standard_normal((3, 4, 5, 6)), rng.standard_normal((2, 3, 3, 3, 3))],
                  tol=1e-4)


def test_conv3d_sums_each_box_as_worked_by_hand(queue):
    x = tp.tensor(np.arange(27, dtype=np.float32).reshape(1, 1, 3, 3, 3))
    w = tp.tensor(np.ones((1, 1, 2, 2, 2), np.float32))
    y = tp.conv3d(x, w, tp.tensor(np.array([0.5], np.float32))).to_host()
    # x = 9d + 3h + w, so the 2x2x2 box at (d, h, w) sums to 8 * x[d, h, w] + 4 * (9 + 3 + 1)
    base = np.arange(27, dtype=np.float32).reshape(3, 3, 3)[:2, :2, :2]
    np.testing.assert_array_equal(y[0, 0], 8 * base + 52 + 0.5)


def test_conv3d_gradients_pass_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((1, 2, 4, 3, 4)))
    w = leaf(queue, rng.standard_normal((3, 2, 2, 2, 3)))
    b = leaf(queue, rng.standard_normal(3))
    assert tp.gradcheck(lambda x, w, b: tp.conv3d(x, w, b, stride=(2, 1, 1), padding=1), [x, w, b])
    assert tp.gradcheck(lambda x, w: tp.conv3d(x, w, padding="same", dilation=(2, 1, 1)), [x, w])


def test_conv3d_of_an_empty_batch_is_empty_as_pytorch(queue, rng):
    x = leaf(queue, rng.standard_normal((2, 4, 3, 4, 5)))[2:]
    w = leaf(queue, rng.standard_normal((3, 4, 2, 2, 2)))
    with tp.Tape() as tape:
        y = tp.conv3d(x, w)
        loss = tp.sum(y)
    tape.backward(loss)
    assert y.shape == (0, 3, 2, 3, 4)
    np.testing.assert_array_equal(w.grad.to_host(), np.zeros((3, 4, 2, 2, 2), np.float32))


def test_conv3d_of_a_batch_split_into_chunks_is_as_pytorch(queue, rng, monkeypatch):
    # a tap matrix of at most 2000 floats: every image its own chunk (offsets n0 > 0)
    monkeypatch.setattr(pc.kernels.conv, "COLS_LIMIT", 2000)
    against_torch(queue, rng, lambda x, w, b: tp.conv3d(x, w, b, padding=1, groups=2),
                  lambda x, w, b: F.conv3d(x, w, b, padding=1, groups=2),
                  [rng.standard_normal((3, 4, 3, 4, 5)), rng.standard_normal((6, 2, 3, 3, 3)),
                   rng.standard_normal(6)], tol=1e-4)
    against_torch(queue, rng, lambda x, w: tp.conv_transpose3d(x, w, stride=2),
                  lambda x, w: F.conv_transpose3d(x, w, stride=2),
                  [rng.standard_normal((3, 4, 3, 4, 5)), rng.standard_normal((4, 2, 3, 3, 3))],
                  tol=1e-4)


class _GPUQueue:
    gpu = True


def test_vol2col_grids_on_gpus_stay_under_2_to_the_31_work_items_for_huge_inputs():
    from parcl.kernels.conv3d import _grid
    # rows x run x taps of 1.8e12 and 2.2e12 elements: each work-item walks RB rows instead,
    # and rows of millions of voxels XB of them too
    for run, rows, depth in [(224, 64 * 112 * 224, 27 * 64), (4096, 1 << 20, 512),
                             (10 ** 7, 3, 27 * 64)]:
        (gx, gy, gz), _, xb, rb = _grid(_GPUQueue(), run, rows, 1, depth)
        assert gx * gy * gz < 2 ** 31 and rb * xb > 1
        assert gx * xb >= run and gy * rb >= rows and gz == depth   # every element its item
    assert _grid(_GPUQueue(), 7, 5, 1, 3) == ((8, 16, 3), (8, 16, 1), 1, 1)   # one per element


def test_the_gpu_geometry_with_several_rows_per_work_item_is_as_pytorch(queue, rng,
                                                                       monkeypatch):
    # the GPU variant (one element per work-item, RB rows and XB elements each past
    # MAX_ITEMS) run here; vol2col's 54 taps give XB > 1, col2vol's rows RB > 1
    from parcl.kernels import conv3d as c3k
    monkeypatch.setattr(c3k, "on_gpu", lambda q: True)
    monkeypatch.setattr(c3k, "MAX_ITEMS", 500)
    assert c3k._grid(queue, 7, 2 * 3 * 3 * 5, 1, 1)[2:] == (1, 2)     # col2vol: 2 rows each
    assert c3k._grid(queue, 7, 2 * 3 * 5, 1, 54)[2] > 1               # vol2col: XB > 1
    against_torch(queue, rng, lambda x, w, b: tp.conv3d(x, w, b, stride=(1, 2, 1), padding=1),
                  lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=1),
                  [rng.standard_normal((2, 3, 3, 5, 7)), rng.standard_normal((4, 3, 2, 3, 3)),
                   rng.standard_normal(4)], tol=1e-4)


TRANSPOSED = [
    dict(),
    dict(stride=2, padding=1, output_padding=1),
    dict(stride=(2, 1, 3), padding=(1, 0, 1), output_padding=(1, 0, 2)),
    dict(stride=(2, 2, 1), padding=1, dilation=(2, 1, 2), groups=2),
    dict(stride=2, output_padding=(1, 0, 1), groups=4),
]


@pytest.mark.parametrize("kw", TRANSPOSED, ids=_id)
def test_conv_transpose3d_values_and_gradients_are_as_pytorch(queue, rng, kw):
    groups = kw.get("groups", 1)
    x = rng.standard_normal((2, 4, 3, 4, 5))
    w = rng.standard_normal((4, 6 // groups, 3, 2, 3)) if groups != 4 else \
        rng.standard_normal((4, 2, 3, 2, 3))
    b = rng.standard_normal(w.shape[1] * groups)
    against_torch(queue, rng, lambda x, w, b: tp.conv_transpose3d(x, w, b, **kw),
                  lambda x, w, b: F.conv_transpose3d(x, w, b, **kw), [x, w, b], tol=1e-4)


def test_conv_transpose3d_unbatched_and_gradcheck(queue, rng):
    against_torch(queue, rng, lambda x, w: tp.conv_transpose3d(x, w, stride=2),
                  lambda x, w: F.conv_transpose3d(x, w, stride=2),
                  [rng.standard_normal((2, 2, 3, 2)), rng.standard_normal((2, 3, 2, 2, 2))],
                  tol=1e-4)
    x = leaf(queue, rng.standard_normal((1, 2, 2, 3, 2)))
    w = leaf(queue, rng.standard_normal((2, 2, 3, 2, 2)))
    b = leaf(queue, rng.standard_normal(2))
    assert tp.gradcheck(lambda x, w, b: tp.conv_transpose3d(x, w, b, stride=(2, 1, 2),
                                                            padding=(1, 0, 0)), [x, w, b])



@pytest.mark.parametrize("kw", [dict(dilation=2, output_padding=1),
                                dict(stride=(1, 2, 1), padding=1, dilation=(3, 1, 2),
                                     output_padding=(2, 1, 1)),
                                dict(stride=2, dilation=3, output_padding=2, groups=2)],
                         ids=["stride1", "mixed", "groups"])
def test_conv_transpose3d_takes_an_output_padding_below_the_dilation_as_pytorch(queue, rng, kw):
    # PyTorch's rule is output_padding < max(stride, dilation): with stride 1 and dilation 2
    # an output_padding of 1 adds a last plane of bias only; conv3d of the gradient then has
    # a position more than x, which the input gradient leaves out
    groups = kw.get("groups", 1)
    x, w = rng.standard_normal((2, 4, 3, 4, 5)), rng.standard_normal((4, 3, 2, 3, 2))
    b = rng.standard_normal(3 * groups)
    out = against_torch(queue, rng, lambda x, w, b: tp.conv_transpose3d(x, w, b, **kw),
                        lambda x, w, b: F.conv_transpose3d(x, w, b, **kw), [x, w, b], tol=1e-4)
    assert out.shape[2:] == tuple(F.conv_transpose3d(
        torch.zeros(1, 4, 3, 4, 5), torch.zeros(4, 3, 2, 3, 2), **kw).shape[2:])
    m = pc.nn.ConvTranspose3d(4, 3, 2, dilation=2, output_padding=1)
    assert m(tp.tensor(np.ones((1, 4, 3, 3, 3), np.float32))).shape == (1, 3, 6, 6, 6)
    assert repr(m) == repr(torch.nn.ConvTranspose3d(4, 3, 2, dilation=2, output_padding=1))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [1, "same", (0, 1, 2)], ids=["1", "same", "012"])
def test_conv3d_module_with_padding_modes_is_as_pytorch(queue, rng, mode, padding):
    torch.manual_seed(0)
    kw = dict(padding=padding, padding_mode=mode, groups=2)
    tm, pm = torch.nn.Conv3d(4, 6, (3, 2, 3), **kw), pc.nn.Conv3d(4, 6, (3, 2, 3), **kw)
    assert list(pm.state_dict()) == list(tm.state_dict()) == ["weight", "bias"]
    assert pm.weight.shape == tuple(tm.weight.shape) == (6, 2, 3, 2, 3)
    assert repr(pm) == repr(tm)

    def run(m, x):
        return m(x)
    compare(queue, tm, pm, [rng.standard_normal((2, 4, 5, 6, 7)).astype(np.float32)], run, run,
            tol=1e-4)


def test_conv3d_module_initialisation_is_pytorchs_uniform_bound(queue):
    pc.nn.manual_seed(0)
    m = pc.nn.Conv3d(6, 4, (3, 2, 2), groups=2, bias=True)
    bound = 1 / np.sqrt(3 * 3 * 2 * 2)                 # fan_in = cin/groups * kd*kh*kw
    w, b = m.weight.to_host(), m.bias.to_host()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.abs(b).max() <= bound
    assert pc.nn.Conv3d(2, 2, 1, bias=False).bias is None
    assert repr(pc.nn.Conv3d(2, 2, 1, bias=False)) == repr(torch.nn.Conv3d(2, 2, 1, bias=False))


@pytest.mark.parametrize("kw,size", [(dict(), (6, 8, 10)),
                                     (dict(groups=2, dilation=(1, 2, 1), bias=False), (6, 10, 9))],
                         ids=["plain", "groups-dilation"])
def test_conv_transpose3d_module_takes_an_output_size_as_pytorch(queue, rng, kw, size):
    torch.manual_seed(0)
    tm = torch.nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, **kw)
    pm = pc.nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, **kw)
    assert list(pm.state_dict()) == list(tm.state_dict())
    assert pm.weight.shape == tuple(tm.weight.shape) and repr(pm) == repr(tm)
    fan_in = pm.weight.shape[1] * 27
    assert np.abs(pm.weight.to_host()).max() <= 1 / np.sqrt(fan_in)

    def run(m, x):
        return m(x, output_size=size)
    out, = compare(queue, tm, pm, [rng.standard_normal((2, 4, 3, 4, 5)).astype(np.float32)],
                   run, run, tol=1e-4)
    assert out.shape == (2, 6) + size


def test_conv3d_refusals_name_the_op_and_shapes(queue, rng):
    x = leaf(queue, rng.standard_normal((2, 4, 3, 4, 5)))
    w = leaf(queue, rng.standard_normal((3, 4, 2, 2, 2)))
    with pytest.raises(ShapeError, match=r"conv3d: weight must be 5-d .* \(3, 4, 2, 2\)"):
        tp.conv3d(x, leaf(queue, rng.standard_normal((3, 4, 2, 2))))
    with pytest.raises(ShapeError, match=r"conv3d: expected a 4-d .* got shape \(2, 4, 3\)"):
        tp.conv3d(leaf(queue, rng.standard_normal((2, 4, 3))), w)
    with pytest.raises(ShapeError, match=r"conv3d: input of shape \(2, 4, 3, 4, 5\) has 4 "
                                         r"channels, weight \(3, 2, 2, 2, 2\)"):
        tp.conv3d(x, leaf(queue, rng.standard_normal((3, 2, 2, 2, 2))))
    with pytest.raises(ShapeError, match=r"conv3d: kernel \(4, 2, 2\) .* spatial size "
                                         r"\(3, 4, 5\)"):
        tp.conv3d(x, leaf(queue, rng.standard_normal((3, 4, 4, 2, 2))))
    with pytest.raises(ShapeError, match="conv3d: padding='same' needs stride 1"):
        tp.conv3d(x, w, padding="same", stride=(1, 2, 1))
    with pytest.raises(ShapeError, match=r"conv3d: bias has shape \(4,\), expected \(3,\)"):
        tp.conv3d(x, w, leaf(queue, rng.standard_normal(4)))
    with pytest.raises(ShapeError, match="conv3d: stride must be a positive int or a tuple "
                                         "of three, got 1.5"):
        tp.conv3d(x, w, stride=1.5)
    with pytest.raises(ShapeError, match=r"conv3d: the input's spatial size \(0, 4, 5\)"):
        tp.conv3d(x[:, :, 3:], w)
    with pytest.raises(DTypeError, match="conv3d: weight has dtype int64"):
        tp.conv3d(x, pc.Tensor.from_host(queue, np.ones((3, 4, 2, 2, 2), np.int64)))
    with pytest.raises(ShapeError, match="conv_transpose3d: output_padding .* smaller than "
                                         "the stride .* or the dilation"):
        tp.conv_transpose3d(x, leaf(queue, rng.standard_normal((4, 3, 2, 2, 2))),
                            output_padding=1)
    with pytest.raises(ShapeError, match=r"conv_transpose3d: input of shape \(2, 4, 3, 4, "
                                         r"5\) has 4 channels, weight \(3, 3, 2, 2, 2\)"):
        tp.conv_transpose3d(x, leaf(queue, rng.standard_normal((3, 3, 2, 2, 2))))
    with pytest.raises(ShapeError, match="ConvTranspose3d: only padding_mode='zeros'"):
        pc.nn.ConvTranspose3d(4, 4, 2, padding_mode="reflect")
    with pytest.raises(ShapeError, match=r"Conv3d.*has 4 features/channels .* expected 3"):
        pc.nn.Conv3d(3, 2, 1)(x)
    with pytest.raises(ShapeError, match="Conv3d: groups=3"):
        pc.nn.Conv3d(4, 6, 1, groups=3)


def test_conv_transpose3d_input_gradient_trimmed_for_output_padding_takes_in_place_adds(queue):
    """An output_padding of a stride or more trims the input gradient to x's size: the trim
    went through Tensor.__getitem__, which notes a user's indexing copy, so the correct
    gradient refused x.grad += 1 ('an indexing result ... a copy in parcl')."""
    rng = np.random.default_rng(0)
    x = leaf(queue, rng.standard_normal((1, 2, 3, 3, 3)).astype(np.float32))
    w = leaf(queue, rng.standard_normal((2, 2, 2, 2, 2)).astype(np.float32))
    with tp.Tape() as tape:
        loss = tp.sum(tp.conv_transpose3d(x, w, stride=2, output_padding=2, dilation=3))
    tape.backward(loss)
    before = x.grad.to_host()
    x.grad += 1.0
    np.testing.assert_array_equal(x.grad.to_host(), before + 1.0)
