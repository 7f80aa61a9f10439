"""GEMM kernels against numpy (float64 references): every transpose, awkward sizes, the fused
epilogue, accumulation, batches, both variants on the CPU device, errors, and threads."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pyopencl as cl
import pytest


import parcl as pc
from parcl.kernels.gemm import SOURCE, VARIANTS, batched_gemm, choose_variant, gemm
from parcl.kernels.probe import wide_kernel_ok

TRANS = list(itertools.product([False, True], repeat=2))


def _operands(rng, m, n, k, trans_a, trans_b, batch=None):
    lead = () if batch is None else (batch,)
    a = rng.standard_normal(lead + ((k, m) if trans_a else (m, k))).astype(np.float32)
    b = rng.standard_normal(lead + ((n, k) if trans_b else (k, n))).astype(np.float32)
    return a, b


def _op(x, trans):
    x = x.astype(np.float64)
    return np.swapaxes(x, -1, -2) if trans else x


def _close(got, want, rtol=1e-4):
    """Within rtol of the result's magnitude (float32 sums of K products)."""
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale)


def _up(queue, x):
    return pc.Tensor.from_host(queue, x)


@pytest.fixture(params=VARIANTS)
def variant(request, queue):
    """Every variant, forced, on the CPU device. Where the float16 probe failed (a PoCL that
    aborts on float16 code would take the whole test run down), the float8 variant that
    replaces it on this device is tested in its place."""
    if request.param.endswith("16") and not wide_kernel_ok(queue.device, "gemm", SOURCE):
        return request.param[:-2] + "8"
    return request.param


# -- correctness ---------------------------------------------------------------------------
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 7, 7), (33, 33, 33), (1, 257, 7),
                                   (257, 33, 1), (16, 64, 128), (65, 17, 33), (40, 1000, 3)])
def test_gemm_matches_numpy(queue, rng, variant, trans_a, trans_b, m, n, k):
    a, b = _operands(rng, m, n, k, trans_a, trans_b)
    c = gemm(_up(queue, a), _up(queue, b), trans_a=trans_a, trans_b=trans_b, _variant=variant)
    assert c.shape == (m, n)
    _close(c.to_host(), _op(a, trans_a) @ _op(b, trans_b))


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_gemm_257_cube(queue, rng, trans_a, trans_b):
    a, b = _operands(rng, 257, 257, 257, trans_a, trans_b)
    c = gemm(_up(queue, a), _up(queue, b), trans_a=trans_a, trans_b=trans_b)
    _close(c.to_host(), _op(a, trans_a) @ _op(b, trans_b))


@pytest.mark.parametrize("m,n,k", [(5, 7, 9), (64, 48, 16), (33, 129, 20)])
def test_bias_relu_epilogue(queue, rng, variant, m, n, k):
    """A Linear layer: relu(x @ W^T + bias)."""
    x, w = _operands(rng, m, n, k, False, True)
    bias = rng.standard_normal(n).astype(np.float32)
    ref = _op(x, False) @ _op(w, True) + bias
    got = gemm(_up(queue, x), _up(queue, w), trans_b=True, bias=_up(queue, bias),
               _variant=variant)
    _close(got.to_host(), ref)
    got = gemm(_up(queue, x), _up(queue, w), trans_b=True, bias=_up(queue, bias), relu=True,
               _variant=variant)
    _close(got.to_host(), np.maximum(ref, 0))
    got = gemm(_up(queue, x), _up(queue, w), trans_b=True, relu=True, _variant=variant)
    _close(got.to_host(), np.maximum(ref - bias, 0))


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_beta_accumulates_into_out(queue, rng, variant, trans_a, trans_b):
    """beta=1 is gradient accumulation: grad += x^T @ dy."""
    m, n, k = 24, 40, 9
    a, b = _operands(rng, m, n, k, trans_a, trans_b)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    out = _up(queue, c0)
    res = gemm(_up(queue, a), _up(queue, b), trans_a=trans_a, trans_b=trans_b, out=out,
               beta=1.0, _variant=variant)
    assert res is out
    ref = _op(a, trans_a) @ _op(b, trans_b) + c0
    _close(out.to_host(), ref)
    gemm(_up(queue, a), _up(queue, b), trans_a=trans_a, trans_b=trans_b, out=out, beta=0.5,
         _variant=variant)
    _close(out.to_host(), _op(a, trans_a) @ _op(b, trans_b) + 0.5 * ref)


