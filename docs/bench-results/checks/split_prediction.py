"""Could a batch split that follows the replicas' recent speeds win back the per-step wait?

Two replica threads start every step together (a barrier, as a synchronised step does) and
each times its own bare replay (captured forward + backward, then finish its queue). From the
per-step times ``t0, t1`` this prints how predictable the imbalance ``log(t0 / t1)`` is from
the steps before (its autocorrelation), and what three step-time totals would be:

* lockstep: every step takes the slower replica's time, ``max(t0, t1)`` (what a synchronised
  step pays);
* adaptive: each replica's share of the next step's samples follows an exponential moving
  average of the past imbalance (time taken as proportional to samples);
* perfect balance: ``(t0 + t1) / 2`` (an oracle split, or work sharing inside the step).

Usage: python docs/bench-results/checks/split_prediction.py [steps] [model]
"""

import sys
import threading
import time

import numpy as np

import parcl as pc
from parcl.bench import models
from parcl.bench.scaling import capture_forward_backward
from parcl.replica import ReplicaGroup

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 400
MODEL = sys.argv[2] if len(sys.argv) > 2 else "mlp"
BATCH = models.DEFAULT_BATCH[MODEL]


def autocorrelation(v: np.ndarray, lag: int) -> float:
    v = v - v.mean()
    return float((v[:-lag] * v[lag:]).sum() / (v * v).sum())


def main():
    group = ReplicaGroup(models.builder(MODEL), pc.devices(split=2), capture=True)
    x, y = models.batch(MODEL, BATCH * 2)
    weight = np.array(0.5 / BATCH, np.float32)
    shards = [(x[:BATCH], y[:BATCH], weight), (x[BATCH:], y[BATCH:], weight)]
    steps = group.run(lambda r: capture_forward_backward(r))
    barrier = threading.Barrier(2)

    def replay(replica, shard, n):
        times = []
        for _ in range(n):
            barrier.wait()
            t = time.perf_counter()
            steps[replica.index](*shard)
            replica.queue.finish()
            times.append(time.perf_counter() - t)
        return np.array(times)

    group.run(replay, shards, [20, 20])                 # warm-up
    t0, t1 = group.run(replay, shards, [STEPS, STEPS])
    group.close()

    r = np.log(t0 / t1)
    print(f"{MODEL}, {STEPS} steps: mean step {t0.mean() * 1e3:.2f} / {t1.mean() * 1e3:.2f} ms, "
          f"CV {t0.std() / t0.mean():.3f} / {t1.std() / t1.mean():.3f}")
    print("autocorrelation of log(t0 / t1): "
          + ", ".join(f"lag {lag} {autocorrelation(r, lag):.2f}" for lag in (1, 2, 5, 20)))
    lockstep = np.maximum(t0, t1).sum()
    perfect = ((t0 + t1) / 2).sum()
    print(f"lockstep {lockstep:.3f} s; perfect balance {perfect:.3f} s "
          f"({lockstep / perfect:.3f}x faster)")
    for alpha in (0.1, 0.3, 0.5):
        estimate, total = 0.0, 0.0
        for i in range(STEPS):
            share0 = 2 / (1 + np.exp(estimate))          # the slower replica gets fewer samples
            total += max(t0[i] * share0, t1[i] * (2 - share0))
            estimate = (1 - alpha) * estimate + alpha * r[i]
        print(f"adaptive split, moving-average weight {alpha}: {total:.3f} s "
              f"({lockstep / total:.3f}x faster than lockstep)")


if __name__ == "__main__":
    main()
