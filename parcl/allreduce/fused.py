"""``Fused``: the whole end of a step in one kernel per replica and bucket.

Replica r's queue takes chunk r of every bucket: it sums that chunk of every replica's
gradients (in replica order, as ``direct`` does), zeroes them, steps replica 0's parameters
and optimizer state there and writes the new values into every other replica
(``parcl.kernels.optim``'s ``name_xK`` kernels). Each element is read and written once, and
the replicas share the work instead of replica 0 stepping everything while the others wait;
it is the arithmetic of ``Reduced``, so results are bit-identical to it.

The optimizer does it through its public flat-bucket interface (``prepare`` and ``launch``
with ``Replicated`` targets); where it cannot (a custom update, parameters of one bucket with
different options) the step ends as ``Reduced`` does.
"""

from __future__ import annotations

import pyopencl as cl

from ..gate import release_all
from ..kernels.optim import MAX_REPLICAS, Replicated
from ._common import chunk_bounds, order_after, pending
from .end import Reduced, StepBuffers, _plannable

__all__ = ["MAX_REPLICAS", "Fused"]


class Fused:
    """The fused end of a step on one process whose devices share one memory (the host's
    cores: ``end_of_step`` picks it only there). No fence after it: there the group waits for
    every queue before the next step is even enqueued."""

    def __init__(self):
        self.fallback = Reduced()

    def finish(self, buffers: StepBuffers, optimizer, max_norm: float | None = None):
        if max_norm is not None or not (_plannable(optimizer) and optimizer.replicable):
            return self.fallback.finish(buffers, optimizer, max_norm)
        plan = optimizer.prepare(buffers.buckets)     # validates first: a bad grad changes nothing
        if plan.single:
            return self.fallback.finish(buffers, optimizer, plan=plan)
        queues = buffers.queues
        k = len(queues)
        # Every replica's backward, and any optimizer state just allocated on replica 0, comes
        # before the chunks are touched. (One replica: its in-order queue does that.)
        if k > 1:
            _fence(queues)
        where = {id(bucket): b for b, bucket in enumerate(buffers.buckets)}

        def target(bucket) -> Replicated:
            b = where[id(bucket)]
            shards = [(q, off, cnt) for q, (off, cnt) in
                      zip(queues, chunk_bounds(bucket.value.size, k))]
            return Replicated([values.flats[b] for values in buffers.values],
                              [grads.flats[b] for grads in buffers.grads], shards)

        optimizer.launch(plan, targets=target)
        # A bucket the optimizer does not step (another optimizer's parameters) is not touched
        # by those kernels: zeroed here, as Reduced zeroes every gradient, or the next step
        # would add this one's gradients to its own. One whose every gradient is None (a
        # frozen layer) holds none: the next step's gather zeroes what it gives back.
        stepped = {id(bucket) for bucket, _, _ in plan.whole}
        for b, bucket in enumerate(buffers.buckets):
            if id(bucket) not in stepped and any(p.grad is not None for p in bucket.params):
                for grads in buffers.grads:
                    grads.flats[b].fill_owned(0)
        buffers.copy_buffers()      # after the fence: replica 0's forward updated them
        release_all()               # queues wait for each other's work: none of it held
        return None


def _fence(queues: list[cl.CommandQueue]) -> None:
    """Nothing enqueued on any queue from here on starts before everything enqueued so far on
    every other queue is done."""
    ready = [pending(q) for q in queues]
    for r, q in enumerate(queues):
        order_after(q, [e for i, e in enumerate(ready) if i != r])
