"""Elementwise kernels: binary ops with numpy broadcasting, unary ops (with up to two float
parameters), tensor-scalar ops, the backward helpers of the activations, and in-place updates
(axpy, scale_).

One OpenCL program for the family (and one for the special functions, ``elementwise_special``,
built only when one of them runs). Same-shape inputs take a flat fast path; broadcasting takes a
strided-index path over at most 6 dimensions after adjacent dimensions are collapsed (so a bias
add ``(N, C) + (C,)`` is a 2-D walk whatever N's own rank was). Launchers enqueue on the first
input's queue and never wait; outputs come from the queue's pool.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import elementwise as ew
>>> q = pc.default_queue()
>>> a = pc.Tensor.from_host(q, np.ones((3, 1), np.float32))
>>> b = pc.Tensor.from_host(q, np.arange(4, dtype=np.float32))
>>> ew.binary("add", a, b).to_host().shape
(3, 4)
>>> y = pc.Tensor.from_host(q, np.ones(3, np.float32))
>>> ew.axpy(y, pc.Tensor.from_host(q, np.arange(3, dtype=np.float32)), 2.0).to_host()
array([1., 3., 5.], dtype=float32)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from numbers import Real

import numpy as np

from ..errors import DeviceError, DTypeError, ShapeError
from ..tensor import FLOAT, Tensor, check_same_queue, dims
from .clmath import GELU_TANH, NORMAL_CDF
from .elementwise_ops import BINARY_OPS, GRAD_OPS, HELPERS, REVERSED, UNARY_OPS
from .elementwise_special import (SPECIAL_BINARY, SPECIAL_GRAD, SPECIAL_HELPERS,
                                  SPECIAL_UNARY)
from ._cache import get_kernel, keep
from .broadcast import (broadcast_shapes, broadcast_strides,  # noqa: F401
                        collapse_dims, int8_vector)

MAX_DIMS = 6

# The offsets of element i in two strided views (other kernel families broadcast with it too).
STRIDED_OFFSETS = r"""
/* Offsets into a and b of the element at flat output index i: dimensions d (outermost s0),
   element strides sa, sb (0 along broadcast dimensions), nd in 1..6. */
#define STRIDED_OFFSETS(i, nd, d, sa, sb, oa, ob) {                              \
    int r_ = (i), q_;                                                            \
    oa = 0; ob = 0;                                                              \
    switch (nd) {                                                                \
    case 6: q_ = r_ % d.s5; r_ /= d.s5; oa += q_ * sa.s5; ob += q_ * sb.s5;      \
    case 5: q_ = r_ % d.s4; r_ /= d.s4; oa += q_ * sa.s4; ob += q_ * sb.s4;      \
    case 4: q_ = r_ % d.s3; r_ /= d.s3; oa += q_ * sa.s3; ob += q_ * sb.s3;      \
    case 3: q_ = r_ % d.s2; r_ /= d.s2; oa += q_ * sa.s2; ob += q_ * sb.s2;      \
    case 2: q_ = r_ % d.s1; r_ /= d.s1; oa += q_ * sa.s1; ob += q_ * sb.s1;      \
    default: oa += r_ * sa.s0; ob += r_ * sb.s0;                                 \
    }                                                                            \
}
"""


# The activations' backward helpers that can also add their result into another tensor
# (``acc=``): the gradients the tape hands on unchanged through an add to a leaf.
ACCUMULATING = ("relu_backward", "sigmoid_backward", "tanh_backward", "sqrt_backward")


def _build_source(helpers: str, binary: dict, unary: dict, grad: dict,
                  accumulating: tuple = (), in_place: bool = True) -> str:
    """One program: the ``_contig/_strided/_grid/_scalar`` kernels of each ``binary`` op, the
    ``_unary`` and ``_grad`` kernels, the ``_acc`` variants and (``in_place``) axpy, scale and
    expand."""
    parts = ["//CL//", STRIDED_OFFSETS, helpers]
    for name, expr in binary.items():
        parts.append(f"""
