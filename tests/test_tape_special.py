"""``tp.special``, torch.special's names: the functions found only there (i1, i0e, i1e, entr,
ndtr, xlog1py) against torch.special in float64 for value and gradient, finite differences,
their edges, and the aliases of parcl's ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl.tape as tp
from conftest import leaf, up
from parcl.tape import special

# name -> (parcl op, torch op, sampler)
UNARY = {
    "i1": (special.i1, torch.special.i1, lambda r, n: r.uniform(-25, 25, n)),
    "i0e": (special.i0e, torch.special.i0e, lambda r, n: r.uniform(-40, 40, n)),
    "i1e": (special.i1e, torch.special.i1e, lambda r, n: r.uniform(-40, 40, n)),
    "entr": (special.entr, torch.special.entr, lambda r, n: r.uniform(0.01, 5, n)),
    "ndtr": (special.ndtr, torch.special.ndtr, lambda r, n: r.uniform(-6, 6, n)),
}


def _torch_grad(fn, arrays, g):
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    y = fn(*ts)
    y.backward(torch.tensor(g.astype(np.float64)))
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("name", sorted(UNARY))
def test_special_only_functions_match_torch_special_value_and_gradient(queue, rng, name):
    fn, tfn, sample = UNARY[name]
    x = sample(rng, 500).astype(np.float32)
    g = rng.standard_normal(500).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = fn(node)
    assert y.op_name == name
    tape.backward(y, grad=up(queue, g))
    want, (want_grad,) = _torch_grad(tfn, [x], g)
    np.testing.assert_allclose(y.to_host(), want, rtol=2e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-5, atol=1e-6,
                               err_msg=name)
    assert tp.gradcheck(fn, [leaf(queue, (x[:12] / 8.0 if name != "entr" else x[:12]))])


def test_xlog1py_matches_torch_special_value_gradients_and_edges(queue, rng):
    a = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
    b = rng.uniform(-0.5, 3, 4).astype(np.float32)
    g = rng.standard_normal((3, 4)).astype(np.float32)
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape() as tape:
        y = special.xlog1py(na, nb)
    tape.backward(y, grad=up(queue, g))
    want, (wa, wb) = _torch_grad(torch.special.xlog1py, [a, b], g)
    np.testing.assert_allclose(y.to_host(), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(na.grad.to_host(), wa, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nb.grad.to_host(), wb, rtol=1e-5, atol=1e-6)
    x = np.array([0.0, 0.0, -1.0, 2.0], np.float32)
    v = np.array([-1.0, np.nan, -1.0, 0.5], np.float32)
    got = special.xlog1py(up(queue, x), up(queue, v)).to_host()
    np.testing.assert_array_equal(got, torch.special.xlog1py(torch.tensor(x),
                                                             torch.tensor(v)).numpy())


def test_edges_are_torch_specials(queue):
    big = np.array([0.0, 100.0, -100.0, 1000.0], np.float32)
    np.testing.assert_allclose(special.i0e(up(queue, big)).to_host(),
                               torch.special.i0e(torch.tensor(big, dtype=torch.float64)),
                               rtol=2e-6)                      # finite where i0 overflows
    e = np.array([0.0, -1.0, np.nan, 1.0], np.float32)
    np.testing.assert_array_equal(special.entr(up(queue, e)).to_host(), [0, -np.inf, np.nan, 0])
    zero = leaf(queue, np.zeros(1, np.float32))
    for fn in (special.i1, special.i1e):                       # 1/2 at 0, as PyTorch's
        with tp.Tape() as tape:
            y = fn(zero)
        tape.backward(y, grad=up(queue, np.ones(1)))
        np.testing.assert_array_equal(zero.grad.to_host(), [0.5])
        zero.grad = None


def test_bessel_functions_past_5e37_are_infinite_or_scaled_as_pytorch(queue):
    # 2 pi |x| overflowed in the Hankel series' 1 / sqrt(2 pi |x|): i0 and i1 were NaN
    # (inf * 0) and i0e, i1e 0 above 5.4e37, where PyTorch's are +-inf and 3.99e-20 at 1e38
    x = np.array([1e38, -1e38, 6e37, 3.4e38], np.float32)
    for fn, tfn in ((tp.i0, torch.i0), (special.i1, torch.special.i1),
                    (special.i0e, torch.special.i0e), (special.i1e, torch.special.i1e)):
        got = fn(up(queue, x)).to_host()
        np.testing.assert_allclose(got, tfn(torch.tensor(x)).numpy(), rtol=1e-6,
                                   err_msg=fn.__name__)
    np.testing.assert_array_equal(tp.i0(up(queue, x)).to_host(), [np.inf] * 4)
    np.testing.assert_allclose(special.i0e(up(queue, x[:2])).to_host(),
                               [(2 * np.pi * 1e38) ** -0.5] * 2, rtol=1e-6)


def test_i1_and_i1e_gradients_below_the_smallest_normal_float_are_one_half_as_pytorch(queue):
    # i1(x) = x / 2 rounds to 0 at 1e-45 and 1 / x overflows below 2.9e-39: the gradients
    # were i1's 1.0 and i1e's NaN (1e-45) and -inf (1e-40), where PyTorch's are 1/2
    x = np.array([1e-45, -1e-45, 1e-40, -3e-39, 2e-38, 1e-3], np.float32)
    for fn, tfn in ((special.i1, torch.special.i1), (special.i1e, torch.special.i1e)):
        v = leaf(queue, x)
        with tp.Tape() as tape:
            y = fn(v)
        tape.backward(y, grad=up(queue, np.ones(6)))
        t = torch.tensor(x, requires_grad=True)
        tfn(t).backward(torch.ones(6))
        np.testing.assert_array_equal(v.grad.to_host()[:4], [0.5] * 4)
        np.testing.assert_allclose(v.grad.to_host(), t.grad.numpy(), rtol=1e-6)


def test_aliases_are_parcls_ops_and_tp_keeps_torchs_top_level(queue):
    assert special.psi is tp.digamma and special.gammaln is tp.lgamma
    assert special.multigammaln is tp.mvlgamma and special.expit is tp.sigmoid
    assert special.erfinv is tp.erfinv and special.logit is tp.logit
    assert special.softmax is tp.softmax and special.xlogy is tp.xlogy
    assert tp.special is special
    for name in ("i0e", "i1", "i1e", "entr", "ndtr", "xlog1py"):
        assert not hasattr(tp, name), name                  # torch.special's only
    assert all(hasattr(special, name) for name in special.__all__)
