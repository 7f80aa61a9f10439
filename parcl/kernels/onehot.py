"""``one_hot``: int32/int64 class labels to float32 rows of 0s with one 1 (the launcher of
``tp.one_hot``).

One work-item per output element: neighbouring work-items write neighbouring words on a GPU,
and on a CPU PoCL vectorises the row. A label outside ``[0, C)`` gives a row of zeros and
lowers a one-int flag (``atomic_min`` of its flat position, so the first bad label is the one
reported whatever the schedule); the caller reads the flag back when it likes.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import onehot
>>> q = pc.default_queue()
>>> out, flag = onehot.one_hot(pc.Tensor.from_host(q, np.array([2, 0])), 3)
>>> out.to_host()
array([[0., 0., 1.],
       [1., 0., 0.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import LABEL_DTYPES, Tensor
from ._cache import get_kernel, round_up

NO_ERROR = np.iinfo(np.int32).max
LOCAL = 64

_KERNEL = r"""
/* out (n, C): out[i, c] = (labels[i] == c); a label outside [0, C) lowers flag to i. */
__kernel void one_hot_IT(__global float *out, __global const IT *labels, __global int *flag,
                         const int n, const int C)
{
    const long g = get_global_id(0);
    if (g >= (long)n * C) return;
    const int i = (int)(g / C), c = (int)(g % C);
    const IT t = labels[i];
    out[g] = (t == (IT)c) ? 1.0f : 0.0f;
    if (c == 0 && (t < 0 || t >= (IT)C)) atomic_min(flag, i);
}
"""

SOURCE = ("//CL//" + _KERNEL.replace("_IT(", "_i32(").replace("IT", "int")
          + _KERNEL.replace("_IT(", "_i64(").replace("IT", "long"))


def one_hot(labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """``(out, flag)``: ``out`` float32 ``(*labels.shape, num_classes)``; ``flag`` (int32,
    (1,)) holds ``NO_ERROR`` or the flat position of the first label outside the classes."""
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"one_hot: labels have dtype {labels.dtype} (shape {labels.shape}); "
                         "expected int32 or int64 class indices")
    if num_classes < 1:
        raise ShapeError(f"one_hot: num_classes must be positive, got {num_classes}")
    q = labels.queue
    n = labels.size
    out = Tensor.empty(q, (*labels.shape, num_classes))
    flag = Tensor.full(q, (1,), NO_ERROR, np.int32)
    suffix = "i32" if labels.dtype == np.int32 else "i64"
    get_kernel(q, SOURCE, "one_hot_" + suffix)(
        q, (round_up(n * num_classes, LOCAL),), (LOCAL,), out.data, labels.data, flag.data,
        np.int32(n), np.int32(num_classes))
    return out, flag
