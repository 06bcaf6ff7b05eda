"""Heartbeats at the router: what a full one changes, and the O(1) path of a delta one.

An agent sends its summary only when it changed (see
:mod:`laminar_agent.heartbeat`); a heartbeat with nothing new names the agent
and the version of the summary the router holds, and the router only moves
that agent's liveness (:meth:`ZoneView.refresh`): no summary is parsed or
rebuilt, no index touched, nothing scanned. Staleness, loss and the fence are
decided from that same liveness by the periodic sweep, exactly as before.

A full heartbeat goes to :meth:`AgentReports.on_heartbeat` as it always did; the
router then keeps the summary's version and says so in the reply, which is
what lets the agent send deltas (an old router never says so; an old agent
never sends a version). A delta the view cannot vouch for (a router restart,
an agent declared stale, another version, another certificate) is refused
with ``summary_version`` 0: the agent sends its summary at once, and the full
path does every check again and raises what it finds.

The Heartbeats stream carries the same requests and replies, one reply per
request; :class:`HeartbeatStream` ties a stream to the agent it speaks for. An
agent on a stream sends when something changed and otherwise every
``liveness_seconds`` (the reply tells it), so an idle agent costs the router one
message per liveness period instead of one call per heartbeat period. What
bounds staleness then:

- the agent process dies (crash, SIGKILL, OOM): its socket closes, the stream
  ends and the agent is stale at once, sooner than the periodic bound;
- the host dies, the network parts, or the agent's event loop hangs with its
  process alive (its gRPC core still answers HTTP/2 pings): nothing closes the
  stream, and the agent is stale after liveness_seconds plus stale_after_periods - 1
  periods of silence (14 s by default, against 3 s over unary heartbeats). The
  router's keepalive pings (laminar_zone.server.keepalive_options) only reap such
  connections later; pinging every period would bound them as before but costs
  about as much as the heartbeats it replaces. A hung agent is also restarted by
  its systemd watchdog, which closes its stream.

Fence and loss are unchanged: both run from the last acknowledged heartbeat, and
the liveness period is at most half the fence lease: an idle agent renews its
fence at least twice per lease, and one that fails retries a period later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from laminar_api.v1 import zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_base.grpcutil import check_str
from laminar_base.wire import workload_message
from laminar_zone.jobs import ZoneState
from laminar_zone.reports import AgentReports

log = logging.getLogger("laminar.zone.membership")


class HeartbeatStream:
    """One agent's Heartbeats stream at the router: the agent it speaks for, known from its
    first request (a stream for another agent than its first is refused)."""

    __slots__ = ("agent_id",)

    def __init__(self) -> None:
        self.agent_id = ""


class Membership:
    def __init__(self, state: ZoneState) -> None:
        self._state = state
        #: Applies what a full heartbeat reports (events, actions, live subjobs).
        self.reports = AgentReports(state)
        self._view = state.view
        self._allowed = frozenset(state.config.auth.agent_ids)
        self._period_seconds = state.config.membership.heartbeat_seconds
        self._fence_lease_seconds = state.config.membership.fence_lease_seconds()
        self._zone = state.zone_name
        self._heartbeats = state.metrics.heartbeats
        self._summaries = state.metrics.heartbeat_summaries
        membership = state.config.membership
        self._liveness_seconds = membership.liveness_seconds()
        #: Silence allowed to an agent on a stream before the sweep marks it stale: the slack
        #: unary heartbeats get (stale_after_periods less the one period they are apart)
        #: after the liveness period, so a liveness of one period is the unary bound.
        self._stream_silence_seconds = (
            self._liveness_seconds + membership.stale_after_seconds() - membership.heartbeat_seconds
        )
        #: The open stream of each agent on one (a newer stream replaces an older one).
        self.streams: dict[str, HeartbeatStream] = {}
        #: The router is shutting down: streams that end do not make their agents stale.
        self.is_closing = False

    def on_heartbeat(
        self,
        request: zone_pb2.HeartbeatRequest,
        caller: str = "",
        caller_names: Sequence[str] = (),
    ) -> zone_pb2.HeartbeatReply:
        """One heartbeat (``caller``, ``caller_names``: as for AgentReports.on_heartbeat)."""
        if not request.HasField("summary"):
            reply = self._refresh(request, caller, caller_names)
        else:
            reply = self.reports.on_heartbeat(request, caller, caller_names)
            self._summaries.inc()
            record = self._view.agents.get(request.summary.agent_id)
            if record is not None:
                record.summary_version = request.summary_version
                reply.summary_version = request.summary_version
        # The agent scores by the workload the router ranks by: send it when it changed.
        workload = self._state.placer.workload
        if workload.version and request.workload_version != workload.version:
            reply.workload_version = workload.version
            reply.workload.extend(workload_message(workload.counts))
        return reply

    def _refresh(
        self, request: zone_pb2.HeartbeatRequest, caller: str, caller_names: Sequence[str]
    ) -> zone_pb2.HeartbeatReply:
        """A delta heartbeat: liveness only, O(1); refused (version 0) when in doubt."""
        if (
            request.events
            or request.airlock_actions
            or request.readdress_subjob_ids
            or request.has_live_subjob_ids
        ):
            raise InvalidArgument(
                "required on a heartbeat that carries events, actions or subjob ids",
                field="summary",
            )
        agent_id = check_str(request.agent_id, "agent_id", required=True)
        self._heartbeats.inc()
        vouched = (
            (not self._allowed or agent_id in self._allowed)
            and (not caller_names or agent_id in caller_names)
            and self._view.refresh(
                agent_id, request.summary_version, caller, time.monotonic(), time.time()
            )
        )
        if not vouched:
            # Not counted as heard from, so no fence lease: send the summary.
            return zone_pb2.HeartbeatReply(period_seconds=self._period_seconds, zone=self._zone)
        return zone_pb2.HeartbeatReply(
            period_seconds=self._period_seconds,
            zone=self._zone,
            fence_lease_seconds=self._fence_lease_seconds,
            summary_version=request.summary_version,
        )

    def on_stream_heartbeat(
        self,
        stream: HeartbeatStream,
        request: zone_pb2.HeartbeatRequest,
        caller: str = "",
        caller_names: Sequence[str] = (),
    ) -> zone_pb2.HeartbeatReply:
        """One request on a Heartbeats stream: :meth:`on_heartbeat`, and the agent is known
        to be on ``stream`` (it may stay silent for the liveness period; it is stale when
        the stream ends)."""
        agent_id = request.summary.agent_id if request.HasField("summary") else request.agent_id
        if stream.agent_id and agent_id != stream.agent_id:
            raise InvalidArgument(
                f"this stream speaks for agent {stream.agent_id!r}, not {agent_id!r}",
                field="agent_id",
            )
        reply = self.on_heartbeat(request, caller, caller_names)
        record = self._view.agents.get(agent_id)
        if record is not None and reply.summary_version:
            # Accepted: from now on the stream vouches for the agent between messages (a
            # newer stream of the agent's replaces an older one).
            stream.agent_id = agent_id
            self.streams[agent_id] = stream
            record.silence_allowed_seconds = self._stream_silence_seconds
            reply.liveness_seconds = self._liveness_seconds
        return reply

    def close_stream(self, stream: HeartbeatStream) -> None:
        """The stream ended (the agent closed it, died, or its host stopped answering
        keepalive pings): the agent is stale now, unless a newer stream speaks for it."""
        agent_id = stream.agent_id
        if not agent_id or self.streams.get(agent_id) is not stream:
            return
        del self.streams[agent_id]
        record = self._view.agents.get(agent_id)
        if record is None or self.is_closing:
            return
        record.silence_allowed_seconds = 0.0
        if self._view.mark_stale(agent_id) is not None:
            log.warning(
                "agent %s stale: its heartbeat stream ended %.1f s after its last heartbeat; "
                "no more probes to it",
                agent_id,
                time.monotonic() - record.last_heartbeat,
            )
