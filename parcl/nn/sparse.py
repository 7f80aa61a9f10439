"""``Embedding``: a lookup table of ``num_embeddings`` rows of ``embedding_dim`` values.

>>> import parcl as pc
>>> emb = pc.nn.Embedding(10, 4)
>>> emb.weight.shape
(10, 4)
"""

from __future__ import annotations

from ..runtime import default_queue
from ..tape import ops
from ..tensor import Tensor
from .layers import _check_sizes
from .module import Module, Parameter, normal_

__all__ = ["Embedding"]


class Embedding(Module):
    """``torch.nn.Embedding``: ``weight`` (num_embeddings, embedding_dim) ~ N(0, 1) from the
    thread's seeded generator; ``emb(idx)`` with int32/int64 ``idx`` of any shape returns
    ``(*idx.shape, embedding_dim)`` (see ``tp.embedding``).

    >>> emb = pc.nn.Embedding(10, 4)
    >>> idx = pc.Tensor.from_host(pc.default_queue(), np.array([[1, 2, 2]]))
    >>> emb(idx).shape
    (1, 3, 4)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        _check_sizes("Embedding", {"num_embeddings": num_embeddings,
                                   "embedding_dim": embedding_dim})
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        shape = (self.num_embeddings, self.embedding_dim)
        self.weight = Parameter(Tensor.from_host(queue, normal_(shape, 1.0)))

    def forward(self, indices):
        return ops.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
