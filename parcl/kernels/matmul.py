"""numpy's matmul of raw tensors: the plan of a product (1-D operands promoted, batch
dims broadcast) and its one GEMM launch. ``tp.matmul``'s forward and ``pc.Tensor.__matmul__``
both run ``planned_product``, so a raw product equals the recorded one bit for bit.

>>> import numpy as np, parcl as pc
>>> q = pc.default_queue()
>>> a = pc.Tensor.from_host(q, np.ones((2, 3, 4, 5), np.float32))
>>> b = pc.Tensor.from_host(q, np.ones((2, 3, 5, 4), np.float32))
>>> matmul(a, b).shape
(2, 3, 4, 4)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor, check_same_queue
from . import elementwise as ew
from .gemm import batched_gemm, gemm, product


@dataclass(frozen=True)
class Plan:
    """The shapes of one product: operands promoted to at least 2-D, their batch shapes, the
    broadcast batch and the result."""

    a_shape: tuple
    b_shape: tuple
    a2: tuple
    b2: tuple
    batch: tuple
    out: tuple

    @property
    def m(self) -> int:
        return self.a2[-2]

    @property
    def k(self) -> int:
        return self.a2[-1]

    @property
    def n(self) -> int:
        return self.b2[-1]

    @property
    def count(self) -> int:           # matrices in the batch
        return prod(self.batch)

    @property
    def a_batch(self) -> int:
        return prod(self.a2[:-2])

    @property
    def b_batch(self) -> int:
        return prod(self.b2[:-2])


def plan(a_shape: tuple, b_shape: tuple) -> Plan:
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ShapeError(f"matmul: scalar operand: {a_shape} @ {b_shape}; use mul for "
                         "scalars")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {a_shape} @ {b_shape}")
    ba, bb = a2[:-2], b2[:-2]
    nd = max(len(ba), len(bb))
    pa, pb = (1,) * (nd - len(ba)) + ba, (1,) * (nd - len(bb)) + bb
    if any(x != y and x != 1 and y != 1 for x, y in zip(pa, pb)):
        raise ShapeError(f"matmul: batch sizes differ: {a_shape} @ {b_shape}: batch "
                         f"dimensions {ba} and {bb} do not broadcast (numpy rules)")
    batch = tuple(max(x, y) for x, y in zip(pa, pb))
    out = (*batch, a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return Plan(a_shape, b_shape, a2, b2, batch, out)


def full(t: Tensor, batch: tuple, count: int) -> Tensor:
    """``t`` (promoted, ``(*its batch, r, c)``) as ``(count, r, c)``: a view when its batch is
    the whole batch, else expanded (copied) to it."""
    r, c = t.shape[-2:]
    if prod(t.shape[:-2]) != count:
        t = ew.broadcast_to(t, (*batch, r, c))
    return t.reshape(count, r, c)



def planned_product(a: Tensor, b: Tensor, p: Plan) -> Tensor:
    """``a @ b`` for operands reshaped to the plan's ``a2`` and ``b2``: one GEMM launch."""
    if p.b_batch == 1:                  # shared b: the batch folds into the rows of a
        y = gemm(a.reshape(p.a_batch * p.m, p.k), b.reshape(p.k, p.n))
    elif p.a_batch == 1:                # shared a, read in place by every batch entry
        y = batched_gemm(a.reshape(p.m, p.k), b.reshape(p.count, p.k, p.n))
    else:
        y = batched_gemm(full(a, p.batch, p.count), full(b, p.batch, p.count))
    return y.reshape(p.out)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of float32 tensors with numpy's semantics (1-D, 2-D, batched and broadcast
    over any leading dims), computed as ``tp.matmul`` computes it."""
    for t, which in ((a, "left"), (b, "right")):
        if t.dtype != FLOAT:
            raise DTypeError(f"matmul: {which} operand {t.shape} has dtype {t.dtype}, "
                             "expected float32")
    check_same_queue("matmul", a, b)
    if len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] == b.shape[0]:
        return product(a, b)
    p = plan(a.shape, b.shape)
    return planned_product(a.reshape(p.a2), b.reshape(p.b2), p)
