"""The router's state driven with no sockets: in-process agents answer the calls a router
makes (Probe, ProbeBatch, Commit, Release, SignalSubjob, GetSubjob) with the agent's real
:class:`~laminar_agent.ledger.Ledger` deciding, and heartbeat the router directly.

An agent here does only what the router can observe of a real one: its subjobs start on
Commit and run until the test ends them (an exit), the router stops them (a signal), or
its fence stops them; a silent agent answers no call; a crashed agent comes back with its
subjobs LOST. Everything a test checks is the router's own code reacting to that.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

import grpc

from laminar_agent.ledger import Bounced, Ledger, ProbeOrder, Slice, SliceKind
from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import LIVE_SUBJOB_STATES, EndCause
from laminar_base.grpcutil import rpc_error as grpc_rpc_error
from laminar_base.wire import parse_demand

GPU_MEMORY_BYTES = 80 << 30


class ManualClock:
    """The monotonic clock of the router and the agents under test: it stands still
    unless the test moves it, so how fast the machine runs never changes a decision (on
    a loaded machine an agent went stale, or a placement ran out of its time budget,
    between two steps, and a failing run could not be replayed). Wall-clock time (the
    unix times the router records) is the real one."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class SeededIds:
    """``uuid4`` for the ids the router makes (jobs, probes), drawn from a seeded
    generator: a run makes the same ids when it is replayed, so a step that picks "an
    agent's i-th subjob" (in id order) picks the same one, and so does everything the
    router orders by id."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    def __getattr__(self, name: str) -> Any:
        return getattr(uuid, name)


def _router_modules(names: str) -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(f"laminar_zone.{name}") for name in names.split())


#: The router's modules that read the monotonic clock for a decision, or make ids.
CLOCKED = _router_modules(
    "admission atomizer jobs membership persistence placer queue_loop reports"
)
IDS = _router_modules("admission placer")


@contextlib.contextmanager
def replayable(clock: ManualClock, ids: SeededIds) -> Iterator[None]:
    """Until the block ends, the router's modules read ``clock`` instead of the real
    monotonic clock and draw their ids from ``ids``: the same steps make the same run."""
    saved = [(module, "time", module.time) for module in CLOCKED]
    saved += [(module, "uuid", module.uuid) for module in IDS]
    for module in CLOCKED:
        setattr(module, "time", clock)  # noqa: B010 (a module attribute, typed as a module)
    for module in IDS:
        setattr(module, "uuid", ids)  # noqa: B010
    try:
        yield
    finally:
        for module, name, real in saved:
            setattr(module, name, real)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc_rpc_error(code.name, details)


class FakeCallStream:
    """An agent's end of a ``Calls`` stream, in memory: each call written is carried out
    by the fake's unary handler (``ProbeBatch`` or ``Release``) and answered by call id;
    a handler's status becomes the call's error, as the agent's servicer answers. With
    ``serves=False`` (an older agent) the stream ends UNIMPLEMENTED, every call unheard."""

    def __init__(self, agent: Any, *, serves: bool = True) -> None:
        self.stub = agent
        self.serves = serves
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        if not serves:
            self.replies.put_nowait(rpc_error(grpc.StatusCode.UNIMPLEMENTED, "no Calls"))

    async def write(self, call: agent_pb2.AgentCall) -> None:
        if not self.serves:
            return  # refused unheard
        task = asyncio.create_task(self._answer(call))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, call: agent_pb2.AgentCall) -> None:
        try:
            if call.WhichOneof("call") == "probes":
                probes = await self.stub.ProbeBatch(call.probes)
                reply = agent_pb2.AgentCallReply(call_id=call.call_id, probes=probes)
            else:
                release = await self.stub.Release(call.release)
                reply = agent_pb2.AgentCallReply(call_id=call.call_id, release=release)
        except grpc.aio.AioRpcError as exc:  # the call failed as a whole: its reply says so
            error = agent_pb2.ProbeError(code=exc.code().name, message=exc.details() or "")
            reply = agent_pb2.AgentCallReply(call_id=call.call_id, error=error)
        self.replies.put_nowait(reply)

    async def read(self) -> Any:
        item = await self.replies.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self.replies.put_nowait(rpc_error(grpc.StatusCode.CANCELLED, "cancelled"))
        return True


@dataclass
class FakeAgent:
    agent_id: str
    gpus: int
    #: Answers no call and sends no heartbeat (partitioned or frozen).
    silent: bool = False
    generation: int = 1
    subjobs: dict[str, common_pb2.Subjob] = field(default_factory=dict)
    #: Subjob id -> times it was started here (a subjob id starts at most once).
    starts: dict[str, int] = field(default_factory=dict)
    events: list[common_pb2.SubjobEvent] = field(default_factory=list)
    acked: int = 0
    want_live: bool = True
    #: The next Commit applies on the agent but its reply never reaches the router.
    lose_next_commit_reply: bool = False
    #: The next Commit applies on the agent and then never answers; ``hung`` is set then
    #: (the test crashes the router at that moment).
    hang_next_commit: bool = False
    hung: asyncio.Event = field(default_factory=asyncio.Event)
    #: The next subjob started exits at once, and its exit reaches the router (through
    #: ``report``, the test's heartbeat) before the reply of the call that started it.
    exit_before_reply: bool = False
    report: Callable[[], None] | None = None
    #: Called as each Probe/ProbeBatch/Commit arrives, while the router's try is in flight.
    inside_call: Callable[[], None] | None = None
    #: The agent's monotonic clock (the test's, so that leases lapse only when it says).
    clock: Callable[[], float] = time.monotonic
    #: Subjobs Airlock wants moved (listed on every heartbeat while they live).
    readdress: set[str] = field(default_factory=set)
    #: The router's call streams to this agent, as it opened them.
    streams: list[FakeCallStream] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: Lease ids count up (the agent draws them at random): a replayed run is the same.
    _leases: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.ledger = self._new_ledger()

    def _new_ledger(self) -> Ledger:
        slices = [
            Slice(
                slice_id=f"gpu{i}",
                kind=SliceKind.WHOLE_GPU,
                gpu_index=i,
                device_uuid=f"{self.agent_id}-gpu{i}",
                gpu_model="H100-80GB",
                memory_total_bytes=GPU_MEMORY_BYTES,
            )
            for i in range(self.gpus)
        ]
        return Ledger(
            slices, lease_prefix=f"{self.agent_id}-", lease_ids=lambda: f"{next(self._leases)}"
        )

    @property
    def address(self) -> str:
        return f"{self.agent_id}.test:1"

    # ------------------------------------------------------------- what the agent does

    def summary(self) -> common_pb2.AgentSummary:
        summary = common_pb2.AgentSummary(
            agent_id=self.agent_id,
            address=self.address,
            generation=self.generation,
            total_gpus=self.gpus,
            active_leases=self.ledger.pending_leases(),
            running_subjobs=len(self.live()),
        )
        for s in self.ledger.shapes():
            summary.shapes.add(
                shape=s.shape,
                free=s.free,
                total=s.total,
                max_free_milli=s.max_free_milli,
                max_free_memory_bytes=s.max_free_memory_bytes,
            )
        return summary

    def live(self) -> list[common_pb2.Subjob]:
        return [s for s in self.subjobs.values() if s.state in LIVE_SUBJOB_STATES]

    def end(self, subjob_id: str, state: int, cause: EndCause, reason: str) -> None:
        """The subjob ends (exit, signal, fence): its capacity is free and an event waits
        for the next heartbeat."""
        subjob = self.subjobs[subjob_id]
        if subjob.state not in LIVE_SUBJOB_STATES:
            return
        subjob.state = state  # type: ignore[assignment]
        subjob.end_cause = cause.wire
        subjob.reason = reason
        subjob.ended_unix = time.time()
        self.ledger.release(subjob.lease_id)
        self._event(subjob)

    def _event(self, subjob: common_pb2.Subjob) -> None:
        event = common_pb2.SubjobEvent(seq=next(self._seq), at_unix=time.time())
        event.subjob.CopyFrom(subjob)
        self.events.append(event)

    def crash_and_restart(self) -> None:
        """The agent's host rebooted: every process is gone, leases with it; the journal
        still holds the subjobs, which come back LOST."""
        for subjob_id, subjob in self.subjobs.items():
            if subjob.state in LIVE_SUBJOB_STATES:
                self.end(subjob_id, common_pb2.LOST, EndCause.LOST, "gone after a restart")
        self.ledger = self._new_ledger()
        self.generation += 1
        self.want_live = True
        self.silent = False

    def fence(self) -> None:
        """The agent lost touch with the router for the fence lease: it stops its work."""
        for subjob in self.live():
            self.end(subjob.spec.subjob_id, common_pb2.KILLED, EndCause.FENCED, "fenced")

    def heartbeat(self) -> zone_pb2.HeartbeatRequest:
        self.ledger.expire(self.clock())  # as the agent's tick does: lapsed leases go
        request = zone_pb2.HeartbeatRequest(
            summary=self.summary(), events=[e for e in self.events if e.seq > self.acked]
        )
        live = {s.spec.subjob_id for s in self.live()}
        self.readdress &= live
        request.readdress_subjob_ids.extend(sorted(self.readdress))
        if self.want_live:
            request.live_subjob_ids.extend(sorted(live))
            request.has_live_subjob_ids = True
        return request

    def heard(self, reply: zone_pb2.HeartbeatReply, sent_live: bool) -> None:
        self.acked = max(self.acked, reply.acked_seq)
        self.want_live = reply.want_live_subjobs or (self.want_live and not sent_live)

    # ------------------------------------------------------------- the agent's RPCs

    def _reachable(self) -> None:
        if self.silent:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.agent_id} does not answer")

    async def Probe(
        self, request: agent_pb2.ProbeRequest, timeout: float = 0
    ) -> agent_pb2.ProbeReply:
        (reply,) = self._settle([request])
        if request.commit_if_fits and reply.WhichOneof("outcome") == "lease":
            # As the agent does: the lease is committed in the same call (a lost or hung
            # reply is the Commit's, injected below).
            commit = agent_pb2.CommitRequest(lease_id=reply.lease.lease_id, spec=request.spec)
            reply.subjob.CopyFrom(await self.Commit(commit))
        return reply

    async def ProbeBatch(
        self, request: agent_pb2.ProbeBatchRequest, timeout: float = 0
    ) -> agent_pb2.ProbeBatchReply:
        requests = list(request.probes)
        replies = self._settle(requests)
        lost: grpc.aio.AioRpcError | None = None
        for probe, reply in zip(requests, replies, strict=True):
            if not (probe.commit_if_fits and reply.WhichOneof("outcome") == "lease"):
                continue
            commit = agent_pb2.CommitRequest(lease_id=reply.lease.lease_id, spec=probe.spec)
            try:
                reply.subjob.CopyFrom(await self.Commit(commit))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    lost = exc  # the call's reply is lost, with every probe's answer in it
                    continue
                # As the agent does: this probe alone fails, with its own status.
                reply.Clear()
                reply.error.code = exc.code().name
                reply.error.message = exc.details() or ""
        if lost is not None:
            raise lost
        return agent_pb2.ProbeBatchReply(replies=replies)

    def _settle(self, requests: list[agent_pb2.ProbeRequest]) -> list[agent_pb2.ProbeReply]:
        if self.inside_call is not None:
            self.inside_call()
        self._reachable()
        now = self.clock()
        self.ledger.expire(now)
        orders = [
            ProbeOrder(
                probe_id=r.probe_id,
                job_id=r.job_id,
                member=r.member,
                demand=parse_demand(r.resources),
                priority=r.priority or common_pb2.BATCH,
                value=r.value,
                arrival_seq=i,
                ttl_seconds=r.lease_ttl_seconds or 5.0,
            )
            for i, r in enumerate(requests)
        ]
        replies = []
        for outcome in self.ledger.arbitrate(orders, now):
            if isinstance(outcome, Bounced):
                reply = agent_pb2.ProbeReply(
                    bounce=agent_pb2.Bounce(reason=outcome.reason, retryable=outcome.retryable)
                )
            else:
                lease = outcome.lease
                reply = agent_pb2.ProbeReply(
                    lease=agent_pb2.Lease(
                        lease_id=lease.lease_id,
                        agent_id=self.agent_id,
                        slice_ids=[a.slice_id for a in lease.allocations],
                        score=lease.score,
                        job_id=lease.job_id,
                        member=lease.member,
                    )
                )
            reply.summary.CopyFrom(self.summary())
            replies.append(reply)
        return replies

    def Calls(self) -> FakeCallStream:
        """The router's probes and releases arrive here (its agent call stream)."""
        self.streams.append(FakeCallStream(self))
        return self.streams[-1]

    async def calls_handled(self) -> None:
        """Until every call the router sent has been carried out here (answered or not)."""
        while pending := [t for s in self.streams for t in s.tasks]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def Release(
        self, request: agent_pb2.ReleaseRequest, timeout: float = 0
    ) -> agent_pb2.ReleaseReply:
        self._reachable()
        released = 0
        for lease_id in request.lease_ids:
            lease = self.ledger.lease(lease_id)
            if lease is not None and not lease.committed:
                self.ledger.release(lease_id)
                released += 1
        return agent_pb2.ReleaseReply(released=released, summary=self.summary())

    async def Commit(
        self, request: agent_pb2.CommitRequest, timeout: float = 0
    ) -> common_pb2.Subjob:
        if self.inside_call is not None:
            self.inside_call()
        self._reachable()
        spec = request.spec
        if spec.subjob_id in self.subjobs:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"{spec.subjob_id} exists")
        try:
            lease = self.ledger.commit(request.lease_id, spec.subjob_id, self.clock())
        except Exception as exc:  # the ledger refuses an unknown or lapsed lease
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        subjob = common_pb2.Subjob(
            agent_id=self.agent_id,
            slice_ids=[a.slice_id for a in lease.allocations],
            state=common_pb2.RUNNING,
            reason="started",
            lease_id=request.lease_id,
            started_unix=time.time(),
        )
        subjob.spec.CopyFrom(spec)
        self.subjobs[spec.subjob_id] = subjob
        self.starts[spec.subjob_id] = self.starts.get(spec.subjob_id, 0) + 1
        self._event(subjob)
        reply = common_pb2.Subjob.FromString(subjob.SerializeToString())
        if self.exit_before_reply:
            self.exit_before_reply = False
            self.end(spec.subjob_id, common_pb2.SUCCEEDED, EndCause.EXITED, "exited 0")
            if self.report is not None:
                self.report()
        if self.lose_next_commit_reply:
            self.lose_next_commit_reply = False
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the reply was lost")
        if self.hang_next_commit:
            self.hang_next_commit = False
            self.hung.set()
            await asyncio.Event().wait()  # until the router that called is gone
        return reply

    async def SignalSubjob(
        self, request: agent_pb2.SignalSubjobRequest, timeout: float = 0
    ) -> common_pb2.Subjob:
        subjob = self._known(request.subjob_id)
        if request.signal == agent_pb2.TERMINATE:
            cause = EndCause(request.end_cause) if request.end_cause else EndCause.TERMINATED
            self.end(request.subjob_id, common_pb2.KILLED, cause, request.reason)
        return subjob

    async def GetSubjob(
        self, request: agent_pb2.GetSubjobRequest, timeout: float = 0
    ) -> common_pb2.Subjob:
        return self._known(request.subjob_id)

    def _known(self, subjob_id: str) -> common_pb2.Subjob:
        self._reachable()
        subjob = self.subjobs.get(subjob_id)
        if subjob is None:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, f"no subjob {subjob_id}")
        return subjob


class FakeClients:
    """What the router's :class:`~laminar_zone.placer.AgentClients` gives it: a stub per
    address, here the in-process agent itself."""

    def __init__(self, agents: dict[str, FakeAgent]) -> None:
        self._by_address = {a.address: a for a in agents.values()}

    def stub(self, address: str) -> FakeAgent:
        agent = self._by_address.get(address)
        if agent is None:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"nothing at {address}")
        return agent

    async def close(self) -> None:
        return None


async def settle(
    tasks: Callable[[], set[asyncio.Task[Any]]], interrupt: asyncio.Event
) -> list[BaseException]:
    """Run the router's background tasks (and those they start) until none is left or
    ``interrupt`` is set; returns the exceptions any of them raised."""
    failures: list[BaseException] = []
    stop = asyncio.ensure_future(interrupt.wait())
    try:
        while (pending := set(tasks())) and not interrupt.is_set():
            done, _ = await asyncio.wait(pending | {stop}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stop}:
                if not task.cancelled() and task.exception() is not None:
                    failures.append(cast(BaseException, task.exception()))
    finally:
        stop.cancel()
    return failures
