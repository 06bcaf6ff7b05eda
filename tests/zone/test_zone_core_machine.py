"""The router's decision core (laminar_zone.core.ZoneCore) with no sockets, no journal and
no ZoneState: events in, instructions out.

The unit tests feed one transition each and assert the instructions and the state. The
property test drives the core alone through random interleavings of submits, placement
tries (each member's Commit taken, refused, or unanswered whether or not the agent
started it), stop deliveries, exits, confirmations, cancels and lost agents, against a
model of the agents (which copies really run), and checks the core's promises: no job
lost, no member run twice while an old copy may run, every subjob the core ends has a
cause, gangs all-or-nothing; and at the end, after every job is cancelled and every stop
and confirmation delivered, nothing left in memory or running.
"""

from __future__ import annotations

import ast
import itertools
import logging
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from holdings_scan import assert_holdings_match
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    TERMINAL_JOB_STATES,
    EndCause,
    end_cause,
)
from laminar_base.demand import Demand
from laminar_base.errors import FailedPrecondition, InvalidArgument
from laminar_zone import core as core_module
from laminar_zone.core import (
    Confirm,
    Count,
    Failure,
    Forget,
    Instruction,
    Journal,
    Loop,
    Member,
    NewJob,
    Next,
    Place,
    Release,
    ResumeForward,
    Terminate,
    TryPlan,
    Wake,
    ZoneCore,
    journaled,
)
from laminar_zone.entry import Entry
from laminar_zone.placement import ShapeCap
from laminar_zone.placements import COMMITTING
from laminar_zone.reasons import Reason, reason_of
from laminar_zone.trying import (
    Clock,
    CommitMembers,
    DoInstructions,
    Gathered,
    GatherLeases,
    OpenRound,
    RunInstructions,
    Slot,
    StartJob,
    pass_steps,
    place_try,
)
from laminar_zone.view import ZoneView

GIB = 1 << 30
AGENTS = ("a0", "a1", "a2", "a3")
NOW = 1_700_000_000.0

_ids = itertools.count()
ONE_GPU = Demand(gpus=1)


def _view(agents: tuple[str, ...] = AGENTS, free: int = 1) -> ZoneView:
    view = ZoneView(stale_after_seconds=3.0)
    for i, agent_id in enumerate(agents):
        view.update(
            agent_id,
            f"127.0.0.1:{i + 1}",
            {"gpu:H100-80GB": ShapeCap(free, 1, 0, 80 * GIB)},
            heat=0,
            draining=False,
            now=0.0,
            total_gpus=1,
        )
    return view


def _core(view: ZoneView | None = None) -> ZoneCore:
    return ZoneCore(view or _view(), {}, lost_after_seconds=10.0)


def _submit(
    core: ZoneCore,
    gang: int = 1,
    retries: int = 0,
    after: tuple[str, ...] = (),
    need: Demand = ONE_GPU,
) -> Entry:
    job = zone_pb2.Job(
        job_id=f"j-{next(_ids)}",
        spec=zone_pb2.JobSpec(
            command=["true"],
            resources=common_pb2.Resources(gpus=1),
            gang_size=gang,
            max_retries=retries,
            after=list(after),
        ),
        state=zone_pb2.PENDING,
        reason="placing",
        submitted_unix=NOW,
        attempts=1,
    )
    entry = Entry(job=job, need=need, submitted_mono=0.0)
    core.admit(entry)
    core.route(entry, allow_forward=False, now_mono=0.0)
    return entry


def _members(*agents: str) -> list[Member]:
    return [Member(a, f"addr-{a}", (f"{a}/gpu0",)) for a in agents]


def _started(p: zone_pb2.Placement) -> None:
    """The driver recorded the agent's reply to the Commit: the subjob runs."""
    p.state = common_pb2.RUNNING
    p.reason = "running"


def _ended(p: zone_pb2.Placement, state: int, cause: EndCause, reason: str = "") -> None:
    """The agent reported the subjob's end."""
    p.state = state  # type: ignore[assignment]
    p.end_cause = cause.wire
    p.reason = reason or cause.name.lower()
    p.ended_unix = NOW


LOST_REPLY = Failure("DEADLINE_EXCEEDED: no answer", unknown=True)
REFUSED = Failure(
    "INVALID_ARGUMENT: workdir /nope does not exist", unknown=False, refused_input=True
)
BUSY = Failure("FAILED_PRECONDITION: lease expired", unknown=False)


# ==================================================================== one transition each


def test_a_gang_whose_second_reply_was_lost_stops_the_first_and_confirms_the_second() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    assert core.begin_commit(entry, _members("a0", "a1")) == [Journal((entry,))]
    first, second = entry.current()
    assert first.reason == second.reason == COMMITTING
    _started(first)  # member 0's Commit was answered; member 1's reply was lost

    ok, out = core.committed(entry, [None, LOST_REPLY], NOW)

    assert not ok
    stops = [i for i in out if isinstance(i, Terminate)]
    assert [(t.placement.subjob_id, t.cause) for t in stops] == [
        (first.subjob_id, EndCause.COMMIT_FAILED)
    ]
    assert Confirm("a1", entry.job.job_id) in out
    assert core.unconfirmed == {"a1": {entry.job.job_id}}
    assert isinstance(out[-1], Journal)
    assert entry.job.attempts == 2 and entry.job.retries_used == 0
    assert second.state == common_pb2.STARTING  # may run: not ended by the core
    # Not placed again while either copy may run: member 0 until its end is reported,
    # member 1 until its agent says whether it started it.
    waits, _ = core.old_copy(entry, 0.0)
    assert waits
    _ended(first, common_pb2.KILLED, EndCause.COMMIT_FAILED)
    waits, out = core.old_copy(entry, 0.0)
    assert waits and "confirm whether it started" in entry.job.reason
    assert reason_of(entry.job.reason_code) is Reason.PREVIOUS_COPY
    _ended(second, common_pb2.FAILED, EndCause.COMMIT_UNCONFIRMED)
    assert core.old_copy(entry, 0.0) == (False, [])


