"""The gradient norm of ``get_total_norm`` / ``clip_grad_norm_`` (``parcl.kernels.gradnorm``:
one launch per tensor, one to finish) is bit for bit the norm the generic kernels compose
(abs, square, pow, ``reduction.sum``/``max``, a left-to-right fold, the 2**40 overflow
scaling), for every norm type, on tensors of one element to over a million, with huge,
infinite and NaN gradients; and it is the float64 norm within float32's rounding. The clip
by that norm (``clip_grads_with_norm_``, one launch per gradient) is the generic kernels'
clip bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

import parcl as pc
from parcl.kernels import elementwise as ew
from parcl.kernels import gradnorm, reduction
from parcl.kernels._cache import trace_launches
from parcl.nn.utils import clip_grad_norm_, clip_grads_with_norm_, get_total_norm

NORM_TYPES = [1.0, 2.0, 3.0, math.inf, 0.5]


def generic_norm(tensors, p, scaled, workgroup=None):
    """The norm as ``pc.nn.utils`` formed it from generic kernels before they were fused:
    per tensor ``reduction.sum`` of its squares (``|g|``, ``|g|**p``; ``reduction.max`` of
    ``|g|`` for inf), folded left to right, the root; scaled (p > 1): the tensors first
    multiplied by ``clamp(2**40 / max|g|, 2**-88, 1)``, the root divided by it again.
    ``workgroup``: the reductions' kernel shape forced, as ``gradnorm.total_norm``'s."""
    def full(op, x):
        if x.size == 1:                                  # reduction.sum's copy of one element
            return x.copy().reshape(())
        return reduction.reduce_3d(op, x, 1, x.size, 1, workgroup=workgroup).reshape(())

    def partial(g, p):
        if math.isinf(p):
            return full("max", ew.unary("abs", g))
        if p == 2.0:
            return full("sum", ew.unary("square", g))
        a = ew.unary("abs", g)
        return full("sum", a if p == 1.0 else ew.scalar("pow", a, p))

    def fold(combine, partials):
        acc = partials[0]
        for t in partials[1:]:
            acc = ew.binary(combine, acc, t, out=acc)
        return acc

    if math.isinf(p):
        return fold("maximum", [partial(t, p) for t in tensors])
    scale = None
    if scaled and p > 1.0:
        biggest = fold("maximum", [partial(t, math.inf) for t in tensors])
        scale = ew.scalar("rdiv", biggest, 2.0 ** 40, out=biggest)
        scale = ew.unary("clamp", scale, out=scale, p=2.0 ** -88, q=1.0)
        tensors = [ew.binary("mul", t, scale) for t in tensors]
    acc = fold("add", [partial(t, p) for t in tensors])
    if p == 1.0:
        return acc
    acc = ew.unary("sqrt", acc, out=acc) if p == 2.0 else ew.scalar("pow", acc, 1.0 / p,
                                                                      out=acc)
    return acc if scale is None else ew.binary("div", acc, scale, out=acc)


def bits(t) -> bytes:
    """The tensor's bytes, every NaN as one NaN: which of two NaNs an operation passes on (its
    sign, its payload) IEEE 754 leaves open, and a compiler may swap ``x * c``'s operands
    (x86 passes on the first): NaN is NaN, every other value bit for bit."""
    a = t.to_host()
    a[np.isnan(a)] = np.nan
    return a.tobytes()


def gradient_sets(rng):
    """Named lists of gradients: the shapes of every reduction plan (one element, short,
    one chunk, chunks plus a remainder, a million and three), magnitudes from tiny to too
    large to square, signed zeros, inf and NaN."""
    def normal(n, scale=1.0):
        return (rng.standard_normal(n) * scale).astype(np.float32)

    shapes = [(1,), (), (7,), (4096,), (2049 * 3,), (1_000_003,), (3, 4), (2, 1, 5)]
    mixed = [normal(int(np.prod(s))).reshape(s) for s in shapes]
    huge = [normal(7), np.array([3e19, -4e19], np.float32), np.full(5000, 1e18, np.float32)]
    with_inf = [normal(4096), np.array([1.0, -np.inf, 2.0], np.float32)]
    with_nan = [normal(4096), normal(2049 * 3), np.array([np.nan], np.float32)]
    nan_in_big = normal(1_000_003)
    nan_in_big[777_777] = np.nan
    return {
        "mixed shapes": mixed,
        "tiny": [normal(4096, 1e-30), normal(7, 1e-42)],           # subnormal squares
        "near 2**40": [normal(4096, 2.0 ** 38), np.array([2.0 ** 40], np.float32)],
        "huge (3e19)": huge,
        "inf": with_inf,
        "NaN": with_nan,
        "NaN in a million": [normal(5), nan_in_big],
        "negative zeros": [np.array([-0.0], np.float32), np.array([-0.0, -0.0], np.float32)],
        "one lone element": [np.array([-3.0], np.float32)],
        "a lone negative zero": [np.array([-0.0], np.float32)],    # |-0| is +0, as torch.abs
    }


@pytest.fixture(scope="module")
def gradients(queue):
    rng = np.random.default_rng(0)
    return {name: [pc.Tensor.from_host(queue, g) for g in gs]
            for name, gs in gradient_sets(rng).items()}


@pytest.mark.parametrize("scaled", [True, False], ids=["scaled", "plain"])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_the_fused_norm_is_the_generic_kernels_norm_bit_for_bit(gradients, norm_type, scaled):
    for name, grads in gradients.items():
        want = generic_norm(grads, norm_type, scaled)
        got = gradnorm.total_norm(grads, norm_type, scaled)
        assert bits(got) == bits(want), (name, got.item(), want.item())


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 3.0])
def test_the_gpu_shape_work_group_trees_also_give_the_same_bits(queue, gradients, norm_type):
    """A GPU reduces long rows with a work-group per chunk and a tree; forced on the CPU
    (``workgroup=True``, as ``reduce_3d`` takes it), the fused kernels build the same trees,
    and the finishing launch replays a later stage's tree the same way (2049 * 2048 + 1
    elements: 2050 first-stage partials, more than one chunk, so three stages)."""
    rng = np.random.default_rng(1)
    three_stages = pc.Tensor.from_host(queue, rng.standard_normal(2049 * 2048 + 1)
                                       .astype(np.float32))
    cases = dict(gradients, **{"three stages": [three_stages, gradients["mixed shapes"][2]]})
    for name, grads in cases.items():
        for scaled in (True, False):
            want = generic_norm(grads, norm_type, scaled, workgroup=True)
            got = gradnorm.total_norm(grads, norm_type, scaled, workgroup=True)
            assert bits(got) == bits(want), (name, scaled, got.item(), want.item())


def test_a_three_stage_sum_on_the_cpu_gives_the_same_bits(queue):
    """Over 2048 * 2048 elements the CPU's sum takes three stages (chunks of chunks)."""
    g = pc.Tensor.from_host(queue, np.random.default_rng(2).standard_normal(2049 * 2048 + 1)
                            .astype(np.float32))
    for p in (2.0, 1.0, math.inf):
        assert bits(gradnorm.total_norm([g], p)) == bits(generic_norm([g], p, scaled=True))


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_the_norm_is_numpys_float64_norm_to_float32_rounding(gradients, norm_type):
    for name in ("mixed shapes", "huge (3e19)", "tiny"):
        grads = gradients[name]
        flat = np.concatenate([g.to_host().astype(np.float64).ravel() for g in grads])
        if math.isinf(norm_type):
            want = np.abs(flat).max()
        else:
            biggest = np.abs(flat).max()               # scaled as float32 would need it
            want = (np.abs(flat / biggest) ** norm_type).sum() ** (1 / norm_type) * biggest
        got = float(get_total_norm(grads, norm_type).item())
        # float32 running sums of up to 2048 terms, then the root (of 0.5: the error doubled)
        assert got == pytest.approx(want, rel=5e-5 * max(1.0, 1 / norm_type)), name


