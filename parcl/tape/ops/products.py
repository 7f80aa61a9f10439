"""PyTorch's vector and matrix products and distances: ``dot``, ``vdot``, ``inner``, ``mv``,
``addmv``, ``addr``, ``addbmm``, ``kron``, ``cross``, ``cdist`` and ``dist``.

Each is composed of ops with their own backward (``mul``, ``sum``, ``mm``, ``matmul``,
``tensordot``, ``index_select``, ``linalg_vector_norm``), so its gradient is theirs and its sums
run in a fixed order. ``addbmm`` is one ``mm`` of the batches laid side by side (the batch sum
is part of the GEMM's own sum), and ``cdist`` a broadcast difference and a norm over its last
dim, or, for ``p=2`` and more than 25 rows as PyTorch's, one GEMM with its own backward.

>>> a = tp.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
>>> float(tp.dot(a, a)), tp.cross(a, tp.tensor(np.array([0.0, 0.0, 1.0]))).to_host()
(14.0, array([ 2., -1.,  0.], dtype=float32))
"""

from __future__ import annotations

import numpy as np

from ...errors import ParclError, ShapeError
from ...kernels.elementwise import broadcast_shapes
from ...tensor import Tensor
from ..node import Function
from .composed import _check_input, _number, _scaled_sum, _tensor, linalg_vector_norm, outer
from .diagonals import tensordot
from .elementwise import add, div, mul, sub
from .indexing import expand
from .linalg import bmm, matmul, mm
from .mathops import eq, sign
from .mathops_more import clamp_min
from .picks import constant, index_select
from .reduce import sum
from .reduce_dims import amax
from .select import where
from .shape import permute, reshape, unsqueeze, wrap_dim
from .unary import abs, neg, sqrt

__all__ = ["addbmm", "addmv", "addr", "cdist", "cross", "dist", "dot", "inner", "kron", "mv",
           "vdot"]


def _vectors(op: str, a, b) -> None:
    _tensor(op, "input", a)
    _tensor(op, "tensor", b)
    sa, sb = tuple(a.shape), tuple(b.shape)
    if len(sa) != 1 or len(sb) != 1 or sa != sb:
        raise ShapeError(f"{op}: expected two 1-D tensors of one length, got {sa} and {sb}")


def dot(input, tensor, *, tape=None):  # noqa: A002
    """``torch.dot``: ``sum(input * tensor)`` of two 1-D tensors of one length, 0-d.

    >>> float(tp.dot(a, tp.tensor(np.ones(3, np.float32))))
    6.0
    """
    _vectors("dot", input, tensor)
    return sum(mul(input, tensor, tape=tape), tape=tape)


def vdot(input, other, *, tape=None):  # noqa: A002
    """``torch.vdot``: ``dot`` with the first argument conjugated; parcl's tensors are real,
    so it is ``dot``.

    >>> float(tp.vdot(a, a))
    14.0
    """
    _vectors("vdot", input, other)
    return sum(mul(input, other, tape=tape), tape=tape)


def inner(input, other, *, tape=None):  # noqa: A002
    """``torch.inner``: the sum over the last dim of both (``input (*a, n)``, ``other (*b, n)``
    gives ``(*a, *b)``); a 0-d operand multiplies the other. ``tensordot`` over the last dims.

    >>> tp.inner(tp.reshape(a, (1, 3)), a).to_host()
    array([14.], dtype=float32)
    """
    _tensor("inner", "input", input)
    _tensor("inner", "other", other)
    sa, sb = tuple(input.shape), tuple(other.shape)
    if not sa or not sb:
        return mul(input, other, tape=tape)
    if sa[-1] != sb[-1]:
        raise ShapeError(f"inner: the last dims of input {sa} and other {sb} must match, got "
                         f"{sa[-1]} and {sb[-1]}")
    return tensordot(input, other, ([len(sa) - 1], [len(sb) - 1]), tape=tape)


def _mat_vec(op: str, mat, vec) -> tuple[int, int]:
    _tensor(op, "mat", mat)
    _tensor(op, "vec", vec)
    sm, sv = tuple(mat.shape), tuple(vec.shape)
    if len(sm) != 2 or len(sv) != 1 or sm[1] != sv[0]:
        raise ShapeError(f"{op}: expected mat (n, m) and vec (m,), got mat {sm} and vec {sv}")
    return sm


def mv(input, vec, *, tape=None):  # noqa: A002
    """``torch.mv``: the matrix ``input (n, m)`` times the vector ``vec (m,)``, ``(n,)``.

    >>> tp.mv(tp.outer(a, a), a).to_host()
    array([14., 28., 42.], dtype=float32)
    """
    _mat_vec("mv", input, vec)
    return matmul(input, vec, tape=tape)


