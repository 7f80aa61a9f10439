"""Let the pip-installed PoCL compile kernels on x86 CPUs newer than the LLVM inside it.

PoCL asks its bundled LLVM for the host CPU's name and compiles every kernel for it. The LLVM
inside ``pocl-binary-distribution`` 3.0 (2022) knows AMD CPU families up to 25 (Zen 3/4); on
a newer one (Zen 5 is family 26) it answers ``"generic"``, which its own clang then rejects,
so every kernel build fails with ``unknown target CPU 'generic'``. (Known PoCL behaviour with
an LLVM older than the CPU: pocl/pocl#1049.)

Where that is the case, ``ensure_known_cpu`` makes a copy of that PoCL library in the user's
cache in which an AMD family above 25 is taken for family 25 (one jump target changed in
LLVM's host detection; the code is found by its bytes, and nothing is changed when they are
not there), and loads it before the OpenCL loader looks for PoCL: the loader then finds the
copy already loaded under PoCL's name. Kernels are compiled for Zen 3, which every later AMD
CPU runs. Nothing happens on other CPUs, other PoCL builds or when PoCL was already loaded
(``/proc/self/maps``); ``PARCL_POCL_CPU_FIX=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.util
import os
import platform
import shutil
import struct
import warnings

# sub $4,%r10d; cmp $0x15,%r10d; ja <unknown family>: LLVM's switch over AMD families 4..25
_FAMILY_SWITCH = bytes.fromhex("4183ea04 4183fa15 0f87".replace(" ", ""))
_LAST_KNOWN_FAMILY = 25


def amd_cpu_family(cpuinfo: str = "/proc/cpuinfo") -> int | None:
    """The CPU family of an AMD processor (None for other vendors or when unknown)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break                              # the first processor is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    if fields.get("vendor_id") != "AuthenticAMD":
        return None
    try:
        return int(fields.get("cpu family", ""))
    except ValueError:
        return None


def patch_family_switch(library: bytes) -> bytes | None:
    """``library`` with AMD families above 25 sent to family 25's case, or None when the
    switch is not found exactly once (another build: leave it alone)."""
    at = library.find(_FAMILY_SWITCH)
    if at < 0 or library.find(_FAMILY_SWITCH, at + 1) >= 0:
        return None
    ja = at + 8                                  # 0f 87 rel32
    after_ja = ja + 6
    # lea table(%rip),%rdx; movslq (%rdx,%r10,4),%rax; add %rdx,%rax; jmp *%rax
    if library[after_ja:after_ja + 3] != b"\x48\x8d\x15":
        return None
    table = after_ja + 7 + struct.unpack_from("<i", library, after_ja + 3)[0]
    entry = table + 4 * (_LAST_KNOWN_FAMILY - 4)
    if not 0 <= entry <= len(library) - 4:
        return None
    target = table + struct.unpack_from("<i", library, entry)[0]
    patched = bytearray(library)
    patched[ja + 2:ja + 6] = struct.pack("<i", target - after_ja)
    return bytes(patched)


def _pocl_library() -> str | None:
    """The PoCL library the pyopencl wheel's OpenCL loader opens (without importing it)."""
    spec = importlib.util.find_spec("pyopencl")
    if spec is None or not spec.origin:
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), ".libs", "libpocl*.so")))
    return found[0] if found else None


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "parcl")


def ensure_known_cpu() -> str | None:
    """Load a PoCL that can compile for this CPU where the installed one cannot; returns the
    path of the copy it loaded, or None when nothing was needed or possible."""
    if os.environ.get("PARCL_POCL_CPU_FIX", "1") == "0":
        return None
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    family = amd_cpu_family()
    if family is None or family <= _LAST_KNOWN_FAMILY:
        return None
    original = _pocl_library()
    if original is None or _mapped(original):
        return None                 # no PoCL, or the loader has opened it already: too late
    # One copy per installed PoCL file (its path, size and time: no 100 MB read per import).
    # It keeps PoCL's file name (the loader opens it by that name) and its place two levels
    # below a link to that installation's pocl_binary_distribution: PoCL finds its kernel
    # library and hwloc relative to itself ($ORIGIN/../../pocl_binary_distribution/.libs), so
    # a copy serves the one installation it was made from, and no other can break it.
    st = os.stat(original)
    key = hashlib.sha256(f"{original}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    root = os.path.join(_cache_dir(), f"pocl-{key[:16]}")
    copy = os.path.join(root, "lib", "pocl", os.path.basename(original))
    try:
        if not os.path.exists(copy):
            _drop_orphans(_cache_dir())
            if not _write_copy(original, root, copy):
                return None
        ctypes.CDLL(copy)
    except OSError as exc:          # no writable cache, or a copy that cannot load
        warnings.warn(f"parcl: could not use a patched PoCL for this CPU ({exc}); kernel "
                      "builds may fail with \"unknown target CPU 'generic'\". Set "
                      "PARCL_POCL_CPU_FIX=0 to skip this, or remove " + root, RuntimeWarning,
                      stacklevel=2)
        return None
    return copy


def _drop_orphans(cache: str) -> None:
    """Remove the copies made for installations that are gone (their link dangles): a copy
    is made per installation, and venvs come and go."""
    for link in glob.glob(os.path.join(cache, "pocl-*", "pocl_binary_distribution")):
        if os.path.islink(link) and not os.path.exists(link):
            shutil.rmtree(os.path.dirname(link), ignore_errors=True)


def _mapped(path: str) -> bool:
    """Whether this process has ``path`` loaded already."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            return os.path.realpath(path) in f.read()
    except OSError:
        return False


def _write_copy(original: str, root: str, copy: str) -> bool:
    """Write the patched copy (and its link to pocl_binary_distribution); False when this
    PoCL's host detection does not have the expected shape."""
    with open(original, "rb") as f:
        patched = patch_family_switch(f.read())
    if patched is None:
        return False
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    support = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(original))),
                           "pocl_binary_distribution")
    link = os.path.join(root, "pocl_binary_distribution")
    if not os.path.islink(link):
        tmp_link = f"{link}.{os.getpid()}"
        os.symlink(support, tmp_link)
        os.replace(tmp_link, link)
    tmp = f"{copy}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(patched)
    os.replace(tmp, copy)                   # atomic: concurrent processes agree
    return True
