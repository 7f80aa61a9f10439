"""Autograd NN ops: forward against float64 numpy, every backward against finite differences
(``tp.gradcheck``), cross-entropy labels, batch-norm running statistics, dropout's RNG, and
errors that name the op and the shapes."""

from __future__ import annotations

import nn_reference as ref
import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.tape.ops import nn as nn_ops
from conftest import close, leaf, up


def grads_of(fn, *nodes):
    """Run fn under a tape, backward from sum(fn(...) * 1), return each node's grad."""
    with tp.Tape() as tape:
        out = fn()
    tape.backward(out, grad=pc.Tensor.full(out.queue, out.shape, 1.0))
    return [n.grad.to_host() for n in nodes]


# -- matmul and linear --------------------------------------------------------------------------
@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((1, 7), (7, 33)), ((2, 3, 4), (2, 4, 5)),
                                    ((2, 3, 4), (4, 5)), ((4,), (4, 3)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 3, 4), (4,))])
def test_matmul_forward_and_gradcheck(queue, rng, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    na, nb = leaf(queue, a), leaf(queue, b)
    y = tp.matmul(na, nb)
    assert y.op_name == "matmul"
    close(y.to_host(), np.matmul(a, b))
    assert tp.gradcheck(tp.matmul, [na, nb])
    assert (na @ nb).shape == np.matmul(a, b).shape


def test_matmul_errors(queue):
    with pytest.raises(pc.ShapeError,
                       match=r"matmul: inner dimensions differ: \(3, 4\) @ \(5, 2\)"):
        tp.matmul(up(queue, np.zeros((3, 4))), up(queue, np.zeros((5, 2))))
    with pytest.raises(pc.ShapeError, match=r"matmul: batch sizes differ"):
        tp.matmul(up(queue, np.zeros((2, 3, 4))), up(queue, np.zeros((3, 4, 2))))


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("xs", [(5, 4), (1, 4), (2, 3, 4)])
def test_linear(queue, rng, relu, xs):
    x, w, b = rng.standard_normal(xs), rng.standard_normal((3, 4)), rng.standard_normal(3)
    nx, nw, nb = leaf(queue, x), leaf(queue, w), leaf(queue, b)
    y = tp.linear(nx, nw, nb, relu=relu)
    want = x @ w.T + b
    close(y.to_host(), np.maximum(want, 0) if relu else want)
    assert y.op_name == "linear"
    assert tp.gradcheck(lambda *a: tp.linear(*a, relu=relu), [nx, nw, nb])
    close(tp.linear(up(queue, x), up(queue, w)).to_host(), x @ w.T)     # no bias, raw tensors


def test_linear_error_names_in_features(queue):
    with pytest.raises(pc.ShapeError, match=r"linear: input of shape \(2, 5\) has 5 features.*"
                       r"\(3, 4\) expects in_features=4"):
        tp.linear(up(queue, np.zeros((2, 5))), up(queue, np.zeros((3, 4))))


# -- convolution and pooling --------------------------------------------------------------------
@pytest.mark.parametrize("xs, ws, stride, padding", [((1, 1, 5, 5), (2, 1, 3, 3), 1, 1),
                                                     ((2, 3, 7, 7), (2, 3, 3, 2), 2, 1),
                                                     ((2, 2, 4, 6), (3, 2, 1, 1), 1, 0)])
def test_conv2d(queue, rng, xs, ws, stride, padding):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    nx, nw, nb = leaf(queue, x), leaf(queue, w), leaf(queue, b)
    y = tp.conv2d(nx, nw, nb, stride=stride, padding=padding)
    assert y.op_name == "conv2d"
    close(y.to_host(), ref.conv2d(x, w, b, stride, padding))
    assert tp.gradcheck(lambda *a: tp.conv2d(*a, stride=stride, padding=padding), [nx, nw, nb],
                        max_elements=24)


def test_conv2d_partial_grads(queue, rng):
    """Only the weight needs a gradient (first layer): no input gradient is computed."""
    x, w = rng.standard_normal((2, 1, 8, 8)), rng.standard_normal((3, 1, 3, 3))
    nw = leaf(queue, w)
    with tp.Tape() as tape:
        y = tp.conv2d(up(queue, x), nw, padding=1)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=up(queue, g))
    close(nw.grad.to_host(), ref.conv2d_grads(x, w, g, 1, 1)[1])


def _distinct(rng, shape):
    return rng.permutation(int(np.prod(shape))).reshape(shape) * 0.01


