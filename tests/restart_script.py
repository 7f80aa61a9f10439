"""examples/train_digits_dp.py with a crash injected, for tests/test_restarts.py.

Run under parcl-launch like the example itself, with the example's arguments. On the first
run (``PARCL_RESTART_COUNT`` 0 or unset) the ``PARCL_TEST_CRASH_AT``-th ``group.step`` call
fails the way ``PARCL_TEST_CRASH_MODE`` says before it runs: ``raise`` (an exception),
``exit`` (``os._exit(3)``: no cleanup at all) or ``kill`` (SIGKILL of this very process).
Restarted runs are not touched, so they show whether the example resumes correctly.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

from parcl.replica import ReplicaGroup

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits_dp.py"


def crash(mode: str) -> None:
    print(f"crashing ({mode})", flush=True)
    if mode == "raise":
        raise RuntimeError("injected crash")
    if mode == "exit":
        os._exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError(f"unknown PARCL_TEST_CRASH_MODE {mode!r}")


crash_at = int(os.environ.get("PARCL_TEST_CRASH_AT", "0"))
if crash_at and os.environ.get("PARCL_RESTART_COUNT", "0") == "0":
    real_step, calls = ReplicaGroup.step, [0]

    def step(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == crash_at:
            crash(os.environ.get("PARCL_TEST_CRASH_MODE", "raise"))
        return real_step(self, *args, **kwargs)

    ReplicaGroup.step = step

sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
