"""``parcl-launch``: run a training script on several devices (and processes).

    parcl-launch [--replicas N] [--devices SPEC] [--allreduce ALGO] [--allow-repeat]
                 [--max-restarts N] [--list-devices] script.py [args...]
    python -m parcl.launch ...                     # the same
    mpiexec -n K parcl-launch --replicas N script.py ...

The launcher picks the devices, hands them to the script (``ReplicaGroup.from_launch`` or
``pc.devices()`` return them), sets the allreduce algorithm and, under ``mpiexec``, the MPI
communicator, then runs ``script.py`` as ``__main__`` with ``sys.argv = [script.py, *args]``.

Devices. On a CPU, ``--replicas N`` splits the CPU device into N sub-devices (OpenCL device
fission), so each replica owns its cores. Under MPI the K ranks on one machine would otherwise
fight over the same cores, so the CPU is split into K*N sub-devices and each rank takes its own
N (rank r on its node gets sub-devices r*N .. r*N+N-1). With ``--devices`` (``gpu``, ``gpu:0,1``,
``cpu:4``, ``all``) the first N listed devices are used (under MPI each rank on a node takes its
own consecutive N). Asking for more replicas than the devices can give is an error unless
``--allow-repeat`` lets several replicas share a device (one queue each).

Restarts. With ``--max-restarts N`` the launcher supervises: it runs the script in a child
launcher process with ``PARCL_RESTART_COUNT`` set (0, 1, ...) and, when that exits non-zero
(an exception, ``os._exit``, a signal), runs it again, up to N times, announcing each restart in
one line; it exits with the last run's status. A SIGTERM or SIGHUP sent to the supervisor is
passed on to the run, which is then not restarted. The script resumes from its own checkpoint
(see ``parcl.restarts``). Under ``mpiexec`` restart the whole job from outside (docs/launch.md).

Errors. Bad arguments exit with status 2 and one line on stderr. An exception in the script
prints its traceback and exits 1; under MPI the traceback is prefixed with the rank and the whole
job is aborted (``MPI_Abort``), so no rank waits forever for a failed one. Ctrl-C stops every
replica and exits 130.
"""

from __future__ import annotations

import _thread
import argparse
import os
import runpy
import sys
import threading
import time
import traceback

USAGE_ERROR = 2
RESTART_COUNT_ENV = "PARCL_RESTART_COUNT"
# Set by the supervising launcher in each run it starts: that run is one run, not another
# supervisor (it got the same arguments, --max-restarts included).
SUPERVISED_ENV = "PARCL_LAUNCH_SUPERVISED"
SCRIPT_ERROR = 1
INTERRUPTED = 130
_EXIT_GRACE_S = 15.0   # after Ctrl-C, the longest cleanup may take before the process is ended


