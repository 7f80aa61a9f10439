"""Device limits that bite only on a GPU: launch sizes, work-group sizes and local memory.

This machine has PoCL's CPU device only, so the GPU choices are checked as geometry (the
functions that choose, given the sizes) and run on a queue that says it is a GPU (``fake_gpu``):
the same kernels a GPU would launch, on the CPU, against torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl.kernels import attention as ak
from parcl.kernels import norm as nk
from parcl.kernels._cache import LAUNCH_MAX, trace_launches


@pytest.fixture
def fake_gpu(queue):
    """A queue on this device that chooses kernel variants as a GPU's would."""
    q = pc.new_queue(queue.device)
    q.gpu = True
    return q


def _launched(traced) -> set[str]:
    return {name for name, _, _ in traced}


def _group_sizes(monkeypatch, limit: int) -> dict[str, int]:
    """Every kernel allows work-groups of ``limit`` (as a GPU's CL_KERNEL_WORK_GROUP_SIZE may):
    the dict filled, as launches go, with each kernel's largest work-group."""
    from parcl.kernels import _cache

    monkeypatch.setattr(_cache, "kernel_limits", lambda *a: _cache.KernelLimits(limit, 0))
    groups: dict[str, int] = {}
    enqueue = _cache._enqueue

    def spy(queue, kernel, gsize, lsize, *rest):
        if lsize is not None:
            name = kernel.function_name
            groups[name] = max(groups.get(name, 0), int(np.prod(lsize)))
        return enqueue(queue, kernel, gsize, lsize, *rest)

    monkeypatch.setattr(_cache, "_enqueue", spy)
    return groups


