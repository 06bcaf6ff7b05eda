"""The router's time-limit clock (laminar_zone.time_limits) with no sockets: which live
subjob is named when, and that time Airlock held it suspended does not count."""

from __future__ import annotations

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_zone.time_limits import TimeLimits

LIMIT = 100.0
START = 1_000.0


def _job(job_id: str, *placements: zone_pb2.Placement, limit: float = LIMIT) -> zone_pb2.Job:
    job = zone_pb2.Job(job_id=job_id, spec=zone_pb2.JobSpec(time_limit_seconds=limit))
    job.placements.extend(placements)
    return job


def _running(subjob_id: str, started: float = START) -> zone_pb2.Placement:
    return zone_pb2.Placement(subjob_id=subjob_id, state=common_pb2.RUNNING, started_unix=started)


def _named(clock: TimeLimits, now: float, jobs: dict[str, zone_pb2.Job]) -> list[str]:
    return [p.subjob_id for p, _ in clock.due(now, jobs.get)]


def test_a_subjob_is_named_at_its_limit_once_and_not_before() -> None:
    clock = TimeLimits(recheck_seconds=1.0)
    job = _job("j-1", _running("j-1-a1-m0"), _running("j-1-a1-m1", started=START + 5))
    jobs = {"j-1": job}
    clock.watch(job, job.placements)
    assert _named(clock, START + LIMIT - 0.5, jobs) == []
    due = clock.due(START + LIMIT, jobs.get)
    assert [p.subjob_id for p, _ in due] == ["j-1-a1-m0"]
    assert "past its limit of 100 s (spec.time_limit_seconds)" in due[0][1]
    assert _named(clock, START + LIMIT + 10, jobs) == ["j-1-a1-m1"]
    # Named once: watching the job again (its next evaluation) does not put it back.
    clock.watch(job, job.placements)
    assert _named(clock, START + 10 * LIMIT, jobs) == []


def test_time_suspended_by_airlock_does_not_count() -> None:
    clock = TimeLimits(recheck_seconds=1.0)
    job = _job("j-2", _running("j-2-a1-m0"))
    jobs = {"j-2": job}
    clock.watch(job, job.placements)
    placement = job.placements[0]
    placement.state = common_pb2.SUSPENDED  # Airlock holds it at its limit: not named
    assert _named(clock, START + LIMIT + 1, jobs) == []
    # Resumed after 30 s suspended (its agent's report): the limit moves by those 30 s.
    placement.state = common_pb2.RUNNING
    placement.suspended_seconds = 30
    assert _named(clock, START + LIMIT + 29, jobs) == []
    assert _named(clock, START + LIMIT + 30, jobs) == ["j-2-a1-m0"]


def test_ended_forgotten_and_unlimited_jobs_are_left_alone() -> None:
    clock = TimeLimits(recheck_seconds=1.0)
    ended = _job("j-3", _running("j-3-a1-m0"))
    unlimited = _job("j-4", _running("j-4-a1-m0"), limit=0)
    gone = _job("j-5", _running("j-5-a1-m0"))
    not_started = _job("j-6", zone_pb2.Placement(subjob_id="j-6-a1-m0", state=common_pb2.STARTING))
    for job in (ended, unlimited, gone, not_started):
        clock.watch(job, job.placements)
    ended.placements[0].state = common_pb2.SUCCEEDED
    assert _named(clock, START + 100 * LIMIT, {"j-3": ended, "j-4": unlimited}) == []
    # A subjob that starts later is put on the clock then, from its own start.
    not_started.placements[0].state = common_pb2.RUNNING
    not_started.placements[0].started_unix = START + 50
    clock.watch(not_started, not_started.placements)
    jobs = {"j-6": not_started}
    assert _named(clock, START + LIMIT + 49, jobs) == []
    assert _named(clock, START + LIMIT + 50, jobs) == ["j-6-a1-m0"]
