"""What the agent journals on the hot path: committed leases only, one transaction a step."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import psutil
import pytest

from laminar_agent import executor as executor_module
from laminar_agent import shim
from laminar_agent.carrier import KEPT_ROW_MAX_SPEC_BYTES
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.journal import SubjobRow
from laminar_agent.node import Node
from laminar_api.v1 import agent_pb2, common_pb2


def _probe(job: str) -> agent_pb2.ProbeRequest:
    return agent_pb2.ProbeRequest(
        probe_id=f"p-{job}",
        job_id=job,
        resources=common_pb2.Resources(gpu_milli=100),
        lease_ttl_seconds=30,
    )


async def test_only_committed_leases_reach_the_journal(tmp_path: Path) -> None:
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        kept = await node.probe(_probe("j1"))
        dropped = await node.probe(_probe("j2"))
        assert kept.HasField("lease") and dropped.HasField("lease")
        assert node.journal.leases() == []  # granted, not committed: memory only
        assert node.release([dropped.lease.lease_id]) == 1
        spec = common_pb2.SubjobSpec(
            job_id="j1", command=[sys.executable, "-c", "pass"], subjob_id="s1"
        )
        await node.commit(kept.lease.lease_id, spec)
        (row,) = node.journal.leases()
        assert (row.lease_id, row.subjob_id, row.committed) == (kept.lease.lease_id, "s1", True)
        # The row recovery re-adopts from carries the lease's allocations.
        subjob = node.journal.get_subjob("s1")
        assert subjob is not None and subjob.allocations_json not in ("", "[]")
        await node.executor.wait("s1")
        assert node.journal.leases() == []  # its end dropped the committed row
        assert [e.state for e in node.journal.events_after(0)] == ["RUNNING", "SUCCEEDED"]
    finally:
        await node.close()


def test_adjacent_writes_to_one_row_merge_and_others_keep_their_order() -> None:
    from laminar_agent.core import RecordEvent, WriteRow, merge_row_writes

    event = RecordEvent("s1", "RUNNING", "started", 1.0)
    merged = merge_row_writes(
        [
            WriteRow("s1", {"pid": 7, "reason": "old"}),
            WriteRow("s1", {"state": "RUNNING", "reason": "started"}),
            event,
            WriteRow("s1", {"exit_code": 0}),
            WriteRow("s2", {"exit_code": 1}),
        ]
    )
    assert merged == [
        WriteRow("s1", {"pid": 7, "reason": "started", "state": "RUNNING"}),
        event,
        WriteRow("s1", {"exit_code": 0}),
        WriteRow("s2", {"exit_code": 1}),
    ]


async def test_a_busy_slice_opens_its_window_when_its_holder_expects_to_end(
    tmp_path: Path,
) -> None:
    """Heartbeats advertise a busy slice from its holder's started + expected_seconds,
    from memory, and again after an agent restart re-adopts the holder."""

    def busy_windows(node: Node) -> dict[str, float]:
        """Windows that open later than now (free slices' open now)."""
        summary = node.summary(with_windows=True)
        later = time.time() + 10
        return {w.slice_id: w.start_unix for w in summary.windows if w.start_unix > later}

    backend = FakeGpuBackend("2xH100-80GB", agent_id="a")
    node = Node("a", backend, tmp_path)
    probe = _probe("j1")
    probe.resources.CopyFrom(common_pb2.Resources(gpus=1))
    granted = await node.probe(probe)
    spec = common_pb2.SubjobSpec(
        job_id="j1",
        subjob_id="s1",
        command=[sys.executable, "-c", "import time; time.sleep(60)"],
        expected_seconds=100,
    )
    subjob = await node.commit(granted.lease.lease_id, spec)
    (slice_id,) = subjob.slice_ids
    assert busy_windows(node) == {slice_id: subjob.started_unix + 100}
    await node.close()  # the subjob runs on; a new agent re-adopts it
    again = Node("a", FakeGpuBackend("2xH100-80GB", agent_id="a"), tmp_path)
    try:
        assert again.recover() == (1, 0)
        assert busy_windows(again) == {slice_id: subjob.started_unix + 100}
        again.executor.kill("s1")
        await again.executor.wait("s1")
        assert busy_windows(again) == {}  # ended: both GPUs free from now
    finally:
        await again.close()


async def test_a_subjob_whose_launch_was_answered_late_is_readopted_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the launch's answer arrives seconds after the process started (here the
    agent's clock reads 5 s late at that point). The subjob's start stays when the answer
    came; the process's own start is journaled apart, and a restarted agent re-adopts the
    live subjob by it instead of taking its pid for a reused one and losing it."""
    from types import SimpleNamespace

    from laminar_agent import launch as launch_module

    real = time.time
    monkeypatch.setattr(
        launch_module, "time", SimpleNamespace(time=lambda: real() + 5.0, monotonic=time.monotonic)
    )
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    granted = await node.probe(_probe("j1"))
    spec = common_pb2.SubjobSpec(
        job_id="j1", subjob_id="s1", command=[sys.executable, "-c", "import time; time.sleep(60)"]
    )
    subjob = await node.commit(granted.lease.lease_id, spec)
    row = node.journal.get_subjob("s1")
    assert row is not None and row.state == "RUNNING"
    assert row.started_unix == subjob.started_unix  # the subjob's start: the answer's time
    process_started = psutil.Process(row.pid).create_time()
    assert row.started_unix - process_started > 4.0
    await node.close()  # the subjob runs on
    monkeypatch.undo()
    again = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        assert again.recover() == (1, 0)
        assert again.executor.is_running("s1")
        # What it was told apart by: the process's identity, journaled as read at the launch.
        kept = again.journal.get_subjob("s1")
        assert kept is not None and kept.pid_start == executor_module._process_start(kept.pid)
        assert kept.pid_start.endswith(":" + _stat_field(kept.pid, 22))
        assert kept.state == "RUNNING"
        again.executor.kill("s1")
        await again.executor.wait("s1")
    finally:
        await again.close()


async def test_a_subjob_lost_at_a_restart_is_voided(tmp_path: Path) -> None:
    """The agent died between its launcher's fork and journaling the pid (a row STARTING
    with pid 0): the restart records the subjob lost, and voids its launch, so that a late
    start runs nothing of it and its cgroup, where there is one, is killed (its job is
    retried elsewhere; nothing of it may run twice)."""
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    granted = await node.probe(_probe("j1"))
    spec = common_pb2.SubjobSpec(
        job_id="j1", subjob_id="s1", command=[sys.executable, "-c", "import time; time.sleep(60)"]
    )
    await node.commit(granted.lease.lease_id, spec)
    row = node.journal.get_subjob("s1")
    assert row is not None
    pid = row.pid
    node.journal.update_subjob("s1", state="STARTING", pid=0, pid_start="")
    await node.close()
    again = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        assert again.recover() == (0, 1)
        lost = again.journal.get_subjob("s1")
        assert lost is not None and lost.state not in ("RUNNING", "STARTING", "SUSPENDED")
        assert (again.executor.subjob_dir("s1") / shim.VOID_FILE).exists()
    finally:
        await again.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


async def test_a_reused_pid_is_not_readopted(tmp_path: Path) -> None:
    """A journaled pid now held by a process that started in another clock tick than the
    one journaled is not the subjob's: the restart does not adopt it (the subjob is lost),
    though the subjob's start is within a second of that process's."""
    assert Path(executor_module.BOOT_ID_PATH).exists(), "needs Linux's boot id"
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    granted = await node.probe(_probe("j1"))
    spec = common_pb2.SubjobSpec(
        job_id="j1", subjob_id="s1", command=[sys.executable, "-c", "import time; time.sleep(60)"]
    )
    await node.commit(granted.lease.lease_id, spec)
    row = node.journal.get_subjob("s1")
    assert row is not None
    pid = row.pid
    # As if the subjob's process had ended unseen and another took its pid two ticks after.
    boot, ticks = row.pid_start.rsplit(":", 1)
    node.journal.update_subjob("s1", pid_start=f"{boot}:{int(ticks) - 2}")
    await node.close()
    again = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        assert again.recover() == (0, 1)
        assert not again.executor.is_running("s1")
        lost = again.journal.get_subjob("s1")
        assert lost is not None and lost.state not in ("RUNNING", "STARTING", "SUSPENDED")
    finally:
        await again.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


async def test_a_commit_cancelled_while_launching_records_the_subjob_failed_and_void(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Commit call ends (cancelled) while the launcher has the record and has not
    answered: the launch is void (a late supervisor runs nothing of it) and the subjob is
    recorded failed, not left neither launched nor ended."""
    waiting = asyncio.Event()

    async def stuck(self: executor_module.Launcher) -> str:
        waiting.set()
        await asyncio.Future()  # never answered
        return ""

    monkeypatch.setattr(executor_module.Launcher, "_readline", stuck)
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        granted = await node.probe(_probe("j1"))
        spec = common_pb2.SubjobSpec(
            job_id="j1", command=[sys.executable, "-c", "pass"], subjob_id="s1"
        )
        task = asyncio.create_task(node.commit(granted.lease.lease_id, spec))
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        row = node.journal.get_subjob("s1")
        assert row is not None and row.state == "FAILED"
        assert "cancelled" in row.reason
        assert (node.executor.subjob_dir("s1") / "void").exists()
    finally:
        await node.close()


