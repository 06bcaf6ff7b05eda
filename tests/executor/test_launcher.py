"""The launcher (shim.py --serve): clean start, fallback, restart, and the durability
contract of a launcher that starts and supervises every subjob itself: it outlives its
agent, and a launcher SIGKILLed leaves its subjobs running and recorded, never lost.

Real processes: the agent's Executor, its launcher and the commands.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from test_executor import Recorder, poll_until
from waiting import gate_code, is_gone, until

from laminar_agent import executor as executor_module
from laminar_agent import shim
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


def _fds(pid: int) -> dict[bytes, str]:
    """What each open fd of ``pid`` is (as /proc's links say)."""
    fds = Path(f"/proc/{pid}/fd")
    return {name.name.encode(): os.readlink(name) for name in fds.iterdir()}


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def _run(ex: Executor, rec: Recorder, spec: LaunchSpec) -> int:
    pid = await ex.launch(spec)
    await poll_until(lambda: spec.subjob_id in rec.exits, f"exit of {spec.subjob_id}")
    return pid


async def test_the_launcher_starts_clean_and_starts_the_subjobs_itself(tmp_path: Path) -> None:
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
    gate = tmp_path / "gate-b"
    spec = _spec(tmp_path, "b", 0)
    spec.command = [sys.executable, "-c", gate_code(gate)]
    pid = await ex.launch(spec)
    # No supervisor between them: the launcher's child is the job, its group's leader.
    assert _ppid(pid) == launcher.pid and os.getpgid(pid) == pid
    gate.write_text("")
    await poll_until(lambda: "b" in rec.exits, "exit of b")
    assert rec.exits["b"].exit_code == 0
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
    # An earlier run's launch.json too (a shim's): left there, it would make an adopting
    # agent take this subjob's own process for a shim.
    (sdir / "launch.json").write_text("{}")
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


def _gated(tmp_path: Path, subjob_id: str, code: int) -> tuple[LaunchSpec, Path, Path]:
    """A subjob that marks each run of it, then waits for its gate and exits ``code``."""
    gate, runs = tmp_path / f"gate-{subjob_id}", tmp_path / f"runs-{subjob_id}"
    spec = _spec(tmp_path, subjob_id, code)
    spec.command = [
        sys.executable,
        "-c",
        f"open({str(runs)!r}, 'a').write('ran\\n')\n" + gate_code(gate, code),
    ]
    return spec, gate, runs


async def test_the_launcher_outlives_its_agent_and_records_the_real_exit(
    tmp_path: Path,
) -> None:
    """Its agent gone (stdin EOF, as when the agent is SIGKILLed or reloads), the launcher
    takes no more launches but goes on supervising: the subjob runs on, its real exit
    status lands in exit.json, a new agent re-adopts it by pid and reads it there; then,
    with no subjob left, the launcher exits."""
    state = tmp_path / "state"
    rec_a = Recorder()
    a = Executor(state, on_exit=rec_a)
    spec, gate, runs = _gated(tmp_path, "lives", 9)
    pid = await a.launch(spec)
    launcher = a._launcher
    assert launcher is not None
    launcher_pid = launcher.pid
    started_unix = psutil.Process(pid).create_time()
    await a.close()  # its pipes closed: what a dead agent leaves
    assert not is_gone(pid) and not is_gone(launcher_pid)
    rec_b = Recorder()
    b = Executor(state, on_exit=rec_b)
    assert b.adopt("lives", pid, started_unix)
    gate.write_text("")
    await poll_until(lambda: "lives" in rec_b.exits, "the adopted subjob's end")
    assert rec_b.exits["lives"].exit_code == 9 and rec_b.exits["lives"].error == ""
    assert rec_a.exits == {}
    await poll_until(lambda: is_gone(launcher_pid), "the launcher to exit, its last subjob done")
    assert runs.read_text() == "ran\n"
    await b.close()


async def test_a_launcher_sigterm_stops_launches_not_subjobs(tmp_path: Path) -> None:
    """SIGTERM (systemd stopping the unit, say) is an EOF: the running subjob is not
    signalled; it ends on its own and its status is recorded."""
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    spec, gate, _ = _gated(tmp_path, "term", 5)
    pid = await ex.launch(spec)
    launcher = ex._launcher
    assert launcher is not None
    os.kill(launcher.pid, signal.SIGTERM)
    await poll_until(lambda: _fds(launcher.pid)[b"0"] == os.devnull, "stdin closed")
    assert not is_gone(pid)
    # The next launch goes elsewhere (a shim now), not into a launcher that takes none.
    await _run(ex, rec, _spec(tmp_path, "next", 2))
    assert rec.exits["next"].exit_code == 2
    gate.write_text("")
    await poll_until(lambda: "term" in rec.exits, "exit of term")
    assert rec.exits["term"].exit_code == 5 and rec.exits["term"].signal is None
    await ex.close()


async def test_a_sigkilled_launcher_leaves_its_subjob_running_then_recorded_unknown(
    tmp_path: Path,
) -> None:
    """A launcher SIGKILLed under a running subjob: the subjob runs on (re-parented to
    init, which reaps it and records nothing), is not started again, and once it ends it
    is recorded ended with that cause (exit status unknown), never lost. So is one a
    restarted agent finds still running under no launcher."""
    state = tmp_path / "state"
    rec = Recorder()
    ex = Executor(state, on_exit=rec)
    spec, gate, runs = _gated(tmp_path, "orphan", 3)
    pid = await ex.launch(spec)
    spec2, gate2, runs2 = _gated(tmp_path, "orphan2", 4)
    pid2 = await ex.launch(spec2)
    started2 = psutil.Process(pid2).create_time()
    launcher = ex._launcher
    assert launcher is not None
    os.kill(launcher.pid, signal.SIGKILL)
    await poll_until(lambda: _ppid(pid) != launcher.pid, "the subjob re-parented")
    assert not is_gone(pid) and ex.is_running("orphan")
    gate.write_text("")
    await poll_until(lambda: "orphan" in rec.exits, "the orphan's end")
    info = rec.exits["orphan"]
    assert info.exit_code is None and "exit status unknown" in info.error
    assert runs.read_text() == "ran\n"
    await ex.close()
    # A new agent finds the other one still running, with no launcher to record it.
    rec_b = Recorder()
    b = Executor(state, on_exit=rec_b)
    assert b.adopt("orphan2", pid2, started2)
    gate2.write_text("")
    await poll_until(lambda: "orphan2" in rec_b.exits, "the adopted orphan's end")
    assert rec_b.exits["orphan2"].exit_code is None
    assert "exit status unknown" in rec_b.exits["orphan2"].error
    assert runs2.read_text() == "ran\n"
    await b.close()


async def test_a_subjob_ended_but_not_yet_reaped_is_adopted_and_its_record_awaited(
    tmp_path: Path,
) -> None:
    """A restarted agent that finds a subjob ended but its launcher not done with it
    (a zombie, exit.json not yet written: here the launcher is stopped) adopts it and
    waits for the record instead of taking it as lost."""
    state = tmp_path / "state"
    a = Executor(state, on_exit=Recorder())
    spec, gate, _ = _gated(tmp_path, "late", 6)
    pid = await a.launch(spec)
    launcher = a._launcher
    assert launcher is not None
    launcher_pid = launcher.pid
    started_unix = psutil.Process(pid).create_time()
    await a.close()
    os.kill(launcher_pid, signal.SIGSTOP)
    try:
        gate.write_text("")
        await poll_until(lambda: _state(pid) == "Z", "the subjob to end, unreaped")
        rec = Recorder()
        b = Executor(state, on_exit=rec)
        assert b.adopt("late", pid, started_unix)
        assert b.read_exit("late") is None
    finally:
        os.kill(launcher_pid, signal.SIGCONT)
    await poll_until(lambda: "late" in rec.exits, "the adopted subjob's end")
    assert rec.exits["late"].exit_code == 6 and rec.exits["late"].error == ""
    await b.close()


async def test_an_agent_upgraded_under_a_shim_subjob_adopts_it_and_its_exit(
    tmp_path: Path,
) -> None:
    """A subjob started under a shim of its own (an older agent's way, and the fallback
    without a launcher) is re-adopted by an agent that uses the launcher: its pid is the
    shim's, which writes exit.json before it exits, and a stop spares the shim."""
    state = tmp_path / "state"
    old = Executor(state, on_exit=Recorder(), use_launcher=False)
    spec, gate, runs = _gated(tmp_path, "old", 8)
    pid = await old.launch(spec)
    started_unix = psutil.Process(pid).create_time()
    await old.close()
    rec = Recorder()
    new = Executor(state, on_exit=rec)
    assert new.adopt("old", pid, started_unix)
    assert not new._tracked["old"].is_job  # the shim leads the group, not the job
    gate.write_text("")
    await poll_until(lambda: "old" in rec.exits, "the adopted shim's subjob to end")
    assert rec.exits["old"].exit_code == 8 and rec.exits["old"].error == ""
    assert runs.read_text() == "ran\n"
    await new.close()


def _open_writer(path: Path, opened: list[int]) -> bool:
    """Open FIFO ``path`` for writing once someone is reading it (appended to ``opened``)."""
    try:
        opened.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        return False
    return True


async def test_a_subjob_is_kept_unreaped_while_its_cgroup_drains_so_a_new_agent_adopts_it(
    tmp_path: Path,
) -> None:
    """The launcher reaps a subjob only once its cgroup has drained and then writes its
    exit.json at once: meanwhile the subjob is a zombie with the launcher as parent, so an
    agent restarted during the drain adopts it and gets its real exit status (reaped
    first, it would find no process and no record, and the subjob would be lost). Its run
    time ends when it ended, not when its cgroup was gone.

    The cgroup is a plain folder here: the child joins it by writing to /dev/null, it
    cannot be removed while the test keeps files in it (it drains), and its memory.peak is
    a FIFO, so the launcher's read of it tells the test the launcher has seen the end."""
    cgroups = SubjobCgroups(tmp_path / "cgroups")
    cgroup = cgroups.path("drains")
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").symlink_to(os.devnull)
    os.mkfifo(cgroup / "memory.peak")
    state = tmp_path / "state"
    a = Executor(state, on_exit=Recorder(), cgroups=cgroups)
    spec, gate, runs = _gated(tmp_path, "drains", 9)
    before = time.monotonic()
    pid = await a.launch(spec)
    started_unix = psutil.Process(pid).create_time()
    await a.close()
    opened: list[int] = []
    try:
        gate.write_text("")
        await until(lambda: _open_writer(cgroup / "memory.peak", opened))
        seen = time.monotonic()  # the launcher has seen the subjob end, and drains
        os.write(opened[0], b"0\n")
        os.close(opened.pop())
        rec = Recorder()
        b = Executor(state, on_exit=rec, cgroups=cgroups)
        assert b.adopt("drains", pid, started_unix)
        assert b.read_exit("drains") is None
        # The cgroup drains for a while (a stretch of wall time, not a synchronisation).
        await until(lambda: time.monotonic() > seen + 1.0)
        assert "drains" not in rec.exits and _state(pid) == "Z"
    finally:
        for fd in opened:
            os.close(fd)
        (cgroup / "cgroup.procs").unlink()
        (cgroup / "memory.peak").unlink()
    await poll_until(lambda: "drains" in rec.exits, "the drained subjob's record")
    info = rec.exits["drains"]
    assert info.exit_code == 9 and info.error == ""
    assert 0 < info.run_seconds <= seen - before
    assert not cgroup.exists() and is_gone(pid)
    assert runs.read_text() == "ran\n"
    await b.close()


def _free_below(taken: set[int], count: int) -> int:
    """A descriptor limit that leaves exactly ``count`` numbers free below it."""
    limit, free = 0, 0
    while free < count or limit <= max(taken):
        if limit not in taken:
            free += 1
            if free > count:
                break
        limit += 1
    return limit


async def test_a_launcher_out_of_descriptors_answers_an_error_and_goes_on(
    tmp_path: Path,
) -> None:
    """No descriptor left for a launch's pipe (EMFILE): that launch is answered with an
    error (the agent starts a shim for it), its log descriptors are closed, and the
    launcher goes on, with every other subjob's record."""
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    launcher = ex._launcher
    assert launcher is not None
    spec, gate, _ = _gated(tmp_path, "running", 2)
    running = await ex.launch(spec)
    launcher_pid = launcher.pid
    assert _ppid(running) == launcher_pid
    idle = _fds(launcher_pid)
    # Room for a launch's two logs, none for its pipe.
    limit = _free_below({int(fd) for fd in idle}, 2)
    old = resource.prlimit(launcher_pid, resource.RLIMIT_NOFILE)
    resource.prlimit(launcher_pid, resource.RLIMIT_NOFILE, (limit, old[1]))  # the soft limit
    try:
        pid = await ex.launch(_spec(tmp_path, "starved", 4))
        assert _ppid(pid) == os.getpid()  # a shim, started by the agent itself
        await poll_until(lambda: "starved" in rec.exits, "exit of starved")
        assert rec.exits["starved"].exit_code == 4
        resource.prlimit(launcher_pid, resource.RLIMIT_NOFILE, old)
        assert launcher.pid == launcher_pid and launcher.starts == 1 and not launcher.is_broken
        starved = str(ex.subjob_dir("starved"))
        assert not [fd for fd in _fds(launcher_pid).values() if fd.startswith(starved)]
    finally:
        gate.write_text("")
    await poll_until(lambda: "running" in rec.exits, "exit of running")
    assert rec.exits["running"].exit_code == 2
    pid = await _run(ex, rec, _spec(tmp_path, "after", 3))
    assert rec.exits["after"].exit_code == 3 and launcher.starts == 1
    await ex.close()


#: An older agent's supervisor as its launcher forked it (e2a51cd): the launcher's own
#: command line (``shim.py --serve``), no launch.json, its own session; it runs the
#: subjob's command as a shim does and writes exit.json. Here it is this shim's ``run``,
#: loaded from a file whose path ends as the shim's does.
_OLD_SUPERVISOR = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("shim", {shim!r})
shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shim)
record = json.loads(sys.stdin.readline())
sys.exit(shim.run(record["dir"], record))
"""


def _spawn_old_supervisor(script: Path, record: Path, sdir: Path) -> int:
    """Start ``script`` as an older launcher's supervisor was: ``python -I -S ... --serve``
    in a session of its own, the launch record on stdin, its logs on stdout and stderr."""
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    return os.posix_spawn(
        sys.executable,
        [sys.executable, "-I", "-S", str(script), "--serve"],
        executor_module.SHIM_ENV,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, str(record), os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(sdir / "stdout"), append, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, str(sdir / "stderr"), append, 0o600),
        ],
        setsid=True,
    )


def _reap_if_ours(pid: int) -> None:
    """Reap ``pid`` if it is an ended child not reaped yet (the adopting agent reaps it)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


