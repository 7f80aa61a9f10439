"""``gather`` along one axis (``torch.gather``); its backward is a ``scatter_add`` into zeros
(``parcl.kernels.scatter.gather_backward``).

The forward reads ``x`` at ``index`` along ``axis`` for every element of ``index``. An index
outside ``[0, x.shape[axis])`` gives NaN there and lowers a one-int flag (``atomic_min`` of the
element's flat position, so the first bad element is reported whatever the schedule); the
caller reads the flag back when it likes.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import gather as gk
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.array([[1, 2], [3, 4]], np.float32))
>>> i = pc.Tensor.from_host(q, np.array([[1, 1], [0, 1]]))
>>> gk.gather_forward(x, 1, i)[0].to_host()
array([[2., 2.],
       [3., 4.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, LABEL_DTYPES, Tensor, check_same_queue
from ._cache import get_kernel, round_up
from .broadcast import int8_vector
from .strided import View, read_view

NO_ERROR = np.iinfo(np.int32).max
LOCAL = 64

_DECOMPOSE = r"""
/* Offsets oa_, ob_ of flat index i over dims d (nd <= 8, outermost s0), strides sa_, sb_. */
#define DECOMPOSE(i, nd, d, sa_, sb_, oa_, ob_) {                                    \
    int r_ = (i), q_;                                                            \
    switch (nd) {                                                                \
    case 8: q_ = r_ % d.s7; r_ /= d.s7; oa_ += (long)q_ * sa_.s7; ob_ += (long)q_ * sb_.s7; \
    case 7: q_ = r_ % d.s6; r_ /= d.s6; oa_ += (long)q_ * sa_.s6; ob_ += (long)q_ * sb_.s6; \
    case 6: q_ = r_ % d.s5; r_ /= d.s5; oa_ += (long)q_ * sa_.s5; ob_ += (long)q_ * sb_.s5; \
    case 5: q_ = r_ % d.s4; r_ /= d.s4; oa_ += (long)q_ * sa_.s4; ob_ += (long)q_ * sb_.s4; \
    case 4: q_ = r_ % d.s3; r_ /= d.s3; oa_ += (long)q_ * sa_.s3; ob_ += (long)q_ * sb_.s3; \
    case 3: q_ = r_ % d.s2; r_ /= d.s2; oa_ += (long)q_ * sa_.s2; ob_ += (long)q_ * sb_.s2; \
    case 2: q_ = r_ % d.s1; r_ /= d.s1; oa_ += (long)q_ * sa_.s1; ob_ += (long)q_ * sb_.s1; \
    case 1: oa_ += (long)r_ * sa_.s0; ob_ += (long)r_ * sb_.s0;                      \
    default: break;                                                              \
    }                                                                            \
}
"""

_KERNELS = r"""
/* out[i] = x[offset of i's coordinates with index[i] along the axis] (sx is 0 on the axis) */
__kernel void gather_fwd_IT(__global float *out, __global const float *x,
                            __global const IT *index, __global int *flag, const int n,
                            const int nd, const int8 d, const int8 sx, const int sxa,
                            const int nx)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    long ox = 0, unused = 0;
    DECOMPOSE(i, nd, d, sx, sx, ox, unused);
    const IT t = index[i];
    if (t < 0 || t >= nx) {
        out[i] = NAN;
        atomic_min(flag, i);
    } else {
        out[i] = x[ox + (long)t * sxa];
    }
}
"""

SOURCE = ("//CL//" + _DECOMPOSE + _KERNELS.replace("_IT(", "_i32(").replace("IT", "int")
          + _KERNELS.replace("_IT(", "_i64(").replace("IT", "long"))


def _strides(shape) -> list[int]:
    out, step = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        out[k] = step
        step *= shape[k]
    return out



def broadcast_index(index: Tensor, shape: tuple, axis: int):
    """``(full, where)``: the 0-d or 1-D ``index`` (``n`` entries) as an index of ``shape``
    (``n`` at ``axis``) repeating it along the other dims (a stride-0 strided copy), and the
    function from a flat position of ``full`` to its entry of ``index``."""
    n = index.size
    stride = tuple(1 if k == axis else 0 for k in range(len(shape)))
    full = read_view(index.reshape((n,)), View(shape, stride))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return full, lambda at: (at // inner) % n


def check_gather(x: Tensor, axis: int, index: Tensor) -> int:
    """Validate and return ``axis`` in ``[0, ndim)``."""
    if x.dtype != FLOAT:
        raise DTypeError(f"gather: input has dtype {x.dtype} (shape {x.shape}), expected float32")
    if index.dtype not in LABEL_DTYPES:
        raise DTypeError(f"gather: index has dtype {index.dtype} (shape {index.shape}), "
                         "expected int32 or int64")
    if index.ndim != x.ndim:
        raise ShapeError(f"gather: index {index.shape} and input {x.shape} must have the same "
                         "number of dimensions")
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"gather: axis {axis} is out of range for input of shape {x.shape}")
    axis %= x.ndim
    for k in range(x.ndim):
        if k != axis and index.shape[k] > x.shape[k]:
            raise ShapeError(f"gather: index {index.shape} is larger than input {x.shape} in "
                             f"dimension {k} (only axis {axis} may differ freely)")
    if x.ndim > 8:
        raise ShapeError(f"gather: at most 8 dimensions are supported, got {x.shape}")
    check_same_queue("gather", x, index)
    return axis


def _suffix(index: Tensor) -> str:
    return "i32" if index.dtype == np.int32 else "i64"


def gather_forward(x: Tensor, axis: int, index: Tensor) -> tuple[Tensor, Tensor]:
    """``(out, flag)``: ``out[...i...] = x[... index[...i...] ...]`` along ``axis``; ``flag``
    (int32, (1,)) holds ``NO_ERROR`` or the flat position of the first out-of-range index."""
    axis = check_gather(x, axis, index)
    q = x.queue
    out = Tensor.empty(q, index.shape)
    flag = Tensor.full(q, (1,), NO_ERROR, np.int32)
    sx = _strides(x.shape)
    sxa, sx[axis] = sx[axis], 0
    n = index.size
    get_kernel(q, SOURCE, "gather_fwd_" + _suffix(index))(
        q, (round_up(n, LOCAL),), (LOCAL,), out.data, x.data, index.data, flag.data,
        np.int32(n), np.int32(x.ndim), int8_vector(index.shape), int8_vector(sx), np.int32(sxa),
        np.int32(x.shape[axis]))
    return out, flag

