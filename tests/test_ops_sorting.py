"""sort, argsort and topk: indices against PyTorch's stable sort and values against numpy
float64 for rows of 1 to 5000 elements along every dim, with ties and NaNs, on every kernel
variant; gradients against finite differences and PyTorch; the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up
from parcl.kernels import sorting
from torch_reference import against_torch, raises_like_torch


def _with_ties_and_nans(rng, shape):
    """Small integers (many ties, -0.0 beside 0.0) with some NaNs and infinities."""
    a = rng.integers(-4, 5, shape).astype(np.float64)
    flat = a.reshape(-1)
    flat[rng.random(flat.size) < 0.1] = np.nan
    flat[rng.random(flat.size) < 0.05] = np.inf
    flat[rng.random(flat.size) < 0.05] = -np.inf
    flat[flat == 0] *= np.where(rng.random(int((flat == 0).sum())) < 0.5, -1.0, 1.0)
    return a


def _torch_stable(a, dim, descending):
    values, indices = torch.sort(torch.tensor(a), dim=dim, descending=descending, stable=True)
    return values.numpy(), indices.numpy()


@pytest.fixture(params=sorting.VARIANTS)
def variant(request, monkeypatch):
    """Every kernel variant, whatever the device would choose (``local`` where the row fits
    it, ``merge`` beyond)."""
    def choose(queue, n):
        fits = request.param != "local" or sorting.fits_local(queue, n)
        return request.param if fits else "merge"
    monkeypatch.setattr(sorting, "choose_variant", choose)
    return request.param


@pytest.mark.parametrize("n", [1, 3, 17, 1000, 5000])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_orders_every_row_as_torchs_stable_sort_with_nan_largest(queue, rng, variant, n,
                                                                      dim, descending):
    shape = [2, 3, 2]
    shape[dim] = n
    a = _with_ties_and_nans(rng, tuple(shape))
    values, indices = tp.sort(up(queue, a), dim, descending=descending)
    want_values, want_indices = _torch_stable(a, dim, descending)
    assert indices.dtype == np.int64 and indices.shape == a.shape
    np.testing.assert_array_equal(indices.to_host(), want_indices)
    np.testing.assert_array_equal(values.to_host(), want_values.astype(np.float32))
    order = np.sort(a, axis=dim)                           # numpy: ascending, NaN last
    got = values.to_host() if not descending else np.flip(values.to_host(), dim)
    if not descending:
        np.testing.assert_array_equal(got, order.astype(np.float32))
    np.testing.assert_array_equal(tp.argsort(up(queue, a), dim, descending).to_host(),
                                  want_indices)


@pytest.mark.parametrize("n,k", [(1, 1), (3, 2), (17, 5), (1000, 1000), (5000, 7)])
@pytest.mark.parametrize("dim", [0, -2, 2])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_keeps_the_lowest_indices_among_equal_values(queue, rng, variant, n, k, dim,
                                                          largest):
    shape = [3, 2, 2]
    shape[dim] = n
    a = _with_ties_and_nans(rng, tuple(shape))
    values, indices = tp.topk(up(queue, a), k, dim, largest=largest)
    want_values, want_indices = _torch_stable(a, dim, largest)
    take = [slice(None)] * 3
    take[dim] = slice(0, k)
    np.testing.assert_array_equal(indices.to_host(), want_indices[tuple(take)])
    np.testing.assert_array_equal(values.to_host(), want_values[tuple(take)].astype(np.float32))


@pytest.mark.parametrize("largest", [True, False])
def test_topk_of_distinct_values_equals_torchs(queue, rng, variant, largest):
    a = rng.permutation(60).reshape(3, 20).astype(np.float64) / 7
    values, indices = tp.topk(up(queue, a), 4, largest=largest)
    want = torch.topk(torch.tensor(a), 4, largest=largest)
    np.testing.assert_array_equal(indices.to_host(), want.indices.numpy())
    np.testing.assert_allclose(values.to_host(), want.values.numpy(), rtol=1e-6)


def test_the_three_kernel_variants_give_the_same_permutation(queue, rng):
    for n in (1, 2, 3, 16, 17, 33, 255, 1000, 4096):
        a = up(queue, _with_ties_and_nans(rng, (3, n)))
        for descending, k in ((False, None), (True, min(n, 5))):
            got = [sorting.argsort(a, 1, descending, k, _variant=v).to_host()
                   for v in sorting.VARIANTS]
            np.testing.assert_array_equal(got[0], got[1])
            np.testing.assert_array_equal(got[0], got[2])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sort_and_topk_send_the_gradient_back_to_the_picked_positions(queue, rng, variant,
                                                                      dim):
    a = rng.permutation(24).reshape(2, 3, 4) / 5.0            # distinct: finite differences
    x = leaf(queue, a)
    assert tp.gradcheck(lambda v: tp.sort(v, dim).values, [x])
    assert tp.gradcheck(lambda v: tp.topk(v, 2, dim, largest=False).values, [x])
    against_torch(queue, rng, lambda v: tp.sort(v, dim, descending=True).values,
                  lambda v: torch.sort(v, dim, descending=True).values, [a])
    against_torch(queue, rng, lambda v: tp.topk(v, 2, dim).values,
                  lambda v: torch.topk(v, 2, dim).values, [a])
    with tp.Tape() as tape:
        values, _ = tp.topk(x, 1, dim)
        assert values.op_name == "topk"
        loss = tp.sum(values * 3.0)
    x.grad = None
    tape.backward(loss)
    want = np.zeros_like(a)
    np.put_along_axis(want, np.argmax(a, dim, keepdims=True), 3.0, dim)
    np.testing.assert_array_equal(x.grad.to_host(), want)


def test_sort_of_a_0d_tensor_and_of_a_node(queue):
    s = leaf(queue, np.array(2.5))
    values, indices = tp.sort(s)
    assert values.shape == () and indices.shape == () and int(indices.to_host()) == 0
    values, indices = tp.topk(s, 1)
    assert float(values) == 2.5 and values.shape == ()
    with tp.Tape():
        values, indices = tp.sort(leaf(queue, [[2.0, 1.0]]), 1)
    assert values.op_name == "sort" and isinstance(indices, pc.Tensor)
    result = tp.sort(up(queue, [1.0, 0.0]))
    assert result.indices is result[1] and result.values is result[0]


def test_sorting_errors_name_the_op_and_the_shapes(queue):
    x = up(queue, np.ones((2, 3)))
    t = torch.ones(2, 3)
    msg = raises_like_torch(lambda: tp.topk(x, 4), lambda: torch.topk(t, 4), "topk")
    assert "(2, 3)" in msg
    raises_like_torch(lambda: tp.topk(x, 1, dim=2), lambda: torch.topk(t, 1, dim=2), "topk")
    raises_like_torch(lambda: tp.sort(x, 2), lambda: torch.sort(t, 2), "sort")
    raises_like_torch(lambda: tp.argsort(x, -3), lambda: torch.argsort(t, -3), "argsort")
    with pytest.raises(pc.ShapeError, match=r"topk: k=0 is out of range .* \(2, 3\)"):
        tp.topk(x, 0)
    with pytest.raises(pc.ShapeError, match="topk: k must be an int"):
        tp.topk(x, 1.5)
    with pytest.raises(pc.DTypeError, match="sort: input .* int64"):
        tp.sort(pc.Tensor.from_host(queue, np.array([3, 1])))


def test_sort_and_topk_of_a_0d_input_record_on_an_explicit_tape_under_no_grad(queue):
    """The 0-d input's reshape to 1-D recorded on the current tape only, so under ``no_grad``
    with ``tape=`` sort and topk returned a raw Tensor: the graph to ``x`` was lost."""
    x = tp.tensor(np.float32(3.0), requires_grad=True)
    with tp.no_grad(), tp.Tape() as tape:
        loss = tp.add(tp.sort(x, tape=tape).values, tp.topk(x, 1, tape=tape).values, tape=tape)
    tape.backward(loss)
    assert x.grad.to_host() == 2.0


@pytest.mark.parametrize("op", ["sort", "argsort", "topk"])
def test_indices_of_rows_from_an_out_of_range_id_raise_as_argmaxs_do(queue, op):
    """The top-k of rows picked by a token id outside ``[0, V)``, read while grad mode was
    on, came back as indices (the top-1 along dim 0 of the rows of ids [0, 4] was [[1, 1, 1]],
    the bad id's row) without the embedding's error: sort, argsort and topk dropped their
    input's pending index check, which tp.argmax keeps. Now their indices raise it at the
    host read, as every value computed from the rows through tp ops does."""
    weight = pc.nn.Parameter.from_host(queue, np.ones((4, 3), np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight)
        indices = {"sort": lambda: tp.sort(rows, 0).indices,
                   "argsort": lambda: tp.argsort(rows, 0),
                   "topk": lambda: tp.topk(rows, 1, 0).indices}[op]()
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        indices.to_host()