async def test_an_older_launchers_supervisor_is_adopted_as_a_shim_and_spared(
    tmp_path: Path,
) -> None:
    """A supervisor forked by an older launcher carries the launcher's command line
    (``--serve``) and has no launch.json; its launcher has ended (with its agent), so its
    parent is no launcher. It is adopted as a shim: a kill ends the command, not the
    supervisor, which records how the command ended."""
    state = tmp_path / "state"
    ex = Executor(state, on_exit=Recorder())
    sdir = ex.subjob_dir("older")
    sdir.mkdir(parents=True)
    script = tmp_path / "old" / "laminar_agent" / "shim.py"
    script.parent.mkdir(parents=True)
    script.write_text(_OLD_SUPERVISOR.format(shim=executor_module.SHIM_PATH))
    spec, gate, runs = _gated(tmp_path, "older", 0)
    record = tmp_path / "record"
    record.write_text(
        json.dumps({"dir": str(sdir), "command": spec.command, "env": {}, "cwd": str(tmp_path)})
        + "\n"
    )
    pid = _spawn_old_supervisor(script, record, sdir)
    rec = Recorder()
    new = Executor(state, on_exit=rec)
    try:
        await poll_until(lambda: runs.exists(), "the older supervisor's command to run")
        assert not (sdir / "launch.json").exists()
        assert new.adopt("older", pid, psutil.Process(pid).create_time())
        assert not new._tracked["older"].is_job  # the supervisor leads the group
        new.kill("older")
        await poll_until(lambda: "older" in rec.exits, "the adopted supervisor's record")
        assert rec.exits["older"].signal == signal.SIGKILL
        assert rec.exits["older"].error == ""  # written by the supervisor, which lived on
    finally:
        gate.write_text("")
        await until(lambda: is_gone(pid))
        _reap_if_ours(pid)
    await new.close()
    await ex.close()


