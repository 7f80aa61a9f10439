"""max, min, argmax, argmin, var, std, logsumexp, cumsum: forward against float64 numpy,
backward against finite differences over awkward shapes (size-1 and odd dims, negative axes,
tuples, keepdims), ties, and edge values without NaN where PyTorch has none."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from conftest import leaf


def grad_of(q, fn, x, upstream=None):
    nx = leaf(q, x)
    with tp.Tape() as tape:
        y = fn(nx)
    up = np.ones(y.shape, np.float32) if upstream is None else upstream
    tape.backward(y, grad=pc.Tensor.from_host(q, up))
    return y.to_host(), nx.grad.to_host()


def ref_lse(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def values_of(op):
    """``tp.max``/``tp.min`` as ``np.max``: the values alone, ``.values`` of the
    ``(values, indices)`` that a dim gives, as ``torch.max``'s."""
    def values(t, axis, keepdims=False):
        return op(t, keepdims=keepdims) if axis is None else op(t, axis, keepdims).values
    return values


SHAPES_AXES = [((3, 4, 5), None), ((3, 4, 5), -1), ((3, 4, 5), 0), ((3, 4, 5), (0, 2)),
               ((3, 4, 5), (-1, 1)), ((1, 7), 0), ((7,), 0), ((2, 1, 3), 1)]


@pytest.mark.parametrize("shape, axis", SHAPES_AXES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_forward_and_gradcheck(queue, rng, shape, axis, keepdims):
    x = rng.standard_normal(shape)
    nx = leaf(queue, x)
    x32 = x.astype(np.float32).astype(np.float64)
    cases = {
        "max": (values_of(tp.max), lambda a: np.max(a, axis=axis, keepdims=keepdims)),
        "min": (values_of(tp.min), lambda a: np.min(a, axis=axis, keepdims=keepdims)),
        "var": (tp.var, lambda a: np.var(a, axis=axis, keepdims=keepdims, ddof=1)),
        "std": (tp.std, lambda a: np.std(a, axis=axis, keepdims=keepdims, ddof=1)),
        "logsumexp": (tp.logsumexp, lambda a: ref_lse(a, axis, keepdims)),
    }
    n = x.size if axis is None else np.prod([shape[a] for a in np.atleast_1d(axis)])
    for name, (op, ref) in cases.items():
        if name in ("var", "std") and n < 2 or name in ("max", "min") and type(axis) is tuple:
            continue                   # torch.max takes one dim; tp.amax takes several
        y = op(nx, axis, keepdims=keepdims)
        assert y.op_name == name
        want = ref(x32)
        assert y.shape == np.shape(want)
        np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-5, err_msg=name)
        assert tp.gradcheck(lambda t, op=op: op(t, axis, keepdims=keepdims), [nx], atol=5e-3)


def test_max_min_ties_send_gradient_to_the_first_over_axes_and_share_it_over_all(queue):
    """As torch: ``torch.max(x, dim)`` gives a row's gradient to its first maximum, and
    ``torch.max(x)`` shares it among tied maxima (parcl gave it all to the first)."""
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    _, g = grad_of(queue, lambda t: tp.max(t, 1).values, x)
    assert g.tolist() == [[0, 1, 0], [1, 0, 0]]
    _, g = grad_of(queue, lambda t: tp.max(t), x)
    assert g.tolist() == [[0, 0.5, 0.5], [0, 0, 0]]
    _, g = grad_of(queue, lambda t: tp.min(t, keepdims=True), np.array([[1.0, 0.0], [0.0, 2.0]]))
    assert g.tolist() == [[0, 0.5], [0.5, 0]]
    _, g = grad_of(queue, lambda t: tp.min(t, dim=0).values, np.array([[1.0, 2.0], [1.0, 0.0]]))
    assert g.tolist() == [[1, 0], [0, 1]]


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_of_every_element_give_nan_extremes_the_gradient_as_pytorch(queue, op):
    """``torch.max(x)`` of a tensor holding NaNs is NaN and shares the gradient among the
    NaNs (0.5 each of two), the rest 0; since the ties were shared (amax's rule, under which
    a NaN extreme ties with nothing) every element's gradient was NaN, so one NaN input
    poisoned every parameter behind it, silently. torch.amax keeps its NaN gradient."""
    import torch
    x = np.array([[1.0, np.nan, 3.0], [np.nan, 2.0, 0.0]])
    y, g = grad_of(queue, lambda t: getattr(tp, op)(t) * 3.0, x)
    t = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    (getattr(torch, op)(t) * 3.0).backward()
    assert np.isnan(y) and g.tolist() == t.grad.tolist() == [[0, 1.5, 0], [1.5, 0, 0]]
    _, g = grad_of(queue, lambda t: tp.amax(t), x)
    assert np.isnan(g).all()                       # as torch.amax's


