"""Long sums in float32 (a GEMM's K, a weight gradient's sum over every row of a batch) stay
near float32 accuracy against float64 numpy, as PyTorch's blocked kernels do.

A running float32 sum of n products drifts by ~sqrt(n) roundings of the whole sum: at K = 262144
a GEMM came out 1.3e-5 of its largest element off (torch: ~1e-6), and a Linear's weight
gradient over 2^18 rows of positive data 3.2e-5. The kernels now sum in blocks (``KBLOCK`` in
``parcl/kernels/cl/gemm.cl``), each block in a fresh accumulator. Errors here are the largest
absolute error over the largest magnitude of the float64 answer.
"""

from __future__ import annotations

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp
from parcl.kernels.gemm import gemm


def _error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("variant", ["cpu16", "cpu8", "tiled"])
@pytest.mark.parametrize("k, bound", [(65536, 1.5e-6), (262144, 3e-6)])
def test_a_gemm_over_a_long_k_stays_within_a_few_float32_roundings(queue, variant, k, bound):
    # old (running sums): 5.8e-6 at K = 65536, 1.3e-5 at 262144; now 4.4e-7 and 1.1e-6
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, k), dtype=np.float32)
    b = rng.standard_normal((k, 32), dtype=np.float32)
    got = gemm(pc.Tensor.from_host(queue, a), pc.Tensor.from_host(queue, b),
               _variant=variant).to_host()
    assert _error(got, a.astype(np.float64) @ b) < bound


@pytest.mark.parametrize("rows", [1 << 16, 1 << 18])
def test_a_linears_weight_gradient_over_a_quarter_million_rows_is_float32_accurate(queue, rows):
    # x^T g over positive data, the sum every term of which adds: old 1.0e-5 at 2^16 rows and
    # 3.2e-5 at 2^18; now 8.0e-7 and 1.4e-6
    rng = np.random.default_rng(0)
    x = rng.random((rows, 64), dtype=np.float32)
    g = rng.random((rows, 32), dtype=np.float32)
    w = tp.tensor(pc.Tensor.from_host(queue, np.zeros((32, 64), np.float32)), True)
    with tp.Tape() as tape:
        out = tp.linear(tp.tensor(pc.Tensor.from_host(queue, x)), w)
    tape.backward(out, pc.Tensor.from_host(queue, g))
    assert _error(w.grad.to_host(), g.T.astype(np.float64) @ x) < 3e-6


@pytest.mark.parametrize("variant", ["cpu16", "cpu8", "direct16", "direct8", "tiled"])
def test_a_gemm_is_the_sum_of_its_256_long_k_blocks_products_in_order(queue, variant):
    # each block of 256 k steps summed on its own, then added to the total: bit for bit the
    # float32 sum of the three blocks' own products (old: one running sum, other bits)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((12, 549), dtype=np.float32)
    b = rng.standard_normal((549, 20), dtype=np.float32)
    parts = [gemm(pc.Tensor.from_host(queue, np.ascontiguousarray(a[:, k:k + 256])),
                  pc.Tensor.from_host(queue, b[k:k + 256]), _variant=variant).to_host()
             for k in (0, 256, 512)]
    got = gemm(pc.Tensor.from_host(queue, a), pc.Tensor.from_host(queue, b),
               _variant=variant).to_host()
    np.testing.assert_array_equal(got, parts[0] + parts[1] + parts[2])


@pytest.mark.parametrize("name, bound", [("rms_norm", 1.5e-6), ("layer_norm", 6e-7)])
def test_a_norms_weight_gradient_over_a_quarter_million_rows_is_float32_accurate(queue, name,
                                                                                  bound):
    # the column sums' 16-row blocks were added in one running sum of rows / 16 terms: old
    # 5.3e-6 (rms_norm) and 1.2e-6 (layer_norm) of the largest element; now 5.6e-7 and 2.6e-7
    rng = np.random.default_rng(0)
    rows, d = 1 << 18, 64
    x = rng.standard_normal((rows, d), dtype=np.float32) + 1
    g = rng.random((rows, d), dtype=np.float32)
    w = tp.tensor(pc.Tensor.from_host(queue, np.ones(d, np.float32)), True)
    with tp.Tape() as tape:
        out = getattr(tp, name)(tp.tensor(pc.Tensor.from_host(queue, x)), (d,), w)
    tape.backward(out, pc.Tensor.from_host(queue, g))
    x64 = x.astype(np.float64)
    if name == "rms_norm":      # torch's default eps: float32's
        xhat = x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + np.finfo(np.float32).eps)
    else:
        xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    assert _error(w.grad.to_host(), (g * xhat).sum(0)) < bound


def test_a_column_sum_over_a_million_rows_is_float32_accurate(queue):
    # a work-item's running sum over a chunk of 2048 rows: old 1.0e-6 of the largest element,
    # now 1.5e-7 (torch float32: 9.9e-8)
    from parcl.kernels import reduction
    x = np.random.default_rng(0).random((1 << 20, 8), dtype=np.float32)
    got = reduction.sum(pc.Tensor.from_host(queue, x), axis=0).to_host()
    assert _error(got, x.astype(np.float64).sum(0)) < 4e-7


def test_a_broadcast_adds_bias_gradient_over_a_million_rows_is_float32_accurate(queue):
    # sum_to_shape, the same column sums: old 1.0e-6, now 1.5e-7
    g = np.random.default_rng(0).random((1 << 20, 8), dtype=np.float32)
    b = tp.tensor(pc.Tensor.from_host(queue, np.zeros(8, np.float32)), True)
    with tp.Tape() as tape:
        out = tp.tensor(pc.Tensor.from_host(queue, np.zeros((1 << 20, 8), np.float32))) + b
    tape.backward(out, pc.Tensor.from_host(queue, g))
    assert _error(b.grad.to_host(), g.astype(np.float64).sum(0)) < 4e-7
