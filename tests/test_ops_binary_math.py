"""The binary pointwise math (xlogy, logaddexp, logaddexp2, fmax, fmin, ldexp, copysign,
floor_divide, heaviside, true_divide, float_power): values and both gradients against torch in
float64 with broadcasting, finite differences, PyTorch's NaN and infinity rules, numbers on
either side, the method forms, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import DTypeError, ParclError, ShapeError

# name -> (parcl op, torch op, sampler of (a, b)); a is (3, 4), b (4,) broadcast along rows
DIFFERENTIABLE = {
    "xlogy": (tp.xlogy, torch.xlogy, lambda r: (r.uniform(-2, 2, (3, 4)), r.uniform(0.2, 3, 4))),
    "logaddexp": (tp.logaddexp, torch.logaddexp,
                  lambda r: (r.uniform(-5, 5, (3, 4)), r.uniform(-5, 5, 4))),
    "logaddexp2": (tp.logaddexp2, torch.logaddexp2,
                   lambda r: (r.uniform(-5, 5, (3, 4)), r.uniform(-5, 5, 4))),
    "fmax": (tp.fmax, torch.fmax, lambda r: (r.uniform(-3, 3, (3, 4)), r.uniform(-3, 3, 4))),
    "fmin": (tp.fmin, torch.fmin, lambda r: (r.uniform(-3, 3, (3, 4)), r.uniform(-3, 3, 4))),
    "ldexp": (tp.ldexp, torch.ldexp, lambda r: (r.uniform(-3, 3, (3, 4)), r.uniform(-3, 3, 4))),
    "copysign": (tp.copysign, torch.copysign,
                 lambda r: (r.uniform(-3, 3, (3, 4)), r.uniform(-3, 3, 4))),
}


def _torch_pair(fn, arrays, g):
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.backward(torch.tensor(g.astype(np.float64)))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


def _ours(queue, fn, arrays, g):
    nodes = [leaf(queue, a) for a in arrays]
    with tp.Tape() as tape:
        out = fn(*nodes)
    tape.backward(out, grad=up(queue, g))
    return out, [n.grad.to_host() for n in nodes]


@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE))
def test_binary_math_matches_pytorch_value_and_both_gradients(queue, rng, name):
    fn, tfn, sample = DIFFERENTIABLE[name]
    a, b = (v.astype(np.float32) for v in sample(rng))
    g = rng.standard_normal((3, 4)).astype(np.float32)
    out, (ga, gb) = _ours(queue, fn, (a, b), g)
    assert out.op_name == name and out.shape == (3, 4)
    want, (wa, wb) = _torch_pair(tfn, (a, b), g)
    np.testing.assert_allclose(out.to_host(), want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(ga, wa, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, wb, rtol=1e-5, atol=1e-5)
    assert tp.gradcheck(fn, [leaf(queue, a), leaf(queue, b)])


def test_xlogy_at_zero_and_nan_is_pytorchs_gradient_included(queue):
    x = np.array([0.0, 0.0, 1.0, 2.0, 0.0], np.float32)
    y = np.array([0.0, np.nan, 0.0, 3.0, 2.0], np.float32)
    out, (gx, gy) = _ours(queue, tp.xlogy, (x, y), np.ones(5, np.float32))
    want, (wx, wy) = _torch_pair(torch.xlogy, (x, y), np.ones(5))
    for got, ref in ((out.to_host(), want), (gx, wx), (gy, wy)):
        np.testing.assert_allclose(got, ref, rtol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(out.to_host()[:3], [0, np.nan, -np.inf])


def test_logaddexp_is_stable_and_keeps_equal_infinities(queue):
    a = np.array([1000.0, -1000.0, np.inf, -np.inf, np.inf, 1.0], np.float32)
    b = np.array([1000.0, -1000.0, np.inf, -np.inf, -np.inf, np.nan], np.float32)
    for fn, tfn in ((tp.logaddexp, torch.logaddexp), (tp.logaddexp2, torch.logaddexp2)):
        got = fn(up(queue, a), up(queue, b)).to_host()
        want = tfn(torch.tensor(a), torch.tensor(b)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True, err_msg=fn.__name__)
    np.testing.assert_allclose(tp.logaddexp(up(queue, a[:2]), up(queue, b[:2])).to_host(),
                               [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-7)


def test_fmax_and_fmin_let_a_number_beat_nan_and_route_the_gradient_as_pytorch(queue):
    a = np.array([1.0, np.nan, 2.0, 3.0, np.nan, 2.0], np.float32)
    b = np.array([1.0, 1.0, np.nan, 5.0, np.nan, -1.0], np.float32)
    for fn, tfn in ((tp.fmax, torch.fmax), (tp.fmin, torch.fmin)):
        out, (ga, gb) = _ours(queue, fn, (a, b), np.ones(6, np.float32))
        want, (wa, wb) = _torch_pair(tfn, (a, b), np.ones(6))
        np.testing.assert_array_equal(out.to_host(), want.astype(np.float32))
        np.testing.assert_array_equal(ga, wa)
        np.testing.assert_array_equal(gb, wb)
    np.testing.assert_array_equal(tp.fmax(up(queue, a), up(queue, b)).to_host(),
                                  [1, 1, 2, 5, np.nan, 2])
    # maximum propagates the NaN that fmax drops
    assert np.isnan(tp.maximum(up(queue, a), up(queue, b)).to_host()[1])


def test_copysign_gradient_is_zero_at_zero_and_for_the_sign_source(queue):
    a = np.array([0.0, -0.0, 2.0, -3.0], np.float32)
    out, (ga, gb) = _ours(queue, tp.copysign, (a, np.array([-1.0, 1.0, -0.0, 2.0])),
                          np.ones(4, np.float32))
    np.testing.assert_array_equal(out.to_host(), [-0.0, 0.0, -2.0, 3.0])
    assert np.signbit(out.to_host()[0]) and not np.signbit(out.to_host()[1])
    np.testing.assert_array_equal(ga, [0, 0, -1, -1])
    np.testing.assert_array_equal(gb, [0, 0, 0, 0])


def test_floor_divide_and_heaviside_are_pytorchs_and_refuse_a_backward(queue):
    a = np.array([-7.0, 7.0, -7.5, 0.0, 5.0, np.nan], np.float32)
    b = np.array([2.0, -2.0, 2.0, 3.0, 0.0, 1.0], np.float32)
    np.testing.assert_array_equal(
        tp.floor_divide(up(queue, a), up(queue, b)).to_host(),
        torch.floor_divide(torch.tensor(a), torch.tensor(b)).numpy())
    np.testing.assert_array_equal(
        tp.heaviside(up(queue, a), up(queue, [0.5])).to_host(),
        torch.heaviside(torch.tensor(a), torch.tensor([0.5])).numpy())
    np.testing.assert_array_equal(tp.heaviside(up(queue, a), 0.5).to_host(),
                                  [0, 1, 0, 0.5, 1, 0])
    x = leaf(queue, a[:3])
    for fn in (lambda v: tp.floor_divide(v, 2.0), lambda v: tp.heaviside(v, 0.5)):
        with tp.Tape() as tape:
            y = tp.sum(fn(x))
        with pytest.raises(ParclError, match="the derivative is not implemented"):
            tape.backward(y)
    np.testing.assert_array_equal((x // 2.0).to_host(), [-4, 3, -4])
    np.testing.assert_array_equal((7.0 // x).to_host(), [-1, 1, -1])


def test_numbers_on_either_side_and_the_aliases(queue):
    x = leaf(queue, np.array([1.0, 4.0], np.float32))
    np.testing.assert_allclose(tp.xlogy(2.0, x).to_host(), [0.0, 2 * np.log(4)], rtol=1e-6)
    np.testing.assert_allclose(tp.ldexp(x, 3).to_host(), [8.0, 32.0])
    np.testing.assert_allclose(tp.logaddexp(0.0, x).to_host(), np.logaddexp(0, [1, 4]),
                               rtol=1e-6)
    np.testing.assert_array_equal(tp.true_divide(x, 2.0).to_host(), [0.5, 2.0])
    p = tp.float_power(x, 0.5)
    assert p.dtype == np.float32                  # float32, where PyTorch's is float64
    np.testing.assert_array_equal(p.to_host(), [1.0, 2.0])
    assert tp.gradcheck(lambda v: tp.xlogy(v, v + 1.0) + tp.copysign(v, -1.0), [x])


def test_node_methods_are_the_ops(queue):
    a = leaf(queue, np.array([0.5, -2.0, 3.0], np.float32))
    b = leaf(queue, np.array([1.5, 2.0, -1.0], np.float32))
    for name in ("xlogy", "logaddexp", "logaddexp2", "fmax", "fmin", "ldexp", "copysign",
                 "heaviside", "floor_divide", "true_divide", "float_power"):
        np.testing.assert_array_equal(getattr(a, name)(b).to_host(),
                                      getattr(tp, name)(a, b).to_host(), err_msg=name)


def test_bad_operands_are_named_errors(queue):
    a, b = up(queue, np.ones((2, 3))), up(queue, np.ones(2))
    with pytest.raises(ShapeError, match=r"logaddexp.*\(2, 3\).*\(2,\)"):
        tp.logaddexp(a, b)
    with pytest.raises(DTypeError, match="xlogy: both operands are numbers"):
        tp.xlogy(1.0, 2.0)
    with pytest.raises(DTypeError, match="fmax: expected tp.Node, pc.Tensor or number"):
        tp.fmax(a, "1")
    with pytest.raises(DTypeError, match=r"copysign: dtype int64 .*\(2,\)"):
        tp.copysign(a, up(queue, [1, 2], np.int64))


def test_div_takes_pytorchs_rounding_modes_with_a_zero_gradient_as_pytorch(queue):
    """``torch.div(a, b, rounding_mode="floor")`` is ``floor_divide`` and ``"trunc"`` the
    quotient truncated toward 0 (-7 / 2: -4 and -3), each with the gradient 0 for both inputs
    (no error, where floor_divide's backward raises); parcl refused the argument with
    TypeError 'div() got an unexpected keyword argument'. Another mode is a ParclError, as
    PyTorch refuses it."""
    a = np.array([-7.0, 7.0, 3.5, -0.5, 0.0, 5.0, np.inf, np.nan, -3.0], np.float32)
    b = np.array([2.0, -2.0, 0.0, 2.0, -3.0, 0.3, 2.0, 1.0, 0.0], np.float32)
    for mode in ("floor", "trunc"):
        x, y = leaf(queue, a), leaf(queue, b)
        with tp.Tape() as tape:
            out = tp.div(x, y, rounding_mode=mode)
        tape.backward(tp.sum(out))
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        want = torch.div(ta, tb, rounding_mode=mode)
        want.sum().backward()
        np.testing.assert_array_equal(out.to_host(), want.detach().numpy())
        np.testing.assert_array_equal(x.grad.to_host(), ta.grad.numpy())
        np.testing.assert_array_equal(y.grad.to_host(), tb.grad.numpy())
        np.testing.assert_array_equal(tp.div(x, 2.0, rounding_mode=mode).to_host(),
                                      torch.div(ta, 2.0, rounding_mode=mode).detach())
        np.testing.assert_array_equal(tp.div(7.0, y, rounding_mode=mode).to_host(),
                                      torch.div(7.0, tb, rounding_mode=mode).detach())
    assert tp.div(leaf(queue, [-7.0]), 2.0, rounding_mode="trunc").to_host().tolist() == [-3]
    with pytest.raises(ParclError, match="rounding_mode must be None, 'floor' or 'trunc'"):
        tp.div(leaf(queue, a), 2.0, rounding_mode="round")
