"""Diagonals and contractions (diagonal, diag, trace, tensordot): values and gradients against
torch in float64 over offsets, dim pairs and dims forms, finite differences, the method forms,
and the errors naming the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import assert_replays_eager, leaf, up
from torch_reference import float64_reference
from parcl.errors import ShapeError


def _against_torch(queue, fn, tfn, arrays, rng):
    """Our value and gradients of ``fn`` at ``arrays`` for a random upstream gradient, and
    torch's in float64."""
    return float64_reference(queue, rng, fn, tfn, arrays)


@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (1, 2, 0), (-2, -1, 1), (3, 0, 2),
                                                (-1, 1, 0), (0, -1, -3)])
def test_diagonal_matches_pytorch_value_and_gradient(queue, rng, offset, dim1, dim2):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    out, (grad,), want, (want_grad,) = _against_torch(
        queue, lambda v: tp.diagonal(v, offset, dim1, dim2),
        lambda t: torch.diagonal(t, offset, dim1, dim2), [a], rng)
    assert out.op_name == "diagonal" and out.shape == want.shape
    np.testing.assert_array_equal(out.to_host(), want.astype(np.float32))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)


@pytest.mark.parametrize("k", [0, 2, -1])
def test_diag_of_a_vector_and_of_a_matrix_match_pytorch(queue, rng, k):
    v = rng.standard_normal(3).astype(np.float32)
    out, (grad,), want, (want_grad,) = _against_torch(
        queue, lambda u: tp.diag(u, k), lambda t: torch.diag(t, k), [v], rng)
    assert out.op_name == "diag" and out.shape == (3 + abs(k),) * 2
    np.testing.assert_array_equal(out.to_host(), want.astype(np.float32))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)
    m = rng.standard_normal((3, 5)).astype(np.float32)
    out, (grad,), want, (want_grad,) = _against_torch(
        queue, lambda u: tp.diag(u, k), lambda t: torch.diag(t, k), [m], rng)
    np.testing.assert_array_equal(out.to_host(), want.astype(np.float32))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)


def test_diag_diagonal_and_trace_give_concrete_values_and_methods(queue):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = leaf(queue, a)
    np.testing.assert_array_equal(tp.diagonal(x).to_host(), [0, 5, 10])
    np.testing.assert_array_equal(x.diagonal(1).to_host(), [1, 6, 11])
    np.testing.assert_array_equal(x.diag(-2).to_host(), [8])
    np.testing.assert_array_equal(tp.diag(up(queue, [1.0, 2.0]), 1).to_host(),
                                  [[0, 1, 0], [0, 0, 2], [0, 0, 0]])
    with tp.Tape() as tape:
        t = x.trace()
    tape.backward(t)
    assert t.shape == () and float(t) == 15.0
    np.testing.assert_array_equal(x.grad.to_host(), np.eye(3, 4))
    assert float(tp.trace(up(queue, a.T))) == float(torch.trace(torch.tensor(a.T)))


def test_diagonals_pass_gradcheck(queue, rng):
    x = leaf(queue, rng.standard_normal((2, 3, 4)))
    assert tp.gradcheck(lambda v: tp.diagonal(v, -1, 2, 1), [x])
    assert tp.gradcheck(lambda v: tp.diag(v, -2), [leaf(queue, [1.0, -2.0, 3.0])])
    assert tp.gradcheck(lambda v: tp.trace(v * v), [leaf(queue, rng.standard_normal((3, 2)))])


def test_diagonals_refuse_what_they_cannot_give_naming_the_shapes(queue):
    x = leaf(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"diagonal: offset 3 leaves no elements in dims 0 "
                                          r"and 1 of shape \(2, 3\)"):
        tp.diagonal(x, 3)
    with pytest.raises(ShapeError, match="diagonal: dim1 and dim2 are both dim 1"):
        tp.diagonal(x, 0, 1, -1)
    with pytest.raises(ShapeError, match=r"diagonal: expects a tensor of at least 2 dims"):
        tp.diagonal(leaf(queue, [1.0]))
    with pytest.raises(ShapeError, match=r"diag: expects a 1-D or 2-D tensor, got shape "
                                          r"\(1, 2, 3\)"):
        tp.diag(leaf(queue, np.ones((1, 2, 3))))
    with pytest.raises(ShapeError, match=r"trace: expects a 2-D tensor, got shape \(3,\)"):
        tp.trace(leaf(queue, [1.0, 2.0, 3.0]))
    with pytest.raises(ShapeError, match="the diagonal offset must be an int"):
        tp.diag(x, 0.5)


