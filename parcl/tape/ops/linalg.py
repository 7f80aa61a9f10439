"""Linear algebra ops: ``matmul`` (numpy semantics for 1-D, 2-D and batched 3-D operands).

The backward never materialises a transpose: ``dA = G @ B^T`` and ``dB = A^T @ G`` are GEMMs
with the transposed operand read in place (NT and TN).

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
from ...kernels.gemm import batched_gemm, gemm
from ...tensor import FLOAT, Tensor, check_same_queue
from ..node import Function

__all__ = ["matmul"]


def _plan(a_shape: tuple, b_shape: tuple) -> tuple[tuple, tuple, tuple]:
    """Promoted operand shapes (1-D made 2-D, as numpy) and the result shape."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ShapeError(f"matmul: scalar operand: {a_shape} @ {b_shape}; use mul for "
                         "scalars")
    if len(a_shape) > 3 or len(b_shape) > 3:
        raise ShapeError(f"matmul: supports 1-D, 2-D and 3-D operands, got {a_shape} @ "
                         f"{b_shape}")
    a2 = (1, *a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b2 = (*b_shape, 1) if len(b_shape) == 1 else tuple(b_shape)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {tuple(a_shape)} @ "
                         f"{tuple(b_shape)}")
    if len(b2) == 3 and len(a2) == 2:
        raise ShapeError(f"matmul: a 2-D @ 3-D product ({tuple(a_shape)} @ {tuple(b_shape)}) "
                         "is not supported; transpose it into a 3-D @ 2-D one")
    if len(a2) == 3 and len(b2) == 3 and a2[0] != b2[0]:
        raise ShapeError(f"matmul: batch sizes differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    out = (*a2[:-1], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return a2, b2, out


def _product(a: Tensor, b: Tensor, *, trans_a: bool = False, trans_b: bool = False) -> Tensor:
    """op(a) @ op(b) for 2-D/3-D tensors, a 3-D @ 2-D product folded into one 2-D GEMM."""
    if a.ndim == 3 and b.ndim == 2 and not trans_a:
        m = a.shape[0] * a.shape[1]
        return gemm(a.reshape(m, a.shape[2]), b, trans_b=trans_b).reshape(
            a.shape[0], a.shape[1], -1)
    if a.ndim == 2 and b.ndim == 2:
        return gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    return batched_gemm(a, b, trans_a=trans_a, trans_b=trans_b)


class Matmul(Function):
    name = "matmul"

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        for t, which in ((a, "left"), (b, "right")):
            if t.dtype != FLOAT:
                raise DTypeError(f"matmul: {which} operand {t.shape} has dtype {t.dtype}, "
                                 "expected float32")
        check_same_queue("matmul", a, b)
        a2, b2, out = _plan(a.shape, b.shape)
        self.shapes = (a.shape, b.shape)
        a, b = a.reshape(a2), b.reshape(b2)
        if self.recording:
            self.a = a if self.needs_input_grad[1] else None
            self.b = b if self.needs_input_grad[0] else None
        return _product(a, b).reshape(out)

    def backward(self, g: Tensor):
        ga = gb = None
        a_shape, b_shape = self.shapes
        if self.needs_input_grad[0]:
            b = self.b
            g3 = g.reshape(*_lead(a_shape, b_shape), b.shape[-1])
            ga = _product(g3, b, trans_b=True).reshape(a_shape)
        if self.needs_input_grad[1]:
            a = self.a
            g3 = g.reshape(*a.shape[:-1], -1)
            if a.ndim == 3 and len(b_shape) <= 2:      # shared b: sum over the batch too
                m = a.shape[0] * a.shape[1]
                gb = gemm(a.reshape(m, a.shape[2]), g3.reshape(m, -1), trans_a=True)
            else:
                gb = _product(a, g3, trans_a=True)
            gb = gb.reshape(b_shape)
        return ga, gb


def _lead(a_shape: tuple, b_shape: tuple) -> tuple:
    """The promoted shape of ``a`` without its last (inner) dimension."""
    return ((1,) if len(a_shape) == 1 else tuple(a_shape[:-1]))


def matmul(a, b, *, tape=None):
    """``a @ b`` with numpy semantics: 2-D @ 2-D, batched 3-D @ 3-D and 3-D @ 2-D (a shared
    right operand), and 1-D operands promoted and squeezed as numpy does. op_name "matmul".

    >>> tp.matmul(a, b).shape
    (2, 4)
    """
    return Matmul.apply(a, b, tape=tape)
