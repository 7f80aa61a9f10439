"""The eager tape's fast paths give the same bits as the plain ones: the weight gradient
accumulated by its GEMM, gradients shared by pass-through backwards and copied on write."""

from __future__ import annotations

import numpy as np

import parcl as pc
import parcl.tape as tp
from parcl.kernels import elementwise as ew
from parcl.kernels._cache import trace_launches
from parcl.kernels.gemm import gemm, product, product2
from parcl.tape.ops import unary


def _chain(queue, rng_seed=0, depth=4):
    rng = np.random.default_rng(rng_seed)
    w = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32) * 0.5),
                  requires_grad=True)
    x = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)),
                  requires_grad=True)
    h = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)))
    with tp.Tape() as tape:
        for _ in range(depth):
            h = tp.tanh(h @ w + x)
        loss = tp.sum(h)
    tape.backward(loss)
    return loss.to_host(), w.grad.to_host(), x.grad.to_host()


def test_gemm_accumulating_with_beta_1_equals_gemm_then_axpy_bit_for_bit(queue, rng):
    for m, k, n in ((4, 4, 4), (7, 5, 3), (64, 48, 40)):
        a = pc.Tensor.from_host(queue, rng.standard_normal((k, m), np.float32))
        g = pc.Tensor.from_host(queue, rng.standard_normal((k, n), np.float32))
        c0 = rng.standard_normal((m, n), np.float32)
        fused = pc.Tensor.from_host(queue, c0)
        gemm(a, g, trans_a=True, out=fused, beta=1.0)
        plain = ew.axpy(pc.Tensor.from_host(queue, c0), gemm(a, g, trans_a=True), 1.0)
        assert fused.to_host().tobytes() == plain.to_host().tobytes()


def test_copy_on_write_add_equals_the_in_place_add_bit_for_bit(queue, rng):
    y0, x0 = rng.standard_normal((2, 37), np.float32)
    y = pc.Tensor.from_host(queue, y0)
    x = pc.Tensor.from_host(queue, x0)
    new = ew.binary("add", y, x)
    assert new.to_host().tobytes() == ew.axpy(y, x, 1.0).to_host().tobytes()


def test_a_shared_inner_gradient_is_copied_on_write(queue, rng):
    """u = a @ w feeds s = u + x (whose backward hands its upstream to u and x uncopied) and
    also the loss directly: u's second contribution must not change s.grad."""
    a0, w0, x0 = (rng.standard_normal((3, 3), np.float32) for _ in range(3))
    a, w, x = (tp.tensor(pc.Tensor.from_host(queue, v), requires_grad=True)
               for v in (a0, w0, x0))
    with tp.Tape() as tape:
        u = a @ w
        s = u + x
        loss = tp.sum(s * s) + tp.sum(u)
    tape.backward(loss)
    s64 = a0.astype(np.float64) @ w0 + x0
    np.testing.assert_allclose(s.grad.to_host(), 2 * s64, rtol=1e-5)
    np.testing.assert_allclose(u.grad.to_host(), 2 * s64 + 1, rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_host(), 2 * s64, rtol=1e-5)
    x.grad.fill_(0)                          # a leaf's gradient is its own buffer
    np.testing.assert_allclose(s.grad.to_host(), 2 * s64, rtol=1e-5)


