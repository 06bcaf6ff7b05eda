"""The agent's authority over its host: ledger + arbitration batches + executor + journal.

Probes arriving within one short batch window (``batch_seconds``, about 1 ms)
are settled together by :meth:`Ledger.arbitrate` in a deterministic order
(priority class, then value, then arrival). Committing a lease launches the
subjob; its exit frees the capacity and is journaled as an event with a seq
number that the zone router acknowledges.

A probe with ``allow_preemption`` that bounces asks the Airlock ladder
(:mod:`laminar_agent.preemption`) for strictly lower-priority victims on slices
that would then fit. The victims are reclaimed (SIGTERM, grace, SIGKILL) while
those slices are reserved for the probe; the lease is granted only once their
capacity is released in the ledger. Preemptions run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from airlock.policy import PRIORITY_NAMES
from laminar_agent.cgroups import SubjobCgroups
from laminar_agent.executor import (
    Executor,
    ExitInfo,
    LaunchSpec,
    RunAs,
    TenantIdentities,
    check_subjob_id,
    units_from_checkpoint,
)
from laminar_agent.inventory import GpuBackend
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.journal import Journal, SubjobRow
from laminar_agent.ledger import (
    Allocation,
    Bounced,
    Granted,
    LeaseRecord,
    Ledger,
    ProbeOrder,
    SliceKind,
    slices_from_gpus,
)
from laminar_agent.metrics import AgentMetrics
from laminar_agent.preemption import HolderFacts, PreemptionPlan, plan_preemption
from laminar_agent.shim import FENCE_FILE
from laminar_api.v1 import agent_pb2, common_pb2
from laminar_base.causes import ENDED_SUBJOB_STATE_NAMES, EndCause, cause_from_token
from laminar_base.errors import FailedPrecondition, InvalidArgument, LaminarError, NotFound
from laminar_base.grpcutil import check_count, check_number, check_str
from laminar_base.wire import check_spec, parse_demand

log = logging.getLogger("laminar.agent.node")
#: Reason prefix, for people, of a subjob its shim stopped because the agent's fence
#: expired; its cause is ``EndCause.FENCED``.
FENCED = "fenced:"

#: Journal state names a subjob never leaves.
TERMINAL_STATES = ENDED_SUBJOB_STATE_NAMES
DEFAULT_LEASE_TTL_SECONDS = 0.2
MAX_LEASE_TTL_SECONDS = 60.0
#: Most lease ids one Release may name.
MAX_RELEASE_IDS = 4096
#: Largest integer SQLite (and a file offset) holds; uint64 fields above it are refused.
MAX_SQLITE_INT = 2**63 - 1
#: Journal reason prefix, for people, of a subjob the agent is stopping; whether it is being
#: stopped (and why) is its journaled end cause, set as the stop begins.
TERMINATING = "terminating: "
#: How long a preemption waits for its victims beyond their grace period.
PREEMPT_MARGIN_SECONDS = 10.0


def validate_spec(spec: common_pb2.SubjobSpec) -> None:
    check_subjob_id(spec.subjob_id, "spec.subjob_id", required=False)
    check_str(spec.job_id, "spec.job_id")
    check_str(spec.checkpoint_dir, "spec.checkpoint_dir", max_chars=4096)
    if spec.unit_count > 0 and not spec.checkpoint_dir.startswith("/"):
        raise InvalidArgument(
            "an atomized subjob (unit_count > 0) needs an absolute checkpoint directory",
            field="spec.checkpoint_dir",
        )
    check_spec(spec)


class Node:
    def __init__(
        self,
        agent_id: str,
        backend: GpuBackend,
        state_dir: Path,
        *,
        batch_seconds: float = 0.001,
        lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS,
        preempt_grace_seconds: float = 5.0,
        airlock_dry_run: bool = False,
        metrics: AgentMetrics | None = None,
        max_windows: int = 16,
        run_as: RunAs | None = None,
        tenant_users: Mapping[str, RunAs] | None = None,
        uid_pool: range | None = None,
        cgroups: SubjobCgroups | None = None,
    ) -> None:
        self.agent_id = agent_id
        #: Bound on the windows advertised in one summary (atomization).
        self.max_windows = max_windows
        self.backend = backend
        self.state_dir = state_dir
        self.batch_seconds = batch_seconds
        self.lease_ttl_seconds = lease_ttl_seconds
        self.journal = Journal(state_dir / "agent.db")
        restarts = int(self.journal.get_meta("restarts") or "0") + 1
        self.journal.set_meta("restarts", str(restarts))
        self.slices = slices_from_gpus(backend.gpus())
        #: Device UUID -> slice name, for what Airlock shows (it reads memory per device).
        self._slice_names = {s.device_uuid: s.slice_id for s in self.slices}
        for gpu in backend.gpus():
            self._slice_names.setdefault(gpu.uuid, f"gpu{gpu.index}")
        self.ledger = Ledger(self.slices, lease_prefix=f"{agent_id}-r{restarts}-")
        identities = TenantIdentities(run_as, users=tenant_users, pool=uid_pool, store=self.journal)
        self.executor = Executor(
            state_dir,
            on_exit=self._on_exit,
            identities=identities,
            cgroups=cgroups,
            fence_file=state_dir / FENCE_FILE,
        )
        self._arrivals = itertools.count()
        self._pending: list[tuple[ProbeOrder, asyncio.Future[Granted | Bounced]]] = []
        self._batch_task: asyncio.Task[None] | None = None
        self._event_waiters: set[asyncio.Event] = set()
        self.pending_probes = 0
        self.is_draining = False
        #: Live (non-terminal) subjob states, kept in memory so summaries stay off the journal.
        self.live_states: dict[str, str] = {}
        #: Live subjobs' peak GPU memory as Airlock's poll saw it (journaled at exit).
        self._peak_gpu: dict[str, int] = {}
        #: Live subjobs the agent is stopping (TERMINATE sent): never chosen as victims again.
        self.terminating: set[str] = set()
        self.preempt_grace_seconds = preempt_grace_seconds
        self.airlock_dry_run = airlock_dry_run
        self.metrics = metrics
        self._preempt_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> tuple[int, int]:
        """Re-adopt subjobs still running after an agent restart; mark the rest with a reason."""
        adopted = lost = 0
        for row in self.journal.subjobs(states=["STARTING", "RUNNING", "SUSPENDED"]):
            allocations = [Allocation(**a) for a in json.loads(row.allocations_json or "[]")]
            if row.pid and self.executor.adopt(row.subjob_id, row.pid, row.started_unix):
                try:
                    self.ledger.adopt(
                        row.lease_id or f"adopted-{row.subjob_id}",
                        row.job_id,
                        0,
                        row.subjob_id,
                        allocations,
                        row.priority or common_pb2.BATCH,
                    )
                except LaminarError as exc:
                    # Capacity we cannot account for must not keep running: that would
                    # overcommit the slice. Stop it and say why.
                    log.error("cannot re-adopt subjob %s: %s; stopping it", row.subjob_id, exc)
                    self.journal.update_subjob(
                        row.subjob_id,
                        reason=f"{TERMINATING}cannot re-adopt its capacity ({exc})",
                        end_cause=EndCause.TERMINATED.token,
                    )
                    self.executor.kill(row.subjob_id)
                    lost += 1
                    continue
                adopted += 1
                log.info("re-adopted subjob %s (pid %d)", row.subjob_id, row.pid)
                continue
            info = self.executor.read_exit(row.subjob_id)
            if info is not None:
                self._record_exit(row, info, "ended while the agent was down")
            else:
                self._set_state(
                    row.subjob_id,
                    "LOST",
                    "process gone after agent restart; no exit record",
                    EndCause.LOST,
                )
            lost += 1
        return adopted, lost

    # -- probing and arbitration ----------------------------------------------------------

    async def probe(
        self, request: agent_pb2.ProbeRequest, caller: str = ""
    ) -> agent_pb2.ProbeReply:
        """Settle one probe; a lease granted is bound to ``caller`` (the mTLS identity)."""
        check_str(request.probe_id, "probe_id")
        check_str(request.job_id, "job_id")
        check_str(request.slice_id, "slice_id")
        check_str(request.tenant, "tenant")
        check_number(request.value, "value", low=-1e12, high=1e12)
        ttl = check_number(
            request.lease_ttl_seconds, "lease_ttl_seconds", high=MAX_LEASE_TTL_SECONDS
        )
        demand = parse_demand(request.resources)
        if request.commit_if_fits:
            validate_spec(request.spec)
        if request.dry_run:
            fit = self.ledger.fit_or_bounce(demand, request.slice_id)
            if isinstance(fit, Bounced):
                return agent_pb2.ProbeReply(
                    bounce=agent_pb2.Bounce(reason=fit.reason, retryable=fit.retryable),
                    would_fit=False,
                    summary=self.summary(),
                )
            return agent_pb2.ProbeReply(would_fit=True, score=fit[1], summary=self.summary())
        if self.is_draining:
            return agent_pb2.ProbeReply(
                bounce=agent_pb2.Bounce(
                    reason=f"agent {self.agent_id} is draining", retryable=False
                ),
                summary=self.summary(),
            )
        order = ProbeOrder(
            probe_id=request.probe_id,
            job_id=request.job_id,
            member=request.member,
            demand=demand,
            priority=request.priority or common_pb2.BATCH,
            value=request.value,
            arrival_seq=next(self._arrivals),
            ttl_seconds=ttl or self.lease_ttl_seconds,
            slice_id=request.slice_id,
            caller=caller,
        )
        result = await self._settle(order)
        preempted: list[str] = []
        if isinstance(result, Bounced) and request.allow_preemption and result.retryable:
            result, preempted = await self._preempt(order, result)
        if isinstance(result, Bounced):
            log.debug(
                "probe %s for job %s bounced: %s", request.probe_id, request.job_id, result.reason
            )
            return agent_pb2.ProbeReply(
                bounce=agent_pb2.Bounce(reason=result.reason, retryable=result.retryable),
                summary=self.summary(),
                preempted_subjob_ids=preempted,
            )
        lease = result.lease
        self._journal_lease(lease, "")
        reply = agent_pb2.ProbeReply(
            lease=self._lease_message(lease),
            summary=self.summary(),
            preempted_subjob_ids=preempted,
        )
        if request.commit_if_fits:
            spec = common_pb2.SubjobSpec()
            spec.CopyFrom(request.spec)
            if not spec.HasField("resources"):
                spec.resources.CopyFrom(request.resources)
            spec.priority = spec.priority or request.priority
            reply.subjob.CopyFrom(await self.commit(lease.lease_id, spec, caller))
        return reply

    # -- priority preemption ---------------------------------------------------------------

    def _holders(self) -> dict[str, HolderFacts]:
        """Facts about every live subjob, for the preemption plan (read from the journal)."""
        facts: dict[str, HolderFacts] = {}
        for subjob_id in sorted(self.live_states):
            row = self.journal.get_subjob(subjob_id)
            if row is None:
                continue
            spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
            facts[subjob_id] = HolderFacts(
                job_id=row.job_id,
                priority=int(spec.priority) or row.priority or common_pb2.BATCH,
                lifecycle=int(spec.lifecycle) or common_pb2.LONG,
                started_at=row.started_unix,
                is_terminating=subjob_id in self.terminating,
            )
        return facts

    async def _preempt(
        self, order: ProbeOrder, bounce: Bounced
    ) -> tuple[Granted | Bounced, list[str]]:
        """Make room for ``order`` by reclaiming strictly lower-priority subjobs, then settle it.

        Returns the outcome and the victims' ids (empty when none were reclaimed).
        """
        async with self._preempt_lock:
            # Room may have appeared while an earlier preemption ran.
            again = await self._settle(replace(order, arrival_seq=next(self._arrivals)))
            if isinstance(again, Granted):
                return again, []
            now = time.time()
            plan = plan_preemption(
                self.ledger,
                order.demand,
                order.priority,
                self._holders(),
                now,
                slice_id=order.slice_id,
            )
            cls = PRIORITY_NAMES.get(order.priority, str(order.priority))
            if plan is None or not plan.victims:
                why = (
                    "no lower-priority work to reclaim would make it fit"
                    if plan is None
                    else "room is free but could not be leased"
                )
                return (
                    Bounced(order.probe_id, f"{again.reason}; preemption for {cls}: {why}", True),
                    [],
                )
            victims = plan.victims
            self._journal_preemption(order, plan, cls, now)
            if self.airlock_dry_run:
                return (
                    Bounced(
                        order.probe_id,
                        f"{again.reason}; airlock dry-run: would preempt {', '.join(victims)}",
                        True,
                    ),
                    [],
                )
            owner = f"preempt-{uuid.uuid4().hex[:12]}"
            budget = self.preempt_grace_seconds + PREEMPT_MARGIN_SECONDS
            self.ledger.reserve(owner, plan.slice_ids, time.monotonic() + budget)
            try:
                reasons = self._preemption_reasons(order, plan, cls)
                for victim in victims:
                    self._spawn(self._reclaim(victim, reasons[victim]), f"preempt-{victim}")
                released = await self._wait_ended(victims, budget)
                if not released:
                    return (
                        Bounced(
                            order.probe_id,
                            f"preempted {', '.join(victims)} but their capacity was not released "
                            f"within {budget:.0f} s",
                            True,
                        ),
                        victims,
                    )
                result = await self._settle(
                    replace(order, arrival_seq=next(self._arrivals), owner=owner)
                )
            finally:
                self.ledger.unreserve(owner)
            log.info(
                "probe %s of job %s (%s): preempted %s on %s -> %s",
                order.probe_id,
                order.job_id,
                cls,
                victims,
                plan.slice_ids,
                "lease" if isinstance(result, Granted) else f"bounce ({result.reason})",
            )
            return result, victims

    def _preemption_reasons(
        self, order: ProbeOrder, plan: PreemptionPlan, cls: str
    ) -> dict[str, str]:
        reasons: dict[str, str] = {}
        for room in plan.rooms:
            need = f"{room.needed_bytes / 1024**3:.1f} GiB"
            if room.needed_milli and room.needed_milli < room.slice.capacity_milli:
                need += f", {room.needed_milli} milli"
            for action in room.actions:
                reasons.setdefault(
                    action.subjob_id,
                    f"preempted: by job {order.job_id} ({cls}) needing {room.slice.slice_id} "
                    f"({need}): {action.reason}",
                )
        return reasons

    def _journal_preemption(
        self, order: ProbeOrder, plan: PreemptionPlan, cls: str, now: float
    ) -> None:
        reasons = self._preemption_reasons(order, plan, cls)
        done: set[str] = set()
        for room in plan.rooms:
            for action in room.actions:
                if action.subjob_id in done:
                    continue
                done.add(action.subjob_id)
                reason = reasons[action.subjob_id]
                self.journal.append_action(
                    "reclaim",
                    action.subjob_id,
                    room.slice.slice_id,
                    reason,
                    max(0, action.expected_bytes_freed),
                    self.airlock_dry_run,
                    end_cause=EndCause.PREEMPTED.token,
                )
                log.info(
                    "airlock %sreclaim subjob %s on %s: %s",
                    "(dry-run) " if self.airlock_dry_run else "",
                    action.subjob_id,
                    room.slice.slice_id,
                    reason,
                )
                if self.metrics is not None:
                    row = self.journal.get_subjob(action.subjob_id)
                    gpus = len(json.loads(row.slice_ids_json)) if row is not None else 1
                    started = row.started_unix if row is not None else 0.0
                    lost = max(0.0, now - started) * max(1, gpus) if started else 0.0
                    self.metrics.record_airlock_action(
                        "reclaim",
                        "preempted",
                        resource="ledger",
                        bytes_freed=max(0, action.expected_bytes_freed),
                        work_lost_gpu_seconds=lost,
                        dry_run=self.airlock_dry_run,
                    )

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` to completion even if the RPC that started it is cancelled."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _reclaim(self, subjob_id: str, reason: str) -> None:
        try:
            await self.signal(
                subjob_id,
                agent_pb2.TERMINATE,
                reason,
                self.preempt_grace_seconds,
                cause=EndCause.PREEMPTED,
            )
        except LaminarError as exc:  # it ended on its own meanwhile
            log.info("reclaim of %s: %s", subjob_id, exc.message)

    async def _wait_ended(self, subjob_ids: Sequence[str], timeout_seconds: float) -> bool:
        """Wait until every subjob is terminal, i.e. its capacity is released in the ledger."""
        waiter = asyncio.Event()
        self._event_waiters.add(waiter)
        deadline = time.monotonic() + timeout_seconds
        try:
            while any(s in self.live_states for s in subjob_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                waiter.clear()
                try:
                    await asyncio.wait_for(waiter.wait(), left)
                except TimeoutError:
                    pass
            return True
        finally:
            self._event_waiters.discard(waiter)

    def _journal_lease(self, lease: LeaseRecord, subjob_id: str) -> None:
        """Persist a lease; with a subjob id it is the committed form that recovery re-adopts."""
        self.journal.put_lease(
            lease.lease_id,
            lease.job_id,
            lease.member,
            json.dumps([a.__dict__ for a in lease.allocations]),
            lease.score,
            lease.priority,
            bool(subjob_id),
            subjob_id,
            time.time(),
        )

    async def _settle(self, order: ProbeOrder) -> Granted | Bounced:
        future: asyncio.Future[Granted | Bounced] = asyncio.get_running_loop().create_future()
        self._pending.append((order, future))
        self.pending_probes += 1
        if self._batch_task is None or self._batch_task.done():
            self._batch_task = asyncio.create_task(
                self._run_batch(), name="agent-arbitration-batch"
            )
        try:
            return await future
        finally:
            self.pending_probes -= 1

    async def _run_batch(self) -> None:
        await asyncio.sleep(self.batch_seconds)  # collect concurrent probes into one batch
        batch, self._pending = self._pending, []
        self._expire()
        results = self.ledger.arbitrate([order for order, _ in batch], time.monotonic())
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    def _set_capacity_gauges(self) -> None:
        """Allocated and stranded shares of the host's GPU capacity (each summary)."""
        if self.metrics is None:
            return
        total = committed = stranded = 0
        for s in self.slices:
            used = self.ledger.usage(s.slice_id)[0]
            total += s.capacity_milli
            committed += used
            if 0 < used < s.capacity_milli:
                stranded += s.capacity_milli - used
        self.metrics.allocated_ratio.set(committed / total if total else 0.0)
        self.metrics.stranded_ratio.set(stranded / total if total else 0.0)

    def expire_leases(self) -> None:
        """Drop the uncommitted leases whose TTL has passed (the agent's tick calls it)."""
        self._expire()

    def _expire(self) -> None:
        for lease in self.ledger.expire(time.monotonic()):
            self.journal.delete_lease(lease.lease_id)
            log.debug("lease %s for job %s expired", lease.lease_id, lease.job_id)

    def _lease_message(self, lease: LeaseRecord) -> agent_pb2.Lease:
        by_id = {s.slice_id: s for s in self.slices}
        return agent_pb2.Lease(
            lease_id=lease.lease_id,
            agent_id=self.agent_id,
            slice_ids=[a.slice_id for a in lease.allocations],
            device_uuids=[by_id[a.slice_id].device_uuid for a in lease.allocations],
            score=lease.score,
            expires_unix=time.time() + max(0.0, lease.expires_at - time.monotonic()),
            job_id=lease.job_id,
            member=lease.member,
        )

    def release(self, lease_ids: Sequence[str], caller: str = "") -> int:
        """Give back uncommitted leases issued to ``caller``; others are skipped, not counted."""
        check_count(lease_ids, "lease_ids", max_items=MAX_RELEASE_IDS)
        released = 0
        for lease_id in lease_ids:
            check_str(lease_id, "lease_ids")
            lease = self.ledger.lease(lease_id)
            if lease is None or lease.committed or lease.caller != caller:
                continue
            self.ledger.release(lease_id)
            self.journal.delete_lease(lease_id)
            released += 1
        return released

    # -- commit, launch and exit ----------------------------------------------------------

    async def commit(
        self, lease_id: str, spec: common_pb2.SubjobSpec, caller: str = ""
    ) -> common_pb2.Subjob:
        check_str(lease_id, "lease_id", required=True)
        validate_spec(spec)
        if not spec.subjob_id:
            spec.subjob_id = f"s-{uuid.uuid4().hex[:12]}"
        if self.journal.get_subjob(spec.subjob_id) is not None:
            raise FailedPrecondition(
                f"subjob {spec.subjob_id} already exists", field="spec.subjob_id"
            )
        self._expire()
        lease = self.ledger.commit(lease_id, spec.subjob_id, time.monotonic(), caller)
        by_id = {s.slice_id: s for s in self.slices}
        slice_ids = [a.slice_id for a in lease.allocations]
        devices = [by_id[s].device_uuid for s in slice_ids]
        now = time.time()
        row = SubjobRow(
            subjob_id=spec.subjob_id,
            job_id=spec.job_id or lease.job_id,
            spec_blob=spec.SerializeToString(),
            state="STARTING",
            reason="lease committed",
            pid=0,
            slice_ids_json=json.dumps(slice_ids),
            device_uuids_json=json.dumps(devices),
            created_unix=now,
            started_unix=0.0,
            ended_unix=0.0,
            exit_code=0,
            signal=0,
            peak_rss_bytes=0,
            peak_gpu_memory_bytes=0,
            run_seconds=0.0,
            suspended_seconds=0.0,
            lease_id=lease_id,
        )
        self.journal.put_subjob(row)
        self._journal_lease(lease, spec.subjob_id)
        if isinstance(self.backend, FakeGpuBackend) and devices:
            self.backend.attach_subjob(
                spec.subjob_id,
                devices,
                spec.resources.gpu_memory_bytes,
                self.executor.gpu_mem_file(spec.subjob_id),
            )
        try:
            pid = await self.executor.launch(
                LaunchSpec(
                    subjob_id=spec.subjob_id,
                    job_id=row.job_id,
                    command=list(spec.command),
                    env=dict(spec.env),
                    workdir=spec.workdir,
                    tenant=spec.tenant,
                    fenced=not spec.run_through_partitions,
                    device_uuids=devices,
                    unit_start=spec.unit_start,
                    unit_count=spec.unit_count,
                    checkpoint_dir=spec.checkpoint_dir,
                    grace_seconds=spec.grace_seconds or 10.0,
                )
            )
        except Exception as exc:
            self._finish(
                spec.subjob_id, "FAILED", f"could not start: {exc}", None, EndCause.LAUNCH_FAILED
            )
            raise
        self.journal.update_subjob(spec.subjob_id, pid=pid, started_unix=time.time())
        self._set_state(
            spec.subjob_id, "RUNNING", f"started as pid {pid} on {','.join(slice_ids) or 'cpu'}"
        )
        log.info(
            "subjob %s of job %s running as pid %d on %s",
            spec.subjob_id,
            row.job_id,
            pid,
            slice_ids,
        )
        return self.subjob_message(spec.subjob_id)

    async def _on_exit(self, subjob_id: str, info: ExitInfo) -> None:
        row = self.journal.get_subjob(subjob_id)
        if row is None or row.state in TERMINAL_STATES:
            return
        self._record_exit(row, info, "")

    def _record_exit(self, row: SubjobRow, info: ExitInfo, context: str) -> None:
        """Terminal state, cause and reason. A subjob the agent was stopping (its stop's
        cause is journaled) ends KILLED with that cause however it exited; its reason starts
        with the stop's reason, for people."""
        stop_cause = cause_from_token(row.end_cause)
        if info.fenced:
            how = f"ended by signal {info.signal}" if info.signal else f"exited {info.exit_code}"
            state, cause, reason = (
                "KILLED",
                EndCause.FENCED,
                f"{FENCED} the agent was out of touch with its router past the fence lease, "
                f"so the router may run this work elsewhere; {how}",
            )
        elif stop_cause is not EndCause.UNSPECIFIED:
            why = row.reason.removeprefix(TERMINATING)
            how = f"ended by signal {info.signal}" if info.signal else f"exited {info.exit_code}"
            state, cause, reason = "KILLED", stop_cause, f"{why}; {how}" if why else how
        elif info.exit_code == 0:
            state, cause, reason = "SUCCEEDED", EndCause.EXITED, "exited 0"
        elif info.signal:
            state, cause, reason = "FAILED", EndCause.EXITED, f"ended by signal {info.signal}"
        else:
            state, cause, reason = (
                "FAILED",
                EndCause.EXITED,
                f"exited {info.exit_code}" + (f": {info.error}" if info.error else ""),
            )
        if context:
            reason = f"{reason}; {context}"
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        units_done = 0
        if spec.unit_count > 0:
            units_done, note = units_from_checkpoint(
                spec.checkpoint_dir,
                spec.unit_start,
                spec.unit_count,
                state == "SUCCEEDED",
                owner_uid=self.executor.owner_uid(spec.tenant),
            )
            reason = f"{reason}; {note}" if note else reason
        self.journal.update_subjob(
            row.subjob_id,
            exit_code=info.exit_code if info.exit_code is not None else -1,
            signal=info.signal or 0,
            peak_rss_bytes=info.peak_rss_bytes,
            run_seconds=info.run_seconds,
            units_done=units_done,
            peak_gpu_memory_bytes=max(
                row.peak_gpu_memory_bytes, self._peak_gpu.pop(row.subjob_id, 0)
            ),
        )
        self._finish(row.subjob_id, state, reason, info.ended_unix, cause)

    def _finish(
        self,
        subjob_id: str,
        state: str,
        reason: str,
        ended_unix: float | None,
        cause: EndCause,
    ) -> None:
        row = self.journal.get_subjob(subjob_id)
        if row is None:
            return
        if isinstance(self.backend, FakeGpuBackend):
            self.backend.detach_subjob(subjob_id)
        if row.lease_id:
            self.ledger.release(row.lease_id)
            self.journal.delete_lease(row.lease_id)
        self.terminating.discard(subjob_id)
        self.journal.update_subjob(subjob_id, ended_unix=ended_unix or time.time())
        self._set_state(subjob_id, state, reason, cause)
        log.info("subjob %s %s (%s): %s", subjob_id, state.lower(), cause.token, reason)

    def _set_state(
        self, subjob_id: str, state: str, reason: str, cause: EndCause | None = None
    ) -> None:
        """Journal a transition; an end (``cause`` given) journals its cause with it."""
        if state in TERMINAL_STATES:
            self.live_states.pop(subjob_id, None)
        else:
            self.live_states[subjob_id] = state
        if cause is None:
            self.journal.update_subjob(subjob_id, state=state, reason=reason)
        else:
            self.journal.update_subjob(subjob_id, state=state, reason=reason, end_cause=cause.token)
        self.journal.append_event(subjob_id, state, reason, time.time())
        for waiter in list(self._event_waiters):
            waiter.set()

    # -- signals, queries, events ---------------------------------------------------------

    async def signal(
        self,
        subjob_id: str,
        signal: int,
        reason: str,
        grace_seconds: float,
        cause: EndCause = EndCause.TERMINATED,
    ) -> common_pb2.Subjob:
        """Carry out a signal; a TERMINATE journals ``cause`` at once, so the subjob's end
        records it whenever and however the process exits (``UNSPECIFIED`` is
        ``TERMINATED``)."""
        check_str(subjob_id, "subjob_id", required=True)
        check_str(reason, "reason", max_chars=1024)
        check_number(grace_seconds, "grace_seconds", high=3600)
        row = self._row(subjob_id)
        if row.state in TERMINAL_STATES:
            raise FailedPrecondition(
                f"subjob {subjob_id} has ended ({row.state.lower()})", field="subjob_id"
            )
        why = reason or "requested"
        if subjob_id in self.terminating and signal in (agent_pb2.SUSPEND, agent_pb2.RESUME):
            raise FailedPrecondition(
                f"subjob {subjob_id} is being stopped ({row.reason})", field="subjob_id"
            )
        if signal == agent_pb2.SUSPEND:
            self.executor.suspend(subjob_id)
            self._set_state(subjob_id, "SUSPENDED", f"suspended: {why}")
        elif signal == agent_pb2.RESUME:
            self.executor.resume(subjob_id)
            self._set_state(subjob_id, "RUNNING", f"resumed: {why}")
        elif signal == agent_pb2.RELEASE_MEMORY:
            self.executor.release_memory(subjob_id)
        elif signal == agent_pb2.TERMINATE:
            self.terminating.add(subjob_id)
            cause = cause if cause is not EndCause.UNSPECIFIED else EndCause.TERMINATED
            self.journal.update_subjob(
                subjob_id, reason=f"{TERMINATING}{why}", end_cause=cause.token
            )
            # The caller waits for the end, but a caller that gives up (an RPC deadline)
            # must not cancel the escalation to SIGKILL: that would leave it running.
            stop = self._spawn(
                self.executor.terminate(subjob_id, grace_seconds or None), f"stop-{subjob_id}"
            )
            await asyncio.shield(stop)
        else:
            raise InvalidArgument(f"unknown signal {signal}", field="signal")
        return self.subjob_message(subjob_id)

    def _row(self, subjob_id: str) -> SubjobRow:
        row = self.journal.get_subjob(subjob_id)
        if row is None:
            raise NotFound(f"no subjob {subjob_id!r} on agent {self.agent_id}", field="subjob_id")
        return row

    def subjob_message(self, subjob_id: str) -> common_pb2.Subjob:
        return self._to_message(self._row(subjob_id))

    def _to_message(self, row: SubjobRow) -> common_pb2.Subjob:
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        directory = self.executor.subjob_dir(row.subjob_id)
        return common_pb2.Subjob(
            spec=spec,
            agent_id=self.agent_id,
            slice_ids=json.loads(row.slice_ids_json),
            device_uuids=json.loads(row.device_uuids_json),
            state=common_pb2.SubjobState.Value(row.state),  # type: ignore[arg-type]
            reason=row.reason,
            # A live row may hold the cause of a stop under way: only an end reports one.
            end_cause=(
                cause_from_token(row.end_cause).wire
                if row.state in TERMINAL_STATES
                else EndCause.UNSPECIFIED.wire
            ),
            exit_code=row.exit_code or 0,
            signal=row.signal or 0,
            created_unix=row.created_unix,
            started_unix=row.started_unix,
            ended_unix=row.ended_unix,
            run_seconds=row.run_seconds,
            peak_rss_bytes=row.peak_rss_bytes,
            peak_gpu_memory_bytes=max(
                row.peak_gpu_memory_bytes, self._peak_gpu.get(row.subjob_id, 0)
            ),
            pid=row.pid,
            stdout_path=str(directory / "stdout"),
            stderr_path=str(directory / "stderr"),
            lease_id=row.lease_id,
            units_done=row.units_done,
        )

    def note_gpu_memory(self, subjob_id: str, used_bytes: int) -> None:
        """A poll's reading of a live subjob's GPU memory; the peak is kept."""
        if subjob_id in self.live_states and used_bytes > self._peak_gpu.get(subjob_id, 0):
            self._peak_gpu[subjob_id] = used_bytes

    def slice_name(self, device_uuid: str) -> str:
        """The slice name the API uses for a device (``gpu0``, ``gpu1/3g.40gb@0``); a device
        the inventory does not know (or the host) keeps its id."""
        return self._slice_names.get(device_uuid, device_uuid)

    def list_subjobs(
        self, job_id: str, states: Sequence[int], limit: int
    ) -> list[common_pb2.Subjob]:
        check_str(job_id, "job_id")
        check_count(states, "states", max_items=64)
        for state in states:
            if state not in common_pb2.SubjobState.values():
                raise InvalidArgument(f"unknown subjob state {state}", field="states")
        names = [common_pb2.SubjobState.Name(s) for s in states] if states else None
        rows = self.journal.subjobs(states=names, job_id=job_id or None)
        if limit:
            rows = rows[-limit:]
        return [self._to_message(r) for r in rows]

    async def watch(self, after_seq: int, job_id: str) -> AsyncIterator[common_pb2.SubjobEvent]:
        check_str(job_id, "job_id")
        if after_seq > MAX_SQLITE_INT:
            raise InvalidArgument(
                f"must be <= {MAX_SQLITE_INT}, got {after_seq}", field="after_seq"
            )
        seq = after_seq
        waiter = asyncio.Event()
        self._event_waiters.add(waiter)
        try:
            while True:
                waiter.clear()
                for event in self.journal.events_after(seq, 500):
                    seq = event.seq
                    message = self.event_message(
                        event.seq, event.subjob_id, event.state, event.reason, event.at_unix, job_id
                    )
                    if message is not None:
                        yield message
                await waiter.wait()
        finally:
            self._event_waiters.discard(waiter)

    def event_message(
        self, seq: int, subjob_id: str, state: str, reason: str, at_unix: float, job_id: str = ""
    ) -> common_pb2.SubjobEvent | None:
        """One journaled transition as an API event (the subjob as it is now, state as it was)."""
        row = self.journal.get_subjob(subjob_id)
        if row is None or (job_id and row.job_id != job_id):
            return None
        message = self._to_message(row)
        message.state = common_pb2.SubjobState.Value(state)  # type: ignore[assignment]
        message.reason = reason
        if state not in TERMINAL_STATES:  # the row may have ended since this transition
            message.end_cause = EndCause.UNSPECIFIED.wire
        return common_pb2.SubjobEvent(seq=seq, subjob=message, at_unix=at_unix)

    def add_event_waiter(self, waiter: asyncio.Event) -> None:
        """``waiter`` is set on every subjob transition (heartbeats send them at once)."""
        self._event_waiters.add(waiter)

    def read_logs(
        self, subjob_id: str, stream: str, offset: int, max_bytes: int
    ) -> agent_pb2.ReadLogsReply:
        check_subjob_id(subjob_id, "subjob_id")  # an id, never a path
        row = self._row(subjob_id)
        if stream not in ("", "stdout", "stderr"):
            raise InvalidArgument("must be stdout or stderr", field="stream")
        if offset > MAX_SQLITE_INT:
            raise InvalidArgument(f"must be <= {MAX_SQLITE_INT}, got {offset}", field="offset")
        path = self.executor.subjob_dir(subjob_id) / (stream or "stdout")
        limit = min(max_bytes or 1024 * 1024, 4 * 1024 * 1024 - 1024)
        data = b""
        size = 0
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                size = os.fstat(fd).st_size
                handle.seek(offset)
                data = handle.read(limit)
        ended = row.state in TERMINAL_STATES
        return agent_pb2.ReadLogsReply(
            data=data, next_offset=offset + len(data), eof=ended and offset + len(data) >= size
        )

    def summary(
        self, *, with_windows: bool = False, pressured: frozenset[str] = frozenset()
    ) -> common_pb2.AgentSummary:
        """Free capacity per shape; with ``with_windows`` (heartbeats) also the windows
        atomized jobs bid for. Probe replies skip the windows: they are on the hot path.
        Slices under memory pressure (``pressured``: slice or GPU names) advertise none:
        new work there would only be Airlock's next victim."""
        self._expire()  # a summary never counts a lease that has already lapsed
        self._set_capacity_gauges()
        summary = common_pb2.AgentSummary(
            agent_id=self.agent_id,
            pending_probes=self.pending_probes,
            active_leases=self.ledger.pending_leases(),
            draining=self.is_draining,
            pressure=common_pb2.NORMAL,
            generated_unix=time.time(),
            total_gpus=len(self.backend.gpus()),
        )
        for shape in self.ledger.shapes():
            summary.shapes.add(
                shape=shape.shape,
                free=shape.free,
                total=shape.total,
                max_free_milli=shape.max_free_milli,
                max_free_memory_bytes=shape.max_free_memory_bytes,
            )
        states = list(self.live_states.values())
        summary.running_subjobs = states.count("RUNNING") + states.count("STARTING")
        summary.suspended_subjobs = states.count("SUSPENDED")
        if with_windows:
            self._fill_windows(summary, summary.generated_unix, pressured)
        return summary

    def _fill_windows(
        self, summary: common_pb2.AgentSummary, now_unix: float, pressured: frozenset[str]
    ) -> None:
        """Windows from the ledger; busy slices open when their holders are expected to end
        (started + declared expected_seconds, the latest holder on a shared slice)."""
        busy_until: dict[str, float] = {}
        if self.live_states:
            for row in self.journal.subjobs(states=sorted(set(self.live_states.values()))):
                spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
                if spec.expected_seconds <= 0 or row.started_unix <= 0:
                    continue
                end = row.started_unix + spec.expected_seconds
                for slice_id in json.loads(row.slice_ids_json):
                    busy_until[slice_id] = max(busy_until.get(slice_id, 0.0), end)
        kinds = {
            SliceKind.WHOLE_GPU: common_pb2.WHOLE_GPU,
            SliceKind.MIG: common_pb2.MIG,
            SliceKind.SHARED_GPU: common_pb2.SHARED_GPU,
        }
        for w in self.ledger.windows(now_unix, busy_until, self.max_windows):
            sid = w.slice.slice_id
            if sid in pressured or sid.split("/", 1)[0] in pressured:
                continue
            summary.windows.add(
                agent_id=self.agent_id,
                slice_id=w.slice.slice_id,
                kind=kinds[w.slice.kind],
                mig_profile=w.slice.mig_profile,
                gpu_milli=w.milli,
                memory_bytes=w.memory_bytes,
                start_unix=w.start_unix,
                end_unix=w.end_unix,
                gpu_model=w.slice.gpu_model,
            )

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.executor.close()
        self.journal.close()
