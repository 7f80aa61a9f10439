"""The pip PoCL on CPUs newer than its LLVM (parcl.hostcpu): no device needed."""

from __future__ import annotations

import os
import struct

import pytest

from parcl import hostcpu


def _fake_library(table_at: int = 0x100) -> bytes:
    """Bytes laid out like LLVM's switch over AMD families: the compare, the ja to the
    unknown-family case, the jump table lookup, a table of 22 entries (families 4..25), then
    family 25's case naming its CPU and LLVM's strings."""
    code = bytearray(b"\x90" * 0x40)
    switch = bytearray(hostcpu._FAMILY_SWITCH) + struct.pack("<i", -0x20)
    lea_at = 0x10 + len(switch)
    lea = b"\x48\x8d\x15" + struct.pack("<i", table_at - (lea_at + 7))
    code[0x10:0x10 + len(switch)] = switch
    code[lea_at:lea_at + 7] = lea
    blob = bytearray(code) + b"\x00" * (table_at - len(code))
    for family in range(4, 26):
        blob += struct.pack("<i", 0x1000 + family - table_at)      # case of `family` at 0x1000+f
    blob += b"\x90" * (NAME_AT - len(blob))
    blob += b"\xba\x06\x00\x00\x00\x48\x8d\x05" + struct.pack("<i", ZNVER3_AT - (NAME_AT + 12))
    blob += b"\x00" * (ZNVER3_AT - 1 - len(blob)) + b"\x00znver3\x00x86-64-v4\x00"
    return bytes(blob)


NAME_AT, ZNVER3_AT = 0x200, 0x300
ZEN5 = hostcpu.AmdCpu(26, hostcpu._V4_FLAGS)      # mov $6,%edx; lea znver3(%rip),%rax / the string


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


def test_family_25_names_x86_64_v4_where_the_cpu_has_avx512():
    lib = hostcpu.patch_family_switch(_fake_library())
    patched = hostcpu.patch_cpu_name(lib)
    assert patched is not None and len(patched) == len(lib)
    assert struct.unpack_from("<i", patched, NAME_AT + 1)[0] == len("x86-64-v4")
    lea = NAME_AT + 5
    target = lea + 7 + struct.unpack_from("<i", patched, lea + 3)[0]
    assert patched[target:target + 10] == b"x86-64-v4\x00"
    changed = [i for i in range(len(lib)) if lib[i] != patched[i]]
    assert changed and all(NAME_AT + 1 <= i < NAME_AT + 5 or lea + 3 <= i < lea + 7
                           for i in changed)


def test_a_cpu_name_patch_that_does_not_match_changes_nothing():
    lib = _fake_library()
    assert hostcpu.patch_cpu_name(lib.replace(b"x86-64-v4", b"x86-64-v5")) is None
    assert hostcpu.patch_cpu_name(lib.replace(b"\x00znver3", b"\x00znver9")) is None
    assert hostcpu.patch_cpu_name(b"\x90" * 4096) is None


