"""The special functions and the rest of the unary math (acosh asinh atanh, deg2rad rad2deg,
erfc erfinv, lgamma digamma polygamma mvlgamma, i0, sinc, logit, sgn, signbit): values and
gradients against torch (torch.special) in float64, finite differences, PyTorch's values at
the poles and edges, the method forms, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import DTypeError, ParclError


def _span(lo, hi):
    return lambda rng, n: rng.uniform(lo, hi, n)


def _off_poles(lo, hi):
    """Samples in [lo, hi] at least 0.1 away from the non-positive integers (the poles of
    lgamma, digamma and polygamma)."""
    def sample(rng, n):
        x = rng.uniform(lo, hi, n)
        near = (x < 0.1) & (np.abs(x - np.round(x)) < 0.1)
        return np.where(near, np.round(x) + 0.5, x)
    return sample


# name -> (parcl op, torch op, sampler): value and gradient against torch in float64
SMOOTH = {
    "acosh": (tp.acosh, torch.acosh, _span(1.1, 6.0)),
    "asinh": (tp.asinh, torch.asinh, _span(-4.0, 4.0)),
    "atanh": (tp.atanh, torch.atanh, _span(-0.9, 0.9)),
    "deg2rad": (tp.deg2rad, torch.deg2rad, _span(-400.0, 400.0)),
    "rad2deg": (tp.rad2deg, torch.rad2deg, _span(-7.0, 7.0)),
    "erfc": (tp.erfc, torch.erfc, _span(-3.0, 3.0)),
    "erfinv": (tp.erfinv, torch.erfinv, _span(-0.95, 0.95)),
    "lgamma": (tp.lgamma, torch.lgamma, _off_poles(-4.5, 12.0)),
    "digamma": (tp.digamma, torch.digamma, _off_poles(-4.5, 12.0)),
    "i0": (tp.i0, torch.i0, _span(-25.0, 25.0)),
    "sinc": (tp.sinc, torch.sinc, _span(-3.0, 3.0)),
    "logit": (tp.logit, torch.logit, _span(0.02, 0.98)),
}


def _torch_grad(fn, x64, g64):
    xt = torch.tensor(x64, requires_grad=True)
    y = fn(xt)
    y.backward(torch.tensor(g64))
    return y.detach().numpy(), xt.grad.numpy()


def _ours(queue, fn, x, g):
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = fn(node)
    tape.backward(y, grad=up(queue, g))
    return y, node.grad.to_host()


@pytest.mark.parametrize("name", sorted(SMOOTH))
@pytest.mark.parametrize("n", [7, 1000])
def test_special_functions_match_pytorch_value_and_gradient(queue, rng, name, n):
    fn, tfn, sample = SMOOTH[name]
    x = sample(rng, n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    y, grad = _ours(queue, fn, x, g)
    assert y.op_name == name and y.shape == (n,)
    want, want_grad = _torch_grad(tfn, x.astype(np.float64), g.astype(np.float64))
    np.testing.assert_allclose(y.to_host(), want, rtol=2e-6, atol=2e-6, err_msg=name)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", sorted(SMOOTH))
def test_special_functions_pass_gradcheck(queue, rng, name):
    fn, _, sample = SMOOTH[name]
    x = sample(rng, (3, 5))
    if name == "i0":
        x = x / 5.0                          # moderate values: float32 differences stay exact
    assert tp.gradcheck(fn, [leaf(queue, x.astype(np.float32))])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 6])
def test_polygamma_matches_pytorch_value_and_gradient(queue, rng, n):
    x = _off_poles(-3.5, 15.0)(rng, 300).astype(np.float32)
    g = rng.standard_normal(300).astype(np.float32)
    y, grad = _ours(queue, lambda v: tp.polygamma(n, v), x, g)
    assert y.op_name == "polygamma"
    want, want_grad = _torch_grad(lambda t: torch.polygamma(n, t), x.astype(np.float64),
                                  g.astype(np.float64))
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5)
    assert tp.gradcheck(lambda v: tp.polygamma(n, v), [leaf(queue, x[:8] + 4.0)])


def test_polygamma_knows_its_closed_forms(queue):
    one = up(queue, [1.0, 0.5])
    # trigamma(1) = pi^2 / 6, trigamma(1/2) = pi^2 / 2; polygamma(2, 1) = -2 zeta(3)
    np.testing.assert_allclose(tp.polygamma(1, one).to_host(),
                               [np.pi ** 2 / 6, np.pi ** 2 / 2], rtol=1e-6)
    np.testing.assert_allclose(tp.polygamma(2, one).to_host()[0], -2 * 1.2020569031595942,
                               rtol=1e-6)
    np.testing.assert_allclose(tp.digamma(one).to_host(),
                               [-0.5772156649015329, -1.9635100260214235], rtol=1e-6)


def test_polygamma_past_float32s_range_near_a_pole_is_infinite_as_pytorch(queue):
    # the first term of the series, x**-(n+1), overflows there: it was inf - inf, NaN
    x = np.array([1e-20, -1e-20, 1e-38, 1e-10, -1e-9, 1e-6], np.float32)
    for n in (1, 2, 3, 4, 8):
        got = tp.polygamma(n, up(queue, x)).to_host()
        want = torch.polygamma(n, torch.tensor(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"polygamma({n})")
    np.testing.assert_array_equal(tp.polygamma(1, up(queue, x[:3])).to_host(), [np.inf] * 3)
    np.testing.assert_array_equal(tp.polygamma(2, up(queue, x[:2])).to_host(),
                                  [-np.inf, np.inf])
    # digamma's gradient is polygamma(1, x)
    v = leaf(queue, np.array([1e-20, 2.0], np.float32))
    with tp.Tape() as tape:
        y = tp.digamma(v)
    tape.backward(y, grad=up(queue, np.ones(2)))
    np.testing.assert_allclose(v.grad.to_host(), [np.inf, np.pi ** 2 / 6 - 1], rtol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_mvlgamma_matches_pytorch_value_and_gradient(queue, rng, p):
    x = rng.uniform((p - 1) / 2 + 0.1, 9.0, 50).astype(np.float32)
    g = rng.standard_normal(50).astype(np.float32)
    y, grad = _ours(queue, lambda v: tp.mvlgamma(v, p), x, g)
    assert y.op_name == "mvlgamma"
    want, want_grad = _torch_grad(lambda t: torch.mvlgamma(t, p), x.astype(np.float64),
                                  g.astype(np.float64))
    np.testing.assert_allclose(y.to_host(), want, rtol=2e-6, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5)
    assert tp.gradcheck(lambda v: tp.mvlgamma(v, p), [leaf(queue, x[:6])])


EDGES = np.array([0.0, -0.0, -1.0, -2.0, -2.5, 1.0, 2.0, np.inf, -np.inf, np.nan, 1e-30,
                  30.0, 0.5, -0.5], np.float32)


@pytest.mark.parametrize("name", ["lgamma", "digamma", "acosh", "asinh", "atanh", "erfc",
                                  "sinc", "deg2rad", "rad2deg"])
def test_edge_values_are_pytorchs(queue, name):
    fn, tfn, _ = SMOOTH[name]
    got = fn(up(queue, EDGES)).to_host()
    want = tfn(torch.tensor(EDGES)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: {got}")
    np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(want) * np.sign(want),
                                  err_msg=f"{name}: {got}")
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=1e-7, err_msg=name)


def test_erfinv_and_i0_edges_are_pytorchs(queue):
    u = np.array([-1.0, 1.0, 1.5, -2.0, 0.0, -0.0, 1 - 2 ** -24, np.nan], np.float32)
    got = tp.erfinv(up(queue, u)).to_host()
    want = torch.erfinv(torch.tensor(u.astype(np.float64))).numpy()
    np.testing.assert_array_equal(got[:6], [-np.inf, np.inf, np.nan, np.nan, 0, 0])
    np.testing.assert_allclose(got[6], want[6], rtol=1e-5)
    assert np.isnan(got[7])
    big = np.array([0.0, 20.0, 20.5, 80.0, -80.0], np.float32)
    np.testing.assert_allclose(tp.i0(up(queue, big)).to_host(),
                               torch.i0(torch.tensor(big.astype(np.float64))).numpy(), rtol=2e-6)


def test_logit_with_and_without_eps_is_pytorchs_gradient_included(queue):
    x = np.array([-0.5, 0.0, 0.1, 0.3, 0.5, 0.9, 1.0, 1.5], np.float32)
    for eps in (None, 0.2):
        y, grad = _ours(queue, lambda v, eps=eps: tp.logit(v, eps), x, np.ones(8, np.float32))
        want, want_grad = _torch_grad(lambda t, eps=eps: torch.logit(t, eps), x.astype(np.float64),
                                      np.ones(8))
        np.testing.assert_allclose(y.to_host(), want, rtol=1e-6, equal_nan=True,
                                   err_msg=f"eps={eps}")
        np.testing.assert_allclose(grad, want_grad, rtol=1e-6, equal_nan=True,
                                   err_msg=f"eps={eps}")
    # eps=0.2 clamps: logit(0.2) below, 0 gradient outside [0.2, 0.8]
    np.testing.assert_allclose(tp.logit(up(queue, [0.0, 1.0]), 0.2).to_host(),
                               [np.log(0.25), np.log(4.0)], rtol=1e-6)


def test_logit_gradient_at_minus_zero_is_plus_infinity_as_pytorch(queue):
    # y / (x (1 - x)) at x = -0 divided by -0: the gradient was -inf where PyTorch's is +inf
    x = np.array([-0.0, 0.0, 1.0, 0.5], np.float32)
    g = np.array([1.0, 1.0, 1.0, -2.0], np.float32)
    for eps in (None, 0.0):
        _, grad = _ours(queue, lambda v, eps=eps: tp.logit(v, eps), x, g)
        t = torch.tensor(x, requires_grad=True)
        torch.logit(t, eps).backward(torch.tensor(g))
        np.testing.assert_array_equal(grad, [np.inf, np.inf, np.inf, -8.0], err_msg=f"{eps}")
        np.testing.assert_array_equal(grad, t.grad.numpy(), err_msg=f"eps={eps}")


def test_sinc_and_its_gradient_at_zero_are_pytorchs(queue):
    y, grad = _ours(queue, tp.sinc, np.array([0.0, 1.0, -2.0, 0.5], np.float32),
                    np.ones(4, np.float32))
    np.testing.assert_allclose(y.to_host(), [1.0, 0.0, 0.0, 2 / np.pi], atol=1e-7)
    np.testing.assert_allclose(grad, [0.0, -1.0, -0.5, -4 / np.pi], rtol=1e-6, atol=1e-7)


def test_sgn_signbit_and_the_numpy_aliases_hold_as_pytorch(queue):
    x = np.array([-2.0, -0.0, 0.0, 3.0, -np.inf], np.float32)
    np.testing.assert_array_equal(tp.sgn(up(queue, x)).to_host(), [-1, 0, 0, 1, -1])
    mask = tp.signbit(leaf(queue, x))
    assert isinstance(mask, type(up(queue, x)))              # a raw mask, not recorded
    np.testing.assert_array_equal(mask.to_host(), [1, 1, 0, 0, 1])
    assert tp.arccos is tp.acos and tp.arcsin is tp.asin and tp.arctan is tp.atan
    assert tp.arccosh is tp.acosh and tp.arcsinh is tp.asinh and tp.arctanh is tp.atanh


def test_node_methods_are_the_ops(queue):
    x = leaf(queue, np.array([0.25, 0.5, 2.5], np.float32))
    for method, op in (("acosh", tp.acosh), ("asinh", tp.asinh), ("atanh", tp.atanh),
                       ("arcsinh", tp.asinh), ("arctan", tp.atan), ("deg2rad", tp.deg2rad),
                       ("rad2deg", tp.rad2deg), ("erfc", tp.erfc), ("erfinv", tp.erfinv),
                       ("lgamma", tp.lgamma), ("digamma", tp.digamma), ("i0", tp.i0),
                       ("sinc", tp.sinc), ("logit", tp.logit), ("sgn", tp.sgn),
                       ("signbit", tp.signbit)):
        np.testing.assert_array_equal(getattr(x, method)().to_host(), op(x).to_host(),
                                      err_msg=method)
    np.testing.assert_array_equal(x.polygamma(2).to_host(), tp.polygamma(2, x).to_host())
    np.testing.assert_array_equal(x.mvlgamma(1).to_host(), tp.lgamma(x).to_host())
    np.testing.assert_array_equal(x.logit(0.3).to_host(), tp.logit(x, eps=0.3).to_host())


def test_bad_arguments_are_named_errors(queue):
    x = up(queue, [1.0, 2.0])
    with pytest.raises(ParclError, match="polygamma: n must be at least 0, got -1"):
        tp.polygamma(-1, x)
    with pytest.raises(DTypeError, match="polygamma: n must be an int, got float"):
        tp.polygamma(1.0, x)
    with pytest.raises(ParclError, match="mvlgamma: p must be at least 1, got 0"):
        tp.mvlgamma(x, 0)
    with pytest.raises(DTypeError, match="logit: eps must be a number or None"):
        tp.logit(x, "0.1")
    with pytest.raises(DTypeError, match=r"lgamma: dtype int64 .*\(3,\)"):
        tp.lgamma(up(queue, [1, 2, 3], np.int64))
    with pytest.raises(DTypeError, match="signbit: expected"):
        tp.signbit(1.0)
