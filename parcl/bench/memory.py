"""``parcl-bench memory``: what the tape keeps alive, from the memory pool's counters.

For each model (default ``resnet18`` at batch 24 of 3x224x224, netcl's figure says the tape
adds about 600 MB there, and the MLP at batch 256), on one queue:

1. a forward pass under ``tp.no_grad()``: its peak pool bytes above what was in use before
   (parameters and the input), then what is still in use once the output is dropped;
2. the same forward recorded on a ``tp.Tape``: its peak, and what it holds once the forward
   is done (the activations backward will read);
3. ``tape.backward(loss)`` (skip with ``--no-backward``): the peak of forward + backward;
4. ``tape.release()``: what is still in use (the parameters' gradients, after a backward),
   and after ``model.zero_grad()`` too.

Peaks come from ``pc.reset_peak_memory_stats`` / ``pc.memory_stats`` (``peak_bytes_in_use``);
the pool rounds each buffer up to its size bin (at most ~25 % more), and the numbers count that.
The model runs in training mode both times (BatchNorm uses batch statistics).

JSON rows (table ``memory``): ``model``, ``batch``, ``input``, ``params_mb``,
``nograd_peak_mb``, ``nograd_after_mb``, ``tape_peak_mb``, ``tape_held_mb``, ``tape_extra_mb``
(tape peak - no_grad peak), ``tape_ratio`` (tape peak / no_grad peak), ``backward_peak_mb``,
``released_mb``, ``zero_grad_mb``, ``forward_ms``, ``forward_tape_ms``. MB = 2**20 bytes, all
relative to the bytes in use before the forward. ``torch_saved_mb``: what PyTorch's autograd
saves in the same forward of its twin of the model (mlp, cnn, gpt; None without PyTorch), to
compare with ``tape_held_mb``.
"""

from __future__ import annotations

import gc
import time

import parcl as pc
import parcl.tape as tp

from . import models
from .common import (
    BenchError,
    add_table,
    device_info,
    new_result,
    require_matplotlib,
    resolve_devices,
    save_figure,
)

MB = float(1 << 20)
# every model of models.MODELS (digits and mobilenet failed with a KeyError): ResNet-18 at
# netcl's batch of 24, the others at their usual batch
DEFAULT_BATCH = {**models.DEFAULT_BATCH, "resnet18": 24}


def add_arguments(p) -> None:
    p.add_argument("--model", default="resnet18,mlp", help="models (default resnet18,mlp)")
    p.add_argument("--batch", type=int, default=None,
                   help=f"batch (default per model: {DEFAULT_BATCH})")
    p.add_argument("--image-size", type=int, default=224,
                   help="resnet18 input size (default 224: 3x224x224)")
    p.add_argument("--devices", default="cpu", metavar="SPEC",
                   help="device (default cpu: the whole CPU device)")
    p.add_argument("--no-backward", action="store_true", help="skip the backward measurement")


def run(args) -> dict:
    names = [m.strip() for m in args.model.split(",") if m.strip()]
    for m in names:
        if m not in models.MODELS:
            raise BenchError(f"memory: unknown model {m!r}; choose from {models.MODELS}")
    if args.batch is not None and args.batch < 1:
        raise BenchError(f"--batch must be >= 1, got {args.batch}")
    dev = resolve_devices(args.devices)[0]
    result = new_result("memory", {"models": names, "batch": args.batch,
                                   "image_size": args.image_size,
                                   "backward": not args.no_backward})
    result["devices"] = [device_info(dev, "queue")]
    rows = [_measure(dev, name, args) for name in names]
    add_table(result, "memory", "pool bytes (MB = 2^20) above those in use before the "
              "forward: forward under no_grad vs recorded on a tape", [
                  ("model", "model", ""), ("batch", "batch", ""), ("input", "input", ""),
                  ("params_mb", "params MB", ".1f"),
                  ("nograd_peak_mb", "no_grad peak", ".1f"),
                  ("tape_peak_mb", "tape peak", ".1f"), ("tape_extra_mb", "tape adds", ".1f"),
                  ("tape_ratio", "tape/no_grad", ".2f"),
                  ("tape_held_mb", "held after fwd", ".1f"),
                  ("torch_saved_mb", "torch saved", ".1f"),
                  ("backward_peak_mb", "fwd+bwd peak", ".1f"),
                  ("released_mb", "after release", ".1f"),
                  ("zero_grad_mb", "after zero_grad", ".1f")], rows)
    result["notes"].append("'after release' still holds the parameters' gradients when a "
                           "backward ran; 'after zero_grad' drops them (set_to_none).")
    return result


