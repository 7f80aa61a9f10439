"""Shared fixtures: one session-wide set of devices, contexts and queues (PoCL builds each
program once per context, so tests share them)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


@pytest.fixture(scope="session")
def devices2():
    """Two OpenCL devices: the CPU split into two sub-devices (one core each here), or, when
    ``PARCL_DEVICES`` names GPUs (``PARCL_DEVICES=gpu python -m pytest tests/test_ops_*.py``),
    the first two GPUs, one GPU twice where there is one (two queues on it)."""
    spec = os.environ.get(pc.runtime.DEVICES_ENV, "")
    if spec.strip().lower().startswith("gpu"):
        gpus = pc.devices()
        return (gpus * 2)[:2]
    return pc.devices(split=2)


@pytest.fixture(scope="session")
def queue(devices2):
    """A queue on the first sub-device; also made this thread's default queue."""
    q = pc.new_queue(devices2[0])
    pc.set_default_queue(q)
    return q


@pytest.fixture(scope="session")
def queues2(devices2, queue):
    """Two queues, one per sub-device, in the same context as ``queue``."""
    return [queue, pc.new_queue(devices2[1])]


def refused_here(algorithm: str, devices) -> bool:
    """Whether ``algorithm`` is refused on ``devices``: the allreduce algorithms that have
    several queues work on one buffer at once need devices that share the host's memory (CPU
    sub-devices); on GPUs they are a ``ValueError`` (``parcl.allreduce.check_algorithm``)."""
    from parcl.allreduce import SHARED_MEMORY_ONLY, shares_memory
    return algorithm in SHARED_MEMORY_ONLY and not shares_memory(devices)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


AWKWARD_SIZES = [1, 7, 33, 257, 1000]


def up(q, a, dtype=np.float32):
    """``a`` as a device tensor on queue ``q`` (float32 unless told)."""
    return pc.Tensor.from_host(q, np.asarray(a, dtype))


def leaf(q, a, requires_grad=True):
    """``a`` on ``q`` as a tape leaf (one that collects a gradient unless told)."""
    return tp.tensor(up(q, a), requires_grad)


def close(got, want, tol=1e-4):
    """``got`` equals ``want`` to ``tol``, absolute and relative."""
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def assert_replays_eager(queue, step, w, inputs):
    """``tp.capture(step)`` called on each array of ``inputs`` gives ``step``'s eager
    output and ``w``'s gradient bit for bit, replaying every call after the first."""
    captured = tp.capture(step, queue)
    for x in inputs:
        w.grad = None
        got = captured(pc.Tensor.from_host(queue, x)).to_host()
        got_grad = w.grad.to_host().copy()
        w.grad = None
        np.testing.assert_array_equal(got, step(pc.Tensor.from_host(queue, x)).to_host())
        np.testing.assert_array_equal(got_grad, w.grad.to_host())
    assert captured.replays == len(inputs) - 1 and captured.reason(x) is None


def assert_same_gradient_bits_twice(queue, x, loss_of):
    """The gradient of ``loss_of(leaf)`` at ``x``, computed twice, is the same bits."""
    grads = []
    for _ in range(2):
        node = leaf(queue, x)
        with tp.Tape() as tape:
            loss = loss_of(node)
        tape.backward(loss)
        grads.append(node.grad.to_host())
    assert np.array_equal(grads[0], grads[1])


def run_on_both_queues(queues, work):
    """Run ``work(queue)`` in one thread per queue, all starting together behind a barrier;
    returns the results in queue order and re-raises the first failure."""
    import threading

    barrier = threading.Barrier(len(queues), timeout=30)
    results, errors = [None] * len(queues), []

    def run(i):
        try:
            results[i] = work(queues[i], barrier.wait)
        except Exception as exc:        # noqa: BLE001 - re-raised in the caller below
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(queues))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    if errors:
        raise errors[0]
    return results
