"""PyTorch's adaptive pools beyond ``adaptive_avg_pool2d`` (in ``nn``): ``adaptive_avg_pool1d``
(that op on an ``(N, C, 1, L)`` view) and ``adaptive_max_pool1d``/``adaptive_max_pool2d``.

An adaptive window ``i`` of ``n`` inputs into ``out`` covers ``[floor(i*n/out),
ceil((i+1)*n/out))`` (PyTorch's bins; neighbours overlap when ``out`` does not divide ``n``).
The max pools gather every window's positions with ``index_select`` (a short window repeats
its last position, which changes no maximum) and pick one element of each by PyTorch's max
pool rule (``window_argmax``): the first maximal element in row-major order, or the last NaN
where a window holds several (``torch.argmax`` would take the first); the gradient goes to
the pick, and positions in several windows sum their gradients in a fixed order. Where ``out``
divides ``n`` the gather is skipped (the windows are a reshape). ``return_indices=True`` also
returns each pick's position in its input plane (int64, PyTorch's flat ``h * W + w``), looked
up in a table of the windows' positions on the device.

>>> x = tp.tensor(np.arange(10, dtype=np.float32).reshape(1, 1, 10))
>>> tp.adaptive_max_pool1d(x, 3).to_host()
array([[[3., 6., 9.]]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...kernels import reduction as rd
from ...kernels import scan
from ...kernels.adaptive_pool import window_argmax, window_positions
from ...tensor import Tensor
from ..node import Function, Node
from .nn import adaptive_avg_pool2d, refuse_empty_windows
from .picks import constant, index_select
from .sequence import _as_2d, _back
from .shape import as_batched, permute, reshape, unbatch

__all__ = ["adaptive_avg_pool1d", "adaptive_max_pool1d", "adaptive_max_pool2d"]


def _size(op: str, value, n: int) -> int:
    """One output size (``None``: the input's ``n``), at least 1."""
    if value is None:
        return n
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ShapeError(f"{op}: output_size must hold positive integers (or None), got "
                         f"{value!r}")
    return int(value)


def _sizes(op: str, output_size, count: int, dims: tuple) -> tuple[int, ...]:
    sizes = (output_size,) * count if not isinstance(output_size, (tuple, list)) \
        else tuple(output_size)
    if len(sizes) != count:
        raise ShapeError(f"{op}: output_size must be an int or a tuple of {count}, got "
                         f"{output_size!r}")
    return tuple(_size(op, s, n) for s, n in zip(sizes, dims))


def _windows(n: int, out: int) -> tuple[np.ndarray, int]:
    """The ``(out, k)`` input positions of every window (a short one repeats its last) and
    ``k``, the longest window."""
    i = np.arange(out)
    start, end = (i * n) // out, -((-(i + 1) * n) // out)
    k = int((end - start).max())
    return np.minimum(start[:, None] + np.arange(k), end[:, None] - 1), k


def _gather(x, axis: int, out: int, tape):
    """``x`` with dim ``axis`` replaced by its ``out`` windows laid end to end, and the
    windows' ``(out, k)`` input positions."""
    n = x.shape[axis]
    at, k = _windows(n, out)
    if out * k == n and np.array_equal(at.ravel(), np.arange(n)):
        return x, at                                 # non-overlapping, equal: a reshape
    return index_select(x, axis, constant(x.queue, at.ravel()), tape=tape), at


class WindowMax(Function):
    """Each window's (the last dim's) element at ``pick`` (``window_argmax``), which is where
    the backward puts the gradient."""

    name = "adaptive_max_pool"

    def forward(self, windows: Tensor, pick: Tensor | None = None):
        if not self.recording:                   # the same values, the maximum's or NaN
            return rd.max(windows, (windows.ndim - 1,), False)
        if pick is None:                         # not asked for the indices: found here
            pick = window_argmax(windows)
        k = windows.shape[-1]
        self.saved = (pick, k, windows.shape)
        return scan.take_rows(windows.reshape((windows.size // k, k)),
                              pick.reshape((pick.size,))).reshape(pick.shape)

    def backward(self, g: Tensor):
        pick, k, shape = self.saved
        return scan.put_rows(g, pick.reshape((pick.size,)), k).reshape(shape)


def _pick(windows, table: np.ndarray, return_indices: bool, batched: bool, tape):
    """Each window's pick over the last dim of ``windows`` (and, asked, its input position from
    ``table``), without the batch dim where the input had none."""
    if not return_indices:               # WindowMax finds the picks only if it records
        y = WindowMax.apply(windows, tape=tape)
        return unbatch(y, batched, tape=tape)
    raw = windows.value if isinstance(windows, Node) else windows
    pick = window_argmax(raw)
    pick.checks = raw.checks             # an embedding's pending index check, as argmax's
    y = WindowMax.apply(windows, tape=tape, pick=pick)
    y = unbatch(y, batched, tape=tape)
    where = window_positions(pick, table)
    return y, (where if batched else where.reshape(where.shape[1:]))


def adaptive_avg_pool1d(x, output_size, *, tape=None):
    """``F.adaptive_avg_pool1d``: the mean of each adaptive window of ``(N, C, L)`` or
    ``(C, L)``; ``adaptive_avg_pool2d`` on an ``(N, C, 1, L)`` view.

    >>> tp.adaptive_avg_pool1d(x, 3).to_host()           # x [[[0, 1, ..., 9]]]
    array([[[1.5, 4.5, 7.5]]], dtype=float32)
    """
    refuse_empty_windows("adaptive_avg_pool1d", x, 1)
    (out,) = _sizes("adaptive_avg_pool1d", output_size, 1, (x.shape[-1],))
    x4, batched = _as_2d("adaptive_avg_pool1d", x, tape)
    return _back(adaptive_avg_pool2d(x4, (1, out), tape=tape), batched, tape)


def adaptive_max_pool1d(x, output_size, return_indices: bool = False, *, tape=None):
    """``F.adaptive_max_pool1d``: the largest element of each adaptive window of ``(N, C, L)``
    or ``(C, L)``; with ``return_indices=True`` also its position in ``L`` (int64, not
    recorded)."""
    op = "adaptive_max_pool1d"
    x3, batched = as_batched(op, x, "C, L", tape=tape)
    refuse_empty_windows(op, x3, 1)
    (out,) = _sizes(op, output_size, 1, x3.shape[2:])
    n, c = x3.shape[:2]
    picked, at = _gather(x3, 2, out, tape)
    windows = reshape(picked, (n, c, out, at.shape[1]), tape=tape)
    return _pick(windows, at, return_indices, batched, tape)


def adaptive_max_pool2d(x, output_size, return_indices: bool = False, *, tape=None):
    """``F.adaptive_max_pool2d``: the largest element of each adaptive window of
    ``(N, C, H, W)`` or ``(C, H, W)``; ``output_size`` an int or a pair (``None`` keeps that
    dim's size); with ``return_indices=True`` also its flat position ``h * W + w`` in its
    plane (int64, not recorded).

    >>> tp.adaptive_max_pool2d(x, (2, None)).shape       # x (2, 3, 7, 5)
    (2, 3, 2, 5)
    """
    op = "adaptive_max_pool2d"
    x4, batched = as_batched(op, x, "C, H, W", tape=tape)
    refuse_empty_windows(op, x4, 2)
    oh, ow = _sizes(op, output_size, 2, x4.shape[2:])
    n, c = x4.shape[:2]
    rows, at_h = _gather(x4, 2, oh, tape)
    picked, at_w = _gather(rows, 3, ow, tape)
    kh, kw = at_h.shape[1], at_w.shape[1]
    windows = reshape(picked, (n, c, oh, kh, ow, kw), tape=tape)
    if kh > 1 and ow > 1:                # (kh, kw) last, in row-major order: PyTorch's scan
        windows = permute(windows, (0, 1, 2, 4, 3, 5), tape=tape)
    windows = reshape(windows, (n, c, oh, ow, kh * kw), tape=tape)
    # window (i, j)'s element (a, b) is input (at_h[i, a], at_w[j, b]), flat h * W + w
    table = (at_h[:, None, :, None] * x4.shape[3] + at_w[None, :, None, :]).reshape(
        oh * ow, kh * kw)
    return _pick(windows, table, return_indices, batched, tape)
