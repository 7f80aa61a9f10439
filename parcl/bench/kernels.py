"""``parcl-bench kernels``: kernel throughput against numpy in the same run, and launch cost.

* GEMM GFLOP/s (``2*n^3`` flop) for NN, NT and TN at ``--sizes`` (256..2048): the whole device
  against numpy with as many BLAS threads as the device has compute units (a GPU: as the host
  has cores, and ``torch.matmul`` on CUDA, TF32 off, where PyTorch has it), and one sub-device
  against numpy on one thread (threadpoolctl; without it the table says so).
* elementwise (add, relu) and reduction (sum of all, sum over rows) GB/s (bytes read + written
  once) against numpy's ``add``/``maximum``/``sum``.
* conv2d forward and backward (input + weight gradients, 2x the forward flop) GFLOP/s against
  a numpy im2col + matmul forward.
* depthwise and transposed convolutions (``--conv-ext``), forward and backward GFLOP/s against
  PyTorch where importable (else a numpy forward): ``parcl.bench.conv_kernels``.
* softmax, log-softmax and class-index cross-entropy over a large vocabulary (``--vocab``,
  rows x classes: a GPT-2 head), forward and backward ms against PyTorch on as many threads:
  ``parcl.bench.vocab_kernels``.
* parcl and numpy are timed in alternation (run r of each back to back), and ``ratio`` is the
  median of the per-run ratios, so a change in the machine's load affects both sides alike.
* host cost of a launch: microseconds per enqueue of a one-element kernel (through parcl's
  launcher and through a raw pyopencl kernel call), per kernel to drain the queue, and the
  enqueue + ``finish`` round trip.
* host cost of a recorded op: a tiny-tensor forward + backward (``--chain`` times
  ``h = h * w + x`` on 4-element tensors, then ``sum`` and ``tape.backward``), eager and
  replayed through ``tp.capture``: microseconds of host (Python) time per recorded op (a Node
  on the tape) and per kernel launched, with the tensors so small that the device time is
  only the launches'.

JSON tables: ``gemm`` (``device``, ``trans``, ``n``, ``variant``, ``gflops`` (+ ``_min``/
``_max``), ``numpy_gflops`` (+ ...), ``numpy_threads``, ``ratio`` (+ ``_min``/``_max``),
``cuda_gflops``, ``cuda_ratio`` beside a GPU), ``memory`` (``device``, ``op``, ``elems``,
``gbps``, ``numpy_gbps``, ``ratio``), ``conv`` (``device``, ``shape``, ``pass``, ``gflops``,
``numpy_gflops``, ``ratio``), ``conv_ext`` (``parcl.bench.conv_kernels``), ``vocab``
(``parcl.bench.vocab_kernels``), ``launch``
(``device``, ``what``, ``us``), ``overhead`` (``device``, ``mode``, ``ops`` (recorded ops per
step), ``kernels``, ``host_us`` (+ ``_min``/``_max``: enqueue time of one forward + backward),
``us_per_op``, ``ops_per_s``, ``us_per_kernel``, ``above_floor_us_per_op`` (host time per
op above the "floor" row: as many bare ``clEnqueueNDRangeKernel`` calls of a kernel with preset
arguments, what a replay cannot go below), ``step_us`` (enqueue + ``finish``)).
"""

# The timed lambdas run inside the loop iteration that defines them (never later):
# ruff: noqa: B023

from __future__ import annotations

import os

import numpy as np

import parcl as pc
from parcl.kernels import conv as K_conv
from parcl.kernels import elementwise as ew
from parcl.kernels import reduction as red
from parcl.kernels.gemm import choose_variant, gemm
from parcl.runtime import is_gpu

from . import conv_kernels, launch_cost, reference, vocab_kernels
from .common import (
    torch_or_none,
    BenchError,
    add_table,
    device_info,
    fmt_range,
    human_bytes,
    new_result,
    numpy_threads,
    parse_ints,
    parse_sizes,
    put_rate,
    put_ratio,
    repeat_of,
    require_matplotlib,
    resolve_devices,
    save_figure,
    time_interleaved,
    time_runs,
    warmup_of,
)

