"""``parcl-bench compare``: one training step of the same model and batch in parcl, in a numpy
reference implementation, and in PyTorch on the CPU when it is importable.

All three start from parcl's initial weights on the same random batch, so their first-step losses
must agree (the ``loss`` column: a cross-check that they compute the same thing). A step is
forward, softmax cross entropy, backward and an SGD update; parcl's step includes the
host-to-device copy of the batch and ends with ``queue.finish()``. Every implementation gets the
same compute: parcl one queue on ``--devices`` (default the whole CPU device), numpy's BLAS and
PyTorch as many threads as that device has compute units (threadpoolctl /
``torch.set_num_threads``). On a GPU, numpy and PyTorch's CPU build get the host's cores, and a
``pytorch (cuda)`` row runs PyTorch on the GPU where its build has CUDA. The implementations are
timed in alternation (run r of each back to back) and ``vs parcl`` is the median of the per-run
ratios, so a change in the machine's load affects all of them alike. PyTorch is not a parcl
dependency: without it the column is skipped and the table says how to install it. When the threads
fill every core, an implementation's idle worker threads can still be spinning when the next one
starts (OpenBLAS's do, for a while after each call, and slowed PyTorch's two-thread step 2-3x on a
2-core machine): ``--no-numpy`` / ``--no-torch`` leave one out so parcl is paired with a single
reference. ``--capture`` times parcl's step through ``tp.capture`` (forward and backward; the
update after it, recorded once and replayed: bit-identical to the eager step, far less Python); the
row is then ``parcl (capture)``. ``mobilenet`` (depthwise-separable blocks, see ``models``) has no
numpy reference: parcl is paired with PyTorch alone. When netcl (the peer PyOpenCL library) is
importable, a ``netcl`` row runs the same step in it on its own queue on the same device
(``netcl_ref``; ``mlp`` and ``cnn`` only); without it the row is left out with a note;
``--no-netcl`` leaves it out. ``--model gpt`` is nanoGPT's model (``pc.nn.GPT``, see ``models``)
with AdamW against its PyTorch twin (``torch_gpt.py``); it has no numpy reference, and its rows add
``tokens_per_s`` (samples/s x T).

JSON rows (table ``compare``): ``model``, ``batch``, ``impl`` (``parcl``, ``numpy``,
``pytorch``, ``netcl``; ``parcl (capture)`` with ``--capture``), ``threads``,
``samples_per_s`` (+ ``_min``/``_max``), ``step_ms``, ``loss`` (first step), ``vs_parcl``
(+ ``_min``/``_max``: this implementation's speed over parcl's, per-run ratios).
"""

from __future__ import annotations

import os

import numpy as np

import parcl as pc
import parcl.tape as tp

from ..runtime import is_gpu
from . import models, netcl_ref, reference
from .common import (
    LazyLoss,
    torch_or_none,
    BenchError,
    add_table,
    device_info,
    fmt_range,
    new_result,
    numpy_threads,
    put_rate,
    put_ratio,
    repeat_of,
    require_matplotlib,
    resolve_devices,
    save_figure,
    time_interleaved,
    warmup_of,
)

COMPARE_MODELS = ("mlp", "cnn", "mobilenet", "gpt")
TORCH_HINT = ("PyTorch is not installed, so its column is skipped; to add it: "
              "pip install torch (a CPU-only build is enough)")


