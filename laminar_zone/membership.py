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
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from laminar_api.v1 import zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_base.grpcutil import check_str
from laminar_base.wire import workload_message
from laminar_zone.jobs import ZoneState
from laminar_zone.reports import AgentReports


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
