"""Gradient clipping's kernels: the p-norm of several tensors together
(``pc.nn.utils.get_total_norm``) in one launch per tensor and one to finish, with no
temporaries the size of a tensor, and the clip by that norm in one launch per tensor.

The result is bit for bit what the composition of generic kernels gives (``reduction.sum``
of ``ew.unary("square", g)`` per tensor, the partials folded left to right with
``ew.binary("add")``, then ``sqrt``), because every sum is formed in the same order:

* per tensor, one launch forms the first stage of ``reduction.reduce_3d``'s full reduction
  (the same chunks, the same kernel shape: a sequential loop per chunk, or on a GPU a
  work-group per chunk with ``reduction``'s strided loop and tree), reading the gradient once
  and computing each element's term (``g*g``, ``|g|``, ``|g|**p``, ``max |g|``) in
  registers. The partials go to one scratch buffer, each tensor's at its own offset.
* one single-work-item launch (``finish_*``) reduces each tensor's partials as
  ``reduce_3d``'s later stages would (the same chunks, the tree replayed sequentially where a
  GPU stage would use one), folds the tensors' results left to right, and takes the root.

The per-element terms are the generic kernels' expressions (``abs`` is their ``fabs``: -0
becomes +0), each rounded on its own: ``FP_CONTRACT OFF``, since a compiler may
otherwise fuse ``acc + x * x`` into one FMA (NVIDIA's does), which the separate kernels
never could. A one-element tensor's partial is its term itself (``reduction`` copies it;
``0 + -0`` would be +0).

Overflow scaling (``scaled``, p > 1): squares of float32 gradients of ~2e19 overflow, so the
gradients are multiplied by ``s = min(2**40 / max|g|, 1)`` (floored at 2**-88, where 2**40 /
FLT_MAX lies, so an infinite gradient stays infinite and the norm inf; NaN stays NaN) before
their powers are summed, and the root is divided by ``s``: the largest is then at most 2**40,
so no sum of fewer than 2**48 squares can overflow. The first pass forms each tensor's
``max |g|`` and its unscaled sum together; ``finish_scale`` computes ``s`` on the device; the
second pass reads ``s`` and, where it is exactly 1 (every ordinary gradient: ``g * 1`` is
``g``, so its sums are the ones already formed), returns at once, else it overwrites the sums
with those of ``g * s``. Nothing is read back.

``clip_by_norm_`` multiplies each tensor by ``min(max_norm / (norm + eps), 1)``, every
work-item forming the coefficient from the device norm as ew's three scalar launches did.

NaN stays NaN; which NaN (its sign and payload, where two meet: IEEE 754 leaves it open, and a
compiler may swap a product's operands) is not promised. Every other value is bit for bit the
generic kernels'.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import gradnorm
>>> q = pc.default_queue()
>>> g = [pc.Tensor.from_host(q, np.array([3.0, 4.0], np.float32))]
>>> float(gradnorm.total_norm(g, 2.0).item())
5.0
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ..errors import ParclError
from ..runtime import on_gpu
from ..tensor import Tensor, check_same_queue
from ._cache import get_kernel, keep, kernel_limits
from .elementwise import LOCAL, check_float
from .elementwise_ops import BINARY_OPS, UNARY_OPS
from .reduction import (CHUNK_CPU, CHUNK_GPU, COMBINE, SUM_BLOCK, WG, sum_loop, trees_fit,
                        use_workgroups)

SAFE_MAX = 2.0 ** 40   # the largest |g| whose powers are summed unscaled
SAFE_MIN = 2.0 ** -88  # the smallest scale: 2**40 / FLT_MAX, what an infinite |g| would give

# The tensors' results are folded by ew's binary ops (add, maximum), as ``_fold`` did
_FOLD = {"sum": "add", "max": "maximum"}


def _bind(expr: str, **names: str) -> str:
    """The C expression ``expr`` of ew's op tables with its operands (the identifiers x, y, p,
    q) replaced, all at once, by ``names``' expressions, in parentheses."""
    return "(" + re.sub(r"\b[xypq]\b", lambda m: names[m.group(0)], expr) + ")"


def _step(op: str, acc: str, v: str) -> str:
    """reduction's step of ``op`` ("sum", "max"): ``acc`` combined with the next value ``v``."""
    return "(" + re.sub(r"\b(acc|v)\b", lambda m: {"acc": acc, "v": v}[m.group(0)],
                        COMBINE[op][1]) + ")"


