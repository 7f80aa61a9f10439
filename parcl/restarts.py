"""``parcl-launch --max-restarts N``: run a training script again when it fails.

The launcher normally runs the script in its own process (``runpy``), which cannot survive the
failures a restart is for: ``os._exit``, a device watchdog's exit, SIGKILL. So with
``--max-restarts N`` (N >= 1) the launcher becomes a supervisor: it starts a child
``python -m parcl.launch`` with the same options and script (less ``--max-restarts``), and
``PARCL_RESTART_COUNT`` set in its environment (0 on the first run, as torchrun's restart
count), waits for it, and when it exits non-zero starts it again with the count incremented,
up to N times. Each restart is announced on stderr in one line naming the exit status. The
supervisor exits with the last run's status (128 + the signal for a child ended by a signal, as
a shell reports it). A child interrupted by Ctrl-C (status 130) is not restarted, nor is one
the supervisor was told to stop: a SIGTERM or SIGHUP sent to the supervisor (a job scheduler's
preemption or time limit, ``kill``) is passed on to the child, as torchrun passes it on to its
workers, and the run ends with the child's status.

The script is expected to resume from its own checkpoint when it finds one (the examples
do: ``--checkpoint DIR``), so a restarted run continues where the last checkpoint left it.

    parcl-launch --max-restarts 3 --replicas 2 examples/train_digits_dp.py --checkpoint run/

Under ``mpiexec`` each rank is one launcher and a failed rank aborts the whole job, so restarts
belong outside ``mpiexec``: see docs/launch.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

from .launch import INTERRUPTED, RESTART_COUNT_ENV, SUPERVISED_ENV

__all__ = ["child_command", "exit_status", "supervise"]

_STOP_GRACE_S = 15.0     # after Ctrl-C, how long the child may take to stop before it is killed
# Signals that stop a run rather than fail it. Python's default for them ends the supervisor
# alone: its child, orphaned, trained on and kept writing checkpoints beside whatever ran next.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                      if hasattr(signal, name))


def child_command(argv: list[str]) -> list[str]:
    """The launcher command line of one run: the launcher's own arguments, as given. The
    child runs them once (``SUPERVISED_ENV``): every launcher option reaches every run."""
    return [sys.executable, "-m", "parcl.launch", *argv]


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + N for one ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit status {exit_status(returncode)})"
    return f"exited with status {returncode}"


def supervise(opts, argv: list[str]) -> int:
    """Run ``opts.script`` until it succeeds or ``opts.max_restarts`` restarts are spent;
    returns the last run's exit status."""
    cmd = child_command(argv)
    for count in range(opts.max_restarts + 1):
        env = {**os.environ, RESTART_COUNT_ENV: str(count), SUPERVISED_ENV: "1"}
        with _passing_on_stop_signals() as run:
            run.start(cmd, env)
            try:
                returncode = run.child.wait()
            except KeyboardInterrupt:      # the child got the same SIGINT: let it stop itself
                try:
                    run.child.wait(timeout=_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    run.child.kill()
                    run.child.wait()
                return INTERRUPTED
        status = exit_status(returncode)
        if run.stopped_by is not None:
            print(f"parcl-launch: stopped by {signal.Signals(run.stopped_by).name}, passed on "
                  f"to {opts.script}, which {_describe(returncode)}; not restarted",
                  file=sys.stderr, flush=True)
            return status
        if status == 0 or status == INTERRUPTED:
            return status
        if count == opts.max_restarts:
            print(f"parcl-launch: {opts.script} {_describe(returncode)}; no restarts left "
                  f"(--max-restarts {opts.max_restarts})", file=sys.stderr, flush=True)
            return status
        print(f"parcl-launch: {opts.script} {_describe(returncode)}; restart {count + 1} of "
              f"{opts.max_restarts} ({RESTART_COUNT_ENV}={count + 1})",
              file=sys.stderr, flush=True)
    return status   # not reached: the loop returns


class _Run:
    """One supervised run: its child process, and the stop signal the supervisor got, if any."""

    def __init__(self):
        self.child: subprocess.Popen | None = None
        self.stopped_by: int | None = None

    def start(self, cmd: list[str], env: dict[str, str]) -> None:
        self.child = subprocess.Popen(cmd, env=env)
        if self.stopped_by is not None:      # it came while the child was being started
            self.child.send_signal(self.stopped_by)


@contextlib.contextmanager
def _passing_on_stop_signals():
    """While a run is in flight, a stop signal (``_STOP_SIGNALS``) the supervisor gets is sent
    on to the run's child and noted in ``stopped_by``. Only signals left at their default are
    taken: one ignored (SIGHUP under ``nohup``) stays ignored, by the child too. Handlers can
    only be set in the main thread; elsewhere the signals keep their handlers."""
    run = _Run()
    if threading.current_thread() is not threading.main_thread():
        yield run
        return

    def pass_on(signum, frame):
        run.stopped_by = signum
        if run.child is not None:
            run.child.send_signal(signum)

    previous = {s: signal.signal(s, pass_on) for s in _STOP_SIGNALS
                if signal.getsignal(s) == signal.SIG_DFL}
    try:
        yield run
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
