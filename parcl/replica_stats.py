"""``sync_batchnorm``: batch statistics over every replica's batch (and every rank's).

A group exchanges for every training-mode batch norm with ``sync_batchnorm=True``
(``every_layer``), or for its ``pc.nn.SyncBatchNorm`` layers alone when its model has some.

At each training-mode batch norm, every replica thread hands its per-channel partials to the
exchange and gets everybody's back, stacked in replica order (then rank order), as a tensor on
its own queue: the statistics, and in the backward the gradient sums, are then those of the
global batch, so a data-parallel step equals the single-replica full-batch step. The partials
stay on the devices (one context): each queue copies the others' after an event, with no host
wait; across ranks replica 0 gathers them through ``comm``. The threads meet at a barrier
twice per exchange (bounded by the group's timeout; a failing replica aborts it, so nobody
waits for it).

>>> exchange = StatsExchange(queues, comm=None, timeout=600)
>>> mode.set_batch_stats_sync(exchange.member(index))      # in replica `index`'s thread
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl

from . import recorder
from .allreduce._common import wait_limit
from .errors import ReplicaError
from .gate import release
from .tape import mode
from .tensor import Tensor

_DONE = object()          # a replica's slot once its step is over


class StatsExchange:
    """The meeting point of one group's replica threads (see the module docstring)."""

    def __init__(self, queues: list[cl.CommandQueue], comm=None, timeout: float = 600.0,
                 every_layer: bool = True):
        self.queues, self.comm = list(queues), comm
        self.every_layer = bool(every_layer)
        k = len(self.queues)
        # (a lock's wait takes at most TIMEOUT_MAX: a timeout of inf waits that long)
        self.barrier = threading.Barrier(k, timeout=min(timeout, threading.TIMEOUT_MAX))
        self.slots: list = [None] * k            # (partials, ready event, count) per replica
        self.reads: list[list] = [[] for _ in range(k)]   # (whose, event) copies each made
        self.host: tuple | None = None           # across ranks: (partials, counts) on the host
        self.told: list | None = None            # what the ranks said where one was not here

    def member(self, index: int) -> Member:
        return Member(self, index)

    def start(self) -> None:
        """Before a step: a barrier broken by a failed step is usable again."""
        if self.barrier.broken:
            self.barrier.reset()
        self.slots = [None] * len(self.queues)
        self.told = None

    def settled(self) -> list | None:
        """Where a rank that was not at an exchange (its replicas failed before it, or its
        step reached no more batch norms) met it with its step's agreement
        (``replica_steps.agreed``), that collective's answers: it was this step's agreement
        too, and no rank makes another."""
        told, self.told = self.told, None
        return told

    def abort(self) -> None:
        """A replica failed: every replica waiting here (or arriving) stops at once."""
        self.barrier.abort()

    def synced(self, run):
        """``run`` (a replica's part of a step, ``run(replica, *args)``) with its batch norms'
        statistics exchanged here (``parcl.tape.mode.batch_stats_sync``)."""
        def step(replica, *args):
            member = self.member(replica.index)
            mode.set_batch_stats_sync(member)
            try:
                outcome = run(replica, *args)
            except BaseException:
                self.abort()            # nobody waits for this replica any more
                raise
            finally:
                mode.set_batch_stats_sync(None)
            member.leave()
            return outcome
        return step


class Member:
    """One replica's side of the exchange: ``gather`` (``parcl.tape.mode.batch_stats_sync``)."""

    def __init__(self, exchange: StatsExchange, index: int):
        self.exchange, self.index = exchange, index

    @property
    def every_layer(self) -> bool:
        """Whether every training-mode batch norm exchanges (``sync_batchnorm=True``), or only
        those that ask (``pc.nn.SyncBatchNorm``'s, ``tp.batch_norm(..., sync=True)``)."""
        return self.exchange.every_layer

    def gather(self, part: Tensor, count: int) -> tuple[Tensor, np.ndarray]:
        """Every replica's ``part`` (same shape), stacked in replica order on this replica's
        queue, and their counts."""
        ex, r = self.exchange, self.index
        q = ex.queues[r]
        # Work that waits on other queues' events: a recorded step could not replay it.
        recorder.unsafe("sync_batchnorm exchanges batch statistics between replicas")
        ex.slots[r] = (part, cl.enqueue_marker(q), float(count))
        release(q)                 # the others' copies wait for it (parcl.gate)
        ex.barrier.wait()                                      # every part is enqueued
        slots = list(ex.slots)
        done = [i for i, s in enumerate(slots) if s is _DONE]
        if done:
            raise ReplicaError(f"sync_batchnorm: replica {r} reached a batch norm that replica "
                               f"{done[0]} did not (it finished its step or run); every replica "
                               "must run the same layers", index=r)
        k = len(slots)
        stacked = Tensor.empty(q, (k, *part.shape))
        reads = []
        for i, (p, ready, _) in enumerate(slots):
            event = cl.enqueue_copy(q, stacked.data, p.data, byte_count=p.nbytes,
                                    dst_offset=i * p.nbytes,
                                    wait_for=None if i == r else [ready])
            if i != r:
                reads.append((i, event))
        ex.reads[r] = reads
        release(q)
        counts = np.array([s[2] for s in slots], np.float32)
        if ex.comm is not None and r == 0:
            ex.host = _across_ranks(ex, stacked, counts)
        ex.barrier.wait()                                      # every copy is enqueued
        # This replica's part may go back to its pool only once the others have read it.
        mine = [e for j in range(k) for i, e in ex.reads[j] if i == r]
        if mine:
            cl.enqueue_barrier(q, wait_for=mine)
        if ex.comm is not None:
            host_parts, counts = ex.host
            stacked = Tensor.from_host(q, host_parts)
        return stacked, counts

    def leave(self) -> None:
        """This replica's step is over: one that still waits for it learns so."""
        ex = self.exchange
        ex.slots[self.index] = _DONE
        release(ex.queues[self.index])
        try:
            ex.barrier.wait()
        except threading.BrokenBarrierError:
            pass                     # another replica failed (or got _DONE and raised)


def _across_ranks(ex: StatsExchange, stacked: Tensor, counts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's stacked partials and counts, in rank order (the same on every rank).
    A rank not at this exchange answers from its step's agreement instead (its failure, or
    None where its step ended without this batch norm): then this collective was the step's
    agreement, and this rank's step fails as every other rank's does."""
    # the read beside the collective waits as long as the group's collectives may (Bounded)
    everyone = ex.comm.allgather((stacked.to_host(wait_limit(ex.comm)), counts))
    absent = [rank for rank, said in enumerate(everyone) if not isinstance(said, tuple)]
    if absent:
        ex.told = everyone
        said = everyone[absent[0]]
        raise ReplicaError(f"sync_batchnorm: rank {absent[0]} is not at this batch norm's "
                           f"exchange: " + (f"its step failed ({said.splitlines()[0]})"
                                            if said is not None else
                                            "its step ended without reaching it"), index=0)
    return (np.concatenate([parts for parts, _ in everyone], axis=0),
            np.concatenate([c for _, c in everyone]))
