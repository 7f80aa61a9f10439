"""``capture_key``: everything of a model a captured step's replay depends on besides its
inputs' shapes.

A recording (``parcl.recorder``) replays kernels on the very buffers the recorded call read.
So the key of a captured call must change whenever the eager call would read something else:

* which modules the model is made of, and of which type (``model.act = Sigmoid()`` replacing
  a ``Tanh`` enqueues other kernels, with no shape to show it);
* every module's ``training`` flag and plain Python attributes (what a forward branches on or
  passes into an op: ``Dropout.p``, ``ReLU.inplace``), and the functions it holds
  (``self.act = tp.relu``), by identity;
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

from ..tape.node import Node
from ..tensor import Tensor
from .module import Module

__all__ = ["capture_key", "loss_key"]

_PLAIN = (bool, int, float, complex, str, bytes, range, type(None))
_NOT_PLAIN = object()
_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              functools.partial)
_REGISTRIES = frozenset(("_parameters", "_buffers", "_modules"))   # not plain: skipped at once


def _frozen(value):
    """A hashable stand-in for an attribute value a forward may read: plain values (bool,
    int, float, complex, str, bytes, range, None, numpy scalars, enum members, and tuples
    (named ones too), lists, sets, dicts, dataclass instances and namespaces of them, keys
    included) and numpy arrays (their
    contents, hashed) by value; Tensors by identity, Nodes (Parameters) by
    identity with their value's; ``_NOT_PLAIN`` for anything else (a sub-module, which
    ``capture_key`` visits itself, an arbitrary object)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, Node):                 # a Parameter: the object and its values
        return (value, value.value)
    if isinstance(value, Tensor):               # a buffer, or a tensor the forward reads
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
        items = []
        for v in value:
            f = _frozen(v)
            if f is _NOT_PLAIN:
                return _NOT_PLAIN
            items.append(f)
        return (kind.__name__, tuple(items))
    if isinstance(value, dict):
        f = _frozen([*value.keys(), *value.values()])
        return _NOT_PLAIN if f is _NOT_PLAIN else ("dict", f)
    if isinstance(value, (set, frozenset)):
        # by value, as a list is (a forward may branch on membership: ``if i in self.skip``)
        f = _frozen(list(value))
        return _NOT_PLAIN if f is _NOT_PLAIN else (kind.__name__, frozenset(f[1]))
    if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or isinstance(
            value, _NAMESPACES):
        # a config object (nanoGPT's ``self.config``, ``argparse.Namespace``) of plain
        # values: by value, so ``model.cfg.dropout = 0.0`` is seen
        f = _frozen(dict(vars(value)) if hasattr(value, "__dict__") else
                    {field.name: getattr(value, field.name)
                     for field in dataclasses.fields(value)})
        return _NOT_PLAIN if f is _NOT_PLAIN else (kind.__qualname__, f)
    return _NOT_PLAIN


def _attributes(obj) -> tuple:
    # Parameters and buffers are attributes too (registration sets them): each is seen here,
    # a buffer set to None as well.
    return tuple((name, f) for name, value in vars(obj).items()
                 if name not in _REGISTRIES and (f := _frozen(value)) is not _NOT_PLAIN)


def capture_key(model) -> tuple:
    """Per module, in module order: the module itself and its type, its ``training`` flag and
    other plain Python attributes (bool, int, float, complex, str, bytes, range, None, numpy
    scalars, enum members, and tuples, lists, sets, dicts, dataclass instances and namespaces
    of them: a config object),
    numpy arrays by their contents, and the tensors it holds (each Parameter with its
    ``.value``, each buffer, any other Tensor attribute), by identity. A captured step
    (``ReplicaGroup(capture=True)``, ``tp.capture(..., key=...)``) is replayed only while this
    is unchanged, and recorded again when it changes: a module replaced by another (of any
    type), a parameter or buffer replaced by a new tensor, a mode or a setting changed.
    Changes *inside* a tensor (``copy_``, ``load_state_dict``, an optimizer step) keep the
    key: the replay reads the same buffers, so it sees them. For an object that is not a
    Module (a loss function), its type and plain attributes.

    >>> model = pc.nn.Dropout(0.5)
    >>> before = pc.nn.capture_key(model)
    >>> _ = model.eval()
    >>> pc.nn.capture_key(model) == before
    False
    """
    if not isinstance(model, Module):
        return ((type(model), _attributes(model)),)
    return tuple((m, type(m), _attributes(m)) for m in model.modules())


def loss_key(loss_fn) -> tuple | None:
    """What a captured step's replay depends on in ``loss_fn``: the ``capture_key`` of each
    loss module it is or reaches through a bound method (``crit.forward``), a
    ``functools.partial`` or a closure (``lambda out, y: crit(out, y)``), and the plain values
    it reads besides: a partial's arguments, a closure's variables, the module-level names
    its code uses (``label_smoothing=s``, ``* LOSS_SCALE``). A setting changed on any of
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
            continue
        if hasattr(fn, "__self__") and hasattr(fn, "__func__"):      # a bound method
            todo += [fn.__self__, fn.__func__]
            continue
        for name, value in _reads(fn):
            if isinstance(value, Module) or (callable(value) and not isinstance(value, type)):
                todo.append(value)
            elif (frozen := _frozen(value)) is not _NOT_PLAIN:
                keys.append((name, frozen))
    return tuple(keys) or None


def _reads(fn):
    """``(name, value)`` of what ``fn`` reads besides its arguments: a partial's own
    arguments and function; a function's closure variables, defaults and the module-level
    globals its code names."""
    if isinstance(fn, functools.partial):
        yield "func", fn.func
        yield from ((f"arg{i}", v) for i, v in enumerate(fn.args))
        yield from fn.keywords.items()
        return
    code = getattr(fn, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None)
                          or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:                   # a cell not yet filled
            continue
    yield "defaults", getattr(fn, "__defaults__", None)
    yield "kwdefaults", getattr(fn, "__kwdefaults__", None)
    scope = getattr(fn, "__globals__", {})
    for name in getattr(code, "co_names", ()):
        if name in scope:
            yield name, scope[name]
