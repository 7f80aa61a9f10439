"""Layers for the wider convolutions and pooling: ``Conv2d(dilation, groups)``,
``ConvTranspose2d``, ``MaxPool2d``/``AvgPool2d`` with PyTorch's options. Parameter names,
shapes and initial bounds as PyTorch's; a state dict loaded from numpy gives the float64
numpy references' outputs and gradients."""

from __future__ import annotations

import conv_reference as ref
import numpy as np
import pool_reference as pref
import pytest

import parcl as pc
import parcl.tape as tp
from parcl import nn
from conftest import close, up


def forward_backward(layer, x, g):
    """layer(x) and the gradients of sum(layer(x) * g) for x and each parameter."""
    nx = tp.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = layer(nx)
    tape.backward(y, grad=g)
    return y.to_host(), nx.grad.to_host(), {k: p.grad.to_host()
                                            for k, p in layer.named_parameters()}


@pytest.mark.parametrize("cin, cout, k, kw", [
    (4, 8, 3, dict(padding=2, dilation=2, groups=4)),        # depthwise, multiplier 2
    (6, 4, (3, 2), dict(stride=2, padding=1, groups=2)),     # grouped
    (3, 5, 3, dict(dilation=(2, 1), padding=(2, 1))),        # dilated
])
def test_conv2d_layer_dilation_groups_matches_reference(queue, rng, cin, cout, k, kw):
    nn.manual_seed(0)
    layer = nn.Conv2d(cin, cout, k, **kw)
    groups = kw.get("groups", 1)
    kh, kwd = (k, k) if isinstance(k, int) else k
    assert layer.weight.shape == (cout, cin // groups, kh, kwd)
    bound = 1 / np.sqrt(cin // groups * kh * kwd)              # PyTorch's fan_in
    sd = layer.state_dict()
    assert list(sd) == ["weight", "bias"]
    assert np.abs(sd["weight"]).max() <= bound and np.abs(sd["bias"]).max() <= bound
    assert np.abs(sd["weight"]).max() > 0.5 * bound
    w, b = rng.standard_normal(sd["weight"].shape), rng.standard_normal(cout)
    layer.load_state_dict({"weight": w, "bias": b})
    x = rng.standard_normal((2, cin, 7, 9))
    args = dict(stride=kw.get("stride", 1), padding=kw.get("padding", 0),
                dilation=kw.get("dilation", 1), groups=groups)
    want = ref.conv2d(x, w, b, **args)
    g = rng.standard_normal(want.shape)
    y, gx, grads = forward_backward(layer, up(queue, x), up(queue, g))
    close(y, want)
    # conv2d is linear in x and in w: <g, conv(dx, w)> = <gx, dx>, <g, conv(x, dw)> = <gw, dw>
    dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    close((gx * dx).sum(), (g * ref.conv2d(dx, w, None, **args)).sum(), 1e-3)
    close((grads["weight"] * dw).sum(), (g * ref.conv2d(x, dw, None, **args)).sum(), 1e-3)
    close(grads["bias"], g.sum((0, 2, 3)))


def test_conv2d_depthwise_in_sequential_fuses_its_relu(queue, rng):
    nn.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1, groups=3), nn.ReLU())
    x = rng.standard_normal((2, 3, 5, 11))
    sd = net.state_dict()
    with tp.no_grad():
        y = net(up(queue, x)).to_host()
    close(y, np.maximum(ref.conv2d(x, sd["0.weight"], sd["0.bias"], 1, 1, 1, 3), 0))
    assert "groups=3" in repr(net)


def test_conv_transpose2d_layer_matches_reference(queue, rng):
    nn.manual_seed(0)
    layer = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
    assert layer.weight.shape == (4, 3, 3, 3)
    bound = 1 / np.sqrt(3 * 3 * 3)            # PyTorch: fan_in from weight dim 1 (cout)
    sd = layer.state_dict()
    assert list(sd) == ["weight", "bias"]
    assert np.abs(sd["weight"]).max() <= bound and np.abs(sd["bias"]).max() <= bound
    assert np.abs(sd["weight"]).max() > 0.5 * bound
    w, b = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(3)
    layer.load_state_dict({"weight": w, "bias": b})
    x = rng.standard_normal((2, 4, 3, 5))
    want = ref.conv_transpose2d(x, w, b, 2, 1, 1)
    assert want.shape == (2, 3, 6, 10)
    g = rng.standard_normal(want.shape)
    y, gx, grads = forward_backward(layer, up(queue, x), up(queue, g))
    close(y, want)
    dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    close((gx * dx).sum(), (g * ref.conv_transpose2d(dx, w, None, 2, 1, 1)).sum(), 1e-3)
    close((grads["weight"] * dw).sum(), (g * ref.conv_transpose2d(x, dw, None, 2, 1, 1)).sum(),
          1e-3)
    close(grads["bias"], g.sum((0, 2, 3)))
    assert "output_padding=(1, 1)" in repr(layer)
    nobias = nn.ConvTranspose2d(4, 3, 2, bias=False)
    assert nobias.bias is None and list(nobias.state_dict()) == ["weight"]


