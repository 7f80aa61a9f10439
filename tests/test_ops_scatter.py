"""scatter, scatter_add, index_add and take_along_dim: forward against a numpy reference that
applies repeated indices in index order (float32: the same bits; float64: the same values),
along every dim and for lines of 1 to 5000; gradients against finite differences and PyTorch;
bit-identical reruns; device-side index checks and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import assert_replays_eager, leaf, up
from torch_reference import against_torch, raises_like_torch


def scatter_reference(x, dim, index, src, add, dtype=np.float64):
    """``x`` with ``src`` set (or added) at ``index`` along ``dim``, one position of the
    line after another (the last of repeated indices wins; sums in index order)."""
    out = np.moveaxis(np.array(x, dtype), dim, -1)
    idx = np.moveaxis(index, dim, -1)
    s = np.moveaxis(np.asarray(src, dtype), dim, -1) if np.ndim(src) else None
    lead = tuple(slice(0, n) for n in idx.shape[:-1])
    view = out[lead]
    for j in range(idx.shape[-1]):
        at = idx[..., j:j + 1]
        value = s[lead + (slice(j, j + 1),)] if s is not None else np.full(at.shape, src, dtype)
        if add:
            value = np.take_along_axis(view, at, -1) + value
        np.put_along_axis(view, at, value, -1)
    out[lead] = view
    return np.moveaxis(out, -1, dim)


def _case(rng, n, dim, lines=3):
    """x with ``n`` along ``dim`` and an index (with repeats) of ``n`` there too, src one
    larger than the index in every dim."""
    shape = [2, lines, 2]
    shape[dim] = n
    x = rng.standard_normal(shape)
    index = rng.integers(0, n, shape)
    src = rng.standard_normal([s + 1 for s in shape])
    return x, index, src


@pytest.mark.parametrize("n", [1, 3, 17, 1000, 5000])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_scatter_add_sums_repeated_indices_in_index_order(queue, rng, n, dim, dtype):
    x, index, src = _case(rng, n, dim)
    got = tp.scatter_add(up(queue, x), dim, pc.Tensor.from_host(queue, index.astype(dtype)),
                         up(queue, src)).to_host()
    np.testing.assert_allclose(got, scatter_reference(x, dim, index, src, True), rtol=1e-5,
                               atol=1e-5)
    same_bits = scatter_reference(x.astype(np.float32), dim, index, src.astype(np.float32),
                                  True, np.float32)
    np.testing.assert_array_equal(got, same_bits)


@pytest.mark.parametrize("n", [1, 3, 17, 1000, 5000])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_keeps_the_last_of_repeated_indices_along_the_dim(queue, rng, n, dim):
    x, index, src = _case(rng, n, dim)
    i = pc.Tensor.from_host(queue, index)
    got = tp.scatter(up(queue, x), dim, i, up(queue, src)).to_host()
    np.testing.assert_array_equal(got, scatter_reference(x, dim, index, src, False,
                                                         np.float32))
    got = tp.scatter(up(queue, x), dim, i, -2.5).to_host()
    np.testing.assert_array_equal(got, scatter_reference(x, dim, index, -2.5, False,
                                                         np.float32))


def test_scatter_of_distinct_indices_equals_torchs_values_and_gradients(queue, rng):
    x = rng.standard_normal((3, 5))
    index = np.stack([rng.permutation(5)[:4] for _ in range(2)])       # (2, 4), no repeats
    src = rng.standard_normal((2, 4))        # torch's backward refuses a src larger than index
    i, ti = pc.Tensor.from_host(queue, index), torch.tensor(index)
    for dim in (1, -1):
        against_torch(queue, rng, lambda a, b, dim=dim: tp.scatter(a, dim, i, b),
                      lambda a, b, dim=dim: torch.scatter(a, dim, ti, b), [x, src])
        against_torch(queue, rng, lambda a, b, dim=dim: tp.scatter_add(a, dim, i, b),
                      lambda a, b, dim=dim: torch.scatter_add(a, dim, ti, b), [x, src])
    against_torch(queue, rng, lambda a: tp.scatter(a, 1, i, 0.5),
                  lambda a: torch.scatter(a, 1, ti, 0.5), [x])


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_scatter_gradients_match_finite_differences_with_repeated_indices(queue, rng, dim):
    x, index, src = _case(rng, 4, dim, lines=2)
    a, b, i = leaf(queue, x), leaf(queue, src), pc.Tensor.from_host(queue, index)
    assert tp.gradcheck(lambda u, v: tp.scatter_add(u, dim, i, v), [a, b])
    assert tp.gradcheck(lambda u, v: tp.scatter(u, dim, i, v), [a, b])
    assert tp.gradcheck(lambda u: tp.scatter(u, dim, i, 3.0), [a])
    with tp.Tape() as tape:
        out = tp.scatter(a, dim, i, b)
        assert out.op_name == "scatter"
        loss = tp.sum(out)
    a.grad = b.grad = None
    tape.backward(loss)
    hit = scatter_reference(np.ones_like(x), dim, index, 0.0, False)
    np.testing.assert_array_equal(a.grad.to_host(), hit)              # overwritten: no gradient
    assert b.grad.to_host().sum() == (hit == 0).sum()                 # one winner per element


def test_scatter_add_and_index_add_are_bit_identical_run_to_run(queue, rng):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    src = (rng.standard_normal((2000, 3)) * 1e3).astype(np.float32)
    index = rng.integers(0, 4, (2000, 3))
    runs = []
    for _ in range(2):
        a, b = leaf(queue, x), leaf(queue, src)
        with tp.Tape() as tape:
            out = tp.scatter_add(a, 0, pc.Tensor.from_host(queue, index), b)
            out = tp.index_add(out, 0, pc.Tensor.from_host(queue, index[:, 0]), b, alpha=0.5)
            loss = tp.sum(out * out)
        tape.backward(loss)
        runs.append((out.to_host(), a.grad.to_host(), b.grad.to_host()))
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("shape,dim,index", [((5, 3), 0, [4, 0, 4, 1]), ((2, 3, 4), 1, [2]),
                                             ((2, 3, 4), -1, [3, 3, 0, 1, 3]),
                                             ((1000,), 0, list(range(999, -1, -3)))])
@pytest.mark.parametrize("alpha", [1, -0.5])
def test_index_add(queue, rng, shape, dim, index, alpha):
    x = rng.standard_normal(shape)
    src_shape = list(shape)
    src_shape[dim] = len(index)
    source = rng.standard_normal(src_shape)
    i = pc.Tensor.from_host(queue, np.array(index))
    got = tp.index_add(leaf(queue, x), dim, i, leaf(queue, source), alpha=alpha)
    assert got.op_name == "index_add"
    want = np.moveaxis(x.copy(), dim, 0)
    np.add.at(want, np.array(index), alpha * np.moveaxis(source, dim, 0))
    np.testing.assert_allclose(got.to_host(), np.moveaxis(want, 0, dim), rtol=1e-5, atol=1e-5)
    ti = torch.tensor(index)
    against_torch(queue, rng, lambda a, b: tp.index_add(a, dim, i, b, alpha=alpha),
                  lambda a, b: torch.index_add(a, dim, ti, b, alpha=alpha), [x, source])
    if x.size <= 24:
        assert tp.gradcheck(lambda a, b: tp.index_add(a, dim, i, b, alpha=alpha),
                            [leaf(queue, x), leaf(queue, source)])


@pytest.mark.parametrize("xs,ishape,dim", [((3, 4), (3, 6), 1), ((3, 4), (1, 2), 1),
                                           ((3, 1), (3, 5), 1), ((2, 3, 4), (2, 5, 1), 1),
                                           ((2, 3, 4), (1, 3, 3), -1), ((5, 2), (7, 2), 0),
                                           ((3, 4), (5,), None), ((17,), (1000,), 0)])
def test_take_along_dim_broadcasts_as_torch(queue, rng, xs, ishape, dim):
    x = rng.standard_normal(xs)
    size = x.size if dim is None else xs[dim]
    index = rng.integers(0, size, ishape)
    i, ti = pc.Tensor.from_host(queue, index), torch.tensor(index)
    want = torch.take_along_dim(torch.tensor(x), ti, dim).numpy()
    got = tp.take_along_dim(leaf(queue, x), i, dim)
    assert got.op_name == "take_along_dim"
    np.testing.assert_allclose(got.to_host(), want, rtol=1e-6)
    against_torch(queue, rng, lambda a: tp.take_along_dim(a, i, dim),
                  lambda a: torch.take_along_dim(a, ti, dim), [x])
    if x.size <= 24:
        assert tp.gradcheck(lambda a: tp.take_along_dim(a, i, dim), [leaf(queue, x)])


def test_take_along_dim_takes_what_argsort_and_topk_give(queue, rng):
    a = rng.standard_normal((3, 7))
    x = leaf(queue, a)
    np.testing.assert_array_equal(tp.take_along_dim(x, tp.argsort(x, 1), 1).to_host(),
                                  np.sort(a, 1).astype(np.float32))
    np.testing.assert_array_equal(tp.take_along_dim(x, tp.topk(x, 2, 0).indices, 0).to_host(),
                                  tp.topk(x, 2, 0).values.to_host())


def test_0d_inputs_scatter_and_take_as_torch(queue):
    s, i = leaf(queue, np.array(1.0)), pc.Tensor.from_host(queue, np.array(0))
    v = leaf(queue, np.array(2.0))
    assert float(tp.scatter_add(s, 0, i, v)) == 3.0 and tp.scatter(s, 0, i, v).shape == ()
    one = pc.Tensor.from_host(queue, np.array([0]))
    assert float(tp.index_add(s, 0, one, v, alpha=2)) == 5.0
    assert float(tp.take_along_dim(s, i, 0)) == 1.0
    t = torch.tensor(1.0)
    assert torch.scatter_add(t, 0, torch.tensor(0), torch.tensor(2.0)).item() == 3.0


@pytest.mark.parametrize("x_shape,index,src_shape", [
    ((), [0, 0, 0], (3,)), ((3,), 2, ()), ((3,), 1, (2,)), ((), 0, ()), ((), [0], (1,))])
def test_a_0d_input_index_or_src_beside_1d_ones_gathers_and_scatters_as_torch(
        queue, rng, x_shape, index, src_shape):
    """PyTorch takes a 0-d tensor beside 1-D ones as 1-D of one element: torch.gather of
    [1, 2, 3] at a 0-d index 2 is 3.0 and torch.scatter_add of [1, 2, 3] at a 0-d index 1
    with a 0-d src 5 is [1, 7, 3]; parcl refused both ('index () and input (3,) must have
    the same number of dimensions'), and gather of a 0-d input outright."""
    x, src = rng.standard_normal(x_shape), rng.standard_normal(src_shape)
    i = np.array(index)
    ti, pi = torch.tensor(i), pc.Tensor.from_host(queue, i)
    against_torch(queue, rng, lambda v: tp.gather(v, -1, pi), lambda v: torch.gather(v, -1, ti),
                  [x])
    # torch's src gradient is refused where src is larger than the index: values only
    grads = src.size == i.size
    against_torch(queue, rng, lambda v, s: tp.scatter_add(v, 0, pi, s),
                  lambda v, s: torch.scatter_add(v, 0, ti, s), [x, src], grads=grads)
    if i.size == 1:
        against_torch(queue, rng, lambda v, s: tp.scatter(v, 0, pi, s),
                      lambda v, s: torch.scatter(v, 0, ti, s), [x, src], grads=grads)
    against_torch(queue, rng, lambda v: tp.scatter(v, 0, pi, 4.0),
                  lambda v: torch.scatter(v, 0, ti, 4.0), [x])
    deep = i.reshape(1, 1, -1)                # beside a 3-D index a 0-d input is refused
    raises_like_torch(lambda: tp.gather(up(queue, x), 0, pc.Tensor.from_host(queue, deep)),
                      lambda: torch.gather(torch.tensor(x), 0, torch.tensor(deep)), "gather")


def test_an_index_out_of_range_is_a_shape_error_naming_the_op(queue):
    x, src = leaf(queue, np.zeros((2, 3))), leaf(queue, np.ones((2, 3)))
    bad = pc.Tensor.from_host(queue, np.array([[0, 3], [1, 1]]))
    for op in ("scatter", "scatter_add"):
        with pytest.raises(pc.ShapeError, match=rf"{op}: index 3 at position \(0, 1\) of "
                                                r"indices \(2, 2\) .* dim 1 of size 3"):
            getattr(tp, op)(x.value, 1, bad, src.value)                 # unrecorded: at once
        with tp.Tape() as tape:
            out = getattr(tp, op)(x, 1, bad, src)
            loss = tp.sum(out)
        with pytest.raises(pc.ShapeError, match=f"{op}: index 3"):
            tape.backward(loss)                                         # recorded: backward
        with pytest.raises(pc.ShapeError, match=f"{op}: index 3"):
            out.to_host()                                               # and every read
    with pytest.raises(pc.ShapeError, match=r"index_add: index -1 at position \(1,\)"):
        tp.index_add(x.value, 0, pc.Tensor.from_host(queue, np.array([0, -1])), src.value)
    with pytest.raises(pc.ShapeError, match=r"take_along_dim: index 9 at position \(0, 1\) "
                                            r"of indices \(1, 2\)"):
        tp.take_along_dim(x.value, pc.Tensor.from_host(queue, np.array([[0, 9]])), 1)


def test_bad_shapes_and_dtypes_are_refused_as_torch_refuses_them(queue):
    x, tx = up(queue, np.zeros((2, 3))), torch.zeros(2, 3)
    i, ti = pc.Tensor.from_host(queue, np.zeros((3, 3), np.int64)), torch.zeros(3, 3,
                                                                               dtype=torch.long)
    src, tsrc = up(queue, np.ones((3, 3))), torch.ones(3, 3)
    msg = raises_like_torch(lambda: tp.scatter_add(x, 1, i, src),
                            lambda: torch.scatter_add(tx, 1, ti, tsrc), "scatter_add")
    assert "input (2, 3), index (3, 3), src (3, 3)" in msg
    raises_like_torch(lambda: tp.scatter(x, 2, pc.Tensor.from_host(queue, np.zeros((2, 3),
                                                                                  np.int64)),
                                         1.0),
                      lambda: torch.scatter(tx, 2, torch.zeros(2, 3, dtype=torch.long), 1.0),
                      "scatter")
    raises_like_torch(lambda: tp.scatter_add(x, 0, pc.Tensor.from_host(queue, np.zeros(
                          (2,), np.int64)), up(queue, np.ones(2))),
                      lambda: torch.scatter_add(tx, 0, torch.zeros(2, dtype=torch.long),
                                                torch.ones(2)), "scatter_add")
    raises_like_torch(lambda: tp.index_add(x, 0, pc.Tensor.from_host(queue, np.array([0])),
                                           up(queue, np.ones((2, 3)))),
                      lambda: torch.index_add(tx, 0, torch.tensor([0]), torch.ones(2, 3)),
                      "index_add")
    raises_like_torch(lambda: tp.take_along_dim(x, pc.Tensor.from_host(queue, np.zeros(
                          (3, 2), np.int64)), 1),
                      lambda: torch.take_along_dim(tx, torch.zeros(3, 2, dtype=torch.long), 1),
                      "take_along_dim")
    with pytest.raises(pc.DTypeError, match="scatter: index must be an int32 or int64"):
        tp.scatter(x, 0, up(queue, np.zeros((2, 3))), 1.0)
    with pytest.raises(TypeError, match="scatter_add: src must be"):
        tp.scatter_add(x, 0, i, 1.0)


# -- the small composed ops ---------------------------------------------------------------------

@pytest.mark.parametrize("fills", [{}, {"nan": 1.5, "posinf": 9.0, "neginf": -7.0},
                                   {"posinf": 2.0}, {"nan": None, "posinf": None}])
def test_nan_to_num_replaces_as_torch_and_passes_the_gradient_where_finite(queue, rng, fills):
    a = rng.standard_normal((3, 5))
    a.reshape(-1)[[1, 4, 7, 8]] = [np.nan, np.inf, -np.inf, np.nan]
    got = tp.nan_to_num(up(queue, a), **fills).to_host()
    want = torch.nan_to_num(torch.tensor(a, dtype=torch.float32), **fills).numpy()
    np.testing.assert_array_equal(got, want)
    x = leaf(queue, a)
    with tp.Tape() as tape:
        loss = tp.sum(tp.nan_to_num(x, **fills) * 2.0)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), 2.0 * np.isfinite(a))
    assert tp.gradcheck(lambda v: tp.nan_to_num(v, **fills), [leaf(queue, a[:, [0]])])


