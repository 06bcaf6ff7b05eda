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

import grpc

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    TERMINAL_JOB_STATES,
    EndCause,
    end_cause,
)
from laminar_base.errors import PermissionDenied
from laminar_base.grpcutil import check_str
from laminar_zone.entry import Entry
from laminar_zone.failures import outcome_unknown
from laminar_zone.jobs import MAX_LIVE_IDS, ZoneState
from laminar_zone.lifecycle import Record, Report, job_of, judge_report, rigid_subjob_id
from laminar_zone.placements import (
    COMMITTING,
    READDRESSED,
    copy_subjob,
    note_true_end,
    state_name,
)
from laminar_zone.placer import Ask, host_from, shapes_from
from laminar_zone.view import AgentRecord

log = logging.getLogger("laminar.zone.reports")

LIVE_SUBJOB = LIVE_SUBJOB_STATES
ENDED_SUBJOB = ENDED_SUBJOB_STATES


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
        )
        host = host_from(summary)
        if host is not None:
            self.state.view.note_host(agent_id, host)
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
        """The agent lists the subjobs it runs: stop each copy this router no longer
        counts on (declared lost and retried, superseded, of an ended or unknown job),
        as :func:`~laminar_zone.lifecycle.judge_report` decides for a live report."""
        for subjob_id in live_ids[:MAX_LIVE_IDS]:
            if not isinstance(subjob_id, str) or len(subjob_id) > 256:
                continue
            entry = self.state.entries.get(job_of(subjob_id))
            p = None
            if entry is not None:
                p = next((p for p in entry.job.placements if p.subjob_id == subjob_id), None)
            verdict = judge_report(
                Record(p.agent_id, p.state, p.attempt) if p is not None else None,
                agent_id,
                entry.job.attempts if entry is not None else 0,
                entry is None or entry.job.state in TERMINAL_JOB_STATES,
                common_pb2.RUNNING,
            )
            if verdict in (Report.STOP, Report.APPLY_AND_STOP):
                why = (
                    f"superseded: the router replaced this copy ({p.reason})"
                    if p is not None and p.state in ENDED_SUBJOB
                    else "superseded: the job moved on or is unknown to the router"
                )
                self.state.stop_copy(agent_id, subjob_id, why, f"reconciling agent {agent_id}")

    def _holds(self, agent_id: str, job_id: str, subjob_id: str) -> bool:
        """Whether ``agent_id`` holds (or held) the placement of ``subjob_id`` of ``job_id``."""
        entry = self.state.entries.get(job_id)
        return entry is not None and any(
            p.subjob_id == subjob_id and p.agent_id == agent_id for p in entry.job.placements
        )

    def _start_readdress(self, agent_id: str, subjob_id: str) -> None:
        """Airlock asks to move a long-suspended subjob: place a copy, then stop the old one."""
        check_str(subjob_id, "readdress_subjob_ids")
        job_id = job_of(subjob_id)
        entry = self.state.entries.get(job_id)
        if entry is None or subjob_id in self.state.readdressing:
            return
        placement = next((p for p in entry.current() if p.subjob_id == subjob_id), None)
        if placement is None or placement.agent_id != agent_id:
            return
        if placement.state not in LIVE_SUBJOB:
            return
        if any(
            p is not placement and p.member == placement.member and p.state in LIVE_SUBJOB
            for p in entry.current()
        ):
            return  # a move of this member is under way (or awaits its agent's word)
        if max(1, entry.job.spec.gang_size) > 1:
            log.info("not re-addressing %s: gang members move together only by retry", subjob_id)
            return
        if (
            job_id in self.state.atomizer.atoms
        ):  # back to the market: it resumes from its checkpoint
            why = f"{READDRESSED} Airlock suspended it too long on {agent_id}; back to the market"
            self.state.spawn(
                self.state.terminate(placement, why, EndCause.READDRESSED), f"readdress-{subjob_id}"
            )
            return
        self.state.readdressing.add(subjob_id)
        self.state.spawn(self._readdress(entry, placement, agent_id), f"readdress-{subjob_id}")

    async def _readdress(self, entry: Entry, old: zone_pb2.Placement, agent_id: str) -> None:
        job = entry.job
        try:
            gathered = await self.state.placer.gather(
                Ask(
                    job_id=job.job_id,
                    resources=job.spec.resources,
                    gang_size=1,
                    priority=job.spec.priority or common_pb2.BATCH,
                    value=job.spec.value,
                    tenant=job.spec.tenant,
                ),
                exclude={agent_id},
            )
            if gathered.chosen is None or job.state in TERMINAL_JOB_STATES:
                if gathered.chosen:
                    await self.state.placer.release(gathered.chosen)
                log.info(
                    "re-addressing %s: no other host now (%s)", old.subjob_id, gathered.reasons[-1:]
                )
                return
            ((record, lease),) = gathered.chosen
            moves = sum(
                1 for p in job.placements if p.member == old.member and p.attempt == old.attempt
            )
            new = zone_pb2.Placement(
                subjob_id=rigid_subjob_id(job.job_id, old.attempt, old.member, moves),
                agent_id=record.agent_id,
                agent_address=record.address,
                slice_ids=list(lease.slice_ids),
                member=old.member,
                state=common_pb2.STARTING,
                reason=COMMITTING,
                attempt=old.attempt,
            )
            job.placements.append(new)
            self.state.by_agent.setdefault(record.agent_id, set()).add(job.job_id)
            self.state.save(entry)
            placement = job.placements[-1]
            try:
                await self.state.commit_placement(
                    entry, placement, lease, env={"LAMINAR_READDRESS_COUNT": str(moves)}
                )
            except grpc.aio.AioRpcError as exc:
                if placement.reason != COMMITTING:
                    pass  # its agent reported it before the lost reply: it ran, the move is done
                elif outcome_unknown(exc):
                    # No answer: the agent may run the copy. Ask it at its next report; till
                    # then the copy counts as live, so the member is not moved again.
                    self.state.unconfirmed.setdefault(placement.agent_id, set()).add(job.job_id)
                    self.state.save(entry)
                    return
                else:
                    placement.state = common_pb2.FAILED
                    placement.end_cause = EndCause.READDRESSED.wire
                    placement.reason = f"{READDRESSED} commit of the copy failed: {exc.details()}"
                    self.state.save(entry)
                    return
            await self.state.retire_moved(entry, old, placement)
        finally:
            self.state.readdressing.discard(old.subjob_id)

    def _apply_event(self, agent_id: str, subjob: common_pb2.Subjob) -> Entry | None:
        """Carry out :func:`~laminar_zone.lifecycle.judge_report` on one subjob event;
        returns the job's entry when its record changed (the caller evaluates it)."""
        subjob_id = subjob.spec.subjob_id
        job_id = subjob.spec.job_id or job_of(subjob_id)
        entry = self.state.entries.get(job_id)
        # A job no longer in memory has ended: its journal record decides.
        job = entry.job if entry is not None else self.state.store.get(job_id) if job_id else None
        p = None
        if job is not None:
            p = next((p for p in job.placements if p.subjob_id == subjob_id), None)
        verdict = judge_report(
            Record(p.agent_id, p.state, p.attempt) if p is not None else None,
            agent_id,
            job.attempts if job is not None else 0,
            job is None or job.state in TERMINAL_JOB_STATES,
            subjob.state,
        )
        if verdict is Report.IGNORE:
            if p is not None and p.agent_id != agent_id:
                log.warning(
                    "ignoring an event for subjob %s from agent %s: it is placed on %s",
                    subjob_id,
                    agent_id,
                    p.agent_id,
                )
            return None
        if verdict is Report.STOP:
            why = (
                f"superseded: the router replaced this copy ({p.reason})"
                if p is not None
                else "superseded: its job has ended or is unknown to the router"
            )
            self.state.stop_copy(agent_id, subjob_id, why)
            return None
        assert job is not None and p is not None
        if verdict is Report.TRUE_END:
            if entry is None:
                note_true_end(p, subjob)
            else:
                self._record_true_end(entry, p, subjob)
        else:
            copy_subjob(p, subjob)
            if verdict is Report.APPLY_AND_STOP:
                self.state.stop_copy(agent_id, subjob_id, "superseded: the job moved on")
        if entry is None:
            self.state.store.put(job)  # an ended job: only its record changes
        return entry

    def _record_true_end(
        self, entry: Entry, p: zone_pb2.Placement, subjob: common_pb2.Subjob
    ) -> None:
        """A copy declared LOST while its agent was out of touch reports how it really
        ended: the record says so. If it succeeded and the job has not ended, it wins:
        the retry still running is stopped, the retry spent on it is given back, and the
        job succeeds (first finisher wins; gangs, which retry as a whole, excepted)."""
        note_true_end(p, subjob)
        job = entry.job
        log.info(
            "subjob %s of job %s declared lost ended %s on %s",
            p.subjob_id,
            job.job_id,
            state_name(subjob.state),
            p.agent_id,
        )
        if (
            subjob.state != common_pb2.SUCCEEDED
            or job.state in TERMINAL_JOB_STATES
            or max(1, job.spec.gang_size) > 1
            or job.job_id in self.state.atomizer.atoms
        ):
            return
        why = f"superseded: copy {p.subjob_id} on {p.agent_id} succeeded first"
        for other in job.placements:
            if other is not p and other.state in LIVE_SUBJOB:
                self.state.spawn(
                    self.state.terminate(other, why, EndCause.SUPERSEDED), "first-finisher"
                )
        if job.retries_used > 0 and p.attempt < job.attempts:
            job.retries_used -= 1
        self.state.finish(
            entry, zone_pb2.JOB_SUCCEEDED, f"subjob {p.subjob_id} succeeded (reported late)"
        )

    async def _verify_unconfirmed(self, record: AgentRecord) -> None:
        """Commits whose outcome is unknown (in flight at a crash, or unanswered): did the
        agent start them? Ask it; a copy the job no longer counts on is stopped."""
        job_ids = self.state.unconfirmed.pop(record.agent_id, set())
        stub = self.state.clients.stub(record.address)
        for job_id in job_ids:
            entry = self.state.entries.get(job_id)
            if entry is None:
                continue
            job = entry.job
            for p in job.placements:
                if (
                    p.agent_id != record.agent_id
                    or p.reason != COMMITTING
                    or p.state not in LIVE_SUBJOB
                ):
                    continue
                # Live copies of the same member made before this one: it was a move.
                older = [
                    q
                    for q in job.placements[: list(job.placements).index(p)]
                    if q.member == p.member and q.attempt == p.attempt and q.state in LIVE_SUBJOB
                ]
                try:
                    subjob = await stub.GetSubjob(
                        agent_pb2.GetSubjobRequest(subjob_id=p.subjob_id), timeout=5
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        self.state.unconfirmed.setdefault(record.agent_id, set()).add(job_id)
                        continue
                    p.state = common_pb2.FAILED
                    # A move's copy that never started leaves the member where it was.
                    cause = EndCause.READDRESSED if older else EndCause.COMMIT_UNCONFIRMED
                    p.end_cause = cause.wire
                    p.reason = "commit unconfirmed: the agent never started it"
                    p.ended_unix = time.time()
                else:
                    copy_subjob(p, subjob)
                    moved_on = p.attempt != job.attempts or job.state in TERMINAL_JOB_STATES
                    if moved_on and p.state in LIVE_SUBJOB:
                        self.state.stop_copy(
                            p.agent_id, p.subjob_id, "superseded: the job moved on"
                        )

            self.state.evaluate(entry)
            self.state.save(entry)
            self.state.forget_if_done(entry)
        self.state.queue_wake.set()
