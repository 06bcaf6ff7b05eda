"""Experiment ``replay``: the Philly trace (as published with Pollux) replayed in time.

Each job of ``philly_jobs_pollux.csv`` (``timestamp, duration, num_gpus, gpu_time,
cluster``) arrives at its time and runs for its duration on whole GPUs: up to
``gpus_per_host`` GPUs on one host, or a gang of full hosts (``ceil(n / gpus_per_host)``
members placed all or nothing) for bigger jobs.

**laminar** drives the router's own decision core (:class:`laminar_zone.core.ZoneCore`):
each trace job is submitted as a ``zone_pb2.Job`` (one tenant, batch class, the trace's
run time as its declared ``expected_seconds``) and routed by the core; queue passes and
placement tries are the steps :mod:`laminar_zone.trying` strings together (order by
``order_key`` with the tenants' usage from the core, per-family blocked heads, EASY
backfill against the core's expected start; the router's default probe limits,
fragmentation ranking, commit on probe and host heat); the hosts are agents' own
:class:`~laminar_agent.core.AgentCore` over their ledgers, and a subjob's end goes back to
the core as the agent's report, so retries and end causes are the router's.

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
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from laminar_agent.core import FAILED, KILLED, SUCCEEDED, EndDecision
from laminar_agent.ledger import Granted, ProbeOrder
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import TERMINAL_JOB_STATES, EndCause
from laminar_base.demand import Demand
from laminar_base.fragmentation import MILLI_SLICING, ObservedWorkload
from laminar_sim.engine import Engine
from laminar_sim.laminar import SimHost
from laminar_sim.zone_driver import (
    CoreHands,
    CoreHost,
    commit_at_once,
    drive,
    end_on,
    gather_at_once,
    report_end,
    start_on,
    submit,
)
from laminar_zone.config import PlacementSettings
from laminar_zone.core import (
    Instruction,
    Loop,
    NewJob,
    TryPlan,
    ZoneCore,
)
from laminar_zone.entry import Entry
from laminar_zone.lifecycle import job_of
from laminar_zone.trying import (
    ClearMarket,
    Clock,
    CloseRound,
    CommitMembers,
    DoInstructions,
    Gathered,
    GatherLeases,
    OpenRound,
    PassStep,
    Round,
    RunInstructions,
    SettleStarts,
    Slot,
    StartJob,
    TryStep,
    pass_steps,
    place_try,
)
from laminar_zone.view import ProbePlan, ZoneView, learned_ranking

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


class CoreOwner(Protocol):
    """What a simulator built on :class:`CoreDriver` keeps itself: its clocks and figures,
    a placed job's run (when each member exits), and (atomized work) the market's round."""

    def clock(self) -> None:
        """Integrate the figures up to now (something is about to change)."""

    def subjob_started(self, host: CoreHost, subjob_id: str, slice_ids: tuple[str, ...]) -> None:
        """The agent committed a subjob of a rigid job on these slices."""

    def subjob_ended(self, host: CoreHost, placement: zone_pb2.Placement) -> None:
        """The agent ended the subjob: its slices are free again."""

    def job_placed(self, entry: Entry) -> None:
        """A placement try placed the job: its members run (the owner schedules their ends
        with :meth:`CoreDriver.end_subjob`)."""

    def job_ended(self, entry: Entry) -> None:
        """The core ended the job (succeeded, or failed with no retry left)."""

    def open_round(self, step: OpenRound) -> Round | None:
        """The market's round for this pass, or None when no atomized work waits."""

    def clear_market(self, step: ClearMarket) -> None:
        """Run the clearing round ``step.step`` asks."""

    def close_round(self, step: CloseRound) -> None:
        """The pass's last class is done: close the round."""

    def pass_done(self, kept: list[Entry]) -> None:
        """The pass left ``kept`` (rigid jobs) waiting."""