def test_a_member_whose_commit_was_refused_outright_fails_to_commit_with_a_cause() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    core.begin_commit(entry, _members("a0", "a1"))
    first, second = entry.current()
    ok, out = core.committed(entry, [BUSY, BUSY], NOW)
    assert not ok
    assert not [i for i in out if isinstance(i, (Terminate, Confirm))]
    assert {p.state for p in (first, second)} == {common_pb2.FAILED}
    assert {end_cause(p.end_cause) for p in (first, second)} == {EndCause.COMMIT_FAILED}
    assert entry.job.state == zone_pb2.PENDING and entry.job.attempts == 2
    # The lost commit is transient: the try gathers once more, then the job queues.
    step, out = core.commit_lost(entry, True, 0.0, NOW)
    assert step is Next.RETRY and Count("placements", "commit_failed") in out
    step, out = core.commit_lost(entry, False, 0.0, NOW)
    assert step is Next.STOP
    assert entry.job.state == zone_pb2.QUEUED
    assert Wake(Loop.QUEUE) in out


def test_a_refused_input_fails_the_job_naming_the_agents_reason() -> None:
    core = _core()
    entry = _submit(core)
    step, out = core.gathered(entry, None, [BUSY, REFUSED], ["no room"], 0.0, NOW)
    assert step is Next.STOP
    assert entry.job.state == zone_pb2.JOB_FAILED
    assert "workdir /nope does not exist" in entry.job.reason
    assert reason_of(entry.job.reason_code) is Reason.REFUSED
    assert Count("finished", "job_failed") in out and journaled(out) == [entry]

    gang = _submit(core, gang=2)
    core.begin_commit(gang, _members("a0", "a1"))
    _started(gang.current()[0])
    ok, out = core.committed(gang, [None, REFUSED], NOW)
    assert not ok and gang.job.state == zone_pb2.JOB_FAILED
    assert "workdir /nope" in gang.job.reason
    assert [i.cause for i in out if isinstance(i, Terminate)] == [EndCause.COMMIT_FAILED]


def test_a_gather_that_found_nothing_queues_the_job_and_blocks_its_family() -> None:
    core = _core(_view(free=0))
    entry = _submit(core)
    step, out = core.gathered(entry, None, [], ["no host fits"], 5.0, NOW)
    assert step is Next.STOP
    assert out == [Count("placements", "queued"), Journal((entry,)), Wake(Loop.QUEUE)]
    assert entry.job.state == zone_pb2.QUEUED and entry.job.queue_position == 1
    assert entry.queued_at == 5.0
    assert core.blocked_families == {entry.need.family: common_pb2.BATCH}
    # A later job of the family waits its turn behind the blocked head.
    later = _submit(core)
    assert later.job.state == zone_pb2.QUEUED
    assert reason_of(later.job.reason_code) is Reason.PRIORITY


def test_a_job_cancelled_while_probing_releases_what_was_gathered() -> None:
    core = _core()
    entry = _submit(core)
    core.cancel(entry.job, "", NOW)
    step, out = core.gathered(entry, ["lease"], [], [], 0.0, NOW)
    assert step is Next.STOP and out == [Release(("lease",))]


def test_a_cancel_during_a_commit_stops_every_member_and_stays_cancelled() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    core.begin_commit(entry, _members("a0", "a1"))
    out = core.cancel(entry.job, "user", NOW)
    assert entry.job.state == zone_pb2.JOB_CANCELLED
    stops = [i for i in out if isinstance(i, Terminate)]
    assert [t.placement.member for t in stops] == [0, 1]
    assert {t.cause for t in stops} == {EndCause.CANCELLED}
    # The Commits' answers come after: the job stays cancelled, its copies are stopped.
    for p in entry.current():
        _started(p)
    assert core.committed(entry, [None, None], NOW)[0]
    assert entry.job.state == zone_pb2.JOB_CANCELLED
    assert core.cancel(entry.job, "again", NOW) == []  # twice is harmless
    assert core.forget_if_done(entry) == []  # its copies still run
    for p in entry.current():
        _ended(p, common_pb2.KILLED, EndCause.CANCELLED)
    assert core.forget_if_done(entry) == [Forget(entry.job.job_id)]
    assert entry.job.job_id not in core.entries


def test_cancelling_an_array_cancels_each_element_not_ended_and_forgets_the_idle_ones() -> None:
    """One decision for the whole array: an element that ended is left alone (not refused),
    a running one is stopped and stays in memory until its copy's end is reported, a
    waiting one is cancelled and forgotten at once; cancelling again does nothing more."""
    core = _core()
    array = zone_pb2.Job(job_id="arr", spec=zone_pb2.JobSpec(array="0-2"))
    core.admit_array(array, total=3, limit=3)
    done, running, waiting = (_submit(core) for _ in range(3))
    for index, entry in enumerate((done, running, waiting)):
        entry.job.array_id, entry.job.array_index = "arr", index
    core.finish(done, zone_pb2.JOB_SUCCEEDED, "exited 0", NOW)
    core.begin_commit(running, _members("a0"))
    (copy,) = running.current()
    _started(copy)
    core.committed(running, [None], NOW)

    out = core.cancel_job(array, "enough", NOW)

    assert done.job.state == zone_pb2.JOB_SUCCEEDED
    assert running.job.state == waiting.job.state == zone_pb2.JOB_CANCELLED
    assert [t for t in out if isinstance(t, Terminate)] == [
        Terminate(copy, "cancelled: enough", EndCause.CANCELLED)
    ]
    # The stops come after every element's other instructions: a driver sends them together.
    first_stop = next(i for i, x in enumerate(out) if isinstance(x, Terminate))
    assert all(isinstance(x, Terminate) for x in out[first_stop:])
    assert [f for f in out if isinstance(f, Forget)] == [Forget(waiting.job.job_id)]
    assert [e.job.job_id for e in journaled(out)] == [running.job.job_id, waiting.job.job_id]
    assert waiting.job.job_id not in core.entries and running.job.job_id in core.entries
    assert core.cancel_job(array, "again", NOW) == []
    _ended(copy, common_pb2.KILLED, EndCause.CANCELLED)
    assert core.forget_if_done(running) == [Forget(running.job.job_id)]
    assert core.forget_if_done(running) == []  # once


