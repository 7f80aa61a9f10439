"""Activations (leaky_relu, silu, softplus, elu, erf, sin, cos, clamp) and their layers:
forward against float64 numpy references of PyTorch's formulas, backward against finite
differences and against PyTorch's gradient at the kinks, extreme inputs without NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.errors import DTypeError, ParclError
from conftest import leaf

_erf = np.vectorize(math.erf)


def _softplus(x, beta=1.0, threshold=20.0):
    with np.errstate(over="ignore"):
        return np.where(x * beta > threshold, x, np.log1p(np.exp(x * beta)) / beta)


def _softplus_grad(x, beta=1.0, threshold=20.0):
    with np.errstate(over="ignore"):
        return np.where(x * beta > threshold, 1.0, 1.0 / (1.0 + np.exp(-x * beta)))


def _elu(x, alpha=1.0):
    with np.errstate(over="ignore"):
        return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# name -> (op, forward reference, gradient reference), references in float64
CASES = {
    "leaky_relu": (lambda x: tp.leaky_relu(x), lambda x: np.where(x > 0, x, 0.01 * x),
                   lambda x: np.where(x > 0, 1.0, 0.01)),
    "leaky_relu_0.2": (lambda x: tp.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x),
                       lambda x: np.where(x > 0, 1.0, 0.2)),
    "silu": (tp.silu, lambda x: x * _sigmoid(x),
             lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))),
    "softplus": (tp.softplus, _softplus, _softplus_grad),
    "softplus_beta2": (lambda x: tp.softplus(x, beta=2.0, threshold=3.0),
                       lambda x: _softplus(x, 2.0, 3.0), lambda x: _softplus_grad(x, 2.0, 3.0)),
    "elu": (tp.elu, _elu, lambda x: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0)))),
    "elu_0.5": (lambda x: tp.elu(x, alpha=0.5), lambda x: _elu(x, 0.5),
                lambda x: np.where(x > 0, 1.0, 0.5 * np.exp(np.minimum(x, 0)))),
    "erf": (tp.erf, _erf, lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x)),
    "sin": (tp.sin, np.sin, np.cos),
    "cos": (tp.cos, np.cos, lambda x: -np.sin(x)),
    "clamp": (lambda x: tp.clamp(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7),
              lambda x: ((x >= -0.5) & (x <= 0.7)).astype(np.float64)),
}


def _input(rng, shape):
    x = rng.standard_normal(shape) * 2
    for kink in (0.0, -0.5, 0.7, 1.5):        # keep finite differences off the kinks
        x[np.abs(x - kink) < 0.05] = kink + 0.3
    return x.astype(np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("shape", [(1,), (7,), (33, 5), (2, 3, 1)])
def test_forward_backward_and_gradcheck(queue, rng, name, shape):
    fn, ref, dref = CASES[name]
    x = _input(rng, shape)
    node = leaf(queue, x)
    g = rng.standard_normal(shape).astype(np.float32)
    with tp.Tape() as tape:
        out = fn(node)
    op_name = name.split("_0")[0].removesuffix("_beta2")      # the case's op, not its variant
    assert isinstance(out, tp.Node) and out.op_name == op_name
    assert out.shape == shape
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out.to_host(), ref(x64), rtol=2e-5, atol=2e-6)
    tape.backward(out, grad=pc.Tensor.from_host(queue, g))
    np.testing.assert_allclose(node.grad.to_host(), g * dref(x64), rtol=2e-5, atol=2e-6)
    assert tp.gradcheck(fn, [leaf(queue, x)])


def test_raw_tensors_give_raw_tensors(queue):
    x = pc.Tensor.from_host(queue, np.array([-1.0, 2.0], np.float32))
    out = tp.silu(x)
    assert isinstance(out, pc.Tensor) and not isinstance(out, tp.Node)


def test_kink_gradients_are_pytorchs(queue):
    """At 0: leaky_relu takes the slope, elu takes alpha (x <= 0 branch), as PyTorch."""
    for fn, want in ((lambda v: tp.leaky_relu(v, 0.3), 0.3), (lambda v: tp.elu(v, 2.0), 2.0),
                     (tp.silu, 0.5), (tp.softplus, 0.5)):
        x = leaf(queue, [0.0])
        with tp.Tape() as tape:
            y = tp.sum(fn(x))
        tape.backward(y)
        np.testing.assert_allclose(x.grad.to_host(), [want], rtol=1e-6)


def test_negative_slope_may_be_negative(queue):
    x = leaf(queue, [-2.0, 3.0])
    with tp.Tape() as tape:
        y = tp.sum(tp.leaky_relu(x, -0.5))
    tape.backward(y)
    np.testing.assert_allclose(tp.leaky_relu(x.value, -0.5).to_host(), [1.0, 3.0])
    np.testing.assert_allclose(x.grad.to_host(), [-0.5, 1.0])   # the input's sign decides


EXTREMES = [-1e30, -1e4, -100.0, -30.0, -1.0, 0.0, 1.0, 15.0, 20.0, 25.0, 100.0, 1e4, 1e30]


@pytest.mark.parametrize("name", ["softplus", "softplus_beta2", "silu", "elu", "erf",
                                  "leaky_relu", "clamp"])
def test_large_inputs_stay_finite(queue, name):
    fn, ref, dref = CASES[name]
    x = np.array(EXTREMES, np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = fn(node)
    tape.backward(y, grad=pc.Tensor.from_host(queue, np.ones_like(x)))
    got, grad = y.to_host(), node.grad.to_host()
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(grad)), (got, grad)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, ref(x64), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, dref(x64), rtol=1e-6, atol=1e-6)


def test_softplus_threshold_rule(queue):
    """Above ``threshold / beta`` the result is ``x`` itself and the gradient exactly 1."""
    x = np.array([5.0, 5.25, 10.0, 1e20], np.float32)
    got = tp.softplus(pc.Tensor.from_host(queue, x), beta=4.0, threshold=20.0).to_host()
    np.testing.assert_array_equal(got[1:], x[1:])
    np.testing.assert_allclose(got[0], np.log1p(np.exp(20.0)) / 4.0, rtol=1e-6)


def test_clamp_ties_and_one_sided_bounds(queue):
    x = np.array([-2.0, -1.0, 0.0, 1.0, 2.0], np.float32)
    cases = [({"min": -1.0, "max": 1.0}, [0, 1, 1, 1, 0]), ({"min": 0.0}, [0, 0, 1, 1, 1]),
             ({"max": 0.0}, [1, 1, 1, 0, 0]), ({"min": 1.0, "max": -1.0}, [0, 0, 0, 0, 0])]
    for bounds, want_grad in cases:
        node = leaf(queue, x)
        with tp.Tape() as tape:
            y = tp.clamp(node, **bounds)
        tape.backward(y, grad=pc.Tensor.from_host(queue, np.ones_like(x)))
        lo, hi = bounds.get("min", -np.inf), bounds.get("max", np.inf)
        want = np.minimum(np.maximum(x, lo), hi)         # torch: min > max gives max
        np.testing.assert_array_equal(y.to_host(), want, err_msg=str(bounds))
        np.testing.assert_array_equal(node.grad.to_host(), want_grad, err_msg=str(bounds))


def test_clamp_keeps_nan_and_takes_tensor_bounds(queue):
    x = np.array([np.nan, -3.0, 0.5, 3.0], np.float32)
    got = tp.clamp(pc.Tensor.from_host(queue, x), -1.0, 1.0).to_host()
    np.testing.assert_array_equal(got, [np.nan, -1.0, 0.5, 1.0])
    lo = leaf(queue, [[-1.0], [0.0]])                          # (2, 1) broadcast over (4,)
    xs = leaf(queue, [-2.0, 0.0, 0.5, 3.0])
    with tp.Tape() as tape:
        y = tp.clamp(xs, min=lo, max=1.0)
    assert y.shape == (2, 4)
    want = np.minimum(np.maximum([-2.0, 0.0, 0.5, 3.0], [[-1.0], [0.0]]), 1.0)
    np.testing.assert_array_equal(y.to_host(), want)
    tape.backward(y, grad=pc.Tensor.from_host(queue, np.ones((2, 4), np.float32)))
    np.testing.assert_array_equal(xs.grad.to_host(), [0, 2, 2, 0])   # ties pass to x
    np.testing.assert_array_equal(lo.grad.to_host(), [[1], [1]])


def test_clamp_with_a_nan_bound_is_nan_everywhere_as_pytorch(queue):
    """``torch.clamp(x, min=nan)`` is NaN everywhere (gradient 0); the kernel's selects
    ignored a NaN bound and returned ``x`` unchanged ([1, -3] for min=nan), silently."""
    x = np.array([1.0, -3.0, np.nan, 0.5], np.float32)
    for bounds in ({"min": np.nan}, {"max": np.nan}, {"min": -1.0, "max": np.nan},
                   {"min": np.nan, "max": 1.0}):
        node = leaf(queue, x)
        with tp.Tape() as tape:
            y = tp.clamp(node, **bounds)
        tape.backward(y, grad=pc.Tensor.from_host(queue, np.ones_like(x)))
        assert np.isnan(y.to_host()).all(), bounds
        np.testing.assert_array_equal(node.grad.to_host(), np.zeros_like(x), err_msg=str(bounds))
    assert np.isnan(tp.hardtanh(pc.Tensor.from_host(queue, x), np.nan, 1.0).to_host()).all()


def test_clamp_with_tensor_bounds_gives_a_nan_no_gradient_as_pytorch(queue):
    """Tensor bounds took maximum/minimum's gradients, which pass a NaN's gradient to both
    sides: a NaN in ``x`` or a bound gave ``x``, ``min`` and ``max`` each the whole gradient
    (1, 1, 1) where ``torch.clamp`` gives all three 0, silently. Ties, ``min > max`` and
    broadcasting keep PyTorch's gradients too."""
    import torch
    nan = np.nan
    x = np.tile(np.array([nan, 0.5, 2.0, -3.0, 1.0, 0.0, 5.0, 0.7], np.float32), (3, 1))
    lo = np.array([[0.0], [nan], [1.0]], np.float32)            # (3, 1) and (8,): broadcast
    hi = np.array([1.0, 1.0, nan, 1.0, 1.0, -1.0, 3.0, 0.7], np.float32)
    cases = [(lo, hi), (lo, None), (None, hi), (lo, 2.0), (-0.5, hi)]
    for a, b in cases:
        nodes = [leaf(queue, v) if isinstance(v, np.ndarray) else v for v in (x, a, b)]
        with tp.Tape() as tape:
            y = tp.clamp(nodes[0], min=nodes[1], max=nodes[2])
        tape.backward(tp.sum(y))
        ts = [torch.tensor(v, requires_grad=isinstance(v, np.ndarray))
              if v is not None else None for v in (x, a, b)]    # torch takes no mix
        ty = torch.clamp(ts[0], min=ts[1], max=ts[2])
        ty.sum().backward()
        np.testing.assert_array_equal(y.to_host(), ty.detach().numpy())
        for node, t in zip(nodes, ts):
            if t is not None and t.requires_grad:
                np.testing.assert_array_equal(node.grad.to_host(), t.grad.numpy(),
                                              err_msg=f"min={a}, max={b}")