def test_outer(queue, rng):
    a, b = rng.standard_normal(4), rng.standard_normal(1)
    against_torch(queue, rng, tp.outer, torch.outer, [a, b])
    assert tp.gradcheck(tp.outer, [leaf(queue, a), leaf(queue, rng.standard_normal(3))])
    raises_like_torch(lambda: tp.outer(up(queue, np.ones((2, 2))), up(queue, np.ones(2))),
                      lambda: torch.outer(torch.ones(2, 2), torch.ones(2)), "outer")


@pytest.mark.parametrize("input_shape", [(3, 5), (5,), (1, 1), (3, 1)])
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, -2.0), (0, 3.0)])
def test_addmm_and_baddbmm_equal_torchs(queue, rng, input_shape, beta, alpha):
    m1, m2 = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    inp = rng.standard_normal(input_shape)
    against_torch(queue, rng, lambda i, a, b: tp.addmm(i, a, b, beta=beta, alpha=alpha),
                  lambda i, a, b: torch.addmm(i, a, b, beta=beta, alpha=alpha), [inp, m1, m2],
                  tol=1e-4)
    b1, b2 = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
    against_torch(queue, rng, lambda i, a, b: tp.baddbmm(i, a, b, beta=beta, alpha=alpha),
                  lambda i, a, b: torch.baddbmm(i, a, b, beta=beta, alpha=alpha),
                  [inp, b1, b2], tol=1e-4)
    assert tp.gradcheck(lambda i, a, b: tp.addmm(i, a, b, beta=beta, alpha=alpha),
                        [leaf(queue, inp), leaf(queue, m1), leaf(queue, m2)])


