"""A small vision transformer on the 8x8 digits: each image as a sequence of 8 row tokens.

    python examples/train_vit_digits.py                       # ~98 % test accuracy
    parcl-launch --replicas 2 examples/train_vit_digits.py    # 2 CPU sub-devices

Each 8x8 image is a sequence of its 8 rows (``--patch 0``, the default) or of square
patches (``--patch 2``: 16 patches of 2x2 pixels, cut by a reshape and transpose inside the
model), each token embedded by a Linear layer, a learned position embedding added, then
``--depth`` pre-norm encoder blocks (bidirectional multi-head attention, GELU MLP), mean
pooling over the tokens, a layer norm and a linear classifier. AdamW, a cosine learning
rate (``pc.optim.lr_scheduler``), random one-pixel shifts of the training images.
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
from parcl.nn.module import normal_
from parcl.replica import ReplicaGroup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import accuracy  # noqa: E402
from train_digits_dp import shift_augment  # noqa: E402



class SelfAttention(pc.nn.Module):
    """Multi-head attention over every position (no causal mask)."""

    def __init__(self, dim: int, heads: int, *, queue=None):
        super().__init__()
        self.qkv = pc.nn.Linear(dim, 3 * dim, queue=queue)
        self.proj = pc.nn.Linear(dim, dim, queue=queue)
        self.dim, self.heads = dim, heads

    def forward(self, x):
        n, t, _ = x.shape
        split = (n, t, self.heads, self.dim // self.heads)
        q, k, v = (tp.transpose(tp.reshape(part, split), (0, 2, 1, 3))
                   for part in tp.split(self.qkv(x), self.dim, axis=2))
        y = tp.scaled_dot_product_attention(q, k, v)
        return self.proj(tp.reshape(tp.transpose(y, (0, 2, 1, 3)), (n, t, self.dim)))


class EncoderBlock(pc.nn.Module):
    def __init__(self, dim: int, heads: int, *, queue=None):
        super().__init__()
        self.ln_1 = pc.nn.LayerNorm(dim, queue=queue)
        self.attn = SelfAttention(dim, heads, queue=queue)
        self.ln_2 = pc.nn.LayerNorm(dim, queue=queue)
        self.fc = pc.nn.Linear(dim, 2 * dim, queue=queue)
        self.gelu = pc.nn.GELU()
        self.out = pc.nn.Linear(2 * dim, dim, queue=queue)

    def forward(self, x):
        x = tp.add(x, self.attn(self.ln_1(x)))
        return tp.add(x, self.out(self.gelu(self.fc(self.ln_2(x)))))


def tokens(x, patch: int):
    """``(N, 1, 8, 8)`` images as sequences: ``patch=0`` the 8 rows (8 pixels each), else the
    ``(8/patch)^2`` patches of ``patch`` x ``patch`` pixels in row-major order."""
    n = x.shape[0]
    if patch == 0:
        return tp.reshape(x, (n, 8, 8))
    side = 8 // patch
    # (N, 1, 8, 8) -> (N, side, patch, side, patch) -> (N, side, side, patch, patch)
    grid = tp.transpose(tp.reshape(x, (n, side, patch, side, patch)), (0, 1, 3, 2, 4))
    return tp.reshape(grid, (n, side * side, patch * patch))


class ViT(pc.nn.Module):
    """``(N, 1, 8, 8)`` images to ``(N, 10)`` logits."""

    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 4, patch: int = 2, *,
                 queue=None):
        super().__init__()
        if patch not in (0, 1, 2, 4, 8):
            raise ValueError(f"ViT: patch must be 0 (rows) or divide 8, got {patch}")
        self.patch = patch
        length, width = (8, 8) if patch == 0 else ((8 // patch) ** 2, patch * patch)
        self.embed = pc.nn.Linear(width, dim, queue=queue)
        self.pos = pc.nn.Parameter.from_host(queue, normal_((length, dim), 0.02))
        self.blocks = pc.nn.ModuleList([EncoderBlock(dim, heads, queue=queue)
                                        for _ in range(depth)])
        self.norm = pc.nn.LayerNorm(dim, queue=queue)
        self.head = pc.nn.Linear(dim, 10, queue=queue)

    def forward(self, x):
        h = tp.add(self.embed(tokens(x, self.patch)), self.pos)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(tp.mean(h, axis=1)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (all ranks)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--patch", type=int, default=0,
                   help="patch side in pixels (1, 2, 4, 8), or 0: one token per image row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0,
                   help="train this many steps at most: the cosine then spans them, so a short "
                        "run anneals to zero (unlike train_digits_dp.py's, which only stops)")
    p.add_argument("--capture", action=argparse.BooleanOptionalAction, default=True,
                   help="record each replica's step once and replay it (default: on)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    # --epochs 0 and a negative --max-steps failed in the scheduler (T_max must be a positive
    # int), --heads 5 of --dim 64 in a reshape of the first step
    for name, least in (("epochs", 1), ("max_steps", 0), ("heads", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if args.dim % args.heads:
        p.error(f"--heads {args.heads} must divide --dim {args.dim}")
    if args.patch not in (0, 1, 2, 4, 8):
        p.error(f"--patch must be 0 (rows) or divide 8 (1, 2, 4, 8), got {args.patch}")
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
    rng = np.random.default_rng([args.seed, rank])

    def build_model(queue):
        pc.nn.manual_seed(args.seed)
        return ViT(args.dim, args.depth, args.heads, args.patch, queue=queue)

    with ReplicaGroup.from_launch(build_model, capture=args.capture) as group:
        params = group.parameters()
        opt = pc.optim.AdamW([{"params": [p for p in params if p.ndim >= 2]},
                              {"params": [p for p in params if p.ndim < 2],
                               "weight_decay": 0.0}], lr=args.lr, weight_decay=0.05)
        total = args.epochs * len(loader)
        if args.max_steps:
            total = min(total, args.max_steps)
        scheduler = pc.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        seq = "8 rows" if args.patch == 0 else f"{(8 // args.patch) ** 2} patches of " \
            f"{args.patch}x{args.patch}"
        log(f"ViT: {sum(p.size for p in params):,} parameters, {seq}; {len(group)} replicas "
            f"x {world} ranks; global batch {args.batch_size}")
        start, step, acc = time.perf_counter(), 0, float("nan")
        for epoch in range(args.epochs):
            losses = []
            bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False,
                       disable=args.no_progress or not is_main)
            for xb, yb in bar:
                xb = ((shift_augment(xb, rng) - mean) / std).astype(np.float32)
                losses.append(group.step(xb, yb, tp.cross_entropy, opt))
                scheduler.step()
                step += 1
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                if step >= total:
                    break
            bar.close()
            last = step >= total or epoch + 1 == args.epochs
            if is_main and (last or (epoch + 1) % 5 == 0):
                group.model.eval()
                acc = accuracy(group.model, group.replicas[0].queue, x_test, y_test)
                group.model.train()
                log(f"epoch {epoch + 1}: train loss {np.mean(losses):.4f}, test accuracy "
                    f"{acc:.4f} ({time.perf_counter() - start:.1f} s)")
            if step >= total:
                break
    log(f"test accuracy: {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
