"""Which PoCL worker thread runs whose commands: bare captured replays with 1 and 2 replicas,
and per thread of the process its CPU time (ms per step), migrations between cores and context
switches, read from /proc/self/task/*/sched (Linux with scheduler statistics).

Usage: python docs/bench-results/checks/pocl_threads.py [model] [rounds]
"""

import os
import sys
import time

import numpy as np

import parcl as pc
from parcl.bench import models
from parcl.bench.scaling import capture_forward_backward
from parcl.replica import ReplicaGroup

MODEL = sys.argv[1] if len(sys.argv) > 1 else "mlp"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
STEPS = 30


def sched(tid: int) -> tuple[int, float, int]:
    """(migrations, CPU ms, context switches) of a thread so far."""
    fields = {}
    with open(f"/proc/self/task/{tid}/sched") as f:
        for line in f:
            if ":" in line:
                key, value = line.split(":", 1)
                fields[key.strip()] = value.strip()
    return (int(float(fields["se.nr_migrations"])), float(fields["se.sum_exec_runtime"]),
            int(fields["nr_switches"]))


def replay(replica, shard, n, captured):
    for _ in range(n):
        captured[replica.index](*shard)
        replica.queue.finish()


def main():
    devs = pc.devices(split=2)
    setups = {}
    for k in (1, 2):
        group = ReplicaGroup(models.builder(MODEL), devs[:k], capture=True)
        x, y = models.batch(MODEL, models.DEFAULT_BATCH[MODEL] * k)
        bounds = [i * x.shape[0] // k for i in range(k + 1)]
        shards = [(x[a:b], y[a:b], np.array(1.0 / x.shape[0], np.float32))
                  for a, b in zip(bounds, bounds[1:])]
        captured = group.run(capture_forward_backward)
        group.run(replay, shards, [5] * k, [captured] * k)
        setups[k] = (group, shards, captured)
    threads = sorted(int(t) for t in os.listdir("/proc/self/task"))
    for _ in range(ROUNDS):
        for k, (group, shards, captured) in setups.items():
            before = {t: sched(t) for t in threads}
            start = time.perf_counter()
            group.run(replay, shards, [STEPS] * k, [captured] * k)
            ms = (time.perf_counter() - start) / STEPS * 1e3
            after = {t: sched(t) for t in threads}
            busy = []
            for t in threads:
                cpu = (after[t][1] - before[t][1]) / STEPS
                if cpu > 0.2:
                    busy.append(f"thread {t}: {cpu:.1f} ms CPU, {after[t][0] - before[t][0]} "
                                f"migrations, {after[t][2] - before[t][2]} switches")
            print(f"{k} replica(s): {ms:.2f} ms/step | " + " | ".join(busy))
    for group, _, _ in setups.values():
        group.close()


if __name__ == "__main__":
    main()