__kernel void {name}_contig(__global float *out, __global const float *a,
                            __global const float *b, const int n)
{{
    int i = get_global_id(0);
    if (i < n) {{ float x = a[i], y = b[i]; out[i] = {expr}; }}
}}
__kernel void {name}_strided(__global float *out, __global const float *a,
                             __global const float *b, const int n, const int nd,
                             const int8 d, const int8 sa, const int8 sb)
{{
    int i = get_global_id(0);
    if (i < n) {{
        int oa, ob;
        STRIDED_OFFSETS(i, nd, d, sa, sb, oa, ob);
        float x = a[oa], y = b[ob]; out[i] = {expr};
    }}
}}
/* Up to 3 collapsed dims as a 3-D range (no integer division): gid 0 walks the innermost
   dim d.s2, gid 2 the outermost d.s0; dims are right-aligned (leading 1s, stride 0). */
__kernel void {name}_grid(__global float *out, __global const float *a,
                          __global const float *b, const int8 d, const int8 sa, const int8 sb)
{{
    int i2 = get_global_id(0), i1 = get_global_id(1), i0 = get_global_id(2);
    if (i2 < d.s2) {{
        float x = a[i0 * sa.s0 + i1 * sa.s1 + i2 * sa.s2];
        float y = b[i0 * sb.s0 + i1 * sb.s1 + i2 * sb.s2];
        out[(i0 * d.s1 + i1) * d.s2 + i2] = {expr};
    }}
}}
__kernel void {name}_scalar(__global float *out, __global const float *a, const float y,
                            const int n)
{{
    int i = get_global_id(0);
    if (i < n) {{ float x = a[i]; out[i] = {expr}; }}
}}""")
    for name, expr in unary.items():
        parts.append(f"""
__kernel void {name}_unary(__global float *out, __global const float *a, const float p,
                           const float q, const int n)
{{
    int i = get_global_id(0);
    if (i < n) {{ float x = a[i]; out[i] = {expr}; }}
}}""")
    for name, expr in grad.items():
        parts.append(f"""
__kernel void {name}_grad(__global float *out, __global const float *a,
                          __global const float *b, const float p, const float q, const int n)
{{
    int i = get_global_id(0);
    if (i < n) {{ float x = a[i], y = b[i]; out[i] = {expr}; }}
}}""")
    for name in accumulating:
        parts.append(f"""
/* {name}_contig that also adds its result into acc (acc += out), for the tape: the one
   gradient an add then hands to a leaf's .grad, added there without a separate axpy launch.
   r is a statement of its own, so acc + r is the same single rounding as axpy's y + 1 * x. */
__kernel void {name}_acc(__global float *out, __global const float *a,
                         __global const float *b, __global float *acc, const int n)
{{
    int i = get_global_id(0);
    if (i < n) {{ float x = a[i], y = b[i]; float r = {binary[name]}; out[i] = r;
                  acc[i] += r; }}
}}""")
    if in_place:
        parts.append(r"""
