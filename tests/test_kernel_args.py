"""Kernel arguments set once (``parcl.kernels._cache.KernelArgs``): a launch sets only the
arguments that changed since its kernel object's last launch, and every launch still runs with
exactly the arguments it was given."""

import threading

import numpy as np
import pytest

import parcl as pc
from parcl.kernels import elementwise as ew
from parcl.kernels import gemm
from parcl.kernels._cache import get_kernel

SOURCE = """
kernel void write(global float* out, float value, int index)
{
    out[index] = value;
}
kernel void write_vector(global float* out, float4 value)
{
    out[0] = value.x; out[1] = value.y; out[2] = value.z; out[3] = value.w;
}
"""


def launch(queue, out, value, index, **kwargs):
    get_kernel(queue, SOURCE, "write")(queue, (1,), None, out.data, value, index, **kwargs)


def test_a_launch_that_changes_one_scalar_runs_with_it(queue):
    out = pc.Tensor.zeros(queue, (4,))
    for i, v in enumerate([1.0, 2.0, 2.0, 3.5]):      # the third launch changes only the index
        launch(queue, out, v, i)
    np.testing.assert_array_equal(out.to_host(), [1.0, 2.0, 2.0, 3.5])


def test_minus_zero_is_not_plus_zero(queue):
    x = pc.Tensor.from_host(queue, np.ones(8, np.float32))
    plus = ew.scalar("mul", x, 0.0).to_host()
    minus = ew.scalar("mul", x, -0.0).to_host()      # equal to 0.0, other bits
    again = ew.scalar("mul", x, 0.0).to_host()
    assert not np.signbit(plus).any() and np.signbit(minus).all()
    assert not np.signbit(again).any()


def test_each_buffer_is_the_one_given(queue):
    a = [pc.Tensor.zeros(queue, (1,)) for _ in range(3)]
    for i, t in enumerate(a + a[::-1]):               # the same buffers again, in another order
        launch(queue, t, float(i), 0)
    assert [float(t.to_host()[0]) for t in a] == [5.0, 4.0, 3.0]


def test_two_queues_of_one_context_share_a_kernel_object_correctly(queues2):
    """One thread's kernel object serves both queues of the context: what one queue's launch
    set must not be taken for what the other's last launch set."""
    q0, q1 = queues2
    out0, out1 = pc.Tensor.zeros(q0, (2,)), pc.Tensor.zeros(q1, (2,))
    launch(q0, out0, 1.0, 0)
    launch(q1, out1, 2.0, 1)
    launch(q0, out0, 2.0, 1)      # the arguments q0's launcher did not set last time
    launch(q1, out1, 1.0, 0)
    np.testing.assert_array_equal(out0.to_host(), [1.0, 2.0])
    np.testing.assert_array_equal(out1.to_host(), [1.0, 2.0])


def test_an_array_changed_in_place_is_sent_again(queue):
    out = pc.Tensor.zeros(queue, (4,))
    value = np.array((1.0, 2.0, 3.0, 4.0), dtype=pc.kernels._cache.cltypes.float4)
    k = get_kernel(queue, SOURCE, "write_vector")
    k(queue, (1,), None, out.data, value)
    np.testing.assert_array_equal(out.to_host(), [1, 2, 3, 4])
    value["x"] = 9.0                                   # the same object, other bytes
    k(queue, (1,), None, out.data, value)
    np.testing.assert_array_equal(out.to_host(), [9, 2, 3, 4])


def test_a_read_only_array_is_set_once_and_a_new_one_is_sent(queue):
    """A launch plan's vectors are read-only arrays owning their memory: passed again, the
    same array is not set again; another array with other bytes is, and a read-only view of a
    writeable array (which its base may change) is compared every time."""
    out = pc.Tensor.zeros(queue, (4,))
    k = get_kernel(queue, SOURCE, "write_vector")
    frozen = np.array((1.0, 2.0, 3.0, 4.0), dtype=pc.kernels._cache.cltypes.float4)
    frozen.flags.writeable = False
    k(queue, (1,), None, out.data, frozen)
    k(queue, (1,), None, out.data, frozen)
    np.testing.assert_array_equal(out.to_host(), [1, 2, 3, 4])
    other = np.array((5.0, 6.0, 7.0, 8.0), dtype=pc.kernels._cache.cltypes.float4)
    other.flags.writeable = False
    k(queue, (1,), None, out.data, other)
    np.testing.assert_array_equal(out.to_host(), [5, 6, 7, 8])
    base = np.array([(1.0, 1.0, 1.0, 1.0)], dtype=pc.kernels._cache.cltypes.float4)
    view = base[0:1].reshape(())
    view.flags.writeable = False
    k(queue, (1,), None, out.data, view)
    base["x"] = 9.0                                    # the view's bytes change under it
    k(queue, (1,), None, out.data, view)
    np.testing.assert_array_equal(out.to_host(), [9, 1, 1, 1])