def _mb(stats: dict, base: int, key: str = "peak_bytes_in_use") -> float:
    return (stats[key] - base) / MB


def _measure(dev, name: str, args) -> dict:
    q = pc.new_queue(dev)
    previous = pc.default_queue()
    pc.set_default_queue(q)
    try:
        batch = args.batch or DEFAULT_BATCH[name]
        model = models.builder(name)(q)
        model.train()
        x, y = models.batch(name, batch, args.image_size)
        xt = pc.Tensor.from_host(q, x)
        yt = pc.Tensor.from_host(q, y)
        params = sum(p.value.nbytes for p in model.parameters())
        with tp.no_grad():                      # warm-up: kernels built, pool bins filled
            out = model(xt)
        del out
        q.finish()
        gc.collect()
        base = pc.memory_stats(q)["bytes_in_use"]
        row = {"model": name, "batch": batch, "input": "x".join(map(str, x.shape[1:])),
               "params_mb": params / MB}

        pc.reset_peak_memory_stats(q)
        t0 = time.perf_counter()
        with tp.no_grad():
            out = model(xt)
        q.finish()
        row["forward_ms"] = (time.perf_counter() - t0) * 1e3
        row["nograd_peak_mb"] = _mb(pc.memory_stats(q), base)
        del out
        gc.collect()
        row["nograd_after_mb"] = _mb(pc.memory_stats(q), base, "bytes_in_use")

        pc.reset_peak_memory_stats(q)
        t0 = time.perf_counter()
        tape = tp.Tape()
        with tape:
            loss = models.loss_of(model)(model(tp.tensor(xt)), yt)
        q.finish()
        row["forward_tape_ms"] = (time.perf_counter() - t0) * 1e3
        stats = pc.memory_stats(q)
        row["tape_peak_mb"] = _mb(stats, base)
        row["tape_held_mb"] = _mb(stats, base, "bytes_in_use")
        if not args.no_backward:
            tape.backward(loss)
            q.finish()
            row["backward_peak_mb"] = _mb(pc.memory_stats(q), base)
        tape.release()
        del tape, loss
        gc.collect()
        q.finish()
        row["released_mb"] = _mb(pc.memory_stats(q), base, "bytes_in_use")
        model.zero_grad(set_to_none=True)
        gc.collect()
        row["zero_grad_mb"] = _mb(pc.memory_stats(q), base, "bytes_in_use")
        row["tape_extra_mb"] = row["tape_peak_mb"] - row["nograd_peak_mb"]
        row["tape_ratio"] = (row["tape_peak_mb"] / row["nograd_peak_mb"]
                             if row["nograd_peak_mb"] > 0 else None)
        row["torch_saved_mb"] = _torch_saved_mb(name, model.state_dict(), x, y)
        return row
    finally:
        pc.set_default_queue(previous)


def _torch_saved_mb(name: str, state: dict, x, y) -> float | None:
    """What PyTorch's autograd keeps for backward after the same forward (its twin of the
    model with these weights, where there is one and PyTorch is installed): the bytes of the
    distinct storages its graph saved, parameters and input left out, as ``tape_held_mb``
    leaves them out."""
    try:
        import torch
        twin = models.torch_model(name, state)
    except (ImportError, ValueError):
        return None
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = twin(xt)
        loss = models.torch_loss(name)(out, yt)
    mine = {p.untyped_storage().data_ptr() for p in twin.parameters()}
    mine.add(xt.untyped_storage().data_ptr())
    del loss, out
    return sum(n for ptr, n in saved.items() if ptr not in mine) / MB


def plot(result: dict, path: str) -> None:
    plt = require_matplotlib()
    import numpy as np

    rows = result["tables"]["memory"]["rows"]
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    keys = [("nograd_peak_mb", "forward, no_grad"), ("tape_peak_mb", "forward, tape"),
            ("tape_held_mb", "held by tape after fwd"), ("backward_peak_mb", "fwd + bwd")]
    keys = [k for k in keys if any(r.get(k[0]) is not None for r in rows)]
    width = 0.8 / len(keys)
    for j, (key, label) in enumerate(keys):
        ax.bar(np.arange(len(rows)) + j * width, [r.get(key) or 0.0 for r in rows], width,
               label=label)
    ax.set_xticks(np.arange(len(rows)) + width * (len(keys) - 1) / 2)
    ax.set_xticklabels([f"{r['model']} b{r['batch']}\n{r['input']}" for r in rows],
                       fontsize=8)
    ax.set_ylabel("MB above baseline (log)")
    ax.set_yscale("log")
    ax.set_title("peak pool memory: tape vs no_grad", fontsize=10)
    ax.legend(fontsize=7)
    save_figure(fig, path)
