"""Transposed 2-D convolution: conv2d's input gradient run forward, on conv2d's GEMM + col2im.

``conv_transpose2d(x, W)`` with ``W`` ``(cin, cout, kh, kw)`` (PyTorch's layout) is the gradient
of ``conv2d(y, W)`` with respect to ``y`` (shape ``(N, cout, OH, OW)``) at upstream gradient
``x``: per batch chunk, ``x`` moves to ``(cin, nb*H*W)``, ``cols = W^T @ x`` (a TN GEMM, ``(cout*
kh*kw, nb*H*W)``) and ``col2im`` folds the columns into the output, a gather in a fixed tap
order. Its backward is conv2d itself: ``grad_x = conv2d(g, W)`` and ``grad_W`` is conv2d's
weight gradient with input ``g`` and upstream gradient ``x``. Output size, as PyTorch:
``(H - 1)*stride - 2*padding + kh + output_padding``.

>>> import numpy as np, parcl as pc
>>> from parcl.kernels import conv_transpose
>>> q = pc.default_queue()
>>> x = pc.Tensor.from_host(q, np.ones((1, 1, 2, 2), np.float32))
>>> w = pc.Tensor.from_host(q, np.ones((1, 1, 2, 2), np.float32))
>>> conv_transpose.conv_transpose2d_forward(x, w).to_host()[0, 0]
array([[1., 2., 1.],
       [2., 4., 2.],
       [1., 2., 1.]], dtype=float32)
"""

from __future__ import annotations

from ..errors import ShapeError
from ..tensor import Tensor, check_same_queue
from . import elementwise as ew
from .conv import _check_float, _chunks, col2im, conv2d_backward, conv2d_forward, pair, swap01
from .conv_geometry import no_spatial_elements
from .gemm import gemm

OP = "conv_transpose2d"


def output_shape(x_shape, w_shape, stride=1, padding=0, output_padding=0) -> tuple[int, ...]:
    """The output shape (N, cout, OH, OW) of ``conv_transpose2d`` for these arguments, checked
    (ShapeError naming the op and the shapes)."""
    if len(x_shape) != 4:
        raise ShapeError(f"{OP}: input must be 4-D (N, C, H, W), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ShapeError(f"{OP}: weight must be 4-D (cin, cout, kh, kw), got shape "
                         f"{tuple(w_shape)}")
    if x_shape[1] != w_shape[0]:
        raise ShapeError(f"{OP}: input has {x_shape[1]} channels but weight {tuple(w_shape)} "
                         f"expects {w_shape[0]} (its first dimension; input {tuple(x_shape)})")
    s, p = pair(OP, "stride", stride), pair(OP, "padding", padding)
    op = pair(OP, "output_padding", output_padding)
    if min(s) < 1 or min(p) < 0 or min(op) < 0:
        raise ShapeError(f"{OP}: stride must be >= 1 and padding, output_padding >= 0, got "
                         f"stride {s}, padding {p}, output_padding {op}")
    if op[0] >= s[0] or op[1] >= s[1]:
        raise ShapeError(f"{OP}: output_padding {op} must be smaller than the stride {s} "
                         "(as PyTorch)")
    if x_shape[2] < 1 or x_shape[3] < 1:
        raise ShapeError(no_spatial_elements(OP, x_shape[2:]))
    oh = (x_shape[2] - 1) * s[0] - 2 * p[0] + w_shape[2] + op[0]
    ow = (x_shape[3] - 1) * s[1] - 2 * p[1] + w_shape[3] + op[1]
    if oh < 1 or ow < 1:
        raise ShapeError(f"{OP}: input {tuple(x_shape)} with weight {tuple(w_shape)}, stride "
                         f"{s}, padding {p} gives an empty output {(oh, ow)}")
    return x_shape[0], w_shape[1], oh, ow


def conv_transpose2d_forward(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,
                             padding=0, output_padding=0) -> Tensor:
    """The transposed convolution of NCHW ``x`` with ``weight`` (cin, cout, kh, kw), + bias."""
    _check_float(OP, input=x, weight=weight, bias=bias)
    n, cout, oh, ow = output_shape(x.shape, weight.shape, stride, padding, output_padding)
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ShapeError(f"{OP}: bias has shape {bias.shape}, expected ({cout},) for weight "
                         f"{weight.shape}")
    check_same_queue(OP, *[t for t in (x, weight, bias) if t is not None])
    s, p = pair(OP, "stride", stride), pair(OP, "padding", padding)
    cin, _, kh, kw = weight.shape
    h, w = x.shape[2:]
    hw, k = h * w, cout * kh * kw
    w2 = weight.reshape(cin, k)
    out = Tensor.empty(x.queue, (n, cout, oh, ow))
    for n0, nb in _chunks(n, hw, k):
        if n == 1:
            xc = x.reshape(cin, hw)
        else:
            xc = Tensor.empty(x.queue, (cin, nb * hw))
            swap01(x, n0 * cin * hw, xc, 0, nb, cin, hw)
        cols = gemm(w2, xc, trans_a=True)                    # (cout*kh*kw, nb*H*W)
        col2im(cols, out, n0, nb, kh, kw, s, p, (h, w))
        del xc, cols
    if bias is not None:
        ew.binary("add", out, bias.reshape(1, cout, 1, 1), out=out)
    return out


def conv_transpose2d_backward(x: Tensor | None, weight: Tensor, grad: Tensor, stride=1, padding=0,
                              need_input: bool = True, need_weight: bool = True,
                              need_bias: bool = False):
    """Gradients (input, weight, bias) of ``conv_transpose2d_forward`` for upstream ``grad``
    (N, cout, OH, OW): conv2d of ``grad`` and conv2d's weight gradient; None where not asked.
    ``x`` is only read for the weight gradient (None is fine without it)."""
    from .batchnorm import channel_sum
    if grad.ndim != 4 or grad.shape[1] != weight.shape[1]:
        raise ShapeError(f"{OP} backward: gradient has shape {grad.shape}, expected "
                         f"(N, {weight.shape[1]}, OH, OW) for weight {weight.shape}")
    gx = conv2d_forward(grad, weight, None, stride, padding) if need_input else None
    gw = None
    if need_weight:
        gw = conv2d_backward(grad, weight, x, stride, padding, need_input=False,
                             need_weight=True)[1]
    gb = None
    if need_bias:
        n, c = grad.shape[:2]
        gb = channel_sum(grad.reshape(n, c, grad.shape[2] * grad.shape[3]))
    return gx, gw, gb
