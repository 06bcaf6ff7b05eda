"""Per-tenant usage (showback): one journal row per subjob that ran, written when it ends.

Why a table and not a rescan of the jobs: a query must cost what the answer
costs (one SQL aggregate over rows since ``since``), not a decode of every job
the zone ever ran. Each subjob that ran is written exactly once, when it reaches
a terminal state at the router (agent event, lost agent, re-addressing, gang
rollback): ``subjob_id`` is the primary key and the insert is ``OR IGNORE``, so
an event seen twice (a re-delivered heartbeat, a router restart that replays
the agents' unacknowledged events) counts once. The row is written *before*
the job row that says the subjob ended, so a crash between the two replays the
end (the agent re-sends it, or the router re-derives it) and never loses it.

A row keeps the rates and the interval, not only the totals, so a query can clip
to ``since`` exactly: GPU units x seconds of ``[max(start, since), end]``.
Subjobs still running are added at query time, up to now, from the live jobs.

What a row measures:

* GPU-seconds: the slice's GPU-equivalents (1 per whole GPU, 3/7 for a
  ``3g.40gb`` MIG instance, milli/1000 of a share) x the agent's recorded run
  time (``run_seconds``), or the router's wall-clock interval when the router
  ended the subjob itself (lost agent, re-addressed copy).
* GPU-memory-byte-seconds: the observed peak GPU memory when the agent
  reported one, else the declared ``gpu_memory_bytes`` (x GPUs), x run seconds.
* Work lost to Airlock: for a subjob reclaimed, preempted or re-addressed, the
  GPU-seconds since its last checkpoint. The wire protocol does not carry
  checkpoint times yet, so the whole run counts (an atomized subjob checkpoints
  only at its end, so for it the whole run *is* the loss). A subjob lost with
  its agent is not Airlock's doing and is not counted as lost.

The pure part (``usage_of``, ``slice_kind``, ``SubjobUsage.clipped``) does no I/O
and is tested without SQLite; ``UsageLedger`` is the store access and metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from laminar_api.v1 import zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    TERMINAL_JOB_STATES,
    end_cause,
    is_airlock_loss,
)
from laminar_base.demand import Demand
from laminar_base.wire import demand_of
from laminar_zone.metrics import MAX_TENANT_LABELS, OTHER_TENANT, ZoneMetrics
from laminar_zone.store import JobStore
from laminar_zone.view import AgentRecord

log = logging.getLogger("laminar.zone.usage")

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    subjob_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    slice_kind TEXT NOT NULL,
    gpu_units REAL NOT NULL,
    memory_bytes INTEGER NOT NULL,
    started_unix REAL NOT NULL,
    ended_unix REAL NOT NULL,
    lost_from_unix REAL NOT NULL,
    gpu_seconds REAL NOT NULL,
    gpu_memory_byte_seconds REAL NOT NULL,
    lost_gpu_seconds REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_ended ON usage(ended_unix);
CREATE INDEX IF NOT EXISTS usage_tenant ON usage(tenant, ended_unix);
"""

#: Journal meta key: set once the rows of jobs journaled before this table existed are in.
BACKFILLED_KEY = "usage_backfilled"
_ENDED = ENDED_SUBJOB_STATES
_LIVE = LIVE_SUBJOB_STATES

_AGGREGATE = """
SELECT tenant, slice_kind, COUNT(*),
       SUM(gpu_units * (ended_unix - MAX(started_unix, :since))),
       SUM(memory_bytes * (ended_unix - MAX(started_unix, :since))),
       SUM(gpu_units * (ended_unix - MAX(lost_from_unix, :since)))
FROM usage
WHERE ended_unix > :since AND (:tenant = '' OR tenant = :tenant)
GROUP BY tenant, slice_kind
"""


@dataclass
class Figures:
    """Usage of one (tenant, slice kind): what GetUsage reports, in base units."""

    subjobs: int = 0
    gpu_seconds: float = 0.0
    gpu_memory_byte_seconds: float = 0.0
    lost_gpu_seconds: float = 0.0

    def add(self, other: Figures) -> None:
        self.subjobs += other.subjobs
        self.gpu_seconds += other.gpu_seconds
        self.gpu_memory_byte_seconds += other.gpu_memory_byte_seconds
        self.lost_gpu_seconds += other.lost_gpu_seconds


