"""tp.linalg and the top-level linear algebra ops (det, slogdet, logdet, inverse, solve,
cholesky, cholesky_ex, cholesky_solve, solve_triangular, lu_factor, matrix_power, the norms):
values and gradients against torch in float64, finite differences on well-conditioned
matrices, singular and indefinite matrices as PyTorch treats them, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from torch_reference import check_float64
from parcl.errors import DTypeError, LinAlgError, ParclError, ShapeError
from parcl.kernels._cache import trace_launches
from parcl.tape import linalg


def _well_conditioned(rng, *shape):
    """Random matrices with a dominant diagonal: far from singular, so float32 finite
    differences (eps 1e-2) are accurate."""
    n = shape[-1]
    return (rng.standard_normal(shape) + 2 * n ** 0.5 * np.eye(n)).astype(np.float32)


def _spd(rng, *shape):
    m = rng.standard_normal(shape)
    return (m @ np.swapaxes(m, -1, -2) + shape[-1] * np.eye(shape[-1])).astype(np.float32)


def _against_torch(queue, rng, fn, tfn, arrays, tol=1e-4):
    """``fn``'s value and gradients at ``arrays`` for a random upstream gradient equal
    torch's in float64."""
    check_float64(queue, rng, fn, tfn, arrays, tol)


def _gradcheck(queue, fn, arrays):
    assert tp.gradcheck(fn, [leaf(queue, a) for a in arrays], eps=1e-2, atol=1e-2, rtol=1e-2)


def test_det_slogdet_and_logdet_and_their_gradients_are_pytorchs(queue, rng):
    a = _well_conditioned(rng, 2, 3, 4, 4)
    _against_torch(queue, rng, tp.det, torch.linalg.det, [a], tol=1e-3)
    _against_torch(queue, rng, lambda x: tp.slogdet(x).logabsdet,
                   lambda x: torch.linalg.slogdet(x).logabsdet, [a])
    _against_torch(queue, rng, tp.logdet, torch.logdet, [a])
    _gradcheck(queue, tp.det, [a[0, 0]])
    _gradcheck(queue, lambda x: tp.slogdet(x)[1], [a[0]])
    sign, logabs = tp.slogdet(tp.tensor(a))
    want = torch.linalg.slogdet(torch.tensor(a, dtype=torch.float64))
    np.testing.assert_array_equal(sign.to_host(), want.sign.numpy())
    assert float(tp.det(tp.tensor(np.array([[1.0, 3.0], [2.0, 4.0]])))) == -2.0
    x = tp.tensor(np.array([[2.0, 1.0], [1.0, 3.0]]))
    assert float(x.det()) == 5.0 and np.isclose(float(x.logdet()), np.log(5.0))


def test_singular_matrices_have_det_zero_slogdet_minus_inf_as_pytorch(queue):
    m = np.array([[[1.0, 2.0], [2.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]],
                  [[0.0, 1.0], [1.0, 0.0]]], np.float32)
    np.testing.assert_array_equal(tp.det(tp.tensor(m)).to_host(), [0.0, 0.0, -1.0])
    sign, logabs = tp.slogdet(tp.tensor(m))
    np.testing.assert_array_equal(sign.to_host(), [0.0, 0.0, -1.0])
    np.testing.assert_array_equal(logabs.to_host(), [-np.inf, -np.inf, 0.0])
    # logdet: -inf where det is 0, NaN where it is negative (torch.logdet's)
    np.testing.assert_array_equal(tp.logdet(tp.tensor(m)).to_host(),
                                  torch.logdet(torch.tensor(m)).numpy())


def test_the_gradient_of_det_at_a_singular_matrix_is_its_adjugates_transpose(queue):
    # the cofactor matrix (d det / dA): nonzero at a matrix of rank n - 1 (PyTorch 2.13 in
    # float64 returns zeros for these two)
    m = np.float32([[[1, 2], [2, 4]], [[0, 0], [0, 0]], [[2, 1], [1, 3]]])
    x = tp.tensor(m, requires_grad=True)
    with tp.Tape() as tape:
        d = tp.sum(tp.det(x))
    tape.backward(d)
    np.testing.assert_allclose(x.grad.to_host(), [[[4, -2], [-2, 1]], [[0, 0], [0, 0]],
                                                  [[3, -1], [-1, 2]]], atol=1e-5)
    y = tp.tensor(np.float32([[1, 2, 3], [4, 5, 6], [2, 4, 6]]), requires_grad=True)
    with tp.Tape() as tape:
        d = tp.det(y)
    tape.backward(d)
    np.testing.assert_allclose(y.grad.to_host(), [[6, -12, 6], [0, 0, 0], [-3, 6, -3]],
                               atol=1e-4)
    with tp.Tape() as tape:
        logabs = tp.slogdet(x).logabsdet
    with pytest.raises(LinAlgError, match=r"slogdet: the input \(3, 2, 2\) is singular "
                                          r"\(matrix \(0,\) of the batch\).*adjugate"):
        tape.backward(tp.sum(logabs))


def test_inverse_and_solve_and_their_gradients_are_pytorchs(queue, rng):
    a = _well_conditioned(rng, 3, 5, 5)
    _against_torch(queue, rng, tp.inverse, torch.linalg.inv, [a])
    _against_torch(queue, rng, linalg.inv, torch.inverse, [a])
    b = rng.standard_normal((2, 1, 5, 3)).astype(np.float32)       # batch dims broadcast
    _against_torch(queue, rng, linalg.solve, torch.linalg.solve, [a, b])
    v = rng.standard_normal((3, 5)).astype(np.float32)             # a batch of vectors
    _against_torch(queue, rng, linalg.solve, torch.linalg.solve, [a, v])
    _against_torch(queue, rng, linalg.solve, torch.linalg.solve, [a[0], v[0]])
    right = rng.standard_normal((3, 4, 5)).astype(np.float32)      # X A = B
    _against_torch(queue, rng, lambda p, q: linalg.solve(p, q, left=False),
                   lambda p, q: torch.linalg.solve(p, q, left=False), [a, right])
    _gradcheck(queue, linalg.solve, [a[0, :3, :3], b[0, 0, :3]])
    _gradcheck(queue, tp.inverse, [a[1, :3, :3]])
    np.testing.assert_allclose(
        tp.tensor(np.array([[2.0, 0.0], [0.0, 4.0]])).inverse().to_host(),
        [[0.5, 0.0], [0.0, 0.25]])


