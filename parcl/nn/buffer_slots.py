"""``ModelSlots``: which Parameters and buffers a model holds, at which paths, checked cheaply.

Whoever keeps a model's tensors for later must see the model hold other ones. A
``ReplicaGroup``'s flat buckets and its optimizer hold the Parameters the models held when the
group was built; it copies replica 0's buffers (batch norm's running statistics) to the other
replicas after every step and puts them aside before a step to undo a failed one. A Parameter
replaced (``fc.weight = Parameter(...)``, a new layer in place of one, a layer with parameters
where there was none) would leave it training objects the model no longer reads; a buffer
replaced by a new tensor (a reset of the statistics) must be read again.

``look()`` compares every module's three registries (parameters, buffers, children) with
copies taken when they were last read: one comparison in C per registry while nothing changed
(ResNet-18, 68 modules: a few µs), a walk of the model naming every changed path when
something did. A module without parameters or buffers replaced by another (an activation) is
no change to report: it is noted, and later looks compare against the model as it is now.

>>> import numpy as np
>>> import parcl as pc
>>> net = pc.nn.Sequential(pc.nn.Linear(4, 3), pc.nn.BatchNorm1d(3))
>>> slots = ModelSlots(net)
>>> slots.look() is None
True
>>> net[1].running_mean = pc.Tensor.zeros(pc.default_queue(), (3,))
>>> slots.look().buffers_replaced, slots.tensors[0] is net[1].running_mean
(True, True)
>>> net[0].weight = pc.nn.Parameter.from_host(None, np.zeros((3, 4), np.float32))
>>> [change.path for change in slots.look().parameters]
['0.weight']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tensor import Tensor
from .module import Module, Parameter

__all__ = ["ABSENT", "ModelChange", "ModelSlots", "SlotChange"]


class _Absent:
    """What a slot that does not exist holds (a buffer slot may hold None)."""

    def __repr__(self) -> str:
        return "nothing"


ABSENT = _Absent()


@dataclass(frozen=True)
class SlotChange:
    """A path of the model (``"0.weight"``) that holds another object than it did."""

    path: str
    old: object          # ABSENT: the model had no such slot
    new: object          # ABSENT: it has none now


@dataclass(frozen=True)
class ModelChange:
    """What ``ModelSlots.look`` found: Parameters that are not the ones read (by path: a
    new one, one gone, one where there was none), buffer slots added or removed, and
    whether a buffer slot that is still there holds another tensor."""

    parameters: list[SlotChange] = field(default_factory=list)
    buffer_slots: list[SlotChange] = field(default_factory=list)
    buffers_replaced: bool = False

    @property
    def structural(self) -> bool:
        """Other Parameters or other buffer slots: more than new tensors to read."""
        return bool(self.parameters or self.buffer_slots)


class ModelSlots:
    """The Parameters (``parameters``: path -> Parameter, fixed when made) and buffers
    (``buffers``: path -> tensor or None; ``tensors``: each tensor once, in that order, as
    ``named_buffers()``) of ``model``, and ``look()``, which says what it holds now."""

    def __init__(self, model: Module):
        self.model = model
        self.parameters, self.buffers = _slots(model)
        self.tensors = _unique(self.buffers.values())
        self._note()

    def _note(self) -> None:
        named = list(self.model.named_modules())
        # the module tree as of this look: valid until a registry changes (``look`` notes
        # again then), so following replica 0's (``nn.follow``) needs no walk of the model
        self.modules = [m for _, m in named]
        self.layout = [(path, type(m)) for path, m in named]
        registries = [r for m in self.modules for r in (m._parameters, m._buffers, m._modules)]
        # Most registries are empty (a ReLU's, a layer's children): a truth test each, which
        # is cheaper than comparing them with empty copies.
        self._held = [r for r in registries if r]
        self._copies = [dict(r) for r in self._held]
        self._empty = [r for r in registries if not r]

    def look(self) -> ModelChange | None:
        """None while the model holds the Parameters, buffer slots and buffer tensors read;
        else what differs. Buffers replaced by new tensors while every Parameter and slot is
        the same are read again (``tensors``), and reported once; other Parameters or buffer
        slots are reported at every look until the model holds the recorded ones again."""
        # Values compare by identity first; parcl's Modules, Parameters and Tensors define no
        # __eq__, so nothing but the very objects compares equal.
        if self._held == self._copies and not any(self._empty):
            return None
        parameters, buffers = _slots(self.model)
        moved = _differences(self.parameters, parameters)
        slots = _differences({p: b for p, b in self.buffers.items() if p not in buffers},
                             {p: b for p, b in buffers.items() if p not in self.buffers})
        replaced = any(buffers[p] is not b for p, b in self.buffers.items() if p in buffers)
        if moved or slots:
            return ModelChange(moved, slots, replaced)
        self.buffers = {p: buffers[p] for p in self.buffers}    # the order they were read in
        self.tensors = _unique(self.buffers.values())
        self._note()
        return ModelChange(buffers_replaced=True) if replaced else None


def _slots(model: Module) -> tuple[dict[str, Parameter], dict[str, Tensor | None]]:
    """Every parameter slot and buffer slot by path (a tied Parameter under each of its
    paths), in ``named_modules`` and registration order."""
    parameters, buffers = {}, {}
    for prefix, m in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        for name, p in m._parameters.items():
            parameters[dot + name] = p
        for name, b in m._buffers.items():
            buffers[dot + name] = b
    return parameters, buffers


def _differences(old: dict, new: dict) -> list[SlotChange]:
    """The paths of ``old`` then those only in ``new`` whose objects differ."""
    paths = [*old, *(p for p in new if p not in old)]
    return [SlotChange(p, old.get(p, ABSENT), new.get(p, ABSENT)) for p in paths
            if old.get(p, ABSENT) is not new.get(p, ABSENT)]


def _unique(tensors) -> list[Tensor]:
    seen, out = set(), []
    for t in tensors:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out
