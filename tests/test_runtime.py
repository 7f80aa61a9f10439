import subprocess
import sys
import textwrap
import threading

import numpy as np
import pyopencl as cl
import pytest

import parcl as pc


def test_split_gives_two_devices_in_one_context(devices2):
    assert len(devices2) == 2
    assert pc.context_for(devices2[0]) == pc.context_for(devices2[1])
    assert pc.devices(split=2)[0].int_ptr == devices2[0].int_ptr      # cached, stable order


def test_sub_devices_of_one_cpu_are_recognised(devices2):
    from parcl.runtime import root_device
    assert root_device(devices2[0]).int_ptr == root_device(devices2[1]).int_ptr
    assert root_device(devices2[0]).get_info(cl.device_info.PARENT_DEVICE) is None


def test_unknown_spec_is_device_error(monkeypatch):
    monkeypatch.setenv("PARCL_DEVICES", "tpu:3")
    with pytest.raises(pc.DeviceError, match="unknown device spec"):
        pc.devices()


def test_env_spec_cpu_n(monkeypatch, devices2):
    monkeypatch.setenv("PARCL_DEVICES", "cpu:2")
    assert [d.int_ptr for d in pc.devices()] == [d.int_ptr for d in devices2]


def test_too_many_subdevices():
    with pytest.raises(pc.DeviceError, match="compute units"):
        pc.devices(split=10_000)


def test_default_queue_is_per_thread():
    seen = []
    t = threading.Thread(target=lambda: seen.append(pc.default_queue()))
    t.start()
    t.join(30)
    assert seen and seen[0] is not pc.default_queue()


def test_from_host_roundtrip_noncontiguous(queue):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (a[:, ::2], np.asfortranarray(a), a.T):
        assert np.array_equal(pc.Tensor.from_host(queue, view).to_host(), view)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_label_dtypes(queue, dtype):
    y = np.array([3, 1, 2], dtype=dtype)
    t = pc.Tensor.from_host(queue, y)
    assert t.dtype == dtype and np.array_equal(t.to_host(), y)


def test_bad_dtype_and_zero_size(queue):
    with pytest.raises(TypeError, match="float64"):
        pc.Tensor.from_host(queue, np.zeros(3))
    with pytest.raises(pc.ShapeError, match="zero-size"):
        pc.Tensor.from_host(queue, np.zeros((0, 3), np.float32))


def test_reshape_is_zero_copy(queue):
    t = pc.Tensor.from_host(queue, np.arange(6, dtype=np.float32))
    v = t.reshape(2, -1)
    assert v.shape == (2, 3) and v.data is t.data
    with pytest.raises(pc.ShapeError, match="cannot view"):
        t.reshape(4, 2)


def test_pool_counters_and_reuse(queue):
    pc.reset_peak_memory_stats(queue)
    before = pc.memory_stats(queue)
    t = pc.Tensor.empty(queue, (1000,))
    during = pc.memory_stats(queue)
    assert during["bytes_in_use"] - before["bytes_in_use"] >= 4000
    assert during["allocations"] == before["allocations"] + 1
    buf = t.data
    del t
    after = pc.memory_stats(queue)
    assert after["bytes_in_use"] == before["bytes_in_use"]
    assert after["peak_bytes_in_use"] >= during["bytes_in_use"]
    t2 = pc.Tensor.empty(queue, (1000,))
    assert t2.data == buf                                         # reused from the pool


def test_zeros_and_fill(queue):
    assert np.array_equal(pc.Tensor.zeros(queue, (3, 2)).to_host(), np.zeros((3, 2)))
    assert np.array_equal(pc.Tensor.full(queue, 4, 2.5).to_host(), np.full(4, 2.5))


def test_copy_across_queues(queues2):
    q0, q1 = queues2
    src = pc.Tensor.from_host(q0, np.arange(5, dtype=np.float32))
    dst = pc.Tensor.zeros(q1, (5,))
    dst.copy_(src)
    assert np.array_equal(dst.to_host(), np.arange(5))


def test_copy_of_a_tensor_into_itself_leaves_it_as_pytorch(queue):
    """``t.copy_(t)`` (or of a view of it: a tied weight copied onto itself) is a no-op, as
    PyTorch's; it raised pyopencl's RuntimeError (MEM_COPY_OVERLAP)."""
    t = pc.Tensor.from_host(queue, np.arange(6, dtype=np.float32))
    assert t.copy_(t) is t
    t.copy_(t.reshape(2, 3).reshape(6))
    np.testing.assert_array_equal(t.to_host(), np.arange(6))


