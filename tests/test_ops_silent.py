"""Ops that once gave wrong numbers without raising: each test is the reproducer of one such
case, with the value PyTorch (or numpy) gives, or the clear error parcl gives instead."""

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


# -- host input: a 0-d array stays 0-d -------------------------------------------------------
@pytest.mark.parametrize("value", [2.5, np.array(True), np.bool_(False)],
                         ids=["python-float", "0d-bool-array", "numpy-bool"])
def test_a_scalar_or_0d_host_value_uploads_as_a_0d_tensor(queue, value):
    """``Tensor.from_host(q, 2.5)`` and a 0-d boolean mask were uploaded with shape ``(1,)``
    (``np.ascontiguousarray`` makes a 0-d array 1-D), so a 0-d mask broadcast a 0-d input
    to ``(1,)``."""
    t = pc.Tensor.from_host(queue, value)
    assert t.shape == ()
    assert t.to_host() == np.asarray(value)


def test_a_borrowed_0d_array_uploads_as_a_0d_tensor(queue):
    t = pc.Tensor.from_host(queue, np.array(3.5, np.float32), borrow=True)
    assert t.shape == () and t.item() == 3.5


def test_where_with_a_0d_mask_keeps_a_0d_input_0d(queue):
    """``tp.where(np.array(True), x, 0.0)`` with ``x`` of shape ``()`` gave shape ``(1,)``."""
    x = tp.tensor(np.float32(4.0), requires_grad=True)
    assert tp.where(np.array(True), x, 0.0).shape == ()
    assert tp.masked_fill(x, np.array(False), 0.0).shape == ()


def test_a_borrowed_transposed_array_uploads_its_values(queue):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(pc.Tensor.from_host(queue, a.T, borrow=True).to_host(), a.T)


# -- a graph backwarded twice: inner gradients start from zero each pass -----------------------
def test_loss_backward_twice_without_a_tape_adds_the_gradient_twice(queue):
    """``y = tp.sum(x * x)`` recorded with no tape current, then ``y.backward()`` twice: the
    second pass propagated the first pass's inner gradients again, giving ``8x`` where
    PyTorch (``retain_graph=True``) gives ``2x + 2x``."""
    x = tp.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = tp.sum(x * x)
    y.backward()
    y.backward()
    np.testing.assert_array_equal(x.grad.to_host(), [4.0, 8.0, 12.0])


def test_a_second_tape_through_a_backwarded_graph_gets_only_its_own_gradient(queue):
    """``h = x * x`` on one tape (backwarded), then ``sum(3 h)`` on another: ``x.grad`` was
    ``10x`` (the first pass's ``h.grad`` propagated again) instead of ``2x + 6x``."""
    x = tp.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    with tp.Tape() as first:
        h = x * x
        loss = tp.sum(h)
    first.backward(loss)
    with tp.Tape() as second:
        loss2 = tp.sum(h * 3)
    second.backward(loss2)
    np.testing.assert_array_equal(x.grad.to_host(), [8.0, 16.0, 24.0])
    np.testing.assert_array_equal(h.grad.to_host(), [3.0, 3.0, 3.0])   # this pass's own


# -- a Node read after an in-place op changed it ---------------------------------------------
def _x():
    return tp.tensor(np.array([-1.0, 2.0, -3.0, 4.0]), requires_grad=True)


def test_reading_the_input_of_an_inplace_relu_afterwards_raises(queue):
    """``z = x * 2; tp.relu(z, inplace=True); tp.sum(z)`` gave ``x.grad == 2`` everywhere:
    ``z`` holds the relu's values but its graph skipped the relu (PyTorch: ``[0, 2, 0, 2]``).
    """
    x = _x()
    with tp.Tape() as tape:
        z = x * 2
        tp.relu(z, inplace=True)
        loss = tp.sum(z)
    with pytest.raises(pc.ParclError, match=r"'sum'.*'mul'.*relu\(inplace=True\)"):
        tape.backward(loss)
    assert x.grad is None                       # nothing accumulated