def _op(name: str, x: str, y: str) -> str:
    """ew's binary op ``name`` on the C expressions ``x`` and ``y``."""
    return _bind(BINARY_OPS[name], x=x, y=y)


def _unary(name: str, x: str, p: str = "0.0f", q: str = "0.0f") -> str:
    """ew's unary op ``name`` on ``x``, with its parameters ``p``, ``q``."""
    return _bind(UNARY_OPS[name], x=x, p=p, q=q)


@dataclass(frozen=True)
class Pass:
    """One launch per tensor: what each element ``x`` adds to the chunk's sum (statements
    setting ``v``; None: no sum) and whether its ``max |x|`` is taken (into ``a``);
    ``scaled``: the terms are of ``x * s``, and the launch does nothing where ``s == 1``."""

    sum: str | None
    max: bool = False
    scaled: bool = False


_ABS_X = _unary("abs", "x")
_POW = "v = " + _op("pow", _ABS_X, "p") + ";"                        # pow(|x|, p)
_SCALED = "const float t = " + _op("mul", "x", "s") + ";"            # x * s
PASSES = {
    "max": Pass(None, max=True),                                      # the inf-norm
    "abs": Pass(f"v = {_ABS_X};"),                                    # p = 1
    "square": Pass(f"v = {_unary('square', 'x')};"),                  # p = 2
    "pow": Pass(_POW),                                                # any other p
    "max_square": Pass(f"v = {_unary('square', 'x')};", max=True),    # scaled, first pass
    "max_pow": Pass(_POW, max=True),
    "scaled_square": Pass(f"{_SCALED} v = {_unary('square', 't')};", scaled=True),
    "scaled_pow": Pass(f"{_SCALED} v = {_op('pow', _unary('abs', 't'), 'p')};", scaled=True),
}

# finish_<name>: which partials (the sums or the maxima) are folded, and the last step on
# their fold ``acc`` (p: 1 / norm type; scale[0]: the scale), ew's expressions
_DIV = "out[0] = " + _op("div", "r", "scale[0]") + ";"
FINISHES = {
    "sum": ("sum", "out[0] = acc;"),                                  # p = 1
    "sqrt": ("sum", f"out[0] = {_unary('sqrt', 'acc')};"),
    "root": ("sum", f"out[0] = {_op('pow', 'acc', 'p')};"),
    "sqrt_scaled": ("sum", f"const float r = {_unary('sqrt', 'acc')}; {_DIV}"),
    "root_scaled": ("sum", f"const float r = {_op('pow', 'acc', 'p')}; {_DIV}"),
    "max": ("max", "out[0] = acc;"),                                  # the inf-norm
    # the scale: rdiv, then clamp's selects (NaN stays NaN)
    "scale": ("max", f"const float r = {_op('rdiv', 'acc', SAFE_MAX.hex() + 'f')};"
                     f" out[0] = {_unary('clamp', 'r', SAFE_MIN.hex() + 'f', '1.0f')};"),
}


def _stage_kernels(name: str, ps: Pass) -> str:
    """The per-tensor launch of pass ``name``: chunk c's sum into part[at + c], its max into
    part[total + at + c], as reduction's ``sum_seq``/``max_seq`` (one work-item per chunk)
    and ``sum_wg``/``max_wg`` (a work-group per chunk) would leave them."""
    term = (ps.sum or "") + (f" a = {_ABS_X};" if ps.max else "")
    step = ((f"sum = {_step('sum', 'sum', 'v')};" if ps.sum else "")
            + (f" big = {_step('max', 'big', 'a')};" if ps.max else ""))
    store = ((" part[at + c] = sum;" if ps.sum else "")
             + (" part[total + at + c] = big;" if ps.max else ""))
    body = f"const float x = g[r]; {term} {step}"
    # reduction's sum_seq sums in blocks: so does the chunk's sum here (max as one running)
    loop = (sum_loop("sum", "start", "end", body) if ps.sum
            else f"for (int r = start; r < end; ++r) {{ {body} }}")
    head = ("const float s = scale[0];\n    if (s == 1.0f) return;   /* the sums are g's */"
            if ps.scaled else "")
    tree = ((f" sbuf[lid] = {_step('sum', 'sbuf[lid]', 'sbuf[lid + k]')};" if ps.sum else "")
            + (f" mbuf[lid] = {_step('max', 'mbuf[lid]', 'mbuf[lid + k]')};" if ps.max else ""))
    args = ("__global float *part, __global const float *g, __global const float *scale,\n"
            "    const int at, const int total, const int R, const int chunk, const int nchunks,"
            "\n    const float p")
    return f"""
__kernel void {name}_seq({args})
{{
    #pragma OPENCL FP_CONTRACT OFF
    const int c = get_global_id(0);
    if (c >= nchunks) return;
    {head}
    float sum = {COMBINE['sum'][0]}, big = {COMBINE['max'][0]}, v = 0.0f, a = 0.0f;
    if (R == 1) {{                       /* reduction copies a lone element's term */
        const float x = g[0];
        {term}
        sum = v; big = a;
    }} else {{
        const int start = c * chunk, end = min(start + chunk, R);
        {loop}
    }}
    {store}
}}

__kernel void {name}_wg({args})
{{
    #pragma OPENCL FP_CONTRACT OFF
    __local float sbuf[WG], mbuf[WG];
    const int c = get_group_id(0), lid = get_local_id(0);
    {head}
    const int start = c * chunk, end = min(start + chunk, R);
    float sum = {COMBINE['sum'][0]}, big = {COMBINE['max'][0]}, v = 0.0f, a = 0.0f;
    for (int r = start + lid; r < end; r += WG) {{ const float x = g[r]; {term} {step} }}
    sbuf[lid] = sum; mbuf[lid] = big;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = WG / 2; k > 0; k >>= 1) {{
        if (lid < k) {{{tree} }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (lid == 0) {{ sum = sbuf[0]; big = mbuf[0];{store} }}
}}"""


