"""Journal tests: round trips, WAL, event acks, reopen."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from laminar_agent.journal import (
    BACKSTOP_CHECKPOINT_PAGES,
    CHECKPOINT_EVERY_COMMITS,
    SCHEMA_VERSION,
    Checkpointer,
    Journal,
    SubjobRow,
)
from laminar_base.errors import InvalidArgument, NotFound


def test_subjob_round_trip_and_update(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    assert j.journal_mode == "wal"
    assert j.schema_version == SCHEMA_VERSION
    row = SubjobRow(
        subjob_id="s1",
        job_id="j1",
        spec_blob=b"\x00\x01proto",
        state="PENDING",
        slice_ids_json='["sl-1", "sl-2"]',
        device_uuids_json='["GPU-a"]',
        lease_id="l9",
        created_unix=1.0,
    )
    j.put_subjob(row)
    assert j.get_subjob("s1") == row  # no lease row yet: joined fields stay empty
    j.put_lease("l9", "j1", 0, '[{"slice_id": "sl-1"}]', 0.5, 7, True, "s1", 1.0)
    joined = j.get_subjob("s1")
    assert joined is not None
    assert (joined.allocations_json, joined.priority) == ('[{"slice_id": "sl-1"}]', 7)
    j.update_subjob("s1", state="RUNNING", pid=123, started_unix=2.0)
    j.update_subjob("s1", state="EXITED", exit_code=3, peak_rss_bytes=1 << 30, slice_ids_json="[]")
    got = j.get_subjob("s1")
    assert got is not None
    assert (got.state, got.pid, got.exit_code, got.peak_rss_bytes, got.slice_ids_json) == (
        "EXITED",
        123,
        3,
        1 << 30,
        "[]",
    )
    j.put_subjob(SubjobRow("s2", "j2", b"", "RUNNING", created_unix=3.0))
    assert [r.subjob_id for r in j.subjobs()] == ["s1", "s2"]
    assert [r.subjob_id for r in j.subjobs(states=["RUNNING"])] == ["s2"]
    assert [r.subjob_id for r in j.subjobs(job_id="j1")] == ["s1"]
    assert j.subjobs(states=[]) == []
    with pytest.raises(NotFound):
        j.update_subjob("nope", state="X")
    with pytest.raises(InvalidArgument):
        j.update_subjob("s1", bogus=1)
    with pytest.raises(InvalidArgument):
        j.update_subjob("s1", priority=1)  # joined from the lease, not a subjob column
    assert j.get_subjob("nope") is None
    assert j.has_subjob("s1") and not j.has_subjob("nope")
    j.close()


def test_heartbeat_reads_and_acks_touch_only_unacknowledged_events(tmp_path: Path) -> None:
    """Every heartbeat reads the unacknowledged events and acks what the router took:
    neither may read the agent's whole event history (a scan costs each heartbeat time
    linear in the subjobs the agent ever ran). SQLite's virtual-machine steps are
    counted; a scan of 3,000 rows takes tens of thousands. A journal made before the
    index (version 4) gains it when opened."""
    path = tmp_path / "agent.db"
    j = Journal(path)
    j._conn.execute("DROP INDEX IF EXISTS events_unacked")  # a journal from before the index
    with j.batch():
        for i in range(3000):
            j.append_event(f"s{i}", "EXITED", reason="r")
    j.ack_events(3000)
    j.close()
    j = Journal(path)
    fresh = [j.append_event("s-new", st, reason="r") for st in ("RUNNING", "EXITED")]
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    j._conn.set_progress_handler(count, 1)
    unacked = [e.seq for e in j.unacked_events(10)]
    acked = j.ack_events(fresh[0])
    left = [e.seq for e in j.unacked_events(10)]
    j._conn.set_progress_handler(None, 0)
    assert unacked == fresh and acked == 1 and left == fresh[1:]
    assert steps < 500, f"{steps} VM steps for two reads and an ack: the events were scanned"
    j.close()


def test_events_ack_and_reopen(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    seqs = [j.append_event("s1", st, reason="r") for st in ("PENDING", "RUNNING", "EXITED")]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert [e.state for e in j.events_after(seqs[0], 10)] == ["RUNNING", "EXITED"]
    assert j.ack_events(seqs[1]) == 2
    assert [e.seq for e in j.unacked_events(10)] == [seqs[2]]
    j.put_lease("l1", "j1", 0, "[]", 0.5, 2, committed=True, created_unix=5.0)
    j.append_action("drop_cache", "s1", "sl-1", "pressure", 1024, dry_run=True)
    j.set_meta("agent_id", "a-1")
    j.close()

    j2 = Journal(tmp_path / "agent.db")  # the db file path works as well as the dir
    assert [e.seq for e in j2.unacked_events(10)] == [seqs[2]]
    assert j2.events_after(0, 10)[0].acked
    assert j2.leases()[0].committed and j2.leases()[0].priority == 2 and j2.leases()[0].member == 0
    acts = j2.recent_actions(5)
    assert len(acts) == 1 and acts[0].dry_run and acts[0].bytes_freed == 1024
    assert j2.get_meta("agent_id") == "a-1"
    assert j2.get_meta("missing", "d") == "d"
    assert j2.delete_lease("l1") and not j2.delete_lease("l1")
    assert j2.leases() == []
    assert j2.append_event("s1", "LOST") > seqs[2]
    j2.close()


WRITER = """
import sys
from pathlib import Path
from laminar_agent.journal import Journal, SubjobRow
j = Journal(Path(sys.argv[1]))
i = 0
while True:
    j.put_subjob(SubjobRow(f"s{i}", "j", b"x" * 4096, "RUNNING", slice_ids_json="[1]" * 50))
    j.append_event(f"s{i}", "RUNNING")
    if i == 20:
        print("ready", flush=True)
    i += 1