def test_beta_zero_ignores_garbage_in_out(queue, rng):
    a, b = _operands(rng, 9, 20, 5, False, False)
    out = pc.Tensor.full(queue, (9, 20), float("nan"))
    gemm(_up(queue, a), _up(queue, b), out=out)
    _close(out.to_host(), _op(a, False) @ _op(b, False))


# whole blocks; ragged columns; a last block of whole vectors and nothing (n = 48 on 16-wide
# vectors) with ragged rows (m = 13): the edge blocks' store path
@pytest.mark.parametrize("m,n", [(8, 32), (8, 35), (13, 48), (13, 40)])
def test_epilogue_order_with_beta_bias_relu(queue, rng, variant, m, n):
    a, b = _operands(rng, m, n, 4, False, False)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = _up(queue, c0)
    gemm(_up(queue, a), _up(queue, b), out=out, beta=2.0, bias=_up(queue, bias), relu=True,
         _variant=variant)
    _close(out.to_host(), np.maximum(_op(a, False) @ _op(b, False) + 2 * c0 + bias, 0))


@pytest.mark.parametrize("n", [32, 35])
def test_nan_propagates_through_relu(queue, variant, n):
    a = np.ones((8, 8), np.float32)
    a[3, 2] = np.nan
    c = gemm(_up(queue, a), _up(queue, np.ones((8, n), np.float32)), relu=True,
             _variant=variant).to_host()
    assert np.isnan(c[3]).all() and not np.isnan(np.delete(c, 3, axis=0)).any()


def test_empty_inner_dimension_gives_bias(queue, variant):
    bias = np.arange(5, dtype=np.float32)
    c = gemm(pc.Tensor.empty(queue, (3, 0)), pc.Tensor.empty(queue, (0, 5)),
             bias=_up(queue, bias), _variant=variant)
    np.testing.assert_array_equal(c.to_host(), np.broadcast_to(bias, (3, 5)))


def test_default_path_small_and_large(queue, rng):
    """No forced variant: tiny products take the one-launch kernel, the rest the packed one."""
    for m, n, k in [(3, 5, 2), (64, 10, 128), (70, 300, 130)]:
        a, b = _operands(rng, m, n, k, True, False)
        _close(gemm(_up(queue, a), _up(queue, b), trans_a=True).to_host(),
               _op(a, True) @ _op(b, False))


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("shared_b", [False, True])
def test_batched_gemm(queue, rng, variant, trans_a, trans_b, shared_b):
    batch, m, n, k = 3, 13, 21, 17
    a, b = _operands(rng, m, n, k, trans_a, trans_b, batch=batch)
    if shared_b:
        b = b[0].copy()
    c = batched_gemm(_up(queue, a), _up(queue, b), trans_a=trans_a, trans_b=trans_b,
                     _variant=variant)
    assert c.shape == (batch, m, n)
    _close(c.to_host(), _op(a, trans_a) @ _op(b, trans_b))


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m", [8, 24])          # whole 8-row panels: A is read in place
def test_a_read_in_place_matches_numpy(queue, rng, variant, trans_b, m):
    a, b = _operands(rng, m, 37, 29, False, trans_b, batch=2)
    bias = rng.standard_normal(37, dtype=np.float32)
    c = batched_gemm(_up(queue, a), _up(queue, b), trans_b=trans_b, _variant=variant)
    _close(c.to_host(), a @ _op(b, trans_b))
    c = gemm(_up(queue, a[1]), _up(queue, b[1]), trans_b=trans_b, bias=_up(queue, bias),
             relu=True, _variant=variant)
    _close(c.to_host(), np.maximum(a[1] @ _op(b[1], trans_b) + bias, 0))


def test_reading_a_in_place_is_bit_identical_to_packing_it(queue, rng):
    a, b = _operands(rng, 64, 96, 200, False, True)
    runs = []
    for pack in (False, True):
        runs.append(gemm(_up(queue, a), _up(queue, b), trans_b=True, _pack_a=pack).to_host())
    np.testing.assert_array_equal(runs[0], runs[1])



