"""Let the pip-installed PoCL compile kernels for the AMD CPU it runs on, at its full width.

PoCL asks its bundled LLVM for the host CPU's name and compiles every kernel for it. The LLVM
inside ``pocl-binary-distribution`` 3.0 (2022) knows AMD CPU families up to 25 (Zen 3/4), and
two things go wrong on newer parts:

* on a family above 25 (Zen 5) it answers ``"generic"``, which its own clang then rejects, so
  every kernel build fails with ``unknown target CPU 'generic'`` (known PoCL behaviour with an
  LLVM older than the CPU: pocl/pocl#1049);
* on family 25 it answers ``"znver3"`` even for a Zen 4, so kernels are compiled for AVX2 and
  16 vector registers although the CPU has AVX-512 and 32: parcl's CPU GEMM runs at 40 % of
  the speed the same kernel reaches as AVX-512 code (98 against 238 GFLOP/s on one Zen 5
  core, ``parcl-bench kernels``).

Where that is the case, ``ensure_known_cpu`` makes a copy of that PoCL library in the user's
cache with LLVM's host detection patched (each patch found by its bytes; nothing is changed
where they are not there): an AMD family above 25 takes family 25's case, and where the CPU
reports the AVX-512 subsets of the ``x86-64-v4`` level (F, BW, CD, DQ, VL), that case names
``x86-64-v4`` (LLVM's vendor-neutral AVX-512 target) instead of ``znver3``. It loads the copy
before the OpenCL loader looks for PoCL, and the loader then finds it already loaded under
PoCL's name. Nothing happens on other CPUs, other PoCL builds or when PoCL was already loaded
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
from dataclasses import dataclass

# sub $4,%r10d; cmp $0x15,%r10d; ja <unknown family>: LLVM's switch over AMD families 4..25
_FAMILY_SWITCH = bytes.fromhex("4183ea04 4183fa15 0f87".replace(" ", ""))
_LAST_KNOWN_FAMILY = 25
# mov $6,%edx; lea "znver3"(%rip),%rax: family 25's case naming its CPU (a StringRef)
_ZNVER3_NAME = bytes.fromhex("ba06000000488d05")
_ZNVER3, _X86_64_V4 = b"znver3", b"x86-64-v4"
_V4_FLAGS = frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})


@dataclass(frozen=True)
class AmdCpu:
    """What ``/proc/cpuinfo`` says of an AMD processor: its family and its feature flags."""

    family: int
    flags: frozenset[str] = frozenset()

    @property
    def has_avx512(self) -> bool:
        """Whether it runs ``x86-64-v4`` code (the AVX-512 subsets every AVX-512 CPU has)."""
        return _V4_FLAGS <= self.flags


def amd_cpu(cpuinfo: str = "/proc/cpuinfo") -> AmdCpu | None:
    """The first processor of an AMD machine (None for other vendors or when unknown)."""
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
        family = int(fields.get("cpu family", ""))
    except ValueError:
        return None
    return AmdCpu(family, frozenset(fields.get("flags", "").split()))


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


def patch_cpu_name(library: bytes) -> bytes | None:
    """``library`` with family 25's CPU name ``znver3`` changed to ``x86-64-v4``, or None
    when that code is not found exactly once after the family switch.

    The name is a pointer and a length set side by side (``mov $6,%edx; lea znver3(%rip),
    %rax``); both are rewritten to point at the ``x86-64-v4`` string LLVM's own CPU table
    holds. This library's code and read-only data are mapped at their file offsets, so a
    RIP-relative target is computed on the file; a build where that is not so does not match.
    """
    at = library.find(_FAMILY_SWITCH)
    old, new = library.find(b"\0" + _ZNVER3 + b"\0"), library.find(b"\0" + _X86_64_V4 + b"\0")
    if at < 0 or old < 0 or new < 0:
        return None
    old, new = old + 1, new + 1
    found = []
    start = library.find(_ZNVER3_NAME, at, at + 0x1000)
    while start >= 0:
        lea = start + 5                                     # lea rel32(%rip),%rax: 7 bytes
        if lea + 7 + struct.unpack_from("<i", library, lea + 3)[0] == old:
            found.append(lea)
        start = library.find(_ZNVER3_NAME, start + 1, at + 0x1000)
    if len(found) != 1:
        return None
    lea = found[0]
    patched = bytearray(library)
    struct.pack_into("<i", patched, lea - 4, len(_X86_64_V4))     # mov $9,%edx
    struct.pack_into("<i", patched, lea + 3, new - (lea + 7))
    return bytes(patched)


def _patches(cpu: AmdCpu | None) -> tuple[str, ...]:
    """The patches this CPU needs: ``family`` (LLVM does not know it) and ``avx512`` (LLVM
    would compile for AVX2 where the CPU has AVX-512)."""
    if cpu is None:
        return ()
    return (("family",) if cpu.family > _LAST_KNOWN_FAMILY else ()) + (
        ("avx512",) if cpu.has_avx512 and cpu.family >= _LAST_KNOWN_FAMILY else ())


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
    patches = _patches(amd_cpu())
    if not patches:
        return None
    original = _pocl_library()
    if original is None or _mapped(original):
        return None                 # no PoCL, or the loader has opened it already: too late
    # One copy per installed PoCL file (its path, size and time: no 100 MB read per import)
    # and set of patches.
    # It keeps PoCL's file name (the loader opens it by that name) and its place two levels
    # below a link to that installation's pocl_binary_distribution: PoCL finds its kernel
    # library and hwloc relative to itself ($ORIGIN/../../pocl_binary_distribution/.libs), so
    # a copy serves the one installation it was made from, and no other can break it.
    st = os.stat(original)
    key = hashlib.sha256(f"{original}|{st.st_size}|{st.st_mtime_ns}|{','.join(patches)}"
                         .encode()).hexdigest()
    root = os.path.join(_cache_dir(), f"pocl-{key[:16]}")
    copy = os.path.join(root, "lib", "pocl", os.path.basename(original))
    try:
        if not os.path.exists(copy):
            _drop_stale(_cache_dir(), _support(original), keep=root)
            if not _write_copy(original, root, copy, patches):
                return None
        ctypes.CDLL(copy)
    except OSError as exc:          # no writable cache, or a copy that cannot load
        warnings.warn(f"parcl: could not use a patched PoCL for this CPU ({exc}); kernel "
                      "builds may fail with \"unknown target CPU 'generic'\". Set "
                      "PARCL_POCL_CPU_FIX=0 to skip this, or remove " + root, RuntimeWarning,
                      stacklevel=2)
        return None
    return copy


def _support(original: str) -> str:
    """The ``pocl_binary_distribution`` folder of the installation ``original`` is in."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(original))),
                        "pocl_binary_distribution")