def _rest(op: str) -> str:
    """``rest_<op>(x, R, ...)``: x[0..R) (a tensor's first-stage partials) reduced as
    ``reduce_3d``'s later stages would: while R > chunk, a stage of chunks (written over x's
    front: chunk c is read before x[c] is written), then one stage over what is left. A
    stage is a tree where ``trees`` says reduction would use one: 1, a GPU's choice (rows of
    WG or more); 2, forced (``workgroup=True``); 0, never."""
    init, combine = COMBINE[op]
    body = f"v = x[r]; acc = {combine};"
    loop = (sum_loop("acc", "start", "end", body) if op == "sum"
            else f"acc = {init};\n    for (int r = start; r < end; ++r) {{ {body} }}")
    return f"""
inline float chunk_{op}(__global const float *x, const int start, const int end, const int tree)
{{
    #pragma OPENCL FP_CONTRACT OFF
    float acc, v;
    if (!tree) {{
        {loop}
        return acc;
    }}
    float buf[WG];                        /* {op}_wg's work-items, one after another */
    for (int l = 0; l < WG; ++l) {{
        acc = {init};
        for (int r = start + l; r < end; r += WG) {{ v = x[r]; acc = {combine}; }}
        buf[l] = acc;
    }}
    for (int k = WG / 2; k > 0; k >>= 1)
        for (int l = 0; l < k; ++l) {{ v = buf[l + k]; acc = buf[l]; buf[l] = {combine}; }}
    return buf[0];
}}

inline float rest_{op}(__global float *x, int R, const int chunk, const int trees)
{{
    if (R == 1) return x[0];              /* the first stage was the whole reduction */
    while (R > chunk) {{
        const int n = (R + chunk - 1) / chunk, tree = trees == 2 || (trees == 1 && R >= WG);
        for (int c = 0; c < n; ++c)
            x[c] = chunk_{op}(x, c * chunk, min(c * chunk + chunk, R), tree);
        R = n;
    }}
    return chunk_{op}(x, 0, R, trees == 2 || (trees == 1 && R >= WG));
}}"""


def _finish_kernel(name: str, partials: str, last: str) -> str:
    region = "part" if partials == "sum" else "part + total"
    fold = _op(_FOLD[partials], "acc", "v")
    return f"""
__kernel void finish_{name}(__global float *out, __global float *part,
    __global const int *counts, const int ntensors, const int total,
    __global const float *scale, const int chunk, const int trees, const float p)
{{
    #pragma OPENCL FP_CONTRACT OFF
    if (get_global_id(0) != 0) return;
    __global float *from = {region};
    float acc = 0.0f;
    for (int t = 0, at = 0; t < ntensors; at += counts[t], ++t) {{
        const float v = rest_{partials}(from + at, counts[t], chunk, trees);
        acc = (t == 0) ? v : {fold};      /* left to right */
    }}
    {last}
}}"""


