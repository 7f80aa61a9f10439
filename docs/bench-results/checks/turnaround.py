"""The turnaround between two data-parallel steps, from device timestamps.

Runs captured ``group.step`` calls with 1 and with 2 replicas on the CPU split in two, on
profiling queues, and times on each replica's device clock the gap from the end of one step's
update (the sharded end, or the unsharded one with a single replica) to the start of the next
step's first replayed launch: the time both devices sit idle while the caller's wait returns,
the next ``step``'s Python runs, its input copies are enqueued and the replica threads wake.

Usage: python docs/bench-results/checks/turnaround.py [model] [steps]
"""

import sys
from collections import defaultdict

import numpy as np
import pyopencl as cl

import parcl as pc
import parcl.replica as replica_module
from parcl import recorder, runtime
from parcl import tape as tp
from parcl.bench import models
from parcl.replica import ReplicaGroup

MODEL = sys.argv[1] if len(sys.argv) > 1 else "cnn"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30

launches = defaultdict(list)        # queue (int_ptr) -> events of its replayed launches
updates = []                        # per step: markers before and after the end of the step


def profiled():
    """Profiling queues for the groups, and an event kept for every replayed launch."""
    new_queue = runtime.new_queue
    replica_module.runtime.new_queue = lambda d, profiling=False: new_queue(d, profiling=True)
    bind = recorder._bind

    def bind_and_keep(op):
        call = bind(op)

        def launch():
            event = call()
            if isinstance(event, cl.Event):
                launches[event.command_queue.int_ptr].append(event)
            return event
        return launch
    recorder._bind = bind_and_keep
    update = ReplicaGroup._update

    def marked_update(self, optimizer):
        before = [cl.enqueue_marker(r.queue) for r in self.replicas]
        update(self, optimizer)
        updates.append((before, [cl.enqueue_marker(r.queue) for r in self.replicas]))
    ReplicaGroup._update = marked_update


def main():
    profiled()
    devs = pc.devices(split=2)
    for k in (1, 2):
        launches.clear()
        updates.clear()
        x, y = models.batch(MODEL, models.DEFAULT_BATCH[MODEL] * k)
        with ReplicaGroup(models.builder(MODEL), devs[:k], capture=True) as group:
            opt = pc.optim.SGD(group.parameters(), lr=models.LR)
            for _ in range(5):
                group.step(x, y, tp.cross_entropy, opt)
            for r in group.replicas:
                r.queue.finish()
            launches.clear()
            updates.clear()
            for _ in range(STEPS):
                group.step(x, y, tp.cross_entropy, opt)
            for r in group.replicas:
                r.queue.finish()
            for i, r in enumerate(group.replicas):
                events = launches[r.queue.int_ptr]
                per = len(events) // STEPS
                first = [events[s * per].profile.start for s in range(STEPS)]
                gaps = [(first[s + 1] - updates[s][1][i].profile.end) / 1e6
                        for s in range(STEPS - 1)]
                ends = [(updates[s][1][i].profile.end - updates[s][0][i].profile.end) / 1e6
                        for s in range(STEPS)]
                spans = [(events[s * per + per - 1].profile.end - first[s]) / 1e6
                         for s in range(STEPS)]
                print(f"{MODEL}, {k} replica(s), replica {i}: {per} launches a step, replayed "
                      f"in {np.median(spans):.2f} ms; end of step (the wait for the other "
                      f"replicas included) {np.median(ends):.2f} ms; update end -> next "
                      "step's first launch "
                      f"median {np.median(gaps):.2f} ms (p10 {np.percentile(gaps, 10):.2f}, "
                      f"p90 {np.percentile(gaps, 90):.2f})")


if __name__ == "__main__":
    main()
