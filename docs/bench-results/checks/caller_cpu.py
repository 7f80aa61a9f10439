"""What the caller's CPU inside a step costs: 1- and 2-replica captured steps, with and without
``burn_ms`` of busy CPU in the caller right after the replays are enqueued (while the devices
run), in randomised rounds of 10 steps. With one replica the caller has a core of its own; with
two, its CPU is taken from a replica's core.

Usage: python docs/bench-results/checks/caller_cpu.py [model] [rounds] [burn_ms]
"""

import sys
import time

import numpy as np

import parcl as pc
import parcl.replica as replica_module
from parcl import tape as tp
from parcl.bench import models
from parcl.bench.common import median_ci, time_interleaved
from parcl.replica import ReplicaGroup

MODEL = sys.argv[1] if len(sys.argv) > 1 else "mlp"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 31
BURN_S = (float(sys.argv[3]) if len(sys.argv) > 3 else 2.0) / 1e3
STEPS = 10
burn = [0.0]                     # seconds of CPU the next replays are followed by


def replay_then_burn(calls, replay=replica_module.replay_together):
    out = replay(calls)
    end = time.thread_time() + burn[0]
    while time.thread_time() < end:
        pass
    return out


def ci(values) -> str:
    low, high = median_ci(values)
    return f"{np.median(values):.3f} [{low:.3f}-{high:.3f}]"


def main():
    replica_module.replay_together = replay_then_burn
    devs = pc.devices(split=2)
    runs, groups = {}, []
    for name, seconds, k in (("1", 0.0, 1), ("2", 0.0, 2), ("1+burn", BURN_S, 1),
                             ("2+burn", BURN_S, 2)):
        group = ReplicaGroup(models.builder(MODEL), devs[:k], capture=True)
        groups.append(group)
        opt = pc.optim.SGD(group.parameters(), lr=models.LR)
        x, y = models.batch(MODEL, models.DEFAULT_BATCH[MODEL] * k)
        for _ in range(5):
            group.step(x, y, tp.cross_entropy, opt)

        def run(group=group, opt=opt, x=x, y=y, seconds=seconds):
            burn[0] = seconds
            for _ in range(STEPS):
                group.step(x, y, tp.cross_entropy, opt)
        runs[name] = run
    stats = time_interleaved([(run, None) for run in runs.values()], ROUNDS)
    t = {name: np.array(stat["times"]) / STEPS * 1e3 for name, stat in zip(runs, stats)}
    print(f"{MODEL}: ms per step", {name: round(float(np.median(v)), 2) for name, v in t.items()})
    print(f"{BURN_S * 1e3:g} ms of caller CPU adds, per step: 1 replica "
          f"{ci(t['1+burn'] - t['1'])} ms, 2 replicas {ci(t['2+burn'] - t['2'])} ms")
    for group in groups:
        group.close()


if __name__ == "__main__":
    main()
