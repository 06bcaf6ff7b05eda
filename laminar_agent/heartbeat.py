"""Heartbeats to the zone router: capacity summary, unacknowledged subjob events, Airlock
actions and the subjobs Airlock wants re-placed.

Events stay in the journal until the router acknowledges their sequence number,
so a router restart or a lost reply never loses a subjob's end. Airlock actions
are sent the same way (``acked_action_seq``, kept in the journal's meta table);
a router that answers a heartbeat carrying actions with ``acked_action_seq`` 0
does not keep them, so until it acknowledges one each action is sent only once.
``readdress_subjob_ids`` is the full current list on every heartbeat: a subjob is
on it from Airlock's re-address decision until it ends. A subjob event wakes the
loop at once instead of waiting for the next period, but heartbeats that events wake
are at least ``event_gap_seconds`` apart (``zone.heartbeat_event_gap_seconds``), so a burst
of subjob starts and ends travels in a few heartbeats rather than one each, while the first
event after a quieter spell goes at once.

The fence (``fence_file``) is rewritten after an acknowledged heartbeat only when the new
deadline is later than the one on disk by :data:`FENCE_RENEW_FRACTION` of the lease: an
earlier deadline on disk only stops fenced work sooner, never later, so skipping a small
extension is safe, and a burst of woken heartbeats does not fsync the file each time. The
write and its fsync run in a worker thread, one at a time, the newest deadline winning:
the fsync blocked the event loop (and every probe and launch on it) for milliseconds. Until
it lands the file holds the older deadline, which again only stops work sooner; a shorter
lease (a deadline moved back) lands milliseconds after the reply, far within the lease the
router counts from. Not covered: a write that hangs in the kernel holds later ones, and the
fence then lapses on disk (subjobs stop rather than run twice).

Delta heartbeats: the summary is sent only when it changed (:func:`summary_key`
tells), on the first heartbeat after a start, and when the router's reply does
not hold the agent's current ``summary_version`` (a router restart, an old
router, an agent it had declared stale). Otherwise a heartbeat with nothing
else to carry names the agent and the version only, and the router just
refreshes its liveness. A router that refused such a delta has not heard from
us: the fence is not renewed and the full summary goes at once. After a failed
heartbeat that carried the summary, a router known to keep versions is assumed
to hold it (an overloaded router answers late, and resending full summaries
keeps it overloaded); if it does not, it refuses the next delta.

Heartbeat stream: the client first opens the router's Heartbeats stream and
sends the same requests over it, one reply each, but a delta goes only every
``liveness_seconds`` (the router's reply says how often; the summary is still
looked at every period and events still wake the loop, so a change goes at
once). A router without the stream (UNIMPLEMENTED, an older one or
``membership.stream = false``) gets the unary Heartbeat from then on; any other
failure closes the stream, counts as a failed heartbeat and a new stream opens a
period later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import grpc

from laminar_agent.core import EVENT_GAP_SECONDS, event_hold
from laminar_agent.jobfiles import write_private
from laminar_agent.journal import ActionRow, EventRow
from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.causes import cause_from_token
from laminar_base.fragmentation import PodShape
from laminar_base.grpcutil import channel_options
from laminar_base.security import INSECURE, Trust
from laminar_base.wire import workload_counts

log = logging.getLogger("laminar.agent.heartbeat")

MAX_EVENTS_PER_HEARTBEAT = 500
#: Bytes of events one heartbeat carries at most (the rest wait for the next, sent at once):
#: a heartbeat must stay far below the router's message size limit, whatever the jobs.
MAX_EVENT_BYTES_PER_HEARTBEAT = 1024 * 1024
MAX_ACTIONS_PER_HEARTBEAT = 200
ACKED_ACTION_META = "acked_action_seq"


#: Most live subjob ids one heartbeat lists (an agent runs far fewer).
MAX_LIVE_IDS = 4096


class HeartbeatJournal(Protocol):
    """What heartbeats read and write in the agent's journal (:class:`Journal` is one; the
    heartbeat benchmark's agents keep an empty one in memory)."""

    def unacked_events(self, limit: int = ...) -> list[EventRow]: ...
    def ack_events(self, up_to_seq: int) -> int: ...
    def actions_after(self, seq: int, limit: int = ...) -> list[ActionRow]: ...
    def get_meta(self, key: str, default: str | None = ...) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...


