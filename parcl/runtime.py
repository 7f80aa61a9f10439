"""Devices, contexts and command queues.

One context per set of devices resolved together (a platform's GPUs, or the CPU split into
sub-devices), so replicas' buffers can be read by each other's kernels. Sub-devices are created
once per (device, count) and cached: their identity, and so their context, is stable for the
life of the process. Everything here is safe to call from several threads.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
import sys
import threading
import time

import pyopencl as cl

from .errors import DeviceError
from .gate import Gate, release_all
from .pool import MemoryPool, pool_of

_lock = threading.RLock()
_subdevices: dict[tuple[int, int], list[cl.Device]] = {}   # (parent int_ptr, n) -> subs
_contexts: dict[tuple[int, ...], cl.Context] = {}           # device int_ptrs -> context
_context_of: dict[int, cl.Context] = {}                      # device int_ptr -> context
_local = threading.local()
_launch: Launch | None = None                                # set by parcl-launch

DEVICES_ENV = "PARCL_DEVICES"
WAIT_TIMEOUT = 600.0        # seconds a device wait may take by default (``wait_for_events``)


def platforms() -> list[cl.Platform]:
    """The OpenCL platforms; none is a DeviceError that says what to install."""
    try:
        found = cl.get_platforms()
    except cl.Error:
        found = []
    if not found:
        raise DeviceError(
            "no OpenCL platform found: install a driver, or the embedded CPU device with "
            "`pip install 'parcl[pocl]'` (pocl-binary-distribution)")
    return found


def _all_of_type(kind: int) -> list[cl.Device]:
    found = []
    for platform in platforms():
        try:
            found.extend(platform.get_devices(device_type=kind))
        except cl.Error:   # CL_DEVICE_NOT_FOUND on platforms without this kind
            pass
    return found


def _cpu_device() -> cl.Device:
    cpus = _all_of_type(cl.device_type.CPU)
    if not cpus:
        raise DeviceError("no OpenCL CPU device: install the embedded one with "
                          "`pip install 'parcl[pocl]'`")
    # Prefer PoCL's CPU device when several CPU platforms exist: it is the one we ship.
    cpus.sort(key=lambda d: 0 if "Portable" in d.platform.name else 1)
    return cpus[0]


def split_device(device: cl.Device, n: int) -> list[cl.Device]:
    """Partition ``device`` into ``n`` equal sub-devices (OpenCL device fission), cached."""
    if n < 1:
        raise DeviceError(f"split_device: n must be >= 1, got {n}")
    if n == 1:
        return [device]
    units = device.max_compute_units
    if n > units:
        raise DeviceError(f"cannot split {device.name.strip()!r} into {n} sub-devices: it has "
                          f"only {units} compute units; ask for at most {units}")
    key = (device.int_ptr, n)
    with _lock:
        if key not in _subdevices:
            try:
                subs = device.create_sub_devices(
                    [cl.device_partition_property.EQUALLY, units // n])
            except cl.Error as exc:
                raise DeviceError(f"device fission of {device.name.strip()!r} into {n} failed: "
                                  f"{exc}") from exc
            _subdevices[key] = list(subs[:n])
        return list(_subdevices[key])


def _register(devices: list[cl.Device]) -> list[cl.Device]:
    """Give the devices resolved together one shared context (reusing a known one)."""
    with _lock:
        unique = []
        for dev in devices:
            if dev.int_ptr not in {d.int_ptr for d in unique}:
                unique.append(dev)
        if all(d.int_ptr in _context_of for d in unique):
            return devices
        # Group by platform: a context cannot span platforms.
        by_platform: dict[int, list[cl.Device]] = {}
        for dev in unique:
            if dev.int_ptr not in _context_of:
                by_platform.setdefault(dev.platform.int_ptr, []).append(dev)
        for group in by_platform.values():
            key = tuple(d.int_ptr for d in group)
            ctx = _contexts.get(key)
            if ctx is None:
                ctx = cl.Context(group)
                _contexts[key] = ctx
            for dev in group:
                _context_of[dev.int_ptr] = ctx
    return devices


def _from_pyopencl_ctx(spec: str) -> list[cl.Device]:
    parts = spec.split(":")
    try:
        platform = platforms()[int(parts[0] or 0)]
        devs = platform.get_devices()
        if len(parts) > 1 and parts[1] != "":
            devs = [devs[int(parts[1])]]
        else:
            devs = devs[:1]
    except (ValueError, IndexError) as exc:
        raise DeviceError(f"PYOPENCL_CTX={spec!r} does not name a platform:device here") from exc
    return devs


def parse_spec(spec: str) -> list[cl.Device]:
    """Resolve a device spec: ``cpu``, ``cpu:N``, ``gpu``, ``gpu:I,J``, ``all``."""
    s = spec.strip().lower()
    if s == "cpu":
        return [_cpu_device()]
    if s.startswith("cpu:"):
        try:
            n = int(s[4:])
        except ValueError:
            raise DeviceError(f"unknown device spec {spec!r}: cpu:N needs an integer N") from None
        return split_device(_cpu_device(), n)
    if s == "gpu" or s.startswith("gpu:"):
        gpus = _all_of_type(cl.device_type.GPU)
        if not gpus:
            raise DeviceError(f"device spec {spec!r}: no OpenCL GPU on this machine "
                              "(use 'cpu' or 'cpu:N')")
        if s == "gpu":
            return gpus
        try:
            idx = [int(i) for i in s[4:].split(",")]
        except ValueError:
            idx = []
        # gpus[i] alone took gpu:-1 for the last GPU, a device no index names
        if not idx or not all(0 <= i < len(gpus) for i in idx):
            raise DeviceError(f"device spec {spec!r}: there are {len(gpus)} GPUs "
                              f"(indices 0..{len(gpus) - 1})")
        return [gpus[i] for i in idx]
    if s == "all":
        gpus = _all_of_type(cl.device_type.GPU)
        return gpus if gpus else [_cpu_device()]
    raise DeviceError(f"unknown device spec {spec!r}: expected cpu, cpu:N, gpu, gpu:I,J or all")


def devices_for(spec: str) -> list[cl.Device]:
    """The devices a ``PARCL_DEVICES`` spec names (``cpu``, ``cpu:N``, ``gpu``, ``gpu:I,J``,
    ``all``), in one shared context; an unknown or unsatisfiable spec is a ``DeviceError``."""
    return _register(parse_spec(spec))


def devices(split: int | None = None) -> list[cl.Device]:
    """OpenCL devices to run replicas on, in a stable order.

    ``split=N`` partitions one CPU device into N sub-devices. Without it: the devices set by
    ``parcl-launch``, else ``PARCL_DEVICES``, else ``PYOPENCL_CTX``, else every GPU, else the
    CPU device (the pip-installed PoCL one when nothing else is there).

    >>> import parcl as pc
    >>> len(pc.devices(split=2))
    2
    """
    if split is not None:
        return _register(split_device(_cpu_device(), int(split)))
    if _launch is not None:
        return list(_launch.devices)
    env = os.environ.get(DEVICES_ENV)
    if env:
        try:
            return _register(parse_spec(env))
        except DeviceError as exc:
            # The spec came from the environment, far from where the error shows: say so, and
            # what this machine does have, so the user knows what to set instead.
            raise DeviceError(f"{DEVICES_ENV}={env!r} (from the environment) cannot be "
                              f"satisfied: {exc}. This machine has: {_inventory()}. Set "
                              f"{DEVICES_ENV} to one of those (e.g. {DEVICES_ENV}=cpu) or "
                              f"unset it") from None
    ctx_env = os.environ.get("PYOPENCL_CTX")
    if ctx_env:
        return _register(_from_pyopencl_ctx(ctx_env))
    return _register(parse_spec("all"))


def _inventory() -> str:
    """The OpenCL devices present, for error messages: 'cpu: pthread-Intel Xeon (2 CU)'."""
    try:
        found = [dev for platform in cl.get_platforms() for dev in platform.get_devices()]
    except cl.Error:
        found = []
    if not found:
        return "no OpenCL device at all"
    return "; ".join(f"{'gpu' if is_gpu(d) else 'cpu'}: {d.name.strip()} "
                     f"({d.max_compute_units} CU)" for d in found)


@dataclass(frozen=True)
class Launch:
    """What ``parcl-launch`` chose for the script it runs in this process: the devices of this
    process's replicas (``devices()`` returns them) and the allreduce algorithm
    (``ReplicaGroup.from_launch`` uses it). The one channel from the launcher to the script."""

    devices: tuple
    allreduce: str = "auto"
    #: the devices the script made queues on (``int_ptr``s): the launcher warns when a
    #: script given several used one (a single-device script under ``--replicas N``)
    used: set = field(default_factory=set, compare=False)


def set_launch(choice: Launch | None) -> None:
    """Used by parcl-launch (None: no launcher)."""
    global _launch
    _launch = None if choice is None else Launch(tuple(_register(list(choice.devices))),
                                                 choice.allreduce)


def launched() -> Launch | None:
    """What parcl-launch chose for this process, or None outside it."""
    return _launch


def context_for(device: cl.Device) -> cl.Context:
    """The shared context of ``device`` (created on first use)."""
    ctx = _context_of.get(device.int_ptr)
    if ctx is None:
        _register([device])
        ctx = _context_of[device.int_ptr]
    return ctx


def is_gpu(device: cl.Device) -> bool:
    return bool(device.type & cl.device_type.GPU)


# Work-groups one launch may have along NDRange dimensions 1 and 2 on a GPU: CUDA grids allow
# 65535 there (2**31 - 1 in dimension 0), and NVIDIA's OpenCL runs on them. OpenCL has no
# query for it, so every GPU gets it (by type: any GPU may have such a grid); CPUs have none.
GPU_GROUPS_MAX = 65535


def groups_max(device: cl.Device) -> int | None:
    """The most work-groups a launch on ``device`` may have along dimensions 1 and 2 (None:
    no limit); a larger launch is split (``kernels._grid``)."""
    return GPU_GROUPS_MAX if is_gpu(device) else None


def on_gpu(queue: cl.CommandQueue) -> bool:
    """Whether ``queue``'s device is a GPU: a parcl ``Queue`` knows it from when it was made
    (asking the device makes a ``Device`` object, at every launch that chooses a variant)."""
    try:
        return queue.gpu
    except AttributeError:
        return is_gpu(queue.device)


def root_device(device: cl.Device) -> cl.Device:
    """The device ``device`` was split from (through any levels), or itself."""
    parent = device.get_info(cl.device_info.PARENT_DEVICE)
    return device if parent is None else root_device(parent)


def describe(device: cl.Device) -> str:
    """A short human name: 'cpu Intel Xeon (1 CU)'."""
    kind = "gpu" if is_gpu(device) else "cpu"
    return f"{kind} {device.name.strip()} ({device.max_compute_units} CU)"


class Queue(cl.CommandQueue):
    """An in-order pyopencl command queue that owns its memory pool (``queue.pool``)."""

    def __init__(self, context: cl.Context, device: cl.Device, properties: int = 0,
                 hold_launches: bool | None = None):
        super().__init__(context, device, properties=properties)
        self.pool = MemoryPool(context)
        self.gpu = is_gpu(device)          # read by kernels choosing a variant (``on_gpu``)
        # read when this queue's launchers are made (tests set a small one on a fresh queue)
        self.groups_max = groups_max(device)
        self.profiling = bool(properties & cl.command_queue_properties.PROFILING_ENABLE)
        if hold_launches is None:        # where it pays: a CPU device (parcl.gate)
            hold_launches = bool(device.type & cl.device_type.CPU)
        in_order = not properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
        self.gate = Gate(self) if hold_launches and in_order else None
        # (thread ident, source, options, name) -> the kernel as this queue launches it
        # from that thread (``kernels._cache.get_kernel``)
        self.launchers: dict[tuple, object] = {}
        # kernel family -> its variant for this device; (family, signature) -> a launch's
        # geometry worked out once (``kernels.gemm``'s small products)
        self.choices: dict = {}

    def finish(self) -> None:
        """Wait for everything enqueued (every held launch released first)."""
        release_all()
        super().finish()

    def flush(self) -> None:
        """Submit everything enqueued to the device (held launches released)."""
        if self.gate is not None:
            self.gate.release()
        super().flush()


def new_queue(device: cl.Device | None = None, profiling: bool = False,
              hold_launches: bool | None = None) -> Queue:
    """A new in-order command queue on ``device`` (default: ``devices()[0]``) in its shared
    context, with its own memory pool. ``profiling=True`` lets kernels be timed by events.
    ``hold_launches`` (default: on CPU devices) runs small launches in batches
    (``parcl.gate``): the same kernels, less host time per launch."""
    if device is None:
        device = devices()[0]
    props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
    if _launch is not None:
        _launch.used.add(device.int_ptr)
    return Queue(context_for(device), device, properties=props, hold_launches=hold_launches)


def default_queue() -> cl.CommandQueue:
    """The calling thread's default command queue (created on first use on ``devices()[0]``)."""
    q = getattr(_local, "queue", None)
    if q is None:
        q = new_queue()
        _local.queue = q
    return q


