"""Incumbency in the market's core: a piece whose window ends keeps its slice unless a bid
of a higher class, or of its class better by the hysteresis, wants it (issue 17)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.demand import Demand
from laminar_zone.atomizer import Atomizer
from laminar_zone.config import ZoneConfig
from laminar_zone.entry import Entry
from laminar_zone.market import (
    Bidder,
    ClearingContext,
    Contract,
    MarketWindow,
    assured_progress,
    clearing_round,
    contract_from,
    score,
)

GIB = 1024**3
POLICIES = ["utilization", "fair", "responsive", "srpt", "slowdown", "blend"]


def contract(total: int = 100) -> Contract:
    return contract_from(
        total_units=total,
        seconds_per_unit=[(0.5, 1.0), (0.95, 2.0), (1.0, 3.0)],
        peak_memory_bytes=[(0.5, 8 * GIB), (0.95, 10 * GIB), (1.0, 12 * GIB)],
        checkpoint_overhead_seconds=5.0,
    )


def held(slice_id: str, holder: str, length: float = 600.0) -> MarketWindow:
    return MarketWindow("a1", slice_id, 40 * GIB, 1000, length, held_by=holder)


def free(slice_id: str, length: float = 600.0) -> MarketWindow:
    return MarketWindow("a1", slice_id, 40 * GIB, 1000, length)


def bidder(
    job: str, priority: int = 3, waited: float = 0.0, holds: str = "", total: int = 100
) -> Bidder:
    c = contract(total)
    return Bidder(job, "t", c, c.profile, 0, waited, priority, ("a1", holds) if holds else None)


def outcome(
    bidders: list[Bidder], windows: list[MarketWindow], policy: str = "responsive", h: float = 0.1
) -> dict[str, str]:
    """slice -> the job it went to."""
    _, awards = clearing_round(bidders, windows, policy, ClearingContext(hysteresis=h))
    return {a.bid.window.slice_id: a.bid.job_id for a in awards}


def test_an_uncontended_piece_keeps_its_slice() -> None:
    _, awards = clearing_round(
        [bidder("run", holds="gpu0")], [held("gpu0", "run")], "blend", ClearingContext()
    )
    (award,) = awards
    assert award.bid.incumbent and award.bid.window.key == ("a1", "gpu0")


def test_a_holder_bids_on_its_own_slice_only() -> None:
    bids, awards = clearing_round(
        [bidder("run", holds="gpu0")],
        [free("gpu1"), held("gpu0", "run"), held("gpu2", "other")],
        "blend",
        ClearingContext(),
    )
    assert {b.window.slice_id for b in bids} == {"gpu0"}
    assert [a.bid.window.slice_id for a in awards] == ["gpu0"]


def test_a_lower_class_never_takes_the_slice_whatever_its_score() -> None:
    # The challenger waited a week (responsive score 1), the holder nothing.
    got = outcome(
        [bidder("run", priority=3, holds="gpu0"), bidder("low", priority=4, waited=7 * 86400)],
        [held("gpu0", "run")],
    )
    assert got == {"gpu0": "run"}


def test_a_higher_class_takes_the_slice_only_when_no_free_window_serves_it() -> None:
    run, high = bidder("run", priority=4, holds="gpu0"), bidder("high", priority=2)
    assert outcome([run, high], [held("gpu0", "run")]) == {"gpu0": "high"}
    # A free window it can use: it takes that, and the piece keeps its slice.
    assert outcome([run, high], [held("gpu0", "run"), free("gpu9")]) == {
        "gpu0": "run",
        "gpu9": "high",
    }


def test_the_same_class_needs_a_score_better_by_the_hysteresis() -> None:
    run = bidder("run", holds="gpu0", waited=0.0)
    # responsive: log(1 + w / 60) / log(1 + 7 days / 60); 6 h of waiting scores about 0.6.
    rival = bidder("rival", waited=6 * 3600.0)
    windows = [held("gpu0", "run")]
    assert outcome([run, rival], windows, h=0.1) == {"gpu0": "rival"}
    assert outcome([run, rival], windows, h=0.9) == {"gpu0": "run"}


def test_responsive_keeps_growing_over_hours_and_srpt_prefers_less_work_left() -> None:
    ctx = ClearingContext()
    window = free("gpu0")
    c = contract()

    def bid_of(waited: float, total: int = 100) -> float:
        b = bidder("j", waited=waited, total=total)
        bids, _ = clearing_round([b], [window], "responsive", ctx)
        return score(bids[0], "responsive", ctx)

    hour, day = bid_of(3600.0), bid_of(86400.0)
    assert 0 < bid_of(60.0) < hour < day < bid_of(5 * 86400.0) <= 1.0
    short, _ = clearing_round([bidder("s", total=10)], [window], "srpt", ctx)
    long, _ = clearing_round([bidder("l", total=100)], [window], "srpt", ctx)
    assert short[0].remaining_seconds < long[0].remaining_seconds
    assert score(short[0], "srpt", ctx) > score(long[0], "srpt", ctx)
    assert c.total_units == 100


@settings(max_examples=150, deadline=None)
@given(
    holders=st.lists(st.tuples(st.integers(2, 4), st.floats(0, 86400.0)), min_size=1, max_size=4),
    waiting=st.lists(
        st.tuples(st.integers(2, 4), st.floats(0, 86400.0), st.integers(5, 200)),
        max_size=6,
    ),
    free_count=st.integers(0, 3),
    policy=st.sampled_from(POLICIES),
    h=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_a_held_slice_changes_hands_only_to_a_higher_class_or_a_clearly_better_bid(
    holders: list[tuple[int, float]],
    waiting: list[tuple[int, float, int]],
    free_count: int,
    policy: str,
    h: float,
) -> None:
    bidders = [
        bidder(f"run{i}", prio, waited, holds=f"held{i}")
        for i, (prio, waited) in enumerate(holders)
    ]
    bidders += [
        bidder(f"w{i}", prio, waited, total=total)
        for i, (prio, waited, total) in enumerate(waiting)
    ]
    windows = [held(f"held{i}", f"run{i}") for i in range(len(holders))]
    windows += [free(f"zfree{i}") for i in range(free_count)]
    ctx = ClearingContext(hysteresis=h)
    bids, awards = clearing_round(bidders, windows, policy, ctx)
    by_slice = {a.bid.window.slice_id: a for a in awards}
    assert len(by_slice) == len(awards)  # no slice twice
    assert len({a.bid.job_id for a in awards}) == len(awards)  # no job twice
    values = {(b.job_id, b.window.slice_id): score(b, policy, ctx) for b in bids}
    for i, (prio, _) in enumerate(holders):
        slice_id = f"held{i}"
        mine = values[(f"run{i}", slice_id)]
        won = by_slice.get(slice_id)
        assert won is not None  # the holder always bids on it, so someone gets it
        if won.bid.job_id == f"run{i}":
            assert won.bid.incumbent
            continue
        assert not won.bid.incumbent and won.bid.job_id.startswith("w")
        assert won.bid.priority < prio or (
            won.bid.priority == prio and values[(won.bid.job_id, slice_id)] > mine + h - 1e-12
        )
    # Work placed on a held slice found no free window it could win first.
    for a in awards:
        if a.bid.window.held_by and not a.bid.incumbent:
            assert all(w.slice_id in by_slice for w in windows if not w.held_by), (
                "a challenger took a held slice while a free one stayed unawarded"
            )


def test_a_running_piece_is_assured_at_its_slow_pace_never_past_its_last_unit() -> None:
    profile = contract().profile  # 1 s a unit at the median, 2 s at the 0.95 quantile
    assert assured_progress(40, 20, 0.0, profile, 0.05) == 40
    assert assured_progress(40, 20, 15.9, profile, 0.05) == 47  # 7 units at 2 s each
    assert assured_progress(40, 20, 7.9, profile, 0.5) == 47  # epsilon 0.5: the median
    assert assured_progress(40, 20, 500.0, profile, 0.05) == 59  # its last unit, not past it
    assert assured_progress(40, 20, -3.0, profile, 0.05) == 40  # a clock step back: its start
    assert assured_progress(40, 0, 9.0, profile, 0.05) == 40


def _job() -> zone_pb2.Job:
    """An atomized job of 500 units of 1 s (median), 8 GiB at its 0.95 quantile."""
    spec = zone_pb2.JobSpec(
        command=["x"],
        atomization=common_pb2.AtomizationContract(
            total_units=500,
            seconds_per_unit=[common_pb2.Quantile(q=0.5, value=1.0)],
            peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=8 * GIB)],
        ),
    )
    return zone_pb2.Job(job_id="j1", spec=spec)


def _market(job: zone_pb2.Job) -> Atomizer:
    """The router's Atomizer over a stand-in zone, with ``job`` admitted."""
    zone = SimpleNamespace(config=ZoneConfig(), blocked_starts={}, metrics=SimpleNamespace())
    market = Atomizer(cast(Any, zone))
    market.admit(job)
    return market