class CoreDriver:
    """The zone router's own decision core (:class:`~laminar_zone.core.ZoneCore`) over
    simulated agents, answered at once: the one driver of the core's steps every replay
    shares (``sim replay`` on whole GPUs, and the rigid jobs of ``sim replay --mode``).

    Jobs are ``zone_pb2.Job`` entries (:meth:`submit`: the core routes and kicks them);
    a queue pass is :func:`laminar_zone.trying.pass_steps` and a placement try
    :func:`laminar_zone.trying.place_try`; a gather is the router's
    :class:`~laminar_zone.gather.Gather` settled over the hosts (:func:`settle`) with the
    router's probe plan over a :class:`~laminar_zone.view.ZoneView` fed the hosts'
    summaries, its default probe limits and its fragmentation ranking; a commit is
    ``AgentCore.commit``; a subjob's end is ``AgentCore.end`` reported back to the core
    (``ZoneCore.report`` and ``evaluate``), so retries and end causes are the router's.
    The market's round (OpenRound, ClearMarket, CloseRound) and what a placed job's
    members do are the ``owner``'s."""

    def __init__(
        self,
        engine: Engine,
        hosts: Sequence[CoreHost],
        owner: CoreOwner,
        seed: int,
        *,
        atoms: Collection[str] = frozenset(),
        demand_of: Callable[[common_pb2.Resources], Demand] | None = None,
    ) -> None:
        """``atoms``: the jobs the owner's market places (the core skips them in its
        walks); ``demand_of``: what an atomized piece's placement holds (tenant usage)."""
        self.engine = engine
        self.owner = owner
        self.view = ZoneView(1e18)
        self.by_id = {h.agent_id: h for h in hosts}
        #: Hosts whose summary changed since the view last read it.
        self.stale: dict[str, CoreHost] = {}
        for host in hosts:
            self.note(host)
        self.rng = random.Random(seed)
        self.settings = PlacementSettings()
        self.workload = ObservedWorkload(
            MILLI_SLICING, min_observed=self.settings.workload_min_observed
        )
        self.core = ZoneCore(self.view, {}, may_forward=False, atoms=atoms, demand_of=demand_of)
        self.hands = CoreHands(
            self.core,
            "sim replay",
            place=lambda entry, from_queue: self.place(entry, from_queue=from_queue),
            wake=self.wake,
            wakes=frozenset(Loop),
            terminate=self.terminate,
            release=self.release,
        )
        self.clocks = Clock(mono=lambda: self.engine.now, unix=lambda: self.engine.now)
        self.pass_due = False
        self.in_pass = False
        self._probe_ids = itertools.count()
        #: Subjobs the agents run now (what a stop or an exit ends once).
        self.live: set[str] = set()

    def note(self, host: CoreHost) -> None:
        """The host's summary changed: the router's view holds it (a probe reply or a
        heartbeat carries it) from the next time anything reads the view (:meth:`sync`;
        nothing else changes the host in between, so the view reads what it would)."""
        self.stale[host.agent_id] = host

    def sync(self) -> None:
        """Fold the changed hosts' summaries into the router's view."""
        for host in self.stale.values():
            self.view.update(
                host.agent_id,
                host.agent_id,
                host.shapes(),
                heat=host.core.ledger.pending_leases(),
                draining=False,
                now=self.engine.now,
            )
        self.stale.clear()

    # ---------------------------------------------------------------- events

    def submit(self, spec: zone_pb2.JobSpec, need: Demand, job_id: str) -> Entry:
        """A Submit: the core makes the job's record, routes it and kicks it."""
        self.sync()
        return submit(self.core, spec, need, NewJob(job_id, "sim"), self.engine.now, self.carry_out)

    def queue_pass(self) -> None:
        """The router's queue pass (:func:`laminar_zone.trying.pass_steps`)."""
        self.pass_due = False
        self.owner.clock()
        steps = pass_steps(self.core, shares={}, backfill=True, rng=self.rng, clock=self.clocks)
        self.in_pass = True
        self.sync()
        kept: list[Entry] = drive(steps, self.answer_pass)
        self.in_pass = False
        self.owner.pass_done(kept)

    def answer_pass(self, step: PassStep) -> Any:
        """A pass's request, answered at once; the view then holds every changed host."""
        answer: Any = None
        if isinstance(step, DoInstructions):
            self.carry_out(step.instructions)
        elif isinstance(step, StartJob):
            answer = self.place(step.entry, from_queue=True)
        elif isinstance(step, SettleStarts):
            answer = list(step.entries)  # each StartJob's answer was its try's result
        elif isinstance(step, OpenRound):
            answer = self.owner.open_round(step)
        elif isinstance(step, ClearMarket):
            self.owner.clear_market(step)
        else:
            assert isinstance(step, CloseRound)
            self.owner.close_round(step)
        self.sync()
        return answer

    def wake(self) -> None:
        """The router's queue wake: a pass at this instant. A wake from the pass's own tries
        (a try that found nothing queues its job and wakes the queue) is not one: the
        router's next pass, ``queue.min_pass_seconds`` later, would see the same hosts, as
        nothing changes here between events."""
        if self.in_pass:
            return
        if not self.pass_due:
            self.pass_due = True
            self.engine.schedule(0.0, self.queue_pass)

    def carry_out(self, instructions: Sequence[Instruction]) -> None:
        """The core's instructions, carried out at once (:class:`CoreHands`): one pass
        serves the queue and the market (class order); commits are never lost here."""
        self.hands.carry_out(instructions)

    def terminate(self, placement: zone_pb2.Placement, why: str, cause: EndCause) -> None:
        self.engine.schedule(0.0, partial(self.stop, placement, why, cause))

    def release(self, host: CoreHost, lease_id: str) -> None:
        host.release(lease_id)
        self.note(host)

    # ---------------------------------------------------------------- a placement try

    def place(self, entry: Entry, *, from_queue: bool) -> bool:
        """One placement try (:func:`laminar_zone.trying.place_try`), answered at once."""
        steps = place_try(
            self.core,
            entry,
            from_queue=from_queue,
            lease_ttl_seconds=self.settings.lease_ttl_seconds,
            budget_seconds=self.settings.budget_seconds,
            clock=self.clocks,
        )
        self.sync()
        placed = bool(drive(steps, self.answer_try))
        if placed:
            self.owner.job_placed(entry)
        return placed

    def answer_try(self, step: TryStep) -> Any:
        """A try's request, answered at once; the view then holds every changed host."""
        answer: Any = None
        if isinstance(step, (RunInstructions, DoInstructions)):
            self.carry_out(step.instructions)
        elif isinstance(step, GatherLeases):
            answer = self.gather(step.entry, step.plan)
        elif isinstance(step, CommitMembers):
            answer = commit_at_once(
                step.placements, step.leases, self.start_subjob, self.engine.now
            )
        else:
            assert isinstance(step, Slot)
        self.sync()
        return answer

    def gather(
        self, entry: Entry, plan: TryPlan, exclude: Collection[str] = frozenset()
    ) -> Gathered:
        """The router's gather over the hosts but ``exclude`` (a move's copy goes elsewhere):
        its probe plan, limits and ranking, each probe arbitrated by the host's core; a
        probe that carries the commit commits there."""
        need = entry.need
        limits = self.settings.limits().for_try(need, plan.gang_size)
        return gather_at_once(
            self.core,
            entry,
            plan,
            ProbePlan(
                self.view,
                need,
                limits,
                self.rng,
                set(exclude),
                rank=learned_ranking(self.workload, need),
            ),
            self.by_id,
            now=self.engine.now,
            budget_seconds=self.settings.budget_seconds,
            probe_ids=self._probe_ids,
            note=self.note_now,
            start=self.start_subjob,
            carry_out=self.carry_out,
        )

    def note_now(self, host: CoreHost) -> None:
        """A probe's or release's reply carries the host's summary: the gather's next
        round reads it."""
        self.note(host)
        self.sync()

    def start_subjob(
        self,
        host: CoreHost,
        lease_id: str,
        placement: zone_pb2.Placement,
        slice_ids: tuple[str, ...],
    ) -> common_pb2.Subjob:
        """The agent commits the lease to the placement's subjob: its reply."""
        reply = start_on(host, lease_id, placement, slice_ids, self.engine.now)
        self.live.add(placement.subjob_id)
        self.owner.subjob_started(host, placement.subjob_id, slice_ids)
        self.note(host)
        return reply

    # ---------------------------------------------------------------- a job's life

    def stop(self, placement: zone_pb2.Placement, why: str, cause: EndCause) -> None:
        """The router's SignalSubjob(TERMINATE): the agent stops the subjob."""
        entry = self.core.entries.get(job_of(placement.subjob_id))
        if entry is None:
            return
        self.end_subjob(entry, placement.subjob_id, EndDecision(KILLED, cause, why), -15)

    def end_subjob(
        self,
        entry: Entry,
        subjob_id: str,
        decision: EndDecision,
        exit_code: int,
        *,
        peak_gpu_memory_bytes: int = 0,
    ) -> None:
        """The agent's core ends the subjob (if it still runs) and its heartbeat reports
        the end (with the GPU memory peak it saw, if given): the router's core judges the
        report and the job."""
        placement = next((p for p in entry.job.placements if p.subjob_id == subjob_id), None)
        if placement is None or subjob_id not in self.live:
            return  # ended already (stopped, or exited)
        self.owner.clock()
        host = self.by_id[placement.agent_id]
        now = self.engine.now
        event = end_on(
            host,
            subjob_id,
            decision,
            now,
            started_unix=placement.started_unix,
            exit_code=exit_code,
            peak_gpu_memory_bytes=peak_gpu_memory_bytes,
        )
        assert event is not None  # live here, so live on its agent
        self.live.discard(subjob_id)
        self.owner.subjob_ended(host, placement)
        self.note(host)
        self.sync()
        was_over = entry.job.state in TERMINAL_JOB_STATES
        report_end(self.core, host.agent_id, event, now, self.carry_out)
        if not was_over and entry.job.state in TERMINAL_JOB_STATES:
            # Once, at the end that decided it: a failed gang's other members end after.
            self.owner.job_ended(entry)
        self.carry_out(self.core.forget_if_done(entry))
        self.wake()  # freed capacity wakes the queue (the agent's heartbeat does at once)


