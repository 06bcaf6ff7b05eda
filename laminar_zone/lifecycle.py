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
from collections.abc import Sequence
from dataclasses import dataclass

from laminar_api.v1 import common_pb2
from laminar_base.causes import FAILED_SUBJOB_STATES, LIVE_SUBJOB_STATES, is_free_retry


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
    """The verdict on an attempt whose members are ``members`` (in member order)."""
    gang = max(1, gang_size)
    if not members or any(m.committing for m in members):
        return Verdict(Outcome.WAIT)
    states = [m.state for m in members]
    if len(members) == gang and all(s == common_pb2.SUCCEEDED for s in states):
        return Verdict(Outcome.SUCCEEDED)
    failed = [i for i, m in enumerate(members) if m.state in FAILED_SUBJOB_STATES]
    if failed:
        first = failed[0]
        stop = tuple(i for i, m in enumerate(members) if m.state in LIVE_SUBJOB_STATES)
        free = is_free_retry(members[first].end_cause)
        if free or retries_used < max_retries:
            return Verdict(Outcome.RETRY, counted=not free, failed_member=first, stop=stop)
        return Verdict(Outcome.FAILED, failed_member=first, stop=stop)
    if all(s in (common_pb2.RUNNING, common_pb2.SUSPENDED, common_pb2.SUCCEEDED) for s in states):
        return Verdict(Outcome.RUNNING, suspended=states.count(common_pb2.SUSPENDED))
    return Verdict(Outcome.WAIT)
