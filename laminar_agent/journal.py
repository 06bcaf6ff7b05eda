"""The agent's durable memory: leases, subjobs, state events and airlock actions in SQLite.

WAL mode with synchronous=NORMAL keeps each small write cheap while a crash
(kill -9) still never leaves a half-written row: every write runs in a transaction,
its own or, inside :meth:`Journal.batch`, the one all the writes of one step share
(a launch's row, lease and event commit together). The journal stores the subjob
spec as opaque bytes so it does not depend on protobuf.

Checkpoints (copying the WAL into the database, with two fsyncs) run on a worker thread
of their own connection (:class:`Checkpointer`), every :data:`CHECKPOINT_EVERY_COMMITS` commits: SQLite's own
automatic checkpoint runs inside the commit that crosses its threshold, and blocked the
agent's event loop (every probe and launch on it) for 15-45 ms at a time under load. A
commit is as durable as before (in the WAL, which a restart replays); SQLite's automatic
checkpoint stays as a backstop, at :data:`BACKSTOP_CHECKPOINT_PAGES`, for a worker that
falls behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laminar_base.errors import InvalidArgument, NotFound

log = logging.getLogger("laminar.agent.journal")

SCHEMA_VERSION = 5
DB_FILE = "agent.db"
#: Commits between two checkpoints on the worker thread (a launch takes about three).
CHECKPOINT_EVERY_COMMITS = 200
#: WAL pages at which SQLite checkpoints inside a commit (its default is 1,000).
BACKSTOP_CHECKPOINT_PAGES = 10_000

_EVENTS_UNACKED_INDEX = "CREATE INDEX IF NOT EXISTS events_unacked ON events(seq) WHERE acked=0"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    member INTEGER NOT NULL,
    allocations_json TEXT NOT NULL,
    score REAL NOT NULL,
    priority INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    subjob_id TEXT NOT NULL,
    created_unix REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS subjobs (
    subjob_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    spec_blob BLOB NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    pid INTEGER NOT NULL,
    slice_ids_json TEXT NOT NULL,
    device_uuids_json TEXT NOT NULL,
    created_unix REAL NOT NULL,
    started_unix REAL NOT NULL,
    ended_unix REAL NOT NULL,
    exit_code INTEGER,
    signal INTEGER,
    peak_rss_bytes INTEGER NOT NULL,
    peak_gpu_memory_bytes INTEGER NOT NULL,
    run_seconds REAL NOT NULL,
    suspended_seconds REAL NOT NULL,
    lease_id TEXT NOT NULL,
    units_done INTEGER NOT NULL DEFAULT 0,
    end_cause TEXT NOT NULL DEFAULT '',
    pid_start TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS subjobs_job ON subjobs(job_id);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    subjob_id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    at_unix REAL NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS airlock_actions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_unix REAL NOT NULL,
    step TEXT NOT NULL,
    subjob_id TEXT NOT NULL,
    slice_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    bytes_freed INTEGER NOT NULL,
    dry_run INTEGER NOT NULL,
    end_cause TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS tenant_uids (
    tenant TEXT PRIMARY KEY,
    uid INTEGER NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass
class LeaseRow:
    lease_id: str
    job_id: str
    member: int
    allocations_json: str
    score: float
    priority: int
    committed: bool
    subjob_id: str = ""
    created_unix: float = 0.0


@dataclass
class SubjobRow:
    subjob_id: str
    job_id: str
    #: Serialized ``laminar.v1.SubjobSpec``; opaque to the journal.
    spec_blob: bytes
    state: str
    reason: str = ""
    pid: int = 0
    slice_ids_json: str = "[]"
    device_uuids_json: str = "[]"
    created_unix: float = 0.0
    started_unix: float = 0.0
    ended_unix: float = 0.0
    exit_code: int | None = None
    signal: int | None = None
    peak_rss_bytes: int = 0
    peak_gpu_memory_bytes: int = 0
    run_seconds: float = 0.0
    suspended_seconds: float = 0.0
    lease_id: str = ""
    #: Atomized subjobs: units covered by its checkpoint when it ended.
    units_done: int = 0
    #: Why it ended, as a ``laminar_base.causes.EndCause`` token (``readdressed``). A stop the
    #: agent carries out writes its cause here as the stop begins, so the end records it
    #: however the process exits, after an agent restart too; empty while live otherwise.
    end_cause: str = ""
    #: Process ``pid``'s identity as the executor read it at the launch (this boot's id and
    #: the process's start tick, ``executor._process_start``; not ``started_unix``, which is
    #: when the launch's answer arrived and lags it under load): what a restarted agent's
    #: adopt compares the pid's with, against pid reuse. "" when unknown (a row an older
    #: agent wrote): adopt falls back to ``started_unix`` with a second's tolerance.
    pid_start: str = ""
    #: Read-only, joined from the subjob's lease (empty once the lease is gone);
    #: recovery needs them to re-adopt the allocation. Never written by put_subjob.
    allocations_json: str = ""
    priority: int = 0


@dataclass
class EventRow:
    seq: int
    subjob_id: str
    state: str
    reason: str
    at_unix: float
    acked: bool


@dataclass
class ActionRow:
    seq: int
    at_unix: float
    step: str
    subjob_id: str
    slice_id: str
    reason: str
    bytes_freed: int
    dry_run: bool
    #: Reclaims: the end cause token the subjob's end records (``reclaimed``, ``preempted``).
    end_cause: str = ""
    #: The subjob's job, from the subjobs table ("" if the subjob row is gone).
    job_id: str = ""


#: Actions with their subjob's job id (joined, so old journals need no migration).
_ACTION_SELECT = (
    "SELECT a.*, COALESCE(s.job_id, '') AS job_id FROM airlock_actions a "
    "LEFT JOIN subjobs s ON s.subjob_id = a.subjob_id"
)

_JOINED_FIELDS = ("allocations_json", "priority")
_SUBJOB_FIELDS = [f.name for f in dataclasses.fields(SubjobRow) if f.name not in _JOINED_FIELDS]
_SUBJOB_SELECT = (
    "SELECT s.*, COALESCE(l.allocations_json, '') AS allocations_json, "
    "COALESCE(l.priority, 0) AS priority "
    "FROM subjobs s LEFT JOIN leases l ON l.lease_id = s.lease_id AND s.lease_id != ''"
)


def _subjob_from_db(row: sqlite3.Row) -> SubjobRow:
    values: dict[str, Any] = {name: row[name] for name in (*_SUBJOB_FIELDS, *_JOINED_FIELDS)}
    values["spec_blob"] = bytes(values["spec_blob"])
    return SubjobRow(**values)


def connect_private(path: Path, **kwargs: Any) -> sqlite3.Connection:
    """A WAL-mode SQLite connection to a file only its owner may read or write.

    A journal holds every tenant's job specs (commands, environments, secrets in them):
    the database and the ``-wal`` and ``-shm`` files SQLite creates beside it are 0600,
    whatever the process umask, and an older file with wider modes is narrowed."""
    old_umask = os.umask(0o077)
    try:
        conn: sqlite3.Connection = sqlite3.connect(path, isolation_level=None, **kwargs)
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        os.umask(old_umask)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)
    return conn


class Checkpointer:
    """Checkpoints one WAL database (PASSIVE: never waits for, nor blocks, its writers) on
    a worker thread with a connection of its own, every ``every_commits`` commits the
    owner reports with :meth:`committed`; :meth:`defer` moves SQLite's own automatic
    checkpoint, which runs inside a commit, to the backstop. Not covered: a backstop
    checkpoint still runs inside a commit when the worker falls that far behind."""

    def __init__(self, path: Path, every_commits: int = CHECKPOINT_EVERY_COMMITS) -> None:
        self.path = path
        self.every_commits = every_commits
        self._commits = 0
        self._worker: threading.Thread | None = None
        #: Checkpoints the worker completed (tests).
        self.checkpoints = 0

    @staticmethod
    def defer(conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_CHECKPOINT_PAGES}")

    def committed(self) -> None:
        self._commits += 1
        if self._commits >= self.every_commits:
            self.start()

    def reset(self) -> None:
        """Count commits from zero again (those before are not counted); a checkpoint
        under way goes on, and :meth:`close` still waits for it."""
        self._commits = 0

    def start(self) -> None:
        """Checkpoint now on the worker thread, unless one is at it (the next commit asks
        again)."""
        if self._worker is not None and self._worker.is_alive():
            return
        self._commits = 0
        self._worker = threading.Thread(target=self._run, name="journal-checkpoint", daemon=True)
        self._worker.start()

    def _run(self) -> None:
        try:
            # Not connect_private: the files exist, and its umask is process-wide.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            finally:
                conn.close()
        except sqlite3.Error as exc:  # the backstop checkpoint still bounds the WAL
            log.warning("checkpoint of %s failed: %s", self.path, exc)
            return
        self.checkpoints += 1

    def close(self) -> None:
        """Wait for the checkpoint under way, if any (before the owner closes its own)."""
        if self._worker is not None:
            self._worker.join()


class Journal:
    """One SQLite connection; use it from a single thread (the agent's event loop)."""

    def __init__(self, path: Path) -> None:
        """``path`` is the state directory or the ``.db`` file itself."""
        path = Path(path)
        self.path = path if path.suffix == ".db" else path / DB_FILE
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._conn = connect_private(self.path)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA synchronous=NORMAL")
        Checkpointer.defer(self._conn)
        self.checkpointer = Checkpointer(self.path)
        self._batch_depth = 0
        #: Whether the outermost batch has begun its transaction (at its first write).
        self._batch_began = False
        self._migrate()
        # Every heartbeat reads the unacknowledged events and acknowledges what the router
        # confirmed: through this index both touch only the unacknowledged rows, not every
        # event the agent ever journaled (a scan: 0.16 ms per heartbeat at 2,000 events,
        # 15 ms at 200,000). Made at every open, not by a schema version: a journal of
        # version 4 gains it and an older agent still opens the journal.
        self._conn.execute(_EVENTS_UNACKED_INDEX)
        # Uncommitted leases are no longer journaled (they die with the agent); rows an
        # older agent left are never read, so they go now.
        self._write("DELETE FROM leases WHERE committed=0")
        self.checkpointer.reset()  # start-up's commits are not counted

    def _migrate(self) -> None:
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise InvalidArgument(
                f"journal schema version {version} is newer than supported {SCHEMA_VERSION}",
                field="path",
            )
        if version < SCHEMA_VERSION:
            self._conn.execute("BEGIN IMMEDIATE")
            if version == 1:  # v2 added subjobs.units_done
                self._conn.execute(
                    "ALTER TABLE subjobs ADD COLUMN units_done INTEGER NOT NULL DEFAULT 0"
                )
            if 1 <= version < 4:  # v4 added end_cause to subjobs and actions; older have none
                for table in ("subjobs", "airlock_actions"):
                    self._conn.execute(
                        f"ALTER TABLE {table} ADD COLUMN end_cause TEXT NOT NULL DEFAULT ''"
                    )
                # A stop under way at the upgrade was marked only in its reason text (read
                # here once, for the data's sake): it must still end KILLED, so it gets the
                # generic cause. Ended rows keep none; their reason says what happened.
                self._conn.execute(
                    "UPDATE subjobs SET end_cause='terminated' WHERE reason LIKE 'terminating:%' "
                    "AND state IN ('STARTING', 'RUNNING', 'SUSPENDED')"
                )
            if 1 <= version < 5:  # v5 added subjobs.pid_start; older rows read ""
                self._conn.execute(
                    "ALTER TABLE subjobs ADD COLUMN pid_start TEXT NOT NULL DEFAULT ''"
                )
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._conn.execute(stmt)
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._conn.execute("COMMIT")

    @property
    def in_batch(self) -> bool:
        """Whether a :meth:`batch` is open (a write now commits only with the outermost)."""
        return self._batch_depth > 0

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every write inside is one transaction: all of them or (on an exception) none.
        Nests: only the outermost commits. The transaction begins at the first write, so
        a batch that writes nothing (a probe's lease lives in memory) costs no commit."""
        if self._batch_depth:
            self._batch_depth += 1
            try:
                yield
            finally:
                self._batch_depth -= 1
            return
        self._batch_depth = 1
        try:
            yield
        except BaseException:
            self._batch_depth = 0
            if self._batch_began:
                self._batch_began = False
                self._conn.execute("ROLLBACK")
            raise
        self._batch_depth = 0
        if self._batch_began:
            self._batch_began = False
            self._commit()

    def _write(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        if self._batch_depth:
            if not self._batch_began:
                self._conn.execute("BEGIN IMMEDIATE")
                self._batch_began = True
            return self._conn.execute(sql, params)
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            cur = self._conn.execute(sql, params)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._commit()
        return cur

    def _commit(self) -> None:
        self._conn.execute("COMMIT")
        self.checkpointer.committed()

    # -- meta -----------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    @property
    def journal_mode(self) -> str:
        return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0])

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return default if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._write("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    # -- tenant uids (executor.uid_pool) ---------------------------------------
    def tenant_uids(self) -> dict[str, int]:
        rows = self._conn.execute("SELECT tenant, uid FROM tenant_uids").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def put_tenant_uid(self, tenant: str, uid: int) -> None:
        self._write("INSERT INTO tenant_uids(tenant, uid) VALUES (?, ?)", (tenant, uid))

    # -- leases ---------------------------------------------------------------
    def put_lease(
        self,
        lease_id: str,
        job_id: str,
        member: int,
        allocations_json: str,
        score: float,
        priority: int,
        committed: bool,
        subjob_id: str = "",
        created_unix: float | None = None,
    ) -> None:
        self._write(
            "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                lease_id,
                job_id,
                member,
                allocations_json,
                score,
                priority,
                int(committed),
                subjob_id,
                time.time() if created_unix is None else created_unix,
            ),
        )

    def delete_lease(self, lease_id: str) -> bool:
        return self._write("DELETE FROM leases WHERE lease_id=?", (lease_id,)).rowcount > 0

    def leases(self) -> list[LeaseRow]:
        rows = self._conn.execute("SELECT * FROM leases ORDER BY created_unix").fetchall()
        return [
            LeaseRow(
                lease_id=r["lease_id"],
                job_id=r["job_id"],
                member=r["member"],
                allocations_json=r["allocations_json"],
                score=r["score"],
                priority=r["priority"],
                committed=bool(r["committed"]),
                subjob_id=r["subjob_id"],
                created_unix=r["created_unix"],
            )
            for r in rows
        ]

    # -- subjobs --------------------------------------------------------------
    def put_subjob(self, row: SubjobRow) -> None:
        cols = _SUBJOB_FIELDS
        vals = [getattr(row, name) for name in cols]
        vals[cols.index("spec_blob")] = bytes(row.spec_blob)
        placeholders = ", ".join("?" for _ in cols)
        self._write(
            f"INSERT OR REPLACE INTO subjobs ({', '.join(cols)}) VALUES ({placeholders})", vals
        )

    def update_subjob(self, subjob_id: str, **fields: Any) -> None:
        """Update some columns of one subjob; names are :class:`SubjobRow` field names."""
        if not fields:
            return
        unknown = (set(fields) - set(_SUBJOB_FIELDS)) | ({"subjob_id"} & set(fields))
        if unknown:
            raise InvalidArgument(f"unknown subjob fields {sorted(unknown)}", field="fields")
        sets: list[str] = []
        vals: list[Any] = []
        for name, value in fields.items():
            sets.append(f"{name}=?")
            vals.append(bytes(value) if name == "spec_blob" else value)
        cur = self._write(
            f"UPDATE subjobs SET {', '.join(sets)} WHERE subjob_id=?", [*vals, subjob_id]
        )
        if cur.rowcount == 0:
            raise NotFound(f"unknown subjob {subjob_id!r}", field="subjob_id")

    def has_subjob(self, subjob_id: str) -> bool:
        """Whether a row for ``subjob_id`` exists (ended ones too), without reading it."""
        sql = "SELECT 1 FROM subjobs WHERE subjob_id=?"
        return self._conn.execute(sql, (subjob_id,)).fetchone() is not None

    def get_subjob(self, subjob_id: str) -> SubjobRow | None:
        r = self._conn.execute(_SUBJOB_SELECT + " WHERE s.subjob_id=?", (subjob_id,)).fetchone()
        return None if r is None else _subjob_from_db(r)

    def subjobs(
        self, states: Iterable[str] | None = None, job_id: str | None = None
    ) -> list[SubjobRow]:
        where: list[str] = []
        params: list[Any] = []
        if states is not None:
            st = list(states)
            where.append(f"s.state IN ({', '.join('?' for _ in st)})" if st else "0")
            params.extend(st)
        if job_id is not None:
            where.append("s.job_id=?")
            params.append(job_id)
        sql = _SUBJOB_SELECT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY s.created_unix, s.subjob_id"
        return [_subjob_from_db(r) for r in self._conn.execute(sql, params).fetchall()]

    # -- events ---------------------------------------------------------------
    def append_event(
        self, subjob_id: str, state: str, reason: str = "", at_unix: float | None = None
    ) -> int:
        cur = self._write(
            "INSERT INTO events(subjob_id, state, reason, at_unix) VALUES (?, ?, ?, ?)",
            (subjob_id, state, reason, time.time() if at_unix is None else at_unix),
        )
        return int(cur.lastrowid or 0)

    def events_after(self, seq: int, limit: int = 1000) -> list[EventRow]:
        rows = self._conn.execute(
            "SELECT * FROM events WHERE seq>? ORDER BY seq LIMIT ?", (seq, limit)
        ).fetchall()
        return [_event(r) for r in rows]

    def ack_events(self, up_to_seq: int) -> int:
        return self._write(
            "UPDATE events SET acked=1 WHERE seq<=? AND acked=0", (up_to_seq,)
        ).rowcount

    def last_events(self, subjob_id: str, limit: int = 1) -> list[EventRow]:
        """The subjob's newest state events, newest first (read once per subjob after a
        restart: the walk goes back from the newest row and stops at the subjob's
        ``limit``-th)."""
        rows = self._conn.execute(
            "SELECT * FROM events WHERE subjob_id=? ORDER BY seq DESC LIMIT ?", (subjob_id, limit)
        ).fetchall()
        return [_event(r) for r in rows]

    def unacked_events(self, limit: int = 1000) -> list[EventRow]:
        rows = self._conn.execute(
            "SELECT * FROM events WHERE acked=0 ORDER BY seq LIMIT ?", (limit,)
        ).fetchall()
        return [_event(r) for r in rows]

    # -- airlock actions ------------------------------------------------------
    def append_action(
        self,
        step: str,
        subjob_id: str,
        slice_id: str,
        reason: str,
        bytes_freed: int,
        dry_run: bool,
        at_unix: float | None = None,
        end_cause: str = "",
    ) -> int:
        cur = self._write(
            "INSERT INTO airlock_actions(at_unix, step, subjob_id, slice_id, reason, "
            "bytes_freed, dry_run, end_cause) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                time.time() if at_unix is None else at_unix,
                step,
                subjob_id,
                slice_id,
                reason,
                bytes_freed,
                int(dry_run),
                end_cause,
            ),
        )
        return int(cur.lastrowid or 0)

    def actions_after(self, seq: int, limit: int = 100) -> list[ActionRow]:
        """Actions with a sequence number above ``seq``, oldest first."""
        rows = self._conn.execute(
            f"{_ACTION_SELECT} WHERE a.seq>? ORDER BY a.seq LIMIT ?", (seq, limit)
        ).fetchall()
        return [_action(r) for r in rows]

    def actions_of(self, subjob_id: str, since_unix: float) -> list[ActionRow]:
        """The Airlock actions carried out (not dry-run ones) on ``subjob_id`` at or after
        ``since_unix``, oldest first (read once per suspended subjob after a restart)."""
        rows = self._conn.execute(
            f"{_ACTION_SELECT} WHERE a.subjob_id=? AND a.dry_run=0 AND a.at_unix>=? ORDER BY a.seq",
            (subjob_id, since_unix),
        ).fetchall()
        return [_action(r) for r in rows]

    def recent_actions(self, limit: int = 100) -> list[ActionRow]:
        """Most recent actions, oldest first."""
        rows = self._conn.execute(
            f"SELECT * FROM ({_ACTION_SELECT} ORDER BY a.seq DESC LIMIT ?) ORDER BY seq",
            (limit,),
        ).fetchall()
        return [_action(r) for r in rows]

    def close(self) -> None:
        self.checkpointer.close()
        self._conn.close()


def _event(r: sqlite3.Row) -> EventRow:
    return EventRow(
        seq=r["seq"],
        subjob_id=r["subjob_id"],
        state=r["state"],
        reason=r["reason"],
        at_unix=r["at_unix"],
        acked=bool(r["acked"]),
    )


def _action(r: sqlite3.Row) -> ActionRow:
    return ActionRow(
        seq=r["seq"],
        at_unix=r["at_unix"],
        step=r["step"],
        subjob_id=r["subjob_id"],
        slice_id=r["slice_id"],
        reason=r["reason"],
        bytes_freed=r["bytes_freed"],
        dry_run=bool(r["dry_run"]),
        end_cause=r["end_cause"],
        job_id=r["job_id"],
    )
