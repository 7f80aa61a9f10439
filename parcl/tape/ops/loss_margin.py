"""PyTorch's margin and embedding losses with ``reduction=`` ('none', 'mean', 'sum'):
``margin_ranking_loss hinge_embedding_loss triplet_margin_loss multi_margin_loss
multilabel_soft_margin_loss``, and ``pairwise_distance`` (the triplet loss's distance).

Each is composed of tape ops (their backwards are the gradient) and ends in ``tp.mean`` or
``tp.sum`` over its rows, so ``ReplicaGroup.step`` weighs a mean by the replicas' rows, as any
mean; ``multilabel_margin_loss``'s per-row term is one op (its labels need integer work, a
kernel). ``multi_margin_loss`` picks each row's target score with a gather whose label check
names the loss: a label outside ``[0, C)`` is a ``ShapeError``, at once when the op is not
recorded, else in the backward or at the first host read of the loss (so is one of
``multilabel_margin_loss`` outside ``[-1, C)``).

>>> x1 = tp.tensor(pc.Tensor.from_host(q, np.array([1.0, 2.0], np.float32)), True)
>>> x2 = pc.Tensor.from_host(q, np.array([2.0, 0.0], np.float32))
>>> y = pc.Tensor.from_host(q, np.array([1.0, 1.0], np.float32))
>>> tp.margin_ranking_loss(x1, x2, y, 0.5, reduction="none").to_host()
array([1.5, 0. ], dtype=float32)
"""

from __future__ import annotations

from ...errors import DTypeError, ParclError, ShapeError
from ...kernels import gather as gk
from ...kernels import multilabel as mk
from ...kernels import onehot as ok
from ...kernels import scatter as sc
from ...kernels.broadcast import broadcast_shapes
from ...tensor import LABEL_DTYPES, Tensor
from .. import mode
from ..node import Function, Node
from ..tape import defer
from .activation import _number, clamp
from .activation_more import logsigmoid
from .composed import linalg_vector_norm
from .elementwise import add, div, minimum, mul, sub
from .loss import class_weight_arg
from .loss_more import _reduce, _tensors, check_reduction
from .mathops import gt, ne, square
from .picks import _RangeCheck
from .reduce import sum
from .select import where
from .shape import reshape
from .unary import neg, relu

__all__ = ["hinge_embedding_loss", "margin_ranking_loss", "multi_margin_loss",
           "multilabel_margin_loss", "multilabel_soft_margin_loss", "pairwise_distance",
           "triplet_margin_loss"]


def margin_ranking_loss(input1, input2, target, margin: float = 0.0, *,
                        reduction: str = "mean", tape=None):
    """``max(0, -target * (input1 - input2) + margin)``, targets +-1 (a target that requires
    grad gets its gradient, as PyTorch's); the three must have the same number of dims and
    broadcast. ``reduction`` keyword-only (PyTorch's deprecated ``size_average``/``reduce``
    come first).

    >>> tp.margin_ranking_loss(x1, x2, y).item()
    0.5
    """
    op = "margin_ranking_loss"
    check_reduction(op, reduction)
    _tensors(op, input1=input1, input2=input2, target=target)
    shapes = [tuple(v.shape) for v in (input1, input2, target)]
    if len({len(s) for s in shapes}) != 1:
        raise ShapeError(f"{op}: all input tensors should have the same number of dimensions, "
                         f"got input1 {shapes[0]}, input2 {shapes[1]}, target {shapes[2]}")
    broadcast_shapes(op, broadcast_shapes(op, shapes[0], shapes[1]), shapes[2])
    m = _number(op, "margin", margin)
    d = mul(neg(target, tape=tape), sub(input1, input2, tape=tape), tape=tape)
    # PyTorch's clamp_min, whose gradient passes at the hinge (tied scores at margin 0)
    return _reduce(clamp(add(d, m, tape=tape), min=0.0, tape=tape), reduction, tape)


