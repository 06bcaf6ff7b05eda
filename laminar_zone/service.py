"""gRPC servicers of laminar-zone: translation between protobuf and the zone state, no policy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import grpc

from laminar_agent.executor import check_subjob_id
from laminar_agent.heartbeat import MAX_ACTIONS_PER_HEARTBEAT, MAX_EVENTS_PER_HEARTBEAT
from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.callstream import CallServer, CallServers, StreamTasks
from laminar_base.causes import TERMINAL_JOB_STATES
from laminar_base.errors import InvalidArgument, LaminarError, PermissionDenied, Unavailable
from laminar_base.grpcutil import (
    MAX_TEXT_CHARS,
    check_count,
    check_str,
    map_errors,
)
from laminar_base.security import peer_names
from laminar_zone.arrays import parse_array
from laminar_zone.auth import (
    DEFAULT_TENANT,
    Guard,
    Principal,
    bearer_from_metadata,
    check_tenant_access,
    open_guard,
    require_admin,
)
from laminar_zone.client_leases import ClientLeases
from laminar_zone.config import is_host_port
from laminar_zone.jobs import ZoneState
from laminar_zone.limits import check_queued
from laminar_zone.membership import HeartbeatStream, Membership
from laminar_zone.peers import PeerRouter
from laminar_zone.queries import ZoneQueries
from laminar_zone.spec import MAX_BATCH_JOBS

Ctx = grpc.aio.ServicerContext[Any, Any]


T = TypeVar("T")


#: Why a stream ends, or is refused, once the router's shutdown has begun.
SHUTTING_DOWN = "the zone router is shutting down"


class ZoneService(zone_pb2_grpc.ZoneServicer):
    """The submitter API. With auth on, every call names its caller (a bearer token);
    tenants act on their own jobs only, and administrative calls need the admin role."""

    def __init__(self, state: ZoneState, guard: Guard | None = None) -> None:
        self._state = state
        self._queries = ZoneQueries(state)
        self._leases = ClientLeases(state)
        self._guard = guard if guard is not None else open_guard()
        self._probe_streams = CallServers(SHUTTING_DOWN)
        #: Open WatchJob and SubmitAndWatch streams (:meth:`end_streams`).
        self._watches = StreamTasks(SHUTTING_DOWN)

    def _caller(self, context: Ctx) -> Principal | None:
        metadata = context.invocation_metadata() or ()
        return self._guard.caller(tuple((str(k), v) for k, v in metadata))

    async def _while_authorized(self, context: Ctx, source: AsyncIterator[T]) -> AsyncIterator[T]:
        """``source``'s items while the caller's token stays valid: when the token table is
        reloaded (SIGHUP) the caller is checked again, and a revoked token ends the stream
        with UNAUTHENTICATED (or PERMISSION_DENIED if its tenant changed)."""
        items = aiter(source)
        if not self._guard.enabled:
            async for item in items:
                yield item
            return
        # Checked again against the table of now, whose generation the wait starts from:
        # a reload between the call's own check and here is not missed.
        generation = self._guard.generation
        self._caller(context)
        nxt: asyncio.Future[T] = asyncio.ensure_future(anext(items))
        changed: asyncio.Future[int] = asyncio.ensure_future(self._guard.wait_reloaded(generation))
        try:
            while True:
                pending: list[asyncio.Future[Any]] = [nxt, changed]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if changed.done():
                    generation = changed.result()
                    self._caller(context)  # raises when the token was revoked
                    changed = asyncio.ensure_future(self._guard.wait_reloaded(generation))
                if nxt.done():
                    try:
                        item = nxt.result()
                    except StopAsyncIteration:
                        return
                    yield item
                    nxt = asyncio.ensure_future(anext(items))
        finally:
            nxt.cancel()
            changed.cancel()
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _audit(self, principal: Principal | None, action: str, target: str, reason: str) -> None:
        if self._state.audit is not None:
            actor = "anonymous" if principal is None else f"{principal.tenant} ({principal.role})"
            self._state.audit.append(actor, action, target, reason)

    def _own_job(self, context: Ctx, job_id: str) -> None:
        principal = self._caller(context)
        if principal is not None and not principal.is_admin:
            check_tenant_access(principal, self._state.get(job_id).spec.tenant)

    def _admit(
        self, principal: Principal | None, specs: Sequence[zone_pb2.JobSpec], prefix: str = ""
    ) -> None:
        """Tenant, rate limit and queued-job cap of new jobs (Submit, SubmitBatch and
        CommitJob): one call spends one rate-limit token; the cap counts every job a call
        adds (an array's elements each)."""
        adding: dict[str, int] = {}
        for i, spec in enumerate(specs):
            try:
                spec.tenant = self._guard.submit_tenant(principal, spec.tenant)
                jobs = len(parse_array(spec.array).indices) if spec.array else 1
            except LaminarError as exc:
                raise exc.within(f"{prefix}[{i}]") if prefix else exc from None
            adding[spec.tenant] = adding.get(spec.tenant, 0) + jobs
        for tenant in adding:
            self._guard.submit_limiter.take(tenant)
        cap = self._guard.max_queued_per_tenant
        if cap:
            for tenant, count in adding.items():
                queued = sum(
                    1
                    for e in self._state.entries.values()
                    if e.job.spec.tenant == tenant and e.job.state not in TERMINAL_JOB_STATES
                )
                check_queued(tenant, queued, cap, count)

    async def _submit(self, request: zone_pb2.SubmitRequest, context: Ctx) -> zone_pb2.Job:
        """Submit's path (SubmitAndWatch's first step): the caller, tenant, rate limit and
        queued-job cap, then the job journaled (or the one a resent request made before)."""
        self._admit(self._caller(context), [request.spec])
        return await self._state.submit(
            request.spec, request.client_request_id, bearer=_bearer(context)
        )

    @map_errors
    async def Submit(self, request: zone_pb2.SubmitRequest, context: Ctx) -> zone_pb2.Job:
        return await self._submit(request, context)

    @map_errors
    async def SubmitBatch(
        self, request: zone_pb2.SubmitBatchRequest, context: Ctx
    ) -> zone_pb2.SubmitBatchReply:
        check_count(request.requests, "requests", max_items=MAX_BATCH_JOBS)
        self._admit(self._caller(context), [r.spec for r in request.requests], "requests")
        jobs = await self._state.submit_many(
            [(r.spec, r.client_request_id) for r in request.requests], bearer=_bearer(context)
        )
        return zone_pb2.SubmitBatchReply(jobs=jobs)

    @map_errors
    async def GetJob(self, request: zone_pb2.GetJobRequest, context: Ctx) -> zone_pb2.Job:
        self._own_job(context, request.job_id)
        return self._state.get(request.job_id)

    @map_errors
    async def ListJobs(
        self, request: zone_pb2.ListJobsRequest, context: Ctx
    ) -> zone_pb2.ListJobsReply:
        principal = self._caller(context)
        tenant = request.tenant
        if principal is not None and not principal.is_admin:
            check_tenant_access(principal, tenant or principal.tenant)
            tenant = principal.tenant
        check_count(request.states, "states", max_items=MAX_STATE_FILTERS)
        return self._queries.list(tenant, list(request.states), request.limit, request.page_token)

    @map_errors
    async def CancelJob(self, request: zone_pb2.CancelJobRequest, context: Ctx) -> zone_pb2.Job:
        self._own_job(context, request.job_id)
        job = await self._state.cancel(request.job_id, request.reason)
        self._audit(self._caller(context), "cancel", request.job_id, request.reason)
        return job

    @map_errors
    async def WatchJob(
        self, request: zone_pb2.WatchJobRequest, context: Ctx
    ) -> AsyncIterator[zone_pb2.JobEvent]:
        self._own_job(context, request.job_id)
        watch = self._while_authorized(context, self._queries.watch(request.job_id))
        async for job in self._watches.serve(watch):
            yield zone_pb2.JobEvent(job=job, at_unix=time.time())

    @map_errors
    async def SubmitAndWatch(
        self, request: zone_pb2.SubmitRequest, context: Ctx
    ) -> AsyncIterator[zone_pb2.JobEvent]:
        """Submit, then WatchJob in the same call: a submitter that follows its job makes
        one call, not two. The first event is Submit's answer (sent once the submit is
        durable); then :meth:`ZoneQueries.watch`, whose first record is the job when the
        watch starts (skipped when it is still the one Submit answered) and whose queue is
        in place before that record, so no change after the submit is lost. A resent request
        streams the job it made before; a revoked token, or a shutdown, ends the stream as
        in WatchJob."""
        answered = await self._submit(request, context)
        yield zone_pb2.JobEvent(job=answered, at_unix=time.time())
        if answered.state in TERMINAL_JOB_STATES:
            return
        watch = self._while_authorized(context, self._queries.watch(answered.job_id))
        is_first = True
        async for job in self._watches.serve(watch):
            if is_first and job == answered:
                is_first = False
                continue
            is_first = False
            yield zone_pb2.JobEvent(job=job, at_unix=time.time())

    @map_errors
    async def GetLogs(
        self, request: zone_pb2.GetLogsRequest, context: Ctx
    ) -> zone_pb2.GetLogsReply:
        self._own_job(context, request.job_id)
        check_subjob_id(request.subjob_id, "subjob_id", required=False)  # an id, never a path
        if request.offset > MAX_LOG_OFFSET:
            raise InvalidArgument(
                f"must be <= {MAX_LOG_OFFSET}, got {request.offset}", field="offset"
            )
        return await self._queries.logs(
            request.job_id, request.subjob_id, request.stream, request.offset, request.max_bytes
        )

    async def _probe(
        self, request: zone_pb2.ProbeJobRequest, context: Ctx
    ) -> zone_pb2.ProbeJobReply:
        """One ProbeJob, unary or a call of a ProbeJobs stream: the caller, its tenant, the
        tenant's probe limit, then the probe."""
        principal = self._caller(context)
        request.spec.tenant = self._guard.submit_tenant(principal, request.spec.tenant)
        self._guard.probe_limiter.take(request.spec.tenant)
        return await self._leases.probe(request)

    @map_errors
    async def ProbeJob(
        self, request: zone_pb2.ProbeJobRequest, context: Ctx
    ) -> zone_pb2.ProbeJobReply:
        return await self._probe(request, context)

    @map_errors
    async def ProbeJobs(
        self, request_iterator: AsyncIterator[zone_pb2.ProbeJobsRequest], context: Ctx
    ) -> AsyncIterator[zone_pb2.ProbeJobsReply]:
        """ProbeJob calls over one stream, each answered as it completes with its call_id
        (:class:`~laminar_base.callstream.CallServer`: at most :data:`MAX_PROBES_IN_FLIGHT`
        in hand, the rest left unread). A caller without a valid token is refused before any call is read; a
        token revoked by a reload ends the stream as in WatchJob. A client that stops
        sending gets the answers of the calls in hand; a cancelled stream cancels them (no
        one reads their answers; an agent's lease granted meanwhile lapses at its TTL,
        as for a unary ProbeJob whose caller went away). At shutdown (:meth:`end_streams`)
        it answers the calls it has read and ends UNAVAILABLE."""
        self._caller(context)

        async def answer(call: zone_pb2.ProbeJobsRequest) -> zone_pb2.ProbeJobsReply:
            reply = await self._probe(call.probe, context)
            return zone_pb2.ProbeJobsReply(call_id=call.call_id, reply=reply)

        server: CallServer[zone_pb2.ProbeJobsRequest, zone_pb2.ProbeJobsReply] = CallServer(
            answer, error_reply=_error_reply, limit=MAX_PROBES_IN_FLIGHT, name="probe-jobs-call"
        )
        replies = self._probe_streams.serve(server, request_iterator)
        async for reply in self._while_authorized(context, replies):
            yield reply

    @property
    def streams_ending(self) -> bool:
        """Whether :meth:`end_streams` has run (a shutdown has begun)."""
        return self._probe_streams.is_stopping

    def end_streams(self) -> int:
        """Shutting down: every ProbeJobs stream answers what it has read and ends, and
        every watch ends (its client watches again once a router serves), all UNAVAILABLE,
        so that the server's grace is not spent on them and no new probe is taken during
        it. How many were open."""
        return self._probe_streams.stop_all() + self._watches.stop_all()

    @map_errors
    async def CommitJob(self, request: zone_pb2.CommitJobRequest, context: Ctx) -> zone_pb2.Job:
        self._admit(self._caller(context), [request.spec])
        return await self._leases.commit_leases(request)

    @map_errors
    async def ListAgents(
        self, request: zone_pb2.ListAgentsRequest, context: Ctx
    ) -> zone_pb2.ListAgentsReply:
        self._caller(context)
        records = sorted(self._state.view.agents.values(), key=lambda r: r.agent_id)
        return zone_pb2.ListAgentsReply(agents=[self._queries.agent_info(r) for r in records])

    @map_errors
    async def DrainAgent(
        self, request: zone_pb2.DrainAgentRequest, context: Ctx
    ) -> zone_pb2.AgentInfo:
        principal = self._caller(context)
        require_admin(principal, "drain")
        info = await self._queries.drain(request.agent, request.reason, True)
        self._audit(principal, "drain", info.agent_id, request.reason)
        return info

    @map_errors
    async def UndrainAgent(
        self, request: zone_pb2.DrainAgentRequest, context: Ctx
    ) -> zone_pb2.AgentInfo:
        principal = self._caller(context)
        require_admin(principal, "undrain")
        info = await self._queries.drain(request.agent, request.reason, False)
        self._audit(principal, "undrain", info.agent_id, request.reason)
        return info

    @map_errors
    async def GetAgentAirlock(
        self, request: zone_pb2.GetAgentAirlockRequest, context: Ctx
    ) -> agent_pb2.AirlockState:
        self._caller(context)
        record = self._queries.resolve_agent(request.agent)
        stub = self._state.clients.stub(record.address)
        try:
            return await stub.GetAirlock(
                agent_pb2.GetAirlockRequest(max_actions=request.max_actions or 20), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"agent {record.agent_id}: {exc.details()}") from None

    @map_errors
    async def InjectPressure(
        self, request: zone_pb2.InjectPressureRequest, context: Ctx
    ) -> agent_pb2.InjectLoadReply:
        principal = self._caller(context)
        require_admin(principal, "pressure injection")
        record = self._queries.resolve_agent(request.agent)
        self._audit(
            principal,
            "inject_pressure",
            record.agent_id,
            f"gpu {request.load.gpu_index} used_bytes {request.load.used_bytes}",
        )
        stub = self._state.clients.stub(record.address)
        try:
            return await stub.InjectLoad(request.load, timeout=10)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.NOT_FOUND,
            ):
                await context.abort(exc.code(), f"agent {record.agent_id}: {exc.details()}")
            raise Unavailable(f"agent {record.agent_id}: {exc.details()}") from None

    @map_errors
    async def GetUsage(
        self, request: zone_pb2.GetUsageRequest, context: Ctx
    ) -> zone_pb2.GetUsageReply:
        principal = self._caller(context)
        tenant = request.tenant
        if principal is not None and not principal.is_admin:
            check_tenant_access(principal, tenant or principal.tenant)
            tenant = principal.tenant
        return self._queries.usage(tenant, request.since_unix)

    @map_errors
    async def Bid(
        self, request_iterator: AsyncIterator[zone_pb2.BidMessage], context: Ctx
    ) -> AsyncIterator[zone_pb2.AnnounceMessage]:
        """The first message names the job (no bids); then announce -> bids -> result."""
        messages = aiter(request_iterator)
        try:
            first = await anext(messages)
        except StopAsyncIteration:
            return
        self._own_job(context, first.job_id)
        stream = self._state.atomizer.bid_stream(first, messages)
        async for announce in self._while_authorized(context, stream):
            yield announce


