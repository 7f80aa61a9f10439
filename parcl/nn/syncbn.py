"""``SyncBatchNorm``: batch normalisation whose training statistics are the global batch's in a
``ReplicaGroup`` (every replica's batch, and every rank's through its ``comm``), as PyTorch's
under DDP; anywhere else a plain batch norm, as PyTorch's on one process.

It asks ``tp.batch_norm`` for the group's exchange (``sync=True``); a group whose model holds a
``SyncBatchNorm`` sets that exchange up (``parcl.replica_stats``), the one
``ReplicaGroup(sync_batchnorm=True)`` uses for every batch norm: no second mechanism.
``SyncBatchNorm.convert_sync_batchnorm(model)`` swaps a model's batch norms for it.

>>> import parcl as pc
>>> model = pc.nn.Sequential(pc.nn.Conv2d(3, 4, 3), pc.nn.BatchNorm2d(4), pc.nn.ReLU())
>>> model = pc.nn.SyncBatchNorm.convert_sync_batchnorm(model)
>>> type(model[1]).__name__
'SyncBatchNorm'
"""

from __future__ import annotations

from ..errors import ParclError, ShapeError
from .layers import BatchNorm2d
from .module import Module

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(BatchNorm2d):
    """``SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True, process_group=None)``: ``BatchNorm2d``'s parameters, buffers,
    initialisation and state-dict names over any ``(N, C, *)`` input; while training inside a
    ``ReplicaGroup`` it normalises with the statistics of the group's global batch (running
    statistics too), elsewhere with its own batch's. ``process_group`` must be None: the group
    is the replica group it runs in."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group=None, *, bias: bool = True, queue=None):
        if process_group is not None:
            raise ParclError("SyncBatchNorm: process_group is not supported; a SyncBatchNorm "
                             "syncs over the ReplicaGroup it runs in (and that group's comm)")
        super().__init__(num_features, eps, momentum, affine, track_running_stats, bias=bias,
                         queue=queue)
        self.process_group = None

    def forward(self, x, *, residual=None, relu: bool = False,
                overwrite_residual: bool = False):
        """``bn(x)``, with ``BatchNorm2d``'s fused ``relu(bn(x) + residual)`` (a converted
        ResNet block's)."""
        shape = tuple(x.shape)
        if len(shape) < 2:
            raise ShapeError(f"{self!r}: expected at least 2D input (got {len(shape)}D input, "
                             f"shape {shape})")
        if shape[1] != self.num_features:
            raise ShapeError(f"{self!r}: input has {shape[1]} features/channels at dim 1 "
                             f"(shape {shape}), expected {self.num_features}")
        # evaluation never exchanges, as PyTorch's (not even without running statistics,
        # where it normalises with its own batch's)
        return self._normalise(x, sync=self.training, residual=residual, relu=relu,
                               overwrite_residual=overwrite_residual)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group=None) -> Module:
        """``module`` with every ``BatchNorm1d``/``2d``/``3d`` in it (itself too) replaced by
        a ``SyncBatchNorm`` holding the same parameters and buffers (the same objects, as
        PyTorch's) and ``training`` flag; returns the module (a new one if ``module`` itself
        was a batch norm)."""
        if process_group is not None:
            raise ParclError("SyncBatchNorm.convert_sync_batchnorm: process_group is not "
                             "supported; a SyncBatchNorm syncs over the ReplicaGroup it runs in")
        out = module
        if isinstance(module, BatchNorm2d) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, bias=module.bias is not None,
                      queue=module.queue)
            # the same Parameter and buffer objects: an optimizer built on the old model and
            # tied references keep working, as PyTorch's
            out.weight, out.bias = module.weight, module.bias
            for name, buffer in module.named_buffers(recurse=False):
                out.register_buffer(name, buffer)
            out.training = module.training
        for name, child in list(module.named_children()):
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out