def test_cancelling_one_job_with_nothing_running_forgets_it() -> None:
    core = _core()
    entry = _submit(core)
    out = core.cancel_job(entry.job, "", NOW)
    assert entry.job.state == zone_pb2.JOB_CANCELLED
    assert journaled(out) == [entry] and out[-1] == Forget(entry.job.job_id)
    assert entry.job.job_id not in core.entries
    done = _submit(core)
    core.finish(done, zone_pb2.JOB_SUCCEEDED, "exited 0", NOW)
    with pytest.raises(FailedPrecondition):  # ended otherwise: refused, as one cancel is
        core.cancel_job(done.job, "", NOW)


def test_cancelling_an_ended_job_is_refused() -> None:
    core = _core()
    entry = _submit(core)
    core.finish(entry, zone_pb2.JOB_SUCCEEDED, "done", NOW)
    with pytest.raises(FailedPrecondition):
        core.cancel(entry.job, "", NOW)


def test_a_probe_that_started_a_cancelled_job_is_stopped() -> None:
    core = _core()
    entry = _submit(core)
    placement, out = core.probe_intent(entry, "a0", "addr-a0")
    assert journaled(out) == [entry] and core.by_agent == {"a0": {entry.job.job_id}}
    core.cancel(entry.job, "", NOW)
    reply = common_pb2.Subjob(state=common_pb2.RUNNING, reason="running")
    ok, out = core.probe_committed(entry, placement, reply, ["a0/gpu0"], "", NOW)
    assert not ok
    assert Terminate(placement, "cancelled while starting", EndCause.CANCELLED) in out


def test_a_probe_carrying_the_commit_with_no_answer_is_confirmed_before_a_retry() -> None:
    core = _core()
    entry = _submit(core)
    placement, _ = core.probe_intent(entry, "a2", "addr-a2")
    ok, out = core.probe_committed(entry, placement, None, [], "DEADLINE_EXCEEDED", NOW)
    assert not ok and Confirm("a2", entry.job.job_id) in out
    assert entry.job.attempts == 2
    assert core.old_copy(entry, 0.0)[0]


def test_a_bounced_probe_forgets_its_placement() -> None:
    core = _core()
    entry = _submit(core)
    placement, _ = core.probe_intent(entry, "a1", "addr-a1")
    core.probe_bounced(entry, placement)
    assert list(entry.job.placements) == [] and core.by_agent == {"a1": set()}


def test_one_members_failure_stops_the_gang_and_retries_it() -> None:
    core = _core()
    entry = _submit(core, gang=3, retries=1)
    core.begin_commit(entry, _members("a0", "a1", "a2"))
    for p in entry.current():
        _started(p)
    core.committed(entry, [None, None, None], NOW)
    assert entry.job.state == zone_pb2.JOB_RUNNING
    first = entry.current()[1]
    _ended(first, common_pb2.FAILED, EndCause.EXITED, "exit 1")
    out = core.evaluate(entry, NOW)
    stops = [i for i in out if isinstance(i, Terminate)]
    assert sorted(t.placement.member for t in stops) == [0, 2]
    assert {t.cause for t in stops} == {EndCause.GANG_STOPPED}
    assert Place(entry) in out and Count("retries") in out
    assert entry.job.attempts == 2 and entry.job.retries_used == 1
    # The retry waits for the stopped members' ends.
    assert core.old_copy(entry, 0.0)[0]


def test_an_agent_silent_past_the_limit_loses_its_subjobs_with_a_cause() -> None:
    core = _core()
    entry = _submit(core, retries=2)
    core.begin_commit(entry, _members("a3"))
    _started(entry.current()[0])
    core.committed(entry, [None], NOW)
    core.view.agents["a3"].last_heartbeat = -100.0
    out = core.sweep(0.0, NOW)
    (lost,) = [p for p in entry.job.placements if p.agent_id == "a3"]
    assert lost.state == common_pb2.LOST and end_cause(lost.end_cause) is EndCause.LOST
    assert "membership.lost_after_seconds=10" in lost.reason
    assert Place(entry) in out and entry.job.attempts == 2
    assert core.by_agent["a3"] == set()


def test_the_sweep_stops_a_run_past_its_time_limit_and_asks_again_for_a_stop_owed() -> None:
    core = _core()
    entry = _submit(core)
    entry.job.spec.time_limit_seconds = 60
    core.begin_commit(entry, _members("a0"))
    (p,) = entry.current()
    _started(p)
    p.started_unix = NOW
    core.committed(entry, [None], NOW)
    core.evaluate(entry, NOW)  # running: its subjob goes on the clock
    assert core.sweep(0.0, NOW + 30) == []
    out = core.sweep(0.0, NOW + 61)
    assert [(t.placement.subjob_id, t.cause) for t in out if isinstance(t, Terminate)] == [
        (p.subjob_id, EndCause.TIME_LIMIT)
    ]
    # The agent did not take a stop: asked again while it is reachable, once.
    stop = zone_pb2.Placement(subjob_id="j-x-a1-m0", agent_id="a1")
    core.owe_stop(stop, "cancelled", EndCause.CANCELLED)
    core.view.agents["a1"].is_stale = True
    assert core.sweep(0.0, NOW) == []
    core.view.agents["a1"].is_stale = False
    assert core.sweep(0.0, NOW) == [Terminate(stop, "cancelled", EndCause.CANCELLED)]
    assert core.sweep(0.0, NOW) == []


def test_a_failed_dependency_fails_its_dependent_and_a_succeeded_one_releases_it() -> None:
    core = _core()
    first, second = _submit(core), _submit(core)
    waiting = _submit(core, after=(first.job.job_id,))
    other = _submit(core, after=(second.job.job_id,))
    assert waiting.job.state == other.job.state == zone_pb2.WAITING
    core.finish(first, zone_pb2.JOB_FAILED, "exit 1", NOW)
    core.finish(second, zone_pb2.JOB_SUCCEEDED, "ok", NOW)
    out = core.resolve_waiting(NOW)
    assert waiting.job.state == zone_pb2.JOB_FAILED
    assert reason_of(waiting.job.reason_code) is Reason.DEPENDENCY_FAILED
    assert journaled(out) == [waiting]
    assert other.job.state == zone_pb2.WAITING
    assert reason_of(other.job.reason_code) is Reason.PLACING


