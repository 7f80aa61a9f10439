"""GEMM: ``C = op(A) @ op(B)`` with a fused bias/ReLU/accumulate epilogue, plain and batched.

The variants live in ``cl/gemm.cl`` and are chosen by device *type* (never by platform name):

* ``"cpu16"`` / ``"cpu8"`` — operands are packed into k-major panels (8 rows of op(A), 32 or 16
  columns of op(B); transposes and zero padding to whole panels happen there; a row-major A
  whose rows fill whole panels is read in place instead), then each
  work-item keeps an 8x32 (8x16) block of C in sixteen ``float16`` (``float8``) registers and
  streams its two panels contiguously, so PoCL emits straight FMA code with no barriers.
  ``cpu16`` (AVX-512 wide) is about twice as fast, but PoCL 3.0/LLVM 14 has aborted whole
  processes on float16 code, so it becomes the default for a device only after a subprocess
  has built it and checked its results there (``probe.wide_kernel_ok``, remembered on
  disk);
  otherwise CPUs get ``cpu8``.
* ``"direct8"`` / ``"direct16"`` — CPU products under ``DIRECT_MAX`` multiply-adds: one
  launch, no packing, 4x4 of C per work-item (PoCL spends ~0.1 ms per enqueue).
* ``"tiled"`` — the GPU shape: 64x64 tiles through local memory, 4x4 registers per work-item,
  in groups of 16x16 it requires; a GPU that allows it fewer runs ``"cpu8"`` instead.

All run on every device; tests force one with the private ``_variant`` argument (and packing
of A with ``_pack_a``).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels.gemm import gemm
>>> q = pc.default_queue()
>>> a = pc.Tensor.from_host(q, np.ones((2, 3), np.float32))
>>> gemm(a, a, trans_b=True).to_host()
array([[3., 3.],
       [3., 3.]], dtype=float32)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ShapeError
from ..runtime import is_gpu
from ..tensor import FLOAT, Tensor, check_same_queue
from ._cache import VECTOR_TYPES, chosen, get_kernel, keep, kernel_limits, load_source
from .probe import wide_kernel_ok

_OPTIONS = ("-cl-mad-enable",)   # `acc += x * y` must become an FMA; no relaxed math needed
MR = 8                           # rows of op(A) per CPU register block; must match gemm.cl
VW = {"cpu16": 16, "cpu8": 8}    # CPU vector width; a block is MR x 2*VW, as in gemm.cl
# A CPU work-group runs its work-items in order, x fastest: its B panels (4 x K x 32 or
# 8 x K x 16 floats, 512 KiB at K=1024) stay in L2 while 16 A panels pass by, and few groups
# keep PoCL's per-group overhead small.
CPU_GROUP = {"cpu16": (4, 16), "cpu8": (8, 16)}
PACK_KB = 8                      # k-rows per packing work-item; must match KB in gemm.cl
PACK_GROUP = 8                   # packing work-items (blocks of PACK_KB k-rows) per group
TILE, GROUP = 64, 16             # the GPU tile and work-group edge; must match gemm.cl
FLAG_BIAS, FLAG_RELU, FLAG_VEC = 1, 2, 4
DIRECT_GROUP = (8, 8)            # work-items (4 x VW blocks of C each) per gemm_direct group
# Up to this many multiply-adds a CPU product runs as one gemm_direct launch: PoCL takes ~0.1 ms
# per enqueue, which the two packing launches would add to a product this small.
DIRECT_MAX = 1 << 17
VARIANTS = ("cpu16", "cpu8", "direct16", "direct8", "tiled")

SOURCE = VECTOR_TYPES + load_source("gemm")    # the program every GEMM kernel is built from


def _options(variant: str) -> tuple[str, ...]:
    # One source, one program per vector width: "direct16" is gemm_direct from cpu16's
    # program; "direct8" and "tiled" share cpu8's.
    vw = VW.get("cpu" + variant[6:]) if variant.startswith("direct") else VW.get(variant)
    return _OPTIONS + (f"-DVW={vw or 8}",)


_OPTIONS_OF = {v: _options(v) for v in VARIANTS}


def _kernel(queue: cl.CommandQueue, name: str, variant: str, role=None) -> cl.Kernel:
    return get_kernel(queue, SOURCE, name, _OPTIONS_OF[variant], role)


def choose_variant(device: cl.Device) -> str:
    """The variant for ``device``: ``"tiled"`` on GPUs; on CPUs ``"cpu16"`` where its probe
    passed, else ``"cpu8"``."""
    if is_gpu(device):
        return "tiled"
    return "cpu16" if wide_kernel_ok(device, "gemm", SOURCE) else "cpu8"


def wide_check(queue: cl.CommandQueue) -> bool:
    """The float16 probe's check (run in its subprocess): ``cpu16`` against numpy."""
    rng = np.random.default_rng(0)
    for trans_a, trans_b, (m, n, k) in [(False, False, (37, 45, 29)), (True, True, (8, 64, 3)),
                                        (False, True, (70, 33, 100))]:
        ha = rng.standard_normal((k, m) if trans_a else (m, k), dtype=np.float32)
        hb = rng.standard_normal((n, k) if trans_b else (k, n), dtype=np.float32)
        hbias = rng.standard_normal(n, dtype=np.float32)
        want = np.maximum((ha.T if trans_a else ha).astype(np.float64)
                          @ (hb.T if trans_b else hb) + hbias, 0)
        got = gemm(Tensor.from_host(queue, ha), Tensor.from_host(queue, hb), trans_a=trans_a,
                   trans_b=trans_b, bias=Tensor.from_host(queue, hbias), relu=True,
                   _variant="cpu16").to_host()
        if not np.allclose(got, want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max())):
            return False
    return True