# The clip: each element times min(max_norm / (norm + eps), 1), the coefficient formed as ew's
# scalar add, rdiv and minimum formed it (each rounded on its own), then ew's mul; every
# work-item forms it from the norm on the device, so it takes no launch of its own. On a CPU
# a work-item takes CLIP_RUN consecutive elements: one division per element made the launch
# 4.5x slower than ew's scale_ (0.29 against 0.065 ms for 401408 floats; 16 each: 0.065).
CLIP_RUN = 16
_COEF = f"""
    #pragma OPENCL FP_CONTRACT OFF
    float c = {_op("add", "norm[0]", "eps")};
    c = {_op("rdiv", "c", "max_norm")};
    c = {_op("minimum", "c", "1.0f")};"""
_CLIP = f"""
__kernel void clip_by_norm(__global float *restrict x, __global const float *restrict norm,
                           const float max_norm, const float eps, const int n)
{{{_COEF}
    const int i = get_global_id(0);
    if (i < n) x[i] = {_op("mul", "x[i]", "c")};
}}

__kernel void clip_by_norm_run(__global float *restrict x, __global const float *restrict norm,
                               const float max_norm, const float eps, const int n)
{{{_COEF}
    const int i = get_global_id(0) * {CLIP_RUN}, end = min(i + {CLIP_RUN}, n);
    for (int j = i; j < end; ++j) x[j] = {_op("mul", "x[j]", "c")};
}}"""


def _build_source() -> str:
    parts = ["//CL//", f"#define WG {WG}", f"#define SUM_BLOCK {SUM_BLOCK}", _rest("sum"),
             _rest("max")]
    parts += [_stage_kernels(name, ps) for name, ps in PASSES.items()]
    parts += [_finish_kernel(name, *f) for name, f in FINISHES.items()]
    parts.append(_CLIP)
    return "\n".join(parts)


SOURCE = _build_source()


# -- the launches ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """One tensor's first-stage launch: its partials at ``at`` in the scratch buffer, ``nchunks``
    of them, by a work-group tree each (``tree``) or a sequential loop."""

    at: int
    size: int
    nchunks: int
    tree: bool


@dataclass(frozen=True)
class Plan:
    """Every tensor's first stage, the scratch buffer's length per region (``total``), the
    chunk counts on the device (``counts``, for ``finish_*``), the chunk length and the
    later stages' tree rule (see ``_rest``)."""

    stages: tuple[Stage, ...]
    total: int
    counts: cl.Buffer
    chunk: int
    trees: int


def _plan(queue, sizes: tuple[int, ...], workgroup: bool | None) -> Plan:
    """The plan for tensors of ``sizes``, made once per parcl queue (an eager training step
    clips the same shapes every time; the counts are then on the device already)."""
    key = ("gradnorm", sizes, workgroup)
    try:
        return queue.choices[key]
    except (AttributeError, KeyError):
        return keep(queue, key, _new_plan(queue, sizes, workgroup))


def _new_plan(queue, sizes, workgroup) -> Plan:
    gpu = on_gpu(queue)
    if workgroup is None and gpu and not (trees_fit(queue) and all(
            kernel_limits(queue, SOURCE, f"{name}_wg").work_group >= WG for name in PASSES)):
        workgroup = False       # trees of WG not allowed here (by reduction's trees too)
    chunk = CHUNK_GPU if gpu else CHUNK_CPU
    stages, at = [], 0
    for n in sizes:
        nchunks = -(-n // chunk)
        # reduce_3d's choice for a full reduction (outer = inner = 1); a lone element is a copy
        tree = n > 1 and (workgroup if workgroup is not None
                          else gpu and use_workgroups(1, n, 1, chunk))
        stages.append(Stage(at, n, nchunks, tree))
        at += nchunks
    counts = np.array([s.nchunks for s in stages], np.int32)
    # A buffer of its own, filled as it is made: no enqueued copy for a step capture to
    # record, and not the pool's, so it lives as long as the plan does.
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=counts)
    trees = 0 if workgroup is False else 2 if workgroup else int(gpu)
    return Plan(tuple(stages), at, buf, chunk, trees)


