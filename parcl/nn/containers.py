"""Small layers and containers: ``Identity``, ``ModuleList``, ``ModuleDict``, ``ParameterList``,
``ParameterDict`` and ``Softmax(dim)``, as PyTorch's.

``ModuleList`` registers its modules as children named ``0``, ``1``, ..., so their parameters
are ``0.weight``, ``1.weight``, ... in ``state_dict()`` (``h.0.attn.c_attn.weight`` inside a
model), exactly PyTorch's keys.

>>> import parcl as pc
>>> blocks = pc.nn.ModuleList([pc.nn.Linear(4, 4) for _ in range(2)])
>>> blocks.append(pc.nn.Identity())
ModuleList(3)
>>> [name for name, _ in blocks.named_parameters()]
['0.weight', '0.bias', '1.weight', '1.bias']
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain

from ..errors import ParclError
from ..tape import ops
from .activation import legacy_softmax_dim
from .indexed import IndexedChildren
from .layers import _dim
from .module import Module, Parameter

__all__ = ["Identity", "ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Softmax"]


class Identity(Module):
    """Returns its input unchanged (a placeholder layer; extra arguments are ignored, as
    PyTorch's).

    >>> pc.nn.Identity()(x) is x
    True
    """

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class ModuleList(IndexedChildren):
    """A list of modules, each registered as a child ``0``, ``1``, ...: ``append``,
    ``extend``, ``insert``, ``pop``, ``del`` (by index or slice; the rest renumbered), ``+``
    and ``+=``, ``len``, iteration, indexing (negative too; a slice gives a new ModuleList)
    and assignment by index, as PyTorch's. It has no ``forward``: call its modules in your
    own.

    >>> layers = pc.nn.ModuleList([pc.nn.Linear(3, 3), pc.nn.ReLU()])
    >>> len(layers), type(layers[-1]).__name__
    (2, 'ReLU')
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, index):
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(modules[index])
        return modules[self._position(index)]

    def __setitem__(self, index: int, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: expected an nn.Module, got {type(module).__name__}")
        self.add_module(str(self._position(index)), module)     # keeps its place

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(chain(self, other))

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before ``index``; later modules are renamed one up, as PyTorch."""
        self._inserted(index, module)

    def forward(self, *args, **kwargs):
        raise ParclError("ModuleList has no forward: iterate over it and call its modules")

    def __repr__(self) -> str:
        return f"ModuleList({len(self)})"


class ModuleDict(Module):
    """Modules by name, each registered as a child of that name (so ``state_dict`` keys are
    ``name.weight``), in insertion order: indexing, assignment, ``del``, ``in``, ``len``,
    iteration over the names, ``keys``/``values``/``items``, ``update``, ``pop``, ``clear``.
    Names follow ``add_module``'s rules (non-empty, no ``.``). No ``forward``, as PyTorch's.

    >>> heads = pc.nn.ModuleDict({"cls": pc.nn.Linear(4, 2), "reg": pc.nn.Linear(4, 1)})
    >>> list(heads), [k for k, _ in heads.named_parameters()][:2]
    (['cls', 'reg'], ['cls.weight', 'cls.bias'])
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict[{key!r}]: expected an nn.Module, got "
                            f"{type(module).__name__}")
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        if key not in self._modules:
            raise KeyError(key)
        self.__delattr__(key)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def keys(self) -> list[str]:
        return list(self._modules)

    def values(self) -> list[Module]:
        return list(self._modules.values())

    def items(self) -> list[tuple[str, Module]]:
        return list(self._modules.items())

    def update(self, modules) -> None:
        """Add or replace from a mapping or an iterable of ``(name, module)`` pairs."""
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for pair in pairs:
            key, module = pair
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        for key in self.keys():
            del self[key]

    def forward(self, *args, **kwargs):
        raise ParclError("ModuleDict has no forward: call its modules in your own")

    def __repr__(self) -> str:
        return f"ModuleDict({', '.join(self._modules)})"


def _parameter(where: str, value) -> Parameter:
    if not isinstance(value, Parameter):
        raise TypeError(f"{where}: expected a pc.nn.Parameter, got {type(value).__name__}")
    return value