# -- validation ----------------------------------------------------------------------------
def _check_float(op: str, **tensors: Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {name} has dtype {t.dtype}, expected float32 "
                             "(convert with .astype(np.float32) before uploading)")


def _check_out(op: str, out: Tensor | None, shape: tuple[int, ...], a: Tensor, b: Tensor,
               beta: float) -> None:
    if out is None:
        if beta != 0.0:
            raise ShapeError(f"{op}: beta={beta} accumulates into out=, but no out was given; "
                             "pass the tensor to accumulate into as out=")
        return
    if out.shape != shape:
        raise ShapeError(f"{op}: out has shape {out.shape}, expected {shape}")
    if out.data == a.data or out.data == b.data:
        raise ShapeError(f"{op}: out must not share memory with an input; pass a fresh tensor")


# -- public API ----------------------------------------------------------------------------
def gemm(a: Tensor, b: Tensor, *, trans_a: bool = False, trans_b: bool = False,
         out: Tensor | None = None, bias: Tensor | None = None, relu: bool = False,
         beta: float = 0.0, _variant: str | None = None, _pack_a: bool = False) -> Tensor:
    """C = op(A) @ op(B) (+ bias broadcast over rows, length N) (then ReLU), for 2-D float32
    tensors. op(A) is (M,K): A is (M,K), or (K,M) when trans_a. op(B) is (K,N): B is (K,N), or
    (N,K) when trans_b. beta != 0 accumulates: C = op(A)@op(B) + beta*C into `out` (must be
    given then; used for += gradient accumulation, e.g. beta=1); with bias/relu as well the
    order is relu(op(A)@op(B) + beta*C + bias). Enqueued on a.queue; never waits.

    >>> import numpy as np, parcl as pc
    >>> q = pc.default_queue()
    >>> x = pc.Tensor.from_host(q, np.array([[1, -2]], np.float32))
    >>> w = pc.Tensor.from_host(q, np.array([[1, 0], [0, 1]], np.float32))
    >>> bias = pc.Tensor.from_host(q, np.array([0.5, 0.5], np.float32))
    >>> gemm(x, w, trans_b=True, bias=bias, relu=True).to_host()
    array([[1.5, 0. ]], dtype=float32)
    """
    _check_float("gemm", a=a, b=b, out=out, bias=bias)
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"gemm: expects 2-D a and b, got {a.shape} and {b.shape} "
                         "(use batched_gemm for 3-D)")
    m, k = a.shape[::-1] if trans_a else a.shape
    kb, n = b.shape[::-1] if trans_b else b.shape
    if k != kb:
        raise ShapeError(f"gemm: inner dimensions differ: a {a.shape}{' (transposed)' * trans_a}"
                         f" gives K={k}, b {b.shape}{' (transposed)' * trans_b} gives K={kb}")
    if bias is not None and bias.shape != (n,):
        raise ShapeError(f"gemm: bias has shape {bias.shape}, expected ({n},) for a result of "
                         f"shape {(m, n)}")
    check_same_queue("gemm", *[t for t in (a, b, out, bias) if t is not None])
    _check_out("gemm", out, (m, n), a, b, beta)
    if out is None:
        out = Tensor.empty(a.queue, (m, n))
    _launch(a, b, out, bias, m, n, k, 1, 0, 0, trans_a, trans_b, relu, float(beta), _variant,
            _pack_a)
    return out


