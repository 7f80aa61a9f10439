"""Held launches (parcl.gate): a CPU queue's small launches run in batches, with the results of
an ungated queue, and no wait, blocking call or exit is left waiting for a held batch."""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pyopencl as cl

import parcl as pc
import parcl.tape as tp
from parcl import gate


def chain(queue, seed=0):
    """A small eager forward and backward: the many-small-launches case the gate is for."""
    rng = np.random.default_rng(seed)
    w = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)), True)
    h = tp.tensor(pc.Tensor.from_host(queue, rng.standard_normal((4, 4), np.float32)))
    with tp.Tape() as tape:
        for _ in range(10):
            h = tp.tanh(h @ w + h)
        loss = tp.sum(h)
    tape.backward(loss)
    return loss.value.to_host(), w.grad.to_host()


def hold(queue, x, factor=2.0):
    """``x * factor`` once a small launch found the device idle and the gate holds it."""
    queue.finish()
    while True:
        y = x * factor
        if queue.gate.event is not None:
            return y
        queue.gate.busy.wait()                     # the device idle again


def test_cpu_queues_are_gated_and_small_launches_are_held(devices2):
    q = pc.new_queue(devices2[0])
    assert q.gate is not None
    y = hold(q, pc.Tensor.from_host(q, np.ones(16, np.float32)))
    assert q.gate.event is not None                 # held: the device has not seen it
    np.testing.assert_array_equal(y.to_host(), np.full(16, 2.0, np.float32))
    assert q.gate.event is None                     # a host read released it first


def test_a_big_launch_releases_the_gate_and_goes_at_once(devices2):
    q = pc.new_queue(devices2[0])
    small = pc.Tensor.from_host(q, np.ones(16, np.float32))
    big = pc.Tensor.from_host(q, np.ones(gate.BIG, np.float32))
    hold(q, small)
    assert q.gate.event is not None
    _ = big * 2.0
    assert q.gate.event is None


def test_gated_results_are_bit_identical_to_an_ungated_queue(devices2):
    gated, plain = pc.new_queue(devices2[0]), pc.new_queue(devices2[0], hold_launches=False)
    assert gated.gate is not None and plain.gate is None
    for got, want in zip(chain(gated), chain(plain)):
        np.testing.assert_array_equal(got, want)


def test_a_blocking_pyopencl_call_parcl_does_not_know_of_is_delayed_not_hung(devices2):
    q = pc.new_queue(devices2[0])
    y = hold(q, pc.Tensor.from_host(q, np.ones(16, np.float32)), 3.0)
    assert q.gate.event is not None
    host = np.empty(16, np.float32)
    t0 = time.monotonic()
    cl.enqueue_copy(q, host, y.data, is_blocking=True)    # the keeper thread releases it
    assert time.monotonic() - t0 < 2.0
    np.testing.assert_array_equal(host, np.full(16, 3.0, np.float32))


def test_a_process_exits_with_launches_still_held():
    code = textwrap.dedent("""
        import numpy as np, parcl as pc
        q = pc.new_queue(pc.devices()[0])
        x = pc.Tensor.from_host(q, np.ones(16, np.float32))
        ys = [x * 2.0 for _ in range(20)]             # some held when the script ends
        z = pc.Tensor.from_host(q, np.ones(16, np.float32))
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"


def test_a_failed_backward_with_an_upload_in_flight_does_not_hang(queue):
    """pyopencl waits for a dropped host copy's event while holding the interpreter lock: no
    host copy is ever put behind a gate."""
    x = tp.tensor(pc.Tensor.from_host(queue, np.ones((2, 3), np.float32)), True)
    for _ in range(3):
        with tp.Tape() as tape:
            out = tp.tanh(x) * 2.0
        try:
            tape.backward(out, grad=pc.Tensor.from_host(queue, np.ones((3, 2), np.float32)))
        except pc.ParclError:
            pass
    assert x.grad is None


def test_cross_queue_work_and_uploads_after_it_never_hang():
    """A copy or an update whose event another queue waits for, then an upload there whose
    event is dropped at once: the gate in front of that work is released when the other queue
    is made to wait for it (``foreign_use``). Run in a subprocess: a hang here would hold the
    interpreter lock, where no in-process timeout can fire."""
    code = textwrap.dedent("""
        import threading, time
        import numpy as np, parcl as pc, parcl.tape as tp
        d0, d1 = pc.devices(split=2)[:2]
        q0, q1 = pc.new_queue(d0), pc.new_queue(d1)
        x = np.ones(16, np.float32)
        a, b = pc.Tensor.from_host(q0, x), pc.Tensor.from_host(q1, 2 * x)
        for t in (a, b):
            (t * 2.0).to_host(); (t + 1.0).to_host()
        for _ in range(20):
            b = b + 1.0                                   # held on q1
        b.copy_(a)                                        # q0 waits for a copy on q1
        y = pc.Tensor.from_host(q0, x) * 2.0              # an upload dropped after its op
        assert (y.to_host() == 2).all() and (b.to_host() == 1).all()
        for _ in range(20):
            a = a + 1.0                                   # held on q0
        a.copy_(b)
        pc.Tensor.from_host(q1, x)                        # dropped at once
        lin = pc.nn.Linear(4, 4, queue=q1)
        sd = lin.state_dict()
        for _ in range(20):
            a = a + 1.0
        pc.Tensor.empty(q0, lin.weight.shape).copy_(lin.weight.value)
        lin.load_state_dict(sd)                           # its uploads' events dropped at once
        w = tp.tensor(pc.Tensor.from_host(q0, x), requires_grad=True)
        w.grad = pc.Tensor.from_host(q1, x)               # a gradient on another queue
        for _ in range(20):
            b = b + 1.0
        pc.optim.SGD([w], lr=0.5).step()
        pc.Tensor.from_host(q1, x)
        assert (w.value.to_host() == 0.5).all()
        stop = time.monotonic() + 1.0                     # two threads sharing one queue
        def uploads():
            while time.monotonic() < stop:
                pc.Tensor.from_host(q0, x)
        def ops():
            t = pc.Tensor.from_host(q0, x)
            while time.monotonic() < stop:
                t = t + 1.0
        threads = [threading.Thread(target=f) for f in (uploads, ops)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "done"


def test_a_group_run_after_the_caller_held_launches_does_not_stall(devices2):
    from parcl.replica import ReplicaGroup
    x = np.ones((2, 3), np.float32)

    def forward(replica, xs):
        return replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, xs))).value

    with ReplicaGroup(lambda q: pc.nn.Linear(3, 3, queue=q), devices2) as group:
        outs = group.run(forward, [x, x])
        target = pc.Tensor.empty(outs[0].queue, outs[1].shape)
        for _ in range(10):
            target = target * 1.0                        # held on replica 0's queue
        target.copy_(outs[1])                            # waits for replica 1's queue
        again = group.run(forward, [x, x])
        np.testing.assert_array_equal(again[0].to_host(), outs[0].to_host())
        np.testing.assert_array_equal(target.to_host(), outs[1].to_host())