def test_a_placed_try_counts_its_latency_from_the_queue() -> None:
    core = _core()
    entry = _submit(core)
    entry.queued_at = 10.0
    out = core.placed(entry, True, 0.25, 12.0, probes=3, bounces=1)
    assert Count("queue_seconds", "batch", 2.0) in out
    assert Count("probes_per_placement", value=3) in out


def test_a_restart_confirms_commits_in_flight_and_places_what_had_not_started() -> None:
    core = _core()
    committing = Entry(
        job=zone_pb2.Job(job_id="j-c", state=zone_pb2.PENDING, attempts=1),
        need=Demand(gpus=1),
    )
    committing.job.placements.add(
        subjob_id="j-c.1.0",
        agent_id="a9",
        agent_address="addr-a9",
        state=common_pb2.STARTING,
        reason=COMMITTING,
        attempt=1,
    )
    pending = Entry(
        job=zone_pb2.Job(job_id="j-p", state=zone_pb2.PENDING, attempts=1), need=Demand(gpus=1)
    )
    forwarded = Entry(
        job=zone_pb2.Job(
            job_id="j-f", state=zone_pb2.PENDING, attempts=1, forwarded_to="pending:z2"
        ),
        need=Demand(gpus=1),
    )
    assert core.recovered(committing, False, 7.0) == []
    assert core.unconfirmed == {"a9": {"j-c"}} and core.by_agent == {"a9": {"j-c"}}
    assert core.view.agents["a9"].is_stale  # known from the journal until it heartbeats
    assert core.recovered(pending, False, 7.0) == [Place(pending)]
    assert core.recovered(forwarded, False, 7.0) == [ResumeForward(forwarded)]
    assert set(core.entries) == {"j-c", "j-p", "j-f"}


def _running(core: ZoneCore, agent: str = "a0", retries: int = 1) -> Entry:
    entry = _submit(core, retries=retries)
    core.begin_commit(entry, _members(agent))
    _started(entry.current()[0])
    core.committed(entry, [None], NOW)
    return entry


def _report(
    p: zone_pb2.Placement, state: int, cause: EndCause = EndCause.UNSPECIFIED
) -> common_pb2.Subjob:
    return common_pb2.Subjob(
        spec=common_pb2.SubjobSpec(subjob_id=p.subjob_id, job_id=p.subjob_id.split("-a")[0]),
        state=state,  # type: ignore[arg-type]
        end_cause=cause.wire,
        reason="reported",
    )


def test_a_report_from_another_agent_is_ignored_and_a_copy_of_an_unknown_job_stopped() -> None:
    core = _core()
    entry = _running(core, "a0")
    (p,) = entry.current()
    assert core.report("a1", _report(p, common_pb2.SUCCEEDED, EndCause.EXITED), None, NOW) == (
        None,
        False,
        [],
    )
    assert p.state == common_pb2.RUNNING
    stray = zone_pb2.Placement(subjob_id="j-gone-a1-m0")
    entry_of, _, out = core.report("a2", _report(stray, common_pb2.RUNNING), None, NOW)
    assert entry_of is None
    assert [
        (t.placement.agent_id, t.placement.subjob_id, t.cause)
        for t in out
        if isinstance(t, Terminate)
    ] == [("a2", "j-gone-a1-m0", EndCause.SUPERSEDED)]


def test_a_copy_declared_lost_that_succeeded_first_wins_and_gives_its_retry_back() -> None:
    core = _core()
    entry = _running(core, "a3")
    core.view.agents["a3"].last_heartbeat = -100.0
    core.sweep(0.0, NOW)  # lost: the job retries (counted)
    assert entry.job.retries_used == 1 and entry.job.attempts == 2
    core.begin_commit(entry, _members("a1"))
    (retry,) = entry.current()
    _started(retry)
    core.committed(entry, [None], NOW)
    lost = entry.job.placements[0]
    touched, _, out = core.report(
        "a3", _report(lost, common_pb2.SUCCEEDED, EndCause.EXITED), None, NOW
    )
    assert touched is entry
    assert entry.job.state == zone_pb2.JOB_SUCCEEDED and entry.job.retries_used == 0
    assert "declared lost" in lost.reason
    assert [(t.placement.subjob_id, t.cause) for t in out if isinstance(t, Terminate)] == [
        (retry.subjob_id, EndCause.SUPERSEDED)
    ]


def test_a_commit_confirmed_after_the_job_moved_on_is_stopped() -> None:
    core = _core()
    entry = _submit(core)
    placement, _ = core.probe_intent(entry, "a2", "addr-a2")
    core.probe_committed(entry, placement, None, [], "no answer", NOW)
    assert core.to_confirm("a2") == [entry.job.job_id] and core.unconfirmed == {}
    assert core.is_unsure(placement, "a2")
    out = core.confirmed(entry, placement, common_pb2.Subjob(state=common_pb2.RUNNING), NOW)
    stop = zone_pb2.Placement(subjob_id=placement.subjob_id, agent_id="a2")
    assert out == [Terminate(stop, "superseded: the job moved on", EndCause.SUPERSEDED)]


def test_a_commit_the_agent_never_started_ends_with_its_cause() -> None:
    core = _core()
    entry = _submit(core)
    placement, _ = core.probe_intent(entry, "a2", "addr-a2")
    core.probe_committed(entry, placement, None, [], "no answer", NOW)
    assert core.confirmed(entry, placement, None, NOW) == []
    assert placement.state == common_pb2.FAILED
    assert end_cause(placement.end_cause) is EndCause.COMMIT_UNCONFIRMED
    assert core.old_copy(entry, 0.0) == (False, [])


