"""Train a small MobileNet-style CNN (depthwise-separable convolutions) on the 8x8 digits.

    python examples/train_mobilenet_digits.py        # ~98% test accuracy in seconds

Each block is MobileNet's: a depthwise 3x3 convolution (``groups == channels``, one filter per
channel) and a pointwise 1x1 convolution that mixes the channels, each followed by batch
normalisation and a ReLU; the second block downsamples with a stride-2 depthwise convolution,
and global average pooling feeds the classifier. The digits ship inside scikit-learn
(``pc.data.load_digits(images=True)``), so nothing is downloaded. Adam with a learning rate
that warms up, then follows a cosine; each step records the forward pass on a tape and runs
backward.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tqdm import tqdm

import parcl as pc
import parcl.tape as tp
from parcl import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import accuracy, standardize, warmup_cosine  # noqa: E402


def separable(cin: int, cout: int, stride: int = 1, queue=None) -> list[nn.Module]:
    """Depthwise 3x3 (stride ``stride``) + BN + ReLU, then pointwise 1x1 + BN + ReLU."""
    return [nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False,
                      queue=queue), nn.BatchNorm2d(cin, queue=queue), nn.ReLU(),
            nn.Conv2d(cin, cout, 1, bias=False, queue=queue),
            nn.BatchNorm2d(cout, queue=queue), nn.ReLU()]


def build_mobilenet(queue=None, width: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False, queue=queue),     # 16 x 8 x 8
        nn.BatchNorm2d(width, queue=queue), nn.ReLU(),
        *separable(width, 2 * width, queue=queue),                      # 32 x 8 x 8
        *separable(2 * width, 4 * width, stride=2, queue=queue),        # 64 x 4 x 4
        *separable(4 * width, 4 * width, queue=queue),                  # 64 x 4 x 4
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4 * width, 10, queue=queue))


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=8e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    if args.epochs < 1:      # no epoch ran: "test accuracy: 0.0000", never measured
        p.error(f"--epochs must be >= 1, got {args.epochs}")

    x_train, y_train, x_test, y_test = pc.data.load_digits(images=True)
    x_train, x_test = standardize(x_train, x_test)
    queue = pc.default_queue()
    pc.nn.manual_seed(args.seed)
    model = build_mobilenet(queue)
    opt = pc.optim.Adam(model.parameters(), lr=args.lr)
    loader = pc.data.DataLoader((x_train, y_train), args.batch_size, shuffle=True,
                                seed=args.seed)
    print(f"mobilenet: {sum(p.value.size for p in model.parameters())} parameters on "
          f"{pc.describe(queue.device)}; {len(x_train)} train / {len(x_test)} test digits")

    scheduler = warmup_cosine(opt, args.epochs * len(loader))
    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        total, seen = 0.0, 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False,
                   disable=args.no_progress)
        for xb, yb in bar:
            with tp.Tape() as tape:
                loss = tp.cross_entropy(model(pc.Tensor.from_host(queue, xb)),
                                        pc.Tensor.from_host(queue, yb))
            tape.backward(loss)
            opt.step()
            scheduler.step()
            opt.zero_grad()
            value = float(loss)
            total += value * len(xb)
            seen += len(xb)
            bar.set_postfix(loss=f"{value:.3f}", refresh=False)
        model.eval()
        acc = accuracy(model, queue, x_test, y_test)
        print(f"epoch {epoch + 1}/{args.epochs}: train loss {total / seen:.4f}, "
              f"test accuracy {acc:.4f} ({time.perf_counter() - start:.1f} s)")
    print(f"test accuracy: {acc:.4f}")
    return acc


if __name__ == "__main__":
    main()
