"""``NodeMethods``: the operators and tensor-like methods of ``Node`` (``+ - * / @ **``,
``x[key]``, ``x.sum()``, ``x.reshape(...)``, ``float(x)``, ``np.asarray(x)``), each a thin
wrapper over the op of the same name in ``parcl.tape.ops``. Kept apart from ``node.py`` so
that the graph's data structure stays short; ``Node`` inherits them unchanged.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from . import mode


@cache
def _ops():
    # imported on first use (ops import node.py, which imports this); cached, as every
    # operator calls it
    from . import ops
    return ops


class NodeMethods:
    """Mixed into ``Node`` (which holds ``value``); no state of its own."""

    __slots__ = ()

    # -- operators: thin wrappers over the ops in parcl.tape.ops ------------------------
    def __add__(self, other):
        return _ops().add(self, other)

    def __radd__(self, other):
        return _ops().add(other, self)

    def __sub__(self, other):
        return _ops().sub(self, other)

    def __rsub__(self, other):
        return _ops().sub(other, self)

    def __mul__(self, other):
        return _ops().mul(self, other)

    def __rmul__(self, other):
        return _ops().mul(other, self)

    def __truediv__(self, other):
        return _ops().div(self, other)

    def __rtruediv__(self, other):
        return _ops().div(other, self)

    # ``x op= y``: under tp.no_grad in place on the value, as PyTorch's (the manual SGD step
    # ``p -= lr * p.grad`` updates the parameter; Python's fallback ``p = p - ...`` rebound
    # the loop variable to a new tensor and left the model unchanged, silently). While
    # recording, NotImplemented: the fallback records ``x = x op y``, a new Node.
    def _inplace(self, symbol: str, other):
        if mode.state.grad:
            return NotImplemented
        res = getattr(self.value, symbol)(other.value if isinstance(other, NodeMethods)
                                          else other)
        if res is NotImplemented:
            raise TypeError(f"Node {symbol}: unsupported operand {type(other).__name__}")
        return self

    def __iadd__(self, other):
        return self._inplace("__iadd__", other)

    def __isub__(self, other):
        return self._inplace("__isub__", other)

    def __imul__(self, other):
        return self._inplace("__imul__", other)

    def __itruediv__(self, other):
        return self._inplace("__itruediv__", other)

    def __ipow__(self, other):
        return self._inplace("__ipow__", other)

    def __matmul__(self, other):
        return _ops().matmul(self, other)

    def __rmatmul__(self, other):
        return _ops().matmul(other, self)

    def __neg__(self):
        return _ops().neg(self)

    def sum(self, axis=None, keepdims=False):
        return _ops().sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return _ops().mean(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        return _ops().reshape(self, shape)

    # -- PyTorch conveniences: x ** y, float(x), int(x), np.asarray(x) ------------------
    def __pow__(self, other):
        return _ops().pow(self, other)

    def __rpow__(self, other):
        return _ops().pow(other, self)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __bool__(self) -> bool:
        # the value's truth (pc.Tensor.__bool__), not every object's True
        return bool(self.value)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(node)``: a host copy of the value (see ``pc.Tensor.__array__``)."""
        return self.value.__array__(dtype, copy)

    def __getitem__(self, key):
        """``x[key]``: basic indexing (ints, slices with steps, None, ...), ``tp.getitem``."""
        return _ops().getitem(self, key)

    def __contains__(self, item) -> bool:
        # elementwise, as pc.Tensor.__contains__ (not each row compared by identity)
        return item in self.value

    def __len__(self) -> int:
        # the first dim, as pc.Tensor's and torch.Tensor's (0-d: a TypeError)
        return len(self.value)

    def __iter__(self):
        # rows, as pc.Tensor.__iter__: a 0-d Node is a TypeError, not an empty iteration
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # -- PyTorch's shape methods (``x.permute(1, 0)``, ``x.view(-1)``, ...) ---------------
    def view(self, *shape):
        """``x.view(*shape)``: ``x.reshape`` (parcl's tensors are contiguous: always a view)."""
        return self.reshape(*shape)

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return _ops().permute(self, dims)

    def movedim(self, source, destination):
        return _ops().movedim(self, source, destination)

    def t(self):
        return _ops().t(self)

    @property
    def T(self):  # noqa: N802
        """The dims reversed, as ``ndarray.T`` and ``pc.Tensor.T`` (``tp.transpose``)."""
        return _ops().transpose(self)

    def squeeze(self, dim=None):
        return _ops().squeeze(self, dim)

    def unsqueeze(self, dim):
        return _ops().unsqueeze(self, dim)

    def flatten(self, start_dim=0, end_dim=-1):
        return _ops().flatten(self, start_dim, end_dim)

    def unflatten(self, dim, sizes):
        return _ops().unflatten(self, dim, sizes)

    def chunk(self, chunks, dim=0):
        return _ops().chunk(self, chunks, dim)

    def unbind(self, dim=0):
        return _ops().unbind(self, dim)

    def narrow(self, dim, start, length):
        return _ops().narrow(self, dim, start, length)

    def repeat(self, *sizes):
        return _ops().repeat(self, *sizes)
