"""The subclasses ``parametrize``, ``prune`` and the older ``weight_norm``/``spectral_norm``
give a module (parcl's modules have no hooks: the computed attribute is a property of the
module's class). Each kind is one layer over the module's own class, and layers of different
kinds stack as PyTorch's hooks and parametrizations do: changing or removing one kind's layer
rebuilds the layers above it on what is below, so the others' properties stay.

Classes are made once per (class below, kind, key): every replica of a model (each built in
its own thread) must have the same classes, which a ReplicaGroup checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["set_layer"]

_CLASSES: dict[tuple, type] = {}
_LOCK = threading.Lock()


def set_layer(module, kind: str, key, make: Callable[[type, object], type]) -> None:
    """Give ``module`` the layer ``make(below, key)`` of ``kind`` (in its place where it has
    one, else on top), or none of that kind where ``key`` is None; the other kinds' layers
    are kept, in their order."""
    layers = []
    cls = type(module)
    while "_class_layer" in vars(cls):
        layers.append(vars(cls)["_class_layer"])
        cls = cls.__bases__[0]
    layers.reverse()
    mine = (kind, key, make)
    kinds = [layer[0] for layer in layers]
    if kind in kinds:
        i = kinds.index(kind)
        layers[i:i + 1] = [mine] if key is not None else []
    elif key is not None:
        layers.append(mine)
    for layer in layers:
        with _LOCK:
            made = _CLASSES.get((cls, layer[0], layer[1]))
            if made is None:
                made = layer[2](cls, layer[1])
                made._class_layer = layer
                _CLASSES[(cls, layer[0], layer[1])] = made
        cls = made
    module.__class__ = cls