class LaunchError(Exception):
    """A bad command line or device request: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):   # one line, no usage block, no traceback
        raise LaunchError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="parcl-launch", description="Run a parcl training script on several "
                "OpenCL devices (data-parallel replicas), optionally under mpiexec.")
    p.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="replicas in this process (on a CPU: sub-devices to split it into)")
    p.add_argument("--devices", default=None, metavar="SPEC",
                   help="cpu, cpu:N, gpu, gpu:I,J or all (default: $PARCL_DEVICES, else "
                        "$PYOPENCL_CTX, else GPUs, else the CPU)")
    p.add_argument("--allreduce", default="auto", metavar="ALGO",
                   help="allreduce algorithm: auto, direct, shared, scatter or ring")
    p.add_argument("--allow-repeat", action="store_true",
                   help="let several replicas share a device when there are fewer devices "
                        "than replicas")
    p.add_argument("--max-restarts", type=int, default=None, metavar="N",
                   help="run the script again, up to N times, when it exits non-zero; it sees "
                        "$PARCL_RESTART_COUNT and should resume from its checkpoint")
    p.add_argument("--list-devices", action="store_true",
                   help="print the OpenCL platforms and devices and exit")
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


# -- devices --------------------------------------------------------------------------------

def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def list_devices(out=None) -> None:
    """Print every OpenCL platform and device: type, compute units, global memory."""
    out = sys.stdout if out is None else out
    import pyopencl as cl

    from .runtime import platforms

    for pi, platform in enumerate(platforms()):
        print(f"platform {pi}: {platform.name.strip()} ({platform.version.strip()})", file=out)
        try:
            devs = platform.get_devices()
        except cl.Error:
            devs = []
        if not devs:
            print("  (no devices)", file=out)
        for di, dev in enumerate(devs):
            kind = ("gpu" if dev.type & cl.device_type.GPU else
                    "cpu" if dev.type & cl.device_type.CPU else "other")
            line = (f"  device {di}: {kind:5s} {dev.name.strip()} | "
                    f"{dev.max_compute_units} compute units | "
                    f"{_gib(dev.global_mem_size)} global memory | {dev.version.strip()}")
            try:
                subs = dev.partition_max_sub_devices
            except cl.Error:
                subs = 0
            if kind == "cpu" and subs > 1:
                line += f" | splits into up to {subs} sub-devices (--replicas N)"
            print(line, file=out)


def choose_devices(replicas: int | None = None, spec: str | None = None,
                   allow_repeat: bool = False, local_rank: int = 0, local_size: int = 1) -> list:
    """The devices of this process's replicas.

    ``spec=None`` means what ``pc.devices()`` would give ($PARCL_DEVICES, $PYOPENCL_CTX, the
    GPUs, else the CPU). A single whole CPU device is split into ``replicas * local_size``
    sub-devices and this rank takes its ``replicas``; a list of devices is cut the same way.
    """
    from . import runtime
    from .errors import DeviceError

    if replicas is not None and replicas < 1:
        raise LaunchError(f"--replicas must be >= 1, got {replicas}")
    pool = runtime.parse_spec(spec) if spec is not None else runtime.devices()
    if not pool:
        raise DeviceError(f"device spec {spec!r} gives no devices")
    where = f" per rank x {local_size} ranks on this node" if local_size > 1 else ""
    single_cpu = (len(pool) == 1 and not runtime.is_gpu(pool[0])
                  and _is_root_device(pool[0]))
    if single_cpu:
        n = replicas or 1
        cpu, total = pool[0], n * local_size
        units = cpu.max_compute_units
        if total > units:
            if not allow_repeat:
                raise LaunchError(
                    f"{n} replicas{where} need {total} CPU sub-devices but "
                    f"{runtime.describe(cpu)} has only {units} compute units; use fewer "
                    f"replicas or --allow-repeat to let replicas share cores")
            pool = runtime.split_device(cpu, units) if units > 1 else [cpu]
        else:
            pool = runtime.split_device(cpu, total)
    else:
        n = replicas or max(1, len(pool) // local_size)
        total = n * local_size
        if total > len(pool) and not allow_repeat:
            raise LaunchError(
                f"{n} replicas{where} need {total} devices but {spec or 'this machine'} gives "
                f"{len(pool)} ({', '.join(runtime.describe(d) for d in pool)}); use fewer "
                f"replicas or --allow-repeat to let replicas share a device")
    first = local_rank * n
    return [pool[(first + i) % len(pool)] for i in range(n)]


def _is_root_device(device) -> bool:
    """True for a device that is not itself a sub-device (so it can be split)."""
    import pyopencl as cl
    try:
        return device.parent_device is None
    except (cl.Error, AttributeError):
        return True


# -- running the script ----------------------------------------------------------------------

def _script_traceback(exc: BaseException) -> str:
    """The traceback as ``python script.py`` would print it: without the launcher's frames."""
    tb = exc.__traceback__
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and (tb.tb_frame.f_code.co_filename in ours or
                              os.path.abspath(tb.tb_frame.f_code.co_filename) in ours):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _prefixed(text: str, prefix: str) -> str:
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def run_script(script: str, args: list[str]) -> None:
    """Run ``script`` as ``__main__`` with ``sys.argv = [script, *args]``, as ``python`` would
    (its directory first on ``sys.path``), with no Ctrl-C lost (``_redeliver``)."""
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    sys.path.insert(0, script_dir)
    previous = sys.unraisablehook
    sys.unraisablehook = _redeliver(previous)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.unraisablehook = previous
        try:
            sys.path.remove(script_dir)
        except ValueError:
            pass


def _redeliver(previous):
    """An ``unraisablehook`` that raises a dropped KeyboardInterrupt again in the main thread.
    Ctrl-C that lands while garbage collection runs a finalizer (a progress bar's ``__del__``)
    raises inside it, and Python reports such an exception and drops it: the script trained on
    as if Ctrl-C had not been pressed. A thread of its own raises it again a moment later
    (``interrupt_main`` from the hook itself would raise inside the hook, and be dropped too),
    so the script stops, or handles it, as for any Ctrl-C."""
    def hook(unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type,
                                                          KeyboardInterrupt):
            _thread.start_new_thread(_interrupt_soon, ())   # no wait for the thread's start
            return
        previous(unraisable)
    return hook


