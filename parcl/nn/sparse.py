"""``Embedding``: a lookup table of ``num_embeddings`` rows of ``embedding_dim`` values.

>>> import parcl as pc
>>> emb = pc.nn.Embedding(10, 4)
>>> emb.weight.shape
(10, 4)
"""

from __future__ import annotations

import numpy as np

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import Node, ops
from ..tape.ops.select import padding_row
from ..tensor import Tensor
from .layers import _check_sizes, overwrite
from .module import Module, Parameter, normal_

__all__ = ["Embedding"]


class Embedding(Module):
    """``torch.nn.Embedding``: ``weight`` (num_embeddings, embedding_dim) ~ N(0, 1) from the
    thread's seeded generator; ``emb(idx)`` with int32/int64 ``idx`` of any shape returns
    ``(*idx.shape, embedding_dim)`` (see ``tp.embedding``). ``padding_idx`` (negative counts
    from the end) names a row initialised to zeros that gets no gradient, as PyTorch's;
    ``max_norm`` rescales the picked rows in place at each call (see ``tp.embedding``);
    ``scale_grad_by_freq`` and ``sparse`` are refused.

    >>> emb = pc.nn.Embedding(10, 4, padding_idx=0)
    >>> idx = pc.Tensor.from_host(pc.default_queue(), np.array([[1, 2, 2]]))
    >>> emb(idx).shape
    (1, 3, 4)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: int | None = None, max_norm: float | None = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, _freeze: bool = False, *, queue=None):
        super().__init__()
        init_table(self, "Embedding", num_embeddings, embedding_dim, padding_idx, max_norm,
                   norm_type, scale_grad_by_freq, sparse, _weight, _freeze, queue)

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False, sparse: bool = False) -> Embedding:
        """An ``Embedding`` whose weight is the 2-D ``embeddings`` (a pc.Tensor or Node is
        shared, an array uploaded; the ``padding_idx`` row kept as given), frozen unless
        ``freeze=False``, as PyTorch's.

        >>> table = np.arange(6, dtype=np.float32).reshape(3, 2)
        >>> pc.nn.Embedding.from_pretrained(table).weight.requires_grad
        False
        """
        value = embeddings.value if isinstance(embeddings, Node) else embeddings
        shape = tuple(value.shape) if isinstance(value, Tensor) else np.shape(value)
        if len(shape) != 2:
            raise ShapeError(f"Embedding.from_pretrained: embeddings parameter is expected to "
                             f"be 2-dimensional, got shape {shape}")
        queue = value.queue if isinstance(value, Tensor) else None
        return cls(*shape, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   value, freeze, queue=queue)

    def reset_parameters(self) -> None:
        """Draw ``weight`` ~ N(0, 1) again as the constructor did (the ``padding_idx`` row
        zeros), in place, as PyTorch's."""
        redraw_table(self)

    def forward(self, indices):
        refuse_set_later(self)
        return ops.embedding(indices, self.weight, padding_idx=self.padding_idx,
                             max_norm=self.max_norm, norm_type=self.norm_type)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        return s


def refuse_set_later(layer) -> None:
    """Refuse ``scale_grad_by_freq`` or ``sparse`` set on an ``Embedding`` or
    ``EmbeddingBag`` after construction, as the constructor refuses them: PyTorch's forward
    reads them, so a forward that ignored them gave a row picked 3 times the gradient 3
    where PyTorch's is 1 (``scale_grad_by_freq``), with no error."""
    if layer.scale_grad_by_freq or layer.sparse:
        raise ParclError(f"{type(layer).__name__}: scale_grad_by_freq and sparse are not "
                         f"supported, got scale_grad_by_freq={layer.scale_grad_by_freq!r}, "
                         f"sparse={layer.sparse!r} (set after construction); set them back "
                         "to False")


def redraw_table(layer) -> None:
    """An embedding table's ``reset_parameters`` (Embedding's and EmbeddingBag's): ``weight``
    drawn ~ N(0, 1) again, the ``padding_idx`` row zeros, written into the same Parameter."""
    weight = normal_(layer.weight.shape, 1.0)
    if layer.padding_idx is not None:
        weight[layer.padding_idx] = 0.0
    overwrite(layer.weight, weight)


def init_table(layer, op: str, num_embeddings: int, embedding_dim: int, padding_idx,
               max_norm, norm_type: float, scale_grad_by_freq: bool, sparse: bool, _weight,
               freeze: bool, queue) -> None:
    """The table settings and ``weight`` of an Embedding or EmbeddingBag (``op``), as
    PyTorch's constructors make them: ~ N(0, 1) from the thread's seeded generator with the
    ``padding_idx`` row zeros, or ``_weight`` as given (its padding row too; a pc.Tensor or
    Node shared, not copied); ``scale_grad_by_freq`` and ``sparse`` refused."""
    queue = queue if queue is not None else default_queue()
    _check_sizes(op, {"num_embeddings": num_embeddings, "embedding_dim": embedding_dim})
    if scale_grad_by_freq or sparse:
        raise ShapeError(f"{op}: scale_grad_by_freq and sparse are not supported, got "
                         f"scale_grad_by_freq={scale_grad_by_freq!r}, sparse={sparse!r}")
    layer.num_embeddings, layer.embedding_dim = int(num_embeddings), int(embedding_dim)
    row = padding_row(op, padding_idx, layer.num_embeddings)
    layer.padding_idx = None if row < 0 else row
    layer.max_norm, layer.norm_type = max_norm, norm_type
    layer.scale_grad_by_freq, layer.sparse = False, False
    shape = (layer.num_embeddings, layer.embedding_dim)
    if _weight is None:
        weight = normal_(shape, 1.0)
        if layer.padding_idx is not None:
            weight[layer.padding_idx] = 0.0
        layer.weight = Parameter(Tensor.from_host(queue, weight), requires_grad=not freeze)
        return
    value = _weight.value if isinstance(_weight, Node) else _weight
    if tuple(value.shape) != shape:
        raise ShapeError(f"{op}: _weight has shape {tuple(value.shape)}, expected "
                         f"(num_embeddings, embedding_dim) = {shape}")
    layer.weight = Parameter(value if isinstance(value, Tensor) else
                             Tensor.from_host(queue, np.asarray(value, np.float32)),
                             requires_grad=not freeze)