@pytest.mark.parametrize("dims, a_shape, b_shape", [
    (2, (2, 3, 4), (3, 4, 5)), (1, (2, 3, 4), (4, 3, 5)), (0, (2, 3), (4,)),
    (([1, 2], [0, 1]), (2, 3, 4), (3, 4, 5)), (([2, 1], [1, 0]), (2, 3, 4), (3, 4, 5)),
    (([0], [2]), (5, 3, 4), (3, 4, 5)), ([[1], [0]], (2, 3, 4), (3, 5))])
def test_tensordot_matches_pytorch_value_and_gradient(queue, rng, dims, a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    out, grads, want, want_grads = _against_torch(
        queue, lambda u, v: tp.tensordot(u, v, dims), lambda s, t: torch.tensordot(s, t, dims),
        [a, b], rng)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-5, atol=1e-5)
    for got, w in zip(grads, want_grads):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_tensordot_contracts_everything_to_0d_and_passes_gradcheck(queue, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    x, y = leaf(queue, a), leaf(queue, a * 2)
    full = tp.tensordot(x, y, 2)
    assert full.shape == () and np.isclose(float(full), float((a * a * 2).sum()), rtol=1e-5)
    assert tp.gradcheck(lambda u, v: tp.tensordot(u, v, ([0], [0])), [x, y])
    assert tp.tensordot(x, y, 0).shape == (2, 3, 2, 3)


def test_tensordot_refuses_mismatched_dims_naming_the_shapes(queue):
    x, y = leaf(queue, np.ones((2, 3))), leaf(queue, np.ones((2, 4)))
    with pytest.raises(ShapeError, match=r"tensordot: dim 1 of a \(2, 3\) has size 3 but dim 0 "
                                          r"of b \(2, 4\) has size 2"):
        tp.tensordot(x, y, 1)
    with pytest.raises(ShapeError, match=r"dims=3 must be in \[0, 2\]"):
        tp.tensordot(x, y, 3)
    with pytest.raises(ShapeError, match=r"1 dims of a \(2, 3\) against 2 of b"):
        tp.tensordot(x, y, ([0], [0, 1]))
    with pytest.raises(ShapeError, match="name a dim of .* twice"):
        tp.tensordot(x, x, ([0, 0], [0, 1]))
    with pytest.raises(ShapeError, match="tensordot: dim 2 is out of range"):
        tp.tensordot(x, y, ([2], [0]))
    with pytest.raises(TypeError, match="tensordot: expected tp.Node or pc.Tensor operands"):
        tp.tensordot(x, 2.0, 0)


def test_a_captured_step_through_the_new_ops_replays_its_eager_bits(queue, rng):
    w = leaf(queue, rng.uniform(0.5, 1.5, (3, 4)))

    def step(x):
        with tp.Tape() as tape:
            h = tp.tensor(x) * w
            h = tp.cumprod(h, 1) + tp.repeat_interleave(tp.diff(h, 1, 0), [2, 1], 0)
            h = tp.tensordot(tp.diag(tp.diagonal(h, 1)), h, 1) % 0.7 + tp.hypot(h, h)
            loss = tp.trace(h[:, :3]) + tp.sum(tp.var_mean(h, 0)[0])
        tape.backward(loss)
        return loss.value

    assert_replays_eager(queue, step, w, [rng.standard_normal((3, 4)).astype(np.float32)
                                          for _ in range(3)])


def test_tensordot_over_a_slice_with_no_elements_gives_pytorchs_zeros(queue):
    """A contracted dim of size 0 (``x[:, 4:]`` of a (3, 4) ``x``) made the rows of the
    reshaped matrix 0 and their division a ZeroDivisionError, where PyTorch's sum of no
    products is 0 and the gradient zero."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = tp.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        full = tp.tensordot(x[:, 4:], x[:, 4:], ([0, 1], [0, 1]))    # (3, 0) . (3, 0)
        rows = tp.tensordot(x[:, 4:], x[:, 4:], ([1], [1]))          # (3, 3) of nothing
        cols = tp.tensordot(x[2:2], x[2:2], ([0], [0]))              # (0, 4): (4, 4)
        loss = tp.sum(full) + tp.sum(rows) + tp.sum(cols)
    tape.backward(loss)
    xt = torch.tensor(a)
    assert float(full) == float(torch.tensordot(xt[:, 4:], xt[:, 4:], ([0, 1], [0, 1])))
    np.testing.assert_array_equal(rows.to_host(), np.zeros((3, 3)))
    np.testing.assert_array_equal(cols.to_host(), torch.tensordot(xt[2:2], xt[2:2],
                                                                  ([0], [0])).numpy())
    np.testing.assert_array_equal(x.grad.to_host(), np.zeros((3, 4)))
