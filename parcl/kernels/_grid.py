"""Launches split where a GPU's grid is too small for them.

A GPU allows a launch a limited number of work-groups along NDRange dimensions 1 and 2
(``runtime.groups_max``: CUDA grids' 65535), where parcl's kernels put rows, batches or taps:
100,000 rows sorted along rows of 5000 ask for 100,000 groups in dimension 1. Such a launch is
enqueued as several, each over a block of at most that many groups, with a global work offset
(OpenCL 1.1): ``get_global_id`` counts from the offset, so every work-item gets the id it has in
the whole launch. Kernels launched with more than one dimension read their ids in dimensions 1
and 2 from ``get_global_id`` alone (not ``get_group_id``, ``get_num_groups`` or
``get_global_size``, which see one block), and write what the launch's other blocks do not read.
"""

from __future__ import annotations

from itertools import product

import pyopencl as cl


def grid_pieces(gsize: tuple, lsize: tuple | None, most: int) -> tuple | None:
    """The ``(offset, size)`` launches that cover ``gsize`` with at most ``most`` work-groups
    each along dimensions 1 and 2, in order; None where ``gsize`` is within that (or has no
    work-items: nothing to split). Without ``lsize`` a group may be one work-item wide there,
    as the driver chooses."""
    if len(gsize) < 2 or not all(gsize):
        return None
    steps = [gsize[0]]
    for d in range(1, len(gsize)):
        steps.append(most * (1 if lsize is None else lsize[d]))
    if all(n <= step for n, step in zip(gsize, steps)):
        return None
    spans = [[(o, min(step, n - o)) for o in range(0, n, step)] for n, step in zip(gsize, steps)]
    return tuple((tuple(o for o, _ in piece), tuple(s for _, s in piece))
                 for piece in product(*spans))


def enqueue_pieces(queue: cl.CommandQueue, kernel: cl.Kernel, pieces: tuple, lsize,
                   wait_for=None) -> cl.Event:
    """Enqueue ``kernel`` (its arguments set) once per piece of ``grid_pieces``; the event of
    them all (a marker: on an out-of-order queue the last piece may end first)."""
    events = [cl.enqueue_nd_range_kernel(queue, kernel, size, lsize, offset, wait_for)
              for offset, size in pieces]
    return cl.enqueue_marker(queue, wait_for=events)
