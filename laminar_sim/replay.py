"""Experiment ``replay``: the Philly trace (as published with Pollux) replayed in time.

Each job of ``philly_jobs_pollux.csv`` (``timestamp, duration, num_gpus, gpu_time,
cluster``) arrives at its time and runs for its duration on whole GPUs: up to
``gpus_per_host`` GPUs on one host, or a gang of full hosts (``ceil(n / gpus_per_host)``
members placed all or nothing) for bigger jobs.

**laminar** drives the router's own decisions: the queue walk
(:class:`laminar_zone.queue.QueueWalk`: order by ``order_key`` with the tenant's running
GPUs as fair share, per-family blocked heads, EASY backfill against the head's expected
start from :func:`laminar_zone.placement.expected_start`; run times are the trace's, given
to the router as the jobs' declared ``expected_seconds``), and each placement try through
the router's :class:`laminar_zone.gather.Gather` (probe plan, late binding, gangs) over
hosts that are the agent's own :class:`~laminar_agent.ledger.Ledger`.

**fifo** is the baseline: one queue served strictly in arrival order (no backfill), each
job on the first hosts that fit, with exact knowledge of every host.

Reported per policy: queue time and job completion time (mean, p50, p99), GPU
utilization (busy GPU-seconds over capacity times the makespan), and fragmentation: the
time-averaged share of the cluster's GPUs that were free while the head of the queue
could not start although the free GPUs added up to what it needed. Both are averaged over
the arrival window (first to last arrival), not the drain after it.

Network delay is not modelled here: the jobs run for minutes to days, so a placement's
milliseconds do not show. Issue 6 adds an ``atomized`` mode next to ``rigid``.
"""

from __future__ import annotations

import csv
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from laminar_agent.ledger import Granted, ProbeOrder
from laminar_base.demand import Demand
from laminar_sim.engine import Engine
from laminar_sim.laminar import SimHost, settle
from laminar_zone.gather import Bind, Gather, ProbeHost
from laminar_zone.placement import Offer, expected_start
from laminar_zone.queue import QueueItem, QueueWalk, order_key, walk_queue
from laminar_zone.view import ProbeLimits, ProbePlan, ZoneView

ProgressFn = Callable[[str, int, int], None]
POLICIES = ("laminar", "fifo")


@dataclass(frozen=True)
class TraceJob:
    index: int
    arrival: float
    duration: float
    gpus: int


@dataclass(frozen=True)
class ReplaySpec:
    trace: Path
    cluster: str = ""
    limit_jobs: int = 2000
    hosts: int = 32
    gpus_per_host: int = 8
    seed: int = 1
    #: Arrival times are divided by this (durations kept): raises the offered load.
    speedup: float = 1.0
    policies: tuple[str, ...] = POLICIES


def read_jobs(spec: ReplaySpec) -> list[TraceJob]:
    """Jobs of the trace (one cluster if given), by arrival, times from the first arrival."""
    path = spec.trace / "philly_jobs_pollux.csv" if spec.trace.is_dir() else spec.trace
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if spec.cluster and row["cluster"] != spec.cluster:
                continue
            gpus = int(float(row["num_gpus"]))
            if gpus < 1 or gpus > spec.hosts * spec.gpus_per_host:
                continue  # a job this cluster can never hold is left out (reported)
            at = datetime.fromisoformat(row["timestamp"]).timestamp()
            rows.append((at, max(1.0, float(row["duration"])), gpus))
    rows.sort()
    rows = rows[: spec.limit_jobs] if spec.limit_jobs else rows
    if not rows:
        return []
    first = rows[0][0]
    return [TraceJob(i, (at - first) / spec.speedup, d, g) for i, (at, d, g) in enumerate(rows)]


def _shape(job: TraceJob, per_host: int) -> tuple[Demand, int]:
    if job.gpus <= per_host:
        return Demand(gpus=job.gpus), 1
    return Demand(gpus=per_host), math.ceil(job.gpus / per_host)


@dataclass
class _Stats:
    queue: list[float] = field(default_factory=list)
    jct: list[float] = field(default_factory=list)
    busy_gpu_seconds: float = 0.0
    frag_gpu_seconds: float = 0.0
    probes: int = 0
    bounces: int = 0
    events: int = 0
    wall_seconds: float = 0.0
    makespan: float = 0.0

    def report(self, capacity: int, jobs: int, window: float) -> dict[str, Any]:
        def summary(values: list[float]) -> dict[str, float]:
            if not values:
                return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
            ordered = sorted(values)

            def pct(q: float) -> float:
                return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

            return {
                "mean": round(statistics.fmean(ordered), 1),
                "p50": round(pct(0.5), 1),
                "p99": round(pct(0.99), 1),
            }

        span = max(window, 1e-9)
        return {
            "jobs": jobs,
            "finished": len(self.jct),
            "queue_seconds": summary(self.queue),
            "jct_seconds": summary(self.jct),
            "queue_percentiles_seconds": _percentiles(self.queue),
            "gpu_utilization_ratio": round(self.busy_gpu_seconds / (capacity * span), 4),
            "fragmentation_ratio": round(self.frag_gpu_seconds / (capacity * span), 4),
            "makespan_seconds": round(self.makespan, 1),
            "probes_per_job": round(self.probes / max(1, jobs), 3),
            "bounces_per_job": round(self.bounces / max(1, jobs), 3),
            "events_processed": self.events,
            "events_per_second": round(self.events / self.wall_seconds) if self.wall_seconds else 0,
        }