def test_bad_arguments_are_clear_errors(queue):
    x = pc.Tensor.from_host(queue, np.ones(3, np.float32))
    with pytest.raises(ParclError, match="clamp: at least one"):
        tp.clamp(x)
    with pytest.raises(DTypeError, match="leaky_relu: negative_slope"):
        tp.leaky_relu(x, "0.1")
    with pytest.raises(ParclError, match="softplus: beta"):
        tp.softplus(x, beta=0)
    labels = pc.Tensor.from_host(queue, np.arange(3))
    with pytest.raises(DTypeError, match=r"silu: dtype int64 .*\(3,\)"):
        tp.silu(labels)


def test_layers_match_their_ops_and_pytorch_names(queue, rng):
    x = _input(rng, (4, 6))
    t = pc.Tensor.from_host(queue, x)
    x64 = x.astype(np.float64)
    layers = [(pc.nn.LeakyReLU(0.2), CASES["leaky_relu_0.2"][1]),
              (pc.nn.SiLU(), CASES["silu"][1]), (pc.nn.Tanh(), np.tanh),
              (pc.nn.Sigmoid(), _sigmoid), (pc.nn.ELU(0.5), CASES["elu_0.5"][1]),
              (pc.nn.Softplus(2.0, 3.0), CASES["softplus_beta2"][1])]
    for layer, ref in layers:
        assert layer.parameters() == [] and layer.state_dict() == {}
        with tp.no_grad():
            got = layer(t)
        assert isinstance(got, pc.Tensor)
        np.testing.assert_allclose(got.to_host(), ref(x64), rtol=2e-5, atol=2e-6,
                                   err_msg=repr(layer))
    assert repr(pc.nn.LeakyReLU(0.2)) == "LeakyReLU(negative_slope=0.2)"
    model = pc.nn.Sequential(pc.nn.Linear(6, 3), pc.nn.SiLU())
    with tp.Tape() as tape:
        loss = tp.sum(model(t))
    tape.backward(loss)
    assert model[0].weight.grad is not None and model[0].weight.grad.shape == (3, 6)


