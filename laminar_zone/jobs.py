"""The zone's job table, driven: journal, RPCs, loops and metrics around :mod:`laminar_zone.core`.

:class:`ZoneState` is the driver of the router's decision core
(:class:`laminar_zone.core.ZoneCore`): it feeds it events (a submit, a gather's outcome,
a commit's answers, a cancel, the sweep's tick, a queue pass) with the time, and carries
out the instructions it returns (:meth:`ZoneState._do` from synchronous code, where a stop
or a placement becomes a task; :meth:`ZoneState._run` from a task, where it is awaited).
It decides nothing itself. It wires the core to its drivers, one concern each:

- :mod:`laminar_zone.admission`: Submit and SubmitBatch, and forwards to peer zones;
- :mod:`laminar_zone.try_driver`: placement tries and the calls to agents (Commit, stop);
- :mod:`laminar_zone.queue_loop`: the queue's root loop and its passes;
- :mod:`laminar_zone.persistence`: journal writes and watchers, recovery, the learned
  workload, gauges.

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
import logging
import random
import sqlite3
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from laminar_api.v1 import zone_pb2
from laminar_base.errors import AlreadyExists, NotFound
from laminar_base.grpcutil import check_str
from laminar_base.security import INSECURE, Trust
from laminar_base.wire import demand_of
from laminar_zone.admission import Admission
from laminar_zone.arrays import ArrayProgress
from laminar_zone.atomizer import Atomizer, units_done
from laminar_zone.audit import AuditLog
from laminar_zone.config import ZoneConfig
from laminar_zone.core import (
    Confirm,
    Count,
    Forget,
    Forward,
    Instruction,
    Journal,
    JudgeAtomized,
    Loop,
    Place,
    Publish,
    Release,
    ResumeForward,
    Retire,
    SumUpArray,
    Terminate,
    Wake,
    ZoneCore,
)
from laminar_zone.entry import Entry
from laminar_zone.kept import KeptLeases
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.persistence import Persistence
from laminar_zone.placements import apply_start_reply, fresh
from laminar_zone.placer import AgentClients, Placer
from laminar_zone.queue_loop import QueueLoop
from laminar_zone.reasons import Reason
from laminar_zone.store import JobStore
from laminar_zone.try_driver import TryDriver, subjob_spec
from laminar_zone.usage import UsageLedger
from laminar_zone.view import ZoneView

T = TypeVar("T")

log = logging.getLogger("laminar.zone.jobs")

#: Most live subjob ids of one heartbeat the router reconciles.
MAX_LIVE_IDS = 4096


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
        store.on_commit = metrics.journal_commits.inc
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
        self.core: ZoneCore = ZoneCore(
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
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Offers a job to a peer zone (the server sets it when it has peers).
        self.forwarder: Callable[[Entry], Coroutine[Any, Any, bool]] | None = None
        #: Leases ProbeJob(keep_leases) handed to a tenant, until CommitJob or their TTL:
        #: CommitJob takes only these, for that tenant and the resources probed.
        self.kept_leases = KeptLeases()
        self.started_mono = time.monotonic()
        self.placer.workload.add_prior(config.workload_prior())
        # The drivers, one concern each (see the module's docstring).
        self.persistence = Persistence(self)
        self.admission = Admission(self)
        self.tries = TryDriver(self)
        self.queue_loop = QueueLoop(self)
        # A commit on probe's intent, grouped with its tick's writes, is committed before
        # its probe leaves.
        self.placer.calls.before_probes = self.persistence.flush
        # Their entries, named here for the service, the server, peers, reports, the
        # atomizer and client leases.
        self.recover = self.persistence.recover
        self.save_many = self.persistence.save_many
        self.submit = self.admission.submit
        self.submit_many = self.admission.submit_many
        self.resume_forwards = self.admission.resume_forwards
        self.commit_all = self.tries.commit_all
        self.terminate = self.tries.terminate
        self.run_queue = self.queue_loop.run
        self.one_pass = self.queue_loop.one_pass

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

    #: For the atomizer (its Zone protocol): a subjob's report into its placement, and how
    #: an agent runs a placement (the module functions).
    apply_start_reply = staticmethod(apply_start_reply)
    subjob_spec = staticmethod(subjob_spec)

    def track(self, entry: Entry, agent_id: str) -> None:
        """The job has (or is about to have) a live subjob on this agent."""
        self.core.track(entry, agent_id)

    def set_placing(self, entry: Entry, placing: bool) -> None:
        """A placement try (the atomizer's piece commit) begins or ends."""
        self.core.set_placing(entry, placing)

    def tenant_usage(self) -> tuple[dict[str, float], dict[str, int]]:
        return self.core.tenant_usage()

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
                        self.tries.place(entry, from_queue=from_queue), f"place-{entry.job.job_id}"
                    )
                case Forward(entry):
                    self.spawn(self.admission.forward_or_place(entry), f"route-{entry.job.job_id}")
                case Release(leases):
                    self.spawn(self.placer.release(list(leases)), "release")
                case Retire(entry, old, new):
                    self.spawn(self.retire_moved(entry, old, new), f"moved-{old.subjob_id}")
                case ResumeForward(entry):
                    # Resumed once the server has its peers (resume_forwards).
                    self.admission.unanswered_forwards.append(entry)
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
                    await self.tries.place(entry, from_queue=from_queue)
                case Forward(entry):
                    await self.admission.forward_or_place(entry)
                case Release(leases):
                    await self.placer.release(list(leases))
                case Retire(entry, old, new):
                    await self.retire_moved(entry, old, new)
                case _:
                    self._carry_out(instruction)

    def _carry_out(self, instruction: Instruction) -> None:
        """The instructions carried out at once, alike from synchronous code and tasks."""
        match instruction:
            case Journal(entries, grouped, quiet):
                if entries:
                    self.save_many(entries, grouped=grouped, quiet=quiet)
            case Publish(entry):
                self.persistence.publish(entry)
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

    # ================================================================ the drivers' entries

    async def queue_pass(self) -> None:
        """The queue loop's pass (:meth:`one_pass`; the market's loop runs it as well). A
        method of its own: the loop calls it by this name, and tests replace it."""
        await self.one_pass()

    def save(self, entry: Entry) -> None:
        self.save_many([entry])

    # ================================================================ the core's events

    async def retire_moved(
        self, entry: Entry, old: zone_pb2.Placement, new: zone_pb2.Placement
    ) -> None:
        """The copy ``new`` runs: the one it moved away from ends (a free retry's cause)."""
        await self._run(self.core.retire(entry, old, new, time.time()))

    async def roll_back_piece(
        self,
        entry: Entry,
        members: list[zone_pb2.Placement],
        unanswered: set[str],
        why: str,
    ) -> None:
        """An atomized gang's piece did not start on every member (for the atomizer): the
        core's rollback, its stops awaited together."""
        await self._run(self.core.piece_rolled_back(entry, members, unanswered, why, time.time()))

    def evaluate(self, entry: Entry) -> None:
        """Derive the job's state from its current attempt's subjobs; retry or finish."""
        self._do(self.core.evaluate(entry, time.time()))

    def finish(self, entry: Entry, state: int, reason: str, code: Reason | None = None) -> None:
        """End the job in ``state``; ``code`` (default: by the state) says why for scripts."""
        self._do(self.core.finish(entry, state, reason, time.time(), code))

    def forget_if_done(self, entry: Entry) -> None:
        self._do(self.core.forget_if_done(entry))

    def sweep(self) -> None:
        """Once a period: stale agents, lost agents and their subjobs; and grouped journal
        writes a failed commit left waiting (retried here on a router with nothing else
        to write)."""
        try:
            self.persistence.flush()
        except sqlite3.Error as exc:  # still waiting: tried again next period
            log.error("journal commit failed: %s", exc)
        self._do(self.core.sweep(time.monotonic(), time.time()))
        self.persistence.save_workload()
        self.persistence.update_gauges(force=True)

    # ================================================================ user operations
    # (reads live in laminar_zone.queries, ProbeJob/CommitJob in laminar_zone.client_leases)

    def _journaled(self, job_id: str) -> zone_pb2.Job | None:
        """A job no longer in memory, as the journal has it (an array: summed up now)."""
        job = self.store.get(job_id)
        if job is not None and job.job_id in self.core.arrays:
            self.core.sum_up_array(job, time.time())  # where its elements stand now
        return job

    def get(self, job_id: str) -> zone_pb2.Job:
        check_str(job_id, "job_id", required=True)
        job = self.core.job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}", field="job_id")
        return fresh(job)

    async def cancel(self, job_id: str, reason: str) -> zone_pb2.Job:
        check_str(reason, "reason", max_chars=1024)
        job = self.get(job_id)
        entry = self.core.entries.get(job_id)  # None: an array's own record, or ended
        # The core decides what a cancel stops (an array: each element not ended yet).
        await self._run(self.core.cancel_job(job, reason, time.time()))
        if entry is not None:
            return fresh(entry.job)
        return self.get(job_id)  # an array summed up now, or a job cancelled before

    # ================================================================ tasks and close

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task: asyncio.Task[T] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def pending_tasks(self) -> set[asyncio.Task[Any]]:
        """The background tasks under way (placements, commits, stops, releases)."""
        return set(self._tasks) | set(self.placer.background)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    async def close(self) -> None:
        self.persistence.flush()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.placer.close()
        await self.clients.close()


__all__ = ["AlreadyExists", "Entry", "ZoneState"]