def set_default_queue(queue: cl.CommandQueue | None) -> None:
    """Make ``queue`` this thread's default queue (replica threads use their own)."""
    _local.queue = queue


def memory_stats(queue: cl.CommandQueue | None = None) -> dict:
    """The pool counters of ``queue`` (default: this thread's default queue):
    ``bytes_in_use``, ``peak_bytes_in_use``, ``allocations``, ``pool_bytes``."""
    return pool_of(queue if queue is not None else default_queue()).stats()


def reset_peak_memory_stats(queue: cl.CommandQueue | None = None) -> None:
    """Set the peak counter of ``queue``'s pool to what is in use now."""
    pool_of(queue if queue is not None else default_queue()).reset_peak()


# -- bounded waits -------------------------------------------------------------------------
# OpenCL has no wait with a timeout, a blocked clWaitForEvents cannot be interrupted, and
# waiting through another thread or by polling costs every step (measured: a waiter thread's
# extra wake-ups made 2-replica steps 3-4 % slower). So a wait stays a plain blocking one,
# registered with a watchdog thread that looks at the registered waits once a second: one
# past its deadline means a device that will not finish, and, as PyTorch's NCCL watchdog
# does, the process is taken down with a message saying what waited for what, rather than
# left to hang.
WAIT_TIMEOUT_EXIT = 70      # the exit status of a process whose device wait timed out
_waits: dict[int, tuple] = {}     # thread id -> (deadline, timeout, what, events, labels, thread)
_watchdog: threading.Thread | None = None


