"""What submitters and operators read from the router, and the agent operations it relays.

Jobs (one, a page, a watch stream), a subjob's logs (read from the agent that holds them),
usage per tenant, agents and their drain state. Nothing here decides placement or a job's
course: it reads :class:`laminar_zone.jobs.ZoneState` and answers, so the state module keeps
only the job lifecycle. The servicer (:mod:`laminar_zone.service`) checks the caller first.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator

import grpc

from laminar_api.v1 import agent_pb2, zone_pb2
from laminar_base.causes import TERMINAL_JOB_STATES
from laminar_base.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from laminar_base.grpcutil import check_number, check_str
from laminar_zone.jobs import ZoneState
from laminar_zone.placements import COMMITTING, fresh
from laminar_zone.view import AgentRecord

log = logging.getLogger("laminar.zone.queries")

#: Most jobs one ListJobs page holds, and the bytes a page stays under (replies must fit
#: the default 4 MiB gRPC message limit with room to spare).
MAX_LIST_PAGE = 1000
LIST_PAGE_BYTES = 3 * 1024 * 1024


def _encode_page_token(submitted_unix: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(f"{submitted_unix!r}|{job_id}".encode()).decode()


def _decode_page_token(token: str) -> tuple[float, str]:
    try:
        when, _, job_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
        return float(when), job_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("is not a token ListJobs returned", field="page_token") from None


class ZoneQueries:
    """Reads of the zone's jobs and agents, and the agent calls an operator asks for."""

    def __init__(self, state: ZoneState) -> None:
        self._state = state

    def list(
        self, tenant: str, states: list[int], limit: int, page_token: str = ""
    ) -> zone_pb2.ListJobsReply:
        """One page of jobs, newest first, at most ``limit`` (1000) and never more than
        :data:`LIST_PAGE_BYTES` of them, with the token of the next page."""
        check_str(tenant, "tenant")
        check_str(page_token, "page_token", max_chars=256)
        for s in states:
            if s not in zone_pb2.JobState.values() or s == 0:
                raise InvalidArgument(f"unknown job state {s}", field="states")
        limit = min(limit or MAX_LIST_PAGE, MAX_LIST_PAGE)
        before = _decode_page_token(page_token) if page_token else None
        # Live jobs change in memory first; the journal has everything else (with the
        # tick's grouped writes committed, so a job's row matches its state filter).
        self._state.persistence.flush()
        out = self._state.store.query(tenant, states, limit + 1, before)
        reply = zone_pb2.ListJobsReply()
        size = 0
        for i, stored in enumerate(out):
            job = fresh(
                self._state.entries[stored.job_id].job
                if stored.job_id in self._state.entries
                else stored
            )
            size += job.ByteSize() + 8
            if i == limit or (reply.jobs and size > LIST_PAGE_BYTES):
                last = reply.jobs[-1]
                reply.next_page_token = _encode_page_token(last.submitted_unix, last.job_id)
                break
            reply.jobs.append(job)
        return reply

    async def watch(self, job_id: str) -> AsyncIterator[zone_pb2.Job]:
        """The job now, then each change until it ends. The watcher's queue is in place
        before the first record goes out: while the client receives it the job may change,
        or end and leave memory, and the stream must still carry that to its last state."""
        job = self._state.get(job_id)
        if job_id in self._state.arrays:
            async for update in self._watch_array(job):
                yield update
            return
        entry = self._state.entries.get(job_id)
        if entry is None or job.state in TERMINAL_JOB_STATES:
            yield job
            return
        queue: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
        entry.watchers.append(queue)
        try:
            yield job
            last = job
            while True:
                update = newest(await queue.get(), queue)
                if update == last:  # a write that changed nothing the watcher sees
                    continue
                yield update
                if update.state in TERMINAL_JOB_STATES:
                    return
                last = update
        finally:
            if queue in entry.watchers:
                entry.watchers.remove(queue)

    async def _watch_array(self, job: zone_pb2.Job) -> AsyncIterator[zone_pb2.Job]:
        """An array's record now, then each time one of its elements changes, until it
        ends (the queue in place before the first record goes out, as in :meth:`watch`)."""
        queue: asyncio.Queue[zone_pb2.Job] = asyncio.Queue()
        watchers = self._state.array_watchers.setdefault(job.job_id, [])
        watchers.append(queue)
        last = job
        try:
            yield job
            while last.state not in TERMINAL_JOB_STATES:
                await queue.get()
                update = self._state.get(job.job_id)
                if (update.state, update.reason) != (last.state, last.reason):
                    yield update
                last = update
        finally:
            watchers.remove(queue)
            if not watchers:
                self._state.array_watchers.pop(job.job_id, None)

    async def logs(
        self, job_id: str, subjob_id: str, stream: str, offset: int, max_bytes: int
    ) -> zone_pb2.GetLogsReply:
        job = self._state.get(job_id)
        check_str(subjob_id, "subjob_id")
        if stream not in ("", "stdout", "stderr"):
            raise InvalidArgument("must be stdout or stderr", field="stream")
        started = [p for p in job.placements if p.reason != COMMITTING]
        if subjob_id:
            started = [p for p in started if p.subjob_id == subjob_id]
            if not started:
                raise NotFound(f"job {job_id} has no subjob {subjob_id!r}", field="subjob_id")
        if not started:
            raise FailedPrecondition(f"job {job_id} has not started yet", field="job_id")
        placement = started[-1]
        record = self._state.view.agents.get(placement.agent_id)
        address = record.address if record is not None else placement.agent_address
        try:
            reply = await self._state.clients.stub(address).ReadLogs(
                agent_pb2.ReadLogsRequest(
                    subjob_id=placement.subjob_id,
                    stream=stream or "stdout",
                    offset=offset,
                    max_bytes=max_bytes,
                ),
                timeout=self._state.config.placement.rpc_timeout_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(
                f"agent {placement.agent_id} holding the logs is unreachable: {exc.details()}"
            ) from None
        return zone_pb2.GetLogsReply(
            data=reply.data,
            next_offset=reply.next_offset,
            eof=reply.eof,
            subjob_id=placement.subjob_id,
        )

    def usage(self, tenant: str, since_unix: float) -> zone_pb2.GetUsageReply:
        """Usage per tenant and slice kind since ``since_unix``: ended subjobs and running ones."""
        check_str(tenant, "tenant")
        check_number(since_unix, "since_unix", high=1e11)
        live = (e.job for e in self._state.entries.values())
        records = self._state.usage_ledger.report(tenant, since_unix, live, time.time())
        return zone_pb2.GetUsageReply(records=records)

    def resolve_agent(self, name: str) -> AgentRecord:
        check_str(name, "agent", required=True)
        record = self._state.view.agents.get(name)
        if record is not None:
            return record
        for r in self._state.view.agents.values():
            if name in (r.hostname, r.address):
                return r
        raise NotFound(f"no agent {name!r} in zone {self._state.zone_name}", field="agent")

    def agent_info(self, record: AgentRecord) -> zone_pb2.AgentInfo:
        state = {
            "ready": zone_pb2.AGENT_READY,
            "stale": zone_pb2.AGENT_STALE,
            "draining": zone_pb2.AGENT_DRAINING,
        }[record.status.value]
        info = zone_pb2.AgentInfo(
            agent_id=record.agent_id,
            address=record.address,
            state=state,
            last_heartbeat_unix=record.last_heartbeat_unix,
            hostname=record.hostname,
        )
        s = info.summary
        s.agent_id = record.agent_id
        s.address = record.address
        s.draining = record.draining
        s.running_subjobs = record.running_subjobs
        s.total_gpus = record.total_gpus
        s.hostname = record.hostname
        s.pressure = record.pressure  # type: ignore[assignment]
        for shape, cap in sorted(record.shapes.items()):
            s.shapes.add(
                shape=shape,
                free=cap.free,
                total=cap.total,
                max_free_milli=cap.max_free_milli,
                max_free_memory_bytes=cap.max_free_memory_bytes,
            )
        return info

    async def drain(self, name: str, reason: str, draining: bool) -> zone_pb2.AgentInfo:
        check_str(reason, "reason", max_chars=1024)
        record = self.resolve_agent(name)
        stub = self._state.clients.stub(record.address)
        request = agent_pb2.DrainRequest(reason=reason or "requested through the zone")
        try:
            if draining:
                await stub.Drain(request, timeout=self._state.config.placement.rpc_timeout_seconds)
            else:
                await stub.Undrain(
                    request, timeout=self._state.config.placement.rpc_timeout_seconds
                )
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"agent {record.agent_id} is unreachable: {exc.details()}") from None
        self._state.view.set_draining(record.agent_id, draining)
        log.info(
            "agent %s %s: %s", record.agent_id, "draining" if draining else "undrained", reason
        )
        if not draining:
            self._state.queue_wake.set()
        return self.agent_info(record)


def newest(update: zone_pb2.Job, queue: asyncio.Queue[zone_pb2.Job]) -> zone_pb2.Job:
    """The newest of ``update`` and the updates queued behind it, up to the first terminal
    one: a watcher slower than the job gets its latest state in one message, not every
    state it went through, and still the terminal state that ends its watch (a job's
    record may change after it ended: a subjob's end confirmed later)."""
    while update.state not in TERMINAL_JOB_STATES and not queue.empty():
        update = queue.get_nowait()
    return update
