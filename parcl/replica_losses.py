"""A loss module's tensors on every replica's queue, for ``ReplicaGroup.step``.

A loss module may hold tensors (``BCEWithLogitsLoss(pos_weight=w)``, class weights), made on
the caller's queue. The replicas run the loss on their own queues, in contexts of their own,
where an op refuses a tensor of another context. So, as a DDP script moves its loss module to
its device, each replica gets its own copy of the module (``LossCopies.for_replicas``): the
same attributes, with every buffer uploaded to its queue. Before each step the copies take
what the caller set on the module since (attributes, ``training``) and, where the source
tensors' values changed (``crit.pos_weight.fill_(2.0)``), the new values, written into the
same device buffers: a captured step's replay reads them there.

>>> import numpy as np, parcl as pc
>>> crit = pc.nn.BCEWithLogitsLoss(pos_weight=pc.Tensor.from_host(
...     pc.default_queue(), np.array([2.0], np.float32)))
>>> queues = [pc.new_queue(d) for d in pc.devices(split=2)]
>>> copies = LossCopies(queues).for_replicas(crit)
>>> [c.pos_weight.queue is q for c, q in zip(copies, queues)]
[True, True]
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .errors import ParclError
from .nn.module import Module
from .pool import pool_of
from .tensor import Tensor

__all__ = ["LossCopies"]

MAX_KEPT = 4          # loss modules whose copies a group keeps (a main and auxiliary losses)


@dataclass
class _Copies:
    """One loss module's copies: ``source`` (held, so its id is not reused), per replica its
    copy, the source tensors they were made from (by identity) and their last host values."""

    source: Module
    copies: list
    tensors: tuple
    values: list


class HostValues:
    """Host copies of tensors the caller holds (a loss module's weights), read again only
    after a change made through parcl (``copy_``, ``fill_``, ``+=``, ``load_state_dict``:
    the queue pool's overwrite stamps), not at every step: each read waits for the queue."""

    def __init__(self):
        self.kept: dict[int, tuple] = {}        # id(t) -> (t, its change's stamp, array)

    def __call__(self, t: Tensor) -> np.ndarray:
        change = pool_of(t.queue).overwrites.get(t.data.int_ptr)
        when = None if change is None else change.when
        kept = self.kept.pop(id(t), None)
        if kept is None or kept[0] is not t or kept[1] != when:
            kept = (t, when, t.to_host())
        self.kept[id(t)] = kept                  # most recently used last
        while len(self.kept) > 4 * MAX_KEPT:
            self.kept.pop(next(iter(self.kept)))
        return kept[2]


class LossCopies:
    """Per-replica copies of the loss modules a group's steps are given (``for_replicas``);
    ``host`` the host values of their tensors (``HostValues``)."""

    def __init__(self, queues: list):
        self.queues = list(queues)
        self.kept: dict[int, _Copies] = {}
        self.host = HostValues()

    def check(self, loss_fn) -> None:
        """Refuse a loss module with parameters: no replica's optimizer step would reduce
        or update them alike."""
        if isinstance(loss_fn, Module) and any(
                p is not None for m in loss_fn.modules() for p in m._parameters.values()):
            raise ParclError(f"ReplicaGroup.step: the loss module {type(loss_fn).__name__} "
                             f"has parameters, which no replica's optimizer step would reduce "
                             f"or update alike; make them part of the model")

    def for_replicas(self, loss_fn) -> list:
        """Per replica the loss function to call: ``loss_fn`` itself unless it is a module
        holding tensors, else its copy on that replica's queue, brought up to date."""
        k = len(self.queues)
        if not isinstance(loss_fn, Module):
            return [loss_fn] * k
        self.check(loss_fn)
        tensors = tuple(b for m in loss_fn.modules() for b in m._buffers.values()
                        if b is not None)
        if not tensors:
            return [loss_fn] * k
        kept = self.kept.pop(id(loss_fn), None)
        if kept is None or kept.source is not loss_fn or len(kept.tensors) != len(tensors) \
                or any(a is not b for a, b in zip(kept.tensors, tensors)):
            kept = _Copies(loss_fn, [_copy(loss_fn, q) for q in self.queues], tensors,
                           [None] * len(tensors))
        self.kept[id(loss_fn)] = kept            # most recently used last
        while len(self.kept) > MAX_KEPT:
            self.kept.pop(next(iter(self.kept)))
        for c in kept.copies:
            _follow(loss_fn, c)
        self._upload_changes(kept)
        return kept.copies

    def _upload_changes(self, kept: _Copies) -> None:
        """The source tensors' values written into every copy where they changed (the same
        host array from ``host``: unchanged)."""
        for i, t in enumerate(kept.tensors):
            host = self.host(t)
            if host is kept.values[i]:
                continue
            kept.values[i] = host
            for c, q in zip(kept.copies, self.queues):
                _buffers_of(c)[i].copy_owned(Tensor.from_host(q, host))


def _buffers_of(module: Module) -> list:
    return [b for m in module.modules() for b in m._buffers.values() if b is not None]


def _copy(module: Module, queue) -> Module:
    """``module`` with every buffer a new tensor on ``queue`` (its values come with the first
    upload) and every submodule copied alike; other attributes shared until ``_follow``."""
    c = copy.copy(module)
    d = c.__dict__
    d["_buffers"] = type(module._buffers)(
        (name, None if b is None else Tensor.empty(queue, b.shape, b.dtype))
        for name, b in module._buffers.items())
    d["_modules"] = type(module._modules)(
        (name, None if m is None else _copy(m, queue)) for name, m in module._modules.items())
    d.update(d["_buffers"])
    d.update(d["_modules"])
    return c


def _follow(source: Module, c: Module) -> None:
    """``c``'s plain attributes and ``training`` made ``source``'s again (what the caller set
    on the loss module since the last step), its own buffers and submodules kept."""
    own = c.__dict__
    for name, value in source.__dict__.items():
        if name in ("_buffers", "_modules", "_parameters") or name in source._buffers \
                or name in source._modules:
            continue
        own[name] = value
    for name, m in source._modules.items():
        if m is not None:
            _follow(m, own["_modules"][name])

