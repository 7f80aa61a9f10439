"""Multi-process runs: ``mpiexec -n 2 parcl-launch ...`` gives the same parameters as one
process with 2 replicas and as 1 replica on the same global batch, and one failing rank stops
the whole job. Skipped where mpi4py or mpiexec is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import parcl as pc

import mpi4py  # noqa: F401  (the test extra installs it with the mpich wheel: never skipped)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "mpi_script.py"
LAUNCH = [sys.executable, "-m", "parcl.launch"]
MPIEXEC = (str(Path(sys.executable).with_name("mpiexec"))
           if Path(sys.executable).with_name("mpiexec").exists() else shutil.which("mpiexec"))
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PARCL_DEVICES", "PYOPENCL_CTX") and not k.startswith(("PMI_", "OMPI_"))}

pytestmark = pytest.mark.slow


def test_mpiexec_is_installed():
    assert MPIEXEC is not None, "mpiexec not found: pip install -e '.[test]' installs mpich"


def _rank_logs(prefix) -> list[str]:
    """What each rank of a two-rank script logged, in rank order: read from the file each
    wrote (``<prefix><rank>.log``), since mpiexec may interleave the ranks' stdout lines."""
    return [Path(f"{prefix}{rank}.log").read_text() for rank in (0, 1)]


def _fails_like_a_skip(tmp_path, text, mode, launch, extra=()) -> list[str]:
    """The two-rank script ``text`` run in ``mode`` (its step 1 fails on rank 1) and in
    ``"skip"`` (every rank skips step 1), with ``parcl-launch`` options ``launch``: both ranks
    end where the skipping run ends; returns each rank's log of the ``mode`` run."""
    script = tmp_path / f"{mode}.py"
    script.write_text(text)
    for how in ("skip", mode):
        r = run([MPIEXEC, "-n", 2, *LAUNCH, *launch, script, tmp_path / how, how, *extra],
                timeout=90)
        assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        np.testing.assert_array_equal(np.load(tmp_path / f"{mode}{rank}.npy"),
                                      np.load(tmp_path / f"skip{rank}.npy"))
    return _rank_logs(tmp_path / mode)


def run(cmd, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=ENV)


def params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def test_two_ranks_match_two_replicas_and_one_replica(tmp_path):
    runs = {
        "mpi 2x1": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1],
        "mpi 2x1 capture": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1],
        "1 process x 2": [*LAUNCH, "--replicas", 2],
        "1 process x 2 capture": [*LAUNCH, "--replicas", 2],
        "1 process x 1": [*LAUNCH, "--replicas", 1],
    }
    results = {}
    for name, cmd in runs.items():
        out = tmp_path / f"{name.replace(' ', '_')}.npz"
        r = run([*cmd, SCRIPT, out, *(["--capture"] if name.endswith("capture") else [])])
        assert r.returncode == 0, f"{name}: {r.stderr}"
        results[name] = params(out)
    ref = results["1 process x 1"]
    assert list(ref) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name, got in results.items():
        for key in ref:
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-6,
                                       err_msg=f"{name}: {key}")
    # the parameters did move: 3 Adam steps from the same seeded initialisation
    moved = params(tmp_path / "1_process_x_1.npz")["0.bias"]
    assert np.abs(moved).max() > 0


def test_clipping_and_accumulation_across_ranks_match_one_replica(tmp_path):
    """max_grad_norm clips the gradient reduced over both ranks (the same norm on each) and
    accumulation_steps runs micro-batches on every rank: the result is one replica's."""
    options = ["--clip", "0.05", "--accumulate", "2"]
    runs = {"mpi": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1],
            "single": [*LAUNCH, "--replicas", 1]}
    for name, cmd in runs.items():
        r = run([*cmd, SCRIPT, tmp_path / f"{name}.npz", *options])
        assert r.returncode == 0, f"{name}: {r.stderr}"
    ref, got = params(tmp_path / "single.npz"), params(tmp_path / "mpi.npz")
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-6, err_msg=key)
    norms = [np.load(tmp_path / f"mpi.npz.norms{rank}.npy") for rank in (0, 1)]
    np.testing.assert_array_equal(norms[0], norms[1])             # the same on every rank
    np.testing.assert_allclose(norms[0], np.load(tmp_path / "single.npz.norms0.npy"), rtol=1e-5)
    assert (norms[0] > 0.05).all()                                # so every step clipped


