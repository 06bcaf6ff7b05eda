"""Subjob shim: runs one command and records how it ended in ``<subjob_dir>/exit.json``.

The agent starts the shim in a new session, so the shim is the process group
leader and the command shares its group. Signals are sent to the whole group and
the command decides how to react; the shim ignores them and only waits. The shim
exists because after an agent restart the subjob is no longer the agent's child:
``exit.json`` is how a re-adopting agent learns the exit status.

Usage: ``python -m laminar_agent.shim <subjob_dir> [--cwd DIR] -- cmd args...``
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
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


def run(subjob_dir: Path, command: list[str]) -> int:
    """Run ``command``, wait for it, write ``exit.json``; return the shim's own exit code."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    started = time.monotonic()
    try:
        pid = os.fork()
    except OSError as exc:
        write_exit(subjob_dir, _failed_record(started, f"fork failed: {exc}"))
        return EXEC_FAILED_CODE
    if pid == 0:  # child: restore default dispositions, then exec
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            # Report through a side file: the parent writes exit.json with this error.
            try:
                (subjob_dir / "exec_error").write_text(f"{command[0]}: {exc.strerror}")
            finally:
                os._exit(EXEC_FAILED_CODE)
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
    err_file = subjob_dir / "exec_error"
    if err_file.exists():
        record["error"] = err_file.read_text()
    write_exit(subjob_dir, record)
    return 0


def _failed_record(started: float, error: str) -> dict[str, Any]:
    return {
        "exit_code": EXEC_FAILED_CODE,
        "signal": None,
        "peak_rss_bytes": 0,
        "ended_unix": time.time(),
        "run_seconds": time.monotonic() - started,
        "error": error,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 3 and args[1] == "--cwd":
        try:
            os.chdir(args[2])  # posix_spawn cannot chdir, so the shim does it
        except OSError as exc:
            write_exit(Path(args[0]), _failed_record(time.monotonic(), f"cwd {args[2]}: {exc}"))
            return EXEC_FAILED_CODE
        args = [args[0], *args[3:]]
    if len(args) < 3 or args[1] != "--":
        print(
            "usage: python -m laminar_agent.shim <subjob_dir> [--cwd DIR] -- cmd args...",
            file=sys.stderr,
        )
        return 2
    return run(Path(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