def test_inf_stays_inf_and_nan_stays_nan(gradients):
    for p in NORM_TYPES:
        assert float(get_total_norm(gradients["inf"], p).item()) == math.inf
        assert math.isnan(float(get_total_norm(gradients["NaN"], p).item()))


def test_one_launch_per_tensor_and_one_to_finish(queue, gradients):
    """The plain norm: a launch per tensor and one to finish (the generic kernels took three
    to five per tensor). Scaled: twice that, the second pass a no-op for ordinary gradients.
    No elementwise kernel runs, so no temporary the size of a gradient is made."""
    grads = gradients["mixed shapes"]
    n = len(grads)
    for p, scaled, launches in [(2.0, False, n + 1), (2.0, True, 2 * n + 2),
                                (3.0, True, 2 * n + 2), (1.0, True, n + 1),
                                (math.inf, True, n + 1)]:
        with trace_launches() as traced:
            gradnorm.total_norm(grads, p, scaled)
        names = [name for name, _, _ in traced]
        assert len(names) == launches, (p, scaled, names)
        with trace_launches() as traced:
            generic_norm(grads, p, scaled)
        assert len(traced) >= 3 * n, (p, scaled)


def test_clip_grad_norm_returns_and_clips_by_the_fused_norm(queue, gradients):
    """``clip_grad_norm_`` reads back the plain norm, and only where that overflowed forms
    the scaled one: the same value either way as the generic kernels'."""
    for name in ("mixed shapes", "huge (3e19)"):
        grads = [g.copy() for g in gradients[name]]
        want = generic_norm(grads, 2.0, scaled=name != "mixed shapes")
        assert clip_grad_norm_(grads, 1e30) == float(want.item())


def generic_clip(grads, norm, max_norm):
    """The clip as ``pc.nn.utils`` formed it from generic kernels: the coefficient
    min(max_norm / (norm + 1e-6), 1) by three scalar launches, then a broadcast mul each."""
    coef = ew.scalar("add", norm, 1e-6)
    ew.scalar("rdiv", coef, float(max_norm), out=coef)
    ew.scalar("minimum", coef, 1.0, out=coef)
    for g in grads:
        ew.binary("mul", g, coef, out=g)


@pytest.mark.parametrize("norm", [0.0, 0.37, 1.0, 3.3e7, math.inf, math.nan])
@pytest.mark.parametrize("max_norm", [0.0, 1e-3, 1.0, 1e30, math.inf])
def test_clipping_by_a_device_norm_is_the_generic_kernels_clip_bit_for_bit(queue, gradients,
                                                                           norm, max_norm):
    """One launch per gradient, each forming the coefficient from the norm on the device (a
    CPU's work-items a run of 16 elements each, a GPU's one: both forced here)."""
    grads = gradients["mixed shapes"] + gradients["inf"] + gradients["NaN"]
    norm_t = pc.Tensor.from_host(queue, np.array(norm, np.float32))
    want = [g.copy() for g in grads]
    generic_clip(want, norm_t, max_norm)
    got = [g.copy() for g in grads]
    with trace_launches() as traced:
        clip_grads_with_norm_(got, max_norm, norm_t)
    assert len(traced) == len(grads)
    for g, w in zip(got, want):
        assert bits(g) == bits(w)
    for run in (1, gradnorm.CLIP_RUN):
        got = [g.copy() for g in grads]
        gradnorm.clip_by_norm_(got, norm_t, max_norm, 1e-6, run=run)
        assert all(bits(g) == bits(w) for g, w in zip(got, want)), run
