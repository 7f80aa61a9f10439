"""Where a 2-replica step loses against two bare replays: the step's parts added one at a time.

Four kinds of run, each with 1 and 2 replicas on the CPU split in two, timed in rounds of a
seeded shuffled order (every kind and count once per round); the speedup of each kind is the
median of per-round 2-vs-1 ratios with a bootstrap 95 % CI:

* bare: each replica thread replays its captured forward + backward and finishes its queue,
  ``steps`` times, in one dispatched call (``parcl-bench scaling --ceiling``);
* bare+barrier: the same, the replica threads waiting for each other after every step;
* bare+dispatch: one ``group.run`` per step from the caller instead (dispatch and join);
* step: ``group.step`` (the sharded end of the step and the loss reads added).

Usage: python docs/bench-results/checks/step_parts.py [model] [rounds]
"""

import sys
import threading

import numpy as np

import parcl as pc
from parcl import tape as tp
from parcl.bench import models
from parcl.bench.common import median_ci, time_interleaved
from parcl.bench.scaling import _bare, capture_forward_backward
from parcl.replica import ReplicaGroup

MODEL = sys.argv[1] if len(sys.argv) > 1 else "mlp"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 41
STEPS = 10
KINDS = ("bare", "bare+barrier", "bare+dispatch", "step")


def with_barrier(group, x, y, steps):
    """Like ``_bare``, with a barrier between the replica threads after every step."""
    k = len(group.replicas)
    barrier = threading.Barrier(k)
    captured = {}

    def replay(replica):
        q = replica.queue
        cap = captured.get(replica.index)
        if cap is None:
            shard = x.shape[0] // k
            lo = replica.index * shard
            xs, ys = x[lo:lo + shard], y[lo:lo + shard]
            w = np.array(1.0 / x.shape[0], np.float32)
            cap = captured[replica.index] = (capture_forward_backward(replica), (xs, ys, w))
        for _ in range(steps):
            cap[0](*cap[1])
            q.finish()
            barrier.wait(10)

    return lambda: group.run(replay)


def repeated(one_step):
    def run_steps():
        for _ in range(STEPS):
            one_step()
    return run_steps


def main():
    devs = pc.devices(split=2)
    runs = {}
    for k in (1, 2):
        x, y = models.batch(MODEL, models.DEFAULT_BATCH[MODEL] * k)
        for kind in KINDS:
            g = ReplicaGroup(models.builder(MODEL), devs[:k], capture=True)
            opt = pc.optim.SGD(g.parameters(), lr=models.LR)
            if kind == "bare":
                fn = _bare(g, x, y, STEPS)
            elif kind == "bare+barrier":
                fn = with_barrier(g, x, y, STEPS)
            elif kind == "bare+dispatch":
                fn = repeated(_bare(g, x, y, 1))
            else:
                fn = repeated(lambda g=g, opt=opt, x=x, y=y: g.step(x, y, tp.cross_entropy, opt))

            def run(fn=fn, g=g):
                fn()
                for r in g.replicas:
                    r.queue.finish()
            runs[kind, k] = run
    stats = time_interleaved([(run, None) for run in runs.values()], ROUNDS, warmup=2)
    times = {key: np.array(stat["times"]) / STEPS * 1e3 for key, stat in zip(runs, stats)}
    for kind in KINDS:
        ratios = 2 * times[kind, 1] / times[kind, 2]
        lo, hi = median_ci(ratios)
        print(f"{MODEL} {kind:14s} 1: {np.median(times[kind, 1]):.2f} ms  "
              f"2: {np.median(times[kind, 2]):.2f} ms  speedup {np.median(ratios):.3f} "
              f"[95% CI {lo:.3f}-{hi:.3f}]")


if __name__ == "__main__":
    main()
