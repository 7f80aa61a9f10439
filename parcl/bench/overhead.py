"""``parcl-bench overhead``: the host cost of the eager tape, per recorded op, vs PyTorch.

Two workloads on one queue, each a fresh graph every pass (as a dynamic model builds one):

* ``chain``: ``h = tanh(h @ w + x)`` ``--depth`` times on ``--size`` x ``--size`` tensors, then
  ``sum``: 31 recorded ops at depth 10, the leaves ``w`` and ``x`` requiring grad;
* ``mix``: the small ops of a transformer block on layer-norm-sized vectors (``--rows`` x
  ``--width``): ``layer_norm``, a reshape to 1-D and back, adds of a bias and of a residual, a
  scalar multiply and ``gelu``, ``--depth`` times, then ``sum``.

For each, two modes: ``fwd+bwd`` (record on a ``tp.Tape``, then ``tape.backward``) and
``no_grad`` (the same forward under ``tp.no_grad()``), in parcl, in parcl on a queue made with
``hold_launches=False`` (``parcl-unheld``: every launch handed to the device at once, see
``parcl.gate``) and in PyTorch's eager autograd (CPU, when torch is installed; ``--no-torch``
leaves it out). A timed run is ``--passes``
passes; its ``host`` time stops when the last op has been enqueued, ``drain`` is the wait for
the queue after that (``queue.finish()``): a drain near 0 means the host, not the device, is the
bottleneck. ``us/op`` is host time per recorded op (a forward op and its share of the
backward); ``ops/s`` its inverse; ``vs torch`` the median of per-round ratios of PyTorch's
time to parcl's (1.0: as fast). All configurations run in alternation (``time_interleaved``).

The ``ops`` table: each common op of a transformer block on its own (``overhead_ops``).

The ``guard`` table: the host cost of the capture guard ``pc.nn.capture_key(model)`` and of
the host snapshot of a batch's upload (``parcl.uploads.snapshot`` of x and y) on the benchmark
MLP and CNN at their default batches, against one captured training step
(``tp.capture``, the SGD update included).

JSON rows: table ``overhead``: ``workload``, ``impl``, ``mode``, ``ops`` (recorded ops per
pass), ``us_per_op`` (+ ``_min``/``_max``/``_q1``/``_q3``), ``ops_per_s``, ``drain_us_per_op``,
``vs_torch`` (+ ``_min``/``_max``); table ``guard``: ``model``, ``batch``, ``capture_key_us``,
``snapshot_us``, ``step_ms`` (+ spreads), ``guard_pct`` (key + snapshot as % of the step).
"""

from __future__ import annotations

import time

import numpy as np

import parcl as pc
import parcl.tape as tp
from parcl.uploads import snapshot

from . import models
from .compare import parcl_step
from .overhead_ops import ops_rows
from .common import (
    torch_or_none,
    BenchError,
    add_table,
    device_info,
    fmt_range,
    new_result,
    put_ratio,
    put_stat,
    repeat_of,
    require_matplotlib,
    resolve_devices,
    save_figure,
    summarize,
    time_interleaved,
    warmup_of,
)


def add_arguments(p) -> None:
    p.add_argument("--depth", type=int, default=10, help="blocks per pass (default 10: 31 "
                   "recorded ops in the chain)")
    p.add_argument("--size", type=int, default=4, help="chain tensors are SIZE x SIZE "
                   "(default 4)")
    p.add_argument("--rows", type=int, default=8, help="mix: rows (default 8)")
    p.add_argument("--width", type=int, default=64, help="mix: layer-norm width (default 64)")
    p.add_argument("--passes", type=int, default=20, help="passes per timed run (default 20)")
    p.add_argument("--op-calls", type=int, default=50, help="ops table: calls per timed run "
                   "(0: no ops table; default 50)")
    p.add_argument("--guard-models", default="mlp,cnn",
                   help="models of the guard table ('' for none; default mlp,cnn)")
    p.add_argument("--devices", default="cpu", metavar="SPEC",
                   help="device (default cpu: the whole CPU device)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")


