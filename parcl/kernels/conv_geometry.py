"""Convolution and pooling windows, checked. A convolution's (``ConvGeometry``): kernel,
stride, padding, dilation and groups as pairs and ints, the output size (PyTorch's formula),
and the operands' dtypes and shapes, with errors that name the op and the shapes (got vs
expected). A pooling window's (``PoolWindow``): PyTorch's
output sizes with ``ceil_mode`` and ``dilation``, and whether ceil_mode windows overhang.

>>> from parcl.kernels.conv_geometry import ConvGeometry
>>> ConvGeometry.of("conv2d", (8, 8), (4, 3, 3, 3), 2, 1, 1).out
(4, 4)
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import index

import numpy as np

from ..errors import DTypeError, ShapeError
from ..tensor import FLOAT, Tensor, check_same_queue


def pair(op: str, name: str, v) -> tuple[int, int]:
    """An int or a pair of ints as a pair (stride, padding, kernel_size). A float in a pair
    is refused, as PyTorch refuses it, not truncated by ``int()`` to another window."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    try:
        a, b = v
        return index(a), index(b)
    except (TypeError, ValueError):
        raise ShapeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}") from None


def out_size(op: str, h: int, w: int, kh: int, kw: int, sh: int, sw: int, ph: int,
             pw: int, dh: int = 1, dw: int = 1) -> tuple[int, int]:
    """The output height and width of a kh x kw window (taps dh, dw apart) sliding with stride
    and padding: ``(h + 2*ph - dh*(kh - 1) - 1) // sh + 1``, as PyTorch."""
    if sh < 1 or sw < 1:
        raise ShapeError(f"{op}: stride must be >= 1, got {(sh, sw)}")
    if ph < 0 or pw < 0:
        raise ShapeError(f"{op}: padding must be >= 0, got {(ph, pw)}")
    if dh < 1 or dw < 1:
        raise ShapeError(f"{op}: dilation must be >= 1, got {(dh, dw)}")
    if h < 1 or w < 1:
        raise ShapeError(no_spatial_elements(op, (h, w)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if kh < 1 or kw < 1 or oh < 1 or ow < 1:
        dil = "" if (dh, dw) == (1, 1) else f" and dilation {(dh, dw)}"
        raise ShapeError(f"{op}: kernel {(kh, kw)} with padding {(ph, pw)}{dil} does not fit "
                         f"the input's spatial size {(h, w)}")
    return oh, ow


def window_options(kh: int, kw: int, stride, padding, dilation=(1, 1)) -> tuple[str, ...]:
    """The build options of a convolution's window: size, stride, padding and dilation as
    -D."""
    values = (kh, kw, *stride, *padding, *dilation)
    return tuple(f"-D{n}={v}" for n, v in zip(("KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW"),
                                              values))


def no_spatial_elements(op: str, hw) -> str:
    """The refusal of an input slice with no elements along a spatial dim (``x[..., W:]``):
    its windows would read padding alone, zeros (or -inf) where PyTorch raises."""
    return (f"{op}: the input's spatial size {tuple(hw)} holds no elements; expected non-zero "
            "sizes there (as PyTorch; an empty batch or channel dim is fine)")


def _check_float(op: str, **ts) -> None:
    for name, t in ts.items():
        if t is not None and t.dtype != FLOAT:
            raise DTypeError(f"{op}: {name} has dtype {t.dtype} (shape {t.shape}), expected "
                             "float32")


def check_conv(x: Tensor, w: Tensor, bias: Tensor | None, groups: int = 1) -> None:
    _check_float("conv2d", x=x, weight=w, bias=bias)
    if x.ndim != 4:
        raise ShapeError(f"conv2d: input must be 4-D (N, C, H, W), got shape {x.shape}")
    if w.ndim != 4:
        raise ShapeError(f"conv2d: weight must be 4-D (cout, cin/groups, kh, kw), got shape "
                         f"{w.shape}")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ShapeError(f"conv2d: groups must be a positive int, got {groups!r}")
    if x.shape[1] % groups or w.shape[0] % groups:
        raise ShapeError(f"conv2d: groups={groups} must divide the input's {x.shape[1]} "
                         f"channels and the weight's {w.shape[0]} output channels (input "
                         f"{x.shape}, weight {w.shape})")
    if x.shape[1] != w.shape[1] * groups:
        raise ShapeError(f"conv2d: input has {x.shape[1]} channels but weight {w.shape} "
                         f"with groups={groups} expects {w.shape[1] * groups} (input shape "
                         f"{x.shape})")
    if bias is not None and bias.shape != (w.shape[0],):
        raise ShapeError(f"conv2d: bias has shape {bias.shape}, expected ({w.shape[0]},) for "
                         f"weight {w.shape}")
    check_same_queue("conv2d", *[t for t in (x, w, bias) if t is not None])


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's window: kernel (kh, kw), stride, padding, dilation (pairs), groups,
    and its output (oh, ow) for the input it was made for."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    out: tuple[int, int]

    @classmethod
    def of(cls, op: str, x_hw, weight_shape, stride, padding, dilation, groups: int = 1):
        k = (int(weight_shape[2]), int(weight_shape[3]))
        s, p = pair(op, "stride", stride), pair(op, "padding", padding)
        d = pair(op, "dilation", dilation)
        o = out_size(op, x_hw[0], x_hw[1], *k, *s, *p, *d)
        return cls(k, s, p, d, int(groups), o)

    def options(self) -> tuple[str, ...]:
        """The build options of this window's kernels (``window_options``)."""
        return window_options(*self.kernel, self.stride, self.padding, self.dilation)


# -- pooling windows ---------------------------------------------------------------------
def pool_out_len(op: str, size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output length: floor (or ceil) of ``(size + 2p - d(k-1) - 1) / s``,
    + 1; with ceil_mode a last window that would start in the right padding is dropped."""
    span = d * (k - 1) + 1
    out = (size + 2 * p - span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


@dataclass(frozen=True)
class PoolWindow:
    """A validated pooling window over an ``(N, C, H, W)`` input: ``kernel``, ``stride``,
    ``padding``, ``dilation`` (pairs), ``out`` (OH, OW) and ``overhang`` (ceil_mode windows
    that reach past the right or bottom padding)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    out: tuple[int, int]
    overhang: bool

    def options(self, divisor: int = 0) -> tuple[str, ...]:
        """Build options of the window kernels: size, stride and padding always, the rest
        only when not the default (so the usual windows keep their programs)."""
        names = ("KH", "KW", "SH", "SW", "PH", "PW")
        opts = [f"-D{n}={v}" for n, v in zip(names, (*self.kernel, *self.stride,
                                                      *self.padding))]
        if self.dilation != (1, 1):
            opts += [f"-DDH={self.dilation[0]}", f"-DDW={self.dilation[1]}"]
        if self.overhang:
            opts.append("-DOVER=1")
        if divisor:
            opts.append(f"-DDIVISOR={divisor}")
        return tuple(opts)


def window(op: str, x_shape, kernel_size, stride, padding, dilation=1,
           ceil_mode: bool = False, limit_padding: bool = True) -> PoolWindow:
    """The validated window of a pooling op over NCHW ``x_shape``, with PyTorch's rules:
    ``stride=None`` is the kernel size, padding at most half the kernel, output sizes as
    ``pool_out_len``."""
    if len(x_shape) != 4:
        raise ShapeError(f"{op}: input must be 4-D (N, C, H, W), got shape {tuple(x_shape)}")
    k = pair(op, "kernel_size", kernel_size)
    s = k if stride is None else pair(op, "stride", stride)
    p, d = pair(op, "padding", padding), pair(op, "dilation", dilation)
    if k[0] < 1 or k[1] < 1:
        raise ShapeError(f"{op}: kernel_size must be >= 1, got {k}")
    if min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ShapeError(f"{op}: stride and dilation must be >= 1 and padding >= 0, got "
                         f"stride {s}, dilation {d}, padding {p}")
    if limit_padding and (p[0] > k[0] // 2 or p[1] > k[1] // 2):
        raise ShapeError(f"{op}: padding {p} must be at most half the kernel size {k} "
                         "(as PyTorch)")
    h, w = x_shape[2], x_shape[3]
    if h < 1 or w < 1:
        raise ShapeError(no_spatial_elements(op, (h, w)))
    o = (pool_out_len(op, h, k[0], s[0], p[0], d[0], ceil_mode),
         pool_out_len(op, w, k[1], s[1], p[1], d[1], ceil_mode))
    if o[0] < 1 or o[1] < 1:
        raise ShapeError(f"{op}: kernel {k} with padding {p}, stride {s}, dilation {d} does "
                         f"not fit the input's spatial size {(h, w)} (output {o})")
    over = any((o[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 > size + 2 * p[i]
               for i, size in enumerate((h, w)))
    return PoolWindow(k, s, p, d, o, over)
