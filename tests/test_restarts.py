"""parcl-launch --max-restarts with the digits example: a run that crashes mid-training (an
exception, os._exit, SIGKILL of the script's own process) is started again, resumes from its
last checkpoint and ends with parameters, Adam state and schedule bit-identical to an
uninterrupted run; without --max-restarts the same crash fails the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "restart_script.py"
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PARCL_DEVICES", "PYOPENCL_CTX", "PARCL_RESTART_COUNT")
       and not k.startswith(("PMI_", "OMPI_", "PARCL_TEST_"))}
# 5 steps per epoch at batch 256: 8 steps cross an epoch; checkpoints at steps 3, 6 and 8. The
# crash comes at the start of step 6, so the restarted run resumes at 3 and redoes 4 and 5.
ARGS = ["--batch-size", "256", "--epochs", "3", "--max-steps", "8", "--save-every", "3",
        "--no-progress", "--augment"]
CRASH_AT = 6


def launch(ckpt: Path, *launcher_args, crash: str | None = None):
    env = dict(ENV)
    if crash:
        env.update(PARCL_TEST_CRASH_AT=str(CRASH_AT), PARCL_TEST_CRASH_MODE=crash)
    cmd = [sys.executable, "-m", "parcl.launch", *map(str, launcher_args), "--replicas", "2",
           str(SCRIPT), *ARGS, "--checkpoint", str(ckpt)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)


def read(path: Path):
    with safe_open(str(path), "np") as f:
        doc = json.loads(f.metadata()["parcl"])
    return doc, safetensors.numpy.load_file(str(path))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("whole")
    r = launch(ckpt)
    assert r.returncode == 0, r.stderr
    assert "resumed" not in r.stdout
    return read(ckpt / "last.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("mode, status", [("raise", 1), ("exit", 3), ("kill", 137)])
def test_a_crashed_run_restarts_and_ends_bit_identical(tmp_path, uninterrupted, mode, status):
    r = launch(tmp_path, "--max-restarts", 2, crash=mode)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("parcl-launch:")]
    assert len(notes) == 1, r.stderr
    assert f"status {status}" in notes[0], notes
    assert "restart 1 of 2 (PARCL_RESTART_COUNT=1)" in notes[0]
    assert f"crashing ({mode})" in r.stdout
    assert "resumed from" in r.stdout and "at step 3" in r.stdout and "after restart 1" in r.stdout

    doc_a, tensors_a = uninterrupted
    doc_b, tensors_b = read(tmp_path / "last.safetensors")
    assert doc_a["step"] == doc_b["step"] == 8
    assert sorted(tensors_a) == sorted(tensors_b)
    assert any(k.startswith("optim.state.") for k in tensors_a)
    for key in tensors_a:
        np.testing.assert_array_equal(tensors_a[key], tensors_b[key], err_msg=key)
    assert doc_a["scheduler"] == doc_b["scheduler"]                  # the schedule, too
    assert doc_a["optimizer"]["param_groups"] == doc_b["optimizer"]["param_groups"]
    for key in ("loader", "rng", "epoch"):
        assert doc_a["meta"][key] == doc_b["meta"][key], key


@pytest.mark.slow
def test_without_max_restarts_the_crash_fails_the_launcher(tmp_path):
    r = launch(tmp_path, crash="raise")
    assert r.returncode == 1 and "injected crash" in r.stderr
    doc, _ = read(tmp_path / "last.safetensors")
    assert doc["step"] == 3                           # the last checkpoint before the crash


# The loop docs/launch.md gives for MPI jobs: restarts outside mpiexec, every rank afresh.
MPI_LOOP = """
max_restarts=2
for count in $(seq 0 $max_restarts); do
    PARCL_RESTART_COUNT=$count "$MPIEXEC" -n 2 "$PYTHON" -m parcl.launch --replicas 1 "$@" && break
    status=$?
    [ $status -eq 130 ] && break
    echo "job exited with status $status; restart $((count + 1)) of $max_restarts" >&2
done
"""


@pytest.mark.slow
def test_an_mpi_job_restarted_from_a_loop_outside_mpiexec_ends_bit_identical(tmp_path):
    import shutil
    mpiexec = Path(sys.executable).with_name("mpiexec")
    mpiexec = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found: pip install -e '.[test]' installs mpich"
    results = {}
    for name, crash in (("whole", None), ("crashed", "kill")):
        env = {**ENV, "MPIEXEC": mpiexec, "PYTHON": sys.executable}
        if crash:
            env.update(PARCL_TEST_CRASH_AT=str(CRASH_AT), PARCL_TEST_CRASH_MODE=crash)
        ckpt = tmp_path / name
        r = subprocess.run(["bash", "-c", MPI_LOOP, "loop", str(SCRIPT), *ARGS, "--checkpoint",
                            str(ckpt)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env=env)
        assert r.returncode == 0, r.stderr
        assert ("restart 1 of 2" in r.stderr) == bool(crash), r.stderr
        assert ("at step 3 (epoch 1, batch 3) after restart 1" in r.stdout) == bool(crash)
        results[name] = read(ckpt / "last.safetensors")
    (doc_a, tensors_a), (doc_b, tensors_b) = results["whole"], results["crashed"]
    assert doc_a["step"] == doc_b["step"] == 8 and doc_a["meta"]["world_size"] == 2
    assert sorted(tensors_a) == sorted(tensors_b)
    for key in tensors_a:
        np.testing.assert_array_equal(tensors_a[key], tensors_b[key], err_msg=key)
    assert doc_a["scheduler"] == doc_b["scheduler"]
    assert doc_a["meta"]["rng"] == doc_b["meta"]["rng"]