def test_a_readdress_moves_a_single_member_and_retires_the_old_copy_once_the_new_runs() -> None:
    core = _core()
    entry = _running(core, "a0")
    (old,) = entry.current()
    assert core.readdress("a1", old.subjob_id) == (None, [])  # not the reporter's
    moving, out = core.readdress("a0", old.subjob_id)
    assert moving is entry and out == [] and old.subjob_id in core.readdressing
    assert core.readdress("a0", old.subjob_id) == (None, [])  # one move at a time
    new, moves, out = core.move_to(entry, old, Member("a2", "addr-a2", ("a2/gpu0",)))
    assert moves == 1 and new.subjob_id == f"{old.subjob_id}-r1" and new.reason == COMMITTING
    _started(new)
    out = core.move_committed(entry, old, new, None, NOW)
    assert old.state == common_pb2.KILLED
    assert end_cause(old.end_cause) is EndCause.READDRESSED
    assert Terminate(old, old.reason, EndCause.READDRESSED) in out
    core.moved(old.subjob_id)
    assert core.readdressing == set()
    assert [p.subjob_id for p in entry.current()] == [new.subjob_id]


def test_a_move_whose_copy_already_failed_stops_the_old_copy_before_placing_a_retry() -> None:
    """The driver awaits a Place inline: the suspended old copy is stopped first."""
    core = _core()
    entry = _running(core, "a0", retries=1)
    (old,) = entry.current()
    core.readdress("a0", old.subjob_id)
    new, _, _ = core.move_to(entry, old, Member("a2", "addr-a2", ("a2/gpu0",)))
    _started(new)
    _ended(new, common_pb2.FAILED, EndCause.EXITED, "exit 1")
    out = core.move_committed(entry, old, new, None, NOW)
    assert Place(entry) in out  # the failed copy's retry
    stop = out.index(Terminate(old, old.reason, EndCause.READDRESSED))
    assert stop < out.index(Place(entry))


def test_a_moves_commit_that_surely_failed_leaves_the_member_where_it_was() -> None:
    core = _core()
    entry = _running(core, "a0")
    (old,) = entry.current()
    core.readdress("a0", old.subjob_id)
    new, _, _ = core.move_to(entry, old, Member("a2", "addr-a2"))
    refused = Failure("RESOURCE_EXHAUSTED: full", unknown=False, details="full")
    assert core.move_committed(entry, old, new, refused, NOW) == [Journal((entry,))]
    assert end_cause(new.end_cause) is EndCause.READDRESSED and "full" in new.reason
    assert old.state == common_pb2.RUNNING
    unsure = core.move_to(entry, old, Member("a3", "addr-a3"))[0]
    out = core.move_committed(entry, old, unsure, LOST_REPLY, NOW)
    assert Confirm("a3", entry.job.job_id) in out and old.state == common_pb2.RUNNING


def test_a_gang_member_or_a_piece_is_not_moved_by_a_copy() -> None:
    core = _core()
    gang = _submit(core, gang=2)
    core.begin_commit(gang, _members("a0", "a1"))
    for p in gang.current():
        _started(p)
    assert core.readdress("a0", gang.current()[0].subjob_id) == (None, [])
    atoms = {"j-piece"}
    pieces = ZoneCore(_view(), {}, atoms=atoms)
    piece = Entry(job=zone_pb2.Job(job_id="j-piece", attempts=1), need=Demand(gpus=1))
    pieces.admit(piece)
    p = piece.job.placements.add(
        subjob_id="j-piece-u0-s0", agent_id="a0", state=common_pb2.SUSPENDED, attempt=1
    )
    entry_of, out = pieces.readdress("a0", p.subjob_id)
    assert entry_of is None
    assert [(t.placement.subjob_id, t.cause) for t in out if isinstance(t, Terminate)] == [
        (p.subjob_id, EndCause.READDRESSED)
    ]


def test_reconciling_stops_what_the_router_no_longer_counts_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = _core()
    entry = _running(core, "a0")
    (p,) = entry.current()
    with caplog.at_level(logging.WARNING, logger="laminar.zone.core"):
        out = core.reconcile("a0", [p.subjob_id, "j-unknown-a1-m0"])
    assert [(t.placement.subjob_id, t.cause) for t in out if isinstance(t, Terminate)] == [
        ("j-unknown-a1-m0", EndCause.SUPERSEDED)
    ]
    assert [r.getMessage().split(": stopping")[0] for r in caplog.records] == [
        "reconciling agent a0"
    ]


def test_a_new_array_is_its_record_then_its_elements_in_order() -> None:
    core = _core()
    spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
    spec.array = "0-2%1"
    entries = core.new_entries(spec, Demand(gpus=1), NewJob("j-a", "z1", "r1"), NOW, 4.0)
    assert entries[0].job.job_id == "j-a"
    elements = [e.job for e in entries[1:]]
    assert [j.array_index for j in elements] == [0, 1, 2]
    assert all(j.array_id == "j-a" and not j.spec.array for j in elements)
    assert [j.submitted_unix for j in elements] == sorted(j.submitted_unix for j in elements)
    assert entries[0].job.client_request_id == "r1" and core.entries == {}  # nothing kept


def test_a_new_job_this_zone_can_never_run_is_refused_naming_the_field() -> None:
    core = _core()
    spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
    spec.after.append("j-nowhere")
    with pytest.raises(InvalidArgument) as refused:
        core.new_entries(spec, Demand(gpus=1), NewJob("j-b", "z1"), NOW, 0.0)
    assert refused.value.field == "spec.after"
    big = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=9))
    with pytest.raises(InvalidArgument) as too_big:
        core.new_entries(big, Demand(gpus=9), NewJob("j-c", "z1"), NOW, 0.0)
    assert too_big.value.field == "spec.resources.gpus" and "has 1" in str(too_big.value)


def test_a_gangs_leases_outlive_the_probe_budget_and_one_member_commits_on_probe() -> None:
    core = _core()
    single, gang = _submit(core), _submit(core, gang=4)
    assert core.plan_try(single, 2.0, 5.0) == TryPlan(1, common_pb2.BATCH, 2.0, True)
    assert core.plan_try(gang, 2.0, 5.0) == TryPlan(4, common_pb2.BATCH, 9.0, False)


