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
    """``x * factor`` after enough small launches in a row that the gate holds it."""
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
