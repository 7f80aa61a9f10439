"""Tensor creation (zeros ... full_like, arange, linspace, logspace, eye, tril/triu_indices,
meshgrid, and the Node methods new_zeros ... fill_): values, dtypes and shapes against torch,
the size forms, placement on a given queue, meshgrid's gradient (finite differences and
torch's), capture, and the errors naming the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parcl as pc
import parcl.tape as tp
from conftest import up
from parcl.errors import DTypeError, ParclError, ShapeError

TORCH_DTYPES = {torch.float32: np.float32, torch.int64: np.int64, torch.int32: np.int32}


def assert_as_torch(got, want: torch.Tensor):
    """``got`` (a Node) has ``want``'s shape, dtype and values."""
    assert got.shape == tuple(want.shape)
    assert got.dtype == TORCH_DTYPES[want.dtype]
    np.testing.assert_allclose(got.to_host(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_fills_take_the_size_as_ints_a_tuple_or_size_as_pytorch(queue):
    for fn, value in ((tp.zeros, 0), (tp.ones, 1)):
        for node in (fn(2, 3), fn((2, 3)), fn([2, 3]), fn(size=(2, 3))):
            assert isinstance(node, tp.Node) and node.op_name == "leaf"
            assert node.shape == (2, 3) and node.dtype == np.float32
            np.testing.assert_array_equal(node.to_host(), np.full((2, 3), value))
    assert tp.zeros(()).shape == () and tp.ones(0, 4).shape == (0, 4)
    assert tp.empty(2, 5).shape == (2, 5) and tp.empty(3, dtype=np.int32).dtype == np.int32
    np.testing.assert_array_equal(tp.ones(3, dtype=np.int64).to_host(), [1, 1, 1])


def test_full_infers_its_dtype_from_the_value_as_pytorch(queue):
    assert_as_torch(tp.full((2, 2), 3), torch.full((2, 2), 3))
    assert_as_torch(tp.full((2,), 2.5), torch.full((2,), 2.5))
    assert_as_torch(tp.full((3,), 7, dtype=np.float32), torch.full((3,), 7, dtype=torch.float32))
    with pytest.raises(DTypeError, match="full: a bool fill_value"):
        tp.full((2,), True)


def test_like_forms_keep_shape_dtype_and_queue_as_pytorch(queue, queues2):
    x = tp.tensor(np.arange(6).reshape(2, 3))                     # int64
    assert_as_torch(tp.zeros_like(x), torch.zeros_like(torch.arange(6).reshape(2, 3)))
    assert_as_torch(tp.ones_like(x.value), torch.ones(2, 3, dtype=torch.int64))
    assert_as_torch(tp.full_like(x, 2.7), torch.full_like(torch.zeros(2, 3, dtype=torch.int64),
                                                         2.7))
    assert_as_torch(tp.full_like(x, 2.5, dtype=np.float32), torch.full((2, 3), 2.5))
    assert tp.empty_like(x).shape == (2, 3) and tp.empty_like(x).dtype == np.int64
    other = queues2[1]
    on_other = tp.zeros(2, queue=other)
    assert on_other.queue is other and tp.ones_like(on_other).queue is other
    assert tp.zeros_like(on_other, queue=queue).queue is queue
    assert tp.zeros(2).queue is pc.default_queue()


def test_requires_grad_makes_a_leaf_that_collects_a_gradient_as_pytorch(queue):
    w = tp.ones(3, requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(w * up(queue, [1.0, 2.0, 3.0]))
    tape.backward(loss)
    np.testing.assert_array_equal(w.grad.to_host(), [1.0, 2.0, 3.0])
    with pytest.raises(DTypeError, match="arange: a int64 tensor"):
        tp.arange(3, requires_grad=True)


@pytest.mark.parametrize("args, kwargs", [
    ((5,), {}), ((2, 9), {}), ((1, 2.5, 0.5), {}), ((0, 1, 0.3), {}), ((5, 0, -2), {}),
    ((-1.5, 2.25, 0.75), {}), ((10, 0, -0.7), {}), ((0,), {}), ((3, 3), {}),
    ((0, 5.5, 1.5), {"dtype": torch.int64}), ((0.5, 5, 1.7), {"dtype": torch.int64}),
    ((7,), {"dtype": torch.int32}), ((4,), {"dtype": torch.float32}),
])
def test_arange_has_pytorch_length_values_and_dtype(queue, args, kwargs):
    ours = {k: TORCH_DTYPES[v] for k, v in kwargs.items()}
    assert_as_torch(tp.arange(*args, **ours), torch.arange(*args, **kwargs))


@pytest.mark.parametrize("start, end, step", [(0, 100, 0.1), (-50, 50, 0.37), (1e4, 2e4, 3.3)])
def test_arange_of_floats_is_start_plus_i_step_rounded_once(queue, start, end, step):
    got = tp.arange(start, end, step).to_host()
    exact = (start + np.arange(got.size, dtype=np.float64) * step).astype(np.float32)
    assert got.size == torch.arange(start, end, step).numel()
    if "cl_khr_fp64" in queue.device.extensions.split():     # computed in double there
        np.testing.assert_array_equal(got, exact)
    np.testing.assert_allclose(got, exact, rtol=0, atol=2 * np.spacing(np.float32(abs(end))))


def test_arange_refuses_a_zero_or_backward_step_as_pytorch(queue):
    with pytest.raises(ShapeError, match="arange: step must be nonzero"):
        tp.arange(0, 5, 0)
    with pytest.raises(ShapeError, match="inconsistent with step sign"):
        tp.arange(0, 5, -1)
    with pytest.raises(ShapeError, match="arange: end must be finite"):
        tp.arange(0, float("inf"))
    with pytest.raises(TypeError, match="arange: end must be a number, got str"):
        tp.arange("3")


@pytest.mark.parametrize("start, end, steps", [(0, 1, 5), (-3, 7.5, 11), (2, -2, 4), (3, 4, 1),
                                               (0, 1, 0), (1e-3, 1e3, 100)])
def test_linspace_and_logspace_match_pytorch(queue, start, end, steps):
    got = tp.linspace(start, end, steps)
    assert_as_torch(got, torch.linspace(start, end, steps))
    if steps > 1:                                 # both ends exact, as torch's
        assert got.to_host()[0] == np.float32(start) and got.to_host()[-1] == np.float32(end)
    for base in (10.0, 2.0):
        if abs(end) < 10:
            want = torch.logspace(start, end, steps, base=base)
            np.testing.assert_allclose(tp.logspace(start, end, steps, base).to_host(),
                                       want.numpy(), rtol=2e-6)
    with pytest.raises(ShapeError, match="linspace: steps must be a non-negative int"):
        tp.linspace(0, 1, -1)
    with pytest.raises(DTypeError, match="logspace: only float32"):
        tp.logspace(0, 1, 3, dtype=np.int64)


@pytest.mark.parametrize("start, end, steps, base", [(-6, -1, 6, 10.0), (1e-3, 1e3, 1001, 10.0),
                                                     (-2.5, 27.3, 100, 10.0), (0, 2, 12, 2.0),
                                                     (0.1, 0.7, 1, 10.0), (-3, 3, 13, 0.5)])
def test_logspace_is_pytorchs_bit_for_bit(queue, start, end, steps, base):
    # float32's pow was off by up to 79 ulps: logspace(-6, -1, 6)[2] was 1.00000005e-4, not 1e-4
    got = tp.logspace(start, end, steps, base).to_host()
    np.testing.assert_array_equal(got, torch.logspace(start, end, steps, base=base).numpy())


@pytest.mark.parametrize("n, m", [(3, None), (2, 5), (4, 1), (0, None), (1, 0)])
def test_eye_matches_pytorch(queue, n, m):
    want = torch.eye(n) if m is None else torch.eye(n, m)
    assert_as_torch(tp.eye(n, m), want)
    assert_as_torch(tp.eye(n, m, dtype=np.int64), want.to(torch.int64))
    with pytest.raises(ShapeError, match="eye: n must be a non-negative int"):
        tp.eye(-1)


@pytest.mark.parametrize("row, col, offset", [(3, 3, 0), (3, 4, 1), (4, 3, -1), (5, 2, 3),
                                              (3, 3, -5), (0, 3, 0), (1, 1, 0), (6, 7, -2)])
def test_tril_and_triu_indices_match_pytorch(queue, row, col, offset):
    assert_as_torch(tp.tril_indices(row, col, offset), torch.tril_indices(row, col, offset))
    assert_as_torch(tp.triu_indices(row, col, offset), torch.triu_indices(row, col, offset))
    got = tp.tril_indices(row, col, offset, dtype=np.int32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.to_host(), torch.tril_indices(row, col, offset).numpy())


def test_triangle_indices_index_the_triangle_of_a_matrix_as_pytorch(queue):
    r, c = tp.triu_indices(4, 4, 1).to_host()
    a = np.arange(16.0).reshape(4, 4)
    np.testing.assert_array_equal(a[r, c], a[np.triu_indices(4, 1)])


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_matches_pytorch_values_and_gradient(queue, rng, indexing):
    arrays = [rng.standard_normal(n) for n in (3, 2, 4)]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = torch.meshgrid(*ts, indexing=indexing)
    nodes = [tp.tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    weights = [rng.standard_normal(tuple(w.shape)) for w in want]
    with tp.Tape() as tape:
        grids = tp.meshgrid(*nodes, indexing=indexing)
        loss = sum(tp.sum(g * up(queue, w)) for g, w in zip(grids, weights))
    tape.backward(loss)
    sum((g * torch.tensor(w)).sum() for g, w in zip(want, weights)).backward()
    for g, w in zip(grids, want):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g.to_host(), w.detach().numpy(), rtol=1e-6)
    for n, t in zip(nodes, ts):
        np.testing.assert_allclose(n.grad.to_host(), t.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert tp.gradcheck(lambda a, b: tp.meshgrid([a, b], indexing=indexing)[0] * 2, nodes[:2])


def test_meshgrid_takes_zero_d_tensors_and_refuses_others_as_pytorch(queue):
    gx, gy = tp.meshgrid(tp.tensor(np.float32(2.0)), tp.arange(3.0))
    assert gx.shape == gy.shape == (1, 3)
    np.testing.assert_array_equal(gx.to_host(), [[2.0, 2.0, 2.0]])
    with pytest.raises(ShapeError, match=r"meshgrid: expects 0-D or 1-D tensors, tensor 1 has "
                                         r"shape \(2, 2\)"):
        tp.meshgrid(tp.zeros(2), tp.zeros(2, 2))
    with pytest.raises(DTypeError, match="meshgrid: expects all tensors to have the same dtype"):
        tp.meshgrid(tp.zeros(2), tp.arange(2))
    with pytest.raises(ShapeError, match="indexing must be 'ij' or 'xy'"):
        tp.meshgrid(tp.zeros(2), indexing="ji")


def test_meshgrid_of_integers_matches_pytorch(queue):
    for indexing in ("ij", "xy"):
        ours = tp.meshgrid(tp.arange(2), tp.arange(3), tp.arange(4), indexing=indexing)
        theirs = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(4),
                                indexing=indexing)
        for got, want in zip(ours, theirs):
            assert got.shape == tuple(want.shape) and got.dtype == TORCH_DTYPES[want.dtype]
            np.testing.assert_array_equal(got.to_host(), want.numpy())
    small = tp.meshgrid(tp.arange(2, dtype=np.int32), tp.arange(3, dtype=np.int32))
    assert small[0].dtype == np.int32
    np.testing.assert_array_equal(small[1].to_host(), [[0, 1, 2], [0, 1, 2]])


def test_cartesian_prod_matches_pytorch_values_and_gradient(queue, rng):
    got = tp.cartesian_prod(tp.arange(2), tp.arange(3), tp.arange(2))
    want = torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(2))
    np.testing.assert_array_equal(got.to_host(), want.numpy())
    a, b = rng.standard_normal(3), rng.standard_normal(2)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    w = rng.standard_normal((6, 2))
    (torch.cartesian_prod(ta, tb) * torch.tensor(w)).sum().backward()
    na, nb = (tp.tensor(v.astype(np.float32), requires_grad=True) for v in (a, b))
    with tp.Tape() as tape:
        out = tp.cartesian_prod(na, nb)
        loss = tp.sum(out * up(queue, w))
    tape.backward(loss)
    np.testing.assert_allclose(out.to_host(), torch.cartesian_prod(ta, tb).detach().numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(na.grad.to_host(), ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nb.grad.to_host(), tb.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert tp.gradcheck(lambda u, v: tp.cartesian_prod(u, v), [na, nb])
    with pytest.raises(ShapeError, match=r"cartesian_prod: expects 1-D tensors, tensor 0 has "
                                         r"shape \(1, 2\)"):
        tp.cartesian_prod(tp.zeros(1, 2), tp.zeros(2))


def test_node_new_methods_take_the_nodes_dtype_and_queue_as_pytorch(queue, queues2):
    x = tp.tensor(np.arange(4, dtype=np.int32), requires_grad=False).value
    node = tp.tensor(pc.Tensor.from_host(queues2[1], np.ones(2, np.float32)))
    assert node.new_zeros(2, 3).queue is queues2[1]
    assert_as_torch(node.new_zeros(2, 3), torch.zeros(2, 3))
    assert_as_torch(node.new_ones((2,)), torch.ones(2))
    assert_as_torch(node.new_full((2,), 3), torch.ones(2).new_full((2,), 3))   # float32
    assert node.new_empty(4).shape == (4,) and node.new_empty(1).dtype == np.float32
    assert_as_torch(tp.tensor(x).new_tensor([[1.9, 2]]),
                    torch.zeros(1, dtype=torch.int32).new_tensor([[1.9, 2]]))
    copy = node.new_tensor(node)
    assert copy.value.data != node.value.data
    np.testing.assert_array_equal(copy.to_host(), [1.0, 1.0])
    assert node.new_zeros(2, requires_grad=True).requires_grad


def test_fill_and_zero_write_in_place_and_refuse_a_recorded_leaf_as_pytorch(queue):
    x = tp.zeros(3)
    assert x.fill_(2.5) is x
    np.testing.assert_array_equal(x.to_host(), [2.5, 2.5, 2.5])
    np.testing.assert_array_equal(x.zero_().to_host(), [0.0, 0.0, 0.0])
    w = tp.ones(2, requires_grad=True)
    with pytest.raises(ParclError, match=r"Node.fill_: a Node that requires grad \(shape "
                                         r"\(2,\)\) is written in place while grad mode is on"):
        w.fill_(3)
    with tp.no_grad():
        w.fill_(3)
    np.testing.assert_array_equal(w.to_host(), [3.0, 3.0])


def test_bad_sizes_are_refused_naming_the_op(queue):
    with pytest.raises(ShapeError, match=r"zeros: negative dimension in shape \(2, -1\)"):
        tp.zeros(2, -1)
    with pytest.raises(ShapeError, match="ones: sizes must be integers"):
        tp.ones(2.0, 3)
    with pytest.raises(TypeError, match="zeros: missing the size"):
        tp.zeros()
    with pytest.raises(DTypeError, match="float64 is not supported"):
        tp.zeros(2, dtype=np.float64)


def test_creation_inside_a_captured_step_replays_the_same_values(queue):
    def step(x):
        return x + tp.arange(3.0).value + tp.full((3,), 2.0).value + tp.eye(3).value[1]

    captured = tp.capture(step, queue)
    for i in range(3):
        got = captured(np.full(3, i, np.float32)).to_host()
        np.testing.assert_array_equal(got, [i + 2.0, i + 4.0, i + 4.0])
    assert captured.replays == 2
