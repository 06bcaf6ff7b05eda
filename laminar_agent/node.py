"""The agent's authority over its host: wires the decision core to its drivers and answers
the API's calls.

Every decision is :class:`laminar_agent.core.AgentCore`'s (lifecycle, arbitration, leases,
preemption). :class:`Node` builds the core, the journal and the executor, checks requests,
strings a probe through its batch (and preemption, and a commit), carries out signals and
builds the API's messages. The rest lives with the drivers, one concern each:

- :mod:`laminar_agent.carrier`: carries out the core's instructions (journal, leases,
  kills, reclaim records) and holds the I/O parts every driver shares;
- :mod:`laminar_agent.arbitration`: the batch window and priority preemption;
- :mod:`laminar_agent.launch`: commit -> executor -> launched or void, and exits;
- :mod:`laminar_agent.recovery`: re-adoption from the journal after a restart;
- :mod:`laminar_agent.mig_driver`: MIG layouts applied on demand;
- :mod:`laminar_agent.host_summary`: the summaries and windows the router reads;
- :mod:`laminar_agent.subjob_reads`: subjobs as the API shows them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from laminar_agent.arbitration import Arbiter
from laminar_agent.carrier import Carrier
from laminar_agent.cgroups import SubjobCgroups
from laminar_agent.core import AgentCore
from laminar_agent.executor import Executor, ExitInfo, RunAs, TenantIdentities
from laminar_agent.host_summary import HostSummaries
from laminar_agent.inventory import GpuBackend
from laminar_agent.journal import Journal
from laminar_agent.launch import Launches, validate_spec
from laminar_agent.ledger import Bounced, LeaseRecord, Ledger, ProbeOrder, slices_from_gpus
from laminar_agent.metrics import AgentMetrics
from laminar_agent.mig_driver import MigLayouts, restore_mig_layouts
from laminar_agent.recovery import recover
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
from laminar_base.wire import parse_demand

__all__ = ["DEFAULT_LEASE_TTL_SECONDS", "Node", "detect_host_totals", "validate_spec"]

log = logging.getLogger("laminar.agent.node")

DEFAULT_LEASE_TTL_SECONDS = 0.2
MAX_LEASE_TTL_SECONDS = 60.0
#: Most lease ids one Release may name.
MAX_RELEASE_IDS = 4096


def detect_host_totals() -> tuple[int, int]:
    """This machine's CPUs in milli-cores and physical memory in bytes."""
    return (os.cpu_count() or 1) * 1000, int(psutil.virtual_memory().total)