def _interrupt_soon() -> None:
    time.sleep(0.05)               # the finalizer and the hook have returned by then
    _thread.interrupt_main()


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)   # sys.exit("message") prints it and exits 1, as Python does
    return 1


def _hard_exit_later(code: int) -> None:
    """Bound the shutdown: if cleanup (joining replica threads, MPI finalize) hangs, end the
    process anyway."""
    def bail():
        sys.stderr.flush()
        os._exit(code)
    timer = threading.Timer(_EXIT_GRACE_S, bail)
    timer.daemon = True
    timer.start()


def _setup_mpi():
    """``(comm, rank, size, local_rank, local_size)``; comm is None outside a multi-rank MPI
    run. mpi4py is imported only when the environment says there are several ranks."""
    from . import distributed

    _, size = distributed.env_world()
    if size <= 1:
        distributed.set_comm(None)
        return None, 0, 1, 0, 1
    try:
        from mpi4py import MPI
    except ImportError:
        raise LaunchError("running under mpiexec with several ranks needs mpi4py: "
                          "pip install 'parcl[mpi]'") from None
    comm = MPI.COMM_WORLD
    distributed.set_comm(comm)
    if comm.Get_size() <= 1:   # the environment looked like MPI, the library says otherwise
        distributed.set_comm(None)
        return None, 0, 1, 0, 1
    return (comm, comm.Get_rank(), comm.Get_size(), distributed.local_rank(),
            distributed.local_size())


def _one_line(exc: BaseException) -> str:
    from .errors import ParclError
    text = str(exc) if isinstance(exc, (LaunchError, ParclError)) else \
        f"{type(exc).__name__}: {exc}"
    return "parcl-launch: error: " + " ".join(text.split())   # one line, whatever it held


def _abort(comm, code: int) -> None:
    """End every rank. The short pause lets mpiexec forward what this rank just wrote to
    stderr before the job is torn down (it may drop it otherwise)."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)
    comm.Abort(code)


def _prepare(argv: list[str]):
    """Parse and check the command line; ``(options, None)`` or ``(options, error)``."""
    opts = None
    try:
        opts, unknown = build_parser().parse_known_args(argv)
        if opts.list_devices and not unknown:
            return opts, None
        if unknown:
            _refuse_unknown(argv, opts, unknown)
        opts.args = _script_args(argv, opts)
        if not opts.script:
            raise LaunchError("no script given: parcl-launch [--replicas N] script.py [args...]")
        if os.path.isdir(opts.script) and not os.path.isfile(
                os.path.join(opts.script, "__main__.py")):
            raise LaunchError(f"{opts.script!r} is a directory, not a script"
                              f"{_scripts_in(opts.script)}")
        if not os.path.isfile(opts.script) and not os.path.isdir(opts.script):
            raise LaunchError(f"script {opts.script!r} not found")
        if opts.max_restarts is not None and opts.max_restarts < 0:
            raise LaunchError(f"--max-restarts must be >= 0, got {opts.max_restarts}")
        if opts.replicas is not None and opts.replicas < 1:
            raise LaunchError(f"--replicas must be >= 1, got {opts.replicas}")
        from .allreduce import ALGORITHMS
        if opts.allreduce != "auto" and opts.allreduce not in ALGORITHMS:
            raise LaunchError(f"--allreduce {opts.allreduce!r} is unknown; choose auto, "
                              f"{', '.join(sorted(ALGORITHMS))}")
    except Exception as exc:   # noqa: BLE001 - reported as one line
        return opts, exc
    return opts, None


def _refuse_unknown(argv: list[str], opts, unknown: list[str]) -> None:
    """Options the launcher does not know. Usually the script's own, given before the script
    (``parcl-launch --epochs 1``): then argparse took the option's value for the script."""
    first = argv.index(unknown[0])
    took_value = (opts.script is not None and first + 1 < len(argv)
                  and argv[first + 1] == opts.script and not os.path.exists(opts.script))
    if opts.script is None or took_value:
        rest = " ".join(argv[first:])
        raise LaunchError(f"no script given ({rest!r} is not a parcl-launch option; the script's "
                          f"own options go after it: parcl-launch [--replicas N] script.py "
                          f"{rest})")
    raise LaunchError(f"unrecognized arguments: {' '.join(unknown)} (parcl-launch's options "
                      f"go before the script, the script's own after it)")


def _script_args(argv: list[str], opts) -> list[str]:
    """The script's arguments exactly as given. argparse takes a ``--`` right after the script
    for its own end-of-options marker and drops it, where ``python script.py -- -x`` hands the
    script ``['--', '-x']``."""
    start = len(argv) - len(opts.args)
    if (opts.script is not None and start >= 2 and argv[start - 1] == "--"
            and argv[start - 2] == opts.script):
        return argv[start - 1:]
    return opts.args


