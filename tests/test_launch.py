"""parcl-launch: device choice, the digits example under 2 replicas, --list-devices, one-line
errors for bad arguments, Ctrl-C. Subprocess tests run the real command line."""

from __future__ import annotations

import contextlib
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
             "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"):
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


def test_a_rank_started_by_srun_with_pmix_is_its_rank_of_the_steps_tasks(monkeypatch):
    """Slurm's ``srun --mpi=pmix -n 2 parcl-launch ...`` sets ``PMIX_RANK`` and no
    ``PMIX_SIZE`` (PMIx has no size variable), and the rank was read only beside one: every
    rank found (0, 1), so parcl-launch ran each as a lone process, each trained on the whole
    data as rank 0 of 1, reduced nothing with the others and wrote the same checkpoint,
    silently. The step's task count is the world size now."""
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "PMIX_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PMIX_RANK", "1")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    assert distributed.env_world() == (1, 2)
    monkeypatch.setenv("PMIX_RANK", "0")              # a single-task step: one process
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert distributed.env_world() == (0, 1)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")        # no size anywhere: as before
    assert distributed.env_world() == (0, 1)

def test_a_launch_that_runs_one_process_is_rank_0_of_1_whatever_the_environment_says(tmp_path):
    """Launcher variables inherited by a process mpiexec did not start (PMI_RANK=3 of 4, a
    local rank 1 of 2) make MPI run one process, and parcl-launch sets up one; but
    ``dist.rank()`` and ``dist.world_size()`` read the environment's 3 of 4, so the script's
    ``DataLoader(rank=dist.rank(), world_size=dist.world_size())`` trained 1 batch of a
    quarter of the data where the whole has 4, and ``is_main()`` was False: nothing printed,
    no checkpoint, silently. The helpers follow the launcher's communicator now."""
    script = tmp_path / "which.py"
    script.write_text("import numpy as np\nimport parcl as pc\n"
                      "from parcl import distributed as dist\n"
                      "loader = pc.data.DataLoader(np.arange(8), 2, rank=dist.rank(), "
                      "world_size=dist.world_size())\n"
                      "print(dist.rank(), dist.world_size(), dist.is_main(), dist.local_rank(), "
                      "dist.local_size(), len(loader))\n")
    env = {**ENV, "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
           "MPI_LOCALNRANKS": "2"}
    r = subprocess.run([*LAUNCH, str(script)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1", "True", "0", "1", "4"]


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
    (["--epochs", 1], "no script given"),
    (["--replicas", 2, "--epochs", 1], "no script given"),
    (["--epochs=1"], "no script given"),
    (["examples"], "is a directory"),
    (["--max-restarts", "-1", DP_EXAMPLE], "--max-restarts must be >= 0"),
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


@pytest.mark.parametrize("args", [["--", "--lr", "0.1"], ["--"], ["a", "--", "-x"],
                                  ["--replicas", "3"]])
def test_script_arguments_reach_the_script_unchanged(tmp_path, args):
    """The script sees ``sys.argv[1:]`` as ``python script.py ARGS`` would give it. argparse
    dropped a ``--`` right after the script, so ``parcl-launch train.py -- --lr 0.1`` handed
    the script ``['--lr', '0.1']``: a script that reads what follows ``--`` as positional
    arguments (file names) instead took ``--lr 0.1`` as its own option, silently."""
    script, out = tmp_path / "argv.py", tmp_path / "argv.txt"
    script.write_text(f"import sys\nopen({str(out)!r}, 'w').write(repr(sys.argv[1:]))\n")
    python = subprocess.run([sys.executable, script, *args], timeout=60)
    assert python.returncode == 0
    expected = out.read_text()
    assert expected == repr(args)
    out.unlink()
    r = launch(script, *args, timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == expected


def test_a_single_device_script_given_two_devices_says_it_used_one(tmp_path):
    """``parcl-launch --replicas 2 train_digits.py`` (a single-device script) trained on one
    device as it would alone, and nothing said that the second replica the user asked for
    never ran; a script over a ``ReplicaGroup`` of the launch's devices gets no such line."""
    single = tmp_path / "single.py"
    single.write_text("import numpy as np, parcl as pc\n"
                      "pc.Tensor.from_host(pc.default_queue(), np.ones(3, np.float32))\n")
    r = launch("--replicas", 2, single, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "the script ran on 1 of the 2 devices it was given" in r.stderr
    group = tmp_path / "group.py"
    group.write_text("import parcl as pc\nfrom parcl.replica import ReplicaGroup\n"
                     "with ReplicaGroup.from_launch(lambda q: pc.nn.Linear(2, 2, queue=q)):\n"
                     "    pass\n")
    r = launch("--replicas", 2, group, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "devices it was given" not in r.stderr


def test_a_replica_group_built_under_the_launcher_takes_its_allreduce_algorithm(tmp_path):
    """``parcl-launch --allreduce ring`` reaches a ``ReplicaGroup(build)`` as it reaches
    ``ReplicaGroup.from_launch(build)``: the plain group ran "auto", the flag parsed and
    ignored; an algorithm the script names is kept, and outside the launcher it is "auto"."""
    script = tmp_path / "algorithm.py"
    script.write_text("import parcl as pc\nfrom parcl.replica import ReplicaGroup\n"
                      "build = lambda q: pc.nn.Linear(2, 2, queue=q)\n"
                      "for kw in ({}, {'allreduce': 'direct'}):\n"
                      "    with ReplicaGroup(build, **kw) as group:\n"
                      "        print(group.allreduce_algorithm)\n")
    r = launch("--replicas", 2, "--allreduce", "ring", script, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ring", "direct"]
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120,
                       env=ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["auto", "direct"]


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


def test_ctrl_c_inside_a_finalizer_still_stops_the_script(tmp_path):
    """Ctrl-C that lands while garbage collection runs a finalizer (a progress bar's ``__del__``)
    raises KeyboardInterrupt inside it, which Python prints as "Exception ignored" and drops: the
    script trained on as if Ctrl-C had not been pressed (seen: the digits example kept going for
    20 s under load). parcl-launch delivers such an interrupt again, after the finalizer."""
    script = tmp_path / "swallowed.py"
    script.write_text(
        "import os, signal, time\n"
        "class Bar:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C while the finalizer runs\n"
        "        sum(range(1000))\n"
        "Bar()\n"
        "for _ in range(100):\n"
        "    time.sleep(0.05)\n"
        "print('trained on')\n")
    r = launch(script, timeout=60)
    assert "trained on" not in r.stdout
    assert r.returncode == 130, r.stderr
    assert "interrupted" in r.stderr and "Exception ignored" not in r.stderr


def test_a_directory_as_the_script_names_its_scripts():
    r = launch("examples", timeout=60)
    assert r.returncode == 2
    assert "'examples' is a directory" in r.stderr and "train_digits_dp.py" in r.stderr
    assert "not found" not in r.stderr


def test_unknown_option_before_an_existing_script_is_named(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    r = launch("--bogus", script, timeout=60)
    assert r.returncode == 2 and "ran" not in r.stdout
    assert "unrecognized arguments: --bogus" in r.stderr and len(r.stderr.splitlines()) == 1


# -- --max-restarts (tiny scripts; the examples' resume is in tests/test_restarts.py) --------

FLAKY = """
import os, signal, sys
count = int(os.environ.get("PARCL_RESTART_COUNT", "0"))
with open(sys.argv[1], "a") as f:
    f.write(f"{count} {sys.argv[2:]}\\n")
fail = sys.argv[2].split(",")[count] if count < len(sys.argv[2].split(",")) else "ok"
if fail == "raise":
    raise RuntimeError(f"crash in run {count}")
if fail == "exit":
    os._exit(7)
if fail == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def flaky(tmp_path, plan: str, *launcher_args):
    script, log = tmp_path / "flaky.py", tmp_path / "runs.txt"
    script.write_text(FLAKY)
    r = launch(*launcher_args, script, log, plan, timeout=120)
    runs = log.read_text().splitlines() if log.exists() else []
    return r, runs


def test_max_restarts_runs_a_failing_script_again_with_the_restart_count(tmp_path):
    r, runs = flaky(tmp_path, "raise,exit,kill", "--max-restarts", 3)
    assert r.returncode == 0, r.stderr
    assert runs == [f"{i} ['raise,exit,kill']" for i in range(4)]       # counts 0, 1, 2, 3
    notes = [line for line in r.stderr.splitlines() if line.startswith("parcl-launch:")]
    assert notes == [
        f"parcl-launch: {tmp_path / 'flaky.py'} exited with status 1; restart 1 of 3 "
        f"(PARCL_RESTART_COUNT=1)",
        f"parcl-launch: {tmp_path / 'flaky.py'} exited with status 7; restart 2 of 3 "
        f"(PARCL_RESTART_COUNT=2)",
        f"parcl-launch: {tmp_path / 'flaky.py'} was killed by SIGKILL (exit status 137); "
        f"restart 3 of 3 (PARCL_RESTART_COUNT=3)"]
    assert "RuntimeError: crash in run 0" in r.stderr      # the failed run's own traceback


def test_every_restarted_run_gets_the_launcher_options(tmp_path):
    """A restart runs the same launcher command (without supervising again): --replicas and
    --allreduce reach every run, not only the first."""
    script, log = tmp_path / "opts.py", tmp_path / "runs.txt"
    script.write_text(
        "import os, sys\nimport parcl as pc\n"
        "count = int(os.environ['PARCL_RESTART_COUNT'])\n"
        "choice = pc.runtime.launched()\n"
        "with open(sys.argv[1], 'a') as f:\n"
        "    f.write(f'{count} {len(pc.devices())} {choice.allreduce}\\n')\n"
        "sys.exit(3 if count == 0 else 0)\n")
    r = launch("--replicas", 2, "--allreduce", "ring", "--max-restarts", 1, script, log)
    assert r.returncode == 0, r.stderr
    assert log.read_text().splitlines() == ["0 2 ring", "1 2 ring"]


def test_max_restarts_exhausted_exits_with_the_last_status(tmp_path):
    r, runs = flaky(tmp_path, "raise,exit", "--max-restarts", 1)
    assert r.returncode == 7
    assert [line.split()[0] for line in runs] == ["0", "1"]
    assert "no restarts left (--max-restarts 1)" in r.stderr.splitlines()[-1]


@pytest.mark.parametrize("plan, status", [("raise", 1), ("exit", 7), ("kill", -9)])
def test_without_max_restarts_a_failing_script_fails_the_launcher(tmp_path, plan, status):
    r, runs = flaky(tmp_path, plan)
    assert r.returncode == status and len(runs) == 1


def test_max_restarts_zero_runs_once_with_count_zero(tmp_path):
    r, runs = flaky(tmp_path, "exit", "--max-restarts", 0)
    assert r.returncode == 7 and runs == ["0 ['exit']"]


def test_a_launch_inside_a_supervised_script_supervises_its_own_runs(tmp_path):
    """Each supervised run had ``PARCL_LAUNCH_SUPERVISED`` in its environment, and so did
    everything the script started: a sweep driver run under ``--max-restarts`` that launches
    its trials with ``parcl-launch --max-restarts 1`` ran each trial once, silently, with the
    driver's own ``PARCL_RESTART_COUNT``, and a failed trial failed the driver, which was
    restarted whole. Now the flag is taken out of the environment by the run it was meant
    for: the trial is restarted by its own supervisor, the driver runs once."""
    flaky_script, trial_log = tmp_path / "flaky.py", tmp_path / "trial.txt"
    flaky_script.write_text(FLAKY)
    driver, driver_log = tmp_path / "driver.py", tmp_path / "driver.txt"
    driver.write_text(
        "import os, subprocess, sys\n"
        f"open({str(driver_log)!r}, 'a').write(os.environ['PARCL_RESTART_COUNT'] + '\\n')\n"
        "sys.exit(subprocess.run([sys.executable, '-m', 'parcl.launch', '--max-restarts', '1', "
        f"{str(flaky_script)!r}, {str(trial_log)!r}, 'raise']).returncode)\n")
    r = launch("--max-restarts", 1, driver, timeout=120)
    assert r.returncode == 0, r.stderr
    assert driver_log.read_text().splitlines() == ["0"]             # the driver ran once
    assert trial_log.read_text().splitlines() == ["0 ['raise']", "1 ['raise']"]
    assert "restart 1 of 1 (PARCL_RESTART_COUNT=1)" in r.stderr      # the trial's supervisor


STOPPABLE = """
import os, sys, time
count = os.environ["PARCL_RESTART_COUNT"]
with open(sys.argv[1], "a") as f:
    f.write(f"{count} {os.getpid()}\\n")
time.sleep(60)
"""


@contextlib.contextmanager
def stoppable_run(tmp_path, **popen):
    """A supervised run of STOPPABLE: yields the launcher's process, the run's pid, the run
    log and the launcher's stderr file; kills whatever is left at the end."""
    script, log, err = tmp_path / "stoppable.py", tmp_path / "runs.txt", tmp_path / "err.txt"
    script.write_text(STOPPABLE)
    with open(err, "w") as stderr:      # a file: an orphaned run would hold a pipe open
        proc = subprocess.Popen([*LAUNCH, "--max-restarts", "2", str(script), str(log)],
                                cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=stderr,
                                **popen)
    child = None
    try:
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline:
            runs = log.read_text().splitlines() if log.exists() else []
            child = int(runs[0].split()[1]) if runs else None
            time.sleep(0.1)
        assert child is not None, "the script never started"
        yield proc, child, log, err
    finally:
        proc.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_to_the_supervisor_stops_its_run_and_is_not_restarted(tmp_path, stop):
    """A SIGTERM (a job scheduler's preemption or time limit, ``kill``) or SIGHUP sent to the
    supervising launcher ended it alone, with Python's default: its run, orphaned, went on
    training for its whole length and writing checkpoints beside whatever ran next, while the
    launcher had already exited 143. Now the supervisor passes the signal on to its run, as
    torchrun passes it on to its workers, exits with the run's status and restarts nothing."""
    with stoppable_run(tmp_path) as (proc, child, log, err):
        proc.send_signal(stop)
        status = proc.wait(timeout=30)
        with pytest.raises(ProcessLookupError):         # the run stopped with it, not orphaned
            os.kill(child, 0)
        assert status == 128 + stop
        assert log.read_text().splitlines() == [f"0 {child}"]        # no restart
        assert (f"stopped by {stop.name}, passed on to {tmp_path / 'stoppable.py'}, which was "
                f"killed by {stop.name} (exit status {128 + stop}); not restarted"
                ) in err.read_text()


def test_a_hangup_the_supervisor_ignores_under_nohup_stays_ignored(tmp_path):
    """Under ``nohup`` (SIGHUP ignored) neither the launcher nor its run stops at a SIGHUP:
    only a signal left at its default is passed on."""
    with stoppable_run(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGHUP,
                                                                  signal.SIG_IGN)) as run:
        proc, child, log, _ = run
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        os.kill(child, 0)                                # still running: no error
        assert log.read_text().splitlines() == [f"0 {child}"]


def test_max_restarts_is_refused_inside_an_mpi_rank(tmp_path, monkeypatch, capsys):
    """Under mpiexec a failed rank aborts the job: restarts belong outside mpiexec."""
    import parcl.launch as launch_module
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    monkeypatch.setattr(distributed, "env_world", lambda: (0, 2))
    monkeypatch.setattr(launch_module, "_setup_mpi", lambda: (None, 0, 1, 0, 1))
    assert main(["--max-restarts", "2", str(script)]) == 2
    captured = capsys.readouterr()
    assert "ran" not in captured.out and "outside mpiexec" in captured.err
