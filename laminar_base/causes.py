"""One vocabulary for how subjobs and jobs end: the end causes and the state sets.

A subjob's end is decided on by its cause (``EndCause.READDRESSED``), a value that travels
on the wire (``Subjob.end_cause``, ``Placement.end_cause``, ``SignalSubjobRequest.end_cause``)
and in the agent's journal. The reason string beside it is built for people, with the
numbers, and is never parsed. Every question the routers and tools ask of an end (is the
retry free, did Airlock take the work, should the atomization profile widen) is answered
here, from the cause, and nowhere else.

What this does not cover: ends recorded before causes existed carry ``UNSPECIFIED`` and are
treated as the job's own (a counted retry, no Airlock loss), which is the conservative side.
"""

from __future__ import annotations

import enum
from typing import cast

from laminar_api.v1 import common_pb2, zone_pb2


class EndCause(enum.IntEnum):
    """Why a subjob ended; the same numbers as ``laminar.v1.EndCause`` on the wire."""

    UNSPECIFIED = common_pb2.END_CAUSE_UNSPECIFIED
    EXITED = common_pb2.END_CAUSE_EXITED
    LAUNCH_FAILED = common_pb2.END_CAUSE_LAUNCH_FAILED
    CANCELLED = common_pb2.END_CAUSE_CANCELLED
    PREEMPTED = common_pb2.END_CAUSE_PREEMPTED
    RECLAIMED = common_pb2.END_CAUSE_RECLAIMED
    READDRESSED = common_pb2.END_CAUSE_READDRESSED
    SUPERSEDED = common_pb2.END_CAUSE_SUPERSEDED
    GANG_STOPPED = common_pb2.END_CAUSE_GANG_STOPPED
    COMMIT_FAILED = common_pb2.END_CAUSE_COMMIT_FAILED
    COMMIT_UNCONFIRMED = common_pb2.END_CAUSE_COMMIT_UNCONFIRMED
    OVERRAN = common_pb2.END_CAUSE_OVERRAN
    FENCED = common_pb2.END_CAUSE_FENCED
    LOST = common_pb2.END_CAUSE_LOST
    TERMINATED = common_pb2.END_CAUSE_TERMINATED
    GPU_FAILED = common_pb2.END_CAUSE_GPU_FAILED
    TIME_LIMIT = common_pb2.END_CAUSE_TIME_LIMIT

    @property
    def token(self) -> str:
        """The short lower-case name users read and type (``readdressed``); ``""`` when
        unspecified."""
        return "" if self is EndCause.UNSPECIFIED else self.name.lower()

    @property
    def wire(self) -> common_pb2.EndCause:
        """The value for a protobuf ``end_cause`` field."""
        return cast("common_pb2.EndCause", int(self))


def end_cause(value: int) -> EndCause:
    """The cause of a wire value; a value this build does not know (a newer peer) reads as
    ``UNSPECIFIED``, so it is treated like an end without a cause rather than refused."""
    try:
        return EndCause(value)
    except ValueError:
        return EndCause.UNSPECIFIED


def cause_from_token(token: str) -> EndCause:
    """The cause a journal or a user names by its token (``""`` is ``UNSPECIFIED``)."""
    if not token:
        return EndCause.UNSPECIFIED
    try:
        return EndCause[token.upper()]
    except KeyError:
        return EndCause.UNSPECIFIED


