"""pc.nn.BatchNorm3d and InstanceNorm3d against torch: outputs, input and parameter gradients,
running statistics over training steps (momentum, momentum=None), evaluation, unbatched
inputs, gradcheck, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from xfmr_reference import compare

import parcl as pc
import parcl.tape as tp
from conftest import leaf

NORMS = [
    ("BatchNorm3d", dict()),
    ("BatchNorm3d", dict(momentum=None)),
    ("BatchNorm3d", dict(affine=False, momentum=0.3, eps=1e-3)),
    ("BatchNorm3d", dict(track_running_stats=False)),
    ("InstanceNorm3d", dict()),
    ("InstanceNorm3d", dict(affine=True, track_running_stats=True, momentum=0.2)),
    ("InstanceNorm3d", dict(track_running_stats=True, momentum=None)),
]


@pytest.mark.parametrize("name,kw", NORMS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(NORMS)])
def test_norm3d_training_steps_then_evaluation_are_as_pytorch(queue, rng, name, kw):
    tm, pm = getattr(torch.nn, name)(4, **kw), getattr(pc.nn, name)(4, **kw)
    # num_batches_tracked is kept where it is read: BatchNorm's cumulative average (as the
    # 2-D layers; InstanceNorm's momentum=None is 0, PyTorch's F.instance_norm reads no count)
    counted = name == "BatchNorm3d" and kw.get("momentum", 0.1) is None
    assert list(pm.state_dict()) == [k for k in tm.state_dict()
                                     if k != "num_batches_tracked" or counted]

    def run(m, x):
        return m(x)
    for step in range(3):                      # each step moves the running statistics
        x = (rng.standard_normal((2, 4, 3, 4, 5)) * (step + 1) + step).astype(np.float32)
        out = compare(queue, tm, pm, [x], run, run, tol=1e-4) if step == 0 else None
        if step:
            with torch.no_grad():
                tm(torch.tensor(x))
            with tp.no_grad():
                pm(tp.tensor(x))
        if out is not None:
            assert out[0].shape == (2, 4, 3, 4, 5)
        for key, value in tm.state_dict().items():
            if key in pm.state_dict():
                np.testing.assert_allclose(pm.state_dict()[key], value.numpy(), rtol=1e-5,
                                           atol=1e-5, err_msg=key)
    tm.eval()
    pm.eval()
    x = rng.standard_normal((3, 4, 2, 3, 4)).astype(np.float32)
    with torch.no_grad():
        want = tm(torch.tensor(x)).numpy()
    with tp.no_grad():
        np.testing.assert_allclose(pm(tp.tensor(x)).to_host(), want, rtol=1e-4, atol=1e-4)


def test_batch_norm3d_normalises_each_channel_over_n_d_h_w_as_worked_by_numpy(queue, rng):
    bn = pc.nn.BatchNorm3d(3, momentum=0.5)
    x = rng.standard_normal((2, 3, 2, 3, 4)) * 3 + 2
    with tp.no_grad():
        y = bn(tp.tensor(x.astype(np.float32))).to_host()
    m, v = x.mean((0, 2, 3, 4), keepdims=True), x.var((0, 2, 3, 4), keepdims=True)
    np.testing.assert_allclose(y, (x - m) / np.sqrt(v + 1e-5), atol=3e-5)
    n = x.size // 3
    np.testing.assert_allclose(bn.running_var.to_host(), 0.5 + 0.5 * v.ravel() * n / (n - 1),
                               rtol=1e-5)


def test_instance_norm3d_of_an_unbatched_volume_is_as_pytorch(queue, rng):
    tm = torch.nn.InstanceNorm3d(3, affine=True)
    pm = pc.nn.InstanceNorm3d(3, affine=True)

    def run(m, x):
        return m(x)
    out, = compare(queue, tm, pm, [rng.standard_normal((3, 2, 3, 4)).astype(np.float32)], run,
                   run, tol=1e-4)
    assert out.shape == (3, 2, 3, 4)


def test_batch_norm_of_a_volume_passes_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((2, 2, 2, 3, 2)) * 2 + 1)
    w, b = leaf(queue, rng.standard_normal(2)), leaf(queue, rng.standard_normal(2))
    # atol as the 2-D batch norm's gradcheck: float32 differences of a normalised output
    assert tp.gradcheck(lambda x, w, b: tp.batch_norm(x, w, b, None, None, training=True),
                        [x, w, b], atol=5e-3)


def test_norm3d_refusals_name_the_layer_and_shape(queue, rng):
    with pytest.raises(pc.ShapeError, match=r"BatchNorm3d.*expected a 5-d input \(N, 4, D, H, "
                                            r"W\), got shape \(2, 4, 3, 3\)"):
        pc.nn.BatchNorm3d(4)(leaf(queue, rng.standard_normal((2, 4, 3, 3))))
    with pytest.raises(pc.ShapeError, match=r"BatchNorm3d.*got shape \(2, 3, 2, 3, 3\)"):
        pc.nn.BatchNorm3d(4)(leaf(queue, rng.standard_normal((2, 3, 2, 3, 3))))
    with pytest.raises(pc.ShapeError, match=r"InstanceNorm3d.*of 5 dims or \(4, \.\.\.\) of 4"):
        pc.nn.InstanceNorm3d(4)(leaf(queue, rng.standard_normal((2, 4, 3))))
    with pytest.raises(pc.ShapeError, match="InstanceNorm3d.*more than 1 spatial element"):
        pc.nn.InstanceNorm3d(4)(leaf(queue, rng.standard_normal((2, 4, 1, 1, 1))))


@pytest.mark.parametrize("kw", [dict(), dict(momentum=None)], ids=["momentum", "cumulative"])
def test_batch_norm3d_of_an_empty_batch_is_empty_and_keeps_the_running_statistics_as_pytorch(
        queue, rng, kw):
    # x[2:] of a batch of 2 (a detector's frames with no proposals): PyTorch gives the empty
    # output, zero weight and bias gradients and the running statistics as they were (its
    # count still moves, so a cumulative average weighs the next batch by 1/2)
    tm, pm = torch.nn.BatchNorm3d(3, **kw), pc.nn.BatchNorm3d(3, **kw)
    with torch.no_grad():
        tm.running_mean.fill_(0.5)
        tm.running_var.fill_(2.0)
    pm.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    xs = rng.standard_normal((2, 3, 2, 3, 4)).astype(np.float32)
    x = leaf(queue, xs)
    with tp.Tape() as tape:
        y = pm(x[2:])
        loss = tp.sum(y)
    tape.backward(loss)
    xt = torch.tensor(xs, requires_grad=True)
    yt = tm(xt[2:])
    yt.sum().backward()
    assert y.shape == tuple(yt.shape) == (0, 3, 2, 3, 4)
    np.testing.assert_array_equal(pm.weight.grad.to_host(), tm.weight.grad.numpy())
    np.testing.assert_array_equal(pm.bias.grad.to_host(), [0, 0, 0])
    np.testing.assert_array_equal(x.grad.to_host(), np.zeros_like(xs))
    np.testing.assert_array_equal(pm.running_mean.to_host(), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(pm.running_var.to_host(), [2, 2, 2])
    # the next, real batch moves them as PyTorch's
    np.testing.assert_allclose(pm(tp.tensor(xs)).to_host(), tm(torch.tensor(xs)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pm.running_mean.to_host(), tm.running_mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(pm.running_var.to_host(), tm.running_var.numpy(), rtol=1e-6)


def test_instance_norm3d_refuses_an_empty_batch_rather_than_put_nan_in_its_running_stats(
        queue, rng):
    # PyTorch refuses x[2:] here too ('index 0 out of range'); parcl averaged the statistics
    # of no samples into running_mean and running_var: [nan, nan, nan] from then on, and
    # every evaluation output NaN
    m = pc.nn.InstanceNorm3d(3, track_running_stats=True, affine=True)
    x = tp.tensor(rng.standard_normal((2, 3, 2, 3, 4)).astype(np.float32))
    with pytest.raises(pc.ShapeError, match=r"InstanceNorm3d.*a batch of no samples, shape "
                                            r"\(0, 3, 2, 3, 4\)"):
        m(x[2:])
    np.testing.assert_array_equal(m.running_mean.to_host(), [0, 0, 0])
    np.testing.assert_array_equal(m.running_var.to_host(), [1, 1, 1])
    # without running statistics (or in evaluation) the empty batch is PyTorch's empty output
    assert pc.nn.InstanceNorm3d(3)(x[2:]).shape == (0, 3, 2, 3, 4)
    assert tuple(torch.nn.InstanceNorm3d(3)(torch.zeros(0, 3, 2, 3, 4)).shape) == (0, 3, 2, 3, 4)
    m.eval()
    assert m(x[2:]).shape == (0, 3, 2, 3, 4)
