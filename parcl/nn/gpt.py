"""nanoGPT's model (``pc.nn.GPT``) and its attention layer (``pc.nn.CausalSelfAttention``).

The structure, parameter names and initialisation are nanoGPT's (``model.py``), so a nanoGPT
state dict loads into ``GPT`` by name and back::

    transformer.wte  transformer.wpe  transformer.h.{i}.ln_1  .attn.c_attn  .attn.c_proj
    .ln_2  .mlp.c_fc  .mlp.c_proj  transformer.ln_f  lm_head

``lm_head.weight`` **is** ``transformer.wte.weight``: one Parameter held by two modules.
``parameters()`` lists it once (as ``transformer.wte.weight``), its gradient is the sum of the
embedding's and the output head's, and ``state_dict()`` lists it under both keys, as
PyTorch's does for nanoGPT.

>>> import numpy as np, parcl as pc
>>> model = pc.nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
>>> model(np.zeros((2, 5), np.int64)).shape
(2, 5, 16)
"""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ParclError, ShapeError
from ..gate import release
from ..runtime import default_queue
from ..tape import ops
from ..tape.mode import no_grad
from ..tape.node import Node
from ..tensor import Tensor
from .containers import ModuleList
from .gelu import GELU
from .layers import Dropout, Linear, _check_sizes
from .module import Module, normal_
from .norm import LayerNorm
from .sparse import Embedding

__all__ = ["GPT", "CausalSelfAttention"]


class CausalSelfAttention(Module):
    """nanoGPT's attention: ``c_attn`` (``n_embd -> 3*n_embd``) split into q, k, v along the
    last axis, ``n_head`` heads of ``n_embd // n_head``, causal scaled dot-product attention
    (attention dropout while training), ``c_proj`` and residual dropout. Input and output
    ``(B, T, n_embd)``.

    >>> attn = pc.nn.CausalSelfAttention(8, n_head=2)
    >>> [name for name, _ in attn.named_parameters()]
    ['c_attn.weight', 'c_attn.bias', 'c_proj.weight', 'c_proj.bias']
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, *,
                 queue=None):
        super().__init__()
        _check_sizes("CausalSelfAttention", {"n_embd": n_embd, "n_head": n_head})
        if n_embd % n_head:
            raise ShapeError(f"CausalSelfAttention: n_embd={n_embd} must be a positive "
                             f"multiple of n_head={n_head}")
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias, queue=queue)
        self.c_proj = Linear(n_embd, n_embd, bias=bias, queue=queue)
        self.attn_dropout = Dropout(dropout)      # nanoGPT's module names (no parameters)
        self.resid_dropout = Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = int(n_head), int(n_embd), float(dropout)

    def forward(self, x):
        shape = tuple(x.shape)
        if len(shape) != 3 or shape[2] != self.n_embd:
            raise ShapeError(f"CausalSelfAttention: expected input (B, T, {self.n_embd}), "
                             f"got {shape}")
        b, t, c = shape
        heads = (b, t, self.n_head, c // self.n_head)
        q, k, v = (ops.transpose(ops.reshape(part, heads), (0, 2, 1, 3))
                   for part in ops.split(self.c_attn(x), self.n_embd, axis=2))
        p = self.attn_dropout.p if self.training else 0.0
        y = ops.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (b, t, c))
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}, dropout={self.dropout}"


class MLP(Module):
    """nanoGPT's MLP: ``c_fc`` (``n_embd -> 4*n_embd``), exact GELU, ``c_proj``, dropout."""

    def __init__(self, n_embd: int, dropout: float = 0.0, bias: bool = True, *, queue=None):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, bias=bias, queue=queue)
        self.gelu = GELU()
        self.c_proj = Linear(4 * n_embd, n_embd, bias=bias, queue=queue)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, *,
                 queue=None):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias, queue=queue)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, queue=queue)
        self.ln_2 = LayerNorm(n_embd, bias=bias, queue=queue)
        self.mlp = MLP(n_embd, dropout, bias, queue=queue)

    def forward(self, x):
        x = ops.add(x, self.attn(self.ln_1(x)))
        return ops.add(x, self.mlp(self.ln_2(x)))


