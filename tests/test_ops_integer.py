"""The integer ops (gcd, lcm, bitwise_and/or/xor/not): values against torch on int32 and
int64 with negative values, zeros and broadcasting, the bitwise ops on bool masks, ints on
either side, the method forms, int32 with int64 promoted to int64, and the errors (float
tensors, a bool mask with an int tensor)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import up
from parcl.errors import DTypeError, ShapeError

NAMES = ["gcd", "lcm", "bitwise_and", "bitwise_or", "bitwise_xor"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("name", NAMES)
def test_integer_ops_match_pytorch_with_broadcasting(queue, rng, name, dtype):
    a = rng.integers(-60, 60, (3, 1, 5)).astype(dtype)
    b = rng.integers(-60, 60, (4, 1)).astype(dtype)
    a[0, 0, :2] = 0
    b[0, 0] = 0                                      # gcd(0, 0) = 0, lcm(x, 0) = 0
    got = getattr(tp, name)(up(queue, a, dtype), up(queue, b, dtype))
    assert isinstance(got, pc.Tensor) and got.dtype == dtype and got.shape == (3, 4, 5)
    want = getattr(torch, name)(torch.tensor(a), torch.tensor(b)).numpy()
    np.testing.assert_array_equal(got.to_host(), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_bitwise_not_is_minus_x_minus_one_as_pytorch(queue, dtype):
    a = np.array([0, 1, -1, 12, -2 ** 31 + 1, 2 ** 31 - 1], dtype)
    got = tp.bitwise_not(up(queue, a, dtype)).to_host()
    np.testing.assert_array_equal(got, torch.bitwise_not(torch.tensor(a)).numpy())


def test_bitwise_ops_on_bool_masks_are_the_logical_ones(queue):
    p = np.array([True, True, False, False])
    r = np.array([True, False, True, False])
    mp, mr = pc.Tensor.from_host(queue, p), pc.Tensor.from_host(queue, r)
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        got = getattr(tp, name)(mp, mr).to_host()
        np.testing.assert_array_equal(got, getattr(torch, name)(torch.tensor(p),
                                                                torch.tensor(r)).numpy())
    np.testing.assert_array_equal(tp.bitwise_not(mp).to_host(), [0, 0, 1, 1])


def test_ints_on_either_side_and_nodes_as_operands(queue):
    a = up(queue, [12, -18, 0, 7], np.int64)
    np.testing.assert_array_equal(tp.gcd(a, 8).to_host(), [4, 2, 8, 1])
    np.testing.assert_array_equal(tp.lcm(6, a).to_host(), [12, 18, 0, 42])
    np.testing.assert_array_equal(tp.bitwise_and(a, 6).to_host(), np.array([12, -18, 0, 7]) & 6)
    node = tp.tensor(np.array([12, 18], np.int64))
    for name in NAMES:
        np.testing.assert_array_equal(getattr(node, name)(node).to_host(),
                                      getattr(tp, name)(node, node).to_host(), err_msg=name)
    np.testing.assert_array_equal(node.bitwise_not().to_host(), [-13, -19])


def test_bad_operands_are_named_errors(queue):
    f = up(queue, [1.0, 2.0])
    i64 = up(queue, [1, 2], np.int64)
    with pytest.raises(DTypeError, match=r"gcd: dtype float32 is not supported \(shape \(2,\)\)"):
        tp.gcd(f, f)
    with pytest.raises(DTypeError, match="bitwise_not: dtype float32"):
        tp.bitwise_not(f)
    mask = pc.Tensor.from_host(queue, np.array([True, False]))
    with pytest.raises(DTypeError, match=r"bitwise_and: operands of different dtypes \(uint8 "
                                          r"\(2,\) and int64 \(2,\)\)"):
        tp.bitwise_and(mask, i64)
    with pytest.raises(DTypeError, match="gcd: dtype uint8"):
        tp.gcd(pc.Tensor.from_host(queue, np.array([True])), pc.Tensor.from_host(
            queue, np.array([True])))
    with pytest.raises(ShapeError, match=r"bitwise_xor.*\(2,\).*\(3,\)"):
        tp.bitwise_xor(i64, up(queue, [1, 2, 3], np.int64))
    with pytest.raises(DTypeError, match="gcd: both operands are numbers"):
        tp.gcd(4, 6)
    with pytest.raises(DTypeError, match="bitwise_and: expected a tp.Node, pc.Tensor or int"):
        tp.bitwise_and(i64, 1.5)


@pytest.mark.parametrize("name", NAMES)
def test_int32_with_int64_operands_give_int64_as_pytorch(queue, name):
    """PyTorch promotes an int32 operand beside an int64 one to int64 (``torch.gcd`` of the
    int32 ``[[6], [-12], [2**31 - 1]]`` and the int64 ``[4, 18, -2**40]`` is int64);
    parcl refused them with 'operands of different dtypes'. Either order, broadcast."""
    a = np.array([[6], [-12], [2**31 - 1]], np.int32)
    b = np.array([4, 18, -2**40], np.int64)
    for x, y in ((a, b), (b, a)):
        got = getattr(tp, name)(up(queue, x, x.dtype), up(queue, y, y.dtype)).to_host()
        want = getattr(torch, name)(torch.from_numpy(x), torch.from_numpy(y)).numpy()
        assert got.dtype == want.dtype == np.int64
        np.testing.assert_array_equal(got, want)
