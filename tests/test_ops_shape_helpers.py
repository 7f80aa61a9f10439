"""Shape helpers (atleast_1d/2d/3d, hstack, vstack, row_stack, dstack, column_stack,
tensor_split, hsplit, vsplit, dsplit, block_diag, cartesian_prod, combinations, broadcast_to,
broadcast_tensors, broadcast_shapes, swapaxes, swapdims, moveaxis, ravel, rot90, fliplr,
flipud, clone, numel): values and gradients against torch in float64, finite differences,
the method forms, copies against views, and the errors naming the op and the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import ShapeError


def _flat(pieces, cat):
    """Several outputs as one 1-D tensor (to compare and differentiate them at once)."""
    if not isinstance(pieces, (tuple, list)):
        return pieces
    return cat([p.reshape(-1) for p in pieces])


def _against_torch(queue, rng, fn, tfn, shapes, check_grad=True):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    want = _flat(tfn(*ts), torch.cat)
    nodes = [leaf(queue, a) for a in arrays]

    def ours(*xs):
        return _flat(fn(*xs), tp.cat)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    want.backward(torch.tensor(g.astype(np.float64)))
    with tp.Tape() as tape:
        out = ours(*nodes)
    tape.backward(out, grad=up(queue, g))
    assert out.shape == tuple(want.shape)
    np.testing.assert_allclose(out.to_host(), want.detach().numpy(), rtol=1e-6, atol=1e-6)
    for n, t in zip(nodes, ts):
        np.testing.assert_allclose(n.grad.to_host(), t.grad.numpy(), rtol=1e-6, atol=1e-6)
    if check_grad:
        assert tp.gradcheck(ours, [leaf(queue, a) for a in arrays])


CASES = {
    "atleast_1d": (tp.atleast_1d, torch.atleast_1d, [()]),
    "atleast_2d_list": (lambda a, b: tp.atleast_2d([a, b]), lambda a, b: torch.atleast_2d([a, b]),
                        [(3,), ()]),
    "atleast_3d": (lambda a, b, c: tp.atleast_3d(a, b, c), torch.atleast_3d, [(3,), (2, 3), ()]),
    "hstack": (lambda a, b: tp.hstack([a, b]), lambda a, b: torch.hstack([a, b]),
               [(2, 3), (2, 1)]),
    "hstack_1d": (lambda a, b: tp.hstack([a, b]), lambda a, b: torch.hstack([a, b]),
                  [(3,), ()]),
    "vstack": (lambda a, b: tp.vstack([a, b]), lambda a, b: torch.vstack([a, b]), [(2, 3), (3,)]),
    "row_stack": (lambda a, b: tp.row_stack([a, b]), lambda a, b: torch.row_stack([a, b]),
                  [(3,), (3,)]),
    "dstack": (lambda a, b: tp.dstack([a, b]), lambda a, b: torch.dstack([a, b]),
               [(2, 3), (2, 3, 2)]),
    "column_stack": (lambda a, b, c: tp.column_stack([a, b, c]),
                     lambda a, b, c: torch.column_stack([a, b, c]), [(4,), (4, 2), (4,)]),
    "tensor_split_sections": (lambda a: tp.tensor_split(a, 3, 1),
                              lambda a: torch.tensor_split(a, 3, 1), [(2, 7)]),
    "tensor_split_indices": (lambda a: tp.tensor_split(a, [-2, 1, 9], dim=-1),
                             lambda a: torch.tensor_split(a, [-2, 1, 9], dim=-1), [(2, 7)]),
    "hsplit": (lambda a: tp.hsplit(a, 2), lambda a: torch.hsplit(a, 2), [(3, 4)]),
    "hsplit_1d": (lambda a: tp.hsplit(a, [1, 3]), lambda a: torch.hsplit(a, [1, 3]), [(5,)]),
    "vsplit": (lambda a: tp.vsplit(a, [1]), lambda a: torch.vsplit(a, [1]), [(3, 2)]),
    "dsplit": (lambda a: tp.dsplit(a, 2), lambda a: torch.dsplit(a, 2), [(2, 1, 4)]),
    "block_diag": (tp.block_diag, torch.block_diag, [(), (2,), (2, 3), (1, 1)]),
    "cartesian_prod": (tp.cartesian_prod, torch.cartesian_prod, [(3,), (2,), (2,)]),
    "combinations": (tp.combinations, torch.combinations, [(4,)]),
    "combinations_r3_replacement": (lambda a: tp.combinations(a, 3, True),
                                    lambda a: torch.combinations(a, 3, True), [(3,)]),
    "broadcast_to": (lambda a: tp.broadcast_to(a, (2, -1, 4)),
                     lambda a: torch.broadcast_to(a, (2, -1, 4)), [(3, 1)]),
    "broadcast_tensors": (tp.broadcast_tensors, torch.broadcast_tensors, [(2, 1), (3,), ()]),
    "swapaxes": (lambda a: tp.swapaxes(a, 0, -1), lambda a: torch.swapaxes(a, 0, -1),
                 [(2, 3, 4)]),
    "swapdims": (lambda a: tp.swapdims(a, 2, 1), lambda a: torch.swapdims(a, 2, 1),
                 [(2, 3, 4)]),
    "moveaxis": (lambda a: tp.moveaxis(a, (0, 1), (2, 0)),
                 lambda a: torch.moveaxis(a, (0, 1), (2, 0)), [(2, 3, 4)]),
    "ravel": (tp.ravel, torch.ravel, [(2, 3)]),
    "rot90": (tp.rot90, torch.rot90, [(2, 3)]),
    "rot90_k2": (lambda a: tp.rot90(a, 2, (2, 0)), lambda a: torch.rot90(a, 2, (2, 0)),
                 [(2, 3, 4)]),
    "rot90_k_minus_1": (lambda a: tp.rot90(a, -1, (1, 2)), lambda a: torch.rot90(a, -1, (1, 2)),
                        [(2, 3, 4)]),
    "rot90_k4": (lambda a: tp.rot90(a, 4), lambda a: torch.rot90(a, 4), [(2, 3)]),
    "fliplr": (tp.fliplr, torch.fliplr, [(2, 3, 2)]),
    "flipud": (tp.flipud, torch.flipud, [(3,)]),
    "clone": (tp.clone, torch.clone, [(2, 3)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shape_helpers_value_and_gradient_hold_as_pytorch(queue, rng, case):
    fn, tfn, shapes = CASES[case]
    _against_torch(queue, rng, fn, tfn, shapes)


def test_shape_helpers_give_concrete_values_and_methods(queue):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = leaf(queue, a)
    np.testing.assert_array_equal(tp.hstack([x, x]).to_host(), np.hstack([a, a]))
    np.testing.assert_array_equal(tp.vstack([x, x[0]]).to_host(), np.vstack([a, a[0]]))
    np.testing.assert_array_equal(tp.dstack([x, x]).to_host(), np.dstack([a, a]))
    np.testing.assert_array_equal(tp.column_stack([x[0], x[1]]).to_host(), a.T)
    np.testing.assert_array_equal(tp.block_diag(x[:, :1], x[0, :2]).to_host(),
                                  [[0, 0, 0], [3, 0, 0], [0, 0, 1]])
    np.testing.assert_array_equal(tp.cartesian_prod(x[0, :2], x[1, :2]).to_host(),
                                  [[0, 3], [0, 4], [1, 3], [1, 4]])
    np.testing.assert_array_equal(tp.combinations(x[0], 2, with_replacement=True).to_host(),
                                  [[0, 0], [0, 1], [0, 2], [1, 1], [1, 2], [2, 2]])
    assert tp.combinations(x[0], 0).shape == (0,) and tp.combinations(x[0], 4).shape == (0, 4)
    assert [p.shape for p in x.tensor_split([1, 5], 1)] == [(2, 1), (2, 2), (2, 0)]
    assert [p.shape for p in x.hsplit(3)] == [(2, 1)] * 3 and len(x.vsplit(2)) == 2
    assert [p.op_name for p in tp.tensor_split(x, 2)] == ["tensor_split"] * 2
    np.testing.assert_array_equal(x.rot90().to_host(), np.rot90(a))
    np.testing.assert_array_equal(x.rot90(3, (1, 0)).to_host(), np.rot90(a, 3, (1, 0)))
    np.testing.assert_array_equal(x.fliplr().to_host(), np.fliplr(a))
    np.testing.assert_array_equal(x.flipud().to_host(), np.flipud(a))
    assert x.swapaxes(0, 1).shape == (3, 2) and x.swapdims(1, 0).shape == (3, 2)
    assert x.moveaxis(0, 1).shape == (3, 2) and x.ravel().shape == (6,)
    assert x.broadcast_to((4, 2, 3)).shape == (4, 2, 3)
    assert tp.numel(x) == 6 and x.numel() == 6 and tp.numel(up(queue, 1.0)) == 1
    assert tp.broadcast_shapes((2, 1), (3,), 1) == (2, 3) and tp.broadcast_shapes() == ()
    atleast = tp.atleast_2d(x)
    assert atleast is x and tp.broadcast_tensors(x, x[0])[0] is x       # as PyTorch: itself


def test_clone_is_a_new_buffer_and_ravel_a_view_as_pytorch(queue):
    x = leaf(queue, np.zeros(3), requires_grad=False)
    copy, view = tp.clone(x), tp.ravel(tp.reshape(x, (1, 3)))
    x.value += 1.0
    np.testing.assert_array_equal(copy.to_host(), [0, 0, 0])
    np.testing.assert_array_equal(view.to_host(), [1, 1, 1])


def test_shape_helpers_refuse_bad_input_naming_the_op_and_shapes(queue):
    v, m = leaf(queue, np.ones(3)), leaf(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"hsplit: cannot split a dim of size 3 into 2 equal "
                                          r"sections \(shape \(2, 3\)\)"):
        tp.hsplit(m, 2)
    with pytest.raises(ShapeError, match=r"vsplit: expects a tensor of at least 2 dims, got "
                                          r"shape \(3,\)"):
        tp.vsplit(v, 3)
    with pytest.raises(ShapeError, match=r"dsplit: expects a tensor of at least 3 dims"):
        tp.dsplit(m, 1)
    with pytest.raises(ShapeError, match="tensor_split: the number of sections must be "
                                         "positive, got 0"):
        tp.tensor_split(m, 0)
    with pytest.raises(ShapeError, match=r"tensor_split: indices_or_sections must be an int, a "
                                          r"list of ints or an int tensor, got 2.5"):
        tp.tensor_split(m, 2.5)
    with pytest.raises(ShapeError, match=r"block_diag: input 0 has shape \(1, 2, 3\)"):
        tp.block_diag(leaf(queue, np.ones((1, 2, 3))))
    with pytest.raises(ShapeError, match=r"cartesian_prod: expects 1-D tensors, tensor 1 has "
                                          r"shape \(2, 3\)"):
        tp.cartesian_prod(v, m)
    with pytest.raises(ShapeError, match="combinations: r must be non-negative, got -1"):
        tp.combinations(v, -1)
    with pytest.raises(ShapeError, match=r"broadcast_shapes: shapes \(2,\) and \(3,\) are not "
                                          r"broadcastable"):
        tp.broadcast_shapes((2,), (3,))
    with pytest.raises(ShapeError, match=r"expand: dimension 1 of size 3 cannot expand to 4"):
        tp.broadcast_to(m, (2, 4))
    with pytest.raises(ShapeError, match=r"rot90: expects a tensor of at least 2 dims, got "
                                          r"shape \(3,\)"):
        tp.rot90(v)
    with pytest.raises(ShapeError, match=r"rot90: dims \(1, -1\) name one dim twice"):
        tp.rot90(m, 1, (1, -1))
    with pytest.raises(ShapeError, match=r"fliplr: expects a tensor of at least 2 dims"):
        tp.fliplr(v)
    with pytest.raises(ShapeError, match=r"swapaxes: dim 2 is out of range for a tensor of "
                                          r"shape \(2, 3\)"):
        tp.swapaxes(m, 0, 2)
    with pytest.raises(ShapeError, match=r"vstack: expected a non-empty sequence of tensors"):
        tp.vstack([])


def test_a_captured_step_through_the_shape_helpers_replays_its_eager_bits(queue, rng):
    from conftest import assert_replays_eager
    w = leaf(queue, rng.uniform(0.5, 1.5, (3, 4)))

    def step(x):
        with tp.Tape() as tape:
            h = tp.tensor(x) * w
            h = tp.hstack([h, tp.rot90(h)[:3]]) + tp.vstack(tp.tensor_split(h, [1], 0))[:, :1]
            g = tp.block_diag(h[:1], h[1:, :2]) * 2
            loss = tp.sum(g) + tp.sum(tp.combinations(h[0], 2) ** 2)
            loss = loss + tp.sum(tp.cartesian_prod(h[0], h[1]).prod(1))
            loss = loss + tp.sum(tp.broadcast_tensors(h[:1], tp.swapaxes(h, 0, 1)[:1, :3].T)[1])
            loss = loss + tp.sum(tp.clone(tp.fliplr(h)) * tp.ravel(h)[:1])
        tape.backward(loss)
        return loss.value

    assert_replays_eager(queue, step, w, [rng.standard_normal((3, 4)).astype(np.float32)
                                          for _ in range(3)])
