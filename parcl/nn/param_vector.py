"""PyTorch's ``parameters_to_vector`` and ``vector_to_parameters`` (``pc.nn.utils``): every
parameter flattened into one vector in the order given, and a vector's slices copied back.

>>> import numpy as np, parcl as pc
>>> layer = pc.nn.Linear(3, 2)
>>> vec = pc.nn.utils.parameters_to_vector(layer.parameters())
>>> vec.shape
(8,)
>>> pc.nn.utils.vector_to_parameters(vec * 0.0, layer.parameters())
>>> float(abs(layer.weight.value.to_host()).sum())
0.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..errors import DTypeError, ShapeError
from ..tape import ops
from ..tape.node import Node
from ..tensor import Tensor, check_same_queue

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def _parameters(op: str, parameters) -> list[Node]:
    params = [parameters] if isinstance(parameters, Node) else list(parameters)
    if not params:
        raise ShapeError(f"{op}: no parameters given")
    bad = [type(p).__name__ for p in params if not isinstance(p, Node)]
    if bad:
        raise DTypeError(f"{op}: expected Parameters (tp.Nodes), got a {bad[0]}")
    check_same_queue(op, *[p.value for p in params])
    return params


def parameters_to_vector(parameters: Iterable[Node]):
    """One 1-D vector of every parameter's elements, flattened in order (``tp.cat`` of their
    ``reshape``s: differentiable, as PyTorch's; a raw Tensor under ``no_grad``). All
    parameters must share one queue."""
    params = _parameters("parameters_to_vector", parameters)
    return ops.cat([ops.reshape(p, (math.prod(p.shape),)) for p in params])


def vector_to_parameters(vec, parameters: Iterable[Node]) -> None:
    """Copy consecutive slices of the 1-D ``vec`` into the parameters' values, in order and
    in place (PyTorch makes each parameter a view of ``vec``; here they keep their own
    buffers, so a later change to ``vec`` does not reach them). Not recorded. ``vec`` must
    hold exactly as many elements as the parameters together (PyTorch ignores a longer
    vector's tail): anything else is a ``ShapeError``."""
    if not isinstance(vec, (Node, Tensor)):
        raise DTypeError(f"vector_to_parameters: expected vec to be a pc.Tensor or tp.Node, "
                         f"got {type(vec).__name__}")
    value = vec.value if isinstance(vec, Node) else vec
    params = _parameters("vector_to_parameters", parameters)
    total = sum(math.prod(p.shape) for p in params)
    if value.ndim != 1 or value.shape[0] != total:
        raise ShapeError(f"vector_to_parameters: vec has shape {tuple(value.shape)}, expected "
                         f"({total},): the parameters' {total} elements")
    check_same_queue("vector_to_parameters", value, params[0].value)
    start = 0
    for p in params:
        n = math.prod(p.shape)
        p.value.copy_(value[start:start + n].reshape(p.shape))
        start += n