#: Most calls of one ProbeJobs stream in hand at once (the next are read as these finish).
MAX_PROBES_IN_FLIGHT = 256
#: Most shapes (GPU models, MIG profiles, shares) one summary may list.
MAX_SHAPES = 256
#: Most windows one agent summary may advertise.
MAX_WINDOWS = 1024
#: Most re-address requests one heartbeat may carry.
MAX_READDRESS = 256
#: Most job states one ListJobs filter may name.
MAX_STATE_FILTERS = 64
#: Largest log offset (a signed 64-bit file offset).
MAX_LOG_OFFSET = 2**63 - 1


def _error_reply(
    call: zone_pb2.ProbeJobsRequest, code_name: str, details: str
) -> zone_pb2.ProbeJobsReply:
    """A ProbeJobs call's failure, as the unary ProbeJob's status would carry it."""
    error = agent_pb2.ProbeError(code=code_name, message=details)
    return zone_pb2.ProbeJobsReply(call_id=call.call_id, error=error)


def _bearer(context: Ctx) -> str:
    """The bearer token the caller sent (the router passes it on when it forwards)."""
    metadata = tuple((str(k), v) for k, v in context.invocation_metadata() or ())
    return bearer_from_metadata(metadata) or ""


def check_shapes(shapes: Sequence[common_pb2.ShapeCapacity], field: str) -> None:
    check_count(shapes, field, max_items=MAX_SHAPES)
    for shape in shapes:
        check_str(shape.shape, f"{field}.shape")


