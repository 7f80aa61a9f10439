"""Program and kernel caches.

A program is built once per context (keyed by its source and build options) behind a lock;
PoCL takes ~0.4 s per cold build, so sources are grouped into a few programs per family.
``Kernel`` objects are cached per *thread*: ``clSetKernelArg`` on one kernel object from two
threads is a data race, so replica threads never share one.

Every kernel's scalar argument types are read from its argument info once; a launch
(``Launcher``) packs and sets only the arguments that changed since the kernel object's last
launch (``KernelArgs``) and enqueues it, behind the queue's gate (``parcl.gate``) on a CPU.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from threading import get_ident
from importlib import resources
from math import prod

import numpy as np
import pyopencl as cl
from pyopencl import cltypes

from .. import recorder
from ..gate import AGE, BIG, LIMIT, _clock
from ..errors import DeviceError, ParclError
from ..runtime import groups_max, on_gpu
from ._grid import enqueue_pieces, grid_pieces

# Work-items of one launch along one dimension, at most: NVIDIA's OpenCL hands out wrong ids
# past 2**31 (some twice, some never: rows left unwritten, silently), and kernels keep ids in
# 32-bit ints. A launch that would be bigger takes a variant with fewer work-items.
LAUNCH_MAX = 2**31

_programs: dict[tuple, cl.Program] = {}
_build_locks: dict[tuple, threading.Lock] = {}
_lock = threading.Lock()


class _Local(threading.local):
    """One thread's kernel objects and its ``trace_launches`` sink (None: not tracing)."""

    trace = None

    def __init__(self):
        self.kernels: dict[tuple, KernelArgs] = {}      # by context, program and name


_local = _Local()


class KernelBuildError(ParclError):
    """An OpenCL program failed to build; the message carries the build log."""


# Unaligned vector types for CPU kernels: ``*(global float8u*)p`` moves 8 floats at any 4-byte-
# aligned address as one inline vector load or store. vload8/vstore8 do the same but are calls
# in PoCL 3.0's CPU device (measured 2-2.5x slower in the hot loops that used them).
VECTOR_TYPES = """
typedef float float8u __attribute__((ext_vector_type(8), aligned(4)));
typedef uchar uchar8u __attribute__((ext_vector_type(8), aligned(1)));
"""

# The sum of v over the work-group, which every work-item must call: a fixed tree in local
# memory (scratch holds one float per work-item; the work-group size is a power of two), so the
# value is bit-reproducible and is returned to every work-item.
GROUP_SUM = r"""
inline float group_sum(float v, __local float* scratch)
{
    const int l = get_local_id(0), L = get_local_size(0);
    scratch[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s)
            scratch[l] += scratch[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
"""

# group_sum of two values at once, in the same tree (the same bits as two group_sum calls) with
# half the barriers; scratch holds two floats per work-item.
GROUP_SUM2 = r"""
inline float2 group_sum2(float2 v, __local float* scratch)
{
    const int l = get_local_id(0), L = get_local_size(0);
    scratch[l] = v.x;
    scratch[L + l] = v.y;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) {
            scratch[l] += scratch[l + s];
            scratch[L + l] += scratch[L + l + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float2 r = (float2)(scratch[0], scratch[L]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
"""


def load_source(name: str) -> str:
    """The text of ``parcl/kernels/cl/<name>.cl`` (shipped as package data)."""
    return resources.files(__package__).joinpath("cl", f"{name}.cl").read_text()


def get_program(context: cl.Context, source: str, options: tuple[str, ...] = ()) -> cl.Program:
    """The built program for ``source`` in ``context``: built on first request, then reused."""
    key = (context.int_ptr, hash(source), source, tuple(options))
    prog = _programs.get(key)
    if prog is not None:
        return prog
    with _lock:
        build_lock = _build_locks.setdefault(key, threading.Lock())
    with build_lock:                     # one build per key, others wait for it
        prog = _programs.get(key)
        if prog is None:
            try:
                prog = cl.Program(context, source).build(
                    options=[*options, "-cl-kernel-arg-info"])
            except cl.RuntimeError as exc:
                first = source.strip().splitlines()[0][:80] if source.strip() else ""
                raise KernelBuildError(f"OpenCL build failed (options {list(options)}, "
                                       f"source starting {first!r}):\n{exc}") from exc
            _programs[key] = prog
    return prog