__kernel void axpy(__global float *y, __global const float *x, const float alpha, const int n)
{
    int i = get_global_id(0);
    if (i < n) y[i] += alpha * x[i];
}
__kernel void scale(__global float *x, const float alpha, const int n)
{
    int i = get_global_id(0);
    if (i < n) x[i] *= alpha;
}
/* out (contiguous, n elements) = x read through strides (0 along broadcast dims) * alpha */
__kernel void expand(__global float *out, __global const float *x, const float alpha,
                     const int n, const int nd, const int8 d, const int8 sx)
{
    int i = get_global_id(0);
    if (i < n) {
        int ox, unused;
        STRIDED_OFFSETS(i, nd, d, sx, sx, ox, unused);
        out[i] = x[ox] * alpha;
    }
}
""")
    return "\n".join(parts)


SOURCE = _build_source("\n".join((GELU_TANH, NORMAL_CDF, HELPERS)), BINARY_OPS, UNARY_OPS,
                       GRAD_OPS, ACCUMULATING)
# The special functions (lgamma, digamma, erfinv, xlogy, ...) build as a program of their
# own: their series doubled the family's cold build (2 s to 4 s), which every process that
# launches an add would have paid.
SPECIAL_SOURCE = _build_source(HELPERS + SPECIAL_HELPERS, SPECIAL_BINARY, SPECIAL_UNARY,
                               SPECIAL_GRAD, in_place=False)
_BINARY = {**BINARY_OPS, **SPECIAL_BINARY}
_UNARY = {**UNARY_OPS, **SPECIAL_UNARY}
_GRAD = {**GRAD_OPS, **SPECIAL_GRAD}


def _kernels(kind: str, ops: dict, special: dict) -> dict:
    return {op: (SPECIAL_SOURCE if op in special else SOURCE, f"{op}_{kind}") for op in ops}


# Each op's (program source, kernel name), made once: a launch looks its kernel up by a name
# whose hash is already known, not by a string built anew.
_NAMES = {kind: _kernels(kind, ops, special)
          for kind, ops, special in (("contig", _BINARY, SPECIAL_BINARY),
                                     ("scalar", _BINARY, SPECIAL_BINARY),
                                     ("unary", _UNARY, SPECIAL_UNARY),
                                     ("grad", _GRAD, SPECIAL_GRAD),
                                     ("grid", _BINARY, SPECIAL_BINARY),
                                     ("strided", _BINARY, SPECIAL_BINARY),
                                     ("acc", {op: None for op in ACCUMULATING}, {}))}
LOCAL = 128
_LOCAL = (LOCAL,)
GRID_LOCAL = 32        # the 3-D broadcast path: work-items along the innermost dim per group
GRID_MIN_INNER = 16    # below this the padding of the 3-D path wastes more than div/mod costs


# -- validation --------------------------------------------------------------------------------
def check_float(op: str, *ts) -> None:
    """Every argument is a float32 ``pc.Tensor`` (else TypeError / DTypeError naming ``op``)."""
    for t in ts:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected a pc.Tensor, got {type(t).__name__}")
        if t.dtype is not FLOAT and t.dtype != FLOAT:      # (``is``: the common case, fast)
            raise DTypeError(f"{op}: dtype {t.dtype} is not supported (shape {t.shape}); "
                             "elementwise kernels take float32 (convert with "
                             ".astype(np.float32) before Tensor.from_host)")


def _global(n: int) -> tuple[int]:
    return ((n + LOCAL - 1) // LOCAL * LOCAL,)


def _output(op: str, queue, shape: tuple[int, ...], out: Tensor | None) -> Tensor:
    if out is None:
        return Tensor.empty(queue, shape)
    check_float(op, out)
    if tuple(out.shape) != tuple(shape):
        raise ShapeError(f"{op}: out has shape {out.shape}, expected {shape}")
    if out.queue is not queue and out.queue != queue:
        raise DeviceError(f"{op}: out {out.shape} is on a different command queue than the "
                          "inputs; ops run on their inputs' queue")
    return out


def _is_scalar(v) -> bool:
    return isinstance(v, (Real, np.number)) and not isinstance(v, bool)


# -- launchers ---------------------------------------------------------------------------------
def binary(op: str, a, b, out: Tensor | None = None) -> Tensor:
    """``op(a, b)`` elementwise with numpy broadcasting; either side may be a Python scalar.

    ``op`` is one of ``BINARY_OPS`` (add, sub, mul, div, rsub, rdiv, maximum, minimum, pow,
    rpow, the 0/1 masks ge, gt, le, lt and the ``*_backward`` helpers).
    """
    if op not in _BINARY:
        raise ValueError(f"binary: unknown op {op!r}; expected one of {sorted(_BINARY)}")
    # the checks' common case (two float32 Tensors on one queue) without a call
    if (type(a) is not Tensor or type(b) is not Tensor or a.dtype is not FLOAT
            or b.dtype is not FLOAT):          # a scalar side, another dtype, or bad input
        if _is_scalar(b):
            return scalar(op, a, b, out=out)
        if _is_scalar(a):
            if op not in REVERSED:
                raise TypeError(f"{op}: the left operand must be a tensor")
            return scalar(REVERSED[op], b, a, out=out)
        check_float(op, a, b)
    queue = a.queue
    if b.queue is not queue:
        check_same_queue(op, a, b)
    if a.shape == b.shape:
        return _contig(op, queue, a, b, out)
    key = ("broadcast", a.shape, b.shape)
    try:
        plan = queue.choices[key]
    except (AttributeError, KeyError):
        plan = keep(queue, key, _broadcast_plan(op, a.shape, b.shape))
    res = _output(op, queue, plan.shape, out)
    get_kernel(queue, *_NAMES[plan.kind][op])(queue, plan.gsize, plan.lsize, res.data,
                                                     a.data, b.data, *plan.args)
    return res


@dataclass(frozen=True, slots=True)
class BroadcastPlan:
    """A broadcast launch of ``binary``, worked out once per queue and pair of shapes (a bias
    add repeats the same one every step): the result's ``shape``, the kernel ``kind``
    (``grid``: up to 3 collapsed dimensions, the innermost long; else ``strided``), its
    sizes and its arguments after the three buffers (read-only ``int8`` vectors, which a
    launch then sets once, not at every call)."""

    shape: tuple[int, ...]
    kind: str
    gsize: tuple[int, ...]
    lsize: tuple[int, ...]
    args: tuple


def _collapsed(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple:
    """``(shape, dims, sa, sb)``: the broadcast of shapes ``a`` and ``b``, and its dims with
    both strides once neighbours that walk contiguously are merged (at most MAX_DIMS)."""
    shape = broadcast_shapes(op, a, b)
    dims, (sa, sb) = collapse_dims(shape, broadcast_strides(a, shape),
                                   broadcast_strides(b, shape))
    if len(dims) > MAX_DIMS:
        raise ShapeError(f"{op}: broadcasting {a} with {b} needs {len(dims)} "
                         f"strided dimensions; at most {MAX_DIMS} are supported")
    return shape, dims, sa, sb


def _broadcast_plan(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> BroadcastPlan:
    shape, dims, sa, sb = _collapsed(op, a, b)
    if len(dims) <= 3 and dims[-1] >= GRID_MIN_INNER:
        pad = 3 - len(dims)
        dims, sa, sb = [1] * pad + dims, [0] * pad + sa, [0] * pad + sb
        gsize = ((dims[2] + GRID_LOCAL - 1) // GRID_LOCAL * GRID_LOCAL, dims[1], dims[0])
        return BroadcastPlan(shape, "grid", gsize, (GRID_LOCAL, 1, 1),
                             (int8_vector(dims), int8_vector(sa), int8_vector(sb)))
    n = prod(shape)
    return BroadcastPlan(shape, "strided", _global(n), _LOCAL,
                         (n, len(dims), int8_vector(dims), int8_vector(sa), int8_vector(sb)))


def strided_plan(op: str, queue, a: tuple[int, ...], b: tuple[int, ...]) -> tuple:
    """``(shape, args)`` of a broadcast of shapes ``a`` and ``b`` for a ``STRIDED_OFFSETS``
    kernel of another dtype family (``compare``, ``integer``): the result's shape and the
    arguments after the three buffers (``n, nd, d, sa, sb``), worked out once per queue."""
    key = ("strided", a, b)
    try:
        return queue.choices[key]
    except (AttributeError, KeyError):
        pass
    shape, dims, sa, sb = _collapsed(op, a, b)
    return keep(queue, key, (shape, (np.int32(prod(shape)), np.int32(len(dims)),
                                     int8_vector(dims), int8_vector(sa), int8_vector(sb))))


def _contig(op: str, queue, a: Tensor, b: Tensor, out: Tensor | None) -> Tensor:
    """The same-shape launch of ``binary`` (inputs already checked)."""
    res = Tensor.empty(queue, a.shape) if out is None else _output(op, queue, a.shape, out)
    n = res.size
    get_kernel(queue, *_NAMES["contig"][op])(queue, _global(n), _LOCAL, res.data,
                                                    a.data, b.data, n)
    return res


def scalar(op: str, x: Tensor, s: float, out: Tensor | None = None) -> Tensor:
    """``op(x, s)`` with a Python scalar ``s`` (``rsub``: s - x, ``rdiv``: s / x, ``rpow``)."""
    if op not in _BINARY:
        raise ValueError(f"scalar: unknown op {op!r}; expected one of {sorted(_BINARY)}")
    check_float(op, x)
    res = Tensor.empty(x.queue, x.shape) if out is None else _output(op, x.queue, x.shape, out)
    n = res.size
    # Python numbers as they are: the kernel's declared float argument packs them to the
    # same float32 as np.float32 would, for less host time
    get_kernel(x.queue, *_NAMES["scalar"][op])(x.queue, _global(n), _LOCAL, res.data,
                                                      x.data, s, n)
    return res


def unary(op: str, x: Tensor, out: Tensor | None = None, *, p: float = 0.0,
          q: float = 0.0) -> Tensor:
    """``op(x)`` elementwise; ``op`` one of ``UNARY_OPS`` (neg, exp, log, relu, sigmoid, tanh,
    gelu (exact erf form), sqrt, abs, square, reciprocal, sign, silu, erf, sin, cos) or one
    with parameters: ``leaky_relu`` (p: slope), ``elu`` (p: alpha), ``softplus`` (p: beta,
    q: threshold), ``clamp`` (p: min, q: max; ``-inf``/``inf`` for no bound).

    >>> ew.unary("leaky_relu", y, p=0.1).to_host()
    array([1., 1., 1.], dtype=float32)
    """
    if op not in _UNARY:
        raise ValueError(f"unary: unknown op {op!r}; expected one of {sorted(_UNARY)}")
    if type(x) is not Tensor or x.dtype is not FLOAT:      # (the common case without a call)
        check_float(op, x)
    res = Tensor.empty(x.queue, x.shape) if out is None else _output(op, x.queue, x.shape, out)
    n = res.size
    get_kernel(x.queue, *_NAMES["unary"][op])(x.queue, _global(n), _LOCAL, res.data,
                                                     x.data, p, q, n)
    return res


def grad(op: str, saved: Tensor, g: Tensor, *, p: float = 0.0, q: float = 0.0,
         out: Tensor | None = None) -> Tensor:
    """A ``GRAD_OPS`` backward helper on the forward's input ``saved`` and the upstream ``g``
    (same shape), with the forward's parameters ``p``, ``q`` (as for ``unary``)."""
    if op not in _GRAD:
        raise ValueError(f"grad: unknown op {op!r}; expected one of {sorted(_GRAD)}")
    check_float(op, saved, g)
    if saved.shape != g.shape:
        raise ShapeError(f"{op}: saved tensor {saved.shape} and gradient {g.shape} differ")
    check_same_queue(op, saved, g)
    res = Tensor.empty(g.queue, g.shape) if out is None else _output(op, g.queue, g.shape, out)
    n = res.size
    get_kernel(g.queue, *_NAMES["grad"][op])(g.queue, _global(n), _LOCAL, res.data,
                                                    saved.data, g.data, p, q, n)
    return res


