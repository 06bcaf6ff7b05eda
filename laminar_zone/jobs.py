"""The zone's job table, driven: journal, RPCs, loops and metrics around :mod:`laminar_zone.core`.

:class:`ZoneState` is the driver of the router's decision core
(:class:`laminar_zone.core.ZoneCore`): it feeds it events (a submit, a gather's outcome,
a commit's answers, a cancel, the sweep's tick, a queue pass) with the time, and carries
out the instructions it returns (:meth:`ZoneState._do` from synchronous code, where a stop
or a placement becomes a task; :meth:`ZoneState._run` from a task, where it is awaited).
It decides nothing itself.

Jobs are journaled (``store.JobStore``) before any reply or action that depends on them:
a Submit is committed before it is acknowledged; a placement intent (subjob id, agent) is
committed before the Commit RPC, so a router killed mid-commit finds out afterwards, from
the agent, whether the subjob exists. Agent events are applied and journaled before they
are acknowledged.

Capacity knowledge is soft: the view comes from heartbeats and probe replies and is
rebuilt after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, cast

import grpc

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import TERMINAL_JOB_STATES, EndCause
from laminar_base.errors import (
    AlreadyExists,
    LaminarError,
    NotFound,
)
from laminar_base.fragmentation import workload_from_rows, workload_rows
from laminar_base.grpcutil import check_count, check_str
from laminar_base.security import INSECURE, Trust
from laminar_base.wire import demand_of
from laminar_zone.arrays import ArrayProgress, parse_array
from laminar_zone.atomizer import Atomizer, MarketRound, is_atomized, units_done
from laminar_zone.audit import AuditLog
from laminar_zone.auth import DEFAULT_TENANT
from laminar_zone.config import ZoneConfig
from laminar_zone.core import (
    Confirm,
    Count,
    Failure,
    Forget,
    Forward,
    Instruction,
    Journal,
    JudgeAtomized,
    Loop,
    Member,
    NewJob,
    Place,
    Publish,
    Release,
    ResumeForward,
    Retire,
    SumUpArray,
    Terminate,
    TryPlan,
    Wake,
    ZoneCore,
)
from laminar_zone.entry import Entry
from laminar_zone.failures import failure_of
from laminar_zone.kept import KeptLeases
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placements import apply_start_reply, fresh
from laminar_zone.placer import AgentClients, Ask, Placer
from laminar_zone.reasons import Reason
from laminar_zone.spec import MAX_BATCH_JOBS, validate_spec
from laminar_zone.store import JobStore
from laminar_zone.trying import (
    ClearMarket,
    Clock,
    CloseRound,
    CommitMembers,
    CommitOnProbe,
    DoInstructions,
    Gathered,
    GatherLeases,
    OpenRound,
    RunInstructions,
    Slot,
    StartJob,
    TryStep,
    commit_steps,
    pass_steps,
    place_try,
)
from laminar_zone.usage import UsageLedger
from laminar_zone.view import AgentRecord, ZoneView

log = logging.getLogger("laminar.zone.jobs")

#: A restarted router lists journaled agents heard from within this long.
KNOWN_AGENT_SECONDS = 86400.0
#: Most live subjob ids of one heartbeat the router reconciles.
MAX_LIVE_IDS = 4096
#: Journal meta key of the task shapes this router observed (its target workload).
WORKLOAD_META = "workload"
#: The router's clocks, which the core's steps read their time from.
CLOCK = Clock(mono=time.monotonic, unix=time.time)
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
        self.heartbeat_seconds = config.membership.heartbeat_seconds
        #: Atomized jobs: windows, clearing rounds, bidders (docs/atomization.md).
        self.atomizer = Atomizer(self)
        #: The decisions: the job table and its transitions (laminar_zone.core).
        self.core = ZoneCore(
            self.view,
            self.quotas,
            atoms=self.atomizer.atoms,
            lookup=self._journaled,
            recheck_seconds=config.membership.heartbeat_seconds,
            lost_after_seconds=config.membership.lost_after_seconds,
            may_forward=bool(config.peers.peers),
            demand_of=demand_of,
            units_done=units_done,
        )
        self.array_watchers: dict[str, list[asyncio.Queue[zone_pb2.Job]]] = {}
        self.queue_wake = asyncio.Event()
        #: One pass at a time: the queue's loop and the market's both run queue_pass.
        self._pass_lock = asyncio.Lock()
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
        #: The target workload's count of observations last journaled (sweep).
        self._workload_saved = 0
        self.placer.workload.add_prior(config.workload_prior())

    # The core's state, read (and, by reports.py and the atomizer, changed) by name.

    @property
    def entries(self) -> dict[str, Entry]:
        return self.core.entries

    @entries.setter
    def entries(self, entries: dict[str, Entry]) -> None:
        self.core.entries = entries

    @property
    def unconfirmed(self) -> dict[str, set[str]]:
        return self.core.unconfirmed

    @property
    def arrays(self) -> dict[str, ArrayProgress]:
        return self.core.arrays

    @property
    def blocked_starts(self) -> dict[str, tuple[int, float]]:
        return self.core.blocked_starts

    @blocked_starts.setter
    def blocked_starts(self, starts: dict[str, tuple[int, float]]) -> None:
        self.core.blocked_starts = starts

    #: For the atomizer (its Zone protocol): a subjob's report into its placement (the
    #: module function).
    apply_start_reply = staticmethod(apply_start_reply)

    def track(self, entry: Entry, agent_id: str) -> None:
        """The job has (or is about to have) a live subjob on this agent."""
        self.core.track(entry, agent_id)

    # ================================================================ carrying out

    def _do(self, instructions: Sequence[Instruction]) -> None:
        """Carry out the core's instructions from synchronous code: stops, placements,
        forwards, releases and retirements become tasks."""
        for instruction in instructions:
            match instruction:
                case Terminate(placement, why, cause):
                    name = f"stop-{placement.subjob_id}"
                    self.spawn(self.terminate(placement, why, cause), name)
                case Place(entry, from_queue):
                    self.spawn(
                        self._place(entry, from_queue=from_queue), f"place-{entry.job.job_id}"
                    )
                case Forward(entry):
                    self.spawn(self._forward_or_place(entry), f"route-{entry.job.job_id}")
                case Release(leases):
                    self.spawn(self.placer.release(list(leases)), "release")
                case Retire(entry, old, new):
                    self.spawn(self.retire_moved(entry, old, new), f"moved-{old.subjob_id}")
                case ResumeForward(entry):
                    # Resumed once the server has its peers (resume_forwards).
                    self._resume_forwards.append(entry)
                case _:
                    self._carry_out(instruction)

    async def _run(self, instructions: Sequence[Instruction]) -> None:
        """Carry out the core's instructions from a task, awaiting stops (together, as a
        batch of consecutive ones), placements, forwards and releases in order."""
        stops: list[Terminate] = []
        for instruction in [*instructions, None]:
            if isinstance(instruction, Terminate):
                stops.append(instruction)
                continue
            if stops:
                await asyncio.gather(
                    *(self.terminate(t.placement, t.why, t.cause) for t in stops),
                    return_exceptions=True,
                )
                stops = []
            match instruction:
                case None:
                    pass
                case Place(entry, from_queue):
                    await self._place(entry, from_queue=from_queue)
                case Forward(entry):
                    await self._forward_or_place(entry)
                case Release(leases):
                    await self.placer.release(list(leases))
                case Retire(entry, old, new):
                    await self.retire_moved(entry, old, new)
                case _:
                    self._carry_out(instruction)

    def _carry_out(self, instruction: Instruction) -> None:
        """The instructions carried out at once, alike from synchronous code and tasks."""
        match instruction:
            case Journal(entries):
                if entries:
                    self.save_many(entries)
            case Publish(entry):
                self._publish(entry)
            case Wake(Loop.QUEUE):
                self.queue_wake.set()
            case Wake(Loop.MARKET):
                self.atomizer.wake.set()
            case Count(metric, label, value):
                counted = getattr(self.metrics, metric)
                if label:
                    counted = counted.labels(label)
                if value is None:
                    counted.inc()
                else:
                    counted.observe(value)
            case Confirm(agent_id, job_id):
                log.info(
                    "job %s: agent %s is asked at its next heartbeat whether it started it",
                    job_id,
                    agent_id,
                )
            case JudgeAtomized(entry):
                self.atomizer.evaluate(entry)
                progress = self.atomizer.progress(entry.job)
                if progress is not None:
                    entry.job.atomization.CopyFrom(progress)
            case SumUpArray(array_id):
                array_job = self.store.get(array_id)
                if array_job is not None:
                    self.core.sum_up_array(array_job, time.time())
                    self.store.put(array_job)
            case Forget(job_id):
                self.atomizer.forget(job_id)
            case _:
                raise AssertionError(f"not carried out here: {instruction!r}")

    # ================================================================ recovery

    def recover(self) -> int:
        """Reload live jobs from the journal; returns how many."""
        now = time.monotonic()
        self._restore_workload()
        for job in self.store.live():
            if job.spec.array:  # an array's record: its counts of ended elements
                self.core.recover_array(job)
                continue
            entry = Entry(job=job, need=demand_of(job.spec.resources), submitted_mono=now)
            self.usage_ledger.ends_known(job)
            atomized = is_atomized(job.spec)
            if atomized and job.state not in TERMINAL_JOB_STATES:
                self.atomizer.admit(job)
            self._do(self.core.recovered(entry, atomized, now))
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
        taken = await resume(entry, target)
        await self._run(
            self.core.forwarded(entry, taken, time.monotonic())
            if taken
            else self.core.keep_here(entry, time.monotonic())
        )

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
                self.core.admit_array(job, len(array.indices), array.limit)
                self.core.sum_up_array(job, time.time())
                continue
            self.core.admit(entry)
            if is_atomized(job.spec):
                self.atomizer.admit(job)
            self._do(self.core.route(entry, self._may_forward(allow_forward), time.monotonic()))
        try:
            self.store.put_many([e.job for e in new])
        except Exception:
            for entry in new:
                self.core.drop(entry.job.job_id)
                self.atomizer.forget(entry.job.job_id)
            raise
        self.metrics.submitted.inc(len([e for e in new if not e.job.spec.array]))
        for entry in new:
            if not entry.job.spec.array:
                self._do(self.core.kick(entry, self._may_forward(allow_forward)))
        return [fresh(answer[0].job if isinstance(answer, list) else answer) for answer in answers]

    def _new_entries(
        self, spec: zone_pb2.JobSpec, request_id: str, forwarded_from: str, bearer: str
    ) -> list[Entry]:
        """Check one new job's input and let the core make its record (an array: its
        record, then its elements'); nothing is kept yet."""
        need = validate_spec(spec)
        for dep in spec.after:
            check_str(dep, "spec.after", required=True)
        return self.core.new_entries(
            spec,
            need,
            NewJob(
                job_id=f"j-{uuid.uuid4().hex[:10]}",
                zone=self.zone_name,
                request_id=request_id,
                forwarded_from=forwarded_from,
                bearer=bearer,
            ),
            time.time(),
            time.monotonic(),
        )

    # ================================================================ routing

    def _may_forward(self, allow_forward: bool) -> bool:
        """Whether a peer may take the request's jobs: the request allows it and the
        server gave this router a way to its peers."""
        return allow_forward and self.forwarder is not None

    async def _forward_or_place(self, entry: Entry) -> None:
        assert self.forwarder is not None
        taken = await self.forwarder(entry)
        await self._run(self.core.forwarded(entry, taken, time.monotonic()))

    def tenant_usage(self) -> tuple[dict[str, float], dict[str, int]]:
        return self.core.tenant_usage()

    # ================================================================ placement

    async def _place(self, entry: Entry, *, from_queue: bool = False) -> bool:
        """One placement try (:func:`laminar_zone.trying.place_try`), its requests awaited."""
        return await self._drive(
            place_try(
                self.core,
                entry,
                from_queue=from_queue,
                lease_ttl_seconds=self.config.placement.lease_ttl_seconds,
                budget_seconds=self.config.placement.budget_seconds,
                clock=CLOCK,
            )
        )

    async def commit_all(
        self, entry: Entry, chosen: list[tuple[AgentRecord, agent_pb2.Lease]]
    ) -> bool:
        """Commit leases a client probed (CommitJob): :func:`laminar_zone.trying.commit_steps`."""
        members = [Member(r.agent_id, r.address, tuple(lease.slice_ids)) for r, lease in chosen]
        return await self._drive(commit_steps(self.core, entry, members, chosen, CLOCK))

    async def _drive(self, steps: Generator[TryStep, Any, bool]) -> bool:
        """Carry out a try's requests in order, each awaited; the slot it asks for is held
        until it ends."""
        async with contextlib.AsyncExitStack() as held:
            try:
                answer: Any = None
                while True:
                    try:
                        step = steps.send(answer)
                    except StopIteration as done:
                        return bool(done.value)
                    answer = None
                    match step:
                        case Slot():
                            await held.enter_async_context(self._semaphore)
                        case RunInstructions(instructions):
                            await self._run(instructions)
                        case DoInstructions(instructions):
                            self._do(instructions)
                        case GatherLeases(entry, plan):
                            answer = await self._gather(entry, plan)
                        case CommitMembers(entry, placements, leases):
                            answer = await self._commit(entry, placements, leases)
                        case _:
                            raise AssertionError(f"a try step the router does not know: {step}")
            finally:
                steps.close()

    async def _gather(self, entry: Entry, plan: TryPlan) -> Gathered:
        """Probe for the try's leases (Placer.gather), the commit on probe journaled first."""
        job = entry.job
        ask = Ask(
            job_id=job.job_id,
            resources=job.spec.resources,
            gang_size=plan.gang_size,
            priority=plan.priority,
            value=job.spec.value,
            tenant=job.spec.tenant,
        )
        hook = _ProbeCommit(self, entry) if plan.commit_on_probe else None
        got = await self.placer.gather(ask, lease_ttl_seconds=plan.lease_ttl_seconds, commit=hook)
        reply = got.committed
        return Gathered(
            chosen=tuple(got.chosen) if got.chosen is not None else None,
            members=tuple(
                Member(r.agent_id, r.address, tuple(lease.slice_ids))
                for r, lease in got.chosen or ()
            ),
            failures=tuple(failure_of(e) for e in got.errors),
            reasons=tuple(got.reasons),
            probes=got.probes,
            bounces=got.bounces,
            pending=hook.book.pending if hook is not None else None,
            committed=reply.subjob if reply is not None else None,
            slice_ids=tuple(reply.lease.slice_ids) if reply is not None else (),
            unsure=got.unsure,
            counted_probes=hook.book.probes if hook is not None else 0,
        )

    async def _commit(
        self,
        entry: Entry,
        placements: Sequence[zone_pb2.Placement],
        leases: Sequence[tuple[AgentRecord, agent_pb2.Lease]],
    ) -> list[Failure | None]:
        """Commit every member at once; each failure as the core reads it."""
        outcomes = await asyncio.gather(
            *(
                self.commit_placement(entry, placement, lease)
                for placement, (_, lease) in zip(placements, leases, strict=True)
            ),
            return_exceptions=True,
        )
        return [failure_of(o) if isinstance(o, BaseException) else None for o in outcomes]

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
        """Drive :func:`laminar_zone.trying.pass_steps`: the walk's starts are placed here,
        awaited, and the market's rounds cleared by the atomizer."""
        steps = pass_steps(
            self.core,
            shares=self.shares,
            backfill=self.config.queue.backfill,
            rng=self.rng,
            clock=CLOCK,
        )
        answer: Any = None
        try:
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration:
                    break
                answer = None
                match step:
                    case DoInstructions(instructions):
                        self._do(instructions)
                    case OpenRound(units, memory):
                        answer = await self.atomizer.open_round(units, memory)
                    case StartJob(entry):
                        answer = await self._place(entry, from_queue=True)
                    case ClearMarket(market, clear):
                        await self.atomizer.clear_class(cast(MarketRound, market), clear)
                    case CloseRound(market):
                        await self.atomizer.close_round(cast(MarketRound, market))
                    case _:
                        raise AssertionError(f"a pass step the router does not know: {step}")
        finally:
            steps.close()
        self._update_gauges()

    # ================================================================ agent events

    async def retire_moved(
        self, entry: Entry, old: zone_pb2.Placement, new: zone_pb2.Placement
    ) -> None:
        """The copy ``new`` runs: the one it moved away from ends (a free retry's cause)."""
        await self._run(self.core.retire(entry, old, new, time.time()))

    def evaluate(self, entry: Entry) -> None:
        """Derive the job's state from its current attempt's subjobs; retry or finish."""
        self._do(self.core.evaluate(entry, time.time()))

    def finish(self, entry: Entry, state: int, reason: str, code: Reason | None = None) -> None:
        """End the job in ``state``; ``code`` (default: by the state) says why for scripts."""
        self._do(self.core.finish(entry, state, reason, time.time(), code))

    def forget_if_done(self, entry: Entry) -> None:
        self._do(self.core.forget_if_done(entry))

    # ================================================================ membership tick

    def sweep(self) -> None:
        """Once a period: stale agents, lost agents and their subjobs."""
        self._do(self.core.sweep(time.monotonic(), time.time()))
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

    def _journaled(self, job_id: str) -> zone_pb2.Job | None:
        """A job no longer in memory, as the journal has it (an array: summed up now)."""
        job = self.store.get(job_id)
        if job is not None and job.job_id in self.core.arrays:
            self.core.sum_up_array(job, time.time())  # where its elements stand now
        return job

    def _job(self, job_id: str) -> zone_pb2.Job | None:
        return self.core.job(job_id)

    def get(self, job_id: str) -> zone_pb2.Job:
        check_str(job_id, "job_id", required=True)
        job = self._job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}", field="job_id")
        return fresh(job)

    async def cancel(self, job_id: str, reason: str) -> zone_pb2.Job:
        check_str(reason, "reason", max_chars=1024)
        job = self.get(job_id)
        if job_id in self.core.arrays:  # an array: every element not ended yet
            for element in self.core.array_elements(job_id):
                await self.cancel(element, reason)
            return self.get(job_id)
        instructions = self.core.cancel(job, reason, time.time())
        entry = self.core.entries.get(job_id)
        if entry is None:
            return job  # cancelled before
        await self._run(instructions)
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
                self.core.owe_stop(stop, reason, cause)
                return
        self.core.stop_taken(placement.subjob_id)

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
    """Commit on probe for one job's try (:class:`laminar_zone.placer.ProbeCommit`), as
    :class:`laminar_zone.trying.CommitOnProbe` keeps it: the intent is journaled before
    the probe goes out, and the agent is told how to run the member."""

    def __init__(self, state: ZoneState, entry: Entry) -> None:
        self.state = state
        self.entry = entry
        self.book = CommitOnProbe(state.core, entry)

    def intent(self, record: AgentRecord) -> common_pb2.SubjobSpec:
        placement, instructions = self.book.intent(record.agent_id, record.address)
        self.state._do(instructions)
        return self.state.subjob_spec(self.entry, placement)

    def bounced(self, record: AgentRecord) -> None:
        self.book.bounced(record.agent_id)

    def may_have_run(self, exc: BaseException) -> bool:
        return failure_of(exc).unknown


def pass_gap(least: float, spent: float) -> float:
    """Least time from one queue pass's start to the next's: ``least``
    (``queue.min_pass_seconds``), or twice the event loop's CPU the pass took (its own and
    what the loop ran while it awaited), whichever is longer."""
    return max(least, 2.0 * spent)


__all__ = ["AlreadyExists", "Entry", "ZoneState"]
