"""Elementwise and layout kernels against numpy: awkward sizes, broadcasting, in-place updates,
errors, and two threads launching on their own sub-devices at once."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import parcl as pc
from conftest import run_on_both_queues
from parcl.kernels import elementwise as ew
from parcl.kernels import gelu
from parcl.kernels import layout

SIZES = [1, 7, 33, 257, 1000]
_erf = np.vectorize(math.erf)


def dev(queue, a):
    return pc.Tensor.from_host(queue, np.asarray(a, np.float32))


def gelu64(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


BINARY_REF = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "rsub": lambda x, y: y - x, "rdiv": lambda x, y: y / x,
    "maximum": np.maximum, "minimum": np.minimum, "pow": np.power,
    "rpow": lambda x, y: np.power(y, x),
    "ge": lambda x, y: (x >= y).astype(np.float64), "gt": lambda x, y: (x > y) * 1.0,
    "le": lambda x, y: (x <= y) * 1.0, "lt": lambda x, y: (x < y) * 1.0,
}

UNARY_REF = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "gelu": gelu64,
    "sqrt": np.sqrt, "abs": np.abs, "square": np.square, "reciprocal": lambda x: 1 / x,
    "sign": np.sign,
}

POSITIVE_ONLY = {"log", "sqrt", "reciprocal"}


def _close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert got.shape == np.shape(want)


# -- binary ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_same_shape(queue, rng, op, n):
    a = rng.uniform(0.5, 2.0, n).astype(np.float32)
    b = rng.uniform(0.5, 2.0, n).astype(np.float32)
    got = ew.binary(op, dev(queue, a), dev(queue, b)).to_host()
    _close(got, BINARY_REF[op](a.astype(np.float64), b.astype(np.float64)))


BROADCASTS = [((3, 1), (1, 4)), ((257,), (7, 257)), ((7, 257), (257,)), ((), (33,)),
              ((1000,), ()), ((33, 1), (33,)), ((2, 1, 5), (3, 1)), ((2, 1, 40), (3, 1)),
              ((4, 1, 6, 1), (5, 1, 7)),
              ((2, 3, 1, 5, 1, 2), (1, 3, 4, 1, 6, 2)), ((1, 1, 1), (7,)), ((5, 33), (1, 1))]


@pytest.mark.parametrize("sa,sb", BROADCASTS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "pow"])
def test_binary_broadcasting(queue, rng, op, sa, sb):
    a = rng.uniform(0.5, 2.0, sa).astype(np.float32)
    b = rng.uniform(0.5, 2.0, sb).astype(np.float32)
    got = ew.binary(op, dev(queue, a), dev(queue, b)).to_host()
    _close(got, BINARY_REF[op](a.astype(np.float64), b.astype(np.float64)))


def test_binary_collapses_more_than_six_dims_when_possible(queue, rng):
    a = rng.standard_normal((2, 3, 1, 1, 1, 1, 1, 4)).astype(np.float32)
    b = rng.standard_normal((3, 1, 1, 1, 5, 1, 1)).astype(np.float32)
    got = ew.binary("add", dev(queue, a), dev(queue, b)).to_host()
    _close(got, a + b)


def test_binary_out_and_aliasing(queue, rng):
    a = rng.standard_normal((7, 33)).astype(np.float32)
    b = rng.standard_normal((33,)).astype(np.float32)
    ta = dev(queue, a)
    res = ew.binary("mul", ta, dev(queue, b), out=ta)      # in place over the full input
    assert res is ta
    _close(ta.to_host(), a * b)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "rsub", "rdiv", "pow", "maximum"])
def test_scalar_ops_and_python_scalars(queue, rng, op):
    x = rng.uniform(0.5, 2.0, (33, 7)).astype(np.float32)
    x64 = x.astype(np.float64)
    _close(ew.scalar(op, dev(queue, x), 1.5).to_host(), BINARY_REF[op](x64, 1.5))
    _close(ew.binary(op, dev(queue, x), 1.5).to_host(), BINARY_REF[op](x64, 1.5))
    _close(ew.binary(op, 1.5, dev(queue, x)).to_host(), BINARY_REF[op](1.5, x64))


# -- unary and backward helpers ----------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary(queue, rng, op, n):
    x = rng.standard_normal(n).astype(np.float32) * 3
    if op in POSITIVE_ONLY:
        x = np.abs(x) + 0.1
    got = ew.unary(op, dev(queue, x)).to_host()
    _close(got, UNARY_REF[op](x.astype(np.float64)), rtol=2e-5, atol=1e-6)


def test_unary_extremes_stay_finite(queue):
    x = np.array([-100.0, -30.0, 0.0, 30.0, 100.0], np.float32)
    for op in ("sigmoid", "tanh", "gelu", "relu"):
        got = ew.unary(op, dev(queue, x)).to_host()
        assert np.all(np.isfinite(got)), op
        _close(got, UNARY_REF[op](x.astype(np.float64)), atol=1e-6)


def test_nan_propagates_like_numpy(queue):
    """Anomaly mode reads outputs: relu/abs/maximum/minimum must not swallow a NaN."""
    x = np.array([np.nan, -1, 0, 2, -np.inf, np.inf], np.float32)
    y = np.array([1, np.nan, -1, 3, 0, 0], np.float32)
    tx, ty = dev(queue, x), dev(queue, y)
    for op, ref in (("maximum", np.maximum), ("minimum", np.minimum)):
        np.testing.assert_array_equal(ew.binary(op, tx, ty).to_host(), ref(x, y))
    np.testing.assert_array_equal(ew.unary("relu", tx).to_host(), [np.nan, 0, 0, 2, 0, np.inf])
    np.testing.assert_array_equal(ew.unary("abs", tx).to_host(), np.abs(x))


def test_backward_helpers(queue, rng):
    x = rng.standard_normal((33, 7)).astype(np.float32)
    g = rng.standard_normal((33, 7)).astype(np.float32)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    tx, tg = dev(queue, x), dev(queue, g)
    _close(ew.relu_backward(tx, tg).to_host(), g64 * (x64 > 0))
    y = 1 / (1 + np.exp(-x64))
    _close(ew.sigmoid_backward(dev(queue, y), tg).to_host(), g64 * y * (1 - y), atol=1e-6)
    t = np.tanh(x64)
    _close(ew.tanh_backward(dev(queue, t), tg).to_host(), g64 * (1 - t * t), atol=1e-6)
    pdf = np.exp(-x64 ** 2 / 2) / math.sqrt(2 * math.pi)
    want = g64 * (0.5 * (1 + _erf(x64 / math.sqrt(2))) + x64 * pdf)
    for variant in {gelu.choose_variant(queue.device), "vec8", "one"}:     # see gelu_variant
        _close(gelu.gelu_backward(tx, tg, variant=variant).to_host(), want, atol=1e-6)
    s = np.abs(x64) + 0.5
    _close(ew.sqrt_backward(dev(queue, s), tg).to_host(), g64 * 0.5 / s)


def test_broadcast_to(queue, rng):
    x = rng.standard_normal((3, 1)).astype(np.float32)
    got = ew.broadcast_to(dev(queue, x), (2, 3, 4), 0.5).to_host()
    _close(got, np.broadcast_to(x * 0.5, (2, 3, 4)))
    with pytest.raises(pc.ShapeError, match="broadcast_to"):
        ew.broadcast_to(dev(queue, x), (2, 4))


# -- in place ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_axpy_scale_fill_copy(queue, rng, n):
    y = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    ty = dev(queue, y)
    assert ew.axpy(ty, dev(queue, x), 2.5) is ty
    _close(ty.to_host(), y + 2.5 * x)
    ew.scale_(ty, -2.0)
    _close(ty.to_host(), -2.0 * (y + 2.5 * x))
    c = ew.copy(ty)
    ew.fill_(ty, 3.0)
    assert np.all(ty.to_host() == 3.0)
    _close(c.to_host(), -2.0 * (y + 2.5 * x))


def test_axpy_accepts_same_size_other_shape(queue):
    y = dev(queue, np.zeros((2, 3)))
    ew.axpy(y, dev(queue, np.ones(6)), 1.0)
    assert np.all(y.to_host() == 1.0)


# -- errors ------------------------------------------------------------------------------------
def test_bad_dtype_is_a_type_error(queue):
    ints = pc.Tensor.from_host(queue, np.arange(4, dtype=np.int32))
    f = dev(queue, np.ones(4))
    for call in (lambda: ew.binary("add", ints, f), lambda: ew.unary("exp", ints),
                 lambda: ew.scalar("mul", ints, 2.0), lambda: ew.axpy(f, ints)):
        with pytest.raises(pc.DTypeError, match="int32"):
            call()
    with pytest.raises(TypeError):
        ew.binary("add", np.ones(4, np.float32), f)


def test_not_broadcastable_names_op_and_shapes(queue):
    a, b = dev(queue, np.ones((3, 4))), dev(queue, np.ones((5,)))
    with pytest.raises(pc.ShapeError, match=r"mul: shapes \(3, 4\) and \(5,\)"):
        ew.binary("mul", a, b)
    with pytest.raises(pc.ShapeError, match="axpy"):
        ew.axpy(a, b)
    with pytest.raises(pc.ShapeError, match="out has shape"):
        ew.binary("add", a, a, out=b)
    with pytest.raises(ValueError, match="unknown op"):
        ew.unary("no_such_op", a)


def test_tensors_on_different_queues_are_an_error(queues2):
    q0, q1 = queues2
    a, b = dev(q0, np.ones(7)), dev(q1, np.ones(7))
    with pytest.raises(pc.DeviceError, match="different command queues"):
        ew.binary("add", a, b)
    with pytest.raises(pc.DeviceError):
        ew.axpy(a, b)
    with pytest.raises(pc.DeviceError):
        ew.unary("exp", a, out=b)


# -- threads -----------------------------------------------------------------------------------
def test_two_threads_on_their_own_sub_devices(queues2):
    """Each thread launches 1,000 rounds on its own queue at the same time as the other."""
    rounds = 1000

    def work(q, start):
        rng = np.random.default_rng(queues2.index(q))
        x = rng.standard_normal(257).astype(np.float32)
        b = rng.standard_normal((7, 1)).astype(np.float32)
        tx, tb = dev(q, x), dev(q, b)
        acc = dev(q, np.zeros(257))
        start()
        last = None
        for _ in range(rounds):
            last = ew.binary("mul", tx, tb)              # (7, 257) strided path
            ew.axpy(acc, ew.unary("tanh", tx), 1.0)
        return x, b, acc.to_host(), last.to_host()

    for x, b, acc, last in run_on_both_queues(queues2, work):
        _close(last, x * b)
        _close(acc, rounds * np.tanh(x.astype(np.float64)), rtol=1e-4, atol=1e-3)


# -- layout ------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (33, 257), (1, 5), (4, 1, 3), (2, 3, 4, 5),
                                   (2, 1, 3, 1, 4, 2), (3, 4, 5, 2, 3, 2)])
def test_transpose_every_permutation(queue, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    tx = dev(queue, x)
    perms = list(itertools.permutations(range(len(shape))))
    if len(perms) > 60:
        perms = [perms[i] for i in rng.choice(len(perms), 60, replace=False)]
    for perm in perms + [None]:
        got = layout.transpose(tx, perm).to_host()
        np.testing.assert_array_equal(got, np.transpose(x, perm))


@pytest.mark.parametrize("shape,perm", [((33, 257), (1, 0)), ((5, 17, 40), (0, 2, 1)),
                                        ((1, 16, 16), (0, 2, 1)), ((3, 4, 5, 6), (0, 2, 3, 1)),
                                        ((7, 1), (1, 0))])
@pytest.mark.parametrize("tiled", [True, False])
def test_transpose_2d_kernels(queue, rng, shape, perm, tiled):
    """Both (batched) 2-D kernels, the GPU's tiled one forced on this device too."""
    x = rng.standard_normal(shape).astype(np.float32)
    got = layout.transpose(dev(queue, x), perm, tiled=tiled).to_host()
    np.testing.assert_array_equal(got, np.transpose(x, perm))


