"""PyTorch's transformer building blocks: ``TransformerEncoderLayer``, ``TransformerEncoder``,
``TransformerDecoderLayer`` and ``TransformerDecoder``, with ``torch.nn``'s arguments,
sub-module names (``self_attn``, ``linear1``, ``norm1``, ``layers.0``, ...) and forward
signatures, so a torch state dict loads by name.

``TransformerEncoder(layer, num_layers)`` copies ``layer`` ``num_layers`` times, as PyTorch's
``copy.deepcopy`` does (every copy starts with the same weights), with ``clone_module``
(``parcl.nn.clone``): new Parameters and buffers holding device copies of the originals, on
the same queue.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> layer = pc.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
>>> enc = pc.nn.TransformerEncoder(layer, num_layers=2)
>>> list(enc.state_dict())[:2]
['layers.0.self_attn.in_proj_weight', 'layers.0.self_attn.in_proj_bias']
"""

from __future__ import annotations


import numpy as np

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tensor import Tensor
from .clone import clone_module
from .containers import ModuleList
from .layers import Dropout, Linear, _check_sizes, _size
from .module import Module
from .module_hooks import holds_hooks
from .multihead import MultiheadAttention, xavier_uniform
from .norm import LayerNorm

__all__ = ["Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerEncoderLayer"]


# -- shared pieces ----------------------------------------------------------------------------
def _activation(layer: str, activation):
    """The function for PyTorch's "relu" / "gelu" strings, or the callable given."""
    if isinstance(activation, str):
        if activation == "relu":
            return ops.relu
        if activation == "gelu":
            return ops.gelu
        raise ParclError(f"{layer}: activation should be relu/gelu, not {activation!r}")
    if not callable(activation):
        raise ParclError(f"{layer}: activation must be 'relu', 'gelu' or a callable, got "
                         f"{type(activation).__name__}")
    return activation


class _FeedForward:
    """``linear2(dropout(activation(linear1(x))))`` then ``dropout_out``: the two layer types'
    ``_ff_block``; a mix-in over modules that define those children. ReLU runs in
    ``linear1``'s GEMM epilogue (unless ``linear1`` holds hooks, which see its own output);
    chosen per call, so assigning ``layer.activation`` works."""

    def _ff_block(self, x, dropout_out: Dropout):
        if self.activation is ops.relu and not holds_hooks(self.linear1):
            h = self.linear1(x, relu=True)
        else:
            h = self.activation(self.linear1(x))
        return dropout_out(self.linear2(self.dropout(h)))


def _build_ff(layer: Module, d_model, dim_feedforward, dropout, activation, bias, queue):
    layer.linear1 = Linear(d_model, dim_feedforward, bias=bias, queue=queue)
    layer.dropout = Dropout(dropout)
    layer.linear2 = Linear(dim_feedforward, d_model, bias=bias, queue=queue)


def _check_num_layers(stack: str, num_layers) -> int:
    """``range(int(num_layers))`` made 2.7 two layers; PyTorch's ``range(num_layers)`` refuses a
    float. Zero layers stays allowed (the stack is then its ``norm``)."""
    if not _size(num_layers, 0):
        raise ShapeError(f"{stack}: num_layers must be a non-negative integer, got "
                         f"{num_layers!r}")
    return int(num_layers)


def _is_causal_mask(mask, size: int) -> bool:
    """PyTorch's ``_detect_is_causal_mask`` for a host mask: equal to the square subsequent
    mask (bool True above the diagonal, or float -inf above and 0 elsewhere)."""
    if mask is None or not isinstance(mask, np.ndarray) or mask.shape != (size, size):
        return False
    upper = np.triu(np.ones((size, size), bool), 1)
    if mask.dtype == np.bool_:
        return bool(np.array_equal(mask, upper))
    return bool(np.array_equal(mask, np.where(upper, -np.inf, 0.0)))


def _seq_len(x, batch_first: bool) -> int:
    shape = tuple(x.shape)
    return shape[0] if len(shape) == 2 or not batch_first else shape[1]