def _backward(op: str, saved: Tensor, g: Tensor, out: Tensor | None,
              acc: Tensor | None = None) -> Tensor:
    """An activation's backward helper; with ``acc`` (as many elements as ``g``) the same
    launch also adds the result into it (``acc += result``, as ``axpy`` would)."""
    # the checks' common case (float32 Tensors on one queue) without a call
    if (type(saved) is not Tensor or type(g) is not Tensor or saved.dtype is not FLOAT
            or g.dtype is not FLOAT):
        check_float(op, saved, g)
    if saved.shape != g.shape:
        raise ShapeError(f"{op}: saved tensor {saved.shape} and gradient {g.shape} differ")
    if saved.queue is not g.queue:
        check_same_queue(op, saved, g)
    if acc is None:
        return _contig(op, saved.queue, saved, g, out)  # same shapes: the flat path, one launch
    if type(acc) is not Tensor or acc.dtype is not FLOAT:
        check_float(op, acc)
    if acc.size != g.size:
        raise ShapeError(f"{op}: acc has {acc.size} elements, the gradient {g.shape}")
    queue = g.queue
    if acc.queue is not queue:
        check_same_queue(op, g, acc)
    res = Tensor.empty(queue, g.shape) if out is None else _output(op, queue, g.shape, out)
    n = res.size
    get_kernel(queue, *_NAMES["acc"][op])(queue, _global(n), _LOCAL, res.data,
                                                 saved.data, g.data, acc.data, n)
    return res


