"""The ops along one dim (cumprod, diff, repeat_interleave) and the pairs var_mean/std_mean:
values and gradients against torch in float64 (cumprod's with zeros in the input too), finite
differences, the method forms, bit-identical reruns, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.errors import DTypeError, ShapeError


def _against_torch(queue, fn, tfn, a, g):
    """Our value and gradient of ``fn`` at ``a`` for upstream ``g``, and torch's (float64)."""
    x = leaf(queue, a)
    with tp.Tape() as tape:
        out = fn(x)
    tape.backward(out, grad=up(queue, g))
    t = torch.tensor(np.asarray(a, np.float64), requires_grad=True)
    want = tfn(t)
    want.backward(torch.tensor(np.asarray(g, np.float64)))
    return out.to_host(), x.grad.to_host(), want.detach().numpy(), t.grad.numpy()


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_matches_pytorch_value_and_gradient(queue, rng, dim):
    a = rng.uniform(-1.5, 1.5, (3, 5, 4)).astype(np.float32)
    g = rng.standard_normal(a.shape).astype(np.float32)
    got, got_grad, want, want_grad = _against_torch(
        queue, lambda v: tp.cumprod(v, dim), lambda t: torch.cumprod(t, dim), a, g)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def test_cumprod_gradient_with_zeros_is_pytorch_s(queue, rng):
    # a line without zeros, one with one zero, with two, with one at each end, all zeros
    a = np.array([[1.5, -2.0, 3.0, 0.5, 2.0],
                  [2.0, 0.0, 3.0, -1.5, 2.0],
                  [0.0, 2.0, 0.0, 4.0, 5.0],
                  [1.0, 2.0, 3.0, 4.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    g = rng.standard_normal(a.shape).astype(np.float32)
    for dim in (1, 0):
        got, got_grad, want, want_grad = _against_torch(
            queue, lambda v, d=dim: tp.cumprod(v, d), lambda t, d=dim: torch.cumprod(t, d),
            a, g)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)
    x = leaf(queue, [2.0, 0.0, 3.0, 4.0])
    with tp.Tape() as tape:
        loss = tp.sum(x.cumprod(0))                         # 2 + 0 + 0 + 0
    tape.backward(loss)
    # d/dx0 = 1; at the zero 2 + 2*3 + 2*3*4 = 32; after it 0
    np.testing.assert_array_equal(x.grad.to_host(), [1, 32, 0, 0])


def test_cumprod_passes_gradcheck_and_reruns_bit_for_bit(queue, rng):
    x = leaf(queue, rng.uniform(0.5, 1.5, (4, 6)) * np.where(rng.random((4, 6)) < 0.3, -1, 1))
    assert tp.gradcheck(lambda v: tp.cumprod(v, 1), [x])
    z = leaf(queue, [[0.5, 0.0, 2.0, 1.5]])
    assert tp.gradcheck(lambda v: tp.cumprod(v, -1), [z])      # through the zero
    runs = []
    for _ in range(2):
        x.grad = None
        with tp.Tape() as tape:
            loss = tp.sum(tp.cumprod(x, 0) * tp.cumprod(x, 1))
        tape.backward(loss)
        runs.append(x.grad.to_host().tobytes())
    assert runs[0] == runs[1]


def test_cumprod_of_one_element_along_dim_and_0d_as_pytorch(queue):
    x = leaf(queue, [[np.inf], [0.0]])
    with tp.Tape() as tape:
        loss = tp.sum(tp.cumprod(x, 1) * 3.0)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), [[3], [3]])      # g itself, no inf/inf
    s = tp.tensor(up(queue, 5.0), requires_grad=True)
    assert tp.cumprod(s, -1).shape == () and float(tp.cumprod(s, 0)) == 5.0


def test_cumsum_of_a_0d_tensor_is_the_tensor_as_pytorch(queue):
    """``torch.cumsum(torch.tensor(5.), 0)`` (or dim -1) is 5, as cumprod's; parcl raised
    'cumsum: a 0-d tensor has no axis'. Another dim is out of range, as PyTorch's."""
    s = tp.tensor(up(queue, 5.0), requires_grad=True)
    with tp.Tape() as tape:
        out = tp.cumsum(s, 0)
    tape.backward(out * 3.0)
    assert out.shape == () and float(out) == float(torch.cumsum(torch.tensor(5.0), 0))
    assert float(s.grad) == 3.0 and float(s.cumsum(-1)) == 5.0
    with pytest.raises(ShapeError, match=r"cumsum: dim 1 is out of range .* \[-1, 0\]"):
        tp.cumsum(s, 1)


