"""``label_counts``: PyTorch's multi-label targets (each row's class indices, ended by the first
-1) as float32 counts per class (the launcher behind ``tp.multilabel_margin_loss``).

One work-item per output element ``(row, class)`` walks its row's labels up to the first -1
and counts those equal to its class (a label listed twice counts twice, as in PyTorch): no
atomics on the counts, the same result whatever the schedule. Every label of the row, after
the -1 too, must lie in ``[-1, C)`` (PyTorch's check); the first that does not lowers a
one-int flag to its flat position (``atomic_min``, so the first one is reported).

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import multilabel
>>> q = pc.default_queue()
>>> counts, flag = multilabel.label_counts(pc.Tensor.from_host(q, np.array([[3, 0, -1, 1]])))
>>> counts.to_host()
array([[1., 0., 0., 1.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..tensor import LABEL_DTYPES, Tensor
from ._cache import get_kernel, round_up

NO_ERROR = np.iinfo(np.int32).max
LOCAL = 64

_KERNEL = r"""
/* counts (n, C): counts[r, k] = #{j before row r's first -1 : labels[r, j] == k}; work-item
   (r, 0) also lowers flag to the flat position of the row's first label outside [-1, C). */
__kernel void label_counts_IT(__global float *counts, __global const IT *labels,
                              __global int *flag, const int n, const int C)
{
    const long g = get_global_id(0);
    if (g >= (long)n * C) return;
    const int r = (int)(g / C), k = (int)(g % C);
    __global const IT *row = labels + (long)r * C;
    float c = 0.0f;
    for (int j = 0; j < C; ++j) {
        const IT t = row[j];
        if (t < 0) break;
        c += (t == (IT)k) ? 1.0f : 0.0f;
    }
    counts[g] = c;
    if (k == 0) {
        for (int j = 0; j < C; ++j) {
            if (row[j] < (IT)-1 || row[j] >= (IT)C) { atomic_min(flag, r * C + j); break; }
        }
    }
}
"""

SOURCE = ("//CL//" + _KERNEL.replace("_IT(", "_i32(").replace("IT", "int")
          + _KERNEL.replace("_IT(", "_i64(").replace("IT", "long"))


def label_counts(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(counts, flag)``: ``counts`` float32 of ``labels``' shape (rows of C labels, the
    last dim); ``flag`` (int32, (1,)) holds ``NO_ERROR`` or the flat position of the first
    label outside ``[-1, C)``."""
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"label_counts: labels have dtype {labels.dtype} (shape "
                         f"{labels.shape}); expected int32 or int64 class indices")
    q = labels.queue
    c = labels.shape[-1] if labels.shape else 1
    n = labels.size // c if c else 0
    counts = Tensor.empty(q, labels.shape)
    flag = Tensor.full(q, (1,), NO_ERROR, np.int32)
    if n * c:
        suffix = "i32" if labels.dtype == np.int32 else "i64"
        get_kernel(q, SOURCE, "label_counts_" + suffix)(
            q, (round_up(n * c, LOCAL),), (LOCAL,), counts.data, labels.data, flag.data,
            np.int32(n), np.int32(c))
    return counts, flag
