"""Reading files a job controls, from a process that may be root; and writing the
agent's own private files (launch records, the fence) so that nothing else can read them.

A subjob may replace any file in a folder it can write (its checkpoint folder, its
scratch folder) with a symbolic link to a file only root may read, a FIFO that blocks
whoever opens it, or a device. The agent still has to read a few small files from such
folders (the checkpoint progress, the fake backend's usage report), so each read here:

- opens with ``O_NOFOLLOW`` (a link as the last component is refused) and ``O_NONBLOCK``
  (opening a FIFO never blocks);
- accepts only a regular file (``fstat`` after the open, so there is no race between a
  check and the open);
- when ``owner_uid`` is given, accepts only a file that user owns: a file the subjob's
  user owns is one it could read anyway, so nothing more leaks through the agent even if
  a folder higher up the path is a link;
- reads at most ``max_bytes``.

What is not covered: a job's files are never executed or parsed beyond these bounded
reads; larger job output (logs) is written by the agent into root-only folders instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class UnsafeJobFile(OSError):
    """The path is not a regular file the expected user owns (link, FIFO, device...)."""


def read_job_file(path: str | os.PathLike[str], *, max_bytes: int, owner_uid: int | None) -> bytes:
    """At most ``max_bytes`` of a regular file; raises FileNotFoundError when absent,
    UnsafeJobFile when it is anything but a regular file owned by ``owner_uid``."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symbolic link
            raise UnsafeJobFile(f"{os.fspath(path)} is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeJobFile(f"{os.fspath(path)} is not a regular file")
        if owner_uid is not None and info.st_uid != owner_uid:
            raise UnsafeJobFile(f"{os.fspath(path)} is not owned by uid {owner_uid}")
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def write_private(path: Path, text: str, *, durable: bool = False) -> None:
    """Write an owner-only (0600) file atomically: a fresh temp file beside it (links
    refused), then a rename, so readers never see half of it. ``durable`` fsyncs first
    (the fence: a shim must never read an older deadline after a crash)."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
