"""Padding modes, interpolation and pixel shuffles as PyTorch's: ``tp.pad`` in reflect,
replicate and circular mode, ``tp.interpolate``, ``tp.pixel_shuffle`` and
``tp.pixel_unshuffle``; outputs and gradients against ``torch.nn.functional`` on odd sizes,
finite differences, bit-identical reruns, captured replays, and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import assert_replays_eager, assert_same_gradient_bits_twice, leaf
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
    assert_same_gradient_bits_twice(queue, x,
                                    lambda t: tp.sum(tp.pad(t, (7, 0, 2, 2), mode=mode) * w))


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


@pytest.mark.parametrize("shape,pad,torch_refuses", [
    ((1, 1, 3), (3, -2), True), ((1, 1, 3), (-2, 2), True), ((1, 1, 4, 5), (0, 0, 3, -2), True),
    ((2, 1, 3), (2, -2), False), ((1, 1, 2), (-2, 2), False)])
def test_circular_pad_refuses_to_wrap_more_than_the_cropped_input_holds(queue, shape, pad,
                                                                        torch_refuses):
    # PyTorch copies each side from the cropped input: more than it holds is an overlapping
    # copy it refuses, or, with several channels, memory it never wrote (garbage such as
    # 4.6e-41); parcl wrapped around again ([1, 1, 1, 1] for [1, 2, 3] padded (3, -2)), or
    # failed in index_select where nothing was kept
    with pytest.raises(pc.ParclError, match="pad: mode 'circular' wraps around at most once"):
        tp.pad(pc.Tensor.zeros(queue, shape), pad, mode="circular")
    if torch_refuses:
        with pytest.raises(RuntimeError):
            F.pad(torch.zeros(shape), pad, mode="circular")
    # as much as the cropped input holds still wraps, as PyTorch
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    np.testing.assert_array_equal(tp.pad(tp.tensor(x), (3, -2), mode="circular").to_host(),
                                  F.pad(torch.tensor(x), (3, -2), mode="circular").numpy())


def test_pad_refuses_a_fill_value_outside_constant_mode_and_an_unknown_mode(queue):
    t = pc.Tensor.zeros(queue, (2, 3, 5))
    raises_like_torch(lambda: tp.pad(t, (1, 1), mode="reflect", value=2.0),
                      lambda: F.pad(torch.zeros(2, 3, 5), (1, 1), mode="reflect", value=2.0),
                      "pad")
    with pytest.raises(pc.ShapeError, match="mode must be one of"):
        tp.pad(t, (1, 1), mode="symmetric")
    with pytest.raises(pc.ShapeError, match="given third .* and value=0.5 too"):
        tp.pad(t, (1, 1), 0.25, value=0.5)


def test_pad_takes_a_fill_value_third_as_parcls_signature_and_a_mode_as_pytorchs(queue):
    """``tp.pad(x, pad, value)`` is parcl's documented signature (API.md); PyTorch's third
    argument is ``mode``. A number there is the fill value, a string the mode."""
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    t = pc.Tensor.from_host(queue, x)
    np.testing.assert_array_equal(tp.pad(t, (1, 1), 0.5).to_host(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1)), constant_values=0.5))
    np.testing.assert_array_equal(tp.pad(t, (1, 1), "replicate").to_host(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1)), mode="edge"))


INTERPOLATE_CASES = [
    ((2, 3, 5, 7), dict(scale_factor=2)), ((2, 3, 5, 7), dict(scale_factor=(1.7, 0.6))),
    ((1, 2, 6, 9), dict(size=(4, 13))), ((1, 2, 6, 9), dict(size=5)),
    ((2, 2, 7, 3), dict(scale_factor=3.3, recompute_scale_factor=True)),
    ((2, 3, 1, 1), dict(size=(3, 2))), ((2, 3, 4, 4), dict(scale_factor=1)),
    ((2, 3, 9, 8), dict(size=(3, 3)))]


@pytest.mark.parametrize("shape,kw", INTERPOLATE_CASES)
@pytest.mark.parametrize("mode,align", [("nearest", None), ("nearest-exact", None),
                                        ("bilinear", False), ("bilinear", True),
                                        ("bilinear", None)])
def test_interpolate_2d_matches_pytorch_with_gradients(queue, rng, shape, kw, mode, align):
    kw = dict(kw, mode=mode, align_corners=align)
    against_torch(queue, rng, lambda t: tp.interpolate(t, **kw),
                  lambda t: F.interpolate(t, **kw), [rng.standard_normal(shape)], tol=2e-5)


@pytest.mark.parametrize("shape,kw,mode", [
    ((2, 3, 7), dict(scale_factor=2.5), "linear"), ((2, 3, 7), dict(size=4), "linear"),
    ((2, 3, 7), dict(size=11), "nearest"), ((1, 2, 3, 4, 5), dict(size=(4, 3, 7)), "nearest"),
    ((1, 2, 3, 4, 5), dict(scale_factor=(2, 1.5, 0.5)), "trilinear")])
@pytest.mark.parametrize("align", [None, True])
def test_interpolate_1d_and_3d_match_pytorch_with_gradients(queue, rng, shape, kw, mode,
                                                             align):
    if align and mode == "nearest":
        return
    kw = dict(kw, mode=mode, align_corners=align)
    against_torch(queue, rng, lambda t: tp.interpolate(t, **kw),
                  lambda t: F.interpolate(t, **kw), [rng.standard_normal(shape)], tol=2e-5)


def test_nearest_exact_moves_a_dim_of_unchanged_size_as_pytorch(queue, rng):
    # scale_factor 1.33 keeps a size of 3 (floor(3.99)) but its positions are (d + 0.5) / 1.33:
    # [0, 1, 1] in PyTorch; parcl kept [0, 1, 2] in every dim but the first
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    got = tp.interpolate(tp.tensor(x), scale_factor=(1.33, 1.33), mode="nearest-exact")
    np.testing.assert_array_equal(got.to_host()[0, 0], [[0, 1, 1], [3, 4, 4], [3, 4, 4]])
    for shape, sf in [((1, 2, 3, 3), (2.0, 1.33)), ((2, 1, 4, 3, 3), (0.7, 1.33, 1.33)),
                      ((1, 2, 3), 1.33)]:
        kw = dict(scale_factor=sf, mode="nearest-exact")
        against_torch(queue, rng, lambda t, kw=kw: tp.interpolate(t, **kw),
                      lambda t, kw=kw: F.interpolate(t, **kw), [rng.standard_normal(shape)])


def test_linear_modes_copy_a_dim_of_unchanged_size_as_pytorch(queue, rng):
    # PyTorch copies a dim whose size a scale_factor leaves as it is (3 at 1.33), where
    # parcl weighed neighbours at the positions (d + 0.5) / 1.33 - 0.5: [0, 0.654, 1.423]
    # for [0, 1, 2]; and an infinity no longer spills into its neighbours (inf * 0)
    x = np.array([[[0.0, 1.0, 2.0]]], np.float32)
    got = tp.interpolate(tp.tensor(x), scale_factor=1.33, mode="linear")
    np.testing.assert_array_equal(got.to_host(), x)
    inf = np.array([[[1.0, np.inf, 3.0]]], np.float32)
    want = F.interpolate(torch.tensor(inf), size=3, mode="linear").numpy()     # [1, nan, 3]
    np.testing.assert_array_equal(tp.interpolate(tp.tensor(inf), size=3, mode="linear")
                                  .to_host(), want)
    for shape, sf, mode in [((1, 2, 3, 5), (1.33, 2.5), "bilinear"),
                            ((2, 1, 4, 3), (2.0, 1.33), "bilinear"),
                            ((1, 1, 2, 3, 2), (1.3, 1.33, 2.0), "trilinear")]:
        for align in (None, True):
            kw = dict(scale_factor=sf, mode=mode, align_corners=align)
            against_torch(queue, rng, lambda t, kw=kw: tp.interpolate(t, **kw),
                          lambda t, kw=kw: F.interpolate(t, **kw),
                          [rng.standard_normal(shape)])


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_interpolate_gradients_pass_finite_differences(queue, rng, mode):
    node = leaf(queue, rng.standard_normal((1, 2, 3, 4)))
    assert tp.gradcheck(lambda t: tp.interpolate(t, size=(5, 7), mode=mode), [node])


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_an_interpolated_gradient_is_the_same_bits_run_after_run(queue, rng, mode):
    """Downsampling picks source positions many times: their gradients are summed in a fixed
    order."""
    x = rng.standard_normal((2, 3, 40, 33)).astype(np.float32)
    w = pc.Tensor.from_host(queue, rng.standard_normal((2, 3, 7, 90)).astype(np.float32))
    assert_same_gradient_bits_twice(
        queue, x, lambda t: tp.sum(tp.interpolate(t, size=(7, 90), mode=mode) * w))


@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 4, 4), dict(mode="linear", size=3)), ((2, 3, 4), dict(mode="bilinear", size=3)),
    ((2, 3, 4, 4), dict(size=3, scale_factor=2)), ((2, 3, 4, 4), dict()),
    ((2, 3, 4, 4), dict(size=(3, 3, 3))), ((2, 3, 4, 4), dict(size=3, align_corners=True)),
    ((2, 3, 4, 4), dict(size=3, recompute_scale_factor=True))])
def test_interpolate_refuses_what_pytorch_refuses(queue, shape, kw):
    t = pc.Tensor.zeros(queue, shape)
    with pytest.raises((ValueError, NotImplementedError, RuntimeError, TypeError)):
        F.interpolate(torch.zeros(shape), **kw)
    with pytest.raises(pc.ShapeError, match="interpolate"):
        tp.interpolate(t, **kw)


@pytest.mark.parametrize("kw", [dict(mode="bilinear", antialias=True)])
def test_interpolate_refuses_the_modes_it_lacks_by_name(queue, kw):
    with pytest.raises(pc.ShapeError, match="not supported"):
        tp.interpolate(pc.Tensor.zeros(queue, (2, 3, 4, 4)), size=3, **kw)


@pytest.mark.parametrize("shape,r", [((2, 8, 3, 5), 2), ((18, 2, 3), 3), ((2, 1, 4, 1, 1), 1),
                                     ((1, 2, 16, 2, 1), 4)])
def test_pixel_shuffle_and_unshuffle_match_pytorch_and_undo_each_other(queue, rng, shape, r):
    x = rng.standard_normal(shape)
    y = against_torch(queue, rng, lambda t: tp.pixel_shuffle(t, r),
                      lambda t: F.pixel_shuffle(t, r), [x])
    back = against_torch(queue, rng, lambda t: tp.pixel_unshuffle(t, r),
                         lambda t: F.pixel_unshuffle(t, r), [y.to_host()])
    assert np.array_equal(back.to_host(), x.astype(np.float32))


def test_pixel_shuffles_refuse_what_pytorch_refuses(queue):
    t = pc.Tensor.zeros(queue, (1, 6, 4, 4))
    raises_like_torch(lambda: tp.pixel_shuffle(t, 2),
                      lambda: F.pixel_shuffle(torch.zeros(1, 6, 4, 4), 2), "pixel_shuffle")
    raises_like_torch(lambda: tp.pixel_unshuffle(t, 3),
                      lambda: F.pixel_unshuffle(torch.zeros(1, 6, 4, 4), 3), "pixel_unshuffle")
    raises_like_torch(lambda: tp.pixel_shuffle(pc.Tensor.zeros(queue, (4, 4)), 2),
                      lambda: F.pixel_shuffle(torch.zeros(4, 4), 2), "pixel_shuffle")


def test_a_captured_step_of_padding_modes_and_interpolation_replays_the_eager_bits(queue, rng):
    w = leaf(queue, rng.standard_normal((2, 3, 10, 16)))

    def step(x):
        with tp.Tape() as tape:
            h = tp.pad(tp.tensor(x) * w, (3, 2, 1, 1), mode="reflect")
            h = tp.pad(h, (1, 1, 0, 0), mode="circular") + tp.pad(h, (2, 0, 0, 0),
                                                                  mode="replicate")
            up = tp.interpolate(h, scale_factor=(1.5, 0.5), mode="bilinear")
            loss = tp.sum(up * up) + tp.sum(tp.pixel_unshuffle(
                tp.interpolate(h, size=(6, 8)), 2)[:, 1])
        tape.backward(loss)
        return loss.value

    assert_replays_eager(queue, step, w, [rng.standard_normal((2, 3, 10, 16)).astype(np.float32)
                                          for _ in range(3)])
