"""``gather(x, axis, index)`` (``torch.gather``) with its index check.

An out-of-range index is found on the device: the forward marks it in a flag and enqueues a
non-blocking read of it. The flag is checked, as ``cross_entropy`` checks its labels (see
``parcl/tape/ops/loss.py``): at once when the op is not recorded or under ``detect_anomaly``;
otherwise in the backward, deferred until the whole backward is enqueued; in a captured step
after each replay. So a bad index is a ``ShapeError`` no later than the step's next host read.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.array([[1, 2], [3, 4]], np.float32)), True)
>>> i = pc.Tensor.from_host(q, np.array([[0, 0], [1, 0]]))
>>> tp.gather(x, 1, i).to_host()
array([[1., 1.],
       [4., 3.]], dtype=float32)
"""

from __future__ import annotations

from ...kernels import gather as gk
from ...kernels import scatter as sc
from ...kernels.strided import axis_int
from ...tensor import Tensor
from ..node import Function, Node
from ..tape import defer
from .picks import _RangeCheck
from .shape import reshape, wrap_dim
from .torch_names import torch_names

__all__ = ["gather"]


class Gather(Function):
    """``x`` read at ``index`` along ``axis``. ``origin``, where the op broadcast the index it
    was given (``take_along_dim``): that index, and its position of a flat position of
    ``index``, for the error."""

    name = "gather"

    def forward(self, x: Tensor, index: Tensor, axis: int = 0, origin=None):
        out, flag = gk.gather_forward(x, axis, index)
        axis %= x.ndim
        given, where = origin or (index, lambda at: at)
        check = _RangeCheck(self.name, flag, given, x.shape[axis],
                            f"dim {axis} of size {x.shape[axis]} (input {x.shape})", where)
        check.guard(out, not self.recording)
        if self.recording:
            self.saved = (x.shape, axis, index, check)
        return out

    def backward(self, g: Tensor):
        x_shape, axis, index, check = self.saved
        defer(check.check)
        if not self.needs_input_grad[0]:
            return None, None
        return sc.gather_backward(g, x_shape, axis, index), None


@torch_names()
def gather(x, axis: int, index, *, tape=None):
    """``torch.gather``: ``out[i][j][k] = x[index[i][j][k]][j][k]`` for ``axis=0`` (and so on
    for other axes); ``index`` is int32/int64 with ``x``'s number of dimensions and no larger
    than ``x`` outside ``axis``; the result has ``index``'s shape. The backward scatter-adds in
    a fixed order (repeated indices sum bit-reproducibly). An index outside the axis is a
    ``ShapeError`` (see the module docstring for when). op_name ``"gather"``.

    >>> tp.gather(x, 0, i).shape
    (2, 2)
    """
    raw = index.value if isinstance(index, Node) else index
    if isinstance(raw, Tensor) and 0 in (x.ndim, raw.ndim) and max(x.ndim, raw.ndim) <= 1:
        # PyTorch takes a 0-d input or index as 1-D of one element; the result has the
        # index's shape
        wrap_dim("gather", axis, x.ndim, x.shape)
        out = Gather.apply(reshape(x, (-1,), tape=tape), raw.reshape((raw.size,)), tape=tape,
                           axis=0)
        return reshape(out, raw.shape, tape=tape)
    return Gather.apply(x, index, tape=tape, axis=axis_int("gather", axis, x.shape))
