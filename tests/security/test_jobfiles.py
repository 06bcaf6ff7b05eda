"""read_job_file: how a (root) agent reads a file a job controls.

Each attack a job can stage in a folder it writes: a FIFO (root would block in open()),
a link to a root-only file (its content would leak), a link higher up the path, a
folder or device in place of the file, another user's file, a huge file. The end-to-end
re-enactment through a real agent is in test_privilege.py; this pins the primitive.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from laminar_agent.jobfiles import UnsafeJobFile, read_job_file


def _read_in_thread(path: Path, owner_uid: int | None) -> BaseException | bytes | None:
    """Read in a thread, so a blocking open fails the test instead of hanging it."""
    result: list[BaseException | bytes] = []

    def read() -> None:
        try:
            result.append(read_job_file(path, max_bytes=64, owner_uid=owner_uid))
        except BaseException as exc:  # handed back to the test
            result.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=10)
    return result[0] if result else None


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "progress"
    os.mkfifo(fifo)
    outcome = _read_in_thread(fifo, os.geteuid())
    assert outcome is not None, "read_job_file blocked on a FIFO"
    assert isinstance(outcome, UnsafeJobFile), outcome


def test_a_link_as_the_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash")
    link = tmp_path / "progress"
    link.symlink_to(secret)
    with pytest.raises(UnsafeJobFile, match="symbolic link"):
        read_job_file(link, max_bytes=64, owner_uid=os.geteuid())


def test_a_folder_or_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    with pytest.raises(UnsafeJobFile, match="not a regular file"):
        read_job_file(tmp_path / "progress", max_bytes=64, owner_uid=None)
    with pytest.raises(UnsafeJobFile, match="not a regular file"):
        read_job_file("/dev/zero", max_bytes=64, owner_uid=None)


def test_reads_are_bounded_and_absence_is_file_not_found(tmp_path: Path) -> None:
    big = tmp_path / "progress"
    big.write_bytes(b"7" * 1_000_000)
    assert read_job_file(big, max_bytes=32, owner_uid=os.geteuid()) == b"7" * 32
    with pytest.raises(FileNotFoundError):
        read_job_file(tmp_path / "absent", max_bytes=32, owner_uid=None)


def test_another_users_file_is_refused_even_through_a_linked_folder(tmp_path: Path) -> None:
    """A job's folder may be a link to /etc: the last component is then a real file,
    but root's, not the job's, so it is refused."""
    if os.geteuid() != 0:
        msg = f"needs root to own files as another user (running as uid {os.geteuid()})"
        print(msg)
        pytest.skip(msg)
    root_only = tmp_path / "etc"
    root_only.mkdir()
    (root_only / "progress").write_text("secret-of-root")
    job_folder = tmp_path / "job"
    job_folder.symlink_to(root_only)  # the job replaced its checkpoint folder by a link
    with pytest.raises(UnsafeJobFile, match="not owned by uid 4242"):
        read_job_file(job_folder / "progress", max_bytes=64, owner_uid=4242)
    own = tmp_path / "own"
    own.write_text("12")
    os.chown(own, 4242, 4242)
    assert read_job_file(own, max_bytes=64, owner_uid=4242) == b"12"