def product(a: Tensor, b: Tensor, trans_a: bool = False, trans_b: bool = False,
            into: Tensor | None = None, bias: Tensor | None = None,
            relu: bool = False) -> Tensor:
    """``gemm`` for a caller that has validated its operands (2-D float32 on one queue, inner
    dimensions equal, ``into`` of the result's shape and its own buffer, ``bias`` of N
    elements): ``op(A) @ op(B)`` (+ ``bias``, then ReLU), or added into ``into`` (``beta=1``)
    and ``into`` returned. The eager matmul's and linear's path: their checks ran once, at
    the op.

    >>> product(a, a, trans_b=True).to_host()
    array([[3., 3.],
           [3., 3.]], dtype=float32)
    """
    m, k = a.shape[::-1] if trans_a else a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    if into is None:
        out, beta = Tensor.empty(a.queue, (m, n)), 0.0
    else:
        out, beta = into, 1.0
    _launch(a, b, out, bias, m, n, k, 1, 0, 0, trans_a, trans_b, relu, beta, None)
    return out


def product2(first: tuple, second: tuple) -> tuple[Tensor, Tensor]:
    """Two ``product`` calls, each ``(a, b, trans_a, trans_b, into)``, in one launch where
    both are small products on a CPU (``gemm_direct2``: a matmul's two gradients), else in
    two; each result as ``product`` returns it. Each element is computed as ``product``
    computes it, bit for bit. The two must not write what the other reads.

    >>> ga, gb = product2((g, b, False, True, None), (a, g, True, False, None))
    """
    (a0, b0, ta0, tb0, into0), (a1, b1, ta1, tb1, into1) = first, second
    queue = a0.queue
    m0, k0 = a0.shape[::-1] if ta0 else a0.shape
    n0 = b0.shape[0] if tb0 else b0.shape[1]
    m1, k1 = a1.shape[::-1] if ta1 else a1.shape
    n1 = b1.shape[0] if tb1 else b1.shape[1]
    p0 = _direct_plan(queue, m0, n0, k0, 1, ta0, tb0) if m0 and n0 else None
    p1 = _direct_plan(queue, m1, n1, k1, 1, ta1, tb1) if p0 is not None and m1 and n1 else None
    if p1 is None:
        return (product(a0, b0, ta0, tb0, into=into0), product(a1, b1, ta1, tb1, into=into1))
    out0, beta0 = (Tensor.empty(queue, (m0, n0)), 0.0) if into0 is None else (into0, 1.0)
    out1, beta1 = (Tensor.empty(queue, (m1, n1)), 0.0) if into1 is None else (into1, 1.0)
    g0, g1 = p0.gsize, p1.gsize
    # one kernel object per pair of transposes and betas, whose strides and betas stay set
    get_kernel(queue, SOURCE, "gemm_direct2", _OPTIONS_OF[p0.variant],
               (ta0, tb0, beta0, ta1, tb1, beta1))(
        queue, (max(g0[0], g1[0]), max(g0[1], g1[1]), 2), _DIRECT_LOCAL,
        a0.data, p0.sa[0], p0.sa[1], b0.data, p0.sb[1], p0.sb[0], out0.data, m0, n0, k0, beta0,
        a1.data, p1.sa[0], p1.sa[1], b1.data, p1.sb[1], p1.sb[0], out1.data, m1, n1, k1, beta1)
    return out0, out1


