"""Hooks: functions a backward calls on a Node's gradient (``Node.register_hook``), and the
handle that removes a hook, for these and for a module's forward hooks (``pc.nn.Module``).

A Node's hooks live on its graph ``Entry`` (``entry.hooks``: None until one is registered, so
an op records nothing more and a backward reads one field per node). The backward calls them,
in registration order, once the Node's gradient of that pass is complete: an inner Node's
before its op's backward reads it, a leaf's before it is added into ``.grad``. A hook returning
a tensor replaces the gradient from there on.

Registering or removing a hook on a leaf or a module between calls of a captured step
(``tp.capture``) makes its next call a new recording (``changes()`` is part of its key). A
hook registered by the step itself, while it is being recorded, is part of the step's Python:
its device work is replayed, its Python (a print, a list it appends to) is not.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from .. import recorder
from ..errors import DTypeError, ParclError, ShapeError
from ..tensor import Tensor

_ids = itertools.count()           # next() is atomic in CPython: ids unique across threads
_lock = threading.Lock()
_changes = 0


def changes() -> int:
    """How many times a hook was registered on or removed from a leaf or a module (outside
    a recording): a captured step keys its recordings on it."""
    return _changes


def note_change() -> None:
    """A hook registered or removed: a captured step records its next call anew (but not for
    one the step itself registers while it is recorded: that is its own Python)."""
    global _changes
    if recorder.current() is None:
        with _lock:
            _changes += 1


class RemovableHandle:
    """What ``register_*hook`` returns: ``handle.remove()`` takes the hook out (again: no
    effect); also a context manager that removes it on exit, as PyTorch's."""

    __slots__ = ("id", "_registries", "_counted")

    def __init__(self, *registries: dict, counted: bool = True):
        self.id = next(_ids)
        self._registries = registries
        self._counted = counted

    def remove(self) -> None:
        removed = False
        for registry in self._registries:
            removed = registry.pop(self.id, None) is not None or removed
        if removed and self._counted:
            note_change()

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> bool:
        self.remove()
        return False


class GradHooks:
    """A Node's hooks (``fns``: handle id -> hook, in registration order), a leaf's
    post-accumulate hooks (``post``), and whether its gradient is kept by a backward with
    ``retain_grads=False`` (``retain``)."""

    __slots__ = ("fns", "post", "retain")

    def __init__(self):
        self.fns: dict = {}
        self.post: dict = {}
        self.retain = False


def run_hooks(entry, grad: Tensor) -> Tensor:
    """``grad`` passed through ``entry``'s hooks, in registration order; each may return
    None (keep it) or a tensor of the same shape (replace it)."""
    for hook in tuple(entry.hooks.fns.values()):
        out = hook(grad)
        if out is None:
            continue
        value = getattr(out, "value", out)          # a Node: its value
        if not isinstance(value, Tensor):
            raise ParclError(f"hook {_name(hook)} on the gradient of '{entry.op_name}' "
                             f"returned a {type(out).__name__}: return a pc.Tensor shaped "
                             f"{entry.shape}, or None to keep the gradient")
        if tuple(value.shape) != tuple(entry.shape):
            raise ShapeError(f"hook {_name(hook)} on the gradient of '{entry.op_name}' "
                             f"returned shape {value.shape}, expected {entry.shape}")
        if value.dtype != np.float32:
            raise DTypeError(f"hook {_name(hook)} on the gradient of '{entry.op_name}' "
                             f"returned a {value.dtype} tensor; gradients are float32")
        grad = value
    return grad


def _name(hook) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__
