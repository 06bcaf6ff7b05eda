"""The router's verdict on a job's attempt, with no sockets: random member states and random
event orders, checked against the gang and retry promises the router makes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2
from laminar_base.causes import (
    FAILED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    EndCause,
    is_final,
    is_free_retry,
)
from laminar_zone.lifecycle import (
    MemberState,
    Outcome,
    Record,
    Report,
    atomized_subjob_id,
    job_of,
    judge_attempt,
    judge_report,
    rigid_subjob_id,
    taken_over,
)

STATES = (
    common_pb2.STARTING,
    common_pb2.RUNNING,
    common_pb2.SUSPENDED,
    common_pb2.SUCCEEDED,
    common_pb2.FAILED,
    common_pb2.KILLED,
    common_pb2.LOST,
)
ENDS = (common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST)

members_st = st.lists(
    st.builds(
        MemberState,
        st.sampled_from(STATES),
        st.sampled_from(list(EndCause)).map(int),
        st.booleans(),
    ),
    max_size=6,
)


def test_a_gang_succeeds_only_with_every_member() -> None:
    done = MemberState(common_pb2.SUCCEEDED, EndCause.EXITED)
    assert judge_attempt([done, done], 2, 0, 0).outcome is Outcome.SUCCEEDED
    # One member has not been placed yet: the gang is not done.
    assert judge_attempt([done], 2, 0, 0).outcome is not Outcome.SUCCEEDED


def test_one_failure_stops_the_live_members_and_retries() -> None:
    running = MemberState(common_pb2.RUNNING)
    failed = MemberState(common_pb2.FAILED, EndCause.EXITED)
    verdict = judge_attempt([running, failed, running], 3, 0, 2)
    assert verdict.outcome is Outcome.RETRY and verdict.counted
    assert verdict.failed_member == 1 and verdict.stop == (0, 2)


def test_a_free_end_retries_even_with_no_retries_left() -> None:
    moved = MemberState(common_pb2.KILLED, EndCause.READDRESSED)
    verdict = judge_attempt([moved], 1, 3, 3)
    assert verdict.outcome is Outcome.RETRY and not verdict.counted
    spent = judge_attempt([MemberState(common_pb2.FAILED, EndCause.EXITED)], 1, 3, 3)
    assert spent.outcome is Outcome.FAILED


def test_a_run_past_its_time_limit_fails_the_job_with_retries_left() -> None:
    timed_out = MemberState(common_pb2.KILLED, EndCause.TIME_LIMIT)
    verdict = judge_attempt([timed_out, MemberState(common_pb2.RUNNING)], 2, 0, 5)
    assert verdict.outcome is Outcome.FAILED and verdict.stop == (1,)


def test_a_commit_under_way_decides_nothing() -> None:
    failed = MemberState(common_pb2.FAILED, EndCause.EXITED)
    committing = MemberState(common_pb2.STARTING, committing=True)
    assert judge_attempt([failed, committing], 2, 0, 5).outcome is Outcome.WAIT
    assert judge_attempt([], 1, 0, 5).outcome is Outcome.WAIT


def test_a_moves_started_copy_alone_is_the_member() -> None:
    """An Airlock move leaves two copies of one member: once the copy moved to is known to
    have started, it alone counts, whether the copy moved from still runs or ended on its
    own (a move cut short by a router crash)."""
    running = MemberState(common_pb2.RUNNING, member=0)
    done = MemberState(common_pb2.SUCCEEDED, EndCause.EXITED, member=0)
    failed = MemberState(common_pb2.FAILED, EndCause.EXITED, member=0)
    assert taken_over([running, done]) == {0: 1}
    assert judge_attempt([running, done], 1, 0, 0).outcome is Outcome.SUCCEEDED
    assert judge_attempt([done, done], 1, 0, 0).outcome is Outcome.SUCCEEDED
    assert judge_attempt([done, running], 1, 0, 0).outcome is Outcome.RUNNING
    assert judge_attempt([failed, running], 1, 0, 0).outcome is Outcome.RUNNING
    verdict = judge_attempt([running, failed], 1, 0, 0)
    assert verdict.outcome is Outcome.FAILED and verdict.failed_member == 1
    # Two moves: the latest copy that started is the member.
    assert taken_over([done, running, done]) == {0: 2, 1: 2}


def test_a_copy_not_known_to_have_started_takes_nothing_over() -> None:
    running = MemberState(common_pb2.RUNNING, member=0)
    committing = MemberState(common_pb2.STARTING, committing=True, member=0)
    lost = MemberState(common_pb2.LOST, EndCause.LOST, member=0)
    assert taken_over([running, committing]) == {}
    assert judge_attempt([running, committing], 1, 0, 0).outcome is Outcome.WAIT
    assert taken_over([running, lost]) == {}
    verdict = judge_attempt([running, lost], 1, 0, 1)
    assert verdict.outcome is Outcome.RETRY and verdict.stop == (0,)
    # Members of a gang are not copies of one another.
    gang = [MemberState(common_pb2.RUNNING, member=0), MemberState(common_pb2.RUNNING, member=1)]
    assert taken_over(gang) == {} and taken_over([running, running]) == {0: 1}


@settings(max_examples=500, deadline=None)
@given(members=members_st, gang=st.integers(0, 6), used=st.integers(0, 4), most=st.integers(0, 4))
def test_every_verdict_keeps_the_promises(
    members: list[MemberState], gang: int, used: int, most: int
) -> None:
    verdict = judge_attempt(members, gang, used, most)
    states = [m.state for m in members]
    if not members or any(m.committing for m in members):
        assert verdict.outcome is Outcome.WAIT
        return
    failed = [i for i, s in enumerate(states) if s in FAILED_SUBJOB_STATES]
    if verdict.outcome is Outcome.SUCCEEDED:
        assert len(members) == max(1, gang) and set(states) == {common_pb2.SUCCEEDED}
    if failed:
        # All-or-nothing: the first failure decides, every live member is stopped.
        assert verdict.outcome in (Outcome.RETRY, Outcome.FAILED)
        assert verdict.failed_member == failed[0]
        assert set(verdict.stop) == {i for i, s in enumerate(states) if s in LIVE_SUBJOB_STATES}
        free = is_free_retry(members[failed[0]].end_cause)
        final = is_final(members[failed[0]].end_cause)
        assert (verdict.outcome is Outcome.FAILED) == (final or (not free and used >= most))
        if verdict.outcome is Outcome.RETRY:
            assert verdict.counted == (not free)
    else:
        assert verdict.outcome not in (Outcome.RETRY, Outcome.FAILED) and not verdict.stop
    if verdict.outcome is Outcome.RUNNING:
        assert verdict.suspended == states.count(common_pb2.SUSPENDED)
        assert common_pb2.STARTING not in states


@settings(max_examples=300, deadline=None)
@given(
    gang=st.integers(1, 4),
    most=st.integers(0, 3),
    script=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(ENDS), st.sampled_from(list(EndCause))),
        max_size=60,
    ),
)
def test_a_job_driven_by_random_ends_finishes_once_within_its_retries(
    gang: int, most: int, script: list[tuple[int, int, EndCause]]
) -> None:
    """Drive one job as the router does: each event ends one live member of the current
    attempt; the verdict is carried out (stop the rest, place a new attempt, or finish).
    The job finishes at most once, never uses more retries than it has, and a finished job
    takes no more events."""
    used, attempts, finished, final = 0, 1, None, False
    members = [MemberState(common_pb2.RUNNING) for _ in range(gang)]
    for index, state, cause in script:
        if finished is not None:
            break
        live = [i for i, m in enumerate(members) if m.state in LIVE_SUBJOB_STATES]
        if not live:
            break
        i = live[index % len(live)]
        members[i] = MemberState(state, int(cause))
        verdict = judge_attempt(members, gang, used, most)
        if verdict.outcome is Outcome.SUCCEEDED:
            finished = Outcome.SUCCEEDED
        elif verdict.outcome is Outcome.FAILED:
            finished = Outcome.FAILED
            final = is_final(members[verdict.failed_member or 0].end_cause)
        elif verdict.outcome is Outcome.RETRY:
            used += verdict.counted
            attempts += 1
            members = [MemberState(common_pb2.RUNNING) for _ in range(gang)]
        assert used <= most
    if finished is Outcome.SUCCEEDED:
        assert all(m.state == common_pb2.SUCCEEDED for m in members)
    if finished is Outcome.FAILED:
        # Out of retries, or a run past its time limit (it would run out again).
        assert used == most or final


def test_subjob_ids_name_their_job() -> None:
    job = "j-0123456789"
    for subjob_id in (
        rigid_subjob_id(job, 1, 0),
        rigid_subjob_id(job, 3, 2, moves=4),
        atomized_subjob_id(job, 120, 7),
    ):
        assert job_of(subjob_id) == job
    assert job_of("s-123") == "" and job_of(job) == ""


@settings(max_examples=500, deadline=None)
@given(
    record=st.none()
    | st.builds(Record, st.sampled_from(["a", "b"]), st.sampled_from(STATES), st.integers(1, 3)),
    attempts=st.integers(1, 3),
    ended=st.booleans(),
    reported=st.sampled_from(STATES),
)
def test_a_report_never_leaves_an_uncounted_copy_running(
    record: Record | None, attempts: int, ended: bool, reported: int
) -> None:
    verdict = judge_report(record, "a", attempts, ended, reported)
    counted = (
        record is not None
        and record.state in LIVE_SUBJOB_STATES
        and record.attempt == attempts
        and not ended
    )
    if record is not None and record.agent_id != "a":
        assert verdict is Report.IGNORE  # another agent's placement: hands off
    elif reported in LIVE_SUBJOB_STATES:
        stops = verdict in (Report.STOP, Report.APPLY_AND_STOP)
        assert stops == (not counted)
    else:
        assert verdict not in (Report.STOP, Report.APPLY_AND_STOP)
        if record is not None and record.state == common_pb2.LOST:
            assert verdict is Report.TRUE_END
    if record is not None and record.state not in LIVE_SUBJOB_STATES:
        assert verdict is not Report.APPLY  # an ended record is never overwritten