def addmv(input, mat, vec, *, beta: float = 1, alpha: float = 1, tape=None):  # noqa: A002
    """``torch.addmv``: ``beta * input + alpha * (mat @ vec)``, ``input`` broadcast to
    ``(n,)``; ``beta=0`` ignores ``input`` (NaN too; its gradient then zeros), as PyTorch.

    >>> tp.addmv(a, tp.outer(a, a), a, beta=0.5).to_host()
    array([14.5, 29. , 43.5], dtype=float32)
    """
    _tensor("addmv", "input", input)
    n, _ = _mat_vec("addmv", mat, vec)
    _check_input("addmv", input, (n,))
    return _scaled_sum("addmv", matmul(mat, vec, tape=tape), input, beta, alpha, tape)


def addr(input, vec1, vec2, *, beta: float = 1, alpha: float = 1, tape=None):  # noqa: A002
    """``torch.addr``: ``beta * input + alpha * outer(vec1, vec2)``, ``input`` broadcast to
    ``(n, m)``; ``beta=0`` ignores ``input``.

    >>> tp.addr(tp.tensor(np.zeros((3, 3), np.float32)), a, a, alpha=2).shape
    (3, 3)
    """
    for what, t in (("input", input), ("vec1", vec1), ("vec2", vec2)):
        _tensor("addr", what, t)
    s1, s2 = tuple(vec1.shape), tuple(vec2.shape)
    if len(s1) != 1 or len(s2) != 1:
        raise ShapeError(f"addr: expected 1-D vec1 and vec2, got {s1} and {s2}")
    _check_input("addr", input, (s1[0], s2[0]))
    return _scaled_sum("addr", outer(vec1, vec2, tape=tape), input, beta, alpha, tape)


def addbmm(input, batch1, batch2, *, beta: float = 1, alpha: float = 1,  # noqa: A002
           tape=None):
    """``torch.addbmm``: ``beta * input + alpha * sum_b batch1[b] @ batch2[b]`` for
    ``batch1 (b, n, m)`` and ``batch2 (b, m, p)``, ``input`` broadcast to ``(n, p)``. One
    ``mm`` of ``batch1`` laid out ``(n, b*m)`` with ``batch2`` as ``(b*m, p)``.

    >>> o = tp.reshape(tp.outer(a, a), (1, 3, 3))
    >>> tp.addbmm(tp.tensor(np.zeros(3, np.float32)), o, o).shape
    (3, 3)
    """
    for what, t in (("input", input), ("batch1", batch1), ("batch2", batch2)):
        _tensor("addbmm", what, t)
    s1, s2 = tuple(batch1.shape), tuple(batch2.shape)
    if len(s1) != 3 or len(s2) != 3 or s1[0] != s2[0] or s1[2] != s2[1]:
        raise ShapeError(f"addbmm: batch1 {s1} and batch2 {s2} must be 3-D (b, n, m) and "
                         "(b, m, p)")
    b, n, m = s1
    _check_input("addbmm", input, (n, s2[2]))
    side_by_side = reshape(permute(batch1, (1, 0, 2), tape=tape), (n, b * m), tape=tape)
    product = mm(side_by_side, reshape(batch2, (b * m, s2[2]), tape=tape), tape=tape)
    return _scaled_sum("addbmm", product, input, beta, alpha, tape)


def kron(input, other, *, tape=None):  # noqa: A002
    """``torch.kron``: the Kronecker product; the operand with fewer dims gets leading 1s,
    and ``out[i*B + j] = input[i] * other[j]`` in every dim (``B`` other's size there). One
    broadcast ``mul`` of the two laid out ``(a0, 1, a1, 1, ...)`` and ``(1, b0, 1, b1, ...)``.

    >>> tp.kron(a, tp.tensor(np.array([1.0, 10.0], np.float32))).to_host()
    array([ 1., 10.,  2., 20.,  3., 30.], dtype=float32)
    """
    _tensor("kron", "input", input)
    _tensor("kron", "other", other)
    sa, sb = tuple(input.shape), tuple(other.shape)
    nd = max(len(sa), len(sb))
    sa, sb = (1,) * (nd - len(sa)) + sa, (1,) * (nd - len(sb)) + sb
    a = reshape(input, tuple(v for s in sa for v in (s, 1)), tape=tape)
    b = reshape(other, tuple(v for s in sb for v in (1, s)), tape=tape)
    return reshape(mul(a, b, tape=tape), tuple(x * y for x, y in zip(sa, sb)), tape=tape)