def check_heartbeat(request: zone_pb2.HeartbeatRequest) -> None:
    """Every string and list a heartbeat carries is bounded before the router keeps any of
    it (the agent sends at most MAX_EVENTS_PER_HEARTBEAT events and
    MAX_ACTIONS_PER_HEARTBEAT actions, so a well-behaved agent never trips these)."""
    summary = request.summary
    check_str(summary.hostname, "summary.hostname", max_chars=253)
    check_shapes(summary.shapes, "summary.shapes")
    check_count(summary.windows, "summary.windows", max_items=MAX_WINDOWS)
    check_count(request.events, "events", max_items=MAX_EVENTS_PER_HEARTBEAT)
    check_count(request.airlock_actions, "airlock_actions", max_items=MAX_ACTIONS_PER_HEARTBEAT)
    check_count(request.readdress_subjob_ids, "readdress_subjob_ids", max_items=MAX_READDRESS)
    for subjob_id in request.readdress_subjob_ids:
        check_str(subjob_id, "readdress_subjob_ids")
    for event in request.events:
        check_str(event.subjob.spec.subjob_id, "events.subjob.spec.subjob_id")
        check_str(event.subjob.spec.job_id, "events.subjob.spec.job_id")
        check_str(event.subjob.reason, "events.subjob.reason", max_chars=MAX_TEXT_CHARS)
    for action in request.airlock_actions:
        check_str(action.step, "airlock_actions.step", max_chars=32)
        check_str(action.subjob_id, "airlock_actions.subjob_id")
        check_str(action.job_id, "airlock_actions.job_id")
        check_str(action.slice_id, "airlock_actions.slice_id")
        check_str(action.reason, "airlock_actions.reason", max_chars=MAX_TEXT_CHARS)


