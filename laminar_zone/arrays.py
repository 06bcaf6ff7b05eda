"""Job arrays: one submission, one job id, many indexed elements (no I/O).

``laminar submit --array 0-999%50`` makes the array ``j-…`` and its elements ``j-…_0`` to
``j-…_999``; each element is an ordinary job (it is placed, retried, cancelled and
inspected on its own) whose command sees ``LAMINAR_ARRAY_INDEX``. The array's own record
sums its elements up and ends when the last one ends: succeeded if all did, failed if any
failed, cancelled otherwise. ``%50`` lets at most 50 elements be under way (placing,
queued or running) at once; the others wait, in index order.

Syntax (as Slurm's ``--array``): comma-separated indices and ranges, a range may carry a
step (``0-98:2``), and an optional ``%N`` at the end limits elements under way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from laminar_api.v1 import zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_zone.reasons import Reason, set_reason

#: Elements one array may have (each is a job record in the journal).
MAX_ARRAY_SIZE = 10_000
#: Indices go up to this (as Slurm's default MaxArraySize bounds them too).
MAX_ARRAY_INDEX = 1_000_000
MAX_ARRAY_TEXT = 4096

_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
FIELD = "spec.array"


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]
    limit: int  # elements under way at once; 0 = no limit


def parse_array(text: str, field_name: str = FIELD) -> ArraySpec:
    """Parse ``0-999%50``-style text; a clear :class:`InvalidArgument` otherwise."""
    if len(text) > MAX_ARRAY_TEXT:
        raise InvalidArgument(f"longer than {MAX_ARRAY_TEXT} characters", field=field_name)
    body, _, limit_text = text.strip().partition("%")
    limit = 0
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise InvalidArgument(
                f"the limit after % must be a whole number >= 1, got {limit_text!r}",
                field=field_name,
            )
        limit = int(limit_text)
    if not body:
        raise InvalidArgument("expected indices such as 0-99 or 1,3,5-7%2", field=field_name)
    indices: set[int] = set()
    for part in body.split(","):
        match = _PART.match(part.strip())
        if match is None:
            raise InvalidArgument(
                f"{part!r} is not an index, a range A-B or a stepped range A-B:S",
                field=field_name,
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise InvalidArgument(
                f"range {part!r} must go up (A <= B) by a step >= 1", field=field_name
            )
        if last > MAX_ARRAY_INDEX:
            raise InvalidArgument(
                f"indices go up to {MAX_ARRAY_INDEX}, got {last}", field=field_name
            )
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY_SIZE:
            raise InvalidArgument(
                f"an array has at most {MAX_ARRAY_SIZE} elements", field=field_name
            )
        indices.update(range(first, last + 1, step))
    return ArraySpec(tuple(sorted(indices)), limit)


def element_id(array_id: str, index: int) -> str:
    return f"{array_id}_{index}"


@dataclass
class ArrayProgress:
    """Where an array's elements stand: which are under way (counted against the
    limit), how many ended and how."""

    total: int
    limit: int = 0
    active: set[str] = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def held(self) -> int:
        """Elements waiting for their turn (the limit) or for dependencies."""
        return self.total - self.ended - len(self.active)

    @property
    def done(self) -> bool:
        return self.ended >= self.total

    def may_start(self, element: str) -> bool:
        """Whether ``element`` may be under way now; if so it counts from now on."""
        if element in self.active:
            return True
        if self.limit and len(self.active) >= self.limit:
            return False
        self.active.add(element)
        return True

    def ended_as(self, element: str, outcome: str) -> None:
        """``element`` ended (``succeeded``, ``failed`` or ``cancelled``)."""
        self.active.discard(element)
        if outcome == "succeeded":
            self.succeeded += 1
        elif outcome == "failed":
            self.failed += 1
        else:
            self.cancelled += 1

    def outcome(self) -> str:
        """The array's end once :attr:`done`: succeeded only if every element did."""
        if self.failed:
            return "failed"
        if self.cancelled:
            return "cancelled"
        return "succeeded"

    def element_ended(self, element: zone_pb2.Job) -> None:
        """``element`` reached its end state (succeeded, failed or cancelled)."""
        outcome = next((o for o, s in OUTCOME_STATES.items() if s == element.state), "cancelled")
        self.ended_as(element.job_id, outcome)

    def sum_up(self, array_job: zone_pb2.Job, *, any_running: bool, now_unix: float) -> None:
        """Write where the elements stand into the array's own record, and end it once the
        last element ended; ``any_running``: an element under way runs now."""
        array_job.array.CopyFrom(
            zone_pb2.ArrayStatus(
                total=self.total,
                limit=self.limit,
                under_way=len(self.active),
                held=self.held,
                succeeded=self.succeeded,
                failed=self.failed,
                cancelled=self.cancelled,
            )
        )
        if self.done:
            array_job.state = OUTCOME_STATES[self.outcome()]
            set_reason(
                array_job,
                Reason.ARRAY,
                f"{self.succeeded} of {self.total} elements succeeded, "
                f"{self.failed} failed, {self.cancelled} cancelled",
            )
            array_job.ended_unix = now_unix
            return
        array_job.state = zone_pb2.JOB_RUNNING if self.ended or any_running else zone_pb2.QUEUED
        set_reason(
            array_job,
            Reason.ARRAY,
            f"{len(self.active)} elements under way, {self.held} waiting, "
            f"{self.ended} of {self.total} ended",
        )


#: An array's end and the job state it is.
OUTCOME_STATES = {
    "succeeded": zone_pb2.JOB_SUCCEEDED,
    "failed": zone_pb2.JOB_FAILED,
    "cancelled": zone_pb2.JOB_CANCELLED,
}
