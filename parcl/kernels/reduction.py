"""Reductions: ``sum``, ``mean``, ``max``, ``min`` over an axis, a tuple of axes or everything;
``argmax``; ``first_extreme`` (``torch.max(x, dim)``'s values and indices, one kernel);
``sum_to_shape`` (a broadcast gradient summed back to its input's shape).

Every reduction is one pattern: reduce the middle axis of an ``(outer, R, inner)`` view of a
contiguous tensor (reduced axes that are not neighbours are permuted together first). The order
of every sum is fixed by the shapes and the device type alone (sequential loops and a fixed tree,
no float atomics), so a result is the same bit for bit on every run. A long ``R`` is cut into
fixed chunks whose partial results are reduced again (two stages), which keeps a full sum of a
million elements parallel and its rounding error small.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import reduction
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.ones((3, 4), np.float32))
>>> reduction.sum(x, axis=0).to_host()
array([3., 3., 3., 3.], dtype=float32)
>>> reduction.mean(x).to_host().shape
()
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from math import prod

import numpy as np

from ..errors import DTypeError, ShapeError
from ..runtime import on_gpu
from ..tensor import LABEL_DTYPES, Tensor
from . import layout
from ._cache import LAUNCH_MAX, VECTOR_TYPES, get_kernel, keep, kernel_limits
from .strided import axis_int
from .elementwise import check_float
from .line_sums import SUM_BLOCK

WG = 256            # work-group size of the GPU tree kernels (a power of two)
CHUNK_CPU = 2048    # rows of R one work-item sums before partials are reduced again
CHUNK_GPU = 16384

# Each op's start value and its step, a C expression of the running ``acc`` and the next value
# ``v`` (``gradnorm`` forms its sums with the same ones, in the same order)
COMBINE = {"sum": ("0.0f", "acc + v"),
            # NaN wins (numpy's max propagates it): keep acc if it is NaN or not smaller
            "max": ("-INFINITY", "(acc >= v || isnan(acc)) ? acc : v"),
            # max's mirror image: the same element as -max(-x), bit for bit
            "min": ("INFINITY", "(acc <= v || isnan(acc)) ? acc : v"),
            "prod": ("1.0f", "acc * v")}


def sum_loop(acc: str, start: str, end: str, body: str, ctype: str = "float") -> str:
    """C statements running ``body`` (which adds the term at the int ``r`` into ``acc``, and
    may do more) for r = start .. end - 1, with ``acc`` a fresh 0 for each block of SUM_BLOCK
    terms, the blocks' sums added in order, and ``acc`` the total at the end: a term rounds
    against its block's sum, not the chunk's (a column sum over 2^20 rows was 1.0e-6 of the
    float64 answer off, torch 1.0e-7; now 1.2e-7). A chunk of at most SUM_BLOCK terms gives the
    bits of one running sum (0.0 + it is exact). Whole blocks run to a fixed end and the rest
    after them, as ``line_sums.BLOCK_SUM`` (min()-bounded blocks compile slower on PoCL)."""
    return f"""{{
        {ctype} total_ = ({ctype})(0.0f);
        int r = {start};
        for (int end_ = r + SUM_BLOCK; end_ <= {end}; end_ += SUM_BLOCK) {{
            {acc} = ({ctype})(0.0f);
            for (; r < end_; ++r) {{ {body} }}
            total_ += {acc};
        }}
        {acc} = ({ctype})(0.0f);
        for (; r < {end}; ++r) {{ {body} }}
        {acc} = total_ + {acc};
    }}"""


def _chunk_loop(op: str, ctype: str, body: str) -> str:
    """The loop over a chunk's rows r = start .. end - 1 of the ``_seq`` kernels: sums in
    blocks (``sum_loop``), the other ops one running ``acc``."""
    if op == "sum":
        return sum_loop("acc", "start", "end", body, ctype)
    return f"for (int r = start; r < end; ++r) {{ {body} }}"


def _build_source() -> str:
    parts = ["//CL//", VECTOR_TYPES, f"#define WG {WG}", f"#define SUM_BLOCK {SUM_BLOCK}"]
    for op, (init, combine) in COMBINE.items():
        loop1 = _chunk_loop(op, "float", f"float v = src[(long)r * inner]; acc = {combine};")
        loop8 = _chunk_loop(op, "float8u", "float8u v = *(__global const float8u *)"
                                           f"(src + (long)r * inner); acc = {combine};")
        parts.append(f"""
