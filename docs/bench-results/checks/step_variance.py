"""How much one replica's step time varies, alone and beside a second replica.

Each replica thread replays its captured MLP forward + backward and finishes its queue 200
times, timing each replay (bare replays, as in ``parcl-bench scaling --ceiling``). A step that
synchronises the replicas takes the slower of the two; ``E[max] / mean`` pairs the i-th steps
of the two replicas (not aligned in time, so indicative only) to say what that costs when
nothing else does.

Usage: python docs/bench-results/checks/step_variance.py [steps] [model]
"""

import sys
import time

import numpy as np

import parcl as pc
from parcl.bench import models
from parcl.bench.scaling import capture_forward_backward
from parcl.replica import ReplicaGroup

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
MODEL = sys.argv[2] if len(sys.argv) > 2 else "mlp"
BATCH = models.DEFAULT_BATCH[MODEL]


def main():
    devs = pc.devices(split=2)
    for k in (1, 2):
        x, y = models.batch(MODEL, BATCH * k)
        times = {}

        def work(replica, x=x, y=y, times=times):
            step = capture_forward_backward(replica)
            lo = replica.index * BATCH
            shard = (x[lo:lo + BATCH], y[lo:lo + BATCH], np.array(1.0 / x.shape[0], np.float32))
            for _ in range(5):
                step(*shard)
                replica.queue.finish()
            spent = []
            for _ in range(STEPS):
                t = time.perf_counter()
                step(*shard)
                replica.queue.finish()
                spent.append(time.perf_counter() - t)
            times[replica.index] = np.array(spent) * 1e3

        with ReplicaGroup(models.builder(MODEL), devs[:k], capture=True) as group:
            group.run(work)
        for i, t in sorted(times.items()):
            print(f"{k} replica(s), replica {i}: step ms median {np.median(t):.2f}  "
                  f"p10 {np.percentile(t, 10):.2f}  p90 {np.percentile(t, 90):.2f}  "
                  f"CV {t.std() / t.mean():.3f}")
        if k == 2:
            both = np.maximum(times[0], times[1])
            print(f"  E[max of the two] / mean: "
                  f"{both.mean() / np.mean([times[0].mean(), times[1].mean()]):.3f}")


if __name__ == "__main__":
    main()