def test_sync_batchnorm_across_ranks_matches_one_replica(tmp_path):
    """Batch statistics over both ranks' replicas: parameters and running statistics equal
    one replica's on the whole batch."""
    runs = {"mpi": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 2, "--allow-repeat"],
            "single": [*LAUNCH, "--replicas", 1]}
    for name, cmd in runs.items():
        r = run([*cmd, SCRIPT, tmp_path / f"{name}.npz", "--sync-bn"])
        assert r.returncode == 0, f"{name}: {r.stderr}"
    ref, got = params(tmp_path / "single.npz"), params(tmp_path / "mpi.npz")
    assert "1.running_var" in ref
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-6, err_msg=key)
def test_ranks_with_different_replica_counts_average_over_every_replica(tmp_path):
    """allreduce_grads(average=True) with 1 replica on rank 0 and 2 on rank 1 divides by the 3
    replicas on both ranks: the ranks stay equal, and equal one replica on the whole batch."""
    runs = {"mpi": ([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1], "1,2"),
            "single": ([*LAUNCH, "--replicas", 1], "1")}
    for name, (cmd, counts) in runs.items():
        r = run([*cmd, SCRIPT, tmp_path / f"{name}.npz", "--by-hand", counts])
        assert r.returncode == 0, f"{name}: {r.stderr}"
    ref = params(tmp_path / "single.npz")
    ranks = [params(tmp_path / f"mpi.npz.rank{r}.npz") for r in (0, 1)]
    for key in ref:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
        np.testing.assert_allclose(ranks[0][key], ref[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_an_opt_step_on_each_ranks_unreduced_gradients_is_refused_on_every_rank(tmp_path):
    """The by-hand loop without allreduce_grads under mpiexec -n 2, one replica each: each
    rank's opt.step() read its own half of the batch and the ranks drifted apart, silently;
    the second run now raises on every rank, naming allreduce_grads."""
    r = run([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1, SCRIPT, tmp_path / "never.npz",
             "--by-hand", "1,1", "--no-allreduce"], timeout=60)
    assert r.returncode != 0
    assert r.stderr.count("call group.allreduce_grads() after the backward run") >= 1, r.stderr
    assert not (tmp_path / "never.npz").exists()


def test_every_rank_starts_from_rank_0s_parameters_when_seeded_by_rank(tmp_path):
    """A model built with manual_seed(rank) on each rank: the group takes rank 0's initial
    parameters everywhere (as DDP), so the ranks train as one and end where 1 replica does."""
    runs = {"mpi": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1],
            "single": [*LAUNCH, "--replicas", 1]}
    for name, cmd in runs.items():
        r = run([*cmd, SCRIPT, tmp_path / f"{name}.npz", "--seed-by-rank"])
        assert r.returncode == 0, f"{name}: {r.stderr}"
    ref, got = params(tmp_path / "single.npz"), params(tmp_path / "mpi.npz")
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_two_ranks_train_the_gpt_as_one_replica(tmp_path):
    """The tied-weight GPT under ``mpiexec -n 2`` (captured) ends where 1 replica does."""
    results = {}
    for name, cmd in {"mpi 2x1 capture": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1],
                      "1 process x 1": [*LAUNCH, "--replicas", 1]}.items():
        out = tmp_path / f"{name.replace(' ', '_')}.npz"
        r = run([*cmd, SCRIPT, out, "--model", "gpt", "--capture"])
        assert r.returncode == 0, f"{name}: {r.stderr}"
        results[name] = params(out)
    ref, got = results["1 process x 1"], results["mpi 2x1 capture"]
    assert "transformer.wte.weight" in ref and "lm_head.weight" not in ref    # listed once
    assert got.keys() == ref.keys()
    n_embd = 16                                         # mpi_script.build_gpt
    for key in ref:
        a, b = got[key], ref[key]
        if key.endswith("attn.c_attn.bias"):
            # The key bias adds the same q.b to every score of a row, which softmax ignores:
            # its gradient is zero but for rounding, which Adam scales to lr-sized noise.
            keys = slice(n_embd, 2 * n_embd)
            assert np.abs(a[keys]).max() < 1e-3 and np.abs(b[keys]).max() < 1e-3
            a, b = np.delete(a, np.r_[keys]), np.delete(b, np.r_[keys])
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=key)