@pytest.mark.parametrize("n, dim", [(1, -1), (2, 1), (3, 0), (0, 0)])
def test_diff_matches_pytorch_value_and_gradient(queue, rng, n, dim):
    a = rng.standard_normal((5, 6)).astype(np.float32)
    want_shape = tuple(torch.diff(torch.tensor(a), n, dim).shape)
    g = rng.standard_normal(want_shape).astype(np.float32)
    got, got_grad, want, want_grad = _against_torch(
        queue, lambda v: tp.diff(v, n, dim), lambda t: torch.diff(t, n, dim), a, g)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-5)


def test_diff_joins_prepend_and_append_first_as_pytorch(queue):
    a = np.array([[1.0, 4.0, 9.0], [2.0, 3.0, 5.0]], np.float32)
    x, p, q = leaf(queue, a), leaf(queue, [[0.0], [1.0]]), leaf(queue, [[10.0, 20.0]] * 2)
    with tp.Tape() as tape:
        out = tp.diff(x, 1, 1, prepend=p, append=q)
        loss = tp.sum(out * out)
    tape.backward(loss)
    want = torch.diff(torch.tensor(a), 1, 1, prepend=torch.tensor([[0.0], [1.0]]),
                      append=torch.tensor([[10.0, 20.0]] * 2))
    np.testing.assert_array_equal(out.to_host(), want.numpy())
    np.testing.assert_array_equal(out.to_host(), [[1, 3, 5, 1, 10], [1, 1, 2, 5, 10]])
    np.testing.assert_array_equal(p.grad.to_host(), [[-2], [-2]])
    np.testing.assert_array_equal(x.diff(2).to_host(), [[2], [1]])
    assert tp.gradcheck(lambda u, v: tp.diff(u, 2, 0, append=v), [x, leaf(queue, [[1, 2, 3]])])


def test_diff_refuses_what_it_cannot_give_naming_the_shapes(queue):
    x = leaf(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"diff: n=3 leaves no elements along dim 1 .*\(2, 3\)"):
        tp.diff(x, 3)
    with pytest.raises(ShapeError, match="diff: expects a tensor of at least one dimension"):
        tp.diff(up(queue, 1.0))
    with pytest.raises(ShapeError, match=r"diff: prepend has shape \(3,\), expected 2 dims"):
        tp.diff(x, prepend=leaf(queue, [1.0, 2.0, 3.0]))
    with pytest.raises(ShapeError, match="diff: n must be a non-negative int"):
        tp.diff(x, -1)
    with pytest.raises(ShapeError, match="diff: dim 2 is out of range"):
        tp.diff(x, 1, 2)


def test_repeat_interleave_matches_pytorch_value_and_gradient(queue, rng):
    a = rng.standard_normal((2, 3, 2)).astype(np.float32)
    cases = [(2, None), (3, 1), (2, -1), ([1, 0, 3], 1), (np.array([2, 1]), 0), ([2], 1)]
    for repeats, dim in cases:
        t_repeats = torch.tensor(repeats) if not isinstance(repeats, int) else repeats
        want_shape = tuple(torch.repeat_interleave(torch.tensor(a), t_repeats, dim).shape)
        g = rng.standard_normal(want_shape).astype(np.float32)
        got, got_grad, want, want_grad = _against_torch(
            queue, lambda v, r=repeats, d=dim: tp.repeat_interleave(v, r, d),
            lambda t, r=t_repeats, d=dim: torch.repeat_interleave(t, r, d), a, g)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-6, atol=1e-6)


def test_repeat_interleave_takes_tensor_repeats_and_methods_as_pytorch(queue):
    x = leaf(queue, [[1.0, 2.0], [3.0, 4.0]])
    counts = up(queue, [2, 1], np.int64)
    np.testing.assert_array_equal(tp.repeat_interleave(x, counts, 0).to_host(),
                                  [[1, 2], [1, 2], [3, 4]])
    np.testing.assert_array_equal(x.repeat_interleave(2).to_host(), [1, 1, 2, 2, 3, 3, 4, 4])
    np.testing.assert_array_equal(x.repeat_interleave(2, dim=1, output_size=4).to_host(),
                                  [[1, 1, 2, 2], [3, 3, 4, 4]])
    np.testing.assert_array_equal(tp.repeat_interleave(up(queue, 7.0), 3).to_host(), [7, 7, 7])
    assert tp.gradcheck(lambda v: tp.repeat_interleave(v, [3, 1], 1), [x])