def test_a_gpu_normalises_rows_with_work_groups_only_while_the_launch_stays_under_2_31():
    """A work-group of WG per row: rows * WG work-items, past 2**31 at 2**24 rows (a
    (2**24, 64) float32 input is 4 GiB), where NVIDIA's OpenCL hands out wrong ids."""
    assert nk.use_workgroups(LAUNCH_MAX // nk.WG - 1)
    assert not nk.use_workgroups(LAUNCH_MAX // nk.WG)
    assert not nk.use_workgroups(2**24)


def test_layer_norm_on_a_gpu_past_the_launch_limit_takes_a_row_per_work_item_as_pytorch(
        fake_gpu, rng, monkeypatch):
    """The limit lowered to 8 rows' groups: 8 rows take a work-group each, 9 rows a work-item
    each, and both are torch's layer norm, forward and backward."""
    monkeypatch.setattr(nk, "LAUNCH_MAX", 8 * nk.WG + 1)
    for rows, kernel in ((8, "ln_fwd_wg"), (9, "ln_fwd_row")):
        x = rng.standard_normal((rows, 5)).astype(np.float32)
        w = rng.standard_normal(5).astype(np.float32)
        b = rng.standard_normal(5).astype(np.float32)
        tx, tw, tb = (tp.tensor(pc.Tensor.from_host(fake_gpu, a), True) for a in (x, w, b))
        with trace_launches() as traced:
            y = tp.layer_norm(tx, (5,), tw, tb)
            tp.sum(y * y).backward()
        assert kernel in _launched(traced)
        xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
        yt = torch.nn.functional.layer_norm(xt, (5,), wt, bt)
        (yt * yt).sum().backward()
        np.testing.assert_allclose(y.value.to_host(), yt.detach().numpy(), atol=1e-5)
        for got, want in ((tx, xt), (tw, wt), (tb, bt)):
            np.testing.assert_allclose(got.grad.to_host(), want.grad.numpy(), atol=1e-4)


def test_attention_on_a_gpu_past_the_launch_limit_takes_a_row_per_work_item_as_pytorch(
        fake_gpu, rng, monkeypatch):
    """The attention softmax's work-group per row: rows * GPU_GROUP work-items, past 2**31 at
    2**25 score rows (short key rows); with the limit lowered to 12 rows' groups, 12 rows take
    a work-group each and 24 rows a work-item each, both torch's attention."""
    assert not ak._variant(fake_gpu, None, LAUNCH_MAX // ak.GPU_GROUP) == "groups"
    assert ak._variant(fake_gpu, None, LAUNCH_MAX // ak.GPU_GROUP - 1) == "groups"
    monkeypatch.setattr(ak, "LAUNCH_MAX", 12 * ak.GPU_GROUP + 1)
    for batch, kernel in ((1, "attn_softmax_fwd_wg"), (2, "attn_softmax_fwd")):
        q, k, v = (rng.standard_normal((batch, 2, 6, 4)).astype(np.float32) for _ in range(3))
        tq, tk, tv = (tp.tensor(pc.Tensor.from_host(fake_gpu, a), True) for a in (q, k, v))
        with trace_launches() as traced:
            out = tp.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            tp.sum(out * out).backward()
        assert kernel in _launched(traced)
        qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
        ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        (ot * ot).sum().backward()
        np.testing.assert_allclose(out.value.to_host(), ot.detach().numpy(), atol=1e-5)
        for got, want in ((tq, qt), (tk, kt), (tv, vt)):
            np.testing.assert_allclose(got.grad.to_host(), want.grad.numpy(), atol=1e-4)


def test_a_tensor_within_a_work_group_of_2_31_elements_is_refused_before_a_launch_wraps(queue):
    """A launch over n elements is rounded up to whole work-groups (elementwise: 128): for a
    (2**31 - 1,) tensor, 2**31 + 127 work-items, whose ids past 2**31 - 1 wrap to -2**31 in
    the kernels' int index and pass ``i < n``, writing 8 GiB before the tensor. Such a tensor
    is refused; the largest allowed one leaves every rounded launch under 2**31."""
    from parcl.tensor import MAX_ELEMENTS
    from parcl.kernels._cache import round_up
    for size in (2**31 - 1, 2**31 - 128, MAX_ELEMENTS + 1):
        with pytest.raises(pc.ShapeError, match=r"2\*\*31 - 1"):
            pc.Tensor.empty(queue, (size,))
    assert round_up(MAX_ELEMENTS, 256) + 16 * 256 < LAUNCH_MAX


def test_a_sort_fits_local_memory_only_beside_what_the_kernel_takes_itself(queue, monkeypatch):
    """The local sort of a row padded to 4096 needs 32 KiB of keys and indices: on a GPU with
    32 KiB of local memory whose implementation keeps 16 bytes of it for the kernel, the
    launch fails (CL_OUT_OF_RESOURCES), so such a row goes to the merge sort; 2048 fits."""
    from types import SimpleNamespace

    from parcl.kernels import sorting
    from parcl.kernels._cache import KernelLimits, kernel_limits

    limits = kernel_limits(queue, sorting.SOURCE, "sort_local")
    assert limits.work_group >= 1 and limits.local_bytes >= 0      # the device's own answer
    gpu = SimpleNamespace(device=SimpleNamespace(local_mem_size=32 * 1024))
    monkeypatch.setattr(sorting, "on_gpu", lambda q: True)
    monkeypatch.setattr(sorting, "kernel_limits", lambda q, source, name: KernelLimits(256, 16))
    assert not sorting.fits_local(gpu, 4096)
    assert sorting.choose_variant(gpu, 3000) == "merge"
    assert sorting.fits_local(gpu, 2048) and sorting.choose_variant(gpu, 2048) == "local"


def test_losses_batch_norm_sort_and_attention_take_the_work_group_the_kernel_allows_as_pytorch(
        fake_gpu, rng, monkeypatch):
    """A GPU whose limit for a register-heavy kernel (CL_KERNEL_WORK_GROUP_SIZE) is below the
    256 these kernels asked for refused every launch (INVALID_WORK_GROUP_SIZE); kernels whose
    group size is free take the largest power of two the device allows. Here each allows 32,
    and every result is torch's."""
    groups = _group_sizes(monkeypatch, 32)
    def up(a):
        return tp.tensor(pc.Tensor.from_host(fake_gpu, np.asarray(a, np.float32)), True)

    def T(a):
        return torch.tensor(np.asarray(a, np.float32), requires_grad=True)

    F = torch.nn.functional

    x, p = rng.standard_normal((70, 5)), rng.random((70, 5))
    labels = rng.integers(0, 5, 70)
    px, pp, xt, pt = up(x), up(p), T(x), T(p)
    got = (tp.cross_entropy(px, pc.Tensor.from_host(fake_gpu, labels))
           + tp.mse_loss(px, pp) + tp.cross_entropy(px, tp.softmax(pp, -1))
           + tp.binary_cross_entropy_with_logits(px, pp))
    want = (F.cross_entropy(xt, torch.tensor(labels)) + F.mse_loss(xt, pt)
            + F.cross_entropy(xt, torch.softmax(pt, -1))
            + F.binary_cross_entropy_with_logits(xt, pt))
    got.backward()
    want.backward()
    np.testing.assert_allclose(got.value.to_host(), want.item(), rtol=1e-5)
    np.testing.assert_allclose(px.grad.to_host(), xt.grad.numpy(), atol=1e-6)
    np.testing.assert_allclose(pp.grad.to_host(), pt.grad.numpy(), atol=1e-6)

    b = rng.standard_normal((4, 3, 5, 5))
    w0, b0 = rng.standard_normal(3), rng.standard_normal(3)
    pb, w, bias, bt, wt, biast = up(b), up(w0), up(b0), T(b), T(w0), T(b0)
    y = tp.batch_norm(pb, w, bias, None, None, True)
    yt = F.batch_norm(bt, None, None, wt, biast, training=True)
    tp.sum(y * y * y).backward()
    (yt * yt * yt).sum().backward()
    np.testing.assert_allclose(y.value.to_host(), yt.detach().numpy(), atol=1e-5)
    for got_grad, want_grad in ((pb, bt), (w, wt), (bias, biast)):
        np.testing.assert_allclose(got_grad.grad.to_host(), want_grad.grad.numpy(), atol=1e-3)

    s = rng.standard_normal((3, 300)).astype(np.float32)
    values, indices = tp.sort(pc.Tensor.from_host(fake_gpu, s), 1)
    want_values, want_indices = torch.sort(torch.tensor(s), dim=1, stable=True)
    np.testing.assert_array_equal(values.to_host(), want_values.numpy())
    np.testing.assert_array_equal(indices.to_host(), want_indices.numpy())

    q, k, v = (rng.standard_normal((2, 2, 6, 4)) for _ in range(3))
    pq, pk, pv, qt, kt, vt = up(q), up(k), up(v), T(q), T(k), T(v)
    out = tp.scaled_dot_product_attention(pq, pk, pv, is_causal=True)
    ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    tp.sum(out * out).backward()
    (ot * ot).sum().backward()
    np.testing.assert_allclose(out.value.to_host(), ot.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(pq.grad.to_host(), qt.grad.numpy(), atol=1e-4)

    free = {"ce_sum_i64", "mse_fwd", "soft_ce_mean", "bce_fwd", "bn_stats", "bn_grad_sums",
            "sort_local", "attn_softmax_fwd_wg", "attn_softmax_bwd_wg"}
    assert {name: groups.get(name) for name in free} == dict.fromkeys(free, 32)


def test_ops_over_a_slice_with_no_elements_launch_nothing_where_the_device_refuses_it(
        queue, rng, monkeypatch):
    """An op over x[2:2] launches kernels of no work-items; OpenCL before 2.1 (and some
    drivers since) refuse such a launch (INVALID_GLOBAL_WORK_SIZE) where PoCL and 2.1 run
    nothing, so parcl raised where PyTorch gives the empty result. On a device that refuses
    them, the ops (eager, and a captured step's replays) still give PyTorch's results."""
    import pyopencl as cl

    from parcl.kernels import _cache

    enqueue, refused = _cache._enqueue, []

    def refusing(q, kernel, gsize, *rest):
        if not all(gsize):
            refused.append(kernel.function_name)
            raise cl.LogicError(cl._cl._ErrorRecord(
                "clEnqueueNDRangeKernel failed: INVALID_GLOBAL_WORK_SIZE",
                cl.status_code.INVALID_GLOBAL_WORK_SIZE, "clEnqueueNDRangeKernel"))
        return enqueue(q, kernel, gsize, *rest)

    monkeypatch.setattr(_cache, "_enqueue", refusing)
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", refusing)     # a replay's launches
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = tp.tensor(pc.Tensor.from_host(queue, np.ones(4, np.float32)), True)

    def step(t):
        e = tp.exp(t[2:2]) * 2.0
        y = tp.layer_norm(t[2:2], (4,), w)
        loss = tp.sum(e) + tp.sum(y) + tp.sum(t)
        loss.backward()
        return loss

    xt = torch.tensor(x)
    want = (torch.exp(xt[2:2]) * 2).sum() + torch.nn.functional.layer_norm(
        xt[2:2], (4,), torch.ones(4)).sum() + xt.sum()
    captured = tp.capture(step, queue)
    for _ in range(3):                  # eager and recorded, then replayed twice
        w.grad = None
        got = captured(pc.Tensor.from_host(queue, x))
        np.testing.assert_allclose(got.to_host(), want.item(), rtol=1e-5)
        np.testing.assert_array_equal(w.grad.to_host(), np.zeros(4, np.float32))
    assert "exp_unary" in refused
    assert tp.argmax(tp.tensor(pc.Tensor.from_host(queue, x))[2:2], 1).shape == (0,)


def test_batch_norm_on_a_gpu_past_the_launch_limit_takes_a_work_item_per_channel_as_pytorch(
        fake_gpu, rng, monkeypatch):
    """Batch norm's per-channel sums on a GPU launch a work-group of 256 per channel: past
    2**31 work-items at 2**23 channels. With the limit lowered to 3 channels' groups, 3
    channels take a work-group each and 4 a work-item each, both torch's batch norm."""
    from parcl.kernels import batchnorm as bk
    assert not bk._groups_per_channel(fake_gpu, 2**23)
    assert bk._groups_per_channel(fake_gpu, 2**23 - 1)
    monkeypatch.setattr(bk, "LAUNCH_MAX", 3 * 256 + 1)
    for c, kernel in ((3, "bn_stats"), (4, "bn_stats_lanes")):
        x, w, b = rng.standard_normal((5, c, 3)), rng.standard_normal(c), rng.standard_normal(c)
        tx, tw, tb = (tp.tensor(pc.Tensor.from_host(fake_gpu, a.astype(np.float32)), True)
                      for a in (x, w, b))
        with trace_launches() as traced:
            y = tp.batch_norm(tx, tw, tb, None, None, True)
            tp.sum(y * y * y).backward()
        assert kernel in _launched(traced)
        xt, wt, bt = (torch.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b))
        yt = torch.nn.functional.batch_norm(xt, None, None, wt, bt, training=True)
        (yt * yt * yt).sum().backward()
        np.testing.assert_allclose(y.value.to_host(), yt.detach().numpy(), atol=1e-5)
        for got, want in ((tx, xt), (tw, wt), (tb, bt)):
            np.testing.assert_allclose(got.grad.to_host(), want.grad.numpy(), rtol=1e-4,
                                       atol=1e-4)


def test_norms_and_transposes_take_their_one_item_kernels_where_a_gpu_allows_smaller_groups(
        fake_gpu, rng, monkeypatch):
    """The GPU's layer norm (groups of 128) and tiled transpose (16 x 16) have their group
    size compiled in; a device that allows those kernels fewer work-items refused every
    launch (INVALID_WORK_GROUP_SIZE). Where it allows 64, they run their other kernels (a
    work-item per row), torch's results."""
    from parcl.kernels import _cache, layout

    def limits(*kernel):
        return _cache.KernelLimits(64, 0)

    monkeypatch.setattr(nk, "kernel_limits", limits)
    monkeypatch.setattr(layout, "kernel_limits", limits)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal(5).astype(np.float32)
    tx, tw = (tp.tensor(pc.Tensor.from_host(fake_gpu, a), True) for a in (x, w))
    with trace_launches() as traced:
        y = tp.layer_norm(tx, (5,), tw)
        tp.sum(y * y).backward()
        t = layout.transpose(pc.Tensor.from_host(fake_gpu, x), (1, 0))
    assert {"ln_fwd_row", "ln_bwd_row", "transpose_rows"} <= _launched(traced)
    assert not {"ln_fwd_wg", "ln_bwd_wg", "transpose_tiled"} & _launched(traced)
    xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
    yt = torch.nn.functional.layer_norm(xt, (5,), wt)
    (yt * yt).sum().backward()
    np.testing.assert_allclose(y.value.to_host(), yt.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(tx.grad.to_host(), xt.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(tw.grad.to_host(), wt.grad.numpy(), atol=1e-4)
    np.testing.assert_array_equal(t.to_host(), x.T)


def test_a_kernels_limits_are_asked_once_per_queue_even_when_its_plans_are_full(queue):
    """Asked at every launch of a loss or batch norm: kept past PLANS_MAX (a dynamic-shape
    model fills the plans), not asked of a new kernel object every time."""
    from parcl.kernels import _cache, softmax
    q = pc.new_queue(queue.device)
    q.choices.update({("filler", i): None for i in range(_cache.PLANS_MAX)})
    first = _cache.kernel_limits(q, softmax.SOURCE, "mse_fwd")
    assert _cache.kernel_limits(q, softmax.SOURCE, "mse_fwd") is first
    assert first.work_group >= 64


def test_reductions_and_grad_norms_loop_where_a_gpu_allows_their_trees_fewer_work_items(
        fake_gpu, rng, monkeypatch):
    """A GPU reduces rows of 256 or more with trees of 256 work-items compiled in (reduction
    and the fused gradient norm); a device allowing those kernels fewer refused every such sum
    (INVALID_WORK_GROUP_SIZE). Where it allows 128, both loop in one work-item per output
    (as a GPU does for short rows): numpy's sums, and the fused norm is still bit for bit
    the norm composed from reduction's sums."""
    import math

    from parcl.kernels import _cache, gradnorm, reduction
    from parcl.kernels import elementwise as ew

    def limits(*kernel):
        return _cache.KernelLimits(128, 0)

    monkeypatch.setattr(reduction, "kernel_limits", limits)
    monkeypatch.setattr(gradnorm, "kernel_limits", limits)
    x = rng.standard_normal((3, 40000)).astype(np.float32)
    tx = pc.Tensor.from_host(fake_gpu, x)
    with trace_launches() as traced:
        total, rows, biggest = (reduction.sum(tx), reduction.sum(tx, 1),
                                reduction.max(tx, 1))
        norm = gradnorm.total_norm([tx, tx.reshape(-1)[:1000]], 2.0, scaled=False)
    assert not any(name.endswith("_wg") for name in _launched(traced))
    np.testing.assert_allclose(total.to_host(), x.astype(np.float64).sum(), rtol=1e-5)
    np.testing.assert_allclose(rows.to_host(), x.astype(np.float64).sum(1), rtol=1e-4)
    np.testing.assert_array_equal(biggest.to_host(), x.max(1))
    head = pc.Tensor.from_host(fake_gpu, x.reshape(-1)[:1000])
    parts = [reduction.sum(ew.unary("square", t)) for t in (tx, head)]
    want = ew.unary("sqrt", ew.binary("add", *parts))
    assert norm.to_host().tobytes() == want.to_host().tobytes()
    np.testing.assert_allclose(norm.item(), math.sqrt((x.astype(np.float64) ** 2).sum()
                                                      + (x.reshape(-1)[:1000] ** 2).sum()),
                               rtol=1e-5)


def test_matmuls_take_the_packed_kernels_where_a_gpu_allows_the_tiles_fewer_work_items(
        fake_gpu, rng, monkeypatch):
    """The GPU's GEMM requires groups of 16 x 16 (reqd_work_group_size); a device allowing
    gemm_tiled fewer refused every matmul (INVALID_WORK_GROUP_SIZE). Where it allows 128,
    products run the packed kernels: numpy's products, plain, transposed and batched, and
    the gradients of a linear layer torch's."""
    from parcl.kernels import _cache, gemm

    def limits(*kernel):
        return _cache.KernelLimits(128, 0)

    monkeypatch.setattr(gemm, "kernel_limits", limits)
    fake_gpu.choices["gemm"] = "tiled"                  # the GPU's variant, as chosen there
    a, b = rng.standard_normal((70, 33)), rng.standard_normal((33, 45))
    x, w = rng.standard_normal((4, 70, 33)), rng.standard_normal((45, 33))
    ta, tb = (pc.Tensor.from_host(fake_gpu, v.astype(np.float32)) for v in (a, b))
    px, pw = (tp.tensor(pc.Tensor.from_host(fake_gpu, v.astype(np.float32)), True)
              for v in (x, w))
    with trace_launches() as traced:
        ab = gemm.gemm(ta, tb)
        abt = gemm.gemm(tb, ta, trans_a=True, trans_b=True)
        y = tp.matmul(px, tp.permute(pw, (1, 0)))
        tp.sum(y * y).backward()
    assert "gemm_cpu" in _launched(traced) and "gemm_tiled" not in _launched(traced)
    np.testing.assert_allclose(ab.to_host(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(abt.to_host(), (a @ b).T, rtol=1e-4, atol=1e-4)
    xt, wt = (torch.tensor(v.astype(np.float32), requires_grad=True) for v in (x, w))
    yt = xt @ wt.T
    (yt * yt).sum().backward()
    np.testing.assert_allclose(y.value.to_host(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(px.grad.to_host(), xt.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(pw.grad.to_host(), wt.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_ctc_loss_takes_the_work_group_the_device_allows_its_recursions_as_pytorch(
        queue, rng, monkeypatch):
    """The alpha and beta recursions walk a sample's states in one work-group of any size;
    they asked for 64 whatever the device, so a GPU allowing those kernels fewer refused
    every tp.ctc_loss (INVALID_WORK_GROUP_SIZE) where PyTorch gives the loss. Here each
    allows 16, fewer than a 12-label target's 25 states: groups of 16, torch's loss and
    gradient."""
    import torch.nn.functional as F

    groups = _group_sizes(monkeypatch, 16)
    t, n, c, s = 30, 3, 6, 12
    logits = rng.standard_normal((t, n, c)).astype(np.float32)
    targets = rng.integers(1, c, (n, s))
    ilen, tlen = np.array([t, t - 3, 20]), np.array([s, 7, 5])
    node = tp.tensor(pc.Tensor.from_host(queue, logits), True)
    with tp.Tape() as tape:
        loss = tp.ctc_loss(tp.log_softmax(node, axis=-1), pc.Tensor.from_host(queue, targets),
                           pc.Tensor.from_host(queue, ilen), pc.Tensor.from_host(queue, tlen))
    tape.backward(loss)
    tx = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    want = F.ctc_loss(tx.log_softmax(-1), torch.tensor(targets), torch.tensor(ilen),
                      torch.tensor(tlen))
    want.backward()
    assert groups["ctc_alpha_i64"] == groups["ctc_beta_i64"] == 16
    np.testing.assert_allclose(loss.to_host(), want.item(), rtol=2e-5)
    np.testing.assert_allclose(node.grad.to_host(), tx.grad.numpy(), rtol=2e-4, atol=1e-5)


def test_convolutions_and_pools_take_the_work_group_the_device_allows_their_kernels_as_pytorch(
        fake_gpu, rng, monkeypatch):
    """Convolutions' and pools' GPU grids asked for groups of 128 (conv2d's im2col, col2im
    and swap01, the depthwise kernels, conv3d's vol2col and col2vol, the 2-D pools) or 256
    (max_pool3d's join_positions, global average pooling's backward) whatever the device
    allows the kernel, which a GPU allowing it fewer refused (INVALID_WORK_GROUP_SIZE) where
    PyTorch gives a result. Here each kernel allows 32: groups of 32, torch's values and
    gradients."""
    groups = _group_sizes(monkeypatch, 32)
    F = torch.nn.functional
    x2, w2, wd = (rng.standard_normal(s).astype(np.float32)
                  for s in ((2, 3, 9, 10), (4, 3, 3, 3), (3, 1, 3, 3)))
    x3, w3 = (rng.standard_normal(s).astype(np.float32) for s in ((2, 2, 5, 6, 7),
                                                                 (3, 2, 3, 3, 3)))
    ops = [
        (lambda x, w: tp.conv2d(x, w, padding=1), lambda x, w: F.conv2d(x, w, padding=1),
         (x2, w2)),
        (lambda x, w: tp.conv2d(x, w, padding=1, groups=3),
         lambda x, w: F.conv2d(x, w, padding=1, groups=3), (x2, wd)),
        (lambda x, w: tp.conv3d(x, w, padding=1), lambda x, w: F.conv3d(x, w, padding=1),
         (x3, w3)),
        (lambda x: tp.max_pool2d(x, 3, 2, 1), lambda x: F.max_pool2d(x, 3, 2, 1), (x2,)),
        (lambda x: tp.adaptive_avg_pool2d(x, (4, 3)), lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
         (x2,)),
        (lambda x: tp.adaptive_avg_pool2d(x, 1), lambda x: F.adaptive_avg_pool2d(x, 1), (x2,)),
    ]
    for op, torch_op, inputs in ops:
        leaves = [tp.tensor(pc.Tensor.from_host(fake_gpu, a), True) for a in inputs]
        y = op(*leaves)
        tp.sum(y * y).backward()
        torch_leaves = [torch.tensor(a, requires_grad=True) for a in inputs]
        yt = torch_op(*torch_leaves)
        (yt * yt).sum().backward()
        np.testing.assert_allclose(y.value.to_host(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
        for got, want in zip(leaves, torch_leaves):
            np.testing.assert_allclose(got.grad.to_host(), want.grad.numpy(), rtol=1e-4,
                                       atol=1e-4)
    values, indices = tp.max_pool3d(pc.Tensor.from_host(fake_gpu, x3), 2, return_indices=True)
    want_values, want_indices = F.max_pool3d(torch.tensor(x3), 2, return_indices=True)
    np.testing.assert_array_equal(values.to_host(), want_values.numpy())
    np.testing.assert_array_equal(indices.to_host(), want_indices.numpy())

    fixed = {"im2col", "col2im", "swap01", "dw_forward", "dw_grad_input", "vol2col", "col2vol",
             "max_pool_fwd", "adaptive_avg_fwd", "adaptive_avg_bwd", "global_avg_bwd",
             "join_positions"}
    assert {name: groups.get(name) for name in fixed} == dict.fromkeys(fixed, 32)
