"""Folding an evaluation-mode BatchNorm into the convolution or linear layer before it, as
``torch.nn.utils.fusion``: ``fuse_conv_bn_eval``, ``fuse_linear_bn_eval`` and the functions on
the bare weights they use. With ``s = bn.weight / sqrt(running_var + eps)``::

    weight' = weight * s (per output channel);  bias' = (bias - running_mean) * s + bn.bias

so that ``layer'(x) == bn(layer(x))`` in evaluation, with one layer less to run. Computed on
the device, in PyTorch's order of operations.

>>> conv, bn = pc.nn.Conv2d(3, 8, 3).eval(), pc.nn.BatchNorm2d(8).eval()
>>> fused = pc.nn.utils.fuse_conv_bn_eval(conv, bn)    # a new Conv2d; conv is unchanged
"""

from __future__ import annotations

from ... import tape as tp
from ...errors import ParclError, ShapeError
from ...tensor import Tensor
from ..module import Module, Parameter
from ..clone import clone_module

__all__ = ["FusionError", "fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
           "fuse_linear_bn_weights"]


class FusionError(ParclError, ValueError):
    """Layers that cannot be fused: one in training mode, or a BatchNorm without running
    statistics."""


def _value(t) -> Tensor | None:
    return t.value if hasattr(t, "value") and not isinstance(t, Tensor) else t


def _requires_grad(t) -> bool:
    return bool(getattr(t, "requires_grad", False))


def _defaults(op: str, bias, bn_rm, bn_w, bn_b, bias_shape: tuple | None = None):
    """PyTorch's stand-ins for absent tensors: a zero bias (of ``bias_shape``, by default the
    BatchNorm's), a BatchNorm weight of ones and a bias of zeros."""
    queue, shape = bn_rm.queue, tuple(bn_rm.shape)
    bias = Tensor.zeros(queue, bias_shape or shape) if bias is None else bias
    bn_w = Tensor.full(queue, shape, 1.0) if bn_w is None else bn_w
    bn_b = Tensor.zeros(queue, shape) if bn_b is None else bn_b
    for name, t in (("bn weight", bn_w), ("bn bias", bn_b)):
        if tuple(t.shape) != shape:
            raise ShapeError(f"{op}: {name} of shape {tuple(t.shape)} does not match the "
                             f"running mean's {shape}")
    return bias, bn_w, bn_b


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps: float, bn_w, bn_b,
                         transpose: bool = False) -> tuple[Parameter, Parameter]:
    """The fused convolution's ``(weight, bias)`` Parameters, as PyTorch's: the weight scaled
    along its output-channel dim (dim 0; dim 1 with ``transpose``, a transposed
    convolution's); each keeps ``requires_grad`` of the conv tensor it came from (an absent
    bias gives one that does not require it, as PyTorch's)."""
    op = "fuse_conv_bn_weights"
    w, rm, rv = _value(conv_w), _value(bn_rm), _value(bn_rv)
    b, bw, bb = _defaults(op, _value(conv_b), rm, _value(bn_w), _value(bn_b))
    channels = w.shape[1 if transpose else 0] if w.ndim >= 2 else None
    if channels != rm.shape[0]:
        raise ShapeError(f"{op}: a weight of shape {tuple(w.shape)} has "
                         f"{channels} output channels (dim {1 if transpose else 0}), the "
                         f"BatchNorm {rm.shape[0]}")
    shape = ((1, -1) if transpose else (-1, 1)) + (1,) * (w.ndim - 2)
    with tp.no_grad():
        inv = tp.rsqrt(rv + float(bn_eps))
        fused_w = w * tp.reshape(bw * inv, shape)
        fused_b = (b - rm) * inv * bw + bb
    return (Parameter(fused_w, _requires_grad(conv_w)),
            Parameter(fused_b, _requires_grad(conv_b)))


def fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps: float, bn_w, bn_b
                           ) -> tuple[Parameter, Parameter]:
    """The fused linear layer's ``(weight, bias)`` Parameters, as PyTorch's: each row of the
    weight scaled by its feature's factor (a BatchNorm of one feature scales them all)."""
    op = "fuse_linear_bn_weights"
    w, rm, rv = _value(linear_w), _value(bn_rm), _value(bn_rv)
    # a zero bias of one per output feature (PyTorch's has the BatchNorm's shape, one where
    # a BatchNorm of one feature scales them all)
    b, bw, bb = _defaults(op, _value(linear_b), rm, _value(bn_w), _value(bn_b),
                          bias_shape=(w.shape[0],))
    with tp.no_grad():
        scale = bw * tp.rsqrt(rv + float(bn_eps))
        fused_w = w * tp.unsqueeze(scale, -1)
        fused_b = (b - rm) * scale + bb
    return (Parameter(fused_w, _requires_grad(linear_w)),
            Parameter(fused_b, _requires_grad(linear_b)))


def _check_eval(op: str, layer: Module, bn: Module) -> None:
    if layer.training or bn.training:
        raise FusionError(f"{op}: fusion is for evaluation only; call .eval() on both "
                          f"{type(layer).__name__} and {type(bn).__name__} first (training "
                          f"normalises with the batch's statistics, which no fixed weight "
                          f"can fold)")
    if bn.running_mean is None or bn.running_var is None:
        raise FusionError(f"{op}: {type(bn).__name__} keeps no running statistics "
                          "(track_running_stats=False), so there is nothing to fold")


def fuse_conv_bn_eval(conv: Module, bn: Module, transpose: bool = False) -> Module:
    """A new convolution (a copy of ``conv``, see ``pc.nn.clone_module``) equal to ``bn(conv(x))``
    in evaluation; both must be in evaluation mode. ``transpose=True`` for a transposed
    convolution (its weight's output channels are dim 1).

    >>> fused = pc.nn.utils.fuse_conv_bn_eval(conv.eval(), bn.eval())   # doctest: +SKIP
    """
    _check_eval("fuse_conv_bn_eval", conv, bn)
    fused = clone_module(conv)
    fused.weight, fused.bias = fuse_conv_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias,
        transpose)
    return fused


def fuse_linear_bn_eval(linear: Module, bn: Module) -> Module:
    """A new ``Linear`` (a copy of ``linear``) equal to ``bn(linear(x))`` in evaluation;
    ``bn`` must have ``linear.out_features`` features, or one."""
    _check_eval("fuse_linear_bn_eval", linear, bn)
    if linear.out_features != bn.num_features and bn.num_features != 1:
        raise ShapeError(f"fuse_linear_bn_eval: the BatchNorm has {bn.num_features} features; "
                         f"to fuse it needs linear.out_features={linear.out_features} or 1")
    fused = clone_module(linear)
    fused.weight, fused.bias = fuse_linear_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    return fused