def test_inverse_and_solve_of_a_singular_matrix_raise_linalg_error_naming_the_matrix(queue):
    m = np.stack([np.eye(3), [[1, 2, 3], [2, 4, 6], [0, 0, 1]]]).astype(np.float32)
    with pytest.raises(LinAlgError, match=r"linalg.inv: the input \(2, 3, 3\) is singular "
                                          r"\(matrix \(1,\) of the batch\): the pivot of "
                                          "column 1 is zero"):
        tp.inverse(tp.tensor(m))
    x = tp.tensor(m, requires_grad=True)
    with tp.Tape() as tape:                      # recorded: raised at the first host read
        y = linalg.solve(x, tp.tensor(np.ones((2, 3, 1))))
    with pytest.raises(LinAlgError, match="linalg.solve: the input"):
        y.to_host()
    with pytest.raises(LinAlgError):
        tape.backward(tp.sum(y))
    assert issubclass(LinAlgError, RuntimeError) and pc.LinAlgError is LinAlgError


def test_cholesky_lower_and_upper_and_its_gradient_are_pytorchs(queue, rng):
    a = _spd(rng, 2, 5, 5)
    _against_torch(queue, rng, linalg.cholesky, torch.linalg.cholesky, [a])
    _against_torch(queue, rng, lambda x: linalg.cholesky(x, upper=True),
                   lambda x: torch.linalg.cholesky(x, upper=True), [a])
    # through a symmetric input, as PyTorch's own gradcheck of cholesky
    _gradcheck(queue, lambda x: linalg.cholesky(x + tp.transpose(x, (1, 0))), [a[0] / 2])
    _gradcheck(queue, lambda x: linalg.cholesky(x + tp.transpose(x, (1, 0)), upper=True),
               [a[1, :4, :4] / 2])
    np.testing.assert_array_equal(
        linalg.cholesky(tp.tensor(np.array([[4.0, 2.0], [2.0, 5.0]]))).to_host(),
        [[2.0, 0.0], [1.0, 2.0]])


def test_cholesky_of_an_indefinite_matrix_raises_and_cholesky_ex_reports_info_as_pytorch(
        queue):
    m = np.stack([np.eye(3), np.diag([1.0, 1.0, -1.0]), [[1, 2, 0], [2, 1, 0], [0, 0, 1]]])
    m = m.astype(np.float32)
    with pytest.raises(LinAlgError, match=r"linalg.cholesky: the input \(3, 3, 3\) is not "
                                          r"positive-definite \(matrix \(1,\) of the batch\): "
                                          "its leading minor of order 3"):
        linalg.cholesky(tp.tensor(m))
    L, info = linalg.cholesky_ex(tp.tensor(m))
    np.testing.assert_array_equal(info.to_host(), [0, 3, 2])
    np.testing.assert_array_equal(info.to_host(),
                                  torch.linalg.cholesky_ex(torch.tensor(m)).info.numpy())
    assert info.dtype == np.int32 and L.shape == (3, 3, 3)
    np.testing.assert_array_equal(L.to_host()[0], np.eye(3))
    with pytest.raises(LinAlgError, match="cholesky_ex"):
        linalg.cholesky_ex(tp.tensor(m), check_errors=True)


def test_solve_triangular_in_every_form_and_its_gradient_are_pytorchs(queue, rng):
    a = _well_conditioned(rng, 2, 4, 4)
    b = rng.standard_normal((2, 4, 3)).astype(np.float32)
    bt = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for upper in (False, True):
        for unit in (False, True):
            def ours(x, y, upper=upper, unit=unit):
                return linalg.solve_triangular(x, y, upper=upper, unitriangular=unit)

            def theirs(x, y, upper=upper, unit=unit):
                return torch.linalg.solve_triangular(x, y, upper=upper, unitriangular=unit)
            _against_torch(queue, rng, ours, theirs, [a, b])

            def ours_right(x, y, upper=upper, unit=unit):
                return linalg.solve_triangular(x, y, upper=upper, left=False,
                                               unitriangular=unit)

            def theirs_right(x, y, upper=upper, unit=unit):
                return torch.linalg.solve_triangular(x, y, upper=upper, left=False,
                                                     unitriangular=unit)
            _against_torch(queue, rng, ours_right, theirs_right, [a, bt])
    _gradcheck(queue, lambda x, y: linalg.solve_triangular(x, y, upper=True), [a[0], b[0]])


def test_cholesky_solve_is_pytorchs(queue, rng):
    a = _spd(rng, 2, 4, 4)
    L = np.linalg.cholesky(a.astype(np.float64)).astype(np.float32)
    b = rng.standard_normal((2, 4, 2)).astype(np.float32)
    _against_torch(queue, rng, tp.cholesky_solve, torch.cholesky_solve, [b, L])
    U = np.swapaxes(L, -1, -2).copy()
    _against_torch(queue, rng, lambda x, y: tp.cholesky_solve(x, y, upper=True),
                   lambda x, y: torch.cholesky_solve(x, y, upper=True), [b, U])
    np.testing.assert_allclose(tp.tensor(b).cholesky_solve(tp.tensor(L)).to_host(),
                               np.linalg.solve(a.astype(np.float64), b), rtol=1e-4, atol=1e-5)


def test_lu_factor_gives_pytorchs_factors_and_pivots(queue, rng):
    a = rng.standard_normal((3, 5, 5)).astype(np.float32)
    LU, pivots = linalg.lu_factor(tp.tensor(a))
    want = torch.linalg.lu_factor(torch.tensor(a, dtype=torch.float64))
    np.testing.assert_allclose(LU.to_host(), want.LU.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(pivots.to_host(), want.pivots.numpy())
    assert pivots.dtype == np.int32
    np.testing.assert_array_equal(
        linalg.lu_factor(tp.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))).pivots.to_host(),
        [2, 2])
    with pytest.raises(ParclError, match="lu_factor.*requires grad.*detach"):
        linalg.lu_factor(tp.tensor(a, requires_grad=True))


