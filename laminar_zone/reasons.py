"""Why a job is where it is, as a code scripts can rely on (``Job.reason_code``) beside the
reason text people read (``Job.reason``), as Slurm's squeue ``%r`` or Kubernetes'
``reason``. The text may change wording between releases; the code does not."""

from __future__ import annotations

import enum
from typing import cast

from laminar_api.v1 import zone_pb2


class Reason(enum.IntEnum):
    """The same numbers as ``laminar.v1.ReasonCode`` on the wire."""

    NONE = zone_pb2.REASON_NONE
    PLACING = zone_pb2.REASON_PLACING
    RESOURCES = zone_pb2.REASON_RESOURCES
    NO_MATCHING_HOST = zone_pb2.REASON_NO_MATCHING_HOST
    TOO_LARGE = zone_pb2.REASON_TOO_LARGE
    PRIORITY = zone_pb2.REASON_PRIORITY
    DEPENDENCY = zone_pb2.REASON_DEPENDENCY
    QUOTA = zone_pb2.REASON_QUOTA
    ARRAY_LIMIT = zone_pb2.REASON_ARRAY_LIMIT
    WINDOW = zone_pb2.REASON_WINDOW
    PREVIOUS_COPY = zone_pb2.REASON_PREVIOUS_COPY
    RETRYING = zone_pb2.REASON_RETRYING
    SUSPENDED = zone_pb2.REASON_SUSPENDED
    SUBJOB_FAILED = zone_pb2.REASON_SUBJOB_FAILED
    REFUSED = zone_pb2.REASON_REFUSED
    CANCELLED = zone_pb2.REASON_CANCELLED
    DEPENDENCY_FAILED = zone_pb2.REASON_DEPENDENCY_FAILED
    ARRAY = zone_pb2.REASON_ARRAY
    TIME_LIMIT = zone_pb2.REASON_TIME_LIMIT

    @property
    def token(self) -> str:
        """The short lower-case name the CLI shows and scripts match (``resources``)."""
        return "" if self is Reason.NONE else self.name.lower()


def reason_of(value: int) -> Reason:
    """The reason of a wire value; one this build does not know reads as ``NONE``."""
    try:
        return Reason(value)
    except ValueError:
        return Reason.NONE


def set_reason(job: zone_pb2.Job, reason: Reason, text: str) -> None:
    """Record why ``job`` is where it is: the code and the text together."""
    job.reason_code = cast("zone_pb2.ReasonCode", int(reason))
    job.reason = text


#: The code of an ended job whose caller names none, by its end state.
END_REASONS: dict[int, Reason] = {
    zone_pb2.JOB_SUCCEEDED: Reason.NONE,
    zone_pb2.JOB_FAILED: Reason.SUBJOB_FAILED,
    zone_pb2.JOB_CANCELLED: Reason.CANCELLED,
}
