"""Every file the package writes goes through here: a temporary file, then an atomic rename.

:func:`atomic_write` writes to a new temporary file in the target's own
folder (same file system, so the rename is atomic), flushes and ``fsync``\\ s
it, then ``os.replace``\\ s it over the target. Whatever happens before the
rename (a full disk, an exception or Ctrl-C part-way, a crash) the target is
untouched and the temporary file is removed (a crash can leave one behind,
never a half-written target). Consequences worth knowing:

* Saving over the file an input was loaded from is safe: the loaders
  memory-map their files (:mod:`q2gemv.io`), and truncating a mapped file
  in place would kill the process with SIGBUS. The rename gives the target
  name a new inode; the old mapping keeps the old bytes until it is dropped.
  (On Windows, where a mapped file cannot be replaced, the rename fails with
  an OSError and the original stays intact.)
* A symlink target is followed: the file it points to is replaced, as
  ``open(path, "w")`` would write it; the link itself stays.
* An existing target's permission bits are kept; a new file gets the
  process's default (``0o666`` less the umask), as ``open`` would give it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, *, text: bool = False, newline: str | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on a clean exit, rename it over ``path``.

    Args:
        path: the file to create or replace (str or os.PathLike).
        text: False (default) for a binary file, True for UTF-8 text.
        newline: as for :func:`open` in text mode (``""`` for the csv module).

    Yields the open temporary file. On a clean exit of the ``with`` block it
    is flushed, fsync'd, closed and renamed over ``path`` (then the folder is
    fsync'd where the platform allows). On any exception (``KeyboardInterrupt``
    included) the temporary file is removed and the exception propagates;
    ``path`` is never opened for writing.
    """
    target = os.path.realpath(os.fspath(path))
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        mode = "w" if text else "wb"
        encoding = "utf-8" if text else None
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
            fd = -1  # owned by f now
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable where a folder can be opened (POSIX); best effort."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(dfd)
    finally:
        os.close(dfd)


def write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    with atomic_write(path) as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`)."""
    with atomic_write(path, text=True) as f:
        f.write(text)
