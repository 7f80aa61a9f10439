"""Gradient buckets: each replica's gradients live in a few flat buffers.

Parameters are packed in reverse registration order (backward produces the last layers' grads
first) into buckets of about ``bucket_mb``; each parameter's ``.grad`` becomes a view (an OpenCL
sub-buffer) into its bucket, so backward accumulates straight into the bucket and the allreduce
is a few large kernels instead of one per parameter. Parameter values get the same layout
(``ParamBuckets``), so a broadcast is one copy per bucket and an optimizer can step a whole
bucket with one kernel (``parcl.optim.FlatBucket``).
"""

from __future__ import annotations

from math import prod

import pyopencl as cl

from ..tensor import Tensor


def alignment_elems(device: cl.Device) -> int:
    # Sub-buffer origins must be multiples of CL_DEVICE_MEM_BASE_ADDR_ALIGN (bits).
    return max(1, device.mem_base_addr_align // 8 // 4)


def plan_buckets(shapes: list[tuple[int, ...]], bucket_mb: float,
                 align: int) -> list[list[tuple[int, int]]]:
    """Assign parameters (by index) to buckets in reverse order.

    Returns per bucket a list of ``(param_index, offset_in_elements)``; offsets are aligned.
    """
    limit = max(1, int(bucket_mb * (1 << 20) / 4))
    buckets: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    used = 0
    for i in reversed(range(len(shapes))):
        n = prod(shapes[i])
        if current and used + n > limit:
            buckets.append(current)
            current, used = [], 0
        current.append((i, used))
        used += (n + align - 1) // align * align
    if current:
        buckets.append(current)
    return buckets


def bucket_size(bucket: list[tuple[int, int]], shapes, align: int) -> int:
    i, off = bucket[-1]
    return off + (prod(shapes[i]) + align - 1) // align * align


def _flat_views(shapes, queue: cl.CommandQueue, plan, align: int):
    """Zeroed flat buffers, one per bucket of ``plan``, and per parameter its view."""
    flats, views = [], [None] * len(shapes)
    for bucket in plan:
        flat = Tensor.zeros(queue, (bucket_size(bucket, shapes, align),))
        flats.append(flat)
        for i, off in bucket:
            sub = flat.data.get_sub_region(off * 4, prod(shapes[i]) * 4)
            views[i] = flat.view_of(sub, shapes[i])
    return flats, views


def copy_flats(dst: list, src: list, wait_for) -> list[cl.Event]:
    """Enqueue on each ``dst`` bucket's queue: its bytes = the ``src`` bucket's, after
    ``wait_for``; the copies' events."""
    return [cl.enqueue_copy(d.queue, d.data, s.data, byte_count=s.nbytes, wait_for=wait_for)
            for d, s in zip(dst, src)]


class GradBuckets:
    """Flat gradient buffers for one replica's parameters, with ``.grad`` views into them:
    backward accumulates straight into the buckets."""

    def __init__(self, params: list, queue: cl.CommandQueue, bucket_mb: float = 25.0,
                 plan=None, align: int | None = None):
        self.queue = queue
        shapes = [tuple(p.shape) for p in params]
        self.align = align if align is not None else alignment_elems(queue.device)
        self.plan = plan if plan is not None else plan_buckets(shapes, bucket_mb, self.align)
        self.flats, self.views = _flat_views(shapes, queue, self.plan, self.align)
        self.params = params
        for p, view in zip(params, self.views):
            p.grad = view

    def gather(self, keep: bool = True) -> None:
        """Make every parameter's ``.grad`` its view again: a gradient that was replaced (an
        optimizer's ``zero_grad()`` dropping it, a backward that made a new one) is copied
        into the bucket, a dropped one is zero there, so the buckets hold every gradient.
        ``keep=False``: the buckets are about to be zeroed, so nothing is copied."""
        for p, view in zip(self.params, self.views):
            grad = p.grad
            if grad is view:
                continue
            if keep:
                if grad is None:
                    view.fill_owned(0)
                else:
                    view.copy_owned(grad)
            p.grad = view

    def copy_from(self, other: GradBuckets, wait_for) -> list[cl.Event]:
        """Enqueue on this replica's queue: every bucket = ``other``'s (after ``wait_for``)."""
        return copy_flats(self.flats, other.flats, wait_for)

    def zero_(self) -> None:
        """Zero every gradient: one fill per bucket."""
        for flat in self.flats:
            flat.fill_owned(0)
        for view in self.views:       # a failed backward's check (tape.hold_back) guards
            view.checks = ()          # nothing any more, as after a view's own fill_

    def detach(self) -> None:
        """Give the parameters ordinary gradients again (``.grad = None``)."""
        for p in self.params:
            p.grad = None


class ParamBuckets:
    """Flat buffers holding one replica's parameter values (``p.value`` becomes a view, same
    layout as its gradient buckets), so copying every parameter to another replica is one copy
    per bucket."""

    def __init__(self, params: list, queue: cl.CommandQueue, plan, align: int):
        shapes = [tuple(p.shape) for p in params]
        self.flats, self.views = _flat_views(shapes, queue, plan, align)
        self.params = params
        for p, view in zip(params, self.views):
            view.copy_owned(p.value)
            p.value = view

    def replaced(self) -> list[int]:
        """The indices of the parameters whose ``.value`` is no longer its bucket view (set
        anew after the buckets were made): the optimizer would update a tensor the model no
        longer reads."""
        return [i for i, (p, view) in enumerate(zip(self.params, self.views))
                if p.value is not view]

    def copy_from(self, other: ParamBuckets, wait_for) -> list[cl.Event]:
        """Enqueue on this replica's queue: every bucket = ``other``'s (after ``wait_for``)."""
        return copy_flats(self.flats, other.flats, wait_for)
