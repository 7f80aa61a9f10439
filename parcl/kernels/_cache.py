"""Program and kernel caches.

A program is built once per context (keyed by its source and build options) behind a lock;
PoCL takes ~0.4 s per cold build, so sources are grouped into a few programs per family.
``Kernel`` objects are cached per *thread*: ``clSetKernelArg`` on one kernel object from two
threads is a data race, so replica threads never share one.

Every kernel gets its scalar argument dtypes declared (read from the kernel's argument info):
pyopencl then packs scalars itself, which makes a launch ~5 µs of host time instead of ~30.
"""

from __future__ import annotations

import threading
from threading import get_ident
from importlib import resources
from math import prod

import numpy as np
import pyopencl as cl
from pyopencl import cltypes

from .. import recorder
from ..errors import ParclError

_programs: dict[tuple, cl.Program] = {}
_build_locks: dict[tuple, threading.Lock] = {}
_lock = threading.Lock()


class _Local(threading.local):
    """One thread's kernel objects and its ``trace_launches`` sink (None: not tracing)."""

    trace = None

    def __init__(self):
        self.kernels: dict[tuple, cl.Kernel] = {}      # by context, program and name


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
               options: tuple[str, ...] = ()) -> cl.Kernel:
    """This thread's ``Kernel`` object for ``name`` in ``source`` on ``queue``'s context,
    wrapped to hold its launches behind the queue's gate where the queue has one."""
    local = _local
    if type(options) is not tuple:
        options = tuple(options)
    try:
        # A parcl Queue keeps its launchers, one per thread (a thread's ident is never
        # another live thread's): the hot path of every eager op is one dict lookup, with
        # no context or gate query.
        launchers = queue.launchers
    except AttributeError:
        k = _launcher(queue, source, name, options)
    else:
        key = (get_ident(), source, options, name)
        k = launchers.get(key)
        if k is None:
            k = launchers[key] = _launcher(queue, source, name, options)
    sink = local.trace
    if sink is not None:
        k = _TracedKernel(k, name, sink)
    if recorder.state.recording is not None:
        return _RecordedKernel(k)
    return k


def _launcher(queue: cl.CommandQueue, source: str, name: str, options: tuple) -> cl.Kernel:
    """The thread's kernel object, behind ``queue``'s gate when it has one."""
    ctx = queue.context
    key = (ctx.int_ptr, hash(source), options, name)
    k = _local.kernels.get(key)
    if k is None:
        k = cl.Kernel(get_program(ctx, source, options), name)
        k.set_scalar_arg_dtypes(_scalar_dtypes(k))
        _local.kernels[key] = k
    gate = getattr(queue, "gate", None)   # a parcl Queue on a CPU device: launches in batches
    return k if gate is None else _HeldKernel(k, gate)


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


def _own_kernel(program: cl.Program, name: str, args: tuple) -> cl.Kernel:
    own = cl.Kernel(program, name)
    own.set_scalar_arg_dtypes(_scalar_dtypes(own))
    own.set_args(*args)
    return own


class _HeldKernel:
    """A kernel whose launches go behind its queue's gate (``parcl.gate``) unless they are
    big enough to start the device at once."""

    __slots__ = ("kernel", "gate")

    def __init__(self, kernel, gate):
        self.kernel, self.gate = kernel, gate

    def __call__(self, queue, gsize, *args, **kwargs):
        gate = self.gate
        if gate.hold(prod(gsize)):
            gate.busy = event = self.kernel(queue, gsize, *args, **kwargs)
            return event
        return self.kernel(queue, gsize, *args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)


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
        recorder.kernel(own, queue, gsize, lsize, args, wait_for)
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
