"""The pointwise ops PyTorch users reach for (remainder, fmod, hypot, exp2, frac, addcmul,
addcdiv, clamp_min/clamp_max, isinf, all, any): values and gradients against torch in float64,
finite differences, the sign conventions and edge values, the method forms, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import DTypeError, ShapeError


def _torch_pair(fn, arrays, g):
    """torch's value and the gradient of each input of ``fn`` at float64 copies of
    ``arrays``, for the upstream gradient ``g``."""
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


# a dividend that crosses zero and a divisor of both signs, broadcast along rows
A = np.array([[-7.5, -3.0, -0.5, 0.0], [0.5, 3.0, 7.25, 10.0], [-1.0, 2.0, -9.0, 4.5]],
             np.float32)
B = np.array([2.0, -2.0, 1.5, -4.0], np.float32)


@pytest.mark.parametrize("name", ["remainder", "fmod"])
def test_remainder_and_fmod_match_pytorch_value_and_gradient(queue, rng, name):
    g = rng.standard_normal(A.shape).astype(np.float32)
    out, (ga, gb) = _ours(queue, getattr(tp, name), [A, B], g)
    want, (wa, wb) = _torch_pair(getattr(torch, name), [A, B], g)
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ga, wa, rtol=1e-6)
    np.testing.assert_allclose(gb, wb, rtol=1e-5, atol=1e-5)
    assert out.op_name == name


def test_remainder_follows_the_divisor_and_fmod_the_dividend_as_pytorch(queue):
    x = leaf(queue, [-3.0, 3.0, -3.0, 3.0])
    d = leaf(queue, [2.0, -2.0, -2.0, 2.0])
    np.testing.assert_array_equal(tp.remainder(x, d).to_host(), [1, -1, -1, 1])
    np.testing.assert_array_equal(tp.fmod(x, d).to_host(), [-1, 1, -1, 1])
    np.testing.assert_array_equal((x % d).to_host(), [1, -1, -1, 1])          # Node's %
    np.testing.assert_array_equal((x % 2.0).to_host(), [1, 1, 1, 1])
    np.testing.assert_array_equal((5.0 % d).to_host(), [1, -1, -1, 1])
    np.testing.assert_array_equal(x.fmod(2.0).to_host(), [-1, 1, -1, 1])
    np.testing.assert_array_equal(x.remainder(-2.0).to_host(), [-1, -1, -1, -1])


def test_remainder_and_fmod_edge_values_match_pytorch(queue):
    a = np.array([5.0, -5.0, 5.0, np.inf, 0.0, -0.0, 1e30, 7.0], np.float32)
    b = np.array([0.0, np.inf, -np.inf, 2.0, -3.0, 3.0, 3.0, 1e-30], np.float32)
    for name in ("remainder", "fmod"):
        got = getattr(tp, name)(up(queue, a), up(queue, b)).to_host()
        want = getattr(torch, name)(torch.tensor(a), torch.tensor(b)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
        signed = ~np.isnan(want)                  # zeros keep torch's sign
        assert np.array_equal(np.signbit(got[signed]), np.signbit(want[signed])), name


def test_a_number_divisor_passes_the_gradient_unchanged_as_pytorch(queue):
    x = leaf(queue, [-3.5, 4.0])
    with tp.Tape() as tape:
        loss = tp.sum(tp.remainder(x, 3.0) * 2.0 + tp.fmod(x, -3.0))
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), [3, 3])
    d = leaf(queue, [2.0, -3.0])
    with tp.Tape() as tape:
        loss = tp.sum(tp.remainder(7.0, d))          # 7 % 2 = 1, 7 % -3 = -2
    tape.backward(loss)
    np.testing.assert_array_equal(d.grad.to_host(), [-3, 3])   # -floor(7 / d)


def test_remainder_fmod_and_hypot_pass_gradcheck(queue, rng):
    a = leaf(queue, rng.uniform(-5, 5, (3, 4)).round(1) + 0.05)     # away from the jumps
    b = leaf(queue, [1.5, -2.5, 3.5, -1.5])
    for fn in (tp.remainder, tp.fmod, tp.hypot):
        assert tp.gradcheck(fn, [a, b])


def test_hypot_matches_pytorch_value_and_gradient_without_overflow(queue, rng):
    g = rng.standard_normal(A.shape).astype(np.float32)
    out, (ga, gb) = _ours(queue, tp.hypot, [A, B], g)
    want, (wa, wb) = _torch_pair(torch.hypot, [A, B], g)
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-6)
    np.testing.assert_allclose(ga, wa, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, wb, rtol=1e-5, atol=1e-6)
    big = tp.hypot(up(queue, [3e30, 0.0]), up(queue, [4e30, 0.0])).to_host()
    np.testing.assert_allclose(big, [5e30, 0.0], rtol=1e-6)


@pytest.mark.parametrize("name", ["exp2", "frac"])
def test_exp2_and_frac_match_pytorch_value_and_gradient(queue, rng, name):
    x = rng.uniform(-6, 6, 33).astype(np.float32)
    g = rng.standard_normal(33).astype(np.float32)
    out, (gx,) = _ours(queue, getattr(tp, name), [x], g)
    want, (wx,) = _torch_pair(getattr(torch, name), [x], g)
    np.testing.assert_allclose(out.to_host(), want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(gx, wx, rtol=2e-6)
    assert tp.gradcheck(getattr(tp, name), [leaf(queue, x[:7] + 0.01)])


def test_exp2_and_frac_of_edge_values_are_pytorch_s(queue):
    e = np.array([0.0, -0.0, 2.5, -2.5, np.inf, -np.inf, np.nan, 128.0, -150.0], np.float32)
    for name in ("exp2", "frac"):
        got = getattr(tp, name)(up(queue, e)).to_host()
        want = getattr(torch, name)(torch.tensor(e)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert leaf(queue, [1.75]).frac().to_host()[0] == 0.75
    assert leaf(queue, [3.0]).exp2().to_host()[0] == 8.0


def test_addcmul_and_addcdiv_broadcast_and_take_value_as_pytorch(queue, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    t1 = rng.standard_normal((3,)).astype(np.float32)
    t2 = rng.uniform(0.5, 2, (2, 1)).astype(np.float32)
    g = rng.standard_normal((2, 3)).astype(np.float32)
    for name in ("addcmul", "addcdiv"):
        for value in (1, -0.5):
            out, grads = _ours(queue, lambda a, b, c, n=name, v=value:
                               getattr(tp, n)(a, b, c, value=v), [x, t1, t2], g)
            want, wants = _torch_pair(lambda a, b, c, n=name, v=value:
                                      getattr(torch, n)(a, b, c, value=v), [x, t1, t2], g)
            np.testing.assert_allclose(out.to_host(), want, rtol=1e-6, atol=1e-6)
            for got_g, want_g in zip(grads, wants):
                np.testing.assert_allclose(got_g, want_g, rtol=1e-5, atol=1e-6)
    one = leaf(queue, [1.0, 2.0])
    np.testing.assert_array_equal(one.addcmul(one, one, value=2).to_host(), [3, 10])
    np.testing.assert_array_equal(one.addcdiv(one, one * 4.0).to_host(), [1.25, 2.25])
    with pytest.raises(TypeError):
        tp.addcmul(one, one, one, 2.0)                    # value is keyword-only, as torch's


def test_value_that_is_no_number_is_a_dtype_error_naming_the_op(queue):
    one = leaf(queue, [1.0])
    with pytest.raises(DTypeError, match="addcdiv: value must be a number"):
        tp.addcdiv(one, one, one, value=one)
    with pytest.raises(DTypeError, match="addcmul: value must be a number"):
        tp.addcmul(one, one, one, value=one)


def test_clamp_min_and_clamp_max_are_clamp_with_one_bound_as_pytorch(queue):
    x = leaf(queue, [-2.0, 0.5, 3.0])
    with tp.Tape() as tape:
        loss = tp.sum(tp.clamp_min(x, 0.5) + x.clamp_max(1.0))
    tape.backward(loss)
    np.testing.assert_array_equal(tp.clamp_min(x, 0.5).to_host(), [0.5, 0.5, 3])
    np.testing.assert_array_equal(tp.clamp_max(x, 1.0).to_host(), [-2, 0.5, 1])
    np.testing.assert_array_equal(x.grad.to_host(), [1, 2, 1])      # a tie passes, as torch
    bound = leaf(queue, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(tp.clamp_min(x, bound).to_host(), [0, 1, 3])


def test_isinf_is_a_mask_as_isnan_and_isfinite(queue):
    v = up(queue, [np.inf, -np.inf, np.nan, 0.0, 3e38])
    np.testing.assert_array_equal(tp.isinf(v).to_host(), [1, 1, 0, 0, 0])
    node = tp.tensor(v)
    np.testing.assert_array_equal(node.isinf().to_host(), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(node.isnan().to_host(), [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(node.isfinite().to_host(), [0, 0, 0, 1, 1])


def test_all_and_any_reduce_truth_over_dims_as_pytorch(queue):
    a = np.array([[[0.0, 1.0], [2.0, 3.0]], [[np.nan, -1.0], [0.0, 0.0]]], np.float32)
    x = up(queue, a)
    t = torch.tensor(a)
    for name in ("all", "any"):
        op = getattr(tp, name)
        assert op(x).shape == () and float(op(x)) == float(getattr(torch, name)(t))
        for dim in (0, 1, -1, (0, 2), (-1, 0)):
            for keepdim in (False, True):
                want = getattr(torch, name)(t, dim=dim, keepdim=keepdim).float().numpy()
                np.testing.assert_array_equal(op(x, dim, keepdim).to_host(), want,
                                              err_msg=f"{name} {dim} {keepdim}")
    np.testing.assert_array_equal(tp.all(x, 2).to_host(), [[0, 1], [1, 0]])   # NaN is true
    np.testing.assert_array_equal(tp.any(x, (1, 2)).to_host(), [1, 1])
    node = tp.tensor(x, requires_grad=True)
    np.testing.assert_array_equal(node.all(dim=0).to_host(), [[0, 1], [0, 0]])
    np.testing.assert_array_equal(node.any(-1, keepdim=True).to_host(), [[[1], [1]], [[1], [0]]])
    assert not isinstance(tp.any(node), tp.Node)                     # never recorded
    zero_d = up(queue, 0.0)
    assert float(tp.any(zero_d, 0)) == 0.0 and float(tp.all(up(queue, 2.0), -1)) == 1.0


def test_all_and_any_refuse_bad_dims_and_integer_tensors_naming_the_op(queue):
    x = up(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match="all: dim 2 is out of range .*\\(2, 3\\)"):
        tp.all(x, 2)
    with pytest.raises(ShapeError, match="any: dims .* name a dimension twice"):
        tp.any(x, (0, -2))
    with pytest.raises(DTypeError, match="any: dtype int32"):
        tp.any(up(queue, [1, 0], np.int32))


def test_remainder_fmod_and_hypot_refuse_two_numbers_and_other_operands(queue):
    x = leaf(queue, [1.0, 2.0])
    with pytest.raises(DTypeError, match="remainder: both operands are numbers"):
        tp.remainder(3.0, 2.0)
    with pytest.raises(DTypeError, match="fmod: expected a tp.Node, pc.Tensor or number, got str"):
        tp.fmod(x, "2")
    with pytest.raises(DTypeError, match="hypot: expected tp.Node or pc.Tensor operands"):
        tp.hypot(x, 1.0)
    with pytest.raises(ShapeError):
        tp.remainder(x, leaf(queue, [1.0, 2.0, 3.0]))


@pytest.mark.parametrize("call, message", [
    (lambda a, b, c: tp.lerp(a, b, c),
     r"lerp: shapes do not broadcast: input \(2, 3\), end \(2, 3\), weight \(4,\)"),
    (lambda a, b, c: tp.lerp(a, c, 0.5), r"lerp: shapes do not broadcast: input \(2, 3\), "
     r"end \(4,\)"),
    (lambda a, b, c: tp.addcmul(a, b, c, value=0.5),
     r"addcmul: shapes do not broadcast: input \(2, 3\), tensor1 \(2, 3\), tensor2 \(4,\)"),
    (lambda a, b, c: tp.addcdiv(a, c, b),
     r"addcdiv: shapes do not broadcast: input \(2, 3\), tensor1 \(4,\), tensor2 \(2, 3\)"),
    (lambda a, b, c: tp.clamp(a, b, c),
     r"clamp: shapes do not broadcast: input \(2, 3\), min \(2, 3\), max \(4,\)"),
])
def test_three_input_ops_name_themselves_and_every_shape_when_they_do_not_broadcast(
        queue, call, message):
    # each is composed of binary ops: the error came from one of them, naming it and two shapes
    # ('sub: shapes (4,) and (2, 3)' for a lerp), perhaps an intermediate result's
    a, b, c = (leaf(queue, np.ones(s, np.float32)) for s in ((2, 3), (2, 3), (4,)))
    with pytest.raises(ShapeError, match=message):
        call(a, b, c)