def summary_key(summary: common_pb2.AgentSummary) -> bytes:
    """What the router would learn from ``summary``: its bytes less what changes on every
    call without news (the generation, when it was built, and the start of windows open
    from now, which the router reads as "now" either way)."""
    key = common_pb2.AgentSummary()
    key.CopyFrom(summary)
    key.ClearField("generation")
    key.ClearField("generated_unix")
    for window in key.windows:
        if window.start_unix <= summary.generated_unix:
            window.start_unix = 0.0
    return key.SerializeToString(deterministic=True)


#: A fence deadline is rewritten when it moves by at least this share of the fence lease.
FENCE_RENEW_FRACTION = 0.1


def write_fence(path: Path, deadline_mono: float) -> None:
    """Write the fence deadline (root-only, atomic, fsynced)."""
    write_private(path, f"{deadline_mono:.3f}\n", durable=True)


class StreamEnded(Exception):
    """The router closed the heartbeat stream without an error status."""


class HeartbeatClient:
    def __init__(
        self,
        zone_address: str,
        period_seconds: float,
        summary: Callable[[], common_pb2.AgentSummary],
        journal: HeartbeatJournal,
        to_event: Callable[[int, str, str, str, float], common_pb2.SubjobEvent | None],
        *,
        readdress_ids: Callable[[], list[str]] | None = None,
        trust: Trust = INSECURE,
        fence_file: Path | None = None,
        live_ids: Callable[[], list[str]] | None = None,
        on_workload: Callable[[Counter[PodShape]], None] | None = None,
        use_stream: bool = True,
        extra_channel_options: list[tuple[str, Any]] | None = None,
        event_gap_seconds: float = EVENT_GAP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fence_file``: where the fence deadline goes (the shims read it); ``live_ids``:
        the live subjob ids, sent on the first heartbeat and whenever the router asks;
        ``use_stream``: try the Heartbeats stream first (off: unary heartbeats only);
        ``event_gap_seconds``: least time between two heartbeats that events woke;
        ``clock``: CLOCK_MONOTONIC seconds (the fence file holds a deadline on it)."""
        self.use_stream = use_stream
        self.event_gap_seconds = event_gap_seconds
        self._clock = clock
        #: When the last pass that an event woke began (after its hold).
        self._woken_at = float("-inf")
        self._extra_channel_options = list(extra_channel_options or ())
        #: How long the stream may stay silent with nothing new (the router's reply says).
        self.liveness_seconds = period_seconds
        #: Heartbeats (requests) and streams opened over the stream, for tests and benches.
        self.streamed = 0
        self.streams_opened = 0
        self.zone_address = zone_address
        self._trust = trust
        self.period_seconds = period_seconds
        self._summary = summary
        self._journal = journal
        self._to_event = to_event
        self._readdress_ids = readdress_ids
        self._fence_file = fence_file
        self._live_ids = live_ids
        #: The router's target workload this agent scores by (``on_workload`` applies a
        #: new one); 0 until the router sends one.
        self._on_workload = on_workload
        self.workload_version = 0
        #: Send the live subjob ids with the next heartbeat (first one, or asked).
        self._send_live_ids = live_ids is not None
        #: Highest action seq sent so far, and whether the router acknowledges actions.
        self._sent_action_seq = 0
        self._router_acks_actions = True
        #: The summary's content (summary_key) and its version, which changes with it.
        self._summary_key = b""
        self.summary_version = 0
        #: The version the router's last reply said it holds (0: send the summary).
        self._router_version = 0
        #: The router has acknowledged a version: it understands delta heartbeats.
        self._router_keeps_versions = False
        self.wake = asyncio.Event()
        self.sent = 0
        #: Heartbeats sent without the summary (the router only refreshed liveness).
        self.deltas = 0
        self.failures = 0
        #: The last heartbeat left events behind (size bound): send the next one at once.
        self.more_events = False
        #: The fence deadline on disk (monotonic; 0: none written by this process).
        self.fence_written = 0.0
        #: The deadline the fence is being brought to (0: removed; None: not known, as at
        #: start, where an earlier process may have left one); its writer task.
        self._fence_target: float | None = None
        self._fence_writer: asyncio.Task[None] | None = None

    async def run(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Heartbeat until ``stop``; ``beat`` is called once per pass (root-loop progress)."""
        options = channel_options() + self._extra_channel_options
        try:
            async with self._trust.aio_channel(self.zone_address, options) as channel:
                stub = zone_pb2_grpc.ZoneControlStub(channel)
                if self.use_stream:
                    await self._run_stream(stub, stop, beat)
                while not stop.is_set():
                    beat()
                    await self.beat(stub)
                    self.wake.clear()
                    if self.more_events and not self.failures:
                        continue
                    await self._wait(stop)
        finally:
            await self.fence_settled()

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until the next pass: a period, an event, or ``stop``. A pass an event wakes
        within ``event_gap_seconds`` of the last one an event woke waits out the rest of the
        gap, so a burst's events gather; periodic passes do not count, so the first event
        after a quieter spell goes at once."""
        waiters = [
            asyncio.create_task(stop.wait(), name="heartbeat-stop"),
            asyncio.create_task(self.wake.wait(), name="heartbeat-wake"),
        ]
        await asyncio.wait(
            waiters, timeout=self.period_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        for task in waiters:
            task.cancel()
        if not self.wake.is_set() or stop.is_set():
            return
        held = event_hold(self._clock(), self._woken_at, self.event_gap_seconds)
        if held > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), held)
        self._woken_at = self._clock()

    async def _run_stream(
        self, stub: zone_pb2_grpc.ZoneControlStub, stop: asyncio.Event, beat: Callable[[], None]
    ) -> None:
        """Heartbeat over the Heartbeats stream until ``stop``; returns early, with
        :attr:`use_stream` off, when the router does not implement it."""
        while not stop.is_set():
            # The generated stubs type the call for the blocking API; this is the aio one.
            call: Any = stub.Heartbeats()  # type: ignore[call-arg]
            # A stream the router ends (a shutdown, a restart) wakes the loop: an idle agent
            # would otherwise notice only when it next speaks, a liveness period later.
            call.add_done_callback(lambda _call: self.wake.set())
            self.streams_opened += 1
            try:
                await self._drive_stream(call, stop, beat)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info(
                        "zone %s has no heartbeat stream (%s): heartbeats go one call each",
                        self.zone_address,
                        exc.details(),
                    )
                    self.use_stream = False
                    return
                self._note_failure(exc.code().name, exc.details() or "")
            except (TimeoutError, StreamEnded) as exc:
                self._note_failure(
                    "DEADLINE_EXCEEDED" if isinstance(exc, TimeoutError) else "EOF", str(exc)
                )
            finally:
                call.cancel()
            if not stop.is_set():  # a new stream a period later, as the next heartbeat
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.period_seconds)

    async def _drive_stream(
        self,
        call: Any,
        stop: asyncio.Event,
        beat: Callable[[], None],
    ) -> None:
        """One stream: a request when something changed or the liveness period is up."""
        last_sent = float("-inf")  # a new stream speaks at once: it names the agent
        while not stop.is_set():
            if call.done():
                code, details = await call.code(), await call.details()
                raise StreamEnded(f"the router ended the heartbeat stream: {code.name} {details}")
            beat()
            now = self._clock()
            request, is_delta = self._request()
            if not is_delta or now - last_sent >= self.liveness_seconds:
                await call.write(request)
                # Closing the stream makes the router mark us stale at once, so a slow
                # reply gets longer than a unary call would (still far within the fence).
                patience = max(1.0, self.period_seconds, self.liveness_seconds / 2)
                reply = await asyncio.wait_for(call.read(), patience)
                if reply is grpc.aio.EOF:  # type: ignore[attr-defined]
                    raise StreamEnded("the router ended the heartbeat stream")
                assert isinstance(reply, zone_pb2.HeartbeatReply)
                last_sent = now
                self.streamed += 1
                self._recovered()
                self._apply(request, is_delta, reply, now)
                self.liveness_seconds = reply.liveness_seconds or self.period_seconds
            self.wake.clear()
            if self.more_events:
                continue
            await self._wait(stop)

    def _note_failure(self, code: str, details: str) -> None:
        self.failures += 1
        if self.failures in (1, 10) or self.failures % 100 == 0:
            log.warning(
                "heartbeat to zone %s failed (%d in a row): %s %s",
                self.zone_address,
                self.failures,
                code,
                details,
            )

    def _recovered(self) -> None:
        if self.failures:
            log.info(
                "heartbeat to zone %s restored after %d failures", self.zone_address, self.failures
            )
        self.failures = 0

    def _renew_fence(self, sent_mono: float, lease_seconds: float) -> None:
        """After an acknowledged heartbeat, running subjobs may go on until ``sent_mono``
        (when the heartbeat left, so the router heard from us after it) plus the lease the
        router gives; a router that gives none turns fencing off. The file is written off
        the event loop (:meth:`_write_fence`)."""
        if self._fence_file is None:
            return
        target = sent_mono + lease_seconds if lease_seconds > 0 else 0.0
        current = self._fence_target
        if current is not None:
            if target == current == 0.0:
                return  # fencing stays off
            if lease_seconds > 0 and 0 <= target - current < FENCE_RENEW_FRACTION * lease_seconds:
                # On disk is at most a tenth of the lease earlier: it only stops work sooner.
                # (A shorter lease than before moves it back at once.)
                return
        self._fence_target = target
        if self._fence_writer is None or self._fence_writer.done():
            self._fence_writer = asyncio.get_running_loop().create_task(
                self._write_fence(self._fence_file), name="agent-fence-write"
            )

    async def _write_fence(self, path: Path) -> None:
        """Bring the fence file to the newest target, one write at a time, in a thread."""
        while (target := self._fence_target) is not None:
            try:
                if target > 0:
                    await asyncio.to_thread(write_fence, path, target)
                else:
                    await asyncio.to_thread(path.unlink, missing_ok=True)
            except OSError as exc:  # the fence then lapses: subjobs stop rather than run twice
                log.error("cannot renew the fence %s: %s", path, exc)
                self._fence_target = None  # unknown: the next heartbeat writes it again
                return
            self.fence_written = target
            if self._fence_target == target:
                return

    async def fence_settled(self) -> None:
        """Until the fence write under way (if any) has landed (tests; shutdown)."""
        if self._fence_writer is not None:
            await asyncio.shield(self._fence_writer)

    async def beat(self, stub: zone_pb2_grpc.ZoneControlStub) -> None:
        """One unary heartbeat and what its reply says (a pass of :meth:`run`)."""
        request, is_delta = self._request()
        sent_mono = self._clock()
        try:
            reply = await stub.Heartbeat(request, timeout=max(1.0, self.period_seconds))  # type: ignore[misc]
        except grpc.aio.AioRpcError as exc:
            # A router that keeps versions most likely kept this summary (an overloaded one
            # answers past the deadline): the next heartbeat is a delta, which it refuses if
            # not. Full summaries again and again are what an overloaded router can least
            # afford. A router that never acknowledged a version never gets a delta.
            if self._router_keeps_versions and request.HasField("summary"):
                self._router_version = request.summary_version
            self._note_failure(exc.code().name, exc.details() or "")
            return
        self._recovered()
        self._apply(request, is_delta, reply, sent_mono)

    def _request(self) -> tuple[zone_pb2.HeartbeatRequest, bool]:
        """The next heartbeat, and whether it is a delta (liveness only)."""
        summary = self._summary()
        key = summary_key(summary)
        if key != self._summary_key:
            self._summary_key = key
            self.summary_version += 1
        request = zone_pb2.HeartbeatRequest(
            summary_version=self.summary_version, workload_version=self.workload_version
        )
        self.more_events = False
        size = 0
        for row in self._journal.unacked_events(MAX_EVENTS_PER_HEARTBEAT):
            event = self._to_event(row.seq, row.subjob_id, row.state, row.reason, row.at_unix)
            if event is None:
                continue
            # The router has the job's spec: the command and environment are not sent
            # again with every transition.
            event.subjob.spec.ClearField("command")
            event.subjob.spec.ClearField("env")
            size += event.ByteSize()
            if request.events and size > MAX_EVENT_BYTES_PER_HEARTBEAT:
                self.more_events = True  # the rest go in the next heartbeat, sent at once
                break
            request.events.append(event)
        acked_actions = int(self._journal.get_meta(ACKED_ACTION_META) or "0")
        cursor = acked_actions if self._router_acks_actions else self._sent_action_seq
        for action in self._journal.actions_after(
            max(cursor, acked_actions), MAX_ACTIONS_PER_HEARTBEAT
        ):
            request.airlock_actions.append(action_message(action))
        if self._readdress_ids is not None:
            request.readdress_subjob_ids.extend(self._readdress_ids())
        if self._send_live_ids and self._live_ids is not None:
            request.live_subjob_ids.extend(self._live_ids()[:MAX_LIVE_IDS])
            request.has_live_subjob_ids = True
        is_delta = self._router_version == self.summary_version and not (
            request.events
            or request.airlock_actions
            or request.readdress_subjob_ids
            or request.has_live_subjob_ids
        )
        if is_delta:
            request.agent_id = summary.agent_id
        else:
            request.summary.CopyFrom(summary)
        return request, is_delta

    def _apply(
        self,
        request: zone_pb2.HeartbeatRequest,
        is_delta: bool,
        reply: zone_pb2.HeartbeatReply,
        sent_mono: float,
    ) -> None:
        """What an acknowledged heartbeat's reply says (unary or streamed)."""
        acked_actions = int(self._journal.get_meta(ACKED_ACTION_META) or "0")
        self.sent += 1
        self._router_version = reply.summary_version
        self._router_keeps_versions |= reply.summary_version > 0
        if reply.workload_version and reply.workload_version != self.workload_version:
            # The router's target workload changed: score by it as the router ranks by it.
            self.workload_version = reply.workload_version
            if self._on_workload is not None:
                self._on_workload(workload_counts(reply.workload))
        if is_delta:
            if reply.summary_version != request.summary_version:
                # Refused: the router holds no summary of ours to refresh. It has not
                # counted this heartbeat, so the fence stays as it was; the summary goes now.
                self.more_events = True
                return
            self.deltas += 1
        if request.has_live_subjob_ids:
            self._send_live_ids = False
        if reply.want_live_subjobs and self._live_ids is not None:
            self._send_live_ids = True
            self.more_events = True  # answer at once
        self._renew_fence(sent_mono, reply.fence_lease_seconds)
        if reply.acked_seq:
            self._journal.ack_events(reply.acked_seq)
        sent_max = max((a.seq for a in request.airlock_actions), default=0)
        if sent_max:
            self._sent_action_seq = max(self._sent_action_seq, sent_max)
            self._router_acks_actions = reply.acked_action_seq > 0
        if reply.acked_action_seq > acked_actions:
            self._journal.set_meta(
                ACKED_ACTION_META,
                str(min(reply.acked_action_seq, max(self._sent_action_seq, acked_actions))),
            )
        if reply.period_seconds > 0:
            self.period_seconds = reply.period_seconds


def action_message(row: ActionRow) -> agent_pb2.AirlockAction:
    """One journaled Airlock action as the API shows it (GetAirlock and heartbeats)."""
    return agent_pb2.AirlockAction(
        seq=row.seq,
        at_unix=row.at_unix,
        step=row.step,
        subjob_id=row.subjob_id,
        job_id=row.job_id,
        slice_id=row.slice_id,
        reason=row.reason,
        bytes_freed=row.bytes_freed,
        dry_run=row.dry_run,
        end_cause=cause_from_token(row.end_cause).wire,
    )