@pytest.mark.parametrize("op, ref", [(tp.argmax, np.argmax), (tp.argmin, np.argmin)])
@pytest.mark.parametrize("axis", [None, 0, -1, 1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_argmin(queue, rng, op, ref, axis, keepdims):
    x = rng.integers(0, 3, (3, 5)).astype(np.float32)          # many ties
    got = op(leaf(queue, x), axis, keepdims)
    assert isinstance(got, pc.Tensor) and got.dtype == np.int64
    want = ref(x, axis=axis, keepdims=keepdims)
    assert got.shape == np.shape(want)
    np.testing.assert_array_equal(got.to_host(), want)


def test_var_correction_and_edge_values(queue, rng):
    x = rng.standard_normal((4, 6))
    nx = leaf(queue, x)
    for c in (0, 1, 2):
        np.testing.assert_allclose(tp.var(nx, 1, correction=c).to_host(),
                                   np.var(x, axis=1, ddof=c), rtol=1e-5)
    assert tp.gradcheck(lambda t: tp.var(t, (0, 1), correction=0), [nx])
    # one element with correction 1: NaN, as PyTorch (0 / 0)
    assert np.isnan(tp.var(leaf(queue, [2.0]), correction=1).to_host())
    # a constant row: std 0 and a zero gradient (PyTorch's std backward), not NaN
    y, g = grad_of(queue, lambda t: tp.std(t, axis=1), np.ones((2, 3)))
    assert y.tolist() == [0.0, 0.0] and g.tolist() == [[0.0] * 3] * 2
    # a mean far from zero
    big = (rng.standard_normal(50) + 1e4)
    np.testing.assert_allclose(tp.var(leaf(queue, big)).to_host(),
                               np.var(big.astype(np.float32).astype(np.float64), ddof=1),
                               rtol=1e-3)


def test_logsumexp_is_stable(queue):
    x = np.array([[1e30, 1e30], [-1e30, -1e30], [-np.inf, -np.inf], [np.inf, 1.0],
                  [88.0, 89.0]])
    y, g = grad_of(queue, lambda t: tp.logsumexp(t, axis=1), x)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = ref_lse(x.astype(np.float32).astype(np.float64), 1, False)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert np.isfinite(g[:2]).all() and np.isfinite(g[4]).all()
    # float32 cannot hold 1e30 + log 2: exp(x - out) is 1 for both, as in PyTorch
    np.testing.assert_allclose(g[0], [1.0, 1.0])
    np.testing.assert_allclose(g[4], np.exp([88.0, 89.0] - np.logaddexp(88.0, 89.0)),
                               rtol=1e-5)


@pytest.mark.parametrize("shape, axis", [((3, 4, 5), 0), ((3, 4, 5), 1), ((3, 4, 5), -1),
                                         ((1,), 0), ((7, 1), 1), ((2, 300), 1)])
def test_cumsum(queue, rng, shape, axis):
    x = rng.standard_normal(shape)
    nx = leaf(queue, x)
    y = tp.cumsum(nx, axis)
    assert y.op_name == "cumsum"
    np.testing.assert_allclose(y.to_host(), np.cumsum(x, axis=axis), rtol=1e-5, atol=1e-4)
    assert tp.gradcheck(lambda t: tp.cumsum(t, axis), [nx], atol=5e-3, rtol=3e-3)
    with pytest.raises(pc.ShapeError, match=r"cumsum: axis 3 is out of range"):
        tp.cumsum(nx, 3)


def test_reductions_are_bit_identical(queue, rng):
    x = rng.standard_normal((17, 33)).astype(np.float32)
    runs = [[op(leaf(queue, x), 1).to_host() for op in (tp.var, tp.std, tp.logsumexp)]
            + [tp.cumsum(leaf(queue, x), 1).to_host()] for _ in range(2)]
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_reduction_errors(queue):
    x = leaf(queue, np.zeros((2, 3)))
    with pytest.raises(pc.ShapeError, match=r"max: axis 2 is out of range for a 2-D tensor"):
        tp.max(x, 2)
    with pytest.raises(pc.ShapeError, match=r"var: repeated axis"):
        tp.var(x, (1, -1))


def test_cumsum_over_a_tensor_with_no_elements(queue):
    from parcl.kernels import scan
    empty = pc.Tensor.empty(queue, (0, 4))
    for axis in (0, 1):
        assert scan.cumsum(empty, axis).shape == (0, 4)


def test_var_of_rows_with_a_large_mean_is_accurate_as_pytorch(queue):
    """Rows of N(0, 1) shifted by 1e6: the float32 mean was off by about 1 (its sum's
    rounding), so var came out 40 % off and its gradient 23 %; torch sums in double. With the
    mean refined by the mean of the deviations both are within 1e-2 (float32's ulp at 1e6 is
    0.06 of the spread)."""
    import torch
    x = (np.random.default_rng(0).standard_normal((3, 5000)) + 1e6).astype(np.float32)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    torch.var(xt, 1).sum().backward()
    nx = tp.tensor(x, requires_grad=True)
    with tp.Tape() as tape:
        v = tp.var(nx, 1)
    tape.backward(v, grad=pc.Tensor.from_host(queue, np.ones(3, np.float32)))
    np.testing.assert_allclose(v.to_host(), torch.var(xt, 1).detach().numpy(), rtol=2e-3)
    g = xt.grad.numpy()
    assert np.abs(nx.grad.to_host() - g).max() < 1e-2 * np.abs(g).max()


def test_reductions_over_an_empty_slice_give_pytorchs_values(queue):
    """``x[:, T:].sum(1)`` (a slice past the end, a window that ends at the last position):
    a reduced axis of size 0 was taken for one with nothing to reduce, and the copy of the
    empty input failed (``LogicError: clEnqueueCopyBuffer failed: INVALID_VALUE``; a full sum
    or mean ``ShapeError``/``ZeroDivisionError``) where PyTorch's sum of nothing is 0, its
    product 1, its mean NaN; a maximum of nothing is an error in both."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = pc.Tensor.from_host(queue, a)
    empty, rows = t[:, 4:], t[2:2]                       # (3, 0) and (0, 4)
    np.testing.assert_array_equal(empty.sum(1).to_host(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(empty.mean(1).to_host(), [np.nan] * 3)
    np.testing.assert_array_equal(rows.sum(0, keepdims=True).to_host(), np.zeros((1, 4)))
    assert float(rows.sum()) == 0.0 and np.isnan(float(rows.mean()))
    assert rows.sum(1).shape == (0,)                     # nothing reduced into nothing
    np.testing.assert_array_equal(tp.prod(empty, 1).to_host(), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(tp.sum(rows, 0).to_host(), np.zeros(4))
    with pytest.raises(pc.ShapeError, match="max: axis 1 of shape \\(3, 0\\) holds no elements"):
        empty.max(1)
    x = tp.tensor(a, requires_grad=True)                 # torch: loss nan, grad 0 and 1/3
    with tp.Tape() as tape:
        loss = tp.sum(tp.mean(x[:, 1:], 1)) + tp.sum(tp.mean(x[:, 4:], 1))
    tape.backward(loss)
    assert np.isnan(float(loss))
    np.testing.assert_allclose(x.grad.to_host(), np.tile([0.0, 1 / 3, 1 / 3, 1 / 3], (3, 1)))


def test_any_all_and_logsumexp_over_an_empty_slice_give_pytorchs_values(queue):
    """``tp.any``, ``tp.all`` and ``tp.logsumexp`` over an axis with no elements raised a
    ShapeError naming ``max`` (the maximum they are built on, of nothing) where PyTorch's
    any is False, all True and logsumexp -inf."""
    t = pc.Tensor.from_host(queue, np.arange(12, dtype=np.float32).reshape(3, 4))
    empty = t[:, 4:]                                     # (3, 0)
    np.testing.assert_array_equal(tp.any(empty, 1).to_host(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(tp.all(empty, 1).to_host(), [1.0, 1.0, 1.0])
    assert float(tp.all(t[2:2])) == 1.0 and float(tp.any(t[2:2])) == 0.0
    np.testing.assert_array_equal(tp.logsumexp(empty, 1).to_host(), [-np.inf] * 3)
    np.testing.assert_array_equal(tp.logsumexp(t[2:2], 0, keepdims=True).to_host(),
                                  np.full((1, 4), -np.inf))
    assert tp.any(t[2:2], 1).shape == (0,)


def test_argmin_launches_one_kernel_for_the_first_smallest_or_nan_as_pytorch(queue):
    """``tp.argmin`` and ``Tensor.argmin`` take the first smallest element (the first NaN
    where there is one; -0.0 ties 0.0) in one launch (after a transpose for a dim not last):
    they negated the input and launched argmax, two. The indices are torch's."""
    from parcl.kernels._cache import trace_launches
    a = np.float32([[3, 1, 1, np.nan], [0.0, -0.0, 2, -0.0], [5, 4, 4, 6]])
    x = tp.tensor(a)
    for dim, want in ((1, [3, 0, 1]), (0, [1, 1, 0, 0]), (None, 3)):
        with trace_launches() as launches:
            got = (tp.argmin(x, dim), x.value.argmin(dim))
        names = [k[0] for k in launches]       # dim 0: each moves it last (a transpose) first
        assert names.count("argmin_long") == 2 and len(names) == (4 if dim == 0 else 2)
        for indices in got:
            assert indices.to_host().tolist() == want


def test_amin_and_min_of_everything_launch_one_reduction_kernel(queue):
    """``tp.amin``, ``tp.min(x)`` and ``Tensor.amin`` / ``Tensor.min()`` reduce with a min
    kernel, max's mirror image: they negated the input, took the max and negated it back,
    three launches and an input-sized temporary. NaN propagates; the values are numpy's."""
    from parcl.kernels._cache import trace_launches
    a = np.float32([[3, 1, np.nan], [2, -1, 4]])
    x = tp.tensor(a)
    for got, want in (((lambda: tp.amin(x, 1)), [np.nan, -1]), ((lambda: tp.min(x)), np.nan),
                      ((lambda: x.value.amin(0)), [2, -1, np.nan]),
                      ((lambda: tp.min(x[:, :2])), -1)):
        with trace_launches() as launches:
            values = got()
        assert [k[0] for k in launches if not k[0].startswith("copy")] == ["min_seq"]
        np.testing.assert_array_equal(values.to_host(), want)


def test_argmax_and_a_recorded_max_over_an_empty_slice_raise_a_shape_error_as_pytorch(queue):
    """The index of the largest of no elements (``x[:, 4:]`` of a (3, 4) ``x``) divided by
    the row length 0 (a ZeroDivisionError from tp.argmax, tp.argmin, Tensor.argmax and a
    tp.max recorded for its backward) where PyTorch raises 'Expected reduction dim 1 to have
    non-zero size'; rows of nothing to reduce give an empty result and a zero gradient."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = tp.tensor(a, requires_grad=True)
    for op, call in (("argmax", lambda: tp.argmax(x[:, 4:], 1)),
                     ("argmin", lambda: tp.argmin(x[:, 4:], 1)),
                     ("argmax", lambda: x.value[:, 4:].argmax(1)),
                     ("max", lambda: tp.max(x[:, 4:], 1))):
        with tp.Tape(), pytest.raises(pc.ShapeError, match=f"{op}: axis 1 of shape \\(3, 0\\)"):
            call()
    assert tp.argmax(x[2:2], 1).shape == (0,)             # torch: tensor([], dtype=int64)
    with tp.Tape() as tape:
        y = tp.max(x[2:2], 1).values
    tape.backward(tp.sum(y))
    assert y.shape == (0,)
    np.testing.assert_array_equal(x.grad.to_host(), np.zeros((3, 4)))


def test_reductions_over_dim_0_or_minus_1_of_a_0d_input_are_the_input_as_pytorch(queue):
    """PyTorch reads a 0-d tensor's dim 0 and -1 as its one element: ``s.max(0)`` of the 0-d
    ``s = 2.5`` is ``(2.5, 0)``, ``s.sum(-1, True)`` 0-d 2.5, ``s.var(0)`` NaN (one element,
    correction 1). parcl's sum, mean, max, min, argmax, argmin, var, std, logsumexp (the tp
    functions and the Node methods) raised 'axis 0 is out of range for a 0-D tensor' where
    amax, prod and cumsum took it. Values, 0-d shapes and gradients are torch's; dim 1 is
    still a ShapeError, as PyTorch's IndexError."""
    import torch
    calls = {   # name: (tp's function, the Node method, which is torch.Tensor's)
        "sum": (lambda s, d, k: tp.sum(s, d, k), lambda s, d, k: s.sum(d, k)),
        "mean": (lambda s, d, k: tp.mean(s, d, k), lambda s, d, k: s.mean(d, k)),
        "max": (lambda s, d, k: tp.max(s, d, k).values, lambda s, d, k: s.max(d, k).values),
        "min": (lambda s, d, k: tp.min(s, d, k).values, lambda s, d, k: s.min(d, k).values),
        "var": (lambda s, d, k: tp.var(s, d, keepdims=k, correction=0),
                lambda s, d, k: s.var(d, keepdim=k, correction=0)),
        "std": (lambda s, d, k: tp.std(s, d, keepdims=k, correction=0),
                lambda s, d, k: s.std(d, keepdim=k, correction=0)),
        "logsumexp": (lambda s, d, k: tp.logsumexp(s, d, k),
                      lambda s, d, k: s.logsumexp(d, k)),
    }
    for name, (function, method) in calls.items():
        for dim in (0, -1):
            for keepdim in (False, True):
                t = torch.tensor(2.5, requires_grad=True)
                want = method(t, dim, keepdim)
                (want * 3.0).backward()
                for call in (function, method):
                    s = leaf(queue, 2.5)
                    with tp.Tape() as tape:
                        got = call(s, dim, keepdim)
                    tape.backward(got * 3.0)
                    assert got.shape == (), (name, dim, keepdim)
                    np.testing.assert_array_equal(got.to_host(), want.detach().numpy())
                    np.testing.assert_array_equal(s.grad.to_host(), t.grad.numpy())
    s = leaf(queue, 2.5)
    assert float(tp.std(s, 0)) != float(tp.std(s, 0))            # NaN, as torch.std
    for name in ("argmax", "argmin"):
        for keepdim in (False, True):
            got = getattr(tp, name)(s, -1, keepdim)
            assert got.shape == () and int(got.to_host()) == 0
        assert s.max(0).indices.shape == () and int(s.min(-1, True).indices.to_host()) == 0
    for call in (lambda: tp.sum(s, 1), lambda: s.max(1), lambda: tp.argmax(s, -2)):
        with pytest.raises(pc.ShapeError, match="out of range for a 0-D tensor"):
            call()
    with pytest.raises(pc.ShapeError, match="repeated axis"):
        tp.sum(s, (0, -1))                     # torch: 'dim 0 appears multiple times'


def test_max_and_min_of_a_tensor_other_are_the_elementwise_maximum_as_pytorch(queue):
    """``torch.max(a, b)`` and ``a.max(b)`` of two tensors are ``torch.maximum(a, b)`` (min:
    ``minimum``), broadcast, with its gradients (half to each side at a tie); parcl read
    ``b`` as a dim and raised 'max: axis must be an int'. An int dim is unchanged."""
    import torch
    a, b = [1.0, 5.0, 2.0, -1.0], [[3.0, 4.0, 2.0, 0.0], [0.0, 9.0, 2.0, -1.0]]
    for name in ("max", "min"):
        for method in (False, True):
            x, y = leaf(queue, a), leaf(queue, b)
            with tp.Tape() as tape:
                out = getattr(x, name)(y) if method else getattr(tp, name)(x, y)
            tape.backward(tp.sum(out * tp.tensor(np.float32([[1, 2, 3, 4], [5, 6, 7, 8]]))))
            tx, ty = (torch.tensor(v, requires_grad=True) for v in (a, b))
            want = getattr(torch, name)(tx, ty)
            (want * torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])).sum().backward()
            np.testing.assert_array_equal(out.to_host(), want.detach().numpy())
            np.testing.assert_array_equal(x.grad.to_host(), tx.grad.numpy())
            np.testing.assert_array_equal(y.grad.to_host(), ty.grad.numpy())
    y = leaf(queue, b)
    assert y.max(1).indices.to_host().tolist() == [1, 1]
    np.testing.assert_array_equal(tp.min(y, 0).values.to_host(), [0.0, 4.0, 2.0, -1.0])


