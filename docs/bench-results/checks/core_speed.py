"""Whether this machine's cores run at the same speed: the same single-threaded numpy matmul
loop pinned to core 0 and then to core 1, eight times in turn (Linux, 2 cores).

Usage: OPENBLAS_NUM_THREADS=1 python docs/bench-results/checks/core_speed.py
"""

import os
import time

import numpy as np


def work(a) -> float:
    start = time.perf_counter()
    for _ in range(200):
        a @ a
    return (time.perf_counter() - start) * 1e3


def main():
    a = np.random.default_rng(0).random((256, 256), dtype=np.float32)
    for _ in range(8):
        took = []
        for core in (0, 1):
            os.sched_setaffinity(0, {core})
            work(a)                                       # settle on the core first
            took.append(work(a))
        print(f"core 0 {took[0]:.1f} ms, core 1 {took[1]:.1f} ms, core 1 / core 0 "
              f"{took[1] / took[0]:.2f}")


if __name__ == "__main__":
    main()
