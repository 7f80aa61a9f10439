"""Layers and Modules: registration, PyTorch state-dict names, load_state_dict validation,
seeded initialisation, train/eval, forward values against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl import nn


def host(queue, array):
    return pc.Tensor.from_host(queue, np.asarray(array, np.float32))


def conv2d_ref(x, w, b, stride, padding):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + (b[None, :, None, None] if b is not None else 0)


# -- registration and state dicts -----------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.features(x))


def test_sequential_state_dict_keys_and_order(queue):
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2, bias=False),
                        nn.BatchNorm2d(2))
    assert list(net.state_dict()) == ["0.weight", "0.bias", "2.weight", "3.weight", "3.bias",
                                      "3.running_mean", "3.running_var"]
    assert [n for n, _ in net.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                      "3.weight", "3.bias"]
    assert [n for n, _ in net.named_buffers()] == ["3.running_mean", "3.running_var"]
    assert len(net) == 4 and isinstance(net[-1], nn.BatchNorm2d)
    assert isinstance(net[1:3], nn.Sequential) and len(net[1:3]) == 2
    assert net.state_dict()["0.weight"].shape == (3, 4)
    assert all(p.requires_grad and isinstance(p, tp.Node) for p in net.parameters())


def test_nested_module_names_and_no_duplicates(queue):
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
        "head.weight", "head.bias"]
    assert len(net.modules()) == 8 and net.children() == [net.features, net.head]
    shared = nn.Sequential(net.head, net.head)
    assert len(shared.parameters()) == 2           # the same Linear twice: listed once
    assert net.queue is queue


def test_resnet18_torchvision_names(queue):
    model = nn.resnet18(num_classes=10)
    sd = model.state_dict()
    assert len(model.parameters()) == 62           # as torchvision's resnet18
    assert len(sd) == 102                          # torchvision's 122 minus num_batches_tracked
    keys = list(sd)
    assert keys[:5] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                        "bn1.running_var"]
    assert keys[-2:] == ["fc.weight", "fc.bias"]
    for key, shape in [("conv1.weight", (64, 3, 7, 7)), ("layer1.0.conv1.weight", (64, 64, 3, 3)),
                       ("layer1.1.bn2.running_var", (64,)),
                       ("layer2.0.downsample.0.weight", (128, 64, 1, 1)),
                       ("layer2.0.downsample.1.running_mean", (128,)),
                       ("layer4.1.conv2.weight", (512, 512, 3, 3)), ("fc.weight", (10, 512))]:
        assert sd[key].shape == shape, key
    assert "layer1.0.downsample.0.weight" not in sd
    # torchvision-style dicts with num_batches_tracked load (those entries are ignored)
    sd_torch = dict(sd)
    sd_torch["bn1.num_batches_tracked"] = np.array(5)
    model.load_state_dict(sd_torch)


def test_state_dict_round_trip(queue):
    nn.manual_seed(1)
    a = Net()
    nn.manual_seed(2)
    b = Net()
    assert not np.array_equal(a.state_dict()["head.weight"], b.state_dict()["head.weight"])
    b.load_state_dict(a.state_dict())
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb
        np.testing.assert_array_equal(va, vb)


@pytest.mark.parametrize("corrupt,error", [
    (lambda d: d.pop("features.1.running_var"), nn.StateDictError),
    (lambda d: d.__setitem__("extra.weight", np.zeros(3, np.float32)), nn.StateDictError),
    (lambda d: d.__setitem__("head.weight", np.zeros((3, 5), np.float32)), pc.ShapeError),
    (lambda d: d.__setitem__("head.bias", "not numbers"), nn.StateDictError)])
def test_load_state_dict_errors_change_nothing(queue, corrupt, error):
    nn.manual_seed(3)
    model = Net()
    before = model.state_dict()
    nn.manual_seed(4)
    bad = Net().state_dict()             # different values everywhere...
    corrupt(bad)                         # ...and one problem
    with pytest.raises(error) as info:
        model.load_state_dict(bad)
    assert isinstance(info.value, pc.ParclError)
    assert "nothing was loaded" in str(info.value)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_load_state_dict_lists_every_problem_and_non_strict(queue):
    model = Net()
    bad = model.state_dict()
    del bad["head.bias"]
    bad["head.weight"] = np.zeros((2, 2), np.float32)
    bad["bogus"] = np.zeros(1, np.float32)
    with pytest.raises(pc.ShapeError) as info:
        model.load_state_dict(bad)
    msg = str(info.value)
    assert "head.bias" in msg and "bogus" in msg and "(2, 2)" in msg and "(3, 4)" in msg
    partial = {"head.bias": np.full(3, 7.0, np.float32), "bogus": np.zeros(1)}
    model.load_state_dict(partial, strict=False)
    np.testing.assert_array_equal(model.head.bias.to_host(), 7.0)


def test_load_state_dict_returns_the_missing_and_unexpected_keys_as_pytorch(queue):
    """``load_state_dict`` returned None, so ``strict=False`` gave no way to see what it had
    skipped: PyTorch's ``missing, unexpected = model.load_state_dict(sd, strict=False)`` (or
    ``.missing_keys``) failed. It returns PyTorch's pair, both lists empty on a full load."""
    model = Net()
    full = model.state_dict()
    assert model.load_state_dict(full) == ([], [])
    partial = {"head.bias": np.zeros(3, np.float32), "bogus": np.zeros(1)}
    result = model.load_state_dict(partial, strict=False)
    missing, unexpected = result
    assert missing == [k for k in full if k != "head.bias"] == result.missing_keys
    assert unexpected == ["bogus"] == result.unexpected_keys