def test_transpose_int_and_negative_axes(queue):
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    got = layout.transpose(pc.Tensor.from_host(queue, x), (-1, 0, 1))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.to_host(), np.transpose(x, (2, 0, 1)))


@pytest.mark.parametrize("perm", [(1, 3, 5, 7, 0, 2, 4, 6), (0, 2, 4, 6, 7, 1, 3, 5)])
def test_transpose_of_more_than_6_strided_dims_as_numpy(queue, rng, perm):
    # beyond the permute kernel's 6 dims (a repeat's backward over (r0, s0, ..., r3, s3)):
    # the strided copy, where it was a ShapeError
    x = rng.standard_normal((2, 3, 2, 2, 3, 2, 2, 2)).astype(np.float32)
    np.testing.assert_array_equal(layout.transpose(dev(queue, x), perm).to_host(),
                                  np.transpose(x, perm))


def test_transpose_bad_axes(queue):
    x = dev(queue, np.ones((2, 3)))
    with pytest.raises(pc.ShapeError, match="permutation"):
        layout.transpose(x, (0, 0))
    with pytest.raises(pc.ShapeError, match="do not match"):
        layout.transpose(x, (0, 1, 2))


@pytest.fixture(params=gelu.VARIANTS)
def gelu_variant(request, queue):
    """Every GELU kernel, forced. Where the float16 probe failed (LLVM 14 aborts on float16
    code compiled for AVX2, which would take the whole test run down), the float8 kernel
    that replaces it on this device is tested in its place."""
    if request.param == "vec16" and gelu.choose_variant(queue.device) != "vec16":
        return "vec8"
    return request.param