def test_tensors_from_another_context_are_refused(queue):
    from parcl.kernels import elementwise as ew
    whole_cpu = pc.new_queue(pc.devices(split=1)[0])           # a context of its own
    assert whole_cpu.context != queue.context
    a = pc.Tensor.from_host(queue, np.ones(4, np.float32))
    b = pc.Tensor.from_host(whole_cpu, np.ones(4, np.float32))
    with pytest.raises(pc.DeviceError, match="different OpenCL contexts"):
        ew.binary("add", a, b)
    with pytest.raises(pc.DeviceError, match="different OpenCL contexts"):
        a.copy_(b)


def test_ops_on_different_queues_of_one_context_are_refused(queues2):
    import parcl.tape as tp
    a = pc.Tensor.from_host(queues2[0], np.ones((2, 2), np.float32))
    b = pc.Tensor.from_host(queues2[1], np.ones((2, 2), np.float32))
    with pytest.raises(pc.DeviceError, match="different command queues"):
        tp.matmul(a, b)


def _run_script(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120)


def test_a_device_wait_that_never_ends_takes_the_process_down_with_a_message():
    """A blocked OpenCL wait cannot be interrupted: past its timeout the watchdog names the
    wait and what is pending, and ends the process instead of letting it hang."""
    proc = _run_script("""
        import pyopencl as cl, parcl as pc
        from parcl import runtime
        q = runtime.new_queue(pc.devices(split=2)[0])
        never = cl.UserEvent(q.context)               # nothing ever completes it
        marker = cl.enqueue_marker(q, wait_for=[never])
        other = runtime.new_queue(pc.devices(split=2)[1])
        runtime.wait_for_events([cl.enqueue_marker(other)], timeout=30)   # done: no exit
        runtime.wait_for_events([marker], timeout=0.5, what="the test's wait",
                                labels=["the gated marker"])
        print("not reached")
    """)
    assert proc.returncode == pc.runtime.WAIT_TIMEOUT_EXIT, proc.stderr
    assert "not reached" not in proc.stdout
    assert "the test's wait waited 0.5 s" in proc.stderr
    assert "still pending: the gated marker" in proc.stderr


def test_a_read_behind_a_kernel_that_never_finishes_ends_the_process_naming_its_thread():
    """``to_host`` was a blocking copy outside the watchdog: it waited for ever."""
    proc = _run_script("""
        import threading
        import numpy as np, pyopencl as cl, parcl as pc
        from parcl import runtime
        q = runtime.new_queue(pc.devices(split=2)[0])
        t = pc.Tensor.from_host(q, np.arange(4, dtype=np.float32))
        print(t.to_host(timeout=30).tolist())                  # done: no exit
        cl.enqueue_barrier(q, wait_for=[cl.UserEvent(q.context)])   # the queue never drains
        reader = threading.Thread(target=t.to_host, args=(0.5,), name="the reader")
        reader.start()
        reader.join()
        print("not reached")
    """)
    assert proc.returncode == pc.runtime.WAIT_TIMEOUT_EXIT, proc.stderr
    assert proc.stdout == "[0.0, 1.0, 2.0, 3.0]\n"
    assert "Tensor.to_host waited 0.5 s (in thread the reader)" in proc.stderr


def test_a_wait_inside_a_watched_block_leaves_the_block_watched():
    """A watched call inside another (a ``to_host`` in a ``watched`` block) dropped the
    outer one's registration: the block's next wait was unbounded, and leaving the block
    raised KeyError."""
    proc = _run_script("""
        import numpy as np, pyopencl as cl, parcl as pc
        from parcl import runtime
        q = runtime.new_queue(pc.devices(split=2)[0])
        t = pc.Tensor.from_host(q, np.arange(4, dtype=np.float32))
        with runtime.watched(30.0, "the first block"):
            with runtime.watched(30.0, "a nested one"):
                pass
        print("left")                                          # no KeyError
        with runtime.watched(0.5, "the outer block"):
            print(t.to_host(timeout=30).tolist())              # nested, done
            cl.enqueue_barrier(q, wait_for=[cl.UserEvent(q.context)])   # never drains
            q.finish()
        print("not reached")
    """)
    assert proc.returncode == pc.runtime.WAIT_TIMEOUT_EXIT, proc.stderr
    assert proc.stdout == "left\n[0.0, 1.0, 2.0, 3.0]\n"
    assert "the outer block waited 0.5 s" in proc.stderr


