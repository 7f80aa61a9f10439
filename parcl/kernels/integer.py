"""Integer elementwise kernels: ``gcd``, ``lcm`` and the bitwise ops ``and or xor not`` on
int32 and int64 tensors, the bitwise ones also on parcl's bool masks (uint8 0/1, what
``Tensor.from_host`` makes of a bool array; ``not`` flips them, as ``~`` on a torch bool).

One program, one kernel per op and element type; the binary ones broadcast (numpy rules)
through the strided walk of ``elementwise``. Both operands have one dtype (PyTorch would
promote int32 with int64; here that is a DTypeError saying what to convert).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import integer
>>> q = pc.default_queue()
>>> a = pc.Tensor.from_host(q, np.array([12, -18, 0], np.int64))
>>> integer.binary("gcd", a, pc.Tensor.from_host(q, np.array([8], np.int64))).to_host()
array([4, 2, 8])
"""

from __future__ import annotations


import numpy as np

from ..errors import DTypeError
from ..tensor import Tensor, check_same_queue
from ._cache import get_kernel
from .counting import cast
from .elementwise import STRIDED_OFFSETS, strided_plan

# element type -> its OpenCL C name
C_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long", np.dtype(np.uint8): "uchar"}
BOOL = np.dtype(np.uint8)

# name -> C expression of x, y (TYPE: the element type's C name)
BINARY = {"bitwise_and": "x & y", "bitwise_or": "x | y", "bitwise_xor": "x ^ y",
          "gcd": "gcd_of_TYPE(x, y)", "lcm": "lcm_of_TYPE(x, y)"}
ON_BOOL = ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not")

# gcd by Euclid on |x|, |y| (gcd(0, 0) = 0), lcm as |x / gcd * y| (0 where gcd is), PyTorch's
_INTEGER_HELPERS = r"""
inline TYPE gcd_of_TYPE(const TYPE x, const TYPE y)
{
    TYPE a = (x < 0) ? -x : x, b = (y < 0) ? -y : y;
    while (b != 0) { const TYPE r = a % b; a = b; b = r; }
    return a;
}
inline TYPE lcm_of_TYPE(const TYPE x, const TYPE y)
{
    const TYPE g = gcd_of_TYPE(x, y);
    if (g == 0) return 0;
    const TYPE m = x / g * y;
    return (m < 0) ? -m : m;
}
"""


def _build_source() -> str:
    parts = ["//CL//", STRIDED_OFFSETS]
    for dtype, t in C_TYPES.items():
        ops = {op: expr for op, expr in BINARY.items() if dtype != BOOL or op in ON_BOOL}
        if dtype != BOOL:
            parts.append(_INTEGER_HELPERS.replace("TYPE", t))
        for op, expr in ops.items():
            expr = expr.replace("TYPE", t)
            parts.append(f"""
__kernel void {op}_{t}(__global {t} *out, __global const {t} *a, __global const {t} *b,
                       const int n, const int nd, const int8 d, const int8 sa, const int8 sb)
{{
    int i = get_global_id(0);
    if (i < n) {{
        int oa, ob;
        STRIDED_OFFSETS(i, nd, d, sa, sb, oa, ob);
        const {t} x = a[oa], y = b[ob];
        out[i] = {expr};
    }}
}}""")
        not_expr = "(uchar)(x == 0)" if dtype == BOOL else "~x"
        parts.append(f"""
__kernel void bitwise_not_{t}(__global {t} *out, __global const {t} *a, const int n)
{{
    int i = get_global_id(0);
    if (i < n) {{ const {t} x = a[i]; out[i] = {not_expr}; }}
}}""")
    return "\n".join(parts)


SOURCE = _build_source()
LOCAL = 128


def _global(n: int) -> tuple[int]:
    return ((n + LOCAL - 1) // LOCAL * LOCAL,)


def check_integer(op: str, *ts: Tensor) -> np.dtype:
    """The one dtype of ``ts``: int32 or int64 (or a bool mask for the bitwise ops), else a
    DTypeError naming ``op`` and the shapes."""
    allowed = ("int32", "int64", "bool (uint8)") if op in ON_BOOL else ("int32", "int64")
    for t in ts:
        if t.dtype not in C_TYPES or (t.dtype == BOOL and op not in ON_BOOL):
            raise DTypeError(f"{op}: dtype {t.dtype} is not supported (shape {t.shape}); it "
                             f"takes {', '.join(allowed)} tensors")
    if len({t.dtype for t in ts}) > 1:
        named = " and ".join(f"{t.dtype} {t.shape}" for t in ts)
        raise DTypeError(f"{op}: operands of different dtypes ({named}); convert one "
                         "(np.asarray(t).astype(...)) before the op")
    return ts[0].dtype


def promote(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` and ``b``, an int32 one beside an int64 one converted to int64 as PyTorch
    promotes them (every int32 value fits): the kernels take operands of one dtype."""
    if {a.dtype, b.dtype} == {np.dtype(np.int32), np.dtype(np.int64)}:
        return cast(a, np.int64), cast(b, np.int64)
    return a, b


def binary(op: str, a: Tensor, b: Tensor) -> Tensor:
    """``op(a, b)`` elementwise with numpy broadcasting; ``op`` one of ``BINARY``."""
    if op not in BINARY:
        raise ValueError(f"binary: unknown op {op!r}; expected one of {sorted(BINARY)}")
    a, b = promote(a, b)
    dtype = check_integer(op, a, b)
    check_same_queue(op, a, b)
    queue = a.queue
    shape, args = strided_plan(op, queue, a.shape, b.shape)
    out = Tensor.empty(queue, shape, dtype)
    if out.size:
        get_kernel(queue, SOURCE, f"{op}_{C_TYPES[dtype]}")(
            queue, _global(out.size), (LOCAL,), out.data, a.data, b.data, *args)
    return out


def bitwise_not(x: Tensor) -> Tensor:
    """``~x`` (a bool mask: its negation)."""
    dtype = check_integer("bitwise_not", x)
    out = Tensor.empty(x.queue, x.shape, dtype)
    if out.size:
        get_kernel(x.queue, SOURCE, f"bitwise_not_{C_TYPES[dtype]}")(
            x.queue, _global(out.size), (LOCAL,), out.data, x.data, np.int32(out.size))
    return out