/* out[o, p, j] = scale * op over r in chunk p of x[o, r, j]; one work-item per output. */
__kernel void {op}_seq(__global float *out, __global const float *x, const int n, const int R,
                       const int inner, const int chunk, const int nchunks, const float scale)
{{
    int g = get_global_id(0);
    if (g >= n) return;
    int j = g % inner, t = g / inner, p = t % nchunks, o = t / nchunks;
    int start = p * chunk, end = min(start + chunk, R);
    __global const float *src = x + ((long)o * R) * inner + j;
    float acc = {init};
    {loop1}
    out[g] = acc * scale;
}}

/* The same for 8 neighbouring outputs per work-item (CPUs, inner % 8 == 0): each lane is one
   output's sequential loop, so every sum is the one above; the loads are whole vectors. */
__kernel void {op}_seq8(__global float *out, __global const float *x, const int n8, const int R,
                        const int inner, const int chunk, const int nchunks, const float scale)
{{
    int g = get_global_id(0);
    if (g >= n8) return;
    int lanes = inner / 8;
    int j = (g % lanes) * 8, t = g / lanes, p = t % nchunks, o = t / nchunks;
    int start = p * chunk, end = min(start + chunk, R);
    __global const float *src = x + ((long)o * R) * inner + j;
    float8u acc = (float8u)({init});
    {loop8}
    *(__global float8u *)(out + (long)t * inner + j) = acc * scale;
}}

