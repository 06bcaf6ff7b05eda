"""Experiment ``load``: the placement hot path at cluster scale, Laminar against a central queue.

Open-loop Poisson arrivals of a mix of small transient tasks (a share of one GPU, short)
and large rigid tasks (several whole GPUs on one host, long) on ``hosts`` equal hosts;
the arrival rate gives the offered ``load`` (GPU-seconds asked per GPU-second of the
cluster). Every task has a start deadline; a task not started by then is dropped and
counts in the latency percentiles at its deadline.

**laminar**: zones of ``zone_hosts`` hosts, one router each, and each router is the
router's own decision core (:class:`~laminar_zone.core.ZoneCore`). A task arrives at a
random zone, which keeps it or forwards it once by the router's flow splitting
(:func:`laminar_zone.flow.split_flow`; peer summaries refreshed every
``exchange_seconds``; a lost forward is sent again after the RPC timeout, as the router
retries), and is submitted there as a ``zone_pb2.Job``: the
core routes it (placing, or queued behind its family's blocked head) and its placement
tries and queue passes are :func:`~laminar_zone.trying.place_try` and
:func:`~laminar_zone.trying.pass_steps`, suspended while a request travels and resumed
when its reply arrives. A gather is the router's :class:`~laminar_zone.gather.Gather`
over its :class:`~laminar_zone.view.ProbePlan`, its probes sent to the hosts (with
d = 1 the probe carries the commit); a commit is the agent core's, and can be late or
lost. Hosts are the agent's own :class:`~laminar_agent.core.AgentCore` over its ledger,
so a probe is judged against ground truth at the moment it arrives, and leases hold
capacity until they are committed or released; every reply refreshes the view. A
subjob's end goes back to the core as the agent's report (its slices, start, run time and
GPU memory peak: :func:`laminar_sim.zone_driver.end_on`). The router's queue loop runs a
pass per wake (a task queued, a host's heartbeat showing freed capacity: the agent sends
one at once when a subjob ends, as the real agent's heartbeat loop wakes on a subjob
event), at least ``queue.min_pass_seconds`` apart, and every ``queue.retry_seconds``;
a pass waits for each start it tries only until the try's first request crosses the
network, as the router's does (:class:`~laminar_zone.trying.PassTry`), and the try goes
on beside it. A task not started by its
deadline is cancelled at its router.

**central**: one global FIFO queue and one scheduler that knows every host exactly and
picks the best fit over all of them. Its decisions are serialized, and each one takes the
time this machine needs to run the decision function on ``hosts`` hosts (measured at
start, reported), so its decision cost grows with the cluster as it does in our code.
A queue pass on each departure tries at most ``central_queue_depth`` waiting tasks (as
Slurm's ``default_queue_depth`` bounds its passes), skipping a shape once one task of it
did not fit in that pass.

Both policies see the same arrivals (same seed) in the same invocation.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from laminar_agent.core import (
    EVENT_GAP_SECONDS,
    KILLED,
    SUCCEEDED,
    EndDecision,
    event_hold,
)
from laminar_agent.ledger import Bounced, Granted
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import TERMINAL_JOB_STATES, EndCause
from laminar_base.demand import Demand
from laminar_sim.engine import Engine, LossyDelay
from laminar_sim.laminar import TENANT, Ask, LaminarCluster, SimHost, SimZone
from laminar_sim.zone_driver import (
    CoreHands,
    GatherBook,
    arbitrate_on,
    commit_on,
    confirm_on,
    end_on,
    report_end,
    start_on,
    submit,
)
from laminar_zone.config import PlacementSettings, QueueSettings
from laminar_zone.core import (
    Failure,
    Instruction,
    NewJob,
    TryPlan,
)
from laminar_zone.entry import Entry
from laminar_zone.gather import Bind, GiveUp, ProbeHost, Unsure
from laminar_zone.gather import Instruction as GatherInstruction
from laminar_zone.gather import Release as GatherRelease
from laminar_zone.lifecycle import job_of
from laminar_zone.placements import apply_start_reply
from laminar_zone.trying import (
    Clock,
    CommitMembers,
    DoInstructions,
    Gathered,
    GatherLeases,
    OpenRound,
    PassStep,
    PassTry,
    RunInstructions,
    Slot,
    StartJob,
    TryStep,
    pass_steps,
    place_try,
)
from laminar_zone.view import ProbeLimits, ProbePlan

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LoadSpec:
    hosts: int = 1000
    load: float = 0.7
    seed: int = 1
    #: Tasks to arrive; 0 = as many as arrive in ``window_seconds``.
    jobs: int = 0
    window_seconds: float = 10.0
    gpus_per_host: int = 8
    small_ratio: float = 0.9
    small_milli: int = 500
    small_mean_seconds: float = 1.0
    small_deadline_seconds: float = 2.0
    large_gpus: int = 4
    large_mean_seconds: float = 10.0
    large_deadline_seconds: float = 20.0
    #: Tasks arriving before this are run but not measured (the cluster starts pre-filled
    #: to ``load`` with tasks of the same mix, so the warm-up can be short).
    warmup_seconds: float = 2.0
    zone_hosts: int = 1000
    #: d, hosts probed per attempt (default: the router's; 1 = the probe carries the commit).
    probes_per_attempt: int = ProbeLimits().probes_per_attempt
    heartbeat_seconds: float = 1.0
    #: Least time between two heartbeats a host's subjob events wake (the agent's
    #: ``zone.heartbeat_event_gap_seconds``; laminar_agent.core.event_hold decides).
    event_gap_seconds: float = EVENT_GAP_SECONDS
    exchange_seconds: float = 1.0
    net_delay_seconds: float = 0.0005
    net_jitter_seconds: float = 0.0002
    loss_ratio: float = 0.0
    rpc_timeout_seconds: float = 0.5
    central_queue_depth: int = 100
    #: The central scheduler's cost per decision; 0 = measure it on this machine at start
    #: (then runs are reproducible only given that figure, which the report carries).
    central_decision_seconds: float = 0.0
    policies: tuple[str, ...] = ("laminar", "central")

    def validate(self) -> None:
        checks = [
            (1 <= self.hosts <= 200_000, "--hosts", f"must be in 1..200000, got {self.hosts}"),
            (0 < self.load <= 2.0, "--load", f"must be in (0, 2], got {self.load}"),
            (0 <= self.jobs <= 2_000_000, "--jobs", f"must be in 0..2000000, got {self.jobs}"),
            (
                0 < self.window_seconds <= 86400,
                "--window-seconds",
                f"must be in (0, 86400], got {self.window_seconds}",
            ),
            (
                0 <= self.loss_ratio < 0.5,
                "--loss",
                f"must be in [0, 0.5), got {self.loss_ratio}",
            ),
            (
                self.net_delay_seconds >= 0,
                "--net-delay-ms",
                f"must be >= 0, got {self.net_delay_seconds}",
            ),
            (
                self.heartbeat_seconds > 0,
                "--heartbeat-seconds",
                f"must be > 0, got {self.heartbeat_seconds}",
            ),
            (
                0 <= self.event_gap_seconds <= 1,
                "--event-gap-seconds",
                f"must be in 0..1, got {self.event_gap_seconds}",
            ),
            (self.zone_hosts >= 1, "--zone-hosts", f"must be >= 1, got {self.zone_hosts}"),
            (
                1 <= self.probes_per_attempt <= 64,
                "--probes",
                f"must be in 1..64, got {self.probes_per_attempt}",
            ),
        ]
        for ok, flag, message in checks:
            if not ok:
                raise ValueError(f"{flag}: {message}")
        for policy in self.policies:
            if policy not in ("laminar", "central"):
                raise ValueError(f"--policies: unknown policy {policy!r} (laminar, central)")

    @property
    def mean_gpu_seconds(self) -> float:
        small = self.small_ratio * self.small_milli / 1000 * self.small_mean_seconds
        large = (1 - self.small_ratio) * self.large_gpus * self.large_mean_seconds
        return small + large

    @property
    def task_count(self) -> int:
        return self.jobs or max(1, round(self.arrival_rate * self.window_seconds))

    @property
    def arrival_rate(self) -> float:
        """Tasks per second that offer ``load`` of the cluster's GPUs."""
        return self.load * self.hosts * self.gpus_per_host / self.mean_gpu_seconds