def test_a_failing_rank_stops_the_whole_job(tmp_path):
    t0 = time.monotonic()
    r = run([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1, SCRIPT, tmp_path / "never.npz",
             "--fail-rank", 1], timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert elapsed < 30, f"took {elapsed:.1f} s"
    assert "[rank 1] RuntimeError: deliberate failure on rank 1" in r.stderr
    assert not (tmp_path / "never.npz").exists()


def test_a_rank_a_step_short_ends_the_job_after_the_timeout(tmp_path):
    """Rank 1's script skips a step on its own (its code failed outside ``group.step``, or it
    left its loop early): its later steps pair with rank 0's earlier ones, and rank 0's last
    collective has no partner. MPI would wait for ever; the
    group's watchdog aborts the job after its timeout, saying which collective waited."""
    t0 = time.monotonic()
    r = run([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1, SCRIPT, tmp_path / "never.npz",
             "--skip-rank", 1, "--timeout", 3], timeout=90)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert "[rank 0]" in r.stderr and "waited more than 3 s for the other ranks" in r.stderr
    assert elapsed < 60, f"took {elapsed:.1f} s"
    assert not (tmp_path / "never.npz").exists()


BAD_BATCH_ON_ONE_RANK = """
import sys, numpy as np, parcl as pc, parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup
pc.nn.manual_seed(0)
group = ReplicaGroup.from_launch(lambda q: pc.nn.Linear(8, 4, queue=q), timeout=20)
opt = pc.optim.SGD(group.parameters(), lr=0.1)
rng, rank, log = np.random.default_rng(0), dist.rank(), []
for step in range(4):
    x, y = rng.standard_normal((8, 8)).astype(np.float32), rng.integers(0, 4, 8)
    xs, ys = x[rank * 4:rank * 4 + 4], y[rank * 4:rank * 4 + 4].copy()
    if step == 1 and sys.argv[2] == "skip":
        continue                                  # the reference: every rank skips step 1
    if step == 1 and rank == 1 and sys.argv[2] == "bad":
        ys[0] = 7                                 # a label out of range on rank 1 only
    if step == 1 and rank == 1 and sys.argv[2] == "short":
        xs, ys = xs[:1], ys[:1]                   # a batch rank 1 cannot split in 2
    try:
        log.append(round(group.step(xs, ys, tp.cross_entropy, opt,
                                    accumulation_steps=int(sys.argv[3])), 6))
    except pc.ParclError as exc:
        log.append(type(exc).__name__ + ": " + str(exc)[:60])
np.save(sys.argv[1] + str(rank) + ".npy", group.model.weight.value.to_host())
open(sys.argv[1] + str(rank) + ".log", "w").write(repr(log))
"""


def test_a_bad_batch_on_one_rank_fails_the_step_on_every_rank_and_the_loop_goes_on(tmp_path):
    """A loop that catches a failed step (a bad batch) went on, under MPI, only on the rank
    whose replica failed: that rank skipped the step's collectives, the others waited in
    theirs, and the watchdog ended the job. Now the step fails on every rank (the bad one
    with its error, the others with a ``ReplicaError`` naming it) and the ranks go on
    together, ending where a run that skipped that step everywhere ends."""
    rank0, rank1 = _fails_like_a_skip(tmp_path, BAD_BATCH_ON_ONE_RANK, "bad",
                                      ["--replicas", 1], [1])
    assert "ReplicaError: ReplicaGroup.step: rank 1's replicas failed" in rank0
    assert "LabelError" in rank1 and "ReplicaError: ReplicaGroup.step: rank 1" not in rank1


def test_a_batch_one_rank_cannot_split_fails_the_step_on_every_rank(tmp_path):
    """Rank 1's batch of 1 sample cannot make 2 micro-batches: its ShapeError was raised
    before the step's collectives, on rank 1 alone, so a loop catching it went on there
    while rank 0 waited in the step for rank 1 until the watchdog ended the job (exit 3
    after the group's timeout, 20 s here, 600 by default). Now every rank refuses the batch
    before any runs its part (rank 0 with a ReplicaError naming rank 1) and the ranks go on
    together, ending where a run that skipped that step everywhere ends."""
    rank0, rank1 = _fails_like_a_skip(tmp_path, BAD_BATCH_ON_ONE_RANK, "short",
                                      ["--replicas", 1], [2])
    assert "ReplicaError: ReplicaGroup.step: rank 1's batch was refused" in rank0
    assert "ShapeError: ReplicaGroup.step: a batch of 1 samples cannot" in rank1


SYNC_BN_FAILING_ON_ONE_RANK = """
import sys, numpy as np, parcl as pc, parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup
def build(q):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(8, 6, queue=q), pc.nn.BatchNorm1d(6, queue=q),
                            pc.nn.ReLU(), pc.nn.Linear(6, 4, queue=q))
group = ReplicaGroup.from_launch(build, timeout=20, sync_batchnorm=True)
opt = pc.optim.SGD(group.parameters(), lr=0.1)
rng, rank, log = np.random.default_rng(0), dist.rank(), []
for step in range(4):
    x, y = rng.standard_normal((8, 8)).astype(np.float32), rng.integers(0, 4, 8)
    xs, ys = x[rank * 4:rank * 4 + 4], y[rank * 4:rank * 4 + 4]
    if step == 1 and sys.argv[2] == "skip":
        continue
    if step == 1 and rank == 1 and sys.argv[2] == "bad":
        xs = xs[:, :7]                            # rank 1 fails before its batch norm
    try:
        log.append(round(group.step(xs, ys, tp.cross_entropy, opt), 6))
    except pc.ParclError as exc:
        log.append(type(exc).__name__ + ": " + str(exc)[:60])
np.save(sys.argv[1] + str(rank) + ".npy", group.model[0].weight.value.to_host())
open(sys.argv[1] + str(rank) + ".log", "w").write(repr(log))
"""


def test_a_rank_failing_before_its_first_batch_norm_exchange_fails_the_step_on_every_rank(
        tmp_path):
    """With sync_batchnorm, rank 1's forward failed before its batch norm: its step's
    agreement met rank 0's batch norm exchange (which took a failure text for statistics)
    and rank 0 waited for rank 1 in its next collective until the watchdog ended the job
    after the group's timeout (20 s here). Now the exchange takes that answer as the step's
    agreement: rank 0 raises a ReplicaError naming rank 1, and the ranks go on together,
    ending where a run that skipped that step everywhere ends."""
    rank0, rank1 = _fails_like_a_skip(tmp_path, SYNC_BN_FAILING_ON_ONE_RANK, "bad",
                                      ["--replicas", 1])
    assert "ReplicaError: ReplicaGroup.step: rank 1's replicas failed" in rank0
    assert "ReplicaError: replica 0 on" in rank1 and "failed: ShapeError" in rank1


BRANCH_ON_ONE_RANK = """
import sys, numpy as np, parcl as pc, parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup
class TwoHeads(pc.nn.Module):
    def __init__(self, q):
        super().__init__()
        self.a, self.b = pc.nn.Linear(4, 3, queue=q), pc.nn.Linear(4, 3, queue=q)
    def forward(self, x):                         # a branch on the data: b for large inputs
        return self.b(x) if float(x.value.to_host().mean()) > 5 else self.a(x)
pc.nn.manual_seed(0)
group = ReplicaGroup.from_launch(TwoHeads, timeout=20)
opt = pc.optim.SGD(group.parameters(), lr=0.1)
rng, rank, log = np.random.default_rng(0), dist.rank(), []
for step in range(4):
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    if step == 1 and sys.argv[2] == "skip":
        continue
    if step == 1 and rank == 1:
        x[6:] += 100                              # rank 1's replica 1 takes head b
    try:
        log.append(round(group.step(x[rank * 4:rank * 4 + 4], y[rank * 4:rank * 4 + 4],
                                    tp.cross_entropy, opt), 6))
    except pc.ParclError as exc:
        log.append(type(exc).__name__ + ": " + str(exc)[:60])
np.save(sys.argv[1] + str(rank) + ".npy", group.model.a.weight.value.to_host())
open(sys.argv[1] + str(rank) + ".log", "w").write(repr(log))
"""


def test_a_data_dependent_branch_on_one_rank_fails_the_step_on_every_rank(tmp_path):
    """Rank 1's replicas gave gradients to different heads (its second replica's batch
    took the model's other branch): the desync ReplicaError was raised on rank 1 alone
    after the replicas' part, so a loop catching it went on there while rank 0 waited in
    the step for rank 1 until the watchdog ended the job (exit 3 after 20 s here, 600 by
    default). Now rank 0 raises a ReplicaError naming rank 1 and the ranks go on together,
    ending where a run that skipped that step everywhere ends."""
    rank0, rank1 = _fails_like_a_skip(tmp_path, BRANCH_ON_ONE_RANK, "branch",
                                      ["--replicas", 2, "--allow-repeat"])
    assert "ReplicaError: ReplicaGroup.step: rank 1's replicas failed" in rank0
    assert "ReplicaError: replica desync before allreduce" in rank1


BATCH_NORM_PER_SHARD = """
import sys, numpy as np, parcl as pc, parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup
def build(q):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(4, 3, queue=q),            # and an int64 count:
                            pc.nn.BatchNorm1d(3, momentum=None, queue=q),
                            pc.nn.ReLU(), pc.nn.Linear(3, 2, queue=q))
rng = np.random.default_rng(0)
x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 2, 8)
x[4:] += 3                                  # the second half's statistics are other
rank, world = dist.rank(), dist.world_size()
rows = slice(rank * 8 // world, (rank + 1) * 8 // world)
def fwd_bwd(replica, xs, ys):
    with tp.Tape() as tape:
        out = replica.model(tp.tensor(pc.Tensor.from_host(replica.queue, xs)))
        tape.backward(tp.cross_entropy(out, pc.Tensor.from_host(replica.queue, ys)))
found = {}
with ReplicaGroup.from_launch(build) as group:
    opt = pc.optim.SGD(group.parameters(), lr=0.1)
    for _ in range(3):
        group.step(x[rows], y[rows], tp.cross_entropy, opt)
    found["step"] = [r.model[1].running_mean.to_host() for r in group.replicas]
    found["count"] = [r.model[1].num_batches_tracked.to_host() for r in group.replicas]
with ReplicaGroup.from_launch(build) as group:          # a custom loop
    opt = pc.optim.SGD(group.parameters(), lr=0.1)
    k = len(group)
    for _ in range(3):
        opt.zero_grad()
        group.run(fwd_bwd, np.array_split(x[rows], k), np.array_split(y[rows], k))
        group.allreduce_grads()
        opt.step()
    found["loop"] = [r.model[1].running_mean.to_host() for r in group.replicas]
everyone = dist.gather(found)
if dist.is_main():
    np.savez(sys.argv[1], **{f"{how}{r}_{i}": m for r, f in enumerate(everyone)
                             for how, ms in f.items() for i, m in enumerate(ms)})
"""


def test_every_rank_ends_a_step_with_rank_0s_running_statistics(tmp_path):
    """Without sync_batchnorm each replica's training forward updates its batch norm's running
    statistics from its own shard, and the end of a step gives every replica replica 0's (as
    DDP's broadcast_buffers gives every rank rank 0's): 2 ranks of one replica each end
    where one process of two replicas does, every rank alike, and so does every rank's model
    after a custom loop's allreduce_grads. Rank 1 kept the statistics of its own shard
    (running mean [-2.635, 2.813, 1.036] where rank 0's and every replica's in one process
    are [0.259, -0.840, 0.017]), so a rank evaluating its model normalised with others."""
    script = tmp_path / "batch_norm.py"
    script.write_text(BATCH_NORM_PER_SHARD)
    for name, cmd in {"mpi": [MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1],
                      "single": [*LAUNCH, "--replicas", 2]}.items():
        r = run([*cmd, script, tmp_path / f"{name}.npz"], timeout=90)
        assert r.returncode == 0, f"{name}: {r.stderr}"
    mpi, single = params(tmp_path / "mpi.npz"), params(tmp_path / "single.npz")
    np.testing.assert_array_equal(single["step0_1"], single["step0_0"])
    for how in ("step", "loop"):
        np.testing.assert_array_equal(mpi[f"{how}1_0"], mpi[f"{how}0_0"], err_msg=how)
        np.testing.assert_allclose(mpi[f"{how}1_0"], single[f"{how}0_0"], rtol=1e-5,
                                   atol=1e-6, err_msg=how)
    np.testing.assert_allclose(mpi["step1_0"], [0.2592, -0.8403, 0.0172], atol=1e-4)
    assert mpi["count1_0"] == mpi["count0_0"] == 3


OTHER_MODEL_ON_ONE_RANK = """
import numpy as np, parcl as pc, parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup
hidden = 3 + dist.rank()                          # a width each rank derived on its own
def build(q):
    pc.nn.manual_seed(0)
    return pc.nn.Sequential(pc.nn.Linear(4, hidden, queue=q), pc.nn.ReLU(),
                            pc.nn.Linear(hidden, 3, queue=q))
with ReplicaGroup.from_launch(build, timeout=20) as group:
    opt = pc.optim.SGD(group.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 4)).astype(np.float32), rng.integers(0, 3, 4)
    print("trained", group.step(x, y, tp.cross_entropy, opt), flush=True)
"""


def test_ranks_that_built_other_models_are_refused_as_ddp_refuses_them(tmp_path):
    """Rank 1's hidden layer was 4 wide where rank 0's was 3: the group broadcast rank 0's
    bytes into rank 1's buckets and summed the gradients position by position, and both
    ranks trained (the step returned the same loss, 1.1677, on each) on weights that mean
    nothing, silently. PyTorch's DDP checks the parameters' shapes across the processes when
    it is built; so does the group now, on every rank, naming the rank and the first
    parameter that differs."""
    script = tmp_path / "other_model.py"
    script.write_text(OTHER_MODEL_ON_ONE_RANK)
    r = run([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1, script], timeout=90)
    assert r.returncode != 0
    assert "trained" not in r.stdout
    assert ("ReplicaGroup: rank 1 built a model other than rank 0's: its parameter or buffer "
            "0 is 0.weight (4, 4) float32 where rank 0's is 0.weight (3, 4) float32"
            in r.stderr), r.stderr


def test_launch_errors_abort_every_rank():
    r = run([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1000, SCRIPT, "x.npz"], timeout=60)
    assert r.returncode != 0
    assert "parcl-launch: error:" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_under_mpiexec_stops_every_rank():
    import signal

    cmd = [MPIEXEC, "-n", "2", *LAUNCH, "--replicas", "1",
           str(ROOT / "examples" / "train_digits_dp.py"), "--epochs", "1000", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**ENV, "PYTHONUNBUFFERED": "1"})
    try:
        line = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not line.startswith("epoch 1/"):
            line = proc.stdout.readline()
            if not line:
                break
        assert line.startswith("epoch 1/"), proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 15
        assert proc.returncode != 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_scaling_benchmark_gives_each_rank_its_share_of_the_cpu(tmp_path):
    """Two ranks of one replica each on this machine: each runs on a sub-device of its own
    (half the cores), as under parcl-launch, not both on the whole CPU."""
    out = tmp_path / "scaling.json"
    r = run([MPIEXEC, "-n", 2, sys.executable, "-m", "parcl.bench", "scaling", "--model", "mlp",
             "--replicas", 1, "--steps", 1, "--repeat", 1, "--no-numpy", "--json", out])
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["params"]["ranks"] == 2
    (device,) = result["devices"]
    assert device["sub_device"] and device["compute_units"] == 1, result["devices"]