def test_addmm_with_beta_0_ignores_nan_in_the_input_and_refuses_bad_shapes(queue, rng):
    nan = up(queue, np.full((2, 2), np.nan))
    m = up(queue, np.eye(2))
    np.testing.assert_array_equal(tp.addmm(nan, m, m, beta=0).to_host(), np.eye(2))
    t = torch.ones(2, 2)
    raises_like_torch(lambda: tp.addmm(up(queue, np.ones((3, 2))), m, m),
                      lambda: torch.addmm(torch.ones(3, 2), t, t), "addmm")
    raises_like_torch(lambda: tp.addmm(m, m, up(queue, np.ones((3, 2)))),
                      lambda: torch.addmm(t, t, torch.ones(3, 2)), "addmm")
    b = up(queue, np.ones((2, 2, 2)))
    raises_like_torch(lambda: tp.baddbmm(b, b, up(queue, np.ones((3, 2, 2)))),
                      lambda: torch.baddbmm(torch.ones(2, 2, 2), torch.ones(2, 2, 2),
                                            torch.ones(3, 2, 2)), "baddbmm")


@pytest.mark.parametrize("op", ["addmm", "baddbmm"])
def test_addmm_with_beta_0_gives_the_input_a_zero_gradient_as_pytorch(queue, rng, op):
    """With ``beta=0`` the input is ignored but stays in PyTorch's graph: its gradient is
    zeros, where parcl's was None, so SGD with weight_decay=0.5 at lr=0.1 left a bias
    [1, -2, 3] as it was where PyTorch's step makes it [0.95, -1.9, 2.85], silently."""
    shape = (2, 3) if op == "addmm" else (1, 2, 3)
    a, b = rng.standard_normal(shape[:-1] + (4,)), rng.standard_normal(shape[:-2] + (4, 3))
    bias = np.array([1.0, -2.0, 3.0], np.float32)
    inp, m1, m2 = leaf(queue, bias), leaf(queue, a), leaf(queue, b)
    t_inp = torch.tensor(bias, requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(getattr(tp, op)(inp, m1, m2, beta=0))
    tape.backward(loss)
    getattr(torch, op)(t_inp, torch.tensor(a, dtype=torch.float32, requires_grad=True),
                       torch.tensor(b, dtype=torch.float32), beta=0).sum().backward()
    pc.optim.SGD([inp], lr=0.1, weight_decay=0.5).step()
    torch.optim.SGD([t_inp], lr=0.1, weight_decay=0.5).step()
    np.testing.assert_allclose(inp.to_host(), [0.95, -1.9, 2.85], rtol=1e-6)
    np.testing.assert_array_equal(inp.grad.to_host(), np.zeros(3, np.float32))
    np.testing.assert_array_equal(t_inp.grad.numpy(), np.zeros(3, np.float32))
    np.testing.assert_allclose(inp.to_host(), t_inp.detach().numpy(), rtol=1e-6)


NORM_DIMS = [None, 0, -1, (0, 2)]


@pytest.mark.parametrize("ord_", [2, 1, 3, 0.5, np.inf, -np.inf, 0])
@pytest.mark.parametrize("dim", NORM_DIMS, ids=[str(d) for d in NORM_DIMS])
@pytest.mark.parametrize("keepdim", [False, True])
def test_linalg_vector_norm_equals_torchs(queue, rng, ord_, dim, keepdim):
    a = rng.standard_normal((3, 4, 2))
    a[0, 1, 0] = 0.0
    grads = ord_ != 0
    against_torch(queue, rng, lambda v: tp.linalg_vector_norm(v, ord_, dim, keepdim),
                  lambda v: torch.linalg.vector_norm(v, ord_, dim, keepdim), [a], tol=1e-4,
                  grads=grads)
    want = np.linalg.norm(np.moveaxis(a, (0, 2), (0, 1)).reshape(6, 4), ord_, axis=0) \
        if dim == (0, 2) else None
    if want is not None and not keepdim:
        np.testing.assert_allclose(tp.linalg_vector_norm(up(queue, a), ord_, dim).to_host(),
                                   want, rtol=1e-5)
    against_torch(queue, rng, lambda v: tp.norm(v, ord_, dim, keepdim),
                  lambda v: torch.norm(v, ord_, dim, keepdim), [a], tol=1e-4, grads=grads)


@pytest.mark.parametrize("ord_", [2, 3, 1, np.inf, 0.5])
def test_the_gradient_of_a_norm_at_zero_is_zero_as_torchs(queue, ord_):
    a = np.zeros((2, 3))
    a[1] = [3.0, 0.0, -4.0]
    x = leaf(queue, a)
    with tp.Tape() as tape:
        loss = tp.sum(tp.linalg_vector_norm(x, ord_, dim=1))
    tape.backward(loss)
    t = torch.tensor(a, requires_grad=True)
    torch.linalg.vector_norm(t, ord_, dim=1).sum().backward()
    np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-6, atol=1e-7)
    assert not np.isnan(x.grad.to_host()).any()