def test_reading_a_view_taken_before_an_inplace_relu_raises(queue):
    """``v = z.reshape(2, 2); tp.relu(z, inplace=True); tp.sum(v)``: ``v`` shares ``z``'s
    buffer, so it changed too."""
    x = _x()
    with tp.Tape() as tape:
        z = x * 2
        v = z.reshape(2, 2)
        tp.relu(z, inplace=True)
        loss = tp.sum(v)
    with pytest.raises(pc.ParclError, match="'reshape'.*shares it"):
        tape.backward(loss)


def test_reading_the_base_of_a_view_changed_in_place_raises(queue):
    x = _x()
    with tp.Tape() as tape:
        z = x * 2
        tp.relu(z.reshape(2, 2), inplace=True)
        loss = tp.sum(z * 3)
    with pytest.raises(pc.ParclError, match="overwrote its buffer"):
        tape.backward(loss)


def test_the_result_of_an_inplace_relu_and_its_views_backward_as_pytorch(queue):
    """What stays allowed: reading the in-place op's result and views of it taken after;
    gradients as PyTorch's."""
    x = _x()
    with tp.Tape() as tape:
        r = tp.relu(x * 2, inplace=True)
        loss = tp.sum(r * r) + tp.sum(r.reshape(2, 2))
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), [0.0, 18.0, 0.0, 34.0])   # 8x + 2


def test_an_inplace_op_keeps_no_graph_alive_after_its_tape_is_released(queue):
    """The note of an in-place change must not hold the graph (the memory benchmark's
    ``zero_grad_mb`` found buffers still out of the pool)."""
    import gc
    import weakref
    x = _x()
    with tp.Tape() as tape:
        z = x * 2
        r = tp.relu(z, inplace=True)
        loss = tp.sum(r)
    tape.backward(loss)
    entry = weakref.ref(z.entry)
    tape.release()
    del z, r, loss, tape
    gc.collect()
    assert entry() is None


def test_a_resnet_block_with_inplace_relus_still_backwards(queue):
    pc.nn.manual_seed(0)
    from parcl.nn.resnet import BasicBlock
    block = BasicBlock(2, 4, stride=2)           # a downsample: its output is overwritten
    x = tp.tensor(np.random.default_rng(0).standard_normal((2, 2, 6, 6)), requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(block(x))
    tape.backward(loss)
    assert x.grad is not None and np.isfinite(x.grad.to_host()).all()


# -- an axis that is not an int is refused, not truncated ------------------------------------
@pytest.mark.parametrize("op", [
    lambda x: tp.softmax(x, axis=0.9), lambda x: tp.log_softmax(x, axis=0.9),
    lambda x: tp.cumsum(x, 0.9), lambda x: tp.argmax(x, axis=1.7),
    lambda x: tp.sum(x, axis=(0.5,)), lambda x: tp.max(x, 1.5),
    lambda x: tp.transpose(x, (1.7, 0)),
], ids=["softmax", "log_softmax", "cumsum", "argmax", "sum", "max", "transpose"])
def test_a_float_axis_is_a_shape_error_not_another_axis(queue, op):
    """``tp.softmax(x, axis=0.9)`` on ``(1, 3)`` ran along axis 0 (``int(0.9)``) and gave
    ones; numpy and PyTorch refuse a float axis."""
    x = tp.tensor(np.arange(3, dtype=np.float32).reshape(1, 3))
    with pytest.raises(pc.ShapeError, match="axis must be an int"):
        op(x)


@pytest.mark.parametrize("op", [
    lambda x: x.value.reshape(2.9, 2), lambda x: x.reshape((2.0, 3)),
    lambda x: tp.expand(x[:1], (2.5, 2)), lambda x: tp.split(x, [1.5, 1.5], 0),
    lambda x: pc.Tensor.zeros(x.value.queue, (2.0, 3)),
    lambda x: tp.layer_norm(x, (2.0,)), lambda x: tp.split(x, 1.5, 0),
    lambda x: tp.pad(x, (0.5, 0.5)),
], ids=["Tensor.reshape", "reshape", "expand", "split", "Tensor.zeros", "layer_norm",
        "split_size", "pad"])
def test_a_float_size_is_a_shape_error_not_truncated(queue, op):
    """``x.reshape(2.9, 2)`` on a (3, 2) tensor was read as ``reshape(2, 2)`` by ``int()`` (and
    failed only by luck of the element count; ``expand((2.5, 2))`` expanded to 2 rows,
    ``split(x, 1.5)`` cut pieces of 1, ``pad(x, (0.5, 0.5))`` padded nothing); numpy and
    PyTorch refuse a float size."""
    x = tp.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    with pytest.raises(pc.ShapeError, match="sizes must be integers"):
        op(x)


def test_integer_sizes_of_any_integer_type_still_work(queue):
    x = tp.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    assert x.reshape(np.int64(2), 3).shape == (2, 3)
    assert tp.expand(x[:1], (np.int32(4), -1)).shape == (4, 2)


# -- normalize: a row whose p-norm is below eps ------------------------------------------------
@pytest.mark.parametrize("p,eps", [(4.0, 1e-12), (6.0, 1e-12), (2.0, 1e-30), (3.0, 1e-12)])
def test_normalize_of_a_zero_or_tiny_row_is_finite_as_pytorchs(queue, p, eps):
    """``tp.normalize(x, p=4)`` of a zero row gave NaN (PyTorch: zeros), and of a row of norm
    1e-14 NaN (PyTorch: ``x / eps``): the norm was clamped at ``eps ** p`` before the root,
    and ``1e-12 ** 4`` is 0 in float32. The same for p=2 with ``eps=1e-30``. Gradients as
    PyTorch's: ``1 / eps`` through the clamped rows, no NaN."""
    import torch
    a = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [1e-14, 0.0, -2e-14]], np.float32)
    w = np.random.default_rng(0).standard_normal(a.shape).astype(np.float32)
    x = tp.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        y = tp.normalize(x, p=p, dim=1, eps=eps)
    tape.backward(tp.sum(y * tp.tensor(w)))
    t = torch.tensor(a, requires_grad=True)
    ty = torch.nn.functional.normalize(t, p=p, dim=1, eps=eps)
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-4)