# Seconds of untimed runs of the same side before each timed GEMM run (time_interleaved)
GEMM_LEAD_IN = 0.12

# name -> (x shape NCHW, weight shape, padding): the CNN's two convolutions at batch 64 and a
# ResNet-18 layer1 convolution at batch 8
CONV_SHAPES = {
    "cnn1": ((64, 1, 28, 28), (32, 1, 3, 3), 0),
    "cnn2": ((64, 32, 13, 13), (64, 32, 3, 3), 0),
    "resnet": ((8, 64, 56, 56), (64, 64, 3, 3), 1),
    "tiny": ((2, 3, 8, 8), (4, 3, 3, 3), 1),
}


def add_arguments(p) -> None:
    p.add_argument("--sizes", default="256,512,1024,2048", help="GEMM sizes n (n x n x n)")
    p.add_argument("--trans", default="NN,NT,TN", help="GEMM transposes (default NN,NT,TN)")
    p.add_argument("--vector-sizes", default="1M,16M",
                   help="elements for the elementwise/reduction rows (K/M suffixes count "
                        "elements here)")
    p.add_argument("--conv", default="cnn1,cnn2,resnet",
                   help=f"conv shapes from {sorted(CONV_SHAPES)}")
    p.add_argument("--conv-ext", default=conv_kernels.DEFAULT,
                   help="depthwise/transposed conv shapes from "
                        f"{sorted(conv_kernels.CONV_EXT_SHAPES)}")
    p.add_argument("--vocab", default=vocab_kernels.DEFAULT,
                   help="rows x classes of the softmax/cross-entropy rows (default "
                        f"{vocab_kernels.DEFAULT}: a GPT-2 head over 1024 tokens)")
    p.add_argument("--launches", type=int, default=2000, help="launches per overhead run")
    p.add_argument("--devices", default=None, metavar="SPEC",
                   help="device spec for the whole-device rows (default: the CPU device); a "
                        "CPU is also measured as one sub-device of one compute unit")
    p.add_argument("--chain", type=int, default=100,
                   help="ops h = h * w + x in the recorded-op overhead chain (default 100)")
    p.add_argument("--skip", default="",
                   help="sections to skip: gemm,memory,conv,conv_ext,vocab,launch,overhead")


def _targets(args) -> list[tuple[str, object, int]]:
    """(label, device, numpy threads): the whole device, and a CPU's one-CU sub-device. numpy
    gets the cores parcl gets: a CPU device's compute units, or the host's cores beside a GPU."""
    devs = resolve_devices(args.devices or "cpu")
    whole = devs[0]
    units = int(whole.max_compute_units)
    out = [("whole", whole, (os.cpu_count() or 1) if is_gpu(whole) else units)]
    if not is_gpu(whole) and units > 1 and args.devices in (None, "cpu"):
        out.append(("1 CU", resolve_devices(None, units)[0], 1))
    return out


