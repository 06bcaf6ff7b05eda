"""What the router's queue reads of a live job (Entry.item): made once per attempt, and a
job whose last attempt Airlock reclaimed under memory pressure waits as restarted (it keeps
a claim on the slices that fit it, laminar_zone.queue.QueueWalk.claims)."""

from __future__ import annotations

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.wire import demand_of
from laminar_zone.entry import Entry

GIB = 1024**3


def _entry() -> Entry:
    spec = zone_pb2.JobSpec(
        command=["true"],
        resources=common_pb2.Resources(gpus=1, gpu_memory_bytes=40 * GIB),
        expected_seconds=60,
    )
    job = zone_pb2.Job(job_id="j-1", spec=spec, attempts=1, submitted_unix=5.0)
    return Entry(job=job, need=demand_of(spec.resources))


def test_a_job_airlock_reclaimed_waits_as_restarted_until_its_next_attempt_ends() -> None:
    entry = _entry()
    first = entry.item
    assert not first.is_restarted and first.expected_seconds == 60
    assert entry.item is first  # made once per attempt
    entry.job.placements.add(
        subjob_id="j-1-a1-m0",
        attempt=1,
        state=common_pb2.KILLED,
        end_cause=EndCause.RECLAIMED.wire,
    )
    entry.job.attempts = 2
    assert entry.item.is_restarted and entry.item.job_id == "j-1"
    # An attempt that ended otherwise (its own exit) does not keep the claim.
    entry.job.placements.add(
        subjob_id="j-1-a2-m0", attempt=2, state=common_pb2.FAILED, end_cause=EndCause.EXITED.wire
    )
    entry.job.attempts = 3
    assert not entry.item.is_restarted