@pytest.mark.parametrize("solver", ["solve", "solve_ex", "solve_triangular", "cholesky_solve",
                                    "lu_solve"])
def test_a_solve_with_an_integer_b_is_refused_as_pytorch(queue, solver):
    # its buffer was read as floats: solve([[2, 0], [0, 4]], int64 [2, 4]) was [1, 4] (int64)
    a = np.float32([[2, 0], [0, 4]])
    b = np.array([[2], [4]])
    with pytest.raises(RuntimeError, match="Expected A and B to have the same dtype"):
        torch.linalg.solve(torch.tensor(a), torch.tensor(b))
    A, B = tp.tensor(a), tp.tensor(b)
    run = {"solve": lambda: linalg.solve(A, B), "solve_ex": lambda: linalg.solve_ex(A, B),
           "solve_triangular": lambda: linalg.solve_triangular(A, B, upper=True),
           "cholesky_solve": lambda: tp.cholesky_solve(B, A),
           "lu_solve": lambda: linalg.lu_solve(*linalg.lu_factor(A), B)}[solver]
    with pytest.raises(DTypeError, match=r"B \(2, 1\) has dtype int64, expected float32"):
        run()
    np.testing.assert_allclose(linalg.solve(A, tp.tensor(b.astype(np.float32))).to_host(),
                               [[1], [1]])


def test_lu_factor_of_a_singular_matrix_is_refused_and_lu_factor_ex_gives_info_as_pytorch(
        queue):
    # parcl's lu_factor gave the factors silently, and lu_solve with them inf
    a = np.float32([[[2, 0], [0, 1]], [[1, 2], [2, 4]]])
    with pytest.raises(RuntimeError, match="U\\[2,2\\] is zero"):
        torch.linalg.lu_factor(torch.tensor(a))
    with pytest.raises(LinAlgError, match=r"linalg.lu_factor: the input \(2, 2, 2\) is "
                                          r"singular \(matrix \(1,\) of the batch\): U\[2,2\]"):
        linalg.lu_factor(tp.tensor(a))
    want = torch.linalg.lu_factor_ex(torch.tensor(a, dtype=torch.float64))
    got = linalg.lu_factor_ex(tp.tensor(a))
    np.testing.assert_allclose(got.LU.to_host(), want.LU.numpy())
    np.testing.assert_array_equal(got.pivots.to_host(), want.pivots.numpy())
    np.testing.assert_array_equal(got.info.to_host(), want.info.numpy())       # [0, 2]
    with pytest.raises(LinAlgError, match="linalg.lu_factor_ex: the input"):
        linalg.lu_factor_ex(tp.tensor(a), check_errors=True)
    P, L, U = linalg.lu(tp.tensor(a))                  # as torch.linalg.lu: no error
    np.testing.assert_allclose(U.to_host(), torch.linalg.lu(torch.tensor(a)).U.numpy())


@pytest.mark.parametrize("n", [0, 1, 3, -2])
def test_matrix_power_and_its_gradient_are_pytorchs(queue, rng, n):
    a = _well_conditioned(rng, 2, 3, 3) / 3
    _against_torch(queue, rng, lambda x: tp.matrix_power(x, n),
                   lambda x: torch.linalg.matrix_power(x, n), [a])
    assert linalg.matrix_power is tp.matrix_power


def test_matrix_power_of_a_matrix_is_repeated_products(queue):
    x = tp.tensor(np.array([[1.0, 1.0], [0.0, 1.0]]))
    np.testing.assert_array_equal(x.matrix_power(3).to_host(), [[1, 3], [0, 1]])
    np.testing.assert_array_equal(tp.matrix_power(x, -1).to_host(), [[1, -1], [0, 1]])


@pytest.mark.parametrize("ord_", ["fro", 1, -1, float("inf"), float("-inf")])
@pytest.mark.parametrize("dim,keepdim", [((-2, -1), False), ((0, 2), True), ((2, 0), False)])
def test_matrix_norm_and_its_gradient_are_pytorchs(queue, rng, ord_, dim, keepdim):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    _against_torch(queue, rng, lambda x: linalg.matrix_norm(x, ord_, dim, keepdim),
                   lambda x: torch.linalg.matrix_norm(x, ord_, dim, keepdim), [a])


@pytest.mark.parametrize("ord_,dim", [(None, None), (None, 1), (3, 1), (None, (0, 1)),
                                      (1, (1, 0)), ("fro", (0, 1)), (float("inf"), -1)])
def test_norm_dispatches_as_pytorchs(queue, rng, ord_, dim):
    a = rng.standard_normal((3, 4, 2)).astype(np.float32)
    _against_torch(queue, rng, lambda x: linalg.norm(x, ord_, dim),
                   lambda x: torch.linalg.norm(x, ord_, dim), [a])
    m = a[0]
    _against_torch(queue, rng, lambda x: linalg.norm(x, 1), lambda x: torch.linalg.norm(x, 1),
                   [m])
    _against_torch(queue, rng, lambda x: linalg.vector_norm(x, 3),
                   lambda x: torch.linalg.vector_norm(x, 3), [a])
    assert float(linalg.norm(tp.tensor(np.array([[1.0, -2.0], [3.0, 4.0]])), 1)) == 6.0


def test_cross_is_the_tp_op():
    assert linalg.cross is tp.cross and linalg.vector_norm is tp.linalg_vector_norm


def test_bad_inputs_raise_errors_naming_the_op_and_shapes(queue):
    with pytest.raises(ShapeError, match=r"linalg.inv: expected square matrices .* \(2, 3\)"):
        tp.inverse(tp.tensor(np.ones((2, 3))))
    with pytest.raises(ShapeError, match=r"det: matrices of size 129 x 129 .* 1 to 128"):
        tp.det(tp.tensor(np.ones((129, 129))))
    with pytest.raises(DTypeError, match="det: input .* int32"):
        tp.det(pc.Tensor.from_host(queue, np.ones((2, 2), np.int32)))
    with pytest.raises(ShapeError, match=r"linalg.solve: B \(4, 1\) does not fit A \(3, 3\)"):
        linalg.solve(tp.tensor(np.eye(3)), tp.tensor(np.ones((4, 1))))
    with pytest.raises(ShapeError, match="batch dims of A"):
        linalg.solve(tp.tensor(np.ones((2, 3, 3))), tp.tensor(np.ones((4, 3, 1))))
    with pytest.raises(ParclError, match="ord=3 is not supported"):
        linalg.matrix_norm(tp.tensor(np.eye(3)), 3)
    with pytest.raises(ParclError, match="ord='fro' is a matrix norm"):
        linalg.norm(tp.tensor(np.eye(3)), "fro", 0)
    with pytest.raises(ShapeError, match="must be 1-D or 2-D"):
        linalg.norm(tp.tensor(np.ones((2, 2, 2))), 1)
    with pytest.raises(ShapeError, match="n must be an int"):
        tp.matrix_power(tp.tensor(np.eye(2)), 1.5)


