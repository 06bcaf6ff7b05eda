"""End causes: one vocabulary on the wire and in code, and the decisions made on it.

The decisions that once read reason prefixes (free retry or counted, widen the atomized
profile or not) are checked here by giving a cause with a reason that says otherwise: the
cause decides, the text is never parsed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base import causes
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_zone.config import ZoneConfig
from laminar_zone.entry import Entry
from laminar_zone.jobs import ZoneState
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.store import JobStore

GIB = 1 << 30


# ---------------------------------------------------------------- the vocabulary


def test_the_python_enum_is_the_wire_enum() -> None:
    wire = {
        name.removeprefix("END_CAUSE_"): value
        for name, value in common_pb2.EndCause.items()  # type: ignore[attr-defined]
    }
    assert {c.name: int(c) for c in EndCause} == wire


def test_tokens_round_trip_and_unknown_values_read_as_unspecified() -> None:
    for cause in EndCause:
        assert causes.cause_from_token(cause.token) is cause
        assert causes.end_cause(int(cause.wire)) is cause
    assert EndCause.READDRESSED.token == "readdressed"
    assert EndCause.UNSPECIFIED.token == ""
    assert causes.end_cause(999) is EndCause.UNSPECIFIED  # a newer peer's cause
    assert causes.cause_from_token("no-such-cause") is EndCause.UNSPECIFIED


def test_one_list_of_free_ends() -> None:
    """The router's list (preempted, readdressed, commit unconfirmed) and the atomizer's
    (those, superseded, cancelled) became one: the union; a GPU that failed under its work
    (an Xid, off the bus) is not the job's fault either, nor a gang's rollback (one
    decision for rigid and atomized gangs: a member that never started is FAILED)."""
    assert {
        EndCause.PREEMPTED,
        EndCause.READDRESSED,
        EndCause.COMMIT_UNCONFIRMED,
        EndCause.COMMIT_FAILED,
        EndCause.SUPERSEDED,
        EndCause.CANCELLED,
        EndCause.GPU_FAILED,
    } == causes.FREE_RETRY_CAUSES
    for cause in (EndCause.EXITED, EndCause.LOST, EndCause.FENCED, EndCause.UNSPECIFIED):
        assert not causes.is_free_retry(cause)
    assert {
        EndCause.RECLAIMED,
        EndCause.PREEMPTED,
        EndCause.READDRESSED,
    } == causes.AIRLOCK_LOSS_CAUSES
    assert {EndCause.OVERRAN, EndCause.RECLAIMED} == causes.WIDENING_CAUSES


def test_state_sets_partition_the_states() -> None:
    subjob_states = set(common_pb2.SubjobState.values()) - {common_pb2.SUBJOB_STATE_UNSPECIFIED}
    assert subjob_states == causes.LIVE_SUBJOB_STATES | causes.ENDED_SUBJOB_STATES
    assert not causes.LIVE_SUBJOB_STATES & causes.ENDED_SUBJOB_STATES
    assert causes.ENDED_SUBJOB_STATES - {common_pb2.SUCCEEDED} == causes.FAILED_SUBJOB_STATES
    assert {"SUCCEEDED", "FAILED", "KILLED", "LOST"} == causes.ENDED_SUBJOB_STATE_NAMES
    assert causes.FINISHED_JOB_STATES | {zone_pb2.FORWARDED} == causes.TERMINAL_JOB_STATES
    assert not causes.RUNNING_JOB_STATES & causes.TERMINAL_JOB_STATES


# ---------------------------------------------------------------- decisions in the router


@pytest.fixture
async def zone(tmp_path: Path) -> AsyncIterator[ZoneState]:
    store = JobStore(tmp_path / "zone.db")
    state = ZoneState(ZoneConfig(), store, ZoneMetrics(CollectorRegistry()))
    try:
        yield state
    finally:
        await state.close()
        store.close()


def _entry(
    zone: ZoneState, cause: EndCause, reason: str, *, state: int = common_pb2.KILLED
) -> Entry:
    job = zone_pb2.Job(
        job_id="j-1",
        spec=zone_pb2.JobSpec(command=["x"], resources=common_pb2.Resources(gpus=1), max_retries=0),
        state=zone_pb2.JOB_RUNNING,
        attempts=1,
        placements=[
            zone_pb2.Placement(
                subjob_id="j-1-a1-m0",
                agent_id="h1",
                state=state,  # type: ignore[arg-type]
                end_cause=cause.wire,
                reason=reason,
                attempt=1,
            )
        ],
    )
    entry = Entry(job=job, need=Demand(gpus=1))
    zone.entries[job.job_id] = entry
    return entry


# A readdressed copy is not evaluated at all: its replacement is the current one (below).
@pytest.mark.parametrize("cause", [EndCause.PREEMPTED, EndCause.COMMIT_UNCONFIRMED])
async def test_a_free_end_retries_without_using_a_retry(zone: ZoneState, cause: EndCause) -> None:
    entry = _entry(zone, cause, "stopped; exited 0")  # the text names no cause
    zone.evaluate(entry)
    assert entry.job.state == zone_pb2.PENDING
    assert (entry.job.retries_used, entry.job.attempts) == (0, 2)
    assert "not counted" in entry.job.reason


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        (EndCause.EXITED, "exited 3"),
        (EndCause.FENCED, "fenced: the agent was out of touch with its router"),
        (EndCause.LOST, "agent h1 silent for 30 s"),
        # An end without a cause (journaled before causes existed) is counted, whatever
        # its text says: the text is for people.
        (EndCause.UNSPECIFIED, "preempted: by job j-9 (critical); exited 0"),
    ],
)
async def test_other_ends_count_against_the_retries(
    zone: ZoneState, cause: EndCause, reason: str
) -> None:
    entry = _entry(zone, cause, reason, state=common_pb2.FAILED)
    zone.evaluate(entry)
    assert entry.job.state == zone_pb2.JOB_FAILED  # max_retries=0: none left
    assert entry.job.retries_used == 0


async def test_a_readdressed_copy_is_not_part_of_the_current_attempt(zone: ZoneState) -> None:
    entry = _entry(zone, EndCause.READDRESSED, "moved to h2")
    moved = entry.job.placements.add(subjob_id="j-1-a1-m0-r1", agent_id="h2", attempt=1)
    moved.state = common_pb2.RUNNING
    assert [p.subjob_id for p in entry.current()] == ["j-1-a1-m0-r1"]


# ---------------------------------------------------------------- decisions in the atomizer


def _atomized(zone: ZoneState, *placements: zone_pb2.Placement) -> zone_pb2.Job:
    return zone_pb2.Job(
        job_id="j-2",
        spec=zone_pb2.JobSpec(
            command=["x"],
            max_retries=3,
            atomization=common_pb2.AtomizationContract(
                total_units=100,
                seconds_per_unit=[common_pb2.Quantile(q=0.5, value=1.0)],
                peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=8 * GIB)],
            ),
        ),
        state=zone_pb2.JOB_RUNNING,
        placements=list(placements),
    )


def _atom_end(subjob_id: str, state: int, cause: EndCause, reason: str) -> zone_pb2.Placement:
    return zone_pb2.Placement(
        subjob_id=subjob_id,
        agent_id="h1",
        state=state,  # type: ignore[arg-type]
        end_cause=cause.wire,
        reason=reason,
        unit_start=0,
        unit_count=10,
    )


async def test_overran_and_reclaimed_ends_widen_the_profile(zone: ZoneState) -> None:
    job = _atomized(
        zone,
        _atom_end("j-2-u1-s0", common_pb2.KILLED, EndCause.OVERRAN, "window ended; exited 0"),
        _atom_end("j-2-u2-s0", common_pb2.KILLED, EndCause.RECLAIMED, "gpu0 at 79 GiB"),
        # The text of an overrun, without its cause: not a violation.
        _atom_end("j-2-u3-s0", common_pb2.KILLED, EndCause.UNSPECIFIED, "overran: window"),
        _atom_end("j-2-u4-s0", common_pb2.KILLED, EndCause.PREEMPTED, "by job j-9"),
    )
    zone.atomizer.admit(job)
    assert zone.atomizer.atoms["j-2"].violations == 2


@pytest.mark.parametrize(
    ("cause", "counted"),
    [
        (EndCause.COMMIT_UNCONFIRMED, False),
        (EndCause.READDRESSED, False),
        (EndCause.SUPERSEDED, False),
        (EndCause.CANCELLED, False),
        (EndCause.EXITED, True),
        (EndCause.LAUNCH_FAILED, True),
    ],
)
async def test_atomized_failures_count_a_retry_unless_free(
    zone: ZoneState, cause: EndCause, counted: bool
) -> None:
    job = _atomized(zone)
    zone.atomizer.admit(job)
    atom = zone.atomizer.atoms["j-2"]
    ended = _atom_end("j-2-u1-s0", common_pb2.FAILED, cause, "exited 1")
    assert zone.atomizer._observe(job, atom, ended, replay=False) == ""
    assert job.retries_used == (1 if counted else 0)
