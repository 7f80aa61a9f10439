"""Covariance, integration and matrix builders (cov, corrcoef, trapezoid, cumulative_trapezoid,
vander, renorm): values and gradients against torch in float64, finite differences, concrete
values, the method forms, and the errors naming the op and the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from torch_reference import check_float64
from parcl.errors import DTypeError, ParclError, ShapeError


def _against_torch(queue, fn, tfn, arrays, rng, tol=1e-5):
    """``fn`` at ``arrays`` against torch's ``tfn`` in float64: value, gradients for a random
    upstream gradient, and finite differences."""
    check_float64(queue, rng, fn, tfn, arrays, tol)
    assert tp.gradcheck(fn, [leaf(queue, a) for a in arrays])


FREQ = np.array([1, 3, 0, 2, 1, 2])


@pytest.mark.parametrize("kwargs", [{}, {"correction": 0}, {"correction": 2},
                                    {"fweights": FREQ}, {"fweights": FREQ, "correction": 0}])
def test_cov_value_and_gradient_hold_as_pytorch(queue, rng, kwargs):
    tkw = {k: torch.tensor(v) if k == "fweights" else v for k, v in kwargs.items()}
    _against_torch(queue, lambda x: tp.cov(x, **kwargs), lambda x: torch.cov(x, **tkw),
                   [rng.standard_normal((3, 6)).astype(np.float32)], rng)


def test_cov_with_aweights_gives_them_their_gradient_as_pytorch(queue, rng):
    x = rng.standard_normal((2, 6)).astype(np.float32)
    aw = rng.uniform(0.5, 2.0, 6).astype(np.float32)
    _against_torch(queue, lambda u, w: tp.cov(u, aweights=w, fweights=FREQ),
                   lambda u, w: torch.cov(u, aweights=w, fweights=torch.tensor(FREQ)),
                   [x, aw], rng)
    _against_torch(queue, lambda u, w: tp.cov(u, correction=0, aweights=w),
                   lambda u, w: torch.cov(u, correction=0, aweights=w), [x, aw], rng)


def test_cov_and_corrcoef_of_one_variable_are_0d_as_pytorch(queue, rng):
    v = rng.standard_normal(5).astype(np.float32)
    _against_torch(queue, tp.cov, torch.cov, [v], rng)
    _against_torch(queue, tp.cov, torch.cov, [v[None]], rng)
    assert float(tp.corrcoef(leaf(queue, v))) == 1.0


def test_corrcoef_value_and_gradient_hold_as_pytorch(queue, rng):
    _against_torch(queue, tp.corrcoef, torch.corrcoef,
                   [rng.standard_normal((3, 7)).astype(np.float32)], rng, tol=1e-4)


def test_cov_and_corrcoef_give_concrete_values_and_methods(queue):
    x = leaf(queue, [[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    np.testing.assert_array_equal(tp.cov(x).to_host(), [[1, -1], [-1, 1]])
    np.testing.assert_array_equal(x.cov(correction=0).to_host() * 3, [[2, -2], [-2, 2]])
    np.testing.assert_array_equal(x.corrcoef().to_host(), [[1, -1], [-1, 1]])


TRAPEZOIDS = {
    "default": ((2, 5), lambda y: tp.trapezoid(y), lambda y: torch.trapezoid(y)),
    "dx_dim0": ((4, 3), lambda y: tp.trapezoid(y, dx=0.5, dim=0),
                lambda y: torch.trapezoid(y, dx=0.5, dim=0)),
    "one_sample": ((3, 1), lambda y: tp.trapezoid(y), lambda y: torch.trapezoid(y)),
    "cumulative": ((2, 5), lambda y: tp.cumulative_trapezoid(y),
                   lambda y: torch.cumulative_trapezoid(y)),
    "cumulative_dx_dim0": ((4, 3), lambda y: tp.cumulative_trapezoid(y, dx=-2.0, dim=0),
                           lambda y: torch.cumulative_trapezoid(y, dx=-2.0, dim=0)),
}


@pytest.mark.parametrize("case", list(TRAPEZOIDS))
def test_trapezoids_with_a_spacing_hold_as_pytorch(queue, rng, case):
    shape, fn, tfn = TRAPEZOIDS[case]
    _against_torch(queue, fn, tfn, [rng.standard_normal(shape).astype(np.float32)], rng)


@pytest.mark.parametrize("name", ["trapezoid", "cumulative_trapezoid"])
@pytest.mark.parametrize("x_shape, dim", [((5,), -1), ((2, 5), 1), ((4,), 0), ((1, 5), -1)])
def test_trapezoids_with_sample_points_give_both_gradients_as_pytorch(queue, rng, name,
                                                                        x_shape, dim):
    y_shape = (2, 5) if x_shape == (2, 5) else (4, 5)
    fn, tfn = getattr(tp, name), getattr(torch, name)
    x = np.cumsum(rng.uniform(0.1, 1.0, x_shape), axis=dim).astype(np.float32)
    _against_torch(queue, lambda u, v: fn(u, v, dim=dim), lambda u, v: tfn(u, v, dim=dim),
                   [rng.standard_normal(y_shape).astype(np.float32), x], rng)


def test_trapezoids_give_concrete_values(queue):
    y = leaf(queue, [1.0, 2.0, 3.0])
    assert float(tp.trapezoid(y)) == 4.0 and float(tp.trapezoid(y, dx=0.5)) == 2.0
    assert float(tp.trapezoid(y, leaf(queue, [0.0, 1.0, 3.0]))) == 1.5 + 5.0
    np.testing.assert_array_equal(tp.cumulative_trapezoid(y).to_host(), [1.5, 4.0])


@pytest.mark.parametrize("N, increasing", [(None, False), (4, False), (2, True), (1, False)])
def test_vander_value_and_gradient_hold_as_pytorch_at_zero_too(queue, rng, N, increasing):
    # torch.vander's own backward fails (2.13: an in-place error, any dtype), so the reference
    # is its definition: the columns x ** k, torch's pow giving x ** 0 a zero gradient
    x = np.array([0.0, -1.5, 2.0, 0.5], np.float32)
    powers = list(range(len(x) if N is None else N))
    if not increasing:
        powers.reverse()
    np.testing.assert_array_equal(tp.vander(leaf(queue, x), N, increasing).to_host(),
                                  torch.vander(torch.tensor(x), N, increasing).numpy())
    _against_torch(queue, lambda u: tp.vander(u, N, increasing),
                   lambda u: torch.stack([u ** k for k in powers], 1), [x], rng)


def test_vander_gives_concrete_values(queue):
    x = leaf(queue, [2.0, 3.0])
    np.testing.assert_array_equal(tp.vander(x).to_host(), [[2, 1], [3, 1]])
    np.testing.assert_array_equal(tp.vander(x, 3, True).to_host(), [[1, 2, 4], [1, 3, 9]])
    assert tp.vander(x, 0).shape == (2, 0)


@pytest.mark.parametrize("p, dim, maxnorm", [(2.0, 0, 1.5), (1.0, -1, 2.0), (3.0, 1, 0.5),
                                             (2.0, 2, 100.0)])
def test_renorm_value_and_gradient_hold_as_pytorch(queue, rng, p, dim, maxnorm):
    _against_torch(queue, lambda u: tp.renorm(u, p, dim, maxnorm),
                   lambda u: torch.renorm(u, p, dim, maxnorm),
                   [rng.standard_normal((3, 4, 2)).astype(np.float32)], rng)


def test_renorm_scales_only_the_slices_over_maxnorm(queue):
    x = leaf(queue, [[3.0, 4.0], [0.3, 0.4]])
    np.testing.assert_allclose(x.renorm(2, 0, 1.0).to_host(), [[0.6, 0.8], [0.3, 0.4]],
                               rtol=1e-6)


def test_numerics_refuse_bad_input_naming_the_op_and_shapes(queue):
    m = leaf(queue, np.ones((3, 4)))
    with pytest.raises(ShapeError, match=r"cov: expected an input of two or fewer dimensions .*"
                                          r"got shape \(2, 3, 4\)"):
        tp.cov(leaf(queue, np.ones((2, 3, 4))))
    with pytest.raises(DTypeError, match="cov: expected fweights to have an integral dtype"):
        tp.cov(m, fweights=np.ones(4, np.float32))
    with pytest.raises(ShapeError, match=r"cov: expected fweights to have as many elements as "
                                          r"the input has observations, got 2 != 4"):
        tp.cov(m, fweights=np.array([1, 2]))
    with pytest.raises(ParclError, match="cov: aweights cannot be negative"):
        tp.cov(m, aweights=up(queue, [1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ShapeError, match=r"trapezoid: x \(3,\) must hold one value per sample "
                                          r"point: 4 along dim 1 of y \(3, 4\)"):
        tp.trapezoid(m, leaf(queue, np.ones(3)))
    with pytest.raises(ParclError, match="trapezoid: x and dx given both"):
        tp.trapezoid(m, m, dx=2.0)
    with pytest.raises(ShapeError, match=r"vander: x must be a one-dimensional tensor, got "
                                          r"shape \(3, 4\)"):
        tp.vander(m)
    with pytest.raises(ShapeError, match="vander: N must be a non-negative int, got -1"):
        tp.vander(leaf(queue, np.ones(3)), -1)
    with pytest.raises(ShapeError, match=r"renorm: input needs at least 2 dimensions, got "
                                          r"shape \(3,\)"):
        tp.renorm(leaf(queue, np.ones(3)), 2, 0, 1.0)
    with pytest.raises(ParclError, match="renorm: p must be positive, got 0.0"):
        tp.renorm(m, 0, 0, 1.0)
    with pytest.raises(ParclError, match="renorm: maxnorm must be >= 0, got -1.0"):
        tp.renorm(m, 2, 0, -1)