def test_results_are_the_same_bits_on_every_run(queue, rng):
    a = _well_conditioned(rng, 4, 16, 16)
    first = tp.inverse(tp.tensor(a)).to_host()
    for _ in range(3):
        np.testing.assert_array_equal(tp.inverse(tp.tensor(a)).to_host(), first)


# -- eigh and svd (Jacobi) -------------------------------------------------------------------
def _symmetric(rng, *shape):
    a = rng.standard_normal(shape)
    return (a + np.swapaxes(a, -1, -2)).astype(np.float32)


def _reconstructed(w, v):
    return tp.matmul(v * tp.unsqueeze(w, -2), tp.swapaxes(v, -1, -2))


def test_eigh_and_eigvalsh_and_their_gradients_are_pytorchs(queue, rng):
    s = _symmetric(rng, 2, 6, 6)
    _against_torch(queue, rng, linalg.eigvalsh, torch.linalg.eigvalsh, [s])
    # sign-independent functions of the eigenvectors, as PyTorch's gradients require
    _against_torch(queue, rng, lambda x: linalg.eigh(x).eigenvectors ** 2,
                   lambda x: torch.linalg.eigh(x).eigenvectors ** 2, [s])
    _against_torch(queue, rng, lambda x: _reconstructed(*linalg.eigh(x, "U")),
                   lambda x: (lambda w, v: (v * w.unsqueeze(-2)) @ v.mT)(
                       *torch.linalg.eigh(x, "U")), [s])
    _gradcheck(queue, lambda x: linalg.eigvalsh(x + tp.transpose(x, (1, 0))), [s[0] / 2])
    w, v = linalg.eigh(tp.tensor(s))
    np.testing.assert_allclose(w.to_host(), np.linalg.eigvalsh(s.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)
    vh = v.to_host()
    np.testing.assert_allclose(vh @ np.swapaxes(vh, -1, -2), np.broadcast_to(np.eye(6), s.shape),
                               atol=1e-5)
    np.testing.assert_array_equal(
        linalg.eigvalsh(tp.tensor(np.array([[2.0, 0.0], [0.0, 1.0]]))).to_host(), [1.0, 2.0])


@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6), (3, 3)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_and_its_gradients_are_pytorchs(queue, rng, shape, full):
    a = rng.standard_normal(shape).astype(np.float32)
    k = min(shape[-2:])
    _against_torch(queue, rng, linalg.svdvals, torch.linalg.svdvals, [a])
    _against_torch(queue, rng, lambda x: linalg.svd(x, full).S,
                   lambda x: torch.linalg.svd(x, full).S, [a])
    # sign-independent products of the singular vectors (the completed columns of a full
    # U or Vh are a basis of their own: compared through orthonormality below)
    _against_torch(queue, rng, lambda x: (lambda u, s, vh: tp.matmul(
                       u[..., :k] * tp.unsqueeze(s, -2), vh[..., :k, :]))(*linalg.svd(x, full)),
                   lambda x: (lambda u, s, vh: (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :])(
                       *torch.linalg.svd(x, full)), [a])
    _against_torch(queue, rng, lambda x: linalg.svd(x, full).U[..., :k] ** 2,
                   lambda x: torch.linalg.svd(x, full).U[..., :k] ** 2, [a])
    _against_torch(queue, rng, lambda x: linalg.svd(x, full).Vh[..., :k, :] ** 2,
                   lambda x: torch.linalg.svd(x, full).Vh[..., :k, :] ** 2, [a])
    u, s, vh = (t.to_host() for t in linalg.svd(tp.tensor(a), full))
    m, n = shape[-2:]
    assert u.shape[-2:] == (m, m if full else k) and vh.shape[-2:] == (n if full else k, n)
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, np.eye(u.shape[-1]) + 0 * u[..., :1, :1],
                               atol=1e-5)
    np.testing.assert_allclose(vh @ np.swapaxes(vh, -1, -2),
                               np.eye(vh.shape[-2]) + 0 * vh[..., :1, :1], atol=1e-5)


