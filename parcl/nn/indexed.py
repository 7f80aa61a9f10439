"""What ``Sequential`` and ``ModuleList`` share, as PyTorch's: children named ``0``, ``1``, ...
by position, read, taken out (``del``, ``pop``) and inserted by index, renumbered after.

>>> import parcl as pc
>>> seq = pc.nn.Sequential(pc.nn.Linear(2, 2), pc.nn.ReLU(), pc.nn.Tanh())
>>> type(seq.pop(1)).__name__, [name for name, _ in seq.named_children()]
('ReLU', ['0', '1'])
"""

from __future__ import annotations

import operator

from ..errors import ParclError
from .module import Module

__all__ = ["ContainerError", "IndexedChildren"]


class ContainerError(ParclError, ValueError):
    """A container operation PyTorch refuses with a ``ValueError`` (``Sequential + list``,
    ``Sequential * 0``)."""


class IndexedChildren(Module):
    """Children addressed by position: ``del c[i]``, ``del c[a:b]`` and ``c.pop(i)`` take them
    out and rename the rest ``0``, ``1``, ..., as PyTorch's (a Sequential built from an
    OrderedDict loses its names then, as there)."""

    def _position(self, index) -> int:
        # operator.index, not int(): c[1.5] or c["1"] must not reach child 1 (PyTorch and
        # Python's list refuse them)
        name = type(self).__name__
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"{name}: index must be an int or a slice, got {index!r}") from None
        n = len(self._modules)
        if not -n <= index < n:
            raise IndexError(f"{name}: index {index} is out of range for {n} modules")
        return index % n

    def _renumber(self, modules: list[Module]) -> None:
        """Hold ``modules`` as the children ``0``, ``1``, ... in this order."""
        for name in list(self._modules):
            self.__delattr__(name)
        for i, module in enumerate(modules):
            self.add_module(str(i), module)

    def _inserted(self, index: int, module: Module) -> None:
        if not isinstance(module, Module):       # before any child is taken out
            raise TypeError(f"{type(self).__name__}.insert: expected an nn.Module, got "
                            f"{type(module).__name__}")
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._renumber(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __delitem__(self, index) -> None:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            del modules[index]
        else:
            del modules[self._position(index)]
        self._renumber(modules)

    def pop(self, index):
        """Take out and return the child at ``index`` (a slice: a container of them)."""
        taken = self[index]
        del self[index]
        return taken
