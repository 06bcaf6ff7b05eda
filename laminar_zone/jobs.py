"""The zone's job state machine: admission, placement, queue, subjob events, recovery.

Jobs are journaled (``store.JobStore``) before any reply or action that
depends on them: a Submit is committed before it is acknowledged; a placement
intent (subjob id, agent) is committed before the Commit RPC, so a router
killed mid-commit finds out afterwards, from the agent, whether the subjob
exists. Agent events are applied and journaled before they are acknowledged.

Capacity knowledge is soft: the view comes from heartbeats and probe replies
and is rebuilt after a restart. Queue order, backfill and quotas are decided
by :mod:`laminar_zone.queue`; candidate choice by :mod:`laminar_zone.placement`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    RUNNING_JOB_STATES,
    TERMINAL_JOB_STATES,
    EndCause,
    end_cause,
)
from laminar_base.demand import Demand
from laminar_base.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    LaminarError,
    NotFound,
)
from laminar_base.fragmentation import workload_from_rows, workload_rows
from laminar_base.grpcutil import check_count, check_str
from laminar_base.security import INSECURE, Trust
from laminar_base.wire import demand_of
from laminar_zone.arrays import (
    ArrayProgress,
    element_id,
    parse_array,
)
from laminar_zone.atomizer import Atomizer, is_atomized, units_done
from laminar_zone.audit import AuditLog
from laminar_zone.auth import DEFAULT_TENANT
from laminar_zone.config import ZoneConfig
from laminar_zone.entry import Entry, queue_item
from laminar_zone.kept import KeptLeases
from laminar_zone.lifecycle import (
    MemberState,
    Outcome,
    job_of,
    judge_attempt,
    rigid_subjob_id,
    taken_over,
)
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placement import ReleaseCurve
from laminar_zone.placements import (
    COMMITTING,
    READDRESSED,
    apply_start_reply,
    copy_subjob,
    fresh,
    is_refused_input,
    member_states,
    moves_from_live_copy,
    now_running,
    outcome_unknown,
    state_name,
)
from laminar_zone.placer import AgentClients, Ask, Gathered, Placer, rpc_reason
from laminar_zone.queue import (
    Admit,
    Clear,
    QueueWalk,
    Waiting,
    class_order,
    drive_awaiting,
    order_key,
    quota_block,
    quota_never_fits,
    why_waiting,
)
from laminar_zone.reasons import END_REASONS, Reason, reason_of, set_reason
from laminar_zone.spec import MAX_BATCH_JOBS, validate_spec
from laminar_zone.store import JobStore
from laminar_zone.time_limits import TimeLimits
from laminar_zone.usage import UsageLedger
from laminar_zone.view import AgentRecord, HostCounts, ZoneView

log = logging.getLogger("laminar.zone.jobs")

LIVE_SUBJOB = LIVE_SUBJOB_STATES
ENDED_SUBJOB = ENDED_SUBJOB_STATES
#: A restarted router lists journaled agents heard from within this long.
KNOWN_AGENT_SECONDS = 86400.0
#: Most live subjob ids of one heartbeat the router reconciles.
MAX_LIVE_IDS = 4096
#: Journal meta key of the task shapes this router observed (its target workload).
WORKLOAD_META = "workload"


#: Least time between two gauge refreshes by queue passes (the sweep refreshes always).
GAUGE_SECONDS = 0.5


class ZoneState:
    def __init__(
        self,
        config: ZoneConfig,
        store: JobStore,
        metrics: ZoneMetrics,
        *,
        rng: random.Random | None = None,
        trust: Trust = INSECURE,
        clients: AgentClients | None = None,
    ) -> None:
        """``trust`` authenticates the router's calls to agents (mTLS, shared secret, none);
        ``clients`` replaces the gRPC stubs to agents (tests drive the router in-process)."""
        self.config = config
        self.zone_name = config.server.zone_name
        self.store = store
        self.metrics = metrics
        #: Append-only audit log (the server sets it; None in embedded use).
        self.audit: AuditLog | None = None
        self.rng = rng or random.Random()
        stale = config.membership.heartbeat_seconds * config.membership.stale_after_periods
        self.view = ZoneView(stale)
        #: Per-tenant usage rows, written as subjobs end (before the job row that says so).
        self.usage_ledger = UsageLedger(store, metrics, self.view.agents)
        self.clients = clients or AgentClients(trust)
        self.placer = Placer(self.view, self.clients, config.placement, self.rng)
        self.shares = config.shares()
        self.quotas = config.quotas()
        self.entries: dict[str, Entry] = {}
        self.by_agent: dict[str, set[str]] = {}  # agent id -> job ids with live placements
        self.unconfirmed: dict[str, set[str]] = {}  # agent id -> job ids to verify
        self.readdressing: set[str] = set()
        #: Arrays not yet ended: array job id -> where its elements stand.
        self.arrays: dict[str, ArrayProgress] = {}
        self.array_watchers: dict[str, list[asyncio.Queue[zone_pb2.Job]]] = {}
        #: Stops the agent has not taken yet (it did not answer): subjob id -> the copy to
        #: stop, why, and the cause. Each sweep asks again while the agent is reachable.
        self._owed_stops: dict[str, tuple[zone_pb2.Placement, str, EndCause]] = {}
        #: The clock of jobs' time limits (spec.time_limit_seconds), read by the sweep.
        self.time_limits = TimeLimits(recheck_seconds=config.membership.heartbeat_seconds)
        self.queue_wake = asyncio.Event()
        #: One pass at a time: the queue's loop and the market's both run queue_pass.
        self._pass_lock = asyncio.Lock()
        self._blocked_families: dict[str, int] = {}  # family -> priority of its blocked head
        #: family -> jobs waiting in it, as the last queue pass left them plus those since.
        self._queued_per_family: dict[str, int] = {}
        #: family -> (its blocked head's priority class, expected start)
        self.blocked_starts: dict[str, tuple[int, float]] = {}
        self._mean_run_seconds: dict[str, float] = {}
        self._semaphore = asyncio.Semaphore(config.placement.concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.forwarder: Callable[[Entry], Coroutine[Any, Any, bool]] | None = None
        #: Jobs whose forward to a peer was unanswered at a restart (the server resumes them).
        self._resume_forwards: list[Entry] = []
        #: Leases ProbeJob(keep_leases) handed to a tenant, until CommitJob or their TTL:
        #: CommitJob takes only these, for that tenant and the resources probed.
        self.kept_leases = KeptLeases()
        self._gauges_at = -math.inf
        self.started_mono = time.monotonic()
        self.heartbeat_seconds = config.membership.heartbeat_seconds
        #: Atomized jobs: windows, clearing rounds, bidders (docs/atomization.md).
        self.atomizer = Atomizer(self)
        #: The target workload's count of observations last journaled (sweep).
        self._workload_saved = 0
        self.placer.workload.add_prior(config.workload_prior())

    #: For the atomizer (its Zone protocol): a subjob's report into its placement (the
    #: module function, defined below the class).
    apply_start_reply = staticmethod(lambda p, subjob: apply_start_reply(p, subjob))

    def track(self, entry: Entry, agent_id: str) -> None:
        """The job has (or is about to have) a live subjob on this agent."""
        self.by_agent.setdefault(agent_id, set()).add(entry.job.job_id)

    # ================================================================ recovery

    def recover(self) -> int:
        """Reload live jobs from the journal; returns how many."""
        now = time.monotonic()
        self._restore_workload()
        for job in self.store.live():
            if job.spec.array:  # an array's record: its counts of ended elements
                self.arrays[job.job_id] = ArrayProgress(
                    job.array.total,
                    job.array.limit,
                    succeeded=job.array.succeeded,
                    failed=job.array.failed,
                    cancelled=job.array.cancelled,
                )
                continue
            entry = Entry(job=job, need=demand_of(job.spec.resources), submitted_mono=now)
            self.entries[job.job_id] = entry
            self.usage_ledger.ends_known(job)
            ended = job.state in TERMINAL_JOB_STATES  # loaded for a subjob still settling
            if job.array_id and job.state != zone_pb2.WAITING and not ended:
                # Under way at the crash (its array's record precedes it in the journal).
                progress = self.arrays.get(job.array_id)
                if progress is not None:
                    progress.active.add(job.job_id)
            if is_atomized(job.spec) and not ended:
                self.atomizer.admit(job)
            for p in job.placements:  # earlier attempts too: a copy may still run
                if p.state in LIVE_SUBJOB:
                    self.view.add_placeholder(p.agent_id, p.agent_address, now)
                    self.by_agent.setdefault(p.agent_id, set()).add(job.job_id)
                    if p.reason == COMMITTING:
                        self.unconfirmed.setdefault(p.agent_id, set()).add(job.job_id)
            if not is_atomized(job.spec):
                # A move the crash cut short after its copy started: the copy it moved
                # from is retired now, not left running until its own end.
                current = entry.current()
                self._finish_moves(entry, current, member_states(current))
                self._watch_time_limit(entry)
            if job.state == zone_pb2.PENDING and not any(
                p.state in LIVE_SUBJOB for p in entry.current()
            ):
                if job.forwarded_to.startswith("pending:"):
                    # A forward was in flight at the crash: only the peer may say whether
                    # it took the job, so ask it again (same idempotency key).
                    self._resume_forwards.append(entry)
                elif job.job_id in self.atomizer.atoms:
                    job.state = zone_pb2.QUEUED  # it waits for the next window
                else:
                    self.spawn(self._place(entry), f"place-{job.job_id}")
            elif job.state in (zone_pb2.QUEUED, zone_pb2.WAITING):
                entry.queued_at = now
        # Agents heard from lately, idle ones too, so drain, undrain and pressure reach an
        # agent that has not heartbeated since this restart (frozen, partitioned).
        for agent_id, (address, seen_unix) in self.store.known_agents().items():
            if time.time() - seen_unix < KNOWN_AGENT_SECONDS:
                self.view.add_placeholder(agent_id, address, now)
        self.queue_wake.set()
        return len(self.entries)

    def resume_forwards(self, resume: Callable[[Entry, str], Coroutine[Any, Any, bool]]) -> None:
        """Resend the forwards that were unanswered at a restart; a definite refusal places
        the job here."""
        pending, self._resume_forwards = self._resume_forwards, []
        for entry in pending:
            target = entry.job.forwarded_to.removeprefix("pending:")
            self.spawn(self._resume_forward(entry, target, resume), f"fwd-{entry.job.job_id}")

    async def _resume_forward(
        self,
        entry: Entry,
        target: str,
        resume: Callable[[Entry, str], Coroutine[Any, Any, bool]],
    ) -> None:
        if await resume(entry, target):
            self.atomizer.forget(entry.job.job_id)
        else:
            await self._keep_here(entry)

    # ================================================================ admission

    async def submit(
        self,
        spec: zone_pb2.JobSpec,
        client_request_id: str,
        *,
        forwarded_from: str = "",
        allow_forward: bool = True,
        bearer: str = "",
    ) -> zone_pb2.Job:
        (job,) = await self.submit_many(
            [(spec, client_request_id)],
            forwarded_from=forwarded_from,
            allow_forward=allow_forward,
            bearer=bearer,
            name_items=False,
        )
        return job

    async def submit_many(
        self,
        requests: Sequence[tuple[zone_pb2.JobSpec, str]],
        *,
        forwarded_from: str = "",
        allow_forward: bool = True,
        bearer: str = "",
        name_items: bool = True,
    ) -> list[zone_pb2.Job]:
        """Accept jobs (Submit, SubmitBatch): every request is checked before any is taken
        (an error names ``requests[i]`` when ``name_items``), then all new jobs, array
        elements included, are journaled in one write and started. A request whose
        (tenant, client_request_id) was seen before returns that job again."""
        check_count(requests, "requests", max_items=MAX_BATCH_JOBS)
        answers: list[zone_pb2.Job | list[Entry]] = []
        taken: dict[tuple[str, str], int] = {}
        for i, (spec, request_id) in enumerate(requests):
            try:
                check_str(request_id, "client_request_id")
                if not spec.tenant:
                    spec.tenant = DEFAULT_TENANT
                if request_id and (spec.tenant, request_id) in taken:
                    answers.append(answers[taken[(spec.tenant, request_id)]])
                    continue
                existing = self.store.by_request(spec.tenant, request_id) if request_id else None
                if existing is not None:
                    answers.append(existing)
                    continue
                answers.append(self._new_entries(spec, request_id, forwarded_from, bearer))
                if request_id:
                    taken[(spec.tenant, request_id)] = i
            except LaminarError as exc:
                if name_items:
                    raise exc.within(f"requests[{i}]") from None
                raise
        new: list[Entry] = []
        seen: set[int] = set()
        for answer in answers:
            if isinstance(answer, list) and id(answer) not in seen:
                seen.add(id(answer))
                new.extend(answer)
        for entry in new:
            job = entry.job
            if job.spec.array:  # the array's own record: its elements are the work
                array = parse_array(job.spec.array)
                self.arrays[job.job_id] = ArrayProgress(len(array.indices), array.limit)
                self._sum_up_array(job)
                continue
            self.entries[job.job_id] = entry
            if is_atomized(job.spec):
                self.atomizer.admit(job)
            self._route(entry, allow_forward and _may_forward(job))
        try:
            self.store.put_many([e.job for e in new])
        except Exception:
            for entry in new:
                self.entries.pop(entry.job.job_id, None)
                self.arrays.pop(entry.job.job_id, None)
                self.atomizer.forget(entry.job.job_id)
            raise
        self.metrics.submitted.inc(len([e for e in new if not e.job.spec.array]))
        for entry in new:
            if not entry.job.spec.array:
                self._kick(entry, allow_forward and _may_forward(entry.job))
        return [fresh(answer[0].job if isinstance(answer, list) else answer) for answer in answers]

    def _new_entries(
        self, spec: zone_pb2.JobSpec, request_id: str, forwarded_from: str, bearer: str
    ) -> list[Entry]:
        """Check one new job and make its record (an array: its record, then its
        elements'); nothing is kept yet."""
        need = validate_spec(spec)
        largest = self.view.largest_gpus
        if need.gpus > largest > 0 and not self.config.peers.peers:
            # No peer zone to send it to, and no host here was ever that large.
            raise InvalidArgument(
                f"{need.gpus} GPUs on one host, but the largest host of zone {self.zone_name} "
                f"has {largest}; ask for at most {largest} per member (a gang spreads "
                "members over hosts)",
                field="spec.resources.gpus",
            )
        array = parse_array(spec.array) if spec.array else None
        for dep in spec.after:
            check_str(dep, "spec.after", required=True)
            if self._job(dep) is None:
                raise InvalidArgument(f"no job {dep!r} to wait for", field="spec.after")
        item = queue_item(spec, need)
        refusal = quota_never_fits(item, self.quotas.get(spec.tenant))
        if refusal:
            raise FailedPrecondition(refusal, field="spec.resources")
        now, now_mono = time.time(), time.monotonic()
        job = zone_pb2.Job(
            job_id=f"j-{uuid.uuid4().hex[:10]}",
            spec=spec,
            state=zone_pb2.PENDING,
            reason="placing" if not forwarded_from else f"forwarded from zone {forwarded_from}",
            submitted_unix=now,
            zone=self.zone_name,
            client_request_id=request_id,
            attempts=1,
        )
        entries = [Entry(job=job, need=need, submitted_mono=now_mono, bearer=bearer)]
        if array is None:
            return entries
        for order, index in enumerate(array.indices):
            element_spec = zone_pb2.JobSpec()
            element_spec.CopyFrom(spec)
            element_spec.ClearField("array")
            element = zone_pb2.Job(
                job_id=element_id(job.job_id, index),
                spec=element_spec,
                state=zone_pb2.PENDING,
                reason="placing",
                submitted_unix=now + order * 1e-6,  # the queue takes elements in order
                zone=self.zone_name,
                attempts=1,
                array_id=job.job_id,
                array_index=index,
            )
            entries.append(Entry(job=element, need=need, submitted_mono=now_mono, bearer=bearer))
        return entries

    # ================================================================ job arrays

    def _array_block(self, entry: Entry) -> str:
        """Why an array element may not be under way yet (its array's %N limit), or "";
        an element that may go counts against the limit from then on."""
        job = entry.job
        progress = self.arrays.get(job.array_id) if job.array_id else None
        if progress is None or progress.may_start(job.job_id):
            return ""
        return (
            f"array {job.array_id}: {progress.limit} elements under way at once "
            f"(%{progress.limit}); this one starts when one of them ends"
        )

    def _sum_up_array(self, array_job: zone_pb2.Job) -> None:
        """Write where the array's elements stand into its record; end it with its last."""
        progress = self.arrays.get(array_job.job_id)
        if progress is None:
            return
        running = any(
            (e := self.entries.get(element)) is not None and e.job.state in RUNNING_JOB_STATES
            for element in progress.active
        )
        progress.sum_up(array_job, any_running=running, now_unix=time.time())
        if progress.done:
            del self.arrays[array_job.job_id]

    def _element_ended(self, job: zone_pb2.Job) -> None:
        """An array element reached its end: count it, and journal the array's record."""
        progress = self.arrays.get(job.array_id)
        if progress is None:
            return
        progress.element_ended(job)
        array_job = self.store.get(job.array_id)
        if array_job is not None:
            self._sum_up_array(array_job)
            self.store.put(array_job)

    def _route(self, entry: Entry, allow_forward: bool) -> None:
        """Decide the first state: waiting for dependencies or quota, queued, or placing."""
        job = entry.job
        blocks = (
            (Reason.DEPENDENCY, self._dependency_block),
            (Reason.ARRAY_LIMIT, self._array_block),
            (Reason.QUOTA, self._quota_block),
        )
        for reason, block in blocks:
            waiting = block(entry)
            if waiting:
                job.state = zone_pb2.WAITING
                set_reason(job, reason, waiting)
                entry.queued_at = time.monotonic()
                return
        if job.job_id in self.atomizer.atoms:
            if allow_forward and self.forwarder is not None:
                # Flow splitting picks its zone as for a rigid job (_kick): a peer, or a
                # window here.
                set_reason(job, Reason.PLACING, "routing: flow splitting picks its zone")
                return
            self._await_window(entry)
            return
        gang = max(1, job.spec.gang_size)
        members_total = self.view.counts(entry.need).members_total
        if gang > 1 and members_total < gang:
            job.state = zone_pb2.QUEUED
            set_reason(
                job,
                Reason.TOO_LARGE,
                f"the zone cannot hold this gang even when idle: its ready hosts hold "
                f"{members_total} of {gang} x {entry.need.label()}; waiting for more hosts",
            )
            entry.queued_at = time.monotonic()
            return
        may_forward = allow_forward and self.forwarder is not None and bool(self.config.peers.peers)
        if not may_forward and self._behind_blocked_head(entry):
            self._queue_behind_head(entry)
            return
        # A peer zone may take it (flow splitting decides first); if it stays here behind
        # a blocked head, _forward_or_place queues it then.
        set_reason(job, Reason.PLACING, job.reason or "placing")

    def _await_window(self, entry: Entry) -> None:
        """An atomized job stays in this zone: it waits for a window (the market starts it)."""
        job = entry.job
        job.state = zone_pb2.QUEUED
        set_reason(
            job,
            Reason.WINDOW,
            f"waiting for a window; {units_done(job)} of {job.spec.atomization.total_units} "
            "units done",
        )
        entry.queued_at = time.monotonic()
        self.atomizer.wake.set()

    async def _keep_here(self, entry: Entry) -> None:
        """No peer took ``entry``: an atomized job waits here for a window, a rigid one is
        placed."""
        if entry.job.job_id in self.atomizer.atoms:
            self._await_window(entry)
            self.save(entry)
            self._publish(entry)
            return
        await self._place(entry)

    def _behind_blocked_head(self, entry: Entry) -> bool:
        """Whether a job of its kind and no higher class waits blocked at the queue's head:
        then this one may not start before it (it waits its turn in the queue)."""
        head_priority = self._blocked_families.get(entry.need.family)
        priority = entry.job.spec.priority or common_pb2.BATCH
        return head_priority is not None and priority >= head_priority

    def _queue_behind_head(self, entry: Entry) -> None:
        entry.job.state = zone_pb2.QUEUED
        set_reason(
            entry.job,
            Reason.PRIORITY,
            "behind queued work of the same kind; waiting for the next queue pass",
        )
        entry.queued_at = time.monotonic()

    def _kick(self, entry: Entry, allow_forward: bool) -> None:
        if entry.job.state == zone_pb2.PENDING:
            if allow_forward and self.forwarder is not None:
                self.spawn(self._forward_or_place(entry), f"route-{entry.job.job_id}")
            else:
                self.spawn(self._place(entry), f"place-{entry.job.job_id}")
        else:
            self.queue_wake.set()
            self._publish(entry)

    async def _forward_or_place(self, entry: Entry) -> None:
        assert self.forwarder is not None
        if await self.forwarder(entry):
            self.atomizer.forget(entry.job.job_id)  # the peer's market runs it
            return
        if entry.job.job_id not in self.atomizer.atoms and self._behind_blocked_head(entry):
            self._queue_behind_head(entry)  # it stays here: after the blocked head
            self.save(entry)
            self.queue_wake.set()
            return
        await self._keep_here(entry)

    def _dependency_block(self, entry: Entry) -> str:
        pending = []
        for dep in entry.job.spec.after:
            job = self._job(dep)
            if job is None or job.state == zone_pb2.JOB_SUCCEEDED:
                continue
            if job.state in TERMINAL_JOB_STATES:
                return f"!dependency {dep} ended {zone_pb2.JobState.Name(job.state).lower()}"
            pending.append(dep)
        if pending:
            return f"waiting for {', '.join(pending)} to succeed"
        return ""

    def tenant_usage(self) -> tuple[dict[str, float], dict[str, int]]:
        units: dict[str, float] = {}
        memory: dict[str, int] = {}
        for e in self.entries.values():
            tenant = e.job.spec.tenant
            if e.job.job_id in self.atomizer.atoms:
                # An atomized job holds what its live pieces hold (its spec asks nothing).
                for p in e.job.placements:
                    if p.state in LIVE_SUBJOB:
                        piece = demand_of(p.resources)
                        units[tenant] = units.get(tenant, 0.0) + piece.gpu_units
                        memory[tenant] = memory.get(tenant, 0) + piece.memory_bytes
            elif e.job.state in RUNNING_JOB_STATES or e.placing:
                units[tenant] = units.get(tenant, 0.0) + e.item.units
                memory[tenant] = memory.get(tenant, 0) + e.need.memory_bytes * e.item.gang_size
        return units, memory

    def _quota_block(self, entry: Entry) -> str:
        quota = self.quotas.get(entry.job.spec.tenant)
        if quota is None:
            return ""
        units, memory = self.tenant_usage()
        tenant = entry.job.spec.tenant
        return quota_block(entry.item, quota, units.get(tenant, 0.0), memory.get(tenant, 0))

    # ================================================================ placement

    async def _place(self, entry: Entry, *, from_queue: bool = False) -> bool:
        """One placement try within the probe budget; on failure the job waits in the queue."""
        if entry.placing or entry.job.state in TERMINAL_JOB_STATES:
            return False
        entry.placing = True
        started = time.monotonic()
        try:
            async with self._semaphore:
                return await self._place_once(entry, started, from_queue)
        finally:
            entry.placing = False

    async def _place_once(
        self, entry: Entry, started: float, from_queue: bool, *, retry_commit: bool = True
    ) -> bool:
        job = entry.job
        if self._wait_for_old_copy(entry):
            return False
        gang = max(1, job.spec.gang_size)
        ask = Ask(
            job_id=job.job_id,
            resources=job.spec.resources,
            gang_size=gang,
            priority=job.spec.priority or common_pb2.BATCH,
            value=job.spec.value,
            tenant=job.spec.tenant,
        )
        ttl = self.config.placement.lease_ttl_seconds
        if gang > 1:
            ttl = max(ttl, self.config.placement.budget_seconds + 2 * ttl)
        hook = _ProbeCommit(self, entry) if gang == 1 else None
        gathered = await self.placer.gather(ask, lease_ttl_seconds=ttl, commit=hook)
        job.probes += max(0, gathered.probes - (hook.probes if hook is not None else 0))
        job.bounces += gathered.bounces
        if hook is not None and hook.pending is not None:
            ok = await self._probe_committed(entry, hook.pending, gathered)
        else:
            if job.state in TERMINAL_JOB_STATES:  # cancelled while probing
                if gathered.chosen:
                    await self.placer.release(gathered.chosen)
                return False
            if gathered.chosen is None:
                refused = [e for e in gathered.errors if is_refused_input(e)]
                if refused:
                    self.finish(
                        entry,
                        zone_pb2.JOB_FAILED,
                        f"the agent refused the job: {rpc_reason(refused[0])}",
                        Reason.REFUSED,
                    )
                    return False
                self.metrics.placements.labels("queued").inc()
                self._enqueue(entry, gathered.reasons)
                return False
            ok = await self.commit_all(entry, gathered.chosen)
        if not ok:
            self.metrics.placements.labels("commit_failed").inc()
            if job.state in TERMINAL_JOB_STATES:
                return False
            if not retry_commit:
                self._enqueue(entry, [job.reason])
                return False
            # A lost commit (lease expired on a busy agent) is transient: try once more now.
            return await self._place_once(entry, started, from_queue, retry_commit=False)
        latency = time.monotonic() - (entry.queued_at if from_queue else entry.submitted_mono)
        priority = common_pb2.PriorityClass.Name(job.spec.priority or common_pb2.BATCH).lower()
        self.metrics.placements.labels("placed").inc()
        self.metrics.placement_seconds.observe(time.monotonic() - started)
        self.metrics.probes_per_placement.observe(gathered.probes)
        self.metrics.bounces_per_placement.observe(gathered.bounces)
        if from_queue:
            self.metrics.queue_seconds.labels(priority).observe(latency)
        return True

    async def _probe_committed(
        self, entry: Entry, placement: zone_pb2.Placement, gathered: Gathered
    ) -> bool:
        """The end of a try whose probes carried the commit: the member runs (its probe's
        reply says so), or may run where a probe got no answer (confirmed with that agent
        before the job is placed again, as for a commit of unknown outcome)."""
        job = entry.job
        reply = gathered.committed
        if placement.state in ENDED_SUBJOB:
            # Its end was reported before the probe's reply came (or instead of it: a lost
            # reply): it ran, and the report already judged the job.
            if reply is not None:
                apply_start_reply(placement, reply.subjob)
            self.save(entry)
            return True
        if reply is not None:
            del placement.slice_ids[:]
            placement.slice_ids.extend(reply.lease.slice_ids)
            copy_subjob(placement, reply.subjob)
            if job.state in TERMINAL_JOB_STATES:  # cancelled while it started: stop it
                self.save(entry)
                await self.terminate(placement, "cancelled while starting", EndCause.CANCELLED)
                return False
            now_running(job)
            self.save(entry)
            return True
        why = gathered.unsure or "no answer"
        log.warning("job %s: a probe carrying the commit got no answer (%s)", job.job_id, why)
        self.unconfirmed.setdefault(placement.agent_id, set()).add(job.job_id)
        job.attempts += 1
        if job.state not in TERMINAL_JOB_STATES:
            set_reason(job, Reason.RETRYING, f"commit failed: {why}")
        self.save(entry)
        return False

    async def commit_all(
        self, entry: Entry, chosen: list[tuple[AgentRecord, agent_pb2.Lease]]
    ) -> bool:
        """Journal the intent, commit every lease, and roll back all members if any fails."""
        job = entry.job
        attempt = job.attempts
        for member, (record, lease) in enumerate(chosen):
            job.placements.append(
                zone_pb2.Placement(
                    subjob_id=rigid_subjob_id(job.job_id, attempt, member),
                    agent_id=record.agent_id,
                    agent_address=record.address,
                    slice_ids=list(lease.slice_ids),
                    member=member,
                    state=common_pb2.STARTING,
                    reason=COMMITTING,
                    attempt=attempt,
                )
            )
            self.by_agent.setdefault(record.agent_id, set()).add(job.job_id)
        job.state = zone_pb2.PENDING
        set_reason(job, Reason.PLACING, "committing leases")
        self.save(entry)
        outcomes = await asyncio.gather(
            *(
                self._commit_one(entry, member, record, lease)
                for member, (record, lease) in enumerate(chosen)
            ),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if not failures:
            now_running(job)
            self.save(entry)
            return True
        why = "; ".join(rpc_reason(f) for f in failures)
        log.warning("job %s: commit failed (%s); rolling back all members", job.job_id, why)
        current = entry.current()
        unknown = {
            current[member].subjob_id
            for member, outcome in enumerate(outcomes)
            if isinstance(outcome, BaseException) and outcome_unknown(outcome)
        }
        for p in current:
            if p.state not in LIVE_SUBJOB:
                continue
            if p.reason != COMMITTING:
                # Started: stop it. Its record stays live until the agent reports the end,
                # and the job is not placed again before that (nothing runs twice).
                await self.terminate(
                    p,
                    f"gang rollback: another member failed to commit ({why})",
                    EndCause.COMMIT_FAILED,
                )
            elif p.subjob_id in unknown:
                # No answer: the agent may have started it. Ask it (at its next heartbeat)
                # before placing the job again; a silent agent is declared lost in time.
                self.unconfirmed.setdefault(p.agent_id, set()).add(job.job_id)
            else:
                p.state = common_pb2.FAILED
                p.end_cause = EndCause.COMMIT_FAILED.wire
                p.reason = f"commit failed: {why}"
                p.ended_unix = time.time()
        job.attempts += 1
        set_reason(job, Reason.RETRYING, f"commit failed: {why}")
        if any(is_refused_input(f) for f in failures):
            # The agent refused the spec itself (a workdir or command it cannot use). Hosts
            # are meant to be alike, and each retry left one more failed subjob on the agent
            # (a retry storm of several a second): the job fails for good, saying why.
            self.finish(
                entry, zone_pb2.JOB_FAILED, f"the agent refused the job: {why}", Reason.REFUSED
            )
        self.save(entry)
        return False

    async def _commit_one(
        self, entry: Entry, member: int, record: AgentRecord, lease: agent_pb2.Lease
    ) -> None:
        del record  # the lease names its agent; the placement holds the address
        await self.commit_placement(entry, entry.current()[member], lease)

    async def commit_placement(
        self,
        entry: Entry,
        placement: zone_pb2.Placement,
        lease: agent_pb2.Lease,
        env: dict[str, str] | None = None,
    ) -> None:
        spec = self.subjob_spec(entry, placement, env)
        subjob = await self.clients.stub(placement.agent_address).Commit(
            agent_pb2.CommitRequest(lease_id=lease.lease_id, spec=spec),
            timeout=self.config.placement.rpc_timeout_seconds,
        )
        apply_start_reply(placement, subjob)

    def subjob_spec(
        self, entry: Entry, placement: zone_pb2.Placement, env: dict[str, str] | None = None
    ) -> common_pb2.SubjobSpec:
        """How the agent should run this placement of the job."""
        job = entry.job
        return common_pb2.SubjobSpec(
            subjob_id=placement.subjob_id,
            job_id=job.job_id,
            tenant=job.spec.tenant,
            command=list(job.spec.command),
            env={**job.spec.env, **(env or {})},
            workdir=job.spec.workdir,
            priority=job.spec.priority or common_pb2.BATCH,
            lifecycle=job.spec.lifecycle or common_pb2.LONG,
            resources=job.spec.resources,
            grace_seconds=job.spec.grace_seconds,
            supports_release_signal=job.spec.supports_release_signal,
            restartable=job.spec.restartable,
            value=job.spec.value,
            expected_seconds=job.spec.expected_seconds,
            run_through_partitions=job.spec.run_through_partitions,
            array_job_id=job.array_id,
            array_index=job.array_index,
        )

    def _wait_for_old_copy(self, entry: Entry) -> bool:
        """A copy from an earlier attempt may still run (being stopped, or its commit went
        unanswered): the job waits in the queue until its agent reports the end, confirms
        it never started, or is declared lost. Returns whether the job waits."""
        job = entry.job
        old = next(
            (p for p in job.placements if p.state in LIVE_SUBJOB and p.attempt != job.attempts),
            None,
        )
        if old is None:
            return False
        reason = (
            f"waiting for agent {old.agent_id} to confirm whether it started subjob "
            f"{old.subjob_id} (its commit went unanswered) before placing the job again"
            if old.reason == COMMITTING
            else f"waiting for subjob {old.subjob_id} of an earlier attempt to stop on "
            f"{old.agent_id} before placing the job again"
        )
        if job.state != zone_pb2.QUEUED or job.reason != reason:
            job.state = zone_pb2.QUEUED
            set_reason(job, Reason.PREVIOUS_COPY, reason)
            entry.queued_at = time.monotonic()
            self.save(entry)
            self._publish(entry)
        return True

    def _enqueue(self, entry: Entry, reasons: list[str]) -> None:
        job = entry.job
        if job.state in TERMINAL_JOB_STATES:
            return
        job.state = zone_pb2.QUEUED
        if reasons:
            log.info("job %s queued after %d probe(s): %s", job.job_id, job.probes, reasons[-1])
        entry.queued_at = time.monotonic()
        self._explain_one(entry)
        self._blocked_families.setdefault(entry.need.family, job.spec.priority or common_pb2.BATCH)
        self.save(entry)
        self.queue_wake.set()

    def _explain_one(self, entry: Entry) -> None:
        """Why a job just queued waits. Its position is behind the jobs of its family the
        last queue pass left waiting and those queued since (the next pass places it
        exactly): counting them here was a scan of every job, per job queued."""
        counts = self.view.counts(entry.need)
        family = entry.need.family
        position = self._queued_per_family.get(family, 0) + 1
        self._queued_per_family[family] = position
        entry.job.queue_position = position
        why = why_waiting(
            entry.need,
            gang_size=max(1, entry.job.spec.gang_size),
            hosts_ready=counts.ready,
            hosts_matching=counts.matching,
            hosts_fitting=counts.fitting,
            position=position,
            expected_start=None,
            now=time.time(),
            members_total=counts.members_total,
        )
        set_reason(entry.job, Reason[why.token.upper()], why.text)

    # ================================================================ the queue

    async def run_queue(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """The queue's root loop: a pass per wake or period. A pass that raises ends the
        loop; its supervisor logs it and restarts it (laminar_base.supervise).

        Passes start at least ``queue.min_pass_seconds`` apart, and a pass that took longer
        than that (a long queue) is followed by as long a pause: the event loop's CPU then
        goes at most half to queue passes, and placements, heartbeats and calls keep the
        rest (:func:`pass_gap`)."""
        period = self.config.queue.retry_seconds
        least = self.config.queue.min_pass_seconds
        next_at = -math.inf
        while not stop.is_set():
            beat()
            try:
                await asyncio.wait_for(self.queue_wake.wait(), period)
            except TimeoutError:
                pass
            early = next_at - time.monotonic()
            if early > 0:
                # Right after a pass: wakes until then are served by one.
                await asyncio.sleep(early)
            self.queue_wake.clear()
            started, cpu = time.monotonic(), time.thread_time()
            await self.queue_pass()
            next_at = started + pass_gap(least, time.thread_time() - cpu)

    async def queue_pass(self) -> None:
        """The queue loop's pass (:meth:`one_pass`; the market's loop runs it as well)."""
        await self.one_pass()

    async def one_pass(self) -> None:
        """One pass over all waiting work in one class order, the simulator's too
        (laminar_zone.queue.class_order): per priority class, highest first, the walk of its
        rigid jobs (each placed here, awaited, without delaying a blocked head) and then its
        clearing round (the atomizer's), so a lower class's rigid job never takes a slice a
        higher class's bid would win. The queue's loop and the market's both run it, one
        pass at a time."""
        async with self._pass_lock:
            await self._one_pass()

    async def _one_pass(self) -> None:
        now_unix = time.time()
        self._resolve_waiting()
        waiting = [
            e
            for e in self.entries.values()
            if e.job.state in (zone_pb2.QUEUED, zone_pb2.WAITING) and not e.placing
        ]
        units, memory = self.tenant_usage()
        market = await self.atomizer.open_round(units, memory)
        if not waiting and market is None:
            self._blocked_families.clear()
            self.blocked_starts.clear()
            self._queued_per_family.clear()
            self._update_gauges()
            return
        waiting.sort(key=lambda e: order_key(e.item, units, self.shares))
        walk = QueueWalk(now_unix, backfill=self.config.queue.backfill)
        changed: list[Entry] = []
        counts: dict[Demand, HostCounts] = {}
        releases: dict[str, ReleaseCurve] = {}  # per family, this pass
        queued_per_family: dict[str, int] = {}

        def admit(entry: Entry) -> Admit:
            """Whether ``entry`` is walked in this pass, and whether it could ever fit."""
            job = entry.job
            if job.state in TERMINAL_JOB_STATES or entry.placing:
                return Admit.SKIP
            if job.state == zone_pb2.WAITING and self._dependency_block(entry):
                return Admit.SKIP
            held = self._array_block(entry) if job.state == zone_pb2.WAITING else ""
            if held:
                if job.reason != held:
                    set_reason(job, Reason.ARRAY_LIMIT, held)
                    changed.append(entry)
                return Admit.SKIP
            if self._wait_for_old_copy(entry):
                return Admit.SKIP
            if job.job_id in self.atomizer.atoms:  # placed by the market, not by this walk
                if job.state == zone_pb2.WAITING:
                    job.state = zone_pb2.QUEUED
                    set_reason(job, Reason.WINDOW, "dependencies succeeded; waiting for a window")
                    changed.append(entry)
                    self.atomizer.wake.set()
                return Admit.SKIP
            tenant = job.spec.tenant
            blocked = quota_block(
                entry.item, self.quotas.get(tenant), units.get(tenant, 0.0), memory.get(tenant, 0)
            )
            if blocked:
                if job.state != zone_pb2.WAITING or job.reason != blocked:
                    job.state = zone_pb2.WAITING
                    set_reason(job, Reason.QUOTA, blocked)
                    changed.append(entry)
                return Admit.SKIP
            if entry.need not in counts:
                counts[entry.need] = self.view.counts(entry.need)
            # A job the zone cannot hold even when idle blocks nobody.
            never = counts[entry.need].members_total < entry.item.gang_size
            return Admit.NEVER if never else Admit.WALK

        async def start(entry: Entry) -> bool:
            if not self.view.any_fits(entry.need, self.rng):
                return False
            entry.job.state = zone_pb2.PENDING
            set_reason(entry.job, Reason.PLACING, "placing from the queue")
            placed = await self._place(entry, from_queue=True)
            if not placed and entry.job.state in TERMINAL_JOB_STATES:
                # It ended while being placed (cancelled, or it ran and its end was
                # reported before the placement returned): it waits for nothing.
                return True
            if placed:
                tenant = entry.job.spec.tenant
                units[tenant] = units.get(tenant, 0.0) + entry.item.units
                memory[tenant] = memory.get(tenant, 0) + entry.need.memory_bytes
                counts.pop(entry.need, None)
                releases.pop(entry.need.family, None)
                if market is not None:
                    market.note_started(entry.job.placements)
                return True
            counts[entry.need] = self.view.counts(entry.need)
            return False

        def waited(entry: Entry, wait: Waiting) -> None:
            job = entry.job
            hosts = counts[entry.need]
            why = why_waiting(
                entry.need,
                gang_size=entry.item.gang_size,
                hosts_ready=hosts.ready,
                hosts_matching=hosts.matching,
                hosts_fitting=hosts.fitting,
                position=wait.position,
                expected_start=wait.expected_start,
                now=now_unix,
                blocked_by=wait.blocked_by if hosts.fitting else "",
                members_total=hosts.members_total,
            )
            queued_per_family[entry.need.family] = wait.position
            if (
                job.state != zone_pb2.QUEUED
                or job.reason != why.text
                or job.queue_position != wait.position
            ):
                job.state = zone_pb2.QUEUED
                set_reason(job, Reason[why.token.upper()], why.text)
                job.queue_position = wait.position
                job.expected_start_unix = wait.expected_start or 0.0
                changed.append(entry)

        steps = class_order(
            walk,
            waiting,
            lambda e: e.item,
            lambda e, ahead: self._expected_start(e, ahead, now_unix, releases),
            market.classes if market is not None else (),
            admit=admit,
            waited=waited,
            estimate_all=True,
        )

        async def clear(step: Clear) -> None:
            assert market is not None  # a round is asked only for a class with market work
            await self.atomizer.clear_class(market, step)

        await drive_awaiting(steps, start, clear)
        if market is not None:
            await self.atomizer.close_round(market)
        self._queued_per_family = queued_per_family
        self._blocked_families = {
            family: self.entries[head.job_id].job.spec.priority or common_pb2.BATCH
            for family, head in walk.heads.items()
            if head.job_id in self.entries
        }
        #: When each family's blocked head is expected to start: windows of that family
        #: end there, so atomized work backfills it without delaying it (EASY).
        self.blocked_starts = {
            family: (self._blocked_families[family], head.expected_start)
            for family, head in walk.heads.items()
            if head.expected_start is not None and family in self._blocked_families
        }
        self.save_many(changed)
        self._update_gauges()

    def _expected_start(
        self,
        entry: Entry,
        units_ahead: float,
        now_unix: float,
        releases: dict[str, ReleaseCurve],
    ) -> float | None:
        """When ``entry`` may start, from the expected ends of running work of its family;
        ``releases`` holds each family's, made once per pass (one scan of the live jobs per
        family, not per waiting job) and dropped when the pass starts a job of it."""
        family = entry.need.family
        if family not in releases:
            ends: list[tuple[float, float]] = []
            mean = self._mean_run_seconds.get(family, 0.0)
            for other in self.entries.values():
                if other.job.state not in RUNNING_JOB_STATES or other.need.family != family:
                    continue
                run = other.item.expected_seconds or mean  # the estimate, else the limit
                if run > 0:
                    ends.append((other.job.started_unix + run, other.item.units))
            releases[family] = ReleaseCurve(ends)
        return releases[family].start(now_unix, 0.0, units_ahead, entry.item.units)

    def _resolve_waiting(self) -> None:
        """Dependencies: fail jobs whose dependency failed, release those whose all succeeded."""
        for entry in list(self.entries.values()):
            if entry.job.state != zone_pb2.WAITING:
                continue
            block = self._dependency_block(entry)
            if block.startswith("!"):
                self.finish(entry, zone_pb2.JOB_FAILED, block[1:], Reason.DEPENDENCY_FAILED)
                self.save(entry)
            elif not block and reason_of(entry.job.reason_code) is Reason.DEPENDENCY:
                set_reason(entry.job, Reason.PLACING, "dependencies succeeded")

    # ================================================================ agent events

    async def retire_moved(
        self, entry: Entry, old: zone_pb2.Placement, new: zone_pb2.Placement
    ) -> None:
        """The copy ``new`` runs: the one it moved away from ends (a free retry's cause)."""
        if old.state not in LIVE_SUBJOB:
            return  # retired already (the move's own task and an event both saw it run)
        why = f"{READDRESSED} moved to {new.agent_id} after Airlock suspended it on {old.agent_id}"
        old.state = common_pb2.KILLED
        old.end_cause = EndCause.READDRESSED.wire
        old.reason = why
        old.ended_unix = time.time()
        if new.state in ENDED_SUBJOB:
            self.evaluate(entry)  # the copy ended before its move was done: judge the job now
        self.save(entry)
        self.metrics.readdressed.inc()
        log.info("job %s: subjob %s %s as %s", entry.job.job_id, old.subjob_id, why, new.subjob_id)
        await self.terminate(old, why, EndCause.READDRESSED)

    def stop_copy(self, agent_id: str, subjob_id: str, why: str, context: str = "") -> None:
        """Stop a copy of a subjob on ``agent_id`` that the router does not count on."""
        log.warning(
            "%sstopping subjob %s on agent %s: %s",
            f"{context}: " if context else "",
            subjob_id,
            agent_id,
            why,
        )
        record = self.view.agents.get(agent_id)
        stop = zone_pb2.Placement(
            subjob_id=subjob_id,
            agent_id=agent_id,
            agent_address=record.address if record is not None else "",
        )
        self.spawn(self.terminate(stop, why, EndCause.SUPERSEDED), f"supersede-{subjob_id}")

    def evaluate(self, entry: Entry) -> None:
        """Derive the job's state from its current attempt's subjobs; retry or finish."""
        job = entry.job
        if job.state in TERMINAL_JOB_STATES:
            return
        if job.job_id in self.atomizer.atoms:
            self.atomizer.evaluate(entry)
            progress = self.atomizer.progress(job)
            if progress is not None:
                job.atomization.CopyFrom(progress)
            return
        current = entry.current()
        copies = member_states(current)
        self._finish_moves(entry, current, copies)
        verdict = judge_attempt(
            copies,
            job.spec.gang_size,
            job.retries_used,
            job.spec.max_retries,
        )
        if verdict.outcome is Outcome.SUCCEEDED:
            run = max(p.run_seconds for p in current)
            family = entry.need.family
            old = self._mean_run_seconds.get(family)
            self._mean_run_seconds[family] = run if old is None else 0.8 * old + 0.2 * run
            self.finish(entry, zone_pb2.JOB_SUCCEEDED, "all subjobs succeeded")
        elif verdict.outcome in (Outcome.RETRY, Outcome.FAILED):
            assert verdict.failed_member is not None
            first = current[verdict.failed_member]
            for index in verdict.stop:
                self.spawn(
                    self.terminate(
                        current[index],
                        f"gang member {first.member} ended: {first.reason}",
                        EndCause.GANG_STOPPED,
                    ),
                    "gang-stop",
                )
            what = f"subjob {first.subjob_id} on {first.agent_id} ended {state_name(first.state)}: {first.reason}"
            if verdict.outcome is Outcome.FAILED:
                limited = end_cause(first.end_cause) is EndCause.TIME_LIMIT
                self.finish(
                    entry, zone_pb2.JOB_FAILED, what, Reason.TIME_LIMIT if limited else None
                )
                return
            if verdict.counted:
                job.retries_used += 1
            job.attempts += 1
            job.state = zone_pb2.PENDING
            counted = f"retry {job.retries_used} of {job.spec.max_retries}"
            set_reason(
                job,
                Reason.RETRYING,
                f"retrying ({counted if verdict.counted else 'not counted'}) after {what}",
            )
            self.metrics.retries.inc()
            self.spawn(self._place(entry), f"retry-{job.job_id}")
        elif verdict.outcome is Outcome.RUNNING:
            suspended = verdict.suspended
            job.state = zone_pb2.JOB_SUSPENDED if suspended else zone_pb2.JOB_RUNNING
            job.started_unix = job.started_unix or time.time()
            set_reason(
                job,
                Reason.SUSPENDED if suspended else Reason.NONE,
                f"{suspended} subjob(s) suspended by Airlock (GPU memory pressure on "
                f"{', '.join(sorted({p.agent_id for p in current if p.state == common_pb2.SUSPENDED}))})"
                if suspended
                else "",
            )
            self._watch_time_limit(entry)

    def _watch_time_limit(self, entry: Entry) -> None:
        if entry.job.job_id not in self.atomizer.atoms:  # pieces end with their windows
            self.time_limits.watch(entry.job, entry.current())

    def _enforce_time_limits(self, now_unix: float) -> None:
        """Stop each running subjob past its job's time limit (laminar_zone.time_limits)."""
        for placement, why in self.time_limits.due(now_unix, self._live_job):
            log.info("job %s: subjob %s %s", job_of(placement.subjob_id), placement.subjob_id, why)
            self.spawn(
                self.terminate(placement, why, EndCause.TIME_LIMIT), f"limit-{placement.subjob_id}"
            )

    def _finish_moves(
        self, entry: Entry, current: list[zone_pb2.Placement], copies: list[MemberState]
    ) -> None:
        """A move's copy started (it runs, or already ended) while the copy it moved away
        from still lives (the move was cut short by a restart, or its copy's report came
        first): retire the old one."""
        for index, by in taken_over(copies).items():
            old = current[index]
            if old.state in LIVE_SUBJOB:
                self.spawn(self.retire_moved(entry, old, current[by]), f"moved-{old.subjob_id}")

    def finish(self, entry: Entry, state: int, reason: str, code: Reason | None = None) -> None:
        """End the job in ``state``; ``code`` (default: by the state) says why for scripts."""
        job = entry.job
        job.state = state  # type: ignore[assignment]
        set_reason(job, END_REASONS.get(state, Reason.NONE) if code is None else code, reason)
        job.ended_unix = time.time()
        job.queue_position = 0
        job.expected_start_unix = 0
        self.metrics.finished.labels(zone_pb2.JobState.Name(state).lower()).inc()
        log.info("job %s %s: %s", job.job_id, zone_pb2.JobState.Name(state).lower(), reason)
        if job.array_id:
            self._element_ended(job)
        self.queue_wake.set()

    def forget_if_done(self, entry: Entry) -> None:
        job = entry.job
        if job.state not in TERMINAL_JOB_STATES:
            return
        if any(p.state in LIVE_SUBJOB for p in job.placements):
            return
        for p in job.placements:
            jobs = self.by_agent.get(p.agent_id)
            if jobs is not None:
                jobs.discard(job.job_id)
        self.time_limits.forget(p.subjob_id for p in job.placements)
        # Keep it in memory while dependents may ask; the journal has it anyway.
        self.entries.pop(job.job_id, None)
        self.atomizer.forget(job.job_id)

    # ================================================================ membership tick

    def sweep(self) -> None:
        """Once a period: stale agents, lost agents and their subjobs."""
        now = time.monotonic()
        for stale in self.view.sweep(now):
            log.warning(
                "agent %s stale: no heartbeat for %.1f s; no more probes to it",
                stale.agent_id,
                now - stale.last_heartbeat,
            )
        self._enforce_time_limits(time.time())
        for subjob_id, (stop, why, cause) in list(self._owed_stops.items()):
            record = self.view.agents.get(stop.agent_id)
            if record is not None and not record.is_stale:
                # A stale agent's fence stops its work; when it is back, reconciling does.
                del self._owed_stops[subjob_id]
                self.spawn(self.terminate(stop, why, cause), f"stop-again-{subjob_id}")
        lost_after = self.config.membership.lost_after_seconds
        for agent_id, job_ids in list(self.by_agent.items()):
            record = self.view.agents.get(agent_id)
            if record is None or not record.is_stale:
                continue
            silent = now - record.last_heartbeat
            if silent < lost_after:
                continue
            for job_id in list(job_ids):
                entry = self.entries.get(job_id)
                if entry is None:
                    job_ids.discard(job_id)
                    continue
                placements = entry.job.placements
                for i, p in enumerate(placements):
                    if p.agent_id == agent_id and p.state in LIVE_SUBJOB:
                        p.state = common_pb2.LOST
                        # A move's copy never confirmed (its fence stopped it if it ran)
                        # leaves the member where it was, as when its agent says it never
                        # started it; any other copy is the member, lost.
                        moved = p.reason == COMMITTING and moves_from_live_copy(placements[:i], p)
                        p.end_cause = (EndCause.READDRESSED if moved else EndCause.LOST).wire
                        p.reason = (
                            f"agent {agent_id} silent for {silent:.0f} s "
                            f"(membership.lost_after_seconds={lost_after:g})"
                        )
                        p.ended_unix = time.time()
                job_ids.discard(job_id)
                self.evaluate(entry)
                self.save(entry)
                self.forget_if_done(entry)
        self._save_workload()
        self._update_gauges(force=True)

    def _save_workload(self) -> None:
        """Journal the task shapes this router observed when they changed (at most once a
        sweep): a restarted router ranks by what it learned, not from nothing."""
        workload = self.placer.workload
        if workload.observed == self._workload_saved:
            return
        self.store.set_meta(WORKLOAD_META, json.dumps(workload_rows(workload.own)))
        self._workload_saved = workload.observed

    def _restore_workload(self) -> None:
        text = self.store.get_meta(WORKLOAD_META)
        if not text:
            return
        try:
            counts = workload_from_rows(json.loads(text), f"journal meta {WORKLOAD_META!r}")
        except (json.JSONDecodeError, ValueError) as exc:  # learned again from arrivals
            log.warning("ignoring the journaled target workload: %s", exc)
            return
        for shape, count in counts.items():
            self.placer.workload.observe(shape, count)
        self._workload_saved = self.placer.workload.observed
        log.info(
            "target workload restored from the journal: %d shapes, %d tasks",
            len(counts),
            sum(counts.values()),
        )

    # ================================================================ user operations
    # (reads live in laminar_zone.queries, ProbeJob/CommitJob in laminar_zone.client_leases)

    def _live_job(self, job_id: str) -> zone_pb2.Job | None:
        entry = self.entries.get(job_id)
        return None if entry is None else entry.job

    def _job(self, job_id: str) -> zone_pb2.Job | None:
        entry = self.entries.get(job_id)
        if entry is not None:
            return entry.job
        job = self.store.get(job_id)
        if job is not None and job.job_id in self.arrays:
            self._sum_up_array(job)  # an array under way: where its elements stand now
        return job

    def get(self, job_id: str) -> zone_pb2.Job:
        check_str(job_id, "job_id", required=True)
        job = self._job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}", field="job_id")
        return fresh(job)

    async def cancel(self, job_id: str, reason: str) -> zone_pb2.Job:
        check_str(reason, "reason", max_chars=1024)
        job = self.get(job_id)
        if job_id in self.arrays:  # an array: every element not ended yet
            elements = [
                e.job.job_id
                for e in list(self.entries.values())
                if e.job.array_id == job_id and e.job.state not in TERMINAL_JOB_STATES
            ]
            for element in elements:
                await self.cancel(element, reason)
            return self.get(job_id)
        entry = self.entries.get(job_id)
        if job.state == zone_pb2.JOB_CANCELLED:
            # Cancelling twice is harmless: a resend whose first reply was lost, or two
            # users at once, get the cancelled job.
            return job
        if entry is None or job.state in TERMINAL_JOB_STATES:
            raise FailedPrecondition(
                f"job {job_id} has already ended ({zone_pb2.JobState.Name(job.state).lower()})",
                field="job_id",
            )
        why = f"cancelled: {reason or 'by request'}"
        self.finish(entry, zone_pb2.JOB_CANCELLED, why)
        self.save(entry)
        await asyncio.gather(
            *(
                self.terminate(p, why, EndCause.CANCELLED)
                for p in entry.current()
                if p.state in LIVE_SUBJOB
            ),
            return_exceptions=True,
        )
        self.forget_if_done(entry)
        return fresh(entry.job)

    async def terminate(self, placement: zone_pb2.Placement, reason: str, cause: EndCause) -> None:
        """Ask the placement's agent to stop it; its end records ``cause`` (the reason is
        for people)."""
        address = placement.agent_address
        record = self.view.agents.get(placement.agent_id)
        if record is not None:
            address = record.address
        try:
            await self.clients.stub(address).SignalSubjob(
                agent_pb2.SignalSubjobRequest(
                    subjob_id=placement.subjob_id,
                    signal=agent_pb2.TERMINATE,
                    reason=reason,
                    end_cause=cause.wire,
                ),
                timeout=self.config.placement.rpc_timeout_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                log.warning(
                    "could not stop subjob %s on %s (asking again at the next sweep): %s",
                    placement.subjob_id,
                    placement.agent_id,
                    exc.details(),
                )
                stop = zone_pb2.Placement(
                    subjob_id=placement.subjob_id,
                    agent_id=placement.agent_id,
                    agent_address=address,
                )
                self._owed_stops[placement.subjob_id] = (stop, reason, cause)
                return
        # Taken, ended already, or unknown to the agent: nothing more is owed.
        self._owed_stops.pop(placement.subjob_id, None)

    # ================================================================ plumbing

    def save(self, entry: Entry) -> None:
        self.save_many([entry])

    def save_many(self, entries: Sequence[Entry]) -> None:
        """Journal jobs in one write (usage rows first), then tell their watchers."""
        jobs = [e.job for e in entries]
        with self.store.transaction():  # one commit for the usage rows and the jobs
            usage = self.usage_ledger.write(jobs, time.time())
            self.store.put_many(jobs)
        self.usage_ledger.written(usage)
        for entry in entries:
            self._publish(entry)
            self.forget_if_done(entry)

    def _publish(self, entry: Entry) -> None:
        for queue in self.array_watchers.get(entry.job.array_id, ()) if entry.job.array_id else ():
            queue.put_nowait(entry.job)  # a wake-up: the watcher reads the array afresh
        if not entry.watchers:
            return
        snapshot = fresh(entry.job)
        for queue in entry.watchers:
            queue.put_nowait(snapshot)

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> None:
        task: asyncio.Task[Any] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def pending_tasks(self) -> set[asyncio.Task[Any]]:
        """The background tasks under way (placements, commits, stops, releases)."""
        return set(self._tasks) | set(self.placer.background)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    def _update_gauges(self, *, force: bool = False) -> None:
        """Set the job, queue and agent gauges: a scan of every live job and agent, so a
        pass (one per event) refreshes them at most every :data:`GAUGE_SECONDS`; the
        sweep (once per heartbeat period, at most 1 s) always does."""
        now = time.monotonic()
        if not force and now - self._gauges_at < GAUGE_SECONDS:
            return
        self._gauges_at = now
        counts: dict[str, int] = {}
        queued: dict[str, int] = {}
        for e in self.entries.values():
            state = zone_pb2.JobState.Name(e.job.state).lower()
            counts[state] = counts.get(state, 0) + 1
            if e.job.state == zone_pb2.QUEUED:
                p = common_pb2.PriorityClass.Name(e.job.spec.priority or common_pb2.BATCH).lower()
                queued[p] = queued.get(p, 0) + 1
        for state in ("pending", "queued", "waiting", "job_running", "job_suspended"):
            self.metrics.jobs.labels(state).set(counts.get(state, 0))
        for p in ("critical", "production", "batch", "opportunistic"):
            self.metrics.queue_length.labels(p).set(queued.get(p, 0))
        agents: dict[str, int] = {}
        for r in self.view.agents.values():
            agents[r.status.value] = agents.get(r.status.value, 0) + 1
        for status in ("ready", "stale", "draining"):
            self.metrics.agents.labels(status).set(agents.get(status, 0))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.placer.close()
        await self.clients.close()


class _ProbeCommit:
    """Commit on probe for one job's try (:class:`laminar_zone.placer.ProbeCommit`): the
    member's placement is journaled as committing on each host before the probe that
    carries the commit goes out, and dropped again when that host bounced it."""

    def __init__(self, state: ZoneState, entry: Entry) -> None:
        self.state = state
        self.entry = entry
        #: The placement journaled for the probe under way, if any.
        self.pending: zone_pb2.Placement | None = None
        #: Probes already counted into the job (the try's total adds the rest).
        self.probes = 0

    def intent(self, record: AgentRecord) -> common_pb2.SubjobSpec:
        job = self.entry.job
        # Counted now: the member may end, and its job be judged and published as ended,
        # before this try returns.
        job.probes += 1
        self.probes += 1
        placement = job.placements.add(
            subjob_id=rigid_subjob_id(job.job_id, job.attempts, 0),
            agent_id=record.agent_id,
            agent_address=record.address,
            member=0,
            state=common_pb2.STARTING,
            reason=COMMITTING,
            attempt=job.attempts,
        )
        self.state.by_agent.setdefault(record.agent_id, set()).add(job.job_id)
        if job.state not in TERMINAL_JOB_STATES:
            job.state = zone_pb2.PENDING
            set_reason(job, Reason.PLACING, "probing with commit")
        self.state.save(self.entry)
        self.pending = placement
        return self.state.subjob_spec(self.entry, placement)

    def bounced(self, record: AgentRecord) -> None:
        job = self.entry.job
        if self.pending is None or self.pending.agent_id != record.agent_id:
            return
        job.placements.remove(self.pending)
        self.pending = None
        if not any(p.agent_id == record.agent_id for p in job.placements):
            self.state.by_agent.get(record.agent_id, set()).discard(job.job_id)
        # Journaled with the next change: a router that restarts before then finds a
        # committing placement and asks that agent, which knows no such subjob.

    def may_have_run(self, exc: BaseException) -> bool:
        return outcome_unknown(exc)


def pass_gap(least: float, spent: float) -> float:
    """Least time from one queue pass's start to the next's: ``least``
    (``queue.min_pass_seconds``), or twice the event loop's CPU the pass took (its own and
    what the loop ran while it awaited), whichever is longer."""
    return max(least, 2.0 * spent)


def _may_forward(job: zone_pb2.Job) -> bool:
    """Flow splitting sends rigid and atomized jobs alike to peers (an atomized job then
    bids for the peer's windows); an array's elements stay with their array."""
    return not job.array_id


__all__ = ["AlreadyExists", "Entry", "ZoneState"]
