"""``ModelFollower``: replica 0's Python state made every replica's before a group's call.

A ``ReplicaGroup``'s ``group.model`` is replica 0's model, and the other replicas are copies
that only its Parameters and buffers are copied onto. What a training loop sets on the model
it holds would otherwise stay replica 0's, and the replicas would compute different
functions, silently: ``group.model.eval()`` (batch norm on running statistics on replica 0,
on batch statistics elsewhere), ``model.drop.p = 0.0``, ``layer.activation = tp.gelu``. So,
as PyTorch's ``DataParallel`` copies the module it replicates at every forward:

* every module's ``training`` flag is replica 0's (a few µs: one list walk), and every
  Parameter's ``requires_grad`` (``group.model.encoder.requires_grad_(False)`` freezes it
  on every replica, as a DDP loop freezes its one module);
* a plain attribute (``keys.capture_key``'s kinds: numbers, strings, tuples, lists, dicts,
  config objects, numpy arrays, functions) *assigned* on replica 0 between two calls is
  copied to the others, a copy of each mutable value (what a forward sets is each
  replica's own); changes made inside such a value in place (``model.cfg.x = 1``,
  ``arr[:] = ...``) are not seen: make those on every replica (``for r in group.replicas``);
* a module tree of other paths or types than replica 0's (an activation replaced on replica
  0 only) is a ParclError: a module is not copied across devices.

>>> import parcl as pc
>>> models = [pc.nn.Sequential(pc.nn.Linear(2, 2), pc.nn.Dropout(0.5)) for _ in range(2)]
>>> slots = [pc.nn.buffer_slots.ModelSlots(m) for m in models]
>>> follower = ModelFollower(slots[0])
>>> models[0].eval()[1].p = 0.0
>>> follower.follow(slots)
>>> models[1].training, models[1][1].p
(False, 0.0)
"""

from __future__ import annotations

import copy

from ..errors import ParclError
from ..tape import hooks
from ..tape.node import Node
from ..tensor import Tensor
from .buffer_slots import ModelSlots
from .keys import _NOT_PLAIN, _RESOURCES, Opaque, _frozen, _Unkeyable
from .module import Module

__all__ = ["ModelFollower"]

# what a module's __dict__ holds besides its attributes (registries, the mode followed apart)
_SKIPPED = frozenset(("_parameters", "_buffers", "_modules", "training", "_hooks",
                      "_non_persistent"))


class ModelFollower:
    """Follows the model of ``first`` (replica 0's ``ModelSlots``): ``follow(slots)``."""

    def __init__(self, first: ModelSlots):
        self.first = first
        self._hooks_seen = None       # every replica's ``_hook_ids`` when they last agreed
        # the hook generation and the module lists they were read at: no hook registered
        # or removed and no tree walked anew since, they are the same ids (not read again)
        self._hooks_at = (None, [])
        self.note()

    def note(self) -> None:
        """After a call: replica 0's attributes as its forwards left them. What a forward
        sets (a cached length, a counter) is each replica's own: only what is assigned
        between calls is the caller's, to copy."""
        # id(module) -> (module, its __dict__'s keys, their values)
        self._seen = {id(m): _snapshot(m) for m in self.first.modules}

    def follow(self, slots: list[ModelSlots], fresh: bool = False) -> None:
        """Every other model of ``slots`` given replica 0's modes, its Parameters'
        ``requires_grad`` and the plain attributes assigned on it since the last call. The
        module trees are the ones ``look`` last saw (``fresh``: walked now, for a call that
        does not look)."""
        if len(slots) < 2:
            return
        trees = [(s.modules, s.layout) if not fresh else _tree(s.model) for s in slots]
        first, layout = trees[0]
        for r, (_, other) in enumerate(trees[1:], 1):
            if other != layout:
                raise ParclError(_different_trees(r, layout, other))
        now, lists = hooks.generation(), [modules for modules, _ in trees]
        seen, seen_lists = self._hooks_at
        if now != seen or len(lists) != len(seen_lists) or any(
                a is not b for a, b in zip(lists, seen_lists)):
            ids = [_hook_ids(modules, s) for modules, s in zip(lists, slots)]
            if ids != self._hooks_seen:        # compared, not counted, while none changed
                _check_hooks(lists, layout, slots)
                self._hooks_seen = ids
            self._hooks_at = (now, lists)
        changed = self._assigned(first)
        wanted = [p is not None and p.requires_grad for p in slots[0].parameters.values()]
        for (modules, _), other in zip(trees[1:], slots[1:]):
            for a, b in zip(first, modules):
                if b.training != a.training:
                    object.__setattr__(b, "training", a.training)
            for want, p in zip(wanted, other.parameters.values()):
                if p is not None and p.requires_grad != want:     # None: an empty slot
                    p.requires_grad = want
            for j, names in changed:
                for name in names:
                    object.__setattr__(modules[j], name, copy.deepcopy(vars(first[j])[name]))

    def _assigned(self, modules: list[Module]) -> list[tuple[int, list[str]]]:
        """Per module of replica 0 (by position) the plain attributes assigned since the
        last call (all of them for a module not seen before: one put in place of another
        of its type); the snapshot updated."""
        out = []
        for j, m in enumerate(modules):
            seen = self._seen.get(id(m))
            now = vars(m)
            if seen is not None and seen[0] is m and _same(seen[2], now):
                continue
            old = dict(zip(seen[1], seen[2])) if seen is not None and seen[0] is m else {}
            names = [k for k, v in now.items() if k not in _SKIPPED
                     and (k not in old or old[k] is not v) and _plain(v)]
            self._seen[id(m)] = _snapshot(m)
            if names:
                out.append((j, names))
        if len(self._seen) > len(modules):      # modules replaced since: not kept alive
            self._seen = {id(m): self._seen[id(m)] for m in modules}
        return out


