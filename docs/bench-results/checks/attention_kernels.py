"""What attention's pieces cost on this device: a batched GEMM launch against a loop of GEMM
launches over sub-buffers, the fused masked softmax against its unfused composition, and the
whole scaled_dot_product_attention step against the same step composed of tape ops.

Shapes: B*H = 64 matrices, T = 64, D = 32 (the GPT benchmark's 16 x 4 heads, T = 64, head
width 32). Each timing is the median of ``repeats`` runs, each ending with ``queue.finish()``.

Usage: python docs/bench-results/checks/attention_kernels.py [repeats]
(PyTorch's step for comparison: attention_torch.py, in a process of its own: in one process
PoCL's spinning workers and PyTorch's threads take the cores from each other.)
"""

import sys
import time

import numpy as np

import parcl as pc
import parcl.tape as tp
from parcl.kernels import attention as ak
from parcl.kernels import elementwise as ew
from parcl.kernels import softmax as smk
from parcl.kernels.gemm import batched_gemm, gemm

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
BH, T, D = 64, 64, 32
q = pc.default_queue()
rng = np.random.default_rng(0)


def up(*shape):
    return pc.Tensor.from_host(q, rng.standard_normal(shape).astype(np.float32))


def timed(fn) -> float:
    fn()
    q.finish()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        q.finish()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def pieces(t: pc.Tensor) -> list:
    """Each matrix of a (B, r, c) tensor as a sub-buffer view."""
    _, r, c = t.shape
    size = r * c * 4
    return [t.view_of(t.data.get_sub_region(i * size, size), (r, c)) for i in range(BH)]


def loop(a, b, out, **kw):
    def run():
        for x, y, o in zip(pieces(a), pieces(b), pieces(out)):
            gemm(x, y, out=o, **kw)
    return run


qq, kk, vv = up(BH, T, D), up(BH, T, D), up(BH, T, D)
s_out, o_out = pc.Tensor.empty(q, (BH, T, T)), pc.Tensor.empty(q, (BH, T, D))
p = up(BH, T, T)
rows = []
rows.append(("q @ k^T (64 x 64x32 @ 32x64): one batched launch",
             timed(lambda: batched_gemm(qq, kk, trans_b=True, out=s_out))))
rows.append(("q @ k^T: 64 gemm launches on sub-buffers", timed(loop(qq, kk, s_out,
                                                                     trans_b=True))))
rows.append(("p @ v (64 x 64x64 @ 64x32): one batched launch",
             timed(lambda: batched_gemm(p, vv, out=o_out))))
rows.append(("p @ v: 64 gemm launches on sub-buffers", timed(loop(p, vv, o_out))))

scores = up(BH, T, T)
causal = pc.Tensor.from_host(q, np.triu(np.full((T, T), -np.inf), 1).astype(np.float32))
scale = 1 / np.sqrt(D)
rows.append(("causal softmax(s * scale) fused, forward",
             timed(lambda: ak.masked_softmax(scores, scale, causal=True))))
rows.append(("additive-mask softmax(s * scale + m) fused, forward",
             timed(lambda: ak.masked_softmax(scores, scale, causal))))
rows.append(("unfused: mul, add mask, softmax (3 launches), forward",
             timed(lambda: smk.softmax_forward(ew.binary("add", ew.scalar("mul", scores, scale),
                                                         causal), -1))))
probs = ak.masked_softmax(scores, scale, causal=True)
rows.append(("fused softmax backward (scale folded in)",
             timed(lambda: ak.masked_softmax_backward(probs, scores, scale))))
rows.append(("unfused: softmax backward, mul (2 launches)",
             timed(lambda: ew.scalar("mul", smk.softmax_backward(probs, scores, -1), scale))))


def step(fused: bool):
    nodes = [tp.tensor(up(16, 4, T, D), requires_grad=True) for _ in range(3)]
    g = up(16, 4, T, D)

    def run():
        with tp.Tape() as tape:
            if fused:
                y = tp.scaled_dot_product_attention(*nodes, is_causal=True)
            else:
                s = tp.matmul(nodes[0], tp.transpose(nodes[1], (0, 1, 3, 2))) * scale
                y = tp.matmul(tp.softmax(s + causal, -1), nodes[2])
        tape.backward(y, grad=g)
        for n in nodes:
            n.grad = None
    return run


rows.append(("scaled_dot_product_attention forward + backward (16, 4, 64, 32), causal",
             timed(step(True))))
rows.append(("the same composed of tape ops (matmul, transpose, mul, add, softmax, matmul)",
             timed(step(False))))
print(f"device: {q.device.name.strip()}, {q.device.max_compute_units} compute units; "
      f"median of {REPEATS}")
for name, ms in rows:
    print(f"{ms:8.3f} ms  {name}")