def get_kernel(queue: cl.CommandQueue, source: str, name: str,
               options: tuple[str, ...] = (), role=None) -> Launcher:
    """This thread's ``Kernel`` object for ``name`` in ``source`` on ``queue``'s context,
    wrapped to hold its launches behind the queue's gate where the queue has one.

    A kernel launched in a few distinct ways (a GEMM's transposes) may ask for one kernel
    object per ``role`` (a small hashable): each keeps its own arguments set between
    launches (``KernelArgs``), so only those that change within the role are set again."""
    local = _local
    if type(options) is not tuple:
        options = tuple(options)
    try:
        # A parcl Queue keeps its launchers, one per thread (a thread's ident is never
        # another live thread's): the hot path of every eager op is one dict lookup, with
        # no context or gate query.
        launchers = queue.launchers
    except AttributeError:
        k = _launcher(queue, source, name, options, role)
    else:
        key = (get_ident(), source, options, name, role)
        k = launchers.get(key)
        if k is None:
            k = launchers[key] = _launcher(queue, source, name, options, role)
    sink = local.trace
    if sink is not None:
        k = _TracedKernel(k, name, sink)
    if recorder.state.recording is not None:
        return _RecordedKernel(k)
    return k


def _launcher(queue: cl.CommandQueue, source: str, name: str, options: tuple,
              role) -> Launcher:
    """The thread's kernel object, behind ``queue``'s gate when it has one."""
    ctx = queue.context
    key = (ctx.int_ptr, hash(source), options, name, role)
    args = _local.kernels.get(key)
    if args is None:
        k = cl.Kernel(get_program(ctx, source, options), name)
        dtypes = _scalar_dtypes(k)
        k.set_scalar_arg_dtypes(dtypes)     # for a launch with global_offset (pyopencl's own)
        args = _local.kernels[key] = KernelArgs(k, dtypes)
    try:
        most = queue.groups_max
    except AttributeError:                  # a plain pyopencl queue
        most = groups_max(queue.device)
    return Launcher(args, getattr(queue, "gate", None), most)   # gate: a parcl Queue on a CPU


def chosen(queue: cl.CommandQueue, family: str, choose) -> str:
    """``choose(queue.device)``, a kernel family's variant for the device type, made once per
    parcl queue (``queue.choices``); a plain pyopencl queue chooses at every call."""
    try:
        return queue.choices[family]
    except AttributeError:
        return choose(queue.device)
    except KeyError:
        variant = queue.choices[family] = choose(queue.device)
        return variant


PLANS_MAX = 4096        # launch plans a parcl queue keeps (a dynamic-shape model makes more)


def keep(queue: cl.CommandQueue, key: tuple, plan):
    """``plan``, a launch worked out for ``key``, kept in a parcl queue's ``choices`` (an eager
    step repeats the same few shapes) while it holds fewer than ``PLANS_MAX``; a plain pyopencl
    queue keeps nothing. The callers look ``queue.choices[key]`` up inline: a frame less on
    every launch that finds its plan."""
    choices = getattr(queue, "choices", None)
    if choices is not None and len(choices) < PLANS_MAX:
        choices[key] = plan
    return plan


@dataclass(frozen=True, slots=True)
class KernelLimits:
    """What a device allows one kernel: ``work_group``, the most work-items of a 1-D group
    (CL_KERNEL_WORK_GROUP_SIZE, which a kernel using many registers lowers below the device's
    maximum on some GPUs, and the device's first CL_DEVICE_MAX_WORK_ITEM_SIZES), and
    ``local_bytes``, the local memory it takes before any ``__local`` argument
    (CL_KERNEL_LOCAL_MEM_SIZE: its own ``__local`` arrays and what the implementation keeps)."""

    work_group: int
    local_bytes: int


def kernel_limits(queue: cl.CommandQueue, source: str, name: str,
                  options: tuple[str, ...] = ()) -> KernelLimits:
    """``KernelLimits`` of kernel ``name`` in ``source`` on ``queue``'s device, asked once per
    parcl queue (kept in its ``choices`` even past ``PLANS_MAX``: one per kernel, and asked
    at every launch of some), of a kernel object of its own: a launched one has its
    ``__local`` arguments set, which CL_KERNEL_LOCAL_MEM_SIZE would count."""
    key = ("limits", source, name, options)
    choices = getattr(queue, "choices", None)
    if choices is not None:
        limits = choices.get(key)
        if limits is not None:
            return limits
    kernel = cl.Kernel(get_program(queue.context, source, options), name)
    device, info = queue.device, cl.kernel_work_group_info
    limits = KernelLimits(min(kernel.get_work_group_info(info.WORK_GROUP_SIZE, device),
                              device.max_work_item_sizes[0]),
                          kernel.get_work_group_info(info.LOCAL_MEM_SIZE, device))
    if choices is not None:
        choices[key] = limits
    return limits


