"""``FractionalMaxPool2d``: max pooling over pseudo-random windows (``tp.fractional_max_pool2d``),
new windows on every call from the thread's seeded dropout generator.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> pool = pc.nn.FractionalMaxPool2d(3, output_ratio=(0.5, 0.5))
>>> pool(tp.tensor(np.ones((1, 1, 10, 10), np.float32))).shape
(1, 1, 5, 5)
"""

from __future__ import annotations

from ..errors import ParclError
from ..tape import Node, ops
from ..tensor import Tensor
from .module import Module

__all__ = ["FractionalMaxPool2d"]


class FractionalMaxPool2d(Module):
    """``FractionalMaxPool2d(kernel_size, output_size=None, output_ratio=None,
    return_indices=False, _random_samples=None)``: exactly one of ``output_size`` and
    ``output_ratio`` (each in (0, 1)), as PyTorch's; ``_random_samples`` ``(N, C, 2)`` fixes
    the windows."""

    def __init__(self, kernel_size, output_size=None, output_ratio=None,
                 return_indices: bool = False, _random_samples=None):
        super().__init__()
        if output_size is None and output_ratio is None:
            raise ParclError("FractionalMaxPool2d requires specifying either an output size, "
                             "or a pooling ratio")
        if output_size is not None and output_ratio is not None:
            raise ParclError("FractionalMaxPool2d: only one of output_size and output_ratio "
                             "may be specified")
        if output_ratio is not None:
            ratio = (output_ratio, output_ratio) if isinstance(output_ratio, (int, float)) \
                else tuple(output_ratio)
            if not all(0 < float(r) < 1 for r in ratio):
                raise ParclError(f"FractionalMaxPool2d: output_ratio must be between 0 and 1 "
                                 f"(got {output_ratio!r})")
        self.kernel_size, self.output_size = kernel_size, output_size
        self.output_ratio, self.return_indices = output_ratio, bool(return_indices)
        samples = _random_samples.value if isinstance(_random_samples, Node) else _random_samples
        if isinstance(samples, Tensor):
            # a buffer, as PyTorch's: its state dict holds the windows' samples
            self.register_buffer("_random_samples", samples)
        else:
            self._random_samples = samples        # None (new windows per call) or an array

    def forward(self, x):
        return ops.fractional_max_pool2d(x, self.kernel_size, self.output_size,
                                         self.output_ratio, self.return_indices,
                                         self._random_samples)
