"""A job's placements as the router records them, with no I/O: copies handed out, a
member's start and end copied from its agent's subjob. (Which failed calls may still have
been carried out: :mod:`laminar_zone.failures`.)"""

from __future__ import annotations

from collections.abc import Sequence

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    EndCause,
    end_cause,
)
from laminar_zone.lifecycle import MemberState
from laminar_zone.reasons import Reason, set_reason

#: The reason of a placement journaled before its Commit (or the probe carrying it) went
#: out: whether the agent took it is not known yet.
COMMITTING = "committing"
#: Reason prefix, for people, of a copy moved elsewhere; its cause is EndCause.READDRESSED.
READDRESSED = "readdressed:"


def fresh(job: zone_pb2.Job) -> zone_pb2.Job:
    """A copy of ``job`` to hand out: what watchers and callers get never changes under them."""
    copy = zone_pb2.Job()
    copy.CopyFrom(job)
    return copy


def placement_of(job: zone_pb2.Job | None, subjob_id: str) -> zone_pb2.Placement | None:
    """The placement of ``job`` (None: gone) named ``subjob_id``, or None."""
    if job is None:
        return None
    return next((p for p in job.placements if p.subjob_id == subjob_id), None)


def now_running(job: zone_pb2.Job, now_unix: float) -> None:
    """Every member committed: a job still pending (not cancelled meanwhile) runs."""
    if job.state == zone_pb2.PENDING:
        job.state = zone_pb2.JOB_RUNNING
        set_reason(job, Reason.NONE, "")
        job.started_unix = job.started_unix or now_unix
        job.queue_position = 0
        job.expected_start_unix = 0


def moves_from_live_copy(older: Sequence[zone_pb2.Placement], p: zone_pb2.Placement) -> bool:
    """Whether ``p`` is a move's copy: a copy of its member in its attempt placed before it
    (``older``) lives."""
    return any(
        q.member == p.member and q.attempt == p.attempt and q.state in LIVE_SUBJOB_STATES
        for q in older
    )


def member_states(current: list[zone_pb2.Placement]) -> list[MemberState]:
    return [MemberState(p.state, p.end_cause, p.reason == COMMITTING, p.member) for p in current]


def apply_start_reply(p: zone_pb2.Placement, subjob: common_pb2.Subjob) -> bool:
    """Record the subjob a Commit (or a probe carrying it) answered with, unless the
    placement already ended: the agent's report of its end reached the router first (a
    short subjob, a reply held behind a batch), and a reply is older than any report.
    Returns whether the reply was applied."""
    if p.state in ENDED_SUBJOB_STATES and subjob.state not in ENDED_SUBJOB_STATES:
        if not p.slice_ids:
            p.slice_ids.extend(subjob.slice_ids)
        return False
    copy_subjob(p, subjob)
    return True


def copy_subjob(p: zone_pb2.Placement, subjob: common_pb2.Subjob) -> None:
    p.state = subjob.state
    p.reason = subjob.reason
    ended = subjob.state in ENDED_SUBJOB_STATES
    p.end_cause = (end_cause(subjob.end_cause) if ended else EndCause.UNSPECIFIED).wire
    p.exit_code = subjob.exit_code
    if subjob.slice_ids:
        del p.slice_ids[:]
        p.slice_ids.extend(subjob.slice_ids)
    p.started_unix = subjob.started_unix
    p.ended_unix = subjob.ended_unix
    p.run_seconds = subjob.run_seconds
    p.suspended_seconds = subjob.suspended_seconds
    p.peak_gpu_memory_bytes = subjob.peak_gpu_memory_bytes
    p.unit_start = subjob.spec.unit_start
    p.unit_count = subjob.spec.unit_count
    p.units_done = subjob.units_done


def note_true_end(p: zone_pb2.Placement, subjob: common_pb2.Subjob) -> None:
    """Record how a copy declared LOST really ended, keeping why it was declared lost."""
    lost_reason = p.reason
    copy_subjob(p, subjob)
    p.reason = f"{subjob.reason} (reported after the agent came back; declared lost: {lost_reason})"


def state_name(state: int) -> str:
    return common_pb2.SubjobState.Name(state).lower()
