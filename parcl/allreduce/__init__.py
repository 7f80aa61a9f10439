"""Allreduce over replicas' tensors in one OpenCL context, one algorithm per module.

>>> from parcl.allreduce import allreduce
>>> allreduce([grad_on_replica0, grad_on_replica1], op="mean")   # in place, enqueued

Every algorithm sums in a fixed order, so the same run twice gives bit-identical results, and
every replica ends with the same values. Cross-process reduction (MPI) lives in ``mpi.py``.
"""

from __future__ import annotations

import pyopencl as cl

from ..gate import release_all
from ..tensor import Tensor
from ._common import check_tensors
from .buckets import GradBuckets, plan_buckets
from .direct import direct
from .ring import ring
from .scatter import scatter
from .shared import shared

ALGORITHMS = {"direct": direct, "ring": ring, "scatter": scatter, "shared": shared}

# Below ~1 MB the launch latency of one kernel per replica (and the events between queues)
# outweighs spreading the additions over the devices, so one kernel on replica 0 (`direct`)
# wins; from 1 MB up `shared` (one pass, every replica reducing its chunk into every buffer)
# is fastest: 4 MB 0.67 ms vs 1.2 ms for direct, 25 MB 2.6 ms vs 4.7 ms, measured with
# `parcl-bench allreduce` on 2 PoCL sub-devices (see docs/performance.md).
AUTO_SHARED_BYTES = 1 << 20


# Only ``direct`` touches a buffer from one queue at a time. The others have several queues
# work on one buffer at once (different chunks of it: ``shared`` writes every replica's buffer
# from every queue, ``scatter`` and ``ring`` read a buffer whose owner is writing another chunk
# of it), which OpenCL leaves undefined for devices with memories of their own: a GPU keeps its
# copy of a buffer and moves it whole, so one device's chunk can overwrite another's. They are
# for devices that are the host's own cores (CPU sub-devices), which share one memory.
SHARED_MEMORY_ONLY = ("ring", "scatter", "shared")


def shares_memory(devices) -> bool:
    """Whether several queues may work on one buffer at once on ``devices``: CPU devices (the
    host's cores, one memory), chosen by device type."""
    return all(d.type & cl.device_type.CPU for d in devices)


def choose_algorithm(nbytes: int, replicas: int, shared_memory: bool = True) -> str:
    """The algorithm ``auto`` runs for a tensor of ``nbytes`` over ``replicas`` replicas."""
    if replicas <= 1 or nbytes < AUTO_SHARED_BYTES or not shared_memory:
        return "direct"
    return "shared"


def check_algorithm(algorithm: str, devices, what: str) -> None:
    """Refuse an algorithm that needs one memory (``SHARED_MEMORY_ONLY``) on other devices."""
    if algorithm in SHARED_MEMORY_ONLY and not shares_memory(devices):
        raise ValueError(f"{what}: allreduce {algorithm!r} has several queues work on one buffer "
                         "at once, which OpenCL leaves undefined on devices with memories of "
                         "their own (GPUs); use 'direct' or 'auto'")


def allreduce(tensors: list[Tensor], op: str = "sum", algorithm: str = "auto") -> None:
    """Sum (``op="sum"``) or average (``"mean"``) same-shaped tensors on different queues, in
    place; enqueued with events, the host never waits."""
    tensors = list(tensors)
    check_tensors("allreduce", tensors)
    if op not in ("sum", "mean"):
        raise ValueError(f"allreduce: op must be 'sum' or 'mean', got {op!r}")
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"allreduce: unknown algorithm {algorithm!r}; choose one of "
                         f"{sorted(ALGORITHMS)} or 'auto'")
    allreduce_scaled(tensors, 1.0 / len(tensors) if op == "mean" else 1.0, algorithm)


def allreduce_scaled(tensors: list[Tensor], scale: float, algorithm: str = "auto") -> None:
    """In place: every tensor becomes ``scale * sum(tensors)`` (inputs already checked)."""
    if len(tensors) == 1:
        if scale != 1.0:
            from ..kernels.elementwise import scale_
            scale_(tensors[0], scale)
        return
    devices = [t.queue.device for t in tensors]
    if algorithm == "auto":
        name = choose_algorithm(tensors[0].nbytes, len(tensors), shares_memory(devices))
    else:
        check_algorithm(algorithm, devices, "allreduce")
        name = algorithm
    ALGORITHMS[name](tensors, scale)
    release_all()           # the queues wait for each other's work: none of it held back


__all__ = ["ALGORITHMS", "GradBuckets", "allreduce", "allreduce_scaled", "check_algorithm",
           "choose_algorithm", "direct", "plan_buckets", "ring", "scatter", "shares_memory",
           "shared"]
