"""Whether the float16 CPU GEMM kernel is safe on a device: probed once in a subprocess.

PoCL 3.0 (LLVM 14) has aborted whole processes while compiling float16 code. So before
``gemm.choose_variant`` makes ``cpu16`` a CPU's default, a child process builds it and checks
its results against numpy on that device; the answer is remembered per device model, driver
and program text in ``~/.cache/parcl/gemm-probe.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pyopencl as cl

from ..tensor import Tensor

_probe_lock = threading.Lock()
_probed: dict[str, bool] = {}
_probe_keys: dict[int, str] = {}     # device int_ptr -> key (devices live for the process)


def _probe_key(device: cl.Device, source: str) -> str:
    key = _probe_keys.get(device.int_ptr)
    if key is None:
        src = source
        key = "|".join([device.platform.name, device.platform.version, device.name.strip(),
                        device.driver_version, _compiler(),
                        hashlib.sha1(src.encode()).hexdigest()[:12]])
        _probe_keys[device.int_ptr] = key
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
    return Path(base) / "parcl" / "gemm-probe.json"


def wide_kernel_ok(device: cl.Device, source: str) -> bool:
    """Whether the float16 CPU kernel builds and computes correctly on ``device``.

    Answered once per device model and driver by a subprocess (so an LLVM abort cannot take
    this process down) and remembered in ``~/.cache/parcl/gemm-probe.json``.
    """
    key = _probe_key(device, source)
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
            ok = _run_probe(device)
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


def _run_probe(device: cl.Device) -> bool:
    code = ("import sys; from parcl.kernels.gemm_probe import _probe_main; "
            "sys.exit(_probe_main(sys.argv[1], sys.argv[2]))")
    try:
        done = subprocess.run([sys.executable, "-c", code, device.platform.name, device.name],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        done = None
        why = str(exc)
    else:
        why = f"exit status {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    if done is not None and done.returncode == 0:
        return True
    warnings.warn(f"parcl gemm: the float16 kernel failed its probe on {device.name.strip()!r} "
                  f"({why}); using the float8 kernel, which is about half as fast",
                  RuntimeWarning, stacklevel=3)
    return False


def _probe_main(platform_name: str, device_name: str) -> int:
    """In the probe subprocess: 0 when ``cpu16`` matches numpy on the named device."""
    from ..runtime import new_queue
    from .gemm import gemm
    devs = [d for p in cl.get_platforms() if p.name == platform_name
            for d in p.get_devices() if d.name == device_name]
    if not devs:
        return 3
    queue = new_queue(devs[0])
    rng = np.random.default_rng(0)
    for trans_a, trans_b, (m, n, k) in [(False, False, (37, 45, 29)), (True, True, (8, 64, 3)),
                                        (False, True, (70, 33, 100))]:
        ha = rng.standard_normal((k, m) if trans_a else (m, k), dtype=np.float32)
        hb = rng.standard_normal((n, k) if trans_b else (k, n), dtype=np.float32)
        hbias = rng.standard_normal(n, dtype=np.float32)
        want = np.maximum((ha.T if trans_a else ha).astype(np.float64)
                          @ (hb.T if trans_b else hb) + hbias, 0)
        got = gemm(Tensor.from_host(queue, ha), Tensor.from_host(queue, hb), trans_a=trans_a,
                   trans_b=trans_b, bias=Tensor.from_host(queue, hbias), relu=True,
                   _variant="cpu16").to_host()
        if not np.allclose(got, want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max())):
            return 1
    return 0
