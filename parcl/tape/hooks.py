"""Hooks: functions a backward calls on a Node's gradient (``Node.register_hook``), and the
handle that removes a hook, for these and for a module's forward hooks (``pc.nn.Module``).

A Node's hooks live on its graph ``Entry`` (``entry.hooks``: None until one is registered, so
an op records nothing more and a backward reads one field per node). The backward calls them,
in registration order, once the Node's gradient of that pass is complete: an inner Node's
before its op's backward reads it, a leaf's before it is added into ``.grad``. A hook returning
a tensor replaces the gradient from there on.

The hooks' holders (a Node's ``GradHooks``, a module's ``ModuleHooks``) keep ``ids``, the
handle ids of the hooks they hold, in order: a captured step (``tp.capture``) replays a
recording only while the leaves and modules it used hold the hooks its call left them with,
so a hook registered on or removed from one of them between calls makes the next call
another recording, and one on any other tensor or module changes nothing (``HookState``;
a count of every registration and removal on a leaf or a module, ``generation``, spares it
and ``nn.follow`` the comparison of every holder's ids while none happened). A hook the step
itself registers while it is being recorded is part of the step's Python: its device work
is replayed, its Python (a print, a list it appends to) is not.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np

from ..errors import DTypeError, ParclError, ShapeError
from ..tensor import Tensor

_ids = itertools.count()           # next() is atomic in CPython: ids unique across threads


class _Changes:
    """How many times a leaf's or a module's ``ids`` changed in this process: a hint only,
    that lets a check of many holders' ids (``HookState.hold``, ``nn.follow``) skip its walk
    while no such hook was registered or removed; the per-holder comparison stays the truth.
    Locked: a lost increment could bring the count back to one a checker verified."""

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()

    def bump(self) -> None:
        with self._lock:
            self.count += 1


_changes = _Changes()


def generation() -> int:
    """The count of hook registrations and removals so far (``_Changes``): read it before
    reading the holders' ids it vouches for."""
    return _changes.count


def hooks_changed() -> None:
    """A leaf's or a module's hook ``ids`` were just renewed (a registration or removal):
    the generation moves on. Not ``tape.changes.note_change``, which notes a value changed
    in place."""
    _changes.bump()


class RemovableHandle:
    """What ``register_*hook`` returns: ``handle.remove()`` takes the hook out (again: no
    effect); also a context manager that removes it on exit, as PyTorch's. ``owner``: the
    ``GradHooks`` or ``ModuleHooks`` whose ``registry`` holds the hook, renewed on removal."""

    __slots__ = ("id", "_owner", "_registry")

    def __init__(self, owner, registry: dict):
        self.id = next(_ids)
        self._owner = owner
        self._registry = registry

    def remove(self) -> None:
        if self._registry.pop(self.id, None) is not None:
            self._owner.renew()

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> bool:
        self.remove()
        return False


class GradHooks:
    """A Node's hooks (``fns``: handle id -> hook, in registration order), a leaf's
    post-accumulate hooks (``post``), and whether its gradient is kept by a backward with
    ``retain_grads=False`` (``retain``); ``ids``: the handle ids of both kinds of hooks, in
    order, renewed by every registration and removal. ``entry``: the graph entry holding them
    (weakly)."""

    __slots__ = ("fns", "post", "retain", "ids", "entry")

    def __init__(self, entry):
        self.fns: dict = {}
        self.post: dict = {}
        self.retain = False
        self.ids: tuple = ()
        self.entry = weakref.ref(entry)

    def renew(self) -> None:
        self.ids = (*self.fns, *self.post)
        # Only a leaf's hooks are compared (``HookState``): those on an inner node (a full
        # backward hook registers one every forward) leave the generation, and the walks it
        # spares, be. Asked now, not when built: a released graph's nodes are leaves.
        entry = self.entry()
        if entry is not None and entry.grad_fn is None:
            hooks_changed()


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


class HookState:
    """The hooks a captured call left on the leaves and modules it used (each holder's
    ``ids``; hooks the call registers and removes itself are its Python): its recording, or
    its verdict that it cannot be replayed, stands only while they ``hold``. A hook
    registered on or removed from one of them makes the next call another recording (or
    lifts the verdict); one on any other tensor or module changes nothing. ``HookState()``,
    of no holders, always holds: a verdict that no hook can lift."""

    __slots__ = ("leaves", "modules", "seen", "held")

    def __init__(self, leaf_entries=(), modules=()):
        self.seen, self.held = generation(), True       # read first: a change after is seen
        # weakly, both: a verdict (no recording) outlives the model, and would pin a leaf's
        # .grad with its entry
        self.leaves = [(weakref.ref(e), _handle_ids(e.hooks)) for e in leaf_entries]
        self.modules = [(weakref.ref(m), m.hook_ids) for m in modules]

    def hold(self) -> bool:
        """Whether every leaf and module holds the hooks it was left with (one dropped since
        holds: nobody uses it again). Run before every replay: compared holder by holder
        only when a hook on some leaf or module was registered or removed since the last
        comparison (``generation``)."""
        now = generation()
        if now != self.seen:
            self.seen, self.held = now, self._compare()
        return self.held

    def _compare(self) -> bool:
        for ref, ids in self.leaves:
            e = ref()
            if e is not None and _handle_ids(e.hooks) != ids:
                return False
        for ref, ids in self.modules:
            module = ref()
            if module is not None and module.hook_ids != ids:
                return False
        return True


def _handle_ids(hooks) -> tuple:
    return () if hooks is None else hooks.ids