@dataclass(frozen=True)
class Task:
    index: int
    arrival: float
    ask: Ask
    duration: float
    deadline: float
    large: bool


def make_tasks(spec: LoadSpec) -> list[Task]:
    """The arrivals, a pure function of the seed (shared by every policy)."""
    rng = np.random.default_rng([spec.seed, 0x6C6F6164])  # "load"
    count = spec.task_count
    gaps = rng.exponential(1.0 / spec.arrival_rate, count)
    large = rng.random(count) >= spec.small_ratio
    tasks = []
    now = 0.0
    small_ask = Ask(Demand(gpu_milli=spec.small_milli))
    large_ask = Ask(Demand(gpus=spec.large_gpus))
    for i in range(count):
        now += float(gaps[i])
        big = bool(large[i])
        mean = spec.large_mean_seconds if big else spec.small_mean_seconds
        tasks.append(
            Task(
                i,
                now,
                large_ask if big else small_ask,
                float(rng.exponential(mean)),
                spec.large_deadline_seconds if big else spec.small_deadline_seconds,
                big,
            )
        )
    return tasks


def make_hosts(spec: LoadSpec) -> list[SimHost]:
    return [SimHost(f"h{i}", "H100", spec.gpus_per_host, 10**9, 10**9) for i in range(spec.hosts)]


def prefill(spec: LoadSpec, hosts: list[SimHost]) -> list[tuple[SimHost, str, float]]:
    """Fill every host to about ``load`` with tasks of the mix (the same for every policy).

    Tasks are drawn by their share of GPU-time, so the running mix matches the steady
    state; durations are exponential, so a pre-filled task's remaining time has the same
    distribution as a new one's. Returns (host, lease, remaining seconds) to schedule.
    """
    rng = np.random.default_rng([spec.seed, 0x66696C6C])  # "fill"
    small_gpu_s = spec.small_ratio * spec.small_milli / 1000 * spec.small_mean_seconds
    large_share = 1.0 - small_gpu_s / spec.mean_gpu_seconds
    kinds = [
        (Ask(Demand(gpus=spec.large_gpus)), float(spec.large_gpus), spec.large_mean_seconds),
        (Ask(Demand(gpu_milli=spec.small_milli)), spec.small_milli / 1000, spec.small_mean_seconds),
    ]
    running = []
    target = spec.load * spec.gpus_per_host
    for host in hosts:
        used = 0.0
        while used < target:
            first = 0 if rng.random() < large_share else 1
            for ask, gpus, mean in (kinds[first], kinds[1 - first]):
                if used + gpus > target + 0.5:
                    continue
                reply = host.probe(ask, 0.0)
                if isinstance(reply, Granted):
                    host.commit(reply.lease.lease_id, reply.lease.lease_id, 0.0)
                    running.append((host, reply.lease.lease_id, float(rng.exponential(mean))))
                    used += gpus
                    break
            else:
                break
    return running