def test_a_gang_started_in_a_pass_counts_every_members_memory_as_tenant_usage_does() -> None:
    core = _core()
    entry = _submit(core, gang=2, need=Demand(gpus=1, gpu_memory_bytes=10 * GIB))
    book = core.begin_pass([], {}, {}, {}, NOW, 3.0, backfill=True)
    assert book.started(entry, True)
    entry.job.state = zone_pb2.JOB_RUNNING
    units, memory = core.tenant_usage()
    tenant = entry.job.spec.tenant
    assert book.memory == memory == {tenant: 20 * GIB}
    assert book.units == units == {tenant: 2.0}


def _pass(core: ZoneCore, start: Callable[[Entry], bool]) -> list[Instruction]:
    """One queue pass (laminar_zone.trying.pass_steps), its starts answered at once by
    ``start`` (the router awaits a placement try); no market. Returns the instructions."""
    steps = pass_steps(
        core,
        shares={},
        backfill=True,
        rng=random.Random(0),
        clock=Clock(mono=lambda: 3.0, unix=lambda: NOW),
    )
    out: list[Instruction] = []
    answer: bool | None = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration:
            return out
        answer = None
        if isinstance(step, DoInstructions):
            out += step.instructions
        elif isinstance(step, StartJob):
            answer = start(step.entry)
        else:
            assert isinstance(step, OpenRound)  # no market: no round


def test_a_pass_places_in_order_explains_the_rest_and_blocks_the_family() -> None:
    core = _core()
    entries = [_submit(core) for _ in range(4)]
    for e in entries:
        e.job.state = zone_pb2.QUEUED
    room = [True, True]  # two slots: the first two start

    def start(entry: Entry) -> bool:
        if not room:
            return False
        room.pop()
        entry.job.state = zone_pb2.JOB_RUNNING
        return True

    out = _pass(core, start)
    assert [e.job.state for e in entries] == [zone_pb2.JOB_RUNNING] * 2 + [zone_pb2.QUEUED] * 2
    assert [e.job.queue_position for e in entries[2:]] == [1, 2]
    assert journaled(out) == entries[2:]  # only what changed
    assert core.blocked_families == {entries[0].need.family: common_pb2.BATCH}
    assert core.queued_per_family == {entries[0].need.family: 2}


def test_a_pass_skips_a_job_whose_old_copy_may_still_run() -> None:
    core = _core()
    entry = _submit(core, gang=2)
    core.begin_commit(entry, _members("a0", "a1"))
    _started(entry.current()[0])
    core.committed(entry, [None, BUSY], NOW)
    entry.job.state = zone_pb2.QUEUED
    tried: list[Entry] = []

    def start(e: Entry) -> bool:
        tried.append(e)
        return True

    out = _pass(core, start)
    assert tried == []
    assert reason_of(entry.job.reason_code) is Reason.PREVIOUS_COPY
    assert journaled(out) == [entry] and entry.queued_at == 3.0


def test_a_pass_holds_array_elements_past_the_limit() -> None:
    core = _core()
    array = zone_pb2.Job(job_id="arr")
    core.admit_array(array, total=3, limit=1)
    elements = []
    for index in range(3):
        entry = _submit(core)
        entry.job.array_id = "arr"
        entry.job.array_index = index
        entry.job.state = zone_pb2.WAITING
        elements.append(entry)
    started: list[str] = []

    def start(e: Entry) -> bool:
        started.append(e.job.job_id)
        return True

    _pass(core, start)
    assert started == [elements[0].job.job_id]
    assert all(reason_of(e.job.reason_code) is Reason.ARRAY_LIMIT for e in elements[1:])


# ==================================================================== the property


@dataclass
class World:
    """What really runs on the agents, and the driver's side of each instruction."""

    core: ZoneCore
    #: subjob id -> (job id, member, agent): copies the agents run.
    running: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    #: stops sent and not delivered yet: subjob id -> cause
    stops: dict[str, EndCause] = field(default_factory=dict)
    jobs: dict[str, Entry] = field(default_factory=dict)
    #: The journal: job id -> the job as last written.
    journal: dict[str, bytes] = field(default_factory=dict)

    def write(self, entry: Entry) -> None:
        self.journal[entry.job.job_id] = entry.job.SerializeToString()

    def restart(self) -> None:
        """The router restarts: a new core from what the journal holds (its live jobs, and
        ended ones with a subjob whose end is not recorded); stops in flight are lost."""
        self.stops.clear()
        self.core = _core()
        for job_id, body in self.journal.items():
            job = zone_pb2.Job.FromString(body)
            entry = Entry(job=job, need=Demand(gpus=1))
            self.jobs[job_id] = entry
            live = any(p.state in LIVE_SUBJOB_STATES for p in job.placements)
            if job.state not in TERMINAL_JOB_STATES or live:
                self.carry_out(self.core.recovered(entry, False, 0.0))

    def reconcile(self, agent_id: str) -> None:
        """The agent lists what it runs (after a gap, or a router restart)."""
        ids = sorted(s for s, (_, _, agent) in self.running.items() if agent == agent_id)
        self.carry_out(self.core.reconcile(agent_id, ids))

    def carry_out(self, out: list[Instruction]) -> None:
        for i in out:
            if isinstance(i, Terminate):
                self.stops[i.placement.subjob_id] = i.cause
            elif isinstance(i, Journal):
                for entry in i.entries:
                    self.write(entry)
                    self.carry_out(self.core.forget_if_done(entry))
            elif isinstance(i, Release):
                raise AssertionError("nothing is gathered without a try")

    def end(self, subjob_id: str, state: int, cause: EndCause) -> None:
        """A copy ends on its agent, which reports it (the core judges the report)."""
        job_id, _, agent_id = self.running.pop(subjob_id)
        self.stops.pop(subjob_id, None)
        subjob = common_pb2.Subjob(
            spec=common_pb2.SubjobSpec(subjob_id=subjob_id, job_id=job_id),
            state=state,  # type: ignore[arg-type]
            end_cause=cause.wire,
            reason=cause.name.lower(),
            ended_unix=NOW,
        )
        entry, _, out = self.core.report(agent_id, subjob, None, NOW)
        self.carry_out(out)
        if entry is not None:
            self.carry_out(self.core.evaluate(entry, NOW))
            self.carry_out([Journal((entry,))])

    def confirm(self, agent_id: str) -> None:
        """The agent heartbeats: the router asks it about its unconfirmed commits."""
        for job_id in self.core.to_confirm(agent_id):
            entry = self.core.entries.get(job_id)
            if entry is None:
                continue
            for p in entry.job.placements:
                if not self.core.is_unsure(p, agent_id):
                    continue
                subjob = None
                if p.subjob_id in self.running:
                    subjob = common_pb2.Subjob(state=common_pb2.RUNNING, reason="running")
                self.carry_out(self.core.confirmed(entry, p, subjob, NOW))
            self.carry_out(self.core.evaluate(entry, NOW))
            self.carry_out([Journal((entry,))])

    def check(self) -> None:
        core = self.core
        # What the core keeps of the jobs' holdings is what a walk of them reads.
        assert_holdings_match(core)
        seen: set[tuple[str, int]] = set()
        for job_id, member, _ in self.running.values():
            assert (job_id, member) not in seen, f"{job_id} member {member} runs twice"
            seen.add((job_id, member))
        for job_id, entry in self.jobs.items():
            job = entry.job
            assert job_id in core.entries or job.state in TERMINAL_JOB_STATES, "job lost"
            if job_id not in core.entries:
                assert not any(p.state in LIVE_SUBJOB_STATES for p in job.placements)
            for p in job.placements:
                if p.state in ENDED_SUBJOB_STATES:
                    assert end_cause(p.end_cause) is not EndCause.UNSPECIFIED, p
            current = entry.current()
            if job.state == zone_pb2.JOB_SUCCEEDED:
                gang = max(1, job.spec.gang_size)
                assert len(current) == gang
                assert all(p.state == common_pb2.SUCCEEDED for p in current)
            if job.state == zone_pb2.JOB_RUNNING:
                assert len(current) == max(1, job.spec.gang_size)
                # Every member runs, or is done (a gang waits for its last member).
                assert all(
                    p.state in LIVE_SUBJOB_STATES or p.state == common_pb2.SUCCEEDED
                    for p in current
                )


