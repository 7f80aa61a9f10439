"""The comparisons ``eq ne lt le gt ge`` on integer tensors (int32, int64, and parcl's bool
masks, held as uint8 0/1), giving the float32 0/1 mask a float comparison gives: accuracy's
``eq(predicted, labels)`` on int64 labels, as PyTorch's.

One kernel per op and element type; int32 against int64 compares in PyTorch's promotion to
int64 (``integer.promote``). A Python int on one side is compared exactly, as a 0-d tensor
of the other side's type (one beyond that type's range lies above or below every element);
a Python float, or a float32 tensor, against an integer tensor is compared in float32,
PyTorch's promotion (so above 2**24 labels round as they do there); against a bool mask
through its floor (``m < 0.5`` is ``m <= 0``), NaN and infinities as PyTorch's (a constant
mask).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import compare
>>> q = pc.default_queue()
>>> y = pc.Tensor.from_host(q, np.array([3, 1, 2], np.int64))
>>> compare.compare("eq", y, pc.Tensor.from_host(q, np.array([3, 0, 2], np.int64))).to_host()
array([1., 0., 1.], dtype=float32)
>>> compare.compare("lt", y, 2.5).to_host()
array([0., 1., 1.], dtype=float32)
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from ..errors import DTypeError
from ..tensor import FLOAT, Tensor, check_same_queue
from . import elementwise as ew
from ._cache import get_kernel
from .counting import cast
from .elementwise import STRIDED_OFFSETS, strided_plan
from .integer import BOOL, C_TYPES, promote

OPS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# op with its operands swapped: ``2 < x`` is ``x > 2``
SWAPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
LIMITS = {np.dtype(np.int32): (-2**31, 2**31 - 1), np.dtype(np.int64): (-2**63, 2**63 - 1),
          np.dtype(np.uint8): (0, 255)}


def _build_source() -> str:
    parts = ["//CL//", STRIDED_OFFSETS]
    for op, sign in OPS.items():
        for t in C_TYPES.values():
            parts.append(f"""
__kernel void {op}_{t}(__global float *out, __global const {t} *a, __global const {t} *b,
                       const int n, const int nd, const int8 d, const int8 sa, const int8 sb)
{{
    int i = get_global_id(0);
    if (i < n) {{
        int oa, ob;
        STRIDED_OFFSETS(i, nd, d, sa, sb, oa, ob);
        out[i] = (a[oa] {sign} b[ob]) ? 1.0f : 0.0f;
    }}
}}""")
    return "\n".join(parts)


SOURCE = _build_source()
LOCAL = 128


def is_integer(v) -> bool:
    """Whether ``v`` is a tensor this module compares (int32, int64 or a bool mask)."""
    return isinstance(v, Tensor) and v.dtype in C_TYPES


def compare(op: str, a, b) -> Tensor:
    """``op(a, b)`` as a float32 0/1 mask with numpy broadcasting: ``a`` and ``b`` tensors or
    Python numbers, at least one of them an integer tensor."""
    if op not in OPS:
        raise ValueError(f"compare: unknown op {op!r}; expected one of {sorted(OPS)}")
    if not isinstance(a, Tensor):
        op, a, b = SWAPPED[op], b, a
    if not isinstance(b, Tensor):
        return _with_number(op, a, b)
    if a.dtype == FLOAT or b.dtype == FLOAT:
        return ew.binary(op, cast(a, FLOAT), cast(b, FLOAT))
    return _tensors(op, a, b)


def _tensors(op: str, a: Tensor, b: Tensor) -> Tensor:
    a, b = promote(a, b)
    if a.dtype not in C_TYPES or a.dtype != b.dtype:
        raise DTypeError(f"{op}: cannot compare {a.dtype} {a.shape} with {b.dtype} {b.shape}; "
                         "it takes int32 and int64 tensors, or two bool masks (convert one "
                         "with np.asarray(t).astype(...) first)")
    check_same_queue(op, a, b)
    queue = a.queue
    shape, args = strided_plan(op, queue, a.shape, b.shape)
    out = Tensor.empty(queue, shape, FLOAT)
    if out.size:
        n = out.size
        get_kernel(queue, SOURCE, f"{op}_{C_TYPES[a.dtype]}")(
            queue, ((n + LOCAL - 1) // LOCAL * LOCAL,), (LOCAL,), out.data, a.data, b.data,
            *args)
    return out


def _with_number(op: str, t: Tensor, v) -> Tensor:
    """``op(t, v)`` for an integer tensor ``t`` and a Python number ``v``, exactly."""
    if not isinstance(v, (Real, np.number)) or isinstance(v, complex):
        raise DTypeError(f"{op}: expected a pc.Tensor or a real number, got "
                         f"{type(v).__name__}")
    if isinstance(v, (Integral, np.integer)):
        return _with_integer(op, t, int(v))
    if t.dtype != BOOL:
        # PyTorch promotes an integer tensor and a Python float to float32, its default
        # dtype, so it compares label 16777217 == 16777216.0 as 1: compare as it does
        return ew.binary(op, cast(t, FLOAT), float(v))
    with np.errstate(over="ignore"):      # 1e300 is inf in float32, as PyTorch's
        v = float(np.float32(v))          # a mask's 0 and 1 are float32 already
    if math.isnan(v):                     # NaN equals nothing, orders with nothing
        return Tensor.full(t.queue, t.shape, float(op == "ne"))
    if math.isinf(v):                     # every integer lies below +inf, above -inf
        below = v > 0
        holds = {"eq": False, "ne": True, "lt": below, "le": below, "gt": not below,
                 "ge": not below}[op]
        return Tensor.full(t.queue, t.shape, float(holds))
    if v.is_integer():
        return _with_integer(op, t, int(v))
    # a fraction: no integer equals it; x < 2.5 and x <= 2.5 are x <= 2, x > 2.5 is x > 2
    if op in ("eq", "ne"):
        return Tensor.full(t.queue, t.shape, float(op == "ne"))
    return _with_integer("le" if op in ("lt", "le") else "gt", t, math.floor(v))


def _with_integer(op: str, t: Tensor, v: int) -> Tensor:
    if t.dtype not in C_TYPES:
        raise DTypeError(f"{op}: dtype {t.dtype} is not supported (shape {t.shape})")
    lo, hi = LIMITS[t.dtype]
    if lo <= v <= hi:
        return _tensors(op, t, Tensor.full(t.queue, (), v, t.dtype))
    if t.dtype != BOOL and not -2**63 <= v < 2**63:
        raise DTypeError(f"{op}: {v} is out of the range of a {t.dtype} tensor {t.shape}")
    # every element lies below v (above it, for v below lo): an int32 against 2**40, a
    # mask's 0 and 1 against -1 (PyTorch's bool == -1)
    holds = {"eq": False, "ne": True, "lt": v > hi, "le": v > hi, "gt": v < lo,
             "ge": v < lo}[op]
    return Tensor.full(t.queue, t.shape, float(holds))
