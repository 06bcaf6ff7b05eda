"""Two-phase placement for clients: ProbeJob(keep_leases) holds leases, CommitJob uses them.

A client that wants to see where its job would go (or to place several jobs together)
probes first: the router gathers leases through the same placer as every job and keeps them
for that tenant and those resources until CommitJob or their TTL
(:class:`laminar_zone.kept.KeptLeases`). CommitJob admits the job under the same quotas as
Submit and commits the leases through :meth:`ZoneState.commit_all`, the path queued jobs
take. Without keep_leases a probe is a dry run: each host says whether the job would fit.
"""

from __future__ import annotations

import time
import uuid

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.errors import FailedPrecondition, InvalidArgument
from laminar_base.grpcutil import check_number, check_str
from laminar_zone.auth import DEFAULT_TENANT
from laminar_zone.entry import Entry, queue_item
from laminar_zone.jobs import ZoneState
from laminar_zone.kept import KeptLease
from laminar_zone.placements import fresh
from laminar_zone.placer import Ask, rpc_reason
from laminar_zone.queue import quota_block, quota_never_fits
from laminar_zone.spec import validate_spec


class ClientLeases:
    """ProbeJob and CommitJob over a zone's state."""

    def __init__(self, state: ZoneState) -> None:
        self._state = state

    async def probe(self, request: zone_pb2.ProbeJobRequest) -> zone_pb2.ProbeJobReply:
        spec = request.spec
        if not spec.command:
            spec.command.append("true")  # a probe needs no command; validate the rest
        need = validate_spec(spec)
        max_hosts = min(request.max_hosts or 8, 64)
        check_number(request.lease_ttl_seconds, "lease_ttl_seconds", high=60)
        hosts = self._state.view.counts(need)
        reply = zone_pb2.ProbeJobReply(hosts_matching=hosts.matching, hosts_total=hosts.ready)
        if request.keep_leases:
            gathered = await self._state.placer.gather(
                Ask(
                    job_id=f"probe-{uuid.uuid4().hex[:8]}",
                    resources=spec.resources,
                    gang_size=max(1, spec.gang_size),
                    priority=spec.priority or common_pb2.BATCH,
                    value=spec.value,
                    tenant=spec.tenant,
                ),
                lease_ttl_seconds=request.lease_ttl_seconds or 10.0,
            )
            now = time.monotonic()
            self._state.kept_leases.sweep(now)
            kept = KeptLease(
                tenant=spec.tenant or DEFAULT_TENANT,  # as CommitJob names an unnamed tenant
                resources=spec.resources.SerializeToString(deterministic=True),
                gang_size=max(1, spec.gang_size),
                expires_mono=now + (request.lease_ttl_seconds or 10.0),
            )
            for record, lease in gathered.chosen or []:
                self._state.kept_leases.keep(lease.lease_id, kept)
                reply.hosts.add(
                    agent_id=record.agent_id,
                    address=record.address,
                    fits=True,
                    score=lease.score,
                    lease=lease,
                )
            if gathered.chosen is None:
                for text in gathered.reasons[-max_hosts:]:
                    agent_id, _, why = text.partition(": ")
                    reply.hosts.add(agent_id=agent_id, fits=False, reason=why or text)
            return reply
        for record, outcome in await self._state.placer.dry_run(
            spec.resources, max_hosts, spec.priority or common_pb2.BATCH
        ):
            if isinstance(outcome, BaseException):
                reply.hosts.add(
                    agent_id=record.agent_id,
                    address=record.address,
                    fits=False,
                    reason=rpc_reason(outcome),
                )
                continue
            reply.hosts.add(
                agent_id=record.agent_id,
                address=record.address,
                fits=outcome.would_fit,
                score=outcome.score,
                reason="" if outcome.would_fit else outcome.bounce.reason,
            )
        reply.hosts.sort(key=lambda h: (not h.fits, -h.score, h.agent_id))
        return reply

    async def commit_leases(self, request: zone_pb2.CommitJobRequest) -> zone_pb2.Job:
        """Two-phase form: leases from ProbeJob(keep_leases) become a running job."""
        spec = request.spec
        if not spec.tenant:
            spec.tenant = DEFAULT_TENANT
        need = validate_spec(spec)
        gang = max(1, spec.gang_size)
        if len(request.leases) != gang:
            raise InvalidArgument(
                f"has {len(request.leases)} leases for a gang of {gang}", field="leases"
            )
        check_str(request.client_request_id, "client_request_id")
        if request.client_request_id:
            existing = self._state.store.by_request(spec.tenant, request.client_request_id)
            if existing is not None:
                return fresh(existing)
        lease_ids = [lease.lease_id for lease in request.leases]
        self._state.kept_leases.check(
            lease_ids,
            spec.tenant,
            spec.resources.SerializeToString(deterministic=True),
            gang,
            time.monotonic(),
        )
        chosen = []
        for i, lease in enumerate(request.leases):
            record = self._state.view.agents.get(lease.agent_id)
            if record is None:
                raise InvalidArgument(f"unknown agent {lease.agent_id!r}", field=f"leases[{i}]")
            chosen.append((record, lease))
        item = queue_item(spec, need)
        # The same quota as Submit: a job that can never fit is refused, and one that does
        # not fit beside the tenant's running work now is refused too (it holds leases, it
        # cannot wait in the queue).
        quota = self._state.quotas.get(spec.tenant)
        refusal = quota_never_fits(item, quota)
        if not refusal and quota is not None:
            units, memory = self._state.tenant_usage()
            refusal = quota_block(
                item, quota, units.get(spec.tenant, 0.0), memory.get(spec.tenant, 0)
            )
        if refusal:
            raise FailedPrecondition(refusal, field="spec.resources")
        self._state.kept_leases.take(lease_ids)
        job = zone_pb2.Job(
            job_id=f"j-{uuid.uuid4().hex[:10]}",
            spec=spec,
            state=zone_pb2.PENDING,
            reason="committing leases",
            submitted_unix=time.time(),
            zone=self._state.zone_name,
            client_request_id=request.client_request_id,
            attempts=1,
        )
        entry = Entry(job=job, need=need, submitted_mono=time.monotonic(), placing=True)
        self._state.core.admit(entry)
        self._state.store.put(job)
        try:
            ok = await self._state.commit_all(entry, chosen)
        finally:
            self._state.core.set_placing(entry, False)
        if not ok:
            self._state.finish(entry, zone_pb2.JOB_FAILED, job.reason)
            self._state.save(entry)
            raise FailedPrecondition(
                f"{job.reason} (leases expire after their TTL; probe again)", field="leases"
            )
        return fresh(job)
