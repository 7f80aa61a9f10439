"""Picking by index: ``index_select`` (``torch.index_select``) and ``one_hot``
(``torch.nn.functional.one_hot``).

``index_select`` is ``gather`` with the 1-D index broadcast along the other dims (a stride-0
strided copy of the index), so it shares gather's kernels: the backward adds each line's
gradients in index order (repeated indices sum bit-reproducibly). Both check their indices on
the device, as ``gather`` does (``parcl/tape/ops/gather.py``): a flag, read back without a
stall and raised as a ``ShapeError`` at once when the op is not recorded or under
``detect_anomaly``, else in the backward; ``one_hot`` (never recorded) raises at the first host
read of its result or of a value computed from it through ``tp`` ops.

>>> x = tp.tensor(pc.Tensor.from_host(q, np.arange(6, dtype=np.float32).reshape(2, 3)), True)
>>> tp.index_select(x, 1, pc.Tensor.from_host(q, np.array([2, 0, 2]))).to_host()
array([[2., 0., 2.],
       [5., 3., 5.]], dtype=float32)
>>> tp.one_hot(pc.Tensor.from_host(q, np.array([1, 0])), 3).to_host()
array([[0., 1., 0.],
       [1., 0., 0.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ShapeError
from ...kernels import gather as gk
from ...kernels.gather import broadcast_index
from ...kernels import onehot as ok
from ...kernels import scatter as sc
from ...kernels._cache import keep
from ...kernels.strided import axis_int
from ...tensor import FLOAT, LABEL_DTYPES, Tensor
from .. import mode
from ..node import Function, Node
from ..tape import defer
from .checks import FlagCheck
from .shape import wrap_dim

__all__ = ["index_select", "one_hot"]


class _RangeCheck(FlagCheck):
    """A flag holding the flat position of the first index outside ``[0, bound)`` in
    ``index`` (or ``NO_ERROR``); ``where`` turns that position into the index's own.
    (``bound``, not ``size``: ``FlagCheck.size`` is the flag's own length.)"""

    def __init__(self, op: str, flag: Tensor, index: Tensor, bound: int, what: str, where,
                 noun: str = "index"):
        self.description = f"{op}'s {noun} check"
        self.op, self.index, self.bound, self.what, self.where = op, index, bound, what, where
        self.noun = noun
        super().__init__(flag)

    def error(self, host: np.ndarray) -> ShapeError | None:
        at = int(host[0])
        if at == gk.NO_ERROR:
            return None
        pos = self.where(at)
        value = int(self.index.to_host().reshape(-1)[pos])
        coords = tuple(map(int, np.unravel_index(pos, self.index.shape or (1,))))
        plural = {"index": "indices", "label": "labels"}[self.noun]
        return ShapeError(f"{self.op}: {self.noun} {value} at position {coords} of "
                          f"{plural} {self.index.shape} is out of range for {self.what}; "
                          f"{plural} must be in [0, {self.bound})")


def constant(queue, array: np.ndarray) -> Tensor:
    """``Tensor.from_host(queue, array)`` for a small array that is only read (interpolate's
    and pad's source positions and weights), uploaded once per parcl queue and content and
    kept in ``queue.choices`` beside the kernels' launch plans: an upload costs tens of us of
    host time, and a step asks for the same few every time."""
    key = ("constant", array.dtype.str, array.shape, array.tobytes())
    try:
        return queue.choices[key]
    except (AttributeError, KeyError):
        return keep(queue, key, Tensor.from_host(queue, array))


class IndexSelect(Function):
    name = "index_select"

    def forward(self, x: Tensor, index: Tensor, dim: int = 0):
        if x.dtype != FLOAT:
            raise DTypeError(f"index_select: input has dtype {x.dtype} (shape {x.shape}), "
                             "expected float32")
        if index.dtype not in LABEL_DTYPES:
            raise DTypeError(f"index_select: index has dtype {index.dtype} (shape "
                             f"{index.shape}), expected int32 or int64")
        if index.ndim > 1:
            raise ShapeError(f"index_select: index must be 0-d or 1-D, got shape "
                             f"{index.shape} (input {x.shape})")
        shape = x.shape
        axis = wrap_dim("index_select", dim, x.ndim, shape)
        if not shape:                      # a 0-d input selects as a 1-D one of one element
            if index.size != 1:
                raise ShapeError(f"index_select: a 0-d input takes one index, got "
                                 f"{index.shape}")
            x = x.reshape((1,))
        out_shape = (*x.shape[:axis], index.size, *x.shape[axis + 1:])
        full, where = broadcast_index(index, out_shape, axis)
        out, flag = gk.gather_forward(x, axis, full)
        check = _RangeCheck("index_select", flag, index, x.shape[axis],
                            f"dim {axis} of size {x.shape[axis]} (input {shape})", where)
        check.guard(out, not self.recording)
        if self.recording:
            self.saved = (x.shape, shape, axis, full, check)
        return out.reshape(out_shape if shape else ())

    def backward(self, g: Tensor):
        x_shape, shape, axis, full, check = self.saved
        defer(check.check)
        if not self.needs_input_grad[0]:
            return None, None
        return sc.gather_backward(g.reshape(full.shape), x_shape, axis, full).reshape(shape), None


def index_select(x, dim: int, index, *, tape=None):
    """``torch.index_select``: the entries of ``x`` at the int32/int64 ``index`` (0-d or 1-D)
    along ``dim``; the result has ``len(index)`` there. Repeated indices add their gradients
    in index order. An index outside the dim is a ``ShapeError`` (see the module docstring for
    when). op_name ``"index_select"``.

    >>> tp.index_select(x, 0, pc.Tensor.from_host(q, np.array([1]))).shape
    (1, 3)
    """
    return IndexSelect.apply(x, index, tape=tape, dim=dim)


def one_hot(labels, num_classes: int = -1) -> Tensor:
    """``torch.nn.functional.one_hot``: int32/int64 ``labels`` of any shape to float32
    ``(*labels.shape, num_classes)`` rows with a 1 at each label (PyTorch's result is int64;
    parcl's float type is float32, and PyTorch takes int64 labels only). ``num_classes=-1``
    means ``max(labels) + 1``, read from the device (a wait, as in PyTorch). A label outside
    ``[0, num_classes)`` is a ``ShapeError`` at the first host read of the result or of a
    value computed from it (at once under ``detect_anomaly``). No gradient, never recorded.

    >>> tp.one_hot(pc.Tensor.from_host(q, np.array([[2]])), 4).shape
    (1, 1, 4)
    """
    if isinstance(labels, Node):
        labels = labels.value
    if not isinstance(labels, Tensor):
        raise TypeError(f"one_hot: expected a pc.Tensor or tp.Node of labels, got "
                        f"{type(labels).__name__}")
    if labels.dtype not in LABEL_DTYPES:
        raise DTypeError(f"one_hot: labels have dtype {labels.dtype} (shape {labels.shape}); "
                         "expected int32 or int64 class indices")
    num_classes = axis_int("one_hot", num_classes, labels.shape)
    if num_classes == -1:
        host = labels.to_host()
        if not host.size:            # ids[2:2]: no label to count the classes of
            raise ShapeError(f"one_hot: labels of shape {labels.shape} hold no elements, so "
                             "num_classes=-1 has no largest label to come from (as PyTorch's "
                             "'Can not infer total number of classes'); pass num_classes")
        if host.min() < 0:
            raise ShapeError(f"one_hot: label {int(host.min())} is negative (labels "
                             f"{labels.shape}); class values must be non-negative")
        num_classes = int(host.max()) + 1
    elif num_classes < 1:
        raise ShapeError(f"one_hot: num_classes must be positive or -1 (from the labels), "
                         f"got {num_classes}")
    out, flag = ok.one_hot(labels, num_classes)
    check = _RangeCheck("one_hot", flag, labels, num_classes, f"num_classes={num_classes}",
                        lambda at: at, noun="label")
    if mode.is_anomaly_enabled():
        check.check()
    out.checks = (*labels.checks, check.check)
    return out
