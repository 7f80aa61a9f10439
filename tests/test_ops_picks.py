"""index_select, one_hot, amax, amin, prod, mm and bmm: forward against numpy float64,
gradients against finite differences and against PyTorch (ties shared evenly, zeros in a
product), device-side index checks, and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf
from torch_reference import against_torch, raises_like_torch


@pytest.mark.parametrize("shape,dim,index", [((3, 4), 0, [2, 0, 2]), ((3, 4), -1, [3]),
                                             ((2, 3, 4), 1, [1, 1, 0, 2, 1]),
                                             ((5,), 0, [4, 0]), ((3, 4), 1, 2),
                                             ((2, 1, 3), -2, [0, 0, 0])])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_index_select(queue, rng, shape, dim, index, dtype):
    a = rng.standard_normal(shape)
    x = leaf(queue, a)
    i = pc.Tensor.from_host(queue, np.array(index, dtype))
    with tp.Tape():
        y = tp.index_select(x, dim, i)
    assert y.op_name == "index_select"
    want = np.take(a, np.atleast_1d(index), dim)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-6)
    assert tp.gradcheck(lambda v: tp.index_select(v, dim, i), [x])
    ti = torch.tensor(np.array(index, np.int64))
    against_torch(queue, rng, lambda v: tp.index_select(v, dim, i),
                  lambda v: torch.index_select(v, dim, ti), [a])


def test_index_select_repeats_sum_bit_identically(queue, rng):
    x = leaf(queue, rng.standard_normal((4, 3)))
    i = pc.Tensor.from_host(queue, np.array([1, 1, 1, 3, 1]))
    grads = []
    for _ in range(2):
        x.grad = None
        with tp.Tape() as tape:
            loss = tp.sum(tp.index_select(x, 0, i) * 0.1)
        tape.backward(loss)
        grads.append(x.grad.to_host())
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_allclose(grads[0][:, 0], [0, 0.4, 0, 0.1], rtol=1e-6)


def test_index_select_out_of_range(queue):
    x = leaf(queue, np.ones((2, 3)))
    bad = pc.Tensor.from_host(queue, np.array([0, 3]))
    with pytest.raises(pc.ShapeError, match=r"index_select: index 3 at position \(1,\) .* "
                                            r"dim 1 of size 3"):
        tp.index_select(x.value, 1, bad)                        # unrecorded: at once
    with tp.Tape() as tape:
        y = tp.index_select(x, 1, pc.Tensor.from_host(queue, np.array([-1])))
        loss = tp.sum(y)
    with pytest.raises(pc.ShapeError, match="index -1"):
        tape.backward(loss)                                     # recorded: in the backward
    with pytest.raises(pc.ShapeError, match="index -1"):
        y.to_host()                                             # and at every read
    with pytest.raises(RuntimeError):
        torch.index_select(torch.ones(2, 3), 1, torch.tensor([0, 3]))


@pytest.mark.parametrize("size", [65, 1000])
def test_index_select_and_one_hot_over_a_dimension_of_more_than_64(queue, rng, size):
    """``tp.index_select`` on a dim of 65 or more entries and ``tp.one_hot`` with 65 or more
    classes failed with ``clEnqueueReadBuffer failed: INVALID_VALUE``: their range check read
    back one int32 per entry of the dim (its size had taken the name of the flag's length)
    from a one-int flag. A vocabulary or a batch of that size is ordinary."""
    a = rng.standard_normal((size, 3))
    index = np.array([size - 1, 0, size - 1])
    x = leaf(queue, a)
    with tp.Tape() as tape:
        y = tp.index_select(x, 0, pc.Tensor.from_host(queue, index))
    tape.backward(tp.sum(y))
    np.testing.assert_allclose(y.to_host(), a[index].astype(np.float32))
    want = np.zeros((size, 3), np.float32)
    np.add.at(want, index, 1.0)
    np.testing.assert_array_equal(x.grad.to_host(), want)
    labels = np.array([[size - 1], [3]])
    got = tp.one_hot(pc.Tensor.from_host(queue, labels), size)
    np.testing.assert_array_equal(
        got.to_host(), torch.nn.functional.one_hot(torch.tensor(labels), size).numpy())
    with pytest.raises(pc.ShapeError, match=f"index {size} .* indices must be in \\[0, {size}\\)"):
        tp.index_select(x.value, 0, pc.Tensor.from_host(queue, np.array([size])))


@pytest.mark.parametrize("labels,num_classes", [([0, 2, 1], -1), ([[3], [0]], 5),
                                                (1, 3), ([0, 0], 1)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_one_hot(queue, labels, num_classes, dtype):
    lab = np.array(labels, dtype)
    got = tp.one_hot(pc.Tensor.from_host(queue, lab), num_classes)
    want = torch.nn.functional.one_hot(torch.tensor(lab.astype(np.int64)), num_classes)
    assert isinstance(got, pc.Tensor) and got.dtype == np.float32
    np.testing.assert_array_equal(got.to_host(), want.numpy().astype(np.float32))
    node = tp.tensor(pc.Tensor.from_host(queue, lab))
    np.testing.assert_array_equal(tp.one_hot(node, num_classes).to_host(), got.to_host())


def test_one_hot_errors(queue):
    labels = pc.Tensor.from_host(queue, np.array([[1], [4]]))
    out = tp.one_hot(labels, 3)                          # checked on the device, no wait
    with pytest.raises(pc.ShapeError, match=r"one_hot: label 4 at position \(1, 0\) of "
                                            r"labels \(2, 1\) .* num_classes=3"):
        out.to_host()
    with pytest.raises(pc.ShapeError, match="one_hot: label 4"):
        tp.sum(tp.tensor(out) * 2.0).to_host()          # what is computed from it raises too
    F = torch.nn.functional
    for lab, n in (([1, 4], 3), ([0, -1], 3), ([0, -1], -1), ([1], 0)):
        t = pc.Tensor.from_host(queue, np.array(lab))
        raises_like_torch(lambda t=t, n=n: tp.one_hot(t, n).to_host(),
                          lambda lab=lab, n=n: F.one_hot(torch.tensor(lab), n), "one_hot")
    with pytest.raises(pc.DTypeError, match="one_hot: labels have dtype float32"):
        tp.one_hot(pc.Tensor.from_host(queue, np.array([1.0], np.float32)), 3)


DIMS = [None, 0, -1, (0, 2), (), (1,)]


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim", DIMS, ids=[str(d) for d in DIMS])
@pytest.mark.parametrize("keepdim", [False, True])
def test_amax_amin(queue, rng, op, dim, keepdim):
    a = rng.integers(-2, 3, (3, 4, 2)).astype(np.float64)      # small ints: many ties
    x = leaf(queue, a)
    y = getattr(tp, op)(x, dim, keepdim)
    assert y.op_name == op
    axis = None if dim in (None, ()) else dim
    np.testing.assert_array_equal(y.to_host(), getattr(np, op)(a, axis, keepdims=keepdim))
    against_torch(queue, rng, lambda v: getattr(tp, op)(v, dim, keepdim),
                  lambda v: getattr(torch, op)(v, dim if dim is not None else (), keepdim),
                  [a])
    b = rng.standard_normal((3, 4, 2))                          # no ties: finite differences
    assert tp.gradcheck(lambda v: getattr(tp, op)(v, dim, keepdim), [leaf(queue, b)])


def test_amax_0d_and_ties_split_evenly(queue):
    s = leaf(queue, np.array(2.0))
    assert tp.amax(s).shape == () and tp.amin(s, 0).shape == ()
    assert tp.amax(s, -1, True).shape == () and float(tp.amin(s, ())) == 2.0
    x = leaf(queue, np.array([[3.0, 3.0, 1.0, 3.0]]))
    with tp.Tape() as tape:
        loss = tp.amax(x, 1)
    tape.backward(loss, grad=pc.Tensor.from_host(queue, np.array([1.5], np.float32)))
    np.testing.assert_allclose(x.grad.to_host(), [[0.5, 0.5, 0.0, 0.5]], rtol=1e-6)
    n = leaf(queue, np.array([np.nan, 1.0, np.nan]))          # NaN wins, its gradient is NaN
    t = torch.tensor([np.nan, 1.0, np.nan], requires_grad=True)
    with tp.Tape() as tape:
        m = tp.amax(n, 0)
    tape.backward(m)
    torch.amax(t, 0).backward()
    assert np.isnan(m.to_host()) and np.isnan(n.grad.to_host()).all()
    assert torch.isnan(t.grad).all()


PRODS = [((3, 4), None, [0]), ((3, 4), 1, [1]), ((3, 4), 0, [1, 2]), ((3, 4), -1, [0, 5, 6]),
         ((2, 3, 2), 1, []), ((5,), 0, [2]), ((), None, []), ((), 0, [0])]


@pytest.mark.parametrize("shape,dim,zeros", PRODS, ids=[str(p) for p in PRODS])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod(queue, rng, shape, dim, zeros, keepdim):
    a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    a.reshape(-1)[zeros] = 0.0                                 # zeros: one or two per row
    x = leaf(queue, a)
    y = tp.prod(x, dim, keepdim)
    assert y.op_name == "prod"
    np.testing.assert_allclose(y.to_host(), np.prod(a, dim, keepdims=keepdim),
                               rtol=1e-5, atol=1e-7)
    # torch.prod takes no keepdim without a dim; parcl's keeps the dims as numpy's does
    kept = np.prod(a, dim, keepdims=keepdim).shape
    against_torch(queue, rng, lambda v: tp.prod(v, dim, keepdim),
                  lambda v: torch.prod(v).reshape(kept) if dim is None
                  else torch.prod(v, dim, keepdim), [a])


def test_prod_gradcheck_and_zero_rows(queue, rng):
    x = leaf(queue, rng.uniform(0.5, 1.5, (3, 4)))
    assert tp.gradcheck(lambda v: tp.prod(v, 1), [x])
    a = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])
    z = leaf(queue, a)
    with tp.Tape() as tape:
        loss = tp.sum(tp.prod(z, 1))
    tape.backward(loss)
    np.testing.assert_allclose(z.grad.to_host(), [[0, 6, 0], [0, 0, 0], [8, 4, 2]], rtol=1e-6)
    assert np.isfinite(z.grad.to_host()).all()


@pytest.mark.parametrize("a_shape,b_shape,op", [((2, 3), (3, 4), "mm"), ((1, 5), (5, 1), "mm"),
                                                ((3, 2, 4), (3, 4, 5), "bmm"),
                                                ((1, 1, 3), (1, 3, 2), "bmm")])
def test_mm_bmm(queue, rng, a_shape, b_shape, op):
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    x, w = leaf(queue, a), leaf(queue, b)
    y = getattr(tp, op)(x, w)
    assert y.op_name == op
    np.testing.assert_allclose(y.to_host(), a @ b, rtol=1e-5, atol=1e-5)
    assert tp.gradcheck(getattr(tp, op), [x, w])
    against_torch(queue, rng, getattr(tp, op), getattr(torch, op), [a, b])


Z = np.zeros((2, 3), np.float32)
ERRORS = [
    ("mm", lambda x: tp.mm(x, x), lambda t: torch.mm(t, t)),
    ("mm", lambda x: tp.mm(x, tp.reshape(x, (6,))), lambda t: torch.mm(t, t.reshape(6))),
    ("mm", lambda x: tp.mm(tp.unsqueeze(x, 0), x), lambda t: torch.mm(t[None], t)),
    ("bmm", lambda x: tp.bmm(x, tp.t(x)), lambda t: torch.bmm(t, t.t())),
    ("bmm", lambda x: tp.bmm(tp.unsqueeze(x, 0), tp.unsqueeze(x, 0)),
     lambda t: torch.bmm(t[None], t[None])),
    ("bmm", lambda x: tp.bmm(tp.reshape(x, (1, 2, 3)), tp.reshape(tp.t(x), (2, 3, 1))),
     lambda t: torch.bmm(t.reshape(1, 2, 3), t.t().reshape(2, 3, 1))),
    ("index_select", lambda x: tp.index_select(x, 1, pc.Tensor.from_host(
        x.queue, np.zeros((1, 1), np.int64))), lambda t: torch.index_select(
        t, 1, torch.zeros((1, 1), dtype=torch.int64))),
    ("index_select", lambda x: tp.index_select(x, 2, pc.Tensor.from_host(
        x.queue, np.zeros(1, np.int64))), lambda t: torch.index_select(
        t, 2, torch.zeros(1, dtype=torch.int64))),
    ("index_select", lambda x: tp.index_select(x, 0, pc.Tensor.from_host(
        x.queue, np.zeros(1, np.float32))), lambda t: torch.index_select(
        t, 0, torch.zeros(1))),
    ("amax", lambda x: tp.amax(x, (0, -2)), lambda t: torch.amax(t, (0, -2))),
    ("amin", lambda x: tp.amin(x, 2), lambda t: torch.amin(t, 2)),
    ("prod", lambda x: tp.prod(x, 2), lambda t: torch.prod(t, 2)),
    ("prod", lambda x: tp.prod(x, 1.0), lambda t: torch.prod(t, 1.0)),
]


@pytest.mark.parametrize("op,tp_call,torch_call", ERRORS,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_errors_like_torch(queue, op, tp_call, torch_call):
    x = leaf(queue, Z)
    raises_like_torch(lambda: tp_call(x), lambda: torch_call(torch.tensor(Z)), op)


@pytest.mark.parametrize("workgroup", [None, True, False])
def test_product_kernel_paths(queue, rng, workgroup):
    """The 'prod' reduction through every kernel variant on this device: the 8-wide CPU loop
    (inner % 8 == 0), two stages (R > one chunk), and the GPU work-group tree, forced."""
    from parcl.kernels import reduction as rd
    for shape, axis in (((3, 16), 0), ((5000,), 0), ((2, 3000, 8), 1), ((300, 3), 0)):
        a = rng.uniform(0.999, 1.001, shape)
        x = pc.Tensor.from_host(queue, a.astype(np.float32))
        ax = axis % len(shape)
        outer, inner = int(np.prod(shape[:ax])), int(np.prod(shape[ax + 1:]))
        got = rd.reduce_3d("prod", x, outer, shape[ax], inner, workgroup=workgroup).to_host()
        want = np.prod(a.astype(np.float32).astype(np.float64), axis).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-4)
        np.testing.assert_array_equal(rd.product(x, axis).to_host().reshape(-1),
                                      rd.product(x, axis).to_host().reshape(-1))


def test_one_hot_of_labels_with_no_elements_needs_num_classes_as_pytorch(queue):
    """``num_classes=-1`` over an empty slice of labels took the minimum of nothing, numpy's
    'ValueError: zero-size array to reduction operation minimum', where PyTorch raises 'Can
    not infer total number of classes from empty tensor'; with num_classes given both give
    the (0, C) result."""
    ids = pc.Tensor.from_host(queue, np.arange(4))
    with pytest.raises(pc.ShapeError, match=r"one_hot: labels of shape \(0,\) hold no "
                                            r"elements, so num_classes=-1"):
        tp.one_hot(ids[4:])
    with pytest.raises(RuntimeError, match="Can not infer total number of classes"):
        torch.nn.functional.one_hot(torch.arange(4)[4:])
    assert tp.one_hot(ids[4:], 3).shape == (0, 3)
