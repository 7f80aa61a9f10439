"""Gradients at domain edges equal PyTorch's (issue 16 item 3): no NaN from ``0 * inf`` where
PyTorch has a finite value, and the same inf/NaN where PyTorch has one. References are numpy
float64 transcriptions of PyTorch's backward formulas (``tools/autograd/derivatives.yaml``)."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf


def grads_of(queue, fn, *arrays):
    """Value and gradients of ``fn(*leaves)`` for an upstream gradient of ones."""
    leaves = [leaf(queue, a) for a in arrays]
    with tp.Tape() as tape:
        out = fn(*leaves)
    tape.backward(out, grad=pc.Tensor.from_host(queue, np.ones(out.shape, np.float32)))
    return out.to_host(), [x.grad.to_host() for x in leaves]


def torch_pow_grads(x, y):
    """PyTorch's pow_backward_self / pow_backward_exponent for an upstream of ones."""
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    with np.errstate(all="ignore"):
        gx = np.where(y == 0, 0.0, y * np.power(x, y - 1))
        gy = np.where((x == 0) & (y >= 0), 0.0, np.power(x, y) * np.log(x))
    return gx, gy


EDGE_X = [0.0, -0.0, 1.0, -2.0, 0.5, 3.0]


@pytest.mark.parametrize("p", [0, 0.0, 1, 2, 3, 0.5, -1, -0.5, 2.5])
def test_pow_scalar_exponent_at_zero(queue, p):
    """``pow(x, 0)`` has gradient 0 at 0 (it was NaN: ``0 * x**-1``); ``pow(x, 2)`` 0 at 0."""
    got, (gx,) = grads_of(queue, lambda x: x ** p, EDGE_X)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(got, np.power(np.float64(EDGE_X), p), rtol=1e-6)
    want, _ = torch_pow_grads(EDGE_X, p)
    np.testing.assert_allclose(gx, want, rtol=1e-6)       # inf and NaN exactly where torch's
    if p in (0, 1, 2, 3):
        assert np.all(np.isfinite(gx))


def test_pow_zero_exponent_is_zero_even_for_an_inf_upstream(queue):
    x = leaf(queue, [0.0, 2.0])
    with tp.Tape() as tape:
        y = tp.pow(x, 0)
    tape.backward(y, grad=pc.Tensor.from_host(queue, np.array([np.inf, np.nan], np.float32)))
    np.testing.assert_array_equal(x.grad.to_host(), [0.0, 0.0])      # torch: zeros_like


def test_pow_tensor_exponent_edges(queue):
    """d/dy of x**y is 0 where x == 0 and y >= 0 (torch masks log(0)), -inf for y < 0."""
    x = np.array([0.0, 0.0, 0.0, 0.0, 2.0, -2.0, -2.0, 1.5], np.float32)
    y = np.array([0.0, 1.0, 2.5, -1.0, 0.0, 2.0, 0.5, -1.0], np.float32)
    got, (gx, gy) = grads_of(queue, tp.pow, x, y)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(got, np.power(x.astype(np.float64), y), rtol=1e-6)
    want_x, want_y = torch_pow_grads(x, y)
    np.testing.assert_allclose(gx, want_x, rtol=1e-5)
    np.testing.assert_allclose(gy, want_y, rtol=1e-5)
    assert np.all(np.isfinite(gy[:3])) and gy[3] == -np.inf


def test_pow_scalar_base_edges(queue):
    """``0 ** x`` (and negative bases) no longer fail on the host's ``math.log``; the values
    are PyTorch's: 0 where x >= 0, -inf where x < 0; NaN for a negative base."""
    x = np.array([0.0, 1.0, 2.0, -1.0], np.float32)
    for base in (0.0, 2.0, -2.0, 1.0):
        got, (gx,) = grads_of(queue, lambda t, b=base: b ** t, x)
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(got, np.power(base, x.astype(np.float64)), rtol=1e-6)
        _, want = torch_pow_grads(base, x)
        np.testing.assert_allclose(gx, want, rtol=1e-6, err_msg=f"base {base}")


@pytest.mark.parametrize("xs,ys", [((3, 1), (1, 4)), ((5,), ()), ((), (2, 3)), ((2, 3), (3,))])
def test_pow_tensor_exponent_broadcasts_and_gradchecks(queue, rng, xs, ys):
    x = rng.uniform(0.5, 2.0, xs).astype(np.float32)
    y = rng.uniform(-1.5, 2.5, ys).astype(np.float32)
    a, b = leaf(queue, x), leaf(queue, y)
    with tp.Tape():
        out = a ** b
    assert out.op_name == "pow" and out.shape == np.broadcast_shapes(xs, ys)
    np.testing.assert_allclose(out.to_host(), np.power(x.astype(np.float64), y), rtol=2e-6)
    assert tp.gradcheck(tp.pow, [a, b])


def test_pow_operators_on_nodes(queue):
    x = leaf(queue, [1.0, 2.0, 3.0])
    with tp.Tape() as tape:
        y = tp.sum(2 ** x + x ** 2 + x ** x)
    tape.backward(y)
    x64 = np.array([1.0, 2.0, 3.0])
    want = 2 ** x64 * np.log(2) + 2 * x64 + x64 ** x64 * (np.log(x64) + 1)
    np.testing.assert_allclose(x.grad.to_host(), want, rtol=1e-5)


def test_other_backward_formulas_at_their_edges(queue):
    """The rest of the audit: each gradient equals PyTorch's formula at the domain edge (finite
    where PyTorch's is: abs, relu, maximum, div's numerator; inf where PyTorch's is inf)."""
    ones = np.ones(1)
    cases = [
        (tp.abs, [0.0], [0.0]),                           # sgn(0) = 0
        (tp.relu, [0.0], [0.0]),
        (tp.sqrt, [0.0], [np.inf]),                       # grad / (2 * result)
        (tp.log, [0.0], [np.inf]),                        # grad / x
        (lambda x: tp.div(x, 2.0), [0.0], [0.5]),
        (lambda x: tp.div(1.0, x), [0.0], [-np.inf]),     # -grad * s / x**2
        (lambda x: tp.maximum(x, 0.0), [0.0], ones),      # clamp_min: x >= min passes
        (lambda x: tp.minimum(x, 0.0), [0.0], ones),
        (tp.exp, [-1e4], [0.0]),
        (tp.sigmoid, [-1e4], [0.0]),
        (tp.tanh, [1e4], [0.0]),
    ]
    for fn, x, want in cases:
        with np.errstate(all="ignore"):
            _, (g,) = grads_of(queue, fn, x)
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6, err_msg=str(fn))
        assert not np.isnan(g).any()


def test_softmax_and_losses_stay_finite_at_extremes(queue):
    """-inf logits (masked positions) and huge ones: finite gradients, as PyTorch."""
    z = np.array([[-np.inf, 0.0, 1.0], [1e4, -1e4, 0.0]], np.float32)
    for fn in (lambda x: tp.softmax(x, axis=1), lambda x: tp.log_softmax(x, axis=1)):
        out, (g,) = grads_of(queue, fn, z)
        assert np.all(np.isfinite(g)), (fn, g)
        assert not np.isnan(out).any()
    labels = pc.Tensor.from_host(queue, np.array([2, 0]))
    x = leaf(queue, np.array([[-1e4, 0.0, 1e4], [1e4, -1e4, 0.0]], np.float32))
    with tp.Tape() as tape:
        loss = tp.cross_entropy(x, labels) + tp.mse_loss(x, tp.tensor(x.value))
    tape.backward(loss)
    assert np.isfinite(loss.item()) and np.all(np.isfinite(x.grad.to_host()))