def group_size(queue: cl.CommandQueue, source: str, name: str, wanted: int,
               options: tuple[str, ...] = ()) -> int:
    """The work-group for a kernel whose group size is free (it reads ``get_local_size`` and
    takes its local memory as arguments): ``wanted`` (a power of two), or the largest power
    of two the device allows the kernel where that is less (the trees halve the group)."""
    limit = kernel_limits(queue, source, name, options).work_group
    return wanted if wanted <= limit else 1 << (limit.bit_length() - 1)


def gpu_group(queue: cl.CommandQueue, source: str, name: str, wanted: int,
              options: tuple[str, ...] = ()) -> int:
    """``group_size`` on a GPU; elsewhere ``wanted``, unasked (for geometries that give a
    CPU groups of their own and a GPU groups of ``wanted`` work-items)."""
    return group_size(queue, source, name, wanted, options) if on_gpu(queue) else wanted


def _own_kernel(program: cl.Program, name: str, args: tuple) -> cl.Kernel:
    own = cl.Kernel(program, name)
    own.set_scalar_arg_dtypes(_scalar_dtypes(own))
    own.set_args(*args)
    return own


_MUTABLE = (np.ndarray, np.void)
_UNSET = object()          # an argument never set: no value is this one


class KernelArgs:
    """One thread's kernel object and the arguments it holds, so that a launch sets only those
    that changed since the last one.

    Why: pyopencl's invoker packs and sets every argument at every launch, ~1 µs of host time
    per argument on the PoCL CPU device (a 6-argument elementwise launch ~10 µs, the enqueue
    alone ~4); an eager step launches the same kernels with mostly the same sizes and flags,
    and only the buffers change. OpenCL takes a kernel's arguments when a launch is
    enqueued, so an argument set once serves every later launch until it is set again.

    ``values`` holds each argument last set (buffers too, so that no buffer's handle is
    freed and reused while this compares against it); a scalar that is not the same object
    is compared by its packed bytes (``-0.0`` is not ``0.0``), and a numpy array or void
    scalar, which may change in place, always is, unless it is a read-only array owning its
    memory (a launch plan's ``int8_vector``). Thread-local like the kernel object."""

    __slots__ = ("kernel", "packs", "values", "packed")

    def __init__(self, kernel: cl.Kernel, dtypes: list):
        self.kernel = kernel
        self.packs = [None if dt is None else _packer(np.dtype(dt)) for dt in dtypes]
        self.forget()

    def forget(self) -> None:
        """After a launch that set every argument itself: the next one sets them all. (In
        place: a ``Launcher`` reads these lists.)"""
        n = len(self.packs)
        try:
            self.values[:] = [_UNSET] * n
            self.packed[:] = [None] * n
        except AttributeError:             # from __init__
            self.values = [_UNSET] * n
            self.packed = [None] * n

    def set(self, args: tuple) -> None:
        """Set the arguments of ``args`` that are not those set last (``Launcher`` does this
        inline; see ``put``)."""
        values = self.values
        if len(args) != len(values):
            raise TypeError(f"kernel {self.kernel.function_name}: {len(args)} arguments, "
                            f"it takes {len(values)}")
        for i, a in enumerate(args):
            if a is not values[i]:
                self.put(i, a)

    def put(self, i: int, a) -> None:
        """Set argument ``i`` to ``a``, which is not the object set last."""
        pack = self.packs[i]
        if pack is None:                  # a buffer, None or local memory
            self.kernel.set_arg(i, a)
        else:
            b = pack(a)
            if b != self.packed[i]:
                self.kernel._set_arg_buf(i, b)    # what pyopencl's invoker calls: set_arg
                # tries every other argument type first, ~100x slower for bytes
                self.packed[i] = b
            if isinstance(a, _MUTABLE) and _writeable(a):   # may change in place: compare
                return                                     # its bytes each time
        self.values[i] = a