"""


def test_kill_9_leaves_no_half_written_rows(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    j = Journal(tmp_path)
    rows = j.subjobs()
    assert len(rows) > 20
    assert all(r.spec_blob == b"x" * 4096 and r.slice_ids_json == "[1]" * 50 for r in rows)
    assert len(j.events_after(0, 100_000)) in (len(rows), len(rows) - 1)
    j.close()


def _old_journal(path: Path, version: int) -> None:
    """A journal as an older build wrote it: no pid_start column (v4), nor end_cause
    (v3), nor units_done (v1)."""
    import sqlite3

    from laminar_agent import journal as journal_module

    schema = journal_module._SCHEMA.replace(",\n    pid_start TEXT NOT NULL DEFAULT ''", "")
    if version < 4:
        schema = schema.replace(",\n    end_cause TEXT NOT NULL DEFAULT ''", "")
        assert "end_cause" not in schema
    if version < 2:
        schema = schema.replace(",\n    units_done INTEGER NOT NULL DEFAULT 0", "")
    assert "pid_start" not in schema
    conn = sqlite3.connect(path / "agent.db")
    conn.executescript(schema)
    columns = "subjob_id, job_id, spec_blob, state, reason, pid, slice_ids_json, "
    columns += "device_uuids_json, created_unix, started_unix, ended_unix, peak_rss_bytes, "
    columns += "peak_gpu_memory_bytes, run_seconds, suspended_seconds, lease_id"
    conn.execute(
        f"INSERT INTO subjobs ({columns}) VALUES "
        "('s1', 'j1', x'00', 'KILLED', 'readdressed: moved; exited 0', 0, '[]', '[]', "
        "1.0, 2.0, 3.0, 0, 0, 1.0, 0.0, ''), "
        "('s0', 'j0', x'00', 'RUNNING', 'terminating: cancelled: by request', 7, '[]', '[]', "
        "1.0, 2.0, 0.0, 0, 0, 0.0, 0.0, '')"
    )
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("version", [1, 3])
def test_migration_adds_end_cause(tmp_path: Path, version: int) -> None:
    """An older journal gains the end_cause column; its ends read as without a cause (the
    reason text is kept, never parsed into one), and new ends persist theirs."""
    _old_journal(tmp_path, version)
    j = Journal(tmp_path)
    assert j.schema_version == SCHEMA_VERSION == 5
    old = j.get_subjob("s1")
    assert old is not None
    assert (old.state, old.end_cause, old.units_done) == ("KILLED", "", 0)
    assert old.reason == "readdressed: moved; exited 0"
    stopping = j.get_subjob("s0")  # a stop under way at the upgrade still ends KILLED
    assert stopping is not None and stopping.end_cause == "terminated"
    j.put_subjob(SubjobRow("s2", "j1", b"", "RUNNING", created_unix=4.0))
    j.update_subjob("s2", state="KILLED", end_cause="readdressed")
    j.close()
    reopened = Journal(tmp_path)
    again = reopened.get_subjob("s2")
    assert again is not None and again.end_cause == "readdressed"
    reopened.close()


def test_actions_keep_their_end_cause(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.append_action(
        "reclaim", "s1", "gpu0", "preempted: by job j-2", 10, False, end_cause="preempted"
    )
    j.append_action("suspend", "s1", "gpu0", "gpu0 at 79 GiB", 0, False)
    assert [(a.step, a.end_cause) for a in j.recent_actions()] == [
        ("reclaim", "preempted"),
        ("suspend", ""),
    ]
    j.close()


def test_batch_commits_all_writes_or_none(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    other = Journal(tmp_path)
    with j.batch():
        j.put_lease("l1", "j1", 0, "[]", 0.5, 2, committed=True, subjob_id="s1")
        with j.batch():  # nested: still the outer transaction
            j.append_event("s1", "RUNNING")
        # Another connection sees nothing of it before the outer batch ends.
        assert other.leases() == [] and other.unacked_events(10) == []
    assert [row.lease_id for row in other.leases()] == ["l1"]
    assert [e.state for e in other.unacked_events(10)] == ["RUNNING"]
    with pytest.raises(NotFound), j.batch():
        j.append_event("s1", "EXITED")
        j.update_subjob("nobody", state="EXITED")  # raises: the event rolls back too
    assert [e.state for e in other.unacked_events(10)] == ["RUNNING"]
    j.append_event("s1", "EXITED")  # outside a batch: a transaction of its own again
    assert [e.state for e in other.unacked_events(10)] == ["RUNNING", "EXITED"]
    other.close()
    j.close()


def test_a_batch_that_writes_nothing_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe's batch often writes nothing (its lease lives in memory): it takes no write
    lock and costs no commit; the first write inside a batch begins its transaction."""
    commits: list[int] = []
    monkeypatch.setattr(Checkpointer, "committed", lambda self: commits.append(1))
    j = Journal(tmp_path)
    other = Journal(tmp_path)
    commits.clear()
    with j.batch():
        assert j.unacked_events(10) == []
        other.append_event("s0", "RUNNING")  # no lock held by the empty batch
    assert commits == [1]  # the other connection's commit only
    with j.batch():
        j.append_event("s1", "RUNNING")
        j.append_event("s1", "SUCCEEDED")
    assert commits == [1, 1]
    assert [e.state for e in other.unacked_events(10)] == ["RUNNING", "RUNNING", "SUCCEEDED"]
    other.close()
    j.close()


