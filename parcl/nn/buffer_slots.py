"""``ModelBuffers``: a model's buffers (batch norm's running statistics) as the model holds
them now, checked cheaply.

Whoever keeps a model's buffer tensors for later (a ``ReplicaGroup`` copies replica 0's to the
other replicas after every step, and puts them aside before a step to undo a failed one) must
see a buffer replaced by a new tensor (``bn.running_mean = pc.Tensor.zeros(...)``, a reset),
else it keeps working on tensors the model no longer reads. Walking the whole model every step
would see it too, at a cost that grows with the model; ``changed()`` only looks at the modules
that hold buffers: each still at its place in the model, still holding the same tensors.

>>> import parcl as pc
>>> net = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.BatchNorm1d(3))
>>> watch = ModelBuffers(net)
>>> watch.changed()
False
>>> net[1].running_mean = pc.Tensor.zeros(pc.default_queue(), (3,))
>>> watch.changed(), watch.refresh()[0] is net[1].running_mean
(True, True)
"""

from __future__ import annotations

from ..tensor import Tensor
from .module import Module

__all__ = ["ModelBuffers"]


class ModelBuffers:
    """The buffers of ``model`` (``named_buffers()`` order, each tensor once), re-read by
    ``refresh()``; ``changed()`` says whether the model holds other ones now."""

    def __init__(self, model: Module):
        self.model = model
        self.refresh()

    def refresh(self) -> list[Tensor]:
        """Read the model's buffers again; returns them."""
        links: dict[tuple[int, str], tuple[Module, str, Module]] = {}
        slots, holders, seen, tensors = [], [], set(), []
        for chain, m in _paths(self.model, (), set()):
            if not m._buffers:
                continue
            for parent, name, child in chain:      # each link once: shared by sub-paths
                links[id(parent), name] = (parent, name, child)
            holders.append((m._buffers, len(m._buffers)))
            for name, t in m._buffers.items():
                slots.append((m._buffers, name, t))
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    tensors.append(t)
        # flat tuples: changed() runs before every step, a few identity checks per buffer
        self._links = tuple((parent._modules, name, child) for parent, name, child
                            in links.values())
        self._holders, self._slots = tuple(holders), tuple(slots)
        self.tensors = tensors
        return tensors

    def changed(self) -> bool:
        """Whether a buffer was replaced (or set to None, or registered on a module holding
        buffers), or a module on the way to one replaced, since the last ``refresh``. A
        buffer registered on a module that held none, or a new module with buffers where
        none was, is not seen."""
        for children, name, child in self._links:
            if children.get(name) is not child:
                return True
        for registry, count in self._holders:
            if len(registry) != count:
                return True
        for registry, name, t in self._slots:
            if registry.get(name, False) is not t:
                return True
        return False


def _paths(m: Module, chain: tuple, memo: set):
    """``(chain, module)`` in ``named_modules`` order (depth first, each module once); the
    chain is the ``(parent, name, child)`` links from the model down to the module."""
    if id(m) in memo:
        return
    memo.add(id(m))
    yield chain, m
    for name, child in m._modules.items():
        yield from _paths(child, (*chain, (m, name, child)), memo)
