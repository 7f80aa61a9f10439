"""median, nanmedian, quantile, nanquantile, kthvalue, mode, msort, aminmax, cummax, cummin
and logcumsumexp: values and indices against PyTorch (ties and NaNs included), gradients
against finite differences and PyTorch's, and the errors PyTorch raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf, up
from parcl.tape.ops.order import mode
from torch_reference import against_torch, raises_like_torch

NAN = np.nan
TIES = np.array([[3.0, 1.0, 3.0, 1.0, 2.0, 1.0], [2.0, NAN, 1.0, NAN, 0.0, 5.0]], np.float32)


def _ties(rng, shape):
    a = rng.integers(0, 4, shape).astype(np.float32)
    a.reshape(-1)[rng.random(a.size) < 0.1] = NAN
    return a


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_median_and_nanmedian_pick_the_values_and_indices_as_pytorch(queue, rng, dim, keepdim):
    a = _ties(rng, (5, 7, 4))
    for op in ("median", "nanmedian"):
        got = getattr(tp, op)(up(queue, a), dim, keepdim)
        want = getattr(torch, op)(torch.tensor(a), dim, keepdim)
        np.testing.assert_array_equal(got.values.to_host(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.to_host(), want.indices.numpy())


def test_median_of_every_element_is_the_lower_median_and_nan_propagates(queue):
    assert float(tp.median(up(queue, TIES[0]))) == 1.0
    assert np.isnan(float(tp.median(up(queue, TIES))))
    assert float(tp.nanmedian(up(queue, TIES))) == 1.0
    np.testing.assert_array_equal(tp.median(up(queue, TIES), 1).indices.to_host(), [5, 1])
    values, indices = tp.nanmedian(up(queue, [[NAN, NAN]]), 1)
    assert np.isnan(values.to_host()[0]) and indices.to_host()[0] == 0      # as PyTorch's


def test_median_of_every_element_shares_the_gradient_among_ties_as_pytorch(queue, rng):
    for op in ("median", "nanmedian"):
        against_torch(queue, rng, getattr(tp, op), getattr(torch, op), [TIES[:1]])
    against_torch(queue, rng, lambda v: tp.median(v, 1).values,
                  lambda v: torch.median(v, 1).values, [TIES[:1]])
    x = leaf(queue, rng.permutation(12).reshape(3, 4) / 3.0)
    assert tp.gradcheck(lambda v: tp.median(v, 0).values, [x])
    assert tp.gradcheck(tp.nanmedian, [x])


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_interpolates_as_pytorch(queue, rng, interpolation):
    a = rng.standard_normal((4, 9, 3)).astype(np.float32)
    qs = np.array([0.0, 0.125, 1 / 3, 0.5, 0.625, 1.0], np.float32)
    for dim, keepdim in ((None, False), (None, True), (1, False), (-1, True), (0, False)):
        for q in (qs, 0.375):
            got = tp.quantile(up(queue, a), up(queue, q) if isinstance(q, np.ndarray) else q,
                              dim, keepdim, interpolation=interpolation)
            want = torch.quantile(torch.tensor(a), torch.tensor(q) if isinstance(
                q, np.ndarray) else q, dim, keepdim, interpolation=interpolation)
            assert got.shape == tuple(want.shape)
            np.testing.assert_allclose(got.to_host(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_quantile_gives_nan_for_rows_with_nan_and_nanquantile_skips_them(queue):
    a = np.array([[1.0, NAN, 2.0, 4.0], [NAN, NAN, NAN, NAN], [0.0, 1.0, 2.0, 3.0]],
                 np.float32)
    for op in ("quantile", "nanquantile"):
        for interpolation in ("linear", "nearest"):
            got = getattr(tp, op)(up(queue, a), up(queue, [0.25, 0.5]), 1,
                                  interpolation=interpolation).to_host()
            want = getattr(torch, op)(torch.tensor(a), torch.tensor([0.25, 0.5]), 1,
                                      interpolation=interpolation).numpy()
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(tp.nanquantile(up(queue, a), 0.5, 1).to_host(),
                                  [2.0, NAN, 1.5])


def test_quantile_gradient_is_the_interpolation_weights_as_pytorch(queue, rng):
    a = rng.permutation(20).reshape(4, 5).astype(np.float32) / 4
    q = np.array([0.3, 0.5], np.float32)
    for interpolation in ("linear", "midpoint", "lower", "nearest"):
        against_torch(queue, rng, lambda v, i=interpolation: tp.quantile(
                          v, up(queue, q), 1, interpolation=i),
                      lambda v, i=interpolation: torch.quantile(
                          v, torch.tensor(q), 1, interpolation=i), [a])
        against_torch(queue, rng, lambda v, i=interpolation: tp.nanquantile(
                          v, 0.7, interpolation=i),
                      lambda v, i=interpolation: torch.nanquantile(v, 0.7, interpolation=i),
                      [a])
    x = leaf(queue, a)
    assert tp.gradcheck(lambda v: tp.quantile(v, up(queue, q), 0), [x])
    x = leaf(queue, [1.0, 2.0, 3.0, 4.0])
    with tp.Tape() as tape:
        loss = tp.sum(tp.quantile(x, up(queue, [0.5, 1 / 3])))
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), [0.0, 1.5, 0.5, 0.0], atol=1e-6)


def test_kthvalue_picks_the_kth_smallest_as_pytorch_and_the_stable_orders_index(queue, rng):
    a = _ties(rng, (6, 11))
    for k in (1, 4, 11):
        for dim, keepdim in ((1, False), (-1, True)):
            values, indices = tp.kthvalue(up(queue, a), k, dim, keepdim)
            want = torch.kthvalue(torch.tensor(a), k, dim, keepdim)
            np.testing.assert_array_equal(values.to_host(), want.values.numpy())
            stable = np.argsort(a, 1, kind="stable")[:, k - 1]
            np.testing.assert_array_equal(indices.to_host().reshape(-1), stable)
    b = rng.permutation(24).reshape(4, 6).astype(np.float32)
    np.testing.assert_array_equal(tp.kthvalue(up(queue, b), 2, 0).indices.to_host(),
                                  torch.kthvalue(torch.tensor(b), 2, 0).indices.numpy())
    against_torch(queue, rng, lambda v: tp.kthvalue(v, 3, 0).values,
                  lambda v: torch.kthvalue(v, 3, 0).values, [b])
    assert tp.gradcheck(lambda v: tp.kthvalue(v, 2).values, [leaf(queue, b / 5)])


def test_mode_is_the_most_frequent_smallest_value_at_its_last_index_as_pytorch(queue, rng):
    a = rng.integers(0, 4, (5, 13)).astype(np.float32)
    for dim, keepdim in ((1, False), (0, True), (-1, True)):
        got = mode(up(queue, a), dim, keepdim)
        want = torch.mode(torch.tensor(a), dim, keepdim)
        np.testing.assert_array_equal(got.values.to_host(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.to_host(), want.indices.numpy())
    got = leaf(queue, TIES).mode(1)
    np.testing.assert_array_equal(got.values.to_host(), [1.0, 0.0])
    np.testing.assert_array_equal(got.indices.to_host(), [5, 4])
    against_torch(queue, rng, lambda v: v.mode(1).values, lambda v: torch.mode(v, 1).values,
                  [a])


def test_msort_and_aminmax_as_pytorch(queue, rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(tp.msort(up(queue, a)).to_host(), np.sort(a, 0))
    b = np.array([[1.0, 5.0], [0.0, 5.0]], np.float32)
    lo, hi = tp.aminmax(up(queue, b))
    assert float(lo) == 0.0 and float(hi) == 5.0
    result = tp.aminmax(up(queue, b), dim=1, keepdim=True)
    np.testing.assert_array_equal(result.min.to_host(), [[1.0], [0.0]])
    np.testing.assert_array_equal(result.max.to_host(), [[5.0], [5.0]])
    against_torch(queue, rng, lambda v: tuple(tp.aminmax(v)), lambda v: tuple(torch.aminmax(v)),
                  [b])         # the tied maxima share the gradient: 0.5 each


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cummax_and_cummin_reach_values_and_indices_as_pytorch(queue, rng, dim):
    a = _ties(rng, (6, 5, 3))
    for op in ("cummax", "cummin"):
        got = getattr(tp, op)(up(queue, a), dim)
        want = getattr(torch, op)(torch.tensor(a), dim)
        np.testing.assert_array_equal(got.values.to_host(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.to_host(), want.indices.numpy())
    y = up(queue, [1.0, NAN, 2.0, NAN, 1.0])
    np.testing.assert_array_equal(tp.cummax(y, 0).indices.to_host(), [0, 1, 1, 3, 3])


def test_cummax_gradient_goes_to_where_each_value_was_reached_as_pytorch(queue, rng):
    a = rng.integers(0, 5, (3, 7)).astype(np.float32)
    for op in ("cummax", "cummin"):
        against_torch(queue, rng, lambda v, op=op: getattr(tp, op)(v, 1).values,
                      lambda v, op=op: getattr(torch, op)(v, 1).values, [a])
    x = leaf(queue, rng.permutation(21).reshape(3, 7) / 4.0)
    assert tp.gradcheck(lambda v: tp.cummax(v, 1).values, [x])
    assert tp.gradcheck(lambda v: tp.cummin(v, 0).values, [x])


def test_logcumsumexp_is_stable_and_its_gradient_is_pytorchs(queue, rng):
    a = (rng.standard_normal((4, 6)) * 30).astype(np.float32)
    a[0, :2] = 200.0                                  # exp would overflow float32
    for dim in (0, 1, -1):
        np.testing.assert_allclose(
            tp.logcumsumexp(up(queue, a), dim).to_host(),
            torch.logcumsumexp(torch.tensor(a, dtype=torch.float64), dim).numpy(),
            rtol=1e-6, atol=1e-5)
        against_torch(queue, rng, lambda v, d=dim: tp.logcumsumexp(v, d),
                      lambda v, d=dim: torch.logcumsumexp(v, d), [a / 30], tol=1e-5)
    np.testing.assert_array_equal(
        tp.logcumsumexp(up(queue, [-np.inf, 0.0, np.inf, 1.0]), 0).to_host(),
        [-np.inf, 0.0, np.inf, np.inf])
    x = leaf(queue, rng.standard_normal((3, 5)))
    assert tp.gradcheck(lambda v: tp.logcumsumexp(v, 1), [x])
    assert tp.gradcheck(lambda v: tp.logcumsumexp(v, 0), [x])


def test_ops_of_a_0d_input_and_node_methods_as_pytorch(queue):
    s = leaf(queue, np.float32(2.5))
    values, indices = tp.median(s, 0)
    assert values.shape == () and float(values) == 2.5 and int(indices.to_host()) == 0
    assert tp.cummax(s, 0).values.shape == () and tp.logcumsumexp(s, -1).shape == ()
    assert tp.kthvalue(s, 1).values.shape == () and float(tp.quantile(s, 0.2)) == 2.5
    x = leaf(queue, TIES)
    with tp.Tape():
        assert x.median(1).values.op_name == "median"
        assert x.kthvalue(2, 1).values.op_name == "kthvalue"
        assert x.quantile(0.5, 1).shape == (2,) and x.nanquantile(0.5).shape == ()
        assert x.cummax(1).values.op_name == "cummax"
        assert x.logcumsumexp(1).op_name == "logcumsumexp"
    assert float(x.nanmedian()) == 1.0 and x.msort().shape == (2, 6)
    assert float(x[0].aminmax().max) == 3.0 and x.cummin(0).indices.shape == (2, 6)


def test_median_mode_and_kthvalue_of_a_0d_input_with_keepdim_stay_0d_as_pytorch(queue):
    """``torch.median(s, 0, keepdim=True)`` of a 0-d ``s`` is 0-d (values and indices), as
    ``torch.amax(s, 0, True)``: there is no dim to keep. parcl's median, nanmedian, mode and
    kthvalue gave shape (1,), so ``s - s.median(0, True).values`` of ``s = 2.5`` was the
    (1,) [0.] where PyTorch gives the 0-d 0., silently; the gradient is PyTorch's 1."""
    t = torch.tensor(2.5, requires_grad=True)
    ops = {"median": (lambda v: tp.median(v, 0, True), lambda v: torch.median(v, 0, True)),
           "nanmedian": (lambda v: tp.nanmedian(v, -1, True),
                         lambda v: torch.nanmedian(v, -1, True)),
           "mode": (lambda v: mode(v, 0, True), lambda v: torch.mode(v, 0, True)),
           "kthvalue": (lambda v: tp.kthvalue(v, 1, 0, True),
                        lambda v: torch.kthvalue(v, 1, 0, True))}
    for name, (ours, theirs) in ops.items():
        s = leaf(queue, np.float32(2.5))
        with tp.Tape() as tape:
            values, indices = ours(s)
            out = s - values * 0.5
        tape.backward(tp.sum(out))
        t.grad = None
        want_values, want_indices = theirs(t)
        (t - want_values * 0.5).sum().backward()
        assert values.shape == indices.shape == out.shape == (), name
        assert want_values.shape == want_indices.shape == ()
        assert float(values) == 2.5 and int(indices.to_host()) == 0 and float(out) == 1.25
        assert float(s.grad.to_host()) == float(t.grad) == 0.5


