"""Data-parallel training of the digits CNN: one replica per device, one thread each.

    parcl-launch --replicas 2 examples/train_digits_dp.py               # 2 CPU sub-devices
    mpiexec -n 2 parcl-launch --replicas 1 examples/train_digits_dp.py  # 2 processes
    parcl-launch --replicas 2 examples/train_digits_dp.py --checkpoint run/   # saves each epoch
    parcl-launch --max-restarts 3 --replicas 2 examples/train_digits_dp.py --checkpoint run/

``ReplicaGroup.from_launch`` takes the devices (and, under mpiexec, the MPI communicator) that
parcl-launch chose. ``--batch-size`` is the global batch: each rank loads its share
(``DataLoader(rank=, world_size=)``) and ``group.step`` splits it over the local replicas, so the
result does not depend on how many processes and replicas run it. Only rank 0 prints and writes
checkpoints. Each replica's step is recorded once and replayed (``capture=True``), which gives
the eager step's results bit for bit with far less Python; ``--no-capture`` runs it eagerly.

The learning rate warms up and then follows a cosine (``warmup_cosine``: ``LinearLR`` then
``CosineAnnealingLR``), one scheduler step after every optimizer step, and the reduced
gradient's global norm is clipped to ``--max-grad-norm`` (``group.step(max_grad_norm=)``,
the same norm on every replica and rank). A checkpoint
(``DIR/last.safetensors``, written atomically) holds the model, the Adam state, the scheduler,
the step, the epoch, the data loader's position and every rank's augmentation RNG state. When
``DIR`` holds one, the run resumes from it (``--resume`` insists on one), bit-identically to an
uninterrupted run, data order included; so under ``parcl-launch --max-restarts N`` a crashed
run is simply started again and continues from its last checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import parcl as pc
import parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import accuracy, build_cnn, warmup_cosine  # noqa: E402


def shift_augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Move each raw (unstandardised) image by up to one pixel in each direction."""
    n = len(x)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    dy, dx = rng.integers(0, 3, size=n), rng.integers(0, 3, size=n)
    return np.stack([padded[i, :, dy[i]:dy[i] + 8, dx[i]:dx[i] + 8] for i in range(n)])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (all ranks)")
    p.add_argument("--lr", type=float, default=8e-3,
                   help="Adam learning rate (after the warm-up; cosine decay)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, metavar="N",
                   help="clip the reduced gradient's global norm to N (0: no clipping)")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True,
                   help="random one-pixel shifts of the training images (default: on)")
    p.add_argument("--checkpoint", metavar="DIR", help="save DIR/last.safetensors")
    p.add_argument("--save-every", type=int, default=0, metavar="STEPS",
                   help="save every STEPS steps (default: at the end of every epoch)")
    p.add_argument("--resume", action="store_true",
                   help="continue from DIR/last.safetensors, which must exist (without it the "
                        "run continues from it when it exists, else starts afresh)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop (and save) after this many steps in total")
    p.add_argument("--capture", action=argparse.BooleanOptionalAction, default=True,
                   help="record each replica's step once and replay it: the same results with "
                        "far less Python per step (default: on; --no-capture runs every step "
                        "eagerly)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    # a negative --max-steps or no epoch trained nothing and printed the untrained accuracy
    for name, least in (("epochs", 1), ("max_steps", 0), ("save_every", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint DIR")
    if args.save_every and not args.checkpoint:     # (was ignored: nothing saved)
        p.error("--save-every needs --checkpoint DIR")
    if args.batch_size % dist.world_size():
        p.error(f"--batch-size {args.batch_size} must divide by the {dist.world_size()} ranks")
    return args


def main(argv=None) -> float:
    args = parse_args(argv)
    rank, world, is_main = dist.rank(), dist.world_size(), dist.is_main()
    log = print if is_main else (lambda *a, **k: None)

    x_train, y_train, x_test, y_test = pc.data.load_digits(images=True)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + np.float32(0.1)
    x_test = ((x_test - mean) / std).astype(np.float32)
    loader = pc.data.DataLoader((x_train, y_train), args.batch_size // world, shuffle=True,
                                seed=args.seed, drop_last=True, rank=rank, world_size=world)
    rng = np.random.default_rng([args.seed, rank])   # this rank's augmentation randomness

    def build_model(queue):
        pc.nn.manual_seed(args.seed)                 # every replica, every rank: same weights
        return build_cnn(queue)

    with ReplicaGroup.from_launch(build_model, capture=args.capture) as group:
        opt = pc.optim.Adam(group.parameters(), lr=args.lr)
        # The schedule spans the whole run (--max-steps only stops early), so a run stopped,
        # crashed or resumed follows the very learning rates of an uninterrupted one.
        scheduler = warmup_cosine(opt, args.epochs * len(loader))
        path = os.path.join(args.checkpoint, "last.safetensors") if args.checkpoint else None
        step = 0
        if args.resume or (path and os.path.exists(path)):
            meta = pc.load(path, group.model, opt, scheduler=scheduler)
            if meta.get("world_size") != world:
                raise SystemExit(f"{path} was saved by {meta.get('world_size')} ranks; resume "
                                 f"it with as many (this run has {world})")
            # the scheduler and Adam's lr come from the checkpoint: other flags would be ignored
            saved_schedule = meta.get("schedule", {"epochs": args.epochs, "lr": args.lr})
            if saved_schedule != {"epochs": args.epochs, "lr": args.lr}:
                raise SystemExit(f"{path} continues a run of --epochs "
                                 f"{saved_schedule['epochs']} --lr {saved_schedule['lr']}; "
                                 f"resume it with those (this run has --epochs {args.epochs} "
                                 f"--lr {args.lr}; --max-steps stops it earlier)")
            group.broadcast_parameters()             # the loaded weights to every replica
            step = int(meta["step"])
            loader.load_state_dict(meta["loader"])
            rng.bit_generator.state = meta["rng"][rank]
            restarts = os.environ.get("PARCL_RESTART_COUNT", "0")
            log(f"resumed from {path} at step {step} (epoch {loader.epoch + 1}, "
                f"batch {loader.batch_index})"
                + (f" after restart {restarts}" if restarts != "0" else ""))
        if path and is_main:
            os.makedirs(args.checkpoint, exist_ok=True)

        saved = step

        def save() -> None:
            nonlocal saved
            saved = step
            states = dist.gather(rng.bit_generator.state)    # collective: every rank calls it
            if is_main:
                pc.save(path, group.model, opt, step=step, scheduler=scheduler,
                        epoch=loader.state_dict()["epoch"], loader=loader.state_dict(),
                        rng=states, world_size=world,
                        schedule={"epochs": args.epochs, "lr": args.lr})

        total_steps = args.epochs * len(loader)
        if args.max_steps:
            total_steps = min(total_steps, args.max_steps)
        devices = ", ".join(pc.describe(r.device) for r in group.replicas)
        log(f"{len(group)} replicas x {world} ranks ({devices}); global batch "
            f"{args.batch_size}; {len(loader)} steps per epoch")

        start, acc = time.perf_counter(), float("nan")
        while step < total_steps:
            epoch, first = loader.epoch, loader.batch_index
            losses = []
            bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", total=len(loader),
                       initial=first, leave=False, disable=args.no_progress or not is_main)
            for xb, yb in bar:
                if args.augment:
                    xb = shift_augment(xb, rng)
                xb = ((xb - mean) / std).astype(np.float32)
                losses.append(group.step(xb, yb, tp.cross_entropy, opt,
                                         max_grad_norm=args.max_grad_norm or None))
                scheduler.step()
                step += 1
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                if path and args.save_every and step % args.save_every == 0:
                    save()
                if step >= total_steps:
                    break
            bar.close()
            if path and (not args.save_every or step >= total_steps) and saved != step:
                save()
            if is_main:
                group.model.eval()
                acc = accuracy(group.model, group.replicas[0].queue, x_test, y_test)
                group.model.train()
            done = "" if loader.state_dict()["epoch"] > epoch else f" (stopped at step {step})"
            log(f"epoch {epoch + 1}/{args.epochs}{done}: train loss "
                f"{np.mean(losses) if losses else float('nan'):.4f}, test accuracy {acc:.4f} "
                f"({time.perf_counter() - start:.1f} s)")
        if is_main and np.isnan(acc):    # resumed a run that had already finished
            acc = accuracy(group.model, group.replicas[0].queue, x_test, y_test)
    log(f"test accuracy: {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