@dataclass
class Outcome:
    """Per-policy accounting."""

    started: int = 0
    #: Every task started, warm-up included: the denominator of the per-placement figures.
    placements: int = 0
    dropped: int = 0
    latencies: list[float] = field(default_factory=list)
    large_started: int = 0
    large_total: int = 0
    probes: int = 0
    bounces: int = 0
    view_lookups: int = 0
    hosts_scanned: int = 0
    decision_seconds: float = 0.0
    events: int = 0
    wall_seconds: float = 0.0
    sim_seconds: float = 0.0
    messages: int = 0
    messages_lost: int = 0
    forwards: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self, tasks: int) -> dict[str, Any]:
        lat = sorted(self.latencies)
        placed = max(1, self.placements)

        def pct(q: float) -> float:
            if not lat:
                return 0.0
            return round(1000 * lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))], 3)

        return {
            "measured_tasks": tasks,
            "started": self.started,
            "dropped": self.dropped,
            "start_success_ratio": round(self.started / tasks, 4) if tasks else 0.0,
            "large_start_success_ratio": round(self.large_started / self.large_total, 4)
            if self.large_total
            else None,
            "latency_p50_ms": pct(0.50),
            "latency_p99_ms": pct(0.99),
            "latency_mean_ms": round(1000 * statistics.fmean(lat), 3) if lat else 0.0,
            #: Latency at each percentile 1..100, for plots (drops at their deadline).
            "latency_percentiles_ms": [pct(q / 100) for q in range(1, 101)],
            "probes_per_placement": round(self.probes / placed, 3),
            "bounces_per_placement": round(self.bounces / placed, 3),
            "view_lookups_per_placement": round(self.view_lookups / placed, 3),
            "hosts_scanned_per_placement": round(self.hosts_scanned / placed, 3),
            "router_seconds_per_placement": round(self.decision_seconds / placed, 9),
            "messages_per_placement": round(self.messages / placed, 3),
            "messages_lost": self.messages_lost,
            "forwards_per_placement": round(self.forwards / placed, 4),
            "events_processed": self.events,
            "events_per_second": round(self.events / self.wall_seconds) if self.wall_seconds else 0,
            "wall_seconds": round(self.wall_seconds, 2),
            "simulated_seconds": round(self.sim_seconds, 1),
            **self.extra,
        }


class _Base:
    def __init__(self, spec: LoadSpec, tasks: list[Task]) -> None:
        self.spec = spec
        self.tasks = tasks
        network = LossyDelay(spec.net_delay_seconds, spec.net_jitter_seconds, spec.loss_ratio)
        self.engine = Engine(spec.seed, network)
        self.out = Outcome(
            large_total=sum(1 for t in tasks if t.large and t.arrival >= spec.warmup_seconds)
        )
        self.done: set[int] = set()
        self.hosts = make_hosts(spec)
        for host, lease_id, remaining in prefill(spec, self.hosts):
            self.engine.schedule(remaining, partial(self.finish_prefilled, host, lease_id))

    def finish_prefilled(self, host: SimHost, lease_id: str) -> None:
        host.end(lease_id, self.engine.now)
        self.freed(host)

    def start(self, task: Task, host: SimHost, lease_id: str) -> None:
        """The commit reached the host: the task runs from now. Its subjob on the host is named
        by the lease (a task whose commit reply was lost may be committed a second time)."""
        if not self.begins(task):
            host.end(lease_id, self.engine.now, dropped=True)  # room given back
            self.freed(host)
            return
        self.engine.schedule(task.duration, lambda: self.finish(task, host, lease_id))

    def begins(self, task: Task) -> bool:
        """The task starts now, counted once: False if it started already or its deadline
        passed (then it is dropped, if not yet)."""
        if task.index in self.done or self.drop(task):
            return False
        self.done.add(task.index)
        self.out.placements += 1
        if self.measured(task):
            self.out.started += 1
            self.out.large_started += int(task.large)
            self.out.latencies.append(self.engine.now - task.arrival)
        return True

    def finish(self, task: Task, host: SimHost, lease_id: str) -> None:
        host.end(lease_id, self.engine.now)
        self.freed(host)

    def freed(self, host: SimHost) -> None:
        raise NotImplementedError

    def drop(self, task: Task) -> bool:
        """Drop ``task`` if its deadline passed (counted at the deadline); True if dropped."""
        if task.index in self.done:
            return True
        if self.engine.now < task.arrival + task.deadline:
            return False
        self.done.add(task.index)
        if self.measured(task):
            self.out.dropped += 1
            self.out.latencies.append(task.deadline)
        return True

    def measured(self, task: Task) -> bool:
        return task.arrival >= self.spec.warmup_seconds

    def run(self, progress: ProgressFn | None, name: str) -> Outcome:
        for task in self.tasks:
            self.engine.schedule_at(task.arrival, partial(self.arrive, task))
        started = time.perf_counter()
        processed = 0
        while self.engine.pending and len(self.done) < len(self.tasks):
            stats = self.engine.run(max_events=5000)
            processed += stats.events_processed
            if progress is not None:
                progress(name, min(len(self.tasks), len(self.done)), len(self.tasks))
            if stats.events_processed == 0:
                break
        self.out.events = processed
        self.out.wall_seconds = time.perf_counter() - started
        self.out.sim_seconds = self.engine.now
        self.out.messages += self.engine.messages_sent
        self.out.messages_lost = self.engine.messages_lost
        for task in self.tasks:
            if task.index not in self.done:
                self.done.add(task.index)
                if self.measured(task):
                    self.out.dropped += 1
                    self.out.latencies.append(task.deadline)
        return self.out

    def arrive(self, task: Task) -> None:
        raise NotImplementedError


