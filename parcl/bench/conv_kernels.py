"""The ``conv_ext`` section of ``parcl-bench kernels``: depthwise and transposed convolutions.

GFLOP/s of parcl's depthwise (``groups == cin``, direct kernels) and transposed (GEMM +
col2im) convolutions, forward and backward (input + weight gradients, counted as 2x the
forward flop), each timed in alternation with the same pass in PyTorch on as many threads
(``torch.nn.functional.conv2d(..., groups=cin)``, ``conv_transpose2d`` and their autograd
backward) when PyTorch is importable, else with a direct numpy forward (a sum over taps of
strided slices; no numpy backward). Flop: ``2*N*cout*OH*OW*kh*kw`` (depthwise),
``2*N*cin*H*W*cout*kh*kw`` (transposed). ``ratio`` = parcl's speed over the reference's, the
median of per-run ratios.

JSON table ``conv_ext``: ``device``, ``kind`` (``depthwise``/``transposed``), ``shape``,
``pass``, ``gflops`` (+ ``_min``/``_max``), ``ref`` (``pytorch``/``numpy``), ``ref_gflops``,
``ratio`` (+ ``_min``/``_max``).
"""

# The timed lambdas run inside the loop iteration that defines them (never later):
# ruff: noqa: B023

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import parcl as pc
from parcl.kernels import conv as K_conv
from parcl.kernels import conv_transpose as K_convt

from .common import fmt_range, put_rate, put_ratio, time_interleaved, torch_or_none


@dataclass(frozen=True)
class ConvCase:
    """One benchmarked convolution: ``kind``, input and weight shapes, stride, padding
    (and output_padding for the transposed ones)."""

    kind: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    stride: int
    padding: int
    output_padding: int = 0


# MobileNet's depthwise layers at stride 1 and 2 (batch 32), a U-Net/GAN-style 2x upsampling,
# and tiny ones for smoke tests
CONV_EXT_SHAPES = {
    "dw": ConvCase("depthwise", (32, 64, 32, 32), (64, 1, 3, 3), 1, 1),
    "dw_s2": ConvCase("depthwise", (32, 128, 16, 16), (128, 1, 3, 3), 2, 1),
    "tconv": ConvCase("transposed", (16, 64, 16, 16), (64, 32, 4, 4), 2, 1),
    "tiny_dw": ConvCase("depthwise", (2, 4, 9, 11), (4, 1, 3, 3), 1, 1),
    "tiny_tconv": ConvCase("transposed", (2, 4, 5, 5), (4, 3, 3, 3), 2, 1, 1),
}
DEFAULT = "dw,dw_s2,tconv"