@pytest.mark.parametrize("k, s, p", [(2, None, 0), (3, 2, 1), ((3, 2), 1, (1, 0))])
def test_max_pool2d(queue, rng, k, s, p):
    x = _distinct(rng, (2, 3, 7, 7))
    nx = leaf(queue, x)
    y = tp.max_pool2d(nx, k, s, p)
    assert y.op_name == "max_pool2d"
    close(y.to_host(), ref.max_pool2d(x, k, s, p)[0])
    assert tp.gradcheck(lambda a: tp.max_pool2d(a, k, s, p), [nx], eps=1e-3)


@pytest.mark.parametrize("k, s, p", [(16, 3, 8), ((17, 16), (2, 3), (8, 7))])
def test_max_pool2d_wide_windows(queue, rng, k, s, p):
    """A 16x16 window still saves one byte per output; 17x16 falls back to int indices."""
    x = _distinct(rng, (1, 2, 19, 18))
    nx = leaf(queue, x)
    y = tp.max_pool2d(nx, k, s, p)
    close(y.to_host(), ref.max_pool2d(x, k, s, p)[0])
    assert y.grad_fn.idx.dtype == (np.uint8 if k == 16 else np.int32)
    assert tp.gradcheck(lambda a: tp.max_pool2d(a, k, s, p), [nx], eps=1e-3)


@pytest.mark.parametrize("k, s, p", [(2, None, 0), (3, 2, 1), ((3, 2), 1, (1, 0))])
def test_avg_pool2d(queue, rng, k, s, p):
    x = rng.standard_normal((2, 3, 8, 8))
    nx = leaf(queue, x)
    y = tp.avg_pool2d(nx, k, s, p)
    assert y.op_name == "avg_pool2d"
    close(y.to_host(), ref.avg_pool2d(x, k, s, p))
    assert tp.gradcheck(lambda a: tp.avg_pool2d(a, k, s, p), [nx])


@pytest.mark.parametrize("out", [1, 2, 3, (2, 4)])
def test_adaptive_avg_pool2d(queue, rng, out):
    x = rng.standard_normal((2, 3, 7, 8))
    nx = leaf(queue, x)
    y = tp.adaptive_avg_pool2d(nx, out)
    assert y.op_name == "adaptive_avg_pool2d"
    close(y.to_host(), ref.adaptive_avg_pool2d(x, out))
    assert tp.gradcheck(lambda a: tp.adaptive_avg_pool2d(a, out), [nx])


def test_pool_no_grad_returns_tensor(queue, rng):
    with tp.no_grad():
        y = tp.max_pool2d(leaf(queue, rng.standard_normal((1, 1, 4, 4))), 2)
    assert isinstance(y, pc.Tensor)


# -- softmax and losses -------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((2, 4, 3), 1), ((4, 3), 0)])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_ops(queue, rng, shape, axis, op):
    x = rng.standard_normal(shape) * 3
    nx = leaf(queue, x)
    y = getattr(tp, op)(nx, axis=axis)
    assert y.op_name == op
    close(y.to_host(), getattr(ref, op)(x, axis))
    assert tp.gradcheck(lambda a: getattr(tp, op)(a, axis=axis), [nx])


