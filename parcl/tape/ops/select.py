"""Selection ops: ``where``, ``masked_fill`` and ``embedding``.

``where(cond, a, b)`` and ``masked_fill(x, mask, value)`` broadcast as numpy; the condition is
a boolean mask (``Tensor.from_host`` of an ``np.bool_`` array, or the numpy array itself), an
int32/int64 or a float32 tensor (nonzero is True). Gradients reach ``a`` and ``b`` (``x``),
never the condition.

``embedding`` checks its indices on the device, as ``cross_entropy`` checks its labels: the
forward kernel gives a bad index a NaN row and lowers a flag, read back without blocking. The
flag is checked, with a ``ShapeError`` naming the position and the index, in the backward
(deferred until the whole backward is enqueued), at once when the op is not recorded or under
``detect_anomaly``, and, in a replayed captured step whose indices are one of its inputs, on
the host array before it is uploaded.

>>> w = tp.tensor(pc.Tensor.from_host(q, np.eye(3, dtype=np.float32)), requires_grad=True)
>>> idx = pc.Tensor.from_host(q, np.array([[2, 0]]))
>>> tp.embedding(idx, w).to_host()
array([[[0., 0., 1.],
        [1., 0., 0.]]], dtype=float32)
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from ...errors import ShapeError
from ...kernels import elementwise as ew
from ...kernels import select as sk
from ...kernels.reduction import sum_to_shape
from ...tensor import Tensor
from ..node import ACCUMULATED, Function, Node
from ..tape import defer
from .checks import FlagCheck

__all__ = ["embedding", "masked_fill", "where"]


def _queue_of(*xs):
    for x in xs:
        if isinstance(x, (Node, Tensor)):
            return x.queue
    raise TypeError("where: at least one of cond, a and b must be a tp.Node or pc.Tensor")


def _as_input(x, queue):
    """A Node or Tensor as it is; a numpy array (e.g. a boolean mask) or Python scalar
    uploaded to ``queue`` (a scalar as a 0-d float32 tensor)."""
    if isinstance(x, (Node, Tensor)):
        return x
    if isinstance(x, np.ndarray):
        return Tensor.from_host(queue, x)
    if isinstance(x, (Real, np.number)):
        return Tensor.full(queue, (), float(x))
    raise TypeError(f"where: expected a tp.Node, pc.Tensor, numpy array or number, got "
                    f"{type(x).__name__}")


class Where(Function):
    name = "where"

    def forward(self, cond: Tensor, a: Tensor, b: Tensor):
        out = sk.where(cond, a, b)
        if self.recording:
            self.cond, self.shapes = cond, (a.shape, b.shape)
        return out

    def backward(self, g: Tensor):
        need = self.needs_input_grad
        ga = gb = None
        if need[1] or need[2]:
            zero = Tensor.zeros(g.queue, ())
        if need[1]:
            ga = sum_to_shape(sk.where(self.cond, g, zero), self.shapes[0])
        if need[2]:
            gb = sum_to_shape(sk.where(self.cond, zero, g), self.shapes[1])
        return None, ga, gb


def where(cond, a, b, *, tape=None):
    """``a`` where ``cond`` is nonzero (True), else ``b``; all three broadcast (numpy rules).
    ``a`` or ``b`` may be a Python number, ``cond`` a boolean numpy array.

    >>> tp.where(np.array([True, False]), a, 0.0).shape          # a (2,)
    (2,)
    """
    q = _queue_of(a, b, cond)
    return Where.apply(_as_input(cond, q), _as_input(a, q), _as_input(b, q), tape=tape)


def masked_fill(x, mask, value, *, tape=None):
    """``x`` with ``value`` (a number, or a 0-d Node or Tensor) wherever ``mask`` (broadcast
    to ``x``'s shape) is nonzero; as ``torch.Tensor.masked_fill``. The gradient reaches ``x``
    where the mask is False, and a 0-d Node ``value`` the sum of it where the mask is True.

    >>> tp.masked_fill(scores, causal_mask, float("-inf")).shape  # scores (T, T)
    (4, 4)
    """
    m = _as_input(mask, _queue_of(x))
    if ew.broadcast_shapes("masked_fill", m.shape, x.shape) != tuple(x.shape):
        raise ShapeError(f"masked_fill: mask of shape {m.shape} does not broadcast to the "
                         f"input's shape {x.shape}")
    if isinstance(value, (Node, Tensor)):
        # kept in the graph, not read as a float: that dropped a Node's gradient (and the
        # host read kept a captured step eager)
        if value.shape != ():
            raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, as "
                             f"PyTorch's, got shape {value.shape} (input {x.shape})")
        return where(m, value, x, tape=tape)
    return where(m, float(value), x, tape=tape)


class _IndexCheck(FlagCheck):
    """The embedding's flag: the first out-of-range position of ``indices`` (``size`` of
    them when all are in range)."""

    description = "embedding's index check"

    def __init__(self, flag: Tensor, indices: Tensor, num_embeddings: int):
        self.indices, self.V = indices, num_embeddings
        super().__init__(flag, checked=indices)

    def error(self, host: np.ndarray) -> ShapeError | None:
        pos = int(host[0])
        if pos >= self.indices.size:
            return None
        return self._error(pos, int(self.indices.to_host().reshape(-1)[pos]))

    def check_host(self, indices: np.ndarray) -> None:
        """The same check on the indices' host array, before a replay uploads it."""
        flat = indices.reshape(-1)
        bad = (flat < 0) | (flat >= self.V)
        if bad.any():
            pos = int(np.argmax(bad))
            raise self._error(pos, int(flat[pos]))

    def _error(self, pos: int, value: int) -> ShapeError:
        where_ = np.unravel_index(pos, self.indices.shape) if self.indices.shape else ()
        return ShapeError(f"embedding: index {value} at position {tuple(map(int, where_))} of "
                          f"indices {self.indices.shape} is out of range for a weight of "
                          f"{self.V} rows; indices must be in [0, {self.V})")


