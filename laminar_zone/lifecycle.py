"""What a rigid job's current attempt amounts to, decided from its subjobs alone (no I/O).

The router's :meth:`ZoneState.evaluate` asks :func:`judge_attempt` each time a subjob of
the job changes, and carries the verdict out: finish the job, stop the gang's other
members, place a retry, or show it running or suspended. Gangs are all-or-nothing: the
job succeeds only when every member succeeded, and one member's failure stops the rest.
Whether a retry counts against ``max_retries`` comes from the failed member's end cause
(:func:`laminar_base.causes.is_free_retry`), never from its reason text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from laminar_api.v1 import common_pb2
from laminar_base.causes import (
    FAILED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    is_final,
    is_free_retry,
)


class Outcome(enum.Enum):
    WAIT = "wait"  # nothing to change yet (no subjob, a commit under way, members starting)
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED = "failed"
    RUNNING = "running"  # every member running (some may be suspended) or done


@dataclass(frozen=True)
class MemberState:
    """One subjob of the current attempt."""

    state: int
    end_cause: int = 0
    committing: bool = False
    #: The gang member it runs; None: its position among the attempt's subjobs. An Airlock
    #: move leaves two copies of one member (the one moved from, and the one moved to).
    member: int | None = None


def _started(copy: MemberState) -> bool:
    """Whether the router knows the copy started: its commit was answered or its agent
    reported it, live or ended. A copy declared LOST may never have started."""
    return not copy.committing and copy.state != common_pb2.LOST


def taken_over(copies: Sequence[MemberState]) -> dict[int, int]:
    """The copies (by position) that a later copy of the same member took over from, each
    with the position of the latest such copy. Once a move's copy has started, the member
    is that copy, however it ends or has ended (before its move was done, or before a
    router restart cut the move short); the copy it moved from no longer counts, whether
    it still runs (the router retires it) or ended on its own meanwhile."""
    members = [i if c.member is None else c.member for i, c in enumerate(copies)]
    latest: dict[int, int] = {}
    for i, copy in enumerate(copies):
        if _started(copy):
            latest[members[i]] = i
    return {i: latest[m] for i, m in enumerate(members) if latest.get(m, i) > i}


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    #: RETRY: whether it counts against ``max_retries`` (False: a free retry).
    counted: bool = False
    #: RETRY or FAILED: the member whose end decided it.
    failed_member: int | None = None
    #: Members still live that must be stopped (the gang is all-or-nothing).
    stop: tuple[int, ...] = ()
    #: RUNNING: how many members Airlock holds suspended.
    suspended: int = 0


def judge_attempt(
    members: Sequence[MemberState], gang_size: int, retries_used: int, max_retries: int
) -> Verdict:
    """The verdict on an attempt whose subjobs are ``members`` (in the order they were
    placed; positions in the verdict are positions in ``members``). A copy a move's copy
    took over from (:func:`taken_over`) does not count."""
    gang = max(1, gang_size)
    gone = taken_over(members)
    counted = [i for i in range(len(members)) if i not in gone]
    if not counted or any(members[i].committing for i in counted):
        return Verdict(Outcome.WAIT)
    states = [members[i].state for i in counted]
    if len(counted) == gang and all(s == common_pb2.SUCCEEDED for s in states):
        return Verdict(Outcome.SUCCEEDED)
    failed = [i for i in counted if members[i].state in FAILED_SUBJOB_STATES]
    if failed:
        first = failed[0]
        stop = tuple(i for i in counted if members[i].state in LIVE_SUBJOB_STATES)
        free = is_free_retry(members[first].end_cause)
        final = is_final(members[first].end_cause)
        if not final and (free or retries_used < max_retries):
            return Verdict(Outcome.RETRY, counted=not free, failed_member=first, stop=stop)
        return Verdict(Outcome.FAILED, failed_member=first, stop=stop)
    if all(s in (common_pb2.RUNNING, common_pb2.SUSPENDED, common_pb2.SUCCEEDED) for s in states):
        return Verdict(Outcome.RUNNING, suspended=states.count(common_pb2.SUSPENDED))
    return Verdict(Outcome.WAIT)


# -- subjob ids ------------------------------------------------------------------------

#: Rigid: JOB-aN-mM (attempt, member), JOB-aN-mM-rK after K Airlock moves; atomized:
#: JOB-uN-sM (first unit, subjob number).
_SUBJOB_ID = re.compile(r"^(?P<job>.+?)-(?:a\d+-m\d+(?:-r\d+)?|u\d+-s\d+)$")


def rigid_subjob_id(job_id: str, attempt: int, member: int, moves: int = 0) -> str:
    """The id of a rigid job's member in an attempt (``moves``: Airlock re-addresses)."""
    return f"{job_id}-a{attempt}-m{member}" + (f"-r{moves}" if moves else "")


def atomized_subjob_id(job_id: str, unit_start: int, number: int) -> str:
    """The id of an atomized job's piece starting at ``unit_start``."""
    return f"{job_id}-u{unit_start}-s{number}"


def job_of(subjob_id: str) -> str:
    """The job a router-made subjob id belongs to; ``""`` for an id no router made."""
    match = _SUBJOB_ID.match(subjob_id)
    return match.group("job") if match else ""


# -- what an agent's report on a subjob means ---------------------------------------------


class Report(enum.Enum):
    IGNORE = "ignore"  # not the reporter's placement, or nothing the router records
    APPLY = "apply"  # record the report
    APPLY_AND_STOP = "apply-and-stop"  # record it, and stop the copy: its job moved on
    STOP = "stop"  # a live copy the router does not count on: stop it
    TRUE_END = "true-end"  # a copy declared lost reports how it really ended


@dataclass(frozen=True)
class Record:
    """The router's record of one placement."""

    agent_id: str
    state: int
    attempt: int


def judge_report(
    record: Record | None, reporter: str, attempts: int, job_ended: bool, reported: int
) -> Report:
    """What the router does with ``reporter``'s report that a subjob is in state
    ``reported``, given its record of that placement (None: no job or no such subjob),
    the job's current attempt and whether the job has ended. The router counts on a copy
    only while its record is live, in the current attempt, of a job that has not ended;
    any other live copy is stopped, so nothing runs twice. Only the agent a placement is
    on may report on it (another agent cannot end, charge or stop someone's job)."""
    live = reported in LIVE_SUBJOB_STATES
    if record is None:
        return Report.STOP if live else Report.IGNORE
    if record.agent_id != reporter:
        return Report.IGNORE
    if record.state not in LIVE_SUBJOB_STATES:
        if live:
            return Report.STOP
        return Report.TRUE_END if record.state == common_pb2.LOST else Report.IGNORE
    moved_on = record.attempt != attempts or job_ended
    return Report.APPLY_AND_STOP if moved_on and live else Report.APPLY