def hinge_embedding_loss(input, target, margin: float = 1.0, *,  # noqa: A002
                         reduction: str = "mean", tape=None):
    """PyTorch's: ``input`` where ``target == 1``, ``max(0, margin - input)`` where ``target ==
    -1`` (both, added, for any other target); target and input broadcast.

    >>> tp.hinge_embedding_loss(x1, y).item()
    1.5
    """
    op = "hinge_embedding_loss"
    check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    broadcast_shapes(op, tuple(input.shape), tuple(target.shape))
    m = _number(op, "margin", margin)
    t = target.value if isinstance(target, Node) else target    # no gradient, as PyTorch's
    hinge = where(ne(t, 1.0), clamp(sub(m, input, tape=tape), min=0.0, tape=tape), 0.0,
                  tape=tape)
    kept = where(ne(t, -1.0), input, 0.0, tape=tape)
    return _reduce(add(hinge, kept, tape=tape), reduction, tape)


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False, *,
                      tape=None):
    """``torch.nn.functional.pairwise_distance``: the ``p``-norm of ``x1 - x2 + eps`` over the
    last dim of their broadcast (``eps`` keeps the norm's gradient finite at equal vectors).

    >>> round(tp.pairwise_distance(x1, x2, eps=0.0).item(), 6)
    2.236068
    """
    op = "pairwise_distance"
    _tensors(op, x1=x1, x2=x2)
    shape = broadcast_shapes(op, tuple(x1.shape), tuple(x2.shape))
    if not shape:
        raise ShapeError(f"{op}: inputs need at least one dimension, got x1 "
                         f"{tuple(x1.shape)} and x2 {tuple(x2.shape)}")
    d = add(sub(x1, x2, tape=tape), _number(op, "eps", eps), tape=tape)
    return linalg_vector_norm(d, _number(op, "p", p), -1, bool(keepdim), tape=tape)


def check_triplet(op: str, anchor, positive, negative, margin, reduction: str) -> float:
    """The checks the triplet losses share: the reduction, three tensors of one number of
    dims, and ``margin > 0``, which is returned as a float."""
    check_reduction(op, reduction)
    _tensors(op, anchor=anchor, positive=positive, negative=negative)
    m = _number(op, "margin", margin)
    if not m > 0:
        raise ParclError(f"{op}: margin must be greater than 0, got {margin}")
    shapes = [tuple(v.shape) for v in (anchor, positive, negative)]
    if len({len(s) for s in shapes}) != 1:
        raise ShapeError(f"{op}: the anchor, positive, and negative tensors are expected to "
                         f"have the same number of dimensions, got anchor {shapes[0]}, "
                         f"positive {shapes[1]}, negative {shapes[2]}")
    return m


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2.0,
                        eps: float = 1e-6, swap: bool = False, *, reduction: str = "mean",
                        tape=None):
    """``max(0, margin + d(anchor, positive) - d(anchor, negative))`` with ``d`` the
    ``pairwise_distance(., ., p, eps)`` over the last dim; ``swap=True`` uses the smaller of
    ``d(anchor, negative)`` and ``d(positive, negative)`` (Balntas et al.). The three have the
    same number of dims; ``margin`` must be > 0.

    >>> tp.triplet_margin_loss(x1, x2, x2).item()
    1.0
    """
    op = "triplet_margin_loss"
    m = check_triplet(op, anchor, positive, negative, margin, reduction)
    d_pos = pairwise_distance(anchor, positive, p, eps, tape=tape)
    d_neg = pairwise_distance(anchor, negative, p, eps, tape=tape)
    if swap:
        d_neg = minimum(d_neg, pairwise_distance(positive, negative, p, eps, tape=tape),
                        tape=tape)
    # PyTorch's clamp_min, whose gradient passes at the hinge (relu's would not)
    return _reduce(clamp(add(sub(d_pos, d_neg, tape=tape), m, tape=tape), min=0.0,
                         tape=tape), reduction, tape)


class TargetScore(Function):
    """``x[r, target[r]]`` as an (N, 1) column: gather along dim 1 with a label check that
    names the loss (and the labels' own shape), raised as ``gather``'s is."""

    name = "multi_margin_loss_target"

    def forward(self, x: Tensor, index: Tensor, op: str = "", labels: Tensor | None = None,
                what: str = ""):
        out, flag = gk.gather_forward(x, 1, index)
        check = _RangeCheck(op, flag, labels, x.shape[1], what, lambda at: at, noun="label")
        check.guard(out, not self.recording)
        if self.recording:
            self.saved = (x.shape, index, check)
        return out

    def backward(self, g: Tensor):
        x_shape, index, check = self.saved
        defer(check.check)
        if not self.needs_input_grad[0]:
            return None, None
        return sc.gather_backward(g, x_shape, 1, index), None