class ParameterList(Module):
    """Parameters in a list, registered as ``0``, ``1``, ... (``state_dict`` keys ``0``,
    ``1``, ...; ``name.0`` inside a model): ``append``, ``extend``, ``+=``, ``len``,
    iteration, indexing (a slice gives a ParameterList of the same Parameters) and assignment
    by index, as PyTorch's.

    >>> ps = pc.nn.ParameterList([pc.nn.Parameter.from_host(None, np.zeros(2, np.float32))])
    >>> [k for k, _ in ps.named_parameters()]
    ['0']
    """

    def __init__(self, values: Iterable[Parameter] | None = None):
        super().__init__()
        if values is not None:
            self.extend(values)

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(list(self._parameters.values()))

    def __getitem__(self, index):
        values = list(self._parameters.values())
        if isinstance(index, slice):              # the same Parameters, as PyTorch's
            return ParameterList(values[index])
        if not -len(values) <= index < len(values):
            raise IndexError(f"ParameterList: index {index} is out of range for "
                             f"{len(values)} parameters")
        return values[index]

    def __setitem__(self, index: int, value: Parameter) -> None:
        self[index]                                    # in range, or IndexError
        self.register_parameter(str(index % len(self)), _parameter("ParameterList", value))

    def append(self, value: Parameter) -> ParameterList:
        self.register_parameter(str(len(self)), _parameter("ParameterList", value))
        return self

    def extend(self, values: Iterable[Parameter]) -> ParameterList:
        for value in values:
            self.append(value)
        return self

    def __iadd__(self, values: Iterable[Parameter]) -> ParameterList:
        return self.extend(values)

    def forward(self, *args, **kwargs):
        raise ParclError("ParameterList has no forward: use its parameters in your own")

    def __repr__(self) -> str:
        return f"ParameterList({len(self)})"


class ParameterDict(Module):
    """Parameters by name (``state_dict`` keys are the names), in insertion order (a plain
    ``dict`` given to the constructor or ``update`` sorted by key first, as PyTorch does):
    indexing, assignment, ``del``, ``in``, ``len``, iteration over the names (``reversed``
    too), ``keys``/``values``/``items``, ``get``, ``pop``, ``popitem``, ``setdefault``,
    ``clear``, ``copy``, ``fromkeys``, ``update`` and ``|``/``|=``, as PyTorch's."""

    def __init__(self, parameters: Mapping[str, Parameter] | Iterable | None = None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]

    def __setitem__(self, key: str, value: Parameter) -> None:
        self.register_parameter(key, _parameter(f"ParameterDict[{key!r}]", value))

    def __delitem__(self, key: str) -> None:
        if key not in self._parameters:
            raise KeyError(key)
        self.__delattr__(key)

    def __contains__(self, key) -> bool:
        return key in self._parameters

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._parameters))

    def keys(self) -> list[str]:
        return list(self._parameters)

    def values(self) -> list[Parameter]:
        return list(self._parameters.values())

    def items(self) -> list[tuple[str, Parameter]]:
        return list(self._parameters.items())

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._parameters))

    def get(self, key: str, default=None):
        return self._parameters[key] if key in self._parameters else default

    def pop(self, key: str) -> Parameter:
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, Parameter]:
        """Take out and return the last ``(name, parameter)`` pair, as PyTorch's."""
        if not self._parameters:
            raise KeyError("popitem(): ParameterDict is empty")
        key = next(reversed(self._parameters))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Parameter | None = None) -> Parameter:
        if key not in self._parameters:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        for key in self.keys():
            del self[key]

    def copy(self) -> ParameterDict:
        """A new ParameterDict holding the same Parameters, in this order."""
        return ParameterDict(OrderedDict(self._parameters))

    def fromkeys(self, keys: Iterable[str], default: Parameter | None = None
                 ) -> ParameterDict:
        """A new ParameterDict with ``default`` under every key, as PyTorch's."""
        return ParameterDict([(key, default) for key in keys])

    def __or__(self, other: ParameterDict) -> ParameterDict:
        merged = self.copy()
        merged.update(other)
        return merged

    def __ror__(self, other: ParameterDict) -> ParameterDict:
        merged = other.copy()
        merged.update(self)
        return merged

    def __ior__(self, other: ParameterDict) -> ParameterDict:
        self.update(other)
        return self

    def update(self, parameters) -> None:
        """Add or replace from a mapping or an iterable of ``(name, parameter)`` pairs. As
        PyTorch's: an ``OrderedDict``, a ParameterDict or pairs keep their order, a plain
        ``dict`` (an unordered mapping to PyTorch) goes in sorted by key, so
        ``parameters()`` (what an optimizer's state is matched by) has PyTorch's order."""
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = parameters.items()
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items(), key=lambda pair: pair[0])
        else:
            pairs = parameters
        for key, value in pairs:
            self[key] = value

    def forward(self, *args, **kwargs):
        raise ParclError("ParameterDict has no forward: use its parameters in your own")

    def __repr__(self) -> str:
        return f"ParameterDict({', '.join(self._parameters)})"


class Softmax(Module):
    """``tp.softmax`` along ``dim`` (any axis, negative from the end); ``dim=None`` takes
    PyTorch's legacy choice (0 for 0-, 1- and 3-D inputs, else 1) with its deprecation
    warning, as ``LogSoftmax`` does.

    >>> pc.nn.Softmax(dim=-1)(x).shape == x.shape
    True
    """

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = None if dim is None else _dim("Softmax", dim)

    def forward(self, x):
        dim = self.dim
        if dim is None:
            dim = legacy_softmax_dim("Softmax", len(x.shape))
        return ops.softmax(x, axis=dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
