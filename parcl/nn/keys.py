"""``capture_key``: everything of a model a captured step's replay depends on besides its
inputs' shapes.

A recording (``parcl.recorder``) replays kernels on the very buffers the recorded call read.
So the key of a captured call must change whenever the eager call would read something else:

* which modules the model is made of, and of which type (``model.act = Sigmoid()`` replacing
  a ``Tanh`` enqueues other kernels, with no shape to show it);
* every module's ``training`` flag and plain Python attributes (what a forward branches on or
  passes into an op: ``Dropout.p``, ``ReLU.inplace``), and the functions it holds
  (``self.act = tp.relu``), by identity;
* the plain module-level values its ``forward`` reads (``* SCALE``), the class attributes
  it reads through ``self`` (``temperature = 1.0`` in the class body), and those of the
  functions and methods it calls by name (``self._head(h)``);
* which tensors it reads: each parameter's Parameter object and its ``.value`` Tensor, each
  buffer (``bn.running_mean = pc.Tensor.zeros(...)`` replacing one) and any other Tensor or
  Node held as an attribute.

Objects are put in the key themselves, not their ``id()``: they compare by identity, and a
key kept beside a recording keeps them alive, so the memory a replay writes cannot have been
handed to another tensor meanwhile (an ``id`` of a dropped object could also be reused).

>>> import parcl as pc
>>> bn = pc.nn.BatchNorm1d(3)
>>> before = pc.nn.capture_key(bn)
>>> bn.running_mean = pc.Tensor.zeros(pc.default_queue(), (3,))
>>> pc.nn.capture_key(bn) == before
False
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import hashlib
import types

import numpy as np
import pyopencl as cl

from ..tape.capture import Unkeyed
from ..tape.node import Node
from ..tensor import Tensor
from .module import Module

__all__ = ["capture_key", "loss_key"]

_PLAIN = (bool, int, float, complex, str, bytes, range, type(None))
_NOT_PLAIN = object()
_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              functools.partial)
# a device resource a module may hold (its queue): which one, by identity, never its insides
_RESOURCES = (cl.CommandQueue, cl.Context, cl.Device)
# not plain: skipped at once (hooks: a registration or removal on a module a step used
# records anew by itself, ``tape.hooks``)
_REGISTRIES = frozenset(("_parameters", "_buffers", "_modules", "_hooks"))
# Bounds on what a config object is keyed through: nesting deeper than this is a cycle or a
# data structure rather than settings, and so are more values than this in all (a vocabulary,
# a diamond of shared objects); either makes the object unkeyable.
_MAX_DEPTH = 8
_LIBRARY = __name__.split(".")[0] + "."      # "parcl.": whose layers' forwards are not walked
_MAX_ITEMS = 1024


class Opaque:
    """An object a container holds with nothing to key by value (a lock): keyed by identity,
    and held, so no other object takes its id while a key lives."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other) -> bool:
        return type(other) is Opaque and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


class _Unkeyable(Exception):
    """A config object holding what cannot be keyed by value (the message says what)."""


