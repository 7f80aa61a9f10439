"""The reduce kernel of the allreduce: the sum (or mean) of K same-sized buffers.

``out[off + i] = scale * (((b0[off + i] + b1[off + i]) + b2[off + i]) + ...)``: always summed in
replica order, so every algorithm that reduces a chunk with this kernel gets bit-identical
results run after run. ``out`` may be one of the inputs (each element is read before written).
Chunked by ``offset``/``count`` so the allreduce algorithms can split the work between devices.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import ShapeError
from ..tensor import Tensor
from ._cache import get_kernel

MAX_K = 8     # inputs one kernel reads; more are folded in by further launches, in order


def ordered_sum(terms: list[str]) -> str:
    """The OpenCL expression ``((t0 + t1) + t2) + ...``: the one summation order of every
    cross-replica sum (here and in the optimizers' replicated updates), so they agree bit
    for bit."""
    total = terms[0]
    for t in terms[1:]:
        total = f"({total} + {t})"
    return total


def _source() -> str:
    kernels = []
    for k in range(2, MAX_K + 1):
        params = ", ".join(f"__global const float *b{i}" for i in range(k))
        total = ordered_sum([f"b{i}[j]" for i in range(k)])
        kernels.append(f"""
__kernel void reduce{k}(__global float *out, {params}, const long offset, const long count,
                       const float scale)
{{
    const long i = get_global_id(0);
    if (i >= count) return;
    const long j = offset + i;
    out[j] = scale * {total};
}}""")
        params = ", ".join(f"__global float *b{i}" for i in range(k))
        stores = " ".join(f"b{i}[j] = s;" for i in range(k))
        kernels.append(f"""
__kernel void reduce_bcast{k}({params}, const long offset, const long count, const float scale)
{{
    const long i = get_global_id(0);
    if (i >= count) return;
    const long j = offset + i;
    const float s = scale * {total};
    {stores}
}}""")
    return "//CL//\n" + "\n".join(kernels)


REDUCE_SOURCE = _source()
WORK_GROUP = 256


def reduce_into(queue: cl.CommandQueue, out: cl.Buffer, inputs: list[cl.Buffer], offset: int,
                count: int, scale: float = 1.0, wait_for=None) -> cl.Event:
    """Enqueue on ``queue``: ``out[offset:offset+count] = scale * sum(inputs)`` (in order)."""
    if len(inputs) < 2:
        raise ShapeError(f"reduce: needs at least 2 inputs, got {len(inputs)}")
    if count <= 0:
        return cl.enqueue_marker(queue, wait_for=wait_for)
    gsize = ((count + WORK_GROUP - 1) // WORK_GROUP * WORK_GROUP,)
    first = inputs[:MAX_K]
    rest = inputs[MAX_K:]
    # The partial sums go to ``out`` unless it is one of the inputs folded in later (a 9th
    # replica's own buffer): the first partial sum would overwrite it before it is read, so
    # they go to a scratch buffer then (indexed as the inputs), and only the last to ``out``.
    partial = out
    if any(b.int_ptr == out.int_ptr for b in rest):
        scratch = Tensor.empty(queue, (offset + count,))     # this queue's pool: in order
        partial = scratch.data
    k = get_kernel(queue, REDUCE_SOURCE, f"reduce{len(first)}")
    s = np.float32(scale if not rest else 1.0)
    ev = k(queue, gsize, (WORK_GROUP,), partial if rest else out, *first, np.int64(offset),
           np.int64(count), s, wait_for=wait_for)
    while rest:       # fold the remaining inputs in, still in replica order
        chunk = [partial] + rest[:MAX_K - 1]
        rest = rest[MAX_K - 1:]
        k = get_kernel(queue, REDUCE_SOURCE, f"reduce{len(chunk)}")
        s = np.float32(scale if not rest else 1.0)
        ev = k(queue, gsize, (WORK_GROUP,), partial if rest else out, *chunk,
               np.int64(offset), np.int64(count), s)
    return ev


def reduce_broadcast(queue: cl.CommandQueue, buffers: list[cl.Buffer], offset: int, count: int,
                     scale: float = 1.0, wait_for=None) -> cl.Event:
    """Enqueue on ``queue``: ``b[offset:offset+count] = scale * sum(buffers)`` for every b,
    summed in order, in one pass (2 <= len(buffers) <= MAX_K)."""
    if not 2 <= len(buffers) <= MAX_K:
        raise ShapeError(f"reduce_broadcast: needs 2..{MAX_K} buffers, got {len(buffers)}")
    if count <= 0:
        return cl.enqueue_marker(queue, wait_for=wait_for)
    gsize = ((count + WORK_GROUP - 1) // WORK_GROUP * WORK_GROUP,)
    k = get_kernel(queue, REDUCE_SOURCE, f"reduce_bcast{len(buffers)}")
    return k(queue, gsize, (WORK_GROUP,), *buffers, np.int64(offset), np.int64(count),
             np.float32(scale), wait_for=wait_for)
