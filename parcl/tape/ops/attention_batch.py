"""How ``scaled_dot_product_attention`` lays out a query, key and value whose batch dimensions
broadcast against each other, and grouped-query attention (``enable_gqa``), for its batched
GEMMs. Shapes only: the op (``attention.py``) records the Node and owns the backward.

The GEMMs run over a key/value batch: k ``(nb, S, E)``, v ``(nb, S, Ev)``. Query rows that
read the same key/value entry are folded into the GEMM's rows, q ``(nb, g * L, E)``, instead
of copying k and v ``g`` times: GQA's ``Hq / Hkv`` query heads per key head (PyTorch's
``repeat_interleave``: query head ``h`` reads key head ``h // (Hq / Hkv)``, so a group's heads
lie next to each other), and trailing batch dimensions along which k and v are both 1
(multi-query attention, k ``(B, 1, S, E)``). The scores ``(nb, g * L, S)`` are then, in
memory, ``(*batch, L, S)``, so the mask and ``is_causal`` apply unchanged, and the group's
gradients of k and v are summed inside the GEMMs ``ds^T @ q`` and ``p^T @ g``. Any other
broadcast dimension is copied out (``broadcast_to``) and its gradient summed back
(``sum_to_shape``, a fixed-order reduction).

>>> lay = layout((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8), enable_gqa=True)
>>> lay.q.gemm, lay.k.gemm, lay.batch
((4, 6, 8), (4, 5, 8), (2, 4))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import ShapeError
from ...kernels import elementwise as ew
from ...kernels.reduction import sum_to_shape
from ...tensor import Tensor

__all__: list[str] = []          # no ops: a helper of attention.py


@dataclass(frozen=True)
class Spread:
    """An operand read as ``view`` (its own data with size-1 dimensions inserted) and
    broadcast to ``full`` (copied only where the two differ)."""

    view: tuple[int, ...]
    full: tuple[int, ...]

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(self.view)
        return x if self.view == self.full else ew.broadcast_to(x, self.full)

    def backward(self, g: Tensor) -> Tensor:
        return sum_to_shape(g.reshape(self.full), self.view)


@dataclass(frozen=True)
class Operand:
    """One of q, k, v: its shape, the spreads that take it to the GEMM's 3-D ``gemm`` shape,
    and back for its gradient."""

    shape: tuple[int, ...]
    spreads: tuple[Spread, ...]
    gemm: tuple[int, int, int]

    def forward(self, x: Tensor) -> Tensor:
        for s in self.spreads:
            x = s.forward(x)
        return x.reshape(self.gemm)

    def backward(self, g: Tensor) -> Tensor:
        for s in reversed(self.spreads):
            g = s.backward(g)
        return g.reshape(self.shape)


@dataclass(frozen=True)
class AttentionLayout:
    q: Operand
    k: Operand
    v: Operand
    batch: tuple[int, ...]          # the output's batch shape, which the mask broadcasts to


def _heads(shape, h: int, hs: int) -> tuple[tuple[Spread, ...], tuple[int, ...]]:
    """Key or value ``shape`` ``(..., h, S, D)`` as GQA's ``(..., hs, 1)`` batch: heads copied
    ``hs / h`` times (``repeat_interleave``) only where key and value head counts differ and
    neither is 1 (a head count of 1 broadcasts)."""
    outer, tail = tuple(shape[:-3]), tuple(shape[-2:])
    if h in (1, hs):
        return (), (*outer, h, 1)
    spread = Spread((*outer, h, 1, *tail), (*outer, h, hs // h, *tail))
    return (spread,), (*outer, hs, 1)


def layout(q_shape, k_shape, v_shape, enable_gqa: bool = False,
           op: str = "scaled_dot_product_attention") -> AttentionLayout:
    """The layout of q ``(..., L, E)``, k ``(..., S, E)``, v ``(..., S, Ev)`` (shapes already
    checked for rank and matching E and S); a ``ShapeError`` naming the op and the three
    shapes where their batches do not broadcast or GQA's head counts do not divide."""
    (tq, d), (tk, dv) = q_shape[-2:], (k_shape[-2], v_shape[-1])
    qb, kb, vb = tuple(q_shape[:-2]), tuple(k_shape[:-2]), tuple(v_shape[:-2])
    shapes = f"query {tuple(q_shape)}, key {tuple(k_shape)}, value {tuple(v_shape)}"
    k_pre = v_pre = ()
    if enable_gqa:
        if not (qb and kb and vb):
            raise ShapeError(f"{op}: enable_gqa needs a heads dimension, inputs (..., H, T, D); "
                             f"got {shapes}")
        hq, hk, hv = qb[-1], kb[-1], vb[-1]
        if hk == 0 or hv == 0 or hq % hk or hq % hv:
            raise ShapeError(f"{op}: with enable_gqa the key's heads ({hk}) and the value's "
                             f"heads ({hv}) must divide the query's heads ({hq}), as PyTorch; "
                             f"got {shapes}")
        hs = math.lcm(hk, hv)
        k_pre, kb = _heads(k_shape, hk, hs)
        v_pre, vb = _heads(v_shape, hv, hs)
        qb = (*qb[:-1], hs, hq // hs)
    n = max(len(qb), len(kb), len(vb))
    qb, kb, vb = ((1,) * (n - len(b)) + b for b in (qb, kb, vb))
    full = []
    for a, b, c in zip(qb, kb, vb):
        sizes = {a, b, c} - {1}
        if len(sizes) > 1:
            raise ShapeError(f"{op}: the batch dimensions of {shapes} do not broadcast (numpy "
                             "rules: equal or 1" + ("; the heads dimension apart, which enable_gqa "
                             "groups" * enable_gqa) + ")")
        full.append(sizes.pop() if sizes else 1)
    full = tuple(full)
    fold = 0                        # trailing batch dims where k and v are 1: query rows
    while fold < n and kb[n - 1 - fold] == 1 and vb[n - 1 - fold] == 1:
        fold += 1
    outer, group = full[:n - fold], math.prod(full[n - fold:])
    nb, kv_full = math.prod(outer), (*outer, *(1,) * fold)
    q = Operand(tuple(q_shape), (Spread((*qb, tq, d), (*full, tq, d)),), (nb, group * tq, d))
    k = Operand(tuple(k_shape), (*k_pre, Spread((*kb, tk, d), (*kv_full, tk, d))), (nb, tk, d))
    v = Operand(tuple(v_shape), (*v_pre, Spread((*vb, tk, dv), (*kv_full, tk, dv))),
                (nb, tk, dv))
    batch = (*full[:-2], full[-2] * full[-1]) if enable_gqa else full
    return AttentionLayout(q, k, v, batch)