# -- a NaN input: the gradient passes on, as PyTorch's -------------------------------------------
def test_relu_maximum_and_minimum_pass_the_gradient_of_a_nan_on(queue):
    """``tp.relu`` gave a NaN input the gradient 0 (``out > 0`` is false for NaN), and
    ``tp.maximum``/``tp.minimum`` gave 0 to both sides where either was NaN, so a NaN reaching
    the loss through them left the layers below with finite gradients; PyTorch passes the
    upstream gradient on (``threshold_backward``; both sides of ``maximum``). A tie splits
    it half and half, as PyTorch's."""
    import torch
    a = np.array([np.nan, 1.0, np.nan, 2.0, -1.0, 3.0], np.float32)
    b = np.array([0.5, np.nan, np.nan, 2.0, 0.0, -3.0], np.float32)
    for op, ref in ((tp.maximum, torch.maximum), (tp.minimum, torch.minimum)):
        x, y = tp.tensor(a, requires_grad=True), tp.tensor(b, requires_grad=True)
        with tp.Tape() as tape:
            out = op(x, y)
        tape.backward(tp.sum(out))
        tx = torch.tensor(a, requires_grad=True)
        ty = torch.tensor(b, requires_grad=True)
        ref(tx, ty).sum().backward()
        nan = np.isnan(a) | np.isnan(b)
        np.testing.assert_array_equal(x.grad.to_host()[nan], tx.grad.numpy()[nan])
        np.testing.assert_array_equal(y.grad.to_host()[nan], ty.grad.numpy()[nan])
        np.testing.assert_array_equal(x.grad.to_host()[3], 0.5)      # the tie: half each
        np.testing.assert_array_equal(y.grad.to_host()[3], 0.5)
    x = tp.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        out = tp.relu(x)
    tape.backward(tp.sum(out))
    np.testing.assert_array_equal(x.grad.to_host(), [1.0, 1.0, 1.0, 1.0, 0.0, 1.0])


