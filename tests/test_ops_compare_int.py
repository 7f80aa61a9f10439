"""``tp.eq ne lt le gt ge`` on int32/int64 tensors and bool masks against PyTorch's: the same
float32 0/1 mask a float comparison gives, broadcasting, int32 with int64, Python numbers
(fractions, NaN, infinities) exactly, an integer tensor against a float32 one promoted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.errors import DTypeError

OPS = ["eq", "ne", "lt", "le", "gt", "ge"]
A = np.array([[1, -2, 3], [7, 0, 2**31 - 1]], np.int64)
B = np.array([1, 0, 3], np.int32)
PAIRS = [(A, A[::-1].copy()), (A, B), (B, A), (A.astype(np.int32), B), (A, 2), (A, 2.5),
         (A, -2.5), (A, 7.0), (A, float("nan")), (A, float("inf")), (A, -float("inf")),
         (np.array([True, False]), np.array([True, True])), (A, np.float32([1.5, 0, 3]))]


def as_torch(v):
    return torch.as_tensor(v) if isinstance(v, np.ndarray) else v


def as_parcl(queue, v):
    return pc.Tensor.from_host(queue, v) if isinstance(v, np.ndarray) else v


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("pair", range(len(PAIRS)))
def test_integer_comparisons_give_pytorchs_mask_as_float(queue, op, pair):
    x, y = PAIRS[pair]
    got = getattr(tp, op)(as_parcl(queue, x), as_parcl(queue, y)).to_host()
    want = getattr(torch, op)(as_torch(x), as_torch(y)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_a_number_on_the_left_compares_as_pytorchs_reflected_operator(queue):
    y = pc.Tensor.from_host(queue, np.array([1, 5, 3], np.int64))
    np.testing.assert_array_equal(tp.lt(3, y).to_host(), [0, 1, 0])       # 3 < y
    np.testing.assert_array_equal(tp.ge(2.5, y).to_host(), [1, 0, 0])     # 2.5 >= y
    np.testing.assert_array_equal(tp.ne(5, y).to_host(), [1, 0, 1])


def test_accuracy_of_int64_labels_counts_the_matches_as_pytorch(queue):
    logits = np.array([[0.1, 2.0, 0.3], [1.5, 0.2, 0.1], [0.0, 0.1, 0.9], [3.0, 0.0, 0.1]],
                      np.float32)
    labels = np.array([1, 0, 1, 2], np.int64)
    pred = tp.argmax(pc.Tensor.from_host(queue, logits), 1)
    hits = tp.eq(pred, pc.Tensor.from_host(queue, labels))
    want = (torch.tensor(logits).argmax(1) == torch.tensor(labels)).float()
    np.testing.assert_array_equal(hits.to_host(), want.numpy())
    assert float(hits.mean()) == 0.5


def test_an_int32_tensor_against_a_number_beyond_int32_compares_exactly(queue):
    x = pc.Tensor.from_host(queue, np.array([0, -5, 2**31 - 1], np.int32))
    np.testing.assert_array_equal(tp.lt(x, 2**40).to_host(), [1, 1, 1])
    np.testing.assert_array_equal(tp.eq(x, 2**40).to_host(), [0, 0, 0])


def test_integer_comparisons_refuse_a_mask_against_labels(queue):
    mask = pc.Tensor.from_host(queue, np.array([True, False]))
    labels = pc.Tensor.from_host(queue, np.array([1, 0], np.int64))
    with pytest.raises(DTypeError, match=r"eq: cannot compare uint8 \(2,\) with int64 \(2,\)"):
        tp.eq(mask, labels)
    with pytest.raises(DTypeError, match="out of the range"):
        tp.eq(pc.Tensor.from_host(queue, np.array([1], np.int64)), 2**70)


def test_tensor_and_node_comparison_methods_take_integer_labels_as_pytorch(queue):
    labels = np.array([1, 2, 3], np.int64)
    scores = np.array([1.0, 0.0, 3.0], np.float32)
    y, f = pc.Tensor.from_host(queue, labels), pc.Tensor.from_host(queue, scores)
    ty, tf = torch.tensor(labels), torch.tensor(scores)
    np.testing.assert_array_equal((y < 2).to_host(), (ty < 2).float().numpy())
    np.testing.assert_array_equal((2 < y).to_host(), (2 < ty).float().numpy())
    np.testing.assert_array_equal(y.eq(f).to_host(), ty.eq(tf).float().numpy())
    np.testing.assert_array_equal(f.ne(y).to_host(), tf.ne(ty).float().numpy())
    np.testing.assert_array_equal(y.ge(y).to_host(), [1, 1, 1])
    node = tp.tensor(f, requires_grad=True)
    np.testing.assert_array_equal(node.gt(y).to_host(), tf.gt(ty).float().numpy())
    np.testing.assert_array_equal(node.le(1.0).to_host(), tf.le(1.0).float().numpy())
    assert float(y.eq(pc.Tensor.from_host(queue, np.array([1, 0, 3]))).sum()) == 2.0


def test_labels_above_2_to_the_24_against_a_python_float_compare_in_float32_as_pytorch(queue):
    # PyTorch promotes int64 and a Python float to float32: 16777217 rounds to 16777216 there,
    # so x == 16777216.0 holds and x > 16777216.0 does not (parcl compared exactly: 0 and 1)
    x = np.array([16777217, 2**53 + 1, 3, -16777217], np.int64)
    for op in OPS:
        for v in (16777216.0, float(2**53), -16777216.0, 2.5):
            got = getattr(tp, op)(pc.Tensor.from_host(queue, x), v).to_host()
            want = getattr(torch, op)(torch.tensor(x), v).float().numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {v}")
    y = pc.Tensor.from_host(queue, x)
    np.testing.assert_array_equal(tp.eq(y, 16777216.0).to_host(), [1, 0, 0, 0])
    np.testing.assert_array_equal((y > 16777216.0).to_host(), [0, 1, 0, 0])


def test_a_bool_mask_against_a_number_outside_0_to_255_is_a_constant_mask_as_pytorch(queue):
    # PyTorch compares True/False with -1 or 300 as integers; parcl raised DTypeError
    # 'le: -1 is out of the range of a uint8 tensor (2,)' for mask < -0.5
    mask = np.array([True, False])
    for v in (-1, -0.5, 256, 300.5, -300):
        for op in OPS:
            got = getattr(tp, op)(pc.Tensor.from_host(queue, mask), v).to_host()
            want = getattr(torch, op)(torch.tensor(mask), v).float().numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {v}")
    np.testing.assert_array_equal(tp.gt(pc.Tensor.from_host(queue, mask), -1).to_host(), [1, 1])
