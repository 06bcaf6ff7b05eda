"""What agents report to the router, and what the router does about it.

A full heartbeat (see :mod:`laminar_zone.membership` for the delta path) carries the
agent's summary, its subjob events, its Airlock actions, the subjobs Airlock wants moved
and, after a gap, every subjob it runs. :class:`AgentReports` applies them to the jobs
:class:`~laminar_zone.jobs.ZoneState` holds: each report is judged by
:func:`~laminar_zone.lifecycle.judge_report` (record it, stop a copy nothing counts on, a
lost copy's true end), each changed job by :meth:`ZoneState.evaluate`; re-address
requests place a copy elsewhere and retire the old one; commits whose outcome is unknown
are confirmed with the agent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import EndCause, end_cause
from laminar_base.errors import PermissionDenied
from laminar_base.grpcutil import check_str
from laminar_zone.entry import Entry
from laminar_zone.failures import failure_of
from laminar_zone.jobs import MAX_LIVE_IDS, ZoneState
from laminar_zone.lifecycle import job_of
from laminar_zone.placer import host_from, shapes_from
from laminar_zone.trying import (
    AskSubjob,
    DoInstructions,
    confirm_steps,
    readdress_steps,
)
from laminar_zone.view import AgentRecord

log = logging.getLogger("laminar.zone.reports")


class AgentReports:
    """Carries out what agents report (ZoneState keeps the jobs; this reads and changes
    them as agents say)."""

    def __init__(self, state: ZoneState) -> None:
        self.state = state

    def on_heartbeat(
        self,
        request: zone_pb2.HeartbeatRequest,
        caller: str = "",
        caller_names: Sequence[str] = (),
    ) -> zone_pb2.HeartbeatReply:
        """An agent's heartbeat. ``caller`` is its mTLS certificate name and
        ``caller_names`` every name the certificate carries: an agent id must be one of
        them, and is bound to the certificate of its first heartbeat (for this router's
        lifetime), so another certificate the CA signed cannot speak for it."""
        summary = request.summary
        agent_id = check_str(summary.agent_id, "summary.agent_id", required=True)
        address = check_str(summary.address, "summary.address", required=True)
        allowed = self.state.config.auth.agent_ids
        if allowed and agent_id not in allowed:
            raise PermissionDenied(
                f"agent id {agent_id!r} is not in auth.agent_ids", field="summary.agent_id"
            )
        if caller_names and agent_id not in caller_names:
            raise PermissionDenied(
                f"certificate {caller!r} does not name agent {agent_id!r}: an agent "
                "heartbeats with a certificate issued for its agent id",
                field="summary.agent_id",
            )
        known = self.state.view.agents.get(agent_id)
        if caller and known is not None and known.identity and known.identity != caller:
            raise PermissionDenied(
                f"agent {agent_id} heartbeats with certificate {known.identity!r}, not {caller!r}",
                field="summary.agent_id",
            )
        update = self.state.view.update(
            agent_id,
            address,
            shapes_from(summary),
            heat=summary.pending_probes + summary.active_leases,
            draining=summary.draining,
            now=time.monotonic(),
            now_unix=time.time(),
            hostname=summary.hostname,
            running_subjobs=summary.running_subjobs,
            total_gpus=summary.total_gpus,
            pressure=summary.pressure,
            generation=summary.generation,
            host=host_from(summary),
        )
        if update.is_new or update.came_back:
            self.state.store.note_agent(agent_id, address, time.time())
            log.info(
                "agent %s %s at %s (%d GPUs)",
                agent_id,
                "joined" if update.is_new else "is back",
                address,
                summary.total_gpus,
            )
        if caller and not update.record.identity:
            update.record.identity = caller
        self.state.atomizer.note_windows(agent_id, summary.windows)
        if agent_id in self.state.unconfirmed:
            self.state.spawn(self._verify_unconfirmed(update.record), f"verify-{agent_id}")
        # Decided before the events apply, which may end and forget a job.
        own_actions = {
            a.seq for a in request.airlock_actions if self._holds(agent_id, a.job_id, a.subjob_id)
        }
        touched: dict[str, Entry] = {}
        acked = 0
        for event in request.events:
            acked = max(acked, event.seq)
            entry = self._apply_event(agent_id, event.subjob)
            if entry is not None:
                touched[entry.job.job_id] = entry
        for entry in touched.values():
            self.state.evaluate(entry)
        if touched:
            self.state.save_many(list(touched.values()))
        for subjob_id in request.readdress_subjob_ids:
            self._start_readdress(agent_id, subjob_id)
        if update.freed or touched:
            self.state.queue_wake.set()
        acked_actions = 0
        for action in request.airlock_actions:
            acked_actions = max(acked_actions, action.seq)
            if action.seq not in own_actions:
                log.warning(
                    "ignoring an Airlock action on subjob %s from agent %s: not placed there",
                    action.subjob_id,
                    agent_id,
                )
                continue
            if action.step == "reclaim" and not action.dry_run and self.state.audit is not None:
                self.state.audit.append(
                    f"airlock@{agent_id}",
                    "preemption"
                    if end_cause(action.end_cause) is EndCause.PREEMPTED
                    else "reclamation",
                    f"{action.job_id}/{action.subjob_id}",
                    action.reason,
                    agent_seq=action.seq,
                )
            log.info(
                "airlock on %s: %s%s subjob %s on %s: %s (freed %d bytes)",
                agent_id,
                "would " if action.dry_run else "",
                action.step,
                action.subjob_id,
                action.slice_id or "host",
                action.reason,
                action.bytes_freed,
            )
        if request.has_live_subjob_ids:
            self._reconcile(agent_id, list(request.live_subjob_ids))
        self.state.metrics.heartbeats.inc()
        return zone_pb2.HeartbeatReply(
            acked_seq=acked,
            period_seconds=self.state.config.membership.heartbeat_seconds,
            zone=self.state.zone_name,
            acked_action_seq=acked_actions,
            fence_lease_seconds=self.state.config.membership.fence_lease_seconds(),
            # After a gap (or a restart of either side) compare live subjobs.
            want_live_subjobs=(update.is_new or update.came_back)
            and not request.has_live_subjob_ids,
        )

    def _reconcile(self, agent_id: str, live_ids: list[str]) -> None:
        """The agent lists the subjobs it runs: the core stops each copy this router no
        longer counts on (:meth:`~laminar_zone.core.ZoneCore.reconcile`)."""
        ids = [
            subjob_id
            for subjob_id in live_ids[:MAX_LIVE_IDS]
            if isinstance(subjob_id, str) and len(subjob_id) <= 256
        ]
        self.state._do(self.state.core.reconcile(agent_id, ids))

    def _holds(self, agent_id: str, job_id: str, subjob_id: str) -> bool:
        """Whether ``agent_id`` holds (or held) the placement of ``subjob_id`` of ``job_id``."""
        entry = self.state.entries.get(job_id)
        return entry is not None and any(
            p.subjob_id == subjob_id and p.agent_id == agent_id for p in entry.job.placements
        )

    def _start_readdress(self, agent_id: str, subjob_id: str) -> None:
        """Airlock asks to move a long-suspended subjob: place a copy, then stop the old one
        (:func:`~laminar_zone.trying.readdress_steps` strings the steps). Whether it moves is
        decided now, within this heartbeat (a second ask waits for this move); the rest
        runs as a task."""
        check_str(subjob_id, "readdress_subjob_ids")
        steps = readdress_steps(
            self.state.core,
            agent_id,
            subjob_id,
            lease_ttl_seconds=self.state.config.placement.lease_ttl_seconds,
            clock=time.time,
        )
        try:
            step = next(steps)
            while isinstance(step, DoInstructions):
                self.state._do(step.instructions)
                step = steps.send(None)
        except StopIteration:
            return
        # The gather over every other agent and the copy's Commit, each awaited.
        self.state.spawn(self.state.tries.drive(steps, step), f"readdress-{subjob_id}")

    def _apply_event(self, agent_id: str, subjob: common_pb2.Subjob) -> Entry | None:
        """Carry out the core's judgement of one subjob event
        (:meth:`~laminar_zone.core.ZoneCore.report`); returns the job's entry when its
        record changed (the caller evaluates it)."""
        job_id = subjob.spec.job_id or job_of(subjob.spec.subjob_id)
        # A job no longer in memory has ended: its journal record decides.
        ended_job = None
        if job_id not in self.state.entries and job_id:
            ended_job = self.state.store.get(job_id)
        entry, ended_changed, instructions = self.state.core.report(
            agent_id, subjob, ended_job, time.time()
        )
        self.state._do(instructions)
        if ended_changed and ended_job is not None:
            self.state.store.put(ended_job)  # an ended job: only its record changes
        return entry

    async def _verify_unconfirmed(self, record: AgentRecord) -> None:
        """Commits whose outcome is unknown (in flight at a crash, or unanswered): did the
        agent start them? Ask it (:func:`laminar_zone.trying.confirm_steps` strings the
        questions and what the core makes of the answers)."""
        stub = self.state.clients.stub(record.address)
        steps = confirm_steps(self.state.core, record.agent_id, clock=time.time)
        answer: Any = None
        try:
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration:
                    return
                answer = None
                match step:
                    case AskSubjob(p):
                        try:
                            answer = await stub.GetSubjob(
                                agent_pb2.GetSubjobRequest(subjob_id=p.subjob_id), timeout=5
                            )
                        except grpc.aio.AioRpcError as exc:
                            if exc.code() != grpc.StatusCode.NOT_FOUND:
                                answer = failure_of(exc)
                    case DoInstructions(instructions):
                        self.state._do(instructions)
        finally:
            steps.close()