def test_pool_layers_take_pytorch_options(queue, rng):
    x = rng.standard_normal((2, 3, 7, 8))
    mp = nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True)
    ap = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
    with tp.no_grad():
        close(mp(up(queue, x)).to_host(), pref.max_pool2d(x, 3, 2, 1, 2, True)[0])
        close(ap(up(queue, x)).to_host(), pref.avg_pool2d(x, 3, 2, 1, True, False))
    assert "ceil_mode=True" in repr(mp) and "count_include_pad=False" in repr(ap)


def test_conv_layer_errors(queue):
    with pytest.raises(pc.ShapeError, match=r"Conv2d: groups=3 must be >= 1 and divide "
                                            r"in_channels=4"):
        nn.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(pc.ShapeError, match=r"ConvTranspose2d: output_padding \(2, 2\) must "
                                            r"be smaller than the stride \(2, 2\)"):
        nn.ConvTranspose2d(4, 2, 3, stride=2, output_padding=2)
    layer = nn.ConvTranspose2d(4, 2, 3)
    with pytest.raises(pc.ShapeError, match=r"input has 3 features/channels at dim -3"):
        layer(up(queue, np.zeros((1, 3, 5, 5))))


@pytest.mark.parametrize("kernel, dilation, padding_mode", [
    ((3, 3), 1, "zeros"), ((2, 4), 1, "zeros"), ((3, 2), (2, 1), "zeros"),
    ((4, 4), 1, "reflect"), ((3, 3), 2, "circular")])
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_conv2d_takes_pytorchs_padding_same_and_valid(queue, kernel, dilation, padding_mode,
                                                      padding):
    """``Conv2d(..., padding="same")`` (the output as large as the input; an even kernel's
    odd zero on the right and below) and ``"valid"``, in every padding mode, as torch's:
    values and the input's gradient (it was a ShapeError: padding must be an int)."""
    import torch
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)
    ours = pc.nn.Conv2d(3, 4, kernel, padding=padding, dilation=dilation,
                        padding_mode=padding_mode, queue=queue)
    theirs = torch.nn.Conv2d(3, 4, kernel, padding=padding, dilation=dilation,
                             padding_mode=padding_mode)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    xt = torch.tensor(x, requires_grad=True)
    want = theirs(xt)
    (want * want).sum().backward()
    nx = tp.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        y = ours(nx)
        loss = tp.sum(y * y)
    tape.backward(loss)
    np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nx.grad.to_host(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert repr(ours) == repr(theirs)


def test_conv2d_padding_same_with_a_stride_is_refused_as_pytorch(queue):
    with pytest.raises(pc.ShapeError, match="padding='same' needs stride 1"):
        pc.nn.Conv2d(3, 4, 3, stride=2, padding="same", queue=queue)
    with pytest.raises(pc.ShapeError, match="padding 'full' is not 'same', 'valid'"):
        tp.conv2d(tp.tensor(np.ones((1, 1, 4, 4), np.float32)),
                  tp.tensor(np.ones((1, 1, 3, 3), np.float32)), padding="full")


@pytest.mark.parametrize("name, args, kwargs", [
    ("Conv2d", (3, 4, 3), {"bias": False, "padding_mode": "reflect", "padding": 1}),
    ("Conv1d", (3, 6, 3), {"bias": False, "padding_mode": "circular", "groups": 3}),
    ("Conv3d", (2, 2, 1), {"dilation": 2}),
    ("ConvTranspose1d", (4, 2, 3), {"output_padding": 1, "stride": 2, "bias": False}),
    ("ConvTranspose2d", (4, 2, 3), {"groups": 2, "dilation": 2, "padding": 1}),
    ("ConvTranspose3d", (4, 2, 2), {"output_padding": 1, "stride": 2, "bias": False})])
def test_a_convolutions_repr_lists_what_differs_from_the_defaults_as_pytorch(queue, name, args,
                                                                            kwargs):
    # PyTorch puts bias=False before padding_mode; parcl's Conv1d/2d/3d put it after
    import torch
    assert repr(getattr(pc.nn, name)(*args, **kwargs, queue=queue)) == repr(
        getattr(torch.nn, name)(*args, **kwargs))