class LaminarRun(_Base):
    """Zone routers driving their own decision core over the network model (see the
    module docstring): each task is a ``zone_pb2.Job`` of its zone's
    :class:`~laminar_zone.core.ZoneCore`; its placement tries and the queue's passes are
    :func:`~laminar_zone.trying.place_try` and :func:`~laminar_zone.trying.pass_steps`,
    suspended while a request travels and resumed when its reply arrives in simulated time.
    This driver decides nothing: it carries messages, runs the queue loop's clock (a pass
    per wake, ``queue.min_pass_seconds`` apart, and every ``queue.retry_seconds``) and
    cancels a task at its start deadline."""

    def __init__(self, spec: LoadSpec, tasks: list[Task]) -> None:
        super().__init__(spec, tasks)
        self.cluster = LaminarCluster(
            self.hosts,
            zone_hosts=spec.zone_hosts,
            limits=ProbeLimits(probes_per_attempt=spec.probes_per_attempt),
            gamma=1.0,
            seed=spec.seed,
            exchange_every=1 << 62,  # exchanges run on the simulated clock below
        )
        self.zone_of = {h.agent_id: z for z in self.cluster.zones for h in z.hosts.values()}
        self.zones = {z.name: z for z in self.cluster.zones}
        self.settings = PlacementSettings()
        self.queue_settings = QueueSettings()
        self.clock = Clock(mono=lambda: self.engine.now, unix=lambda: self.engine.now)
        self.probe_ids = itertools.count()
        #: The task of each job (job id -> task).
        self.task_of: dict[str, Task] = {}
        #: The queue loop of each zone.
        self.loops = {z.name: _QueueLoop() for z in self.cluster.zones}
        #: Per host: when its last event-woken heartbeat went (or will go), and whether one
        #: is held now (it carries every change until it goes).
        self.woken_at: dict[str, float] = {}
        self.held: set[str] = set()
        #: Per host: subjob ends its heartbeats have not carried to the router yet.
        self.unreported: dict[str, list[common_pb2.Subjob]] = {}
        #: When each live subjob launched (what its agent reports of it).
        self.launched: dict[str, float] = {}
        #: Each zone router's hands for its core's instructions.
        self.hands = {z.name: self.hands_of(z) for z in self.cluster.zones}
        if len(self.cluster.zones) > 1:
            self.engine.schedule(spec.exchange_seconds, self.exchange)
        self.engine.schedule(self.queue_settings.retry_seconds, self.tick)

    def exchange(self) -> None:
        before = self.cluster.counters.exchange_messages
        self.cluster.exchange()
        self.out.messages += self.cluster.counters.exchange_messages - before
        if len(self.done) < len(self.tasks):
            self.engine.schedule(self.spec.exchange_seconds, self.exchange)

    def tick(self) -> None:
        """The queue loop's period: a pass in every zone."""
        for zone in self.cluster.zones:
            self.wake(zone)
        if len(self.done) < len(self.tasks):
            self.engine.schedule(self.queue_settings.retry_seconds, self.tick)

    # ---------------------------------------------------------------- a task's life

    def arrive(self, task: Task) -> None:
        entry = self.cluster.zones[int(self.engine.rng.integers(len(self.cluster.zones)))]
        t0 = time.perf_counter()
        zone = self.cluster.route(entry, task.ask)  # the router's own flow splitting
        self.out.decision_seconds += time.perf_counter() - t0
        if zone is not entry:
            self.out.forwards += 1
            self.forward(entry, zone, task)
        else:
            self.submit(zone, task)

    def forward(self, entry: SimZone, zone: SimZone, task: Task) -> None:
        """The entry router's ForwardJob to ``zone``. A lost call is sent again after the
        RPC timeout (same idempotency key), as ``PeerRouter.resume_forward`` retries until
        the peer answers: the task is never lost on the way (and never submitted twice,
        as only a call that arrives submits it)."""
        if self.engine.send(entry.name, zone.name, partial(self.submit, zone, task)) is None:
            retry = partial(self.forward, entry, zone, task)
            self.engine.schedule(self.spec.rpc_timeout_seconds, retry)

    def submit(self, zone: SimZone, task: Task) -> None:
        """A Submit at the task's router: its core makes the job's record, routes it and
        kicks it (a placement try, or the queue behind its family's blocked head)."""
        if self.drop(task):
            return
        spec = zone_pb2.JobSpec(
            command=["task"],
            tenant=TENANT,
            resources=common_pb2.Resources(gpus=task.ask.need.gpus),
            priority=common_pb2.BATCH,
        )
        job_id = f"t{task.index}"
        self.task_of[job_id] = task
        self.engine.schedule_at(task.arrival + task.deadline, partial(self.deadline, zone, job_id))
        job = NewJob(job_id, zone.name)
        submit(
            zone.core, spec, task.ask.need, job, self.engine.now, self.hands[zone.name].carry_out
        )

    def deadline(self, zone: SimZone, job_id: str) -> None:
        """The task's start deadline: not started, it is dropped (the router cancels it;
        a job no longer in its core's memory has ended)."""
        task = self.task_of[job_id]
        entry = zone.core.entries.get(job_id)
        if task.index in self.done or entry is None or entry.job.state in TERMINAL_JOB_STATES:
            return
        self.drop(task)
        self.carry_out(zone, zone.core.cancel(entry.job, "start deadline passed", self.engine.now))

    def started(self, zone: SimZone, host: SimHost, subjob_id: str) -> None:
        """A commit reached the host: the task runs from now (unless it was dropped: the
        router stops the copy, as its core says)."""
        task = self.task_of[job_of(subjob_id)]
        if not self.begins(task):
            return
        self.engine.schedule(
            task.duration,
            partial(
                self.end_subjob,
                zone,
                host,
                subjob_id,
                EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0"),
            ),
        )

    def end_subjob(
        self, zone: SimZone, host: SimHost, subjob_id: str, decision: EndDecision
    ) -> None:
        """The agent's core ends the subjob (if it still runs): the event wakes its
        heartbeat, which carries the report of the end to the router's core."""
        event = end_on(
            host,
            subjob_id,
            decision,
            self.engine.now,
            started_unix=self.launched.get(subjob_id, 0.0),
            exit_code=0 if decision.state == SUCCEEDED else -15,
        )
        if event is None:
            return
        del self.launched[subjob_id]
        self.unreported.setdefault(host.agent_id, []).append(event)
        self.freed(host)

    def reported(self, zone: SimZone, host: SimHost, event: common_pb2.Subjob) -> None:
        """A heartbeat carried the agent's report of a subjob's end to the router."""
        report_end(
            zone.core, host.agent_id, event, self.engine.now, self.hands[zone.name].carry_out
        )

    def start_subjob(
        self,
        zone: SimZone,
        host: SimHost,
        lease_id: str,
        placement: zone_pb2.Placement,
        slice_ids: tuple[str, ...],
    ) -> common_pb2.Subjob:
        """The agent commits the lease to the placement's subjob and launches it: its
        reply."""
        reply = start_on(host, lease_id, placement, slice_ids, self.engine.now)
        self.launched[placement.subjob_id] = self.engine.now
        self.started(zone, host, placement.subjob_id)
        return reply

    def finish_prefilled(self, host: SimHost, lease_id: str) -> None:
        host.end(lease_id, self.engine.now)
        self.freed(host)

    # ---------------------------------------------------------------- the core's hands

    def carry_out(self, zone: SimZone, instructions: Sequence[Instruction]) -> None:
        self.hands[zone.name].carry_out(instructions)

    def hands_of(self, zone: SimZone) -> CoreHands:
        """The zone router's hands for its core's instructions: a try, a stop or a
        release sent over the network, a queue wake, an ask at the agent's next
        heartbeat (:meth:`confirm`)."""
        return CoreHands(
            zone.core,
            "sim load",
            place=lambda entry, from_queue: self.start_try(
                zone, entry, from_queue, lambda placed: None
            ),
            wake=partial(self.wake, zone),
            terminate=partial(self.terminate, zone),
            release=partial(self.release, zone),
            confirm=lambda agent_id: self.engine.schedule(
                self.spec.heartbeat_seconds, partial(self.confirm, zone, agent_id)
            ),
        )

    def terminate(
        self, zone: SimZone, placement: zone_pb2.Placement, why: str, cause: EndCause
    ) -> None:
        """The router's SignalSubjob(TERMINATE), sent to the agent."""
        host = zone.hosts[placement.agent_id]
        decision = EndDecision(KILLED, cause, why)
        self.engine.send(
            zone.name,
            host.agent_id,
            partial(self.end_subjob, zone, host, placement.subjob_id, decision),
        )

    def confirm(self, zone: SimZone, agent_id: str) -> None:
        """The agent's next heartbeat: the router asks it about commits of unknown outcome."""
        host = zone.hosts[agent_id]
        confirm_on(zone.core, host, self.launched, self.engine.now, partial(self.carry_out, zone))
        self.wake(zone)

    def release(self, zone: SimZone, host: SimHost, lease_id: str) -> None:
        self.engine.send(zone.name, host.agent_id, partial(host.release, lease_id))

    def freed(self, host: SimHost) -> None:
        """A task ended or gave its room back: like the agent, whose heartbeat a subjob event
        wakes, the host sends a heartbeat, at once after a quieter spell or when the
        event gap since its last event-woken one has passed (laminar_agent.core.
        event_hold; one held heartbeat carries every change until it goes); the router
        sees it, and the subjob ends it reports, one network delay later (a lost one:
        its ends go with the host's next heartbeat, and the queue's period runs a pass)."""
        agent_id = host.agent_id
        if agent_id in self.held:
            return  # the held heartbeat reads the host when it goes
        zone = self.zone_of[agent_id]
        now = self.engine.now
        hold = event_hold(now, self.woken_at.get(agent_id, -math.inf), self.spec.event_gap_seconds)
        self.woken_at[agent_id] = now + hold

        def heartbeat(events: list[common_pb2.Subjob]) -> None:
            zone.note(host)
            for event in events:
                self.reported(zone, host, event)
            self.wake(zone)

        def send() -> None:
            self.held.discard(agent_id)
            events = self.unreported.pop(agent_id, [])
            if self.engine.send(agent_id, zone.name, partial(heartbeat, events)) is None:
                # Lost: the agent reports them again with its next heartbeat.
                self.unreported.setdefault(agent_id, [])[:0] = events

        if hold > 0:
            self.held.add(agent_id)
            self.engine.schedule(hold, send)
        else:
            send()

    # ---------------------------------------------------------------- the queue loop

    def wake(self, zone: SimZone) -> None:
        """The queue loop's wake: a pass now, or when the last one is ``min_pass_seconds``
        old; a wake during a pass runs one more after it."""
        loop = self.loops[zone.name]
        if loop.running:
            loop.due = True
            return
        if loop.scheduled:
            return
        loop.scheduled = True
        self.engine.schedule_at(max(self.engine.now, loop.next_at), partial(self.queue_pass, zone))

    def queue_pass(self, zone: SimZone) -> None:
        loop = self.loops[zone.name]
        loop.scheduled = False
        loop.running = True
        loop.next_at = self.engine.now + self.queue_settings.min_pass_seconds
        steps = pass_steps(
            zone.core, shares={}, backfill=True, rng=self.cluster.rng, clock=self.clock
        )
        _Steps(steps, partial(self.answer_pass, zone), partial(self.pass_done, zone)).resume()

    def answer_pass(self, zone: SimZone, step: PassStep, steps: _Steps) -> Any:
        if isinstance(step, DoInstructions):
            self.carry_out(zone, step.instructions)
        elif isinstance(step, StartJob):
            # Pipelined (PassTry): the try runs until it waits on the network (tries are
            # not bounded here: no slot to wait for), then on beside the pass.
            pending = PassTry()
            self.start_try(zone, step.entry, True, lambda placed: None, pending)
            answer = pending.answer()
            assert answer is not None
            return answer
        else:
            assert isinstance(step, OpenRound)  # no atomized work here: no round
        return None

    def pass_done(self, zone: SimZone, kept: list[Entry]) -> None:
        loop = self.loops[zone.name]
        loop.running = False
        if loop.due:
            loop.due = False
            self.wake(zone)

    # ---------------------------------------------------------------- a placement try

    def start_try(
        self,
        zone: SimZone,
        entry: Entry,
        from_queue: bool,
        done: Callable[[bool], None],
        pending: PassTry | None = None,
    ) -> None:
        """One placement try (:func:`laminar_zone.trying.place_try`) over the network; a
        pass's start is driven through ``pending`` (:class:`~laminar_zone.trying.PassTry`)."""
        steps = place_try(
            zone.core,
            entry,
            from_queue=from_queue,
            lease_ttl_seconds=self.settings.lease_ttl_seconds,
            budget_seconds=self.settings.budget_seconds,
            clock=self.clock,
        )
        if pending is not None:
            steps = pending.steps(steps)
        zone.in_flight += 1  # as the router's Placer counts tries under way

        def ended(placed: bool) -> None:
            zone.in_flight -= 1
            done(placed)

        _Steps(steps, partial(self.answer_try, zone), ended).resume()

    def answer_try(self, zone: SimZone, step: TryStep, steps: _Steps) -> Any:
        if isinstance(step, (RunInstructions, DoInstructions)):
            self.carry_out(zone, step.instructions)
        elif isinstance(step, GatherLeases):
            _NetGather(self, zone, step.entry, step.plan, steps.resume).start()
            return LATER
        elif isinstance(step, CommitMembers):
            self.commit(zone, step, steps.resume)
            return LATER
        else:
            assert isinstance(step, Slot)  # tries are not bounded here
        return None

    def commit(
        self, zone: SimZone, step: CommitMembers, done: Callable[[list[Failure | None]], None]
    ) -> None:
        """Every member's Commit over the network; the answers once all are in (a commit or
        reply lost: no answer within the RPC timeout)."""
        answers: list[Failure | object | None] = [LATER] * len(step.placements)
        now = self.engine.now

        def answered(index: int, answer: Failure | None, reply: common_pb2.Subjob | None) -> None:
            if answers[index] is not LATER:
                return
            if reply is not None:
                apply_start_reply(step.placements[index], reply)
            answers[index] = answer
            if all(a is not LATER for a in answers):
                done([a for a in answers])  # type: ignore[misc]

        for index, (placement, (host, lease_id)) in enumerate(
            zip(step.placements, step.leases, strict=True)
        ):

            def at_host(
                index: int = index,
                placement: zone_pb2.Placement = placement,
                host: SimHost = host,
                lease_id: str = lease_id,
            ) -> None:
                start = partial(self.start_subjob, zone)
                reply = commit_on(host, lease_id, placement, start, self.engine.now)
                if isinstance(reply, Failure):
                    self.engine.send(
                        host.agent_id, zone.name, partial(answered, index, reply, None)
                    )
                    return
                self.engine.send(
                    host.agent_id,
                    zone.name,
                    partial(self.note_and, zone, host, partial(answered, index, None, reply)),
                )

            self.engine.send(zone.name, host.agent_id, at_host)
            lost = Failure("no answer", unknown=True)
            self.engine.schedule_at(
                now + self.spec.rpc_timeout_seconds, partial(answered, index, lost, None)
            )

    def note_and(self, zone: SimZone, host: SimHost, then: Callable[[], None]) -> None:
        """A reply carries the host's fresh summary into the view, then is read."""
        zone.note(host)
        then()


