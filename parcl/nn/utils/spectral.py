"""The arithmetic of spectral normalisation, shared by ``parametrizations.spectral_norm`` and
the older ``spectral_norm`` (``legacy_norm``): the weight as a matrix, the starting ``u`` and
``v``, the power iteration on them and the weight divided by ``sigma = u . (W v)``.

>>> import numpy as np
>>> w = tp.tensor(np.diag([3.0, 1.0]).astype(np.float32))
>>> u, v = start_vectors(w.queue, (2, 2), 1e-12)
>>> power_iteration(w, u, v, 20, 1e-12)
>>> round(float(divided_by_sigma(w, w, u, v).to_host()[0, 0]), 4)
1.0
"""

from __future__ import annotations

from ... import tape as tp
from ...tensor import Tensor
from ..conv import ConvTranspose1d, ConvTranspose2d
from ..conv3d import ConvTranspose3d
from ..module import Module, normal_


def default_dim(module: Module) -> int:
    """The weight dim of the output channels: 1 for transposed convolutions, else 0."""
    return 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0


def as_matrix(weight, dim: int):
    """``weight`` as a matrix: dim ``dim`` first, the others flattened."""
    if dim != 0:
        weight = tp.permute(weight, (dim,) + tuple(d for d in range(len(weight.shape))
                                                   if d != dim))
    return tp.reshape(weight, (weight.shape[0], -1))


def start_vectors(queue, shape: tuple, eps: float) -> tuple[Tensor, Tensor]:
    """``u`` and ``v`` for a matrix of ``shape``: normalised draws of the seeded generator."""
    h, w = shape
    with tp.no_grad():
        u = tp.normalize(Tensor.from_host(queue, normal_((h,), 1.0)), dim=0, eps=eps)
        v = tp.normalize(Tensor.from_host(queue, normal_((w,), 1.0)), dim=0, eps=eps)
    return u, v


def power_iteration(mat, u: Tensor, v: Tensor, steps: int, eps: float,
                    v_first: bool = False) -> None:
    """``u = normalize(W v)``, then ``v = normalize(W^T u)``, ``steps`` times, into ``u`` and
    ``v``; ``v_first``: ``v`` then ``u``, the older API's order."""
    with tp.no_grad():
        m = mat if isinstance(mat, Tensor) else mat.value
        for _ in range(steps):
            if v_first:
                v.copy_(tp.normalize(tp.matmul(tp.t(m), u), dim=0, eps=eps))
            u.copy_(tp.normalize(tp.matmul(m, v), dim=0, eps=eps))
            if not v_first:
                v.copy_(tp.normalize(tp.matmul(tp.t(m), u), dim=0, eps=eps))


def divided_by_sigma(weight, mat, u: Tensor, v: Tensor):
    """``weight / sigma``, ``sigma = u . (mat v)`` (``mat``: ``weight`` as a matrix), on copies
    of ``u`` and ``v``: the next read's power iteration overwrites the buffers in place, and
    this read's backward needs its own."""
    u, v = u.copy(), v.copy()
    return weight / tp.sum(u * tp.matmul(mat, v))