def _scripts_in(directory: str) -> str:
    found = sorted(f for f in os.listdir(directory) if f.endswith(".py"))[:6]
    return f"; give one of its scripts: {', '.join(found)}" if found else \
        " (and has no __main__.py); give the script's path"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``parcl-launch``; returns the exit status."""
    from . import distributed

    argv = sys.argv[1:] if argv is None else list(argv)
    # Read once and taken out of the environment: a script that runs parcl-launch
    # --max-restarts itself (a sweep driver) must get a supervisor, not one run.
    supervised = os.environ.pop(SUPERVISED_ENV, None) is not None
    comm, rank = None, 0
    try:
        opts, error = _prepare(argv)
        if error is None and opts.list_devices:
            list_devices()
            return 0
        under_mpi = distributed.env_world()[1] > 1
        if error is None and under_mpi and opts.max_restarts:
            error = LaunchError("--max-restarts restarts one process and cannot restart an MPI "
                                "job from inside one of its ranks; restart the whole job from "
                                "outside mpiexec (a loop around it: see docs/launch.md)")
        if error is not None and not under_mpi:
            print(_one_line(error), file=sys.stderr, flush=True)
            return USAGE_ERROR
        if error is None and opts.max_restarts and not supervised:
            from .restarts import supervise
            return supervise(opts, argv)
        if opts is not None and opts.max_restarts is not None and not supervised:
            os.environ[RESTART_COUNT_ENV] = "0"   # --max-restarts 0: the first run
        # Under MPI every rank takes part in the set-up even when its own arguments failed, and
        # the ranks agree on the outcome: a rank that left alone would leave the others waiting
        # in their first collective forever.
        try:
            comm, rank, _, local_rank, local_size = _setup_mpi()
        except LaunchError as exc:   # no mpi4py: no way to tell the others; they fail alike
            print(_one_line(exc), file=sys.stderr, flush=True)
            return USAGE_ERROR
        if error is None:
            try:
                from . import runtime
                devs = choose_devices(opts.replicas, opts.devices, opts.allow_repeat,
                                      local_rank, local_size)
                runtime.set_launch(runtime.Launch(tuple(devs), opts.allreduce))
            except Exception as exc:   # noqa: BLE001 - LaunchError, DeviceError, OpenCL errors
                error = exc
        failed = error is not None
        if comm is not None:
            from mpi4py import MPI
            failed = bool(comm.allreduce(int(failed), op=MPI.MAX))
        if failed:
            if error is not None:
                prefix = f"[rank {rank}] " if comm is not None else ""
                print(prefix + _one_line(error), file=sys.stderr, flush=True)
            return USAGE_ERROR
    except KeyboardInterrupt:
        return INTERRUPTED

    prefix = f"[rank {rank}] " if comm is not None else ""
    try:
        run_script(opts.script, opts.args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code != 0 and comm is not None:   # the other ranks may wait for this one
            _abort(comm, code)
        if code == 0:
            _warn_unused_devices(prefix)
        return code
    except KeyboardInterrupt:
        print(f"{prefix}parcl-launch: interrupted", file=sys.stderr, flush=True)
        _hard_exit_later(INTERRUPTED)
        if comm is not None:
            _abort(comm, INTERRUPTED)
        return INTERRUPTED
    except BaseException as exc:   # noqa: BLE001 - reported, then the whole job stops
        text = _script_traceback(exc)
        sys.stderr.write(_prefixed(text, prefix) if prefix else text)
        sys.stderr.flush()
        _hard_exit_later(SCRIPT_ERROR)
        if comm is not None:
            _abort(comm, SCRIPT_ERROR)
        return SCRIPT_ERROR
    _warn_unused_devices(prefix)
    return 0


def _warn_unused_devices(prefix: str) -> None:
    """One line on stderr when the script was given several devices and ran on one: a
    single-device script under ``--replicas N`` trains as it would alone, which the user
    asking for N replicas would not otherwise see."""
    from . import runtime
    launch = runtime.launched()
    if launch is None or len(launch.devices) < 2:
        return
    used = launch.used & {d.int_ptr for d in launch.devices}
    if len(used) == 1:
        print(f"{prefix}parcl-launch: the script ran on 1 of the {len(launch.devices)} devices "
              f"it was given (it made no ReplicaGroup over them: ReplicaGroup.from_launch, "
              f"or pc.devices() for its own use of each)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