def run(args) -> dict:
    repeat, warmup = repeat_of(args, 5), warmup_of(args, 1)
    sizes = parse_ints(args.sizes, "size")
    trans = [t.strip().upper() for t in args.trans.split(",") if t.strip()]
    if any(len(t) != 2 or set(t) - {"N", "T"} for t in trans):
        raise BenchError(f"--trans {args.trans!r}: use two letters of N/T, e.g. NN,NT,TN")
    vectors = parse_sizes(args.vector_sizes)
    convs = [c.strip() for c in args.conv.split(",") if c.strip()]
    for c in convs:
        if c not in CONV_SHAPES:
            raise BenchError(f"unknown --conv shape {c!r}; choose from {sorted(CONV_SHAPES)}")
    exts = [c.strip() for c in args.conv_ext.split(",") if c.strip()]
    for c in exts:
        if c not in conv_kernels.CONV_EXT_SHAPES:
            raise BenchError(f"unknown --conv-ext shape {c!r}; choose from "
                             f"{sorted(conv_kernels.CONV_EXT_SHAPES)}")
    vocab = vocab_kernels.parse_shapes(args.vocab)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    result = new_result("kernels", {"sizes": sizes, "trans": trans, "vector_sizes": vectors,
                                    "conv": convs, "conv_ext": exts,
                                    "vocab": [f"{n}x{v}" for n, v in vocab], "repeat": repeat,
                                    "warmup": warmup})
    targets = _targets(args)
    result["devices"] = [device_info(d, label) for label, d, _ in targets]
    _, applied = numpy_threads(1)
    if not applied:
        result["notes"].append("threadpoolctl is not installed: numpy ran on its default BLAS "
                               "threads in every row (pip install threadpoolctl)")
    gemm_rows, mem_rows, conv_rows, launch_rows, ovh_rows = [], [], [], [], []
    ext_rows, vocab_rows = [], []
    for label, dev, threads in targets:
        q = pc.new_queue(dev)
        limit, applied = numpy_threads(threads)
        with limit:
            nthreads = threads if applied else None
            if "gemm" not in skip:
                gemm_rows += _gemm(q, label, sizes, trans, nthreads, repeat, warmup,
                                   _cuda_torch() if is_gpu(dev) else None)
            if "memory" not in skip:
                mem_rows += _memory(q, label, vectors, repeat, warmup)
            if "conv" not in skip:
                conv_rows += _conv(q, label, convs, repeat, warmup)
            if "conv_ext" not in skip:
                ext_rows += conv_kernels.run_section(q, label, exts, threads, repeat, warmup)
            if "vocab" not in skip:
                vocab_rows += vocab_kernels.run_section(q, label, vocab, threads, repeat,
                                                        warmup)
        if "launch" not in skip:
            launch_rows += launch_cost.launch_rows(q, label, args.launches, repeat)
        if "overhead" not in skip:
            ovh_rows += launch_cost.overhead_rows(q, label, args.chain, max(repeat, 5),
                                                  warmup)
    spread = fmt_range("gflops", ".1f")
    add_table(result, "gemm", "GEMM n x n x n: parcl vs numpy.matmul, alternating runs, "
              f"median [min-max] of {repeat}; parcl/numpy = median of per-run ratios", [
                  ("device", "device", ""), ("trans", "trans", ""), ("n", "n", ""),
                  ("variant", "variant", ""), ("gflops", "parcl GFLOP/s", ".1f"),
                  ("gflops_range", "[min-max]", spread),
                  ("numpy_gflops", "numpy GFLOP/s", ".1f"),
                  ("numpy_threads", "numpy threads", ""), ("ratio", "parcl/numpy", ".2f"),
                  ("ratio_range", "[min-max]", fmt_range("ratio", ".2f")),
                  *([("cuda_gflops", "torch cuda GFLOP/s", ".1f"),
                     ("cuda_ratio", "parcl/torch cuda", ".2f")]
                    if any("cuda_gflops" in r for r in gemm_rows) else [])],
              gemm_rows)
    add_table(result, "memory", "elementwise and reduction: GB/s of bytes read + written", [
        ("device", "device", ""), ("op", "op", ""), ("size", "elements", ""),
        ("gbps", "parcl GB/s", ".2f"), ("gbps_range", "[min-max]", fmt_range("gbps", ".2f")),
        ("numpy_gbps", "numpy GB/s", ".2f"), ("ratio", "parcl/numpy", ".2f")], mem_rows)
    add_table(result, "conv", "conv2d (im2col + GEMM): GFLOP/s; backward = input + weight "
              "gradients (2x forward flop); numpy = im2col + matmul forward", [
                  ("device", "device", ""), ("shape", "shape", ""), ("pass", "pass", ""),
                  ("gflops", "parcl GFLOP/s", ".1f"),
                  ("gflops_range", "[min-max]", spread),
                  ("numpy_gflops", "numpy GFLOP/s", ".1f"), ("ratio", "parcl/numpy", ".2f")],
              conv_rows)
    add_table(result, "conv_ext", conv_kernels.TITLE, conv_kernels.COLUMNS, ext_rows)
    add_table(result, "vocab", vocab_kernels.TITLE, vocab_kernels.COLUMNS, vocab_rows)
    add_table(result, "launch", "host cost of a launch (one-element kernel)", [
        ("device", "device", ""), ("what", "what", ""), ("us", "us", ".1f"),
        ("us_range", "[min-max]", fmt_range("us", ".1f"))], launch_rows)
    add_table(result, "overhead", f"host cost per recorded op: {args.chain} x (h = h * w + x) "
              "on 4-element tensors + sum + backward; host us = enqueue time of one forward + "
              "backward, median [min-max]", [
                  ("device", "device", ""), ("mode", "mode", ""), ("ops", "recorded ops", ""),
                  ("kernels", "kernels", ""), ("host_us", "host us/step", ".0f"),
                  ("host_range", "[min-max]", fmt_range("host_us", ".0f")),
                  ("us_per_op", "us/op", ".2f"), ("ops_per_s", "ops/s", ".0f"),
                  ("us_per_kernel", "us/kernel", ".2f"),
                  ("above_floor_us_per_op", "us/op above floor", ".2f"),
                  ("step_us", "step us (+finish)", ".0f")],
              ovh_rows)
    for name in [n for n in list(result["tables"]) if not result["tables"][n]["rows"]]:
        del result["tables"][name]
    return result


