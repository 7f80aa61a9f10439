"""Where one training step's device time goes, kernel by kernel.

An eager SGD step of a ``parcl-bench`` model (forward, cross entropy, backward, update) runs on
one CPU sub-device through a profiling queue; every launch is traced
(``parcl.kernels._cache.trace_launches``) and its device time (profiling start to end) summed
per kernel name, as the median step of 20 after 5 warm-up steps. The GEMMs' shapes are listed
too (m, n, k, transposes), in launch order.

Usage: python docs/bench-results/checks/kernel_times.py [mlp|cnn|digits]
"""

import collections
import sys

import numpy as np
import pyopencl as cl

import parcl as pc
import parcl.kernels.gemm as gemm_module
from parcl import runtime
from parcl import tape as tp
from parcl.bench import models
from parcl.kernels._cache import trace_launches

MODEL = sys.argv[1] if len(sys.argv) > 1 else "mlp"
WARMUP, STEPS = 5, 20


def main():
    device = pc.devices(split=2)[0]
    context = runtime.new_queue(device).context
    queue = cl.CommandQueue(context, device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
    x, y = models.batch(MODEL, models.DEFAULT_BATCH[MODEL])
    net = models.builder(MODEL)(queue)
    opt = pc.optim.SGD(net.parameters(), lr=0.01)

    shapes = []
    launch = gemm_module._launch

    def traced_launch(a, b, out, bias, m, n, k, *rest):
        trans_a, trans_b = rest[3], rest[4]
        shapes.append(f"{m}x{n}x{k} {'T' if trans_a else 'N'}{'T' if trans_b else 'N'}")
        return launch(a, b, out, bias, m, n, k, *rest)

    gemm_module._launch = traced_launch
    per_step = []
    for step in range(WARMUP + STEPS):
        shapes.clear()
        with trace_launches() as launches:
            with tp.Tape() as tape:
                logits = net(tp.tensor(pc.Tensor.from_host(queue, x)))
                loss = tp.cross_entropy(logits, pc.Tensor.from_host(queue, y))
            tape.backward(loss)
            opt.step()
            opt.zero_grad()
        queue.finish()
        if step >= WARMUP:
            times = collections.defaultdict(float)
            counts = collections.Counter()
            for name, _, event in launches:
                times[name] += (event.profile.end - event.profile.start) * 1e-6
                counts[name] += 1
            per_step.append((sum(times.values()), times, counts))
    gemm_module._launch = launch

    per_step.sort(key=lambda s: s[0])
    total, times, counts = per_step[len(per_step) // 2]
    print(f"{MODEL}: one eager SGD step on one sub-device, median of {STEPS}: "
          f"{total:.2f} ms of kernels in {sum(counts.values())} launches")
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"  {name:24s} {ms:7.3f} ms  {100 * ms / total:5.1f} %  x{counts[name]}")
    print("GEMMs (m x n x k, op(A) op(B)):", ", ".join(shapes))
    # the spread of the whole step's kernel time, for context
    totals = np.array([s[0] for s in per_step])
    print(f"kernel time per step: median {np.median(totals):.2f} ms "
          f"[{totals.min():.2f}-{totals.max():.2f}]")


if __name__ == "__main__":
    main()