async def test_the_rows_kept_in_memory_are_the_journals_rows_at_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit's reply and each event's message are built from the rows the carrier kept
    as it committed them, not read back: at every step (commit, suspend, resume, stop, end)
    each kept row equals the journal's, and the messages equal those built from the journal
    (a restarted agent, which keeps none, reads the same)."""
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    journal_reads: list[str] = []
    get_subjob = node.journal.get_subjob

    def read(subjob_id: str) -> SubjobRow | None:
        journal_reads.append(subjob_id)
        return get_subjob(subjob_id)

    monkeypatch.setattr(node.journal, "get_subjob", read)

    def assert_kept_as_journaled(subjob_id: str) -> None:
        kept = node.carrier.row(subjob_id)
        assert kept is not None and kept == get_subjob(subjob_id)

    try:
        granted = await node.probe(_probe("j1"))
        spec = common_pb2.SubjobSpec(
            job_id="j1",
            subjob_id="s1",
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
            priority=common_pb2.BATCH,
        )
        reply = await node.commit(granted.lease.lease_id, spec)
        assert journal_reads == []  # the reply was built from memory
        assert_kept_as_journaled("s1")
        journaled = get_subjob("s1")
        assert journaled is not None and journaled.allocations_json not in ("", "[]")
        assert reply == node.reads._to_message(journaled)
        assert reply.state == common_pb2.RUNNING and reply.pid > 0
        await node.signal("s1", agent_pb2.SUSPEND, "test", 0)
        assert_kept_as_journaled("s1")
        await node.signal("s1", agent_pb2.RESUME, "test", 0)
        assert_kept_as_journaled("s1")
        await node.signal("s1", agent_pb2.TERMINATE, "test", 0.1)
        await node.executor.wait("s1")
        assert_kept_as_journaled("s1")  # ended: its lease's columns are gone from both
        ended = get_subjob("s1")
        assert ended is not None and ended.state == "KILLED" and ended.allocations_json == ""
        events = node.journal.events_after(0)
        assert [e.state for e in events] == ["RUNNING", "SUSPENDED", "RUNNING", "KILLED"]
        kept_messages = [
            node.reads.event_message(e.seq, e.subjob_id, e.state, e.reason, e.at_unix)
            for e in events
        ]
        assert journal_reads == []  # nor the events' messages, the end's included
    finally:
        await node.close()
    again = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        assert again.carrier.row("s1") is None  # nothing kept across a restart
        assert kept_messages == [
            again.reads.event_message(e.seq, e.subjob_id, e.state, e.reason, e.at_unix)
            for e in events
        ]
    finally:
        await again.close()


async def test_a_row_with_a_large_spec_is_read_from_the_journal_not_kept(tmp_path: Path) -> None:
    """Kept rows hold their stored spec: one larger than ``KEPT_ROW_MAX_SPEC_BYTES`` (a
    large environment) is not kept, so what memory holds stays bounded, and its reply is
    the journal's all the same."""
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        granted = await node.probe(_probe("j1"))
        spec = common_pb2.SubjobSpec(
            job_id="j1",
            subjob_id="s1",
            command=[sys.executable, "-c", "pass"],
            env={"BIG": "x" * KEPT_ROW_MAX_SPEC_BYTES},
        )
        reply = await node.commit(granted.lease.lease_id, spec)
        assert node.carrier.row("s1") is None
        journaled = node.journal.get_subjob("s1")
        assert journaled is not None and reply == node.reads._to_message(journaled)
        assert reply.spec.env["BIG"] == spec.env["BIG"]
        await node.executor.wait("s1")
        assert node.carrier.row("s1") is None  # nor once it ended
    finally:
        await node.close()