class ZoneControlService(zone_pb2_grpc.ZoneControlServicer):
    def __init__(
        self, state: ZoneState, peers: PeerRouter, submitters: ZoneService | None = None
    ) -> None:
        """``submitters``: the Zone service whose tenant checks ForwardJob applies."""
        self._state = state
        self._peers = peers
        self._submitters = submitters if submitters is not None else ZoneService(state)
        self._membership = Membership(state)
        #: Every open heartbeat stream (:meth:`end_streams`).
        self._streams = StreamTasks(SHUTTING_DOWN)

    def end_streams(self) -> int:
        """Shutting down: end every heartbeat stream now (its agent reconnects a period
        later), so the server's grace is not spent waiting for streams that never end on
        their own. Agents are not marked stale for it. How many were open."""
        self._membership.is_closing = True
        return self._streams.stop_all()

    @map_errors
    async def Heartbeat(
        self, request: zone_pb2.HeartbeatRequest, context: Ctx
    ) -> zone_pb2.HeartbeatReply:
        if request.HasField("summary"):  # a delta carries nothing else (Membership checks)
            check_heartbeat(request)
        names = peer_names(context)  # the certificate is read once per heartbeat
        return self._membership.on_heartbeat(request, names[0] if names else "", names)

    @map_errors
    async def Heartbeats(
        self, request_iterator: AsyncIterator[zone_pb2.HeartbeatRequest], context: Ctx
    ) -> AsyncIterator[zone_pb2.HeartbeatReply]:
        if not self._state.config.membership.stream:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "heartbeat streams are off (membership.stream)"
            )
        names = peer_names(context)  # one certificate for the whole stream
        async for reply in self._streams.serve(self._heartbeat_replies(request_iterator, names)):
            yield reply

    async def _heartbeat_replies(
        self, requests: AsyncIterator[zone_pb2.HeartbeatRequest], names: list[str]
    ) -> AsyncIterator[zone_pb2.HeartbeatReply]:
        caller = names[0] if names else ""
        stream = HeartbeatStream()
        try:
            async for request in requests:
                if request.HasField("summary"):
                    check_heartbeat(request)
                yield self._membership.on_stream_heartbeat(stream, request, caller, names)
        finally:
            self._membership.close_stream(stream)

    def _check_peer(self, context: Ctx) -> None:
        """With ``auth.peer_names``, only those certificates act as peer zones (the role
        check already ran: this narrows it to the routers the operator listed)."""
        allowed = self._state.config.auth.peer_names
        names = peer_names(context)
        if allowed and not set(allowed).intersection(names):
            who = f"certificate {names[0]!r}" if names else "a caller without a certificate"
            raise PermissionDenied(f"{who} is not listed", field="auth.peer_names")

    @map_errors
    async def ExchangeSummary(
        self, request: zone_pb2.ZoneSummary, context: Ctx
    ) -> zone_pb2.ZoneSummary:
        self._check_peer(context)
        check_str(request.zone, "zone", max_chars=64)
        check_str(request.address, "address")
        if request.address and not is_host_port(request.address):
            raise InvalidArgument(f"expected HOST:PORT, got {request.address!r}", field="address")
        check_shapes(request.shapes, "shapes")
        return self._peers.accept(request)

    @map_errors
    async def ForwardJob(self, request: zone_pb2.ForwardJobRequest, context: Ctx) -> zone_pb2.Job:
        self._check_peer(context)
        check_str(request.from_zone, "from_zone", max_chars=64, required=True)
        if request.from_zone == self._state.zone_name:
            raise InvalidArgument("a zone cannot forward to itself", field="from_zone")
        # The job is the submitter's, not the forwarding router's: the same tenant
        # authentication, quota and limits as Submit (the router passes the token on).
        # The idempotency key decides first: the router that forwarded this job asks again
        # (after a lost answer or its own restart, when it may no longer hold the
        # submitter's token) and gets the job it already created, never a second one.
        if request.client_request_id.startswith(f"fwd:{request.from_zone}:"):
            tenant = request.spec.tenant or DEFAULT_TENANT
            existing = self._state.store.by_request(tenant, request.client_request_id)
            if existing is not None:
                return self._state.get(existing.job_id)
        submitters = self._submitters
        submitters._admit(submitters._caller(context), [request.spec])
        return await self._state.submit(
            request.spec,
            request.client_request_id,
            forwarded_from=request.from_zone,
            allow_forward=False,
        )
