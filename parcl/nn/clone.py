"""``clone_module``: PyTorch's ``copy.deepcopy`` of a module, which ``copy.deepcopy`` of a parcl
module, Parameter or Tensor now runs (a pyopencl queue cannot itself be copied).

The copy has its own Parameters and buffers, device copies of the originals on the same
queue (``requires_grad`` kept, ``.grad`` not copied, as PyTorch's ``Parameter.__deepcopy__``);
a tensor two modules share (tied weights) stays shared in the copy; functions (an
activation) are shared, other attributes copied as ``copy.deepcopy`` copies them (a numpy
array, a config object), a queue or context shared.

>>> import copy, parcl as pc
>>> fc = pc.nn.Linear(4, 2)
>>> twin = copy.deepcopy(fc)
>>> twin.weight is fc.weight, twin.weight.value.queue is fc.weight.value.queue
(False, True)
"""

from __future__ import annotations

import copy
import types
from collections import OrderedDict

from ..tensor import Tensor
from .module import Module, Parameter

__all__ = ["clone_module", "clone_value"]

_SHARED = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
           types.ModuleType)


def clone_value(value, memo: dict):
    """``value`` copied as ``clone_module`` copies a module's attributes; ``memo`` is
    ``copy.deepcopy``'s (what is copied once stays one object in the copy)."""
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, Module):
        return clone_module(value, memo)
    if isinstance(value, Parameter):
        new = Parameter(value.value.copy(), requires_grad=value.requires_grad)
    elif isinstance(value, Tensor):
        new = value.copy()
    # these types exactly: a subclass (a defaultdict, a Counter) is copied by copy.deepcopy,
    # which keeps its type, as PyTorch's (rebuilt here as a dict, a defaultdict lost its
    # default and raised KeyError in the copy)
    elif type(value) is OrderedDict:
        new = OrderedDict((k, clone_value(v, memo)) for k, v in value.items())
    elif type(value) is dict:
        new = {k: clone_value(v, memo) for k, v in value.items()}
    elif type(value) is list:
        new = [clone_value(v, memo) for v in value]
    elif isinstance(value, _SHARED):
        return value          # functions, classes, Python modules: shared, as deepcopy does
    else:
        # other values as copy.deepcopy copies them (a numpy array, a config object, a set:
        # shared, a change to one layer's would change every copy's); what cannot be copied
        # (a queue, a context) is shared
        try:
            return copy.deepcopy(value, memo)
        except Exception:     # any refusal to be copied (a pyopencl object): share it
            return value
    memo[id(value)] = new
    return new


def clone_module(module: Module, memo: dict | None = None) -> Module:
    """A copy of ``module`` with its own Parameters and buffers (device copies of the
    originals, same queue, same ``requires_grad``), sub-modules copied the same way; a tensor
    shared by two modules (tied weights) stays shared in the copy. ``copy.deepcopy(module)``
    runs it, as PyTorch's.

    >>> fc = pc.nn.Linear(4, 2)
    >>> pc.nn.clone_module(fc).weight is fc.weight
    False
    """
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    new = object.__new__(type(module))
    memo[id(module)] = new
    for name, value in module.__dict__.items():
        object.__setattr__(new, name, clone_value(value, memo))
    return new