def _frozen(value, depth: int = 0, budget: list | None = None, found: list | None = None):
    """A hashable stand-in for an attribute value a forward may read: plain values (bool,
    int, float, complex, str, bytes, range, None, numpy scalars, enum members, and tuples
    (named ones too), lists, sets, dicts and config objects of them, keys included) and numpy
    arrays (their contents, hashed) by value; Tensors by identity, Nodes (Parameters) by
    identity with their value's, queues and functions by identity; ``_NOT_PLAIN`` for a
    sub-module (which ``capture_key`` visits itself) or an object with no ``__dict__`` (a
    lock). A config object (a dataclass, a namespace, any other instance with a
    ``__dict__``) is keyed by its attributes' values; one holding what is not plain, or
    deeper or larger than the bounds, raises ``_Unkeyable``: it could change unseen.
    ``budget`` (one counter) bounds the values keyed below a config object. ``found`` (a
    list, from ``capture_key``): a module *inside* a list, tuple, dict, set or config object
    (``self.acts = [ReLU()]``, never registered) is keyed by identity and appended to it, so
    its own attributes are keyed too, instead of the whole container being ``_NOT_PLAIN``:
    ``self.acts[0] = Sigmoid()`` must record the step again."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, Module):               # first: most attributes that are not plain
        if depth == 0 or found is None:         # a registered sub-module: visited itself
            return _NOT_PLAIN
        found.append(value)
        return ("module", value)
    if isinstance(value, Node):                 # a Parameter: the object and its values
        return (value, value.value)
    if isinstance(value, (Tensor, *_RESOURCES)):    # a buffer, a tensor the forward reads
        return value
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        # a host array the forward may upload: a replay uploads the copy its recording took,
        # so a change inside the array must change the key (its contents, hashed)
        data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        return ("ndarray", value.shape, value.dtype.str,
                hashlib.blake2b(data, digest_size=16).digest())
    if isinstance(value, np.generic):           # np.float64(...) is a float too
        return (kind.__name__, value.item())
    if isinstance(value, enum.Enum):
        return (kind.__qualname__, value.name)
    if isinstance(value, _FUNCTIONS):
        # an op a forward calls (``self.act = tp.relu``): by identity, so ``tp.sigmoid`` in
        # its place is another recording, not a replay of the ReLU's kernels
        return ("function", value)
    if isinstance(value, (tuple, list)):
        _spend(kind, len(value), depth, budget)
        items = []
        for v in value:
            f = _frozen(v, depth + 1, budget, found)
            if f is _NOT_PLAIN:
                if isinstance(v, (Module, tuple, list, dict, set, frozenset)):
                    return _NOT_PLAIN
                # an object with nothing to key by value (a lock beside the settings,
                # ``{"lock": l, "scale": s}``) by identity, as an attribute of its own is
                # skipped: dropping the whole container replayed the old scale after it changed
                f = Opaque(v)
            items.append(f)
        return (kind.__name__, tuple(items))
    if isinstance(value, dict):
        f = _frozen([*value.keys(), *value.values()], depth, budget, found)
        return _NOT_PLAIN if f is _NOT_PLAIN else ("dict", f)
    if isinstance(value, (set, frozenset)):
        # by value, as a list is (a forward may branch on membership: ``if i in self.skip``)
        f = _frozen(list(value), depth, budget, found)
        return _NOT_PLAIN if f is _NOT_PLAIN else (kind.__name__, frozenset(f[1]))
    if isinstance(value, (type, types.ModuleType)) or not (hasattr(value, "__dict__") or (
            dataclasses.is_dataclass(value))):
        return _NOT_PLAIN
    return _config(value, depth, budget, found)


def _config(value, depth: int, budget: list | None, found: list | None = None):
    """A config object (nanoGPT's ``self.config``, an ``argparse.Namespace``, an instance of
    a plain class) by its attributes' values, so ``model.cfg.dropout = 0.0`` is seen; one
    holding a lock or anything else not plain (a module, unless ``found`` collects it) raises
    ``_Unkeyable``, since the forward may read it and a change inside it could not be
    seen."""
    kind = type(value)
    fields = (vars(value) if hasattr(value, "__dict__") else
              {field.name: getattr(value, field.name) for field in dataclasses.fields(value)})
    budget = [_MAX_ITEMS] if budget is None else budget
    _spend(kind, len(fields), depth, budget)
    items = []
    for name, v in fields.items():
        f = _frozen(v, depth + 1, budget, found)
        if f is _NOT_PLAIN:
            raise _Unkeyable(f"{kind.__qualname__}.{name} holds a {type(v).__qualname__}, "
                             "which is not keyed by value")
        items.append((name, f))
    return (kind.__qualname__, tuple(items))


def _spend(kind, n: int, depth: int, budget: list | None) -> None:
    # only below a config object (budget given) or past the depth bound (a list holding
    # itself): a module's own long list stays keyed in full, as it was
    if depth > _MAX_DEPTH:
        raise _Unkeyable(f"a {kind.__qualname__} nested deeper than {_MAX_DEPTH} levels "
                         "(a cycle?)")
    if budget is not None:
        budget[0] -= n
        if budget[0] < 0:
            raise _Unkeyable(f"more than {_MAX_ITEMS} values below a config object")


def _attributes(obj, found: list | None = None) -> tuple:
    # Parameters and buffers are attributes too (registration sets them): each is seen here,
    # a buffer set to None as well.
    return tuple((name, f) for name, value in vars(obj).items()
                 if name not in _REGISTRIES and (f := _frozen(value, 0, None, found))
                 is not _NOT_PLAIN)


def capture_key(model) -> tuple | Unkeyed:
    """Per module, in module order: the module itself and its type, its ``training`` flag and
    other plain Python attributes (bool, int, float, complex, str, bytes, range, None, numpy
    scalars, enum members, and tuples, lists, sets, dicts and config objects of them: a
    dataclass, a namespace, a plain class's instance, by its attributes' values),
    numpy arrays by their contents, and the tensors it holds (each Parameter with its
    ``.value``, each buffer, any other Tensor attribute), by identity. A captured step
    (``ReplicaGroup(capture=True)``, ``tp.capture(..., key=...)``) is replayed only while this
    is unchanged, and recorded again when it changes: a module replaced by another (of any
    type), a parameter or buffer replaced by a new tensor, a mode or a setting changed.
    Modules held in a plain list, tuple, dict, set or config object (never registered:
    ``self.acts = [pc.nn.ReLU()]``) are keyed by identity and visited as well.
    Changes *inside* a tensor (``copy_``, ``load_state_dict``, an optimizer step) keep the
    key: the replay reads the same buffers, so it sees them. For an object that is not a
    Module (a loss function), its type and plain attributes. A config object that cannot be
    keyed by value (it holds a lock or a sub-module, a cycle, too much) gives an ``Unkeyed``
    naming it instead: the step then runs eagerly, as an unreplayable recording does, since
    a replay could not see a change inside it.

    >>> model = pc.nn.Dropout(0.5)
    >>> before = pc.nn.capture_key(model)
    >>> _ = model.eval()
    >>> pc.nn.capture_key(model) == before
    False
    """
    if not isinstance(model, Module):
        try:
            return ((type(model), _attributes(model)),)
        except _Unkeyable as exc:
            return _unkeyed_attribute(model, exc)
    keys = []
    todo = model.modules()
    seen = {id(m) for m in todo}
    for m in todo:                  # grows: the modules held in lists, dicts, config objects
        found: list[Module] = []
        try:
            keys.append((m, type(m), _attributes(m, found), _forward_reads(m, found)))
        except _Unkeyable as exc:
            return _unkeyed_attribute(m, exc)
        for held in found:
            for sub in held.modules():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    todo.append(sub)
    return tuple(keys)


def _forward_reads(module, held: list) -> tuple:
    """``(name, key)`` of the module-level values ``module``'s ``forward`` names, the class
    attributes it reads through ``self`` (``* self.temperature`` held by the class), and
    those of the module-level functions and the methods it calls by name (one level down):
    a replay would run the kernels of the value it was recorded with (``* SCALE``,
    ``if USE_GELU:``). Plain values by value, functions by identity, modules (a layer made
    at module level, ``ACT = pc.nn.LeakyReLU(0.5)``) by identity and appended to ``held``
    for ``capture_key`` to key as well; other objects are
    skipped, as ``loss_key`` skips them (the library's own state is among them). parcl's
    own layers are skipped whole: their forwards read only the library's constants and
    functions, which a script does not set, and walking them doubled the guard's cost (MLP
    11 -> 28 us)."""
    kind = type(module)
    if kind.__module__.startswith(_LIBRARY):
        return ()
    forward = _function_of(getattr(kind, "forward", None))
    if forward is None:
        return ()
    # the script's own classes of the module: what ``self.name`` finds on the class (a class
    # attribute ``temperature = 1.0``, a helper method ``self._head(h)``) when the instance
    # does not hold it
    classes = [k for k in kind.__mro__ if k is not object and not k.__module__.startswith(
        _LIBRARY)]
    keys, called = [], []
    _global_reads(forward, keys, called, classes, held)
    for fn in called:
        _global_reads(fn, keys, None, classes, held)
    return tuple(keys)


def _global_reads(fn, keys: list, called: list | None, classes: list, held: list) -> None:
    scope = fn.__globals__
    names = _names(fn.__code__)
    for name in names:
        # a global, and what an attribute of that name is on the module's class (a method
        # by identity, and its reads): a helper method's reads and a class attribute's
        # value were left out, so ``SCALE = 3.0`` read in ``self._head`` (or
        # ``Net.temperature = 3.0``) replayed the old value
        found = [(name, scope[name])] if name in scope else []
        found += [(f"{k.__qualname__}.{name}", vars(k)[name]) for k in classes
                  if name in vars(k)]
        if name in scope:
            found += _module_settings(scope[name], names)
        for where, value in found:
            code = _function_of(value)
            if code is not None and called is not None and code is not fn:
                called.append(code)
            if isinstance(value, Module):       # its settings: ``ACT.negative_slope = 3.0``
                held.append(value)
                keys.append((where, ("module", value)))
                continue
            try:
                frozen = _frozen(value)
            except _Unkeyable:
                continue
            if frozen is not _NOT_PLAIN:
                keys.append((where, frozen))


def _function_of(value):
    """The Python function a forward runs when it names ``value``: a function itself, a
    ``staticmethod``'s or ``classmethod``'s, a ``property``'s getter (``self._temper(h)``,
    ``* self.scale``); their reads were left out, so ``h / SCALE`` in a static helper
    replayed the recorded scale. None for anything else. A decorated one
    (``functools.wraps``: ``@tp.no_grad()``, a timing decorator) is the function it wraps,
    whose code is what reads the settings: the wrapper's hid them."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    if type(value) is not types.FunctionType:
        return None
    for _ in range(_MAX_DEPTH):             # a chain of decorators (bounded: no cycle)
        inner = getattr(value, "__wrapped__", None)
        if type(inner) is not types.FunctionType:
            break
        value = inner
    return value