def test_the_cpu_is_read_for_amd_only(tmp_path):
    amd = tmp_path / "amd"
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
                   "flags\t\t: fpu avx2 avx512f avx512dq avx512cd avx512bw avx512vl\n\n"
                   "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 99\n")
    intel = tmp_path / "intel"
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n")
    cpu = hostcpu.amd_cpu(str(amd))
    assert cpu.family == 26 and cpu.has_avx512
    assert hostcpu.amd_cpu(str(intel)) is None
    assert hostcpu.amd_cpu(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("family, avx512, patches", [
    (26, True, ("family", "avx512")),     # Zen 5: unknown to LLVM 14, has AVX-512
    (26, False, ("family",)),
    (25, True, ("avx512",)),              # Zen 4: LLVM 14 calls it znver3 (AVX2)
    (25, False, ()),                      # Zen 3: LLVM 14 knows it
    (23, False, ()),
])
def test_the_patches_follow_the_cpu(family, avx512, patches):
    flags = hostcpu._V4_FLAGS if avx512 else frozenset({"avx2", "avx512f"})
    assert hostcpu._patches(hostcpu.AmdCpu(family, flags)) == patches
    assert hostcpu._patches(None) == ()


def test_an_unwritable_cache_leaves_pocl_as_it_is(tmp_path, monkeypatch):
    fake = tmp_path / "libpocl-fake.so"
    fake.write_bytes(_fake_library())
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory would go")
    monkeypatch.setattr(hostcpu, "amd_cpu", lambda: ZEN5)
    monkeypatch.setattr(hostcpu, "_pocl_library", lambda: str(fake))
    monkeypatch.setattr(hostcpu, "_cache_dir", lambda: str(blocked))
    monkeypatch.setattr(hostcpu.platform, "system", lambda: "Linux")
    monkeypatch.setattr(hostcpu.platform, "machine", lambda: "x86_64")
    with pytest.warns(RuntimeWarning, match="could not use a patched PoCL"):
        assert hostcpu.ensure_known_cpu() is None      # no error at import time either


def _installation(root, monkeypatch, cache):
    """A fake venv layout: site-packages/pyopencl/.libs/libpocl-x.so beside
    site-packages/pocl_binary_distribution."""
    libs = root / "site-packages" / "pyopencl" / ".libs"
    libs.mkdir(parents=True)
    (root / "site-packages" / "pocl_binary_distribution").mkdir()
    lib = libs / "libpocl-x.so"
    lib.write_bytes(_fake_library())
    monkeypatch.setattr(hostcpu, "amd_cpu", lambda: ZEN5)
    monkeypatch.setattr(hostcpu, "_pocl_library", lambda: str(lib))
    monkeypatch.setattr(hostcpu, "_cache_dir", lambda: str(cache))
    monkeypatch.setattr(hostcpu.platform, "system", lambda: "Linux")
    monkeypatch.setattr(hostcpu.platform, "machine", lambda: "x86_64")
    return root / "site-packages" / "pocl_binary_distribution"


def test_each_installation_gets_its_own_copy_and_a_bad_one_warns(tmp_path, monkeypatch):
    """Two venvs with the same PoCL build must not share a copy: the copy finds PoCL's kernel
    library through a link to its own installation, so deleting one venv cannot break the
    other. A copy that cannot be loaded (here: fake bytes) is a warning, not a failed import."""
    cache = tmp_path / "cache"
    links = []
    for venv in ("a", "b"):
        support = _installation(tmp_path / venv, monkeypatch, cache)
        with pytest.warns(RuntimeWarning, match="could not use a patched PoCL"):
            assert hostcpu.ensure_known_cpu() is None
        links.append((support, sorted(cache.glob("pocl-*/pocl_binary_distribution"))))
    roots = links[1][1]
    assert len(roots) == 2
    assert {os.path.realpath(p) for p in roots} == {str(s) for s, _ in links}


def test_nothing_is_done_once_pocl_is_loaded(tmp_path, monkeypatch):
    _installation(tmp_path / "a", monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(hostcpu, "_mapped", lambda path: True)
    assert hostcpu.ensure_known_cpu() is None
    assert not (tmp_path / "cache").exists()


def test_copies_of_installations_that_are_gone_are_removed(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    gone = cache / "pocl-0123456789abcdef"
    (gone / "lib" / "pocl").mkdir(parents=True)
    os.symlink(tmp_path / "deleted-venv" / "pocl_binary_distribution",
               gone / "pocl_binary_distribution")
    support = _installation(tmp_path / "a", monkeypatch, cache)
    with pytest.warns(RuntimeWarning):             # the fake library cannot load
        hostcpu.ensure_known_cpu()
    assert not gone.exists()
    kept = list(cache.glob("pocl-*/pocl_binary_distribution"))
    assert [os.path.realpath(p) for p in kept] == [str(support)]


def test_a_new_copy_replaces_older_copies_of_the_same_installation(tmp_path, monkeypatch):
    """Other patches (or an updated PoCL file) give the copy another name: the older one of
    the same installation goes, the other installations' stay."""
    cache = tmp_path / "cache"
    _installation(tmp_path / "b", monkeypatch, cache)
    with pytest.warns(RuntimeWarning):
        hostcpu.ensure_known_cpu()
    support = _installation(tmp_path / "a", monkeypatch, cache)
    for cpu in (hostcpu.AmdCpu(26), ZEN5):
        monkeypatch.setattr(hostcpu, "amd_cpu", lambda cpu=cpu: cpu)
        with pytest.warns(RuntimeWarning):
            hostcpu.ensure_known_cpu()
    kept = sorted(os.path.realpath(p) for p in cache.glob("pocl-*/pocl_binary_distribution"))
    assert kept == sorted([str(support), str(tmp_path / "b" / "site-packages" /
                                             "pocl_binary_distribution")])
    copy, = [p.parent / "lib" / "pocl" / "libpocl-x.so"
             for p in cache.glob("pocl-*/pocl_binary_distribution")
             if os.path.realpath(p) == str(support)]
    lib = _fake_library()
    assert copy.read_bytes() == hostcpu.patch_cpu_name(hostcpu.patch_family_switch(lib))


def test_a_copy_another_process_is_making_is_kept(tmp_path):
    """Two processes starting at once (mpiexec) make the same copy: neither removes it."""
    support = tmp_path / "venv" / "pocl_binary_distribution"
    support.mkdir(parents=True)
    making, older = tmp_path / "cache" / "pocl-new", tmp_path / "cache" / "pocl-old"
    for root in (making, older):
        root.mkdir(parents=True)
        os.symlink(support, root / "pocl_binary_distribution")
    hostcpu._drop_stale(str(tmp_path / "cache"), str(support), keep=str(making))
    assert making.exists() and not older.exists()