@pytest.mark.parametrize("width", ["8", "16"])
def test_the_small_product_kernel_gives_the_packed_kernels_bits(queue, rng, width):
    """``gemm_direct`` (small products, read in place, VW columns a work-item) sums every
    element in k order from 0, as the packed kernels do: the same bits, whatever the
    transposes, edges, batch, accumulation (beta) and epilogue, for either vector width."""
    if width == "16" and not wide_kernel_ok(queue.device, "gemm", SOURCE):
        width = "8"
    for _ in range(60):
        m, n, k = (int(v) for v in rng.integers(1, 50, 3))
        batch = int(rng.choice([1, 1, 3]))
        trans_a, trans_b = (bool(v) for v in rng.integers(0, 2, 2))
        a, b = _operands(rng, m, n, k, trans_a, trans_b, batch=batch)
        c0 = rng.standard_normal((batch, m, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if batch == 1 and rng.integers(2) \
            else None
        relu = bool(batch == 1 and rng.integers(2))
        beta = float(rng.choice([0.0, 1.0, 0.5])) if batch == 1 else 0.0   # batched: no beta
        runs = []
        for variant in ("direct" + width, "cpu" + width):
            out = _up(queue, c0)
            if batch == 1:
                gemm(_up(queue, a[0]), _up(queue, b[0]), trans_a=trans_a, trans_b=trans_b,
                     bias=None if bias is None else _up(queue, bias), relu=relu, beta=beta,
                     out=out.reshape(m, n), _variant=variant)
            else:
                batched_gemm(_up(queue, a), _up(queue, b), trans_a=trans_a, trans_b=trans_b,
                             out=out, _variant=variant)
            runs.append(out.to_host())
        assert runs[0].tobytes() == runs[1].tobytes(), (m, n, k, batch, trans_a, trans_b)
        want = np.maximum if relu else (lambda v, _: v)
        _close(runs[0], want(_op(a, trans_a) @ _op(b, trans_b) + beta * c0
                             + (0 if bias is None else bias), 0))

def test_batched_gemm_out(queue, rng):
    a, b = _operands(rng, 16, 32, 8, False, False, batch=2)
    out = pc.Tensor.empty(queue, (2, 16, 32))
    assert batched_gemm(_up(queue, a), _up(queue, b), out=out) is out
    _close(out.to_host(), _op(a, False) @ _op(b, False))


def test_large_rectangular(queue, rng):
    a, b = _operands(rng, 300, 520, 1000, False, True)
    c = gemm(_up(queue, a), _up(queue, b), trans_b=True)
    _close(c.to_host(), _op(a, False) @ _op(b, True))


def test_variant_follows_device_type(queue):
    """GPUs get the tiled kernel; CPUs the float16 one where its probe passed, else float8."""
    if pc.runtime.is_gpu(queue.device):
        assert choose_variant(queue.device) == "tiled"
        return
    want = "cpu16" if wide_kernel_ok(queue.device, "gemm", SOURCE) else "cpu8"
    assert choose_variant(queue.device) == want      # the PoCL CPU device: never "tiled"


# -- errors --------------------------------------------------------------------------------
def test_inner_dimension_mismatch_names_op_and_shapes(queue):
    a = pc.Tensor.zeros(queue, (3, 4))
    b = pc.Tensor.zeros(queue, (5, 6))
    with pytest.raises(pc.ShapeError, match=r"gemm.*\(3, 4\).*\(5, 6\)"):
        gemm(a, b)
    with pytest.raises(pc.ShapeError, match="gemm"):
        gemm(a, b, trans_a=True)
    gemm(a, pc.Tensor.zeros(queue, (6, 4)), trans_b=True)          # fits


def test_bad_shapes_and_arguments(queue):
    a = pc.Tensor.zeros(queue, (3, 4))
    b = pc.Tensor.zeros(queue, (4, 5))
    with pytest.raises(pc.ShapeError, match="2-D"):
        gemm(pc.Tensor.zeros(queue, (2, 3, 4)), b)
    with pytest.raises(pc.ShapeError, match="bias"):
        gemm(a, b, bias=pc.Tensor.zeros(queue, (4,)))
    with pytest.raises(pc.ShapeError, match="out"):
        gemm(a, b, out=pc.Tensor.zeros(queue, (5, 3)))
    with pytest.raises(pc.ShapeError, match="beta"):
        gemm(a, b, beta=1.0)
    with pytest.raises(pc.ShapeError, match="batched_gemm.*batch"):
        batched_gemm(pc.Tensor.zeros(queue, (2, 3, 4)), pc.Tensor.zeros(queue, (3, 4, 5)))
    with pytest.raises(pc.ShapeError, match="batched_gemm"):
        batched_gemm(pc.Tensor.zeros(queue, (2, 3, 4)), pc.Tensor.zeros(queue, (2, 3, 5)))


def test_non_float32_is_dtype_error(queue):
    a = pc.Tensor.zeros(queue, (3, 4))
    labels = pc.Tensor.zeros(queue, (4, 5), dtype=np.int32)
    with pytest.raises(pc.DTypeError, match="gemm.*float32"):
        gemm(a, labels)
    with pytest.raises(pc.DTypeError):
        batched_gemm(pc.Tensor.zeros(queue, (1, 4, 5), dtype=np.int32), labels)


def test_different_queues_rejected(queues2):
    a = pc.Tensor.zeros(queues2[0], (3, 4))
    b = pc.Tensor.zeros(queues2[1], (4, 5))
    with pytest.raises(pc.DeviceError, match="gemm"):
        gemm(a, b)


# -- threads -------------------------------------------------------------------------------
def test_two_threads_two_subdevices(queues2):
    """Replica threads: each its own queue, sub-device and Kernel objects, all at once."""
    errors = []

    def worker(queue, seed):
        try:
            rng = np.random.default_rng(seed)
            a, b = _operands(rng, 19, 37, 23, False, True)
            bias = rng.standard_normal(37).astype(np.float32)
            ta, tb, tbias = _up(queue, a), _up(queue, b), _up(queue, bias)
            ref = np.maximum(_op(a, False) @ _op(b, True) + bias, 0)
            for i in range(200):
                c = gemm(ta, tb, trans_b=True, bias=tbias, relu=True)
                if i % 20 == 0 or i == 199:
                    _close(c.to_host(), ref)
            queue.finish()
        except Exception as exc:   # noqa: BLE001 - handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(q, i)) for i, q in enumerate(queues2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors



def test_the_probe_is_remembered_per_pocl_library(queue, monkeypatch):
    """An AVX2 and an AVX-512 build of PoCL (parcl.hostcpu's copies) compile float16 code
    differently: a probe's answer for one is not taken for the other."""
    from parcl.kernels import probe
    keys = []
    for library in ("/cache/pocl-avx2/libpocl.so", "/cache/pocl-avx512/libpocl.so"):
        monkeypatch.setattr(probe, "_probe_keys", {})
        monkeypatch.setattr(probe, "_compiler", lambda library=library: library)
        keys.append(probe._probe_key(queue.device, "gemm", SOURCE))
    assert keys[0] != keys[1]
    assert "pocl-avx2" in keys[0] and "pocl-avx512" in keys[1]


@pytest.mark.parametrize("trans_a, trans_b", TRANS)
def test_small_products_are_the_same_on_a_plain_pyopencl_queue(queue, rng, trans_a, trans_b):
    """A parcl queue works out a small product's launch once per signature and keeps it
    (``queue.choices``); a plain pyopencl queue works it out at every call. Both launch the
    same kernel: the results are equal bit for bit, at the first call and the repeated one."""
    plain = cl.CommandQueue(queue.context, queue.device)
    a, b = _operands(rng, 5, 7, 3, trans_a, trans_b)
    kept = [gemm(pc.Tensor.from_host(queue, a), pc.Tensor.from_host(queue, b), trans_a=trans_a,
                 trans_b=trans_b).to_host() for _ in range(2)]
    fresh = gemm(pc.Tensor.from_host(plain, a), pc.Tensor.from_host(plain, b), trans_a=trans_a,
                 trans_b=trans_b).to_host()
    np.testing.assert_array_equal(kept[0], kept[1])
    np.testing.assert_array_equal(kept[0], fresh)
    np.testing.assert_allclose(kept[0], _op(a, trans_a) @ _op(b, trans_b), rtol=1e-5, atol=1e-5)
    assert ("gemm", 5, 7, 3, 1, trans_a, trans_b) in queue.choices
    pc.pool.release_pool(plain)
