"""gRPC servicer of laminar-agent: translation between protobuf and the agent's state, no policy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from laminar_agent.state import AgentState
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.callstream import CallServer, CallServers, StreamTasks
from laminar_base.causes import end_cause
from laminar_base.errors import (
    FailedPrecondition,
    InvalidArgument,
    LaminarError,
    NotFound,
)
from laminar_base.grpcutil import check_number, check_str, error_status, map_errors
from laminar_base.security import peer_identity

Ctx = grpc.aio.ServicerContext[Any, Any]

#: Most probes one ProbeBatch may carry.
MAX_BATCH = 256


def _error_reply(
    call: agent_pb2.AgentCall, code_name: str, details: str
) -> agent_pb2.AgentCallReply:
    """A Calls call's failure, as the unary call's status would carry it."""
    error = agent_pb2.ProbeError(code=code_name, message=details)
    return agent_pb2.AgentCallReply(call_id=call.call_id, error=error)


#: Why a stream ends, or is refused, once the agent's shutdown has begun.
SHUTTING_DOWN = "the agent is shutting down"


class AgentService(agent_pb2_grpc.AgentServicer):
    """Leases are bound to the caller's mTLS identity (:func:`peer_identity`, "" without TLS):
    only the identity that probed may commit or release them. Debug calls (InjectLoad) are
    served only on the fake backend or with ``server.debug_rpcs``."""

    def __init__(self, state: AgentState, *, debug_rpcs: bool = False) -> None:
        self._state = state
        self._node = state.node
        self._debug_rpcs = debug_rpcs
        #: Calls of a :meth:`Calls` stream that went while they were in hand.
        self._unfinished: set[asyncio.Task[Any]] = set()
        self._streams = CallServers(SHUTTING_DOWN)
        #: Open WatchSubjobs streams, which end only when their client goes (:meth:`end_streams`).
        self._watches = StreamTasks(SHUTTING_DOWN)
        # The hot calls' metric children, looked up once (``labels`` takes a lock and
        # builds its key at every call).
        metrics = state.metrics
        self._seconds = {
            name: metrics.rpc_seconds.labels(name) for name in ("Probe", "ProbeBatch", "Commit")
        }
        self._probes = {
            outcome: metrics.probes_total.labels(outcome)
            for outcome in ("lease", "bounce", "fits", "dry_run")
        }

    @map_errors
    async def Probe(self, request: agent_pb2.ProbeRequest, context: Ctx) -> agent_pb2.ProbeReply:
        with self._seconds["Probe"].time():
            reply = await self._node.probe(request, peer_identity(context))
            self._state.fill_summary(reply.summary)
            self._count_probe(reply)
        return reply

    def _count_probe(self, reply: agent_pb2.ProbeReply) -> None:
        outcome = reply.WhichOneof("outcome") or ("fits" if reply.would_fit else "dry_run")
        self._probes[outcome].inc()

    @map_errors
    async def ProbeBatch(
        self, request: agent_pb2.ProbeBatchRequest, context: Ctx
    ) -> agent_pb2.ProbeBatchReply:
        return await self._probe_batch(request, peer_identity(context))

    async def _probe_batch(
        self, request: agent_pb2.ProbeBatchRequest, caller: str
    ) -> agent_pb2.ProbeBatchReply:
        if len(request.probes) > MAX_BATCH:
            raise InvalidArgument(
                f"has {len(request.probes)} probes, at most {MAX_BATCH}", field="probes"
            )
        with self._seconds["ProbeBatch"].time():
            outcomes = await asyncio.gather(
                *(self._node.probe(p, caller) for p in request.probes), return_exceptions=True
            )
        replies = []
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                # Only this probe failed (a refused spec, a commit that could not
                # launch): the others' outcomes stand, so each carries its own status.
                if isinstance(outcome, LaminarError):
                    outcome.within(f"probes[{i}]")
                code, details = error_status(outcome)
                reply = agent_pb2.ProbeReply(
                    error=agent_pb2.ProbeError(code=code.name, message=details)
                )
            else:
                reply = outcome
                self._count_probe(reply)
                self._state.fill_summary(reply.summary)
            replies.append(reply)
        return agent_pb2.ProbeBatchReply(replies=replies)

    @map_errors
    async def Calls(
        self, requests: AsyncIterator[agent_pb2.AgentCall], context: Ctx
    ) -> AsyncIterator[agent_pb2.AgentCallReply]:
        """ProbeBatch and Release calls over one stream (:class:`CallServer`). At shutdown
        (:meth:`end_streams`) it answers the calls it has read and ends UNAVAILABLE."""
        caller = peer_identity(context)
        server: CallServer[agent_pb2.AgentCall, agent_pb2.AgentCallReply] = CallServer(
            lambda call: self._call(call, caller),
            error_reply=_error_reply,
            keep_running=self._unfinished,
            name="agent-call",
        )
        async for reply in self._streams.serve(server, requests):
            yield reply

    @property
    def streams_ending(self) -> bool:
        """Whether :meth:`end_streams` has run (a shutdown has begun)."""
        return self._streams.is_stopping

    @property
    def watches_open(self) -> int:
        """Open WatchSubjobs streams."""
        return len(self._watches)

    def end_streams(self) -> int:
        """Shutting down: every Calls stream answers what it has read and ends, and every
        WatchSubjobs stream ends (both UNAVAILABLE), so that the server's grace is not spent
        on streams that never end on their own and no new probe is taken during it. How
        many were open."""
        return self._streams.stop_all() + self._watches.stop_all()

    async def calls_finished(self, timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) for the calls of streams that went while
        they were in hand; cancel what is left. How many were cancelled."""
        if self._unfinished:
            await asyncio.wait(set(self._unfinished), timeout=timeout)
        left = list(self._unfinished)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        return len(left)

    async def _call(self, call: agent_pb2.AgentCall, caller: str) -> agent_pb2.AgentCallReply:
        """One call of a :meth:`Calls` stream; its failure is its reply's error
        (:func:`_error_reply`), as the unary call's would be its status."""
        kind = call.WhichOneof("call")
        if kind == "probes":
            probes = await self._probe_batch(call.probes, caller)
            return agent_pb2.AgentCallReply(call_id=call.call_id, probes=probes)
        if kind == "release":
            release = self._release(call.release, caller)
            return agent_pb2.AgentCallReply(call_id=call.call_id, release=release)
        raise InvalidArgument("names no call (probes or release)", field="call")

    @map_errors
    async def Commit(self, request: agent_pb2.CommitRequest, context: Ctx) -> common_pb2.Subjob:
        with self._seconds["Commit"].time():
            return await self._node.commit(request.lease_id, request.spec, peer_identity(context))

    @map_errors
    async def Release(
        self, request: agent_pb2.ReleaseRequest, context: Ctx
    ) -> agent_pb2.ReleaseReply:
        return self._release(request, peer_identity(context))

    def _release(self, request: agent_pb2.ReleaseRequest, caller: str) -> agent_pb2.ReleaseReply:
        released = self._node.release(list(request.lease_ids), caller)
        return agent_pb2.ReleaseReply(released=released, summary=self._state.summary_message())

    @map_errors
    async def GetInventory(
        self, request: agent_pb2.GetInventoryRequest, context: Ctx
    ) -> agent_pb2.Inventory:
        return self._state.inventory_message(await self._state.read_memory())

    @map_errors
    async def GetSummary(
        self, request: agent_pb2.GetSummaryRequest, context: Ctx
    ) -> common_pb2.AgentSummary:
        return self._state.summary_message(with_windows=True)

    @map_errors
    async def ListSubjobs(
        self, request: agent_pb2.ListSubjobsRequest, context: Ctx
    ) -> agent_pb2.ListSubjobsReply:
        subjobs = self._node.reads.list(request.job_id, list(request.states), request.limit)
        return agent_pb2.ListSubjobsReply(subjobs=subjobs)

    @map_errors
    async def GetSubjob(
        self, request: agent_pb2.GetSubjobRequest, context: Ctx
    ) -> common_pb2.Subjob:
        check_str(request.subjob_id, "subjob_id", required=True)
        return self._node.reads.message(request.subjob_id)

    @map_errors
    async def WatchSubjobs(
        self, request: agent_pb2.WatchSubjobsRequest, context: Ctx
    ) -> AsyncIterator[common_pb2.SubjobEvent]:
        async for event in self._watches.serve(
            self._node.reads.watch(request.after_seq, request.job_id)
        ):
            yield event

    @map_errors
    async def SignalSubjob(
        self, request: agent_pb2.SignalSubjobRequest, context: Ctx
    ) -> common_pb2.Subjob:
        return await self._node.signal(
            request.subjob_id,
            request.signal,
            request.reason,
            request.grace_seconds,
            cause=end_cause(request.end_cause),
        )

    @map_errors
    async def ReadLogs(
        self, request: agent_pb2.ReadLogsRequest, context: Ctx
    ) -> agent_pb2.ReadLogsReply:
        check_str(request.subjob_id, "subjob_id", required=True)
        return self._node.reads.read_logs(
            request.subjob_id, request.stream, request.offset, request.max_bytes
        )

    @map_errors
    async def Drain(self, request: agent_pb2.DrainRequest, context: Ctx) -> agent_pb2.DrainReply:
        check_str(request.reason, "reason", max_chars=1024)
        self._state.set_draining(True, request.reason)
        return agent_pb2.DrainReply(draining=True, running_subjobs=len(self._node.live_states))

    @map_errors
    async def Undrain(self, request: agent_pb2.DrainRequest, context: Ctx) -> agent_pb2.DrainReply:
        check_str(request.reason, "reason", max_chars=1024)
        self._state.set_draining(False, request.reason)
        return agent_pb2.DrainReply(draining=False, running_subjobs=len(self._node.live_states))

    @map_errors
    async def GetAirlock(
        self, request: agent_pb2.GetAirlockRequest, context: Ctx
    ) -> agent_pb2.AirlockState:
        readings = await self._state.read_memory()
        return self._state.airlock_message(min(request.max_actions, 1000), readings)

    @map_errors
    async def InjectLoad(
        self, request: agent_pb2.InjectLoadRequest, context: Ctx
    ) -> agent_pb2.InjectLoadReply:
        fake = self._state.fake_backend
        if fake is None and not self._debug_rpcs:
            raise FailedPrecondition(
                "InjectLoad is a debug call, served only with inventory.gpu_backend = fake "
                "or server.debug_rpcs = true (--debug-rpcs)",
                field="server.debug_rpcs",
            )
        if fake is None:
            raise FailedPrecondition(
                f"the {self._state.backend.name} backend cannot simulate load; InjectLoad "
                "needs inventory.gpu_backend = fake",
                field="inventory.gpu_backend",
            )
        check_str(request.slice_id, "slice_id")
        check_number(request.duration_seconds, "duration_seconds", high=7 * 86400)
        if request.gpu_index >= len(fake.gpus()):
            raise NotFound(f"no GPU with index {request.gpu_index}", field="gpu_index")
        # A slice id (``gpu0/3g.40gb@0``, as `laminar airlock` shows) or a device UUID.
        by_name = {s.slice_id: s.device_uuid for s in self._state.node.slices}
        device = by_name.get(request.slice_id, request.slice_id)
        injected = fake.inject(
            gpu_index=request.gpu_index,
            device_uuid=device or None,
            used_bytes=request.used_bytes,
            add=request.add,
            duration_seconds=request.duration_seconds,
        )
        return agent_pb2.InjectLoadReply(injected_bytes=injected)