def relu_backward(x: Tensor, g: Tensor, out: Tensor | None = None,
                  acc: Tensor | None = None) -> Tensor:
    """``g * (x > 0)``; ``x`` may be relu's input or its output."""
    return _backward("relu_backward", x, g, out, acc)


def sigmoid_backward(y: Tensor, g: Tensor, out: Tensor | None = None,
                     acc: Tensor | None = None) -> Tensor:
    """``g * y * (1 - y)`` from sigmoid's output ``y``."""
    return _backward("sigmoid_backward", y, g, out, acc)


def tanh_backward(y: Tensor, g: Tensor, out: Tensor | None = None,
                  acc: Tensor | None = None) -> Tensor:
    """``g * (1 - y**2)`` from tanh's output ``y``."""
    return _backward("tanh_backward", y, g, out, acc)


def sqrt_backward(y: Tensor, g: Tensor, out: Tensor | None = None,
                  acc: Tensor | None = None) -> Tensor:
    """``g * 0.5 / y`` from sqrt's output ``y``."""
    return _backward("sqrt_backward", y, g, out, acc)


def broadcast_to(x: Tensor, shape, alpha: float = 1.0) -> Tensor:
    """A new contiguous tensor of ``shape`` holding ``x`` broadcast (numpy rules) times
    ``alpha`` (the backward of sum/mean)."""
    check_float("broadcast_to", x)
    shape = dims("broadcast_to", shape)
    queue = x.queue
    key = ("expand", x.shape, shape)
    try:
        plan = queue.choices[key]
    except (AttributeError, KeyError):
        plan = keep(queue, key, _expand_plan(x.shape, shape))
    res = Tensor.empty(queue, shape)
    get_kernel(queue, SOURCE, "expand")(queue, plan[0], _LOCAL, res.data, x.data,
                                        np.float32(alpha), *plan[1:])
    return res


