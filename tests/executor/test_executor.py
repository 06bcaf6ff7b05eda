"""Executor tests with real subjob processes under the shim."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from laminar_agent import executor as executor_module
from laminar_agent.executor import Executor, ExitInfo, LaunchSpec
from laminar_agent.shim import FENCE_GRACE_SECONDS, fence_step
from laminar_base.errors import InvalidArgument, NotFound

DEADLINE_SECONDS = 20.0


async def poll_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Recorder:
    def __init__(self) -> None:
        self.exits: dict[str, ExitInfo] = {}

    async def __call__(self, subjob_id: str, info: ExitInfo) -> None:
        self.exits[subjob_id] = info


def make_spec(tmp_path: Path, subjob_id: str, code: str, **kw: object) -> LaunchSpec:
    return LaunchSpec(
        subjob_id=subjob_id,
        job_id="job-1",
        command=[sys.executable, "-c", code],
        env=kw.pop("env", {}),  # type: ignore[arg-type]
        workdir=str(tmp_path),
        device_uuids=["GPU-aaa", "GPU-bbb"],
        **kw,  # type: ignore[arg-type]
    )


ENV_DUMP = (
    "import json, os, sys\n"
    "print(json.dumps({k: v for k, v in os.environ.items()"
    " if k.startswith('LAMINAR_')"
    " or k in ('CUDA_VISIBLE_DEVICES', 'USER_VAR', 'GRPC_ENABLE_FORK_SUPPORT')}))\n"
    "x = bytearray(20 * 1024 * 1024)\n"
    "sys.exit(3)\n"
)


async def test_launch_reports_exit_env_stdout_and_rss(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    spec = make_spec(
        tmp_path,
        "s1",
        ENV_DUMP,
        env={"USER_VAR": "u", "CUDA_VISIBLE_DEVICES": "evil", "LAMINAR_JOB_ID": "evil"},
        unit_start=5,
        unit_count=7,
        checkpoint_dir="/ckpt",
    )
    pid = await ex.launch(spec)
    assert pid > 0
    await poll_until(lambda: "s1" in rec.exits, "exit of s1")
    info = rec.exits["s1"]
    assert info.exit_code == 3
    assert info.signal is None
    assert info.peak_rss_bytes > 20 * 1024 * 1024
    assert not ex.is_running("s1")
    env = json.loads((ex.subjob_dir("s1") / "stdout").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaa,GPU-bbb"
    assert env["LAMINAR_JOB_ID"] == "job-1"
    assert env["LAMINAR_SUBJOB_ID"] == "s1"
    assert env["LAMINAR_UNIT_START"] == "5"
    assert env["LAMINAR_UNIT_COUNT"] == "7"
    assert env["LAMINAR_CHECKPOINT_DIR"] == "/ckpt"
    assert env["LAMINAR_GPU_MEM_FILE"] == str(ex.subjob_dir("s1") / "gpu_mem")
    assert env["USER_VAR"] == "u"
    # The agent's own gRPC setting (laminar_base sets it in this process too) is not the job's.
    assert os.environ["GRPC_ENABLE_FORK_SUPPORT"] == "0"
    assert "GRPC_ENABLE_FORK_SUPPORT" not in env
    assert ex.read_exit("s1") == info
    await ex.close()


async def test_bad_command_records_127(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    spec = make_spec(tmp_path, "bad", "")
    spec.command = ["/nonexistent/definitely-not-here"]
    await ex.launch(spec)
    await poll_until(lambda: "bad" in rec.exits, "exit of bad")
    assert rec.exits["bad"].exit_code == 127
    assert "definitely-not-here" in rec.exits["bad"].error
    await ex.close()


async def test_missing_workdir_is_found_by_the_subjob_not_the_agent(tmp_path: Path) -> None:
    """The working directory is the job's path: it is entered by the child after it took
    the job's identity, so a missing one ends the subjob with an error naming it."""
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    spec = make_spec(tmp_path, "wd", "pass")
    spec.workdir = str(tmp_path / "missing")
    await ex.launch(spec)
    await poll_until(lambda: "wd" in rec.exits, "exit of wd")
    assert rec.exits["wd"].exit_code == 127
    assert "missing" in rec.exits["wd"].error
    await ex.close()


async def test_invalid_specs_name_the_field(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state", on_exit=Recorder())
    spec = make_spec(tmp_path, "e", "")
    spec.command = []
    with pytest.raises(InvalidArgument) as ei:
        await ex.launch(spec)
    assert ei.value.field == "command"
    spec = make_spec(tmp_path, "e", "pass")
    spec.workdir = "relative/dir"
    with pytest.raises(InvalidArgument) as ei:
        await ex.launch(spec)
    assert ei.value.field == "workdir"
    for bad_id in ("../escape", "", ".."):
        spec = make_spec(tmp_path, bad_id, "pass")
        with pytest.raises(InvalidArgument) as ei:
            await ex.launch(spec)
        assert ei.value.field == "subjob_id"
    with pytest.raises(NotFound) as nf:
        ex.suspend("nope")
    assert nf.value.field == "subjob_id"
    await ex.close()


SLEEPER = (
    "import signal, sys, time, pathlib\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path('ready').write_text('1')\n"
    "while True: time.sleep(0.05)\n"
)


def child_of(pid: int) -> psutil.Process:
    kids = psutil.Process(pid).children()
    assert len(kids) == 1
    return kids[0]


async def test_suspend_resume_and_terminate_escalates(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    pid = await ex.launch(make_spec(tmp_path, "s2", SLEEPER))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    child = psutil.Process(pid)  # the job itself, its group's leader: no shim in between
    assert child.ppid() == ex._launcher.pid and os.getpgid(pid) == pid  # type: ignore[union-attr]
    ex.suspend("s2")
    await poll_until(lambda: child.status() == psutil.STATUS_STOPPED, "child stopped")
    ex.resume("s2")
    await poll_until(lambda: child.status() != psutil.STATUS_STOPPED, "child resumed")
    ex.release_memory("s2")  # the child dies from SIGUSR1 by default
    await poll_until(lambda: "s2" in rec.exits, "exit after SIGUSR1")
    assert rec.exits["s2"].signal == 10

    (tmp_path / "ready").unlink()
    pid = await ex.launch(make_spec(tmp_path, "s3", SLEEPER))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    assert ex.is_running("s3")
    ex.suspend("s3")  # terminate must also work on a stopped group
    started = time.monotonic()
    await ex.terminate("s3", grace_seconds=0.5)
    assert time.monotonic() - started >= 0.5
    assert rec.exits["s3"].signal == 9
    assert not ex.is_running("s3")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    await ex.close()


async def test_terminate_graceful_child_exits_before_grace(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    code = "import pathlib, time\npathlib.Path('ready').write_text('1')\ntime.sleep(60)\n"
    await ex.launch(make_spec(tmp_path, "g", code))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    await ex.terminate("g", grace_seconds=30.0)
    info = rec.exits["g"]
    assert info.signal == 15  # child died of SIGTERM; shim survived and wrote exit.json
    assert info.error == ""
    await ex.close()


async def test_adopt_after_restart_reads_exit_json(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rec_a = Recorder()
    a = Executor(state, on_exit=rec_a)
    code = (
        "import os, pathlib, sys, time\n"
        "pathlib.Path('ready').write_text('1')\n"
        "while not os.path.exists('go'): time.sleep(0.02)\n"
        "sys.exit(42)\n"
    )
    pid = await a.launch(make_spec(tmp_path, "ad", code))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    started_unix = psutil.Process(pid).create_time()
    await a.close()  # must not kill the subjob
    assert psutil.Process(pid).is_running()

    rec_b = Recorder()
    b = Executor(state, on_exit=rec_b)
    assert not b.adopt("ad", pid, started_unix + 100.0)  # wrong start time: not ours
    assert b.adopt("ad", pid, started_unix)
    assert b.is_running("ad")
    (tmp_path / "go").write_text("1")
    await poll_until(lambda: "ad" in rec_b.exits, "adopted exit")
    assert rec_b.exits["ad"].exit_code == 42
    assert rec_a.exits == {}
    assert not b.adopt("gone", os.getpid() + 10_000_000, started_unix)
    await b.close()


async def test_adopt_compares_the_pids_own_start_not_the_subjobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the pid's identity as read at its launch journaled (this boot, its start tick),
    adopt compares that: a subjob whose start (its launch's answer) lags its process by
    seconds is still adopted, also by an agent whose boot time reads a second apart (the
    kernel recomputes it from the wall clock at each read); a process that started a tick
    away, or in another boot, is a reused pid, refused even where the subjob's start is
    within a second."""
    state = tmp_path / "state"
    a = Executor(state, on_exit=Recorder())
    code = (
        "import os, pathlib, time\n"
        "pathlib.Path('ready').write_text('1')\n"
        "while not os.path.exists('go'): time.sleep(0.02)\n"
    )
    pid = await a.launch(make_spec(tmp_path, "lag", code))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    pid_start = a.pid_start("lag")
    boot, ticks = pid_start.rsplit(":", 1)
    assert boot == Path(executor_module.BOOT_ID_PATH).read_text().strip()
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert int(ticks) == int(stat[stat.rfind(")") + 2 :].split()[19])  # field 22: start tick
    started = psutil.Process(pid).create_time()
    assert a.pid_start("unknown") == ""
    await a.close()  # must not kill the subjob

    # The restarted agent reads the boot time a second later than the first did.
    monkeypatch.setattr(psutil, "boot_time", lambda: started + 1.0)
    rec = Recorder()
    b = Executor(state, on_exit=rec)
    try:
        assert not b.adopt("lag", pid, started, pid_start=f"{boot}:{int(ticks) - 1}")
        assert not b.adopt("lag", pid, started, pid_start=f"{boot}:{int(ticks) + 1}")
        assert not b.adopt("lag", pid, started, pid_start=f"another-boot:{ticks}")
        assert not b.adopt("lag", pid, started + 5.0)  # no pid start: 1 s on the start
        assert b.adopt("lag", pid, started + 5.0, pid_start=pid_start)
        assert b.is_running("lag")
    finally:
        (tmp_path / "go").write_text("1")
    await poll_until(lambda: "lag" in rec.exits, "adopted exit")
    assert rec.exits["lag"].exit_code == 0
    await b.close()


async def test_terminate_sweeps_stragglers_in_the_group(tmp_path: Path) -> None:
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    code = (
        "import pathlib, subprocess, sys, time\n"
        "gc = ('import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);'"
        " 'time.sleep(60)')\n"
        "p = subprocess.Popen([sys.executable, '-c', gc])\n"
        "pathlib.Path('gc.pid').write_text(str(p.pid))\n"
        "pathlib.Path('ready').write_text('1')\n"
        "time.sleep(60)\n"
    )
    await ex.launch(make_spec(tmp_path, "st", code))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    grandchild = psutil.Process(int((tmp_path / "gc.pid").read_text()))
    await ex.terminate("st", grace_seconds=30.0)
    assert rec.exits["st"].signal == 15
    await poll_until(
        lambda: not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE,
        "grandchild killed",
    )
    await ex.close()


async def test_a_stop_sent_while_the_shim_starts_is_not_lost(tmp_path: Path) -> None:
    # SIGTERM right after launch can reach the shim before it has forked the command;
    # it must still end the command by SIGTERM, not hang until the grace runs out.
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec)
    for i in range(40):  # stops 0-78 ms after launch cover the shim's start-up
        subjob_id = f"early-{i}"
        await ex.launch(make_spec(tmp_path, subjob_id, "import time; time.sleep(120)"))
        await asyncio.sleep(i * 0.002)
        await ex.terminate(subjob_id, grace_seconds=5.0)
        await poll_until(lambda s=subjob_id: s in rec.exits, "the exit record")
        # Ended by the SIGTERM itself: a lost stop shows as SIGKILL (9) after the grace.
        assert rec.exits[subjob_id].signal == 15, rec.exits[subjob_id]
    await ex.close()


async def test_the_shim_stops_a_fenced_subjob_once_the_fence_deadline_passes(
    tmp_path: Path,
) -> None:
    """The agent's fence file holds a CLOCK_MONOTONIC deadline; past it the shim (outside
    the agent) stops fenced subjobs and says so, and leaves unfenced ones alone."""
    rec = Recorder()
    fence = tmp_path / "fence"
    ex = Executor(tmp_path / "state", on_exit=rec, fence_file=fence)
    fence.write_text(f"{time.monotonic() + 600}\n")
    sleeper = "import time\ntime.sleep(120)\n"
    await ex.launch(make_spec(tmp_path, "fenced", sleeper, grace_seconds=1.0))
    await ex.launch(make_spec(tmp_path, "fenced-too", sleeper, grace_seconds=1.0))
    await ex.launch(make_spec(tmp_path, "free", sleeper, fenced=False))
    await poll_until(lambda: ex.pid_of("fenced") is not None, "fenced started")
    assert "fenced" not in rec.exits  # a deadline ahead keeps it running
    fence.write_text(f"{time.monotonic() - 1}\n")
    # Every fenced subjob is stopped at one look (the fence file is read once for all).
    await poll_until(lambda: {"fenced", "fenced-too"} <= set(rec.exits), "fenced stopped")
    for name in ("fenced", "fenced-too"):
        info = rec.exits[name]
        assert info.fenced and info.signal == signal.SIGTERM
    assert ex.is_running("free")
    await ex.terminate("free", grace_seconds=1.0)
    assert not rec.exits["free"].fenced
    await ex.close()


async def test_a_garbled_fence_counts_as_expired_and_no_fence_as_none(tmp_path: Path) -> None:
    rec = Recorder()
    fence = tmp_path / "fence"
    ex = Executor(tmp_path / "state", on_exit=rec, fence_file=fence)
    await ex.launch(make_spec(tmp_path, "quick", "print('done')"))
    await poll_until(lambda: "quick" in rec.exits, "quick done")
    assert rec.exits["quick"].exit_code == 0 and not rec.exits["quick"].fenced
    fence.write_text("not a number")
    await ex.launch(make_spec(tmp_path, "g", "import time\ntime.sleep(120)\n", grace_seconds=1.0))
    await poll_until(lambda: "g" in rec.exits, "garbled fence stops it")
    assert rec.exits["g"].fenced
    await ex.close()


class LateCgroup:
    """A subjob cgroup the child has not joined yet, then has (``pids`` set by the test)."""

    def __init__(self) -> None:
        self.pids_now: list[int] = []

    def pids(self, subjob_id: str) -> list[int]:
        return list(self.pids_now)

    def kill(self, subjob_id: str) -> bool:
        return False


async def test_a_resume_reaches_a_shim_stopped_before_its_child_joined_the_cgroup(
    tmp_path: Path,
) -> None:
    """Airlock may suspend a subjob milliseconds after launch, before the child is in its
    cgroup: the stop then goes to the whole process group, shim included. The resume, sent
    when the cgroup lists the child, must continue the shim too, or the shim never records
    the subjob's end (seen as a subjob RUNNING for ever in `laminar bench airlock`)."""
    rec = Recorder()
    cgroup = LateCgroup()
    # A shim per subjob: the fallback where the launcher cannot be used. (The launcher
    # answers right after the fork, so a stop can reach the group before its child joined
    # the cgroup too; but no shim is in that group, only the job, and the launcher that
    # records the end is outside it.)
    ex = Executor(tmp_path / "state", on_exit=rec, use_launcher=False)
    pid = await ex.launch(make_spec(tmp_path, "s4", SLEEPER))
    await poll_until(lambda: (tmp_path / "ready").exists(), "child ready")
    shim, child = psutil.Process(pid), child_of(pid)
    ex.cgroups = cgroup  # type: ignore[assignment]  # signals go the cgroup way from here
    ex.suspend("s4")  # the cgroup lists nobody yet: the group is stopped, shim included
    await poll_until(lambda: shim.status() == psutil.STATUS_STOPPED, "shim stopped")
    cgroup.pids_now = [child.pid]
    ex.resume("s4")
    await poll_until(lambda: shim.status() != psutil.STATUS_STOPPED, "shim continued")
    await poll_until(lambda: child.status() != psutil.STATUS_STOPPED, "child continued")
    ex.cgroups = None
    await ex.terminate("s4", grace_seconds=5)
    assert "s4" in rec.exits
    await ex.close()


def _spawn_exit_3() -> int:
    return os.posix_spawn("/bin/sh", ["sh", "-c", "exit 3"], {})


def _spawn_orphan() -> int:
    """A shell that starts a sleeper in the background and exits: the sleeper is
    re-parented away from us, so it is not our child. Returns the sleeper's pid."""
    read_end, write_end = os.pipe()
    shell = os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", "sleep 0.3 & echo $!"],
        {"PATH": "/usr/bin:/bin"},
        file_actions=[(os.POSIX_SPAWN_DUP2, write_end, 1)],
    )
    os.close(write_end)
    with os.fdopen(read_end) as out:
        sleeper = int(out.readline())
    os.waitpid(shell, 0)
    return sleeper


async def test_waiting_for_a_child_or_for_another_process_by_pidfd() -> None:
    """Our own child yields its wait status; a process that is not our child (as a
    supervisor the launcher forked) yields None once it has ended."""
    from laminar_agent.executor import _wait_child

    status = await asyncio.wait_for(_wait_child(_spawn_exit_3()), 30)
    assert status is not None and os.WEXITSTATUS(status) == 3
    sleeper = _spawn_orphan()
    assert await asyncio.wait_for(_wait_child(sleeper), 30) is None
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == "zombie"


def test_a_fence_step_stops_once_then_kills_after_the_grace() -> None:
    """The fence's steps, as the shim's wait and the launcher's loop take them: nothing
    before the fence passes; past it SIGCONT and SIGTERM once; SIGKILL once the grace (at
    most FENCE_GRACE_SECONDS) is over."""
    cont, term, kill = int(signal.SIGCONT), int(signal.SIGTERM), int(signal.SIGKILL)
    assert fence_step(0.0, False, 10.0, 100.0) == (0.0, ())
    assert fence_step(0.0, True, 10.0, 100.0) == (100.0, (cont, term))
    assert fence_step(100.0, False, 10.0, 100.5) == (100.0, ())
    assert fence_step(100.0, False, 10.0, 100.0 + FENCE_GRACE_SECONDS + 0.1) == (100.0, (kill,))
    assert fence_step(100.0, False, 0.2, 100.3) == (100.0, (kill,))  # a shorter own grace