def test_var_and_std_take_pytorchs_unbiased_as_pytorch(queue):
    """A hand-written layer norm's ``x.var(-1, unbiased=False, keepdim=True)`` (and
    ``x.var(1, False)``, ``x.std(False)``, ``torch.var(x, 1, unbiased=False)``) is the biased
    variance in PyTorch; parcl raised TypeError at ``unbiased`` (and read ``x.var(False)``'s
    bool as a dim). Values and gradients are torch's; ``unbiased`` with ``correction`` is a
    TypeError, as PyTorch's."""
    import torch
    a = np.array([[1.0, 2.0, 4.0, 7.0], [3.0, -1.0, 0.5, 2.0]], np.float32)
    calls = [lambda v: v.var(-1, unbiased=False, keepdim=True), lambda v: v.var(1, False),
             lambda v: v.std(0, True, True), lambda v: v.std(False), lambda v: v.var(True),
             lambda v: v.std(dim=1, unbiased=False), lambda v: v.var(1, correction=0)]
    for call in calls:
        x, t = leaf(queue, a), torch.tensor(a, requires_grad=True)
        with tp.Tape() as tape:
            got = call(x)
        tape.backward(tp.sum(got * got))
        want = call(t)
        (want * want).sum().backward()
        np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-5)
    x = leaf(queue, a)
    np.testing.assert_allclose(tp.var(x, 1, unbiased=False).to_host(), a.var(axis=1))
    np.testing.assert_allclose(tp.std_mean(x, 0, unbiased=False)[0].to_host(), a.std(axis=0))
    np.testing.assert_allclose(tp.var_mean(x, unbiased=True)[0].to_host(), a.var(ddof=1))
    with pytest.raises(TypeError, match="given both"):
        x.var(1, False, correction=0)