@dataclass
class _QueueLoop:
    """One router's queue loop: whether a pass runs or is due, and when the next may start."""

    running: bool = False
    due: bool = False
    scheduled: bool = False
    next_at: float = -math.inf


#: A request answered later (the driver resumes the generator with the answer).
LATER: Any = object()


class _Steps:
    """One of the core's generators (a try or a pass) driven over simulated time: each
    request is answered at once, or :data:`LATER` (then :meth:`resume` carries the answer
    when it arrives)."""

    def __init__(
        self,
        steps: Generator[Any, Any, Any],
        answer: Callable[[Any, _Steps], Any],
        done: Callable[[Any], None],
    ) -> None:
        self.steps = steps
        self.answer = answer
        self.done = done
        self.inside = False
        self.early: Any = LATER

    def resume(self, reply: Any = None) -> None:
        if self.inside:  # answered while the request was being made
            self.early = reply
            return
        while True:
            try:
                step = self.steps.send(reply)
            except StopIteration as end:
                self.done(end.value)
                return
            self.inside = True
            try:
                reply = self.answer(step, self)
            finally:
                self.inside = False
            if reply is LATER:
                if self.early is LATER:
                    return
                reply, self.early = self.early, LATER


class _NetGather:
    """A :class:`~laminar_zone.trying.GatherLeases` answered over the network model: the
    router's gather (:class:`~laminar_sim.zone_driver.GatherBook`) with its probe plan,
    its probes sent to the hosts' cores (:func:`~laminar_sim.zone_driver.arbitrate_on`)
    and their replies read as they arrive; the
    :class:`~laminar_zone.trying.Gathered` goes back to the try once the gather is over."""

    def __init__(
        self,
        run: LaminarRun,
        zone: SimZone,
        entry: Entry,
        plan: TryPlan,
        done: Callable[[Gathered], None],
    ) -> None:
        self.run = run
        self.zone = zone
        self.done = done
        need = entry.need
        t0 = time.perf_counter()
        limits = run.cluster.limits.for_try(need, plan.gang_size)
        probes = ProbePlan(zone.view, need, limits, run.cluster.rng)
        run.out.decision_seconds += time.perf_counter() - t0
        self.book: GatherBook[SimHost] = GatherBook(
            zone.core,
            entry,
            plan,
            probes,
            now=run.engine.now,
            budget_seconds=run.settings.budget_seconds,
        )
        self.timer: Any = None
        self.over = False

    def start(self) -> None:
        self._carry(self.book.machine.start(self.run.engine.now))

    def _carry(self, steps: list[GatherInstruction]) -> None:
        run = self.run
        probes = [step for step in steps if isinstance(step, ProbeHost)]
        if (probes or self.book.machine.is_done) and self.timer is not None:
            run.engine.cancel(self.timer)
            self.timer = None
        outcome: Bind | GiveUp | Unsure | None = None
        for step in steps:
            if isinstance(step, ProbeHost):
                host = self.zone.hosts[step.record.agent_id]
                placement, instructions = self.book.intent(step, host)
                run.carry_out(self.zone, instructions)
                run.out.probes += 1
                run.out.view_lookups += 1
                run.engine.send(
                    self.zone.name, host.agent_id, partial(self._at_host, host, step, placement)
                )
            elif isinstance(step, GatherRelease):
                for offer in step.offers:
                    host, lease_id = self.book.released(offer)
                    run.release(self.zone, host, lease_id)
            elif isinstance(step, (Bind, GiveUp, Unsure)):
                outcome = step
        if probes:
            self.timer = run.engine.schedule(
                run.spec.rpc_timeout_seconds, partial(self._timed_out, probes[0])
            )
        if outcome is not None:
            self._finish(outcome)

    def _at_host(
        self, host: SimHost, step: ProbeHost, placement: zone_pb2.Placement | None
    ) -> None:
        run = self.run
        orders = self.book.orders(step, run.probe_ids)
        start = partial(run.start_subjob, self.zone)
        replies, started = arbitrate_on(host, orders, placement, start, run.engine.now)
        run.engine.send(
            host.agent_id,
            self.zone.name,
            partial(self._reply, host, step, placement, replies, started),
        )

    def _reply(
        self,
        host: SimHost,
        step: ProbeHost,
        placement: zone_pb2.Placement | None,
        replies: list[Granted | Bounced],
        started: list[common_pb2.Subjob],
    ) -> None:
        self.zone.note(host)
        grants, bounces = self.book.read(host, placement, replies, started)
        self.run.out.bounces += len(bounces)
        now = self.run.engine.now
        self._carry(self.book.machine.answered(host.agent_id, step.round, grants, bounces, now))

    def _timed_out(self, probe: ProbeHost) -> None:
        now = self.run.engine.now
        self.timer = None
        machine = self.book.machine
        if probe.commit:  # no answer to a probe carrying the commit: it may have run
            steps = machine.failed(
                probe.record.agent_id, probe.round, "no answer", now, may_have_run=True
            )
        else:
            steps = machine.timed_out(probe.round, now)
        self._carry(steps)

    def _finish(self, outcome: Bind | GiveUp | Unsure) -> None:
        if self.over:
            return
        self.over = True
        self.done(self.book.answer(outcome))