@pytest.mark.parametrize("ord_", [2, 3, 0.5, -1, 1, np.inf])
def test_a_norm_over_a_nan_is_nan_as_torchs(queue, ord_):
    # the root was taken of the sums > 0 only, so a NaN's sum (not > 0) gave a norm of 0.0
    # where PyTorch's is NaN: a NaN in the weights looked like a zero vector
    a = np.array([[np.nan, 1.0, 2.0], [3.0, 0.5, -4.0]])
    got = tp.linalg_vector_norm(up(queue, a), ord_, dim=1).to_host()
    want = torch.linalg.vector_norm(torch.tensor(a), ord_, dim=1).numpy()
    assert np.isnan(got[0]) and np.isnan(want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert np.isnan(tp.norm(up(queue, a), ord_).to_host())


@pytest.mark.parametrize("ord_", [-1, -2, -0.5])
@pytest.mark.parametrize("dim", NORM_DIMS, ids=[str(d) for d in NORM_DIMS])
def test_a_negative_order_norm_of_a_vector_holding_a_zero_is_zero_as_torchs(queue, rng, ord_,
                                                                           dim):
    # |0| ** ord is inf there, so the norm is 0 (gradient 0); the zeros were left out of the
    # sum, and the (-1)-norm of [0, 1, 2] came out 0.667 instead of 0
    a = rng.standard_normal((3, 4, 2))
    a[0, 1, 0] = a[2, 3, 1] = 0.0
    np.testing.assert_allclose(tp.linalg_vector_norm(up(queue, np.array([0.0, 1.0, 2.0])),
                                                     -1).to_host(), 0.0)
    for keepdim in (False, True):
        against_torch(queue, rng, lambda v, k=keepdim: tp.linalg_vector_norm(v, ord_, dim, k),
                      lambda v, k=keepdim: torch.linalg.vector_norm(v, ord_, dim, k), [a],
                      tol=1e-4)


@pytest.mark.parametrize("ord_", [2, 1, 0.5, np.inf, 0])
@pytest.mark.parametrize("keepdim", [False, True])
def test_a_norm_over_dim_empty_is_over_every_dim_as_torchs(queue, rng, ord_, keepdim):
    # dim=() reduced over no dim: the 2-norm of [[3, -4], [1, 2]] came out |x| elementwise,
    # [[3, 4], [1, 2]], where PyTorch gives 5.477 (dim=None's)
    a = np.array([[3.0, -4.0], [1.0, 2.0]])
    np.testing.assert_allclose(tp.linalg_vector_norm(up(queue, a), dim=()).to_host(),
                               np.sqrt(30.0), rtol=1e-6)
    for dim in ((), []):
        against_torch(queue, rng,
                      lambda v, d=dim: tp.linalg_vector_norm(v, ord_, d, keepdim),
                      lambda v, d=dim: torch.linalg.vector_norm(v, ord_, d, keepdim),
                      [rng.standard_normal((2, 3))], tol=1e-5, grads=ord_ != 0)


def test_norm_takes_fro_and_refuses_matrix_norms(queue, rng):
    a = rng.standard_normal((3, 4))
    against_torch(queue, rng, lambda v: tp.norm(v, "fro"), lambda v: torch.norm(v, "fro"), [a])
    against_torch(queue, rng, lambda v: tp.norm(v, "fro", dim=1, keepdim=True),
                  lambda v: torch.norm(v, "fro", dim=1, keepdim=True), [a])
    # p=None is PyTorch's 'fro' too (it was a ParclError: ord must be a number)
    against_torch(queue, rng, lambda v: tp.norm(v, None, 1), lambda v: torch.norm(v, None, 1),
                  [a])
    against_torch(queue, rng, lambda v: v.norm(None), lambda v: v.norm(None), [a])
    assert tp.gradcheck(lambda v: tp.norm(v, 2, 0), [leaf(queue, a)])
    with pytest.raises(pc.ParclError, match="norm: p='nuc' is not supported"):
        tp.norm(up(queue, a), "nuc")
    raises_like_torch(lambda: tp.linalg_vector_norm(up(queue, a), 2, dim=2),
                      lambda: torch.linalg.vector_norm(torch.tensor(a), 2, dim=2),
                      "linalg_vector_norm")


def test_a_captured_step_of_sort_topk_and_scatters_replays_the_eager_bits(queue, rng):
    w = leaf(queue, rng.standard_normal((4, 6)))
    idx = pc.Tensor.from_host(queue, rng.integers(0, 6, (4, 5)))

    def step(x):
        with tp.Tape() as tape:
            h = tp.tensor(x) * w
            values, indices = tp.topk(h, 3, 1)
            s = tp.scatter_add(h, 1, idx, tp.take_along_dim(h, indices, 1)[:, :1] * tp.tensor(
                pc.Tensor.full(queue, (4, 5), 1.0)))
            s = tp.index_add(s, 0, pc.Tensor.from_host(queue, np.array([3, 3])), s[:2])
            loss = tp.sum(values) + tp.sum(tp.sort(s, 0).values * 0.5) + tp.norm(s)
        tape.backward(loss)
        return loss.value

    assert_replays_eager(queue, step, w, [rng.standard_normal((4, 6)).astype(np.float32)
                                          for _ in range(3)])


def test_scatters_of_an_empty_index_leave_the_input_as_pytorch(queue):
    """An index with no elements (``idx[:, 2:]``, ``ids[2:2]``): the launch divided by the
    index's length along the axis, 0, a ZeroDivisionError from tp.scatter, tp.scatter_add and
    tp.index_add, where PyTorch writes nothing: the input unchanged, its gradient passed
    through and a zero gradient for the source."""
    import torch
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    idx = np.zeros((6, 2), np.int64)
    x, s = tp.tensor(a, requires_grad=True), tp.tensor(a, requires_grad=True)
    xt, st = torch.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    i, it = pc.Tensor.from_host(queue, idx), torch.tensor(idx)
    ids, idt = pc.Tensor.from_host(queue, np.arange(6)), torch.arange(6)
    with tp.Tape() as tape:
        outs = [tp.scatter(x * 1.0, 1, i[:, 2:], s[:, 4:]),
                tp.scatter_add(x * 1.0, 1, i[:, 2:], s[:, 4:]),
                tp.scatter(x * 1.0, 1, i[:, 2:], 1.0),
                tp.index_add(x * 1.0, 0, ids[2:2], s[2:2])]
        loss = tp.sum(tp.stack([tp.sum(y * y) for y in outs]))
    tape.backward(loss)
    touts = [torch.scatter(xt * 1, 1, it[:, 2:], st[:, 4:]),
             torch.scatter_add(xt * 1, 1, it[:, 2:], st[:, 4:]),
             torch.scatter(xt * 1, 1, it[:, 2:], 1.0),
             torch.index_add(xt * 1, 0, idt[2:2], st[2:2])]
    sum((y * y).sum() for y in touts).backward()
    for y, yt in zip(outs, touts):
        np.testing.assert_array_equal(y.to_host(), yt.detach().numpy())     # a itself
    np.testing.assert_array_equal(x.grad.to_host(), xt.grad.numpy())        # 8 * a
    np.testing.assert_array_equal(s.grad.to_host(), np.zeros((6, 4)))
