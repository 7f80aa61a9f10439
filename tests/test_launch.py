"""parcl-launch: device choice, the digits example under 2 replicas, --list-devices, one-line
errors for bad arguments, Ctrl-C. Subprocess tests run the real command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import parcl as pc
from parcl import distributed
from parcl.launch import LaunchError, choose_devices, main

ROOT = Path(__file__).resolve().parent.parent
DP_EXAMPLE = ROOT / "examples" / "train_digits_dp.py"
LAUNCH = [sys.executable, "-m", "parcl.launch"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
for _var in ("PARCL_DEVICES", "PYOPENCL_CTX", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_SIZE"):
    ENV.pop(_var, None)


def launch(*args, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=ENV, **kw)


# -- device choice (in process; nothing global is changed) ----------------------------------

def test_replicas_split_the_cpu_into_sub_devices():
    cpu = pc.runtime.parse_spec("cpu")[0]
    units = cpu.max_compute_units
    assert units >= 2, "parcl's multi-device tests need a CPU with at least 2 compute units"
    devs = choose_devices(2)
    assert len(devs) == 2 and devs[0].int_ptr != devs[1].int_ptr
    assert all(d.max_compute_units == units // 2 for d in devs)
    assert choose_devices(1)[0].int_ptr == cpu.int_ptr        # one replica: the whole CPU


def test_mpi_ranks_take_disjoint_slices_of_the_cpu():
    assert pc.runtime.parse_spec("cpu")[0].max_compute_units >= 2, \
        "parcl's multi-device tests need a CPU with at least 2 compute units"
    subs = pc.split_device(pc.runtime.parse_spec("cpu")[0], 2)
    mine = [choose_devices(1, local_rank=r, local_size=2)[0] for r in (0, 1)]
    assert [d.int_ptr for d in mine] == [d.int_ptr for d in subs]


def test_more_replicas_than_cores_needs_allow_repeat():
    units = pc.runtime.parse_spec("cpu")[0].max_compute_units
    with pytest.raises(LaunchError, match="--allow-repeat"):
        choose_devices(units + 1)
    devs = choose_devices(units + 1, allow_repeat=True)
    assert len(devs) == units + 1
    assert len({d.int_ptr for d in devs}) == units


def test_explicit_spec_takes_the_first_n_devices():
    devs = choose_devices(1, "cpu:2")
    assert [d.int_ptr for d in devs] == [pc.runtime.parse_spec("cpu:2")[0].int_ptr]
    with pytest.raises(LaunchError, match="need 3 devices"):
        choose_devices(3, "cpu:2")
    assert len(choose_devices(3, "cpu:2", allow_repeat=True)) == 3


def test_list_devices_in_process(capsys):
    assert main(["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert "platform 0:" in out and "compute units" in out and "GiB global memory" in out


def test_distributed_helpers_read_the_mpi_environment(monkeypatch):
    assert distributed.env_world() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "4")
    assert distributed.env_world() == (3, 4)
    monkeypatch.delenv("PMI_RANK")
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert distributed.env_world() == (1, 2)


# -- the command line -----------------------------------------------------------------------

@pytest.mark.slow
def test_two_replicas_train_the_digits_example():
    t0 = time.monotonic()
    r = launch("--replicas", 2, DP_EXAMPLE, "--epochs", 1, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "2 replicas x 1 ranks" in r.stdout
    acc = float(r.stdout.strip().splitlines()[-1].split("test accuracy:")[1])
    assert 0.5 < acc <= 1.0, r.stdout
    assert time.monotonic() - t0 < 60


def test_console_script_lists_the_pocl_device():
    exe = Path(sys.executable).with_name("parcl-launch")
    cmd = [str(exe)] if exe.exists() else LAUNCH
    r = subprocess.run([*cmd, "--list-devices"], capture_output=True, text=True, timeout=60,
                       env=ENV)
    assert r.returncode == 0, r.stderr
    assert "Portable Computing Language" in r.stdout
    assert "cpu" in r.stdout and "compute units" in r.stdout


@pytest.mark.parametrize("args, fragment", [
    ([], "no script given"),
    (["--replicas", "0", DP_EXAMPLE], "--replicas must be >= 1"),
    (["--replicas", "two", DP_EXAMPLE], "invalid int value"),
    (["--replicas", "1000", DP_EXAMPLE], "compute units"),
    (["--devices", "tpu:7", DP_EXAMPLE], "unknown device spec"),
    (["no_such_script.py"], "not found"),
    (["--allreduce", "telepathy", DP_EXAMPLE], "--allreduce"),
])
def test_bad_arguments_exit_with_one_line(args, fragment):
    r = launch(*args, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert fragment in lines[0] and lines[0].startswith("parcl-launch: error:")


def test_script_error_prints_its_traceback_and_exits_1(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--x', '1']\nraise ValueError('nope')\n")
    r = launch(script, "--x", 1, timeout=60)
    assert r.returncode == 1
    assert "ValueError: nope" in r.stderr and str(script) in r.stderr
    assert "runpy" not in r.stderr and "launch.py" not in r.stderr   # only the script's frames


def test_script_exit_code_is_passed_through(tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("raise SystemExit(3)\n")
    assert launch(script, timeout=60).returncode == 3


@pytest.mark.slow
def test_ctrl_c_stops_every_replica_and_exits_130():
    proc = subprocess.Popen([*LAUNCH, "--replicas", "2", str(DP_EXAMPLE), "--epochs", "1000",
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=ENV)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:          # wait until training is under way
            line = proc.stdout.readline()
            if not line or line.startswith("epoch 1/"):
                break
        assert line.startswith("epoch 1/"), proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - t0 < 10
        assert proc.returncode == 130, err
        assert "interrupted" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
