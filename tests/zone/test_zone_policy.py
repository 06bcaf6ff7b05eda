"""Pure placement and queue policy: no sockets, no processes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar_base.demand import Demand
from laminar_zone.config import Quota
from laminar_zone.placement import (
    Offer,
    ReleaseCurve,
    ShapeCap,
    assign_gang,
    best_offers,
    choose_weighted,
    expected_start,
    flow_weight,
    members_fitting,
)
from laminar_zone.queue import QueueItem, may_backfill, order_key, quota_block, why_waiting
from laminar_zone.reasons import Reason
from laminar_zone.view import ZoneView

GIB = 1024**3


def test_members_fitting_reads_summaries_like_the_ledger() -> None:
    shapes = {
        "gpu:H100-80GB": ShapeCap(free=3, total=4, max_free_memory_bytes=80 * GIB),
        "mig:3g.40gb": ShapeCap(free=1, total=2, max_free_memory_bytes=40 * GIB),
        "share:A100-80GB": ShapeCap(
            free=1, total=1, max_free_milli=400, max_free_memory_bytes=30 * GIB
        ),
    }
    assert members_fitting(Demand(gpus=1), shapes) == 3
    assert members_fitting(Demand(gpus=2), shapes) == 1
    assert members_fitting(Demand(gpus=2), shapes, total=True) == 2
    assert members_fitting(Demand(gpus=1, gpu_model="A100-80GB"), shapes) == 0
    assert members_fitting(Demand(mig_profile="3g.40gb"), shapes) == 1
    assert members_fitting(Demand(mig_profile="3g.40gb", gpu_memory_bytes=50 * GIB), shapes) == 0
    assert members_fitting(Demand(gpu_milli=400, gpu_memory_bytes=30 * GIB), shapes) == 1
    assert members_fitting(Demand(gpu_milli=500), shapes) == 0
    assert members_fitting(Demand(), shapes) > 1000  # CPU-only fits anywhere


def test_gang_prefers_fewest_hosts_and_needs_every_member() -> None:
    offers = [
        Offer("l1", "a", 0, 0.5),
        Offer("l2", "b", 0, 0.9),
        Offer("l3", "b", 1, 0.8),
        Offer("l4", "c", 0, 0.7),
    ]
    chosen = assign_gang(offers, 2)
    assert chosen is not None and {o.agent_id for o in chosen} == {"b"}
    three = assign_gang(offers, 3)
    assert three is not None and len({o.lease_id for o in three}) == 3
    assert assign_gang(offers, 5) is None


@given(
    st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 3), st.floats(0, 1)), max_size=12),
    st.integers(1, 6),
)
def test_gang_assignment_never_reuses_a_lease(raw: list[tuple[str, int, float]], gang: int) -> None:
    offers = [Offer(f"l{i}", a, m, s) for i, (a, m, s) in enumerate(raw)]
    chosen = assign_gang(offers, gang)
    if chosen is None:
        # Short only when the distinct (agent, member) offers cannot cover the gang.
        assert len({(o.agent_id, o.member) for o in offers}) < gang
        return
    assert len(chosen) == gang
    assert len({o.lease_id for o in chosen}) == gang


def test_late_binding_picks_the_best_score_then_agent_id() -> None:
    offers = [Offer("x", "b", 0, 0.5), Offer("y", "a", 0, 0.5), Offer("z", "c", 0, 0.9)]
    assert [o.lease_id for o in best_offers(offers)] == ["z", "y", "x"]


def test_flow_weight_formula_and_stale_zones_never_drawn() -> None:
    assert flow_weight(3, 1, 1.0) == pytest.approx(2.0)
    assert flow_weight(3, 1, 2.0) == pytest.approx(1.0)
    rng = random.Random(7)
    draws = [choose_weighted([("a", 1.0), ("b", 3.0), ("stale", 0.0)], rng) for _ in range(4000)]
    assert "stale" not in draws
    assert draws.count("b") / len(draws) == pytest.approx(0.75, abs=0.03)
    with pytest.raises(ValueError):
        choose_weighted([("x", 0.0)], rng)


def test_expected_start_accumulates_releases_in_time_order() -> None:
    releases = [(130.0, 1.0), (110.0, 1.0), (150.0, 2.0)]
    assert expected_start(100.0, 0.0, releases, 0.0, 1.0) == 110.0
    assert expected_start(100.0, 0.0, releases, 1.0, 1.0) == 130.0
    assert expected_start(100.0, 0.0, releases, 1.0, 2.0) == 150.0
    assert expected_start(100.0, 0.0, releases, 4.0, 1.0) is None
    assert expected_start(100.0, 2.0, releases, 1.0, 1.0) == 100.0


@given(
    releases=st.lists(
        st.tuples(st.floats(0, 1e6), st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 8.0])),
        max_size=40,
    ),
    asks=st.lists(
        st.tuples(st.floats(0, 64), st.sampled_from([0.1, 0.5, 1.0, 4.0]), st.floats(0, 8)),
        min_size=1,
        max_size=20,
    ),
)
def test_one_release_curve_answers_every_question_as_a_fresh_scan(
    releases: list[tuple[float, float]], asks: list[tuple[float, float, float]]
) -> None:
    """A queue pass asks one family's curve once per waiting job: the same answers as
    accumulating the sorted releases afresh for each."""

    def scan(free: float, ahead: float, needed: float) -> float | None:
        want = ahead + needed - free
        if want <= 1e-9:
            return 100.0
        freed = 0.0
        for at, units in sorted(releases):
            freed += units
            if freed + 1e-9 >= want:
                return max(100.0, at)
        return None

    curve = ReleaseCurve(releases)
    for ahead, needed, free in asks:
        assert curve.start(100.0, free, ahead, needed) == scan(free, ahead, needed)


def _item(
    job: str, priority: int = 3, tenant: str = "t", submitted: float = 0.0, **need: int
) -> QueueItem:
    return QueueItem(job, priority, tenant, submitted, Demand(**need or {"gpus": 1}), 1, 0.0)


def test_queue_order_is_priority_then_fair_share_then_age() -> None:
    items = [
        _item("old-batch", 3, "heavy", 1.0),
        _item("new-prod", 2, "heavy", 9.0),
        _item("light-batch", 3, "light", 5.0),
    ]
    usage = {"heavy": 8.0, "light": 1.0}
    ordered = sorted(items, key=lambda i: order_key(i, usage, {}))
    assert [i.job_id for i in ordered] == ["new-prod", "light-batch", "old-batch"]
    # A bigger share makes the heavy tenant's usage count for less.
    ordered = sorted(items, key=lambda i: order_key(i, usage, {"heavy": 16.0}))
    assert [i.job_id for i in ordered] == ["new-prod", "old-batch", "light-batch"]


def test_backfill_only_when_it_ends_before_the_blocked_head_starts() -> None:
    quick = QueueItem("q", 3, "t", 0.0, Demand(gpus=1), 1, expected_seconds=30)
    unknown = QueueItem("u", 3, "t", 0.0, Demand(gpus=1), 1, expected_seconds=0)
    assert may_backfill(quick, now=100.0, head_expected_start=140.0)
    assert not may_backfill(quick, now=100.0, head_expected_start=120.0)
    assert not may_backfill(unknown, now=100.0, head_expected_start=1e9)
    assert not may_backfill(quick, now=100.0, head_expected_start=None)


def test_quota_block_names_tenant_and_numbers() -> None:
    item = QueueItem("j", 3, "alice", 0.0, Demand(gpus=1, gpu_memory_bytes=40 * GIB), 2, 0.0)
    assert quota_block(item, None, 10.0, 0) == ""
    assert quota_block(item, Quota(max_gpus=4), 2.0, 0) == ""
    text = quota_block(item, Quota(max_gpus=4), 3.0, 0)
    assert text.startswith("waiting for quota: tenant alice runs 3 of 4 GPUs")
    assert "GPU memory" in quota_block(item, Quota(max_gpu_memory_bytes=100 * GIB), 0.0, 40 * GIB)


def test_explanation_reads_like_the_issue_example() -> None:
    why = why_waiting(
        Demand(mig_profile="3g.40gb"),
        gang_size=1,
        hosts_ready=12,
        hosts_matching=2,
        hosts_fitting=0,
        position=3,
        expected_start=140.0,
        now=100.0,
    )
    assert why.text == (
        "no host with a free 3g.40gb slice; 2 of 12 hosts match; queue position 3; "
        "expected start in about 40 s"
    )
    assert why.token == "resources"


def _view_with(n: int, free_every: int) -> ZoneView:
    view = ZoneView(stale_after_seconds=3.0)
    for i in range(n):
        free = 1 if i % free_every == 0 else 0
        view.update(
            f"a{i}",
            f"127.0.0.1:{i}",
            {"gpu:H100-80GB": ShapeCap(free, 1, 0, 80 * GIB)},
            heat=0,
            draining=False,
            now=0.0,
        )
    return view


def test_sampling_returns_only_fitting_ready_agents_and_excludes() -> None:
    view = _view_with(100, free_every=10)
    rng = random.Random(1)
    got = view.sample(Demand(gpus=1), 4, rng)
    assert len(got) == 4
    assert all(members_fitting(Demand(gpus=1), r.shapes) for r in got)
    assert len({r.agent_id for r in got}) == 4
    rest = view.sample(Demand(gpus=1), 20, rng, exclude={r.agent_id for r in got})
    assert len(rest) == 6 and not {r.agent_id for r in rest} & {r.agent_id for r in got}
    view.set_draining("a0", True)
    assert "a0" not in {r.agent_id for r in view.sample(Demand(gpus=1), 10, rng)}


def test_sampling_work_does_not_grow_with_zone_size() -> None:
    """The index holds only agents with room: the draw touches O(k) entries at any size."""
    rng = random.Random(3)
    calls = 0

    class Counting(dict[str, object]):
        def __getitem__(self, key: str) -> object:
            nonlocal calls
            calls += 1
            return dict.__getitem__(self, key)

    for n in (100, 10_000):
        view = _view_with(n, free_every=2)
        calls = 0
        view.agents = Counting(view.agents)  # type: ignore[assignment]
        assert len(view.sample(Demand(gpus=1), 4, rng)) == 4
        assert calls <= 8 * 4 + 16


def test_stale_agents_drop_out_and_come_back() -> None:
    view = _view_with(3, free_every=1)
    assert [r.agent_id for r in view.sweep(now=10.0)] == ["a0", "a1", "a2"]
    assert view.sample(Demand(gpus=1), 3, random.Random(0)) == []
    update = view.update(
        "a1",
        "127.0.0.1:1",
        {"gpu:H100-80GB": ShapeCap(1, 1, 0, 80 * GIB)},
        heat=0,
        draining=False,
        now=11.0,
    )
    assert update.came_back
    assert [r.agent_id for r in view.sample(Demand(gpus=1), 3, random.Random(0))] == ["a1"]


@pytest.mark.parametrize(
    ("ready", "matching", "fitting", "members", "blocked_by", "code"),
    [
        (0, 0, 0, None, "", Reason.NO_MATCHING_HOST),
        (3, 0, 0, None, "", Reason.NO_MATCHING_HOST),
        (3, 2, 0, 1, "", Reason.TOO_LARGE),
        (3, 2, 1, None, "j-head", Reason.PRIORITY),
        (3, 2, 0, None, "", Reason.RESOURCES),
        (3, 2, 2, None, "", Reason.RESOURCES),
    ],
)
def test_every_waiting_explanation_has_a_reason_code(
    ready: int, matching: int, fitting: int, members: int | None, blocked_by: str, code: Reason
) -> None:
    why = why_waiting(
        Demand(gpus=1),
        gang_size=2,
        hosts_ready=ready,
        hosts_matching=matching,
        hosts_fitting=fitting,
        position=1,
        expected_start=None,
        now=0.0,
        blocked_by=blocked_by,
        members_total=members,
    )
    assert Reason[why.token.upper()] is code and why.text