class CentralRun(_Base):
    """One global FIFO queue and one exact best-fit scheduler with a measured decision cost."""

    def __init__(self, spec: LoadSpec, tasks: list[Task], decision_seconds: float) -> None:
        super().__init__(spec, tasks)
        self.free = np.full((spec.hosts, spec.gpus_per_host), 1000, dtype=np.int64)
        for index in range(spec.hosts):
            self._refresh_row(index)
        self.queue: deque[Task] = deque()
        self.busy_until = 0.0
        self.decision_cost = decision_seconds
        self.pass_pending = False

    def arrive(self, task: Task) -> None:
        self.queue.append(task)
        self._schedule_pass()

    def freed(self, host: SimHost) -> None:
        index = int(host.agent_id[1:])
        self.engine.send(host.agent_id, "central", lambda: self._refresh(index))

    def _refresh(self, index: int) -> None:
        self._refresh_row(index)
        self._schedule_pass()

    def _refresh_row(self, index: int) -> None:
        """The scheduler's exact copy of one host's free milli per GPU."""
        host = self.hosts[index]
        for g, slice_id in enumerate(host.ledger.slices):
            milli, leased, _, _ = host.ledger.usage(slice_id)
            self.free[index, g] = 1000 - milli - leased

    def _schedule_pass(self) -> None:
        if not self.pass_pending:
            self.pass_pending = True
            self.engine.schedule_at(max(self.engine.now, self.busy_until), self.queue_pass)

    def queue_pass(self) -> None:
        """Try up to ``central_queue_depth`` waiting tasks in order; each try costs a decision."""
        self.pass_pending = False
        now = self.engine.now
        tried = 0
        kept: deque[Task] = deque()
        blocked: set[Demand] = set()  # a shape that did not fit fails again in this pass
        while self.queue and tried < self.spec.central_queue_depth:
            task = self.queue.popleft()
            if self.drop(task):
                continue
            if task.ask.need in blocked:
                kept.append(task)
                continue
            tried += 1
            now += self.decision_cost
            self.out.decision_seconds += self.decision_cost
            self.out.hosts_scanned += self.spec.hosts
            choice = best_fit(self.free, task.ask.need)
            if choice is None:
                blocked.add(task.ask.need)
                kept.append(task)
                continue
            host_index, _ = choice
            host = self.hosts[host_index]
            self._reserve(host_index, task.ask.need)
            self.engine.schedule_at(now, partial(self._send_commit, task, host))
        kept.extend(self.queue)
        self.queue = kept
        self.busy_until = now
        if self.queue and tried:
            self.engine.schedule_at(
                max(self.engine.now + self.spec.heartbeat_seconds, now), self._schedule_pass
            )

    def _reserve(self, index: int, need: Demand) -> None:
        row = self.free[index]
        if need.gpus:
            for g in np.flatnonzero(row == 1000)[: need.gpus]:
                row[g] = 0
        else:
            fits = np.flatnonzero(row >= need.gpu_milli)
            g = fits[np.argmin(row[fits])]
            row[g] -= need.gpu_milli

    def _send_commit(self, task: Task, host: SimHost) -> None:
        def at_host() -> None:
            reply = host.probe(task.ask, self.engine.now)  # the agent's own arbitration
            if isinstance(reply, Granted):
                host.commit(reply.lease.lease_id, reply.lease.lease_id, self.engine.now)
                self.start(task, host, reply.lease.lease_id)
            else:
                self.out.bounces += 1
                self.engine.send(host.agent_id, "central", lambda: self.arrive(task))
            index = int(host.agent_id[1:])
            self.engine.send(host.agent_id, "central", lambda: self._refresh(index))

        self.out.probes += 1
        self.engine.send("central", host.agent_id, at_host)


