"""Differentiable elementwise, reduction and shape ops: forward against float64 numpy, backward
against finite differences (tp.gradcheck), broadcasting gradients, scalars, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf

_erf = np.vectorize(math.erf)


UNARY = {
    "neg": (tp.neg, np.negative, False),
    "exp": (tp.exp, np.exp, False),
    "log": (tp.log, np.log, True),
    "relu": (tp.relu, lambda x: np.maximum(x, 0), False),
    "sigmoid": (tp.sigmoid, lambda x: 1 / (1 + np.exp(-x)), False),
    "tanh": (tp.tanh, np.tanh, False),
    "gelu": (tp.gelu, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), False),
    "sqrt": (tp.sqrt, np.sqrt, True),
    "abs": (tp.abs, np.abs, False),
}


def _input(rng, shape, positive):
    x = rng.standard_normal(shape)
    if positive:
        return (np.abs(x) + 0.5).astype(np.float32)
    x[np.abs(x) < 0.05] = 0.3           # keep relu/abs kinks away from the finite differences
    return x.astype(np.float32)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", [(1,), (7,), (33, 7), (2, 3, 5)])
def test_unary_forward_and_gradcheck(queue, rng, name, shape):
    fn, ref, positive = UNARY[name]
    x = _input(rng, shape, positive)
    node = leaf(queue, x)
    with tp.Tape():
        out = fn(node)
    assert isinstance(out, tp.Node) and out.op_name == name and out.shape == shape
    np.testing.assert_allclose(out.to_host(), ref(x.astype(np.float64)), rtol=2e-5, atol=1e-6)
    assert tp.gradcheck(fn, [node])


BINARY = {"add": (tp.add, np.add), "sub": (tp.sub, np.subtract),
          "mul": (tp.mul, np.multiply), "div": (tp.div, np.divide),
          "maximum": (tp.maximum, np.maximum), "minimum": (tp.minimum, np.minimum)}

BROADCASTS = [((7,), (7,)), ((3, 1), (1, 4)), ((257,), (7, 257)), ((7, 257), (257,)),
              ((), (33,)), ((2, 1, 5), (3, 1)), ((4, 1), (1,))]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sa,sb", BROADCASTS)
def test_binary_forward_and_gradcheck(queue, rng, name, sa, sb):
    fn, ref = BINARY[name]
    a = rng.uniform(0.5, 2.0, sa).astype(np.float32)
    b = rng.uniform(0.5, 2.0, sb).astype(np.float32)
    if name in ("maximum", "minimum"):          # keep every pair >= 0.05 apart (the kink)
        a = np.round(a, 1).astype(np.float32)
        b = (np.round(b, 1) + 0.05).astype(np.float32)
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape():
        out = fn(na, nb)
    assert out.op_name == name
    np.testing.assert_allclose(out.to_host(), ref(a.astype(np.float64), b.astype(np.float64)),
                               rtol=1e-5)
    assert tp.gradcheck(fn, [na, nb], max_elements=24)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_only_one_side_requires_grad(queue, rng, name):
    fn, _ = BINARY[name]
    na = leaf(queue, rng.uniform(0.5, 2, (3, 4)))
    nb = leaf(queue, rng.uniform(0.5, 2, (4,)), requires_grad=False)
    assert tp.gradcheck(fn, [na, nb])
    with tp.Tape() as tape:
        loss = tp.sum(fn(nb, na))
    tape.backward(loss)
    assert na.grad.shape == (3, 4) and nb.grad is None


SCALAR_CASES = [
    ("add", lambda x: x + 2.5, lambda x: x + 2.5),
    ("add", lambda x: 2.5 + x, lambda x: 2.5 + x),
    ("sub", lambda x: x - 2.5, lambda x: x - 2.5),
    ("sub", lambda x: 2.5 - x, lambda x: 2.5 - x),
    ("mul", lambda x: x * -1.5, lambda x: x * -1.5),
    ("mul", lambda x: 3 * x, lambda x: 3 * x),
    ("div", lambda x: x / 4.0, lambda x: x / 4.0),
    ("div", lambda x: 3.0 / x, lambda x: 3.0 / x),
    ("neg", lambda x: -x, lambda x: -x),
    ("pow", lambda x: tp.pow(x, 3), lambda x: x ** 3),
    ("pow", lambda x: tp.pow(x, 0.5), np.sqrt),
    ("pow", lambda x: tp.pow(2.0, x), lambda x: 2.0 ** x),
    ("maximum", lambda x: tp.maximum(x, 1.0), lambda x: np.maximum(x, 1.0)),
    ("minimum", lambda x: tp.minimum(1.0, x), lambda x: np.minimum(x, 1.0)),
]


@pytest.mark.parametrize("name,fn,ref", SCALAR_CASES)
def test_scalar_operands_and_operators(queue, rng, name, fn, ref):
    x = rng.uniform(0.5, 2.0, (33, 7)).astype(np.float32)
    x[np.abs(x - 1.0) < 0.02] = 1.3      # away from the maximum/minimum kink
    node = leaf(queue, x)
    with tp.Tape():
        out = fn(node)
    assert out.op_name == name
    np.testing.assert_allclose(out.to_host(), ref(x.astype(np.float64)), rtol=1e-5)
    assert tp.gradcheck(fn, [node])


def test_numpy_scalars_work_and_two_scalars_do_not(queue):
    x = leaf(queue, [1.0, 2.0])
    assert np.allclose((x * np.float32(2.0)).to_host(), [2.0, 4.0])
    with pytest.raises(TypeError, match="both operands"):
        tp.add(1.0, 2.0)
    with pytest.raises(TypeError):
        tp.mul(x, np.ones(2, np.float32))


def test_broadcast_gradients_are_summed_to_the_input_shape(queue, rng):
    """Bias-add shape: (N, C) + (C,); the bias gradient is the column sum."""
    xs = rng.standard_normal((5, 3)).astype(np.float32)
    bs = rng.standard_normal((3,)).astype(np.float32)
    x, b = leaf(queue, xs), leaf(queue, bs)
    with tp.Tape() as tape:
        loss = tp.sum(tp.mul(x + b, x + b))
    tape.backward(loss)
    y = xs.astype(np.float64) + bs
    np.testing.assert_allclose(b.grad.to_host(), (2 * y).sum(0), rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_host(), 2 * y, rtol=1e-5)


# -- reductions -------------------------------------------------------------------------------
REDUCE_AXES = [None, 0, -1, (0, 2), (1,), (0, 1, 2), ()]


@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("axis", REDUCE_AXES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_forward_and_gradcheck(queue, rng, name, axis, keepdims):
    fn = getattr(tp, name)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape():
        out = fn(node, axis=axis, keepdims=keepdims)
    want = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims)
    assert out.op_name == name and out.shape == want.shape
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-5, atol=1e-6)
    assert tp.gradcheck(lambda v: fn(v, axis=axis, keepdims=keepdims), [node])


def test_scalar_results_have_shape_empty_and_node_methods(queue, rng):
    node = leaf(queue, rng.standard_normal((7, 33)))
    assert tp.sum(node).shape == () and tp.mean(node).shape == ()
    assert node.sum(axis=1).shape == (7,) and node.mean(keepdims=True).shape == (1, 1)
    with pytest.raises(pc.ShapeError, match="out of range"):
        tp.sum(node, axis=3)


# -- shape ops --------------------------------------------------------------------------------
def test_reshape_is_zero_copy_and_differentiable(queue, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape():
        out = tp.reshape(node, (3, -1))
        out2 = node.reshape(2, 12)
    assert out.op_name == "reshape" and out.shape == (3, 8) and out2.shape == (2, 12)
    assert out.value.data is node.value.data        # same buffer: no copy
    np.testing.assert_array_equal(out.to_host(), x.reshape(3, 8))
    assert tp.gradcheck(lambda v: tp.mul(tp.reshape(v, (8, 3)), 2.0), [node])
    with pytest.raises(pc.ShapeError):
        tp.reshape(node, (5, 5))


@pytest.mark.parametrize("axes", [None, (1, 0, 2), (2, 0, 1), (0, 2, 1), (-1, -3, -2)])
def test_transpose_forward_and_gradcheck(queue, rng, axes):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape():
        out = tp.transpose(node, axes)
    assert out.op_name == "transpose"
    np.testing.assert_array_equal(out.to_host(), np.transpose(x, axes))
    assert tp.gradcheck(lambda v: tp.transpose(v, axes), [node])


def test_composite_graph_gradcheck(queue, rng):
    """A small MLP-like expression through most ops at once (tp functions, not operators:
    gradcheck re-evaluates ``f`` under no_grad, where ops return raw Tensors)."""
    x = leaf(queue, rng.standard_normal((5, 4)), requires_grad=False)
    w = leaf(queue, rng.standard_normal((4,)) * 0.5)
    b = leaf(queue, rng.standard_normal((5, 1)) * 0.1)

    def f(w, b):
        h = tp.gelu(tp.add(tp.mul(x, w), b))
        s = tp.sub(tp.sigmoid(tp.transpose(h)), tp.div(tp.reshape(tp.tanh(h), (4, 5)), 3.0))
        return tp.add(tp.mean(tp.mul(tp.exp(s), 0.5), axis=0),
                      tp.sum(tp.log(tp.add(tp.exp(h), 1.0))))

    assert tp.gradcheck(f, [w, b])


def test_ops_on_raw_tensors_return_raw_tensors(queue):
    t = pc.Tensor.from_host(queue, np.ones((2, 3), np.float32))
    for out in (tp.add(t, t), tp.exp(t), tp.sum(t, 0), tp.transpose(t), tp.mul(t, 2.0)):
        assert isinstance(out, pc.Tensor)


def test_abs_of_negative_zero_is_positive_zero_as_torch(queue):
    """``torch.abs(-0.0)`` is +0; the select ``x < 0 ? -x : x`` kept -0, so ``1 / |x|`` at
    ``x = -0`` was -inf where PyTorch gives inf. Other values keep their bits."""
    x = np.array([-0.0, 0.0, -2.5, 3.0, -np.inf, np.nan, -1e-45], np.float32)
    got = tp.abs(pc.Tensor.from_host(queue, x)).to_host()
    assert not np.signbit(got[:2]).any()
    np.testing.assert_array_equal(got, np.abs(x))
    assert (1.0 / tp.abs(pc.Tensor.from_host(queue, x[:1]))).to_host()[0] == np.inf


def test_add_and_sub_take_pytorchs_alpha(queue):
    """``torch.add(p, g, alpha=-0.1)`` is ``p - 0.1 g`` (``torch.sub``: ``a - alpha b``), the
    ``b`` side broadcast and its gradient scaled by ``alpha``; ``tp.add`` refused the argument
    with TypeError 'add() got an unexpected keyword argument'. A non-number alpha is a
    TypeError, as PyTorch's."""
    import torch
    a, b = np.float32([1.0, -2.0, 3.0]), np.float32([[0.5], [2.0]])
    for name in ("add", "sub"):
        for alpha in (1, 2, -0.1, 0):
            x, y = leaf(queue, a), leaf(queue, b)
            with tp.Tape() as tape:
                out = getattr(tp, name)(x, y, alpha=alpha)
            tape.backward(tp.sum(out * out))
            tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
            want = getattr(torch, name)(tx, ty, alpha=alpha)
            (want * want).sum().backward()
            np.testing.assert_allclose(out.to_host(), want.detach().numpy(), rtol=1e-6)
            np.testing.assert_allclose(x.grad.to_host(), tx.grad.numpy(), rtol=1e-6)
            np.testing.assert_allclose(y.grad.to_host(), ty.grad.numpy(), rtol=1e-6)
        np.testing.assert_allclose(getattr(tp, name)(leaf(queue, a), 2.0, alpha=3).to_host(),
                                   getattr(torch, name)(torch.tensor(a), 2.0, alpha=3))
    np.testing.assert_allclose(tp.add(leaf(queue, a), 2.0, alpha=-0.5).to_host(), a - 1.0)
    with pytest.raises(TypeError, match="add: alpha must be a number"):
        tp.add(leaf(queue, a), leaf(queue, a), alpha=leaf(queue, 2.0))
