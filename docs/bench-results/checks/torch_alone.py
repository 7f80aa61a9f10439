"""PyTorch's training step alone in a process (no parcl, no numpy BLAS calls), 1 and 2 threads.

Run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python docs/bench-results/checks/torch_alone.py
Output of the run quoted in docs/performance.md: torch_alone.txt.
"""

import time

import numpy as np
import torch
from torch import nn


def build(model):
    if model == "mlp":
        m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
        return m, torch.randn(256, 784), 10
    m = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 10))
    return m, torch.randn(64, 1, 28, 28), 3


for model in ("mlp", "cnn"):
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        m, x, k = build(model)
        y = torch.randint(0, 10, (x.shape[0],))
        opt = torch.optim.SGD(m.parameters(), lr=0.01)

        def step(m=m, x=x, y=y, opt=opt):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()

        for _ in range(3):
            step()
        ts = []
        for _ in range(15):
            t0 = time.perf_counter()
            for _ in range(k):
                step()
            ts.append((time.perf_counter() - t0) / k)
        ts = np.array(ts)
        n = x.shape[0]
        print(f"{model} threads={threads}: {n / np.median(ts):.0f} samples/s "
              f"[{n / ts.max():.0f}-{n / ts.min():.0f}]")
