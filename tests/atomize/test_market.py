"""The atomization market's pure core: contracts, feasibility, bids, clearing, calibration."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_base.errors import InvalidArgument
from laminar_zone.market import (
    Bid,
    Bidder,
    Calibrator,
    ClearingContext,
    Contract,
    MarketWindow,
    Profile,
    Quantiles,
    best_bid,
    clear,
    contract_from,
    feasibility,
    round_bids,
    work_left_seconds,
)

GIB = 1024**3


def contract(**overrides: object) -> object:
    fields: dict[str, object] = {
        "total_units": 100,
        "seconds_per_unit": [(0.5, 1.0), (0.95, 2.0), (1.0, 3.0)],
        "peak_memory_bytes": [(0.5, 8 * GIB), (0.95, 10 * GIB), (1.0, 12 * GIB)],
        "checkpoint_overhead_seconds": 5.0,
        "min_units": 2,
        "max_units": 50,
        "epsilon": 0.05,
    }
    fields.update(overrides)
    return contract_from(**fields)  # type: ignore[arg-type]


def window(length: float = 60.0, memory: int = 40 * GIB, slice_id: str = "gpu0") -> MarketWindow:
    return MarketWindow("a1", slice_id, memory, 1000, length)


# ---- contracts ----


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"total_units": 0}, "spec.atomization.total_units"),
        ({"min_units": 60}, "spec.atomization.min_units"),
        ({"max_units": 200}, "spec.atomization.max_units"),
        ({"epsilon": 0.7}, "spec.atomization.epsilon"),
        ({"checkpoint_overhead_seconds": -1.0}, "spec.atomization.checkpoint_overhead_seconds"),
        ({"seconds_per_unit": []}, "spec.atomization.seconds_per_unit"),
        ({"seconds_per_unit": [(0.5, 2.0), (0.9, 1.0)]}, "spec.atomization.seconds_per_unit[1]"),
        ({"peak_memory_bytes": [(1.5, 1.0)]}, "spec.atomization.peak_memory_bytes[0]"),
    ],
)
def test_invalid_contracts_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        contract(**overrides)
    assert err.value.field == field


def test_defaults_fill_in() -> None:
    c = contract_from(total_units=10, seconds_per_unit=[(0.9, 1.0)], peak_memory_bytes=[(0.9, GIB)])
    assert (c.min_units, c.max_units, c.epsilon) == (1, 10, 0.05)


# ---- feasibility and bids ----


def test_feasibility_reads_the_quantiles() -> None:
    c = contract()
    # 10 units need 10 x 2.0 s at the 95th percentile, +5 s overhead: a 25 s window is enough.
    assert feasibility(c.profile, 10, window(25.0), 5.0) == pytest.approx(0.95 * 1.0)
    # Memory: 10 GiB is the 95th percentile, so a 10 GiB window is feasible at 0.95 only.
    assert feasibility(c.profile, 1, window(1e9, memory=10 * GIB), 0.0) == pytest.approx(0.95)
    assert feasibility(c.profile, 1, window(1e9, memory=4 * GIB), 0.0) == 0.0
    assert feasibility(c.profile, 10, window(5.0), 5.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 500.0), st.integers(1, 99))
def test_feasibility_never_grows_with_units(length: float, units: int) -> None:
    c = contract()
    w = window(length)
    assert feasibility(c.profile, units + 1, w, 5.0) <= feasibility(c.profile, units, w, 5.0)


def test_best_bid_takes_the_most_units_that_fit_with_1_minus_epsilon() -> None:
    c = contract()
    bid = best_bid("j", "t", c, c.profile, window(65.0), next_unit=0, waited_seconds=0.0)
    assert bid is not None
    # (65 - 5) / 2.0 s per unit at the 95th percentile = 30 units.
    assert bid.unit_count == 30 and bid.unit_start == 0
    assert bid.feasibility >= 0.95
    assert feasibility(c.profile, 31, window(65.0), 5.0) < 0.95
    # Too short for even min_units: no bid. The last units: only what is left.
    assert best_bid("j", "t", c, c.profile, window(8.0), 0, 0.0) is None
    tail = best_bid("j", "t", c, c.profile, window(1e6), 97, 0.0)
    assert tail is not None and (tail.unit_start, tail.unit_count) == (97, 3)
    assert best_bid("j", "t", c, c.profile, window(1e6), 100, 0.0) is None


# ---- clearing ----


def bid(job: str, tenant: str, expected: float, waited: float, slice_id: str = "gpu0") -> Bid:
    return Bid(job, tenant, window(100.0, slice_id=slice_id), 0, 10, 0.99, expected, waited)


def test_work_left_is_what_srpt_ranks_a_bid_by() -> None:
    """``work_left_seconds``: the units left at the profile's median, plus one checkpoint;
    the same figure a bid carries (``remaining_seconds``), and 0 once every unit is done."""
    c = contract()
    assert isinstance(c, Contract)
    assert work_left_seconds(c, c.profile, 40) == pytest.approx(60 * 1.0 + 5.0)
    bid = best_bid("j", "t", c, c.profile, window(), 40, 0.0)
    assert bid is not None
    assert bid.remaining_seconds == work_left_seconds(c, c.profile, 40)
    assert work_left_seconds(c, c.profile, 100) == 0.0


def test_each_policy_prefers_what_it_is_for() -> None:
    big = bid("big", "a", expected=90.0, waited=0.0)
    starved = bid("starved", "b", expected=10.0, waited=0.0)
    old = bid("old", "a", expected=10.0, waited=600.0)
    ctx = ClearingContext(usage={"a": 1000.0, "b": 0.0})
    assert clear([big, starved, old], "utilization", ctx)[0].bid.job_id == "big"
    assert clear([big, starved, old], "fair", ctx)[0].bid.job_id == "starved"
    assert clear([big, starved, old], "responsive", ctx)[0].bid.job_id == "old"
    blend = clear([big, starved, old], "blend", ctx)
    assert len(blend) == 1  # one window, one winner


def test_one_window_per_winner_and_one_win_per_job() -> None:
    bids = [
        bid("j1", "a", 50.0, 0.0, "gpu0"),
        bid("j1", "a", 40.0, 0.0, "gpu1"),
        bid("j2", "a", 30.0, 0.0, "gpu0"),
    ]
    awards = clear(bids, "utilization")
    assert [(a.bid.job_id, a.bid.window.slice_id) for a in awards] == [("j1", "gpu0")]


def test_ties_break_deterministically_on_ids() -> None:
    bids = [bid(f"j{i}", "a", 50.0, 0.0) for i in (3, 1, 2)]
    for order in (bids, list(reversed(bids))):
        assert clear(order, "utilization")[0].bid.job_id == "j1"
    with pytest.raises(InvalidArgument) as err:
        clear(bids, "cheapest")
    assert err.value.field == "market.policy"


# ---- calibration ----


def test_calibration_brings_the_violation_rate_to_epsilon() -> None:
    # Declared: 1 s per unit at the 95th percentile. True: lognormal with median 1.5 s, so
    # the declaration is overrun about 70% of the time before calibration.
    declared = Profile(Quantiles(((0.5, 0.7), (0.95, 1.0))), Quantiles(((0.95, GIB),)))
    cal = Calibrator(declared, epsilon=0.05)
    rng = random.Random(7)
    draws = [math.exp(rng.gauss(math.log(1.5), 0.3)) for _ in range(3000)]
    before = sum(d > 1.0 for d in draws[:500]) / 500
    assert before > 0.5
    for d in draws[:500]:
        cal.observe(d, GIB / 2)
    q95 = cal.profile().seconds_per_unit.value_at(0.95)
    after = sum(d > q95 for d in draws[500:]) / len(draws[500:])
    assert abs(after - 0.05) < 0.03, after


def test_an_overrun_widens_at_once_and_the_next_observation_takes_over() -> None:
    declared = Profile(Quantiles(((0.95, 1.0),)), Quantiles(((0.95, GIB),)))
    cal = Calibrator(declared, epsilon=0.05)
    base = cal.profile().seconds_per_unit.value_at(0.95)
    cal.overran(2.0)
    assert cal.profile().seconds_per_unit.value_at(0.95) == pytest.approx(2 * base)
    assert cal.observe(3.0, GIB / 2) is True  # beyond even the widened prediction
    assert cal.violation_rate == 1.0
    assert cal.profile().seconds_per_unit.value_at(0.95) == pytest.approx(3.0)


def test_priority_class_clears_before_score_and_ties_stay_deterministic() -> None:
    from dataclasses import replace

    rich = replace(bid("opp", "a", expected=95.0, waited=900.0), priority=4)
    prod = replace(bid("prod", "b", expected=5.0, waited=0.0), priority=2)
    for policy in ("utilization", "fair", "responsive", "blend"):
        awards = clear([rich, prod], policy)
        assert [a.bid.job_id for a in awards] == ["prod"], policy  # one window: prod takes it
    two = [rich, replace(prod, window=window(100.0, slice_id="gpu1"))]
    assert {a.bid.job_id for a in clear(two, "blend")} == {"opp", "prod"}


def test_a_window_cut_widens_time_only_and_a_memory_kill_memory_only() -> None:
    declared = Profile(Quantiles(((0.95, 1.0),)), Quantiles(((0.95, GIB),)))
    cal = Calibrator(declared, epsilon=0.05)
    cal.overran(2.0, time=True, memory=False)
    assert cal.profile().seconds_per_unit.value_at(0.95) == pytest.approx(2.0)
    assert cal.profile().peak_memory_bytes.value_at(0.95) == pytest.approx(GIB)
    cal.overran(1.5, time=False, memory=True)
    assert cal.profile().peak_memory_bytes.value_at(0.95) == pytest.approx(1.5 * GIB)
    assert cal.profile().seconds_per_unit.value_at(0.95) == pytest.approx(2.0)
    # The default keeps the empirical quantile's coverage: ceil(1 / epsilon) - 1 samples.
    assert cal.min_samples == 19


def test_a_memory_widening_past_every_slice_is_dropped_so_the_job_can_run_again() -> None:
    declared = Profile(Quantiles(((0.95, 1.0),)), Quantiles(((0.95, 8 * GIB),)))
    cal = Calibrator(declared, epsilon=0.05)
    cal.overran(1.5, time=True, memory=True)  # 12 GiB predicted: fits a 16 GiB slice
    profile, reset = cal.believed(16 * GIB)
    assert not reset and profile.peak_memory_bytes.value_at(0.95) == pytest.approx(12 * GIB)
    assert cal.believed(0) == (cal.profile(), False)  # no slice known yet: kept
    cal.overran(1.5, time=False, memory=True)  # 18 GiB: above every slice
    profile, reset = cal.believed(16 * GIB)
    assert reset and profile.peak_memory_bytes.value_at(0.95) == pytest.approx(8 * GIB)
    assert profile.seconds_per_unit.value_at(0.95) == pytest.approx(1.5)  # time stays widened
    assert cal.believed(16 * GIB) == (profile, False)


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.integers(0, 95),  # next unit
            st.floats(0.0, 600.0),  # waited
            st.sampled_from([1, 2, 3, 4]),  # priority
            st.sampled_from(["a", "b", "c"]),  # tenant
        ),
        min_size=1,
        max_size=8,
    ),
    windows=st.lists(
        st.tuples(
            st.sampled_from([10 * GIB, 20 * GIB, 40 * GIB]),
            st.sampled_from([30.0, 60.0, 200.0, math.inf]),
            st.sampled_from(["mig", "gpu"]),
        ),
        min_size=1,
        max_size=12,
    ),
    policy=st.sampled_from(["utilization", "fair", "responsive", "blend"]),
)
def test_pricing_alike_windows_once_gives_the_same_awards_as_bidding_on_each(
    jobs: list[tuple[int, float, int, str]],
    windows: list[tuple[int, float, str]],
    policy: str,
) -> None:
    c = contract()
    assert isinstance(c, Contract)
    bidders = [
        Bidder(f"j{i}", tenant, c, c.profile, unit, waited, prio)
        for i, (unit, waited, prio, tenant) in enumerate(jobs)
    ]
    offered = [
        MarketWindow(f"h{i % 3}", f"s{i}", mem, 1000, length, tag)
        for i, (mem, length, tag) in enumerate(windows)
    ]

    def only_gpu_for_even(b: Bidder, w: MarketWindow) -> bool:
        return w.tag == "gpu" or int(b.job_id[1:]) % 2 == 1

    naive = [
        bid
        for b in bidders
        for w in offered
        if only_gpu_for_even(b, w)
        and (
            bid := best_bid(
                b.job_id, b.tenant, c, b.profile, w, b.next_unit, b.waited_seconds, b.priority
            )
        )
        is not None
    ]
    ctx = ClearingContext(usage={"a": 50.0, "b": 10.0})
    grouped = round_bids(bidders, offered, only_gpu_for_even)
    assert len(grouped) <= len(naive)
    expected = [(a.bid.job_id, a.bid.window.key, a.score) for a in clear(naive, policy, ctx)]
    got = [(a.bid.job_id, a.bid.window.key, a.score) for a in clear(grouped, policy, ctx)]
    assert got == expected
