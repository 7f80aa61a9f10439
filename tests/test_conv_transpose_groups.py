"""``tp.conv_transpose2d``/``conv_transpose1d`` and ``nn.ConvTranspose2d``/``ConvTranspose1d``
with ``groups`` and ``dilation`` (and unbatched inputs) against PyTorch's: outputs, the
gradients of input, weight and bias, gradcheck, ``output_size``, init bounds and reprs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from parcl import nn

CASES_2D = [((2, 4, 5, 5), (4, 3, 3, 3), dict(groups=2)),
            ((2, 4, 5, 6), (4, 2, 3, 2), dict(dilation=2, stride=2, padding=1,
                                               output_padding=1)),
            ((4, 5, 5), (4, 1, 3, 3), dict(groups=4, dilation=(2, 1))),
            ((1, 6, 4, 4), (6, 2, 2, 3), dict(groups=3, stride=(2, 1), padding=(0, 1))),
            ((3, 4, 4), (3, 2, 3, 3), dict(stride=2, padding=1))]
CASES_1D = [((2, 4, 7), (4, 3, 3), dict(groups=2, stride=2)),
            ((4, 6), (4, 2, 2), dict(dilation=3, padding=1)),
            ((1, 6, 5), (6, 1, 3), dict(groups=6, dilation=2, stride=3, output_padding=2))]


def check_as_torch(ours, theirs, shapes, kw, rng) -> None:
    xs, ws = shapes
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[1] * kw.get("groups", 1)).astype(np.float32)
    mine = [leaf(pc.default_queue(), a) for a in (x, w, b)]
    torchs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    with tp.Tape() as tape:
        y = ours(*mine, **kw)
    want = theirs(*torchs, **kw)
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=pc.Tensor.from_host(pc.default_queue(), g))
    want.backward(torch.from_numpy(g))
    for a, t in zip(mine, torchs):
        np.testing.assert_allclose(a.grad.to_host(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("index", range(len(CASES_2D)))
def test_conv_transpose2d_with_groups_and_dilation_matches_pytorch(queue, rng, index):
    xs, ws, kw = CASES_2D[index]
    check_as_torch(tp.conv_transpose2d, F.conv_transpose2d, (xs, ws), kw, rng)


@pytest.mark.parametrize("index", range(len(CASES_1D)))
def test_conv_transpose1d_with_groups_and_dilation_matches_pytorch(queue, rng, index):
    xs, ws, kw = CASES_1D[index]
    check_as_torch(tp.conv_transpose1d, F.conv_transpose1d, (xs, ws), kw, rng)


def test_a_grouped_dilated_conv_transpose2d_passes_gradcheck(queue, rng):
    x, w, b = (leaf(queue, rng.standard_normal(s).astype(np.float32))
               for s in ((1, 4, 3, 3), (4, 1, 2, 2), (2,)))
    assert tp.gradcheck(lambda *a: tp.conv_transpose2d(*a, stride=2, groups=2, dilation=2),
                        [x, w, b])


def test_a_grouped_conv_transpose_is_the_input_gradient_of_the_grouped_conv(queue):
    # one group's output channel sees only that group's input channels: ones in, so the
    # output is the sum of that group's weights at each tap
    x = tp.tensor(np.ones((1, 4, 1, 1), np.float32))
    w = np.arange(8, dtype=np.float32).reshape(4, 2, 1, 1)
    y = tp.conv_transpose2d(x, tp.tensor(w), groups=2).to_host().ravel()
    np.testing.assert_array_equal(y, [0 + 2, 1 + 3, 4 + 6, 5 + 7])


MODULES = [(nn.ConvTranspose2d, torch.nn.ConvTranspose2d, (4, 6, 3),
            dict(stride=2, padding=1, groups=2, dilation=2), (2, 4, 5, 5)),
           (nn.ConvTranspose2d, torch.nn.ConvTranspose2d, (3, 2, 2), dict(stride=2), (3, 4, 4)),
           (nn.ConvTranspose1d, torch.nn.ConvTranspose1d, (6, 3, 3),
            dict(groups=3, dilation=2, output_padding=1, stride=2), (2, 6, 5))]


@pytest.mark.parametrize("index", range(len(MODULES)))
def test_conv_transpose_modules_with_groups_and_dilation_match_pytorch(queue, rng, index):
    ours_cls, theirs_cls, args, kw, xs = MODULES[index]
    ours, theirs = ours_cls(*args, **kw), theirs_cls(*args, **kw)
    assert repr(ours) == repr(theirs)
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    fan_in = theirs.weight.shape[1] * int(np.prod(theirs.weight.shape[2:]))
    weight = ours.weight.to_host()
    assert np.abs(weight).max() <= 1 / np.sqrt(fan_in) + 1e-7
    theirs.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
    x = rng.standard_normal(xs).astype(np.float32)
    nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = ours(nx)
    want = theirs(tx)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    tape.backward(tp.sum(y))
    want.sum().backward()
    np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours.weight.grad.to_host(), theirs.weight.grad.numpy(),
                               rtol=1e-4, atol=1e-4)


def test_output_size_counts_the_dilated_kernel_as_pytorch(queue):
    ours = nn.ConvTranspose2d(2, 2, 3, stride=2, dilation=2)
    theirs = torch.nn.ConvTranspose2d(2, 2, 3, stride=2, dilation=2)
    x = np.ones((1, 2, 4, 4), np.float32)
    y = ours(tp.tensor(x), output_size=(12, 11))
    assert y.shape == tuple(theirs(torch.tensor(x), output_size=(12, 11)).shape) == \
        (1, 2, 12, 11)


def test_conv_transpose2d_refuses_channels_groups_do_not_divide(queue):
    x = tp.tensor(np.ones((1, 4, 3, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"conv_transpose2d: input of shape \(1, 4, 3, 3\) "
                                            r"has 4 channels, weight \(4, 1, 2, 2\) .*groups=3"):
        tp.conv_transpose2d(x, tp.tensor(np.ones((4, 1, 2, 2), np.float32)), groups=3)
    with pytest.raises(pc.ShapeError, match="conv_transpose2d: dilation must be a positive"):
        tp.conv_transpose2d(x, tp.tensor(np.ones((4, 1, 2, 2), np.float32)), dilation=0)


def test_conv_transpose1d_and_2d_take_an_output_padding_below_the_dilation_as_pytorch(queue,
                                                                                     rng):
    # PyTorch needs output_padding below the stride *or* the dilation, as ConvTranspose3d's
    # (32fc306); these were refused with 'output_padding (1, 1) must be smaller than the
    # stride (1, 1)'
    check_as_torch(tp.conv_transpose1d, F.conv_transpose1d, ((2, 4, 7), (4, 3, 2)),
                   dict(dilation=2, output_padding=1), rng)
    for ours_cls, theirs_cls, xs in [(nn.ConvTranspose2d, torch.nn.ConvTranspose2d,
                                      (2, 4, 5, 6)),
                                     (nn.ConvTranspose1d, torch.nn.ConvTranspose1d, (2, 4, 7))]:
        kw = dict(dilation=2, output_padding=1)
        ours, theirs = ours_cls(4, 3, 2, **kw), theirs_cls(4, 3, 2, **kw)
        assert repr(ours) == repr(theirs)
        theirs.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
        x = rng.standard_normal(xs).astype(np.float32)
        nx, tx = leaf(queue, x), torch.tensor(x, requires_grad=True)
        with tp.Tape() as tape:
            y = ours(nx)
        want = theirs(tx)
        assert y.shape == tuple(want.shape) == (2, 3) + tuple(n + 3 for n in xs[2:])
        np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
        tape.backward(tp.sum(y * y))
        (want * want).sum().backward()
        np.testing.assert_allclose(nx.grad.to_host(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ours.weight.grad.to_host(), theirs.weight.grad.numpy(),
                                   rtol=1e-4, atol=1e-4)
    with pytest.raises(pc.ShapeError, match=r"ConvTranspose2d: output_padding \(2, 2\) must "
                                            r"be smaller than the stride \(1, 1\) or the "
                                            r"dilation \(2, 2\)"):
        nn.ConvTranspose2d(4, 3, 2, dilation=2, output_padding=2)