def numpy_depthwise(x, w, stride: int, pad: int):
    """Depthwise convolution (channel multiplier 1) as a sum over taps of strided slices."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, c, oh, ow), np.float32)
    for ky in range(kh):
        for kx in range(kw):
            y += xp[:, :, ky:ky + stride * (oh - 1) + 1:stride,
                    kx:kx + stride * (ow - 1) + 1:stride] * w[None, :, 0, ky, kx, None, None]
    return y


def numpy_transposed(x, w, stride: int, pad: int, out_pad: int):
    """Transposed convolution as one matmul and a scatter-add of its columns over the taps."""
    n, cin, h, wd = x.shape
    _, cout, kh, kw = w.shape
    cols = np.einsum("nchw,cdyx->ndyxhw", x, w, optimize=True)
    full = np.zeros((n, cout, (h - 1) * stride + kh + out_pad, (wd - 1) * stride + kw + out_pad),
                    np.float32)
    for ky in range(kh):
        for kx in range(kw):
            full[:, :, ky:ky + stride * (h - 1) + 1:stride,
                 kx:kx + stride * (wd - 1) + 1:stride] += cols[:, :, ky, kx]
    oh = (h - 1) * stride - 2 * pad + kh + out_pad
    ow = (wd - 1) * stride - 2 * pad + kw + out_pad
    return full[:, :, pad:pad + oh, pad:pad + ow]


def _passes(q, case: ConvCase, hx, hw):
    """(flop, parcl forward, parcl backward, output shape) for ``case``."""
    x, w = pc.Tensor.from_host(q, hx), pc.Tensor.from_host(q, hw)
    s, p = case.stride, case.padding
    if case.kind == "depthwise":
        c = case.x[1]
        y = K_conv.conv2d_forward(x, w, None, s, p, groups=c)
        g = pc.Tensor.from_host(q, np.ones(y.shape, np.float32))
        flop = 2.0 * y.size * case.w[2] * case.w[3]
        return (flop, lambda: K_conv.conv2d_forward(x, w, None, s, p, groups=c),
                lambda: K_conv.conv2d_backward(x, w, g, s, p, groups=c), y.shape)
    op = case.output_padding
    y = K_convt.conv_transpose2d_forward(x, w, None, s, p, op)
    g = pc.Tensor.from_host(q, np.ones(y.shape, np.float32))
    flop = 2.0 * hx.size * case.w[1] * case.w[2] * case.w[3]
    return (flop, lambda: K_convt.conv_transpose2d_forward(x, w, None, s, p, op),
            lambda: K_convt.conv_transpose2d_backward(x, w, g, s, p), y.shape)


def _reference(torch, case: ConvCase, hx, hw, out_shape):
    """(name, forward, backward or None) of the reference implementation."""
    s, p = case.stride, case.padding
    if torch is None:
        if case.kind == "depthwise":
            return "numpy", (lambda: numpy_depthwise(hx, hw, s, p)), None
        return "numpy", (lambda: numpy_transposed(hx, hw, s, p, case.output_padding)), None
    F = torch.nn.functional
    tx = torch.from_numpy(hx).requires_grad_()
    tw = torch.from_numpy(hw).requires_grad_()
    tg = torch.ones(out_shape)
    if case.kind == "depthwise":
        def fwd():
            return F.conv2d(tx, tw, None, s, p, 1, case.x[1])
    else:
        def fwd():
            return F.conv_transpose2d(tx, tw, None, s, p, case.output_padding)

    def forward():
        with torch.no_grad():
            return fwd()

    # The backward alone, as parcl's is timed: the forward's graph recorded once, outside
    # the timed calls, and kept for every backward.
    recorded = fwd()
    return "pytorch", forward, (
        lambda: torch.autograd.grad(recorded, (tx, tw), tg, retain_graph=True))


def run_section(q, label: str, names: list[str], threads: int, repeat: int,
                warmup: int) -> list[dict]:
    """The ``conv_ext`` rows of one device."""
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(threads)
    rows = []
    rng = np.random.default_rng(3)
    for name in names:
        case = CONV_EXT_SHAPES[name]
        hx = rng.standard_normal(case.x, dtype=np.float32)
        hw = rng.standard_normal(case.w, dtype=np.float32) * 0.1
        flop, fwd, bwd, out_shape = _passes(q, case, hx, hw)
        ref, ref_fwd, ref_bwd = _reference(torch, case, hx, hw, out_shape)
        shape = f"{name} x{case.x} w{case.w} s{case.stride}"
        for pss, mine, theirs, fl in (("forward", fwd, ref_fwd, flop),
                                      ("backward", bwd, ref_bwd, 2 * flop)):
            pairs = [(mine, q.finish)] + ([(theirs, None)] if theirs is not None else [])
            stats = time_interleaved(pairs, repeat, warmup)
            row = {"device": label, "kind": case.kind, "shape": shape, "pass": pss,
                   "ref": ref if theirs is not None else "-"}
            put_rate(row, "gflops", fl / 1e9, stats[0])
            if theirs is not None:
                put_rate(row, "ref_gflops", fl / 1e9, stats[1])
                put_ratio(row, "ratio", stats[0], stats[1])
            rows.append(row)
    return rows


COLUMNS = [("device", "device", ""), ("kind", "kind", ""), ("shape", "shape", ""),
           ("pass", "pass", ""), ("gflops", "parcl GFLOP/s", ".2f"),
           ("gflops_range", "[min-max]", fmt_range("gflops", ".2f")), ("ref", "reference", ""),
           ("ref_gflops", "ref GFLOP/s", ".2f"), ("ratio", "parcl/ref", ".2f"),
           ("ratio_range", "[min-max]", fmt_range("ratio", ".2f"))]
TITLE = ("depthwise (direct kernels) and transposed (GEMM + col2im) convolutions: GFLOP/s; "
         "backward = input + weight gradients (2x forward flop); reference = PyTorch on as "
         "many threads, else a numpy forward; alternating runs, parcl/ref = median of per-run "
         "ratios")
