"""Selecting and placing ops (select, select_scatter, slice_scatter, diagonal_scatter,
diag_embed, diagflat, take, masked_select, masked_scatter, index_copy, index_fill): values and
gradients against torch in float64, finite differences, the method forms, and the errors
naming the op and the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import DTypeError, ShapeError
from torch_reference import float64_reference


def _against_torch(queue, rng, fn, tfn, shapes):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out, grads, want, want_grads = float64_reference(queue, rng, fn, tfn, arrays)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-6, atol=1e-6)
    for got, expected in zip(grads, want_grads):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert tp.gradcheck(fn, [leaf(queue, a) for a in arrays])


IDX = np.array([2, 0, 2])
MASK = np.array([[True, False, True, False], [False, False, True, True], [True] * 4])

CASES = {
    "select": (lambda a: tp.select(a, 1, -2), lambda a: torch.select(a, 1, -2), [(2, 3, 4)]),
    "select_scatter": (lambda a, s: tp.select_scatter(a, s, -1, 1),
                       lambda a, s: torch.select_scatter(a, s, -1, 1), [(2, 3), (2,)]),
    "slice_scatter": (lambda a, s: tp.slice_scatter(a, s, 1, 1, None, 2),
                      lambda a, s: torch.slice_scatter(a, s, 1, 1, None, 2),
                      [(3, 6), (3, 3)]),
    "slice_scatter_negative": (lambda a, s: tp.slice_scatter(a, s, start=-2, end=-1),
                               lambda a, s: torch.slice_scatter(a, s, start=-2, end=-1),
                               [(4, 2), (1, 2)]),
    "diagonal_scatter": (lambda a, s: tp.diagonal_scatter(a, s, 1),
                         lambda a, s: torch.diagonal_scatter(a, s, 1), [(3, 4), (3,)]),
    "diagonal_scatter_dims": (lambda a, s: tp.diagonal_scatter(a, s, -1, 2, 0),
                              lambda a, s: torch.diagonal_scatter(a, s, -1, 2, 0),
                              [(3, 2, 4), (2, 3)]),
    "diag_embed": (tp.diag_embed, torch.diag_embed, [(2, 3)]),
    "diag_embed_dims": (lambda a: tp.diag_embed(a, -1, 0, 2),
                        lambda a: torch.diag_embed(a, -1, 0, 2), [(2, 3)]),
    "diagflat": (lambda a: tp.diagflat(a, 2), lambda a: torch.diagflat(a, 2), [(2, 2)]),
    "take": (lambda a: tp.take(a, np.array([[5, -1], [0, 5]])),
             lambda a: torch.take(a, torch.tensor([[5, -1], [0, 5]])), [(2, 3)]),
    "masked_select": (lambda a: tp.masked_select(a, MASK),
                      lambda a: torch.masked_select(a, torch.tensor(MASK)), [(3, 4)]),
    "masked_select_broadcast": (lambda a: tp.masked_select(a, MASK[:, :1]),
                                lambda a: torch.masked_select(a, torch.tensor(MASK[:, :1])),
                                [(4,)]),
    "masked_scatter": (lambda a, s: tp.masked_scatter(a, MASK, s),
                       lambda a, s: torch.masked_scatter(a, torch.tensor(MASK), s),
                       [(3, 4), (2, 5)]),
    "masked_scatter_broadcast": (lambda a, s: tp.masked_scatter(a, MASK[0], s),
                                 lambda a, s: torch.masked_scatter(a, torch.tensor(MASK[0]), s),
                                 [(2, 1), (4,)]),
    "index_copy": (lambda a, s: tp.index_copy(a, 1, np.array([3, 0]), s),
                   lambda a, s: torch.index_copy(a, 1, torch.tensor([3, 0]), s),
                   [(2, 4), (2, 2)]),
    "index_fill": (lambda a: tp.index_fill(a, 0, IDX, -1.5),
                   lambda a: torch.index_fill(a, 0, torch.tensor(IDX), -1.5), [(3, 2)]),
    "index_fill_negative": (lambda a: tp.index_fill(a, -1, np.array([-1]), 2.0),
                            lambda a: torch.index_fill(a, -1, torch.tensor([-1]), 2.0),
                            [(3, 2)]),
    "index_fill_tensor_value": (lambda a, v: tp.index_fill(a, 1, np.array([0, 2]), v),
                                lambda a, v: torch.index_fill(a, 1, torch.tensor([0, 2]), v),
                                [(2, 3), ()]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_placing_value_and_gradient_hold_as_pytorch(queue, rng, case):
    fn, tfn, shapes = CASES[case]
    _against_torch(queue, rng, fn, tfn, shapes)


def test_placing_gives_concrete_values_and_methods(queue):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = leaf(queue, a)
    np.testing.assert_array_equal(x.select(0, -1).to_host(), [3, 4, 5])
    assert x.select(1, 0).op_name == "select"
    np.testing.assert_array_equal(x.take(np.array([1, -2])).to_host(), [1, 4])
    dev = up(queue, np.array([4, 0]), np.int64)
    np.testing.assert_array_equal(tp.take(x, dev).to_host(), [4, 0])
    np.testing.assert_array_equal(x.masked_select(a > 2).to_host(), [3, 4, 5])
    np.testing.assert_array_equal(x.masked_select(up(queue, a > 2, np.bool_)).to_host(),
                                  [3, 4, 5])
    assert x.masked_select(a > 9).shape == (0,)
    np.testing.assert_array_equal(
        x.masked_scatter(a < 2, leaf(queue, [10.0, 20.0, 30.0])).to_host(),
        [[10, 20, 2], [3, 4, 5]])
    np.testing.assert_array_equal(x.index_fill(1, up(queue, [1], np.int32), 0.0).to_host(),
                                  [[0, 0, 2], [3, 0, 5]])
    np.testing.assert_array_equal(
        x.index_copy(0, np.array([1, 0]), leaf(queue, a[::-1].copy())).to_host(), a)
    np.testing.assert_array_equal(x.select_scatter(leaf(queue, [7.0, 8.0]), 1, 2).to_host(),
                                  [[0, 1, 7], [3, 4, 8]])
    np.testing.assert_array_equal(x.slice_scatter(leaf(queue, np.zeros((2, 1))), 1, 2)
                                  .to_host(), [[0, 1, 0], [3, 4, 0]])
    np.testing.assert_array_equal(x.diagonal_scatter(leaf(queue, [-1.0]), 2).to_host(),
                                  [[0, 1, -1], [3, 4, 5]])
    np.testing.assert_array_equal(x[0].diag_embed().to_host(), np.diag(a[0]))
    np.testing.assert_array_equal(tp.diagflat(x[0], -1).to_host(), np.diagflat(a[0], -1))


def test_select_is_a_copy_and_index_copy_lets_the_last_repeat_win(queue):
    x = leaf(queue, np.zeros((2, 2)), requires_grad=False)
    row = tp.select(x, 0, 0)
    x.value += 1.0
    np.testing.assert_array_equal(row.to_host(), [0, 0])
    out = tp.index_copy(x, 0, np.array([1, 1]), leaf(queue, [[5.0, 5.0], [6.0, 6.0]]))
    np.testing.assert_array_equal(out.to_host(), [[1, 1], [6, 6]])


def test_placing_refuses_bad_input_naming_the_op_and_shapes(queue):
    x = leaf(queue, np.ones((2, 3)))
    with pytest.raises(IndexError, match=r"select: index 2 is out of range for dim 0 of size 2 "
                                          r"\(shape \(2, 3\)\)"):
        tp.select(x, 0, 2)
    with pytest.raises(ShapeError, match=r"select_scatter: src has shape \(3,\), expected "
                                          r"\(2,\) for input \(2, 3\)"):
        tp.select_scatter(x, leaf(queue, np.ones(3)), 1, 0)
    with pytest.raises(ShapeError, match="slice_scatter: step must be positive, got 0"):
        tp.slice_scatter(x, x, step=0)
    with pytest.raises(ShapeError, match="diagonal_scatter: dim1 and dim2 are both dim 1"):
        tp.diagonal_scatter(x, x, 0, 1, -1)
    with pytest.raises(ShapeError, match=r"take: index 6 at position \(1,\) of indices \(2,\) "
                                          r"is out of range"):
        tp.take(x, np.array([0, 6])).to_host()      # recorded: raised at the first read
    with pytest.raises(ShapeError, match=r"take: index -1 at position \(0,\)"):
        tp.take(x.value, up(queue, [-1], np.int64))   # a device index: in [0, size)
    with pytest.raises(ShapeError, match=r"masked_select: input \(2, 3\) and mask \(2,\) do not "
                                          r"broadcast"):
        tp.masked_select(x, np.array([True, False]))
    with pytest.raises(ShapeError, match=r"masked_scatter: the mask \(2, 3\) has 6 True "
                                          r"elements but source \(4,\) only 4"):
        tp.masked_scatter(x, np.ones((2, 3), np.bool_), leaf(queue, np.ones(4)))
    with pytest.raises(ShapeError, match=r"index_copy: source \(2, 2\) must have the input's "
                                          r"shape \(2, 3\) with the index's length 1 at dim 1"):
        tp.index_copy(x, 1, np.array([0]), leaf(queue, np.ones((2, 2))))
    with pytest.raises(ShapeError, match=r"index_copy: index -1 at position \(0,\)"):
        tp.index_copy(x, 1, np.array([-1]), leaf(queue, np.ones((2, 1)))).to_host()
    with pytest.raises(ShapeError, match=r"index_fill: index 3 at position \(0,\)"):
        tp.index_fill(x, 1, np.array([3]), 0.0).to_host()
    with pytest.raises(DTypeError, match="index_fill: value must be a number or a 0-d tensor"):
        tp.index_fill(x, 1, np.array([0]), "a")
    with pytest.raises(ShapeError, match=r"diag_embed: expects a tensor of at least 1 dim"):
        tp.diag_embed(leaf(queue, 1.0))


def test_a_captured_step_through_the_placing_ops_replays_its_eager_bits(queue, rng):
    from conftest import assert_replays_eager
    w = leaf(queue, rng.uniform(0.5, 1.5, (3, 4)))

    def step(x):
        with tp.Tape() as tape:
            h = tp.tensor(x) * w
            h = tp.select_scatter(h, tp.select(h, 1, -1) * 3, 1, 0)
            h = tp.slice_scatter(h, h[:, ::2] * h[:, 1::2], 1, 0, None, 2)
            h = tp.diagonal_scatter(h, tp.diagonal(h, 1) + 1, 1)
            h = tp.index_copy(h, 0, np.array([2, 0]), h[:2] * 2)
            h = tp.index_fill(h, 1, np.array([-1]), 0.5)
            loss = tp.sum(tp.diag_embed(h) ** 2) + tp.sum(tp.take(h, np.array([[0, 11]])))
            loss = loss + tp.sum(tp.diagflat(h[0], 1))
        tape.backward(loss)
        return loss.value

    assert_replays_eager(queue, step, w, [rng.standard_normal((3, 4)).astype(np.float32)
                                          for _ in range(3)])