@dataclass(frozen=True)
class SubjobUsage:
    """One subjob's use of one slice over ``[started_unix, ended_unix]`` (one usage row).

    ``lost_from_unix`` is where the work Airlock threw away begins (``ended_unix``
    when nothing was lost); it lies within the interval.
    """

    subjob_id: str
    job_id: str
    tenant: str
    slice_kind: str
    gpu_units: float
    memory_bytes: int
    started_unix: float
    ended_unix: float
    lost_from_unix: float

    @property
    def run_seconds(self) -> float:
        return self.ended_unix - self.started_unix

    def clipped(self, since_unix: float) -> Figures:
        """The part of this use after ``since_unix`` (the SQL aggregate computes the same)."""
        if self.ended_unix <= since_unix:
            return Figures()
        seconds = self.ended_unix - max(self.started_unix, since_unix)
        lost = self.ended_unix - max(self.lost_from_unix, since_unix)
        return Figures(
            subjobs=1,
            gpu_seconds=self.gpu_units * seconds,
            gpu_memory_byte_seconds=self.memory_bytes * seconds,
            lost_gpu_seconds=self.gpu_units * max(0.0, lost),
        )


def slice_kind(need: Demand, agent_shapes: Iterable[str]) -> str:
    """``gpu:<model>``, ``mig:<profile>``, ``share:<model>`` or ``cpu``.

    The model is the one the job asked for, else the agent's only model of that
    shape (from its heartbeat), else ``any`` (unknown agent, or several models).
    """
    if need.mig_profile:
        return f"mig:{need.mig_profile}"
    if need.gpu_milli:
        prefix = "share:"
    elif need.gpus:
        prefix = "gpu:"
    else:
        return "cpu"
    model = need.gpu_model
    if not model:
        models = {s[len(prefix) :] for s in agent_shapes if s.startswith(prefix)}
        model = models.pop() if len(models) == 1 else "any"
    return f"{prefix}{model}"


def usage_of(
    placement: zone_pb2.Placement,
    *,
    job_id: str,
    tenant: str,
    need: Demand,
    kind: str,
    now_unix: float,
    checkpoint_unix: float = 0.0,
) -> SubjobUsage | None:
    """The usage row of one subjob, ended or (up to ``now_unix``) running; None if it never ran.

    ``checkpoint_unix`` is the time of the subjob's last checkpoint where known
    (0: none, the whole run is lost if Airlock ends it).
    """
    p = placement
    if p.started_unix <= 0 and p.run_seconds <= 0:
        return None  # never started: a failed commit, or still committing
    ended = p.state in _ENDED
    end = p.ended_unix if ended and p.ended_unix > 0 else now_unix
    # The agent's own clock where it reported one: the figure users see on the subjob.
    run = p.run_seconds if ended and p.run_seconds > 0 else max(0.0, end - p.started_unix)
    start = end - run
    lost_from = end
    if ended and is_airlock_loss(p.end_cause):
        lost_from = min(end, max(start, checkpoint_unix))
    return SubjobUsage(
        subjob_id=p.subjob_id,
        job_id=job_id,
        tenant=tenant,
        slice_kind=kind,
        gpu_units=need.gpu_units,
        memory_bytes=int(p.peak_gpu_memory_bytes) or need.memory_bytes,
        started_unix=start,
        ended_unix=end,
        lost_from_unix=lost_from,
    )


def records_from(figures: dict[tuple[str, str], Figures]) -> list[zone_pb2.UsageRecord]:
    """UsageRecords in (tenant, slice kind) order."""
    return [
        zone_pb2.UsageRecord(
            tenant=tenant,
            slice_kind=kind,
            gpu_seconds=f.gpu_seconds,
            gpu_memory_byte_seconds=f.gpu_memory_byte_seconds,
            lost_gpu_seconds=f.lost_gpu_seconds,
            subjobs=f.subjobs,
        )
        for (tenant, kind), f in sorted(figures.items())
    ]


