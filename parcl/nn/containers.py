"""Small layers: ``Identity``, ``ModuleList`` and ``Softmax(dim)``, as PyTorch's.

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

from collections.abc import Iterable, Iterator

from ..errors import ParclError
from ..tape import ops
from .module import Module

__all__ = ["Identity", "ModuleList", "Softmax"]


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


class ModuleList(Module):
    """A list of modules, each registered as a child ``0``, ``1``, ...: ``append``,
    ``extend``, ``insert``, ``len``, iteration, indexing (negative too; a slice gives a new
    ModuleList) and assignment by index. It has no ``forward``: call its modules in your own.

    >>> layers = pc.nn.ModuleList([pc.nn.Linear(3, 3), pc.nn.ReLU()])
    >>> len(layers), type(layers[-1]).__name__
    (2, 'ReLU')
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, index: int) -> int:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ModuleList: index {index} is out of range for {n} modules")
        return index % n

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, index):
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(modules[index])
        return modules[self._index(int(index))]

    def __setitem__(self, index: int, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: expected an nn.Module, got {type(module).__name__}")
        self.add_module(str(self._index(int(index))), module)     # keeps its place

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before ``index``; later modules are renamed one up, as PyTorch."""
        modules = list(self._modules.values())
        modules.insert(index, module)
        for name in list(self._modules):
            self.__delattr__(name)
        self.extend(modules)

    def forward(self, *args, **kwargs):
        raise ParclError("ModuleList has no forward: iterate over it and call its modules")

    def __repr__(self) -> str:
        return f"ModuleList({len(self)})"


class Softmax(Module):
    """``tp.softmax`` along ``dim`` (any axis, negative from the end).

    >>> pc.nn.Softmax(dim=-1)(x).shape == x.shape
    True
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x):
        return ops.softmax(x, axis=self.dim)
