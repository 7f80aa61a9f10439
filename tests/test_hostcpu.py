"""The pip PoCL on CPUs newer than its LLVM (parcl.hostcpu): no device needed."""

from __future__ import annotations

import struct

from parcl import hostcpu


def _fake_library(table_at: int = 0x100) -> bytes:
    """Bytes laid out like LLVM's switch over AMD families: the compare, the ja to the
    unknown-family case, the jump table lookup, and a table of 22 entries (families 4..25)."""
    code = bytearray(b"\x90" * 0x40)
    switch = bytearray(hostcpu._FAMILY_SWITCH) + struct.pack("<i", -0x20)
    lea_at = 0x10 + len(switch)
    lea = b"\x48\x8d\x15" + struct.pack("<i", table_at - (lea_at + 7))
    code[0x10:0x10 + len(switch)] = switch
    code[lea_at:lea_at + 7] = lea
    blob = bytearray(code) + b"\x00" * (table_at - len(code))
    for family in range(4, 26):
        blob += struct.pack("<i", 0x1000 + family - table_at)      # case of `family` at 0x1000+f
    return bytes(blob)


def test_unknown_amd_families_take_the_last_known_case():
    lib = _fake_library()
    patched = hostcpu.patch_family_switch(lib)
    assert patched is not None and len(patched) == len(lib)
    ja = 0x10 + 8
    target = ja + 6 + struct.unpack_from("<i", patched, ja + 2)[0]
    assert target == 0x1000 + 25
    # every other byte is as it was
    assert patched[:ja + 2] == lib[:ja + 2] and patched[ja + 6:] == lib[ja + 6:]


def test_other_builds_are_left_alone():
    assert hostcpu.patch_family_switch(b"\x90" * 4096) is None
    twice = _fake_library() + _fake_library()
    assert hostcpu.patch_family_switch(twice) is None


def test_cpu_family_is_read_for_amd_only(tmp_path):
    amd = tmp_path / "amd"
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n\n"
                   "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 99\n")
    intel = tmp_path / "intel"
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n")
    assert hostcpu.amd_cpu_family(str(amd)) == 26
    assert hostcpu.amd_cpu_family(str(intel)) is None
    assert hostcpu.amd_cpu_family(str(tmp_path / "missing")) is None


def test_an_unwritable_cache_leaves_pocl_as_it_is(tmp_path, monkeypatch):
    fake = tmp_path / "libpocl-fake.so"
    fake.write_bytes(_fake_library())
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory would go")
    monkeypatch.setattr(hostcpu, "amd_cpu_family", lambda: 26)
    monkeypatch.setattr(hostcpu, "_pocl_library", lambda: str(fake))
    monkeypatch.setattr(hostcpu, "_cache_dir", lambda: str(blocked))
    monkeypatch.setattr(hostcpu.platform, "system", lambda: "Linux")
    monkeypatch.setattr(hostcpu.platform, "machine", lambda: "x86_64")
    assert hostcpu.ensure_known_cpu() is None          # no error at import time either