def best_fit(free: npt.NDArray[np.int64], need: Demand) -> tuple[int, int] | None:
    """Exact best fit over every host: the host (and GPU) left with the least room."""
    if need.gpus:
        whole = (free == 1000).sum(axis=1)
        ok = np.flatnonzero(whole >= need.gpus)
        if ok.size == 0:
            return None
        left = free[ok].sum(axis=1)
        best = int(ok[int(np.argmin(left))])
        return best, -1
    fits = free >= need.gpu_milli
    slack = np.where(fits, free - need.gpu_milli, 10**9)
    flat = int(np.argmin(slack))
    if slack.flat[flat] >= 10**9:
        return None
    width = int(free.shape[1])
    return flat // width, flat % width


def measure_decision_seconds(hosts: int, gpus_per_host: int, repeats: int = 200) -> float:
    """Median wall time of one :func:`best_fit` over ``hosts`` half-full hosts on this machine."""
    rng = np.random.default_rng(0)
    free = rng.choice([0, 250, 500, 750, 1000], size=(hosts, gpus_per_host)).astype(np.int64)
    samples = []
    needs = [Demand(gpu_milli=500), Demand(gpus=4)]
    for i in range(repeats):
        t0 = time.perf_counter()
        best_fit(free, needs[i % 2])
        samples.append(time.perf_counter() - t0)
    return float(statistics.median(samples))