#: Ends that are not the job's fault: its retry is not counted, and an atomized job's
#: profile is left alone. Preempted, readdressed, commit-unconfirmed and GPU-failed ends
#: are free on both paths; superseded and cancelled ends were free only for atomized jobs.
#: A rigid job never decides on those two (a superseded copy belongs to an attempt that
#: moved on, a cancelled job has ended), so one list serves both without changing either.
#: A gang's rollback (``COMMIT_FAILED``) ends an attempt, rigid or atomized, so no job
#: decides on it either; it is listed so that its member that never started (``FAILED``)
#: costs an atomized job nothing, as the rollback's started member (``KILLED``) never did.
FREE_RETRY_CAUSES = frozenset(
    {
        EndCause.PREEMPTED,
        EndCause.READDRESSED,
        EndCause.COMMIT_UNCONFIRMED,
        EndCause.COMMIT_FAILED,
        EndCause.SUPERSEDED,
        EndCause.CANCELLED,
        EndCause.GPU_FAILED,
    }
)
#: Ends that fail the job whatever retries it has left: running it again would end the
#: same way (it ran past its time limit).
FINAL_CAUSES = frozenset({EndCause.TIME_LIMIT})
#: Ends where Airlock, or a preemption for a more important class, took the work: the run
#: since the last checkpoint is counted as lost GPU time.
AIRLOCK_LOSS_CAUSES = frozenset({EndCause.RECLAIMED, EndCause.PREEMPTED, EndCause.READDRESSED})
#: Atomized ends that show its profile was too tight, so the profile is widened: in time
#: (overran its window) or in memory (Airlock reclaimed it).
WIDENING_CAUSES = frozenset({EndCause.OVERRAN, EndCause.RECLAIMED})


def is_free_retry(cause: int) -> bool:
    """Whether an end with this cause retries its job without using one of its retries."""
    return end_cause(cause) in FREE_RETRY_CAUSES


def is_final(cause: int) -> bool:
    """Whether an end with this cause fails its job with no retry (:data:`FINAL_CAUSES`)."""
    return end_cause(cause) in FINAL_CAUSES


def is_airlock_loss(cause: int) -> bool:
    """Whether Airlock (or a preemption) took the work of a subjob that ended so."""
    return end_cause(cause) in AIRLOCK_LOSS_CAUSES


def widens_profile(cause: int) -> bool:
    """Whether an atomized subjob that ended so widens its job's profile."""
    return end_cause(cause) in WIDENING_CAUSES


# -- states ------------------------------------------------------------------------------

#: Subjob states that hold slices and may still change.
LIVE_SUBJOB_STATES = frozenset({common_pb2.STARTING, common_pb2.RUNNING, common_pb2.SUSPENDED})
#: Subjob states it never leaves.
ENDED_SUBJOB_STATES = frozenset(
    {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}
)
#: Ended subjob states that are not a success: the job retries or fails.
FAILED_SUBJOB_STATES = frozenset({common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST})
#: The same terminal states by name, as the agent's journal stores them.
ENDED_SUBJOB_STATE_NAMES = frozenset(common_pb2.SubjobState.Name(s) for s in ENDED_SUBJOB_STATES)

#: A job holding slices: running, or running with a subjob Airlock suspended.
RUNNING_JOB_STATES = frozenset({zone_pb2.JOB_RUNNING, zone_pb2.JOB_SUSPENDED})
#: A job's own end in this zone: it succeeded, failed or was cancelled.
FINISHED_JOB_STATES = frozenset(
    {zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED}
)
#: States in which this zone is done with a job: finished, or handed to a peer zone.
TERMINAL_JOB_STATES = FINISHED_JOB_STATES | {zone_pb2.FORWARDED}

__all__ = [
    "AIRLOCK_LOSS_CAUSES",
    "ENDED_SUBJOB_STATES",
    "ENDED_SUBJOB_STATE_NAMES",
    "FAILED_SUBJOB_STATES",
    "FINAL_CAUSES",
    "FINISHED_JOB_STATES",
    "FREE_RETRY_CAUSES",
    "LIVE_SUBJOB_STATES",
    "RUNNING_JOB_STATES",
    "TERMINAL_JOB_STATES",
    "WIDENING_CAUSES",
    "EndCause",
    "cause_from_token",
    "end_cause",
    "is_airlock_loss",
    "is_final",
    "is_free_retry",
    "widens_profile",
]
