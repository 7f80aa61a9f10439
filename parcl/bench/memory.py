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

``--checkpoint LxCxT,...`` adds table ``checkpoint``: activation checkpointing
(``tp.checkpoint``) on the GPT (``models.CheckpointedGPT``) of L layers, width C (4 heads,
vocabulary 98) and T tokens, batch ``--batch`` (default 16), one model run plain and with each
block checkpointed: ``fwd_bwd_peak_mb`` and ``held_mb`` (after the forward, above the bytes in
use before it) of both, ``peak_ratio`` and ``held_ratio`` (plain / checkpointed), the training
step (forward, backward, AdamW) ``step_ms`` of both, timed in alternation (``--repeat``,
default 5, after ``--warmup``, default 1) and ``time_ratio`` (checkpointed / plain, the median
of the per-round ratios). The first backward of each must give the same gradient bits, else
the benchmark fails (a ``BenchError`` naming the parameter).
"""

from __future__ import annotations

import gc
import time

import numpy as np

import parcl as pc
import parcl.tape as tp

from . import models
from .common import (
    BenchError,
    add_table,
    device_info,
    finisher,
    new_result,
    put_ratio,
    put_stat,
    repeat_of,
    require_matplotlib,
    resolve_devices,
    save_figure,
    time_interleaved,
    warmup_of,
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
    p.add_argument("--checkpoint", default="", metavar="LxCxT,...",
                   help="also GPTs of L layers, width C, T tokens run plain vs with every "
                        "block through tp.checkpoint: memory, step time, same gradients "
                        "(e.g. 4x128x64,12x128x256; batch --batch, default 16)")


def run(args) -> dict:
    names = [m.strip() for m in args.model.split(",") if m.strip()]
    for m in names:
        if m not in models.MODELS:
            raise BenchError(f"memory: unknown model {m!r}; choose from {models.MODELS}")
    if args.batch is not None and args.batch < 1:
        raise BenchError(f"--batch must be >= 1, got {args.batch}")
    gpts = _gpt_sizes(args.checkpoint)
    dev = resolve_devices(args.devices)[0]
    result = new_result("memory", {"models": names, "batch": args.batch,
                                   "image_size": args.image_size,
                                   "backward": not args.no_backward,
                                   "checkpoint": [list(g) for g in gpts]})
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
    if gpts:
        rows = [_measure_checkpoint(dev, *g, args) for g in gpts]
        add_table(result, "checkpoint", "tp.checkpoint on every GPT block: MB (2^20) above "
                  "those in use before the forward, and step time (fwd + bwd + AdamW)", [
                      ("model", "model", ""), ("batch", "batch", ""),
                      ("params_mb", "params MB", ".1f"),
                      ("plain_peak_mb", "fwd+bwd peak", ".1f"),
                      ("ckpt_peak_mb", "ckpt peak", ".1f"),
                      ("peak_ratio", "peak plain/ckpt", ".2f"),
                      ("plain_held_mb", "held after fwd", ".1f"),
                      ("ckpt_held_mb", "ckpt held", ".1f"),
                      ("held_ratio", "held plain/ckpt", ".2f"),
                      ("plain_ms", "step ms", ".1f"), ("ckpt_ms", "ckpt step ms", ".1f"),
                      ("time_ratio", "time ckpt/plain", ".2f"),
                      ("same_grads", "same grads", "")], rows)
        result["notes"].append("checkpoint: the same model and batch, plain and with each "
                               "block through tp.checkpoint; the first backward of each gave "
                               "the same gradient bits (checked); step times interleaved, "
                               "medians, time ratio the median of the per-round ratios.")
    return result


def _gpt_sizes(text: str) -> list[tuple[int, int, int]]:
    """``"4x128x64,12x128x256"`` -> ``[(4, 128, 64), (12, 128, 256)]`` (layers, width, T)."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        dims = part.lower().split("x")
        if len(dims) != 3:
            raise BenchError(f"--checkpoint: expected LAYERSxWIDTHxT (e.g. 4x128x64), got "
                             f"{part!r}")
        try:
            layers, width, t = (int(d) for d in dims)
        except ValueError:
            raise BenchError(f"--checkpoint: cannot read {part!r}: use e.g. 4x128x64") from None
        if min(layers, width, t) < 1 or width % 4:
            raise BenchError(f"--checkpoint: {part!r} needs sizes >= 1 and a width that is a "
                             "multiple of the 4 heads")
        sizes.append((layers, width, t))
    return sizes


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