def batched_gemm(a: Tensor, b: Tensor, *, trans_a: bool = False, trans_b: bool = False,
                 out: Tensor | None = None, _variant: str | None = None) -> Tensor:
    """3-D (batch, M, K) x (batch, K, N) -> (batch, M, N), with the transposes of ``gemm``
    applied to the last two dimensions; a 2-D ``b`` (or a 2-D ``a``) is shared by every batch.

    >>> import numpy as np, parcl as pc
    >>> q = pc.default_queue()
    >>> a = pc.Tensor.from_host(q, np.ones((4, 2, 3), np.float32))
    >>> b = pc.Tensor.from_host(q, np.ones((3, 5), np.float32))
    >>> batched_gemm(a, b).to_host().shape
    (4, 2, 5)
    """
    _check_float("batched_gemm", a=a, b=b, out=out)
    if a.ndim not in (2, 3) or b.ndim not in (2, 3) or a.ndim + b.ndim == 4:
        raise ShapeError(f"batched_gemm: expects 3-D operands (one of them may be 2-D, shared "
                         f"by the batch), got {a.shape} and {b.shape}")
    batch = a.shape[0] if a.ndim == 3 else b.shape[0]
    m, k = a.shape[:-3:-1] if trans_a else a.shape[-2:]
    kb, n = b.shape[:-3:-1] if trans_b else b.shape[-2:]
    if a.ndim == 3 and b.ndim == 3 and b.shape[0] != batch:
        raise ShapeError(f"batched_gemm: batch sizes differ: a {a.shape}, b {b.shape}")
    if k != kb:
        raise ShapeError(f"batched_gemm: inner dimensions differ: a {a.shape}"
                         f"{' (transposed)' * trans_a} gives K={k}, b {b.shape}"
                         f"{' (transposed)' * trans_b} gives K={kb}")
    check_same_queue("batched_gemm", *[t for t in (a, b, out) if t is not None])
    _check_out("batched_gemm", out, (batch, m, n), a, b, 0.0)
    if out is None:
        out = Tensor.empty(a.queue, (batch, m, n))
    a_bs = m * k if a.ndim == 3 else 0
    b_bs = k * n if b.ndim == 3 else 0
    _launch(a, b, out, None, m, n, k, batch, a_bs, b_bs, trans_a, trans_b, False, 0.0,
            _variant)
    return out


# -- launching -----------------------------------------------------------------------------
_DIRECT_OF = {"cpu16": "direct16", "cpu8": "direct8"}    # from the same program as the big one
_DIRECT = frozenset(_DIRECT_OF.values())
_DIRECT_LOCAL = (*DIRECT_GROUP, 1)


@dataclass(frozen=True, slots=True)
class DirectPlan:
    """One small product's launch on a CPU: its ``variant`` (``direct8``/``direct16``), the
    global size, and the (row, k) strides of op(A) and op(B) in the operands' memory."""

    variant: str
    gsize: tuple[int, int, int]
    sa: tuple[int, int]
    sb: tuple[int, int]


