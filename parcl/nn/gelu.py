"""``GELU``: the GELU activation as a layer (``approximate="tanh"`` for GPT-2's form).

>>> import parcl as pc
>>> pc.nn.GELU(approximate="tanh")
GELU(approximate='tanh')
"""

from __future__ import annotations

from ..tape import ops
from .module import Module

__all__ = ["GELU"]


class GELU(Module):
    """``torch.nn.GELU``: exact ``x * Phi(x)`` (``approximate="none"``) or GPT-2's tanh
    approximation (``"tanh"``); see ``tp.gelu``.

    >>> act = pc.nn.GELU()
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