# -- a Python scalar beyond float32's range ----------------------------------------------------
@pytest.mark.parametrize("expr, expected", [
    (lambda x: x * 1e40, np.inf), (lambda x: x - 1e40, -np.inf), (lambda x: x + 1e300, np.inf),
    (lambda x: (x * 2) ** 1e40, np.inf), (lambda x: x ** 1e40, 1.0),
], ids=["mul", "sub", "add", "pow-of-2", "pow-of-1"])
def test_a_scalar_beyond_float32_is_infinite_in_arithmetic_as_pytorch(queue, expr, expected):
    """``x * 1e40`` raised a bare ``OverflowError`` from packing the scalar where PyTorch gives
    inf: the scalar is cast to the tensor's float32, as ``torch.ones(2) * 1e40`` casts it."""
    x = tp.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    y = expr(x)
    np.testing.assert_array_equal(y.to_host(), np.full((2, 3), expected, np.float32))


# -- a tensor too big for 32-bit indexing ------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda q: pc.Tensor.empty(q, (2**16, 2**15)),
    lambda q: pc.Tensor.empty(q, (2**31,), np.int32),
    lambda q: pc.Tensor.from_host(q, np.broadcast_to(np.float32(1), (2**16, 2**15))),
], ids=["empty-float32", "empty-int32", "from_host"])
def test_a_tensor_of_2_to_the_31_elements_is_refused_before_any_kernel_indexes_it(queue, make):
    """Kernels index with 32-bit ints, which wrap at 2**31 elements and would read and write
    the wrong elements; such a tensor is a ShapeError naming its shape, before anything is
    allocated."""
    with pytest.raises(pc.ShapeError, match=r"2\*\*31 - 1"):
        make(queue)


# -- var and std: PyTorch's third positional argument is unbiased ----------------------------
def test_var_and_std_read_pytorchs_positional_unbiased_and_keepdim_as_pytorch(queue):
    """``torch.var(x, 1, False)`` is the biased variance ([1.556, 2.0] here); parcl once read
    the False as keepdims and gave the unbiased [2.333, 3.0], silently, then refused it.
    The positional arguments are now torch.var's, (input, dim, unbiased, keepdim), for var,
    std, var_mean and std_mean; correction stays keyword-only."""
    import torch
    a = np.array([[1.0, 2.0, 4.0], [0.0, 3.0, 3.0]], np.float32)
    x, t = tp.tensor(a), torch.tensor(a)
    np.testing.assert_allclose(tp.var(x, 1, False).to_host(), [14 / 9, 2.0], rtol=1e-6)
    for name in ("var", "std", "var_mean", "std_mean"):
        for args in ((1, False), (1, True), (0, False, True), (None, False, True)):
            got = getattr(tp, name)(x, *args)
            want = getattr(torch, name)(t, *args)
            for g, w in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):
                assert g.shape == tuple(w.shape), (name, args)
                np.testing.assert_allclose(g.to_host(), w.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tp.var(x, 1, correction=0).to_host(), [14 / 9, 2.0], rtol=1e-6)


def test_var_std_var_mean_and_std_mean_of_one_bool_take_it_as_unbiased_as_pytorch(queue):
    """``torch.var(x, False)`` (std, var_mean, std_mean alike) is PyTorch's overload of one
    bool: the biased variance over every dim, 1.806 of [[1, 2, 4], [0, 3, 3]]; tp.var read
    the bool as a dim and raised 'var: axis must be an int, got False', where x.var(False)
    already took it as unbiased."""
    import torch
    a = np.array([[1.0, 2.0, 4.0], [0.0, 3.0, 3.0]], np.float32)
    x, t = tp.tensor(a), torch.tensor(a)
    np.testing.assert_allclose(tp.var(x, False).to_host(), 65 / 36, rtol=1e-6)
    for name in ("var", "std", "var_mean", "std_mean"):
        for unbiased in (False, True):
            got = getattr(tp, name)(x, unbiased)
            want = getattr(torch, name)(t, unbiased)
            for g, w in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):
                assert g.shape == tuple(w.shape) == (), (name, unbiased)
                np.testing.assert_allclose(g.to_host(), w.numpy(), rtol=1e-6)
