"""The activations hardtanh ... threshold, glu, softmin, normalize and cosine_similarity, and
their pc.nn layers: values and gradients against PyTorch in float64 over awkward sizes, the
gradient at the kinks and at extreme inputs as PyTorch's, finite differences, and PyTorch's
errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import AWKWARD_SIZES, leaf, up
from parcl.errors import DTypeError, ParclError, ShapeError

# name -> (parcl op, torch op, kinks to keep finite differences away from)
CASES = {
    "hardtanh": (tp.hardtanh, F.hardtanh, (-1.0, 1.0)),
    "hardtanh_2_3": (lambda x: tp.hardtanh(x, -2.0, 3.0), lambda x: F.hardtanh(x, -2.0, 3.0),
                     (-2.0, 3.0)),
    "relu6": (tp.relu6, F.relu6, (0.0, 6.0)),
    "hardsigmoid": (tp.hardsigmoid, F.hardsigmoid, (-3.0, 3.0)),
    "hardswish": (tp.hardswish, F.hardswish, (-3.0, 3.0)),
    "mish": (tp.mish, F.mish, ()),
    "softsign": (tp.softsign, F.softsign, (0.0,)),
    "logsigmoid": (tp.logsigmoid, F.logsigmoid, ()),
    "selu": (tp.selu, F.selu, (0.0,)),
    "celu": (tp.celu, F.celu, (0.0,)),
    "celu_0.5": (lambda x: tp.celu(x, 0.5), lambda x: F.celu(x, 0.5), (0.0,)),
    "tanhshrink": (tp.tanhshrink, F.tanhshrink, ()),
    "threshold": (lambda x: tp.threshold(x, 0.5, -2.0), lambda x: F.threshold(x, 0.5, -2.0),
                  (0.5,)),
}
OP_NAME = {"hardtanh_2_3": "hardtanh", "relu6": "hardtanh", "celu_0.5": "celu"}


def _input(rng, shape, kinks):
    x = rng.standard_normal(shape) * 4
    for k in kinks:
        x[np.abs(x - k) < 0.05] = k + 0.3
    return x.astype(np.float32)


def _torch(fn, x, g):
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = fn(xt)
    y.backward(torch.tensor(g, dtype=torch.float64))
    return y.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("n", AWKWARD_SIZES)
def test_values_and_gradients_match_pytorch(queue, rng, name, n):
    fn, tfn, kinks = CASES[name]
    x = _input(rng, (n,), kinks)
    g = rng.standard_normal(n).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = fn(node)
    assert isinstance(y, tp.Node) and y.op_name == OP_NAME.get(name, name)
    tape.backward(y, grad=up(queue, g))
    want, want_grad = _torch(tfn, x, g)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck(queue, rng, name):
    fn, _, kinks = CASES[name]
    assert tp.gradcheck(fn, [leaf(queue, _input(rng, (4, 3), kinks))])


EXTREMES = np.array([-3e38, -1e30, -1e4, -100.0, -88.0, -20.0, -6.0, -3.0, -1.0, -0.0, 0.0,
                     0.5, 1.0, 3.0, 6.0, 20.0, 88.0, 100.0, 1e4, 1e30, 3e38, np.nan],
                    np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_kinks_and_extremes_are_pytorchs(queue, name):
    """At the kinks (ties included) and for huge |x| and NaN, value and gradient are
    PyTorch's float32 ones: hardtanh passes no gradient at its bounds, logsigmoid stays
    finite, mish(1e30) is 1e30."""
    fn, tfn, kinks = CASES[name]
    x = np.concatenate([EXTREMES, np.array(kinks, np.float32)])
    if name == "softsign":                 # PyTorch's x / (1 + |x|): NaN at inf, as ours
        x = x[np.abs(x) < 1e30]
    if name == "hardswish":                # PyTorch's x * 6 / 6 overflows to inf past 5.7e37
        x = x[np.abs(x) < 1e38]
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = fn(node)
    tape.backward(y, grad=up(queue, np.ones_like(x)))
    xt = torch.tensor(x, requires_grad=True)
    ty = tfn(xt)
    ty.backward(torch.ones_like(xt))
    for got, want in ((y.to_host(), ty.detach().numpy()), (node.grad.to_host(),
                                                           xt.grad.numpy())):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{x}\n{got}")
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, equal_nan=True,
                                   err_msg=f"{name}: x = {x}")


def test_logsigmoid_is_stable_where_the_naive_form_is_not(queue):
    x = np.array([-200.0, -90.0, 90.0], np.float32)
    got = tp.logsigmoid(up(queue, x)).to_host()
    np.testing.assert_allclose(got, [-200.0, -90.0, 0.0], atol=1e-30)   # log(sigmoid) -> -inf


@pytest.mark.parametrize("shape,dim", [((4, 6), -1), ((4, 6), 0), ((2, 8, 3), 1), ((10,), 0)])
def test_glu_matches_pytorch(queue, rng, shape, dim):
    x = rng.standard_normal(shape).astype(np.float32)
    g_shape = list(shape)
    g_shape[dim] //= 2
    g = rng.standard_normal(g_shape).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.glu(node, dim)
    tape.backward(y, grad=up(queue, g))
    want, want_grad = _torch(lambda t: F.glu(t, dim), x, g)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-5, atol=1e-6)
    assert tp.gradcheck(lambda v: tp.glu(v, dim), [leaf(queue, x)])


def test_glu_refuses_what_pytorch_refuses(queue):
    with pytest.raises(ShapeError, match="glu: halving dimension must be even, but dimension "
                                         r"1 is size 3 \(shape \(2, 3\)\)"):
        tp.glu(up(queue, np.ones((2, 3))))
    with pytest.raises(ShapeError, match="glu: does not support scalars"):
        tp.glu(up(queue, np.float32(1.0)))
    with pytest.raises(ShapeError, match="glu: axis 2 is out of range"):
        tp.glu(up(queue, np.ones((2, 4))), 2)


@pytest.mark.parametrize("shape,dim", [((5, 7), 1), ((5, 7), 0), ((3, 4, 2), -1)])
def test_softmin_matches_pytorch(queue, rng, shape, dim):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.softmin(node, dim)
    tape.backward(y, grad=up(queue, g))
    want, want_grad = _torch(lambda t: F.softmin(t, dim), x, g)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-4, atol=1e-6)


def test_softmin_without_dim_takes_pytorchs_legacy_choice(queue, rng):
    for shape in ((5,), (2, 5), (2, 3, 4)):
        x = rng.standard_normal(shape).astype(np.float32)
        with pytest.warns(UserWarning, match="softmin: implicit dimension"):
            got = tp.softmin(up(queue, x)).to_host()
        with pytest.warns(UserWarning):
            want = F.softmin(torch.tensor(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=str(shape))


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 1), (3.0, 0), (np.inf, -1), (2.0, 0)])
@pytest.mark.parametrize("n", [1, 33, 257])
def test_normalize_matches_pytorch(queue, rng, p, dim, n):
    x = rng.standard_normal((n, 5)).astype(np.float32)
    x[0] = 0.0                                       # a zero row: zeros, gradient 1 / eps
    g = rng.standard_normal((n, 5)).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.normalize(node, p, dim)
    tape.backward(y, grad=up(queue, g))
    want, want_grad = _torch(lambda t: F.normalize(t, p, dim), x, g)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-5, atol=1e-6)
    if dim == 1:
        np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-4, atol=1e-4)
    else:               # p-norm columns that include the zero row: finite and as PyTorch's
        np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-4, atol=1e-4)
    if n == 33:
        assert tp.gradcheck(lambda v: tp.normalize(v, p, dim), [leaf(queue, x[1:4] + 0.1)])


@pytest.mark.parametrize("dim", [1, -1])
def test_normalize_inf_shares_the_gradient_among_elements_tied_for_the_largest_magnitude(
        queue, rng, dim):
    """PyTorch's inf-norm backward splits the gradient evenly among the elements whose |x|
    is the norm; tp.normalize gave it all to the first (row 0: 3 and -3, row 1: 2 and -2)."""
    x = np.array([[3.0, -3.0, 1.0], [2.0, 0.5, -2.0], [1.0, 1.0, 1.0]], np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.normalize(node, np.inf, dim)
    tape.backward(y, grad=up(queue, g))
    want, want_grad = _torch(lambda t: F.normalize(t, np.inf, dim), x, g)
    np.testing.assert_allclose(y.to_host(), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(node.grad.to_host(), want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, np.inf])
def test_normalize_of_a_row_holding_a_nan_is_nan_as_pytorch(queue, p):
    """The root was taken of the sums > 0 only and a NaN sum is not > 0, so [nan, 1] was
    divided by eps instead of its NaN norm: [nan, 1e12] where PyTorch gives [nan, nan]."""
    x = np.array([[np.nan, 1.0], [3.0, 4.0]], np.float32)
    got = tp.normalize(up(queue, x), p).to_host()
    want = F.normalize(torch.tensor(x), p).numpy()
    assert np.isnan(got[0]).all() and np.isnan(want[0]).all()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_normalize_refuses_what_pytorch_refuses(queue):
    with pytest.raises(ShapeError, match=r"normalize: dim 1 is out of range .*\(3,\)"):
        tp.normalize(up(queue, [1.0, 2.0, 3.0]))             # torch: IndexError
    with pytest.raises(ParclError, match="normalize: p must be >= 1"):
        tp.normalize(up(queue, np.ones((2, 2))), p=0.5)
    with pytest.raises(DTypeError, match="normalize: eps must be a Python number"):
        tp.normalize(up(queue, np.ones((2, 2))), eps="tiny")


@pytest.mark.parametrize("s1,s2,dim", [((33, 8), (33, 8), 1), ((7, 4), (1, 4), 1),
                                       ((4, 3, 5), (3, 5), -1), ((6, 5), (6, 5), 0)])
def test_cosine_similarity_matches_pytorch(queue, rng, s1, s2, dim):
    a = rng.standard_normal(s1).astype(np.float32)
    b = rng.standard_normal(s2).astype(np.float32)
    a.reshape(-1)[:5] = 0.0 if dim == 1 and s1[0] == 33 else a.reshape(-1)[:5]
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape() as tape:
        y = tp.cosine_similarity(na, nb, dim)
    g = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    tape.backward(y, grad=up(queue, g))
    ta = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    ty = F.cosine_similarity(ta, tb, dim)
    ty.backward(torch.tensor(g, dtype=torch.float64))
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.to_host(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(na.grad.to_host(), ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nb.grad.to_host(), tb.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_cosine_similarity_of_a_zero_row_is_zero_with_pytorchs_gradient(queue):
    a, b = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32), np.array([[1.0, 0.0], [1.0, 1.0]])
    na = leaf(queue, a)
    with tp.Tape() as tape:
        y = tp.sum(tp.cosine_similarity(na, up(queue, b)))
    tape.backward(y)
    ta = torch.tensor(a, requires_grad=True)
    F.cosine_similarity(ta, torch.tensor(b, dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(na.grad.to_host(), ta.grad.numpy(), rtol=1e-5)   # 1e8 = 1/eps
    with pytest.raises(ShapeError, match=r"cosine_similarity: shapes \(1, 2\) and \(1, 3\)"):
        tp.cosine_similarity(up(queue, np.ones((1, 2))), up(queue, np.ones((1, 3))))



def test_cosine_similarity_passes_the_gradient_of_a_norm_below_eps_as_pytorch(queue):
    """PyTorch clamps cosine_similarity's norms at eps in place under no_grad, so a norm below
    eps still carries its gradient; parcl's recorded clamp dropped it: x1 = [0.3, 0.4] (norm
    0.5) against [1, 0] with eps=1 had the gradient [1, 0] where PyTorch's is [0.82, -0.24]
    (the value, 0.3, was the same)."""
    a = np.array([[0.3, 0.4], [0.06, -0.08], [3.0, 4.0]], np.float32)
    b = np.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.1]], np.float32)
    na, nb = leaf(queue, a), leaf(queue, b)
    with tp.Tape() as tape:
        y = tp.sum(tp.cosine_similarity(na, nb, dim=1, eps=1.0))
    tape.backward(y)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    want = F.cosine_similarity(ta, tb, dim=1, eps=1.0).sum()
    want.backward()
    np.testing.assert_allclose(y.item(), want.item(), rtol=1e-6)
    np.testing.assert_allclose(na.grad.to_host()[0], [0.82, -0.24], rtol=1e-5)
    np.testing.assert_allclose(na.grad.to_host(), ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nb.grad.to_host(), tb.grad.numpy(), rtol=1e-5, atol=1e-6)

def test_argument_errors_are_pytorchs(queue):
    x = up(queue, np.ones(3))
    with pytest.raises(ParclError, match="hardtanh: min_val cannot be greater than max_val"):
        tp.hardtanh(x, 1.0, -1.0)
    with pytest.raises(ParclError, match="celu: alpha cannot be 0"):
        tp.celu(x, 0.0)
    with pytest.raises(DTypeError, match="threshold: value must be a Python number"):
        tp.threshold(x, 0.0, None)
    with pytest.raises(DTypeError, match=r"mish: dtype int64 .*\(3,\)"):
        tp.mish(pc.Tensor.from_host(queue, np.arange(3)))


LAYERS = [
    (pc.nn.Hardtanh(-2.0, 3.0), torch.nn.Hardtanh(-2.0, 3.0), "min_val=-2.0, max_val=3.0"),
    (pc.nn.ReLU6(), torch.nn.ReLU6(), ""), (pc.nn.Hardsigmoid(), torch.nn.Hardsigmoid(), ""),
    (pc.nn.Hardswish(), torch.nn.Hardswish(), ""), (pc.nn.Mish(), torch.nn.Mish(), ""),
    (pc.nn.Softsign(), torch.nn.Softsign(), ""), (pc.nn.LogSigmoid(), torch.nn.LogSigmoid(), ""),
    (pc.nn.SELU(), torch.nn.SELU(), ""), (pc.nn.CELU(0.7), torch.nn.CELU(0.7), "alpha=0.7"),
    (pc.nn.GLU(), torch.nn.GLU(), "dim=-1"), (pc.nn.GLU(0), torch.nn.GLU(0), "dim=0"),
    (pc.nn.Tanhshrink(), torch.nn.Tanhshrink(), ""),
    (pc.nn.Softmin(1), torch.nn.Softmin(1), "dim=1"),
    (pc.nn.Threshold(0.1, 20.0), torch.nn.Threshold(0.1, 20.0), "threshold=0.1, value=20.0"),
]


@pytest.mark.parametrize("layer,torch_layer,extra", LAYERS, ids=[type(x[0]).__name__ + x[2]
                                                                 for x in LAYERS])
def test_layers_match_pytorchs_modules(queue, rng, layer, torch_layer, extra):
    x = (rng.standard_normal((4, 6)) * 4).astype(np.float32)
    assert layer.parameters() == [] and layer.state_dict() == {}
    assert repr(layer) == f"{type(layer).__name__}({extra})"
    node = leaf(queue, x)
    with tp.Tape() as tape:
        y = tp.sum(layer(node))
    tape.backward(y)
    xt = torch.tensor(x, requires_grad=True)
    torch_layer(xt).sum().backward()
    np.testing.assert_allclose(y.item(), float(torch_layer(torch.tensor(x)).sum()), rtol=1e-5)
    np.testing.assert_allclose(node.grad.to_host(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_cosine_similarity_layer_and_inplace_refused(queue, rng):
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3))
    got = pc.nn.CosineSimilarity(dim=1, eps=1e-6)(up(queue, a), up(queue, b)).to_host()
    want = torch.nn.CosineSimilarity(1, 1e-6)(torch.tensor(a), torch.tensor(b, dtype=torch.float32))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    for make in (lambda: pc.nn.ReLU6(inplace=True), lambda: pc.nn.SELU(True),
                 lambda: pc.nn.Hardtanh(inplace=True), lambda: pc.nn.Threshold(0, 0, True)):
        with pytest.raises(ParclError, match="inplace=True is not supported"):
            make()
    with pytest.raises(ParclError, match="Hardtanh: min_val cannot be greater than max_val"):
        pc.nn.Hardtanh(1.0, -1.0)


def test_normalize_and_cosine_similarity_of_a_0d_input_over_dim_0_as_pytorch(queue):
    """``F.normalize(s, dim=0)`` of a 0-d ``s`` is ``s / max(|s|, eps)`` (-3: -1.0; 0: 0.0)
    and ``F.cosine_similarity(s, t, 0)`` of two 0-d tensors their signs' product, as a 0-d
    tensor's dim 0 and -1 are its one element in PyTorch; parcl raised 'normalize: axis 0 is
    out of range for a tensor of shape ()'. Values and gradients are torch's."""
    calls = [(lambda x, y: tp.normalize(x, dim=0), lambda x, y: F.normalize(x, dim=0)),
             (lambda x, y: tp.normalize(x, 1.0, -1), lambda x, y: F.normalize(x, 1.0, -1)),
             (lambda x, y: tp.normalize(x, float("inf"), 0),
              lambda x, y: F.normalize(x, float("inf"), 0)),
             (lambda x, y: tp.cosine_similarity(x, y, 0),
              lambda x, y: F.cosine_similarity(x, y, 0)),
             (lambda x, y: tp.cosine_similarity(x, y, -1) * y,
              lambda x, y: F.cosine_similarity(x, y, -1) * y)]
    for value in (2.5, -3.0, 0.0):
        for ours, theirs in calls:
            x, y = leaf(queue, value), leaf(queue, -1.5)
            with tp.Tape() as tape:
                got = ours(x, y)
            tape.backward(got * 3.0)
            tx = torch.tensor(value, requires_grad=True)
            ty = torch.tensor(-1.5, requires_grad=True)
            want = theirs(tx, ty)
            (want * 3.0).backward()
            assert got.shape == ()
            np.testing.assert_allclose(got.to_host(), want.detach().numpy(), rtol=1e-6)
            # torch's gradient of s / |s| is 0 up to its rounding (1e-7)
            np.testing.assert_allclose(x.grad.to_host(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
            if ty.grad is not None:
                np.testing.assert_allclose(y.grad.to_host(), ty.grad.numpy(), rtol=1e-5,
                                           atol=1e-6)
    with pytest.raises(ShapeError, match=r"normalize: dim 1 is out of range .*shape \(\)"):
        tp.normalize(leaf(queue, 2.5), dim=1)
