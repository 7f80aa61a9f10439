"""A character-level GPT trained on the Python standard library's own source files.

    python examples/train_gpt.py                                    # one replica
    parcl-launch --replicas 2 examples/train_gpt.py                 # 2 CPU sub-devices
    mpiexec -n 2 parcl-launch --replicas 1 examples/train_gpt.py    # 2 processes
    python examples/train_gpt.py --checkpoint run/ --save-every 500 [--resume]

The text is read from the running interpreter (``pc.data.text_corpus``: no download), split
into training and validation files, and cut into windows of ``--block-size`` characters
(``pc.data.TextLoader``, sharded by rank). The model is nanoGPT's (``pc.nn.GPT``: 4 layers,
width 128, 4 heads by default), trained with AdamW (weight decay on the 2-D weights only, as
nanoGPT's parameter groups), a linear warm-up then a cosine learning rate
(``pc.optim.lr_scheduler``). ``--batch-size`` is the global batch, split over every replica
of every rank. Only rank 0 prints: the train and validation loss in nats and bits per
character beside the unigram baseline (a model that knows only character frequencies), and
at the end a greedy and a sampled continuation. A checkpoint holds the model, the AdamW state,
the step, the loader's position and the schedule, so a run whose ``--checkpoint DIR`` holds
one continues where it stopped, as a ``parcl-launch --max-restarts`` restart needs
(``--resume`` insists on one; ``--max-steps`` is the whole run's length).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
from tqdm import tqdm

import parcl as pc
import parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup

PROMPT = "def "


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=1500,
                   help="training steps: the length of the run and of its schedule")
    p.add_argument("--stop-at", type=int, default=0, metavar="STEP",
                   help="stop (and save) at this step, the schedule unchanged: --resume "
                        "goes on from there")
    p.add_argument("--batch-size", type=int, default=16, help="global batch (all ranks)")
    p.add_argument("--block-size", type=int, default=64, help="context length T")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    p.add_argument("--min-lr", type=float, default=2e-4, help="learning rate at the end")
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=1.0, metavar="N",
                   help="clip the reduced gradient's global norm to N (0: no clipping)")
    p.add_argument("--max-chars", type=int, default=4_000_000,
                   help="characters of the standard library to read")
    p.add_argument("--eval-every", type=int, default=500, help="steps between evaluations")
    p.add_argument("--eval-batches", type=int, default=8,
                   help="validation batches (of 64 windows) per evaluation")
    p.add_argument("--sample-chars", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", metavar="DIR",
                   help="save DIR/last.safetensors at the end (and every --save-every steps); "
                        "continue from it when it exists")
    p.add_argument("--save-every", type=int, default=0, metavar="STEPS")
    p.add_argument("--resume", action="store_true",
                   help="continue from DIR/last.safetensors, which must exist")
    p.add_argument("--capture", action=argparse.BooleanOptionalAction, default=True,
                   help="record each replica's step once and replay it (default: on)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    # a negative --max-steps or --stop-at trained nothing, silently
    # (--eval-batches 0 ended the run at its first evaluation: division by zero)
    for name, least in (("eval_every", 1), ("eval_batches", 1), ("max_steps", 0),
                        ("stop_at", 0), ("save_every", 0), ("sample_chars", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint DIR")
    if args.save_every and not args.checkpoint:     # (was ignored: nothing saved)
        p.error("--save-every needs --checkpoint DIR")
    if args.batch_size % dist.world_size():
        p.error(f"--batch-size {args.batch_size} must divide by the {dist.world_size()} ranks")
    return args


def schedule_args(args: argparse.Namespace) -> dict:
    """The flags a checkpoint's scheduler and optimizer state fix (pc.load restores them)."""
    return {"max_steps": args.max_steps, "warmup": args.warmup, "lr": args.lr,
            "min_lr": args.min_lr, "weight_decay": args.weight_decay}