_answers = st.lists(
    st.sampled_from(["ok", "busy", "refused", "lost_started", "lost_not_started"]),
    min_size=3,
    max_size=3,
)

events = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 3), st.integers(0, 2)),
    st.tuples(
        st.just("place"), st.integers(0, 20), _answers, st.sampled_from([False] * 4 + [True])
    ),
    st.tuples(st.just("queue_pass"), _answers),
    st.tuples(st.just("deliver_stop"), st.integers(0, 20)),
    st.tuples(st.just("exit"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("confirm"), st.sampled_from(AGENTS)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("lose"), st.sampled_from(AGENTS)),
    st.tuples(st.just("restart")),
    st.tuples(st.just("reconcile"), st.sampled_from(AGENTS)),
)

ANSWERS = {
    "ok": None,
    "busy": BUSY,
    "refused": REFUSED,
    "lost_started": LOST_REPLY,
    "lost_not_started": LOST_REPLY,
}


def _try(world: World, entry: Entry, answers: list[object], crash: bool = False) -> bool:
    """One placement try (laminar_zone.trying.place_try): every gather binds the first
    agents, each member's Commit is answered as ``answers`` says (a lost commit gathers
    once more, answered alike), or the router crashes (``crash``) with the Commits sent
    and unanswered. Returns whether the job was placed."""
    core = world.core
    gang = max(1, entry.job.spec.gang_size)
    steps = place_try(
        core,
        entry,
        from_queue=False,
        lease_ttl_seconds=5.0,
        budget_seconds=2.0,
        clock=Clock(mono=lambda: 0.0, unix=lambda: NOW),
    )
    answer: object = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return bool(done.value)
        answer = None
        if isinstance(step, (RunInstructions, DoInstructions)):
            world.carry_out(list(step.instructions))
        elif isinstance(step, GatherLeases):
            members = _members(*AGENTS[:gang])
            answer = Gathered(chosen=tuple(m.agent_id for m in members), members=tuple(members))
        elif isinstance(step, CommitMembers):
            # The invariant the core keeps: no copy of an earlier attempt may still run.
            assert not any(
                p.state in LIVE_SUBJOB_STATES and p.attempt != entry.job.attempts
                for p in entry.job.placements
            )
            replies = []
            for p, reply in zip(step.placements, answers, strict=False):
                if reply in ("ok", "lost_started"):
                    world.running[p.subjob_id] = (entry.job.job_id, p.member, p.agent_id)
                if reply == "ok":
                    _started(p)
                replies.append(ANSWERS[str(reply)])
            if crash:
                steps.close()
                world.restart()
                return False
            answer = replies
        else:
            assert isinstance(step, Slot)