def _gelu_input(queue, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[: min(n, 4)] = np.array([0.0, -90.0, 90.0, -8.0], np.float32)[: min(n, 4)]
    return dev(queue, x), dev(queue, rng.standard_normal(n))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 1000, 4099])
def test_gelu_backward_in_one_kernel_is_bit_for_bit_the_four_flat_launches(queue, n,
                                                                           gelu_variant):
    """The fused kernel (16 or 8 elements per work-item on CPUs, one on GPUs) against
    phi(x), times x, plus Phi(x), times g as separate launches: the same bits, tails and the
    clamped far ends (|x| = 90) included."""
    tx, tg = _gelu_input(queue, n)
    d = ew.unary("normal_pdf", tx)
    ew.binary("mul", tx, d, out=d)
    ew.binary("add", ew.unary("normal_cdf", tx), d, out=d)
    want = ew.binary("mul", tg, d, out=d).to_host()
    got = gelu.gelu_backward(tx, tg, variant=gelu_variant).to_host()
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 1000, 4099])
def test_gelu_forward_kernel_is_bit_for_bit_the_flat_launch(queue, n, gelu_variant):
    tx, _ = _gelu_input(queue, n)
    want = ew.unary("gelu", tx).to_host()
    got = gelu.gelu_forward(tx, variant=gelu_variant).to_host()
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_a_cpu_runs_the_float16_gelu_where_its_probe_passed(queue):
    """On an AVX-512 build the probe passes, and the float16 kernel is what every test of
    the GELU op exercises; elsewhere the float8 one. A GPU runs one element per work-item."""
    if pc.runtime.is_gpu(queue.device):
        assert gelu.choose_variant(queue.device) == "one"
        return
    wide = gelu.wide_kernel_ok(queue.device, "gelu", gelu.SOURCES["vec16"])
    assert gelu.choose_variant(queue.device) == ("vec16" if wide else "vec8")
    if wide:
        assert gelu.wide_check(queue)
