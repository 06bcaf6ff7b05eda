"""Without cgroups, a subjob's processes that leave its process group (setsid, double
fork) are still found and stopped: the supervisor is their child subreaper.

Executor() here has no cgroups (the process-group fallback); the cgroup path is
re-enacted through a real agent in tests/security/test_privilege.py."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
from test_executor import Recorder, poll_until

from laminar_agent.executor import Executor, LaunchSpec

#: Forks a grandchild that starts its own session (escaping the process group), writes
#: its pid, and lives on; the command itself waits for it to be written.
ESCAPE = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"  # double fork: the daemon's parent is gone at once
    "        open('gc.pid.tmp', 'w').write(str(os.getpid()))\n"
    "        os.rename('gc.pid.tmp', 'gc.pid')\n"
    "        while True: time.sleep(1)\n"
    "    os._exit(0)\n"
    "while not os.path.exists('gc.pid'): time.sleep(0.01)\n"
    "{tail}"
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _spec(tmp_path: Path, subjob_id: str, tail: str) -> LaunchSpec:
    return LaunchSpec(
        subjob_id=subjob_id,
        job_id="job-1",
        command=[sys.executable, "-c", ESCAPE.format(tail=tail)],
        env={},
        workdir=str(tmp_path),
        device_uuids=[],
    )


async def test_cancel_ends_a_setsid_grandchild_without_cgroups(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    assert ex.cgroups is None
    await ex.launch(_spec(tmp_path, "esc", "while True: time.sleep(1)\n"))
    await poll_until(lambda: (tmp_path / "gc.pid").exists(), "the grandchild's pid")
    grandchild = int((tmp_path / "gc.pid").read_text())
    assert not _gone(grandchild)
    await ex.terminate("esc", grace_seconds=5)
    await poll_until(lambda: "esc" in rec.exits, "exit of esc")
    await poll_until(lambda: _gone(grandchild), "the setsid grandchild to be gone")
    await ex.close()


async def test_a_daemon_left_behind_ends_with_its_subjob(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    await ex.launch(_spec(tmp_path, "daemon", "sys.exit(0)\n"))
    await poll_until(lambda: "daemon" in rec.exits, "exit of daemon")
    assert rec.exits["daemon"].exit_code == 0
    grandchild = int((tmp_path / "gc.pid").read_text())
    await poll_until(lambda: _gone(grandchild), "the daemon to be gone")
    await ex.close()
