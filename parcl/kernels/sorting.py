"""Sorting along one axis: the permutation that sorts every row (``argsort``), for ``sort``,
``argsort`` and ``topk``.

Every variant orders by one strict total order, ``before`` below: by value (ascending, or
descending), NaN larger than every number (last ascending, first descending, as PyTorch), and
equal values (``-0.0`` and ``0.0`` too, and NaNs among themselves) by their index along the
axis. No two elements tie under it, so the result is one permutation, the same from every
variant and every run: a stable sort.

Three variants, chosen by device type only:

* ``local`` (GPUs, rows of up to ``LOCAL_MAX`` elements): one work-group per row, a bitonic
  sort of the row padded to a power of two, keys and indices in local memory;
* ``merge`` (GPUs, longer rows): the rows copied to global scratch, then one launch per merge
  width, one work-item per element: each finds its place in the merged run by a binary search
  of the partner run (the order is total, so that place is unique);
* ``serial`` (CPUs): one work-item per row: insertion sort of runs of 16, then bottom-up merges
  in global scratch. No barriers, which a CPU device pays for; the rows spread over the cores.

The tests run all three on the CPU device (``_variant=``).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import sorting
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([[3.0, np.nan, 1.0, 3.0]], np.float32))
>>> sorting.argsort(x, 1).to_host()
array([[2, 0, 3, 1]])
>>> sorting.argsort(x, 1, descending=True, k=2).to_host()
array([[1, 0]])
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..errors import DTypeError, ShapeError
from ..runtime import on_gpu
from ..tensor import FLOAT, Tensor
from ._cache import get_kernel, group_size, kernel_limits, round_up

LOCAL = 64
GROUP = 256          # the work-group of the local variant, where the device allows it
LOCAL_MAX = 4096     # the longest row the local variant sorts: 32 KiB of keys and indices
RUN = 16             # the serial variant's insertion-sorted runs
VARIANTS = ("local", "merge", "serial")

SOURCE = r"""//CL//
/* Whether (a, ia) goes before (b, ib): by value (descending when desc), NaN the largest, equal
   values by index; padding (an index >= n) after everything. A strict total order. */
inline int before(const float a, const int ia, const float b, const int ib, const int n,
                  const int desc)
{
    const int pa = ia >= n, pb = ib >= n;
    if (pa || pb) return pa == pb ? ia < ib : pb;
    const int na = isnan(a), nb = isnan(b);
    if (na || nb) return (na && nb) ? ia < ib : (desc ? na : nb);
    if (a != b) return desc ? a > b : a < b;
    return ia < ib;
}

/* Row r of x (rows of n along the axis, inner elements apart) starts at row_base(r, n). */
inline long row_base(const int r, const int n, const int inner)
{
    return (long)(r / inner) * n * inner + r % inner;
}

/* One work-group per row: a bitonic sort of the row padded to P (a power of two) in local
   memory; out takes the first k indices. */