PLAIN_GROUP = """
import sys, numpy as np, parcl as pc, parcl.tape as tp
from parcl import distributed as dist
from parcl.replica import ReplicaGroup
def build(q):
    pc.nn.manual_seed(0)
    return pc.nn.Linear(2, 1, queue=q)
x = np.full((2, 2), dist.rank() + 1.0, np.float32)      # each rank's own half of the batch
make = {"plain": lambda: ReplicaGroup(build), "launch": lambda: ReplicaGroup.from_launch(build)}
with make[sys.argv[2]]() as group:
    group.step(x, np.zeros((2, 1), np.float32), tp.mse_loss,
               pc.optim.SGD(group.parameters(), lr=0.1))
    np.save(f"{sys.argv[1]}{dist.rank()}.npy", group.model.weight.value.to_host())
"""


def test_a_replica_group_built_without_comm_under_mpiexec_reduces_over_every_rank_as_ddp(
        tmp_path):
    """``ReplicaGroup(build)`` under ``mpiexec -n 2 parcl-launch`` takes the run's
    communicator, as DDP's default process group: it had none, so each rank trained its own
    replicas apart from the other's and rank 0 ended with [0.350, -0.169], rank 1 with
    [0.559, 0.040], silently, where ``ReplicaGroup.from_launch(build)`` gives both
    [0.454, -0.065]."""
    script = tmp_path / "plain_group.py"
    script.write_text(PLAIN_GROUP)
    weights = {}
    for how in ("plain", "launch"):
        r = run([MPIEXEC, "-n", 2, *LAUNCH, "--replicas", 1, script, tmp_path / how, how])
        assert r.returncode == 0, r.stderr
        weights[how] = [np.load(tmp_path / f"{how}{rank}.npy") for rank in (0, 1)]
    np.testing.assert_allclose(weights["launch"][0], [[0.45438036, -0.06488348]], rtol=1e-6)
    for rank in (0, 1):
        np.testing.assert_array_equal(weights["plain"][rank], weights["launch"][0])