def _writeable(a) -> bool:
    """Whether ``a`` (an ndarray or numpy void scalar) may change in place: a read-only array
    that owns its memory (a launch plan's ``int8_vector``) cannot."""
    return type(a) is not np.ndarray or a.flags.writeable or a.base is not None


# struct's codes for OpenCL's scalar types, native byte order at standard sizes (numpy's
# "l" is 8 bytes on Linux, struct's standard "l" 4)
_CODES = {("f", 4): "f", ("f", 8): "d", ("i", 1): "b", ("u", 1): "B", ("i", 2): "h",
          ("u", 2): "H", ("i", 4): "i", ("u", 4): "I", ("i", 8): "q", ("u", 8): "Q"}


_FLOAT = struct.Struct("=f")


def _pack_float(a) -> bytes:
    """A float argument's 4 bytes. A Python float beyond float32's range becomes +-inf, as
    PyTorch casts a scalar to a float32 tensor's type (``x * 1e40`` is inf), where struct
    raises OverflowError."""
    try:
        return _FLOAT.pack(a)
    except OverflowError:
        with np.errstate(over="ignore"):
            return np.float32(a).tobytes()


def _packer(dt: np.dtype):
    """The bytes of a scalar argument of type ``dt``, as pyopencl's invoker packs them."""
    code = _CODES.get((dt.kind, dt.itemsize))
    if code == "f":
        return _pack_float
    if code is not None:
        return struct.Struct("=" + code).pack
    return lambda a: np.asarray(a, dt).tobytes()         # vector types (cltypes.float4, ...)


class Launcher:
    """A thread's kernel on one queue: ``launcher(queue, gsize, lsize, *args, wait_for=None)``
    launches it, setting only the arguments that changed (``KernelArgs``). On a queue with a
    gate (``parcl.gate``) small launches are held behind it unless they are big enough to
    start the device at once. ``most`` is the device's limit on work-groups along dimensions
    1 and 2 (None: none); a launch over it is enqueued in pieces (``_grid``)."""

    __slots__ = ("args", "kernel", "gate", "most")

    def __init__(self, args: KernelArgs, gate, most: int | None = None):
        self.args, self.kernel, self.gate, self.most = args, args.kernel, gate, most

    def pieces(self, gsize, lsize) -> tuple | None:
        """The pieces a launch of ``gsize`` is enqueued in (``_grid.grid_pieces``), or None:
        one launch."""
        return None if self.most is None else grid_pieces(gsize, lsize, self.most)

    def __call__(self, queue, gsize, lsize, *args, wait_for=None, **kwargs):
        gate = self.gate
        now = False
        if gate is not None:
            # ``Gate.hold``'s common case inlined (a frame less at every launch): a small
            # launch joins the held gate while it is neither full nor old
            items = gsize[0] if len(gsize) == 1 else prod(gsize)
            if gate.event is not None and items < BIG:
                gate.count += 1
                if gate.count >= LIMIT or _clock() - gate.taken >= AGE:
                    now = gate.decide(items)
            else:
                now = gate.decide(items)
        state = self.args
        if kwargs:                     # global_offset and the like: pyopencl's own invoker
            # (the optimizers' 1-D shards: nothing for a GPU's grid to split)
            state.forget()
            event = self.kernel(queue, gsize, lsize, *args, wait_for=wait_for, **kwargs)
        else:
            # ``KernelArgs.set`` inlined (a frame less at every launch): usually only the
            # buffers changed since this kernel object's last launch, often not even those
            values = state.values
            if len(args) != len(values):
                state.set(args)                       # raises, naming the kernel
            i = 0
            for a in args:
                if a is not values[i]:
                    if state.packs[i] is None:          # a buffer: ``put``'s first case
                        state.kernel.set_arg(i, a)
                        values[i] = a
                    else:
                        state.put(i, a)
                i += 1
            pieces = None if self.most is None else grid_pieces(gsize, lsize, self.most)
            try:
                if pieces is None:
                    event = _enqueue(queue, self.kernel, gsize, lsize, None, wait_for, False,
                                     False)
                else:
                    event = enqueue_pieces(queue, self.kernel, pieces, lsize, wait_for)
            except cl.LogicError as exc:
                if all(gsize):
                    raise _too_big(exc, self.kernel, queue.device, lsize) from exc
                event = nothing_to_launch(queue, wait_for)
        if now:
            gate.busy = event
        return event

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)