def multi_margin_loss(input, target, p: int = 1, margin: float = 1.0,  # noqa: A002
                      weight=None, *, reduction: str = "mean", tape=None):
    """The multi-class hinge loss: per row ``sum_{j != y} w[y] max(0, margin - x[y] +
    x[j]) ** p / C`` for ``input`` (N, C) or (C,) and int class indices ``target`` (N,) or
    (); ``p`` 1 or 2; ``weight`` (C,) class weights (constants: no gradient, as PyTorch's).
    A label outside ``[0, C)`` is a ``ShapeError`` naming it and its position.

    >>> scores = pc.Tensor.from_host(q, np.array([[0.1, 0.2, 0.4, 0.8]], np.float32))
    >>> round(tp.multi_margin_loss(scores, pc.Tensor.from_host(q, np.array([3]))).item(), 4)
    0.325
    """
    op = "multi_margin_loss"
    check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    if isinstance(p, bool) or p not in (1, 2):
        raise ParclError(f"{op}: only p == 1 and p == 2 supported, got p={p!r}")
    m = _number(op, "margin", margin)
    shape, tshape = tuple(input.shape), tuple(target.shape)
    if len(shape) not in (1, 2) or not shape[-1]:
        raise ShapeError(f"{op}: input must be (N, C) or (C,) with C > 0, got {shape}")
    if tshape != shape[:-1]:
        raise ShapeError(f"{op}: inconsistent target size: got target {tshape} for input "
                         f"{shape}, expected {shape[:-1]}")
    labels = target.value if isinstance(target, Node) else target
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"{op}: target has dtype {labels.dtype} (shape {tshape}); expected "
                         "int32 or int64 class indices")
    c = shape[-1]
    rows = shape[0] if len(shape) == 2 else 1
    w = class_weight_arg(op, weight, input)
    if w is not None and tuple(w.shape) != (c,):
        raise ShapeError(f"{op}: weight must be one weight per class, ({c},) for input "
                         f"{shape}, got {tuple(w.shape)}")
    x = input if len(shape) == 2 else reshape(input, (1, c), tape=tape)
    flat = labels.reshape((rows,))
    picked = TargetScore.apply(x, flat.reshape((rows, 1)), tape=tape, op=op, labels=labels,
                                what=f"input {shape} ({c} classes)")
    onehot, _ = ok.one_hot(flat, c)          # in range or refused by TargetScore's check
    h = relu(add(sub(x, picked, tape=tape), m, tape=tape), tape=tape)
    if p == 2:
        h = square(h, tape=tape)
    h = where(onehot, 0.0, h, tape=tape)     # the target's own term is left out
    if w is not None:
        h = mul(h, sum(mul(onehot, w), 1, True), tape=tape)       # w[y], per row
    loss = div(sum(h, 1, tape=tape), float(c), tape=tape)
    return _reduce(loss if len(shape) == 2 else reshape(loss, (), tape=tape), reduction, tape)


def multilabel_soft_margin_loss(input, target, weight=None, *,  # noqa: A002
                                reduction: str = "mean", tape=None):
    """``-mean_c w[c] (y log sigmoid(x) + (1 - y) log sigmoid(-x))`` per row, the classes
    along the last dim of ``input`` (N, C) or (C,), float targets (0/1) of its shape;
    ``weight`` broadcasts to the input (a Node that requires grad gets its gradient).

    >>> tp.multilabel_soft_margin_loss(x1, y).shape
    ()
    """
    op = "multilabel_soft_margin_loss"
    check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    shape = tuple(input.shape)
    if not shape:
        raise ShapeError(f"{op}: input must have a class dim, (N, C) or (C,), got {shape}")
    if tuple(target.shape) != shape:
        raise ShapeError(f"{op}: target {tuple(target.shape)} must have the input's shape "
                         f"{shape}")
    pos = mul(target, logsigmoid(input, tape=tape), tape=tape)
    neg_ = mul(sub(1.0, target, tape=tape), logsigmoid(neg(input, tape=tape), tape=tape),
               tape=tape)
    loss = neg(add(pos, neg_, tape=tape), tape=tape)
    if weight is not None:
        _tensors(op, weight=weight)
        if broadcast_shapes(op, tuple(weight.shape), shape) != shape:
            raise ShapeError(f"{op}: weight of shape {tuple(weight.shape)} does not broadcast "
                             f"to the input's shape {shape}")
        loss = mul(loss, weight, tape=tape)
    per_row = div(sum(loss, len(shape) - 1, tape=tape), float(shape[-1]), tape=tape)
    return _reduce(per_row, reduction, tape)



