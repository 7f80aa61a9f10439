"""3-D normalisation layers with PyTorch's arguments, parameter and buffer names:
``BatchNorm3d`` over ``(N, C, D, H, W)`` and ``InstanceNorm3d`` over ``(N, C, D, H, W)`` or
unbatched ``(C, D, H, W)``. The 2-D layers' ops take any ``(N, C, ...)`` layout (a channel's
positions are contiguous runs either way), so these are those layers with a 5-d input check.

>>> import parcl as pc
>>> list(pc.nn.BatchNorm3d(4).state_dict())
['weight', 'bias', 'running_mean', 'running_var']
"""

from __future__ import annotations

from ..errors import ShapeError
from .layers import BatchNorm2d
from .norm import _InstanceNorm

__all__ = ["BatchNorm3d", "InstanceNorm3d"]


class BatchNorm3d(BatchNorm2d):
    """``torch.nn.BatchNorm3d(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True)`` over ``(N, C, D, H, W)``: ``BatchNorm2d``'s statistics (each
    channel over ``N*D*H*W`` positions; running variance unbiased, ``momentum=None`` the
    cumulative average), parameters and state-dict names, and its fused ``residual``/``relu``
    epilogue."""

    def forward(self, x, *, residual=None, relu: bool = False,
                overwrite_residual: bool = False):
        shape = tuple(x.shape)
        if len(shape) != 5 or shape[1] != self.num_features:
            raise ShapeError(f"{self!r}: expected a 5-d input (N, {self.num_features}, D, H, "
                             f"W), got shape {shape}")
        return self._normalise(x, residual=residual, relu=relu,
                               overwrite_residual=overwrite_residual)


class InstanceNorm3d(_InstanceNorm):
    """``torch.nn.InstanceNorm3d(num_features, eps=1e-5, momentum=0.1, affine=False,
    track_running_stats=False)`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)``: each sample's
    channel normalised over its own ``D*H*W`` positions (see ``InstanceNorm2d``)."""

    _batched_ndim = 5
