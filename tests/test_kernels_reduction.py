"""Reductions against numpy: every axis, tuples of axes, everything, keepdims; both kernel
variants; bit-identical repeated sums; sum_to_shape; argmax; errors; concurrent threads."""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
from conftest import run_on_both_queues
from parcl.kernels import reduction as rd

SHAPES = [(1,), (7,), (1000,), (33, 257), (257, 7), (4, 1, 3), (2, 3, 4, 5), (3, 1, 7, 1)]
REF = {"sum": np.sum, "mean": np.mean, "max": np.max}


def dev(queue, a):
    return pc.Tensor.from_host(queue, np.asarray(a, np.float32))


def _axes_cases(nd):
    cases = [None, ()] + list(range(-nd, nd)) + [tuple(range(nd))]
    if nd >= 2:
        cases.append((0, nd - 1))
    if nd >= 3:
        cases += [(0, 2), (1, 2)]
    if nd >= 4:
        cases += [(1, 3), (0, 1, 3)]
    return cases


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_reduce_every_axis(queue, rng, shape, op):
    x = rng.standard_normal(shape).astype(np.float32)
    tx = dev(queue, x)
    for axis in _axes_cases(len(shape)):
        for keepdims in (False, True):
            got = getattr(rd, op)(tx, axis=axis, keepdims=keepdims).to_host()
            want = REF[op](x.astype(np.float64), axis=axis, keepdims=keepdims)
            assert got.shape == want.shape, (axis, keepdims)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [((33, 257), 1), ((257, 33), 0), ((5, 3000, 2), 1),
                                        ((2, 3, 4, 5), (1, 3)), ((20000,), None)])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_workgroup_variant_matches(queue, rng, shape, axis, op):
    """The GPU tree kernel, forced on this device, agrees with numpy too."""
    x = rng.standard_normal(shape).astype(np.float32)
    got = rd._reduce(op, op, dev(queue, x), axis, False, False, workgroup=True).to_host()
    np.testing.assert_allclose(got, REF[op](x.astype(np.float64), axis=axis), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("shape,axis", [((256, 512), 0), ((3, 5000, 16), 1), ((4, 3, 24), (0, 1)),
                                        ((9, 8), 0)])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_eight_columns_at_once_sum_each_as_one_column_does(queue, rng, shape, axis, op):
    """Where the kept inner extent is a multiple of 8, a CPU work-item reduces 8 neighbouring
    columns in vector lanes: each column's result is bit for bit the one-column reduction's,
    NaN and infinities included."""
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[::37] = np.nan
    x.flat[5::41] = -np.inf
    whole = getattr(rd, op)(dev(queue, x), axis=axis).to_host()
    np.testing.assert_allclose(whole, REF[op](x.astype(np.float64), axis=axis), rtol=1e-4,
                               atol=1e-4, equal_nan=True)
    flat = whole.reshape(-1)
    for j in range(x.shape[-1]):
        one = getattr(rd, op)(dev(queue, x[..., j:j + 1].copy()), axis=axis).to_host()
        np.testing.assert_array_equal(one.reshape(-1), flat[j::x.shape[-1]])


def test_full_sum_of_a_million_is_accurate_and_bit_identical(queue, rng):
    x = rng.random(1 << 20).astype(np.float32)
    tx = dev(queue, x)
    runs = [rd.sum(tx).to_host() for _ in range(5)]
    assert runs[0].shape == ()
    assert len({r.tobytes() for r in runs}) == 1
    np.testing.assert_allclose(runs[0], x.astype(np.float64).sum(), rtol=1e-6)
    np.testing.assert_allclose(rd.mean(tx).to_host(), x.astype(np.float64).mean(), rtol=1e-6)


def test_long_axis_two_stage(queue, rng):
    x = rng.standard_normal((3, 50000)).astype(np.float32)
    got = rd.sum(dev(queue, x), axis=1).to_host()
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)
    got = rd.max(dev(queue, x.T.copy()), axis=0).to_host()
    np.testing.assert_array_equal(got, x.max(1))


def test_max_propagates_nan_and_handles_inf(queue):
    x = np.array([[1.0, np.nan, 3.0], [-np.inf, -5.0, -np.inf]], np.float32)
    got = rd.max(dev(queue, x), axis=1).to_host()
    assert np.isnan(got[0]) and got[1] == -5.0