def test_max_and_min_over_a_dim_return_values_and_indices_as_pytorch(queue):
    """``torch.max(x, dim)`` is the pair ``(values, indices)``; tp.max returned the values
    alone (numpy's amax), so the classifier idiom ``_, pred = tp.max(logits, 1)`` on a batch
    of 2 unpacked the two row maxima into ``_`` and ``pred``: pred was 7.0, a value, where
    torch's is the index 0. Values, indices, keepdim and gradients are torch's (the gradient
    to the first maximum of a row); ``tp.max(x)`` and ``tp.max(a, b)`` are unchanged, and
    numpy's ``axis=`` and a tuple of dims are refused (tp.amax takes them)."""
    import torch
    a = np.array([[1.0, 5.0, 5.0], [7.0, 0.0, 7.0]], np.float32)
    _, pred = tp.max(tp.tensor(a), 1)
    assert pred.to_host().tolist() == [1, 0]
    for name in ("max", "min"):
        for dim, keepdim in ((1, False), (0, True), (-1, True)):
            x, t = leaf(queue, a), torch.tensor(a, requires_grad=True)
            want = getattr(torch, name)(t, dim=dim, keepdim=keepdim)
            w = np.arange(1, want.values.numel() + 1, dtype=np.float32).reshape(want.values.shape)
            (want.values * torch.tensor(w)).sum().backward()
            with tp.Tape() as tape:
                got = getattr(tp, name)(x, dim, keepdim)
                loss = tp.sum(got.values * tp.tensor(w))
            tape.backward(loss)
            assert type(got).__name__ == "SortResult" and len(got) == 2
            np.testing.assert_array_equal(got.values.to_host(), want.values.detach().numpy())
            np.testing.assert_array_equal(got.indices.to_host(), want.indices.numpy())
            assert got.indices.to_host().dtype == np.int64
            np.testing.assert_array_equal(x.grad.to_host(), t.grad.numpy())
            by_keyword = getattr(tp, name)(leaf(queue, a), dim=dim, keepdim=keepdim)
            np.testing.assert_array_equal(by_keyword.indices.to_host(), want.indices.numpy())
    assert float(tp.max(tp.tensor(a))) == 7.0 and float(tp.min(tp.tensor(a))) == 0.0
    assert tp.max(tp.tensor(a), tp.tensor(a[::-1].copy())).to_host().tolist() == [[7, 5, 7]] * 2
    x = tp.tensor(a)
    with pytest.raises(pc.ParclError, match=r"max: axis=1 is not taken: .*\(values, indices\)"
                                            r".*tp\.amax\(x, dim\)"):
        tp.max(x, axis=1)
    with pytest.raises(pc.ShapeError, match=r"min: axis must be an int, got \(0, 1\)"):
        tp.min(x, (0, 1))                        # torch.min refuses a tuple of dims too