def test_weight_used_twice_gets_both_gemm_contributions(queue, rng):
    h0, w0 = rng.standard_normal((2, 4, 4), np.float32)
    h, w = tp.tensor(pc.Tensor.from_host(queue, h0)), tp.tensor(
        pc.Tensor.from_host(queue, w0), requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum((h @ w) @ w)
    tape.backward(loss)
    h64, w64 = h0.astype(np.float64), w0.astype(np.float64)
    ones = np.ones((4, 4))
    want = (h64 @ w64).T @ ones + h64.T @ (ones @ w64.T)
    np.testing.assert_allclose(w.grad.to_host(), want, rtol=1e-4, atol=1e-5)
    assert tp.gradcheck(lambda v: tp.sum((h @ v) @ v), [w])


ACTIVATIONS = {"tanh": tp.tanh, "sigmoid": tp.sigmoid, "relu": tp.relu, "sqrt": tp.sqrt}


def _bits(t) -> np.ndarray:
    return t.to_host().view(np.int32)


def test_an_activation_backward_adding_into_acc_equals_it_then_axpy_bit_for_bit(queue, rng):
    for op in ew.ACCUMULATING:
        helper = getattr(ew, op)
        for shape in ((4, 4), (37,), (1000,)):
            saved0, g0, acc0 = rng.standard_normal((3, *shape), np.float32)
            saved = pc.Tensor.from_host(queue, np.abs(saved0) if op == "sqrt_backward"
                                        else np.tanh(saved0))
            g = pc.Tensor.from_host(queue, g0)
            acc = pc.Tensor.from_host(queue, acc0)
            fused = helper(saved, g, acc=acc)
            plain = helper(saved, g)
            np.testing.assert_array_equal(_bits(fused), _bits(plain))
            summed = ew.axpy(pc.Tensor.from_host(queue, acc0), plain, 1.0)
            np.testing.assert_array_equal(_bits(acc), _bits(summed))


def _grads(queue, act, build, seed=0):
    """The leaves' gradients after two backward passes (the second accumulates into the
    first's .grad), and the names of the kernels the second launched."""
    rng = np.random.default_rng(seed)
    w = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((5, 5), np.float32) * 0.5),
                  requires_grad=True)
    x = tp.tensor(pc.Tensor.from_host(queue, np.abs(rng.standard_normal((5, 5), np.float32))
                                      + 0.5), requires_grad=True)      # sqrt's inputs > 0
    h = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((5, 5), np.float32)))
    for _ in range(2):
        with tp.Tape() as tape:
            loss = build(act, h, w, x)
        with trace_launches() as launches:
            tape.backward(loss)
    return [_bits(w.grad), _bits(x.grad)], [name for name, _, _ in launches]


def _chain(act, h, w, x):
    for _ in range(4):
        h = act(tp.abs(h @ w) + x)
    return tp.sum(h * h)


def _add_read_twice(act, h, w, x):
    """s = h @ w + x feeds the activation and the loss: s gets two gradients, so the
    activation's alone must not go into x.grad."""
    s = tp.abs(h @ w) + x
    return tp.sum(act(s)) + tp.sum(s * s)


def _leaf_twice(act, h, w, x):
    return tp.sum(act(x + x) @ w)


def test_the_leaf_gradient_an_add_hands_on_is_added_by_the_activation_bit_for_bit(
        queue, monkeypatch):
    """tanh(h @ w + x): tanh's backward kernel adds its gradient into x.grad itself (the add
    hands it on unchanged) instead of an axpy after the add's backward; the same bits."""
    for name, act in ACTIVATIONS.items():
        for build, fused in ((_chain, True), (_add_read_twice, False), (_leaf_twice, False)):
            new, launched = _grads(queue, act, build)
            kernel = f"{name}_backward_acc"
            assert (kernel in launched) == fused, (name, build.__name__, launched)
            for cls in (unary.Tanh, unary.Sigmoid, unary.Relu, unary.Sqrt):
                monkeypatch.setattr(cls, "adds_into", False)
            old, launched_old = _grads(queue, act, build)
            monkeypatch.undo()
            assert kernel not in launched_old
            if fused:
                assert launched_old.count("axpy") == launched.count("axpy") + 4
            for a, b in zip(new, old):
                np.testing.assert_array_equal(a, b)


def test_two_products_in_one_launch_equal_two_launches_bit_for_bit(queue, rng):
    """A matmul's two gradients, dA = G @ B^T and dB += A^T @ G, in one gemm_direct2 launch
    where both are small, with and without accumulating into an existing gradient; on a GPU
    (no direct kernel there) two launches, with the same results."""
    one_launch = not pc.runtime.is_gpu(queue.device)
    for m, k, n in ((4, 4, 4), (7, 5, 3), (1, 9, 13), (64, 48, 40)):
        a, b, g = (pc.Tensor.from_host(queue, rng.standard_normal(s, np.float32))
                   for s in ((m, k), (k, n), (m, n)))
        for accumulate in (False, True):
            c0 = rng.standard_normal((k, n), np.float32)
            into = pc.Tensor.from_host(queue, c0) if accumulate else None
            with trace_launches() as launches:
                ga, gb = product2((g, b, False, True, None), (a, g, True, False, into))
            names = [name for name, _, _ in launches]
            assert names == ["gemm_direct2"] if one_launch else len(names) == 2
            plain_into = pc.Tensor.from_host(queue, c0) if accumulate else None
            want_a = product(g, b, trans_b=True)
            want_b = product(a, g, trans_a=True, into=plain_into)
            assert gb is into if accumulate else gb is not None
            np.testing.assert_array_equal(_bits(ga), _bits(want_a))
            np.testing.assert_array_equal(_bits(gb), _bits(want_b))