def _snapshot(m: Module) -> tuple:
    now = vars(m)
    return m, tuple(now), tuple(now.values())


def _same(values: tuple, now: dict) -> bool:
    # identity first (a tuple compares its items with `is` before `==`); a numpy attribute
    # replaced by another array raises in `==`: that is a change
    try:
        return len(values) == len(now) and values == tuple(now.values())
    except (ValueError, TypeError):
        return False


def _plain(value) -> bool:
    """A value to copy: plain (``capture_key``'s kinds) and holding no tensor. A tensor is
    bound to its replica's queue; one a forward keeps (attention weights to look at) is
    each replica's own."""
    try:
        frozen = _frozen(value)
    except _Unkeyable:           # a config object holding a lock, a cycle: not copied
        return False
    return frozen is not _NOT_PLAIN and not _holds_tensors(frozen)


def _holds_tensors(frozen) -> bool:
    # a queue too: each replica's own; and an object keyed by identity (a lock in a dict),
    # which a copy could not reproduce
    if isinstance(frozen, (Tensor, Node, Opaque, *_RESOURCES)):
        return True
    return isinstance(frozen, tuple) and any(_holds_tensors(v) for v in frozen)


def _tree(model: Module) -> tuple[list[Module], list]:
    named = list(model.named_modules())
    return [m for _, m in named], [(path, type(m)) for path, m in named]


def _hook_ids(modules: list[Module], slots: ModelSlots) -> list:
    """The handle ids of the hooks of every module and parameter (None: none registered):
    the same list while no hook was registered on or removed from them."""
    holders = [m._hooks for m in modules]
    holders += [None if p is None else p.entry.hooks for p in slots.parameters.values()]
    return [None if h is None else h.ids for h in holders]


def _hook_counts(modules: list[Module], slots: ModelSlots) -> list[tuple[str, int]]:
    counts = [(i, (0, 0, 0, 0) if m._hooks is None else m._hooks.counts())
              for i, m in enumerate(modules)]
    counts += [(path, 0 if p is None or p.entry.hooks is None
                else len(p.entry.hooks.fns) + len(p.entry.hooks.post))
               for path, p in slots.parameters.items()]
    return counts


def _check_hooks(trees: list[list[Module]], layout: list, slots: list[ModelSlots]) -> None:
    """Every replica's modules and parameters hold as many hooks as replica 0's: a hook
    registered on ``group.model`` (replica 0's) alone would change replica 0's output or
    gradients only, and the step average them with the others' unchanged ones."""
    first = _hook_counts(trees[0], slots[0])
    for r, (modules, other) in enumerate(zip(trees[1:], slots[1:]), 1):
        for (where, mine), (_, theirs) in zip(first, _hook_counts(modules, other)):
            if mine != theirs:
                path = layout[where][0] if isinstance(where, int) else where
                what = ("(forward pre, forward, backward pre, backward)"
                        if isinstance(where, int) else "gradient")
                raise ParclError(
                    f"ReplicaGroup: replica 0's {path or 'model'!r} has {mine} {what} hooks, "
                    f"replica {r}'s {theirs}: a hook registered on group.model runs on replica "
                    "0 only. Register hooks in build_model, or on every replica: "
                    "for r in group.replicas: r.model...register_...(hook)")


def _different_trees(r: int, layout: list, other: list) -> str:
    path, mine, theirs = next(((a[0], a[1].__name__, b[1].__name__)
                               for a, b in zip(layout, other) if a != b),
                              (None, len(layout), len(other)))
    where = (f"at {path!r}: replica 0 has a {mine}, replica {r} a {theirs}" if path is not None
             else f"({mine} modules, replica {r} {theirs})")
    return (f"ReplicaGroup: replica {r}'s model differs from replica 0's {where}; replicas "
            "must compute the same function: replace a module on every replica alike "
            "(for r in group.replicas: setattr(r.model, ...))")