def _expand_plan(in_shape: tuple, shape: tuple) -> tuple:
    """The ``expand`` launch's global size and arguments after ``x``, worked out once per
    queue and pair of shapes (``broadcast_to`` runs in every sum's and mean's backward)."""
    if broadcast_shapes("broadcast_to", in_shape, shape) != shape:
        raise ShapeError(f"broadcast_to: cannot broadcast {in_shape} to {shape}")
    strided, (sx,) = collapse_dims(shape, broadcast_strides(in_shape, shape))
    if len(strided) > MAX_DIMS:
        raise ShapeError(f"broadcast_to: {in_shape} to {shape} needs {len(strided)} strided "
                         f"dimensions; at most {MAX_DIMS} are supported")
    n = prod(shape)
    return (_global(n), np.int32(n), np.int32(len(strided)), int8_vector(strided),
            int8_vector(sx))


def axpy(y: Tensor, x: Tensor, alpha: float = 1.0) -> Tensor:
    """``y += alpha * x`` in place (same number of elements); returns ``y``."""
    check_float("axpy", y, x)
    if x.size != y.size:
        raise ShapeError(f"axpy: sizes differ: y {y.shape} and x {x.shape}")
    check_same_queue("axpy", y, x)
    n = y.size
    get_kernel(y.queue, SOURCE, "axpy")(y.queue, _global(n), _LOCAL, y.data, x.data, alpha, n)
    return y


def scale_(x: Tensor, alpha: float) -> Tensor:
    """``x *= alpha`` in place; returns ``x``."""
    check_float("scale_", x)
    k = get_kernel(x.queue, SOURCE, "scale")
    k(x.queue, _global(x.size), (LOCAL,), x.data, np.float32(alpha), np.int32(x.size))
    return x


def fill_(x: Tensor, value: float) -> Tensor:
    """Set every element of ``x`` to ``value`` in place; returns ``x``."""
    return x.fill_(value)


def copy(x: Tensor) -> Tensor:
    """A new tensor (from the pool) with ``x``'s contents."""
    return x.copy()