async def test_an_exit_notice_names_its_subjob_so_a_reused_pid_is_not_misrouted() -> None:
    """``x PID ID``: a notice for an earlier subjob is never taken for a later one the
    kernel gave the same pid."""
    launcher = executor_module.Launcher(sys.executable)
    loop = asyncio.get_running_loop()
    read, write = os.pipe()
    os.set_blocking(read, False)
    launcher._from = read
    loop.add_reader(read, launcher._on_readable)
    try:
        later = asyncio.create_task(launcher.wait_exit("later"))
        os.write(write, b"x 4242 earlier\n")
        assert await asyncio.wait_for(launcher.wait_exit("earlier"), 5)
        assert not later.done()
        os.write(write, b"x 4242 later\n")
        assert await asyncio.wait_for(later, 5)
    finally:
        loop.remove_reader(read)
        launcher._from = -1
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("use_launcher", [True, False])
async def test_a_launch_keeps_its_process_start_time_not_when_its_answer_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_launcher: bool
) -> None:
    """The identity kept against pid reuse is the process's own (its boot and start tick),
    whatever the clock read when its answer came (a lagging loop, here a clock 5 s ahead):
    its own process must not look like another one later."""
    real = time.time
    clock = SimpleNamespace(time=lambda: real() + 5.0, monotonic=time.monotonic)
    monkeypatch.setattr(executor_module, "time", clock)
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec, use_launcher=use_launcher)
    spec, gate, _ = _gated(tmp_path, "lagged", 0)
    pid = await ex.launch(spec)
    try:
        identity = ex._tracked["lagged"].identity
        assert identity and identity == executor_module._process_start(pid)
        assert identity == f"{_boot_id()}:{_start_tick(pid)}"
    finally:
        gate.write_text("")
    await poll_until(lambda: "lagged" in rec.exits, "exit of lagged")
    await ex.close()


