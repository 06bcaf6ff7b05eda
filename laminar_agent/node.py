"""The agent's authority over its host: drives the decision core with probes, the executor
and the journal.

Every decision is :class:`laminar_agent.core.AgentCore`'s (lifecycle, arbitration, leases,
preemption); this module checks requests, times the batch window, awaits, launches and
signals processes, writes what the core says to the journal and builds the API's messages.

Probes arriving within one short batch window (``batch_seconds``, about 1 ms) are settled
together by the core in a deterministic order (priority class, then value, then arrival).
Committing a lease launches the subjob; its exit frees the capacity and is journaled as an
event with a seq number that the zone router acknowledges.

A probe with ``allow_preemption`` that bounces asks the core for strictly lower-priority
victims on slices that would then fit. The victims are reclaimed (SIGTERM, grace, SIGKILL)
while those slices are reserved for the probe; the lease is granted only once their
capacity is released in the ledger. Preemptions run one at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, assert_never

import psutil

from laminar_agent.cgroups import SubjobCgroups
from laminar_agent.core import (
    LIVE_STATES,
    SUCCEEDED,
    AgentCore,
    DropLease,
    Ended,
    Instruction,
    KeepLease,
    Kill,
    NewRow,
    RecordEvent,
    RecordReclaim,
    RestoredSubjob,
    TransitionRefused,
    WriteRow,
)
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
from laminar_agent.inventory.base import MigInstanceInfo, MigRepartitioner
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
from laminar_agent.mig_layout import MigGpu
from laminar_agent.shim import FENCE_FILE
from laminar_agent.subjob_reads import SubjobReads
from laminar_api.v1 import agent_pb2, common_pb2
from laminar_base.causes import EndCause
from laminar_base.errors import InvalidArgument, LaminarError
from laminar_base.fragmentation import (
    MILLI_SLICING,
    FragmentationCache,
    PodShape,
    typical_workload,
)
from laminar_base.grpcutil import check_count, check_number, check_str
from laminar_base.wire import check_spec, demand_of, parse_demand

log = logging.getLogger("laminar.agent.node")

DEFAULT_LEASE_TTL_SECONDS = 0.2
MAX_LEASE_TTL_SECONDS = 60.0
#: Most lease ids one Release may name.
MAX_RELEASE_IDS = 4096
#: Journal meta key: GPU index -> the MIG layout last applied on demand (JSON).
MIG_LAYOUTS_META = "mig_layouts"


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


@dataclass(frozen=True)
class _SpecFacts:
    """What the node reads from a live subjob's spec after its commit (its end, the windows
    of each heartbeat), kept from the commit or the restart so that nothing re-reads and
    re-parses the stored spec for it."""

    tenant: str
    unit_start: int
    unit_count: int
    checkpoint_dir: str
    expected_seconds: float

    @classmethod
    def of(cls, spec: common_pb2.SubjobSpec) -> _SpecFacts:
        return cls(
            spec.tenant,
            spec.unit_start,
            spec.unit_count,
            spec.checkpoint_dir,
            spec.expected_seconds,
        )


def _merge_row_writes(instructions: Iterable[Instruction]) -> list[Instruction]:
    """Adjacent writes to one subjob's row as one UPDATE (a transition's state after the
    figures of a launch or an end), the later value of a field winning, as it would."""
    merged: list[Instruction] = []
    for ins in instructions:
        last = merged[-1] if merged else None
        if (
            isinstance(ins, WriteRow)
            and isinstance(last, WriteRow)
            and last.subjob_id == ins.subjob_id
        ):
            merged[-1] = WriteRow(ins.subjob_id, {**last.fields, **ins.fields})
        else:
            merged.append(ins)
    return merged


def detect_host_totals() -> tuple[int, int]:
    """This machine's CPUs in milli-cores and physical memory in bytes."""
    return (os.cpu_count() or 1) * 1000, int(psutil.virtual_memory().total)


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
        host_totals: tuple[int, int] | None = None,
        mig_on_demand: bool = False,
        mig_carve_busy: bool = True,
    ) -> None:
        """``host_totals`` are the host's (milli-cores, memory bytes) the ledger arbitrates;
        None (or a 0 in it) reads them from the machine (every CPU, all physical memory).
        ``mig_on_demand``: the ledger may give a MIG GPU a new layout to fit demand
        (:mod:`laminar_agent.mig_layout`); the backend applies it at the first commit.
        ``mig_carve_busy``: a busy MIG GPU's idle part may be carved too (instances in use
        stay)."""
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
        on_demand = self._restore_mig_layouts(backend) if mig_on_demand else ()
        self.slices = slices_from_gpus(backend.gpus())
        self._devices = {s.slice_id: s.device_uuid for s in self.slices}
        #: Live subjobs' spec facts (:class:`_SpecFacts`), dropped at their end.
        self._facts: dict[str, _SpecFacts] = {}
        #: Device UUID -> slice name, for what Airlock shows (it reads memory per device).
        self._slice_names = {s.device_uuid: s.slice_id for s in self.slices}
        self._mig_lock = asyncio.Lock()  # one MIG repartition at a time
        for gpu in backend.gpus():
            self._slice_names.setdefault(gpu.uuid, f"gpu{gpu.index}")
        detected = detect_host_totals()
        cpu_total_milli, memory_total_bytes = (
            (host_totals[0] or detected[0], host_totals[1] or detected[1])
            if host_totals
            else detected
        )
        self.core = AgentCore(
            Ledger(
                self.slices,
                lease_prefix=f"{agent_id}-r{restarts}-",
                cpu_total_milli=cpu_total_milli,
                memory_total_bytes=memory_total_bytes,
                mig_on_demand=on_demand,
                mig_carve_busy=mig_carve_busy,
            )
        )
        identities = TenantIdentities(run_as, users=tenant_users, pool=uid_pool, store=self.journal)
        self.executor = Executor(
            state_dir,
            on_exit=self._on_exit,
            identities=identities,
            cgroups=cgroups,
            fence_file=state_dir / FENCE_FILE,
        )
        self._pending: list[tuple[ProbeOrder, asyncio.Future[Granted | Bounced]]] = []
        self._batch_task: asyncio.Task[None] | None = None
        self._event_waiters: set[asyncio.Event] = set()
        #: Subjobs as the API shows them (get, list, watch, logs).
        self.reads = SubjobReads(
            agent_id, self.journal, self.executor, self.core, self._event_waiters
        )
        self.pending_probes = 0
        self.is_draining = False
        self.preempt_grace_seconds = preempt_grace_seconds
        self.airlock_dry_run = airlock_dry_run
        self.metrics = metrics
        self._preempt_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def ledger(self) -> Ledger:
        return self.core.ledger

    @property
    def live_states(self) -> dict[str, str]:
        """Live (non-terminal) subjob states, kept in memory so summaries stay off the journal."""
        return self.core.live_states

    @property
    def terminating(self) -> frozenset[str]:
        """Live subjobs the agent is stopping (TERMINATE sent): never chosen as victims again."""
        return self.core.stopping

    # -- carrying out the core's instructions -----------------------------------------------

    def _apply(
        self, instructions: Iterable[Instruction], spec: common_pb2.SubjobSpec | None = None
    ) -> None:
        """Do what the core decided, in order; ``spec`` is the new subjob's, for a NewRow.
        The journal writes of one call commit as one transaction."""
        with self.journal.batch():
            woken = self._carry_out(instructions, spec)
        if woken:
            for waiter in list(self._event_waiters):
                waiter.set()

    def _carry_out(
        self, instructions: Iterable[Instruction], spec: common_pb2.SubjobSpec | None
    ) -> bool:
        """The instructions, in order; whether any journaled an event (watchers wake)."""
        woken = False
        for ins in _merge_row_writes(instructions):
            if isinstance(ins, WriteRow):
                self.journal.update_subjob(ins.subjob_id, **ins.fields)
            elif isinstance(ins, RecordEvent):
                self.journal.append_event(ins.subjob_id, ins.state, ins.reason, ins.at_unix)
                woken = True
            elif isinstance(ins, KeepLease):
                if ins.subjob_id:  # uncommitted leases live in memory only
                    self._journal_lease(ins.lease, ins.subjob_id, ins.at_unix)
            elif isinstance(ins, DropLease):
                if ins.journaled:
                    self.journal.delete_lease(ins.lease_id)
                log.debug("lease %s for job %s %s", ins.lease_id, ins.job_id, ins.why)
            elif isinstance(ins, NewRow):
                assert spec is not None, "a new row needs its spec"
                self.journal.put_subjob(self._new_row(ins, spec))
            elif isinstance(ins, Ended):
                self._facts.pop(ins.subjob_id, None)
                if isinstance(self.backend, FakeGpuBackend):
                    self.backend.detach_subjob(ins.subjob_id)
                log.info(
                    "subjob %s %s (%s): %s",
                    ins.subjob_id,
                    ins.state.lower(),
                    ins.cause.token,
                    ins.reason,
                )
            elif isinstance(ins, Kill):
                log.error("stopping subjob %s: its capacity cannot be re-adopted", ins.subjob_id)
                self.executor.kill(ins.subjob_id)
            elif isinstance(ins, RecordReclaim):
                self._record_reclaim(ins)
            else:
                assert_never(ins)
        return woken

    def _new_row(self, ins: NewRow, spec: common_pb2.SubjobSpec) -> SubjobRow:
        slice_ids = [a.slice_id for a in ins.lease.allocations]
        return SubjobRow(
            subjob_id=ins.subjob_id,
            job_id=ins.job_id,
            spec_blob=spec.SerializeToString(),
            state=ins.state,
            reason=ins.reason,
            slice_ids_json=json.dumps(slice_ids),
            device_uuids_json=json.dumps([self._devices[s] for s in slice_ids]),
            created_unix=ins.created_unix,
            exit_code=0,
            signal=0,
            lease_id=ins.lease.lease_id,
        )

    def _journal_lease(self, lease: LeaseRecord, subjob_id: str, at_unix: float) -> None:
        self.journal.put_lease(
            lease.lease_id,
            lease.job_id,
            lease.member,
            json.dumps([a.__dict__ for a in lease.allocations]),
            lease.score,
            lease.priority,
            bool(subjob_id),
            subjob_id,
            at_unix,
        )

    def _record_reclaim(self, ins: RecordReclaim) -> None:
        self.journal.append_action(
            "reclaim",
            ins.subjob_id,
            ins.slice_id,
            ins.reason,
            ins.bytes_freed,
            ins.dry_run,
            end_cause=ins.cause.token,
        )
        log.info(
            "airlock %sreclaim subjob %s on %s: %s",
            "(dry-run) " if ins.dry_run else "",
            ins.subjob_id,
            ins.slice_id,
            ins.reason,
        )
        if self.metrics is not None:
            self.metrics.record_airlock_action(
                "reclaim",
                "preempted",
                resource="ledger",
                bytes_freed=ins.bytes_freed,
                work_lost_gpu_seconds=ins.work_lost_gpu_seconds,
                dry_run=ins.dry_run,
            )

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> tuple[int, int]:
        """Re-adopt subjobs still running after an agent restart; mark the rest with a reason."""
        adopted = lost = 0
        for row in self.journal.subjobs(states=list(LIVE_STATES)):
            spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
            self.core.restore(
                RestoredSubjob(
                    subjob_id=row.subjob_id,
                    job_id=row.job_id,
                    state=row.state,
                    reason=row.reason,
                    lease_id=row.lease_id,
                    slice_ids=tuple(json.loads(row.slice_ids_json)),
                    priority=int(spec.priority) or row.priority or common_pb2.BATCH,
                    lifecycle=int(spec.lifecycle) or common_pb2.LONG,
                    started_unix=row.started_unix,
                    end_cause=row.end_cause,
                    peak_gpu_memory_bytes=row.peak_gpu_memory_bytes,
                )
            )
            self._facts[row.subjob_id] = _SpecFacts.of(spec)
            if row.pid and self.executor.adopt(row.subjob_id, row.pid, row.started_unix):
                allocations = [Allocation(**a) for a in json.loads(row.allocations_json or "[]")]
                # The host CPU and memory it holds: what its demand takes here, as at its probe.
                cpu, memory = self.ledger.host_need(demand_of(spec.resources))
                refused = self.core.adopt(
                    row.subjob_id,
                    allocations,
                    row.priority or common_pb2.BATCH,
                    cpu_milli=cpu,
                    host_memory_bytes=memory,
                )
                self._apply(refused)  # its capacity cannot be held: it is stopped
                if refused:
                    lost += 1
                else:
                    adopted += 1
                    log.info("re-adopted subjob %s (pid %d)", row.subjob_id, row.pid)
                continue
            info = self.executor.read_exit(row.subjob_id)
            if info is not None:
                self._record_exit(row.subjob_id, info, "ended while the agent was down")
            else:
                self._apply(self.core.lose(row.subjob_id, time.time()))
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
        spec: common_pb2.SubjobSpec | None = None
        if request.commit_if_fits:  # the spec the commit runs, checked once, before a lease
            spec = common_pb2.SubjobSpec()
            spec.CopyFrom(request.spec)
            if not spec.HasField("resources"):
                spec.resources.CopyFrom(request.resources)
            spec.priority = spec.priority or request.priority
            validate_spec(spec)
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
            arrival_seq=self.core.next_arrival(),
            ttl_seconds=ttl or self.lease_ttl_seconds,
            slice_id=request.slice_id,
            caller=caller,
        )
        result = await self._settle(order)
        preempted: list[str] = []
        if isinstance(result, Bounced) and request.allow_preemption and result.retryable:
            result, preempted = await self._preempt(order)
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
        reply = agent_pb2.ProbeReply(
            lease=self._lease_message(lease),
            summary=self.summary(),
            preempted_subjob_ids=preempted,
        )
        if spec is not None:
            reply.subjob.CopyFrom(await self.commit(lease.lease_id, spec, caller, checked=True))
            if not all(reply.lease.device_uuids):  # a MIG layout applied at the commit
                reply.lease.CopyFrom(self._lease_message(lease))
        return reply

    async def _preempt(self, order: ProbeOrder) -> tuple[Granted | Bounced, list[str]]:
        """Make room for ``order`` by reclaiming the holders the core chooses, then settle it.

        Returns the outcome and the victims' ids (empty when none were reclaimed).
        """
        async with self._preempt_lock:
            # Room may have appeared while an earlier preemption ran.
            again = await self._settle(replace(order, arrival_seq=self.core.next_arrival()))
            if isinstance(again, Granted):
                return again, []
            choice = self.core.choose_preemption(
                order,
                again,
                time.time(),
                dry_run=self.airlock_dry_run,
                grace_seconds=self.preempt_grace_seconds,
            )
            self._apply(choice.actions)
            if choice.bounce is not None:
                return choice.bounce, []
            victims = list(choice.victims)
            owner = f"preempt-{uuid.uuid4().hex[:12]}"
            self.core.reserve(owner, choice, time.monotonic())
            try:
                for victim in victims:
                    self._spawn(self._reclaim(victim, choice.reasons[victim]), f"preempt-{victim}")
                if not await self._wait_ended(victims, choice.budget_seconds):
                    return self.core.preemption_timed_out(order, choice), victims
                result = await self._settle(
                    replace(order, arrival_seq=self.core.next_arrival(), owner=owner)
                )
            finally:
                self.core.unreserve(owner)
            log.info(
                "probe %s of job %s (%s): preempted %s on %s -> %s",
                order.probe_id,
                order.job_id,
                choice.priority_name,
                victims,
                list(choice.slice_ids),
                "lease" if isinstance(result, Granted) else f"bounce ({result.reason})",
            )
            return result, victims

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` to completion even if the RPC that started it is cancelled."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _reclaim(
        self, subjob_id: str, reason: str, cause: EndCause = EndCause.PREEMPTED
    ) -> None:
        try:
            await self.signal(
                subjob_id, agent_pb2.TERMINATE, reason, self.preempt_grace_seconds, cause=cause
            )
        except LaminarError as exc:  # it ended on its own meanwhile
            log.info("reclaim of %s: %s", subjob_id, exc.message)

    def end_subjobs_on_gpu(self, gpu_index: int, reason: str) -> list[str]:
        """Stop every live subjob holding a slice of GPU ``gpu_index``, which failed under
        them, with cause ``GPU_FAILED`` (a free retry for the router); returns their ids.
        The stops run in the background (SIGTERM, grace, SIGKILL)."""
        on_gpu = {s.slice_id for s in self.slices if s.gpu_index == gpu_index}
        live = sorted(set(self.live_states.values()))
        victims = [
            row.subjob_id
            for row in (self.journal.subjobs(states=live) if live else [])
            if row.subjob_id not in self.terminating
            and on_gpu.intersection(json.loads(row.slice_ids_json))
        ]
        for subjob_id in victims:
            self._spawn(
                self._reclaim(subjob_id, reason, EndCause.GPU_FAILED), f"gpu-failed-{subjob_id}"
            )
        return victims

    async def _wait_ended(self, subjob_ids: Sequence[str], timeout_seconds: float) -> bool:
        """Wait until every subjob is terminal, i.e. its capacity is released in the ledger."""
        waiter = asyncio.Event()
        self._event_waiters.add(waiter)
        deadline = time.monotonic() + timeout_seconds
        try:
            while any(self.core.subjob(s) is not None for s in subjob_ids):
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
        results, instructions = self.core.arbitrate(
            [order for order, _ in batch], time.monotonic(), time.time()
        )
        self._apply(instructions)
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    def set_capacity_gauges(self) -> None:
        """Allocated and stranded shares of the host's GPU capacity. The agent's tick sets
        them (at most ``airlock.poll_seconds`` old), not each summary: a summary goes with
        every probe and release reply, and the gauges are read at a scrape."""
        if self.metrics is None:
            return
        total = committed = stranded = 0
        for s in self.ledger.slices.values():
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
        self._apply(self.core.expire(time.monotonic()))

    def _lease_message(self, lease: LeaseRecord) -> agent_pb2.Lease:
        return agent_pb2.Lease(
            lease_id=lease.lease_id,
            agent_id=self.agent_id,
            slice_ids=[a.slice_id for a in lease.allocations],
            # A MIG instance the ledger planned has its UUID once its layout is applied.
            device_uuids=[self._devices.get(a.slice_id, "") for a in lease.allocations],
            score=lease.score,
            expires_unix=time.time() + max(0.0, lease.expires_at - time.monotonic()),
            job_id=lease.job_id,
            member=lease.member,
        )

    def release(self, lease_ids: Sequence[str], caller: str = "") -> int:
        """Give back uncommitted leases issued to ``caller``; others are skipped, not counted."""
        check_count(lease_ids, "lease_ids", max_items=MAX_RELEASE_IDS)
        for lease_id in lease_ids:
            check_str(lease_id, "lease_ids")
        released, instructions = self.core.release(lease_ids, caller)
        self._apply(instructions)
        return released

    # -- commit, launch and exit ----------------------------------------------------------

    async def commit(
        self,
        lease_id: str,
        spec: common_pb2.SubjobSpec,
        caller: str = "",
        *,
        checked: bool = False,
    ) -> common_pb2.Subjob:
        """``checked``: ``spec`` passed :func:`validate_spec` already (a probe that commits)."""
        check_str(lease_id, "lease_id", required=True)
        if not checked:
            validate_spec(spec)
        if not spec.subjob_id:
            spec.subjob_id = f"s-{uuid.uuid4().hex[:12]}"
        if self.journal.has_subjob(spec.subjob_id):  # an ended one, too
            raise TransitionRefused(
                f"subjob {spec.subjob_id} already exists", field="spec.subjob_id"
            )
        self._expire()
        await self._apply_mig_layouts(lease_id)
        instructions = self.core.commit(
            lease_id,
            spec.subjob_id,
            spec.job_id,
            caller=caller,
            priority=int(spec.priority),
            lifecycle=int(spec.lifecycle) or common_pb2.LONG,
            now=time.monotonic(),
            now_unix=time.time(),
        )
        self._apply(instructions, spec)
        self._facts[spec.subjob_id] = _SpecFacts.of(spec)
        new_row = next(i for i in instructions if isinstance(i, NewRow))
        devices = [self._devices[a.slice_id] for a in new_row.lease.allocations]
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
                    job_id=new_row.job_id,
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
                    array_job_id=spec.array_job_id,
                    array_index=spec.array_index,
                )
            )
        except (Exception, asyncio.CancelledError) as exc:
            # Cancelled too (its Commit call ended): the executor voided the launch, and
            # the subjob is recorded failed rather than left neither launched nor ended.
            why = str(exc) or "the launch was cancelled (its Commit call ended)"
            self._apply(self.core.launch_failed(spec.subjob_id, why, time.time()))
            raise
        self._apply(self.core.launched(spec.subjob_id, pid, time.time()))
        # The one INFO line of a start (the executor's own is DEBUG); its end has one too.
        log.info(
            "subjob %s of job %s running as pid %d on %s%s",
            spec.subjob_id,
            new_row.job_id,
            pid,
            [a.slice_id for a in new_row.lease.allocations],
            f", units {spec.unit_start}+{spec.unit_count}" if spec.unit_count else "",
        )
        return self.reads.message(spec.subjob_id)

    def _restore_mig_layouts(self, backend: GpuBackend) -> list[MigGpu]:
        """MIG on demand: the GPUs the ledger may repartition, after giving each the layout
        journaled when it was last applied (the fake backend starts from its spec; a real
        GPU keeps its instances, and applying the same layout again changes nothing)."""
        if not isinstance(backend, MigRepartitioner):
            raise InvalidArgument(
                f"MIG on demand needs a backend that creates GPU instances ({backend.name} "
                "does not)",
                field="inventory.mig_on_demand",
            )
        saved: dict[str, list[list[object]]] = json.loads(
            self.journal.get_meta(MIG_LAYOUTS_META) or "{}"
        )
        for index, layout in sorted(saved.items()):
            backend.apply_mig_layout(
                int(index), [(str(n), int(str(a)), int(str(z))) for n, a, z in layout]
            )
        return [MigGpu(g.index, g.model, g.uuid) for g in backend.gpus() if g.mig_enabled]

    async def _apply_mig_layouts(self, lease_id: str) -> None:
        """Before a lease on a MIG GPU whose new layout the ledger chose is committed, the
        backend creates that layout (only instances the ledger holds idle are destroyed,
        and the backend refuses where one runs something); the layout is journaled for
        restarts. The driver's
        calls run off the event loop, one repartition at a time."""
        lease = self.ledger.lease(lease_id)
        backend = self.backend
        if (
            lease is None
            or not self.ledger.mig_pending
            or not isinstance(backend, MigRepartitioner)
        ):
            return
        indexes = {
            self.ledger.slices[a.slice_id].gpu_index
            for a in lease.allocations
            if a.slice_id in self.ledger.slices
        }
        async with self._mig_lock:
            for index in sorted(indexes & set(self.ledger.mig_pending)):
                layout = self.ledger.mig_pending.get(index)
                if layout is None:
                    continue  # another commit applied it while we waited
                instances = await asyncio.to_thread(backend.apply_mig_layout, index, layout)
                self._mig_applied(index, layout, instances, lease_id)

    def _mig_applied(
        self,
        index: int,
        layout: tuple[tuple[str, int, int], ...],
        instances: tuple[MigInstanceInfo, ...],
        lease_id: str,
    ) -> None:
        """Record a layout the backend applied: ledger, journal, device names."""
        self.ledger.layout_applied(index, instances)
        saved = json.loads(self.journal.get_meta(MIG_LAYOUTS_META) or "{}")
        saved[str(index)] = [list(instance) for instance in layout]
        self.journal.set_meta(MIG_LAYOUTS_META, json.dumps(saved, sort_keys=True))
        for inst in instances:
            slice_id = f"gpu{index}/{inst.profile}@{inst.start}"
            self._devices[slice_id] = inst.uuid
            self._slice_names[inst.uuid] = slice_id
        log.info(
            "GPU %d repartitioned to %s for lease %s",
            index,
            "+".join(name for name, _, _ in layout),
            lease_id,
        )

    async def _on_exit(self, subjob_id: str, info: ExitInfo) -> None:
        try:
            self._record_exit(subjob_id, info, "")
        except TransitionRefused as exc:  # its end is recorded already
            log.debug("exit of subjob %s not recorded: %s", subjob_id, exc.message)

    def _record_exit(self, subjob_id: str, info: ExitInfo, context: str) -> None:
        """The core decides the end; an atomized subjob's reason also says what its
        checkpoint covers."""
        decision = self.core.decide_exit(subjob_id, info, context)
        # Every live subjob has its facts: set in the step that makes it live (commit,
        # restart), dropped when it ends; decide_exit refused an ended one above.
        facts = self._facts[subjob_id]
        units_done = 0
        if facts.unit_count > 0:
            units_done, note = units_from_checkpoint(
                facts.checkpoint_dir,
                facts.unit_start,
                facts.unit_count,
                decision.state == SUCCEEDED,
                owner_uid=self.executor.owner_uid(facts.tenant),
            )
            if note:
                decision = replace(decision, reason=f"{decision.reason}; {note}")
        fields = {
            "exit_code": info.exit_code if info.exit_code is not None else -1,
            "signal": info.signal or 0,
            "peak_rss_bytes": info.peak_rss_bytes,
            "run_seconds": info.run_seconds,
            "units_done": units_done,
        }
        self._apply(
            self.core.end(
                subjob_id, decision, time.time(), ended_unix=info.ended_unix, fields=fields
            )
        )

    # -- signals, queries, events ---------------------------------------------------------

    async def signal(
        self,
        subjob_id: str,
        signal: int,
        reason: str,
        grace_seconds: float,
        cause: EndCause = EndCause.TERMINATED,
    ) -> common_pb2.Subjob:
        """Carry out a signal the core allows; a TERMINATE journals ``cause`` at once, so the
        subjob's end records it whenever and however the process exits (``UNSPECIFIED`` is
        ``TERMINATED``)."""
        check_str(subjob_id, "subjob_id", required=True)
        check_str(reason, "reason", max_chars=1024)
        check_number(grace_seconds, "grace_seconds", high=3600)
        self.reads.row(subjob_id)
        why = reason or "requested"
        if signal == agent_pb2.SUSPEND:
            self.core.check_signal(subjob_id)
            self.executor.suspend(subjob_id)
            self._apply(self.core.suspend(subjob_id, why, time.time()))
        elif signal == agent_pb2.RESUME:
            self.core.check_signal(subjob_id)
            self.executor.resume(subjob_id)
            self._apply(self.core.resume(subjob_id, why, time.time()))
        elif signal == agent_pb2.RELEASE_MEMORY:
            self.core.check_release_memory(subjob_id)
            self.executor.release_memory(subjob_id)
        elif signal == agent_pb2.TERMINATE:
            self._apply(self.core.stop(subjob_id, why, cause))
            # The caller waits for the end, but a caller that gives up (an RPC deadline)
            # must not cancel the escalation to SIGKILL: that would leave it running.
            stop = self._spawn(
                self.executor.terminate(subjob_id, grace_seconds or None), f"stop-{subjob_id}"
            )
            await asyncio.shield(stop)
        else:
            self.core.check_release_memory(subjob_id)
            raise InvalidArgument(f"unknown signal {signal}", field="signal")
        return self.reads.message(subjob_id)

    def note_gpu_memory(self, subjob_id: str, used_bytes: int) -> None:
        """A poll's reading of a live subjob's GPU memory; the peak is kept."""
        self.core.note_gpu_memory(subjob_id, used_bytes)

    def slice_name(self, device_uuid: str) -> str:
        """The slice name the API uses for a device (``gpu0``, ``gpu1/3g.40gb@0``); a device
        the inventory does not know (or the host) keeps its id."""
        return self._slice_names.get(device_uuid, device_uuid)

    def add_event_waiter(self, waiter: asyncio.Event) -> None:
        """``waiter`` is set on every subjob transition (heartbeats send them at once)."""
        self._event_waiters.add(waiter)

    def score_against(self, counts: Counter[PodShape]) -> None:
        """The router's target workload (its heartbeat reply sends it when it changes): the
        ledger chooses GPUs by FGD's fragmentation measure against it, as the router ranks
        hosts by it."""
        frag = FragmentationCache(typical_workload(counts), MILLI_SLICING) if counts else None
        self.ledger.set_fragmentation(frag)
        log.info("scoring placements against the router's workload of %d shapes", len(counts))

    def summary(
        self, *, with_windows: bool = False, pressured: frozenset[str] = frozenset()
    ) -> common_pb2.AgentSummary:
        """Free capacity per shape; with ``with_windows`` (heartbeats) also the windows
        atomized jobs bid for. Probe replies skip the windows: they are on the hot path.
        Slices under memory pressure (``pressured``: slice or GPU names) advertise none:
        new work there would only be Airlock's next victim."""
        self._expire()  # a summary never counts a lease that has already lapsed
        summary = common_pb2.AgentSummary(
            agent_id=self.agent_id,
            pending_probes=self.pending_probes,
            active_leases=self.ledger.pending_leases(),
            draining=self.is_draining,
            pressure=common_pb2.NORMAL,
            generated_unix=time.time(),
            total_gpus=len(self.backend.gpus()),
        )
        host = self.ledger.host_free()
        summary.cpu_free_milli = host.cpu_free_milli
        summary.cpu_total_milli = host.cpu_total_milli
        summary.memory_free_bytes = host.memory_free_bytes
        summary.memory_total_bytes = host.memory_total_bytes
        summary.gpu_free_milli.extend(host.gpu_free_milli)
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
        for subjob_id, facts in self._facts.items():  # no journal read, no spec parsed
            live = self.core.subjob(subjob_id)
            if facts.expected_seconds <= 0 or live is None or live.started_unix <= 0:
                continue
            end = live.started_unix + facts.expected_seconds
            for slice_id in live.slice_ids:
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