/* The same with one work-group of WG items per output: strided loop, then a fixed tree. */
__kernel void {op}_wg(__global float *out, __global const float *x, const int n, const int R,
                      const int inner, const int chunk, const int nchunks, const float scale)
{{
    __local float buf[WG];
    int g = get_group_id(0), lid = get_local_id(0);
    int j = g % inner, t = g / inner, p = t % nchunks, o = t / nchunks;
    int start = p * chunk, end = min(start + chunk, R);
    __global const float *src = x + ((long)o * R) * inner + j;
    float acc = {init};
    for (int r = start + lid; r < end; r += WG) {{
        float v = src[(long)r * inner]; acc = {combine};
    }}
    buf[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {{
        if (lid < s) {{ float v = buf[lid + s]; acc = buf[lid]; buf[lid] = {combine}; }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (lid == 0) out[g] = buf[0] * scale;
}}""")
    # argmax_int, ..., argmin_long: the index alone; max_index, min_index: the value with it
    for name, ctype, better, value in (("argmax_int", "int", ">", False),
                                       ("argmax_long", "long", ">", False),
                                       ("argmin_int", "int", "<", False),
                                       ("argmin_long", "long", "<", False),
                                       ("max_index", "long", ">", True),
                                       ("min_index", "long", "<", True)):
        values_arg = "__global float *values, " if value else ""
        store_value = "values[row] = best;" if value else ""
        parts.append(f"""
/* Index of the first extreme element of each row of x (rows, R), a NaN the first NaN. */
__kernel void {name}(__global {ctype} *out, {values_arg}__global const float *x,
                     const int rows, const int R)
{{
    int row = get_global_id(0);
    if (row >= rows) return;
    __global const float *src = x + (long)row * R;
    float best = src[0];
    int arg = 0;
    for (int r = 1; r < R; ++r) {{
        float v = src[r];
        if (v {better} best || (isnan(v) && !isnan(best))) {{ best = v; arg = r; }}
    }}
    out[row] = arg;
    {store_value}
}}""")
    return "\n".join(parts)


SOURCE = _build_source()


# -- axes ----------------------------------------------------------------------------------
def normalize_axes(op: str, axis, ndim: int, shape=None) -> tuple[int, ...]:
    """``axis`` (None, int or tuple) as a sorted tuple of non-negative axes. A 0-d tensor
    takes axis 0 and -1, as PyTorch's dims (as if it had one dimension): that dimension is the
    tensor itself, so there is nothing to reduce, ``()``."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    n = ndim or 1                  # (max is this module's reduction)
    norm = []
    for a in axes:
        a = axis_int(op, a, shape)
        if not -n <= a < n:
            raise ShapeError(f"{op}: axis {a} is out of range for a {ndim}-D tensor "
                             f"(shape {shape})")
        norm.append(a % n)
    if len(set(norm)) != len(norm):
        raise ShapeError(f"{op}: repeated axis in {axes} (shape {shape})")
    return tuple(sorted(norm)) if ndim else ()


def reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if k in axes else s for k, s in enumerate(shape))
    return tuple(s for k, s in enumerate(shape) if k not in axes)


# -- the (outer, R, inner) core --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stage:
    """One launch of a reduction: ``kernel`` (``sum_seq``, ``max_wg``, ...) over ``size`` outputs
    with ``gsize``/``lsize``, and the kernel's scalar arguments ``args`` (n, R, inner, chunk,
    nchunks, scale) as plain numbers: the kernel's declared types pack them."""

    kernel: str
    size: int
    gsize: tuple[int]
    lsize: tuple[int]
    args: tuple


@dataclass(frozen=True, slots=True)
class Plan:
    """A reduction worked out once per queue, input shape and axes (an eager step repeats the
    same few): ``perm`` (reduced axes moved last first, or None), the ``stages`` (a long row is
    reduced in chunks, then the partials again) and the result's ``shape``."""

    perm: tuple[int, ...] | None
    stages: tuple[Stage, ...]
    shape: tuple[int, ...]


def reduce_3d(op: str, x: Tensor, outer: int, R: int, inner: int, scale: float = 1.0, *,
              workgroup: bool | None = None) -> Tensor:
    """``op`` ("sum", "max", "min" or "prod") over the middle axis of ``x`` viewed as (outer, R,
    inner), times ``scale``; a flat (outer * inner,) tensor. ``workgroup`` forces the kernel
    variant (default: work-group trees on a GPU when ``inner`` is small, sequential loops
    otherwise)."""
    gpu = on_gpu(x.queue)
    if workgroup is None and gpu and not trees_fit(x.queue):
        workgroup = False
    return _run(x, _stages(op, gpu, outer, R, inner, scale, workgroup))


def trees_fit(queue) -> bool:
    """Whether the device allows the work-group tree kernels (``{op}_wg``) the WG work-items
    compiled into them; where it allows fewer, a GPU reduces with sequential loops only."""
    return all(kernel_limits(queue, SOURCE, f"{op}_wg").work_group >= WG for op in COMBINE)


def _stages(op: str, gpu: bool, outer: int, R: int, inner: int, scale: float,
            workgroup: bool | None) -> tuple[Stage, ...]:
    chunk = CHUNK_GPU if gpu else CHUNK_CPU
    forced = workgroup
    if workgroup is None:
        workgroup = gpu and use_workgroups(outer, R, inner, chunk)
    if R > chunk:
        nchunks = (R + chunk - 1) // chunk
        first = _stage(op, gpu, outer, R, inner, chunk, nchunks, 1.0, workgroup)
        # the partials' rows are nchunks long: chosen again for them unless forced
        return (first, *_stages(op, gpu, outer, nchunks, inner, scale, forced))
    return (_stage(op, gpu, outer, R, inner, R, 1, scale, workgroup),)


def use_workgroups(outer: int, R: int, inner: int, chunk: int) -> bool:
    """Whether a GPU reduces with a work-group per output (``{op}_wg``): for short inner
    strides, rows of at least one group's width, and a launch under 2**31 work-items (GPU
    drivers mishandle ids past that); else one work-item per output loops over its row."""
    outputs = outer * inner * -(-R // chunk)
    return inner < 32 and R >= WG and outputs * WG < LAUNCH_MAX


def _stage(op, gpu, outer, R, inner, chunk, nchunks, scale, workgroup) -> Stage:
    n = outer * nchunks * inner
    if workgroup:
        return Stage(f"{op}_wg", n, (n * WG,), (WG,), (n, R, inner, chunk, nchunks, scale))
    if inner % 8 == 0 and not gpu:
        n8 = n // 8
        return Stage(f"{op}_seq8", n, ((n8 + 63) // 64 * 64,), (64,),
                     (n8, R, inner, chunk, nchunks, scale))
    return Stage(f"{op}_seq", n, ((n + 63) // 64 * 64,), (64,),
                 (n, R, inner, chunk, nchunks, scale))


def _run(x: Tensor, stages: tuple[Stage, ...]) -> Tensor:
    """The stages one after the other, each reducing the last one's partials."""
    q = x.queue
    for s in stages:
        out = Tensor.empty(q, (s.size,))
        get_kernel(q, SOURCE, s.kernel)(q, s.gsize, s.lsize, out.data, x.data, *s.args)
        x = out
    return x


def _reduce(op: str, kernel_op: str, x: Tensor, axis, keepdims: bool, mean: bool,
            workgroup: bool | None = None) -> Tensor:
    check_float(op, x)
    if not x.size:                   # a slice with no elements (t[2:2], x[:, T:])
        return _of_nothing(op, kernel_op, x, axis, keepdims, mean)
    queue = x.queue
    choices = getattr(queue, "choices", None)       # a parcl Queue's: plans kept per queue
    key = None
    # a plan is kept only under exact ints: (1.0,) and (True,) equal (1,) as keys, and would
    # take its plan silently where _plan refuses them (axis_int)
    if choices is not None and workgroup is None and (
            axis is None or type(axis) is int
            or (type(axis) is tuple and all(type(a) is int for a in axis))):
        key = ("reduce", op, kernel_op, x.shape, axis, keepdims, mean)
        plan = choices.get(key)
        if plan is not None:
            return _apply(x, plan)
    gpu = on_gpu(queue)
    if workgroup is None and gpu and not trees_fit(queue):
        workgroup = False
    plan = _plan(op, kernel_op, x.shape, axis, keepdims, mean, gpu, workgroup)
    return _apply(x, plan if key is None else keep(queue, key, plan))


def _of_nothing(op: str, kernel_op: str, x: Tensor, axis, keepdims: bool,
                mean: bool) -> Tensor:
    """A reduction of a tensor with no elements, as numpy's and PyTorch's: where the reduced
    axes hold none, the op's start value (a sum 0, a product 1) or NaN (a mean, 0 / 0); a
    maximum of none has no value and is a ShapeError. (The plans below took a reduced axis of
    size 0 for one with nothing to reduce and failed copying the empty input.)"""
    axes = normalize_axes(op, axis, x.ndim, x.shape)
    out = Tensor.empty(x.queue, reduced_shape(x.shape, axes, keepdims))
    if not out.size:
        return out
    if kernel_op in ("max", "min"):
        raise ShapeError(f"{op}: axes {axes} of shape {x.shape} hold no elements, and the "
                         f"{kernel_op}imum of none is undefined (as numpy's and PyTorch's)")
    out.fill_owned(np.nan if mean else float(COMBINE[kernel_op][0].rstrip("f")))
    return out


def _apply(x: Tensor, plan: Plan) -> Tensor:
    if not plan.stages:                      # nothing to reduce: a copy in the new shape
        return x.copy().reshape(plan.shape)
    if plan.perm is not None:
        x = layout.transpose(x, plan.perm)
    return _run(x, plan.stages).reshape(plan.shape)


def _plan(op: str, kernel_op: str, shape: tuple[int, ...], axis, keepdims: bool, mean: bool,
          gpu: bool, workgroup: bool | None) -> Plan:
    ndim = len(shape)
    axes = normalize_axes(op, axis, ndim, shape)
    out_shape = reduced_shape(shape, axes, keepdims)
    red = [k for k in axes if shape[k] > 1]
    kept = [k for k in range(ndim) if k not in axes and shape[k] > 1]
    R = prod(shape[k] for k in axes)
    if not red:
        return Plan(None, (), out_shape)
    perm = None
    if any(red[0] < k < red[-1] for k in kept):
        # Reduced axes interleaved with kept ones: move the reduced axes last.
        perm = tuple([k for k in range(ndim) if k not in axes] + list(axes))
        outer, inner = prod(out_shape), 1
    else:
        outer = prod(shape[:red[0]])
        inner = prod(shape[red[-1] + 1:])
    scale = 1.0 / R if mean else 1.0
    return Plan(perm, _stages(kernel_op, gpu, outer, R, inner, scale, workgroup), out_shape)


# -- public launchers ---------------------------------------------------------------------------
def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (None: all, an int, or a tuple), numpy semantics; a new tensor
    (shape ``()`` for a full reduction)."""
    return _reduce("sum", "sum", x, axis, keepdims, mean=False)


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``, numpy semantics (the sum, scaled by 1/count in the last stage)."""
    return _reduce("mean", "sum", x, axis, keepdims, mean=True)


def max(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Maximum over ``axis``, numpy semantics (NaN propagates)."""
    return _reduce("max", "max", x, axis, keepdims, mean=False)


def min(x: Tensor, axis=None, keepdims: bool = False, op: str = "min") -> Tensor:  # noqa: A001
    """Minimum over ``axis``, numpy semantics (NaN propagates); ``op`` names the caller in
    errors."""
    return _reduce(op, "min", x, axis, keepdims, mean=False)


def product(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Product over ``axis``, numpy semantics (multiplied in the same fixed order as sums;
    named so as not to shadow ``math.prod``, which this module uses)."""
    return _reduce("prod", "prod", x, axis, keepdims, mean=False)


def _rows_along(op: str, x: Tensor, axis) -> Tensor:
    """``x`` with ``axis`` moved last (a 0-d ``x``, whose axis 0 and -1 are PyTorch's, as one
    element), for the kernels that take each row's extreme; an axis of no elements has no
    index to give."""
    if x.ndim == 0:
        normalize_axes(op, axis, 0, x.shape)
        return x.reshape((1,))
    (ax,) = normalize_axes(op, axis, x.ndim, x.shape)
    if x.shape[ax] == 0:             # rows of nothing (x[:, T:]): no index to give
        raise ShapeError(f"{op}: axis {ax} of shape {x.shape} holds no elements, so it has no "
                         "index to give (as PyTorch's)")
    if ax != x.ndim - 1:
        x = layout.transpose(x, [k for k in range(x.ndim) if k != ax] + [ax])
    return x


def argmax(x: Tensor, axis: int = -1, dtype=np.int64, op: str = "argmax",
           lowest: bool = False) -> Tensor:
    """Index of the first largest (smallest where ``lowest``: argmin) element along ``axis``
    (numpy's ``argmax``), a NaN the first NaN, as int64 or int32 labels; used for accuracy.
    ``op`` names the caller in errors."""
    check_float(op, x)
    dt = np.dtype(dtype)
    if dt not in LABEL_DTYPES:
        raise DTypeError(f"{op}: output dtype {dt} is not supported; use int32 or int64")
    x = _rows_along(op, x, axis)
    R = x.shape[-1]
    rows = x.size // R
    out = Tensor.empty(x.queue, x.shape[:-1], dt)
    name = f"{'argmin' if lowest else 'argmax'}_{'int' if dt == np.int32 else 'long'}"
    get_kernel(x.queue, SOURCE, name)(x.queue, ((rows + 63) // 64 * 64,), (64,), out.data,
                                      x.data, np.int32(rows), np.int32(R))
    return out


def first_extreme(x: Tensor, axis: int, lowest: bool, op: str) -> tuple[Tensor, Tensor]:
    """``torch.max(x, axis)`` (``torch.min`` where ``lowest``): each row's first largest
    (smallest) element and its int64 index, a row's first NaN where it has one, both from one
    kernel (the value is the element at the index, bit for bit); ``op`` names the caller in
    errors."""
    check_float(op, x)
    x = _rows_along(op, x, axis)
    R = x.shape[-1]
    rows = x.size // R
    values = Tensor.empty(x.queue, x.shape[:-1])
    indices = Tensor.empty(x.queue, x.shape[:-1], np.int64)
    k = get_kernel(x.queue, SOURCE, "min_index" if lowest else "max_index")
    k(x.queue, ((rows + 63) // 64 * 64,), (64,), indices.data, values.data, x.data,
      np.int32(rows), np.int32(R))
    return values, indices


def sum_to_shape(g: Tensor, shape) -> Tensor:
    """``g`` (a gradient of a broadcast result) summed back to ``shape``, the shape of the input
    that was broadcast (numpy rules). Returns ``g`` itself, no copy, when shapes already match;
    a zero-copy reshape when only size-1 dimensions differ."""
    if g.shape == shape:                   # the common case (an add of equal shapes): no work
        return g
    shape = tuple(int(s) for s in shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    if lead < 0 and all(s == 1 for s in shape[:-lead]):
        g, lead = g.reshape((1,) * -lead + tuple(g.shape)), 0     # shape has extra leading 1s
    if lead < 0 or any(s != 1 and s != gs for s, gs in zip(shape, g.shape[lead:])):
        raise ShapeError(f"sum_to_shape: gradient of shape {g.shape} is not a broadcast of "
                         f"shape {shape}")
    axes = tuple(range(lead)) + tuple(lead + k for k, s in enumerate(shape)
                                      if s == 1 and g.shape[lead + k] != 1)
    if builtins.all(g.shape[k] == 1 for k in axes):
        return g.reshape(shape)
    return _reduce("sum_to_shape", "sum", g, axes, keepdims=True, mean=False).reshape(shape)
