"""Resampling layers: ``Upsample`` (``UpsamplingNearest2d``, ``UpsamplingBilinear2d``),
``PixelShuffle`` and ``PixelUnshuffle``, PyTorch's, over ``tp.interpolate`` and the pixel
shuffles; no parameters.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> up = pc.nn.Upsample(scale_factor=2, mode="bilinear")
>>> up
Upsample(scale_factor=2.0, mode='bilinear')
>>> up(tp.tensor(np.zeros((1, 3, 4, 5), np.float32))).shape
(1, 3, 8, 10)
"""

from __future__ import annotations

from ..tape import ops
from .module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle", "Upsample", "UpsamplingBilinear2d",
           "UpsamplingNearest2d"]


class Upsample(Module):
    """``torch.nn.Upsample``: ``tp.interpolate`` with the layer's ``size`` or
    ``scale_factor`` (a single number kept as a float, as PyTorch), ``mode`` and
    ``align_corners``."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest",
                 align_corners: bool | None = None, recompute_scale_factor: bool | None = None):
        super().__init__()
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode, self.align_corners = mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return ops.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                               recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        info = (f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None
                else f"size={self.size!r}")
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """``torch.nn.UpsamplingNearest2d``: ``Upsample(size, scale_factor, mode="nearest")``."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """``torch.nn.UpsamplingBilinear2d``: ``Upsample(size, scale_factor, mode="bilinear",
    align_corners=True)``."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)


class PixelShuffle(Module):
    """``torch.nn.PixelShuffle``: ``(*, C * r**2, H, W)`` to ``(*, C, H * r, W * r)``
    (``tp.pixel_shuffle``)."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x):
        return ops.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """``torch.nn.PixelUnshuffle``: ``(*, C, H * r, W * r)`` to ``(*, C * r**2, H, W)``
    (``tp.pixel_unshuffle``)."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x):
        return ops.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"