def test_argmax(queue, rng):
    x = rng.standard_normal((33, 10)).astype(np.float32)
    x[3, 4] = x[3, 7] = 100.0                        # ties: the first index wins
    tx = dev(queue, x)
    got = rd.argmax(tx)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.to_host(), x.argmax(-1))
    got32 = rd.argmax(tx, axis=0, dtype=np.int32)
    assert got32.dtype == np.int32
    np.testing.assert_array_equal(got32.to_host(), x.argmax(0))
    with pytest.raises(pc.DTypeError):
        rd.argmax(tx, dtype=np.float32)


@pytest.mark.parametrize("shape", [(7, 3, 4), (3, 4), (4,), (1, 4), (3, 1), (7, 1, 1),
                                   (1, 1, 4), (), (1, 3, 4), (1, 1, 1, 1)])
def test_sum_to_shape(queue, rng, shape):
    g = rng.standard_normal((7, 3, 4)).astype(np.float32)
    tg = dev(queue, g)
    got = rd.sum_to_shape(tg, shape)
    assert got.shape == shape
    want = g.astype(np.float64)
    lead = want.ndim - len(shape)
    if lead > 0:
        want = want.sum(axis=tuple(range(lead)))
    elif lead < 0:                                  # extra leading 1s in the target shape
        want = want.reshape((1,) * -lead + want.shape)
    if shape:
        want = want.sum(axis=tuple(k for k, s in enumerate(shape) if s == 1), keepdims=True)
    np.testing.assert_allclose(got.to_host(), np.broadcast_to(want, shape), rtol=1e-5,
                               atol=1e-5)


def test_sum_to_shape_returns_g_itself_when_shapes_match(queue):
    g = dev(queue, np.ones((3, 4)))
    assert rd.sum_to_shape(g, (3, 4)) is g
    view = rd.sum_to_shape(dev(queue, np.ones((1, 3, 1))), (3, 1))   # only size-1 dims
    assert view.shape == (3, 1)


def test_errors(queue):
    x = dev(queue, np.ones((3, 4)))
    with pytest.raises(pc.ShapeError, match="axis 2 is out of range"):
        rd.sum(x, axis=2)
    with pytest.raises(pc.ShapeError, match="repeated axis"):
        rd.mean(x, axis=(0, -2))
    with pytest.raises(pc.ShapeError, match="not a broadcast"):
        rd.sum_to_shape(x, (5,))
    with pytest.raises(pc.ShapeError, match="not a broadcast"):
        rd.sum_to_shape(x, (2, 3, 4))
    with pytest.raises(pc.DTypeError, match="sum"):
        rd.sum(pc.Tensor.from_host(queue, np.arange(3, dtype=np.int64)))


def test_an_axis_refused_once_is_refused_after_its_int_plan_is_kept(queue):
    # (1.0,) and (True,) equal (1,) as keys: after a sum over (1,) they took its plan
    x = pc.Tensor.from_host(queue, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(rd.sum(x, axis=(1,)).to_host(), [3.0, 12.0])
    for axis in ((1.0,), (True,), (0, 1.0)):
        with pytest.raises(pc.ShapeError, match="axis must be an int"):
            rd.sum(x, axis=axis)
    np.testing.assert_array_equal(rd.sum(x, axis=(np.int64(1),)).to_host(),
                                  [3.0, 12.0])


def test_two_threads_reduce_concurrently(queues2):
    rounds = 300

    def work(q, start):
        x = np.random.default_rng(queues2.index(q)).standard_normal((64, 257)).astype(np.float32)
        tx = dev(q, x)
        start()
        outs = [rd.sum(tx, axis=1) for _ in range(rounds)]
        full = [rd.sum(tx) for _ in range(rounds)]
        return x, [o.to_host() for o in outs[::50]], {f.to_host().tobytes() for f in full}

    for x, outs, fulls in run_on_both_queues(queues2, work):
        for o in outs:
            np.testing.assert_allclose(o, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
        assert len(fulls) == 1


def test_a_gpu_takes_work_groups_only_for_long_rows_and_launches_under_2_31():
    chunk = rd.CHUNK_GPU
    assert rd.use_workgroups(1000, 1024, 1, chunk)             # long rows, short stride
    assert not rd.use_workgroups(1000, 4, 1, chunk)            # 4 values: one work-item each
    assert not rd.use_workgroups(1000, 1024, 64, chunk)        # long strides: sequential
    assert not rd.use_workgroups(9_000_000, 256, 1, chunk)     # 2.3e9 work-items: too many