def test_max_and_min_over_a_dim_launch_one_kernel_for_values_and_indices(queue):
    """``tp.max(x, dim)`` and ``tp.min(x, dim)``, recorded or not, and ``Tensor.max(dim)``
    take values and indices from one kernel (after a transpose where ``dim`` is not last):
    recorded, they launched an argmax (min a negation too) and a gather; unrecorded, a max
    reduction and an argmax (min three negations more). Recorded, they return as indices what
    the backward reads. The values, indices and gradients are torch's, the indices the same
    as unrecorded; a write into them is a write into what the backward reads, which it
    refuses, as PyTorch's backward refuses indices changed in place."""
    import torch
    from parcl.kernels._cache import trace_launches
    a = np.array([[[1, np.nan, 5], [7, 0, 7]], [[2, 2, -1], [3, 9, 3]]], np.float32)
    for name in ("max", "min"):
        for dim, keepdim in ((2, False), (1, True), (0, False), (-1, True)):
            x, t = leaf(queue, a), torch.tensor(a, requires_grad=True)
            want = getattr(torch, name)(t, dim, keepdim)
            want.values.nan_to_num(0.5).sum().backward()
            with tp.Tape() as tape:
                with trace_launches() as launches:
                    got = getattr(tp, name)(x, dim, keepdim)
                loss = tp.sum(tp.nan_to_num(got.values, 0.5))
            tape.backward(loss)
            moves = 0 if dim % a.ndim == a.ndim - 1 else 1           # a transpose: dim last
            assert [k[0] for k in launches][moves:] == [f"{name}_index"]
            np.testing.assert_array_equal(got.values.to_host(), want.values.detach().numpy())
            np.testing.assert_array_equal(got.indices.to_host(), want.indices.numpy())
            assert got.indices.shape == tuple(want.indices.shape)
            np.testing.assert_array_equal(x.grad.to_host(), t.grad.numpy())
            with tp.no_grad(), trace_launches() as launches:
                unrecorded = getattr(tp, name)(x, dim, keepdim)
                method = getattr(x.value, name)(dim, keepdim)
            assert [k[0] for k in launches if k[0].endswith("_index")] == [f"{name}_index"] * 2
            assert len(launches) == 2 * (moves + 1)
            for pair in (unrecorded, method):
                assert pair.values.to_host().tobytes() == got.values.to_host().tobytes()
                assert pair.indices.to_host().tobytes() == got.indices.to_host().tobytes()
    x = leaf(queue, a)
    with tp.Tape() as tape:
        values, indices = tp.max(x, 2)
    indices.fill_(0)
    with pytest.raises(pc.ParclError, match="updated in place"):
        tape.backward(tp.sum(values))