def _percentiles(values: list[float]) -> list[float]:
    """Each percentile 1..100 of ``values`` (nearest rank), for plots."""
    if not values:
        return []
    ordered = sorted(values)
    return [
        round(ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))], 1)
        for q in range(1, 101)
    ]


class _Replay:
    """Shared bookkeeping: arrivals, starts, ends, utilization and fragmentation clocks."""

    def __init__(self, spec: ReplaySpec, jobs: list[TraceJob]) -> None:
        self.spec = spec
        self.jobs = jobs
        self.engine = Engine(spec.seed)
        self.hosts = [
            SimHost(f"h{i}", "V100", spec.gpus_per_host, 10**9, 10**9) for i in range(spec.hosts)
        ]
        self.capacity = spec.hosts * spec.gpus_per_host
        self.free = self.capacity
        self.queue: list[TraceJob] = []
        #: Running jobs: expected end and GPUs held (what the queue's expected start reads).
        self.ends: dict[int, tuple[float, int]] = {}
        self.stats = _Stats()
        self.last = 0.0
        self.frag_now = 0
        self.window_end = jobs[-1].arrival if jobs else 0.0

    def clock(self) -> None:
        """Integrate busy and fragmented GPUs over the arrival window (not the drain after)."""
        now = self.engine.now
        span = max(0.0, min(now, self.window_end) - min(self.last, self.window_end))
        self.stats.busy_gpu_seconds += span * (self.capacity - self.free)
        self.stats.frag_gpu_seconds += span * self.frag_now
        self.last = now

    def arrive(self, job: TraceJob) -> None:
        self.clock()
        self.queue.append(job)
        self.schedule()

    def started(self, job: TraceJob, subjobs: list[tuple[SimHost, str]]) -> None:
        """``subjobs``: (host, subjob id) of each member, committed by the agent's core."""
        now = self.engine.now
        held = 0
        for host, subjob_id in subjobs:
            held += sum(a.milli for a in host.allocations(subjob_id)) // 1000
        self.free -= held
        self.ends[job.index] = (now + job.duration, held)
        self.stats.queue.append(now - job.arrival)

        def end() -> None:
            self.clock()
            for host, subjob_id in subjobs:
                host.end(subjob_id, self.engine.now)
                self.ended_on(host)
            self.free += held
            del self.ends[job.index]
            self.stats.jct.append(self.engine.now - job.arrival)
            self.schedule()

        self.engine.schedule(job.duration, end)

    def ended_on(self, host: SimHost) -> None:
        """A host freed capacity (the router folds its summary in)."""

    def schedule(self) -> None:
        raise NotImplementedError

    def head_blocked(self, head: TraceJob) -> None:
        """The head cannot start: free GPUs that would be enough in total are fragmented."""
        self.frag_now = self.free if self.free >= head.gpus else 0

    def run(self, name: str, progress: ProgressFn | None) -> dict[str, Any]:
        for job in self.jobs:
            self.engine.schedule_at(job.arrival, partial(self.arrive, job))
        started = time.perf_counter()
        while self.engine.pending:
            stats = self.engine.run(max_events=5000)
            self.stats.events += stats.events_processed
            if progress is not None:
                progress(name, len(self.stats.jct), len(self.jobs))
            if stats.events_processed == 0:
                break
        self.clock()
        self.stats.wall_seconds = time.perf_counter() - started
        self.stats.makespan = self.engine.now
        return self.stats.report(self.capacity, len(self.jobs), self.window_end)


