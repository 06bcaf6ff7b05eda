"""Subjob shim: runs one command and records how it ended in ``<subjob_dir>/exit.json``.

The agent starts the shim in a new session, so the shim is the process group
leader and the command shares its group. Signals are sent to the whole group and
the command decides how to react; the shim ignores them and only waits. The shim
exists because after an agent restart the subjob is no longer the agent's child:
``exit.json`` is how a re-adopting agent learns the exit status.

When the agent runs as root, the shim stays root (so it can write ``exit.json`` in
a directory the subjob cannot touch) and only the command takes the unprivileged
identity given by ``--user``.

Usage: ``python -m laminar_agent.shim <subjob_dir> [--cwd DIR] [--user UID:GID:GROUPS]
[--mkdir DIR]... -- cmd args...``
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_FILE = "exit.json"
EXEC_FAILED_CODE = 127


def write_exit(subjob_dir: Path, record: dict[str, Any]) -> None:
    """Write ``exit.json`` atomically (tmp + rename) so readers never see half a file."""
    tmp = subjob_dir / (EXIT_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, subjob_dir / EXIT_FILE)


@dataclass(frozen=True)
class Identity:
    """Who the command runs as (``--user UID:GID:G1,G2``); the shim itself stays root."""

    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Identity:
        uid, gid, groups = text.split(":")
        return cls(int(uid), int(gid), tuple(int(g) for g in groups.split(",") if g))

    def become(self) -> None:
        """Drop to this identity for good: groups first, then gid, then uid."""
        os.setgroups(list(self.groups))
        os.setgid(self.gid)
        os.setuid(self.uid)


def run(
    subjob_dir: Path,
    command: list[str],
    *,
    identity: Identity | None = None,
    make_dirs: tuple[str, ...] = (),
) -> int:
    """Run ``command``, wait for it, write ``exit.json``; return the shim's own exit code.

    The child takes ``identity`` (if any), then creates ``make_dirs`` as that identity so
    they are its own (a folder it may not create is reported on its stderr and left to
    the command), then execs. A failed identity change or exec is reported through a
    pipe and recorded in ``exit.json`` with exit code 127."""
    # A stop can arrive before the command exists, and would find only the shim. So the
    # stop signals are blocked (held pending, not lost) until the fork: the parent then
    # ignores them and passes on any that came early; the child restores the defaults and
    # unblocks, so a pending stop ends it before it execs. (Python-level handlers cannot
    # do this: CPython drops a child's tripped-but-unrun handlers at fork.)
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    started = time.monotonic()
    errors_r, errors_w = os.pipe()
    os.set_inheritable(errors_w, False)
    try:
        pid = os.fork()
    except OSError as exc:
        write_exit(subjob_dir, _failed_record(started, f"fork failed: {exc}"))
        return EXEC_FAILED_CODE
    if pid == 0:  # child: restore default dispositions, take the identity, then exec
        os.close(errors_r)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)  # a pending stop ends it here
        step = "user"
        try:
            if identity is not None:
                identity.become()
            for directory in make_dirs:
                try:
                    os.makedirs(directory, exist_ok=True)
                except OSError as exc:
                    os.write(2, f"laminar: cannot create {directory}: {exc.strerror}\n".encode())
            step = command[0]
            os.execvp(command[0], command)
        except OSError as exc:
            try:
                os.write(errors_w, f"{step}: {exc.strerror}".encode(errors="replace"))
            finally:
                os._exit(EXEC_FAILED_CODE)
    early = signal.sigpending() & stops
    for sig in stops:  # from now on a stop sent to the group reaches the child itself
        signal.signal(sig, signal.SIG_IGN)
    for sig in sorted(early):
        os.kill(pid, sig)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    os.close(errors_w)
    error = _read_all(errors_r).decode(errors="replace")
    while True:
        try:
            _, status, rusage = os.wait4(pid, 0)
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
    run_seconds = time.monotonic() - started
    record: dict[str, Any] = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "peak_rss_bytes": int(rusage.ru_maxrss) * 1024,
        "ended_unix": time.time(),
        "run_seconds": run_seconds,
    }
    if error:
        record["error"] = error
    write_exit(subjob_dir, record)
    return 0


def _read_all(fd: int) -> bytes:
    """Read a pipe to its end (the child's exec closes it, or the child writes and exits)."""
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _failed_record(started: float, error: str) -> dict[str, Any]:
    return {
        "exit_code": EXEC_FAILED_CODE,
        "signal": None,
        "peak_rss_bytes": 0,
        "ended_unix": time.time(),
        "run_seconds": time.monotonic() - started,
        "error": error,
    }


USAGE = (
    "usage: python -m laminar_agent.shim <subjob_dir> [--cwd DIR] [--user UID:GID:GROUPS] "
    "[--mkdir DIR]... -- cmd args..."
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    subjob_dir, rest = Path(args[0]), args[1:]
    identity: Identity | None = None
    make_dirs: list[str] = []
    while len(rest) >= 2 and rest[0] in ("--cwd", "--user", "--mkdir"):
        option, value, rest = rest[0], rest[1], rest[2:]
        if option == "--cwd":
            try:
                os.chdir(value)  # posix_spawn cannot chdir, so the shim does it
            except OSError as exc:
                write_exit(subjob_dir, _failed_record(time.monotonic(), f"cwd {value}: {exc}"))
                return EXEC_FAILED_CODE
        elif option == "--user":
            try:
                identity = Identity.parse(value)
            except ValueError:
                print(f"shim: bad --user {value!r}", file=sys.stderr)
                return 2
        else:
            make_dirs.append(value)
    if len(rest) < 2 or rest[0] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    return run(subjob_dir, rest[1:], identity=identity, make_dirs=tuple(make_dirs))


if __name__ == "__main__":
    sys.exit(main())
