"""``EmbeddingBag``: a lookup table whose rows are summed, averaged or maximised over bags of
indices (``tp.embedding_bag``), without the per-index rows in between.

>>> import numpy as np, parcl as pc
>>> bag = pc.nn.EmbeddingBag(10, 4, mode="sum")
>>> idx = pc.Tensor.from_host(pc.default_queue(), np.array([1, 2, 4, 5, 4, 3]))
>>> bag(idx, np.array([0, 2])).shape                  # two bags: [1, 2] and [4, 5, 4, 3]
(2, 4)
"""

from __future__ import annotations


from ..errors import ParclError, ShapeError
from ..tape import ops
from ..tensor import Tensor
from .module import Module
from .sparse import init_table, redraw_table, refuse_set_later

__all__ = ["EmbeddingBag"]


class EmbeddingBag(Module):
    """``torch.nn.EmbeddingBag(num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
    scale_grad_by_freq=False, mode="mean", sparse=False, _weight=None,
    include_last_offset=False, padding_idx=None)``: ``weight`` (num_embeddings,
    embedding_dim) ~ N(0, 1) from the thread's seeded generator (``_weight``, a pc.Tensor or
    array of that shape, instead), the ``padding_idx`` row zeros; ``bag(input, offsets=None,
    per_sample_weights=None)`` is ``tp.embedding_bag`` with these settings.
    ``scale_grad_by_freq`` and ``sparse`` are refused."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: float | None = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
                 sparse: bool = False, _weight=None, include_last_offset: bool = False,
                 padding_idx: int | None = None, *, queue=None):
        super().__init__()
        if mode not in ("sum", "mean", "max"):
            raise ParclError(f"EmbeddingBag: mode has to be one of 'sum', 'mean' or 'max', got "
                             f"{mode!r}")
        init_table(self, "EmbeddingBag", num_embeddings, embedding_dim, padding_idx, max_norm,
                   norm_type, scale_grad_by_freq, sparse, _weight, False, queue)
        self.mode, self.include_last_offset = mode, bool(include_last_offset)

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, max_norm: float | None = None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        mode: str = "mean", sparse: bool = False,
                        include_last_offset: bool = False,
                        padding_idx: int | None = None) -> EmbeddingBag:
        """An ``EmbeddingBag`` over the 2-D ``embeddings`` (its weight; frozen unless
        ``freeze=False``), as PyTorch's."""
        value = embeddings.value if hasattr(embeddings, "value") else embeddings
        if len(value.shape) != 2:
            raise ShapeError(f"EmbeddingBag.from_pretrained: embeddings parameter is expected "
                             f"to be 2-dimensional, got shape {tuple(value.shape)}")
        queue = value.queue if isinstance(value, Tensor) else None
        bag = cls(*value.shape, max_norm, norm_type, scale_grad_by_freq, mode, sparse, value,
                  include_last_offset, padding_idx, queue=queue)
        bag.weight.requires_grad = not freeze
        return bag

    def reset_parameters(self) -> None:
        """Draw ``weight`` ~ N(0, 1) again as the constructor did (the ``padding_idx`` row
        zeros), in place, as PyTorch's."""
        redraw_table(self)

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002
        refuse_set_later(self)
        return ops.embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type,
                                 mode=self.mode, per_sample_weights=per_sample_weights,
                                 include_last_offset=self.include_last_offset,
                                 padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        s += f", mode={self.mode!r}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s
