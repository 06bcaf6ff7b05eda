"""The pre-forked launcher (shim.py --serve): clean start, fallback, restart.

Real processes: the agent's Executor, its launcher, supervisors and commands.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
from test_executor import Recorder, poll_until
from waiting import gate_code

from laminar_agent import executor as executor_module
from laminar_agent.cgroups import SubjobCgroups
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


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


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
    # Ended (its pipes closed) before the next record is sent: a launcher killed only
    # after the record reached it may have started the subjob, and that launch fails.
    await poll_until(lambda: _state(first) == "Z", "the launcher to end")
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
    gate = tmp_path / "gate"
    spec = _spec(tmp_path, "direct", 0)
    spec.command = [sys.executable, "-c", gate_code(gate)]
    pid = await ex.launch(spec)
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    keys = {item.partition(b"=")[0].decode() for item in env if item}
    assert not keys & {"PYTHONPATH", "LD_PRELOAD"}, keys
    assert _ppid(pid) == os.getpid()  # our own child: no launcher in between
    gate.write_text("")
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


async def test_a_launch_sends_the_record_and_the_supervisor_makes_the_folder(
    tmp_path: Path,
) -> None:
    """The agent writes no file to launch: the supervisor makes the subjob's folder (a
    stale exit record of an earlier run of the same id goes) and the record travels over
    the launcher's pipe, so no launch.json is left on disk."""
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    sdir = ex.subjob_dir("again")
    sdir.mkdir(parents=True)
    (sdir / "exit.json").write_text('{"exit_code": 99}')
    spec = _spec(tmp_path, "again", 0)
    gate = tmp_path / "gate2"
    spec.command = [sys.executable, "-c", gate_code(gate)]
    await ex.launch(spec)
    assert not (sdir / "exit.json").exists()  # gone before the pid was answered
    assert not (sdir / "launch.json").exists()
    gate.write_text("")
    await poll_until(lambda: "again" in rec.exits, "exit of again")
    assert rec.exits["again"].exit_code == 0
    fresh = ex.subjob_dir("fresh")
    await _run(ex, rec, _spec(tmp_path, "fresh", 7))
    assert rec.exits["fresh"].exit_code == 7
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o700)
    assert ex._launcher is not None and ex._launcher.starts == 1
    await ex.close()


async def test_a_folder_that_cannot_be_made_fails_the_launch_not_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor answers an error (no pid to watch): the launch fails with its
    reason, and no shim tries the same again. The launcher stays in use for the next
    launch."""
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "subjobs").write_text("not a folder")
    direct: list[Path] = []

    def shim_directly(self: Executor, sdir: Path, launch: dict[str, object]) -> tuple[int, str]:
        direct.append(sdir)
        raise OSError("tried again")

    monkeypatch.setattr(Executor, "_launch_shim", shim_directly)
    with pytest.raises(OSError, match="error supervisor:"):
        await ex.launch(_spec(tmp_path, "nowhere", 0))
    assert direct == []
    monkeypatch.undo()
    launcher = ex._launcher
    assert launcher is not None and launcher.pid > 0 and not launcher.is_broken
    (tmp_path / "state" / "subjobs").unlink()
    await _run(ex, rec, _spec(tmp_path, "somewhere", 3))
    assert rec.exits["somewhere"].exit_code == 3
    assert launcher.starts == 1
    await ex.close()


@pytest.mark.parametrize("use_launcher", [True, False])
async def test_a_cgroup_that_cannot_be_made_is_a_warning_not_a_failure(
    tmp_path: Path, use_launcher: bool, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    cgroups = SubjobCgroups(tmp_path / "no-such-hierarchy" / "laminar.a")
    ex = Executor(tmp_path / "state", on_exit=rec, cgroups=cgroups, use_launcher=use_launcher)
    with caplog.at_level(logging.WARNING, logger="laminar_agent.executor"):
        await _run(ex, rec, _spec(tmp_path, "loose", 5))
    assert rec.exits["loose"].exit_code == 5
    assert "subjob loose runs without a cgroup" in caplog.text
    await ex.close()


async def test_a_launch_whose_answer_never_comes_fails_and_nothing_of_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record reached the launcher, so its supervisor may start the subjob late: the
    launch fails (naming the timeout), starts no shim for the same id (that would run it
    twice), and is void, so the late supervisor runs nothing of it. The supervisor is
    held here after its answer by its stdout being a FIFO nobody reads: it starts its
    child only once the test opens the FIFO, after the agent gave up."""

    async def no_answer(self: executor_module.Launcher) -> str:
        raise TimeoutError

    monkeypatch.setattr(executor_module.Launcher, "_readline", no_answer)
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    runs = tmp_path / "runs"
    spec = _spec(tmp_path, "once", 0)
    spec.command = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('ran\\n')"]
    sdir = ex.subjob_dir("once")
    sdir.mkdir(parents=True)
    os.mkfifo(sdir / "stdout")
    with pytest.raises(executor_module.LaunchUnanswered, match="no answer within"):
        await ex.launch(spec)
    launcher = ex._launcher
    assert launcher is not None and launcher.is_broken and launcher.pid == 0
    assert "once" not in ex._tracked
    assert not (sdir / "launch.json").exists()  # no direct shim was started
    assert (sdir / "void").exists()
    # Let the late supervisor go on: it reaches its child, which finds the launch void.
    fifo = os.open(sdir / "stdout", os.O_RDONLY | os.O_NONBLOCK)
    try:
        await poll_until(lambda: (sdir / "exit.json").exists(), "the supervisor's exit record")
    finally:
        os.close(fifo)
    assert not runs.exists()
    record = ex.read_exit("once")
    assert record is not None and record.exit_code == 127
    assert "gave up on it" in (record.error or "")
    await ex.close()


async def test_a_cancelled_launch_stops_the_launcher_so_its_answer_is_nobody_elses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after the record was sent: the launcher's late answer would be read as
    the next launch's (another subjob's pid). It is stopped; the next launch gets a fresh
    launcher and its own supervisor."""
    waiting = asyncio.Event()
    readline = executor_module.Launcher._readline

    async def stuck(self: executor_module.Launcher) -> str:
        waiting.set()
        await asyncio.Future()  # never answered
        return ""

    monkeypatch.setattr(executor_module.Launcher, "_readline", stuck)
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    launcher = ex._launcher
    assert launcher is not None
    task = asyncio.create_task(ex.launch(_spec(tmp_path, "cancelled", 0)))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert launcher.pid == 0 and not launcher.is_broken
    monkeypatch.setattr(executor_module.Launcher, "_readline", readline)
    gate = tmp_path / "gate"
    spec = _spec(tmp_path, "next", 0)
    spec.command = [sys.executable, "-c", gate_code(gate, 4)]
    pid = await ex.launch(spec)
    assert launcher.starts == 2 and _ppid(pid) == launcher.pid
    gate.write_text("")
    await poll_until(lambda: "next" in rec.exits, "exit of next")
    assert rec.exits["next"].exit_code == 4
    await ex.close()
