"""What sharing a step's last GEMM between two CPU sub-devices wins (ReplicaGroup._help_tails).

Opens three captured groups at once: two replicas on the CPU split in two with the tail shared
(the default there), the same without it (``_share_tails`` off before the first step, so
nothing is recorded for sharing), and one replica on one sub-device. Rounds of ``10`` steps of
each run in a seeded shuffled order; prints the median step times, the median per-round ratio
of the unshared to the shared step with a bootstrap 95 % CI, and each 2-replica group's weak
scaling against the 1-replica group in the same rounds.

Usage: python docs/bench-results/checks/tail_sharing.py [model] [rounds]
"""

import sys
import time

import numpy as np

import parcl as pc
from parcl import tape as tp
from parcl.bench import models
from parcl.bench.common import median_ci
from parcl.replica import ReplicaGroup

MODEL = sys.argv[1] if len(sys.argv) > 1 else "mlp"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
STEPS = 10


def open_group(devices, batch, share):
    group = ReplicaGroup(models.builder(MODEL), devices, capture=True)
    group._share_tails = group._share_tails and share
    opt = pc.optim.SGD(group.parameters(), lr=models.LR)
    x, y = models.batch(MODEL, batch)
    for _ in range(3):                       # record, then replay
        group.step(x, y, tp.cross_entropy, opt)
    return group, opt, x, y


def main():
    devs = pc.devices(split=2)
    batch = models.DEFAULT_BATCH[MODEL]
    runs = {"shared": open_group(devs, 2 * batch, True),
            "unshared": open_group(devs, 2 * batch, False),
            "one": open_group(devs[:1], batch, False)}
    times = {name: [] for name in runs}
    order = np.random.default_rng(1)
    names = list(runs)
    for _ in range(ROUNDS):
        for i in order.permutation(len(names)):
            group, opt, x, y = runs[names[i]]
            t0 = time.perf_counter()
            for _ in range(STEPS):
                group.step(x, y, tp.cross_entropy, opt)
            times[names[i]].append(time.perf_counter() - t0)
    shared, unshared, one = (np.array(times[n]) for n in ("shared", "unshared", "one"))
    ms = {n: np.median(t) / STEPS * 1e3 for n, t in times.items()}
    print(f"{MODEL}, {ROUNDS} rounds of {STEPS} steps: step ms shared {ms['shared']:.2f}, "
          f"unshared {ms['unshared']:.2f}, 1 replica {ms['one']:.2f}")
    ratio = unshared / shared
    lo, hi = median_ci(list(ratio))
    print(f"  unshared / shared step time: median {np.median(ratio):.3f} "
          f"[95% CI {lo:.3f}-{hi:.3f}]")
    for name, t in (("shared", shared), ("unshared", unshared)):
        speedup = 2 * one / t
        lo, hi = median_ci(list(speedup))
        print(f"  weak scaling, {name}: {np.median(speedup):.3f} [95% CI {lo:.3f}-{hi:.3f}]")
    for group, *_ in runs.values():
        group.close()


if __name__ == "__main__":
    main()