class MultilabelMargin(Function):
    """Per row ``sum_{j, i} [i not a label] max(0, 1 - x[y_j] + x[i]) / C`` over the labels
    ``y_j`` before the row's first -1: the hinges of every (label, class) pair, (N, C, C),
    weighed by the label's count and the class not being a label."""

    name = "multilabel_margin_loss"

    def forward(self, x: Tensor, labels: Tensor, target: Tensor | None = None,
                what: str = ""):
        n, c = x.shape
        counts, flag = mk.label_counts(labels)
        check = _RangeCheck(self.name, flag, target, c, what, lambda at: at, noun="label")
        if not self.recording or mode.is_anomaly_enabled():
            check.check()
        others = sub(1.0, gt(counts, 0.0))                  # the classes that are no label
        pairs = mul(counts.reshape((n, c, 1)), others.reshape((n, 1, c)))
        z = add(sub(x.reshape((n, 1, c)), x.reshape((n, c, 1))), 1.0)   # 1 - x[k] + x[i]
        out = div(sum(mul(relu(z), pairs), (1, 2)), float(c))
        out.checks = (check.check,)
        if self.recording:
            self.saved = (mul(pairs, gt(z, 0.0)), check)
        return out

    def backward(self, g: Tensor):
        active, check = self.saved
        defer(check.check)
        if not self.needs_input_grad[0]:
            return None, None
        n, c, _ = active.shape
        a = mul(active, div(g, float(c)).reshape((n, 1, 1)))
        return sub(sum(a, 1), sum(a, 2)), None       # + as the class i, - as the label k


def multilabel_margin_loss(input, target, *, reduction: str = "mean",  # noqa: A002
                           tape=None):
    """The multi-label hinge loss: per row ``sum_{j, i not a label} max(0, 1 - (x[y_j] -
    x[i])) / C`` for ``input`` (N, C) or (C,) and an int ``target`` of its shape holding each
    row's labels ``y_j`` up to its first -1 (the rest ignored; a label listed twice counts
    twice, as PyTorch's). Every target entry must be in ``[-1, C)`` (a ``ShapeError`` naming
    it and its position otherwise). Memory and work are O(N C**2), as PyTorch's work is.

    >>> scores = pc.Tensor.from_host(q, np.array([[0.1, 0.2, 0.4, 0.8]], np.float32))
    >>> labels = pc.Tensor.from_host(q, np.array([[3, 0, -1, 1]]))
    >>> round(tp.multilabel_margin_loss(scores, labels).item(), 4)
    0.85
    """
    op = "multilabel_margin_loss"
    check_reduction(op, reduction)
    _tensors(op, input=input, target=target)
    shape = tuple(input.shape)
    if len(shape) not in (1, 2) or not shape[-1]:
        raise ShapeError(f"{op}: input must be (N, C) or (C,) with C > 0, got {shape}")
    if tuple(target.shape) != shape:
        raise ShapeError(f"{op}: inconsistent target size: got target {tuple(target.shape)} "
                         f"for input {shape}; expected the input's shape")
    labels = target.value if isinstance(target, Node) else target
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"{op}: target has dtype {labels.dtype} (shape {shape}); expected "
                         "int32 or int64 class indices (-1 ends a row's labels)")
    c = shape[-1]
    rows = shape[0] if len(shape) == 2 else 1
    x = input if len(shape) == 2 else reshape(input, (1, c), tape=tape)
    loss = MultilabelMargin.apply(x, labels.reshape((rows, c)), tape=tape, target=labels,
                                  what=f"input {shape} ({c} classes, -1 ending a row's "
                                       f"labels)")
    return _reduce(loss if len(shape) == 2 else reshape(loss, (), tape=tape), reduction, tape)