class Node:
    """One agent's core and drivers, and the calls the API makes on them."""

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
        self.backend = backend
        self.state_dir = state_dir
        self.lease_ttl_seconds = lease_ttl_seconds
        self.journal = Journal(state_dir / "agent.db")
        restarts = int(self.journal.get_meta("restarts") or "0") + 1
        self.journal.set_meta("restarts", str(restarts))
        on_demand = restore_mig_layouts(self.journal, backend) if mig_on_demand else ()
        self.slices = slices_from_gpus(backend.gpus())
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
        self.carrier = Carrier(
            self.core, self.journal, self.executor, backend, self.slices, metrics
        )
        self.metrics = metrics
        #: Subjobs as the API shows them (get, list, watch, logs).
        self.reads = SubjobReads(
            agent_id, self.journal, self.executor, self.core, self.carrier.waiters, self.carrier.row
        )
        self.arbiter = Arbiter(
            self.carrier,
            self._reclaim,
            batch_seconds=batch_seconds,
            preempt_grace_seconds=preempt_grace_seconds,
            airlock_dry_run=airlock_dry_run,
        )
        self.launches = Launches(self.carrier, MigLayouts(self.carrier), self.reads)
        self.summaries = HostSummaries(self.carrier, agent_id, self.arbiter, max_windows)

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

    @property
    def is_draining(self) -> bool:
        """Draining: probes bounce (not retryable) and summaries say so."""
        return self.core.is_draining

    @is_draining.setter
    def is_draining(self, draining: bool) -> None:
        self.core.is_draining = draining

    def recover(self) -> tuple[int, int]:
        """Re-adopt subjobs still running after an agent restart; mark the rest with a reason.
        Returns (re-adopted, not re-adopted)."""
        return recover(self.carrier, self.launches)

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
        refused = self.core.admit(request.probe_id, self.agent_id)
        if refused is not None:
            return agent_pb2.ProbeReply(
                bounce=agent_pb2.Bounce(reason=refused.reason, retryable=refused.retryable),
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
        result = await self.arbiter.settle(order)
        preempted: list[str] = []
        if self.core.may_preempt(result, request.allow_preemption):
            result, preempted = await self.arbiter.preempt(order)
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
            reply.subjob.CopyFrom(
                await self.launches.commit(lease.lease_id, spec, caller, checked=True)
            )
            if not all(reply.lease.device_uuids):  # a MIG layout applied at the commit
                reply.lease.CopyFrom(self._lease_message(lease))
        return reply

    def _lease_message(self, lease: LeaseRecord) -> agent_pb2.Lease:
        return agent_pb2.Lease(
            lease_id=lease.lease_id,
            agent_id=self.agent_id,
            slice_ids=[a.slice_id for a in lease.allocations],
            # A MIG instance the ledger planned has its UUID once its layout is applied.
            device_uuids=[self.carrier.devices.get(a.slice_id, "") for a in lease.allocations],
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
        self.carrier.apply(instructions)
        return released

    def expire_leases(self) -> None:
        """Drop the uncommitted leases whose TTL has passed (the agent's tick calls it)."""
        self.carrier.expire()

    # -- commit and exit ------------------------------------------------------------------

    async def commit(
        self, lease_id: str, spec: common_pb2.SubjobSpec, caller: str = ""
    ) -> common_pb2.Subjob:
        """Commit a lease to ``spec`` and launch it (:meth:`Launches.commit`)."""
        return await self.launches.commit(lease_id, spec, caller)

    async def _on_exit(self, subjob_id: str, info: ExitInfo) -> None:
        await self.launches.on_exit(subjob_id, info)

    # -- signals --------------------------------------------------------------------------

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
        apply = self.carrier.apply
        if signal == agent_pb2.SUSPEND:
            self.core.check_suspend(subjob_id)
            self.executor.suspend(subjob_id)
            apply(self.core.suspend(subjob_id, why, time.time()))
        elif signal == agent_pb2.RESUME:
            self.core.check_signal(subjob_id)
            self.executor.resume(subjob_id)
            apply(self.core.resume(subjob_id, why, time.time()))
        elif signal == agent_pb2.RELEASE_MEMORY:
            self.core.check_release_memory(subjob_id)
            self.executor.release_memory(subjob_id)
        elif signal == agent_pb2.TERMINATE:
            apply(self.core.stop(subjob_id, why, cause))
            # The caller waits for the end, but a caller that gives up (an RPC deadline)
            # must not cancel the escalation to SIGKILL: that would leave it running.
            stop = self.carrier.spawn(
                self.executor.terminate(subjob_id, grace_seconds or None), f"stop-{subjob_id}"
            )
            await asyncio.shield(stop)
        else:
            self.core.check_release_memory(subjob_id)
            raise InvalidArgument(f"unknown signal {signal}", field="signal")
        return self.reads.message(subjob_id)

    async def _reclaim(
        self, subjob_id: str, reason: str, cause: EndCause = EndCause.PREEMPTED
    ) -> None:
        try:
            await self.signal(
                subjob_id,
                agent_pb2.TERMINATE,
                reason,
                self.arbiter.preempt_grace_seconds,
                cause=cause,
            )
        except LaminarError as exc:  # it ended on its own meanwhile
            log.info("reclaim of %s: %s", subjob_id, exc.message)

    def end_subjobs_on_gpu(self, gpu_index: int, reason: str) -> list[str]:
        """Stop every live subjob holding a slice of GPU ``gpu_index``, which failed under
        them, with cause ``GPU_FAILED`` (a free retry for the router); returns their ids.
        The stops run in the background (SIGTERM, grace, SIGKILL)."""
        victims = self.core.holding({s.slice_id for s in self.slices if s.gpu_index == gpu_index})
        for subjob_id in victims:
            self.carrier.spawn(
                self._reclaim(subjob_id, reason, EndCause.GPU_FAILED), f"gpu-failed-{subjob_id}"
            )
        return victims

    # -- readings and the router's view ---------------------------------------------------

    def note_gpu_memory(self, subjob_id: str, used_bytes: int) -> None:
        """A poll's reading of a live subjob's GPU memory; the peak is kept."""
        self.core.note_gpu_memory(subjob_id, used_bytes)

    def slice_name(self, device_uuid: str) -> str:
        """The slice name the API uses for a device (``gpu0``, ``gpu1/3g.40gb@0``); a device
        the inventory does not know (or the host) keeps its id."""
        return self.carrier.slice_names.get(device_uuid, device_uuid)

    def add_event_waiter(self, waiter: asyncio.Event) -> None:
        """``waiter`` is set on every subjob transition (heartbeats send them at once)."""
        self.carrier.waiters.add(waiter)

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
        """This agent's free capacity (:meth:`HostSummaries.summary`)."""
        return self.summaries.summary(with_windows=with_windows, pressured=pressured)

    def set_capacity_gauges(self) -> None:
        """Allocated and stranded shares of the host's GPU capacity. The agent's tick sets
        them (at most ``airlock.poll_seconds`` old), not each summary: a summary goes with
        every probe and release reply, and the gauges are read at a scrape."""
        if self.metrics is None:
            return
        allocated, stranded = self.core.capacity_ratios()
        self.metrics.allocated_ratio.set(allocated)
        self.metrics.stranded_ratio.set(stranded)

    async def close(self) -> None:
        await self.carrier.cancel_background()
        await self.executor.close()
        self.journal.close()
