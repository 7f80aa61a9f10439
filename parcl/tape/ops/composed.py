"""Small ops composed from others, so their gradients are those ops' own: ``nan_to_num``,
``outer``, ``addmm``, ``baddbmm``, ``bilinear``, ``linalg_vector_norm``, ``norm`` and
``pairwise_distance`` (PyTorch's).

The norms take the root of the positive sums only, as ``normalize`` does
(``parcl/tape/ops/activation_more.py``), and ``|x| ** p`` of the nonzero elements only:
``sqrt``, ``pow(s, 1/p)`` and ``|x| ** p`` for p < 1 have an infinite slope at 0, so the
gradient there would be ``0 * inf = NaN`` where PyTorch's is 0.

>>> a = tp.tensor(np.array([3.0, -4.0], np.float32), requires_grad=True)
>>> float(tp.linalg_vector_norm(a)), float(tp.norm(a, 1)), float(tp.norm(a, float("inf")))
(5.0, 7.0, 4.0)
>>> tp.outer(a, a).to_host()
array([[  9., -12.],
       [-12.,  16.]], dtype=float32)
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from ...errors import ParclError, ShapeError
from ...kernels.elementwise import broadcast_shapes
from ...tensor import Tensor
from ..node import Node
from .elementwise import add, mul, pow
from .linalg import bmm, mm
from .mathops import eq, gt, isfinite, isnan, ne, square
from .reduce import sum
from .reduce_dims import amax, amin
from .select import where
from .shape import permute, reshape, unsqueeze, wrap_dims
from .unary import abs, sqrt

__all__ = ["addmm", "baddbmm", "bilinear", "linalg_vector_norm", "nan_to_num", "norm", "outer"]

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _tensor(op: str, what: str, x) -> None:
    if not isinstance(x, (Node, Tensor)):
        raise TypeError(f"{op}: {what} must be a tp.Node or pc.Tensor, got {type(x).__name__}")


def _number(op: str, what: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (Real, np.number)):
        raise ParclError(f"{op}: {what} must be a number, got {v!r}")
    return float(v)


def nan_to_num(x, nan: float | None = 0.0, posinf: float | None = None,
               neginf: float | None = None, *, tape=None):
    """``torch.nan_to_num``: NaN replaced by ``nan``, +inf by ``posinf`` and -inf by
    ``neginf`` (0 and float32's largest and lowest finite values by default, or given None).
    The gradient passes where ``x`` is finite and is 0 elsewhere. One recorded ``where``.

    >>> tp.nan_to_num(tp.tensor(np.array([np.nan, np.inf, 1.0], np.float32))).to_host()
    array([0.0000000e+00, 3.4028235e+38, 1.0000000e+00], dtype=float32)
    """
    _tensor("nan_to_num", "input", x)
    nan = 0.0 if nan is None else _number("nan_to_num", "nan", nan)
    posinf = FLOAT32_MAX if posinf is None else _number("nan_to_num", "posinf", posinf)
    neginf = -FLOAT32_MAX if neginf is None else _number("nan_to_num", "neginf", neginf)
    raw = x.value if isinstance(x, Node) else x
    # the replacement of each non-finite element, computed on the raw tensor (no gradient)
    fill = where(isnan(raw), nan, where(gt(raw, 0.0), posinf, neginf))
    return where(isfinite(raw), x, fill, tape=tape)


def outer(a, b, *, tape=None):
    """``torch.outer``: ``a[i] * b[j]`` for 1-D ``a`` and ``b``.

    >>> tp.outer(a, tp.tensor(np.ones(3, np.float32))).shape
    (2, 3)
    """
    _tensor("outer", "input", a)
    _tensor("outer", "vec2", b)
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise ShapeError(f"outer: expected two 1-D tensors, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    return mul(reshape(a, (-1, 1), tape=tape), reshape(b, (1, -1), tape=tape), tape=tape)


def _scaled_sum(op: str, product, input_, beta, alpha, tape):
    beta, alpha = _number(op, "beta", beta), _number(op, "alpha", alpha)
    if alpha != 1.0:
        product = mul(product, alpha, tape=tape)
    if beta == 0.0:
        # as PyTorch: input is ignored, its NaN and inf too, yet stays in the graph with a
        # zero gradient (not None: an optimizer's weight decay still reaches it)
        needs = isinstance(input_, Node) and input_.requires_grad
        return where(0.0, input_, product, tape=tape) if needs else product
    return add(input_ if beta == 1.0 else mul(input_, beta, tape=tape), product, tape=tape)


def _check_input(op: str, input_, out_shape) -> None:
    if broadcast_shapes(op, tuple(input_.shape), out_shape) != out_shape:
        raise ShapeError(f"{op}: input {tuple(input_.shape)} does not broadcast to the "
                         f"product's shape {out_shape}")


def addmm(input, mat1, mat2, *, beta: float = 1, alpha: float = 1, tape=None):  # noqa: A002
    """``torch.addmm``: ``beta * input + alpha * (mat1 @ mat2)`` for 2-D ``mat1 (n, m)`` and
    ``mat2 (m, p)``, ``input`` broadcast to ``(n, p)``; ``beta=0`` ignores ``input``.

    >>> tp.addmm(tp.tensor(np.zeros(2, np.float32)), tp.outer(a, a), tp.outer(a, a)).shape
    (2, 2)
    """
    for what, t in (("input", input), ("mat1", mat1), ("mat2", mat2)):
        _tensor("addmm", what, t)
    s1, s2 = tuple(mat1.shape), tuple(mat2.shape)
    if len(s1) != 2 or len(s2) != 2 or s1[1] != s2[0]:
        raise ShapeError(f"addmm: mat1 {s1} and mat2 {s2} must be 2-D (n, m) and (m, p)")
    _check_input("addmm", input, (s1[0], s2[1]))
    return _scaled_sum("addmm", mm(mat1, mat2, tape=tape), input, beta, alpha, tape)


def baddbmm(input, batch1, batch2, *, beta: float = 1, alpha: float = 1,  # noqa: A002
            tape=None):
    """``torch.baddbmm``: ``beta * input + alpha * (batch1 @ batch2)`` for 3-D
    ``batch1 (b, n, m)`` and ``batch2 (b, m, p)``, ``input`` broadcast to ``(b, n, p)``;
    ``beta=0`` ignores ``input``.

    >>> o = tp.reshape(tp.outer(a, a), (1, 2, 2))
    >>> tp.baddbmm(o, o, o, beta=0.5, alpha=2).shape
    (1, 2, 2)
    """
    for what, t in (("input", input), ("batch1", batch1), ("batch2", batch2)):
        _tensor("baddbmm", what, t)
    s1, s2 = tuple(batch1.shape), tuple(batch2.shape)
    if len(s1) != 3 or len(s2) != 3 or s1[0] != s2[0] or s1[2] != s2[1]:
        raise ShapeError(f"baddbmm: batch1 {s1} and batch2 {s2} must be 3-D (b, n, m) and "
                         "(b, m, p)")
    _check_input("baddbmm", input, (s1[0], s1[1], s2[2]))
    return _scaled_sum("baddbmm", bmm(batch1, batch2, tape=tape), input, beta, alpha, tape)


def linalg_vector_norm(x, ord: float = 2, dim=None, keepdim: bool = False,  # noqa: A002
                       *, tape=None):
    """``torch.linalg.vector_norm``: ``sum(|x| ** ord) ** (1 / ord)`` over ``dim`` (an int, a
    tuple, or None for all); ``ord`` inf / -inf is the largest / smallest ``|x|`` (ties
    share the gradient), 0 the count of nonzeros (a raw Tensor: no gradient). The gradient
    is 0 at a zero vector and at zero elements, as PyTorch's.

    >>> tp.linalg_vector_norm(tp.outer(a, a), 2, dim=1).to_host()
    array([15., 20.], dtype=float32)
    """
    _tensor("linalg_vector_norm", "input", x)
    p = _number("linalg_vector_norm", "ord", ord)
    shape = tuple(x.shape)
    axes = None if dim is None else wrap_dims("linalg_vector_norm", dim, len(shape), shape)
    if not shape or not axes:          # dim=() is every dim in PyTorch, as None
        axes = None
    keep = bool(keepdim)
    if p == math.inf:
        return amax(abs(x, tape=tape), axes, keep, tape=tape)
    if p == -math.inf:
        return amin(abs(x, tape=tape), axes, keep, tape=tape)
    if p == 0.0:
        raw = x.value if isinstance(x, Node) else x
        return sum(ne(raw, 0.0), axes, keep)
    if p == 1.0:
        return sum(abs(x, tape=tape), axes, keep, tape=tape)
    if p == 2.0:
        power = square(x, tape=tape)
    else:
        # |x| ** p of the nonzero elements only: at 0 its slope is 0 * inf = NaN for p < 1,
        # where PyTorch's gradient is 0
        nonzero = ne(x.value if isinstance(x, Node) else x, 0.0)
        safe = where(nonzero, x, 1.0, tape=tape)
        power = where(nonzero, pow(abs(safe, tape=tape), p, tape=tape), 0.0, tape=tape)
    s = sum(power, axes, keep, tape=tape)
    # the sums are >= 0: the root of every nonzero one, NaN included, as PyTorch's
    positive = ne(s.value if isinstance(s, Node) else s, 0.0)
    s = where(positive, s, 1.0, tape=tape)
    root = sqrt(s, tape=tape) if p == 2.0 else pow(s, 1.0 / p, tape=tape)
    norm_ = where(positive, root, 0.0, tape=tape)
    if p < 0:
        # a zero's |x| ** p is inf, so its vector's norm is 0 with a gradient of 0 (unless a
        # NaN makes it NaN), as PyTorch's: the sum above left the zeros out
        zeros = sum(eq(x.value if isinstance(x, Node) else x, 0.0), axes, keep)
        raw_s = s.value if isinstance(s, Node) else s
        norm_ = where(where(isnan(raw_s), 0.0, gt(zeros, 0.0)), 0.0, norm_, tape=tape)
    return norm_


def norm(x, p=2, dim=None, keepdim: bool = False, *, tape=None):
    """``torch.norm`` for vector norms: ``linalg_vector_norm(x, p, dim, keepdim)``;
    ``p="fro"`` (and None, as PyTorch's) is the 2-norm over ``dim`` (all of ``x`` when None).
    Other matrix norms (``"nuc"``) are refused.

    >>> float(tp.norm(tp.outer(a, a), "fro"))
    25.0
    """
    if p is None or p == "fro":
        p = 2
    elif isinstance(p, str):
        raise ParclError(f"norm: p={p!r} is not supported (vector norms and 'fro' only); "
                         f"got input {tuple(x.shape)}")
    return linalg_vector_norm(x, p, dim, keepdim, tape=tape)


def bilinear(input1, input2, weight, bias=None, *, tape=None):
    """``torch.nn.functional.bilinear``: ``y[..., o] = sum_ij input1[..., i] * weight[o, i, j]
    * input2[..., j] + bias[o]`` for ``input1`` ``(*, in1)`` and ``input2`` ``(*, in2)`` with
    the same leading dims (none: unbatched), ``weight`` ``(out, in1, in2)``, ``bias``
    ``(out,)``. One GEMM of ``input1`` with the weight laid out ``(in1, out*in2)``, then a
    product with ``input2`` summed over ``in2``.

    >>> tp.bilinear(x1, x2, w).shape          # x1 (5, 2), x2 (5, 3), w (4, 2, 3)
    (5, 4)
    """
    for what, t in (("input1", input1), ("input2", input2), ("weight", weight)):
        _tensor("bilinear", what, t)
    s1, s2, ws = tuple(input1.shape), tuple(input2.shape), tuple(weight.shape)
    if len(ws) != 3 or not s1 or not s2 or s1[:-1] != s2[:-1] or (s1[-1], s2[-1]) != ws[1:]:
        raise ShapeError(f"bilinear: expected input1 (*, in1) and input2 (*, in2) with the same "
                         f"leading dims and weight (out, in1, in2), got input1 {s1}, input2 "
                         f"{s2}, weight {ws}")
    out, in1, in2 = ws
    if bias is not None and tuple(bias.shape) != (out,):
        raise ShapeError(f"bilinear: bias has shape {tuple(bias.shape)}, expected ({out},) for "
                         f"weight {ws}")
    rows = math.prod(s1[:-1])
    w = reshape(permute(weight, (1, 0, 2), tape=tape), (in1, out * in2), tape=tape)
    t = reshape(mm(reshape(input1, (rows, in1), tape=tape), w, tape=tape), (rows, out, in2),
                tape=tape)
    y = sum(mul(t, unsqueeze(reshape(input2, (rows, in2), tape=tape), 1, tape=tape),
                tape=tape), 2, tape=tape)
    if bias is not None:
        y = add(y, bias, tape=tape)
    return reshape(y, s1[:-1] + (out,), tape=tape)