def check_schedule(path: str, saved: dict | None, args: argparse.Namespace) -> None:
    """A resumed run follows the checkpoint's schedule and optimizer settings whatever the
    command line says: refuse other ones rather than ignore them."""
    mine = schedule_args(args)
    if saved is None or saved == mine:         # (checkpoints before this check: no record)
        return
    flag = lambda k: "--" + k.replace("_", "-")     # noqa: E731
    raise SystemExit(f"{path} continues a run of "
                     + " ".join(f"{flag(k)} {v}" for k, v in saved.items())
                     + "; resume it with those (this run has "
                     + ", ".join(f"{flag(k)} {mine.get(k)}" for k, v in saved.items()
                                 if mine.get(k) != v)
                     + "; --stop-at stops it earlier)")


def param_groups(model: pc.nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's groups: weight decay on every 2-D weight (matmuls, embeddings), none on
    biases and layer norms."""
    params = model.parameters()
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def warmup_cosine(opt, total_steps: int, warmup: int, min_lr: float):
    """Linear warm-up from a tenth of the learning rate over ``warmup`` steps (none for 0),
    then a cosine down to ``min_lr``; step it once after every optimizer step."""
    sched = pc.optim.lr_scheduler
    if warmup <= 0:        # no warm-up asked for: max(1, ...) below gave a first step at lr/10
        return sched.CosineAnnealingLR(opt, T_max=max(1, total_steps), eta_min=min_lr)
    warmup = max(1, min(warmup, total_steps - 1))
    return sched.SequentialLR(opt, [
        sched.LinearLR(opt, start_factor=0.1, total_iters=warmup),
        sched.CosineAnnealingLR(opt, T_max=max(1, total_steps - warmup), eta_min=min_lr)],
        milestones=[warmup])


def evaluate(model: pc.nn.GPT, batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean loss (nats per character) over ``batches``, nothing recorded, dropout off."""
    model.eval()
    with tp.no_grad():
        queue = model.lm_head.weight.queue
        total = sum(float(pc.nn.GPT.loss(model(x), pc.Tensor.from_host(queue, y)))
                    for x, y in batches)
    model.train()
    return total / len(batches)


def bits(nats: float) -> float:
    return nats / math.log(2.0)


def main(argv=None) -> float:
    args = parse_args(argv)
    rank, world, is_main = dist.rank(), dist.world_size(), dist.is_main()
    log = print if is_main else (lambda *a, **k: None)

    corpus = pc.data.text_corpus(max_chars=args.max_chars)
    vocab = corpus.vocab
    baseline = corpus.unigram_baseline()
    loader = pc.data.TextLoader(corpus.train, args.block_size, args.batch_size // world,
                                seed=args.seed, rank=rank, world_size=world)
    val = pc.data.TextLoader(corpus.val, args.block_size, 64, seed=args.seed)
    val_batches = [b for b, _ in zip(val, range(args.eval_batches))]

    def build_model(queue):
        pc.nn.manual_seed(args.seed)                 # every replica, every rank: same weights
        return pc.nn.GPT(vocab.size, args.block_size, args.n_layer, args.n_head, args.n_embd,
                         dropout=args.dropout, queue=queue)

    with ReplicaGroup.from_launch(build_model, capture=args.capture) as group:
        # manual_seed above also seeded every replica's dropout generator with args.seed, so
        # every replica of every rank dropped the very same units of its own shard (masks
        # repeated across the global batch, unlike one device's); each now draws its own.
        group.run(lambda r: tp.manual_seed(int(
            np.random.SeedSequence([args.seed, rank, r.index]).generate_state(1)[0])))
        opt = pc.optim.AdamW(param_groups(group.model, args.weight_decay), lr=args.lr,
                             betas=(0.9, 0.99))
        scheduler = warmup_cosine(opt, args.max_steps, args.warmup, args.min_lr)
        n_params = sum(p.size for p in group.parameters())
        log(f"corpus: {len(corpus.train):,} training characters from "
            f"{len(corpus.train_files)} files, {len(corpus.val):,} validation characters from "
            f"{len(corpus.val_files)} files of {corpus.root}")
        log(f"unigram baseline: {baseline.nats:.4f} nats/char ({baseline.bits:.3f} bits/char)")
        devices = ", ".join(pc.describe(r.device) for r in group.replicas)
        log(f"GPT: {n_params:,} parameters; {len(group)} replicas x {world} ranks ({devices}); "
            f"global batch {args.batch_size} x {args.block_size} characters")

        path = os.path.join(args.checkpoint, "last.safetensors") if args.checkpoint else None
        step = 0
        # A checkpoint in DIR is continued from (what makes a parcl-launch --max-restarts
        # restart resume, as docs/launch.md says); --resume insists there is one.
        if args.resume or (path and os.path.exists(path)):
            meta = pc.load(path, group.model, opt, scheduler=scheduler)
            check_schedule(path, meta.get("schedule"), args)
            group.broadcast_parameters()             # the loaded weights to every replica
            step = int(meta["step"])
            loader.load_state_dict(meta["loader"])   # rank 0's position: every rank's
            saved = meta.get("dropout", [])          # every rank's replicas' generators
            saved = saved[rank] if rank < len(saved) and len(saved[rank]) and \
                isinstance(saved[rank][0], list) else saved    # (before: rank 0's only)
            if len(saved) == len(group):             # the same masks as in one run
                group.set_rng_state(saved)
            elif args.dropout > 0:                   # masks drawn afresh: say so, not silently
                log(f"note: the checkpoint has {len(saved)} dropout generators for "
                    f"{len(group)} replicas; this run draws its dropout masks afresh")
            log(f"resumed from {path} at step {step}")

        def save() -> None:
            dropout = dist.gather(group.rng_state())  # collective: every rank calls it
            if is_main:
                os.makedirs(args.checkpoint, exist_ok=True)
                pc.save(path, group.model, opt, step=step, scheduler=scheduler,
                        loader=loader.state_dict(), dropout=dropout,
                        schedule=schedule_args(args))

        stop = min(args.stop_at, args.max_steps) if args.stop_at else args.max_steps
        start, first, recent = time.perf_counter(), step, []
        val_loss = float("nan")
        bar = tqdm(total=args.max_steps, initial=step, desc="train", leave=False,
                   disable=args.no_progress or not is_main)
        while step < stop:
            for xb, yb in loader:
                lr = scheduler.get_last_lr()[0]      # this step's, as nanoGPT logs it
                recent.append(group.step(xb, yb, pc.nn.GPT.loss, opt,
                                         max_grad_norm=args.max_grad_norm or None))
                scheduler.step()
                step += 1
                bar.update()
                bar.set_postfix(loss=f"{recent[-1]:.3f}", refresh=False)
                if path and args.save_every and step % args.save_every == 0:
                    save()
                if step % args.eval_every == 0 or step == stop:
                    train_loss, recent = float(np.mean(recent)), []
                    if is_main:
                        val_loss = evaluate(group.model, val_batches)
                    bar.clear()
                    log(f"step {step}: train {train_loss:.4f} nats/char "
                        f"({bits(train_loss):.3f} bits), validation {val_loss:.4f} nats/char "
                        f"({bits(val_loss):.3f} bits), lr {lr:.2e} "
                        f"({time.perf_counter() - start:.0f} s)")
                if step >= stop:
                    break
        bar.close()
        elapsed = time.perf_counter() - start
        if path:
            save()
        if is_main and math.isnan(val_loss):     # no step ran: a finished run resumed, or
            val_loss = evaluate(group.model, val_batches)    # --max-steps 0; measure it
        if is_main:
            model = group.model.eval()
            prompt = vocab.encode(PROMPT).astype(np.int64)[None]
            greedy = model.generate(prompt, args.sample_chars, greedy=True)
            sampled = model.generate(prompt, args.sample_chars, temperature=0.8, top_k=20,
                                     seed=args.seed)
            log(f"--- greedy ---\n{vocab.decode(greedy[0])}")
            log(f"--- temperature 0.8, top-k 20 ---\n{vocab.decode(sampled[0])}")
            log("---")
    tokens = (step - first) * args.batch_size * args.block_size
    log(f"{step - first} steps in {elapsed:.0f} s ({tokens / max(elapsed, 1e-9):,.0f} "
        "characters/s)")
    log(f"validation: {val_loss:.4f} nats/char, {bits(val_loss):.3f} bits/char (unigram "
        f"baseline {baseline.nats:.4f} nats/char, {baseline.bits:.3f} bits/char)")
    return val_loss


if __name__ == "__main__":
    main()