async def test_a_batch_that_fails_leaves_no_kept_row_ahead_of_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transition whose journal batch raises is rolled back, and the kept row with it:
    every read answers what the journal holds, never the write that did not commit. A batch
    inside another (committed only with the outer one) keeps no row at all."""
    node = Node("a", FakeGpuBackend("1xH100-80GB:shared", agent_id="a"), tmp_path)
    try:
        granted = await node.probe(_probe("j1"))
        spec = common_pb2.SubjobSpec(
            job_id="j1",
            subjob_id="s1",
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
        )
        await node.commit(granted.lease.lease_id, spec)

        def broken(*args: object, **kwargs: object) -> int:
            raise sqlite3.OperationalError("disk I/O error")

        with monkeypatch.context() as patched:
            patched.setattr(node.journal, "append_event", broken)
            with pytest.raises(sqlite3.OperationalError):
                await node.signal("s1", agent_pb2.SUSPEND, "test", 0)
        journaled = node.journal.get_subjob("s1")
        assert journaled is not None and journaled.state == "RUNNING"  # rolled back
        assert node.reads.find("s1") == journaled
        assert node.reads.message("s1").state == common_pb2.RUNNING
        with pytest.raises(RuntimeError), node.journal.batch():
            await node.signal("s1", agent_pb2.SUSPEND, "test", 0)
            raise RuntimeError("the outer batch rolls back")
        assert node.carrier.row("s1") is None
        assert node.reads.find("s1") == journaled
        node.executor.kill("s1")
        await node.executor.wait("s1")
    finally:
        await node.close()


def _stat_field(pid: int, number: int) -> str:
    """Field ``number`` (1-based, as proc(5) numbers them) of ``/proc/PID/stat``."""
    data = Path(f"/proc/{pid}/stat").read_text()
    return data[data.rfind(")") + 2 :].split()[number - 3]
