"""Allreduce algorithms against a numpy sum, for K = 2, 3, 4 replicas (K > 2 shares the two
sub-devices between several queues), sizes 1, 1023 and 1 Mi elements."""

import numpy as np
import pytest

import parcl as pc
from parcl.allreduce import ALGORITHMS, GradBuckets, allreduce, choose_algorithm, plan_buckets

from conftest import refused_here


@pytest.fixture(scope="module")
def queues4(devices2, queues2):
    return queues2 + [pc.new_queue(devices2[0]), pc.new_queue(devices2[1])]


def _inputs(queues, n, seed=0):
    rng = np.random.default_rng(seed)
    hosts = [rng.standard_normal(n).astype(np.float32) for _ in queues]
    return hosts, [pc.Tensor.from_host(q, h) for q, h in zip(queues, hosts)]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS) + ["auto"])
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 1023, 1 << 20])
def test_allreduce_matches_numpy_and_is_bitwise_repeatable(queues4, algorithm, k, n):
    queues = queues4[:k]
    hosts, ts = _inputs(queues, n)
    if refused_here(algorithm, [q.device for q in queues]):
        with pytest.raises(ValueError, match="memories of their own"):
            allreduce(ts, op="sum", algorithm=algorithm)
        return
    allreduce(ts, op="sum", algorithm=algorithm)
    results = [t.to_host() for t in ts]
    expected = np.sum(np.stack(hosts).astype(np.float64), axis=0)
    for r in results:
        np.testing.assert_allclose(r, expected, rtol=1e-5, atol=1e-5)
        assert np.array_equal(r, results[0])             # every replica: the same bits
    _, again = _inputs(queues, n)
    allreduce(again, op="sum", algorithm=algorithm)
    assert np.array_equal(again[0].to_host(), results[0])   # run twice: the same bits


@pytest.mark.parametrize("other", ["scatter", "shared"])
def test_replica_order_algorithms_agree_bitwise_with_direct(queues4, other):
    _, a = _inputs(queues4[:3], 5000)
    _, b = _inputs(queues4[:3], 5000)
    allreduce(a, algorithm="direct")
    if refused_here(other, [q.device for q in queues4[:3]]):
        with pytest.raises(ValueError, match="memories of their own"):
            allreduce(b, algorithm=other)
        return
    allreduce(b, algorithm=other)
    assert np.array_equal(a[0].to_host(), b[2].to_host())


@pytest.mark.parametrize("algorithm", ["scatter", "shared", "auto"])
@pytest.mark.parametrize("k", [9, 10])
def test_more_replicas_than_one_kernel_reads_still_sum_every_replica(devices2, algorithm, k):
    """Past 8 replicas (``MAX_K``) a chunk's sum is folded in by further launches; the
    replica owning the chunk (``scatter``, ``shared``, ``auto`` from 1 MiB) had its own
    buffer overwritten by the first 8 replicas' sum before it was read, so with 9 replicas
    holding 1, 2, ..., 9 its chunk came out 72 instead of 45, silently (a 10th replica's
    chunk 82 and 81). Equal to ``direct`` bit for bit now, on every replica."""
    queues = [pc.new_queue(devices2[i % 2]) for i in range(k)]
    n = 1 << 18                                    # 1 MiB: 'auto' reduces it as 'shared'
    hosts = [np.full(n, i + 1, np.float32) for i in range(k)]
    ts = [pc.Tensor.from_host(q, h) for q, h in zip(queues, hosts)]
    if refused_here(algorithm, devices2):
        with pytest.raises(ValueError, match="memories of their own"):
            allreduce(ts, algorithm=algorithm)
        return
    direct = [pc.Tensor.from_host(q, h) for q, h in zip(queues, hosts)]
    allreduce(ts, algorithm=algorithm)
    allreduce(direct, algorithm="direct")
    want = direct[0].to_host()
    np.testing.assert_array_equal(want, np.full(n, k * (k + 1) // 2, np.float32))
    for t in ts:
        np.testing.assert_array_equal(t.to_host(), want)


def test_mean(queues2):
    hosts, ts = _inputs(queues2, 100)
    allreduce(ts, op="mean")
    np.testing.assert_allclose(ts[1].to_host(), (hosts[0] + hosts[1]) / 2, rtol=1e-6)


def test_bad_input(queues2):
    a = pc.Tensor.zeros(queues2[0], (3,))
    b = pc.Tensor.zeros(queues2[1], (4,))
    with pytest.raises(pc.ShapeError, match="same size"):
        allreduce([a, b])
    with pytest.raises(ValueError, match="unknown algorithm"):
        allreduce([a, pc.Tensor.zeros(queues2[1], (3,))], algorithm="tree")
    with pytest.raises(ValueError, match="op must be"):
        allreduce([a, pc.Tensor.zeros(queues2[1], (3,))], op="max")


def test_auto_picks_direct_for_small():
    assert choose_algorithm(1024, 2) == "direct"
    assert choose_algorithm(25 << 20, 2) == "shared"


def test_bucket_plan_reverse_order_and_alignment():
    shapes = [(10,), (3, 3), (1000,), (5,)]
    plan = plan_buckets(shapes, bucket_mb=1000 * 4 / (1 << 20), align=32)
    flat = [i for bucket in plan for i, _ in bucket]
    assert flat == [3, 2, 1, 0]
    assert all(off % 32 == 0 for bucket in plan for _, off in bucket)
    assert len(plan) >= 2                                  # 1000 elements per bucket


class _P:
    def __init__(self, shape):
        self.shape = shape
        self.grad = None


def test_grad_views_write_into_bucket(queue):
    params = [_P((4, 3)), _P((7,))]
    buckets = GradBuckets(params, queue, bucket_mb=1)
    from parcl.kernels.elementwise import axpy
    axpy(params[0].grad, pc.Tensor.from_host(queue, np.ones((4, 3), np.float32)), 2.0)
    flat = buckets.flats[0].to_host()
    assert flat.sum() == 24.0
    buckets.zero_()
    assert not params[0].grad.to_host().any()


def test_on_devices_with_their_own_memory_only_direct_is_chosen_or_allowed():
    """The fused end, ``shared``, ``scatter`` and ``ring`` have several queues work on one
    buffer at once: fine where the devices are the host's cores (one memory), undefined in
    OpenCL on GPUs, which keep their own copy of a buffer."""
    import types

    import pyopencl as cl

    from parcl.allreduce import shares_memory
    from parcl.allreduce.end import Reduced, end_of_step
    from parcl.allreduce.fused import Fused

    gpus = [types.SimpleNamespace(type=cl.device_type.GPU)] * 2
    cpus = pc.devices(split=2)
    assert shares_memory(cpus) and not shares_memory(gpus)
    assert choose_algorithm(25 << 20, 2, shared_memory=False) == "direct"
    assert isinstance(end_of_step("auto", None, 2, devices=cpus), Fused)
    end = end_of_step("auto", None, 2, devices=gpus)
    assert isinstance(end, Reduced) and end.algorithm == "auto"
    for name in ("shared", "scatter", "ring"):
        with pytest.raises(ValueError, match=f"allreduce '{name}' has several queues"):
            end_of_step(name, None, 2, devices=gpus)
    assert isinstance(end_of_step("direct", None, 2, devices=gpus), Reduced)
