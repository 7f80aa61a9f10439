"""Convolutions beyond the plain conv2d: dilation, groups (depthwise when groups == cin, with
and without a channel multiplier) and conv_transpose2d, forward against float64 numpy
references, backward by ``tp.gradcheck``; repeated runs bit-identical; the GPU work-item
layouts forced on the CPU device give the same results; errors name the op and the shapes."""

from __future__ import annotations

import conv_reference as ref
import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.kernels import conv as convk
from parcl.kernels import conv_transpose as ctk
from conftest import close, leaf, up


# (x shape, weight shape, stride, padding, dilation, groups): odd and size-1 dims; rows wide
# enough for the depthwise kernels' 8-wide (and 4-wide) blocks at stride 1 and 2
CASES = [
    ((2, 3, 6, 13), (3, 1, 3, 3), 1, 1, 1, 3),           # depthwise
    ((2, 3, 5, 7), (3, 1, 3, 3), 1, 1, 1, 3),            # depthwise, narrow rows (4-wide)
    ((1, 2, 5, 21), (4, 1, 3, 3), 2, 1, 1, 2),           # depthwise, multiplier 2, stride 2
    ((2, 3, 7, 12), (3, 1, 3, 2), (1, 2), (2, 0), 2, 3),  # depthwise, dilated, pairs
    ((1, 2, 9, 9), (2, 1, 5, 5), 3, 2, (1, 2), 2),       # depthwise, stride 3 (scalar loads)
    ((2, 4, 1, 1), (4, 1, 3, 3), 1, 1, 1, 4),            # depthwise on 1x1 images
    ((2, 4, 5, 6), (6, 2, 3, 3), 1, 1, 1, 2),            # grouped
    ((1, 6, 7, 5), (3, 2, 2, 3), 2, 1, 1, 3),            # grouped, 1 output channel per group
    ((2, 3, 9, 8), (4, 3, 3, 3), 1, 2, 2, 1),            # dilated
    ((2, 2, 10, 11), (3, 2, 3, 2), 2, 3, (3, 2), 1),     # dilated, stride 2
]


@pytest.mark.parametrize("xs, ws, s, p, d, groups", CASES)
def test_conv2d_dilation_groups_forward_and_gradcheck(queue, rng, xs, ws, s, p, d, groups):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    nx, nw, nb = leaf(queue, x), leaf(queue, w), leaf(queue, b)
    y = tp.conv2d(nx, nw, nb, s, p, d, groups)
    assert y.op_name == "conv2d"
    close(y.to_host(), ref.conv2d(x, w, b, s, p, d, groups))
    # a weight's gradient sums float32 products over every output position: finite
    # differences of the float32 forward are off by up to ~2e-3 there
    assert tp.gradcheck(lambda a, k, c: tp.conv2d(a, k, c, s, p, d, groups), [nx, nw, nb],
                        atol=5e-3)


@pytest.mark.parametrize("xs, ws, s, p, d, groups", [CASES[0], CASES[2], CASES[6]])
def test_conv2d_groups_fused_relu(queue, rng, xs, ws, s, p, d, groups):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    nx, nw = leaf(queue, x), leaf(queue, w)
    for bias in (None, b):
        y = tp.conv2d(nx, nw, None if bias is None else up(queue, bias), s, p, d, groups,
                      relu=True)
        close(y.to_host(), np.maximum(ref.conv2d(x, w, bias, s, p, d, groups), 0))
    assert tp.gradcheck(lambda a, k: tp.conv2d(a, k, up(queue, b), s, p, d, groups,
                                               relu=True), [nx, nw], atol=5e-3)


def test_depthwise_large_batch_weight_gradient_sums_over_images(queue, rng):
    x, w = rng.standard_normal((5, 2, 6, 11)), rng.standard_normal((2, 1, 3, 3))
    g = rng.standard_normal((5, 2, 6, 11))
    gx, gw, gb = convk.conv2d_backward(up(queue, x), up(queue, w), up(queue, g), 1, 1,
                                       need_bias=True, groups=2)
    # conv2d is linear in x and in w: <g, conv(dx, w)> = <gx, dx>, <g, conv(x, dw)> = <gw, dw>
    dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    close((gx.to_host() * dx).sum(), (g * ref.conv2d(dx, w, None, 1, 1, 1, 2)).sum(), 1e-3)
    close((gw.to_host() * dw).sum(), (g * ref.conv2d(x, dw, None, 1, 1, 1, 2)).sum(), 1e-3)
    close(gb.to_host(), g.sum((0, 2, 3)))