class LaminarReplay(_Replay):
    """The zone router's queue order, EASY backfill and probe path over agents' ledgers."""

    def __init__(self, spec: ReplaySpec, jobs: list[TraceJob]) -> None:
        super().__init__(spec, jobs)
        self.view = ZoneView(1e18)
        self.by_id = {h.agent_id: h for h in self.hosts}
        for host in self.hosts:
            self.note(host)
        self.rng = random.Random(spec.seed)
        self.limits = ProbeLimits(sample_size=8, probes_per_attempt=4)

    def note(self, host: SimHost) -> None:
        self.view.update(host.agent_id, "", host.shapes(), heat=0, draining=False, now=0.0)

    def item(self, job: TraceJob) -> QueueItem:
        need, gang = _shape(job, self.spec.gpus_per_host)
        return QueueItem(f"j{job.index}", 3, "philly", job.arrival, need, gang, job.duration)

    def schedule(self) -> None:
        """The router's queue walk (:class:`QueueWalk`): order, per-family heads, EASY backfill."""
        usage = self.running_units()
        self.queue.sort(key=lambda j: order_key(self.item(j), usage, {}))
        now = self.engine.now
        walk = QueueWalk(now)
        self.queue = walk_queue(walk, self.queue, self.item, self.try_start, self.head_start)
        if not walk.heads:
            self.frag_now = 0

    def try_start(self, job: TraceJob) -> bool:
        leases = self.place(job)
        if leases is not None:
            self.started(job, leases)
        return leases is not None

    def head_start(self, job: TraceJob, units_ahead: float) -> float | None:
        """``job`` became the blocked head (fragmentation is measured now): its expected start."""
        self.head_blocked(job)
        releases = [(end, float(gpus)) for end, gpus in self.ends.values()]
        return expected_start(self.engine.now, float(self.free), releases, units_ahead, job.gpus)

    def running_units(self) -> dict[str, float]:
        """GPU-equivalents each tenant runs now: the fair-share term of the queue order."""
        return {"philly": float(sum(gpus for _, gpus in self.ends.values()))}

    def started(self, job: TraceJob, leases: list[tuple[SimHost, str]]) -> None:
        super().started(job, leases)
        for host, _ in leases:
            self.note(host)

    def ended_on(self, host: SimHost) -> None:
        self.note(host)

    def place(self, job: TraceJob) -> list[tuple[SimHost, str]] | None:
        need, gang = _shape(job, self.spec.gpus_per_host)
        machine = Gather(ProbePlan(self.view, need, self.limits, self.rng), gang)
        now = self.engine.now

        def probe(step: ProbeHost) -> tuple[list[Offer], list[str]]:
            host = self.by_id[step.record.agent_id]
            orders = [
                ProbeOrder(f"{job.index}/{m}", f"j{job.index}", m, need, 3, 0.0, m, 60.0)
                for m in range(step.members)
            ]
            grants: list[Offer] = []
            bounces: list[str] = []
            for reply in host.arbitrate(orders, now):
                self.stats.probes += 1
                if isinstance(reply, Granted):
                    lease = reply.lease
                    grants.append(Offer(lease.lease_id, host.agent_id, lease.member, lease.score))
                else:
                    self.stats.bounces += 1
                    bounces.append(reply.reason)
            self.note(host)
            return grants, bounces

        def release(offer: Offer) -> None:
            host = self.by_id[offer.agent_id]
            host.release(offer.lease_id)
            self.note(host)

        outcome = settle(machine, probe, release, now)
        if not isinstance(outcome, Bind):
            return None
        chosen = []
        for offer in outcome.offers:
            host = self.by_id[offer.agent_id]
            subjob_id = f"j{job.index}-m{offer.member}"
            host.commit(offer.lease_id, subjob_id, now)
            chosen.append((host, subjob_id))
            self.note(host)
        return chosen


class FifoReplay(_Replay):
    """Strict arrival order, no backfill, first fit with exact knowledge of every host."""

    def schedule(self) -> None:
        while self.queue:
            job = self.queue[0]
            leases = self.place(job)
            if leases is None:
                self.head_blocked(job)
                return
            self.queue.pop(0)
            self.started(job, leases)
        self.frag_now = 0

    def place(self, job: TraceJob) -> list[tuple[SimHost, str]] | None:
        need, gang = _shape(job, self.spec.gpus_per_host)
        chosen: list[tuple[SimHost, str]] = []
        for host in self.hosts:
            if len(chosen) == gang:
                break
            order = ProbeOrder(f"{job.index}", f"j{job.index}", 0, need, 3, 0.0, 0, 60.0)
            self.stats.probes += 1
            reply = host.arbitrate([order], self.engine.now)[0]
            if isinstance(reply, Granted):
                chosen.append((host, reply.lease.lease_id))
        if len(chosen) < gang:
            for host, lease_id in chosen:
                host.release(lease_id)
            return None
        started = []
        for member, (host, lease_id) in enumerate(chosen):
            subjob_id = f"j{job.index}-m{member}"
            host.commit(lease_id, subjob_id, self.engine.now)
            started.append((host, subjob_id))
        return started


def run_replay(spec: ReplaySpec, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Both policies on the same jobs; the JSON-ready report of ``laminar sim replay``."""
    jobs = read_jobs(spec)
    if not jobs:
        raise ValueError(f"--trace: no job of cluster {spec.cluster!r} fits {spec.hosts} hosts")
    report: dict[str, Any] = {
        "experiment": "replay",
        "mode": "rigid",
        "trace": str(spec.trace),
        "cluster": spec.cluster or "all",
        "jobs": len(jobs),
        "hosts": spec.hosts,
        "gpus_per_host": spec.gpus_per_host,
        "offered_gpu_seconds": round(sum(j.gpus * j.duration for j in jobs), 1),
        "arrival_span_seconds": round(jobs[-1].arrival, 1),
        "speedup": spec.speedup,
        "offered_load": round(
            sum(j.gpus * j.duration for j in jobs)
            / (spec.hosts * spec.gpus_per_host * max(jobs[-1].arrival, 1.0)),
            3,
        ),
        "policies": {},
    }
    for name in spec.policies:
        cls = LaminarReplay if name == "laminar" else FifoReplay
        report["policies"][name] = cls(spec, jobs).run(name, progress)
    return report
