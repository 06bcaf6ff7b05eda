"""Probe-first placement I/O: draw candidates, probe d agents in parallel, bind late.

The decisions (which candidates, which lease, how a gang is assembled) come
from :mod:`laminar_zone.placement`; this module only talks to agents. Every
probe reply carries the agent's fresh summary, which goes straight back into
the view, so a bounce steers the next attempt.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import grpc

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.callstream import CallClient
from laminar_base.demand import HostCap
from laminar_base.fragmentation import MILLI_SLICING, ObservedWorkload
from laminar_base.grpcutil import channel_options, rpc_error
from laminar_base.security import INSECURE, Trust
from laminar_base.wire import demand_of
from laminar_zone.config import PlacementSettings
from laminar_zone.gather import Bind, Gather, ProbeHost, Release, Unsure
from laminar_zone.placement import Offer, ShapeCap
from laminar_zone.view import AgentRecord, ProbePlan, ZoneView, learned_ranking

log = logging.getLogger("laminar.zone.placer")

S = TypeVar("S")


class StubCache(Generic[S]):
    """One channel per address, opened on first use and kept (agents and peer routers).

    Channels authenticate the way ``trust`` says (mTLS, shared secret, or neither)."""

    def __init__(self, factory: Callable[[grpc.aio.Channel], S], trust: Trust = INSECURE) -> None:
        self._factory = factory
        self._trust = trust
        self._stubs: dict[str, tuple[grpc.aio.Channel, S]] = {}

    def stub(self, address: str) -> S:
        entry = self._stubs.get(address)
        if entry is None:
            channel = self._trust.aio_channel(address, channel_options())
            entry = (channel, self._factory(channel))
            self._stubs[address] = entry
        return entry[1]

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close(None)
        self._stubs.clear()


class AgentClients(StubCache["agent_pb2_grpc.AgentAsyncStub"]):
    def __init__(self, trust: Trust = INSECURE) -> None:
        super().__init__(agent_pb2_grpc.AgentStub, trust)


#: Most probes one ProbeBatch call carries (the agent refuses more than 256).
MAX_PROBES_PER_CALL = 256


@dataclass
class _Queued(Generic[S]):
    request: S
    future: asyncio.Future[Any]


#: How long probes or releases for an agent wait behind its call in flight before they
#: go out anyway, in a call of their own (an agent slow to answer holds up nobody long).
HOLD_SECONDS = 0.005
#: How long an agent that serves no call stream gets unary calls before the stream is
#: tried again (an upgraded agent is found within it).
UNARY_RETRY_SECONDS = 300.0


class AgentCalls:
    """Probes and releases for one agent travel together: while a call to an agent is in
    flight, what else is bound for it waits and then goes as one call when that call
    returns (a ProbeBatch, a Probe when alone; one Release with every lease id), or
    after :data:`HOLD_SECONDS` at most. With nothing in flight a call leaves in the
    tick that queued it, so a lone placement waits for nothing. Every call has a fixed
    cost on both ends (about a quarter of a millisecond of CPU each) that a burst of
    placements would otherwise pay per probe; the agent settles the probes of one call
    in one arbitration batch, as it settles probes arriving together within its batch
    window. A call that fails fails every probe in it, as it would have failed each
    alone. Probes that may preempt are never queued: they can take a grace period.

    Each call travels as one message of the agent's ``Calls`` stream (one per agent,
    opened on first use, :class:`~laminar_base.callstream.CallClient`): a unary call's
    fixed cost is several times a stream message's on both ends. An agent that serves
    no such stream (an older one) gets unary calls, and the stream is tried again after
    :data:`UNARY_RETRY_SECONDS`."""

    def __init__(
        self,
        clients: StubCache[Any],
        timeout_seconds: Callable[[], float],
        *,
        hold_seconds: float = HOLD_SECONDS,
    ) -> None:
        self._clients = clients
        self._timeout_seconds = timeout_seconds
        self._hold_seconds = hold_seconds
        #: (kind, address) -> what waits to go; kind is "probe" or "release".
        self._queued: dict[tuple[str, str], list[_Queued[Any]]] = {}
        self._in_flight: dict[tuple[str, str], int] = {}
        self._flushes: dict[tuple[str, str], asyncio.Handle] = {}
        self._streams: dict[str, CallClient[agent_pb2.AgentCall, agent_pb2.AgentCallReply]] = {}
        #: Agents that serve no call stream, until when they get unary calls.
        self._unary_until: dict[str, float] = {}
        #: Called before any probe leaves: the router commits the journal's grouped writes
        #: (a commit on probe's intent must be durable before its probe goes out).
        self.before_probes: Callable[[], None] = _nothing
        #: The calls under way (the router's idle check and close wait for them).
        self.tasks: set[asyncio.Task[None]] = set()

    async def probe(self, address: str, request: agent_pb2.ProbeRequest) -> agent_pb2.ProbeReply:
        reply: agent_pb2.ProbeReply = await self._queue(("probe", address), request)
        return reply

    async def release(self, address: str, lease_ids: list[str]) -> agent_pb2.ReleaseReply:
        reply: agent_pb2.ReleaseReply = await self._queue(("release", address), lease_ids)
        return reply

    def _queue(self, key: tuple[str, str], item: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.setdefault(key, []).append(_Queued(item, future))
        if key not in self._flushes:
            if self._in_flight.get(key, 0):
                self._flushes[key] = loop.call_later(self._hold_seconds, self._flush, key)
            else:
                self._flushes[key] = loop.call_soon(self._flush, key)
        return future

    def _flush(self, key: tuple[str, str]) -> None:
        handle = self._flushes.pop(key, None)
        if handle is not None:
            handle.cancel()  # a no-op when it is the one running
        queued = [q for q in self._queued.pop(key, []) if not q.future.done()]
        kind, address = key
        if not queued:
            return
        if kind == "release":
            self._start(key, self._send_releases(address, queued))
            return
        try:
            self.before_probes()
        except Exception as exc:  # not journaled: no probe of the call may leave
            log.exception("probes for %s not sent: the journal's commit failed", address)
            _settle_all(queued, exc)
            return
        for first in range(0, len(queued), MAX_PROBES_PER_CALL):
            self._start(
                key, self._send_probes(address, queued[first : first + MAX_PROBES_PER_CALL])
            )

    def _start(self, key: tuple[str, str], coro: Coroutine[Any, Any, None]) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        task = asyncio.create_task(coro, name=f"{key[0]}-{key[1]}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda _: self._returned(key))

    def _returned(self, key: tuple[str, str]) -> None:
        """A call came back: what waited for it goes now."""
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]
        if key in self._queued:
            self._flush(key)

    async def _send_probes(
        self, address: str, chunk: list[_Queued[agent_pb2.ProbeRequest]]
    ) -> None:
        try:
            batch = agent_pb2.ProbeBatchRequest(probes=[q.request for q in chunk])
            answer = await self._on_stream(address, agent_pb2.AgentCall(probes=batch))
            if answer is not None:
                replies = list(answer.probes.replies)
            elif len(chunk) == 1:
                stub = self._clients.stub(address)
                replies = [await stub.Probe(chunk[0].request, timeout=self._timeout_seconds())]
            else:
                stub = self._clients.stub(address)
                reply = await stub.ProbeBatch(batch, timeout=self._timeout_seconds())
                replies = list(reply.replies)
            if len(replies) != len(chunk):
                raise RuntimeError(f"{len(replies)} replies to {len(chunk)} probes")
        except Exception as exc:  # every probe of the call failed, as the call did
            if len(chunk) > 1 and not _refused_before_handling(exc):
                # An agent that fails a batch as a whole (one older than per-probe
                # errors) may have committed some of its commit-carrying probes before
                # another failed: their outcome is unknown, whatever the call's status.
                unknown = RuntimeError(f"batched probe failed, outcome unknown: {exc!r}")
                _settle_all([q for q in chunk if q.request.commit_if_fits], unknown)
            _settle_all(chunk, exc)
            return
        for queued, one in zip(chunk, replies, strict=True):
            if queued.future.done():
                continue
            if one.HasField("error"):  # this probe alone failed, as a lone call would
                queued.future.set_exception(rpc_error(one.error.code, one.error.message))
            else:
                queued.future.set_result(one)

    async def _send_releases(self, address: str, queued: list[_Queued[Any]]) -> None:
        request = agent_pb2.ReleaseRequest(lease_ids=[i for q in queued for i in q.request])
        try:
            answer = await self._on_stream(address, agent_pb2.AgentCall(release=request))
            if answer is not None:
                reply = answer.release
            else:
                stub = self._clients.stub(address)
                reply = await stub.Release(request, timeout=self._timeout_seconds())
        except Exception as exc:
            _settle_all(queued, exc)
            return
        for q in queued:
            if not q.future.done():
                q.future.set_result(reply)

    async def _on_stream(
        self, address: str, call: agent_pb2.AgentCall
    ) -> agent_pb2.AgentCallReply | None:
        """``call``'s reply over the agent's call stream; None when the agent serves
        none (nothing of the call was carried out: send it unary). A call that failed
        as a whole raises its status, as the unary call would."""
        if self._unary_until.get(address, 0.0) > time.monotonic():
            return None
        client = self._streams.get(address)
        if client is None:
            stub = self._clients.stub(address)
            client = self._streams[address] = CallClient(
                lambda: stub.Calls(), name=f"agent-calls-{address}"
            )
        try:
            reply = await client.call(call, self._timeout_seconds())
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.info(
                "agent %s serves no call stream: unary calls for %gs", address, UNARY_RETRY_SECONDS
            )
            self._unary_until[address] = time.monotonic() + UNARY_RETRY_SECONDS
            return None
        if reply.HasField("error"):
            raise rpc_error(reply.error.code, reply.error.message)
        return reply

    async def close(self) -> None:
        """End the agents' call streams (after the calls under way)."""
        streams = list(self._streams.values())
        self._streams.clear()
        await asyncio.gather(*(client.close() for client in streams))


