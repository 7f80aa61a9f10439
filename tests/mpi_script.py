"""Helper for tests/test_mpi.py: 3 data-parallel steps of a small MLP on one fixed global batch.

    [mpiexec -n K] parcl-launch --replicas N tests/mpi_script.py OUT.npz [--fail-rank R]
        [--capture] [--model gpt]

Each rank takes its contiguous share of the global batch; rank 0 saves the parameters to
OUT.npz. With ``--fail-rank R`` rank R raises after its first step while the others go on
(and would wait for it forever in the next allreduce without parcl-launch's MPI abort).
``--capture`` records the step once and replays it (``ReplicaGroup(capture=True)``).
``--model gpt`` trains a tiny ``pc.nn.GPT`` (tied head) on token windows with AdamW instead.
"""

from __future__ import annotations

import argparse

import numpy as np

import parcl as pc
import parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup

GLOBAL_BATCH = 24


SEED_BY_RANK = False     # --seed-by-rank: each rank initialises its model from its own seed


def build(queue):
    pc.nn.manual_seed(dist.rank() if SEED_BY_RANK else 0)
    return pc.nn.Sequential(pc.nn.Linear(16, 32, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 4, queue=queue))


def build_bn(queue):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(16, 32, bias=False, queue=queue),
                            pc.nn.BatchNorm1d(32, queue=queue), pc.nn.ReLU(),
                            pc.nn.Linear(32, 4, queue=queue))


def build_gpt(queue):
    pc.nn.manual_seed(0)
    return pc.nn.GPT(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16, queue=queue)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--capture", action="store_true")
    p.add_argument("--clip", type=float, default=None, help="group.step's max_grad_norm")
    p.add_argument("--accumulate", type=int, default=1, help="accumulation_steps")
    p.add_argument("--sync-bn", action="store_true", help="a model with batch norm, "
                   "ReplicaGroup(sync_batchnorm=True)")
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--by-hand", default=None, metavar="K0,K1,...",
                   help="rank r runs K_r replicas (on its device, repeated) and trains with "
                        "run + allreduce_grads(average=True) + opt.step, each replica on an "
                        "equal share of the global batch")
    p.add_argument("--no-allreduce", action="store_true", help="--by-hand without "
                   "allreduce_grads: opt.step() on each rank's own gradients")
    p.add_argument("--skip-rank", type=int, default=-1, help="this rank's script catches "
                   "step 1's (simulated) failure and goes on to step 2, a step short of the "
                   "others; the group's collectives are bounded by --timeout seconds")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed-by-rank", action="store_true", help="build the MLP with "
                   "manual_seed(rank): rank 0's initialisation must still be everyone's")
    args = p.parse_args()
    global SEED_BY_RANK
    SEED_BY_RANK = args.seed_by_rank
    if args.by_hand is not None:
        return by_hand(args.out, [int(k) for k in args.by_hand.split(",")],
                       reduce=not args.no_allreduce)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((GLOBAL_BATCH, 16)).astype(np.float32)
    y = rng.integers(0, 4, GLOBAL_BATCH)
    model, loss_fn, make_opt = build, tp.cross_entropy, pc.optim.Adam
    if args.model == "gpt":
        ids = rng.integers(0, 13, (GLOBAL_BATCH, 9))
        x, y = ids[:, :-1], ids[:, 1:]
        model, loss_fn, make_opt = build_gpt, pc.nn.GPT.loss, pc.optim.AdamW
    rank, world = dist.rank(), dist.world_size()
    share = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    with ReplicaGroup.from_launch(build_bn if args.sync_bn else model, capture=args.capture,
                                  sync_batchnorm=args.sync_bn,
                                  timeout=args.timeout) as group:
        opt = make_opt(group.parameters(), lr=1e-2)
        norms = []
        for step in range(3):
            if step == 1 and rank == args.fail_rank:
                raise RuntimeError(f"deliberate failure on rank {rank}")
            if step == 1 and rank == args.skip_rank:
                continue
            group.step(x[share], y[share], loss_fn, opt, max_grad_norm=args.clip,
                       accumulation_steps=args.accumulate)
            norms.append(group.last_grad_norm)
        if args.clip is not None:
            np.save(f"{args.out}.norms{rank}.npy", np.array(norms, np.float64))
        if dist.is_main():
            state = {n: p.value.to_host() for n, p in group.named_parameters()}
            state.update({n: b.to_host() for n, b in group.model.named_buffers()})
            np.savez(args.out, **state)


def by_hand(out: str, counts: list[int], reduce: bool = True) -> None:
    """A custom loop over ranks with different replica counts: every replica's mean loss on
    GLOBAL_BATCH / sum(counts) rows, the gradients averaged over every replica of every rank."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((GLOBAL_BATCH, 16)).astype(np.float32)
    y = rng.integers(0, 4, GLOBAL_BATCH)
    rank = dist.rank()
    k, rows = counts[rank], GLOBAL_BATCH // sum(counts)
    first = sum(counts[:rank])
    shards = [slice((first + i) * rows, (first + i + 1) * rows) for i in range(k)]

    def fwd_bwd(replica, xs, ys):
        with tp.Tape() as tape:
            logits = replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, xs)))
            loss = tp.cross_entropy(logits, pc.Tensor.from_host(replica.queue, ys))
        tape.backward(loss)

    with ReplicaGroup(build, [pc.devices()[0]] * k, comm=dist.comm()) as group:
        opt = pc.optim.SGD(group.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            group.run(fwd_bwd, [x[s] for s in shards], [y[s] for s in shards])
            if reduce:
                group.allreduce_grads(average=True)
            opt.step()
        state = {n: p.value.to_host() for n, p in group.named_parameters()}
        everyone = dist.gather(state)
        if dist.is_main():
            np.savez(out, **state)
            for r, other in enumerate(everyone or []):
                np.savez(f"{out}.rank{r}.npz", **other)


if __name__ == "__main__":
    main()