def test_a_captured_step_replays_the_parameterised_kernels(queue):
    """The float parameters are kernel arguments: a replay gives the eager step's values."""
    w = tp.tensor(pc.Tensor.from_host(queue, np.array([0.5, -1.5, 2.0], np.float32)), True)
    w.grad = pc.Tensor.zeros(queue, (3,))

    def fn(x):
        with tp.Tape() as tape:
            h = tp.softplus(tp.leaky_relu(w * x, 0.2), beta=2.0) ** 2
            loss = tp.sum(tp.clamp(tp.silu(h) + tp.elu(-h, 0.5), -1.0, 3.0) + tp.sin(h))
        tape.backward(loss)
        return loss.value

    step = tp.capture(fn, queue)
    xs = [np.array([i, -i, 0.5 * i], np.float32) for i in (1.0, 2.0, 3.0)]
    replayed = [step(x).to_host() for x in xs]
    grad_replayed = w.grad.to_host()
    w.grad.fill_(0)
    eager = [fn(pc.Tensor.from_host(queue, x)).to_host() for x in xs]
    assert step.replays == 2
    np.testing.assert_array_equal(replayed, eager)
    np.testing.assert_array_equal(grad_replayed, w.grad.to_host())


def test_kernel_launchers_check_their_arguments(queue):
    from parcl.errors import ShapeError
    from parcl.kernels import elementwise as ew
    x = pc.Tensor.from_host(queue, np.ones(3, np.float32))
    with pytest.raises(ShapeError, match=r"elu_backward: saved tensor \(3,\) and gradient"):
        ew.grad("elu_backward", x, pc.Tensor.from_host(queue, np.ones(4, np.float32)), p=1.0)
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        ew.grad("nope", x, x)
    np.testing.assert_array_equal(ew.unary("clamp", x, p=-np.inf, q=0.5).to_host(), [0.5] * 3)