def cross(input, other, dim: int = -1, *, tape=None):  # noqa: A002
    """``torch.linalg.cross``: the cross product of 3-vectors along ``dim`` (default -1, as
    ``torch.linalg.cross``; ``torch.cross``'s ``dim=None`` picks the first dim of size 3, a
    choice PyTorch deprecates), the inputs (of one number of dims) broadcast. Each component is
    ``a[j] * b[k] - a[k] * b[j]``: two ``index_select`` of each input, ``mul`` and ``sub``.

    >>> tp.cross(tp.tensor(np.eye(3, dtype=np.float32)), a).to_host()[0]
    array([ 0., -3.,  2.], dtype=float32)
    """
    _tensor("cross", "input", input)
    _tensor("cross", "other", other)
    sa, sb = tuple(input.shape), tuple(other.shape)
    if len(sa) != len(sb) or not sa:
        raise ShapeError(f"cross: expects two tensors of one number of dims (at least one), "
                         f"got input {sa} and other {sb}")
    axis = wrap_dim("cross", dim, len(sa), sa)
    if sa[axis] != 3 or sb[axis] != 3:
        raise ShapeError(f"cross: dim {dim} must have size 3 in both inputs, got input {sa} "
                         f"and other {sb}")
    shape = broadcast_shapes("cross", sa, sb)
    if sa != shape:
        input = expand(input, shape, tape=tape)  # noqa: A001
    if sb != shape:
        other = expand(other, shape, tape=tape)
    q = input.queue
    nxt, last = constant(q, np.array([1, 2, 0], np.int32)), constant(q, np.array([2, 0, 1],
                                                                                 np.int32))
    a1, a2 = index_select(input, axis, nxt, tape=tape), index_select(input, axis, last, tape=tape)
    b1, b2 = index_select(other, axis, nxt, tape=tape), index_select(other, axis, last, tape=tape)
    return sub(mul(a1, b2, tape=tape), mul(a2, b1, tape=tape), tape=tape)


class EuclideanDist(Function):
    """The 2-norm distances of the rows of ``x1 (B, P, M)`` and ``x2 (B, R, M)`` by one GEMM:
    ``sqrt(max(|a|^2 + |b|^2 - 2 a.b, 0))``, PyTorch's ``_euclidean_dist``. Its backward is
    PyTorch's too, ``ratio = g / d`` (0 where ``d`` is 0): ``x1 * sum_r ratio - ratio @ x2``,
    so coinciding rows get a zero gradient, not the ``0 * inf`` of the composed square root."""

    name = "cdist"

    def forward(self, x1: Tensor, x2: Tensor):
        rows1 = sum(mul(x1, x1), 2, True)                            # (B, P, 1)
        rows2 = permute(sum(mul(x2, x2), 2, True), (0, 2, 1))        # (B, 1, R)
        cross_ = bmm(x1, permute(x2, (0, 2, 1)))
        squared = sub(add(rows1, rows2), mul(cross_, 2.0))
        d = sqrt(clamp_min(squared, 0.0))
        if self.recording:
            self.saved = (x1, x2, d)
        return d

    def backward(self, g: Tensor):
        x1, x2, d = self.saved
        ratio = where(eq(d, 0.0), 0.0, div(g, where(eq(d, 0.0), 1.0, d)))
        need = self.needs_input_grad
        g1 = g2 = None
        if need[0]:
            g1 = sub(mul(x1, sum(ratio, 2, True)), bmm(ratio, x2))
        if need[1]:
            g2 = sub(mul(x2, permute(sum(ratio, 1, True), (0, 2, 1))),
                     bmm(permute(ratio, (0, 2, 1)), x1))
        return g1, g2


class ChebyshevDist(Function):
    """The inf-norm distances of the rows of ``x1 (*, P, M)`` and ``x2 (*, R, M)`` (one
    leading shape): the largest ``|a - b|`` of each pair. Its backward is PyTorch's cdist's,
    ``g * sign(a - b)`` to every element at the maximum: ties each get the whole gradient,
    where ``linalg_vector_norm``'s (``torch.dist``'s) share it."""

    name = "cdist"

    def forward(self, x1: Tensor, x2: Tensor):
        diff = sub(unsqueeze(x1, -2), unsqueeze(x2, -3))              # (*, P, R, M)
        d = amax(abs(diff), -1)
        if self.recording:
            self.saved = (diff, d)
        return d

    def backward(self, g: Tensor):
        diff, d = self.saved
        at_max = eq(abs(diff), unsqueeze(d, -1))
        per_element = mul(mul(sign(diff), at_max), unsqueeze(g, -1))
        need = self.needs_input_grad
        g1 = sum(per_element, -2) if need[0] else None
        g2 = neg(sum(per_element, -3)) if need[1] else None
        return g1, g2