class LaminarReplay(_Replay):
    """The zone router's own decision core over agents' cores (:class:`CoreDriver`): every
    trace job is a ``zone_pb2.Job`` submitted to :class:`~laminar_zone.core.ZoneCore` (its
    routing, its queue passes and placement tries as :mod:`laminar_zone.trying` strings
    them, its job lifecycle), and every host is an agent's
    :class:`~laminar_agent.core.AgentCore`. A placed job's members each run for the trace
    job's duration, then exit. ``failures``: job index -> how many of its first attempts
    exit with a failure (tests).
    """

    def __init__(
        self,
        spec: ReplaySpec,
        jobs: list[TraceJob],
        *,
        failures: Mapping[int, int] | None = None,
        max_retries: int = 0,
    ) -> None:
        super().__init__(spec, jobs)
        self.driver = CoreDriver(self.engine, self.hosts, self, spec.seed)
        self.core = self.driver.core
        self.failures = dict(failures or {})
        self.max_retries = max_retries
        self.trace_jobs = {f"j{job.index}": job for job in jobs}
        #: GPUs each live subjob holds.
        self.held: dict[str, int] = {}
        #: Jobs that ended, as the core left them (tests read them).
        self.ended: dict[str, zone_pb2.Job] = {}
        #: When each trace job first started (its queue time).
        self.first_start: dict[int, float] = {}

    # ---------------------------------------------------------------- events

    def arrive(self, job: TraceJob) -> None:
        """A Submit of the trace job."""
        self.clock()
        need, gang = _shape(job, self.spec.gpus_per_host)
        spec = zone_pb2.JobSpec(
            command=["trace"],
            tenant=TENANT,
            resources=common_pb2.Resources(gpus=need.gpus),
            gang_size=gang,
            priority=common_pb2.BATCH,
            expected_seconds=job.duration,
            max_retries=self.max_retries,
        )
        self.driver.submit(spec, need, f"j{job.index}")

    # ---------------------------------------------------------------- the driver's owner

    def subjob_started(self, host: CoreHost, subjob_id: str, slice_ids: tuple[str, ...]) -> None:
        assert isinstance(host, SimHost)
        self.held[subjob_id] = sum(a.milli for a in host.allocations(subjob_id)) // 1000
        self.free -= self.held[subjob_id]

    def subjob_ended(self, host: CoreHost, placement: zone_pb2.Placement) -> None:
        self.free += self.held.pop(placement.subjob_id)

    def job_placed(self, entry: Entry) -> None:
        """The try placed the job: each member runs for the job's duration, then exits
        (with a failure for as many attempts as ``failures`` says)."""
        trace_job = self.trace_jobs[entry.job.job_id]
        if trace_job.index not in self.first_start:
            self.first_start[trace_job.index] = self.engine.now
            self.stats.queue.append(self.engine.now - trace_job.arrival)
        failing = self.failures.get(trace_job.index, 0) >= entry.job.attempts
        for placement in entry.current():
            self.engine.schedule(
                trace_job.duration, partial(self.exit, entry, placement.subjob_id, failing)
            )

    def job_ended(self, entry: Entry) -> None:
        self.ended[entry.job.job_id] = entry.job
        trace_job = self.trace_jobs[entry.job.job_id]
        self.stats.jct.append(self.engine.now - trace_job.arrival)
        self.stats.probes += entry.job.probes
        self.stats.bounces += entry.job.bounces

    def open_round(self, step: OpenRound) -> Round | None:
        return None  # no atomized work here

    def clear_market(self, step: ClearMarket) -> None:
        raise AssertionError("no market in sim replay's rigid mode")

    def close_round(self, step: CloseRound) -> None:
        raise AssertionError("no market in sim replay's rigid mode")

    def pass_done(self, kept: list[Entry]) -> None:
        head = kept[0] if kept else None
        gpus = head.need.gpus * max(1, head.job.spec.gang_size) if head is not None else 0
        self.frag_now = self.free if head is not None and self.free >= gpus else 0

    def exit(self, entry: Entry, subjob_id: str, failing: bool) -> None:
        decision = (
            EndDecision(FAILED, EndCause.EXITED, "exited 1")
            if failing
            else EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0")
        )
        self.driver.end_subjob(entry, subjob_id, decision, 1 if failing else 0)


TENANT = "philly"


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
