"""Work that crosses command queues: what one queue waits for before it reads another queue's
tensor, and the barrier that keeps the owner's pool ordered after it (see ``parcl.pool``: a
buffer goes back to its own queue's pool, so that queue must not reuse it while another queue's
work may still touch it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyopencl as cl

from . import recorder
from .gate import release, release_all

if TYPE_CHECKING:
    from .tensor import Tensor


def foreign_wait(t: Tensor, queue: cl.CommandQueue) -> list[cl.Event] | None:
    """Events ``queue`` must wait for before it reads ``t`` (owned by another queue)."""
    if t.queue is queue or t.queue == queue:
        return None
    recorder.unsafe("work crosses command queues")
    event = cl.enqueue_marker(t.queue)
    release(t.queue)                  # another queue waits for it: nothing held back
    return [event]


def foreign_use(t: Tensor, event: cl.Event) -> None:
    """Order ``t``'s own queue after ``event`` (work another queue did on ``t``), so its pool
    never hands the buffer to new work while that event may still touch it."""
    if event is not None and event.get_info(cl.event_info.COMMAND_QUEUE) != t.queue:
        cl.enqueue_barrier(t.queue, wait_for=[event])
        release_all()               # that work must not wait behind a held gate (parcl.gate)