TRANSPOSED = [
    ((2, 3, 4, 5), (3, 2, 3, 3), 2, 1, 1),
    ((1, 2, 3, 3), (2, 3, 2, 2), 1, 0, 0),
    ((2, 2, 5, 4), (2, 1, 3, 2), (3, 2), (2, 1), (2, 1)),
    ((3, 4, 1, 1), (4, 5, 3, 3), 2, 0, 0),
    ((1, 1, 2, 7), (1, 2, 4, 4), 2, 1, 0),
]


@pytest.mark.parametrize("xs, ws, s, p, op", TRANSPOSED)
def test_conv_transpose2d_forward_and_gradcheck(queue, rng, xs, ws, s, p, op):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[1])
    nx, nw, nb = leaf(queue, x), leaf(queue, w), leaf(queue, b)
    y = tp.conv_transpose2d(nx, nw, nb, s, p, op)
    assert y.op_name == "conv_transpose2d"
    want = ref.conv_transpose2d(x, w, b, s, p, op)
    assert y.shape == want.shape
    close(y.to_host(), want)
    assert tp.gradcheck(lambda a, k, c: tp.conv_transpose2d(a, k, c, s, p, op), [nx, nw, nb])


def test_conv_transpose2d_is_conv2d_input_gradient(queue, rng):
    """conv_transpose2d(g, W) is the gradient of conv2d(x, W) with respect to x at g."""
    x, w = rng.standard_normal((2, 3, 7, 7)), rng.standard_normal((4, 3, 3, 3))
    g = rng.standard_normal((2, 4, 4, 4))
    gx = convk.conv2d_backward(up(queue, x), up(queue, w), up(queue, g), 2, 1,
                               need_weight=False)[0]
    y = tp.conv_transpose2d(up(queue, g), up(queue, w), None, 2, 1, 0)
    np.testing.assert_array_equal(y.to_host(), gx.to_host())


def test_conv_ext_bit_identical_run_to_run(queue, rng):
    x = up(queue, rng.standard_normal((2, 4, 7, 12)))
    weights = [up(queue, rng.standard_normal(s)) for s in ((4, 1, 3, 3), (6, 2, 3, 3),
                                                           (6, 3, 3, 3))]
    runs = []
    for _ in range(2):
        nx = tp.tensor(x, requires_grad=True)
        nws = [tp.tensor(w, requires_grad=True) for w in weights]
        with tp.Tape() as tape:
            h = tp.conv2d(nx, nws[0], None, 1, 2, 2, 4)
            h = tp.conv2d(h, nws[1], None, 2, 1, 1, 2)
            h = tp.conv_transpose2d(h, nws[2], None, 2, 1, 1)
            loss = tp.sum(h * h)
        tape.backward(loss)
        runs.append([t.to_host() for t in (loss.value, nx.grad, *(w.grad for w in nws))])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_gpu_layouts_give_the_same_results(queue, rng, monkeypatch):
    """The depthwise kernels' GPU layout (one output per work-item) is chosen by device type;
    forced here so it runs without a GPU."""
    x, w = rng.standard_normal((2, 3, 6, 13)), rng.standard_normal((6, 1, 3, 3))
    g, wt = rng.standard_normal((2, 6, 3, 7)), rng.standard_normal((6, 2, 3, 3))

    def run():
        y = convk.conv2d_forward(up(queue, x), up(queue, w), None, 2, 1, groups=3)
        grads = convk.conv2d_backward(up(queue, x), up(queue, w), up(queue, g), 2, 1,
                                      need_bias=True, groups=3)
        yt = ctk.conv_transpose2d_forward(up(queue, g), up(queue, wt), None, 2, 1, 1)
        return [t.to_host() for t in (y, *grads, yt)]

    cpu = run()
    monkeypatch.setattr(convk, "on_gpu", lambda queue: True)
    for a, b in zip(run(), cpu):
        close(a, b, 1e-5)


def test_conv_ext_errors(queue):
    x = up(queue, np.zeros((1, 4, 5, 5)))
    with pytest.raises(pc.ShapeError, match=r"conv2d: groups=3 must divide the input's 4 "
                                            r"channels"):
        tp.conv2d(x, up(queue, np.zeros((3, 1, 3, 3))), groups=3)
    with pytest.raises(pc.ShapeError, match=r"conv2d: input has 4 channels but weight "
                                            r"\(4, 1, 3, 3\) with groups=2 expects 2"):
        tp.conv2d(x, up(queue, np.zeros((4, 1, 3, 3))), groups=2)
    with pytest.raises(pc.ShapeError, match=r"conv2d: dilation must be >= 1"):
        tp.conv2d(x, up(queue, np.zeros((4, 4, 3, 3))), dilation=0)
    with pytest.raises(pc.ShapeError, match=r"conv2d: kernel \(3, 3\) .*dilation \(3, 3\) "
                                            r"does not fit"):
        tp.conv2d(x, up(queue, np.zeros((4, 4, 3, 3))), dilation=3)
    w = up(queue, np.zeros((4, 2, 3, 3)))
    with pytest.raises(pc.ShapeError, match=r"conv_transpose2d: output_padding \(2, 2\) must "
                                            r"be smaller than the stride \(2, 2\)"):
        tp.conv_transpose2d(x, w, stride=2, output_padding=2)
    with pytest.raises(pc.ShapeError, match=r"conv_transpose2d: input has 4 channels but "
                                            r"weight \(2, 4, 3, 3\) expects 2"):
        tp.conv_transpose2d(x, up(queue, np.zeros((2, 4, 3, 3))))
    with pytest.raises(pc.ShapeError, match=r"conv_transpose2d: bias has shape \(4,\), "
                                            r"expected \(2,\)"):
        tp.conv_transpose2d(x, w, up(queue, np.zeros(4)))
    with pytest.raises(pc.DTypeError, match=r"conv_transpose2d: input has dtype int32"):
        tp.conv_transpose2d(up(queue, np.zeros((1, 4, 5, 5)), np.int32), w)


