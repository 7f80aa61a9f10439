"""Which neighbour slows PyTorch's 2-thread MLP step in `parcl-bench compare`'s alternation?
Times 10 PyTorch steps alone, right after 10 numpy-reference steps (OpenBLAS, 2 threads), and
right after 10 parcl steps on the whole CPU device; median of 12.

Run (repository root): env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
    python docs/bench-results/checks/torch_interleave.py
Output of the run quoted in docs/performance.md: torch_interleave.txt.
"""

import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

import parcl as pc
import parcl.tape as tp
from parcl.bench import models, reference

torch.set_num_threads(2)
x, y = models.batch("mlp", 256, seed=1)
q = pc.new_queue(pc.devices(split=1)[0])
pm = models.builder("mlp")(q)
state = pm.state_dict()
tm = models.torch_model("mlp", state)
opt = torch.optim.SGD(tm.parameters(), lr=0.01)
xt, yt = torch.from_numpy(x), torch.from_numpy(y)
popt = pc.optim.SGD(pm.parameters(), lr=0.01)
ref = reference.NUMPY_MODELS["mlp"](state)


def torch_steps():
    for _ in range(10):
        opt.zero_grad()
        nn.functional.cross_entropy(tm(xt), yt).backward()
        opt.step()


def parcl_steps():
    for _ in range(10):
        xx = tp.tensor(pc.Tensor.from_host(q, x))
        yy = pc.Tensor.from_host(q, y)
        with tp.Tape() as tape:
            loss = tp.cross_entropy(pm(xx), yy)
        tape.backward(loss)
        popt.step()
        popt.zero_grad()
    q.finish()


def numpy_steps():
    for _ in range(10):
        ref.step(x, y, 0.01)


with threadpool_limits(2, user_api="blas"):
    for name, other in (("alone", None), ("after numpy", numpy_steps),
                        ("after parcl", parcl_steps)):
        ts = []
        for _ in range(12):
            if other:
                other()
            t0 = time.perf_counter()
            torch_steps()
            ts.append(time.perf_counter() - t0)
        print(f"torch mlp 2 threads {name}: {2560 / np.median(ts):.0f} samples/s")
