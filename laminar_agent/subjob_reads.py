"""What the agent's API reads about subjobs: one, a list, the event stream, their logs.

The journal holds every subjob and transition; this module turns rows into the API's
messages (adding what only memory knows: GPU memory in use and its peak) and serves the
event stream that heartbeats and ``WatchSubjobs`` read. No decision is made here; the node
(:mod:`laminar_agent.node`) owns the state and wakes the event stream's waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence

from laminar_agent.core import TERMINAL_STATES, AgentCore
from laminar_agent.executor import Executor, check_subjob_id
from laminar_agent.journal import Journal, SubjobRow
from laminar_api.v1 import agent_pb2, common_pb2
from laminar_base.causes import EndCause, cause_from_token
from laminar_base.errors import InvalidArgument, NotFound
from laminar_base.grpcutil import check_count, check_str

#: Largest integer SQLite (and a file offset) holds; uint64 fields above it are refused.
MAX_SQLITE_INT = 2**63 - 1


class SubjobReads:
    """Subjobs as the API shows them, read from the journal."""

    def __init__(
        self,
        agent_id: str,
        journal: Journal,
        executor: Executor,
        core: AgentCore,
        waiters: set[asyncio.Event],
        kept_row: Callable[[str], SubjobRow | None] = lambda _subjob_id: None,
    ) -> None:
        """``waiters``: the node's set of events set on every journaled transition;
        ``kept_row``: a subjob's committed row where memory holds it (the carrier's, so a
        commit's reply and each event's message read no journal), else None."""
        self._kept_row = kept_row
        self._agent_id = agent_id
        self._journal = journal
        self._executor = executor
        self._core = core
        self._waiters = waiters

    def find(self, subjob_id: str) -> SubjobRow | None:
        """A subjob's journal row (None: no such subjob), from memory where it is kept.
        The caller must not change it."""
        row = self._kept_row(subjob_id)
        return self._journal.get_subjob(subjob_id) if row is None else row

    def row(self, subjob_id: str) -> SubjobRow:
        row = self.find(subjob_id)
        if row is None:
            raise NotFound(f"no subjob {subjob_id!r} on agent {self._agent_id}", field="subjob_id")
        return row

    def message(self, subjob_id: str) -> common_pb2.Subjob:
        return self._to_message(self.row(subjob_id))

    def _to_message(self, row: SubjobRow) -> common_pb2.Subjob:
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        return common_pb2.Subjob(
            spec=spec,
            agent_id=self._agent_id,
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
                row.peak_gpu_memory_bytes, self._core.peak_gpu_memory_bytes(row.subjob_id)
            ),
            gpu_memory_used_bytes=self._core.gpu_memory_bytes(row.subjob_id),
            pid=row.pid,
            stdout_path=self._executor.log_path(row.subjob_id, "stdout"),
            stderr_path=self._executor.log_path(row.subjob_id, "stderr"),
            lease_id=row.lease_id,
            units_done=row.units_done,
        )

    def list(self, job_id: str, states: Sequence[int], limit: int) -> list[common_pb2.Subjob]:
        check_str(job_id, "job_id")
        check_count(states, "states", max_items=64)
        for state in states:
            if state not in common_pb2.SubjobState.values():
                raise InvalidArgument(f"unknown subjob state {state}", field="states")
        names = [common_pb2.SubjobState.Name(s) for s in states] if states else None
        rows = self._journal.subjobs(states=names, job_id=job_id or None)
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
        self._waiters.add(waiter)
        try:
            while True:
                waiter.clear()
                for event in self._journal.events_after(seq, 500):
                    seq = event.seq
                    message = self.event_message(
                        event.seq, event.subjob_id, event.state, event.reason, event.at_unix, job_id
                    )
                    if message is not None:
                        yield message
                await waiter.wait()
        finally:
            self._waiters.discard(waiter)

    def event_message(
        self, seq: int, subjob_id: str, state: str, reason: str, at_unix: float, job_id: str = ""
    ) -> common_pb2.SubjobEvent | None:
        """One journaled transition as an API event (the subjob as it is now, state as it was)."""
        row = self.find(subjob_id)
        if row is None or (job_id and row.job_id != job_id):
            return None
        message = self._to_message(row)
        message.state = common_pb2.SubjobState.Value(state)  # type: ignore[assignment]
        message.reason = reason
        if state not in TERMINAL_STATES:  # the row may have ended since this transition
            message.end_cause = EndCause.UNSPECIFIED.wire
        return common_pb2.SubjobEvent(seq=seq, subjob=message, at_unix=at_unix)

    def read_logs(
        self, subjob_id: str, stream: str, offset: int, max_bytes: int
    ) -> agent_pb2.ReadLogsReply:
        check_subjob_id(subjob_id, "subjob_id")  # an id, never a path
        row = self.row(subjob_id)
        if stream not in ("", "stdout", "stderr"):
            raise InvalidArgument("must be stdout or stderr", field="stream")
        if offset > MAX_SQLITE_INT:
            raise InvalidArgument(f"must be <= {MAX_SQLITE_INT}, got {offset}", field="offset")
        path = self._executor.subjob_dir(subjob_id) / (stream or "stdout")
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
