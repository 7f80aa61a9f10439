"""PyTorch's adaptive pools beyond ``adaptive_avg_pool2d`` (in ``nn``): ``adaptive_avg_pool1d``
(that op on an ``(N, C, 1, L)`` view) and ``adaptive_max_pool1d``/``adaptive_max_pool2d``.

An adaptive window ``i`` of ``n`` inputs into ``out`` covers ``[floor(i*n/out),
ceil((i+1)*n/out))`` (PyTorch's bins; neighbours overlap when ``out`` does not divide ``n``).
The max pools gather every window's positions with ``index_select`` (a short window repeats
its last position, which changes no maximum) and take ``max`` over them: the gradient goes to
the first maximal element of each window in row-major order, as PyTorch's, and positions in
several windows sum their gradients in a fixed order. Where ``out`` divides ``n`` the gather is
skipped (the windows are a reshape).

>>> x = tp.tensor(np.arange(10, dtype=np.float32).reshape(1, 1, 10))
>>> tp.adaptive_max_pool1d(x, 3).to_host()
array([[[3., 6., 9.]]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...tensor import Tensor
from .nn import adaptive_avg_pool2d
from .picks import index_select
from .reductions import max
from .sequence import _as_2d, _back
from .shape import permute, reshape, squeeze, unsqueeze

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
    """``x`` with dim ``axis`` replaced by its ``out`` windows laid end to end; and ``k``."""
    n = x.shape[axis]
    at, k = _windows(n, out)
    if out * k == n and np.array_equal(at.ravel(), np.arange(n)):
        return x, k                                  # non-overlapping, equal: a reshape
    return index_select(x, axis, Tensor.from_host(x.queue, at.ravel()), tape=tape), k


def _batched(op: str, x, spatial: int, tape):
    shape = tuple(x.shape)
    if len(shape) not in (spatial + 1, spatial + 2):
        raise ShapeError(f"{op}: expected a {spatial + 1}-d (unbatched) or {spatial + 2}-d "
                         f"input, got shape {shape}")
    batched = len(shape) == spatial + 2
    return (x if batched else unsqueeze(x, 0, tape=tape)), batched


def _no_indices(op: str, return_indices: bool) -> None:
    if return_indices:
        raise ShapeError(f"{op}: return_indices=True is not supported")


def adaptive_avg_pool1d(x, output_size, *, tape=None):
    """``F.adaptive_avg_pool1d``: the mean of each adaptive window of ``(N, C, L)`` or
    ``(C, L)``; ``adaptive_avg_pool2d`` on an ``(N, C, 1, L)`` view.

    >>> tp.adaptive_avg_pool1d(x, 3).to_host()           # x [[[0, 1, ..., 9]]]
    array([[[1.5, 4.5, 7.5]]], dtype=float32)
    """
    (out,) = _sizes("adaptive_avg_pool1d", output_size, 1, (x.shape[-1],))
    x4, batched = _as_2d("adaptive_avg_pool1d", x, tape)
    return _back(adaptive_avg_pool2d(x4, (1, out), tape=tape), batched, tape)


def adaptive_max_pool1d(x, output_size, return_indices: bool = False, *, tape=None):
    """``F.adaptive_max_pool1d``: the largest element of each adaptive window of ``(N, C, L)``
    or ``(C, L)``. ``return_indices=True`` is refused."""
    op = "adaptive_max_pool1d"
    _no_indices(op, return_indices)
    x3, batched = _batched(op, x, 1, tape)
    (out,) = _sizes(op, output_size, 1, x3.shape[2:])
    n, c = x3.shape[:2]
    picked, k = _gather(x3, 2, out, tape)
    y = max(reshape(picked, (n, c, out, k), tape=tape), axis=-1, tape=tape)
    return y if batched else squeeze(y, 0, tape=tape)


def adaptive_max_pool2d(x, output_size, return_indices: bool = False, *, tape=None):
    """``F.adaptive_max_pool2d``: the largest element of each adaptive window of
    ``(N, C, H, W)`` or ``(C, H, W)``; ``output_size`` an int or a pair (``None`` keeps that
    dim's size). ``return_indices=True`` is refused.

    >>> tp.adaptive_max_pool2d(x, (2, None)).shape       # x (2, 3, 7, 5)
    (2, 3, 2, 5)
    """
    op = "adaptive_max_pool2d"
    _no_indices(op, return_indices)
    x4, batched = _batched(op, x, 2, tape)
    oh, ow = _sizes(op, output_size, 2, x4.shape[2:])
    n, c = x4.shape[:2]
    rows, kh = _gather(x4, 2, oh, tape)
    picked, kw = _gather(rows, 3, ow, tape)
    windows = reshape(picked, (n, c, oh, kh, ow, kw), tape=tape)
    if kh > 1 and ow > 1:                # (kh, kw) last, in row-major order: PyTorch's scan
        windows = permute(windows, (0, 1, 2, 4, 3, 5), tape=tape)
    y = max(reshape(windows, (n, c, oh, ow, kh * kw), tape=tape), axis=-1, tape=tape)
    return y if batched else squeeze(y, 0, tape=tape)
