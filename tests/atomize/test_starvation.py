"""``srpt``'s starvation guard (issue 17, the tail): least work left first, except that a job
in the system longer than its patience (a multiple of its work left plus a floor) outranks
every job that is not, so a stream of short jobs cannot hold a long one back for ever."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_zone.market import (
    SRPT_HALF_SECONDS,
    Bid,
    Bidder,
    ClearingContext,
    MarketWindow,
    clearing_round,
    contract_from,
    patience_seconds,
    score,
)

GIB = 1024**3
DAY = 86400.0


def window(slice_id: str = "gpu0", holder: str = "") -> MarketWindow:
    return MarketWindow("a1", slice_id, 40 * GIB, 1000, 3600.0, held_by=holder)


def bidder(job: str, units: int, waited: float, priority: int = 3, holds: str = "") -> Bidder:
    """A job of ``units`` units of 60 s at the median (work left: units x 60 s + 30 s)."""
    c = contract_from(
        total_units=units,
        seconds_per_unit=[(0.5, 60.0), (0.95, 66.0), (1.0, 70.0)],
        peak_memory_bytes=[(0.5, 8 * GIB), (1.0, 10 * GIB)],
        checkpoint_overhead_seconds=30.0,
    )
    return Bidder(job, "t", c, c.profile, 0, waited, priority, ("a1", holds) if holds else None)


def winner(bidders: list[Bidder], ctx: ClearingContext, windows: list[MarketWindow]) -> str:
    _, awards = clearing_round(bidders, windows, "srpt", ctx)
    (award,) = awards
    return award.bid.job_id


def bid_of(units: int, waited: float, ctx: ClearingContext) -> Bid:
    bids, _ = clearing_round([bidder("j", units, waited)], [window()], "srpt", ctx)
    return bids[0]


def test_patience_is_the_ratio_times_work_left_plus_the_floor() -> None:
    ctx = ClearingContext(starvation_ratio=4.0, starvation_floor_seconds=DAY)
    bid = bid_of(1440, 0.0, ctx)  # a day of work (plus the checkpoint)
    assert patience_seconds(bid, ctx) == 4.0 * (1440 * 60.0 + 30.0 + DAY)
    assert math.isinf(patience_seconds(bid, ClearingContext(starvation_ratio=0.0)))


def test_a_long_job_loses_to_a_short_newcomer_until_its_patience_runs_out() -> None:
    ctx = ClearingContext(starvation_ratio=2.0, starvation_floor_seconds=3600.0)
    patience = patience_seconds(bid_of(600, 0.0, ctx), ctx)  # 10 h of work: 22 h patience
    short = bidder("short", 10, 0.0)
    assert winner([bidder("long", 600, patience - 60.0), short], ctx, [window()]) == "short"
    assert winner([bidder("long", 600, patience), short], ctx, [window()]) == "long"
    # Pure SRPT (no guard): the long job loses however long it waited.
    pure = ClearingContext(starvation_ratio=0.0)
    assert winner([bidder("long", 600, 100 * DAY), short], pure, [window()]) == "short"


def test_a_starved_job_never_jumps_a_higher_class() -> None:
    ctx = ClearingContext(starvation_ratio=1.0, starvation_floor_seconds=0.0)
    starved = bidder("starved", 600, 100 * DAY, priority=4)
    assert winner([starved, bidder("prod", 600, 0.0, priority=2)], ctx, [window()]) == "prod"


def test_a_starved_incumbent_keeps_its_slice_against_a_short_job_of_its_class() -> None:
    ctx = ClearingContext(starvation_ratio=2.0, starvation_floor_seconds=3600.0)
    held = [window(holder="long")]
    short = bidder("short", 10, 0.0)
    fresh = bidder("long", 600, 0.0, holds="gpu0")
    assert winner([fresh, short], ctx, held) == "short"  # displaced: srpt, short work first
    starved = bidder("long", 600, 30 * DAY, holds="gpu0")
    assert winner([starved, short], ctx, held) == "long"


def test_a_stream_of_short_jobs_holds_a_long_one_back_only_for_its_patience() -> None:
    """One slice, a new short job every hour: the long job starts at the first round past
    its patience under the guard, never under pure SRPT."""
    for ratio, expect_start in ((2.0, True), (0.0, False)):
        ctx = ClearingContext(starvation_ratio=ratio, starvation_floor_seconds=3600.0)
        patience = 2.0 * (600 * 60.0 + 30.0 + 3600.0)
        started_at = None
        for hour in range(60):
            waited = hour * 3600.0
            got = winner(
                [bidder("long", 600, waited), bidder(f"s{hour}", 10, 0.0)], ctx, [window()]
            )
            if got == "long":
                started_at = waited
                break
        if expect_start:
            assert started_at == math.ceil(patience / 3600.0) * 3600.0
        else:
            assert started_at is None


@settings(max_examples=200, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.integers(1, 5000), st.floats(0, 60 * DAY)), min_size=2, max_size=8),
    ratio=st.sampled_from([0.5, 2.0, 4.0, 8.0]),
    floor=st.sampled_from([0.0, 3600.0, DAY]),
)
def test_starved_jobs_rank_above_the_rest_and_the_others_keep_srpt_order(
    jobs: list[tuple[int, float]], ratio: float, floor: float
) -> None:
    ctx = ClearingContext(starvation_ratio=ratio, starvation_floor_seconds=floor)
    bids = [bid_of(units, waited, ctx) for units, waited in jobs]
    starved = [b for b in bids if b.waited_seconds >= patience_seconds(b, ctx)]
    others = [b for b in bids if b.waited_seconds < patience_seconds(b, ctx)]
    for b in others:  # untouched by the guard: pure SRPT
        assert score(b, "srpt", ctx) == SRPT_HALF_SECONDS / (
            SRPT_HALF_SECONDS + b.remaining_seconds
        )
        assert score(b, "srpt", ctx) <= 1.0
    for b in starved:
        assert 1.5 <= score(b, "srpt", ctx) < 2.0
        assert all(score(b, "srpt", ctx) > score(o, "srpt", ctx) for o in others)
    # Among the starved, the more overdue for its size (waited / patience) ranks first
    # (overdue by more than float resolution: waits one ulp apart score alike).
    for a in starved:
        for b in starved:
            overdue_a = a.waited_seconds / patience_seconds(a, ctx)
            overdue_b = b.waited_seconds / patience_seconds(b, ctx)
            if overdue_a > overdue_b * (1.0 + 1e-9):
                assert score(a, "srpt", ctx) > score(b, "srpt", ctx)
