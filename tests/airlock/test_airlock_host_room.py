"""The ladder under host-memory pressure, the re-address hand-off, and plan_room with milli."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_airlock.levels import Level
from laminar_airlock.policy import (
    GIB,
    HOST_SLICE_ID,
    PolicyConfig,
    SliceSignal,
    Snapshot,
    SubjobView,
    decide,
    host_victims,
    plan_room,
)

TOTAL = 80 * GIB
HOST = 100 * GIB
CFG = PolicyConfig()


def sj(subjob_id: str, **changes: object) -> SubjobView:
    base = SubjobView(
        subjob_id=subjob_id,
        job_id=f"job-{subjob_id}",
        slice_ids=("gpu0",),
        priority=4,
        lifecycle=3,
        declared_bytes=10 * GIB,
        observed_bytes=10 * GIB,
        started_at=0.0,
        work_since_checkpoint_seconds=10.0,
        suspended=False,
        suspended_since=None,
        readdress_count=0,
        free_mode="checkpoint",
        restartable=True,
        host_rss_bytes=4 * GIB,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def host_snap(
    host_used: int,
    host_level: Level,
    *subjobs: SubjobView,
    gpu_used: int = 10 * GIB,
    gpu_level: Level = Level.NORMAL,
) -> Snapshot:
    return Snapshot(
        now=1000.0,
        slices=(SliceSignal("gpu0", gpu_used, TOTAL, gpu_level),),
        subjobs=tuple(subjobs),
        host_used_bytes=host_used,
        host_total_bytes=HOST,
        host_level=host_level,
    )


# ---- host-memory relief ----


def test_host_pressure_reclaims_lowest_class_counting_rss() -> None:
    # 90 GiB used, target 85 GiB: needs 5 GiB; two 4 GiB victims, lowest class first.
    subjobs = [
        sj("crit", priority=1, host_rss_bytes=30 * GIB),
        sj("batch", priority=3),
        sj("opp-a", priority=4, work_since_checkpoint_seconds=5.0),
        sj("opp-b", priority=4, work_since_checkpoint_seconds=1.0),
    ]
    actions = decide(host_snap(90 * GIB, Level.ELEVATED, *subjobs), CFG)
    assert [(a.step, a.subjob_id, a.slice_id) for a in actions] == [
        ("reclaim", "opp-b", HOST_SLICE_ID),
        ("reclaim", "opp-a", HOST_SLICE_ID),
    ]
    assert actions[0].expected_bytes_freed == 4 * GIB
    assert "host memory at 90.0 GiB of 100.0 GiB (90.0%) > elevated mark" in actions[0].reason
    assert "frees 4.0 GiB host RSS" in actions[0].reason
    assert "a stop frees no host memory" in actions[0].reason


def test_host_normal_or_below_target_does_nothing() -> None:
    assert decide(host_snap(99 * GIB, Level.NORMAL, sj("a")), CFG) == []
    assert decide(host_snap(80 * GIB, Level.CRITICAL, sj("a")), CFG) == []


def test_host_critical_protected_while_a_lower_class_is_live_even_suspended() -> None:
    crit = sj("crit", priority=1, host_rss_bytes=40 * GIB)
    parked = sj("parked", priority=4, suspended=True, suspended_since=999.0, host_rss_bytes=GIB)
    actions = decide(host_snap(99 * GIB, Level.CRITICAL, crit, parked), CFG)
    assert [a.subjob_id for a in actions] == ["parked"]
    assert "(suspended)" in actions[0].reason
    assert "host stays above target" in actions[0].reason
    # Alone, a critical subjob may be the victim (no subjob is spared at the OOM edge).
    alone = decide(host_snap(99 * GIB, Level.CRITICAL, crit), CFG)
    assert [a.subjob_id for a in alone] == ["crit"]


def test_gpu_suspend_does_not_count_as_host_relief_but_gpu_reclaim_does() -> None:
    gpu_victim = sj("g", observed_bytes=20 * GIB, host_rss_bytes=6 * GIB)
    other = sj("o", slice_ids=("gpu1",), host_rss_bytes=6 * GIB)
    # GPU critical: "g" is suspended on gpu0; host still needs 5 GiB, so "o" is reclaimed.
    s = host_snap(
        90 * GIB, Level.ELEVATED, gpu_victim, other, gpu_used=79 * GIB, gpu_level=Level.CRITICAL
    )
    actions = decide(s, CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("suspend", "g"), ("reclaim", "o")]
    # Same, but "g" frees nothing by a stop, so the GPU ladder reclaims it: that RSS counts.
    s = dataclasses.replace(s, subjobs=(dataclasses.replace(gpu_victim, free_mode="none"), other))
    actions = decide(s, CFG)
    assert [(a.step, a.subjob_id) for a in actions] == [("reclaim", "g")]


def test_zero_rss_is_never_a_host_victim() -> None:
    assert host_victims([sj("a", host_rss_bytes=0)]) == []


host_subjobs = st.lists(
    st.builds(
        sj,
        subjob_id=st.sampled_from([f"s{i}" for i in range(10)]),
        priority=st.integers(1, 4),
        lifecycle=st.integers(1, 3),
        suspended=st.booleans(),
        suspended_since=st.just(999.0),
        host_rss_bytes=st.integers(0, 12).map(lambda g: g * GIB),
        work_since_checkpoint_seconds=st.sampled_from([0.0, 5.0]),
    ),
    max_size=8,
    unique_by=lambda s: s.subjob_id,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 100), st.sampled_from(list(Level)), host_subjobs)
def test_property_host_relief_reaches_target_and_respects_class(
    used_gib: int, level: Level, subjobs: list[SubjobView]
) -> None:
    """Host reclaims bring projected use under the target when the eligible RSS suffices,
    and never take a higher class while a lower-class eligible subjob is left."""
    s = host_snap(used_gib * GIB, level, *subjobs)
    host_actions = [a for a in decide(s, CFG) if a.slice_id == HOST_SLICE_ID]
    if level == Level.NORMAL:
        assert host_actions == []
        return
    limit = CFG.host_target_ratio * HOST
    eligible = host_victims(subjobs)
    if s.host_used_bytes - sum(v.host_rss_bytes for v in eligible) <= limit:
        assert s.host_used_bytes - sum(a.expected_bytes_freed for a in host_actions) <= limit
    chosen = {a.subjob_id for a in host_actions}
    by_id = {v.subjob_id: v for v in subjobs}
    left = [v for v in eligible if v.subjob_id not in chosen]
    for subjob_id in chosen:
        assert all(by_id[subjob_id].priority >= u.priority for u in left)
        if by_id[subjob_id].priority == 1:
            assert not any(v.priority > 1 for v in subjobs)


# ---- re-addressing hand-off ----


def test_readdress_is_requested_once_then_waits_for_the_zone() -> None:
    waiting = sj("a", observed_bytes=70 * GIB, suspended=True, suspended_since=960.0)
    s = host_snap(10 * GIB, Level.NORMAL, waiting, gpu_used=40 * GIB)
    assert [a.step for a in decide(s, CFG)] == ["readdress"]
    handed = dataclasses.replace(waiting, readdress_requested=True)
    s = dataclasses.replace(s, subjobs=(handed,))
    assert decide(s, CFG) == []
    # Even with room to resume, a handed-off subjob is left to the zone router.
    small = dataclasses.replace(handed, observed_bytes=GIB)
    assert decide(dataclasses.replace(s, subjobs=(small,)), CFG) == []


def test_handed_off_subjob_is_reclaimed_at_the_deadline() -> None:
    late = sj(
        "a",
        observed_bytes=70 * GIB,
        suspended=True,
        suspended_since=870.0,
        readdress_requested=True,
    )
    actions = decide(host_snap(10 * GIB, Level.NORMAL, late, gpu_used=40 * GIB), CFG)
    assert [a.step for a in actions] == ["reclaim"]
    assert "suspended 130.0s > reclaim after 120.0s" in actions[0].reason
    assert "re-addressing attempt 1/2 did not complete" in actions[0].reason


def test_readdress_count_from_earlier_copies_spends_the_budget() -> None:
    moved_twice = sj(
        "a", observed_bytes=70 * GIB, suspended=True, suspended_since=960.0, readdress_count=2
    )
    actions = decide(host_snap(10 * GIB, Level.NORMAL, moved_twice, gpu_used=40 * GIB), CFG)
    assert [a.step for a in actions] == ["reclaim"]


# ---- plan_room with milli (the ledger's view of a shared GPU) ----


def ledger_snap(used_bytes: int, used_milli: int, *subjobs: SubjobView) -> Snapshot:
    sig = SliceSignal("gpu0", used_bytes, TOTAL, Level.NORMAL, used_milli, 1000)
    return Snapshot(now=0.0, slices=(sig,), subjobs=subjobs)


def test_plan_room_frees_milli_and_skips_victims_that_add_nothing() -> None:
    # 900 milli and 30 GiB used. A share of 300 milli and 5 GiB needs 200 more milli.
    bytes_only = sj("bytes-only", priority=4, observed_bytes=20 * GIB, milli=0)
    milli_only = sj(
        "milli-only", priority=4, observed_bytes=0, milli=500, work_since_checkpoint_seconds=20.0
    )
    batch = sj("batch", priority=3, observed_bytes=10 * GIB, milli=400)
    s = ledger_snap(30 * GIB, 900, bytes_only, milli_only, batch)
    plan = plan_room(s, "gpu0", 5 * GIB, 2, CFG, needed_milli=300)
    assert plan is not None and [a.subjob_id for a in plan] == ["milli-only"]
    assert "300 milli needed on gpu0" in plan[0].reason
    # The whole GPU (all bytes and all milli) needs every holder gone.
    plan = plan_room(s, "gpu0", TOTAL, 2, CFG, needed_milli=1000)
    assert plan is not None
    assert sorted(a.subjob_id for a in plan) == ["batch", "bytes-only", "milli-only"]


def test_plan_room_never_takes_critical_or_equal_class() -> None:
    crit = sj("crit", priority=1, observed_bytes=40 * GIB, milli=500)
    prod = sj("prod", priority=2, observed_bytes=40 * GIB, milli=500)
    s = ledger_snap(TOTAL, 1000, crit, prod)
    assert plan_room(s, "gpu0", TOTAL, 2, CFG, needed_milli=1000) is None
    assert plan_room(s, "gpu0", TOTAL, 1, CFG, needed_milli=1000) is None
    assert plan_room(s, "gpu0", 10 * GIB, 2, CFG, needed_milli=2000) is None  # more than exists


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.builds(
            sj,
            subjob_id=st.sampled_from([f"s{i}" for i in range(8)]),
            priority=st.integers(1, 4),
            observed_bytes=st.integers(0, 20).map(lambda g: g * GIB),
            milli=st.integers(0, 250),
        ),
        max_size=6,
        unique_by=lambda s: s.subjob_id,
    ),
    st.integers(1, 4),
    st.integers(0, 80),
    st.integers(0, 1000),
)
def test_property_plan_room_makes_room_with_lower_classes_only(
    subjobs: list[SubjobView], for_priority: int, needed_gib: int, needed_milli: int
) -> None:
    used = min(TOTAL, sum(s.observed_bytes for s in subjobs))
    used_milli = min(1000, sum(s.milli for s in subjobs))
    s = ledger_snap(used, used_milli, *subjobs)
    plan = plan_room(s, "gpu0", needed_gib * GIB, for_priority, CFG, needed_milli=needed_milli)
    by_id = {v.subjob_id: v for v in subjobs}
    lower = [v for v in subjobs if v.priority > for_priority]
    can = TOTAL - used + sum(v.observed_bytes for v in lower) >= needed_gib * GIB and (
        1000 - used_milli + sum(v.milli for v in lower) >= needed_milli
    )
    assert (plan is not None) == can
    if plan is not None:
        victims = [by_id[a.subjob_id] for a in plan]
        assert all(v.priority > for_priority for v in victims)
        assert TOTAL - used + sum(v.observed_bytes for v in victims) >= needed_gib * GIB
        assert 1000 - used_milli + sum(v.milli for v in victims) >= needed_milli