def _methods_named(kind: type, fn) -> list:
    """``(name, function)`` of the methods (static and class methods and property getters
    too) of the script's own classes in ``kind`` that ``fn``'s code names: what a loss
    object's ``__call__`` or a bound method runs besides its own code (``self._ce(o, y)``
    reading ``* LOSS_SCALE``), one level down, as ``_forward_reads`` walks a forward's."""
    code = getattr(_function_of(fn) or fn, "__code__", None)
    if code is None:
        return []
    classes = [k for k in kind.__mro__ if k is not object and not k.__module__.startswith(
        _LIBRARY)]
    found = []
    for name in _names(code):
        where = next((k for k in classes if name in vars(k)), None)
        method = None if where is None else _function_of(vars(where)[name])
        if method is not None and method is not fn:
            found.append((f"{where.__qualname__}.{name}", method))
    return found


def _module_settings(value, names) -> list:
    """``(owner.name, value)`` of the plain settings that code naming ``names`` may read from
    ``value`` when it is a Python module (``config.SCALE`` after ``import config``) or a
    class of the script's own holding settings (``Config.scale``): neither is a plain value,
    so ``config.SCALE = 3.0`` (or ``Config.scale = 3.0``) replayed the recorded scale.
    Functions, classes and modules in it are left out (parcl's and numpy's ops)."""
    if type(value) is types.ModuleType:
        owner = value.__name__
    elif isinstance(value, type) and value.__module__ not in ("builtins", "typing") and \
            not value.__module__.startswith(_LIBRARY):
        owner = value.__qualname__
    else:
        return []
    scope = vars(value)
    return [(f"{owner}.{n}", scope[n]) for n in names if n in scope
            and not callable(scope[n]) and type(scope[n]) is not types.ModuleType]