@pytest.mark.parametrize("op, wshape, kw", [
    ("conv2d", (3, 4, 3, 3), {"padding": 1}),
    ("conv2d", (4, 2, 3, 3), {"groups": 2}),
    ("conv2d", (4, 1, 3, 3), {"groups": 4}),                 # depthwise
    ("conv_transpose2d", (4, 3, 3, 3), {"stride": 2}),
])
def test_convolutions_of_a_batch_with_no_images_give_pytorchs_empty_output_and_zero_grads(
        queue, op, wshape, kw):
    """``x[2:]`` of a batch of 2 (the rest of a batch past its end): the chunking of the
    images divided by their count, a ZeroDivisionError (the depthwise backward a ShapeError
    of its per-image weight parts), where PyTorch gives an empty output and zero gradients
    for the weight and bias."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    wa = rng.standard_normal(wshape).astype(np.float32)
    cout = wshape[1] if op == "conv_transpose2d" else wshape[0]
    ba = rng.standard_normal(cout).astype(np.float32)
    x, w, b = (tp.tensor(v, requires_grad=True) for v in (a, wa, ba))
    with tp.Tape() as tape:
        y = getattr(tp, op)(x[2:], w, b, **kw)
    tape.backward(tp.sum(y))
    xt, wt, bt = (torch.tensor(v, requires_grad=True) for v in (a, wa, ba))
    yt = getattr(F, op)(xt[2:], wt, bt, **kw)
    yt.sum().backward()
    assert y.shape == tuple(yt.shape)
    for ours, theirs in ((x, xt), (w, wt), (b, bt)):
        np.testing.assert_array_equal(ours.grad.to_host(), theirs.grad.numpy())


def test_windows_over_a_spatial_dim_with_no_elements_are_refused_as_pytorch(queue):
    """``x[..., 4:]`` (a width of 0) with padding: the convolutions, pools and unfold slid
    their windows over the padding alone and returned zeros (a max pool -inf), e.g.
    tp.conv2d(x[..., 4:], w, padding=2) a (2, 2, 6, 2) of zeros, silently, where PyTorch
    raises ('Only zero batch or zero channel inputs are supported'); now a ShapeError
    naming the op and the spatial size, and an empty batch still gives the empty result."""
    import torch
    import torch.nn.functional as F
    x4 = tp.tensor(np.ones((2, 3, 4, 4), np.float32))
    x3 = tp.tensor(np.ones((2, 3, 4), np.float32))
    w = tp.tensor(np.ones((2, 3, 3, 3), np.float32))
    calls = {"conv2d": lambda m, x, w: m.conv2d(x, w, padding=2),
             "conv_transpose2d": lambda m, x, w: m.conv_transpose2d(x, m.permute(w, (1, 0, 2, 3))
                                                                    if m is tp else
                                                                    w.permute(1, 0, 2, 3)),
             "max_pool2d": lambda m, x, w: m.max_pool2d(x, 2, padding=1),
             "avg_pool2d": lambda m, x, w: m.avg_pool2d(x, 2, padding=1),
             "unfold": lambda m, x, w: m.unfold(x, 2, padding=1)}
    for op, call in calls.items():
        with pytest.raises(pc.ShapeError, match=f"{op}: the input's spatial size \\(4, 0\\) "
                                                "holds no elements"):
            call(tp, x4[..., 4:], w)
        with pytest.raises((RuntimeError, ValueError)):
            call(F, torch.ones(2, 3, 4, 0), torch.ones(2, 3, 3, 3))
    with pytest.raises(pc.ShapeError, match=r"max_pool1d: the input's spatial size \(0,\)"):
        tp.max_pool1d(x3[..., 4:], 2, padding=1)
    assert tp.conv2d(x4[2:], w, padding=1).shape == (0, 2, 4, 4)