def _with_batch(x, batch: tuple, tape):
    """``x (*, N, M)`` expanded to the leading dims ``batch``."""
    shape = tuple(x.shape)
    return x if shape[:-2] == batch else expand(x, batch + shape[-2:], tape=tape)


COMPUTE_MODES = (None, "use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                 "donot_use_mm_for_euclid_dist")


def cdist(x1, x2, p: float = 2.0, compute_mode=None, *, tape=None):
    """``torch.cdist``: the ``p``-norm distance between each row of ``x1 (*, P, M)`` and each
    of ``x2 (*, R, M)``, ``(*, P, R)`` (the leading dims broadcast). For ``p=2`` with more
    than 25 rows on either side (``compute_mode`` None or
    ``"use_mm_for_euclid_dist_if_necessary"``; always with ``"use_mm_for_euclid_dist"``), as
    PyTorch: one GEMM, ``sqrt(|a|^2 + |b|^2 - 2 a.b)`` (tens of times quicker, and as
    PyTorch's it loses precision for rows close together); otherwise the norm of the broadcast
    difference over its last dim (``P * R * M`` elements), exact. Either way the gradient is 0
    where two rows coincide, as PyTorch's; for ``p=inf`` each element tied at the largest
    difference gets the whole gradient, as PyTorch's cdist (``torch.dist`` shares it). ``p=0``
    counts the differing elements (a raw Tensor, no gradient).

    >>> tp.cdist(tp.reshape(a, (3, 1)), tp.reshape(a, (3, 1))).to_host()[0]
    array([0., 1., 2.], dtype=float32)
    """
    _tensor("cdist", "x1", x1)
    _tensor("cdist", "x2", x2)
    s1, s2 = tuple(x1.shape), tuple(x2.shape)
    if len(s1) < 2 or len(s2) < 2 or s1[-1] != s2[-1]:
        raise ShapeError(f"cdist: expected x1 (*, P, M) and x2 (*, R, M) with the same M, got "
                         f"x1 {s1} and x2 {s2}")
    batch = broadcast_shapes("cdist", s1[:-2], s2[:-2])
    p = _number("cdist", "p", p)
    if p < 0 or np.isnan(p):
        raise ShapeError(f"cdist: p must be non-negative, got {p} (x1 {s1}, x2 {s2})")
    if compute_mode not in COMPUTE_MODES:
        raise ParclError(f"cdist: compute_mode must be one of {COMPUTE_MODES}, got "
                         f"{compute_mode!r}")
    by_mm = p == 2.0 and (compute_mode == "use_mm_for_euclid_dist" or (
        compute_mode in COMPUTE_MODES[:2] and (s1[-2] > 25 or s2[-2] > 25)))
    if by_mm:
        b = int(np.prod(batch, dtype=np.int64))
        a3 = reshape(_with_batch(x1, batch, tape), (b, *s1[-2:]), tape=tape)
        b3 = reshape(_with_batch(x2, batch, tape), (b, *s2[-2:]), tape=tape)
        return reshape(EuclideanDist.apply(a3, b3, tape=tape), batch + (s1[-2], s2[-2]),
                       tape=tape)
    if p == np.inf:
        return ChebyshevDist.apply(_with_batch(x1, batch, tape), _with_batch(x2, batch, tape),
                                   tape=tape)
    diff = sub(unsqueeze(x1, -2, tape=tape), unsqueeze(x2, -3, tape=tape), tape=tape)
    return linalg_vector_norm(diff, p, -1, tape=tape)


def dist(input, other, p: float = 2, *, tape=None):  # noqa: A002
    """``torch.dist``: the ``p``-norm of ``input - other`` (broadcast) over every element,
    0-d; any ``p`` of ``linalg_vector_norm`` (inf, -inf, 0 ...).

    >>> float(tp.dist(a, tp.tensor(np.zeros(3, np.float32)), 1))
    6.0
    """
    _tensor("dist", "input", input)
    _tensor("dist", "other", other)
    broadcast_shapes("dist", tuple(input.shape), tuple(other.shape))
    return linalg_vector_norm(sub(input, other, tape=tape), _number("dist", "p", p), tape=tape)