__kernel void sort_local(__global long *out, __global const float *x, const int n,
                         const int inner, const int k, const int P, const int desc,
                         __local float *key, __local int *id)
{
    const int r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    const long base = row_base(r, n, inner);
    for (int t = l; t < P; t += L) {
        key[t] = t < n ? x[base + (long)t * inner] : 0.0f;
        id[t] = t;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = l; t < P; t += L) {
                const int u = t ^ stride;
                if (u <= t) continue;
                const float kt = key[t], ku = key[u];
                const int it = id[t], iu = id[u];
                const int swap = (t & size) == 0 ? before(ku, iu, kt, it, n, desc)
                                                 : before(kt, it, ku, iu, n, desc);
                if (swap) {
                    key[t] = ku; key[u] = kt;
                    id[t] = iu; id[u] = it;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    const long ob = (long)(r / inner) * k * inner + r % inner;
    for (int t = l; t < k; t += L) out[ob + (long)t * inner] = id[t];
}

/* Rows copied to contiguous scratch (keys and their indices): ks[r * n + j] = row r's j-th. */
__kernel void sort_load(__global float *ks, __global int *is, __global const float *x,
                        const int n, const int inner, const int rows)
{
    const int j = get_global_id(0), r = get_global_id(1);
    if (j >= n || r >= rows) return;
    ks[(long)r * n + j] = x[row_base(r, n, inner) + (long)j * inner];
    is[(long)r * n + j] = j;
}

/* One merge of runs of w into runs of 2w: each element goes to its own place, its position in
   its run plus the number of elements of the partner run that go before it. */
__kernel void sort_merge(__global float *kd, __global int *id, __global const float *ks,
                         __global const int *is, const int n, const int w, const int rows,
                         const int desc)
{
    const int p = get_global_id(0), r = get_global_id(1);
    if (p >= n || r >= rows) return;
    const long row = (long)r * n;
    const int start = p / w * w, other = (p / w ^ 1) * w;
    const float v = ks[row + p];
    const int vi = is[row + p];
    int dst = p;
    if (other < n) {
        int lo = other, hi = min(other + w, n);
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (before(ks[row + mid], is[row + mid], v, vi, n, desc)) lo = mid + 1;
            else hi = mid;
        }
        dst = min(start, other) + (p - start) + (lo - other);
    }
    kd[row + dst] = v;
    id[row + dst] = vi;
}

/* The first k indices of every sorted scratch row to out (k along the axis). */
__kernel void sort_store(__global long *out, __global const int *is, const int n,
                         const int inner, const int k, const int rows)
{
    const int t = get_global_id(0), r = get_global_id(1);
    if (t >= k || r >= rows) return;
    out[(long)(r / inner) * k * inner + r % inner + (long)t * inner] = is[(long)r * n + t];
}

/* One work-item per row: insertion sort of runs of RUN, then bottom-up merges between the
   two scratch buffers (a and b); out takes the first k indices. */
__kernel void sort_serial(__global long *out, __global const float *x, __global float *ka,
                          __global int *ia, __global float *kb, __global int *ib,
                          const int n, const int inner, const int k, const int rows,
                          const int desc)
{
    const int r = get_global_id(0);
    if (r >= rows) return;
    const long base = row_base(r, n, inner);
    __global float *sk = ka + (long)r * n, *dk = kb + (long)r * n;
    __global int *si = ia + (long)r * n, *di = ib + (long)r * n;
    for (int s = 0; s < n; s += RUN) {
        const int e = min(s + RUN, n);
        for (int j = s; j < e; ++j) {
            const float v = x[base + (long)j * inner];
            int m = j;
            while (m > s && before(v, j, sk[m - 1], si[m - 1], n, desc)) {
                sk[m] = sk[m - 1];
                si[m] = si[m - 1];
                --m;
            }
            sk[m] = v;
            si[m] = j;
        }
    }
    for (int w = RUN; w < n; w <<= 1) {
        for (int s = 0; s < n; s += 2 * w) {
            const int m = min(s + w, n), e = min(s + 2 * w, n);
            int a = s, b = m, t = s;
            while (a < m && b < e) {
                if (before(sk[b], si[b], sk[a], si[a], n, desc)) {
                    dk[t] = sk[b]; di[t++] = si[b++];
                } else {
                    dk[t] = sk[a]; di[t++] = si[a++];
                }
            }
            while (a < m) { dk[t] = sk[a]; di[t++] = si[a++]; }
            while (b < e) { dk[t] = sk[b]; di[t++] = si[b++]; }
        }
        __global float *tk = sk; sk = dk; dk = tk;
        __global int *ti = si; si = di; di = ti;
    }
    const long ob = (long)(r / inner) * k * inner + r % inner;
    for (int t = 0; t < k; ++t) out[ob + (long)t * inner] = si[t];
}
""".replace("//CL//", f"//CL//\n#define RUN {RUN}", 1)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def fits_local(queue: cl.CommandQueue, n: int) -> bool:
    """Whether a row of ``n``, padded, fits the local variant (``LOCAL_MAX`` and the
    device's local memory: a float and an int per element, beside what the kernel takes
    itself)."""
    padded = _pow2(n)
    if padded > LOCAL_MAX:
        return False
    own = kernel_limits(queue, SOURCE, "sort_local").local_bytes
    return 8 * padded + own <= queue.device.local_mem_size


def choose_variant(queue: cl.CommandQueue, n: int) -> str:
    """``serial`` on a CPU; on a GPU ``local`` where the row fits it, else ``merge``."""
    if not on_gpu(queue):
        return "serial"
    return "local" if fits_local(queue, n) else "merge"


def argsort(x: Tensor, axis: int, descending: bool = False, k: int | None = None, *,
            _variant: str | None = None) -> Tensor:
    """The int64 indices that sort ``x`` along ``axis`` (a stable sort: see the module
    docstring for the order), only the first ``k`` of each row when given: the result has
    ``x``'s shape with ``k`` along ``axis``. (``_variant`` forces one of ``VARIANTS``.)"""
    if x.dtype != FLOAT:
        raise DTypeError(f"argsort: input {x.shape} has dtype {x.dtype}, expected float32")
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"argsort: axis {axis} is out of range for input {x.shape}")
    n = x.shape[axis]
    k = n if k is None else int(k)
    if not 0 <= k <= n:
        raise ShapeError(f"argsort: k={k} is out of range for a row of {n} (input {x.shape})")
    q = x.queue
    out = Tensor.empty(q, (*x.shape[:axis], k, *x.shape[axis + 1:]), np.int64)
    rows = x.size // n if n else 0
    if out.size == 0:
        return out
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    variant = _variant or choose_variant(q, n)
    if variant not in VARIANTS:
        raise ValueError(f"argsort: unknown variant {variant!r}; expected one of {VARIANTS}")
    desc = np.int32(bool(descending))
    if variant == "local":
        if not fits_local(q, n):
            raise ValueError(f"argsort: a row of {n} does not fit the local variant")
        padded = _pow2(n)
        group = min(group_size(q, SOURCE, "sort_local", GROUP), max(padded // 2, 1))
        get_kernel(q, SOURCE, "sort_local")(
            q, (rows * group,), (group,), out.data, x.data, np.int32(n), np.int32(inner),
            np.int32(k), np.int32(padded), desc, cl.LocalMemory(4 * padded),
            cl.LocalMemory(4 * padded))
        return out
    keys = [Tensor.empty(q, (rows * n,)) for _ in range(2)]
    ids = [Tensor.empty(q, (rows * n,), np.int32) for _ in range(2)]
    if variant == "serial":
        get_kernel(q, SOURCE, "sort_serial")(
            q, (round_up(rows, LOCAL),), (LOCAL,), out.data, x.data, keys[0].data,
            ids[0].data, keys[1].data, ids[1].data, np.int32(n), np.int32(inner), np.int32(k),
            np.int32(rows), desc)
        return out
    grid = (round_up(n, LOCAL), rows), (LOCAL, 1)
    get_kernel(q, SOURCE, "sort_load")(q, *grid, keys[0].data, ids[0].data, x.data,
                                       np.int32(n), np.int32(inner), np.int32(rows))
    merge, w, src = get_kernel(q, SOURCE, "sort_merge"), 1, 0
    while w < n:
        merge(q, *grid, keys[1 - src].data, ids[1 - src].data, keys[src].data, ids[src].data,
              np.int32(n), np.int32(w), np.int32(rows), desc)
        src, w = 1 - src, 2 * w
    get_kernel(q, SOURCE, "sort_store")(q, (round_up(k, LOCAL), rows), (LOCAL, 1), out.data,
                                        ids[src].data, np.int32(n), np.int32(inner),
                                        np.int32(k), np.int32(rows))
    return out
