"""PyTorch's other names for ops parcl has: the deprecated ``upsample``, ``upsample_nearest`` and
``upsample_bilinear`` (``interpolate``, with PyTorch's deprecation warning), and the
``*_with_indices`` pools (the pools with ``return_indices=True``), so code written against
``torch.nn.functional`` runs unchanged.

>>> y, at = tp.max_pool2d_with_indices(tp.tensor(np.arange(16.0).reshape(1, 1, 4, 4)), 2)
>>> at.to_host().ravel().tolist()
[5, 7, 13, 15]
"""

from __future__ import annotations

import warnings

from .adaptive import adaptive_max_pool1d, adaptive_max_pool2d
from .nn import max_pool2d
from .resample import interpolate
from .sequence import max_pool1d

__all__ = ["adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
           "max_pool1d_with_indices", "max_pool2d_with_indices", "upsample",
           "upsample_bilinear", "upsample_nearest"]


def _deprecated(name: str) -> None:
    warnings.warn(f"`nn.functional.{name}` is deprecated. Use `nn.functional.interpolate` "
                  "instead.", UserWarning, stacklevel=3)


def upsample(x, size=None, scale_factor=None, mode: str = "nearest",
             align_corners: bool | None = None, recompute_scale_factor: bool | None = None, *,
             tape=None):
    """``F.upsample``: ``tp.interpolate`` with PyTorch's deprecation warning."""
    _deprecated("upsample")
    return interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor,
                       tape=tape)


def upsample_nearest(x, size=None, scale_factor=None, *, tape=None):
    """``F.upsample_nearest``: ``tp.interpolate(mode="nearest")``, warned as PyTorch's."""
    _deprecated("upsample_nearest")
    return interpolate(x, size, scale_factor, "nearest", tape=tape)


def upsample_bilinear(x, size=None, scale_factor=None, *, tape=None):
    """``F.upsample_bilinear``: ``tp.interpolate(mode="bilinear", align_corners=True)``, warned
    as PyTorch's."""
    _deprecated("upsample_bilinear")
    return interpolate(x, size, scale_factor, "bilinear", align_corners=True, tape=tape)


def max_pool1d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode: bool = False, return_indices: bool = False, *,
                            tape=None):
    """``F.max_pool1d_with_indices``: ``(out, indices)`` of ``tp.max_pool1d`` whatever
    ``return_indices`` says, as PyTorch's."""
    return max_pool1d(x, kernel_size, stride, padding, dilation, ceil_mode, True, tape=tape)


def max_pool2d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode: bool = False, return_indices: bool = False, *,
                            tape=None):
    """``F.max_pool2d_with_indices``: ``(out, indices)`` of ``tp.max_pool2d``."""
    return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, True, tape=tape)


def adaptive_max_pool1d_with_indices(x, output_size, return_indices: bool = False, *,
                                     tape=None):
    """``F.adaptive_max_pool1d_with_indices``: ``(out, indices)`` of
    ``tp.adaptive_max_pool1d``."""
    return adaptive_max_pool1d(x, output_size, True, tape=tape)


def adaptive_max_pool2d_with_indices(x, output_size, return_indices: bool = False, *,
                                     tape=None):
    """``F.adaptive_max_pool2d_with_indices``: ``(out, indices)`` of
    ``tp.adaptive_max_pool2d``."""
    return adaptive_max_pool2d(x, output_size, True, tape=tape)
