"""``parcl-bench overhead``'s ``ops`` table: the host time of one eager op, op by op, vs PyTorch.

The ``chain`` and ``mix`` workloads give a rate over a few ops; this table names what each of a
transformer block's common ops costs on its own, on small tensors (``--rows`` x ``--width``,
the mix's): ``linear`` (with bias), ``layer_norm``, a bias ``add`` (broadcast), an ``add`` of
equal shapes, ``matmul``, ``gelu``, ``softmax``, a scalar ``mul``, ``sum`` and ``mean`` (full),
``sum`` over the last axis and ``reshape``. Two modes: ``no_grad`` (the op alone) and
``fwd+bwd`` (the op recorded on a tape, then its backward from a given upstream gradient: no
loss op is added). A timed run is ``--op-calls`` calls (0: no table); ``host us`` is the host
time per call, ``us`` the time per call until the queue is done (host and device: the drain
after the host's last call included, as a caller that reads the result waits for it), ``vs
torch`` the median of per-round ratios of PyTorch's time to parcl's ``us`` (1.0: as fast).

JSON rows: table ``ops``: ``op``, ``mode``, ``host_us``, ``us`` (+ ``_min``/``_max``),
``torch_us`` (+ spreads, when torch is installed), ``vs_torch`` (+ ``_min``/``_max``).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np

import parcl as pc
import parcl.tape as tp

from .common import put_ratio, put_stat, summarize, time_interleaved

def _cases(rows: int, width: int) -> dict:
    """op -> (its inputs' shapes, parcl's fn, torch's fn), fns taking the inputs in order."""
    def torch_f(torch):
        f = torch.nn.functional
        return {
            "linear": lambda x, w, b: f.linear(x, w, b),
            "layer_norm": lambda x, w, b: f.layer_norm(x, (width,), w, b),
            "add (bias)": lambda x, b: x + b,
            "add": lambda x, y: x + y,
            "matmul": lambda x, w: x @ w,
            "gelu": lambda x: f.gelu(x),
            "softmax": lambda x: torch.softmax(x, -1),
            "mul (scalar)": lambda x: x * 0.5,
            "sum": lambda x: x.sum(),
            "mean": lambda x: x.mean(),
            "sum (last axis)": lambda x: x.sum(-1),
            "reshape": lambda x: x.reshape(-1),
        }
    mat, vec, sq = (rows, width), (width,), (width, width)
    parcl = {
        "linear": ((mat, sq, vec), lambda x, w, b: tp.linear(x, w, b)),
        "layer_norm": ((mat, vec, vec), lambda x, w, b: tp.layer_norm(x, (width,), w, b)),
        "add (bias)": ((mat, vec), lambda x, b: x + b),
        "add": ((mat, mat), lambda x, y: x + y),
        "matmul": ((mat, sq), lambda x, w: x @ w),
        "gelu": ((mat,), lambda x: tp.gelu(x)),
        "softmax": ((mat,), lambda x: tp.softmax(x, axis=-1)),
        "mul (scalar)": ((mat,), lambda x: x * 0.5),
        "sum": ((mat,), lambda x: tp.sum(x)),
        "mean": ((mat,), lambda x: tp.mean(x)),
        "sum (last axis)": ((mat,), lambda x: tp.sum(x, axis=-1)),
        "reshape": ((mat,), lambda x: x.reshape(-1)),
    }
    return parcl, torch_f


def ops_rows(q, torch, rows: int, width: int, calls: int, repeat: int,
             warmup: int) -> list[dict]:
    """The ``ops`` table's rows: each op in both modes, parcl and PyTorch timed in
    alternation."""
    rng = np.random.default_rng(0)
    parcl, torch_f = _cases(rows, width)
    torch_fns = torch_f(torch) if torch is not None else {}
    configs, runs, hosts = [], [], []
    for op, (shapes, fn) in parcl.items():
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        mine = [tp.tensor(a, requires_grad=True) for a in arrays]
        theirs = ([torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
                  if torch is not None else None)
        for mode in ("no_grad", "fwd+bwd"):
            configs.append((op, mode))
            host: list[float] = []
            hosts.append(host)
            runs.append([(_host_timed(_parcl_run(fn, mine, mode, calls), host), q.finish)])
            if torch is not None:
                runs[-1].append((_torch_run(torch, torch_fns[op], theirs, mode, calls), None))
    flat = [r for pair in runs for r in pair]
    stats = iter(time_interleaved(flat, repeat, warmup))
    out = []
    for (op, mode), pair, host in zip(configs, runs, hosts):
        row = {"op": op, "mode": mode}
        mine = next(stats)
        row["host_us"] = float(np.median(host[-repeat:])) * 1e6 / calls   # after the warm-ups
        put_stat(row, "us", summarize(mine["times"]), 1e6 / calls)
        if len(pair) == 2:
            theirs = next(stats)
            put_stat(row, "torch_us", summarize(theirs["times"]), 1e6 / calls)
            put_ratio(row, "vs_torch", mine, theirs)
        out.append(row)
    return out


def _host_timed(run, host: list):
    """``run``, appending its host time (before the queue's drain) to ``host``."""
    def timed():
        t0 = time.perf_counter()
        run()
        host.append(time.perf_counter() - t0)
    return timed


def _runner(calls: int, inputs, quiet, once):
    """A timed run: ``once()`` ``calls`` times (inside ``quiet()``, a library's no_grad, when
    given), then the inputs' gradients dropped."""
    def run():
        with quiet() if quiet is not None else nullcontext():
            for _ in range(calls):
                once()
        for x in inputs:
            x.grad = None
    return run


def _parcl_run(fn, inputs, mode: str, calls: int):
    if mode == "no_grad":
        return _runner(calls, inputs, tp.no_grad, lambda: fn(*inputs))
    upstream = {}

    def once():
        with tp.Tape() as tape:
            y = fn(*inputs)
        g = upstream.get(y.shape)
        if g is None:
            g = upstream[y.shape] = pc.Tensor.full(y.queue, y.shape, 1.0)
        tape.backward(y, grad=g)
    return _runner(calls, inputs, None, once)


def _torch_run(torch, fn, inputs, mode: str, calls: int):
    if mode == "no_grad":
        return _runner(calls, inputs, torch.no_grad, lambda: fn(*inputs))
    upstream = {}

    def once():
        y = fn(*inputs)
        g = upstream.get(y.shape)
        if g is None:
            g = upstream[y.shape] = torch.ones(y.shape)
        y.backward(g)
    return _runner(calls, inputs, None, once)