def _names(code) -> tuple:
    """The global and attribute names ``code`` uses, its comprehensions' and lambdas' too
    (code objects of their own)."""
    names = code.co_names
    for const in code.co_consts:
        if type(const) is types.CodeType:
            names = names + _names(const)
    return names


def _unkeyed_attribute(obj, exc: _Unkeyable) -> Unkeyed:
    """The ``Unkeyed`` a step runs eagerly for, naming the attribute (searched for again:
    only an unkeyable object pays for the search)."""
    for name, value in vars(obj).items():
        try:
            _frozen(value, 0, None, [])
        except _Unkeyable:
            return Unkeyed(f"{type(obj).__qualname__}.{name}: {exc}")
    return Unkeyed(f"{type(obj).__qualname__}: {exc}")


def loss_key(loss_fn) -> tuple | Unkeyed | None:
    """What a captured step's replay depends on in ``loss_fn``: the ``capture_key`` of each
    loss module it is or reaches through a bound method (``crit.forward``), a
    ``functools.partial`` or a closure (``lambda out, y: crit(out, y)``), and the plain values
    it reads besides: a partial's arguments, a closure's variables, the attributes of an
    object it is or is bound to (a class with ``__call__``), the module-level names its code
    uses (``label_smoothing=s``, ``* LOSS_SCALE``). A setting changed on any of
    them records the step again (a replay would run the recorded value's kernels); None
    when there is none."""
    keys, seen, todo = [], set(), [loss_fn]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if isinstance(fn, Module):
            keys.append(capture_key(fn))
            if type(keys[-1]) is Unkeyed:          # the whole loss is then unkeyed
                return keys[-1]
            continue
        if hasattr(fn, "__self__") and hasattr(fn, "__func__"):      # a bound method
            todo += [fn.__self__, fn.__func__,
                     *(f for _, f in _methods_named(type(fn.__self__), fn.__func__))]
            continue
        for name, value, is_global in _reads(fn):
            if isinstance(value, Module) or (callable(value) and not isinstance(value, type)):
                todo.append(value)
                continue
            try:
                frozen = _frozen(value)
            except _Unkeyable as exc:
                if is_global:
                    # the library's own state among them (a threading.local, a lock's
                    # holder): only a global's plain value is keyed, as before
                    continue
                return Unkeyed(f"{getattr(fn, '__qualname__', type(fn).__qualname__)} reads "
                               f"{name}: {exc}")
            if frozen is not _NOT_PLAIN:
                keys.append((name, frozen))
    return tuple(keys) or None


