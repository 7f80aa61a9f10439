"""Linear algebra ops: ``matmul`` with numpy semantics: 1-D operands promoted and squeezed,
2-D products, and products batched over any number of leading dimensions with numpy
broadcasting (``(B, H, T, D) @ (B, H, D, T)``, ``(T, D) @ (B, D, E)``).

Every product is one GEMM call: a right operand shared by the whole batch is folded into the
rows of one 2-D GEMM, otherwise the batch is one batched GEMM (at B*H = 64, T = 64, D = 32 about
10-25x faster on this CPU than 64 launches over sub-buffers, which pay PoCL's per-launch cost
64 times: docs/bench-results/checks/attention_kernels.txt), with a left operand that does not
vary over the batch read in place by every batch entry and only a partly broadcast operand
expanded (copied) first. The
backward never materialises a transpose: ``dA = G @ B^T`` and ``dB = A^T @ G`` read the
transposed operand in place (NT and TN), and the gradient of a broadcast operand is summed
over the broadcast dimensions.

>>> a = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3), np.float32)), requires_grad=True)
>>> b = pc.Tensor.from_host(q, np.ones((3, 4), np.float32))
>>> with tp.Tape() as tape:
...     y = tp.sum(a @ b)
>>> tape.backward(y)
>>> a.grad.to_host()
array([[4., 4., 4.],
       [4., 4., 4.]], dtype=float32)
"""

from __future__ import annotations

from ...errors import DTypeError, ShapeError
from ...kernels.gemm import batched_gemm, gemm, product, product2
from ...kernels.matmul import full as _full
from ...kernels.matmul import plan as _plan
from ...kernels.matmul import planned_product
from ...kernels.reduction import sum_to_shape
from ...tensor import FLOAT, Tensor, check_same_queue
from ..node import ACCUMULATED, Function

__all__ = ["bmm", "matmul", "mm"]


def _check_float(a: Tensor, b: Tensor) -> None:
    for t, which in ((a, "left"), (b, "right")):
        if t.dtype != FLOAT:
            raise DTypeError(f"matmul: {which} operand {t.shape} has dtype {t.dtype}, "
                             "expected float32")


class Matmul(Function):
    name = "matmul"
    takes_targets = True

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        if a.dtype is not FLOAT or b.dtype is not FLOAT:      # (``is``: the common case, fast)
            _check_float(a, b)
        if a.queue is not b.queue:
            check_same_queue("matmul", a, b)
        if len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] == b.shape[0]:
            # the common product: one GEMM on the operands as they are, no plan, no views
            self.plan = None
            if self.needs_input_grad is not None:     # recording (without the property's call)
                self.a = a if self.needs_input_grad[1] else None
                self.b = b if self.needs_input_grad[0] else None
            return product(a, b)
        p = self.plan = _plan(a.shape, b.shape)
        a, b = a.reshape(p.a2), b.reshape(p.b2)
        if self.recording:
            self.a = a if self.needs_input_grad[1] else None
            self.b = b if self.needs_input_grad[0] else None
        return planned_product(a, b, p)

    def backward(self, g: Tensor):
        p = self.plan
        if p is None:
            return self._backward_2d(g)
        ga = gb = None
        if self.needs_input_grad[0]:
            b = self.b
            if p.b_batch == 1:
                ga = gemm(g.reshape(p.count * p.m, p.n), b.reshape(p.k, p.n), trans_b=True)
            else:
                ga = batched_gemm(g.reshape(p.count, p.m, p.n), _full(b, p.batch, p.count),
                                  trans_b=True)
                if p.a_batch != p.count:    # a was broadcast: sum over its broadcast dims
                    ga = sum_to_shape(ga.reshape(*p.batch, p.m, p.k), p.a2)
            ga = ga.reshape(p.a_shape)
        if self.needs_input_grad[1]:
            a = self.a
            if p.b_batch == 1:              # shared b: the sum over the batch is in the GEMM
                rows = p.count * p.m
                gb = gemm(a.reshape(rows, p.k), g.reshape(rows, p.n), trans_a=True)
            else:
                a3 = a.reshape(p.m, p.k) if p.a_batch == 1 else _full(a, p.batch, p.count)
                gb = batched_gemm(a3, g.reshape(p.count, p.m, p.n), trans_a=True)
                if p.b_batch != p.count:
                    gb = sum_to_shape(gb.reshape(*p.batch, p.k, p.n), p.b2)
            gb = gb.reshape(p.b_shape)
        return ga, gb

    def _backward_2d(self, g: Tensor):
        """dA = G @ B^T, dB = A^T @ G; one a leaf's existing ``.grad`` is accumulated into
        by the GEMM itself (beta=1: the same sum, rounded once, as adding it afterwards)."""
        ga = gb = None
        targets = self.grad_targets
        if self.needs_input_grad[0] and self.needs_input_grad[1]:      # both: one launch
            into_a, into_b = targets.get(0), targets.get(1)
            ga, gb = product2((g, self.b, False, True, into_a), (self.a, g, True, False, into_b))
            return (ga if into_a is None else ACCUMULATED), (gb if into_b is None else ACCUMULATED)
        if self.needs_input_grad[0]:
            ga = _product(g, self.b, targets.get(0), trans_b=True)
        if self.needs_input_grad[1]:
            gb = _product(self.a, g, targets.get(1), trans_a=True)
        return ga, gb


class Mm(Matmul):
    """``torch.mm``: matmul of two matrices, checked to be 2-D."""

    name = "mm"

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ShapeError(f"mm: expects matrices (m, k) @ (k, n), got {a.shape} @ "
                             f"{b.shape}; tp.matmul broadcasts and batches")
        return super().forward(a, b)


class Bmm(Matmul):
    """``torch.bmm``: matmul of two batches of matrices, checked to be 3-D and alike."""

    name = "bmm"

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        if (a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]
                or a.shape[2] != b.shape[1]):
            raise ShapeError(f"bmm: expects batches (b, m, k) @ (b, k, n), got {a.shape} @ "
                             f"{b.shape}; tp.matmul broadcasts")
        return super().forward(a, b)


def _product(a: Tensor, b: Tensor, into: Tensor | None, **trans):
    # the shapes were checked in the forward; g's by the tape, a target's by its node
    out = product(a, b, into=into, **trans)
    return out if into is None else ACCUMULATED


def matmul(a, b, *, tape=None):
    """``a @ b`` with numpy semantics: 2-D @ 2-D, products batched over any number of leading
    dimensions with numpy broadcasting (``(B, H, T, D) @ (B, H, D, T)``, ``(T, D) @ (B, D,
    E)``), and 1-D operands promoted and squeezed as numpy does. Gradients of broadcast
    operands are summed over the broadcast dimensions. op_name "matmul".

    >>> tp.matmul(a, b).shape
    (2, 4)
    """
    return Matmul.apply(a, b, tape=tape)


def mm(a, b, *, tape=None):
    """``torch.mm``: ``a (m, k) @ b (k, n)``; anything but two matrices that fit is a
    ShapeError (``tp.matmul`` broadcasts). op_name ``"mm"``.

    >>> tp.mm(a, b).shape
    (2, 4)
    """
    return Mm.apply(a, b, tape=tape)


def bmm(a, b, *, tape=None):
    """``torch.bmm``: ``a (B, m, k) @ b (B, k, n)`` with the same ``B``, no broadcasting.
    op_name ``"bmm"``.

    >>> tp.bmm(tp.unsqueeze(a, 0), tp.unsqueeze(b, 0)).shape
    (1, 2, 4)
    """
    return Bmm.apply(a, b, tape=tape)