def add_arguments(p) -> None:
    p.add_argument("--model", default="mlp,cnn",
                   help=f"models: {', '.join(COMPARE_MODELS)} (default mlp,cnn); mobilenet "
                        "and gpt have no numpy reference")
    p.add_argument("--batch", type=int, default=None,
                   help=f"batch (default per model: {models.DEFAULT_BATCH})")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per timed run (default 10 mlp, 3 cnn and gpt)")
    p.add_argument("--devices", default="cpu", metavar="SPEC",
                   help="device for parcl (default cpu: the whole CPU device)")
    p.add_argument("--capture", action="store_true",
                   help="time parcl's step through tp.capture (recorded once, then replayed)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    p.add_argument("--no-netcl", action="store_true", help="skip netcl even if installed")
    p.add_argument("--no-numpy", action="store_true",
                   help="skip the numpy reference (its spinning BLAS threads slow the next "
                        "implementation when they fill every core)")


def run(args) -> dict:
    repeat, warmup = repeat_of(args, 3), warmup_of(args, 1)
    names = [m.strip() for m in args.model.split(",") if m.strip()]
    for m in names:
        if m not in COMPARE_MODELS:
            raise BenchError(f"compare: unknown model {m!r}; choose from "
                             f"{', '.join(COMPARE_MODELS)}")
    for flag, value in (("--batch", args.batch), ("--steps", args.steps)):
        # `or` would run the default for 0, and range(-2) no step at all: -1.9e6 samples/s
        if value is not None and value < 1:
            raise BenchError(f"compare: {flag} must be >= 1, got {value}")
    dev = resolve_devices(args.devices)[0]
    # The references get the compute parcl gets: a CPU device's compute units, or, on a GPU,
    # the host's cores for numpy and PyTorch's CPU build, and PyTorch on CUDA where it has it.
    gpu = is_gpu(dev)
    threads = (os.cpu_count() or 1) if gpu else int(dev.max_compute_units)
    torch = None if args.no_torch else torch_or_none()
    result = new_result("compare", {"models": names, "batch": args.batch, "repeat": repeat,
                                    "warmup": warmup, "steps": args.steps,
                                    "numpy": not args.no_numpy,
                                    "threads": threads})
    result["devices"] = [device_info(dev, "parcl")]
    if torch is None and not args.no_torch:
        result["notes"].append(TORCH_HINT)
    netcl = not args.no_netcl and netcl_ref.available()
    result["notes"] += netcl_ref.compare_notes(names, args.no_netcl)
    if not args.no_numpy and any(m not in reference.NUMPY_MODELS for m in names):
        result["notes"].append("no numpy reference for "
                               + ", ".join(m for m in names if m not in reference.NUMPY_MODELS)
                               + ": parcl against PyTorch only")
    q = pc.new_queue(dev)
    rows = []
    for name in names:
        n = models.DEFAULT_BATCH[name] if args.batch is None else args.batch
        steps = (10 if name == "mlp" else 3) if args.steps is None else args.steps
        x, y = models.batch(name, n, seed=1)
        model = models.builder(name)(q)
        state = model.state_dict()
        limit, applied = numpy_threads(threads)
        capture = getattr(args, "capture", False)
        impls = [("parcl" + (" (capture)" if capture else ""), f"{dev.max_compute_units} CU",
                  *parcl_step(q, model, x, y, capture, name))]
        if not args.no_numpy and name in reference.NUMPY_MODELS:     # none for gpt
            impls.append(("numpy", threads if applied else "default", *_numpy(name, state, x, y)))
        if torch is not None:
            impls.append(("pytorch", threads, *_pytorch(torch, name, state, x, y, threads)))
            if gpu and torch.cuda.is_available():
                impls.append(("pytorch (cuda)", "gpu",
                              *_pytorch(torch, name, state, x, y, threads, "cuda")))
        if netcl and name in netcl_ref.NETCL_MODELS:
            impls.append(("netcl", f"{dev.max_compute_units} CU",
                          *netcl_ref.netcl_step(name, state, x, y, dev)))
        with limit:
            losses = [float(step()) for _, _, step, _ in impls]      # first step: the check
            stats = time_interleaved(
                [((lambda step=step, k=steps: [step() for _ in range(k)]), sync)
                 for _, _, step, sync in impls], repeat, warmup)
        for (impl, thr, _, _), loss, stat in zip(impls, losses, stats):
            row = {"model": name, "batch": n, "impl": impl, "threads": thr, "loss": loss,
                   **_rates(n, steps, stat)}
            if name == "gpt":                    # a sample is a window of block_size tokens
                row["tokens_per_s"] = row["samples_per_s"] * models.GPT["block_size"]
            put_ratio(row, "vs_parcl", stat, stats[0])
            rows.append(row)
    tokens = [("tokens_per_s", "tokens/s", ".0f")] if "gpt" in names else []
    add_table(result, "compare", f"one training step (SGD; AdamW for gpt), samples/s median "
              f"[min-max] of {repeat} alternating runs; vs parcl = median of per-run ratios; "
              "loss = first-step loss from the same weights and batch", [
                  ("model", "model", ""), ("batch", "batch", ""), ("impl", "impl", ""),
                  ("threads", "threads", ""), ("samples_per_s", "samples/s", ".1f"),
                  ("sps_range", "[min-max]", fmt_range("samples_per_s", ".1f")), *tokens,
                  ("step_ms", "step ms", ".2f"), ("vs_parcl", "vs parcl", ".2f"),
                  ("vs_range", "[min-max]", fmt_range("vs_parcl", ".2f")),
                  ("loss", "loss", ".5f")], rows)
    return result


def _rates(n: int, steps: int, stat: dict) -> dict:
    row = {"step_ms": stat["median"] / steps * 1e3}
    put_rate(row, "samples_per_s", n * steps, stat)
    return row


def parcl_step(q, model, x, y, capture: bool = False, name: str = "mlp"):
    """(step, sync): one parcl training step (batch upload included) and the queue's finish.
    With ``capture`` the forward and backward go through ``tp.capture`` (the first call runs
    eagerly and is recorded, later ones replay it) and the update runs after it, as in
    ``ReplicaGroup(capture=True)``: an optimizer's scalars change every step."""
    opt = models.optimizer(name, model.parameters())
    loss_fn = models.loss_of(model)

    def body(xd, yd):
        with tp.Tape() as tape:
            loss = loss_fn(model(tp.tensor(xd)), yd)
        tape.backward(loss)
        return loss.value

    run = tp.capture(body, q) if capture else (
        lambda xh, yh: body(pc.Tensor.from_host(q, xh), pc.Tensor.from_host(q, yh)))

    def step():
        loss = run(x, y)
        opt.step()
        opt.zero_grad()
        return LazyLoss(loss)

    return step, q.finish


def _numpy(name, state, x, y):
    ref = reference.NUMPY_MODELS[name](state)
    return (lambda: ref.step(x, y, models.LR)), None


def _pytorch(torch, name, state, x, y, threads, device="cpu"):
    """(step, sync): the same step in PyTorch on ``device`` ("cpu", or "cuda": the batch is
    copied to the GPU once, as parcl's is uploaded each step, and sync waits for the GPU)."""
    torch.set_num_threads(threads)
    model = models.torch_model(name, state).to(device)
    loss_fn = models.torch_loss(name)
    opt = models.torch_optimizer(torch, name, model.parameters())
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

    def step():
        loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step, (torch.cuda.synchronize if device == "cuda" else None)


def plot(result: dict, path: str) -> None:
    plt = require_matplotlib()
    rows = result["tables"]["compare"]["rows"]
    names = list(dict.fromkeys(r["model"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        vals = [next((r["samples_per_s"] for r in rows if r["model"] == m and r["impl"] == impl),
                     0.0) for m in names]
        ax.bar(np.arange(len(names)) + j * width, vals, width, label=impl)
    ax.set_xticks(np.arange(len(names)) + width * (len(impls) - 1) / 2)
    ax.set_xticklabels([f"{m} (batch {next(r['batch'] for r in rows if r['model'] == m)})"
                        for m in names])
    ax.set_yscale("log")
    ax.set_ylabel("samples/s (log)")
    ax.set_title("one training step, same weights and batch", fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, path)