def test_the_router_s_incumbent_bids_its_work_left_from_where_it_surely_is() -> None:
    """The router's bidder for a piece whose window ends counts its work left from the
    progress it has surely made, not from its start (a piece 450 s into 500 units of 1 s,
    epsilon 0.05 and one quantile, is at unit 450): under srpt it then scores as the nearly
    finished job it is."""
    job = _job()
    market = _market(job)
    entry = Entry(job=job, need=Demand(gpus=1))
    atom = market.atoms["j1"]
    piece = zone_pb2.Placement(
        subjob_id="j1-u0-s1", started_unix=1000.0, unit_start=0, unit_count=500
    )
    waiting = market._bidder(entry, atom, 0.0, 80 * GIB)
    incumbent = market._bidder(
        entry, atom, 0.0, 80 * GIB, holds=("a1", "s"), running=(piece, 1450.0)
    )
    assert waiting.next_unit == 0
    assert incumbent.next_unit == 450 and incumbent.holds == ("a1", "s")
    assert incumbent.contract.total_units - incumbent.next_unit == 50


def test_a_lost_piece_s_true_end_moves_the_job_on_to_the_checkpoint_it_reached() -> None:
    """A piece declared lost is weighed once (no units); when its agent later reports how
    it really ended, the checkpoint it reached counts: the job resumes there, not at 0."""
    job = _job()
    job.state = zone_pb2.JOB_RUNNING
    lost = job.placements.add(
        subjob_id="j1-u0-s1", agent_id="a1", state=common_pb2.LOST, unit_start=0, unit_count=500
    )
    market = _market(job)
    entry = Entry(job=job, need=Demand(gpus=1))
    market.evaluate(entry)
    assert market.atoms["j1"].next_unit == 0 and job.state == zone_pb2.QUEUED
    lost.state, lost.units_done = common_pb2.KILLED, 200  # its true end, reported late
    market.evaluate(entry)
    assert market.atoms["j1"].next_unit == 200
    assert "200 of 500 units done" in job.reason