def _step(world: World, event: tuple[object, ...]) -> None:
    core = world.core
    kind = event[0]
    jobs = sorted(world.jobs)
    if kind == "submit":
        gang, retries = event[1], event[2]
        assert isinstance(gang, int) and isinstance(retries, int)
        entry = _submit(core, gang=gang, retries=retries)
        world.jobs[entry.job.job_id] = entry
        world.write(entry)  # a Submit is journaled before it is answered
    elif kind == "place" and jobs:
        pick, answers = event[1], event[2]
        assert isinstance(pick, int) and isinstance(answers, list)
        entry = world.jobs[jobs[pick % len(jobs)]]
        if entry.job.state in (zone_pb2.PENDING, zone_pb2.QUEUED, zone_pb2.WAITING):
            _try(world, entry, answers, crash=bool(event[3]))
    elif kind == "queue_pass":
        answers = event[1]
        assert isinstance(answers, list)
        world.carry_out(_pass(core, lambda entry: _try(world, entry, answers)))
    elif kind == "deliver_stop" and world.stops:
        pick = event[1]
        assert isinstance(pick, int)
        subjob_id = sorted(world.stops)[pick % len(world.stops)]
        cause = world.stops.pop(subjob_id)
        if subjob_id in world.running:
            world.end(subjob_id, common_pb2.KILLED, cause)
    elif kind == "exit" and world.running:
        pick, success = event[1], event[2]
        assert isinstance(pick, int)
        subjob_id = sorted(world.running)[pick % len(world.running)]
        state = common_pb2.SUCCEEDED if success else common_pb2.FAILED
        world.end(subjob_id, state, EndCause.EXITED)
    elif kind == "confirm":
        world.confirm(str(event[1]))
    elif kind == "cancel" and jobs:
        pick = event[1]
        assert isinstance(pick, int)
        entry = world.jobs[jobs[pick % len(jobs)]]
        if entry.job.state in TERMINAL_JOB_STATES and entry.job.state != zone_pb2.JOB_CANCELLED:
            return
        world.carry_out(core.cancel(entry.job, "test", NOW))
    elif kind == "lose":
        agent_id = str(event[1])
        # Its fence stops its work; the router declares its subjobs lost.
        for subjob_id, (_, _, agent) in list(world.running.items()):
            if agent == agent_id:
                del world.running[subjob_id]
        record = core.view.agents[agent_id]
        record.is_stale = True
        record.last_heartbeat = -100.0
        world.carry_out(core.agents_lost(0.0, NOW))
        record.is_stale = False  # it comes back, empty
        record.last_heartbeat = 0.0
    elif kind == "restart":
        world.restart()
    elif kind == "reconcile":
        world.reconcile(str(event[1]))


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(events, min_size=8, max_size=60))
def test_random_event_sequences_keep_the_cores_promises(ops: list[tuple[object, ...]]) -> None:
    world = World(_core())
    for event in ops:
        _step(world, event)
        world.check()
    # Wind down: cancel everything, deliver every stop and confirmation.
    for job_id in sorted(world.jobs):
        entry = world.jobs[job_id]
        if entry.job.state not in TERMINAL_JOB_STATES:
            world.carry_out(world.core.cancel(entry.job, "wind down", NOW))
        world.check()
    for _ in range(4):
        for agent_id in AGENTS:
            world.confirm(agent_id)
            world.reconcile(agent_id)
        for subjob_id in sorted(world.stops):
            cause = world.stops.pop(subjob_id)
            if subjob_id in world.running:
                world.end(subjob_id, common_pb2.KILLED, cause)
        world.check()
    assert world.running == {}, "a copy runs that nothing stops"
    assert world.core.entries == {}, "an ended job stays in memory"
    assert all(not jobs for jobs in world.core.by_agent.values())
    assert all(e.job.state in TERMINAL_JOB_STATES for e in world.jobs.values())


# ==================================================================== no I/O


@pytest.mark.parametrize("module", ["core", "trying"])
def test_the_core_imports_no_io(module: str) -> None:
    """The core and its try and pass steps read no clock and open no socket, journal or
    event loop: importing either alone brings in no gRPC, asyncio, sqlite3 or socket, and
    neither imports a clock."""
    code = (
        f"import sys, laminar_zone.{module}; "
        "print(sorted(m for m in ('grpc', 'asyncio', 'sqlite3', 'socket') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
    tree = ast.parse((Path(core_module.__file__ or "").parent / f"{module}.py").read_text())
    imported = {  # at run time (not the names imported for type checking only)
        name.split(".")[0]
        for node in tree.body
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert not imported & {"time", "asyncio", "grpc", "random", "uuid"}


def test_a_job_recovered_mid_commit_is_not_placed_again_before_its_agent_answers() -> None:
    core = _core()
    entry = _submit(core)
    core.begin_commit(entry, _members("a1"))
    restarted = _core()
    copy = Entry(job=zone_pb2.Job.FromString(entry.job.SerializeToString()), need=entry.need)
    assert restarted.recovered(copy, False, 0.0) == []
    assert not restarted.may_place(copy)
    (p,) = copy.current()
    restarted.confirmed(copy, p, None, NOW)  # it never started
    restarted.evaluate(copy, NOW)
    assert restarted.may_place(copy)


#: What only the core may do with a job: the leaf decisions it strings together, and the
#: writes of a job's or a placement's state, reason and counts.
DECISIONS = frozenset(
    {
        "judge_attempt",
        "judge_report",
        "taken_over",
        "why_waiting",
        "quota_block",
        "quota_never_fits",
        "order_key",
        "set_reason",
        "now_running",
        "copy_subjob",
        "note_true_end",
        # What a cancel stops (ZoneCore.cancel_job) and how a commit of unknown outcome
        # is confirmed (laminar_zone.trying.confirm_steps) are the core's too.
        "array_elements",
        "confirmed",
        "reconfirm",
        "is_unsure",
        "to_confirm",
    }
)
WRITTEN = frozenset(
    {
        "state",
        "reason",
        "end_cause",
        "attempts",
        "retries_used",
        "queue_position",
        "queued_at",
        "placing",
        "probes",
        "bounces",
    }
)
#: The core's steps of a placement try and a queue pass: strung together once, by
#: laminar_zone.trying (place_try, commit_steps, pass_steps), which the drivers drive.
STRUNG = frozenset(
    {
        "may_place",
        "old_copy",
        "plan_try",
        "gathered",
        "begin_commit",
        "committed",
        "probe_committed",
        "commit_lost",
        "placed",
        "resolve_waiting",
        "begin_pass",
        "end_pass",
        "idle_pass",
        "may_start",
        "class_order",
    }
)


def test_the_router_s_drivers_decide_nothing() -> None:
    """ZoneState (jobs.py), its drivers (admission, try_driver, queue_loop, persistence)
    and AgentReports (reports.py) carry out the core's instructions: they call none of the
    leaf decisions, string none of a try's or a pass's steps together (laminar_zone.trying
    does), and write no job's or placement's state, reason, cause, attempt, queue position
    or probe counts themselves."""
    root = Path(core_module.__file__ or "").parent
    drivers = ("jobs.py", "admission.py", "try_driver.py", "queue_loop.py", "persistence.py")
    for name in (*drivers, "reports.py"):
        tree = ast.parse((root / name).read_text())
        called = {
            node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }
        assert not called & DECISIONS, (name, called & DECISIONS)
        assert not called & STRUNG, (name, called & STRUNG)
        written = {
            target.attr
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute)
            and not (isinstance(target.value, ast.Name) and target.value.id == "self")
        }
        assert not written & WRITTEN, (name, written & WRITTEN)