def _reads(fn):
    """``(name, value, is_global)`` of what ``fn`` reads besides its arguments: a partial's
    own arguments and function; an object's attributes and its ``__call__``; a function's
    closure variables, defaults and the module-level globals its code names."""
    if isinstance(fn, functools.partial):
        yield "func", fn.func, False
        yield from ((f"arg{i}", v, False) for i, v in enumerate(fn.args))
        yield from ((k, v, False) for k, v in fn.keywords.items())
        return
    if not isinstance(fn, (*_FUNCTIONS, type, types.ModuleType)) and hasattr(fn, "__dict__"):
        # an object called as the loss (a class with ``__call__``, or a bound method's
        # ``self``): what it holds (``self.w``, a loss module) and what its ``__call__``
        # reads; reading none of it replayed the recorded weight after ``loss.w = 3.0``
        yield from ((name, v, False) for name, v in vars(fn).items())
        call = next((vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)),
                    None)                           # a Python function: its reads too
        if type(call) is types.FunctionType:
            yield "__call__", call, False
            yield from ((name, f, False) for name, f in _methods_named(type(fn), call))
        return
    code = getattr(fn, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None)
                          or ()):
        try:
            yield name, cell.cell_contents, False
        except ValueError:                   # a cell not yet filled
            continue
    yield "defaults", getattr(fn, "__defaults__", None), False
    yield "kwdefaults", getattr(fn, "__kwdefaults__", None), False
    scope = getattr(fn, "__globals__", {})
    names = _names(code) if code is not None else ()
    for name in names:
        if name in scope:
            yield name, scope[name], True
            yield from ((n, v, True) for n, v in _module_settings(scope[name], names))