def _drop_stale(cache: str, support: str, keep: str) -> None:
    """Before the copy ``keep`` for the installation of ``support`` is made: remove the copies
    made for installations that are gone (their link dangles; a copy is made per
    installation, and venvs come and go) and the older copies of this one (other patches or
    another PoCL file: a process still using one keeps its mapping). ``keep`` itself may be
    in the making by another process starting at the same time (``mpiexec``)."""
    for link in glob.glob(os.path.join(cache, "pocl-*", "pocl_binary_distribution")):
        if os.path.dirname(link) == keep:
            continue
        if os.path.islink(link) and (not os.path.exists(link)
                                     or os.path.realpath(link) == os.path.realpath(support)):
            shutil.rmtree(os.path.dirname(link), ignore_errors=True)


def _mapped(path: str) -> bool:
    """Whether this process has ``path`` loaded already."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            return os.path.realpath(path) in f.read()
    except OSError:
        return False


def _write_copy(original: str, root: str, copy: str, patches: tuple[str, ...]) -> bool:
    """Write the patched copy (and its link to pocl_binary_distribution); False when this
    PoCL's host detection does not have the expected shape."""
    with open(original, "rb") as f:
        patched = f.read()
    if "family" in patches:                 # needed: without it no kernel builds
        patched = patch_family_switch(patched)
        if patched is None:
            return False
    named = patch_cpu_name(patched) if "avx512" in patches else None
    if named is None and "family" not in patches:
        return False                        # nothing to change after all
    patched = named or patched
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    support = _support(original)
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
