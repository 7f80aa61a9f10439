"""``scaled_dot_product_attention``: ``softmax(q @ k^T * scale + mask) @ v`` as one recorded
Node with its own backward (``torch.nn.functional.scaled_dot_product_attention``).

The forward is two batched GEMMs around the fused masked softmax
(``parcl.kernels.attention``). It saves ``q``, ``k`` and ``v`` but not the attention
probabilities ``p`` (``T x T`` per head, as much as q, k and v together at T = 64, D = 32):
the backward recomputes them with the same two kernels, bit for bit, as flash attention
does. (With dropout ``p`` and its dropped version are saved instead, the dropout mask
regenerated from dropout's counter, never stored.) The backward is then four GEMMs and one
softmax-backward kernel:

    dv = p^T @ g,  dp = g @ v^T,  ds = p * (dp - rowsum(p * dp)) * scale,
    dq = ds @ k,   dk = ds^T @ q

>>> q_ = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 4, 8), np.float32)), True)
>>> tp.scaled_dot_product_attention(q_, q_, q_, is_causal=True).shape
(2, 4, 8)
"""

from __future__ import annotations

import math
from math import prod
from numbers import Real

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import attention as ak
from ...kernels import elementwise as ew
from ...kernels.gemm import batched_gemm
from ...kernels.reduction import sum_to_shape
from ...tensor import FLOAT, Tensor, check_same_queue
from ..node import Function, Node
from .attention_batch import layout
from .nn import Dropout

__all__ = ["scaled_dot_product_attention"]


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dtype != FLOAT:
            raise DTypeError(f"scaled_dot_product_attention: {name} {t.shape} has dtype "
                             f"{t.dtype}, expected float32")
        if t.ndim < 2:
            raise ShapeError(f"scaled_dot_product_attention: {name} must be (..., T, D), got "
                             f"shape {t.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"scaled_dot_product_attention: query {q.shape} and key {k.shape} "
                         "must have the same last dimension (D)")
    if k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"scaled_dot_product_attention: key {k.shape} and value {v.shape} "
                         "must have the same sequence length (second to last dimension)")
    check_same_queue("scaled_dot_product_attention", q, k, v)


class ScaledDotProductAttention(Function):
    name = "scaled_dot_product_attention"

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False):
        _check(q, k, v)
        # batches broadcast, GQA's query heads folded into the GEMMs' rows (attention_batch)
        self.lay = lay = layout(q.shape, k.shape, v.shape, enable_gqa, self.name)
        (tq, d), dv = q.shape[-2:], v.shape[-1]
        # head dim 0 (q[..., :0]): scores of no products are 0 whatever the scale, PyTorch's
        # 1 / sqrt(0) included (it scales q and k, not the scores), so the mask alone counts
        self.scale = (1.0 / math.sqrt(d) if d else 1.0) if scale is None else float(scale)
        self.mask_shape = None if mask is None else mask.shape
        q3, k3, v3 = lay.q.forward(q), lay.k.forward(k), lay.v.forward(v)
        self.mask, self.is_causal = mask, is_causal
        p = self._probabilities(q3, k3)
        self.dropout = None
        if dropout_p > 0.0:
            self.dropout = Dropout((True,))
            pd = self.dropout.forward(p, p=dropout_p)
        else:
            pd = p
        out = batched_gemm(self._rows(pd), v3)
        if self.recording:        # p is recomputed in the backward unless dropout used it
            self.saved = (q3, k3, v3, p, pd) if self.dropout else (q3, k3, v3, None, None)
        return out.reshape(*lay.batch, tq, dv)

    def _rows(self, p: Tensor) -> Tensor:
        """Weights or their gradient as the GEMMs read them: (kv batch, group * Tq, Tk)."""
        nb, rows, _ = self.lay.q.gemm
        return p.reshape(nb, rows, p.shape[-1])

    def _probabilities(self, q3: Tensor, k3: Tensor) -> Tensor:
        """The attention weights (B, Tq, Tk), B the product of the output's batch shape."""
        s = batched_gemm(q3, k3, trans_b=True)
        batch, tq = self.lay.batch, self.lay.q.shape[-2]
        s = s.reshape(prod(batch), tq, s.shape[-1])
        return ak.masked_softmax(s, self.scale, self.mask, self.is_causal, batch)

    def backward(self, g: Tensor):
        q3, k3, v3, p, pd = self.saved
        if p is None:
            p = pd = self._probabilities(q3, k3)
        lay = self.lay
        need_q, need_k, need_v = self.needs_input_grad[:3]
        need_mask = len(self.needs_input_grad) > 3 and self.needs_input_grad[3]
        g3 = g.reshape(q3.shape[0], q3.shape[1], v3.shape[-1])
        gq = gk = gv = gm = None
        if need_v:          # a group's rows (GQA) summed inside the GEMM
            gv = lay.v.backward(batched_gemm(self._rows(pd), g3, trans_a=True))
        if need_q or need_k or need_mask:
            dp = batched_gemm(g3, v3, trans_b=True).reshape(p.shape)
            if self.dropout is not None:
                dp = self.dropout.backward(dp)
            ds = ak.masked_softmax_backward(p, dp, self.scale)
            # scale 0: ds is zero and cannot be divided back; the mask's gradient unscaled
            dm = ak.masked_softmax_backward(p, dp, 1.0) if need_mask and not self.scale else ds
            del dp
            if need_q:
                gq = lay.q.backward(batched_gemm(self._rows(ds), k3))
            if need_k:
                gk = lay.k.backward(batched_gemm(self._rows(ds), q3, trans_a=True))
            if need_mask:               # d(scores)/d(mask) = 1: ds without the scale
                full = (*lay.batch, p.shape[1], p.shape[2])
                gm = sum_to_shape(dm.reshape(full), self.mask_shape)
                if dm is ds and self.scale != 1.0:
                    gm = ew.scalar("mul", gm, 1.0 / self.scale)
        return gq, gk, gv, gm