# -- encoder ----------------------------------------------------------------------------------
class TransformerEncoderLayer(_FeedForward, Module):
    """``torch.nn.TransformerEncoderLayer``: self-attention and a feed-forward block, each
    with a residual connection, layer norm after (``norm_first=False``) or before it.

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``; masks as
    ``MultiheadAttention``'s (boolean True = masked). ``activation`` is ``"relu"``,
    ``"gelu"`` or a callable on a Node (a Module is registered as the child ``activation``).

    >>> layer = pc.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    >>> [n for n, _ in layer.named_children()][:3]
    ['self_attn', 'linear1', 'dropout']
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, *,
                 queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, queue=queue)
        _build_ff(self, d_model, dim_feedforward, dropout, activation, bias, queue)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(type(self).__name__, activation)
        self.batch_first = bool(batch_first)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = ops.add(x, self._sa_block(self.norm1(x), src_mask, src_key_padding_mask,
                                          is_causal))
            return ops.add(x, self._ff_block(self.norm2(x), self.dropout2))
        x = self.norm1(ops.add(x, self._sa_block(x, src_mask, src_key_padding_mask,
                                                 is_causal)))
        return self.norm2(ops.add(x, self._ff_block(x, self.dropout2)))


class TransformerEncoder(Module):
    """``torch.nn.TransformerEncoder``: ``num_layers`` copies of ``encoder_layer`` (as
    ``layers.0``, ``layers.1``, ... each a ``clone_module`` of it, so all start equal), then
    ``norm`` if given.

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)``: ``is_causal=None``
    detects a (numpy) causal ``mask`` as PyTorch does. ``enable_nested_tensor`` and
    ``mask_check`` are accepted for PyTorch's signature and change nothing: parcl never packs
    padded sequences, so padded positions hold what every other position gets (PyTorch's
    nested-tensor fast path, in evaluation without gradients, writes zeros there instead).

    >>> enc = pc.nn.TransformerEncoder(pc.nn.TransformerEncoderLayer(8, 2, 16), 2)
    >>> len(enc.layers)
    2
    """

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        if not isinstance(encoder_layer, Module):
            raise ParclError(f"TransformerEncoder: encoder_layer must be a pc.nn.Module, got "
                             f"{type(encoder_layer).__name__}")
        self.num_layers = _check_num_layers("TransformerEncoder", num_layers)
        self.layers = ModuleList([clone_module(encoder_layer) for _ in range(self.num_layers)])
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = bool(enable_nested_tensor), bool(mask_check)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        if is_causal is None:
            first = self.layers[0] if len(self.layers) else None
            is_causal = _is_causal_mask(mask, _seq_len(src, getattr(first, "batch_first",
                                                                     False)))
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, is_causal=is_causal,
                        src_key_padding_mask=src_key_padding_mask)
        return self.norm(out) if self.norm is not None else out


# -- decoder ----------------------------------------------------------------------------------
class TransformerDecoderLayer(_FeedForward, Module):
    """``torch.nn.TransformerDecoderLayer``: self-attention, attention over ``memory``
    (``multihead_attn``) and a feed-forward block, each with a residual connection and layer
    norm (``norm1``, ``norm2``, ``norm3``; before each block with ``norm_first``).

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)``.

    >>> dec = pc.nn.TransformerDecoderLayer(8, 2, dim_feedforward=16)
    >>> [n for n, _ in dec.named_children()][:2]
    ['self_attn', 'multihead_attn']
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, *,
                 queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, queue=queue)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, queue=queue)
        _build_ff(self, d_model, dim_feedforward, dropout, activation, bias, queue)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(type(self).__name__, activation)
        self.batch_first = bool(batch_first)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           is_causal=is_causal, need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.dropout2(x)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False):
        x = tgt
        if self.norm_first:
            x = ops.add(x, self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask,
                                          tgt_is_causal))
            x = ops.add(x, self._mha_block(self.norm2(x), memory, memory_mask,
                                           memory_key_padding_mask, memory_is_causal))
            return ops.add(x, self._ff_block(self.norm3(x), self.dropout3))
        x = self.norm1(ops.add(x, self._sa_block(x, tgt_mask, tgt_key_padding_mask,
                                                 tgt_is_causal)))
        x = self.norm2(ops.add(x, self._mha_block(x, memory, memory_mask,
                                                  memory_key_padding_mask, memory_is_causal)))
        return self.norm3(ops.add(x, self._ff_block(x, self.dropout3)))