def test_a_step_whose_device_never_finishes_ends_the_process_naming_the_replica():
    proc = _run_script("""
        import numpy as np, pyopencl as cl, parcl as pc
        from parcl import tape as tp
        from parcl.replica import ReplicaGroup
        rng = np.random.default_rng(0)
        x, y = rng.random((8, 16), dtype=np.float32), rng.integers(0, 4, 8)
        build = lambda q: pc.nn.Linear(16, 4, queue=q)
        with ReplicaGroup(build, pc.devices(split=2), capture=True) as group:
            opt = pc.optim.SGD(group.parameters(), lr=0.1)
            for _ in range(2):
                group.step(x, y, tp.cross_entropy, opt)           # recorded, then replayed
            group.timeout = 0.5     # only now: building kernels may take longer on a busy CI
            q1 = group.replicas[1].queue
            cl.enqueue_barrier(q1, wait_for=[cl.UserEvent(q1.context)])   # replica 1 stalls
            group.step(x, y, tp.cross_entropy, opt)
            print("not reached")
    """)
    assert proc.returncode == pc.runtime.WAIT_TIMEOUT_EXIT, proc.stderr
    assert "not reached" not in proc.stdout
    assert "ReplicaGroup.step waited 0.5 s" in proc.stderr
    assert "still pending: replica 1" in proc.stderr       # replica 1 first (0 waits on it)


def test_sync_batchnorms_read_across_ranks_waits_the_groups_timeout_not_the_default():
    """Rank 0's read of its stacked partials, beside the allgather of every rank's, waited
    ``WAIT_TIMEOUT`` (600 s) behind a stalled device whatever the group's timeout; it now
    waits the group's (its ``Bounded`` communicator's), as the MPI path's other waits do."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import types
        import numpy as np, pyopencl as cl, parcl as pc
        from parcl import runtime
        from parcl.allreduce.bounded import Bounded
        from parcl.replica_stats import _across_ranks

        class Solo:
            def allgather(self, value):
                return [value]

        q = runtime.new_queue(pc.devices(split=2)[0])
        stacked = pc.Tensor.from_host(q, np.arange(4, dtype=np.float32).reshape(2, 2))
        ex = types.SimpleNamespace(comm=Bounded(Solo(), timeout=0.5))
        parts, counts = _across_ranks(ex, stacked, np.array([3]))
        print(parts.tolist(), counts.tolist())                  # done: no exit
        cl.enqueue_barrier(q, wait_for=[cl.UserEvent(q.context)])   # the queue never drains
        _across_ranks(ex, stacked, np.array([3]))
        print("not reached")
    """)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == pc.runtime.WAIT_TIMEOUT_EXIT, proc.stderr
    assert proc.stdout == "[[0.0, 1.0], [2.0, 3.0]] [3]\n"
    assert "Tensor.to_host waited 0.5 s" in proc.stderr


def test_fill_copy_and_reshape_refuse_what_would_silently_scramble(queue):
    t = pc.Tensor.zeros(queue, (2, 3))
    with pytest.raises(pc.ShapeError, match="fill_: the value must be a scalar"):
        t.fill_(np.array([1.0, 2.0]))                # was tiled over the buffer
    with pytest.raises(pc.ShapeError, match="fill_: the value must be a scalar"):
        pc.Tensor.full(queue, (4,), [1.0, 2.0])
    transposed = pc.Tensor.from_host(queue, np.arange(6, dtype=np.float32).reshape(3, 2))
    with pytest.raises(pc.ShapeError, match=r"copy_: source of shape \(3, 2\)"):
        t.copy_(transposed)                          # was its raw buffer, reinterpreted
    with pytest.raises(pc.ShapeError, match="no other negative size"):
        t.reshape(-2, -3)
    np.testing.assert_array_equal(t.copy_(transposed.reshape(2, 3)).to_host(),
                                  np.arange(6).reshape(2, 3))
