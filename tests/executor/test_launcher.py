"""The pre-forked launcher (shim.py --serve): clean start, fallback, restart.

Real processes: the agent's Executor, its launcher, supervisors and commands.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from test_executor import Recorder, poll_until

from laminar_agent import executor as executor_module
from laminar_agent.executor import Executor, LaunchSpec


def _spec(tmp_path: Path, subjob_id: str, code: int) -> LaunchSpec:
    return LaunchSpec(
        subjob_id=subjob_id,
        job_id="job-1",
        command=[sys.executable, "-c", f"import sys; sys.exit({code})"],
        env={"PYTHONPATH": "/nonexistent", "LD_PRELOAD": ""},
        workdir=str(tmp_path),
        device_uuids=[],
    )


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def _run(ex: Executor, rec: Recorder, spec: LaunchSpec) -> int:
    pid = await ex.launch(spec)
    await poll_until(lambda: spec.subjob_id in rec.exits, f"exit of {spec.subjob_id}")
    return pid


async def test_the_launcher_starts_clean_and_forks_the_supervisors(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec, base_env={"PYTHONPATH": "/evil"})
    launcher = ex._launcher
    assert launcher is not None
    pid = await ex.launch(_spec(tmp_path, "a", 4))
    assert launcher.pid > 0 and launcher.starts == 1
    env = Path(f"/proc/{launcher.pid}/environ").read_bytes().split(b"\0")
    keys = {item.partition(b"=")[0].decode() for item in env if item}
    assert keys <= {"PATH", "LANG"}, keys
    argv = Path(f"/proc/{launcher.pid}/cmdline").read_bytes().split(b"\0")
    assert argv[1:3] == [b"-I", b"-S"] and b"--serve" in argv
    await poll_until(lambda: "a" in rec.exits, "exit of a")
    assert rec.exits["a"].exit_code == 4
    assert pid != launcher.pid
    await ex.close()


async def test_a_killed_launcher_falls_back_then_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor_module, "LAUNCHER_RETRY_SECONDS", 0.5)
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    launcher = ex._launcher
    assert launcher is not None
    await _run(ex, rec, _spec(tmp_path, "before", 0))
    first = launcher.pid
    assert first > 0
    os.kill(first, signal.SIGKILL)
    # The next launch finds it dead: this subjob still runs (a shim started directly),
    # and its real exit status is recorded.
    await _run(ex, rec, _spec(tmp_path, "during", 5))
    assert rec.exits["during"].exit_code == 5
    assert launcher.pid == 0 and launcher.starts == 1  # not restarted within the period
    await poll_until(lambda: not launcher.is_broken, "the retry period to pass")
    pid = await _run(ex, rec, _spec(tmp_path, "after", 6))
    assert rec.exits["after"].exit_code == 6
    assert launcher.starts == 2 and launcher.pid not in (0, first)
    assert pid > 0
    await ex.close()


async def test_without_the_launcher_each_subjob_gets_a_clean_shim(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec, use_launcher=False)
    code = "import os, time\nwhile not os.path.exists('gate'): time.sleep(0.02)\n"
    spec = _spec(tmp_path, "direct", 0)
    spec.command = [sys.executable, "-c", code]
    pid = await ex.launch(spec)
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    keys = {item.partition(b"=")[0].decode() for item in env if item}
    assert not keys & {"PYTHONPATH", "LD_PRELOAD"}, keys
    assert _ppid(pid) == os.getpid()  # our own child: no launcher in between
    (tmp_path / "gate").write_text("")
    await poll_until(lambda: "direct" in rec.exits, "exit of direct")
    assert rec.exits["direct"].exit_code == 0
    await ex.close()


async def test_the_launcher_loads_what_every_supervisor_would_load_again(
    tmp_path: Path,
) -> None:
    """os.wait4 in a supervisor imports ``resource`` (a shared library): loaded once in
    the launcher, before it forks, not once per launch."""
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    launcher = ex._launcher
    assert launcher is not None
    await _run(ex, rec, _spec(tmp_path, "a", 0))
    maps = Path(f"/proc/{launcher.pid}/maps").read_text()
    assert "resource.cpython" in maps
    await ex.close()
