"""PyTorch's ``local_response_norm`` (AlexNet's): each element divided by
``(k + alpha * mean of x**2 over size neighbouring channels) ** beta``, composed as PyTorch
composes it (the squares padded with ``size // 2`` zero channels before and ``(size - 1) // 2``
after, averaged by ``avg_pool2d`` over ``(size, 1)`` windows of an ``(N, 1, C, rest)`` view), so
its values and gradient match PyTorch's.

>>> x = tp.tensor(np.ones((1, 3, 1), np.float32))
>>> tp.local_response_norm(x, 2, alpha=1.0, beta=1.0, k=1.0).to_host().ravel()
array([0.6666667, 0.5      , 0.5      ], dtype=float32)
"""

from __future__ import annotations

from math import prod

import numpy as np

from ...errors import ShapeError
from .elementwise import add, div, mul, pow
from .indexing import pad
from .mathops import square
from .nn import avg_pool2d
from .shape import reshape

__all__ = ["local_response_norm"]


def local_response_norm(x, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0,
                        *, tape=None):
    """``F.local_response_norm`` over the channels (dim 1) of an ``(N, C, *)`` input."""
    shape = tuple(x.shape)
    if len(shape) < 3:
        raise ShapeError(f"local_response_norm: expected an (N, C, *) input of 3 or more dims, "
                         f"got shape {shape}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ShapeError(f"local_response_norm: size must be a positive integer, got {size!r}")
    n, c, rest = shape[0], shape[1], prod(shape[2:])
    squares = reshape(square(x, tape=tape), (n, 1, c, rest), tape=tape)
    squares = pad(squares, (0, 0, size // 2, (size - 1) // 2), tape=tape)
    mean = avg_pool2d(squares, (int(size), 1), stride=1, tape=tape)
    scale = pow(add(mul(mean, float(alpha), tape=tape), float(k), tape=tape), float(beta),
                tape=tape)
    return div(x, reshape(scale, shape, tape=tape), tape=tape)