class Transformer(Module):
    """nanoGPT's ``transformer`` ModuleDict: ``wte``, ``wpe``, ``drop``, ``h``, ``ln_f``."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias, queue):
        super().__init__()
        self.wte = Embedding(vocab_size, n_embd, queue=queue)
        self.wpe = Embedding(block_size, n_embd, queue=queue)
        self.drop = Dropout(dropout)
        self.h = ModuleList([Block(n_embd, n_head, dropout, bias, queue=queue)
                             for _ in range(n_layer)])
        self.ln_f = LayerNorm(n_embd, bias=bias, queue=queue)


class GPT(Module):
    """nanoGPT: token and position embeddings, ``n_layer`` pre-norm blocks, a final layer
    norm and the output head tied to the token embedding (see the module docstring).

    nanoGPT's initialisation, from the thread's seeded generator (``pc.nn.manual_seed``):
    every Linear and Embedding weight ~ N(0, 0.02^2), every ``c_proj.weight`` ~
    N(0, (0.02/sqrt(2*n_layer))^2), biases zero, layer norms weight 1 and bias 0.
    ``model(idx)`` takes int64 (or int32) token ids ``(B, T)`` with ``T <= block_size`` (a
    numpy array, a ``pc.Tensor`` or a Node holding one) and returns the logits
    ``(B, T, vocab_size)``.

    >>> pc.nn.manual_seed(0)
    >>> model = pc.nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    >>> len(model.parameters()), len(model.state_dict())   # lm_head.weight: a second key
    (28, 29)
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int,
                 n_embd: int, dropout: float = 0.0, bias: bool = True, *, queue=None):
        super().__init__()
        _check_sizes("GPT", {"vocab_size": vocab_size, "block_size": block_size,
                             "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd})
        queue = queue if queue is not None else default_queue()
        self.vocab_size, self.block_size = int(vocab_size), int(block_size)
        self.n_layer, self.n_head, self.n_embd = int(n_layer), int(n_head), int(n_embd)
        self.transformer = Transformer(self.vocab_size, self.block_size, self.n_layer,
                                       self.n_head, self.n_embd, dropout, bias, queue)
        self.lm_head = Linear(self.n_embd, self.vocab_size, bias=False, queue=queue)
        # weight tying: the head's Parameter is the embedding's (nanoGPT assigns it the other
        # way round; either way there is one Parameter, registered under both names)
        self.lm_head.weight = self.transformer.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """Overwrite the layers' PyTorch defaults with nanoGPT's initialisation, drawing
        once per Parameter in module order (the tied weight once, as the embedding)."""
        proj_std = 0.02 / math.sqrt(2 * self.n_layer)
        done: set[int] = set()
        for name, m in self.named_modules():
            if not isinstance(m, (Linear, Embedding)):
                continue
            w = m.weight
            if id(w) not in done:
                done.add(id(w))
                std = proj_std if name.endswith("c_proj") else 0.02
                _write(w.value, normal_(w.shape, std))
            if isinstance(m, Linear) and m.bias is not None:
                m.bias.value.fill_(0.0)

    def forward(self, idx):
        idx = self._indices(idx)
        t = idx.shape[1]
        tok = self.transformer.wte(idx)                  # (B, T, C)
        pos = self.transformer.wpe.weight[:t]            # wpe(arange(T)), without the ids
        x = self.transformer.drop(ops.add(tok, pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def _indices(self, idx) -> Tensor:
        if isinstance(idx, Node):            # ids need no gradient: use their value
            idx = idx.value
        if isinstance(idx, Tensor):
            dtype, shape = idx.dtype, tuple(idx.shape)
        else:
            idx = np.asarray(idx)
            dtype, shape = idx.dtype, idx.shape
        if not np.issubdtype(dtype, np.integer):
            raise DTypeError(f"GPT: token ids must be int64 or int32, got dtype {dtype}")
        if len(shape) != 2:
            raise ShapeError(f"GPT: expected token ids (B, T), got shape {shape}")
        if shape[1] > self.block_size:
            raise ShapeError(f"GPT: cannot forward a sequence of length {shape[1]} (shape "
                             f"{shape}): block_size is {self.block_size}")
        if not isinstance(idx, Tensor):
            idx = Tensor.from_host(self.lm_head.weight.queue, idx.astype(np.int64, copy=False))
        return idx

    @staticmethod
    def loss(logits, targets):
        """Mean cross-entropy of logits ``(B, T, V)`` against targets ``(B, T)``: the
        sequence flattened to ``B*T`` rows (a view), for ``group.step(x, y, GPT.loss, opt)``.

        >>> loss = pc.nn.GPT.loss(model(x), y)
        """
        vocab = logits.shape[-1]
        return ops.cross_entropy(ops.reshape(logits, (-1, vocab)),
                                 ops.reshape(targets, (-1,)))

    loss.__func__.ignore_index = -100     # what ReplicaGroup.step weighs the replicas by

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, greedy: bool = False, *, seed: int = 0
                 ) -> np.ndarray:
        """Continue each row of ``idx`` ``(B, T)`` by ``max_new_tokens`` tokens (nanoGPT's
        ``generate``): the context cropped to ``block_size``, the last position's logits
        divided by ``temperature``, cut to the ``top_k`` largest, then the most likely token
        (``greedy=True``) or one sampled on the host from ``default_rng(seed)`` (the same
        ``seed`` gives the same tokens). Runs under ``no_grad``; returns int64
        ``(B, T + max_new_tokens)``. Call ``model.eval()`` first to turn dropout off.

        >>> model.generate(np.zeros((1, 1), np.int64), 4, greedy=True).shape
        (1, 5)
        """
        idx = np.asarray(idx.to_host() if isinstance(idx, Tensor) else idx)
        if idx.ndim != 2 or idx.shape[1] < 1:
            raise ShapeError(f"GPT.generate: expected token ids (B, T) with T >= 1, got "
                             f"shape {idx.shape}")
        if idx.dtype.kind not in "iu":     # a cast to int64 would truncate 1.7 to token 1
            raise DTypeError(f"GPT.generate: token ids must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens,
                                                              (int, np.integer)) \
                or max_new_tokens < 0:     # range(int(2.7)) made 2 tokens
            raise ShapeError(f"GPT.generate: max_new_tokens must be a non-negative int, got "
                             f"{max_new_tokens!r}")
        if not greedy and not temperature > 0.0:
            raise ValueError(f"GPT.generate: temperature must be > 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"GPT.generate: top_k must be >= 1, got {top_k}")
        rng = np.random.default_rng(seed)
        with no_grad():
            for _ in range(max_new_tokens):
                context = idx[:, -self.block_size:]
                logits = self(context)[:, -1].to_host().astype(np.float64)   # (B, V)
                idx = np.concatenate([idx, _pick(logits, temperature, top_k, greedy, rng)],
                                     axis=1)
        return idx

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, block_size={self.block_size}, "
                f"n_layer={self.n_layer}, n_head={self.n_head}, n_embd={self.n_embd}")


def _pick(logits: np.ndarray, temperature: float, top_k: int | None, greedy: bool,
          rng: np.random.Generator) -> np.ndarray:
    """The next token of each row of ``logits`` (B, V), as a (B, 1) int64 column."""
    if greedy:
        return np.argmax(logits, axis=1).astype(np.int64)[:, None]
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[1]:
        kth = np.sort(logits, axis=1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    # NaN or +inf logits (a diverged model) make NaN probabilities, which the inverse CDF
    # below would read as token 0; torch.multinomial refuses them in nanoGPT's generate
    bad = ~np.isfinite(probs).all(axis=1)
    if bad.any():
        row = int(np.argmax(bad))
        raise ParclError(f"GPT.generate: the next-token logits of row {row} (of {logits.shape}) "
                         f"hold NaN or inf, {logits[row, :6]}..., so their probabilities are "
                         "NaN and no token can be sampled (torch.multinomial refuses them)")
    # inverse-CDF sampling with one uniform per row: reproducible for a given seed
    cdf = np.cumsum(probs, axis=1)
    u = rng.random((logits.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), logits.shape[1] - 1).astype(np.int64)[:, None]


def _write(t: Tensor, array: np.ndarray) -> None:
    """Copy a host array into a device tensor (blocking: ``array`` is a temporary)."""
    release(t.queue)                  # never behind a gate (parcl.gate)
    cl.enqueue_copy(t.queue, t.data, np.ascontiguousarray(array, dtype=t.dtype))