def test_seeded_init_is_reproducible_and_pytorch_scaled(queue):
    nn.manual_seed(123)
    a = nn.Sequential(nn.Linear(50, 20), nn.Conv2d(3, 8, 3))
    nn.manual_seed(123)
    b = nn.Sequential(nn.Linear(50, 20), nn.Conv2d(3, 8, 3))
    for (_, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(va, vb)
    sd = a.state_dict()
    bound_fc, bound_conv = 1 / np.sqrt(50), 1 / np.sqrt(27)
    assert np.abs(sd["0.weight"]).max() <= bound_fc and np.abs(sd["0.bias"]).max() <= bound_fc
    assert np.abs(sd["0.weight"]).max() > 0.9 * bound_fc       # uniform over the full range
    assert np.abs(sd["1.weight"]).max() <= bound_conv
    bn = nn.BatchNorm2d(5).state_dict()
    for key, value in [("weight", 1), ("bias", 0), ("running_mean", 0), ("running_var", 1)]:
        np.testing.assert_array_equal(bn[key], value)


def test_train_eval_switch(queue):
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())


def test_zero_grad_and_errors(queue):
    fc = nn.Linear(3, 2)
    fc.weight.grad = pc.Tensor.full(queue, (2, 3), 1.0)
    fc.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(fc.weight.grad.to_host(), 0)
    fc.zero_grad()
    assert fc.weight.grad is None

    class Forgot(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(pc.ParclError, match="super"):
        Forgot()
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_parameter_from_host(queue):
    p = nn.Parameter.from_host(queue, np.arange(6.0).reshape(2, 3))
    assert p.requires_grad and p.shape == (2, 3) and p.grad is None
    np.testing.assert_array_equal(p.to_host(), np.arange(6.0).reshape(2, 3))


# -- forward --------------------------------------------------------------------------------
def test_linear_forward_matches_numpy(queue, rng):
    fc = nn.Linear(7, 5)
    x = rng.standard_normal((4, 7)).astype(np.float32)
    w, b = fc.weight.to_host(), fc.bias.to_host()
    with tp.Tape():
        out = fc(host(queue, x))
    assert isinstance(out, tp.Node)             # the weights require grad: recorded
    np.testing.assert_allclose(out.to_host(), x @ w.T + b, rtol=1e-5, atol=1e-5)
    x3 = rng.standard_normal((2, 3, 7)).astype(np.float32)
    with tp.no_grad():
        out3 = fc(host(queue, x3))
    np.testing.assert_allclose(out3.to_host(), x3 @ w.T + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(pc.ShapeError, match="7"):
        fc(host(queue, np.zeros((2, 6))))


def test_conv2d_forward_matches_numpy(queue, rng):
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    with tp.no_grad():
        out = conv(host(queue, x))
    want = conv2d_ref(x, conv.weight.to_host(), conv.bias.to_host(), 2, 1)
    assert out.shape == want.shape == (2, 4, 4, 3)
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-4, atol=1e-5)
    nobias = nn.Conv2d(3, 2, 1, bias=False)
    assert nobias.bias is None and [n for n, _ in nobias.named_parameters()] == ["weight"]
    with tp.no_grad():
        out = nobias(host(queue, x))
    np.testing.assert_allclose(out.to_host(), conv2d_ref(x, nobias.weight.to_host(), None, 1, 0),
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(pc.ShapeError, match="channels"):
        conv(host(queue, np.zeros((1, 2, 5, 5))))


def test_layer_shapes(queue, rng):
    x = host(queue, rng.standard_normal((2, 3, 8, 8)))
    with tp.no_grad():
        assert nn.MaxPool2d(2)(x).shape == (2, 3, 4, 4)
        assert nn.MaxPool2d(3, 2, 1)(x).shape == (2, 3, 4, 4)
        assert nn.AvgPool2d(2, stride=1)(x).shape == (2, 3, 7, 7)
        assert nn.AdaptiveAvgPool2d(1)(x).shape == (2, 3, 1, 1)
        assert nn.Flatten()(x).shape == (2, 192)
        assert nn.ReLU()(x).shape == (2, 3, 8, 8)


def test_node_in_node_out_raw_under_no_grad(queue, rng):
    net = Net()
    x = host(queue, rng.standard_normal((2, 1, 5, 5)))
    with tp.Tape() as tape:
        out = net(tp.tensor(x))
        loss = tp.mse_loss(out, host(queue, np.zeros((2, 3))))
    assert isinstance(out, tp.Node) and out.shape == (2, 3)
    tape.backward(loss)
    assert all(p.grad is not None for p in net.parameters())
    with tp.no_grad():
        raw = net(x)
    assert isinstance(raw, pc.Tensor) and not isinstance(raw, tp.Node)


def test_batchnorm_train_and_eval(queue, rng):
    bn = nn.BatchNorm2d(3, momentum=0.1)
    xh = (rng.standard_normal((4, 3, 5, 5)) * 2 + 3).astype(np.float32)
    x = host(queue, xh)
    with tp.no_grad():
        y_train = bn(x).to_host()
    mean = xh.mean(axis=(0, 2, 3))
    var = xh.var(axis=(0, 2, 3))
    np.testing.assert_allclose(y_train.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.to_host(), 0.1 * mean, rtol=1e-4)
    unbiased = var * xh[:, 0].size / (xh[:, 0].size - 1)
    np.testing.assert_allclose(bn.running_var.to_host(), 0.9 + 0.1 * unbiased, rtol=1e-4)
    bn.eval()
    with tp.no_grad():
        y_eval = bn(x).to_host()
    rm, rv = bn.running_mean.to_host(), bn.running_var.to_host()
    want = (xh - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(y_eval, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(bn.running_mean.to_host(), rm)   # eval: stats unchanged


def test_dropout_train_and_eval(queue):
    drop = nn.Dropout(0.5)
    x = pc.Tensor.full(queue, (64, 64), 1.0)
    with tp.no_grad():
        y = drop(x).to_host()
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.3 < (y == 0).mean() < 0.7
    drop.eval()
    with tp.no_grad():
        np.testing.assert_array_equal(drop(x).to_host(), 1.0)


def test_resnet18_forward_shape(queue, rng):
    model = nn.resnet18(num_classes=10)
    model.eval()
    with tp.no_grad():
        out = model(host(queue, rng.standard_normal((1, 3, 32, 32))))
    assert isinstance(out, pc.Tensor) and out.shape == (1, 10)
    assert np.all(np.isfinite(out.to_host()))


def test_training_reduces_the_loss(queue):
    """A whole step: model, tape, backward, optimizer; the loss goes down."""
    x_train, y_train, _, _ = pc.data.load_digits(images=True)
    x = host(queue, x_train[:64])
    y = pc.Tensor.from_host(queue, y_train[:64])
    nn.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.1), nn.Linear(128, 10))
    opt = pc.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        with tp.Tape() as tape:
            loss = tp.cross_entropy(model(x), y)
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
