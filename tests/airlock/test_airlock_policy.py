"""The Airlock ladder: every rung, victim ordering, critical guarantee, determinism."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_airlock.levels import Level
from laminar_airlock.policy import (
    GIB,
    Action,
    PolicyConfig,
    SliceSignal,
    Snapshot,
    SubjobView,
    decide,
    decide_oom_killer,
    eligible_victims,
    freed_per_slice,
    next_deadline,
    plan_room,
    predicts_critical,
    relief_step,
)

TOTAL = 80 * GIB
CFG = PolicyConfig()


def sj(
    subjob_id: str,
    *,
    priority: int = 4,
    lifecycle: int = 3,
    observed: int = 10 * GIB,
    declared: int | None = None,
    work: float = 10.0,
    suspended: bool = False,
    since: float | None = None,
    readdress: int = 0,
    free_mode: str = "checkpoint",
    restartable: bool = True,
    slices: tuple[str, ...] = ("gpu0",),
) -> SubjobView:
    return SubjobView(
        subjob_id=subjob_id,
        job_id=f"job-{subjob_id}",
        slice_ids=slices,
        priority=priority,
        lifecycle=lifecycle,
        declared_bytes=observed if declared is None else declared,
        observed_bytes=observed,
        started_at=0.0,
        work_since_checkpoint_seconds=work,
        suspended=suspended,
        suspended_since=since,
        readdress_count=readdress,
        free_mode=free_mode,
        restartable=restartable,
    )


def snap(
    used: int,
    level: Level,
    *subjobs: SubjobView,
    now: float = 1000.0,
    to_critical: float | None = 1.0,
) -> Snapshot:
    """One slice; by default its trend reaches the critical mark in 1 s, so that an ELEVATED
    slice needs relief (the tests of the prediction itself pass ``to_critical``)."""
    return Snapshot(
        now=now,
        slices=(SliceSignal("gpu0", used, TOTAL, level, seconds_to_critical=to_critical),),
        subjobs=tuple(subjobs),
    )


def ids(actions: list[Action]) -> list[str]:
    return [a.subjob_id for a in actions]


# ---- relief rungs ----


def test_suspend_checkpointable_victim_with_numbers_in_reason() -> None:
    used = int(78.1 * GIB)
    actions = decide(snap(used, Level.CRITICAL, sj("a", observed=12 * GIB)), CFG)
    assert len(actions) == 1
    (a,) = actions
    assert (a.step, a.subjob_id, a.slice_id, a.expected_bytes_freed) == (
        "suspend",
        "a",
        "gpu0",
        12 * GIB,
    )
    assert "78.1 GiB of 80.0 GiB" in a.reason
    assert "critical mark" in a.reason
    assert "opportunistic/transient" in a.reason
    assert "frees 12.0 GiB" in a.reason


def test_release_signal_gets_release_memory() -> None:
    actions = decide(snap(70 * GIB, Level.ELEVATED, sj("a", free_mode="release_signal")), CFG)
    assert [(a.step, a.expected_bytes_freed) for a in actions] == [("release_memory", 10 * GIB)]


def test_release_memory_is_asked_once_per_episode() -> None:
    asked = dataclasses.replace(sj("a", free_mode="release_signal"), release_requested_since=999.0)
    other = sj("b", priority=3, observed=10 * GIB)
    # Within the wait the request counts as relief: nobody else is picked, a is not asked again.
    assert decide(snap(70 * GIB, Level.ELEVATED, asked, other), CFG) == []


def test_release_memory_not_honoured_is_reclaimed_after_the_wait() -> None:
    asked = dataclasses.replace(
        sj("a", free_mode="release_signal"),
        release_requested_since=1000.0 - CFG.release_wait_seconds - 0.5,
    )
    actions = decide(snap(70 * GIB, Level.CRITICAL, asked), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("reclaim", "a")]
    assert "asked to release memory 2.5s ago and still holds 10.0 GiB" in actions[0].reason
    # On a prediction alone (ELEVATED), a reclaim waits for the critical mark itself.
    assert decide(snap(70 * GIB, Level.ELEVATED, asked, to_critical=0.5), CFG) == []


def test_pending_release_does_not_cover_a_deeper_shortfall() -> None:
    asked = dataclasses.replace(sj("a", free_mode="release_signal"), release_requested_since=999.5)
    big = sj("b", priority=3, observed=30 * GIB)
    # 79 GiB - 10 pending = 69 > 64 target: b must go too, and a is not asked twice.
    actions = decide(snap(79 * GIB, Level.CRITICAL, asked, big), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("suspend", "b")]


def test_a_suspend_under_way_counts_as_relief_and_is_not_chosen_again() -> None:
    """cuda-checkpoint takes seconds per GiB to copy a victim out: while it does, the victim
    still shows its memory, and the next polls count it as relief in flight."""
    copying = dataclasses.replace(sj("a", observed=20 * GIB), stopping=True)
    other = sj("b", priority=3, observed=10 * GIB)
    # 78 GiB - 20 under way = 58 <= 64 target: nothing more to do, a is not picked twice.
    assert decide(snap(78 * GIB, Level.CRITICAL, copying, other), CFG) == []
    # A deeper shortfall still takes the next victim: 79 - 10 under way = 69 > 64.
    small = dataclasses.replace(copying, observed_bytes=10 * GIB)
    actions = decide(snap(79 * GIB, Level.CRITICAL, small, sj("c", observed=30 * GIB)), CFG)
    assert [(x.step, x.subjob_id) for x in actions] == [("suspend", "c")]


def test_oom_killer_baseline_waits_for_full_then_kills_the_largest_any_class() -> None:
    crit = sj("crit", priority=1, lifecycle=1, observed=50 * GIB)
    opp = sj("opp", priority=4, observed=20 * GIB)
    assert decide_oom_killer(snap(79 * GIB, Level.CRITICAL, crit, opp)) == []
    actions = decide_oom_killer(snap(TOTAL, Level.CRITICAL, crit, opp))
    assert [(a.step, a.subjob_id, a.expected_bytes_freed) for a in actions] == [
        ("reclaim", "crit", 50 * GIB)
    ]
    assert "oom-killer baseline" in actions[0].reason


def test_free_mode_none_is_reclaimed_not_suspended() -> None:
    actions = decide(snap(70 * GIB, Level.CRITICAL, sj("a", free_mode="none")), CFG)
    assert [a.step for a in actions] == ["reclaim"]
    assert "frees nothing" in actions[0].reason


def test_on_a_prediction_alone_only_relief_that_loses_no_work() -> None:
    """At the elevated mark with critical predicted, a stop that frees memory is taken, a
    reclaim is not: the prediction may not come true, the lost work would be real."""
    lossy = sj("lossy", priority=4, free_mode="none")
    free = sj("free", priority=4, free_mode="checkpoint", lifecycle=1)
    higher = sj("higher", priority=3, free_mode="checkpoint")
    predicted = snap(75 * GIB, Level.ELEVATED, lossy, free, higher, to_critical=0.5)
    # free (same class as lossy, loses nothing) goes; higher would be next, but not past lossy.
    assert [(a.step, a.subjob_id) for a in decide(predicted, CFG)] == [("suspend", "free")]
    assert decide(snap(75 * GIB, Level.ELEVATED, lossy, higher, to_critical=0.5), CFG) == []
    actions = decide(snap(77 * GIB, Level.CRITICAL, lossy, higher), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("reclaim", "lossy"), ("suspend", "higher")]


def test_normal_slice_gets_no_relief() -> None:
    assert decide(snap(79 * GIB, Level.NORMAL, sj("a")), CFG) == []


def test_elevated_but_already_below_target_does_nothing() -> None:
    # Hysteresis may hold ELEVATED while usage is already at target.
    assert decide(snap(60 * GIB, Level.ELEVATED, sj("a")), CFG) == []


def test_only_as_many_victims_as_needed() -> None:
    # 70 GiB used, target 64 GiB: one 10 GiB victim is enough.
    subjobs = [sj(f"s{i}", work=float(i)) for i in range(4)]
    actions = decide(snap(70 * GIB, Level.ELEVATED, *subjobs), CFG)
    assert ids(actions) == ["s0"]
    # 78 GiB: needs 14 GiB, so two victims.
    actions = decide(snap(78 * GIB, Level.CRITICAL, *subjobs), CFG)
    assert ids(actions) == ["s0", "s1"]


def test_insufficient_takes_all_eligible_and_says_so() -> None:
    subjobs = [sj("a", observed=GIB), sj("b", observed=GIB)]
    actions = decide(snap(79 * GIB, Level.CRITICAL, *subjobs), CFG)
    assert sorted(ids(actions)) == ["a", "b"]
    assert all("stays above target" in a.reason for a in actions)


def test_zero_observed_is_never_a_victim() -> None:
    actions = decide(snap(79 * GIB, Level.CRITICAL, sj("a", observed=0), sj("b")), CFG)
    assert ids(actions) == ["b"]


# ---- the trend: act at the elevated mark only where critical is predicted ----


@pytest.mark.parametrize("to_critical", [None, math.inf, 2.5])
def test_elevated_without_a_prediction_suspends_nothing(to_critical: float | None) -> None:
    """Unknown, flat or falling, or too slow a trend: a suspension would prevent nothing."""
    subjobs = (sj("a"), sj("b", free_mode="release_signal"), sj("c", free_mode="none"))
    assert decide(snap(70 * GIB, Level.ELEVATED, *subjobs, to_critical=to_critical), CFG) == []


def test_elevated_with_critical_predicted_suspends_and_says_when() -> None:
    actions = decide(snap(70 * GIB, Level.ELEVATED, sj("a"), to_critical=1.5), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("suspend", "a")]
    assert "critical projected in 1.5s" in actions[0].reason
    slow = PolicyConfig(predict_seconds=1.0)
    assert decide(snap(70 * GIB, Level.ELEVATED, sj("a"), to_critical=1.5), slow) == []


def test_critical_acts_whatever_the_trend() -> None:
    for to_critical in (None, math.inf):
        actions = decide(snap(78 * GIB, Level.CRITICAL, sj("a"), to_critical=to_critical), CFG)
        assert ids(actions) == ["a"]


# ---- what relief costs: a stop that loses no work first, within a class ----


def test_within_a_class_a_stop_that_frees_memory_goes_before_a_reclaim() -> None:
    # The reclaim would lose 5 s, the suspend nothing (however long it has run).
    lossy = sj("lossy", free_mode="none", work=5.0)
    free = sj("free", free_mode="checkpoint", work=500.0, lifecycle=1)
    actions = decide(snap(70 * GIB, Level.CRITICAL, lossy, free), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("suspend", "free")]
    asked = sj("asked", free_mode="release_signal", work=5.0)
    actions = decide(snap(70 * GIB, Level.CRITICAL, lossy, asked), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("release_memory", "asked")]


def test_class_still_comes_before_what_a_victim_loses() -> None:
    low = sj("low", priority=4, free_mode="none", work=900.0)
    high = sj("high", priority=3, free_mode="checkpoint")
    actions = decide(snap(70 * GIB, Level.CRITICAL, low, high), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("reclaim", "low")]


def test_among_reclaims_the_least_work_lost_goes_first() -> None:
    old = sj("old", free_mode="none", work=300.0)
    young = sj("young", free_mode="none", work=30.0)
    assert ids(decide(snap(70 * GIB, Level.CRITICAL, old, young), CFG)) == ["young"]


# ---- ordering ties at each key ----


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (sj("x", priority=4), sj("a", priority=3)),  # lower class first
        (sj("x", lifecycle=3), sj("a", lifecycle=2)),  # transient before long
        (sj("x", lifecycle=2), sj("a", lifecycle=1)),  # long before resident
        (
            sj("x", observed=10 * GIB, declared=5 * GIB),
            sj("a", observed=10 * GIB, declared=9 * GIB),
        ),  # most over declaration
        (sj("x", work=1.0), sj("a", work=2.0)),  # least work lost
        (sj("a"), sj("b")),  # subjob id
    ],
)
def test_victim_order_keys(first: SubjobView, second: SubjobView) -> None:
    for order in ((first, second), (second, first)):
        actions = decide(snap(70 * GIB, Level.ELEVATED, *order), CFG)
        assert ids(actions) == [first.subjob_id]


def test_critical_class_protected_while_lower_class_runs() -> None:
    crit = sj("crit", priority=1, observed=40 * GIB)
    low = sj("low", priority=4, observed=GIB)
    actions = decide(snap(79 * GIB, Level.CRITICAL, crit, low), CFG)
    assert ids(actions) == ["low"]
    assert "stays above target" in actions[0].reason


def test_critical_class_can_be_victim_when_alone() -> None:
    crit = sj("crit", priority=1, observed=40 * GIB)
    assert ids(decide(snap(79 * GIB, Level.CRITICAL, crit), CFG)) == ["crit"]


def test_multi_slice_subjob_chosen_once_and_credited_on_both() -> None:
    big = sj("big", observed=20 * GIB, slices=("gpu0", "gpu1"))
    s = Snapshot(
        now=0.0,
        slices=(
            SliceSignal("gpu0", 70 * GIB, TOTAL, Level.ELEVATED, seconds_to_critical=0.5),
            SliceSignal("gpu1", 70 * GIB, TOTAL, Level.ELEVATED, seconds_to_critical=0.5),
        ),
        subjobs=(big,),
    )
    actions = decide(s, CFG)
    assert ids(actions) == ["big"]
    assert actions[0].expected_bytes_freed == 10 * GIB


# ---- recovery rungs ----


def test_resume_in_priority_order_within_resume_mark() -> None:
    # 40 GiB used; resume mark 60 GiB. Room for two 10 GiB subjobs, not three.
    subjobs = [
        sj("p4", priority=4, suspended=True, since=990.0),
        sj("p2", priority=2, suspended=True, since=995.0),
        sj("p3", priority=3, suspended=True, since=980.0),
    ]
    actions = decide(snap(40 * GIB, Level.NORMAL, *subjobs), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("resume", "p2"), ("resume", "p3")]
    assert actions[0].expected_bytes_freed == -10 * GIB
    assert "resume mark 84%" in actions[0].reason


def test_no_resume_while_slice_or_host_under_pressure() -> None:
    sub = sj("a", suspended=True, since=999.0)
    assert decide(snap(40 * GIB, Level.ELEVATED, sub), CFG) == []
    s = dataclasses.replace(snap(40 * GIB, Level.NORMAL, sub), host_level=Level.ELEVATED)
    assert decide(s, CFG) == []


def test_readdress_after_deadline_when_restartable() -> None:
    sub = sj("a", observed=70 * GIB, suspended=True, since=960.0)  # 40 s, too big to resume
    actions = decide(snap(40 * GIB, Level.NORMAL, sub), CFG)
    assert [a.step for a in actions] == ["readdress"]
    assert "attempt 1/2" in actions[0].reason


def test_not_restartable_waits_then_reclaims() -> None:
    sub = sj("a", observed=70 * GIB, suspended=True, since=960.0, restartable=False)
    assert decide(snap(40 * GIB, Level.NORMAL, sub), CFG) == []
    old = dataclasses.replace(sub, suspended_since=800.0)
    actions = decide(snap(40 * GIB, Level.NORMAL, old), CFG)
    assert [a.step for a in actions] == ["reclaim"]
    assert "reclaim after 120.0s" in actions[0].reason


def test_readdress_budget_spent_reclaims() -> None:
    sub = sj("a", observed=70 * GIB, suspended=True, since=960.0, readdress=2)
    actions = decide(snap(40 * GIB, Level.NORMAL, sub), CFG)
    assert [a.step for a in actions] == ["reclaim"]
    assert "budget spent (2/2)" in actions[0].reason


def test_suspended_waits_as_long_as_a_restart_would_lose() -> None:
    """Waiting loses no work and a restart loses the work since the checkpoint, so a move or
    a reclaim waits at least that long (beyond the configured waits)."""
    one = PolicyConfig(loss_wait_ratio=1.0)  # wait once the work a restart loses
    movable = sj("m", observed=70 * GIB, suspended=True, since=800.0, work=500.0)
    stuck = sj("s", observed=70 * GIB, suspended=True, since=800.0, work=500.0, restartable=False)
    assert decide(snap(40 * GIB, Level.NORMAL, movable, stuck), one) == []  # 200 s < 500 s
    # Moved once it has waited the 500 s; reclaimed 90 s later (120 - 30, as configured).
    later = decide(snap(40 * GIB, Level.NORMAL, movable, stuck, now=1301.0), one)
    assert [(a.step, a.subjob_id) for a in later] == [("readdress", "m")]
    last = decide(snap(40 * GIB, Level.NORMAL, movable, stuck, now=1391.0), one)
    assert [(a.step, a.subjob_id) for a in last] == [("reclaim", "m"), ("reclaim", "s")]
    assert all("waited at least the 500s a restart loses" in a.reason for a in later + last)
    # Without the rule, the configured waits alone: moved after 30 s.
    recent = [dataclasses.replace(x, suspended_since=960.0) for x in (movable, stuck)]
    assert decide(snap(40 * GIB, Level.NORMAL, *recent), one) == []
    no_wait = PolicyConfig(loss_wait_ratio=0.0)
    moved = decide(snap(40 * GIB, Level.NORMAL, *recent), no_wait)
    assert [(a.step, a.subjob_id) for a in moved] == [("readdress", "m")]


def test_no_lower_class_resumes_over_a_suspended_critical() -> None:
    # 30 GiB used, resume mark 60: the critical subjob (40) does not fit, the opportunistic
    # one (10) would, but it would then run while critical work waits on the same GPU.
    crit = sj("crit", priority=1, observed=40 * GIB, suspended=True, since=999.0)
    opp = sj("opp", priority=4, observed=10 * GIB, suspended=True, since=999.0)
    assert decide(snap(30 * GIB, Level.NORMAL, crit, opp), CFG) == []
    # Room for both: critical first, then the other.
    actions = decide(snap(5 * GIB, Level.NORMAL, crit, opp), CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("resume", "crit"), ("resume", "opp")]
    # Elsewhere (another GPU) the lower class resumes.
    away = dataclasses.replace(opp, slice_ids=("gpu1",))
    s = Snapshot(
        now=1000.0,
        slices=(
            SliceSignal("gpu0", 30 * GIB, TOTAL, Level.NORMAL),
            SliceSignal("gpu1", 30 * GIB, TOTAL, Level.NORMAL),
        ),
        subjobs=(crit, away),
    )
    assert [(a.step, a.subjob_id) for a in decide(s, CFG)] == [("resume", "opp")]


def test_next_deadline_is_the_first_wait_to_run_out() -> None:
    a = sj("a", suspended=True, since=990.0, work=10.0)  # readdress at 1020, reclaim at 1110
    b = sj("b", suspended=True, since=700.0, work=400.0)  # readdress and reclaim at 1100
    asked = dataclasses.replace(sj("c"), release_requested_since=999.0)  # wait ends 1001
    assert next_deadline(snap(40 * GIB, Level.NORMAL, a, b), CFG) == 1020.0
    assert next_deadline(snap(40 * GIB, Level.NORMAL, a, b, asked), CFG) == 1001.0
    handed = dataclasses.replace(a, readdress_requested=True)  # only its reclaim is left
    assert next_deadline(snap(40 * GIB, Level.NORMAL, handed), CFG) == 1110.0
    assert next_deadline(snap(40 * GIB, Level.NORMAL, sj("d")), CFG) is None
    # Deadlines passed without an action (a subjob that is not restartable is not moved)
    # change nothing any more.
    stuck = sj("s", suspended=True, since=900.0, restartable=False)
    assert next_deadline(snap(40 * GIB, Level.NORMAL, stuck), CFG) == 1020.0


def test_recently_suspended_and_no_room_waits() -> None:
    sub = sj("a", observed=70 * GIB, suspended=True, since=995.0)
    assert decide(snap(40 * GIB, Level.NORMAL, sub), CFG) == []


# ---- plan_room ----


def test_plan_room_uses_only_lower_priority() -> None:
    subjobs = (sj("p4", priority=4), sj("p3", priority=3), sj("p2", priority=2))
    s = snap(75 * GIB, Level.NORMAL, *subjobs)
    plan = plan_room(s, "gpu0", 15 * GIB, for_priority=2, config=CFG)
    assert plan is not None
    assert ids(plan) == ["p4"]
    plan = plan_room(s, "gpu0", 25 * GIB, for_priority=2, config=CFG)
    assert plan is not None and ids(plan) == ["p4", "p3"]
    assert plan_room(s, "gpu0", 30 * GIB, for_priority=2, config=CFG) is None
    assert plan_room(s, "gpu0", 5 * GIB, for_priority=2, config=CFG) == []
    assert plan_room(s, "nope", GIB, for_priority=2, config=CFG) is None


def test_bad_config_names_field() -> None:
    with pytest.raises(ValueError, match="target_ratio"):
        PolicyConfig(target_ratio=1.5)
    with pytest.raises(ValueError, match="max_readdress"):
        PolicyConfig(max_readdress=-1)


# ---- properties ----

subjob_strategy = st.builds(
    sj,
    subjob_id=st.sampled_from([f"s{i}" for i in range(12)]),
    priority=st.integers(1, 4),
    lifecycle=st.integers(1, 3),
    observed=st.integers(0, 20).map(lambda g: g * GIB),
    declared=st.integers(0, 20).map(lambda g: g * GIB),
    work=st.sampled_from([0.0, 5.0, 10.0]),
    suspended=st.booleans(),
    since=st.sampled_from([None, 900.0, 950.0, 990.0]),
    readdress=st.integers(0, 3),
    free_mode=st.sampled_from(["checkpoint", "release_signal", "none"]),
    restartable=st.booleans(),
)

snapshot_strategy = st.builds(
    lambda used, level, subs, to_critical: snap(used * GIB, level, *subs, to_critical=to_critical),
    st.integers(0, 80),
    st.sampled_from(list(Level)),
    st.lists(subjob_strategy, max_size=10, unique_by=lambda s: s.subjob_id),
    st.sampled_from([None, 0.0, 1.0, 5.0, math.inf]),
)


@settings(max_examples=150, deadline=None)
@given(snapshot_strategy)
def test_property_relief_reaches_target_when_possible(s: Snapshot) -> None:
    """(a) If the eligible victims' freeable bytes suffice, projected usage after the chosen
    relief actions is <= target_ratio * total."""
    sig = s.slices[0]
    if not predicts_critical(sig, CFG):
        running = {v.subjob_id for v in s.subjobs if not v.suspended}
        assert not [a for a in decide(s, CFG) if a.subjob_id in running and a.step != "resume"]
        return
    eligible = eligible_victims("gpu0", s.subjobs)
    if sig.level != Level.CRITICAL:  # on a prediction alone, no reclaim and none past one
        eligible = list(itertools.takewhile(lambda v: relief_step(v) != "reclaim", eligible))
    limit = CFG.target_ratio * sig.total_bytes
    if sig.used_bytes - sum(freed_per_slice(v) for v in eligible) > limit:
        return
    running = {v.subjob_id for v in s.subjobs if not v.suspended}
    relief = [a for a in decide(s, CFG) if a.subjob_id in running]
    assert sig.used_bytes - sum(a.expected_bytes_freed for a in relief) <= limit


@settings(max_examples=150, deadline=None)
@given(snapshot_strategy)
def test_property_victims_respect_class_order(s: Snapshot) -> None:
    """(b) Every chosen victim has a priority number >= that of every unchosen eligible running
    subjob on the slice (eligible = running, frees > 0, and not critical-protected); i.e. no
    higher-class subjob is taken while a lower-class freeable one is left running.
    Also: a priority-1 subjob is never chosen while a lower class runs on the slice."""
    running = [v for v in s.subjobs if not v.suspended]
    chosen = {a.subjob_id for a in decide(s, CFG)} & {v.subjob_id for v in running}
    eligible = eligible_victims("gpu0", s.subjobs)
    unchosen = [v for v in eligible if v.subjob_id not in chosen]
    for v in running:
        if v.subjob_id in chosen:
            assert all(v.priority >= u.priority for u in unchosen)
            if v.priority == 1:
                assert not any(r.priority > 1 for r in running)


@settings(max_examples=150, deadline=None)
@given(snapshot_strategy, st.randoms(use_true_random=False))
def test_property_deterministic_under_permutation(s: Snapshot, rnd: object) -> None:
    """(c) decide gives the same actions whatever the order of the input subjobs."""
    import random

    assert isinstance(rnd, random.Random)
    shuffled = list(s.subjobs)
    rnd.shuffle(shuffled)
    again = dataclasses.replace(s, subjobs=tuple(shuffled))
    assert decide(s, CFG) == decide(again, CFG)
    assert decide(s, CFG) == decide(s, CFG)


@settings(max_examples=150, deadline=None)
@given(snapshot_strategy)
def test_property_resumes_stay_within_resume_mark(s: Snapshot) -> None:
    """Resumes only on a NORMAL slice and never project usage above resume_ratio * total."""
    sig = s.slices[0]
    resumes = [a for a in decide(s, CFG) if a.step == "resume"]
    if resumes:
        assert sig.level == Level.NORMAL
    projected = sig.used_bytes - sum(a.expected_bytes_freed for a in resumes)
    if resumes:
        assert projected <= CFG.resume_ratio * sig.total_bytes


# ---- suspended by an operator ----


def test_an_operators_suspension_is_left_to_the_operator() -> None:
    """Suspended by a SignalSubjob, not by Airlock: on a calm slice it is not resumed, past
    every wait it is neither moved nor reclaimed, and it sets no deadline; Airlock's own
    suspension beside it is resumed, counting the memory the operator's one keeps."""

    def theirs(subjob_id: str, **kw: object) -> SubjobView:
        view = sj(subjob_id, suspended=True, since=0.0, **kw)  # type: ignore[arg-type]
        return dataclasses.replace(view, suspended_by_operator=True)

    calm = snap(50 * GIB, Level.NORMAL, theirs("op"), sj("al", suspended=True, since=990.0))
    assert [(a.step, a.subjob_id) for a in decide(calm, CFG)] == [("resume", "al")]
    # 50 GiB used (the operator's 10 GiB among them) + al's 10 GiB: 60 of 80 GiB
    assert "projected 60.0 GiB" in decide(calm, CFG)[0].reason
    late = snap(70 * GIB, Level.ELEVATED, theirs("op", priority=1), theirs("rd"), now=1e6)
    late = dataclasses.replace(
        late, subjobs=(*late.subjobs, dataclasses.replace(theirs("mv"), readdress_requested=True))
    )
    assert decide(late, CFG) == []
    assert next_deadline(late, CFG) is None
    # A critical one of theirs holds back no lower-class resume on its slice.
    both = snap(40 * GIB, Level.NORMAL, theirs("op", priority=1), sj("al", suspended=True))
    assert ids(decide(both, CFG)) == ["al"]


def test_host_pressure_may_reclaim_an_operators_suspension() -> None:
    """Its resident memory is on the host: it is a host victim like any subjob there."""
    view = dataclasses.replace(
        sj("op", suspended=True, since=0.0), suspended_by_operator=True, host_rss_bytes=8 * GIB
    )
    host = Snapshot(
        now=1.0,
        slices=(SliceSignal("gpu0", 10 * GIB, TOTAL, Level.NORMAL),),
        subjobs=(view,),
        host_used_bytes=95 * GIB,
        host_total_bytes=100 * GIB,
        host_level=Level.CRITICAL,
    )
    assert [(a.step, a.subjob_id, a.slice_id) for a in decide(host, CFG)] == [
        ("reclaim", "op", "host")
    ]