def run_load(spec: LoadSpec, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Both policies on the same arrivals; the JSON-ready report of ``laminar sim load``."""
    spec.validate()
    tasks = make_tasks(spec)
    report: dict[str, Any] = {
        "experiment": "load",
        "hosts": spec.hosts,
        "gpus_per_host": spec.gpus_per_host,
        "load": spec.load,
        "seed": spec.seed,
        "tasks": len(tasks),
        "arrival_rate_per_second": round(spec.arrival_rate, 3),
        "mix": {
            "small": f"{spec.small_ratio:.0%} of arrivals, {spec.small_milli} milli of one GPU, "
            f"mean {spec.small_mean_seconds:g} s, start deadline {spec.small_deadline_seconds:g} s",
            "large": f"{spec.large_gpus} whole GPUs on one host, mean "
            f"{spec.large_mean_seconds:g} s, start deadline {spec.large_deadline_seconds:g} s",
        },
        "network": {
            "delay_ms": spec.net_delay_seconds * 1000,
            "jitter_ms": spec.net_jitter_seconds * 1000,
            "loss_ratio": spec.loss_ratio,
            "heartbeat_seconds": spec.heartbeat_seconds,
            "event_gap_seconds": spec.event_gap_seconds,
            "exchange_seconds": spec.exchange_seconds,
        },
        "zones": math.ceil(spec.hosts / spec.zone_hosts),
        "probes_per_attempt": spec.probes_per_attempt,
        "policies": {},
    }
    measured = sum(1 for t in tasks if t.arrival >= spec.warmup_seconds)
    report["measured_tasks"] = measured
    report["warmup_seconds"] = spec.warmup_seconds
    if "laminar" in spec.policies:
        laminar = LaminarRun(spec, tasks).run(progress, "laminar")
        report["policies"]["laminar"] = laminar.report(measured)
    if "central" in spec.policies:
        cost = spec.central_decision_seconds or measure_decision_seconds(
            spec.hosts, spec.gpus_per_host
        )
        central = CentralRun(spec, tasks, cost).run(progress, "central").report(measured)
        central["decision_seconds_measured"] = cost
        report["policies"]["central"] = central
    return report
