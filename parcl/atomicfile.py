"""Atomic file writes: a new file, or a replaced one, appears whole or not at all.

The bytes go to a temporary file beside the target, are fsynced, and the file is renamed onto
the target, then the directory is fsynced; a crash at any point leaves the previous file intact
(and perhaps a stray ``.<name>.*.tmp``). The file gets the mode any new file gets under the
process's umask (0644 under the usual 022). Used by ``pc.save``.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "notes.txt")
>>> atomic_write(path, b"hello")
>>> open(path, "rb").read()
b'hello'
"""

from __future__ import annotations

import os
import secrets

from .errors import CheckpointError

__all__ = ["atomic_write"]

_WRITE_CHUNK = 1 << 22   # os.write may write less than asked for large buffers; loop in chunks


def atomic_write(path: str, data: bytes, what: str = "file") -> None:
    """Write ``data`` to ``path`` atomically; a failure is a ``CheckpointError`` naming
    ``what`` was being written, with the previous file intact."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = _create_temporary(directory, os.path.basename(path))
    except OSError as e:
        raise CheckpointError(f"save({path!r}): cannot create a file in {directory!r}: "
                              f"{e}") from e
    try:
        try:
            view = memoryview(data)
            offset = 0
            while offset < len(view):
                offset += os.write(fd, view[offset:offset + _WRITE_CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise CheckpointError(f"save({path!r}): writing failed: {e}; the previous "
                                  f"{what}, if any, is intact") from e
        raise
    _fsync_directory(directory)


def _create_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new file beside the target, created with mode 0666 so the kernel applies the
    umask (and any default ACL) exactly as for any other new file; ``tempfile.mkstemp`` would
    make it 0600, and the rename would carry that onto the target. Reading the umask
    instead (``os.umask``) would change it for every thread for a moment."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name!r} in {directory!r}")


def _fsync_directory(directory: str) -> None:
    # Makes the rename itself durable. Not possible on every platform (Windows): best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