def _forget_watchdog() -> None:
    """A forked child has none of the parent's threads: its first wait starts its own."""
    global _watchdog
    _watchdog = None
    _waits.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watchdog)


def wait_for_events(events, timeout: float = WAIT_TIMEOUT, what: str = "a device wait",
                    labels=None) -> None:
    """``cl.wait_for_events(events)``, for at most ``timeout`` seconds (``watched``), the
    pending events named by ``labels`` (one per event) if it times out."""
    events = list(events)
    if not events:
        return
    with watched(timeout, what, events, labels):
        cl.wait_for_events(events)


@contextlib.contextmanager
def watched(timeout: float = WAIT_TIMEOUT, what: str = "a device wait", events=(),
            labels=None):
    """Bound the blocking OpenCL call made inside (a wait, a blocking copy or map) by
    ``timeout`` seconds: past it a watchdog writes ``what``, the waiting thread (a replica's
    names it) and which of ``events`` are pending to stderr and ends the process with
    status ``WAIT_TIMEOUT_EXIT``. Every held launch is released first (``parcl.gate``).

    >>> with watched(60.0, "reading the loss"):
    ...     cl.enqueue_copy(queue, host, loss.data, is_blocking=True)
    """
    release_all()
    _start_watchdog()
    key = threading.get_ident()
    # one slot per thread: a watched call inside another (a to_host in a watched block)
    # takes it for its own wait, and gives the outer one's back when done
    outer = _waits.get(key)
    _waits[key] = (time.monotonic() + timeout, timeout, what, events, labels,
                   threading.current_thread().name)
    try:
        yield
    finally:
        if outer is None:
            del _waits[key]
        else:
            _waits[key] = outer


def _start_watchdog() -> None:
    global _watchdog
    if _watchdog is None:
        with _lock:
            if _watchdog is None:
                _watchdog = threading.Thread(target=_watch, name="parcl-watchdog", daemon=True)
                _watchdog.start()


def _watch() -> None:
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        for deadline, *wait in list(_waits.values()):
            if now > deadline:
                _give_up(*wait)


def _give_up(timeout: float, what: str, events, labels, thread: str) -> None:
    complete = cl.command_execution_status.COMPLETE
    pending = []
    for i, event in enumerate(events):
        try:
            if event.command_execution_status > complete:
                name = labels[i] if labels else f"event {i}"
                if name not in pending:
                    pending.append(name)
        except cl.Error:
            pending.append(f"event {i} (status unreadable)")
    pending = f"; still pending: {', '.join(pending) or 'none'}" if events else ""
    sys.stderr.write(f"parcl: {what} waited {timeout:g} s (in thread {thread}) for the device "
                     f"and it has not finished{pending}. "
                     f"A blocked OpenCL wait cannot be interrupted, so the process exits "
                     f"(status {WAIT_TIMEOUT_EXIT}) instead of hanging.\n")
    sys.stderr.flush()
    os._exit(WAIT_TIMEOUT_EXIT)
