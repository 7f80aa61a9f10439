"""Launches past a GPU's grid: at most 65535 work-groups along NDRange dimensions 1 and 2.

CUDA grids (and NVIDIA's OpenCL on them) allow that many groups in dimensions 1 and 2, where
parcl's kernels put rows, batches and taps. A launch over it is enqueued in pieces with a
global work offset (``parcl.kernels._grid``). This machine has PoCL's CPU device only, so the
limit is set to 3 groups on a queue that chooses kernels as a GPU's (``small_grid``), whose
launches over 3 groups are refused as such a GPU refuses them; each op is then the same bits
as one launch on a queue without the limit, and torch's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyopencl as cl
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from parcl import runtime
from parcl.kernels import _cache, gemm, layout, sorting
from parcl.kernels._grid import grid_pieces

GROUPS = 3          # the small grid's limit along dimensions 1 and 2


@dataclass
class SmallGrid:
    queue: pc.runtime.Queue
    split: set = field(default_factory=set)      # kernels launched in pieces


def _groups(gsize, lsize) -> list[int]:
    """Work-groups along dimensions 1 and 2 (a group one work-item wide where no ``lsize``:
    the driver may choose that)."""
    return [-(-gsize[d] // (1 if lsize is None else lsize[d])) for d in range(1, len(gsize))]


@pytest.fixture
def small_grid(queue, monkeypatch) -> SmallGrid:
    """A queue that chooses kernels as a GPU's and allows GROUPS work-groups along dimensions
    1 and 2; a launch on it past them raises, as the GPU refuses it."""
    q = pc.new_queue(queue.device)
    q.gpu, q.groups_max = True, GROUPS
    grid = SmallGrid(q)

    def refusing(enqueue):
        def launch(on, kernel, gsize, lsize, offset=None, *rest):
            if on is q:
                if max(_groups(gsize, lsize), default=0) > GROUPS:
                    raise AssertionError(f"{kernel.function_name}: {gsize} in groups of "
                                         f"{lsize} is past a grid of {GROUPS} groups")
                if offset is not None:
                    grid.split.add(kernel.function_name)
            return enqueue(on, kernel, gsize, lsize, offset, *rest)
        return launch

    monkeypatch.setattr(_cache, "_enqueue", refusing(_cache._enqueue))
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", refusing(cl.enqueue_nd_range_kernel))
    return grid


@pytest.fixture
def whole(queue):
    """A queue that chooses kernels as a GPU's, with no grid limit (the CPU device's)."""
    q = pc.new_queue(queue.device)
    q.gpu = True
    return q


X = {name: np.random.default_rng(7).standard_normal(shape).astype(np.float32)
     for name, shape in {"rows": (40, 9), "a": (300, 33), "b": (33, 45), "ba": (5, 70, 33),
                         "bb": (5, 33, 45), "vol": (2, 2, 5, 6, 7), "taps": (3, 2, 3, 3, 3),
                         "image": (2, 3, 40, 9), "bn": (4, 3, 20, 5),
                         "table": (50, 6)}.items()}
INDICES = np.random.default_rng(8).integers(0, 50, (4, 9))
LEVELS = np.array([0.1, 0.3, 0.5, 0.8, 0.95], np.float32)


def _leaves(q, *names):
    return [tp.tensor(pc.Tensor.from_host(q, X[n]), True) for n in names]


def _torch_leaves(*names):
    return [torch.tensor(X[n], requires_grad=True) for n in names]


def _squared_sum_backward(out, leaves) -> list[np.ndarray]:
    """``out``'s value and the gradients of ``sum(out ** 2)`` w.r.t. ``leaves`` (parcl or
    torch)."""
    if isinstance(out, torch.Tensor):
        (out * out).sum().backward()
        return [out.detach().numpy(), *(t.grad.numpy() for t in leaves)]
    tp.sum(out * out).backward()
    return [out.value.to_host(), *(t.grad.to_host() for t in leaves)]


def _argsort(q):
    x = pc.Tensor.from_host(q, X["rows"])
    return [sorting.argsort(x, 1, _variant="merge").to_host()]


def _quantile(q):
    x, = _leaves(q, "rows")
    return _squared_sum_backward(tp.quantile(x, pc.Tensor.from_host(q, LEVELS), dim=1), [x])


def _torch_quantile():
    x, = _torch_leaves("rows")
    return _squared_sum_backward(torch.quantile(x, torch.tensor(LEVELS), dim=1), [x])


def _gemm(q):
    a, b = (pc.Tensor.from_host(q, X[n]) for n in ("a", "b"))
    ba, bb = (pc.Tensor.from_host(q, X[n]) for n in ("ba", "bb"))
    return [gemm.gemm(a, b, _variant="tiled").to_host(),
            gemm.batched_gemm(ba, bb, _variant="tiled").to_host()]


def _transpose(q):
    return [layout.transpose(pc.Tensor.from_host(q, X["ba"]), (0, 2, 1)).to_host()]


def _conv3d(q):
    x, w = _leaves(q, "vol", "taps")
    return _squared_sum_backward(tp.conv3d(x, w, padding=1), [x, w])


def _torch_conv3d():
    x, w = _torch_leaves("vol", "taps")
    return _squared_sum_backward(torch.nn.functional.conv3d(x, w, padding=1), [x, w])


def _adaptive_pool(q):
    x, = _leaves(q, "image")
    return _squared_sum_backward(tp.adaptive_avg_pool2d(x, (7, 4)), [x])


def _torch_adaptive_pool():
    x, = _torch_leaves("image")
    return _squared_sum_backward(torch.nn.functional.adaptive_avg_pool2d(x, (7, 4)), [x])


def _batch_norm(q):
    x, = _leaves(q, "bn")
    w, b = (tp.tensor(pc.Tensor.from_host(q, a), True) for a in (np.full(3, 1.5, np.float32),
                                                                 np.full(3, 0.5, np.float32)))
    return _squared_sum_backward(tp.batch_norm(x, w, b, None, None, True), [x, w, b])


def _torch_batch_norm():
    x, = _torch_leaves("bn")
    w, b = (torch.full((3,), v, requires_grad=True) for v in (1.5, 0.5))
    return _squared_sum_backward(torch.nn.functional.batch_norm(x, None, None, w, b, True),
                                 [x, w, b])


def _embedding(q):
    w, = _leaves(q, "table")
    i = tp.tensor(pc.Tensor.from_host(q, INDICES))
    return _squared_sum_backward(tp.embedding(i, w), [w])


def _torch_embedding():
    w, = _torch_leaves("table")
    return _squared_sum_backward(torch.nn.functional.embedding(torch.tensor(INDICES), w), [w])


def _max(q):
    x, = _leaves(q, "rows")
    return _squared_sum_backward(tp.max(x, 1).values, [x])


def _torch_max():
    x, = _torch_leaves("rows")
    return _squared_sum_backward(torch.amax(x, 1), [x])


# op on a queue -> (its reference's arrays, the kernels a grid of GROUPS splits)
CASES = {
    "argsort": (_argsort, lambda: [np.argsort(X["rows"], 1, kind="stable")],
                {"sort_load", "sort_merge", "sort_store"}),
    "quantile": (_quantile, _torch_quantile, {"order_pick"}),
    "gemm": (_gemm, lambda: [X["a"] @ X["b"], X["ba"] @ X["bb"]], {"gemm_tiled"}),
    "transpose": (_transpose, lambda: [X["ba"].transpose(0, 2, 1)], {"transpose_tiled"}),
    "conv3d": (_conv3d, _torch_conv3d, {"vol2col", "col2vol"}),
    "adaptive_avg_pool2d": (_adaptive_pool, _torch_adaptive_pool, {"adaptive_avg_bwd"}),
    "batch_norm": (_batch_norm, _torch_batch_norm, {"bn_apply", "bn_grad_input"}),
    "embedding": (_embedding, _torch_embedding, {"embed_bwd"}),
    "max": (_max, _torch_max, {"put_rows"}),
}


@pytest.mark.parametrize("op", CASES)
def test_launches_past_a_gpus_grid_run_in_pieces_as_one_launch_and_as_pytorch(
        op, small_grid, whole):
    """Each op's launches over 3 groups in dimension 1 or 2 (rows, batches, taps) run in
    pieces: the same bits as one launch where the grid allows it, and torch's values. Before,
    the launch went out whole, which a GPU of that grid refuses."""
    run, reference, kernels = CASES[op]
    got = run(small_grid.queue)
    assert kernels <= small_grid.split
    for g, one_launch, want in zip(got, run(whole), reference(), strict=True):
        np.testing.assert_array_equal(g, one_launch)
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)


def test_a_captured_step_replays_a_launch_past_the_grid_in_its_pieces(small_grid, whole):
    """A replay enqueues the pieces the recorded launch ran in (vol2col's 27 taps in blocks
    of 3), not the whole launch the grid refuses, and gives the eager call's bits and torch's
    values on new inputs."""
    w = pc.Tensor.from_host(small_grid.queue, X["taps"])
    step = tp.capture(lambda x: tp.conv3d(x, w, padding=1), small_grid.queue)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((2, 2, 5, 6, 7)).astype(np.float32)
        got = step(x).to_host()
        want = tp.conv3d(pc.Tensor.from_host(whole, x), pc.Tensor.from_host(whole, X["taps"]),
                         padding=1).to_host()
        np.testing.assert_array_equal(got, want)
        torch_y = torch.nn.functional.conv3d(torch.tensor(x), torch.tensor(X["taps"]), padding=1)
        np.testing.assert_allclose(got, torch_y.numpy(), rtol=1e-4, atol=1e-4)
    assert step.replays == 2 and "vol2col" in small_grid.split


@pytest.mark.parametrize("gsize, lsize", [((64, 10), (64, 1)), ((64, 10, 7), (64, 2, 1)),
                                          ((32, 7, 4), None), ((16, 20, 5), (16, 4, 1))])
def test_grid_pieces_cover_each_work_item_once_within_the_grid(gsize, lsize):
    pieces = grid_pieces(gsize, lsize, GROUPS)
    seen = np.zeros(gsize, np.int32)
    for offset, size in pieces:
        assert max(_groups(size, lsize)) <= GROUPS
        assert all(o % (1 if lsize is None else lsize[d]) == 0 for d, o in enumerate(offset))
        seen[tuple(slice(o, o + s) for o, s in zip(offset, size))] += 1
    assert (seen == 1).all()


def test_launches_within_the_grid_or_on_a_cpu_go_out_whole(queue):
    """A launch within the grid, of one dimension, or of no work-items is not split; a CPU
    device has no grid limit (its launches are enqueued as before), a GPU the CUDA grid's."""
    assert grid_pieces((64, 9, 3), (64, 3, 1), GROUPS) is None
    assert grid_pieces((10**6,), (64,), GROUPS) is None
    assert grid_pieces((0, 100), None, GROUPS) is None
    gpu = runtime.is_gpu(queue.device)
    assert queue.groups_max == runtime.groups_max(queue.device) == (65535 if gpu else None)
    launcher = _cache.get_kernel(queue, sorting.SOURCE, "sort_load")
    assert (launcher.pieces((64, 10**6), (64, 1)) is None) is not gpu