def test_two_products_too_big_for_one_launch_take_two(queue, rng):
    a, b, g = (pc.Tensor.from_host(queue, rng.standard_normal((64, 64), np.float32))
               for _ in range(3))
    with trace_launches() as launches:
        ga, gb = product2((g, b, False, True, None), (a, g, True, False, None))
    assert "gemm_direct2" not in [name for name, _, _ in launches]
    np.testing.assert_array_equal(_bits(ga), _bits(product(g, b, trans_b=True)))
    np.testing.assert_array_equal(_bits(gb), _bits(product(a, g, trans_a=True)))


def test_a_backward_that_raised_leaves_no_walk_state_on_its_functions(queue, monkeypatch):
    """The walk hands a Function this pass's gradient targets and the leaf ``.grad`` to add
    into (``also_into``) for one call; a backward that raised left them set, so a retried
    backward through the same graph would have added into the old targets."""
    rng = np.random.default_rng(3)
    w = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)),
                  requires_grad=True)
    x = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)),
                  requires_grad=True)
    x.grad = pc.Tensor.zeros(queue, (4, 4))          # a .grad to add into: the fused path
    h = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)))
    with tp.Tape() as tape:
        y = tp.tanh(h @ w + x)
        loss = tp.sum(y)
    real = ew.tanh_backward

    def failing(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(ew, "tanh_backward", failing)
    try:
        tape.backward(loss)
    except RuntimeError:
        pass
    monkeypatch.setattr(ew, "tanh_backward", real)
    fn = y.grad_fn
    assert "also_into" not in vars(fn) and "grad_targets" not in vars(fn)


def test_linear_equals_its_gemms_bit_for_bit(queue, rng):
    """linear's forward and backward launch the GEMMs unchecked (the op checked once): the
    output, the input gradient, the weight gradient added into an existing .grad and the bias
    gradient equal the public gemm calls' bit for bit, for 2-D and 3-D inputs, with and
    without the fused ReLU."""
    from parcl.kernels.reduction import sum as reduce_sum
    for shape, relu in (((8, 64), False), ((8, 64), True), ((2, 5, 64), False), ((3, 64), True)):
        x0 = rng.standard_normal(shape, np.float32)
        w0 = rng.standard_normal((48, 64), np.float32) * 0.2
        b0, gw0 = rng.standard_normal(48, np.float32), rng.standard_normal((48, 64), np.float32)
        x = tp.tensor(pc.Tensor.from_host(queue, x0), requires_grad=True)
        w = tp.tensor(pc.Tensor.from_host(queue, w0), requires_grad=True)
        b = tp.tensor(pc.Tensor.from_host(queue, b0), requires_grad=True)
        w.grad = pc.Tensor.from_host(queue, gw0)              # accumulated into by the GEMM
        with tp.Tape() as tape:
            y = tp.linear(x, w, b, relu=relu)
            loss = tp.sum(y * y)
        tape.backward(loss)

        x2 = pc.Tensor.from_host(queue, x0.reshape(-1, 64))
        wt, bt = pc.Tensor.from_host(queue, w0), pc.Tensor.from_host(queue, b0)
        want_y = gemm(x2, wt, trans_b=True, bias=bt, relu=relu)
        g = ew.scalar("mul", want_y, 2.0)        # d sum(y*y) / dy = y + y: doubling is exact
        if relu:
            g = ew.relu_backward(want_y, g)
        want_gx = gemm(g, wt)
        want_gw = pc.Tensor.from_host(queue, gw0)
        gemm(g, x2, trans_a=True, out=want_gw, beta=1.0)
        want_gb = reduce_sum(g, axis=0)
        assert y.to_host().tobytes() == want_y.to_host().reshape(*shape[:-1], 48).tobytes()
        assert x.grad.to_host().tobytes() == want_gx.to_host().reshape(shape).tobytes()
        assert w.grad.to_host().tobytes() == want_gw.to_host().tobytes()
        assert b.grad.to_host().tobytes() == want_gb.to_host().tobytes()
