"""Vector and matrix products and distances (dot, vdot, inner, mv, addmv, addr, addbmm, kron,
cross, cdist, dist): values and gradients against torch in float64, finite differences, the
method forms, concrete values, and the errors naming the op and the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from torch_reference import float64_reference
from parcl.errors import ParclError, ShapeError


def _against_torch(queue, fn, tfn, arrays, rng):
    """Our value and gradients of ``fn`` at ``arrays`` for a random upstream gradient, and
    torch's in float64."""
    return float64_reference(queue, rng, fn, tfn, arrays)


def _check(queue, rng, fn, tfn, shapes, tol=1e-5, eps=1e-3):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out, grads, want, want_grads = _against_torch(queue, fn, tfn, arrays, rng)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.to_host(), want, rtol=tol, atol=tol)
    for got, w in zip(grads, want_grads):
        np.testing.assert_allclose(got, w, rtol=tol, atol=tol)
    assert tp.gradcheck(fn, [leaf(queue, a) for a in arrays], eps=eps)


CASES = {
    "dot": (tp.dot, torch.dot, [(5,), (5,)]),
    "vdot": (tp.vdot, torch.vdot, [(4,), (4,)]),
    "inner_matrices": (tp.inner, torch.inner, [(2, 3, 4), (5, 4)]),
    "inner_0d": (tp.inner, torch.inner, [(), (2, 3)]),
    "mv": (tp.mv, torch.mv, [(3, 4), (4,)]),
    "addmv": (lambda i, m, v: tp.addmv(i, m, v, beta=0.5, alpha=-2),
              lambda i, m, v: torch.addmv(i, m, v, beta=0.5, alpha=-2), [(1,), (3, 4), (4,)]),
    "addr": (lambda i, a, b: tp.addr(i, a, b, alpha=3),
             lambda i, a, b: torch.addr(i, a, b, alpha=3), [(3, 1), (3,), (2,)]),
    "addbmm": (lambda i, a, b: tp.addbmm(i, a, b, beta=2, alpha=0.5),
               lambda i, a, b: torch.addbmm(i, a, b, beta=2, alpha=0.5),
               [(3, 2), (4, 3, 5), (4, 5, 2)]),
    "kron_2d": (tp.kron, torch.kron, [(2, 3), (3, 2)]),
    "kron_mixed_dims": (tp.kron, torch.kron, [(2,), (2, 3, 2)]),
    "cross_last": (tp.cross, lambda a, b: torch.linalg.cross(a, b), [(4, 3), (4, 3)]),
    "cross_dim0_broadcast": (lambda a, b: tp.cross(a, b, dim=0),
                             lambda a, b: torch.linalg.cross(a, b, dim=0), [(3, 2), (3, 1)]),
    "cdist_p2": (tp.cdist, torch.cdist, [(2, 4, 3), (2, 5, 3)]),
    "cdist_p1_broadcast": (lambda a, b: tp.cdist(a, b, 1.0),
                           lambda a, b: torch.cdist(a, b, 1.0), [(1, 4, 3), (2, 5, 3)]),
    "cdist_p3": (lambda a, b: tp.cdist(a, b, 3.0), lambda a, b: torch.cdist(a, b, 3.0),
                 [(4, 2), (3, 2)]),
    "cdist_pinf_broadcast": (lambda a, b: tp.cdist(a, b, float("inf")),
                             lambda a, b: torch.cdist(a, b, float("inf")),
                             [(2, 1, 4, 3), (3, 5, 3)]),
    "dist_p2": (tp.dist, torch.dist, [(3, 4), (4,)]),
    "dist_p_half": (lambda a, b: tp.dist(a, b, 0.5), lambda a, b: torch.dist(a, b, 0.5),
                    [(6,), (6,)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_products_value_and_gradient_hold_as_pytorch(queue, rng, case):
    fn, tfn, shapes = CASES[case]
    _check(queue, rng, fn, tfn, shapes)


def test_products_give_concrete_values_as_pytorch(queue):
    a, e = leaf(queue, [1.0, 2.0, 3.0]), leaf(queue, [0.0, 0.0, 1.0])
    assert float(tp.dot(a, a)) == 14.0 and float(a.dot(e)) == 3.0 and float(a.vdot(a)) == 14
    np.testing.assert_array_equal(tp.cross(a, e).to_host(), [2, -1, 0])
    np.testing.assert_array_equal(a.cross(e).to_host(), [2, -1, 0])
    m = leaf(queue, [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    np.testing.assert_array_equal(m.mv(a).to_host(), [1, 4])
    np.testing.assert_array_equal(tp.inner(m, a).to_host(), [1, 4])
    np.testing.assert_array_equal(tp.kron(leaf(queue, [[1.0, 2.0]]), leaf(queue, np.eye(2)))
                                  .to_host(), [[1, 0, 2, 0], [0, 1, 0, 2]])
    np.testing.assert_array_equal(tp.cdist(leaf(queue, [[0.0, 0.0]]),
                                           leaf(queue, [[3.0, 4.0], [1.0, 0.0]])).to_host(),
                                  [[5, 1]])
    assert float(tp.dist(a, e, float("inf"))) == 2.0 and float(a.dist(e, 1)) == 5.0
    np.testing.assert_array_equal(a.addr(a, e, beta=0).to_host(), np.outer([1, 2, 3], [0, 0, 1]))


@pytest.mark.parametrize("mode", [None, "use_mm_for_euclid_dist",
                                  "donot_use_mm_for_euclid_dist"])
def test_cdist_by_gemm_or_directly_holds_as_pytorch(queue, rng, mode):
    # more than 25 rows: PyTorch's default takes the GEMM route for p=2, and so does parcl's;
    # its float32 cancellation (|a|^2 + |b|^2 - 2 a.b) is ~1e-6, so finite differences
    # need a wider step than 1e-3 to rise above it
    tmode = mode or "use_mm_for_euclid_dist_if_necessary"
    _check(queue, rng, lambda a, b: tp.cdist(a, b, compute_mode=mode),
           lambda a, b: torch.cdist(a, b, compute_mode=tmode), [(2, 30, 4), (1, 27, 4)],
           tol=1e-4, eps=1e-2)


@pytest.mark.parametrize("rows", [2, 30])
def test_cdist_of_coinciding_rows_has_gradient_zero_as_pytorch(queue, rows):
    a = np.tile([[1.0, 2.0]], (rows, 1))
    a[1:, 1] = np.arange(1, rows)          # row 0 and the other operand's row 0 coincide
    x = leaf(queue, a)
    with tp.Tape() as tape:
        d = tp.cdist(x, leaf(queue, a[:1]))
        total = tp.sum(d)
    tape.backward(total)
    want = torch.cdist(torch.tensor(a), torch.tensor(a[:1]))
    np.testing.assert_allclose(d.to_host(), want.numpy(), rtol=1e-6)
    assert d.to_host()[0, 0] == 0.0
    np.testing.assert_array_equal(x.grad.to_host()[0], [0, 0])


def test_cdist_inf_norm_gives_every_tied_element_the_whole_gradient_as_pytorch(queue):
    # PyTorch's cdist sends g * sign(a - b) to each element at the largest |a - b|, where the
    # inf-norm of linalg_vector_norm (and torch.dist) shares it among the ties: parcl's cdist
    # shared it, x.grad [[0, -1.5, 0.5], [-1/3] * 3] where PyTorch gives [[0, -2, 1], [-1] * 3]
    x = leaf(queue, [[1.0, -2.0, 2.0], [0.0, 0.0, 0.0]])
    y = leaf(queue, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    with tp.Tape() as tape:
        d = tp.cdist(x, y, float("inf"))
    tape.backward(d, grad=up(queue, np.ones((2, 2))))
    tx, ty = (torch.tensor(v.value.to_host(), requires_grad=True) for v in (x, y))
    want = torch.cdist(tx, ty, float("inf"))
    want.backward(torch.ones(2, 2))
    np.testing.assert_array_equal(d.to_host(), [[2, 3], [0, 1]])
    np.testing.assert_array_equal(x.grad.to_host(), [[0, -2, 1], [-1, -1, -1]])
    np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())
    np.testing.assert_array_equal(y.grad.to_host(), ty.grad.numpy())
    assert d.op_name == "cdist"


def test_addmv_with_beta_zero_ignores_a_nan_input_as_pytorch(queue):
    inp = leaf(queue, [np.nan, 1.0])
    out = tp.addmv(inp, leaf(queue, np.eye(2)), leaf(queue, [3.0, 4.0]), beta=0)
    np.testing.assert_array_equal(out.to_host(), [3, 4])


def test_products_refuse_shapes_that_do_not_fit_naming_them(queue):
    v3, v2, m = leaf(queue, np.ones(3)), leaf(queue, np.ones(2)), leaf(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"dot: expected two 1-D tensors of one length, got "
                                          r"\(3,\) and \(2,\)"):
        tp.dot(v3, v2)
    with pytest.raises(ShapeError, match=r"mv: expected mat \(n, m\) and vec \(m,\), got mat "
                                          r"\(2, 3\) and vec \(2,\)"):
        tp.mv(m, v2)
    with pytest.raises(ShapeError, match=r"inner: the last dims of input \(2, 3\) and other "
                                          r"\(2,\) must match"):
        tp.inner(m, v2)
    with pytest.raises(ShapeError, match=r"addbmm: batch1 \(2, 3\)"):
        tp.addbmm(m, m, m)
    with pytest.raises(ShapeError, match=r"addr: input \(1, 2, 3\) does not broadcast to the "
                                          r"product's shape \(2, 3\)"):
        tp.addr(leaf(queue, np.ones((1, 2, 3))), v2, v3)
    with pytest.raises(ShapeError, match=r"cross: dim -1 must have size 3 in both inputs, got "
                                          r"input \(2, 3\) and other \(2, 2\)"):
        tp.cross(m, leaf(queue, np.ones((2, 2))))
    with pytest.raises(ShapeError, match=r"cdist: expected x1 \(\*, P, M\) and x2 \(\*, R, M\) "
                                          r"with the same M, got x1 \(2, 3\) and x2 \(3,\)"):
        tp.cdist(m, v3)
    with pytest.raises(ShapeError, match="cdist: p must be non-negative, got -1.0"):
        tp.cdist(m, m, -1)
    with pytest.raises(ParclError, match="cdist: compute_mode must be one of"):
        tp.cdist(m, m, compute_mode="mm")
    with pytest.raises(ShapeError, match=r"dist: shapes \(2, 3\) and \(2,\) are not "
                                          r"broadcastable"):
        tp.dist(m, v2)


def test_a_captured_step_through_the_products_replays_its_eager_bits(queue, rng):
    from conftest import assert_replays_eager
    w = leaf(queue, rng.uniform(0.5, 1.5, (30, 3)))

    def step(x):
        with tp.Tape() as tape:
            h = tp.tensor(x) * w                                    # (30, 3)
            d = tp.cdist(h, w) + tp.cdist(h[:4], w[:5], 1.0).sum()  # GEMM and direct
            c = tp.cross(h, w) + tp.sum(tp.kron(h[:2, :1], w[:1]))
            loss = tp.sum(d) + tp.sum(c) + tp.dot(h[:, 0], w[:, 1]) + tp.dist(h, w)
            loss = loss + tp.sum(tp.addbmm(w[:3], tp.reshape(h, (10, 3, 3)),
                                           tp.reshape(w, (10, 3, 3))))
        tape.backward(loss)
        return loss.value

    assert_replays_eager(queue, step, w, [rng.standard_normal((30, 3)).astype(np.float32)
                                          for _ in range(3)])
