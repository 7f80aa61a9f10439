"""PyTorch's scaled_dot_product_attention step (forward + backward, causal) on the shapes of
attention_kernels.py, alone in its process, on 1 and 2 threads.

Usage: python docs/bench-results/checks/attention_torch.py [repeats]
"""

import sys
import time

import numpy as np
import torch

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 50


def step(q, k, v, g):
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    y.backward(g)
    for t in (q, k, v):
        t.grad = None


for threads in (1, 2):
    torch.set_num_threads(threads)
    args = [torch.randn(16, 4, 64, 32, requires_grad=True) for _ in range(3)]
    args.append(torch.randn(16, 4, 64, 32))
    for _ in range(5):
        step(*args)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        step(*args)
        times.append(time.perf_counter() - t0)
    print(f"{np.median(times) * 1e3:8.3f} ms  PyTorch {torch.__version__} "
          f"scaled_dot_product_attention forward + backward (16, 4, 64, 32), causal, "
          f"{threads} thread(s)")
