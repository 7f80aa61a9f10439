"""The ``vocab`` section of ``parcl-bench kernels``: softmax, log-softmax and class-index
cross-entropy over a large vocabulary, as a language model's head (GPT-2: logits (N, 50257),
N = batch x tokens, ``F.cross_entropy(logits.view(-1, V), targets.view(-1))``).

Milliseconds of parcl's forward and backward of each (the kernels' launchers, as the tape calls
them), timed in alternation with the same pass in PyTorch on as many threads
(``F.softmax``, ``F.log_softmax``, ``F.cross_entropy`` under ``no_grad``, and their autograd
backward alone: the graph recorded once, outside the timed calls) when PyTorch is importable.
Logits ~ N(0, 4), uniform labels, an upstream ~ N(0, 1) for the softmaxes' backward.
``ratio`` = PyTorch's time over parcl's (above 1: parcl is faster), the median of per-run
ratios.

JSON table ``vocab``: ``device``, ``op``, ``shape``, ``pass``, ``ms`` (+ ``_min``/``_max``),
``ref_ms``, ``ratio`` (+ ``_min``/``_max``).
"""

# The timed lambdas run inside the loop iteration that defines them (never later):
# ruff: noqa: B023

from __future__ import annotations

import numpy as np

import parcl as pc
from parcl.kernels import cross_entropy as K_ce
from parcl.kernels import softmax as K_softmax

from .common import BenchError, fmt_range, put_ratio, time_interleaved, torch_or_none

OPS = ("cross_entropy", "softmax", "log_softmax")
DEFAULT = "1024x50257"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"1024x50257,4096x50257"`` -> [(1024, 50257), (4096, 50257)] (rows x classes)."""
    shapes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            rows, classes = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise BenchError(f"--vocab {part!r}: give rows x classes, e.g. {DEFAULT}") from None
        if rows < 1 or classes < 1:
            raise BenchError(f"--vocab {part!r}: rows and classes must be positive")
        shapes.append((rows, classes))
    return shapes


def _parcl_passes(q, op: str, hx, hlabels, hg):
    """(forward, backward) of parcl's kernels for ``op``."""
    x = pc.Tensor.from_host(q, hx)
    if op == "cross_entropy":
        labels = pc.Tensor.from_host(q, hlabels)
        one = pc.Tensor.from_host(q, np.array(1.0, np.float32))
        stats = K_ce.cross_entropy_forward(x, labels)[1]
        return (lambda: K_ce.cross_entropy_forward(x, labels),
                lambda: K_ce.cross_entropy_backward(x, labels, stats, one))
    log, g = op == "log_softmax", pc.Tensor.from_host(q, hg)
    y = K_softmax.softmax_forward(x, -1, log)
    return (lambda: K_softmax.softmax_forward(x, -1, log),
            lambda: K_softmax.softmax_backward(y, g, -1, log))


def _torch_passes(torch, op: str, hx, hlabels, hg):
    """(forward, backward) of PyTorch's ``op``; the backward alone, its graph kept."""
    F = torch.nn.functional
    tx = torch.from_numpy(hx).requires_grad_()
    if op == "cross_entropy":
        tl = torch.from_numpy(hlabels)

        def fwd():
            return F.cross_entropy(tx, tl)
        upstream = torch.tensor(1.0)
    else:
        fn = F.log_softmax if op == "log_softmax" else F.softmax

        def fwd():
            return fn(tx, 1)
        upstream = torch.from_numpy(hg)

    def forward():
        with torch.no_grad():
            return fwd()

    recorded = fwd()
    return forward, lambda: torch.autograd.grad(recorded, (tx,), upstream, retain_graph=True)


def run_section(q, label: str, shapes: list[tuple[int, int]], threads: int, repeat: int,
                warmup: int) -> list[dict]:
    """The ``vocab`` rows of one device."""
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(threads)
    rows = []
    rng = np.random.default_rng(4)
    for n, v in shapes:
        hx = (rng.standard_normal((n, v), dtype=np.float32) * 2)
        hlabels = rng.integers(0, v, n)
        hg = rng.standard_normal((n, v), dtype=np.float32)
        for op in OPS:
            mine = _parcl_passes(q, op, hx, hlabels, hg)
            theirs = _torch_passes(torch, op, hx, hlabels, hg) if torch is not None else None
            for i, pss in enumerate(("forward", "backward")):
                pairs = [(mine[i], q.finish)] + ([(theirs[i], None)] if theirs else [])
                stats = time_interleaved(pairs, repeat, warmup)
                row = {"device": label, "op": op, "shape": f"{n}x{v}", "pass": pss,
                       "ms": stats[0]["median"] * 1e3, "ms_min": stats[0]["min"] * 1e3,
                       "ms_max": stats[0]["max"] * 1e3}
                if theirs:
                    row["ref_ms"] = stats[1]["median"] * 1e3
                    put_ratio(row, "ratio", stats[0], stats[1])
                rows.append(row)
    return rows


COLUMNS = [("device", "device", ""), ("op", "op", ""), ("shape", "rows x classes", ""),
           ("pass", "pass", ""), ("ms", "parcl ms", ".1f"),
           ("ms_range", "[min-max]", fmt_range("ms", ".1f")),
           ("ref_ms", "PyTorch ms", ".1f"), ("ratio", "PyTorch/parcl", ".2f"),
           ("ratio_range", "[min-max]", fmt_range("ratio", ".2f"))]
TITLE = ("softmax, log-softmax and class-index cross-entropy over a large vocabulary: ms per "
         "forward and per backward (alone), median [min-max]; PyTorch on as many threads, "
         "alternating runs, PyTorch/parcl = median of per-run ratios (above 1: parcl faster)")
