"""PyTorch's integer ops: ``gcd lcm`` on int32/int64 tensors and ``bitwise_and bitwise_or
bitwise_xor bitwise_not`` on those and on bool masks (``Tensor.from_host`` of a bool array,
held as uint8 0/1). Integer results have no gradient, so these are never recorded (a Node
operand is read through its value); a Python int on either side of a binary one becomes a
0-d tensor of the other's dtype. Float tensors are a DTypeError, as in PyTorch.

>>> a = pc.Tensor.from_host(q, np.array([12, -18, 0, 5], np.int64))
>>> tp.gcd(a, 8).to_host(), tp.lcm(a, 8).to_host()
(array([4, 2, 8, 1]), array([24, 72,  0, 40]))
>>> tp.bitwise_xor(a, 1).to_host(), tp.bitwise_not(a).to_host()
(array([ 13, -17,   1,   4]), array([-13,  17,  -1,  -6]))
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

from ...errors import DTypeError
from ...kernels import integer as ik
from ...tensor import Tensor, keep_checks
from ..node import Node

__all__ = ["bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "gcd", "lcm"]


def _is_int(v) -> bool:
    return isinstance(v, (Integral, np.integer)) and not isinstance(v, bool)


def _tensor(op: str, v):
    v = v.value if isinstance(v, Node) else v
    if not isinstance(v, Tensor) and not _is_int(v) and not isinstance(v, bool):
        raise DTypeError(f"{op}: expected a tp.Node, pc.Tensor or int, got {type(v).__name__}")
    return v


def _binary(op: str, a, b) -> Tensor:
    a, b = _tensor(op, a), _tensor(op, b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise DTypeError(f"{op}: both operands are numbers; pass a pc.Tensor")
    if not isinstance(a, Tensor):
        a = Tensor.full(b.queue, (), int(a), b.dtype)
    elif not isinstance(b, Tensor):
        b = Tensor.full(a.queue, (), int(b), a.dtype)
    return keep_checks(ik.binary(op, a, b), a, b)


def gcd(input, other) -> Tensor:  # noqa: A002
    """``torch.gcd``: the greatest common divisor of ``|input|`` and ``|other|``
    (``gcd(0, 0) = 0``), broadcasting; int32 or int64."""
    return _binary("gcd", input, other)


def lcm(input, other) -> Tensor:  # noqa: A002
    """``torch.lcm``: the least common multiple, non-negative (0 where either is 0)."""
    return _binary("lcm", input, other)


def bitwise_and(input, other) -> Tensor:  # noqa: A002
    """``input & other`` bit by bit (on bool masks: logical and), broadcasting."""
    return _binary("bitwise_and", input, other)


def bitwise_or(input, other) -> Tensor:  # noqa: A002
    """``input | other`` bit by bit."""
    return _binary("bitwise_or", input, other)


def bitwise_xor(input, other) -> Tensor:  # noqa: A002
    """``input ^ other`` bit by bit."""
    return _binary("bitwise_xor", input, other)


def bitwise_not(input) -> Tensor:  # noqa: A002
    """``~input``: every bit flipped (``-x - 1``); a bool mask negated."""
    x = _tensor("bitwise_not", input)
    if not isinstance(x, Tensor):
        raise DTypeError("bitwise_not: expected a tp.Node or pc.Tensor, got a number")
    return keep_checks(ik.bitwise_not(x), x)