def test_reopen_drops_uncommitted_lease_rows(tmp_path: Path) -> None:
    """An older agent journaled leases nobody committed; nothing reads them back."""
    j = Journal(tmp_path)
    j.put_lease("l-pending", "j1", 0, "[]", 0.5, 2, committed=False)
    j.put_lease("l-held", "j1", 0, "[]", 0.5, 2, committed=True, subjob_id="s1")
    j.close()
    j2 = Journal(tmp_path)
    assert [row.lease_id for row in j2.leases()] == ["l-held"]
    j2.close()


def test_checkpoints_run_on_a_worker_thread_and_keep_every_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's automatic checkpoint (two fsyncs) ran inside the commit that crossed its
    threshold, blocking the agent's event loop; the journal's own runs on a thread."""
    j = Journal(tmp_path)
    autocheckpoint = j._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    assert autocheckpoint == BACKSTOP_CHECKPOINT_PAGES
    threads: list[str] = []
    checkpoint = Checkpointer._run

    def spy(self: Checkpointer) -> None:
        threads.append(threading.current_thread().name)
        checkpoint(self)

    monkeypatch.setattr(Checkpointer, "_run", spy)
    db = tmp_path / "agent.db"
    size_before = db.stat().st_size
    for i in range(CHECKPOINT_EVERY_COMMITS - 1):
        j.append_event(f"s{i}", "RUNNING", "started", float(i))
    assert not threads  # one commit short
    j.append_event("s-last", "RUNNING", "started", 1.0)
    j.checkpointer.close()  # joins the worker the last commit started
    assert j.checkpointer.checkpoints == 1
    assert threads == ["journal-checkpoint"]
    assert db.stat().st_size > size_before  # the WAL's pages are in the database file
    j.close()
    assert len(Journal(tmp_path).unacked_events(10 * CHECKPOINT_EVERY_COMMITS)) == (
        CHECKPOINT_EVERY_COMMITS
    )


@pytest.mark.parametrize("version", [1, 3, 4])
def test_an_old_journal_opens_with_no_pid_start_on_its_rows(tmp_path: Path, version: int) -> None:
    """A journal from before pid_start opens: its live rows read "" there (unknown,
    so a restart's adopt falls back to started_unix), and a new launch persists its own."""
    _old_journal(tmp_path, version)
    j = Journal(tmp_path)
    running = j.get_subjob("s0")
    assert running is not None and (running.pid, running.started_unix) == (7, 2.0)
    assert running.pid_start == ""
    j.put_subjob(SubjobRow("s2", "j1", b"", "RUNNING", created_unix=4.0))
    j.update_subjob("s2", pid=8, started_unix=6.5, pid_start="boot:325")
    j.close()
    reopened = Journal(tmp_path)
    assert reopened.schema_version == SCHEMA_VERSION
    again = reopened.get_subjob("s2")
    assert again is not None and (again.started_unix, again.pid_start) == (6.5, "boot:325")
    reopened.close()
