"""where, masked_fill, embedding, boolean masks through Tensor.from_host, and gelu's tanh
form: forward against float64 numpy, backward against finite differences, determinism of the
embedding backward with repeated indices, and out-of-range indices raising."""

from __future__ import annotations

import math

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up


def test_from_host_accepts_bool_masks(queue):
    t = pc.Tensor.from_host(queue, np.array([[True, False, True]]))
    assert t.dtype == np.uint8 and t.shape == (1, 3)
    assert t.to_host().tolist() == [[1, 0, 1]]
    with pytest.raises(TypeError, match="not supported"):
        pc.Tensor.from_host(queue, np.zeros(3, np.uint16))


@pytest.mark.parametrize("sc, sa, sb", [((3, 4), (3, 4), (3, 4)), ((3, 1), (3, 4), (4,)),
                                        ((1,), (2, 1, 5), (3, 1)), ((2, 3), (), (2, 3))])
@pytest.mark.parametrize("cdtype", [np.bool_, np.int32, np.int64, np.float32])
def test_where_forward_and_gradcheck(queue, rng, sc, sa, sb, cdtype):
    c = (rng.random(sc) > 0.5).astype(cdtype)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    ca, na, nb = pc.Tensor.from_host(queue, c), leaf(queue, a), leaf(queue, b)
    y = tp.where(ca, na, nb)
    assert y.op_name == "where"
    np.testing.assert_array_equal(y.to_host(), np.where(c, a, b).astype(np.float32))
    assert tp.gradcheck(lambda x, z: tp.where(ca, x, z), [na, nb])


def test_where_scalars_numpy_masks_and_inf(queue):
    c = np.array([True, False, True])
    x = leaf(queue, [1.0, 2.0, 3.0])
    assert tp.where(c, x, -np.inf).to_host().tolist() == [1.0, -np.inf, 3.0]
    assert tp.where(c, 0.5, x).to_host().tolist() == [0.5, 2.0, 0.5]
    with tp.Tape() as tape:
        y = tp.sum(tp.where(c, x, float("inf")) * 0.0 + tp.where(c, x, 0.0))
    tape.backward(y)
    assert x.grad.to_host().tolist() == [1.0, 0.0, 1.0]      # no NaN from the inf branch


def test_masked_fill(queue, rng):
    x = rng.standard_normal((2, 4, 4))
    mask = np.triu(np.ones((4, 4), bool), k=1)             # a causal mask, broadcast
    nx = leaf(queue, x)
    y = tp.masked_fill(nx, pc.Tensor.from_host(queue, mask), -1e9)
    np.testing.assert_array_equal(y.to_host(), np.where(mask, -1e9, x).astype(np.float32))
    assert y.op_name == "where"
    assert tp.gradcheck(lambda t: tp.masked_fill(t, mask, 0.0), [nx])
    with pytest.raises(pc.ShapeError, match=r"masked_fill: mask of shape \(1, 2, 4, 4\) does "
                                            r"not broadcast to the input's shape \(2, 4, 4\)"):
        tp.masked_fill(nx, np.ones((1, 2, 4, 4), bool), 0.0)


def test_where_errors(queue):
    with pytest.raises(pc.ShapeError, match=r"where: shapes .* are not broadcastable"):
        tp.where(np.ones(3, bool), up(queue, np.ones(4)), 0.0)
    with pytest.raises(pc.DTypeError, match=r"where: dtype int64 is not supported"):
        tp.where(np.ones(1, bool), up(queue, [1], np.int64), 0.0)


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(5,), (2, 3), (1, 1, 4)])
def test_embedding_forward_and_gradcheck(queue, rng, idx_dtype, shape):
    w = rng.standard_normal((6, 3))
    idx = rng.integers(0, 6, shape).astype(idx_dtype)
    idx.flat[0] = idx.flat[-1] = 5                       # a repeated index
    nw, ti = leaf(queue, w), pc.Tensor.from_host(queue, idx)
    y = tp.embedding(ti, nw)
    assert y.op_name == "embedding" and y.shape == (*shape, 3)
    np.testing.assert_array_equal(y.to_host(), w.astype(np.float32)[idx])
    assert tp.gradcheck(lambda t: tp.embedding(ti, t), [nw])


def test_embedding_backward_sums_repeats_bit_identically(queue, rng):
    v, d, n = 5, 7, 300
    idx = rng.integers(0, 2, n)                           # heavy repetition of rows 0 and 1
    g = rng.standard_normal((n, d)).astype(np.float32)
    ti, tg = pc.Tensor.from_host(queue, idx), pc.Tensor.from_host(queue, g)
    grads = []
    for _ in range(3):
        nw = leaf(queue, np.zeros((v, d)))
        with tp.Tape() as tape:
            y = tp.embedding(ti, nw)
        tape.backward(y, grad=tg)
        grads.append(nw.grad.to_host())
    want = np.zeros((v, d))
    np.add.at(want, idx, g.astype(np.float64))
    np.testing.assert_allclose(grads[0], want, atol=1e-4)
    assert np.array_equal(grads[0], grads[1]) and np.array_equal(grads[0], grads[2])
    assert not grads[0][2:].any()