def test_quantile_gives_its_levels_q_their_gradient_as_pytorch(queue, rng):
    """``torch.quantile(x, q)`` is differentiable in ``q`` (linear interpolation: the rank
    ``q * (n - 1)`` moves the weight), so a learned level gets a gradient: of ``[1, 2, 4, 8]``
    at ``q = 0.5`` the quantile is 3 and ``d/dq`` is ``(4 - 2) * 3 = 6``. parcl read ``q``
    as a constant, so ``q.grad`` stayed None, silently. Now ``q`` (0-d or 1-D) gets PyTorch's
    gradient for quantile and nanquantile along any dim, 0 from a row that gives NaN (PyTorch
    masks its rank) and from the step-wise interpolations; ``x``'s gradient is unchanged."""
    q = leaf(queue, np.float32(0.5))
    with tp.Tape() as tape:
        out = tp.quantile(up(queue, [1.0, 2.0, 4.0, 8.0]), q)
    tape.backward(out)
    assert float(out) == 3.0 and float(q.grad.to_host()) == 6.0
    a = rng.standard_normal((3, 5)).astype(np.float32)
    a[1, 2] = NAN
    weights = rng.standard_normal((3, 3)).astype(np.float32)
    for op in ("quantile", "nanquantile"):
        for interpolation in ("linear", "lower", "midpoint"):
            for levels, dim in (([0.1, 0.5, 0.9], 1), ([0.3, 1.0, 0.0], -1), (0.7, 1)):
                levels = np.asarray(levels, np.float32)
                x, q = leaf(queue, a), leaf(queue, levels)
                with tp.Tape() as tape:
                    out = getattr(tp, op)(x, q, dim, interpolation=interpolation)
                    loss = tp.sum(out * tp.tensor(weights[: levels.size].reshape(out.shape)))
                tape.backward(loss)
                tx = torch.tensor(a, requires_grad=True)
                tq = torch.tensor(levels, requires_grad=True)
                want = getattr(torch, op)(tx, tq, dim, interpolation=interpolation)
                (want * torch.tensor(weights[: levels.size]).reshape(want.shape)).sum().backward()
                np.testing.assert_allclose(out.to_host(), want.detach().numpy(), rtol=1e-6)
                want_q = np.zeros_like(levels) if tq.grad is None else tq.grad.numpy()
                got_q = np.zeros_like(levels) if q.grad is None else q.grad.to_host()
                assert (q.grad is None) == (interpolation != "linear")
                np.testing.assert_allclose(got_q, want_q, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(x.grad.to_host(), tx.grad.numpy(), rtol=1e-5,
                                           atol=1e-6)


def test_order_errors_name_the_op_and_the_shapes_as_pytorch(queue):
    x, t = up(queue, np.ones((2, 3))), torch.ones(2, 3)
    assert "(2, 3)" in raises_like_torch(lambda: tp.kthvalue(x, 4), lambda: torch.kthvalue(t, 4),
                                         "kthvalue")
    raises_like_torch(lambda: tp.median(x, 2), lambda: torch.median(t, 2), "median")
    raises_like_torch(lambda: tp.quantile(x, 1.5), lambda: torch.quantile(t, 1.5), "quantile")
    raises_like_torch(lambda: tp.nanquantile(x, -0.1), lambda: torch.nanquantile(t, -0.1),
                      "nanquantile")
    raises_like_torch(lambda: tp.cummax(x, 2), lambda: torch.cummax(t, 2), "cummax")
    raises_like_torch(lambda: tp.logcumsumexp(x, -3), lambda: torch.logcumsumexp(t, -3),
                      "logcumsumexp")
    with pytest.raises(pc.ShapeError, match="quantile: interpolation must be one of linear"):
        tp.quantile(x, 0.5, interpolation="cubic")
    with pytest.raises(pc.DTypeError, match=r"median: input \(2,\) has dtype int64"):
        tp.median(pc.Tensor.from_host(queue, np.array([3, 1])))
    with pytest.raises(pc.ShapeError, match=r"median: dim 1 of input \(2, 0\) has no elem"):
        tp.median(x[:, 3:], 1)


@pytest.mark.parametrize("op", ["median", "kthvalue", "cummax"])
def test_indices_of_rows_from_an_out_of_range_id_raise_as_argmaxs_do(queue, op):
    """The indices of rows picked by a token id outside ``[0, V)`` raise the embedding's
    error at their host read, as tp.argmax's and tp.sort's do."""
    weight = pc.nn.Parameter.from_host(queue, np.ones((4, 3), np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight)
        indices = {"median": lambda: tp.median(rows, 0).indices,
                   "kthvalue": lambda: tp.kthvalue(rows, 1, 0).indices,
                   "cummax": lambda: tp.cummax(rows, 0).indices}[op]()
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        indices.to_host()
