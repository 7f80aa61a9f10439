"""Normalisation layers: ``LayerNorm``, ``RMSNorm``, ``GroupNorm``, ``BatchNorm1d``,
``InstanceNorm1d``/``InstanceNorm2d`` and ``LocalResponseNorm`` (no parameters), with
PyTorch's arguments, parameter names and initialisation (weight 1, bias 0).

>>> import parcl as pc
>>> ln = pc.nn.LayerNorm(16)
>>> list(ln.state_dict())
['weight', 'bias']
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..runtime import default_queue
from ..tape import ops
from ..tape.ops.instance import normalize_instances
from ..tensor import Tensor, dims
from .layers import BatchNorm2d, _check_sizes, _NormBase, ones_and_zeros
from .module import Module, Parameter

__all__ = ["BatchNorm1d", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "LayerNorm",
           "LocalResponseNorm", "RMSNorm"]


def _shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    return dims("normalized_shape", normalized_shape)


def _filled(queue, shape, value: float) -> Parameter:
    return Parameter(Tensor.full(queue, shape, value))


class LayerNorm(Module):
    """``torch.nn.LayerNorm``: normalises over the trailing ``normalized_shape`` dims, then
    ``* weight + bias`` (``weight`` 1 and ``bias`` 0 of ``normalized_shape``; none with
    ``elementwise_affine=False``, no bias with ``bias=False``).

    >>> ln = pc.nn.LayerNorm((8,), eps=1e-6)
    >>> ln.weight.shape
    (8,)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        self.normalized_shape = _shape(normalized_shape)
        self.eps, self.elementwise_affine = float(eps), bool(elementwise_affine)
        self.weight = _filled(queue, self.normalized_shape, 1.0) if elementwise_affine \
            else None
        self.bias = _filled(queue, self.normalized_shape, 0.0) if elementwise_affine and bias \
            else None

    def reset_parameters(self) -> None:
        """``weight`` 1 and ``bias`` 0 again, in place, as PyTorch's."""
        ones_and_zeros(self)

    def forward(self, x):
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Module):
    """``torch.nn.RMSNorm``: ``x / sqrt(mean(x**2) + eps) * weight`` over the trailing
    ``normalized_shape`` dims; ``eps=None`` is ``torch.finfo(torch.float32).eps``; ``weight``
    1 (none with ``elementwise_affine=False``).

    >>> pc.nn.RMSNorm(8).weight.shape
    (8,)
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, *, queue=None):
        super().__init__()
        queue = queue if queue is not None else default_queue()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = _filled(queue, self.normalized_shape, 1.0) if elementwise_affine \
            else None

    def reset_parameters(self) -> None:
        """``weight`` 1 and ``bias`` 0 again, in place, as PyTorch's."""
        ones_and_zeros(self)

    def forward(self, x):
        return ops.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """``torch.nn.GroupNorm``: ``(N, C, *)`` inputs normalised over groups of
    ``num_channels // num_groups`` channels, then a per-channel ``weight`` (1) and ``bias``
    (0) when ``affine``.

    >>> pc.nn.GroupNorm(2, 6).bias.shape
    (6,)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, *, queue=None):
        super().__init__()
        _check_sizes("GroupNorm", {"num_groups": num_groups, "num_channels": num_channels})
        queue = queue if queue is not None else default_queue()
        self.num_groups, self.num_channels = int(num_groups), int(num_channels)
        if self.num_channels % self.num_groups:
            raise ShapeError(f"GroupNorm: num_channels={num_channels} is not divisible by "
                             f"num_groups={num_groups}")
        self.eps, self.affine = float(eps), bool(affine)
        c = self.num_channels
        self.weight = _filled(queue, (c,), 1.0) if affine else None
        self.bias = _filled(queue, (c,), 0.0) if affine else None

    def reset_parameters(self) -> None:
        """``weight`` 1 and ``bias`` 0 again, in place, as PyTorch's."""
        ones_and_zeros(self)

    def forward(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ShapeError(f"{self!r}: expected input (N, {self.num_channels}, *), got shape "
                             f"{tuple(x.shape)}")
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class BatchNorm1d(BatchNorm2d):
    """``torch.nn.BatchNorm1d`` over ``(N, C)`` or ``(N, C, L)`` inputs: ``BatchNorm2d``'s op
    and kernels (they take any ``(N, C, ...)`` layout), the same parameters, running
    statistics (running variance unbiased) and state-dict names.

    >>> pc.nn.BatchNorm1d(4).running_var.to_host()
    array([1., 1., 1., 1.], dtype=float32)
    """

    def forward(self, x):
        shape = tuple(x.shape)
        if len(shape) not in (2, 3) or shape[1] != self.num_features:
            raise ShapeError(f"{self!r}: expected input (N, {self.num_features}) or "
                             f"(N, {self.num_features}, L), got shape {shape}")
        return self._normalise(x)


class _InstanceNorm(_NormBase):
    """PyTorch's ``_InstanceNorm``: each sample's channel normalised over its own positions
    (``tp.group_norm`` with one group per channel), then ``* weight + bias`` (1 and 0) with
    ``affine``. With ``track_running_stats`` training also updates ``running_mean`` and
    ``running_var`` (the samples' means and unbiased variances averaged over the batch,
    weighed by ``momentum``; None is 0, as PyTorch), and evaluation normalises with them
    (with the flag set False later, with the input's, as PyTorch's).
    ``bias=False`` (keyword, as PyTorch's) drops the bias of an affine layer."""

    _batched_ndim = 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = False, track_running_stats: bool = False, *, bias: bool = True,
                 queue=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, bias, queue)

    def forward(self, x):
        n = self._batched_ndim
        shape = tuple(x.shape)
        if len(shape) not in (n - 1, n) or shape[len(shape) - n + 1] != self.num_features:
            raise ShapeError(f"{self!r}: expected input (N, {self.num_features}, ...) of {n} "
                             f"dims or ({self.num_features}, ...) of {n - 1}, got shape {shape}")
        if len(shape) == n - 1:
            return ops.squeeze(self.forward(ops.unsqueeze(x, 0)), 0)
        # PyTorch's rule reads the flag, not the buffers: with track_running_stats set False
        # later (the buffers kept) evaluation uses the input's statistics and, as there, still
        # moves the running ones
        use_input_stats = self.training or not self.track_running_stats \
            or self.running_mean is None
        return normalize_instances(repr(self), x, self.running_mean, self.running_var,
                                   self.weight, self.bias, use_input_stats, self.momentum,
                                   self.eps)


class InstanceNorm1d(_InstanceNorm):
    """``torch.nn.InstanceNorm1d`` over ``(N, C, L)`` or unbatched ``(C, L)``.

    >>> pc.nn.InstanceNorm1d(4, affine=True).weight.shape
    (4,)
    """

    _batched_ndim = 3


class InstanceNorm2d(_InstanceNorm):
    """``torch.nn.InstanceNorm2d`` over ``(N, C, H, W)`` or unbatched ``(C, H, W)``.

    >>> list(pc.nn.InstanceNorm2d(4, track_running_stats=True).state_dict())
    ['running_mean', 'running_var']
    """

    _batched_ndim = 4


class LocalResponseNorm(Module):
    """``LocalResponseNorm(size, alpha=1e-4, beta=0.75, k=1.0)``: ``tp.local_response_norm``,
    each element over ``(k + alpha * mean of x**2 across size neighbouring channels) ** beta``
    (AlexNet's); inputs ``(N, C, *)``."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        _check_sizes("LocalResponseNorm", {"size": size})
        self.size, self.alpha, self.beta, self.k = int(size), float(alpha), float(beta), float(k)

    def forward(self, x):
        return ops.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