def test_embedding_out_of_range_raises(queue):
    w = leaf(queue, np.ones((4, 2)))
    bad = pc.Tensor.from_host(queue, np.array([[0, 3], [4, 1]]))
    with tp.no_grad(), pytest.raises(pc.ShapeError, match=r"embedding: index 4 at position "
                                                          r"\(1, 0\) of indices \(2, 2\) is out "
                                                          r"of range for a weight of 4 rows"):
        tp.embedding(bad, w)
    with tp.Tape() as tape:
        y = tp.embedding(pc.Tensor.from_host(queue, np.array([-1, 2])), w)
    with pytest.raises(pc.ShapeError, match=r"index -1 at position \(0,\)"):
        y.to_host()                                      # never a silent wrong row
    with pytest.raises(pc.ShapeError, match=r"index -1 at position \(0,\)"):
        tape.backward(y, grad=up(queue, np.ones((2, 2))))
    with pytest.raises(pc.DTypeError, match="embedding: indices"):
        tp.embedding(up(queue, [0.0]), w)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def test_gelu_tanh(queue, rng):
    x = np.concatenate([rng.standard_normal(20) * 3, [0.0, -30.0, 30.0]])
    nx = leaf(queue, x)
    y = tp.gelu(nx, approximate="tanh")
    assert y.op_name == "gelu"
    np.testing.assert_allclose(y.to_host(), _gelu_tanh(x), atol=2e-6, rtol=1e-5)
    assert tp.gradcheck(lambda t: tp.gelu(t, approximate="tanh"), [leaf(queue, x[:20])])
    exact = tp.gelu(nx).to_host()                        # the default stays the erf form
    assert np.abs(exact - y.to_host()).max() > 1e-5
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        tp.gelu(nx, approximate="fast")


def test_gelu_tanh_saturates_exactly_far_out(queue):
    """Far out the tanh is exactly +-1 in float32: gelu(x) is x or 0 and its gradient 1 or
    0, as PyTorch's (a tanh one float short of 1 made the gradient 1.0064 at x = 100)."""
    x = leaf(queue, np.array([-100.0, -30.0, -10.0, 10.0, 30.0, 100.0]))
    with tp.Tape() as tape:
        y = tp.gelu(x, approximate="tanh")
    tape.backward(tp.sum(y))
    np.testing.assert_array_equal(y.value.to_host(), [0, 0, 0, 10, 30, 100])
    np.testing.assert_array_equal(x.grad.to_host(), [0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("n", [16, 64], ids=["tail", "whole-vectors"])
def test_gelu_gradient_far_out_is_one_or_zero(queue, n):
    """Beyond |x| ~ 13 phi(x) is under float's normal range: the exact GELU's gradient
    Phi(x) + x phi(x) is 1 or 0, as PyTorch's. The exp clamped at exp(-87) made x phi(x)
    grow with x: 1.0066 at x = 1e36, -1.97 at x = -3e38."""
    far = [-3e38, -1e37, -1e36, -1e20, -100.0, -13.5, 13.5, 100.0, 1e20, 1e36, 1e37, 3e38]
    values = np.resize(np.array(far, np.float32), n)
    x = leaf(queue, values)
    with tp.Tape() as tape:
        y = tp.gelu(x)
    tape.backward(tp.sum(y))
    want = (values > 0).astype(np.float32)
    np.testing.assert_allclose(x.grad.to_host(), want, rtol=0, atol=1e-30)
    np.testing.assert_array_equal(y.value.to_host(), np.where(values > 0, values, 0))


def test_embedding_in_a_captured_step(queue, rng):
    """Replays equal the eager step bit for bit; indices that are an input of the step are
    range-checked on the host before a replay uploads them, computed ones on the device."""
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    c = pc.Tensor.from_host(queue, rng.standard_normal((2, 3, 3)).astype(np.float32))

    def make(indices_of):
        w = tp.tensor(pc.Tensor.from_host(queue, w0), True)
        w.grad = pc.Tensor.zeros(queue, (5, 3))     # each step adds into it

        def body(idx):
            with tp.Tape() as tape:
                loss = tp.sum(tp.layer_norm(tp.embedding(indices_of(idx), w), 3) * c)
            tape.backward(loss)
            return loss.value
        return w, tp.capture(body, queue)

    idx = np.array([[1, 4, 4], [0, 1, 2]])
    for indices_of in (lambda i: i, lambda i: i.copy()):
        w, step = make(indices_of)
        step(idx)
        eager = w.grad.to_host()
        step(idx)                                   # replayed: adds the same gradient again
        assert step.replays == 1
        assert np.abs(eager).max() > 0.1 and np.array_equal(w.grad.to_host(), 2 * eager)
        bad = idx.copy()
        bad[1, 2] = 9
        with pytest.raises(pc.ShapeError, match=r"index 9 at position \(1, 2\)"):
            step(bad)


def test_embedding_checks_at_once_under_detect_anomaly(queue):
    w = leaf(queue, np.ones((3, 2)))
    with tp.detect_anomaly(), tp.Tape(), pytest.raises(pc.ShapeError,
                                                       match=r"index 3 at position \(0,\)"):
        tp.embedding(pc.Tensor.from_host(queue, np.array([3], np.int32)), w)


@pytest.mark.parametrize("V, n", [(1, 5), (7, 33), (300, 1000)])
def test_embedding_backward_lists_built_either_way_give_the_same_bits(queue, rng, V, n):
    """The per-row position lists of the embedding backward: one work-item walking the
    indices once (CPUs) or a work-item per row (GPUs), repeated indices summed in index
    order both ways; against numpy."""
    from parcl.kernels import select as sk
    idx = rng.integers(0, V, n).astype(np.int64)
    g = rng.standard_normal((n, 4)).astype(np.float32)
    ti, tg = pc.Tensor.from_host(queue, idx), pc.Tensor.from_host(queue, g)
    got = [sk.embedding_backward(ti, tg, V, _parallel_lists=p).to_host() for p in (True, False)]
    np.testing.assert_array_equal(got[0].view(np.int32), got[1].view(np.int32))
    want = np.zeros((V, 4))
    np.add.at(want, idx, g.astype(np.float64))
    np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-5)
