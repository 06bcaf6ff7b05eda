"""The router's journal: recovery loads every job not ended, and every ended one whose
record still has a subjob without a recorded end; a journal written before that column
existed opens and gains it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from laminar_agent.journal import BACKSTOP_CHECKPOINT_PAGES, CHECKPOINT_EVERY_COMMITS
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_zone.store import JobStore


def _job(job_id: str, state: int, subjob_state: int | None = None) -> zone_pb2.Job:
    job = zone_pb2.Job(job_id=job_id, state=state, submitted_unix=1.0)  # type: ignore[arg-type]
    if subjob_state is not None:
        job.placements.add(subjob_id=f"{job_id}-a1-m0", state=subjob_state)  # type: ignore[arg-type]
    return job


def test_recovery_loads_live_jobs_and_ended_ones_still_settling(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "zone.db")
    store.put_many(
        [
            _job("queued", zone_pb2.QUEUED),
            _job("done", zone_pb2.JOB_SUCCEEDED, common_pb2.SUCCEEDED),
            _job("cancelled-settling", zone_pb2.JOB_CANCELLED, common_pb2.STARTING),
        ]
    )
    assert sorted(j.job_id for j in store.live()) == ["cancelled-settling", "queued"]
    store.put(_job("cancelled-settling", zone_pb2.JOB_CANCELLED, common_pb2.FAILED))
    assert [j.job_id for j in store.live()] == ["queued"]
    store.close()


def test_a_journal_from_before_the_settling_column_opens(tmp_path: Path) -> None:
    path = tmp_path / "zone.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE jobs (job_id TEXT PRIMARY KEY, tenant TEXT NOT NULL,
            client_request_id TEXT NOT NULL, state INTEGER NOT NULL,
            submitted_unix REAL NOT NULL, body BLOB NOT NULL);
        """
    )
    old = _job("old", zone_pb2.QUEUED)
    db.execute(
        "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?)",
        ("old", "", "", int(old.state), 1.0, old.SerializeToString()),
    )
    db.commit()
    db.close()
    store = JobStore(path)
    assert [j.job_id for j in store.live()] == ["old"]
    store.put(_job("ended", zone_pb2.JOB_FAILED, common_pb2.RUNNING))
    assert sorted(j.job_id for j in store.live()) == ["ended", "old"]
    store.close()


def test_the_routers_checkpoints_run_off_its_loop_and_keep_every_job(tmp_path: Path) -> None:
    """SQLite's own checkpoint (two fsyncs) ran inside the commit crossing its threshold,
    on the router's event loop; the store defers it and checkpoints on a worker thread
    every CHECKPOINT_EVERY_COMMITS of its transactions."""
    store = JobStore(tmp_path / "zone.db")
    pages = store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    assert pages == BACKSTOP_CHECKPOINT_PAGES
    for i in range(CHECKPOINT_EVERY_COMMITS - 1):
        store.put(_job(f"j-{i}", zone_pb2.QUEUED))
    assert store.checkpointer.checkpoints == 0
    store.put(_job("j-last", zone_pb2.QUEUED))
    store.checkpointer.close()  # joins the worker the last commit started
    assert store.checkpointer.checkpoints == 1
    store.close()
    assert len(list(JobStore(tmp_path / "zone.db").live())) == CHECKPOINT_EVERY_COMMITS


def test_the_idempotency_lookup_finds_the_job_without_reading_the_journal(
    tmp_path: Path,
) -> None:
    """Submit's lookup by (tenant, client_request_id) must search the partial index: a
    scan makes every Submit cost time linear in the journal's size. SQLite's virtual
    machine steps are counted: a scan of 2,000 rows takes tens of thousands."""
    store = JobStore(tmp_path / "zone.db")
    jobs = []
    for i in range(2000):
        job = zone_pb2.Job(job_id=f"j{i}", client_request_id=f"req-{i}", submitted_unix=1.0)
        job.spec.tenant = "t"
        jobs.append(job)
    unkeyed = zone_pb2.Job(job_id="unkeyed", submitted_unix=2.0)
    unkeyed.spec.tenant = "t"
    store.put_many([*jobs, unkeyed])
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    store.db.set_progress_handler(count, 1)
    found = store.by_request("t", "req-1234")
    missing = store.by_request("t", "req-none")
    store.db.set_progress_handler(None, 0)
    assert found is not None and found.job_id == "j1234"
    assert missing is None
    assert steps < 200, f"{steps} VM steps for two lookups: the journal was scanned"
    assert store.by_request("other", "req-1") is None
    assert store.by_request("t", "") is None  # no key: never some job stored without one
    store.close()
