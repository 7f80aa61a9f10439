"""pc.nn.utils.fuse_conv_bn_eval, fuse_linear_bn_eval, their weight functions and skip_init,
as torch.nn.utils's: fused weights and biases equal PyTorch's bit for bit (Conv2d, Conv1d,
ConvTranspose2d with transpose=True, Linear with a BatchNorm of its width or of one feature,
absent biases), the fused layer's output equals bn(layer(x)), the originals are untouched,
and layers in training mode or without running statistics are refused; skip_init leaves the
seeded generator where it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.errors import ShapeError
from parcl.nn.utils import FusionError


def bn_pair(num_features, rng, parcl_cls=pc.nn.BatchNorm2d, torch_cls=torch.nn.BatchNorm2d):
    bn, tbn = parcl_cls(num_features), torch_cls(num_features)
    state = {"weight": rng.standard_normal(num_features).astype(np.float32),
             "bias": rng.standard_normal(num_features).astype(np.float32),
             "running_mean": rng.standard_normal(num_features).astype(np.float32),
             "running_var": (rng.random(num_features) + 0.5).astype(np.float32)}
    bn.load_state_dict(state)
    tbn.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    return bn.eval(), tbn.eval()


def twin(layer, torch_layer):
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    return layer.eval(), torch_layer.eval()


def assert_same_parameters(fused, torch_fused):
    for name in ("weight", "bias"):
        np.testing.assert_array_equal(getattr(fused, name).value.to_host(),
                                      getattr(torch_fused, name).detach().numpy())


@pytest.mark.parametrize("make, bias, shape", [
    (lambda b: (pc.nn.Conv2d(3, 4, 3, padding=1, bias=b),
                torch.nn.Conv2d(3, 4, 3, padding=1, bias=b)), True, (2, 3, 5, 5)),
    (lambda b: (pc.nn.Conv2d(3, 4, 3, bias=b), torch.nn.Conv2d(3, 4, 3, bias=b)), False,
     (2, 3, 5, 5)),
    (lambda b: (pc.nn.Conv1d(3, 4, 3, bias=b), torch.nn.Conv1d(3, 4, 3, bias=b)), True,
     (2, 3, 7)),
])
def test_fuse_conv_bn_eval_equals_pytorchs_bit_for_bit_as_pytorch(make, bias, shape):
    rng = np.random.default_rng(0)
    conv, tconv = twin(*make(bias))
    bn, tbn = bn_pair(4, rng)
    fused = pc.nn.utils.fuse_conv_bn_eval(conv, bn)
    tfused = torch.nn.utils.fuse_conv_bn_eval(tconv, tbn)
    assert type(fused) is type(conv) and fused.weight is not conv.weight
    assert_same_parameters(fused, tfused)
    assert fused.bias.requires_grad == tfused.bias.requires_grad == bias   # PyTorch's quirk
    x = pc.Tensor.from_host(pc.default_queue(), rng.standard_normal(shape).astype(np.float32))
    with tp.no_grad():
        want = bn(conv(x) if len(shape) == 4 else tp.unsqueeze(conv(x), -1))
        got = fused(x) if len(shape) == 4 else tp.unsqueeze(fused(x), -1)
    np.testing.assert_allclose(got.to_host(), want.to_host(), atol=1e-5)


def test_fuse_conv_bn_eval_scales_a_transposed_convolutions_dim_1_as_pytorch():
    rng = np.random.default_rng(1)
    conv, tconv = twin(pc.nn.ConvTranspose2d(3, 4, 2, stride=2),
                       torch.nn.ConvTranspose2d(3, 4, 2, stride=2))
    bn, tbn = bn_pair(4, rng)
    fused = pc.nn.utils.fuse_conv_bn_eval(conv, bn, transpose=True)
    assert_same_parameters(fused, torch.nn.utils.fuse_conv_bn_eval(tconv, tbn, transpose=True))
    with pytest.raises(ShapeError, match=r"3 output channels \(dim 0\).*BatchNorm 4"):
        pc.nn.utils.fuse_conv_bn_eval(conv, bn)


@pytest.mark.parametrize("features, bias", [(4, True), (1, True), (4, False)])
def test_fuse_linear_bn_eval_equals_pytorchs_as_pytorch(features, bias):
    rng = np.random.default_rng(2)
    lin, tlin = twin(pc.nn.Linear(3, 4, bias=bias), torch.nn.Linear(3, 4, bias=bias))
    bn, tbn = bn_pair(features, rng, pc.nn.BatchNorm1d, torch.nn.BatchNorm1d)
    fused = pc.nn.utils.fuse_linear_bn_eval(lin, bn)
    tfused = torch.nn.utils.fuse_linear_bn_eval(tlin, tbn)
    np.testing.assert_array_equal(fused.weight.value.to_host(), tfused.weight.detach().numpy())
    np.testing.assert_array_equal(fused.bias.value.to_host(),
                                  np.broadcast_to(tfused.bias.detach().numpy(), (4,)))
    x = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(fused(pc.Tensor.from_host(pc.default_queue(), x)).to_host(),
                               tfused(torch.tensor(x)).detach().numpy(), atol=1e-5)


def test_fuse_weights_take_bare_tensors_as_pytorch():
    q = pc.default_queue()
    w = pc.Tensor.from_host(q, np.ones((2, 1, 1, 1), np.float32))
    rm = pc.Tensor.from_host(q, np.array([1.0, 2.0], np.float32))
    rv = pc.Tensor.from_host(q, np.array([3.0, 0.0], np.float32))
    weight, bias = pc.nn.utils.fuse_conv_bn_weights(w, None, rm, rv, 1.0, None, None)
    # s = 1 / sqrt(var + 1) = (0.5, 1): weight (0.5, 1), bias (0 - mean) * s = (-0.5, -2)
    np.testing.assert_array_equal(weight.value.to_host().ravel(), [0.5, 1.0])
    np.testing.assert_array_equal(bias.value.to_host(), [-0.5, -2.0])
    lw, lb = pc.nn.utils.fuse_linear_bn_weights(pc.Tensor.from_host(q, np.ones((2, 3),
                                                                               np.float32)),
                                                rm, rm, rv, 1.0, rm, rm)
    np.testing.assert_array_equal(lw.value.to_host(), [[0.5] * 3, [2.0] * 3])
    np.testing.assert_array_equal(lb.value.to_host(), [1.0, 2.0])


def test_fusion_refuses_training_mode_and_missing_statistics_as_pytorch():
    conv, bn = pc.nn.Conv2d(3, 4, 3), pc.nn.BatchNorm2d(4)
    with pytest.raises(FusionError, match="evaluation only"):
        pc.nn.utils.fuse_conv_bn_eval(conv, bn.eval())
    with pytest.raises(FusionError, match="no running statistics"):
        pc.nn.utils.fuse_conv_bn_eval(conv.eval(),
                                      pc.nn.BatchNorm2d(4, track_running_stats=False).eval())
    with pytest.raises(ShapeError, match="out_features=2 or 1"):
        pc.nn.utils.fuse_linear_bn_eval(pc.nn.Linear(3, 2).eval(), pc.nn.BatchNorm1d(4).eval())


def test_skip_init_leaves_the_seeded_generator_where_it_was_as_pytorch():
    pc.nn.manual_seed(0)
    want = pc.nn.Linear(3, 2).weight.value.to_host()
    pc.nn.manual_seed(0)
    skipped = pc.nn.utils.skip_init(pc.nn.Linear, in_features=3, out_features=5)
    got = pc.nn.Linear(3, 2).weight.value.to_host()
    np.testing.assert_array_equal(got, want)
    assert skipped.weight.shape == (5, 3) and skipped.out_features == 5


def test_skip_init_refuses_what_is_not_a_module_class():
    with pytest.raises(pc.ParclError, match="Module class"):
        pc.nn.utils.skip_init(torch.nn.Linear, 3, 2)

    class NoQueue(pc.nn.Module):
        def __init__(self, n):
            super().__init__()

    with pytest.raises(pc.ParclError, match="'queue' argument"):
        pc.nn.utils.skip_init(NoQueue, 3)