def test_a_process_identity_is_its_boot_and_start_tick() -> None:
    """``_process_start`` reads only ``/proc/PID/stat`` (no wall-clock time, which two
    agent processes may read a second apart): this boot's id and the process's start in
    clock ticks, the same for every reader; a gone pid has none."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for pid in (os.getpid(), os.getppid(), child.pid):
            assert executor_module._process_start(pid) == f"{_boot_id()}:{_start_tick(pid)}"
    finally:
        child.kill()
        child.wait()
    assert executor_module._process_start(child.pid) == ""


def _boot_id() -> str:
    return Path(executor_module.BOOT_ID_PATH).read_text().strip()


def _start_tick(pid: int) -> int:
    """Field 22 of ``/proc/PID/stat`` (proc(5)): the process's start in clock ticks."""
    data = Path(f"/proc/{pid}/stat").read_text()
    return int(data[data.rfind(")") + 2 :].split()[19])


def test_an_ended_subjobs_cgroup_is_removed_before_anything_is_read_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a subjob's end its cgroup is removed; what is left is killed only when the
    removal fails, through ``cgroup.kill`` (``cgroup.procs`` is read only on a kernel
    without it). Plain folders stand in for cgroups: a folder with files cannot be
    removed, as a cgroup with processes cannot."""
    cgroups = SubjobCgroups(tmp_path / "cgroups")
    read: list[str] = []
    pids = shim.cgroup_pids

    def counted(cgroup: str) -> list[int]:
        read.append(os.path.basename(cgroup))
        return pids(cgroup)

    monkeypatch.setattr(shim, "cgroup_pids", counted)
    cgroups.path("empty").mkdir(parents=True)
    cgroups.clear("empty")
    cgroups.clear("gone")  # its launcher removed it already
    assert not cgroups.path("empty").exists() and not cgroups.path("gone").exists()
    busy = cgroups.path("busy")
    busy.mkdir()
    (busy / "cgroup.procs").write_text("4242\n")
    (busy / "cgroup.kill").write_text("")  # as the kernel has it
    cgroups.clear("busy")
    assert (busy / "cgroup.kill").read_text() == "1" and read == []
    # A kernel without cgroup.kill (here: a folder in its place) gets each process killed.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    old = cgroups.path("old")
    (old / "cgroup.kill").mkdir(parents=True)
    (old / "cgroup.procs").write_text(f"{child.pid}\n")
    cgroups.clear("old")
    assert read == ["old"] and child.wait(timeout=30) == -signal.SIGKILL


async def test_a_launch_answer_that_never_comes_times_out_and_voids_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for the launcher's answer is bounded by ``LAUNCHER_TIMEOUT_SECONDS`` itself
    (a launcher that reads the record and never answers): the launch fails naming the
    timeout, and is void."""
    answered = asyncio.Event()

    async def silent(self: executor_module.Launcher) -> str:
        try:
            await asyncio.Future()  # never answered
        finally:
            answered.set()  # the wait was given up (cancelled), not left behind
        return ""

    monkeypatch.setattr(executor_module, "LAUNCHER_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(executor_module.Launcher, "_readline", silent)
    ex = Executor(tmp_path / "state", on_exit=Recorder())
    with pytest.raises(executor_module.LaunchUnanswered, match="no answer within"):
        await ex.launch(_spec(tmp_path, "silent", 0))
    assert answered.is_set()
    assert (ex.subjob_dir("silent") / "void").exists() and "silent" not in ex._tracked
    await ex.close()
