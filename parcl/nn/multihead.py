"""``MultiheadAttention``: ``torch.nn.MultiheadAttention`` with PyTorch's parameter names,
shapes, initialisation, masks and return values, over parcl's ops.

Parameters (PyTorch's names, so ``load_state_dict(torch_mha.state_dict())`` works):
``in_proj_weight`` ``(3E, E)`` (or ``q_proj_weight`` ``(E, E)``, ``k_proj_weight``
``(E, kdim)``, ``v_proj_weight`` ``(E, vdim)`` when ``kdim`` or ``vdim`` differ from ``E``),
``in_proj_bias`` ``(3E,)``, ``out_proj.weight`` ``(E, E)``, ``out_proj.bias``.

Masks follow PyTorch's convention, the opposite of ``tp.scaled_dot_product_attention``'s for
booleans: a boolean ``attn_mask`` or ``key_padding_mask`` is True where a position may **not**
be attended to; a float mask is added to the scores.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> mha = pc.nn.MultiheadAttention(8, 2, batch_first=True)
>>> x = pc.Tensor.from_host(pc.default_queue(), np.ones((3, 5, 8), np.float32))
>>> with tp.no_grad():
...     out, w = mha(x, x, x)
>>> out.shape, w.shape
((3, 5, 8), (3, 5, 5))
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import DTypeError, ParclError, ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tape.node import Node
from ..tensor import Tensor
from .layers import Linear, _check_sizes
from .init import _fans
from .module import Module, Parameter, normal_, uniform_

__all__ = ["MultiheadAttention"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
_BOOLS = (np.dtype(np.bool_), np.dtype(np.uint8))


def additive_mask(name: str, mask, queue):
    """PyTorch's ``_canonical_mask``: a boolean mask (True = masked) as 0 / -inf float32, a
    float one as it is. Numpy arrays are converted on the host and uploaded."""
    if mask is None:
        return None
    if isinstance(mask, (Node, Tensor)):
        dtype = np.dtype(mask.dtype)
        if dtype == np.float32:
            return mask
        if dtype in _BOOLS:
            # nothing requires a gradient here, so this is a raw Tensor even while recording
            return ops.where(mask.value if isinstance(mask, Node) else mask, -math.inf, 0.0)
    else:
        arr = np.asarray(mask)
        dtype = arr.dtype
        if dtype == np.bool_:
            return Tensor.from_host(queue, np.where(arr, -np.inf, 0.0).astype(np.float32))
        if dtype in _FLOATS:
            return Tensor.from_host(queue, arr.astype(np.float32))
    raise DTypeError(f"MultiheadAttention: only bool and floating types of {name} are "
                     f"supported (as PyTorch), got dtype {dtype}")


def _shape(mask) -> tuple[int, ...]:
    return tuple(mask.shape) if hasattr(mask, "shape") else np.shape(mask)


def xavier_uniform(shape) -> np.ndarray:
    """``torch.nn.init.xavier_uniform_`` for a weight of 2 or more dims (a host array from the
    thread's generator): ``(fan_out, fan_in, *kernel)`` with torch's fans, each dim times the
    receptive field ``prod(kernel)`` (a conv weight a custom ``Transformer`` part holds)."""
    shape = tuple(shape)
    fan_in, fan_out = _fans(shape, "xavier_uniform_")
    return uniform_(shape, math.sqrt(6.0 / (fan_in + fan_out)))


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention``: ``num_heads`` heads of ``embed_dim // num_heads``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, weights)`` as PyTorch:
    inputs ``(L, B, E)`` (``(B, L, E)`` with ``batch_first``) or unbatched ``(L, E)``;
    ``weights`` ``(B, L, S)`` averaged over heads, ``(B, H, L, S)`` with
    ``average_attn_weights=False``, None with ``need_weights=False`` (then the attention runs
    as one ``tp.scaled_dot_product_attention``). ``attn_mask`` is ``(L, S)`` or
    ``(B*H, L, S)``, ``key_padding_mask`` ``(B, S)``; ``is_causal`` is PyTorch's hint that
    ``attn_mask`` is the causal mask (it still has to be given). Dropout (on the attention
    weights) only while training. ``add_bias_kv`` adds the learnt key and value ``bias_k``
    and ``bias_v`` ``(1, 1, E)`` after the given ones, ``add_zero_attn`` a zero key and value
    after those (the masks are padded so that both are attended to).

    >>> mha = pc.nn.MultiheadAttention(8, 2)
    >>> list(mha.state_dict())
    ['in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias']
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
                 *, queue=None):
        super().__init__()
        sizes = {"embed_dim": embed_dim, "num_heads": num_heads, "kdim": kdim, "vdim": vdim}
        _check_sizes("MultiheadAttention", {k: v for k, v in sizes.items() if v is not None})
        if embed_dim % num_heads:
            raise ShapeError(f"MultiheadAttention: embed_dim={embed_dim} must be divisible by "
                             f"num_heads={num_heads}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        queue = queue if queue is not None else default_queue()
        e = self.embed_dim = int(embed_dim)
        self.kdim = int(kdim) if kdim is not None else e
        self.vdim = int(vdim) if vdim is not None else e
        self._qkv_same_embed_dim = self.kdim == e and self.vdim == e
        self.num_heads, self.head_dim = int(num_heads), e // int(num_heads)
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        # PyTorch's draw order: out_proj's Linear defaults first, then xavier on in_proj
        out_proj = Linear(e, e, bias=bias, queue=queue)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter.from_host(queue, xavier_uniform((3 * e, e)))
        else:
            self.q_proj_weight = Parameter.from_host(queue, xavier_uniform((e, e)))
            self.k_proj_weight = Parameter.from_host(queue, xavier_uniform((e, self.kdim)))
            self.v_proj_weight = Parameter.from_host(queue, xavier_uniform((e, self.vdim)))
        if bias:
            self.in_proj_bias = Parameter(Tensor.zeros(queue, (3 * e,)))
            out_proj.bias.value.fill_(0.0)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = out_proj
        if add_bias_kv:              # torch's xavier_normal_ on (1, 1, E): std 1/sqrt(E)
            self.bias_k = Parameter.from_host(queue, normal_((1, 1, e), 1 / math.sqrt(e)))
            self.bias_v = Parameter.from_host(queue, normal_((1, 1, e), 1 / math.sqrt(e)))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = bool(add_zero_attn)

    # -- projections -----------------------------------------------------------------------
    def _project(self, query, key, value):
        e, b = self.embed_dim, self.in_proj_bias
        bq = bk = bv = None
        if self._qkv_same_embed_dim:
            if query is key and key is value:     # self-attention: one GEMM for q, k and v
                return ops.split(ops.linear(query, self.in_proj_weight, b), e, axis=-1)
            wq, wk, wv = ops.split(self.in_proj_weight, e, axis=0)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if b is not None:
            bq, bk, bv = ops.split(b, e, axis=0)
        return ops.linear(query, wq, bq), ops.linear(key, wk, bk), ops.linear(value, wv, bv)

    def _heads(self, x, batch_first: bool):
        """``(L, B, E)`` or ``(B, L, E)`` -> ``(B, H, L, D)``."""
        a, c, _ = x.shape
        x = ops.reshape(x, (a, c, self.num_heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3) if batch_first else (1, 2, 0, 3))

    # -- checks ----------------------------------------------------------------------------
    def _check(self, query, key, value, key_padding_mask, attn_mask) -> bool:
        """PyTorch's ``_mha_shape_check`` and embedding checks; True when batched."""
        qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
        batched = len(qs) == 3
        if len(qs) not in (2, 3) or len(ks) != len(qs) or len(vs) != len(qs):
            raise ShapeError(f"MultiheadAttention: query, key and value must all be 3-d "
                             f"(batched) or all 2-d (unbatched), got {qs}, {ks}, {vs}")
        kpm_dims = 2 if batched else 1
        if key_padding_mask is not None and len(_shape(key_padding_mask)) != kpm_dims:
            raise ShapeError(f"MultiheadAttention: key_padding_mask must be {kpm_dims}-d for "
                             f"{'batched' if batched else 'unbatched'} inputs, got shape "
                             f"{_shape(key_padding_mask)}")
        if attn_mask is not None and len(_shape(attn_mask)) not in (2, 3):
            raise ShapeError(f"MultiheadAttention: attn_mask must be 2-d or 3-d, got shape "
                             f"{_shape(attn_mask)}")
        if qs[-1] != self.embed_dim:
            raise ShapeError(f"MultiheadAttention: was expecting embedding dimension of "
                             f"{self.embed_dim}, but got query {qs}")
        if ks[-1] != self.kdim or vs[-1] != self.vdim:
            raise ShapeError(f"MultiheadAttention: key {ks} and value {vs} must end in "
                             f"kdim={self.kdim} and vdim={self.vdim}")
        if ks[:-1] != vs[:-1]:
            raise ShapeError(f"MultiheadAttention: key {ks} and value {vs} must have the "
                             "same sequence and batch dims")
        if batched:
            bdim = 0 if self.batch_first else 1
            if qs[bdim] != ks[bdim]:
                raise ShapeError(f"MultiheadAttention: query {qs} and key {ks} have different "
                                 f"batch sizes (dim {bdim}; batch_first={self.batch_first})")
        return batched

    def _mask(self, key_padding_mask, attn_mask, bsz: int, tgt: int, src: int, batched: bool,
              queue):
        """One additive float mask broadcasting to ``(B, H, L, S + extra)``, or None: each
        mask checked against the given keys ``S``, then padded with zeros (not masked) for
        the ``extra`` keys of ``bias_k`` and ``add_zero_attn``, as torch pads them."""
        extra = (self.bias_k is not None) + self.add_zero_attn
        heads = self.num_heads
        kpm = additive_mask("key_padding_mask", key_padding_mask, queue)
        mask = additive_mask("attn_mask", attn_mask, queue)
        if mask is not None:
            want = (tgt, src) if len(mask.shape) == 2 else (bsz * heads, tgt, src)
            if tuple(mask.shape) != want:
                raise ShapeError(f"MultiheadAttention: the shape of the {len(want)}D attn_mask "
                                 f"is {tuple(mask.shape)}, but should be {want}")
            if len(want) == 3:
                mask = ops.reshape(mask, (bsz, heads, tgt, src))
            if extra:
                mask = ops.pad(mask, (0, extra))
        if kpm is not None:
            want = (bsz, src) if batched else (src,)
            if tuple(kpm.shape) != want:      # (S, B) for (B, S) would mask the wrong keys
                raise ShapeError(f"MultiheadAttention: key_padding_mask has shape "
                                 f"{tuple(kpm.shape)}, expected {want}")
            kpm = ops.reshape(kpm, (bsz, 1, 1, src))
            if extra:
                kpm = ops.pad(kpm, (0, extra))
            mask = kpm if mask is None else ops.add(mask, kpm)
        return mask

    # -- forward ---------------------------------------------------------------------------
    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        batched = self._check(query, key, value, key_padding_mask, attn_mask)
        batch_first = self.batch_first and batched
        if not batched:          # (L, E) as a batch of one, sequence first
            query, key, value = (ops.reshape(t, (t.shape[0], 1, t.shape[1]))
                                 for t in (query, key, value))
        if batch_first:
            bsz, tgt, src = query.shape[0], query.shape[1], key.shape[1]
        else:
            tgt, bsz, src = query.shape[0], query.shape[1], key.shape[0]
        if is_causal and attn_mask is None:
            raise ParclError("MultiheadAttention: is_causal=True needs attn_mask (it is "
                             "PyTorch's hint that attn_mask is causal); pass the causal mask, "
                             "e.g. np.triu(np.ones((L, L), bool), 1)")
        # PyTorch drops the mask and runs causal attention only on this path
        causal = bool(is_causal) and key_padding_mask is None and not need_weights
        queue = (query.value if isinstance(query, Node) else query).queue
        mask = None if causal else self._mask(key_padding_mask, attn_mask, bsz, tgt, src,
                                              batched, queue)
        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:      # one more key and value, the same for every batch
            axis = 1 if batch_first else 0
            shape = (bsz, 1, self.embed_dim) if batch_first else (1, bsz, self.embed_dim)
            k = ops.cat([k, ops.expand(self.bias_k, shape)], axis=axis)
            v = ops.cat([v, ops.expand(self.bias_v, shape)], axis=axis)
        q, k, v = (self._heads(t, batch_first) for t in (q, k, v))
        if self.add_zero_attn:           # and a zero key and value after those
            k, v = ops.pad(k, (0, 0, 0, 1)), ops.pad(v, (0, 0, 0, 1))
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = ops.mul(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))),
                             1.0 / math.sqrt(self.head_dim))
            if mask is not None:
                scores = ops.add(scores, mask)
            weights = ops.softmax(scores, axis=-1)
            if p > 0.0:
                weights = ops.dropout(weights, p, training=True)
            y = ops.matmul(weights, v)
        else:
            y = ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 is_causal=causal)
        e = self.embed_dim
        if batch_first:
            y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (bsz, tgt, e))
        else:
            y = ops.reshape(ops.transpose(y, (2, 0, 1, 3)), (tgt, bsz, e))
        out = self.out_proj(y)
        if not batched:
            out = ops.reshape(out, (tgt, e))
        if weights is not None:
            if average_attn_weights:
                weights = ops.mean(weights, axis=1)
            if not batched:
                weights = ops.reshape(weights, tuple(weights.shape)[1:])
        return out, weights

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