@dataclass(frozen=True)
class Written:
    """What :meth:`UsageLedger.write` inserted: the rows, and those that were new."""

    jobs: Sequence[zone_pb2.Job]
    rows: list[SubjobUsage]
    fresh: list[SubjobUsage]


class UsageLedger:
    """The ``usage`` table in the router's journal, and the usage counters.

    ``agents`` is the zone view's live map of agents; the shapes an agent
    advertises supply the GPU model of a slice kind.
    """

    def __init__(
        self, store: JobStore, metrics: ZoneMetrics, agents: Mapping[str, AgentRecord]
    ) -> None:
        self._db = store.db
        self._store = store
        self._metrics = metrics
        self._agents = agents
        #: Subjob ids already written, per job still live (bounded by the live jobs).
        self._written: dict[str, set[str]] = {}
        #: Ended subjob ids already counted by cause, per job still live.
        self._ends_counted: dict[str, set[str]] = {}
        self._tenant_labels: set[str] = set()
        self._db.executescript(SCHEMA)
        if store.get_meta(BACKFILLED_KEY) != "1":
            self._backfill(store)
            store.set_meta(BACKFILLED_KEY, "1")

    def _shapes(self, agent_id: str) -> Iterable[str]:
        record = self._agents.get(agent_id)
        return record.shapes if record is not None else ()

    def _backfill(self, store: JobStore) -> None:
        """Rows for subjobs that ended before this table existed (an upgraded journal)."""
        now = time.time()
        rows = [u for job in store.iter_all() for u in self._rows(job, _ENDED, now)]
        if rows:
            written = self._insert(rows)  # one transaction, however long the journal
            log.info("usage: backfilled %d subjob row(s) from the job journal", len(written))

    def record(self, job: zone_pb2.Job, now_unix: float) -> int:
        """Write a row for each subjob of ``job`` that ended and is not written yet.

        Call it before journaling the job. Returns how many rows were new.
        """
        with self._store.transaction():
            rows = self.write([job], now_unix)
        return self.written(rows)

    def write(self, jobs: Sequence[zone_pb2.Job], now_unix: float) -> Written:
        """Insert the rows of every subjob of ``jobs`` that ended and is not written yet,
        in the caller's transaction (a save commits the usage rows with the jobs): pass
        what it returns to :meth:`written` once that transaction committed. A transaction
        rolled back leaves them unwritten, to be written by the next save."""
        rows: list[SubjobUsage] = []
        for job in jobs:
            done = self._written.get(job.job_id, ())
            rows.extend(u for u in self._rows(job, _ENDED, now_unix) if u.subjob_id not in done)
        return Written(jobs, rows, self._insert(rows) if rows else [])

    def written(self, rows: Written) -> int:
        """Rows of :meth:`write` are in the journal: count them; returns how many were new."""
        for u in rows.rows:
            self._written.setdefault(u.job_id, set()).add(u.subjob_id)
        for usage in rows.fresh:
            self._count(usage)
        for job in rows.jobs:
            self._count_ends(job)
            if job.state in TERMINAL_JOB_STATES and not any(
                p.state in _LIVE for p in job.placements
            ):
                self._written.pop(job.job_id, None)
                self._ends_counted.pop(job.job_id, None)
        return len(rows.fresh)

    def ends_known(self, job: zone_pb2.Job) -> None:
        """A job loaded from the journal at recovery: its ended subjobs were counted by the
        router that journaled them, so they are not counted again."""
        ended = {p.subjob_id for p in job.placements if p.state in _ENDED}
        if ended:
            self._ends_counted[job.job_id] = ended

    def _count_ends(self, job: zone_pb2.Job) -> None:
        """``laminar_zone_subjobs_ended_total{cause}``: each subjob once, when the router
        has journaled its end (started or not: launch and commit failures count too)."""
        for p in job.placements:
            if p.state not in _ENDED:
                continue
            seen = self._ends_counted.setdefault(job.job_id, set())
            if p.subjob_id in seen:
                continue
            seen.add(p.subjob_id)
            token = end_cause(p.end_cause).token or "unspecified"
            self._metrics.subjobs_ended.labels(token).inc()

    def _rows(
        self, job: zone_pb2.Job, states: frozenset[int], now_unix: float
    ) -> Iterator[SubjobUsage]:
        """Usage of the job's subjobs in ``states`` that ran (running ones up to now)."""
        job_need: Demand | None = None
        for p in job.placements:
            if p.state not in states:
                continue
            if p.HasField("resources"):  # an atomized subjob, sized to its window
                need = demand_of(p.resources)
            else:
                if job_need is None:
                    job_need = demand_of(job.spec.resources)
                need = job_need
            usage = usage_of(
                p,
                job_id=job.job_id,
                tenant=job.spec.tenant,
                need=need,
                kind=slice_kind(need, self._shapes(p.agent_id)),
                now_unix=now_unix,
            )
            if usage is not None:
                yield usage

    def _insert(self, rows: Iterable[SubjobUsage]) -> list[SubjobUsage]:
        """INSERT OR IGNORE in one transaction; returns the rows that were new."""
        fresh: list[SubjobUsage] = []
        with self._store.transaction():
            for u in rows:
                cursor = self._db.execute(
                    "INSERT OR IGNORE INTO usage(subjob_id, job_id, tenant, slice_kind,"
                    " gpu_units, memory_bytes, started_unix, ended_unix, lost_from_unix,"
                    " gpu_seconds, gpu_memory_byte_seconds, lost_gpu_seconds)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        u.subjob_id,
                        u.job_id,
                        u.tenant,
                        u.slice_kind,
                        u.gpu_units,
                        u.memory_bytes,
                        u.started_unix,
                        u.ended_unix,
                        u.lost_from_unix,
                        u.gpu_units * u.run_seconds,
                        u.memory_bytes * u.run_seconds,
                        u.gpu_units * (u.ended_unix - u.lost_from_unix),
                    ),
                )
                if cursor.rowcount == 1:
                    fresh.append(u)
        return fresh

    def _count(self, u: SubjobUsage) -> None:
        tenant = u.tenant
        if tenant not in self._tenant_labels:
            if len(self._tenant_labels) >= MAX_TENANT_LABELS:
                tenant = OTHER_TENANT
            else:
                self._tenant_labels.add(tenant)
        figures = u.clipped(u.started_unix)
        m = self._metrics
        m.usage_gpu_seconds.labels(tenant, u.slice_kind).inc(figures.gpu_seconds)
        m.usage_gpu_memory_byte_seconds.labels(tenant, u.slice_kind).inc(
            figures.gpu_memory_byte_seconds
        )
        m.usage_lost_gpu_seconds.labels(tenant, u.slice_kind).inc(figures.lost_gpu_seconds)
        if figures.lost_gpu_seconds > 0:
            log.info(
                "usage: subjob %s of tenant %s lost %.1f GPU-seconds to Airlock (%s, %.3f GPUs)",
                u.subjob_id,
                u.tenant,
                figures.lost_gpu_seconds,
                u.slice_kind,
                u.gpu_units,
            )

    def report(
        self,
        tenant: str,
        since_unix: float,
        live_jobs: Iterable[zone_pb2.Job],
        now_unix: float,
    ) -> list[zone_pb2.UsageRecord]:
        """Usage since ``since_unix`` by (tenant, slice kind): the table plus running subjobs.

        ``tenant`` empty means every tenant.
        """
        figures: dict[tuple[str, str], Figures] = {}
        for row in self._db.execute(_AGGREGATE, {"since": since_unix, "tenant": tenant}):
            figures[(row[0], row[1])] = Figures(
                subjobs=int(row[2]),
                gpu_seconds=float(row[3] or 0.0),
                gpu_memory_byte_seconds=float(row[4] or 0.0),
                lost_gpu_seconds=max(0.0, float(row[5] or 0.0)),
            )
        for job in live_jobs:
            if tenant and job.spec.tenant != tenant:
                continue
            for usage in self._rows(job, _LIVE, now_unix):
                part = usage.clipped(since_unix)
                if part.subjobs:
                    figures.setdefault((usage.tenant, usage.slice_kind), Figures()).add(part)
        return records_from(figures)