_enqueue = cl.enqueue_nd_range_kernel        # positional arguments: pybind's fast path


def nothing_to_launch(queue: cl.CommandQueue, wait_for=None) -> cl.Event:
    """What a launch of no work-items (an op over a slice with no elements) enqueues where
    the device refuses it: OpenCL before 2.1, and some drivers since, fail such a launch
    (INVALID_GLOBAL_WORK_SIZE), where 2.1 made it a marker; so a marker it is."""
    return cl.enqueue_marker(queue, wait_for=wait_for)


def _too_big(exc: cl.LogicError, kernel: cl.Kernel, device: cl.Device, lsize) -> Exception:
    """``exc`` as a ``DeviceError`` naming the kernel, the work-group and the device's limit
    for that kernel where the group is more than the device allows (a GPU with fewer
    work-items per group than parcl's kernels ask for, or a kernel whose registers lower it);
    else ``exc`` itself. The check runs only after OpenCL refused the launch."""
    if exc.code != cl.status_code.INVALID_WORK_GROUP_SIZE or lsize is None:
        return exc
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device)
    return DeviceError(f"kernel {kernel.function_name}: a work-group of {tuple(lsize)} "
                       f"({prod(lsize)} work-items) is more than {device.name.strip()!r} allows "
                       f"for this kernel ({limit}; the device's maximum "
                       f"{device.max_work_group_size}); parcl's kernels ask for at most 256: "
                       "please report this device")


class _RecordedKernel:
    """A kernel whose launches are also appended to this thread's recording (step capture)."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, queue, gsize, lsize, *args, wait_for=None, **kwargs):
        event = self.kernel(queue, gsize, lsize, *args, wait_for=wait_for, **kwargs)
        base = getattr(self.kernel, "kernel", self.kernel)      # under trace_launches too
        # A kernel object of the recording's own with this launch's arguments set once
        own = _own_kernel(base.program, base.function_name, args)
        recorder.kernel(own, queue, gsize, lsize, args, wait_for,
                        self.kernel.pieces(gsize, lsize))
        if kwargs:
            recorder.unsafe(f"a launch with {sorted(kwargs)}, which a replay does not repeat")
        return event

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)


class _TracedKernel:
    """A kernel whose launches are recorded as (name, queue, event) while tracing."""

    __slots__ = ("kernel", "name", "sink")

    def __init__(self, kernel: cl.Kernel, name: str, sink: list):
        self.kernel, self.name, self.sink = kernel, name, sink

    def __call__(self, queue, *args, **kwargs):
        event = self.kernel(queue, *args, **kwargs)
        self.sink.append((self.name, queue, event))
        return event

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)


class trace_launches:
    """Record every kernel launched by this thread inside the block: ``with
    trace_launches() as launches: ...`` gives ``[(kernel name, queue, event), ...]``. On a
    queue made with ``profiling=True`` the events carry device timestamps."""

    def __enter__(self) -> list:
        self.previous = _local.trace
        self.launches: list = []
        _local.trace = self.launches
        return self.launches

    def __exit__(self, *exc) -> bool:
        _local.trace = self.previous
        return False


_SCALARS = {"float": np.float32, "double": np.float64, "int": np.int32, "uint": np.uint32,
            "long": np.int64, "ulong": np.uint64, "short": np.int16, "ushort": np.uint16,
            "char": np.int8, "uchar": np.uint8}


def _scalar_dtypes(kernel: cl.Kernel) -> list:
    """Per argument: None for buffers and local memory, the numpy dtype for scalars."""
    dtypes = []
    for i in range(kernel.num_args):
        qualifier = kernel.get_arg_info(i, cl.kernel_arg_info.ADDRESS_QUALIFIER)
        type_name = kernel.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME).strip()
        if qualifier != cl.kernel_arg_address_qualifier.PRIVATE or type_name.endswith("*"):
            dtypes.append(None)
        elif type_name in _SCALARS:
            dtypes.append(_SCALARS[type_name])
        elif hasattr(cltypes, type_name):          # vector types such as int8, float4
            dtypes.append(getattr(cltypes, type_name))
        else:
            raise KernelBuildError(f"kernel {kernel.function_name}: argument {i} has type "
                                   f"{type_name!r}, which parcl cannot pass from Python")
    return dtypes

def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple
