"""A subjob never joins a cgroup that still holds processes: another agent with the same
id on this host, or an earlier run of the same subjob still alive, would have every stop,
signal and ``cgroup.kill`` meant for the new subjob reach them too. The launch fails with
the cgroup's path and how many processes it holds; an empty cgroup left by a run that
ended is reused.

Plain folders stand in for cgroups where the kernel is not needed (``prepare`` only reads
``cgroup.procs``); one test uses a real cgroup2 hierarchy and skips, saying why, where
none is writable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_executor import Recorder, make_spec, poll_until
from waiting import wait_for

from laminar_agent import shim
from laminar_agent.cgroups import SubjobCgroups, cgroup2_mount, own_cgroup
from laminar_agent.executor import Executor
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.node import Node
from laminar_api.v1 import agent_pb2, common_pb2
from laminar_base.causes import EndCause
from laminar_base.errors import FailedPrecondition

#: Pids no process can have (above the kernel's limit, 2**22): a regressed launcher that
#: joined a stand-in cgroup and killed what it lists at the end reaches nobody.
TWO = f"{2**22 + 1}\n{2**22 + 2}\n"
ONE = f"{2**22 + 1}\n"


def _busy(cgroup: Path, pids: str) -> None:
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text(pids)
    (cgroup / "cgroup.kill").write_text("")  # as the kernel has it


def test_prepare_refuses_a_cgroup_that_holds_processes_before_touching_the_folder(
    tmp_path: Path,
) -> None:
    cgroup = tmp_path / "laminar.a0" / "s-1"
    _busy(cgroup, TWO)
    sdir = tmp_path / "subjobs" / "s-1"
    sdir.mkdir(parents=True)
    (sdir / shim.EXIT_FILE).write_text("{}")  # an earlier run's, left as it was
    spec: dict[str, object] = {"cgroup": str(cgroup)}
    with pytest.raises(shim.CgroupBusy) as raised:
        shim.prepare(str(sdir), spec)
    assert str(raised.value) == (
        f"cgroup {cgroup} still holds 2 processes (another agent with the same id on this "
        "host, or an earlier run still alive); not starting"
    )
    assert (sdir / shim.EXIT_FILE).exists()
    assert spec["cgroup"] == str(cgroup) and cgroup.is_dir()
    one = tmp_path / "laminar.a0" / "s-2"
    _busy(one, ONE)
    with pytest.raises(shim.CgroupBusy, match=r"still holds 1 process \("):
        shim.prepare(str(tmp_path / "subjobs" / "s-2"), {"cgroup": str(one)})
    assert not (tmp_path / "subjobs" / "s-2").exists()


def test_prepare_reuses_an_empty_cgroup(tmp_path: Path) -> None:
    """Left by a run that ended (an agent crash before its removal): empty, so reused."""
    empty = tmp_path / "laminar.a0" / "s-1"
    _busy(empty, "")
    spec: dict[str, object] = {"cgroup": str(empty)}
    assert shim.prepare(str(tmp_path / "subjobs" / "s-1"), spec) == ""
    assert spec["cgroup"] == str(empty) and (tmp_path / "subjobs" / "s-1").is_dir()


def test_prepare_makes_the_agents_folder_again_if_it_went(tmp_path: Path) -> None:
    """Another agent with the same id removed the folder as it stopped: the launch makes it
    again and its cgroup in it (one level only: a missing agent cgroup above is a warning)."""
    cgroup = tmp_path / "laminar.a0" / "s-1"
    spec: dict[str, object] = {"cgroup": str(cgroup)}
    assert shim.prepare(str(tmp_path / "subjobs" / "s-1"), spec) == ""
    assert spec["cgroup"] == str(cgroup) and cgroup.is_dir()
    deeper = tmp_path / "gone" / "laminar.a0" / "s-2"
    spec = {"cgroup": str(deeper)}
    assert shim.prepare(str(tmp_path / "subjobs" / "s-2"), spec).startswith("runs without a cgroup")
    assert spec["cgroup"] == "" and not (tmp_path / "gone").exists()


def test_a_cgroup_made_for_a_folder_that_cannot_be_made_is_removed(tmp_path: Path) -> None:
    cgroup = tmp_path / "laminar.a0" / "s-1"
    cgroup.parent.mkdir()
    (tmp_path / "subjobs").write_text("not a folder")
    with pytest.raises(NotADirectoryError):
        shim.prepare(str(tmp_path / "subjobs" / "s-1"), {"cgroup": str(cgroup)})
    assert not cgroup.exists()


@pytest.mark.parametrize("use_launcher", [True, False])
async def test_a_launch_into_a_busy_cgroup_fails_with_its_cause(
    tmp_path: Path, use_launcher: bool
) -> None:
    """Through the launcher (its ``error supervisor:`` answer) or a shim started directly
    (``prepare`` in the agent): the launch raises, so the agent records the subjob FAILED
    with this cause (``launch.py``), and nothing of it ran."""
    cgroups = SubjobCgroups(tmp_path / "cgroups" / "laminar.a0")
    _busy(cgroups.path("s-1"), TWO)
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec, cgroups=cgroups, use_launcher=use_launcher)
    marker = tmp_path / "ran"
    spec = make_spec(tmp_path, "s-1", f"open({str(marker)!r}, 'w')")
    with pytest.raises(OSError, match=r"cgroup .*/laminar\.a0/s-1 still holds 2 processes"):
        await ex.launch(spec)
    assert not ex.subjob_dir("s-1").exists() and not marker.exists()
    assert (cgroups.path("s-1") / "cgroup.procs").read_text() == TWO
    await ex.close()


@pytest.fixture
def cgroup_base() -> Iterator[Path]:
    """A fresh folder in a writable cgroup2 hierarchy (skipped, saying why, where there
    is none); removed afterwards with whatever a failing run left in it."""
    mount = cgroup2_mount()
    base = None if mount is None else mount / own_cgroup().lstrip("/")
    try:
        if base is None:
            raise FileNotFoundError("no cgroup2 hierarchy mounted")
        base = base / f"laminar-test-{uuid.uuid4().hex[:12]}"
        base.mkdir()
    except OSError as exc:
        reason = f"no writable cgroup2 hierarchy here ({exc}): no process can be put in one"
        print(reason)
        pytest.skip(reason)
    yield base
    for path in [*sorted((p for p in base.rglob("*") if p.is_dir()), reverse=True), base]:
        if (path / "cgroup.procs").exists():
            shim.signal_cgroup(str(path), signal.SIGKILL)
            wait_for(lambda cgroup=str(path): _is_empty(cgroup))
        if path.exists():
            path.rmdir()


async def _runs_in_its_cgroup(
    ex: Executor, rec: Recorder, tmp_path: Path, subjob_id: str, exit_code: int = 0
) -> None:
    """Launch ``subjob_id``, which prints its cgroup; it ends with ``exit_code`` having run
    in ``laminar.a0/<subjob_id>``."""
    code = f"import sys; print(open('/proc/self/cgroup').read()); sys.exit({exit_code})"
    await ex.launch(make_spec(tmp_path, subjob_id, code))
    await poll_until(lambda: subjob_id in rec.exits, f"exit of {subjob_id}")
    assert rec.exits[subjob_id].exit_code == exit_code
    assert f"/laminar.a0/{subjob_id}" in (ex.subjob_dir(subjob_id) / "stdout").read_text()


def _is_empty(cgroup: str) -> bool:
    return not os.path.exists(cgroup) or shim.cgroup_pids(cgroup) == []


@pytest.fixture
def other() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not the subjob's (another agent's subjob, say)."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


async def test_a_real_cgroup_holding_a_process_is_refused_then_reused_once_empty(
    tmp_path: Path, cgroup_base: Path, other: subprocess.Popen[bytes]
) -> None:
    cgroups = SubjobCgroups(cgroup_base / "laminar.a0")
    cgroup = cgroups.path("s-1")
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text(str(other.pid))
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec, cgroups=cgroups)
    try:
        with pytest.raises(OSError, match=r"still holds 1 process \(another agent"):
            await ex.launch(make_spec(tmp_path, "s-1", "pass"))
        # The other process was neither stopped nor killed, and stays where it was.
        assert other.poll() is None
        assert Path(f"/proc/{other.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
        assert shim.cgroup_pids(str(cgroup)) == [other.pid]
        other.kill()  # reaped by poll() below
        await poll_until(lambda: other.poll() is not None, "the other process to end")
        await poll_until(lambda: shim.cgroup_pids(str(cgroup)) == [], "the cgroup to empty")
        # Empty now (as a run that ended leaves it): the next launch joins it and runs.
        await _runs_in_its_cgroup(ex, rec, tmp_path, "s-1", exit_code=3)
    finally:
        await ex.close()


async def test_a_commit_into_a_busy_cgroup_ends_the_subjob_failed_with_the_cause(
    tmp_path: Path,
) -> None:
    """The agent's end: the Commit is refused FAILED_PRECONDITION (the router rolls the job
    back and retries it at once) and the subjob is journaled FAILED, ``launch_failed``, its
    reason naming the cgroup."""
    cgroups = SubjobCgroups(tmp_path / "cgroups" / "laminar.a")
    _busy(cgroups.path("s1"), TWO)
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path, cgroups=cgroups)
    try:
        granted = await node.probe(
            agent_pb2.ProbeRequest(
                probe_id="p-j1",
                job_id="j1",
                resources=common_pb2.Resources(gpu_milli=100),
                lease_ttl_seconds=30,
            )
        )
        spec = common_pb2.SubjobSpec(job_id="j1", command=["true"], subjob_id="s1")
        with pytest.raises(FailedPrecondition, match="still holds 2 processes") as refused:
            await node.commit(granted.lease.lease_id, spec)
        # Surely not started, and said so: the router places the job again at once, its
        # reason naming the cgroup (an OSError would reach it as INTERNAL, outcome unknown).
        assert refused.value.code_name == "FAILED_PRECONDITION"
        assert refused.value.message.startswith("subjob s1 could not start: ")
        row = node.journal.get_subjob("s1")
        assert row is not None and row.state == "FAILED"
        assert row.end_cause == EndCause.LAUNCH_FAILED.token
        assert row.reason.startswith("could not start: ")
        assert f"cgroup {cgroups.path('s1')} still holds 2 processes" in row.reason
    finally:
        await node.close()


async def test_an_agent_stopping_removes_its_cgroup_folder_unless_a_subjob_is_in_it(
    tmp_path: Path, cgroup_base: Path
) -> None:
    """Nothing running: the agent's folder goes with it (repeated starts and stops leave
    no empty cgroups behind). A subjob that outlives its agent keeps the folder, and runs
    on in its cgroup."""
    cgroups = SubjobCgroups(cgroup_base / "laminar.a0")
    cgroups.base.mkdir()
    rec = Recorder()
    ex = Executor(tmp_path / "state", on_exit=rec, cgroups=cgroups)
    await ex.launch(make_spec(tmp_path, "s-1", "pass"))
    await poll_until(lambda: "s-1" in rec.exits, "exit of s-1")
    await poll_until(lambda: not cgroups.path("s-1").exists(), "s-1's cgroup removed")
    await ex.close()
    assert not cgroups.base.exists()

    cgroups.base.mkdir()  # a restarted agent makes it again
    ex = Executor(tmp_path / "state2", on_exit=rec, cgroups=cgroups)
    await ex.launch(make_spec(tmp_path, "s-2", "import time; time.sleep(300)"))
    await poll_until(lambda: cgroups.pids("s-2") != [], "s-2 in its cgroup")
    await ex.close()
    assert cgroups.base.exists() and cgroups.pids("s-2") != []  # kept, and s-2 runs on
    cgroups.kill_all("s-2")  # its launcher, which outlived the agent, reaps it and removes it
    await poll_until(lambda: not cgroups.path("s-2").exists(), "s-2's cgroup removed")


async def test_an_agent_with_the_same_id_keeps_launching_into_cgroups_after_the_other_stops(
    tmp_path: Path, cgroup_base: Path
) -> None:
    """Two agents with one id on a host (two test suites, say): the one that stops with
    nothing running removes the folder; the other's next subjob still gets its cgroup."""
    cgroups = SubjobCgroups(cgroup_base / "laminar.a0")
    cgroups.base.mkdir()
    rec = Recorder()
    stopping = Executor(tmp_path / "one", on_exit=rec, cgroups=cgroups)
    staying = Executor(tmp_path / "two", on_exit=rec, cgroups=cgroups)
    try:
        await stopping.close()
        assert not cgroups.base.exists()
        await _runs_in_its_cgroup(staying, rec, tmp_path, "s-3")
    finally:
        await staying.close()