class Embedding(Function):
    takes_targets = True
    name = "embedding"

    def forward(self, indices: Tensor, weight: Tensor, padding_idx: int = -1):
        self.padding_idx = padding_idx
        out, flag = sk.embedding_forward(indices, weight)
        check = _IndexCheck(flag, indices, weight.shape[0])
        check.guard(out, not self.recording)
        if self.recording:
            self.saved = (indices, weight.shape[0], check)
        return out

    def backward(self, g: Tensor):
        indices, V, check = self.saved
        defer(check.check)            # after the whole backward is enqueued: no stall
        if not self.needs_input_grad[1]:
            return None, None
        into = self.grad_targets.get(1)
        gw = sk.embedding_backward(indices, g, V, into=into, padding_idx=self.padding_idx)
        return None, (ACCUMULATED if into is not None else gw)


def embedding(indices, weight, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
              *, tape=None):
    """Rows of ``weight`` (V, D) picked by the int32/int64 tensor ``indices`` (any shape):
    ``(*indices.shape, D)``, as ``torch.nn.functional.embedding``. The backward adds the
    gradient rows of repeated indices in index order (bit-reproducible). An index outside
    ``[0, V)`` is a ``ShapeError`` (see the module docstring for when it is raised).
    ``padding_idx`` (negative counts from the end, as PyTorch) names a row that is picked as
    any other but gets no gradient. ``max_norm`` first scales, in place, each picked row of
    ``weight`` whose ``norm_type``-norm exceeds it down to it, as PyTorch (not recorded:
    the gradient is the rescaled rows'); that reads the indices back to the host (a wait).
    ``scale_grad_by_freq`` and ``sparse`` are refused.

    >>> tp.embedding(idx, wte).shape             # idx (B, T), wte (V, D)
    (2, 8, 16)
    """
    if scale_grad_by_freq or sparse:
        raise ShapeError(f"embedding: scale_grad_by_freq and sparse are not supported, got "
                         f"scale_grad_by_freq={scale_grad_by_freq!r}, sparse={sparse!r}")
    if isinstance(indices, np.ndarray):
        indices = Tensor.from_host(_queue_of(weight), indices)
    padding = padding_row("embedding", padding_idx, weight.shape[0])
    if max_norm is not None:
        _renorm(indices, weight, max_norm, norm_type)
    return Embedding.apply(indices, weight, tape=tape, padding_idx=padding)


def _renorm(indices, weight, max_norm, norm_type) -> None:
    """``max_norm``: the picked rows rescaled in place before the lookup. Indices out of
    range are left to the lookup's own check, which names them."""
    if not isinstance(max_norm, Real) or max_norm < 0 or not isinstance(norm_type, Real):
        raise ShapeError(f"embedding: max_norm must be a non-negative number and norm_type a "
                         f"number, got max_norm={max_norm!r}, norm_type={norm_type!r}")
    w = weight.value if isinstance(weight, Node) else weight
    sk.check_indices("embedding", indices, w)
    rows = np.unique(indices.to_host())
    rows = rows[(rows >= 0) & (rows < w.shape[0])]
    sk.embedding_renorm_(w, rows, float(max_norm), float(norm_type))


def padding_row(op: str, padding_idx: int | None, num_embeddings: int) -> int:
    """``padding_idx`` as a row in ``[0, num_embeddings)``, or -1 for None; PyTorch's range
    ``[-num_embeddings, num_embeddings)``."""
    if padding_idx is None:
        return -1
    if not isinstance(padding_idx, (int, np.integer)) or isinstance(padding_idx, bool) \
            or not -num_embeddings <= padding_idx < num_embeddings:
        raise ShapeError(f"{op}: padding_idx must be an int within num_embeddings "
                         f"(in [{-num_embeddings}, {num_embeddings})), got {padding_idx!r}")
    return int(padding_idx) % num_embeddings