class TransformerDecoder(Module):
    """``torch.nn.TransformerDecoder``: ``num_layers`` copies of ``decoder_layer`` (``layers.i``,
    made by ``clone_module``), then ``norm`` if given. ``forward(tgt, memory, tgt_mask=None,
    memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    tgt_is_causal=None, memory_is_causal=False)``.

    >>> dec = pc.nn.TransformerDecoder(pc.nn.TransformerDecoderLayer(8, 2, 16), 2)
    >>> list(dec.state_dict())[-1]
    'layers.1.norm3.bias'
    """

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__()
        if not isinstance(decoder_layer, Module):
            raise ParclError(f"TransformerDecoder: decoder_layer must be a pc.nn.Module, got "
                             f"{type(decoder_layer).__name__}")
        self.num_layers = _check_num_layers("TransformerDecoder", num_layers)
        self.layers = ModuleList([clone_module(decoder_layer) for _ in range(self.num_layers)])
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False):
        if tgt_is_causal is None:
            first = self.layers[0] if len(self.layers) else None
            tgt_is_causal = _is_causal_mask(tgt_mask, _seq_len(tgt, getattr(
                first, "batch_first", False)))
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask,
                        memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        return self.norm(out) if self.norm is not None else out


# -- the whole model --------------------------------------------------------------------------
class Transformer(Module):
    """``torch.nn.Transformer``: a ``TransformerEncoder`` (``encoder``: ``num_encoder_layers``
    layers and a final ``LayerNorm``) and a ``TransformerDecoder`` (``decoder``, likewise), or
    ``custom_encoder`` / ``custom_decoder``; then, as torch, every parameter with more than one
    dimension re-drawn with xavier_uniform_. ``forward(src, tgt, src_mask=None, tgt_mask=None,
    memory_mask=None, src_key_padding_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
    memory_is_causal=False)`` returns the decoder's output.

    >>> model = pc.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1,
    ...                           num_decoder_layers=1, dim_feedforward=16)
    >>> list(model.state_dict())[0]
    'encoder.layers.0.self_attn.in_proj_weight'
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", custom_encoder: Module | None = None,
                 custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, *,
                 queue=None):
        super().__init__()
        # checked here too: with custom_encoder and custom_decoder no layer of ours sees them
        _check_sizes("Transformer", {"d_model": d_model, "nhead": nhead})
        queue = queue if queue is not None else default_queue()
        args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                batch_first, norm_first, bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(*args, queue=queue), num_encoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(
                TransformerDecoderLayer(*args, queue=queue), num_decoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, queue=queue))
        for p in self.parameters():       # torch's _reset_parameters, in parameter order
            if len(p.shape) > 1:          # torch's p.dim() > 1: a custom part's conv too
                p.value.copy_(Tensor.from_host(p.value.queue, xavier_uniform(p.shape)))
        self.d_model, self.nhead, self.batch_first = int(d_model), int(nhead), bool(batch_first)

    @staticmethod
    def generate_square_subsequent_mask(sz: int) -> np.ndarray:
        """torch's causal mask: float32 ``(sz, sz)``, -inf above the diagonal, 0 elsewhere."""
        return np.triu(np.full((sz, sz), -np.inf, np.float32), 1)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal: bool | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False):
        ss, ts = tuple(src.shape), tuple(tgt.shape)
        bdim = 0 if self.batch_first else 1
        if len(ss) == 3 and (len(ts) != 3 or ss[bdim] != ts[bdim]):
            raise ShapeError(f"Transformer: the batch number of src {ss} and tgt {ts} must be "
                             f"equal (dim {bdim}, batch_first={self.batch_first})")
        if ss[-1] != self.d_model or ts[-1] != self.d_model:
            raise ShapeError(f"Transformer: the feature number of src {ss} and tgt {ts} must "
                             f"be equal to d_model={self.d_model}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