def _cuda_torch():
    """PyTorch where it can run on the GPU (CUDA), float32 products in full float32 (TF32 off,
    as parcl's): the GPU's own library as a GEMM reference beside a GPU. None elsewhere."""
    torch = torch_or_none()
    if torch is None or not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def _gemm(q, label, sizes, trans, threads, repeat, warmup, torch=None) -> list[dict]:
    """GEMM rows: parcl against numpy and, with ``torch`` (CUDA), against ``torch.matmul``."""
    rows = []
    rng = np.random.default_rng(0)
    for n in sizes:
        ha = rng.standard_normal((n, n), dtype=np.float32)
        hb = rng.standard_normal((n, n), dtype=np.float32)
        a, b = pc.Tensor.from_host(q, ha), pc.Tensor.from_host(q, hb)
        out = pc.Tensor.empty(q, (n, n))
        flop = 2.0 * n ** 3
        for t in trans:
            ta, tb = t[0] == "T", t[1] == "T"
            na, nb = (ha.T if ta else ha), (hb.T if tb else hb)
            # Untimed runs of the same side first: right after a 2-thread matmul, OpenBLAS's
            # worker spins for ~0.1 s, which halved the whole device's GEMM (85-100 against
            # 150-190 GFLOP/s timed in blocks); PoCL's idle workers spin too.
            impls = [(lambda: gemm(a, b, trans_a=ta, trans_b=tb, out=out), q.finish),
                     (lambda: np.matmul(na, nb), None)]
            if torch is not None:
                ca, cb = (torch.from_numpy(np.ascontiguousarray(v)).cuda() for v in (na, nb))
                impls.append((lambda ca=ca, cb=cb: torch.matmul(ca, cb), torch.cuda.synchronize))
            cl_stat, np_stat, *cuda_stat = time_interleaved(impls, repeat, warmup,
                                                            lead_in=GEMM_LEAD_IN)
            row = {"device": label, "trans": t, "n": n, "variant": choose_variant(q.device),
                   "numpy_threads": threads if threads is not None else "default"}
            put_rate(row, "gflops", flop / 1e9, cl_stat)
            put_rate(row, "numpy_gflops", flop / 1e9, np_stat)
            put_ratio(row, "ratio", cl_stat, np_stat)
            if cuda_stat:
                put_rate(row, "cuda_gflops", flop / 1e9, cuda_stat[0])
                put_ratio(row, "cuda_ratio", cl_stat, cuda_stat[0])
            rows.append(row)
    return rows