def test_log_softmax_of_a_row_far_from_zero(queue):
    """A row masked with -1e9 is uniform: -log C, not 0 (x - (m + log s) loses log s when
    |m| is that large; (x - m) - log s does not), and its gradient sums to zero per row."""
    x = leaf(queue, np.array([[-1e9] * 4, [1e9, 1e9, 1e9, 1e9], [0.0, 1.0, 2.0, 3.0]]))
    with tp.Tape() as tape:
        y = tp.log_softmax(x, axis=-1)
    tape.backward(tp.sum(y[0]) + tp.sum(y[1]))
    np.testing.assert_allclose(y.value.to_host()[:2], np.full((2, 4), -np.log(4)), rtol=1e-6)
    np.testing.assert_allclose(x.grad.to_host()[:2], np.zeros((2, 4)), atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_cross_entropy(queue, rng, dtype):
    x, labels = rng.standard_normal((7, 5)) * 2, rng.integers(0, 5, 7)
    nx = leaf(queue, x)
    lab = up(queue, labels, dtype)
    loss = tp.cross_entropy(nx, lab)
    assert loss.op_name == "cross_entropy" and loss.shape == ()
    close(loss.item(), ref.cross_entropy(x, labels))
    assert tp.gradcheck(lambda a: tp.cross_entropy(a, lab), [nx])
    (g,) = grads_of(lambda: tp.cross_entropy(nx, tp.tensor(lab)), nx)   # labels as a Node
    close(g, ref.cross_entropy_grad(x, labels))


def test_cross_entropy_out_of_range_labels(queue):
    x = leaf(queue, np.zeros((4, 3)))
    bad = up(queue, [0, 2, 3, 1], np.int64)
    with tp.Tape() as tape:
        loss = tp.cross_entropy(x, bad)          # no host sync here: checked in backward
    with pytest.raises(pc.ShapeError, match=r"label 3 at row 2"):
        loss.item()                              # the loss is NaN garbage: reading it raises
    with pytest.raises(pc.ShapeError, match=r"cross_entropy: label 3 at row 2 is out of range "
                       r"for 3 classes \(logits \(4, 3\)\)"):
        tape.backward(loss)
    with pytest.raises(pc.ShapeError, match=r"label -1 at row 0"):
        with tp.no_grad():
            tp.cross_entropy(x, up(queue, [-1, 0, 0, 0], np.int32))
    with pytest.raises(pc.ShapeError, match=r"label 3 at row 2"):
        tp.cross_entropy(x, bad, check_labels=True)


def test_cross_entropy_bad_label_under_detect_anomaly(queue):
    """Anomaly mode reads every output anyway: the label error comes first, not a NaN alarm."""
    x = leaf(queue, np.zeros((2, 3)))
    with tp.detect_anomaly(), tp.Tape():
        with pytest.raises(pc.ShapeError, match=r"label 5 at row 1"):
            tp.cross_entropy(x, up(queue, [0, 5], np.int32))


def test_cross_entropy_input_errors(queue):
    x = up(queue, np.zeros((4, 3)))
    with pytest.raises(pc.DTypeError, match=r"cross_entropy: labels have dtype float32"):
        tp.cross_entropy(x, up(queue, np.zeros(4)))
    with pytest.raises(pc.ShapeError, match=r"labels have shape \(3,\), expected \(4,\)"):
        tp.cross_entropy(x, up(queue, [0, 1, 2], np.int64))
    with pytest.raises(pc.ShapeError, match=r"logits must be 2-D"):
        tp.cross_entropy(up(queue, np.zeros(4)), up(queue, [0, 1, 2, 0], np.int64))


def test_mse_loss(queue, rng):
    p, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    np_, nt = leaf(queue, p), leaf(queue, t)
    loss = tp.mse_loss(np_, up(queue, t))
    assert loss.op_name == "mse_loss" and loss.shape == ()
    close(loss.item(), ((p - t) ** 2).mean())
    assert tp.gradcheck(tp.mse_loss, [np_, nt])
    with pytest.raises(pc.ShapeError, match=r"mse_loss: prediction \(3, 4\) and target \(4, 3\)"):
        tp.mse_loss(np_, up(queue, t.T))


# -- batch norm -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 2, 3, 3), (6, 3)])
def test_batch_norm_train_gradcheck_and_running_stats(queue, rng, shape):
    c = shape[1]
    x = rng.standard_normal(shape) * 2 + 1
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    nx, nw, nb = leaf(queue, x), leaf(queue, w), leaf(queue, b)
    rm, rv = up(queue, np.zeros(c)), up(queue, np.ones(c))
    y = tp.batch_norm(nx, nw, nb, rm, rv, training=True, momentum=0.1)
    assert y.op_name == "batch_norm"
    want, wrm, wrv = ref.batch_norm_train(x, w, b, np.zeros(c), np.ones(c), 0.1)
    close(y.to_host(), want)
    close(rm.to_host(), wrm)
    close(rv.to_host(), wrv)
    rm2, rv2 = up(queue, np.zeros(c)), up(queue, np.ones(c))
    assert tp.gradcheck(lambda *a: tp.batch_norm(*a, rm2, rv2, training=True), [nx, nw, nb],
                        atol=5e-3)


def test_batch_norm_eval(queue, rng):
    x = rng.standard_normal((2, 3, 4, 4))
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    rm0, rv0 = rng.standard_normal(3), rng.random(3) + 0.5
    nx, nw, nb = leaf(queue, x), leaf(queue, w), leaf(queue, b)
    rm, rv = up(queue, rm0), up(queue, rv0)
    y = tp.batch_norm(nx, nw, nb, rm, rv, training=False)
    close(y.to_host(), ref.batch_norm_eval(x, w, b, rm0, rv0))
    close(rm.to_host(), rm0)
    assert tp.gradcheck(lambda *a: tp.batch_norm(*a, rm, rv, training=False), [nx, nw, nb])


def test_batch_norm_errors(queue):
    x = up(queue, np.zeros((2, 3, 4, 4)))
    with pytest.raises(pc.ShapeError, match=r"batch_norm: weight has shape \(4,\), expected "
                       r"\(3,\)"):
        tp.batch_norm(x, up(queue, np.ones(4)), None, None, None, training=True)
    with pytest.raises(pc.ShapeError, match=r"more than 1 value per channel"):
        tp.batch_norm(up(queue, np.zeros((1, 3))), None, None, None, None, training=True)



def test_batch_norm_refuses_running_statistics_pytorch_refuses(queue, rng):
    # PyTorch's F.batch_norm order (x, running_mean, running_var, weight, bias) gave parcl's
    # parameters as the statistics: the output all ones (0 * x_hat + 1) and the weights
    # overwritten by running averages ([1, 2, 3] became [0.907, 1.791, 2.708]), silently.
    x = up(queue, rng.standard_normal((4, 3)))
    w, b = leaf(queue, np.array([1.0, 2.0, 3.0])), leaf(queue, np.zeros(3))
    rm, rv = up(queue, np.zeros(3)), up(queue, np.ones(3))
    with pytest.raises(pc.ParclError, match=r"batch_norm: running_mean requires grad.*PyTorch"):
        with tp.Tape():
            tp.batch_norm(x, rm, rv, w, b, True)
    np.testing.assert_array_equal(w.value.to_host(), [1, 2, 3])
    # one statistic without the other: PyTorch refuses it; parcl left the given one stale in
    # training and normalised with the batch's statistics in evaluation
    for training in (True, False):
        for stats in ((rm, None), (None, rv)):
            with pytest.raises(pc.ParclError, match="both be None or neither"):
                tp.batch_norm(x, w, b, *stats, training)
    with pytest.raises(ValueError, match="both be None or neither"):
        torch.nn.functional.batch_norm(torch.zeros(4, 3), torch.zeros(3), None, training=True)
    # a frozen Node is no parameter in training: still taken as a statistic, as before
    frozen_rm = tp.tensor(up(queue, np.zeros(3)), requires_grad=False)
    tp.batch_norm(x, w, b, frozen_rm, rv, True)
    assert np.abs(frozen_rm.value.to_host()).max() > 0


def test_batch_norm_in_evaluation_without_running_statistics_is_refused_as_pytorch(queue):
    # Evaluation normalised with the batch's statistics when given none, ignoring
    # training=False; PyTorch's order F.batch_norm(x, rm, rv, None, None, False) took the
    # statistics as weight and bias: row 0 came out [1.776, 0.5, 3.530], PyTorch's
    # [0.354, 4.243, 1.0].
    x = np.array([[1, 2, 3], [3, 0, -1], [0, 4, 2], [2, 2, 0]], np.float32)
    rm, rv = np.array([0.5, -1, 2], np.float32), np.array([2, 0.5, 1], np.float32)
    want = torch.nn.functional.batch_norm(torch.from_numpy(x), torch.from_numpy(rm),
                                          torch.from_numpy(rv), None, None, False).numpy()
    with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
        torch.nn.functional.batch_norm(torch.from_numpy(x), None, None, training=False)
    for args in ((up(queue, rm), up(queue, rv), None, None), (None, None, None, None),
                 (up(queue, np.ones(3)), up(queue, np.zeros(3)), None, None)):
        with pytest.raises(pc.ParclError, match=r"batch_norm: training=False normalises with "
                           r"the running statistics, but running_mean and running_var are "
                           r"None.*PyTorch's F.batch_norm takes running_mean"):
            tp.batch_norm(up(queue, x), *args, False)
    # parcl's order, and the batch's statistics in training, as before
    y = tp.batch_norm(up(queue, x), None, None, up(queue, rm), up(queue, rv), False)
    close(y.to_host(), want)
    y = tp.batch_norm(up(queue, x), None, None, None, None, True)
    close(y.to_host(), torch.nn.functional.batch_norm(torch.from_numpy(x), None, None,
                                                      training=True).numpy())

# -- dropout ----------------------------------------------------------------------------------
def test_dropout_scaling_determinism_and_eval(queue, rng):
    x = rng.random((64, 33)) + 0.5
    nx = leaf(queue, x)
    assert tp.dropout(nx, 0.5, training=False) is nx
    assert tp.dropout(nx, 0.0, training=True) is nx
    tp.manual_seed(7)
    a = tp.dropout(nx, 0.3, training=True)
    b = tp.dropout(nx, 0.3, training=True)            # the counter moved on: another mask
    tp.manual_seed(7)
    a2 = tp.dropout(nx, 0.3, training=True)
    ha, hb = a.to_host(), b.to_host()
    assert a.op_name == "dropout"
    assert np.array_equal(ha, a2.to_host()) and not np.array_equal(ha, hb)
    kept = ha != 0
    close(ha[kept], (x / 0.7)[kept], 1e-5)
    assert abs(1 - kept.mean() - 0.3) < 0.05
    assert tp.gradcheck(lambda t: tp.dropout(t, 0.3, True, seed=11), [nx])
    (g,) = grads_of(lambda: tp.dropout(nx, 0.3, True, seed=11), nx)
    mask = tp.dropout(up(queue, np.ones(x.shape)), 0.3, True, seed=11).to_host()
    close(g, mask)                                    # the same mask, regenerated
    with pytest.raises(pc.ShapeError, match=r"dropout: probability p must be in \[0, 1\]"):
        tp.dropout(nx, 1.5, True)


def test_dropout_rng_is_thread_local(queue):
    import threading
    tp.manual_seed(1)
    nn_ops.set_rng_state((5, 9))
    seen = []
    t = threading.Thread(target=lambda: seen.append(nn_ops.rng_state()))
    t.start()
    t.join(30)
    assert seen == [(0, 0)] and nn_ops.rng_state() == (5, 9)


def test_cross_entropy_of_a_row_far_from_zero(queue):
    """Logits of -1e9 everywhere in a row (a masked row) are uniform: loss log C and the
    gradient softmax - onehot, as for logits near zero (its log-sum-exp is kept as max and
    log-sum: their sum would lose the log-sum)."""
    x = leaf(queue, np.array([[-1e9] * 4, [1e9] * 4]))
    labels = up(queue, np.array([2, 0]), np.int64)
    with tp.Tape() as tape:
        loss = tp.cross_entropy(x, labels)
    tape.backward(loss)
    np.testing.assert_allclose(loss.item(), np.log(4), rtol=1e-6)
    want = (np.full((2, 4), 0.25) - np.eye(4)[[2, 0]]) / 2
    np.testing.assert_allclose(x.grad.to_host(), want, atol=1e-6)


def test_soft_cross_entropy_of_a_row_far_from_zero(queue):
    x = leaf(queue, np.array([[-1e9] * 4, [1e9] * 4]))
    target = leaf(queue, np.array([[0.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]]))
    with tp.Tape() as tape:
        loss = tp.cross_entropy(x, target)
    tape.backward(loss)
    np.testing.assert_allclose(loss.item(), np.log(4), rtol=1e-6)
    np.testing.assert_allclose(x.grad.to_host(), (0.25 - target.value.to_host()) / 2,
                               atol=1e-6)
    np.testing.assert_allclose(target.grad.to_host(), np.full((2, 4), np.log(4) / 2),
                               rtol=1e-6)


def test_softmax_and_log_softmax_of_a_0d_input_over_dim_0_or_minus_1_as_pytorch(queue):
    """``torch.softmax(s, 0)`` of a 0-d ``s`` is the 0-d 1.0 (log_softmax 0.0, gradient 0;
    NaN for an infinite ``s``), dim -1 alike; parcl raised 'softmax: needs at least a 1-D
    input, got a scalar' (tp.softmax, tp.log_softmax, tp.softmin, the Node methods and
    nn.Softmax/LogSoftmax/Softmin, whose legacy dim is 0 there). Dim 1 is a ShapeError, as
    PyTorch's IndexError."""
    calls = [(tp.softmax, torch.softmax), (tp.log_softmax, torch.log_softmax),
             (tp.softmin, torch.nn.functional.softmin)]
    for value in (2.5, float("inf")):
        for ours, theirs in calls:
            for dim in (0, -1):
                t = torch.tensor(value, requires_grad=True)
                want = theirs(t, dim)
                (want * 3.0).backward()
                s = leaf(queue, value)
                with tp.Tape() as tape:
                    got = ours(s, dim)
                tape.backward(got * 3.0)
                assert got.shape == ()
                np.testing.assert_array_equal(got.to_host(), want.detach().numpy())
                np.testing.assert_array_equal(s.grad.to_host(), t.grad.numpy())
    s = leaf(queue, 2.5)
    assert float(s.softmax(-1)) == 1.0 and float(s.log_softmax(0)) == 0.0
    assert float(pc.nn.LogSoftmax(0)(s)) == 0.0 and float(pc.nn.Softmin(-1)(s)) == 1.0
    with pytest.raises(pc.ShapeError, match=r"softmax: axis 1 is out of range .* shape \(\)"):
        tp.softmax(s, 1)
