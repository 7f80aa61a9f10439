"""The logical ops, the closeness tests (isclose, allclose, equal) and the NaN-aware
reductions (nansum, nanmean): masks and values against torch, gradients against
torch's and finite differences, dims and keepdim, the method forms, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import DTypeError, ParclError, ShapeError

A = np.array([[0.0, 1.5, np.nan, -2.0], [0.0, 0.0, 3.0, np.nan]], np.float32)
B = np.array([1.0, 0.0, 0.0, np.nan], np.float32)


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical_ops_are_pytorchs_as_float_masks(queue, name):
    got = getattr(tp, name)(up(queue, A), up(queue, B))
    assert isinstance(got, pc.Tensor) and got.shape == (2, 4)
    want = getattr(torch, name)(torch.tensor(A), torch.tensor(B)).numpy()
    np.testing.assert_array_equal(got.to_host(), want.astype(np.float32))


def test_logical_not_and_numbers_as_operands(queue):
    np.testing.assert_array_equal(tp.logical_not(up(queue, A)).to_host(),
                                  torch.logical_not(torch.tensor(A)).numpy())
    np.testing.assert_array_equal(tp.logical_and(up(queue, B), 1.0).to_host(), [1, 0, 0, 1])
    np.testing.assert_array_equal(tp.logical_or(0.0, up(queue, B)).to_host(), [1, 0, 0, 1])
    x = leaf(queue, B)
    assert isinstance(tp.logical_xor(x, x), pc.Tensor)             # never recorded


def test_isclose_is_pytorchs_with_infinities_nans_and_tolerances(queue):
    a = np.array([1.0, 1.0 + 1e-6, 1.0 + 1e-4, np.inf, np.inf, np.nan, 0.0, 1e-9],
                 np.float32)
    b = np.array([1.0, 1.0, 1.0, np.inf, -np.inf, np.nan, 1e-9, 0.0], np.float32)
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0},
                   {"rtol": 0.0, "atol": 1e-8}):
        got = tp.isclose(up(queue, a), up(queue, b), **kwargs).to_host()
        want = torch.isclose(torch.tensor(a), torch.tensor(b), **kwargs).numpy()
        np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=str(kwargs))
    # broadcasting, a number on one side
    got = tp.isclose(up(queue, A), up(queue, B), equal_nan=True).to_host()
    want = torch.isclose(torch.tensor(A), torch.tensor(B), equal_nan=True).numpy()
    np.testing.assert_array_equal(got, want.astype(np.float32))
    np.testing.assert_array_equal(tp.isclose(up(queue, B), 1.0).to_host(), [1, 0, 0, 0])


def test_allclose_and_equal_give_python_bools_as_pytorch(queue):
    a, b = up(queue, A), up(queue, A.copy())
    assert tp.allclose(a, b) is False                    # NaN is not close to NaN
    assert tp.allclose(a, b, equal_nan=True) is True
    assert tp.allclose(up(queue, [1.0, 2.0]), up(queue, [1.0, 2.0 + 1e-6])) is True
    assert tp.allclose(up(queue, [1.0, 2.0]), up(queue, [1.0, 2.1])) is False
    assert tp.equal(up(queue, [1.0, 2.0]), up(queue, [1.0, 2.0])) is True
    assert tp.equal(a, b) is False                       # NaN equals nothing
    assert tp.equal(up(queue, [1.0, 2.0]), up(queue, [[1.0, 2.0]])) is False   # shapes
    empty = leaf(queue, np.ones((2, 2)))[:, 2:]               # no elements
    assert tp.allclose(empty, empty) is True and tp.equal(empty, empty) is True


@pytest.mark.parametrize("dim, keepdim", [(None, False), (1, False), (0, True), (-1, True),
                                          ((0, 1), False), ((), False)])
def test_nansum_and_nanmean_match_pytorch_value_and_gradient(queue, rng, dim, keepdim):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x[0, 1] = x[2, 4] = x[2, 0] = np.nan
    x[1, :] = np.nan                                     # a row of NaNs: nanmean NaN there
    for name in ("nansum", "nanmean"):
        node = leaf(queue, x)
        with tp.Tape() as tape:
            y = getattr(tp, name)(node, dim, keepdim)
        g = rng.standard_normal(y.shape).astype(np.float32)
        tape.backward(y, grad=up(queue, g))
        xt = torch.tensor(x.astype(np.float64), requires_grad=True)
        want = getattr(torch, name)(xt, dim=dim, keepdim=keepdim) if dim is not None \
            else getattr(torch, name)(xt)
        want.backward(torch.tensor(g.astype(np.float64)))
        np.testing.assert_allclose(y.to_host(), want.detach().numpy(), rtol=1e-6, atol=1e-6,
                                   equal_nan=True, err_msg=f"{name} dim={dim}")
        np.testing.assert_allclose(node.grad.to_host(), xt.grad.numpy(), rtol=1e-6,
                                   atol=1e-7, err_msg=f"{name} dim={dim}")


def test_nansum_and_nanmean_pass_gradcheck(queue, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[1, 2] = np.nan
    assert tp.gradcheck(lambda v: tp.nansum(v, 1) + tp.nanmean(v, 1) * 2.0, [leaf(queue, x)])


def test_node_methods_are_the_ops(queue):
    a, b = leaf(queue, A), leaf(queue, np.broadcast_to(B, A.shape).copy())
    for name in ("logical_and", "logical_or", "logical_xor", "isclose"):
        np.testing.assert_array_equal(getattr(a, name)(b).to_host(),
                                      getattr(tp, name)(a, b).to_host(), err_msg=name)
    np.testing.assert_array_equal(a.logical_not().to_host(), tp.logical_not(a).to_host())
    assert a.allclose(a, equal_nan=True) and not a.equal(a)
    np.testing.assert_array_equal(a.nansum(1).to_host(), tp.nansum(a, 1).to_host())
    np.testing.assert_array_equal(a.nanmean(0, True).to_host(), tp.nanmean(a, 0, True).to_host())


def test_bad_arguments_are_named_errors(queue):
    a = up(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"logical_and.*\(2, 3\).*\(2,\)"):
        tp.logical_and(a, up(queue, np.ones(2)))
    with pytest.raises(ShapeError, match=r"isclose.*\(2, 3\).*\(2,\)"):
        tp.isclose(a, up(queue, np.ones(2)))
    with pytest.raises(ParclError, match="isclose: rtol must be greater than or equal to zero"):
        tp.isclose(a, a, rtol=-1.0)
    with pytest.raises(DTypeError, match="logical_not: expected a tp.Node or pc.Tensor"):
        tp.logical_not(1.0)
    with pytest.raises(DTypeError, match=r"nansum: dtype int64 .*\(2,\)"):
        tp.nansum(up(queue, [1, 2], np.int64))
    with pytest.raises(ShapeError, match="nanmean"):
        tp.nanmean(a, 2)