def _memory(q, label, vectors, repeat, warmup) -> list[dict]:
    rows = []
    rng = np.random.default_rng(1)
    for n in vectors:
        ha = rng.standard_normal(n, dtype=np.float32)
        hb = rng.standard_normal(n, dtype=np.float32)
        hc = np.empty_like(ha)
        a, b = pc.Tensor.from_host(q, ha), pc.Tensor.from_host(q, hb)
        c = pc.Tensor.empty(q, (n,))
        cols = 256 if n % 256 == 0 else 1
        a2, ha2 = a.reshape(n // cols, cols), ha.reshape(n // cols, cols)
        cases = [
            ("add", 12 * n, lambda: ew.binary("add", a, b, out=c),
             lambda: np.add(ha, hb, out=hc)),
            ("relu", 8 * n, lambda: ew.unary("relu", a, out=c),
             lambda: np.maximum(ha, 0, out=hc)),
            ("sum (all)", 4 * n, lambda: red.sum(a), lambda: ha.sum()),
            (f"sum (rows of {cols})", 4 * n, lambda: red.sum(a2, axis=1),
             lambda: ha2.sum(axis=1)),
        ]
        for op, nbytes, fn_cl, fn_np in cases:
            cl_stat, np_stat = time_interleaved([(fn_cl, q.finish), (fn_np, None)], repeat,
                                                warmup)
            row = {"device": label, "op": op, "elems": n, "size": human_bytes(n).rstrip("B")}
            put_rate(row, "gbps", nbytes / 1e9, cl_stat)
            put_rate(row, "numpy_gbps", nbytes / 1e9, np_stat)
            put_ratio(row, "ratio", cl_stat, np_stat)
            rows.append(row)
    return rows


def _conv(q, label, names, repeat, warmup) -> list[dict]:
    rows = []
    rng = np.random.default_rng(2)
    for name in names:
        xs, ws, pad = CONV_SHAPES[name]
        hx = rng.standard_normal(xs, dtype=np.float32)
        hw = rng.standard_normal(ws, dtype=np.float32) * 0.1
        x, w = pc.Tensor.from_host(q, hx), pc.Tensor.from_host(q, hw)
        y = K_conv.conv2d_forward(x, w, None, 1, pad)
        g = pc.Tensor.from_host(q, rng.standard_normal(y.shape, dtype=np.float32))
        n, cin, h, wd = xs
        cout, _, kh, kw = ws
        oh, ow = y.shape[2], y.shape[3]
        flop = 2.0 * n * cout * oh * ow * cin * kh * kw
        shape = f"{name} x{xs} w{ws}"
        fwd, np_fwd = time_interleaved(
            [(lambda: K_conv.conv2d_forward(x, w, None, 1, pad), q.finish),
             (lambda: reference.conv2d_forward(hx, hw, None, pad), None)], repeat, warmup)
        bwd = time_runs(lambda: K_conv.conv2d_backward(x, w, g, 1, pad, need_input=True,
                                                       need_weight=True), repeat, warmup,
                        sync=q.finish)
        for pss, stat, fl, np_stat in (("forward", fwd, flop, np_fwd),
                                       ("backward", bwd, 2 * flop, None)):
            row = {"device": label, "shape": shape, "pass": pss}
            put_rate(row, "gflops", fl / 1e9, stat)
            if np_stat is not None:
                put_rate(row, "numpy_gflops", fl / 1e9, np_stat)
                put_ratio(row, "ratio", stat, np_stat)
            rows.append(row)
    return rows


def plot(result: dict, path: str) -> None:
    plt = require_matplotlib()
    rows = result["tables"].get("gemm", {}).get("rows", [])
    if not rows:
        raise BenchError("--plot for kernels draws the GEMM table, which was skipped")
    devices = list(dict.fromkeys(r["device"] for r in rows))
    fig, axes = plt.subplots(1, len(devices), figsize=(4.2 * len(devices), 3.4), squeeze=False)
    for ax, dev in zip(axes[0], devices):
        sub = [r for r in rows if r["device"] == dev]
        for t in dict.fromkeys(r["trans"] for r in sub):
            pts = sorted((r["n"], r["gflops"]) for r in sub if r["trans"] == t)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    label=f"parcl {t}")
        pts = sorted({(r["n"], r["numpy_gflops"]) for r in sub if r["trans"] == "NN"} or
                     {(r["n"], r["numpy_gflops"]) for r in sub})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--", marker="s", ms=3,
                label=f"numpy ({sub[0]['numpy_threads']} thr)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"GEMM, {dev} device", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path)
