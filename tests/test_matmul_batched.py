"""matmul batched over any number of leading dims with numpy broadcasting: forward against
float64 numpy, backward against finite differences, the 2-D paths unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.kernels.gemm import batched_gemm, gemm
from conftest import leaf


SHAPES = [
    ((2, 3, 5, 4), (2, 3, 4, 3)),      # (B, H, T, D) @ (B, H, D, T)
    ((5, 4), (2, 4, 3)),               # shared left operand
    ((2, 1, 3, 4), (1, 3, 4, 2)),      # both broadcast
    ((3, 1, 4), (2, 4, 5)),            # batches (3,) and (2,): not broadcastable
    ((2, 3, 5, 4), (4, 3)),            # shared right operand, folded
    ((2, 3, 5, 4), (3, 4, 1)),         # right broadcast over the leading dim, N = 1
    ((4,), (2, 3, 4, 5)),              # 1-D left
    ((2, 3, 1, 7), (7,)),              # 1-D right
    ((1, 1, 1), (1, 1, 1)),
]


@pytest.mark.parametrize("sa,sb", SHAPES[:3] + SHAPES[4:])
def test_matmul_batched_forward_and_gradcheck(queue, rng, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape():
        y = na @ nb
    assert y.op_name == "matmul" and y.shape == np.matmul(a, b).shape
    np.testing.assert_allclose(y.to_host(), np.matmul(a, b), rtol=1e-5, atol=1e-5)
    assert tp.gradcheck(tp.matmul, [na, nb])


def test_matmul_batch_broadcast_error(queue):
    with pytest.raises(pc.ShapeError, match=r"matmul: batch sizes differ.*\(2, 3\).*\(4,\)"):
        tp.matmul(pc.Tensor.zeros(queue, (2, 3, 5, 4)), pc.Tensor.zeros(queue, (4, 4, 2)))
    # (3, 1, 4) @ (2, 4, 5): batch (3,) vs (2,) do not broadcast
    with pytest.raises(pc.ShapeError, match="matmul: batch sizes differ"):
        tp.matmul(pc.Tensor.zeros(queue, SHAPES[3][0]), pc.Tensor.zeros(queue, SHAPES[3][1]))


def test_matmul_broadcast_gradients_are_sums(queue, rng):
    """The shared operand's gradient is the sum over the batch (float64 reference)."""
    a, b = rng.standard_normal((5, 4)), rng.standard_normal((3, 4, 2))
    g = rng.standard_normal((3, 5, 2))
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape() as tape:
        y = na @ nb
    tape.backward(y, grad=pc.Tensor.from_host(queue, g.astype(np.float32)))
    np.testing.assert_allclose(na.grad.to_host(), np.einsum("bmn,bkn->mk", g, b), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(nb.grad.to_host(), np.einsum("mk,bmn->bkn", a, g), rtol=1e-5,
                               atol=1e-5)


def test_matmul_2d_and_3d_paths_bit_identical_to_gemm(queue, rng):
    """The products that existed before batching take the very same GEMM launches."""
    a2, b2 = rng.standard_normal((33, 20)).astype(np.float32), \
        rng.standard_normal((20, 17)).astype(np.float32)
    a3 = rng.standard_normal((3, 33, 20)).astype(np.float32)
    b3 = rng.standard_normal((3, 20, 17)).astype(np.float32)
    up = lambda x: pc.Tensor.from_host(queue, x)         # noqa: E731
    assert np.array_equal(tp.matmul(up(a2), up(b2)).to_host(), gemm(up(a2), up(b2)).to_host())
    assert np.array_equal(tp.matmul(up(a3), up(b3)).to_host(),
                          batched_gemm(up(a3), up(b3)).to_host())
    assert np.array_equal(tp.matmul(up(a3), up(b2)).to_host(),
                          gemm(up(a3.reshape(99, 20)), up(b2)).to_host().reshape(3, 33, 17))


def test_matmul_4d_repeatable(queue, rng):
    a, b = rng.standard_normal((2, 3, 9, 8)), rng.standard_normal((1, 3, 8, 9))
    runs = []
    for _ in range(2):
        na, nb = leaf(queue, a), leaf(queue, b)
        with tp.Tape() as tape:
            y = tp.sum(na @ nb)
        tape.backward(y)
        runs.append((y.to_host(), na.grad.to_host(), nb.grad.to_host()))
    for x, z in zip(*runs):
        assert np.array_equal(x, z)


def test_batched_gemm_shared_left(queue, rng):
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((3, 5, 4)).astype(np.float32)
    for trans_a, ha in ((False, a), (True, a.T.copy())):
        got = batched_gemm(pc.Tensor.from_host(queue, ha), pc.Tensor.from_host(queue, b),
                           trans_a=trans_a, trans_b=True).to_host()
        np.testing.assert_allclose(got, a @ b.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