def test_svd_of_a_rank_deficient_matrix_completes_u_to_an_orthonormal_basis(queue):
    a = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]], np.float32)
    u, s, vh = (t.to_host() for t in linalg.svd(tp.tensor(a)))
    np.testing.assert_allclose(s, [2.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(u.T @ u, np.eye(3), atol=1e-6)
    np.testing.assert_allclose((u[:, :2] * s) @ vh, a, atol=1e-6)
    # a singular value of rounding size (1e-21 here): its column is noise, made orthogonal
    b = np.float32([[1, 2, 3], [4, 5, 6], [2, 4, 6]])
    u, s, vh = (t.to_host() for t in linalg.svd(tp.tensor(b)))
    np.testing.assert_allclose(u.T @ u, np.eye(3), atol=1e-6)
    np.testing.assert_allclose((u * s) @ vh, b, atol=1e-5)
    np.testing.assert_array_equal(
        linalg.svdvals(tp.tensor(np.array([[0.0, 2.0], [1.0, 0.0]]))).to_host(), [2.0, 1.0])


@pytest.mark.parametrize("ord_", [2, -2, "nuc"])
def test_spectral_and_nuclear_matrix_norms_are_pytorchs(queue, rng, ord_):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    _against_torch(queue, rng, lambda x: linalg.matrix_norm(x, ord_),
                   lambda x: torch.linalg.matrix_norm(x, ord_), [a])
    _against_torch(queue, rng, lambda x: linalg.matrix_norm(x, ord_, (0, 2), True),
                   lambda x: torch.linalg.matrix_norm(x, ord_, (0, 2), True), [a])
    _against_torch(queue, rng, lambda x: linalg.norm(x, ord_),
                   lambda x: torch.linalg.norm(x, ord_), [a[0]])


def test_decompositions_refuse_what_they_cannot_take(queue):
    with pytest.raises(ShapeError, match=r"linalg.svd: matrices of 2 x 129"):
        linalg.svd(tp.tensor(np.ones((2, 129))))
    with pytest.raises(ShapeError, match=r"linalg.eigh: expected square matrices"):
        linalg.eigh(tp.tensor(np.ones((2, 3))))
    with pytest.raises(ParclError, match="UPLO must be 'L' or 'U'"):
        linalg.eigvalsh(tp.tensor(np.eye(2)), "X")


# -- pinv, matrix_rank, cond, the _ex forms, lu_solve, multi_dot, cholesky_inverse -----------
@pytest.mark.parametrize("shape", [(2, 5, 3), (2, 3, 5), (4, 4)])
def test_pinv_and_its_gradient_are_pytorchs(queue, rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    if shape[-1] == shape[-2]:
        a = _well_conditioned(rng, *shape)
    _against_torch(queue, rng, linalg.pinv, torch.linalg.pinv, [a])
    s = _symmetric(rng, 3, 3)
    _against_torch(queue, rng, lambda x: linalg.pinv(x, hermitian=True),
                   lambda x: torch.linalg.pinv(x, hermitian=True), [s])
    _gradcheck(queue, linalg.pinv, [a[..., :3, :3] if a.ndim == 2 else a[0]])


def test_pinv_and_matrix_rank_drop_the_singular_values_below_pytorchs_threshold(queue):
    a = np.float32([[1, 0], [0, 1e-3]])
    np.testing.assert_allclose(linalg.pinv(tp.tensor(a), atol=0.01).to_host(),
                               [[1, 0], [0, 0]])
    np.testing.assert_allclose(linalg.pinv(tp.tensor(a), rtol=1e-4).to_host(),
                               [[1, 0], [0, 1000]], rtol=1e-5)
    rank = linalg.matrix_rank(tp.tensor(np.float32([[1, 2], [2, 4]])))
    assert rank.dtype == np.int64 and int(rank) == 1
    assert int(linalg.matrix_rank(tp.tensor(a), atol=0.01)) == 1
    assert int(linalg.matrix_rank(tp.tensor(a), hermitian=True)) == 2
    np.testing.assert_array_equal(
        linalg.matrix_rank(tp.tensor(np.zeros((2, 3, 3), np.float32))).to_host(), [0, 0])


@pytest.mark.parametrize("p", [None, 2, -2, "fro", "nuc", 1, float("inf")])
def test_cond_and_its_gradient_are_pytorchs(queue, rng, p):
    a = _well_conditioned(rng, 2, 4, 4)
    # torch's own cond backward fails for the norms of the inverse (an in-place op):
    # their product is what it computes
    ref = (lambda x: torch.linalg.cond(x, p)) if p in (None, 2, -2) else (
        lambda x: torch.linalg.matrix_norm(x, p) * torch.linalg.matrix_norm(torch.linalg.inv(x), p))
    _against_torch(queue, rng, lambda x: linalg.cond(x, p), ref, [a])
    assert float(linalg.cond(tp.tensor(np.float32([[2, 0], [0, 1]])))) == 2.0


@pytest.mark.parametrize("p", ["fro", "nuc", 1, -1, float("inf"), -float("inf")])
def test_cond_of_a_singular_matrix_is_inf_and_the_rest_of_its_batch_as_pytorch(queue, p):
    a = np.float32([[[1, 0], [0, 0]], [[2, 1], [1, 3]], [[0, 1], [0, 0]]])
    want = torch.linalg.cond(torch.tensor(a, dtype=torch.float64), p).numpy()
    got = linalg.cond(tp.tensor(a), p).to_host()
    assert np.isinf(want[0]) and np.isinf(want[2])
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_inv_ex_and_solve_ex_report_info_and_are_pytorchs(queue, rng):
    a = _well_conditioned(rng, 2, 4, 4)
    b = rng.standard_normal((3, 2, 4, 2)).astype(np.float32)
    _against_torch(queue, rng, lambda x: linalg.inv_ex(x).inverse,
                   lambda x: torch.linalg.inv_ex(x).inverse, [a])
    _against_torch(queue, rng, lambda x, y: linalg.solve_ex(x, y).result,
                   lambda x, y: torch.linalg.solve_ex(x, y).result, [a, b])
    _against_torch(queue, rng, lambda x, y: linalg.solve_ex(x, y, left=False).result,
                   lambda x, y: torch.linalg.solve_ex(x, y, left=False).result,
                   [a, np.swapaxes(b, -1, -2).copy()])
    singular = np.float32([[1, 2], [2, 4]])
    inverse, info = linalg.inv_ex(tp.tensor(singular))         # no error: info says it
    assert info.dtype == np.int32 and int(info) == 2
    assert int(torch.linalg.inv_ex(torch.tensor(singular)).info) == 2
    assert not np.isfinite(inverse.to_host()).all()
    assert int(linalg.solve_ex(tp.tensor(singular), tp.tensor(np.float32([1, 1]))).info) == 2
    with pytest.raises(LinAlgError, match="linalg.inv_ex: the input"):
        linalg.inv_ex(tp.tensor(singular), check_errors=True)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve_with_lu_factors_is_pytorchs(queue, rng, left, adjoint):
    a = _well_conditioned(rng, 2, 4, 4)
    LU, pivots = linalg.lu_factor(tp.tensor(a))
    tLU, tpivots = torch.linalg.lu_factor(torch.tensor(a, dtype=torch.float64))
    b = rng.standard_normal((2, 4, 3) if left else (2, 3, 4)).astype(np.float32)
    _against_torch(queue, rng,
                   lambda y: linalg.lu_solve(LU, pivots, y, left=left, adjoint=adjoint),
                   lambda y: torch.linalg.lu_solve(tLU, tpivots, y, left=left, adjoint=adjoint),
                   [b])


@pytest.mark.parametrize("lu_batch,b_shape", [((1,), (3, 4, 2)), ((2, 1), (3, 4, 2)),
                                               ((3,), (4, 2)), ((1,), (4, 2))])
@pytest.mark.parametrize("left", [True, False])
def test_lu_solve_broadcasts_the_factors_over_bs_batch_as_pytorch(queue, rng, lu_batch,
                                                                   b_shape, left):
    # parcl refused factors with fewer batch dims than B ("broadcasting the factors is not
    # supported"); PyTorch broadcasts both
    a = _well_conditioned(rng, *lu_batch, 4, 4)
    LU, pivots = linalg.lu_factor(tp.tensor(a))
    tLU, tpivots = torch.linalg.lu_factor(torch.tensor(a, dtype=torch.float64))
    b = rng.standard_normal(b_shape).astype(np.float32)
    b = b if left else np.swapaxes(b, -1, -2).copy()
    _against_torch(queue, rng, lambda y: linalg.lu_solve(LU, pivots, y, left=left),
                   lambda y: torch.linalg.lu_solve(tLU, tpivots, y, left=left), [b])


@pytest.mark.parametrize("bad", [0, 5, -1000000])
def test_lu_solve_refuses_pivots_outside_one_to_n_as_pytorch(queue, rng, bad):
    # they were followed out of the matrix: garbage read, and writes past B's buffer
    a = _well_conditioned(rng, 2, 4, 4)
    LU, pivots = linalg.lu_factor(tp.tensor(a))
    wrong = pivots.to_host().copy()
    wrong[1, 2] = bad
    b = rng.standard_normal((2, 4, 3)).astype(np.float32)
    with pytest.raises(RuntimeError, match="Pivots given to lu_solve"):
        torch.linalg.lu_solve(torch.tensor(LU.to_host()), torch.tensor(wrong), torch.tensor(b))
    with pytest.raises(ShapeError, match=r"pivots \(2, 4\) hold a pivot outside 1..4 at "
                                         r"\(1, 2\)"):
        linalg.lu_solve(LU, tp.tensor(wrong), tp.tensor(b)).to_host()
    x = leaf(queue, b)
    with tp.Tape():
        out = linalg.lu_solve(LU, tp.tensor(wrong), x)       # recorded: at the first read
    with pytest.raises(ShapeError, match="outside 1..4"):
        out.to_host()
    with pytest.raises(DTypeError, match="expected int32"):
        linalg.lu_solve(LU, tp.tensor(wrong.astype(np.float32)), tp.tensor(b))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_inverse_of_a_factor_with_a_zero_diagonal_is_refused_as_pytorch(queue, upper):
    # it was NaN throughout, silently; cholesky_solve with that factor stays NaN, as torch's
    f = np.float32([[[2, 0], [1, 3]], [[1, 0], [1, 0]]])
    if upper:
        f = np.ascontiguousarray(np.swapaxes(f, -1, -2))
    with pytest.raises(RuntimeError, match="The diagonal element 2 is zero"):
        torch.cholesky_inverse(torch.tensor(f), upper=upper)
    with pytest.raises(LinAlgError, match=r"cholesky_inverse: the input \(2, 2, 2\) is "
                                          r"singular \(matrix \(1,\) of the batch\): the "
                                          "diagonal element 2 of the factor is zero"):
        tp.cholesky_inverse(tp.tensor(f), upper=upper)
    x = leaf(queue, f)
    with tp.Tape():
        out = tp.cholesky_inverse(x, upper=upper)             # recorded: at the first read
    with pytest.raises(LinAlgError, match="diagonal element 2"):
        out.to_host()
    np.testing.assert_allclose(
        tp.cholesky_inverse(tp.tensor(f[0]), upper=upper).to_host(),
        torch.cholesky_inverse(torch.tensor(f[0]), upper=upper).numpy(), rtol=1e-6)
    b = np.ones((2, 1), np.float32)
    assert np.isnan(tp.cholesky_solve(tp.tensor(b), tp.tensor(f[1]), upper).to_host()).all()
    assert torch.cholesky_solve(torch.tensor(b), torch.tensor(f[1]), upper).isnan().all()


def test_multi_dot_vecdot_diagonal_and_cholesky_inverse_are_pytorchs(queue, rng):
    ms = [rng.standard_normal(s).astype(np.float32) for s in [(5,), (5, 2), (2, 6), (6,)]]
    _against_torch(queue, rng, lambda *t: linalg.multi_dot(t),
                   lambda *t: torch.linalg.multi_dot(t), ms)
    ms = [rng.standard_normal(s).astype(np.float32) for s in [(3, 5), (5, 2), (2, 6)]]
    _against_torch(queue, rng, lambda *t: linalg.multi_dot(t),
                   lambda *t: torch.linalg.multi_dot(t), ms)
    x, y = rng.standard_normal((2, 3, 4)).astype(np.float32)
    _against_torch(queue, rng, lambda u, v: linalg.vecdot(u, v, dim=0),
                   lambda u, v: torch.linalg.vecdot(u, v, dim=0), [x, y])
    _against_torch(queue, rng, lambda u: linalg.diagonal(u, offset=1),
                   lambda u: torch.linalg.diagonal(u, offset=1), [x])
    assert linalg.matmul is tp.matmul
    spd = _spd(rng, 2, 4, 4)
    L = np.linalg.cholesky(spd.astype(np.float64)).astype(np.float32)
    _against_torch(queue, rng, tp.cholesky_inverse, torch.cholesky_inverse, [L])
    _against_torch(queue, rng, lambda u: u.cholesky_inverse(upper=True),
                   lambda u: torch.cholesky_inverse(u, upper=True),
                   [np.swapaxes(L, -1, -2).copy()])
    with pytest.raises(ShapeError, match="multi_dot: expected a chain of matrices"):
        linalg.multi_dot([tp.tensor(x), tp.tensor(y)])


# -- qr (Householder) --------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6), (3, 3)])
def test_qr_gives_pytorchs_q_and_r_and_gradients(queue, rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    # LAPACK's reflections, so Q and R themselves (not only up to signs) are PyTorch's
    _against_torch(queue, rng, lambda x: linalg.qr(x).Q, lambda x: torch.linalg.qr(x).Q, [a])
    _against_torch(queue, rng, lambda x: linalg.qr(x).R, lambda x: torch.linalg.qr(x).R, [a])
    # mode="r" keeps R's gradient (PyTorch's has none there): the reduced R's
    _against_torch(queue, rng, lambda x: linalg.qr(x, "r").R, lambda x: torch.linalg.qr(x).R,
                   [a])
    _gradcheck(queue, lambda x: tp.matmul(*linalg.qr(x)), [a if a.ndim == 2 else a[0]])
    q, r = (t.to_host() for t in linalg.qr(tp.tensor(a), "complete"))
    tq, tr = torch.linalg.qr(torch.tensor(a, dtype=torch.float64), "complete")
    np.testing.assert_allclose(q, tq.numpy(), atol=1e-5)
    np.testing.assert_allclose(r, tr.numpy(), atol=1e-5)
    assert linalg.qr(tp.tensor(a), "r").Q is None


def test_qr_refuses_what_pytorch_refuses(queue):
    x = tp.tensor(np.float32([[1, 2], [3, 4], [5, 6]]), requires_grad=True)
    with tp.Tape() as tape:
        q, r = linalg.qr(x, "complete")
    with pytest.raises(ParclError, match="mode='complete' with more rows than columns"):
        tape.backward(tp.sum(q))
    with pytest.raises(ParclError, match="mode must be"):
        linalg.qr(x, "full")
    np.testing.assert_allclose(linalg.qr(tp.tensor(np.float32([[3, 0], [4, 5]]))).R.to_host(),
                               [[-5, -4], [0, 3]], atol=1e-6)      # torch's too


# -- matrix_exp, tensorinv, tensorsolve, pinverse ---------------------------------------------
@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])
def test_matrix_exp_and_its_gradient_are_pytorchs(queue, rng, scale):
    a = (scale * rng.standard_normal((2, 4, 4))).astype(np.float32)
    want = torch.linalg.matrix_exp(torch.tensor(a, dtype=torch.float64))
    tol = 1e-5 * max(1.0, float(want.abs().max()))       # relative to the entries' size
    _against_torch(queue, rng, tp.matrix_exp, torch.linalg.matrix_exp, [a], tol=tol * 10)
    _gradcheck(queue, tp.matrix_exp, [a[0] / scale])
    np.testing.assert_allclose(
        tp.tensor(np.float32([[0, 1], [0, 0]])).matrix_exp().to_host(), [[1, 1], [0, 1]])
    np.testing.assert_allclose(linalg.matrix_exp(tp.tensor(np.float32([[0, -np.pi],
                                                                          [np.pi, 0]])))
                               .to_host(), [[-1, 0], [0, -1]], atol=1e-5)


def test_tensorinv_tensorsolve_and_pinverse_are_pytorchs(queue, rng):
    t = (3 * np.eye(4).reshape(4, 2, 2) + rng.standard_normal((4, 2, 2))).astype(np.float32)
    _against_torch(queue, rng, lambda x: linalg.tensorinv(x, 1),
                   lambda x: torch.linalg.tensorinv(x, 1), [t])
    a = (3 * np.eye(6) + rng.standard_normal((6, 6))).astype(np.float32)
    b = rng.standard_normal((2, 3)).astype(np.float32)
    _against_torch(queue, rng, linalg.tensorsolve, torch.linalg.tensorsolve,
                   [a.reshape(2, 3, 6), b])
    _against_torch(queue, rng, lambda x, y: linalg.tensorsolve(x, y, dims=(0,)),
                   lambda x, y: torch.linalg.tensorsolve(x, y, dims=(0,)),
                   [a.reshape(6, 2, 3), b])
    m = rng.standard_normal((4, 3)).astype(np.float32)
    _against_torch(queue, rng, tp.pinverse, torch.pinverse, [m])
    with pytest.raises(ShapeError, match="tensorinv: the product of the first ind=1 dims"):
        linalg.tensorinv(tp.tensor(np.ones((3, 2, 2), np.float32)), 1)


@pytest.mark.parametrize("driver", [None, "gelsd", "gels"])
def test_lstsq_gives_pytorchs_solution_residuals_rank_and_gradients(queue, rng, driver):
    a = rng.standard_normal((2, 5, 3)).astype(np.float32)
    b = rng.standard_normal((2, 5, 2)).astype(np.float32)
    _against_torch(queue, rng, lambda x, y: linalg.lstsq(x, y, driver=driver).solution,
                   lambda x, y: torch.linalg.lstsq(x, y, driver=driver or "gelsd").solution,
                   [a, b])
    got = linalg.lstsq(tp.tensor(a), tp.tensor(b), driver=driver)
    want = torch.linalg.lstsq(torch.tensor(a, dtype=torch.float64),
                              torch.tensor(b, dtype=torch.float64), driver=driver)
    for mine, theirs in zip(got[1:], want[1:]):      # residuals, rank, singular values
        if theirs.numel() == 0:
            assert mine is None                      # PyTorch's empty tensor
        else:
            np.testing.assert_allclose(mine.to_host(), theirs.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        linalg.lstsq(tp.tensor(np.float32([[1, 0], [0, 1], [0, 0]])),
                     tp.tensor(np.float32([[1], [2], [3]]))).solution.to_host(), [[1], [2]])


@pytest.mark.parametrize("driver", [None, "gelsd", "gels"])
def test_lstsq_decomposes_a_once_for_its_solution_rank_and_singular_values(queue, rng, driver):
    a = tp.tensor(rng.standard_normal((2, 5, 3)).astype(np.float32))
    b = tp.tensor(rng.standard_normal((2, 5, 2)).astype(np.float32))
    with trace_launches() as launches:
        linalg.lstsq(a, b, driver=driver)
    assert [name for name, *_ in launches].count("svd_jacobi") == 1


@pytest.mark.parametrize("shapes", [((5, 3), (5,)), ((2, 5, 3), (2, 5))])
def test_lstsq_takes_a_vector_b_with_one_dim_fewer_than_a_as_pytorch(queue, rng, shapes):
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    _against_torch(queue, rng, lambda x, y: linalg.lstsq(x, y, driver="gelsd").solution,
                   lambda x, y: torch.linalg.lstsq(x, y, driver="gelsd").solution, [a, b])
    got = linalg.lstsq(tp.tensor(a), tp.tensor(b), driver="gelsd")
    want = torch.linalg.lstsq(torch.tensor(a, dtype=torch.float64),
                              torch.tensor(b, dtype=torch.float64), driver="gelsd")
    assert got.residuals.shape == tuple(want.residuals.shape)      # (*, 1), as PyTorch's
    np.testing.assert_allclose(got.residuals.to_host(), want.residuals.numpy(), rtol=1e-5)


def test_a_matrix_holding_nan_decomposes_to_nan_not_to_a_plausible_answer(queue):
    m = tp.tensor(np.float32([[1, 2, 0], [np.nan, 1, 0], [0, 0, 1]]))
    for values in (linalg.eigvalsh(m), linalg.svdvals(m), linalg.eigh(m).eigenvectors,
                   linalg.svd(m).U, tp.det(m), tp.inverse(m), tp.matrix_exp(m)):
        assert np.isnan(values.to_host()).all()
    assert np.isnan(linalg.eigvalsh(tp.tensor(np.float32([[1, 0], [np.inf, 1]]))).to_host()).all()


@pytest.mark.parametrize("scale", [1e20, 1e-25])
def test_eigh_svd_and_qr_of_huge_or_tiny_matrices_are_pytorchs(queue, rng, scale):
    # entries whose squares overflow (1e20) or underflow (1e-25) float32
    a = (rng.standard_normal((2, 3, 3)) * scale).astype(np.float32)
    sym = a + np.swapaxes(a, -1, -2)
    ta, tsym = torch.tensor(a, dtype=torch.float64), torch.tensor(sym, dtype=torch.float64)
    close = lambda got, want: np.testing.assert_allclose(  # noqa: E731
        got.to_host(), want.numpy(), rtol=1e-4, atol=1e-4 * scale)
    close(linalg.eigvalsh(tp.tensor(sym)), torch.linalg.eigvalsh(tsym))
    close(linalg.svdvals(tp.tensor(a)), torch.linalg.svdvals(ta))
    close(linalg.matrix_norm(tp.tensor(a), 2), torch.linalg.matrix_norm(ta, 2))
    q, r = linalg.qr(tp.tensor(a))
    tq, tr = torch.linalg.qr(ta)
    close(r, tr)
    np.testing.assert_allclose(q.to_host(), tq.numpy(), atol=1e-4)
    w, v = linalg.eigh(tp.tensor(sym))
    np.testing.assert_allclose(v.to_host() @ (w.to_host()[..., None] * np.swapaxes(
        v.to_host(), -1, -2)) / scale, sym / scale, atol=1e-4)


def test_slogdet_of_a_matrix_holding_nan_with_a_zero_pivot_is_nan_as_pytorch(queue):
    # the zero pivot made it (0, -inf), a singular matrix's answer, and logdet -inf
    for m in ([[0, 0], [0, np.nan]], [[0, 1], [0, np.nan]]):
        m = np.float32(m)
        want = torch.linalg.slogdet(torch.tensor(m)).logabsdet
        assert np.isnan(want.item()) and np.isnan(torch.logdet(torch.tensor(m)).item())
        assert np.isnan(tp.slogdet(tp.tensor(m)).logabsdet.to_host())
        assert np.isnan(tp.logdet(tp.tensor(m)).to_host())
        assert np.isnan(tp.det(tp.tensor(m)).to_host())
    sign, logabs = tp.slogdet(tp.tensor(np.float32([[1, 2], [2, 4]])))     # singular: unchanged
    assert float(sign) == 0 and float(logabs) == -np.inf


def test_svd_of_a_matrix_of_entries_near_1e9_is_pytorchs(queue, rng):
    # the rotations' test of two columns, |gamma| > 1e-7 sqrt(alpha beta), overflowed to inf
    # and skipped every rotation: singular values 42% off for a 64 x 64
    a = (rng.standard_normal((64, 64)) * 1e9).astype(np.float32)
    want = torch.linalg.svdvals(torch.tensor(a, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(linalg.svdvals(tp.tensor(a)).to_host(), want,
                               atol=1e-5 * want[0])


def test_lu_gives_pytorchs_p_l_and_u(queue, rng):
    a = rng.standard_normal((2, 4, 4)).astype(np.float32)
    got = linalg.lu(tp.tensor(a))
    want = torch.linalg.lu(torch.tensor(a, dtype=torch.float64))
    np.testing.assert_array_equal(got.P.to_host(), want.P.numpy())
    np.testing.assert_allclose(got.L.to_host(), want.L.numpy(), atol=1e-5)
    np.testing.assert_allclose(got.U.to_host(), want.U.numpy(), atol=1e-5)
    with pytest.raises(ParclError, match="requires grad"):
        linalg.lu(tp.tensor(a, requires_grad=True))


def test_vander_and_its_gradient_are_pytorchs(queue, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    _against_torch(queue, rng, linalg.vander, torch.linalg.vander, [x])
    _against_torch(queue, rng, lambda v: linalg.vander(v, N=5),
                   lambda v: torch.linalg.vander(v, N=5), [x])
    with pytest.raises(ShapeError, match="N must be an int greater than 1"):
        linalg.vander(tp.tensor(x), N=1)


def test_det_of_a_matrix_with_a_nan_below_a_zero_pivot_is_nan_as_pytorch(queue):
    """A zero pivot skipped the trailing update that LAPACK's getf2 still makes with the
    unscaled column, so a NaN below it (never taken as a pivot) was dropped and
    det([[0, 1], [nan, 1]]) came out a singular 0 where PyTorch's is NaN."""
    a = np.array([[0.0, 1.0], [np.nan, 1.0]], np.float32)
    assert np.isnan(linalg.det(tp.tensor(a)).to_host())
    assert np.isnan(torch.linalg.det(torch.tensor(a)).item())
    assert np.isnan(linalg.slogdet(tp.tensor(a))[1].to_host())
    singular = np.array([[0.0, 1.0, 2.0], [0.0, 3.0, 4.0], [0.0, 5.0, 7.0]], np.float32)
    assert linalg.det(tp.tensor(singular)).to_host() == 0.0
