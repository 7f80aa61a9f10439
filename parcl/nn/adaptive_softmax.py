"""``AdaptiveLogSoftmaxWithLoss``: PyTorch's adaptive softmax (Grave et al., "Efficient softmax
approximation for GPUs"): a head over the frequent classes and one entry per cluster of rarer
ones, each cluster a two-layer projection computed only for the rows whose target is in it.

Which rows go to which cluster depends on the targets: they are read on the host (as
PyTorch's ``nonzero`` reads them), so a captured step holding this layer runs eagerly.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> asm = pc.nn.AdaptiveLogSoftmaxWithLoss(16, 10, cutoffs=[4, 8])
>>> out = asm(tp.tensor(np.ones((3, 16), np.float32)), np.array([0, 5, 9]))
>>> out.output.shape, out.loss.shape
((3,), ())
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..errors import ParclError, ShapeError
from ..runtime import default_queue
from ..tape import Node, ops
from ..tensor import Tensor
from .containers import ModuleList
from .layers import Linear, Sequential
from .module import Module

__all__ = ["AdaptiveLogSoftmaxWithLoss"]

_ASMoutput = namedtuple("_ASMoutput", ["output", "loss"])


class AdaptiveLogSoftmaxWithLoss(Module):
    """``AdaptiveLogSoftmaxWithLoss(in_features, n_classes, cutoffs, div_value=4.0,
    head_bias=False)``: ``head`` a ``Linear(in_features, cutoffs[0] + len(cutoffs))``, and
    ``tail[i]`` ``Sequential(Linear(in_features, in_features // div_value ** (i + 1)),
    Linear(that, cluster size))`` without biases: PyTorch's names, shapes and initialisation.
    ``forward(input, target)`` returns ``(output, loss)``: each row's log-probability of its
    target and their negated mean; ``log_prob(input)`` every class's, ``predict(input)`` the
    most likely class (int64)."""

    def __init__(self, in_features: int, n_classes: int, cutoffs, div_value: float = 4.0,
                 head_bias: bool = False, *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        cutoffs = list(cutoffs)
        if len(cutoffs) == 0:
            raise ParclError("AdaptiveLogSoftmaxWithLoss: cutoffs should be a sequence of "
                             "length larger than 0")
        if (cutoffs != sorted(cutoffs) or min(cutoffs) <= 0 or max(cutoffs) > n_classes - 1
                or len(set(cutoffs)) != len(cutoffs)
                or any(int(c) != c or isinstance(c, bool) for c in cutoffs)):
            raise ParclError(f"AdaptiveLogSoftmaxWithLoss: cutoffs should be a sequence of "
                             f"unique, positive integers sorted in an increasing order, where "
                             f"each value is between 1 and n_classes-1 ({n_classes - 1}), got "
                             f"{cutoffs}")
        self.in_features, self.n_classes = int(in_features), int(n_classes)
        self.cutoffs = [int(c) for c in cutoffs] + [self.n_classes]
        self.div_value, self.head_bias = float(div_value), bool(head_bias)
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        self.head = Linear(self.in_features, self.head_size, bias=self.head_bias, queue=queue)
        tails = []
        for i in range(self.n_clusters):
            hsz = int(self.in_features // (self.div_value ** (i + 1)))
            osz = self.cutoffs[i + 1] - self.cutoffs[i]
            if hsz < 1:
                # PyTorch builds a projection of no features (its cluster then uniform);
                # parcl's tensors hold at least one element
                raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: cluster {i}'s projection has "
                                 f"in_features // div_value ** {i + 1} = {hsz} features; use "
                                 f"a smaller div_value or fewer cutoffs (in_features="
                                 f"{self.in_features}, div_value={self.div_value})")
            tails.append(Sequential(Linear(self.in_features, hsz, bias=False, queue=queue),
                                    Linear(hsz, osz, bias=False, queue=queue)))
        self.tail = ModuleList(tails)

    def forward(self, input, target):  # noqa: A002
        shape = tuple(input.shape)
        labels = target.to_host() if isinstance(target, (Tensor, Node)) \
            else np.asarray(target)
        if len(shape) == 1:
            if labels.ndim != 0:
                raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: 1D target tensor expects 2D "
                                 f"input tensors, but found inputs with size {shape}")
            out = self.forward(ops.unsqueeze(input, 0), labels.reshape(1))
            return _ASMoutput(ops.squeeze(out.output, 0), out.loss)
        if len(shape) != 2 or labels.ndim != 1:
            raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: expected input (N, in_features) "
                             f"with target (N,) or input (in_features,) with a 0-d target, got "
                             f"input {shape} and target {labels.shape}")
        if shape[0] != labels.shape[0]:
            raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: Input and target should have the "
                             f"same size in the batch dimension, got {shape[0]} and "
                             f"{labels.shape[0]}")
        if shape[1] != self.in_features:
            raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: input has {shape[1]} features, "
                             f"expected in_features={self.in_features}")
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: target must hold integer classes, "
                             f"got dtype {labels.dtype}")
        if labels.size and (labels.min() < 0 or labels.max() >= self.n_classes):
            raise ShapeError(f"AdaptiveLogSoftmaxWithLoss: Target values should be in [0, "
                             f"{self.n_classes - 1}], but values in range [{labels.min()}, "
                             f"{labels.max()}] were found.")
        q = input.queue
        labels = labels.astype(np.int64)
        head_pick = labels.copy()
        output = None
        for i in range(1, len(self.cutoffs)):
            low, high = self.cutoffs[i - 1], self.cutoffs[i]
            rows = np.nonzero((labels >= low) & (labels < high))[0]
            if rows.size == 0:
                continue
            head_pick[rows] = self.shortlist_size + i - 1
            rows_t = Tensor.from_host(q, rows.astype(np.int32))   # this batch's: not a plan
            cluster = ops.log_softmax(self.tail[i - 1](ops.index_select(input, 0, rows_t)), 1)
            local = ops.gather(cluster, 1, Tensor.from_host(q, (labels[rows] - low)[:, None]))
            part = ops.index_add(Tensor.zeros(q, (shape[0],)), 0, rows_t,
                                 ops.reshape(local, (rows.size,)))
            output = part if output is None else ops.add(output, part)
        head = ops.log_softmax(self.head(input), 1)
        picked = ops.reshape(ops.gather(head, 1, Tensor.from_host(q, head_pick[:, None])),
                             (shape[0],))
        output = picked if output is None else ops.add(output, picked)
        return _ASMoutput(output, ops.mean(ops.neg(output)))

    def log_prob(self, input):  # noqa: A002
        """Every class's log-probability, ``(N, n_classes)`` (or ``(n_classes,)``)."""
        if len(tuple(input.shape)) == 1:
            return ops.squeeze(self.log_prob(ops.unsqueeze(input, 0)), 0)
        head = ops.log_softmax(self.head(input), 1)
        parts = [head[:, :self.shortlist_size]]
        for i, tail in enumerate(self.tail):
            cluster = ops.log_softmax(tail(input), 1)
            at = self.shortlist_size + i
            parts.append(ops.add(cluster, head[:, at:at + 1]))
        return ops.cat(parts, 1)

    def predict(self, input):  # noqa: A002
        """The most likely class of each row (int64; the first of ties)."""
        logp = self.log_prob(input)
        return ops.argmax(logp.value if isinstance(logp, Node) else logp, -1)

    def extra_repr(self) -> str:
        return ""