def run(args) -> dict:
    for name in ("depth", "size", "rows", "width", "passes"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.op_calls < 0:
        raise BenchError(f"--op-calls must be >= 0, got {args.op_calls}")
    guard_models = [m.strip() for m in args.guard_models.split(",") if m.strip()]
    for m in guard_models:
        if m not in models.MODELS:
            raise BenchError(f"overhead: unknown model {m!r}; choose from {models.MODELS}")
    repeat, warmup = repeat_of(args, 15), warmup_of(args, 3)
    torch = None if args.no_torch else torch_or_none()
    dev = resolve_devices(args.devices)[0]
    q = pc.new_queue(dev)
    result = new_result("overhead", {"depth": args.depth, "size": args.size, "rows": args.rows,
                                     "width": args.width, "passes": args.passes,
                                     "op_calls": args.op_calls,
                                     "repeat": repeat, "warmup": warmup,
                                     "torch": torch is not None})
    result["devices"] = [device_info(dev, "queue")]
    previous = pc.default_queue()
    pc.set_default_queue(q)
    try:
        rows = _overhead_rows(q, pc.new_queue(dev, hold_launches=False), torch, args, repeat,
                              warmup)
        ops = (ops_rows(q, torch, args.rows, args.width, args.op_calls, repeat, warmup)
               if args.op_calls else [])
        guard = [_guard_row(q, m, repeat, warmup) for m in guard_models]
    finally:
        pc.set_default_queue(previous)
    add_table(result, "overhead", f"host time per recorded op, median [min-max] of {repeat} "
              f"alternating runs of {args.passes} passes; drain = queue wait after the host is "
              "done", [
                  ("workload", "workload", ""), ("impl", "impl", ""), ("mode", "mode", ""),
                  ("ops", "ops", ""), ("us_per_op", "us/op", ".2f"),
                  ("us_range", "[min-max]", fmt_range("us_per_op", ".2f")),
                  ("ops_per_s", "ops/s", ".0f"), ("drain_us_per_op", "drain us/op", ".2f"),
                  ("vs_torch", "vs torch", ".2f")], rows)
    if ops:
        add_table(result, "ops", f"time of one op ({args.rows}x{args.width} tensors; linear "
                  f"{args.width}->{args.width}), median [min-max] of {repeat} alternating runs "
                  f"of {args.op_calls} calls, the queue's drain included (host us: before it); "
                  "fwd+bwd: recorded, then its backward from a given gradient", [
                      ("op", "op", ""), ("mode", "mode", ""), ("host_us", "host us", ".2f"),
                      ("us", "us", ".2f"), ("us_range", "[min-max]", fmt_range("us", ".2f")),
                      ("torch_us", "torch us", ".2f"), ("vs_torch", "vs torch", ".2f")], ops)
    if guard:
        add_table(result, "guard", "host cost per step of the capture guard (capture_key) and "
                  "of the upload snapshot vs one captured step", [
                      ("model", "model", ""), ("batch", "batch", ""),
                      ("capture_key_us", "capture_key us", ".1f"),
                      ("snapshot_us", "snapshot us", ".1f"), ("step_ms", "step ms", ".2f"),
                      ("guard_pct", "guard %", ".2f")], guard)
    if torch is None:
        result["notes"].append("PyTorch is not installed (or --no-torch): no torch rows")
    return result


# -- the workloads ---------------------------------------------------------------------------
class _Parcl:
    """The two workloads on parcl tensors; ``ops`` per pass is counted from a tape."""

    def __init__(self, q, args):
        rng = np.random.default_rng(0)
        s, r, c = args.size, args.rows, args.width
        self.depth = args.depth
        self.w = tp.tensor(rng.standard_normal((s, s), dtype=np.float32) * 0.5,
                           requires_grad=True)
        self.x = tp.tensor(rng.standard_normal((s, s), dtype=np.float32), requires_grad=True)
        self.h0 = tp.tensor(rng.standard_normal((s, s), dtype=np.float32))
        self.lw = tp.tensor(np.ones(c, np.float32), requires_grad=True)
        self.lb = tp.tensor(np.zeros(c, np.float32), requires_grad=True)
        self.bias = tp.tensor(rng.standard_normal(r * c, dtype=np.float32), requires_grad=True)
        self.m0 = tp.tensor(rng.standard_normal((r, c), dtype=np.float32))
        self.rc = (r, c)
        self.leaves = (self.w, self.x, self.lw, self.lb, self.bias)

    def chain(self):
        h = self.h0
        for _ in range(self.depth):
            h = tp.tanh(h @ self.w + self.x)
        return tp.sum(h)

    def mix(self):
        h = self.m0
        for _ in range(self.depth):
            y = tp.layer_norm(h, (self.rc[1],), self.lw, self.lb)
            y = y.reshape(-1) + self.bias
            h = tp.gelu(y.reshape(self.rc)) * 0.5 + h
        return tp.sum(h)

    def recorded(self, workload):
        with tp.Tape() as tape:
            loss = workload()
        tape.backward(loss)
        for leaf in self.leaves:
            leaf.grad = None
        return len(tape.nodes)

    def no_grad(self, workload):
        with tp.no_grad():
            workload()


class _Torch:
    def __init__(self, torch, args):
        rng = np.random.default_rng(0)
        s, r, c = args.size, args.rows, args.width
        self.torch, self.depth, self.rc = torch, args.depth, (r, c)
        t = torch.from_numpy
        self.w = t(rng.standard_normal((s, s), dtype=np.float32) * 0.5).requires_grad_()
        self.x = t(rng.standard_normal((s, s), dtype=np.float32)).requires_grad_()
        self.h0 = t(rng.standard_normal((s, s), dtype=np.float32))
        self.lw = torch.ones(c, requires_grad=True)
        self.lb = torch.zeros(c, requires_grad=True)
        self.bias = t(rng.standard_normal(r * c, dtype=np.float32)).requires_grad_()
        self.m0 = t(rng.standard_normal((r, c), dtype=np.float32))
        self.leaves = (self.w, self.x, self.lw, self.lb, self.bias)

    def chain(self):
        h = self.h0
        for _ in range(self.depth):
            h = self.torch.tanh(h @ self.w + self.x)
        return h.sum()

    def mix(self):
        f = self.torch.nn.functional
        h = self.m0
        for _ in range(self.depth):
            y = f.layer_norm(h, (self.rc[1],), self.lw, self.lb)
            y = y.reshape(-1) + self.bias
            h = f.gelu(y.reshape(self.rc)) * 0.5 + h
        return h.sum()

    def recorded(self, workload):
        workload().backward()
        for leaf in self.leaves:
            leaf.grad = None

    def no_grad(self, workload):
        with self.torch.no_grad():
            workload()


def _overhead_rows(q, unheld, torch, args, repeat: int, warmup: int) -> list[dict]:
    impls = [("parcl", _Parcl(q, args))]
    pc.set_default_queue(unheld)          # the same workload on a queue that holds no launch
    impls.append(("parcl-unheld", _Parcl(unheld, args)))
    pc.set_default_queue(q)
    queues = {"parcl": q, "parcl-unheld": unheld}
    if torch is not None:
        torch.set_num_threads(1)        # tiny tensors: one thread is PyTorch's fastest
        impls.append(("pytorch", _Torch(torch, args)))
    ops = {name: impls[0][1].recorded(getattr(impls[0][1], name)) for name in ("chain", "mix")}
    configs, hosts = [], []
    for workload in ("chain", "mix"):
        for impl, obj in impls:
            for mode in ("fwd+bwd", "no_grad"):
                run_pass = obj.recorded if mode == "fwd+bwd" else obj.no_grad
                host: list[float] = []
                configs.append((workload, impl, mode, host))
                hosts.append((_timed(run_pass, getattr(obj, workload), args.passes, host),
                              queues[impl].finish if impl in queues else None))
    stats = time_interleaved(hosts, repeat, warmup)
    rows = []
    for (workload, impl, mode, host), stat in zip(configs, stats):
        host = host[-repeat:]                       # the timed runs (warm-ups came first)
        n = ops[workload] * args.passes
        hstat = summarize(host)
        row = {"workload": workload, "impl": impl, "mode": mode, "ops": ops[workload]}
        put_stat(row, "us_per_op", hstat, 1e6 / n)
        row["ops_per_s"] = n / hstat["median"]
        row["drain_us_per_op"] = float(np.median(np.subtract(stat["times"], host))) * 1e6 / n
        row["times"] = host
        rows.append(row)
    totals = [stat["times"] for stat in stats]  # host and drain: what PyTorch's times hold
    for row, total in zip(rows, totals):        # torch's time over parcl's, run by run
        twin = next((t for r, t in zip(rows, totals) if r["impl"] == "pytorch" and
                     r["workload"] == row["workload"] and r["mode"] == row["mode"]), None)
        if twin is not None and row["impl"] in queues:
            put_ratio(row, "vs_torch", {"times": total}, {"times": twin})
    return rows


def _timed(run_pass, workload, passes: int, host: list):
    """A timed run: ``passes`` passes, appending the host time (before any drain) to
    ``host``."""
    def fn():
        t0 = time.perf_counter()
        for _ in range(passes):
            run_pass(workload)
        host.append(time.perf_counter() - t0)
    return fn


# -- the capture guard -----------------------------------------------------------------------
def _guard_row(q, name: str, repeat: int, warmup: int) -> dict:
    batch = models.DEFAULT_BATCH[name]
    model = models.builder(name)(q)
    x, y = models.batch(name, batch)
    step, _ = parcl_step(q, model, x, y, capture=True, name=name)   # the model's own loss
    calls = 100

    def key():
        for _ in range(calls):
            pc.nn.capture_key(model)

    def snap():
        for _ in range(calls):
            snapshot(x)
            snapshot(y)

    key_s, snap_s, step_s = time_interleaved(
        [(key, None), (snap, None), (step, q.finish)], repeat, warmup)
    row = {"model": name, "batch": batch}
    put_stat(row, "capture_key_us", key_s, 1e6 / calls)
    put_stat(row, "snapshot_us", snap_s, 1e6 / calls)
    put_stat(row, "step_ms", step_s, 1e3)
    row["guard_pct"] = (row["capture_key_us"] + row["snapshot_us"]) / (row["step_ms"] * 1e3) * 100
    return row


def plot(result: dict, path: str) -> None:
    plt = require_matplotlib()
    rows = result["tables"]["overhead"]["rows"]
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    short = {"parcl": "parcl", "parcl-unheld": "unheld", "pytorch": "torch"}
    labels = [f"{r['workload']}\n{short.get(r['impl'], r['impl'])}\n{r['mode']}" for r in rows]
    values = [r["us_per_op"] for r in rows]
    errs = [[v - r["us_per_op_min"] for v, r in zip(values, rows)],
            [r["us_per_op_max"] - v for v, r in zip(values, rows)]]
    colors = [{"parcl": "tab:blue", "parcl-unheld": "lightsteelblue"}.get(r["impl"], "tab:orange")
              for r in rows]
    ax.bar(range(len(rows)), values, yerr=errs, color=colors, capsize=2)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("host us per recorded op")
    ax.set_title("eager tape overhead (blue parcl, light: launches not held; orange PyTorch)",
                 fontsize=8)
    save_figure(fig, path)