def _as_mask(mask, queue):
    """A boolean (held as uint8) or float32 Node or Tensor as it is; a numpy mask uploaded
    (a boolean one as an additive float mask of 0 and -inf, which the kernel treats the
    same). An integer mask is refused, as PyTorch refuses it: read as boolean, an additive
    mask that happens to be integer (``np.where(pad, -10000, 0)``) would mask exactly the
    keys it keeps."""
    if mask is None:
        return None
    if isinstance(mask, (Node, Tensor)):
        dtype = np.dtype(mask.dtype)
        usable = dtype in (np.dtype(np.bool_), np.dtype(np.uint8), np.dtype(np.float32))
    else:
        mask = np.asarray(mask)
        dtype = mask.dtype
        usable = dtype.kind in "bf"
        if usable:
            mask = np.where(mask, 0.0, -np.inf) if dtype == np.bool_ else mask
            return Tensor.from_host(queue, mask.astype(np.float32))
    if not usable:
        raise DTypeError(f"scaled_dot_product_attention: attn_mask {tuple(mask.shape)} has "
                         f"dtype {dtype}; pass a boolean mask (True = may attend) or a float "
                         "one added to the scores, as PyTorch (an integer one is ambiguous)")
    return mask


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False, *, tape=None):
    """``torch.nn.functional.scaled_dot_product_attention`` over ``(..., T, D)`` inputs
    (typically ``(B, H, T, D)``): ``softmax(q @ k^T * scale + mask) @ v`` with ``scale``
    default ``1/sqrt(D)``. ``attn_mask`` broadcasts to ``(..., Tq, Tk)``: float32 is added to
    the scores, a boolean one (a numpy array too) says where a query may attend (True), an
    integer one is a ``DTypeError`` (as PyTorch's); a query row with nothing to attend to
    gives zeros, as PyTorch. ``is_causal`` masks the future (``j > i``); it cannot be
    combined with a mask. The batch dimensions of q, k and v broadcast against each other
    (k and v ``(1, H, S, D)`` serve every batch entry of q ``(B, H, L, D)``), gradients summed
    back. ``enable_gqa=True`` is grouped-query attention: q ``(..., Hq, L, D)`` with k and v
    of ``Hkv`` heads dividing ``Hq``, query head ``h`` reading key/value head
    ``h // (Hq / Hkv)`` (PyTorch's ``repeat_interleave``), without copying k and v.
    ``dropout_p > 0`` drops attention weights with parcl's dropout generator (replayable
    under capture, like ``tp.dropout``). One Node, op_name ``"scaled_dot_product_attention"``.

    >>> y = tp.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
    """
    if attn_mask is not None and is_causal:
        raise ShapeError("scaled_dot_product_attention: pass either attn_mask or "
                         "is_causal=True, not both (as PyTorch)")
    if scale is not None and not isinstance(scale, Real):
        # float() of a Node reads its value: a learnt temperature would get no gradient
        raise DTypeError(f"scaled_dot_product_attention: scale must be a number, as PyTorch's "
                         f"'must be float', got {type(scale).__name__}; a learnt scale has no "
                         "gradient through it: multiply q by it instead")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p <= 1.0:
        raise ShapeError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got "
                         f"{dropout_p}")
    queue = (q.value if isinstance(q, Node) else q).queue
    mask = _as_mask(attn_mask, queue)
    return ScaledDotProductAttention.apply(q, k, v, mask, tape=tape, dropout_p=dropout_p,
                                           is_causal=bool(is_causal), scale=scale,
                                           enable_gqa=bool(enable_gqa))
