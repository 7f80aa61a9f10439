"""Whether a kernel family's float16 CPU variant is safe on a device: probed once, in a
subprocess.

PoCL 3.0 (LLVM 14) aborts the whole process on some float16 code when it compiles for a CPU
with 256-bit vectors (AVX2): GELU's float16 kernel stops LLVM with "Cannot select ...
X86ISD::FILD", and the GEMM's has aborted before. With AVX-512 code both build and run about
twice as fast as their float8 variants. So before a family makes its float16 variant a CPU's
default, a child process builds it and checks its results on that device (the family's
``wide_check(queue) -> bool``); the answer is remembered per family, device model, driver,
PoCL library and program text in ``~/.cache/parcl/wide-probe.json``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pyopencl as cl

FAMILIES = ("gemm", "gelu")     # modules of parcl.kernels with a wide_check(queue)
_probe_lock = threading.Lock()
_probed: dict[str, bool] = {}
_probe_keys: dict[tuple, str] = {}   # (device int_ptr, family, source) -> key


def _probe_key(device: cl.Device, family: str, source: str) -> str:
    at = (device.int_ptr, family, source)
    key = _probe_keys.get(at)
    if key is None:
        key = "|".join([family, device.platform.name, device.platform.version,
                        device.name.strip(), device.driver_version, _compiler(),
                        hashlib.sha1(source.encode()).hexdigest()[:12]])
        _probe_keys[at] = key
    return key


def _compiler() -> str:
    """The PoCL library this process runs, by path: ``parcl.hostcpu``'s patched copies are
    named by their patches, and the CPU target they compile for (AVX2 or AVX-512 code) is
    what the probe's answer depends on."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                if "libpocl" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""


def _probe_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "parcl" / "wide-probe.json"


def wide_kernel_ok(device: cl.Device, family: str, source: str) -> bool:
    """Whether ``family``'s float16 CPU kernels (built from ``source``) build and compute
    correctly on ``device``.

    Answered once per device model, driver and PoCL library by a subprocess (so an LLVM
    abort cannot take this process down) and remembered in ``~/.cache/parcl/wide-probe.json``.
    """
    if family not in FAMILIES:
        raise ValueError(f"wide_kernel_ok: unknown kernel family {family!r}; one of {FAMILIES}")
    key = _probe_key(device, family, source)
    if key in _probed:
        return _probed[key]
    with _probe_lock:
        if key in _probed:
            return _probed[key]
        path = _probe_file()
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        ok = known.get(key)
        if not isinstance(ok, bool):
            ok = _run_probe(device, family)
            known[key] = ok
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(known, indent=1))
                os.replace(tmp, path)
            except OSError:
                pass                      # a read-only home: probe again next process
        _probed[key] = ok
    return ok


def _run_probe(device: cl.Device, family: str) -> bool:
    code = ("import sys; from parcl.kernels.probe import _probe_main; "
            "sys.exit(_probe_main(sys.argv[1], sys.argv[2], sys.argv[3]))")
    try:
        done = subprocess.run([sys.executable, "-c", code, family, device.platform.name,
                               device.name], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        done = None
        why = str(exc)
    else:
        why = f"exit status {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    if done is not None and done.returncode == 0:
        return True
    warnings.warn(f"parcl {family}: the float16 kernel failed its probe on "
                  f"{device.name.strip()!r} ({why}); using the float8 kernel, which is about "
                  "half as fast", RuntimeWarning, stacklevel=3)
    return False


def _probe_main(family: str, platform_name: str, device_name: str) -> int:
    """In the probe subprocess: 0 when ``family``'s float16 kernels pass its check on the
    named device."""
    from ..runtime import new_queue
    devs = [d for p in cl.get_platforms() if p.name == platform_name
            for d in p.get_devices() if d.name == device_name]
    if not devs:
        return 3
    check = importlib.import_module(f"{__package__}.{family}").wide_check
    return 0 if check(new_queue(devs[0])) else 1