def _plan(variant: str, m: int, n: int, k: int, batch: int, trans_a: bool,
          trans_b: bool) -> DirectPlan:
    lx, ly = DIRECT_GROUP
    vw = VW["cpu" + variant[6:]]                  # a work-item's columns: one vector
    return DirectPlan(variant, (-(-n // (vw * lx)) * lx, -(-m // (4 * ly)) * ly, batch),
                      (1, m) if trans_a else (k, 1), (k, 1) if trans_b else (1, n))


def _direct_plan(queue: cl.CommandQueue, m: int, n: int, k: int, batch: int, trans_a: bool,
                 trans_b: bool) -> DirectPlan | None:
    """The ``gemm_direct`` launch of a product small enough for it on a CPU device, or None
    (a big product, or a GPU): worked out once per parcl queue and signature
    (``queue.choices``), as an eager step repeats the same few products."""
    key = ("gemm", m, n, k, batch, trans_a, trans_b)
    try:
        return queue.choices[key]
    except (AttributeError, KeyError):
        return keep(queue, key, _new_direct_plan(queue, m, n, k, batch, trans_a, trans_b))


def _new_direct_plan(queue, m, n, k, batch, trans_a, trans_b) -> DirectPlan | None:
    variant = chosen(queue, "gemm", choose_variant)
    if variant not in VW or batch * m * n * k > DIRECT_MAX:
        return None
    return _plan(_DIRECT_OF[variant], m, n, k, batch, trans_a, trans_b)


def _launch(a: Tensor, b: Tensor, out: Tensor, bias: Tensor | None, m: int, n: int, k: int,
            batch: int, a_bs: int, b_bs: int, trans_a: bool, trans_b: bool, relu: bool,
            beta: float, variant: str | None, pack_a: bool = False) -> None:
    """``pack_a`` packs A even where it could be read in place (tests compare the two)."""
    queue = a.queue
    if m == 0 or n == 0 or batch == 0:
        return
    flags = (FLAG_BIAS if bias is not None else 0) | (FLAG_RELU if relu else 0)
    bias_buf = bias.data if bias is not None else None
    if variant is None:
        p = _direct_plan(queue, m, n, k, batch, trans_a, trans_b)
        if p is None:
            variant = chosen(queue, "gemm", choose_variant)
    else:                                         # a test forcing a variant
        p = _plan(variant, m, n, k, batch, trans_a, trans_b) if variant in _DIRECT else None
    if p is not None:
        # the small products of an eager step: plain numbers (the kernel's declared argument
        # types pack them to the same bytes as numpy scalars would, for less host time)
        # one kernel object per transpose and beta, whose strides and beta stay set
        get_kernel(queue, SOURCE, "gemm_direct", _OPTIONS_OF[p.variant], (trans_a, trans_b, beta))(
            queue, p.gsize, _DIRECT_LOCAL, a.data, a_bs, p.sa[0], p.sa[1], b.data, b_bs,
            p.sb[1], p.sb[0], out.data, m * n, bias_buf, m, n, k, beta, flags)
        return
    # Plain numbers, in plans kept per signature: the kernels' declared argument types pack
    # them to the bytes numpy scalars would give, and the same objects at every launch are
    # arguments a kernel object has set already (``KernelArgs``), not packed again.
    if variant == "tiled" and kernel_limits(queue, SOURCE, "gemm_tiled",
                                            _OPTIONS_OF[variant]).work_group < GROUP * GROUP:
        variant = "cpu8"      # its GROUP x GROUP groups (required) are more than allowed here
    if variant == "tiled":
        g = _tiled_plan(queue, m, n, k, batch, a_bs, b_bs, trans_a, trans_b, beta, flags)
        _kernel(queue, "gemm_tiled", variant)(
            queue, g.gsize, g.lsize, a.data, *g.a_args, b.data, *g.b_args, out.data,
            *g.c_args, bias_buf, *g.tail)
        return
    if variant not in VW:
        raise ValueError(f"gemm: unknown variant {variant!r}; expected one of {VARIANTS}")
    c = _cpu_plan(queue, variant, m, n, k, batch, a_bs, b_bs, trans_a, trans_b,
                  pack_a or trans_a or m % MR != 0, beta, flags)
    # The panels are pooled temporaries, back in the queue's pool when dropped here: safe, as
    # the in-order queue runs anything that reuses them after this GEMM.
    pa = Tensor.empty(queue, c.pa_shape) if c.pa_shape is not None else None
    pb = Tensor.empty(queue, c.pb_shape)
    packed_a = None if pa is None else pa.data   # (``if pa``: a Tensor's truth is its value's)
    if k > 0:
        _kernel(queue, "pack", variant)(
            queue, c.pack_gsize, c.pack_lsize, a.data, *c.pack_a, packed_a,
            *c.pack_m, b.data, *c.pack_b, pb.data, *c.pack_n)
    _kernel(queue, "gemm_cpu", variant)(
        queue, c.gsize, c.lsize, a.data if packed_a is None else packed_a, *c.a_strides,
        pb.data, *c.pb_bs, out.data, *c.c_args, bias_buf, *c.tail)


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """A packed CPU product's two launches (``pack``, then ``gemm_cpu``), worked out once per
    parcl queue and signature: the panels' shapes (``pa_shape`` None where op(A) is read in
    place), the sizes, and each run of scalar arguments between the buffers."""

    pa_shape: tuple | None
    pb_shape: tuple
    pack_gsize: tuple
    pack_lsize: tuple
    pack_a: tuple          # a_bs, op(A)'s row and k strides
    pack_m: tuple          # m, A's panels (0: read in place)
    pack_b: tuple          # b_bs, op(B)'s k and column strides
    pack_n: tuple          # n, B's panels, B's batch, k
    gsize: tuple
    lsize: tuple
    a_strides: tuple       # batch, panel, row and k strides of what gemm_cpu reads as A
    pb_bs: tuple
    c_args: tuple          # C's batch stride
    tail: tuple            # m, n, k, beta, flags


@dataclass(frozen=True, slots=True)
class TiledPlan:
    """The GPU's ``gemm_tiled`` launch, worked out once per parcl queue and signature."""

    gsize: tuple
    lsize: tuple
    a_args: tuple
    b_args: tuple
    c_args: tuple
    tail: tuple


def _signed(beta: float):
    """``beta`` as a plan's key: -0.0 (equal to 0.0, other bits) is a key of its own."""
    return beta if beta else (beta, math.copysign(1.0, beta))


def _tiled_plan(queue, m, n, k, batch, a_bs, b_bs, trans_a, trans_b, beta, flags) -> TiledPlan:
    key = ("gemm_tiled", m, n, k, batch, a_bs, b_bs, trans_a, trans_b, _signed(beta), flags)
    try:
        return queue.choices[key]
    except (AttributeError, KeyError):
        return keep(queue, key, TiledPlan((-(-n // TILE) * GROUP, -(-m // TILE) * GROUP, batch),
                                          (GROUP, GROUP, 1), (a_bs, int(trans_a)),
                                          (b_bs, int(trans_b)), (m * n,),
                                          (m, n, k, beta, flags)))


def _cpu_plan(queue, variant, m, n, k, batch, a_bs, b_bs, trans_a, trans_b, pack_a, beta,
              flags) -> CpuPlan:
    key = ("gemm_cpu", variant, m, n, k, batch, a_bs, b_bs, trans_a, trans_b, pack_a,
           _signed(beta), flags)
    try:
        return queue.choices[key]
    except (AttributeError, KeyError):
        return keep(queue, key, _new_cpu_plan(variant, m, n, k, batch, a_bs, b_bs, trans_a,
                                              trans_b, pack_a, beta, flags))


def _new_cpu_plan(variant, m, n, k, batch, a_bs, b_bs, trans_a, trans_b, pack_a, beta,
                  flags) -> CpuPlan:
    # op(A)[i, k] and op(B)[k, j] as (row stride, k stride) in the tensors' memory
    sa = (1, m) if trans_a else (k, 1)
    sb = (k, 1) if trans_b else (1, n)
    nr = 2 * VW[variant]
    pm, pn = -(-m // MR), -(-n // nr)            # panels of op(A) rows / op(B) columns
    b_batch = batch if b_bs else 1
    # A row-major op(A) whose rows fill whole panels is read in place: no edge to pad, and its
    # MR rows are MR sequential streams (measured 5-9 % faster than packing on MLP shapes).
    # A transposed A is packed: MR floats per k at a stride of M (2 KiB at M=512) would map
    # every k step to the same few L1 sets. B always goes through panels, which keep a
    # work-group's columns contiguous in L2.
    a_panels = pm if pack_a else 0
    a_strides = (pm * MR * k, k * MR, 1, MR) if pack_a else (a_bs, MR * sa[0], sa[0], sa[1])
    if n % VW[variant] == 0:
        flags |= FLAG_VEC
    lx, ly = CPU_GROUP[variant]
    return CpuPlan(
        (batch, pm, k, MR) if pack_a else None, (b_batch, pn, k, nr),
        (-(-k // (PACK_KB * PACK_GROUP)) * PACK_GROUP, a_panels + pn, batch),
        (PACK_GROUP, 1, 1), (a_bs, sa[0], sa[1]), (m, a_panels), (b_bs, sb[0], sb[1]),
        (n, pn, b_batch, k), (-(-pn // lx) * lx, -(-pm // ly) * ly, batch), (lx, ly, 1),
        a_strides, (pn * nr * k if b_bs else 0,), (m * n,), (m, n, k, beta, flags))