#: Statuses a call gets before any handler ran (nothing of it was carried out).
_BEFORE_HANDLING = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def _refused_before_handling(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _BEFORE_HANDLING


def _nothing() -> None:
    pass


def _settle_all(queued: Sequence[_Queued[Any]], exc: BaseException) -> None:
    for q in queued:
        if not q.future.done():
            q.future.set_exception(exc)


def host_from(summary: common_pb2.AgentSummary) -> HostCap | None:
    """The host CPU, memory and per-GPU free share a summary carries (None: an agent that
    reports none of them)."""
    if not (summary.cpu_total_milli or summary.memory_total_bytes or summary.gpu_free_milli):
        return None
    return HostCap(
        cpu_free_milli=summary.cpu_free_milli,
        cpu_total_milli=summary.cpu_total_milli,
        memory_free_bytes=summary.memory_free_bytes,
        memory_total_bytes=summary.memory_total_bytes,
        gpu_free_milli=tuple(summary.gpu_free_milli),
        gpus_total=summary.total_gpus,
    )


def shapes_from(summary: common_pb2.AgentSummary) -> dict[str, ShapeCap]:
    return {
        s.shape: ShapeCap(s.free, s.total, s.max_free_milli, s.max_free_memory_bytes)
        for s in summary.shapes
    }


@dataclass
class Ask:
    """What to probe for: one job attempt (all gang members)."""

    job_id: str
    resources: common_pb2.Resources
    gang_size: int
    priority: int
    value: float
    tenant: str
    allow_preemption: bool = False


@dataclass
class Gathered:
    """Leases chosen for every member (uncommitted), or None with the reasons. With commit
    on probe: ``committed``, the reply of the probe that started the member, or
    ``unsure``, why a probe carrying the commit got no answer (the member may run)."""

    chosen: list[tuple[AgentRecord, agent_pb2.Lease]] | None
    probes: int = 0
    bounces: int = 0
    reasons: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    committed: agent_pb2.ProbeReply | None = None
    unsure: str = ""
    #: Calls that failed, for the caller to judge (an agent refusing the spec).
    errors: list[BaseException] = field(default_factory=list)


class ProbeCommit(Protocol):
    """The job's side of commit on probe (the router's journal): each probe that carries
    the commit is recorded before it goes out, and forgotten when it surely did not start
    the member."""

    def intent(self, record: AgentRecord) -> common_pb2.SubjobSpec:
        """The member may start on ``record``: record it, and say how to run it."""
        ...

    def bounced(self, record: AgentRecord) -> None:
        """It did not start there (a bounce, or a call the agent refused)."""
        ...

    def may_have_run(self, exc: BaseException) -> bool:
        """Whether a failed call may still have been carried out by the agent."""
        ...


class Placer:
    def __init__(
        self,
        view: ZoneView,
        clients: AgentClients,
        settings: PlacementSettings,
        rng: random.Random,
    ) -> None:
        self.view = view
        self.clients = clients
        self.settings = settings
        self.rng = rng
        self.in_flight = 0
        #: Releases of leases late binding did not choose: sent off the critical path.
        self._releases: set[asyncio.Task[None]] = set()
        self.calls = AgentCalls(clients, lambda: self.settings.rpc_timeout_seconds)
        #: The target workload ranking measures fragmentation against: what this router
        #: was asked to place.
        self.workload = ObservedWorkload(MILLI_SLICING, min_observed=settings.workload_min_observed)

    @property
    def background(self) -> set[asyncio.Task[None]]:
        """Tasks under way off the placements' path: releases and the agent calls."""
        return self._releases | self.calls.tasks

    def note_summary(self, summary: common_pb2.AgentSummary) -> None:
        """Fold a probe reply's summary into the view (not a heartbeat: staleness unchanged)."""
        if not summary.agent_id or summary.agent_id not in self.view.agents:
            return
        self.view.update(
            summary.agent_id,
            summary.address,
            shapes_from(summary),
            heat=summary.pending_probes + summary.active_leases,
            draining=summary.draining,
            now=time.monotonic(),
            running_subjobs=summary.running_subjobs,
            is_heartbeat=False,
            host=host_from(summary),
        )

    async def gather(
        self,
        ask: Ask,
        *,
        lease_ttl_seconds: float = 0.0,
        exclude: set[str] | None = None,
        commit: ProbeCommit | None = None,
    ) -> Gathered:
        """Drive one :class:`~laminar_zone.gather.Gather`: probe rounds over gRPC, bind late.

        ``commit``: with d = 1 (``probes_per_attempt``, for one member of no MIG profile:
        :meth:`ProbeLimits.for_try`), each probe carries "commit if it fits" and ``commit``
        records it (see :class:`ProbeCommit`)."""
        s = self.settings
        need = demand_of(ask.resources)
        gang = max(1, ask.gang_size)
        ttl = lease_ttl_seconds or s.lease_ttl_seconds
        limits = s.limits().for_try(need, gang)
        machine = Gather(
            ProbePlan(
                self.view,
                need,
                limits,
                self.rng,
                exclude,
                rank=learned_ranking(self.workload, need),
            ),
            gang,
            deadline=time.monotonic() + s.budget_seconds,
            budget_seconds=s.budget_seconds,
            commit_on_probe=commit is not None and limits.probes_per_attempt == 1,
        )
        result = Gathered(chosen=None)
        leases: dict[str, tuple[AgentRecord, agent_pb2.Lease]] = {}
        committed: dict[str, agent_pb2.ProbeReply] = {}
        self.in_flight += 1
        try:
            todo = machine.start(time.monotonic())
            while True:
                probes = [i for i in todo if isinstance(i, ProbeHost)]
                for step in todo:
                    if isinstance(step, Release):
                        # Nothing waits on a release (an agent that misses it lets the
                        # lease expire): send it beside the placement, not before it.
                        task = asyncio.create_task(
                            self.release([leases.pop(o.lease_id) for o in step.offers]),
                            name="release-unchosen",
                        )
                        self._releases.add(task)
                        task.add_done_callback(self._releases.discard)
                    elif isinstance(step, Bind) and step.committed:
                        result.committed = committed.pop(step.offers[0].lease_id)
                    elif isinstance(step, Bind):
                        result.chosen = [leases.pop(o.lease_id) for o in step.offers]
                    elif isinstance(step, Unsure):
                        result.unsure = step.reason
                if machine.is_done:
                    break
                specs = {
                    p.record.agent_id: commit.intent(p.record)
                    for p in probes
                    if p.commit and commit is not None
                }
                replies = await asyncio.gather(
                    *(
                        self._probe(p.record, ask, p.members, ttl, specs.get(p.record.agent_id))
                        for p in probes
                    ),
                    return_exceptions=True,
                )
                todo = []
                for p, reply in zip(probes, replies, strict=True):
                    agent_id = p.record.agent_id
                    if isinstance(reply, BaseException):
                        unsure = False
                        if p.commit and commit is not None:
                            result.errors.append(reply)
                            unsure = commit.may_have_run(reply)
                            if not unsure:
                                commit.bounced(p.record)
                        todo += machine.failed(
                            agent_id,
                            p.round,
                            rpc_reason(reply),
                            time.monotonic(),
                            may_have_run=unsure,
                        )
                        continue
                    grants: list[Offer] = []
                    bounces: list[str] = []
                    for one in reply:
                        self.note_summary(one.summary)
                        result.preempted.extend(one.preempted_subjob_ids)
                        if one.WhichOneof("outcome") == "lease":
                            lease = one.lease
                            if p.commit:
                                committed[lease.lease_id] = one
                            else:
                                leases[lease.lease_id] = (p.record, lease)
                            grants.append(
                                Offer(lease.lease_id, agent_id, lease.member, lease.score)
                            )
                        else:
                            if p.commit and commit is not None:
                                commit.bounced(p.record)
                            bounces.append(one.bounce.reason)
                    todo += machine.answered(agent_id, p.round, grants, bounces, time.monotonic())
            result.probes = machine.probes
            result.bounces = machine.bounces
            result.reasons = list(machine.reasons)
            return result
        finally:
            self.in_flight -= 1

    async def _probe(
        self,
        record: AgentRecord,
        ask: Ask,
        members: int,
        ttl: float,
        spec: common_pb2.SubjobSpec | None = None,
    ) -> list[agent_pb2.ProbeReply]:
        """Probe ``record`` for ``members`` members; with ``spec``, one probe that carries
        "commit if it fits" for it."""
        probes = [
            agent_pb2.ProbeRequest(
                probe_id=f"{ask.job_id}/{m}/{uuid.uuid4().hex[:6]}",
                job_id=ask.job_id,
                member=m,
                resources=ask.resources,
                priority=ask.priority,  # type: ignore[arg-type]
                value=ask.value,
                lease_ttl_seconds=ttl,
                allow_preemption=ask.allow_preemption,
                tenant=ask.tenant,
            )
            for m in range(members)
        ]
        if spec is not None:
            # Batched with other probes for the agent like any probe: each probe of a
            # ProbeBatch answers with its own outcome or its own error.
            probes[0].commit_if_fits = True
            probes[0].spec.CopyFrom(spec)
        if len(probes) == 1 and not ask.allow_preemption:
            return [await self.calls.probe(record.address, probes[0])]
        stub = self.clients.stub(record.address)
        timeout = self.settings.rpc_timeout_seconds
        self.calls.before_probes()  # a grouped intent is committed before the probe leaves
        if len(probes) == 1:
            return [await stub.Probe(probes[0], timeout=timeout)]
        reply = await stub.ProbeBatch(agent_pb2.ProbeBatchRequest(probes=probes), timeout=timeout)
        replies = list(reply.replies)
        failed = next((one.error for one in replies if one.HasField("error")), None)
        if failed is not None:
            # A member that could not be probed fails the try on this host as the whole
            # call would have; its siblings' leases are released.
            granted = [one.lease for one in replies if one.WhichOneof("outcome") == "lease"]
            if granted:
                await self.release([(record, lease) for lease in granted])
            raise rpc_error(failed.code, failed.message)
        return replies

    async def close(self) -> None:
        """Let releases and calls under way finish (short: one call per agent, bounded)."""
        while pending := {task for task in self.background if not task.done()}:
            await asyncio.gather(*pending, return_exceptions=True)
        await self.calls.close()

    async def release(self, offers: list[tuple[AgentRecord, agent_pb2.Lease]]) -> None:
        """Give leases back; an unreachable agent lets them expire on its own (short TTL)."""
        by_address: dict[str, list[str]] = {}
        for record, lease in offers:
            by_address.setdefault(record.address, []).append(lease.lease_id)
        calls = [self.calls.release(address, ids) for address, ids in by_address.items()]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.info("lease release failed (the lease will expire): %s", rpc_reason(outcome))
            else:
                self.note_summary(outcome.summary)

    async def dry_run(
        self, resources: common_pb2.Resources, max_hosts: int, priority: int
    ) -> list[tuple[AgentRecord, agent_pb2.ProbeReply | BaseException]]:
        """Ask up to ``max_hosts`` matching hosts whether they could take one member now."""
        need = demand_of(resources)
        records = self.view.sample(need, max_hosts, self.rng)
        calls = [
            self.clients.stub(r.address).Probe(
                agent_pb2.ProbeRequest(
                    probe_id=f"dry/{uuid.uuid4().hex[:8]}",
                    job_id="dry-run",
                    resources=resources,
                    priority=priority,  # type: ignore[arg-type]
                    dry_run=True,
                ),
                timeout=self.settings.rpc_timeout_seconds,
            )
            for r in records
        ]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        return list(zip(records, replies, strict=True))


def rpc_reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