def _pass(name: str, tensors: list[Tensor], plan: Plan, part: Tensor, scale: Tensor | None,
          p: float) -> None:
    q = part.queue
    s = part.data if scale is None else scale.data      # an unscaled pass never reads it
    seq = get_kernel(q, SOURCE, f"{name}_seq")
    wg = get_kernel(q, SOURCE, f"{name}_wg")
    total, chunk, p = np.int32(plan.total), np.int32(plan.chunk), np.float32(p)
    for t, st in zip(tensors, plan.stages):
        args = (part.data, t.data, s, np.int32(st.at), total, np.int32(st.size), chunk,
                np.int32(st.nchunks), p)
        if st.tree:
            wg(q, (st.nchunks * WG,), (WG,), *args)
        else:
            seq(q, (-(-st.nchunks // 64) * 64,), (64,), *args)


def _finish(name: str, plan: Plan, part: Tensor, scale: Tensor | None, p: float) -> Tensor:
    q = part.queue
    out = Tensor.empty(q, ())
    get_kernel(q, SOURCE, f"finish_{name}")(
        q, (1,), (1,), out.data, part.data, plan.counts, np.int32(len(plan.stages)),
        np.int32(plan.total), part.data if scale is None else scale.data,
        np.int32(plan.chunk), np.int32(plan.trees), np.float32(p))
    return out


class NormError(ParclError, ValueError):
    """A norm of no tensors, or of an order that is not a positive number."""


def total_norm(tensors: list[Tensor], p: float, scaled: bool = True, *,
               workgroup: bool | None = None) -> Tensor:
    """The ``p``-norm (``p`` > 0 or inf) of ``tensors`` together, as if concatenated: a 0-d
    tensor on their queue, enqueued, nothing read back. ``scaled`` (p > 1 only): formed from
    the tensors scaled by ``min(2**40 / max|g|, 1)``, so it does not overflow where the plain
    one would (bit for bit the plain norm for every ``max|g| <= 2**40``). ``workgroup``
    forces reduction's kernel shape, as ``reduction.reduce_3d``'s does (tests).

    >>> gradnorm.total_norm([p.grad for p in model.parameters()], 2.0)   # doctest: +SKIP
    """
    tensors = list(tensors)
    if not tensors:
        raise NormError("total_norm: no tensors given")
    if not p > 0:
        raise NormError(f"total_norm: the norm type must be > 0 (2.0, 1.0, inf, ...), got {p}")
    check_float("total_norm", *tensors)
    check_same_queue("total_norm", *tensors)
    q = tensors[0].queue
    plan = _plan(q, tuple(t.size for t in tensors), workgroup)
    # The sums at [0, total), the maxima at [total, 2 total)
    part = Tensor.empty(q, (2 * plan.total,))
    if math.isinf(p):
        _pass("max", tensors, plan, part, None, p)
        return _finish("max", plan, part, None, p)
    if p == 1.0:
        _pass("abs", tensors, plan, part, None, p)
        return _finish("sum", plan, part, None, p)
    term, root = ("square", "sqrt") if p == 2.0 else ("pow", "root")
    if not (scaled and p > 1.0):
        _pass(term, tensors, plan, part, None, p)
        return _finish(root, plan, part, None, 1.0 / p)
    _pass(f"max_{term}", tensors, plan, part, None, p)
    scale = _finish("scale", plan, part, None, p)
    _pass(f"scaled_{term}", tensors, plan, part, scale, p)
    return _finish(f"{root}_scaled", plan, part, scale, 1.0 / p)


def clip_by_norm_(tensors: list[Tensor], norm: Tensor, max_norm: float, eps: float, *,
                  run: int | None = None) -> None:
    """Multiply every tensor in place by ``min(max_norm / (norm + eps), 1)``, ``norm`` a 0-d
    device tensor on their queue: one launch per tensor, nothing read back; bit for bit ew's
    ``scalar("add")``, ``scalar("rdiv")``, ``scalar("minimum")`` and ``binary("mul")``.
    ``run``: elements per work-item, 1 or ``CLIP_RUN`` (default: 1 on a GPU, ``CLIP_RUN`` on a
    CPU; tests force either).

    >>> gradnorm.clip_by_norm_(grads, gradnorm.total_norm(grads, 2.0), 1.0, 1e-6)  # doctest: +SKIP
    """
    check_float("clip_by_norm_", norm, *tensors)
    check_same_queue("clip_by_norm_", norm, *tensors)
    q = norm.queue
    if run is None:
        run = 1 if on_gpu(q) else CLIP_RUN
    k = get_kernel(q, SOURCE, "clip_by_norm" if run == 1 else "clip_by_norm_run")
    m, e = np.float32(max_norm), np.float32(eps)
    for t in tensors:
        items = -(-t.size // run)
        k(q, (-(-items // LOCAL) * LOCAL,), (LOCAL,), t.data, norm.data, m, e,
          np.int32(t.size))