def test_repeat_interleave_refuses_bad_repeats_naming_the_shapes(queue):
    x = leaf(queue, np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"repeats has 2 counts, expected 1 or 3 \(the size "
                                          r"of dim 1 of the input \(2, 3\)\)"):
        tp.repeat_interleave(x, [1, 2], 1)
    with pytest.raises(ShapeError, match="repeats must be non-negative"):
        tp.repeat_interleave(x, -1)
    with pytest.raises(ShapeError, match="output_size 5 is not the total of repeats, 6"):
        tp.repeat_interleave(x, 2, 1, output_size=5)
    with pytest.raises(DTypeError, match="repeats must be an int or an int32/int64 tensor"):
        tp.repeat_interleave(x, up(queue, [1.0, 2.0, 3.0]), 1)
    with pytest.raises(DTypeError, match="repeats must be an int or a 1-D sequence of ints"):
        tp.repeat_interleave(x, 1.5)


@pytest.mark.parametrize("name", ["var_mean", "std_mean"])
def test_var_mean_and_std_mean_match_pytorch_with_correction_and_keepdims(queue, rng, name):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = torch.tensor(a.astype(np.float64))
    for axis, correction, keepdims in [(None, 1, False), (1, 0, True), ((0, 2), 1, False),
                                       (-1, 2, True)]:
        spread, m = getattr(tp, name)(up(queue, a), axis, keepdims=keepdims,
                                      correction=correction)
        want_spread, want_m = getattr(torch, name)(t, dim=axis, correction=correction,
                                                   keepdim=keepdims)
        np.testing.assert_allclose(spread.to_host(), want_spread.numpy(), rtol=1e-5)
        np.testing.assert_allclose(m.to_host(), want_m.numpy(), rtol=1e-5, atol=1e-6)
    x = leaf(queue, a)
    assert tp.gradcheck(lambda v: tp.sum(getattr(tp, name)(v, 1)[0] * 2.0
                                         + getattr(tp, name)(v, 1)[1]), [x])
    for got, want in zip(getattr(tp, name)(x, 1, False),  # torch's third: unbiased, as tp.var
                         getattr(torch, name)(t, 1, False)):
        np.testing.assert_allclose(got.to_host(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_var_mean_gradient_reaches_x_through_both_as_pytorch(queue):
    a = np.array([1.0, 2.0, 6.0], np.float32)
    x = leaf(queue, a)
    with tp.Tape() as tape:
        v, m = tp.var_mean(x)
        loss = v + m
    tape.backward(loss)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    tv, tm = torch.var_mean(t)
    (tv + tm).backward()
    np.testing.assert_allclose(x.grad.to_host(), t.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose([float(v), float(m)], [7.0, 3.0], rtol=1e-6)


def test_repeat_interleave_leaving_no_elements_gives_pytorchs_empty_result(queue):
    """Counts all 0, or an input slice with no elements (``x[:, 4:]``, ``x[2:2]``), were a
    ShapeError ('parcl tensors hold at least one element', from before slices could be
    empty) where PyTorch gives the empty result, and the gradient through it is zero."""
    import torch
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x, xt = tp.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        ys = [tp.repeat_interleave(x, [0, 0, 0, 0], dim=1), tp.repeat_interleave(x, 0),
              tp.repeat_interleave(x[:, 4:], 2, dim=1), tp.repeat_interleave(x[2:2], 3)]
        loss = tp.sum(tp.stack([tp.sum(y) for y in ys])) + tp.sum(x)
    tape.backward(loss)
    yts = [xt.repeat_interleave(torch.tensor([0, 0, 0, 0]), dim=1), xt.repeat_interleave(0),
           xt[:, 4:].repeat_interleave(2, dim=1), xt[2:2].repeat_interleave(3)]
    (sum(y.sum() for y in yts) + xt.sum()).backward()
    assert [y.shape for y in ys] == [tuple(y.shape) for y in yts] == [(3, 0), (0,), (3, 0), (0,)]
    np.testing.assert_array_equal(x.grad.to_host(), xt.grad.numpy())          # ones