def test_broadcasts_of_other_shapes_in_turn_match_numpy(queue, rng):
    """Broadcast adds keep a launch plan per pair of shapes; plans used in turn on one kernel
    object each launch with their own dims and strides."""
    shapes = [((8, 64), (64,)), ((8, 64), (8, 1)), ((3, 1, 5), (1, 4, 5)), ((8, 64), (64,)),
              ((2, 3, 4, 5, 6), (3, 1, 5, 1)), ((8, 1), (8, 64)), ((3, 1, 5), (1, 4, 5))]
    for sa, sb in shapes:
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        got = ew.binary("add", pc.Tensor.from_host(queue, a), pc.Tensor.from_host(queue, b))
        np.testing.assert_array_equal(got.to_host(), a + b)


def test_a_launch_with_a_global_offset_leaves_no_stale_arguments(queue):
    """pyopencl's own invoker (used for ``global_offset``) sets every argument itself; the next
    launch must not assume the arguments set before it."""
    out = pc.Tensor.zeros(queue, (4,))
    launch(queue, out, 1.0, 0)
    launch(queue, out, 2.0, 1, global_offset=(0,))
    launch(queue, out, 1.0, 2)          # 1.0 was set two launches ago, not by the last one
    np.testing.assert_array_equal(out.to_host(), [1.0, 2.0, 1.0, 0.0])


def test_threads_launching_one_kernel_each_get_their_own_arguments(queue):
    out = pc.Tensor.zeros(queue, (64,))
    errors = []

    def write(first):
        try:
            for i in range(first, 64, 2):
                launch(queue, out, float(i), i)
        except Exception as exc:     # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    np.testing.assert_array_equal(out.to_host(), np.arange(64, dtype=np.float32))


def test_products_of_every_transpose_in_turn_match_numpy(queue, rng):
    """The small GEMM keeps one kernel object per transpose and beta: taking them in turn
    gives each its own strides."""
    a = rng.standard_normal((5, 5), dtype=np.float32)
    b = rng.standard_normal((5, 5), dtype=np.float32)
    ta, tb = pc.Tensor.from_host(queue, a), pc.Tensor.from_host(queue, b)
    acc = pc.Tensor.from_host(queue, np.ones((5, 5), np.float32))
    for _ in range(2):
        for trans_a in (False, True):
            for trans_b in (False, True):
                want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
                got = gemm.product(ta, tb, trans_a, trans_b).to_host()
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    gemm.product(ta, tb, into=acc)
    np.testing.assert_allclose(acc.to_host(), 1 + a.astype(np.float64) @ b, rtol=1e-5,
                               atol=1e-5)


def test_packed_products_in_turn_equal_each_on_a_fresh_queue_bit_for_bit(queue, rng):
    """A packed CPU product keeps its launch plan per signature, with plain-number arguments
    a kernel object sets once: products of other signatures in turn (transposes, batches
    with a shared B, bias and ReLU, accumulation) give the bits each gives on a queue that
    has kept nothing."""
    cases = [((96, 80), (80, 72), {}), ((80, 96), (80, 72), {"trans_a": True}),
             ((96, 80), (72, 80), {"trans_b": True, "relu": True}),
             ((99, 80), (80, 70), {"bias": 70}), ((96, 80), (80, 72), {})]
    fresh = pc.new_queue(queue.device)
    for sa, sb, opts in cases * 2:
        a = rng.standard_normal(sa, dtype=np.float32)
        b = rng.standard_normal(sb, dtype=np.float32)
        bias = rng.standard_normal(opts.pop("bias"), dtype=np.float32) if "bias" in opts \
            else None
        got = []
        for q in (queue, fresh):
            kw = dict(opts, bias=None if bias is None else pc.Tensor.from_host(q, bias))
            got.append(gemm.gemm(pc.Tensor.from_host(q, a), pc.Tensor.from_host(q, b),
                                 **kw).to_host())
            fresh.choices.clear()
        assert got[0].tobytes() == got[1].tobytes()
        if bias is not None:
            opts["bias"] = bias.size
    x = rng.standard_normal((3, 64, 48), dtype=np.float32)
    w = rng.standard_normal((48, 64), dtype=np.float32)
    c0 = rng.standard_normal((64, 64), dtype=np.float32)
    for _ in range(2):
        got = gemm.batched_gemm(pc.Tensor.from_host(queue, x), pc.Tensor.from_host(queue, w))
        fresh.choices.clear()
        want = gemm.batched_gemm(pc.Tensor.from_host(fresh, x), pc.Tensor.from_host(fresh, w))
        assert got.to_host().tobytes() == want.to_host().tobytes()
        acc = pc.Tensor.from_host(queue, c0)
        gemm.gemm(pc.Tensor.from_host(queue, x[0]), pc.Tensor.from_host(queue, w), out=acc,
                  beta=1.0)
        np.testing.assert_allclose(acc.to_host(), c0 + x[0].astype(np.float64) @ w,
                                   rtol=1e-5, atol=1e-4)


def test_a_wrong_number_of_arguments_names_the_kernel(queue):
    out = pc.Tensor.zeros(queue, (1,))
    with pytest.raises(TypeError, match="kernel write: 2 arguments, it takes 3"):
        get_kernel(queue, SOURCE, "write")(queue, (1,), None, out.data, 1.0)