def _measure_checkpoint(dev, layers: int, width: int, t: int, args) -> dict:
    """One GPT, plain and with its blocks checkpointed: memory of a recorded forward and its
    backward, gradient bits of both, then their training steps in alternation."""
    q = pc.new_queue(dev)
    previous = pc.default_queue()
    pc.set_default_queue(q)
    try:
        batch = args.batch or DEFAULT_BATCH["gpt"]
        cfg = {**models.GPT, "n_layer": layers, "n_embd": width, "block_size": t}
        pc.nn.manual_seed(0)
        model = models.CheckpointedGPT(**cfg, queue=q)
        model.train()
        rng = np.random.default_rng(0)
        ids = rng.integers(0, cfg["vocab_size"], (batch, t + 1))
        xt = pc.Tensor.from_host(q, ids[:, :-1].copy())
        yt = pc.Tensor.from_host(q, ids[:, 1:].copy())
        params = model.parameters()
        row = {"model": f"gpt {layers}x{width}, T={t}", "batch": batch,
               "params_mb": sum(p.value.nbytes for p in params) / MB}

        def forward_backward(checkpointed: bool):
            model.checkpoint = checkpointed
            tape = tp.Tape()
            with tape:
                loss = pc.nn.GPT.loss(model(xt), yt)
            tape.backward(loss)
            tape.release()

        grads = {}
        for checkpointed in (False, True, False, True):     # the first two warm up
            model.zero_grad(set_to_none=True)
            gc.collect()
            q.finish()
            base = pc.memory_stats(q)["bytes_in_use"]
            pc.reset_peak_memory_stats(q)
            model.checkpoint = checkpointed
            tape = tp.Tape()
            with tape:
                loss = pc.nn.GPT.loss(model(xt), yt)
            q.finish()
            held = _mb(pc.memory_stats(q), base, "bytes_in_use")
            tape.backward(loss)
            q.finish()
            key = "ckpt" if checkpointed else "plain"
            row[f"{key}_peak_mb"] = _mb(pc.memory_stats(q), base)
            row[f"{key}_held_mb"] = held
            grads[key] = [p.grad.to_host() for p in params]
            tape.release()
            del tape, loss
        for (name, _), a, b in zip(model.named_parameters(), grads["plain"], grads["ckpt"]):
            if a.tobytes() != b.tobytes():
                raise BenchError(f"checkpoint: {row['model']}: the checkpointed model's "
                                 f"gradient of {name} differs from the plain one's (max "
                                 f"|diff| {float(abs(a - b).max()):.3g}): tp.checkpoint must "
                                 "give the same bits")
        row["same_grads"] = True
        row["peak_ratio"] = row["plain_peak_mb"] / row["ckpt_peak_mb"]
        row["held_ratio"] = row["plain_held_mb"] / row["ckpt_held_mb"]
        model.zero_grad(set_to_none=True)

        opt = models.optimizer("gpt", params)

        def step(checkpointed: bool):
            def run():
                opt.zero_grad()
                forward_backward(checkpointed)
                opt.step()
            return run

        sync = finisher([q])
        plain, ckpt = time_interleaved([(step(False), sync), (step(True), sync)],
                                       repeat_of(args, 5), warmup_of(args, 1))
        put_stat(row, "plain_ms", plain, 1e3)
        put_stat(row, "ckpt_ms", ckpt, 1e3)
        put_ratio(row, "time_ratio", plain, ckpt)
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
