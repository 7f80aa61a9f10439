"""PyTorch's lazy layers: ``LazyLinear``, ``LazyConv1d``, ``LazyConv2d``,
``LazyConvTranspose1d``, ``LazyConvTranspose2d``, ``LazyBatchNorm1d``/``2d``/``3d`` and
``LazyInstanceNorm1d``/``2d``/``3d`` take every argument but the input size, which the first
call reads from its input (the last dim for ``Linear``, the channel dim for the others). That
call builds the layer it becomes, drawing its parameters from the thread's seeded generator
then, as constructing that layer there would, and the module turns into it (its class too,
PyTorch's ``cls_to_become``). Until then it has no parameters: run a batch through it before
building an optimizer, a ``ReplicaGroup`` or loading a state dict, as PyTorch's dry run.

>>> import numpy as np, parcl as pc, parcl.tape as tp
>>> layer = pc.nn.LazyLinear(3)
>>> layer(tp.tensor(np.ones((2, 5), np.float32))).shape
(2, 3)
>>> type(layer).__name__, layer.weight.shape
('Linear', (3, 5))
"""

from __future__ import annotations

from ..errors import ShapeError
from .conv import Conv1d, ConvTranspose1d, ConvTranspose2d
from .layers import BatchNorm2d, Conv2d, Linear
from .module import Module
from .norm import BatchNorm1d, InstanceNorm1d, InstanceNorm2d
from .norm3d import BatchNorm3d, InstanceNorm3d

__all__ = ["LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyConv1d", "LazyConv2d",
           "LazyConvTranspose1d", "LazyConvTranspose2d", "LazyInstanceNorm1d",
           "LazyInstanceNorm2d", "LazyInstanceNorm3d", "LazyLinear"]


class LazyModuleMixin(Module):
    """A layer whose input size comes from its first call: ``cls_to_become`` built then with
    that size first and the arguments given here after it."""

    cls_to_become: type = Module
    spatial = 0                   # the channel dim is -(spatial + 1) (-1: Linear's features)

    def __init__(self, *args, queue=None, **kwargs):
        super().__init__()
        self._lazy = (args, kwargs, queue)

    def has_uninitialized_params(self) -> bool:
        """True until the first call has built the layer (PyTorch's)."""
        return True

    def reset_parameters(self) -> None:
        """Nothing before the first call, as PyTorch's lazy layers: there are no parameters
        yet, and the first call draws them as the constructor of ``cls_to_become`` does
        (after it the layer is that class, whose ``reset_parameters`` draws them again)."""

    def input_size(self, x) -> int:
        """The size the first input gives: its dim ``-(spatial + 1)``."""
        shape = tuple(x.shape)
        if len(shape) < self.spatial + 1:
            raise ShapeError(f"{type(self).__name__}: expected an input with at least "
                             f"{self.spatial + 1} dims to infer its size from, got shape "
                             f"{shape}")
        return shape[-(self.spatial + 1)]

    def initialize_parameters(self, x) -> None:
        """Build ``cls_to_become`` for ``x`` and become it (parameters, buffers, class)."""
        args, kwargs, queue = self._lazy
        built = self.cls_to_become(self.input_size(x), *args, **kwargs,
                                   queue=queue if queue is not None else x.queue)
        training = self.training
        # the hooks and attributes set on it stay, as PyTorch's module stays the same object
        del self.__dict__["_lazy"]
        self.__dict__.update(built.__dict__)
        self.__class__ = self.cls_to_become
        self.train(training)

    def forward(self, x, *args, **kwargs):
        self.initialize_parameters(x)
        # the new class's forward itself: this call's hooks run around it already
        return self.forward(x, *args, **kwargs)

    def extra_repr(self) -> str:
        args, kwargs, _ = self._lazy
        return ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])


class LazyLinear(LazyModuleMixin):
    """``LazyLinear(out_features, bias=True)``: a ``Linear`` whose ``in_features`` is the
    first input's last dim."""

    cls_to_become = Linear


class LazyConv1d(LazyModuleMixin):
    """``LazyConv1d(out_channels, kernel_size, ...)``: ``Conv1d``'s arguments after
    ``in_channels``, read from the first input (``(N, C, L)`` or ``(C, L)``)."""

    cls_to_become, spatial = Conv1d, 1


class LazyConv2d(LazyModuleMixin):
    """``LazyConv2d(out_channels, kernel_size, ...)``: ``Conv2d``'s arguments after
    ``in_channels``."""

    cls_to_become, spatial = Conv2d, 2


class LazyConvTranspose1d(LazyModuleMixin):
    """``LazyConvTranspose1d(out_channels, kernel_size, ...)``."""

    cls_to_become, spatial = ConvTranspose1d, 1


class LazyConvTranspose2d(LazyModuleMixin):
    """``LazyConvTranspose2d(out_channels, kernel_size, ...)``."""

    cls_to_become, spatial = ConvTranspose2d, 2


class _LazyBatchNorm(LazyModuleMixin):
    """The batch norms' ``num_features`` is the channel dim, 1."""

    def input_size(self, x) -> int:
        shape = tuple(x.shape)
        if len(shape) < 2:
            raise ShapeError(f"{type(self).__name__}: expected an (N, C, ...) input to infer "
                             f"num_features from, got shape {shape}")
        return shape[1]


class LazyBatchNorm1d(_LazyBatchNorm):
    """``LazyBatchNorm1d(eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``."""

    cls_to_become = BatchNorm1d


class LazyBatchNorm2d(_LazyBatchNorm):
    """``LazyBatchNorm2d(eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``."""

    cls_to_become = BatchNorm2d


class LazyBatchNorm3d(_LazyBatchNorm):
    """``LazyBatchNorm3d(eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``."""

    cls_to_become = BatchNorm3d


class _LazyInstanceNorm(LazyModuleMixin):
    """PyTorch's lazy instance norms default to ``affine=True, track_running_stats=True``,
    unlike the instance norms themselves (kept, so code moving between them matches)."""

    def __init__(self, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, *, bias: bool = True, queue=None):
        super().__init__(eps, momentum, affine, track_running_stats, bias=bias, queue=queue)


class LazyInstanceNorm1d(_LazyInstanceNorm):
    """``LazyInstanceNorm1d(eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``
    (PyTorch's defaults; ``(N, C, L)`` or ``(C, L)``)."""

    cls_to_become, spatial = InstanceNorm1d, 1


class LazyInstanceNorm2d(_LazyInstanceNorm):
    """``LazyInstanceNorm2d(...)`` (``(N, C, H, W)`` or ``(C, H, W)``)."""

    cls_to_become, spatial = InstanceNorm2d, 2


class LazyInstanceNorm3d(_LazyInstanceNorm):
    """``LazyInstanceNorm3d(...)`` (``(N, C, D, H, W)`` or ``(C, D, H, W)``)."""

    cls_to_become, spatial = InstanceNorm3d, 3