class _OneRank:
    """A communicator of ``rank`` whose Bcast sends into ``wire`` from rank 0 and receives
    from it on the others."""

    def __init__(self, rank, wire):
        self.rank, self.wire, self.bcasts = rank, wire, 0

    def Get_rank(self):
        return self.rank

    def Bcast(self, packed, root):
        self.bcasts += 1
        if self.rank == root:
            self.wire[:] = packed
        else:
            packed[:] = self.wire


def test_rank_0_raises_a_buffers_pending_check_before_broadcasting_it(queue):
    # rank 0 read its buffers and sent them with no check (to_host, used before, ran them):
    # a value an op had found bad reached every rank; now its error is raised on rank 0
    from parcl.allreduce.end import _from_rank_0
    from parcl.errors import ParclError

    t = pc.Tensor.from_host(queue, np.arange(4, dtype=np.float32))

    def bad():
        raise ParclError("index 7 out of range")

    t.checks = (bad,)
    wire = np.zeros(16, np.uint8)
    rank_0 = _OneRank(0, wire)
    with pytest.raises(ParclError, match="index 7"):
        _from_rank_0(rank_0, [t], "replica 0's buffers")
    assert rank_0.bcasts == 0
    t.checks = ()
    _from_rank_0(rank_0, [t], "replica 0's buffers")
    np.testing.assert_array_equal(wire.view(np.float32), np.arange(4, dtype=np.float32))
    u = pc.Tensor.from_host(queue, np.zeros(4, np.float32))
    _from_rank_0(_OneRank(1, wire), [u], "replica 0's buffers")
    np.testing.assert_array_equal(u.to_host(), np.arange(4, dtype=np.float32))
