"""Gangs in the market (laminar_zone.market.clear, round.ClearingRound, atoms.AtomState), with
no sockets: a gang bids for one window per member, all or nothing; its set is kept, or
taken, together."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2
from laminar_base.causes import EndCause
from laminar_zone.atoms import AtomState, PieceEnd, Violation
from laminar_zone.market import (
    Bid,
    Bidder,
    ClearingContext,
    MarketWindow,
    OpenSlice,
    clear,
    contract_from,
    make_bidder,
    round_bids,
    slice_family,
)
from laminar_zone.queue import Clear
from laminar_zone.round import ClearingRound, Extend, Start, Stop

GIB = 1024**3
NOW = 1_000_000.0
CAP = 3600.0
FAMILY = slice_family("3g.40gb")


def bidder(
    job_id: str,
    priority: int = 3,
    *,
    members: int = 1,
    units: int = 30,
    holds: tuple[str, str] | None = None,
    next_unit: int = 0,
) -> Bidder:
    c = contract_from(
        total_units=units,
        seconds_per_unit=[(0.5, 60.0), (1.0, 66.0)],
        peak_memory_bytes=[(0.5, 8.0 * GIB), (1.0, 10.0 * GIB)],
        checkpoint_overhead_seconds=30.0,
    )
    return make_bidder(
        job_id, "t", c, c.profile, next_unit, 100.0, priority, holds=holds, members=members
    )


def window(name: str, agent: str = "h0", held_by: str = "") -> MarketWindow:
    return MarketWindow(agent, name, 40 * GIB, 3000 // 7, CAP, held_by=held_by)


def open_slice(name: str, agent: str = "h0", held_by: str = "") -> OpenSlice:
    return OpenSlice(agent, name, 40 * GIB, 3000 // 7, FAMILY, held_by=held_by)


def machine(slices: list[OpenSlice], bidders: list[Bidder]) -> ClearingRound:
    return ClearingRound(NOW, slices, bidders, "srpt", ClearingContext(), CAP)


def awards_of(bidders: list[Bidder], windows: list[MarketWindow]) -> dict[str, list[str]]:
    awards = clear(round_bids(bidders, windows), "srpt", ClearingContext())
    return {a.bid.job_id: sorted(w.slice_id for w in a.windows) for a in awards}


def test_a_gang_takes_its_members_windows_before_a_lower_scored_single() -> None:
    windows = [window(f"s{i}") for i in range(4)]
    # srpt: the gang (10 units) outranks the single (90 units).
    got = awards_of([bidder("gang", members=3, units=10), bidder("single", units=90)], windows)
    assert got == {"gang": ["s0", "s1", "s2"], "single": ["s3"]}


def test_a_gang_that_cannot_complete_takes_nothing_and_leaves_the_windows() -> None:
    windows = [window("s0"), window("s1")]
    got = awards_of(
        [bidder("gang", members=3, units=10), bidder("a", units=50), bidder("b", units=90)],
        windows,
    )
    assert got == {"a": ["s0"], "b": ["s1"]}


def test_a_higher_scored_single_first_then_the_gang_on_what_is_left() -> None:
    windows = [window(f"s{i}", agent=f"h{i % 2}") for i in range(4)]
    got = awards_of([bidder("gang", members=3, units=50), bidder("short", units=5)], windows)
    assert got["short"] == ["s0"]
    assert got["gang"] == ["s1", "s2", "s3"]  # across hosts: a family, not a host


def test_a_gang_takes_a_lower_class_holders_slices_but_not_its_own_class() -> None:
    held = [window("s0", held_by="low"), window("s1", held_by="low")]
    holder = bidder("low", 4, members=2, holds=("h0", "s0"), next_unit=5)
    got = awards_of([bidder("high", 2, members=2), holder], held)
    assert got == {"high": ["s0", "s1"]}
    same = bidder("peer", 4, members=2, units=2)  # far shorter, same class
    got = awards_of([same, holder], held)
    assert got == {"low": ["s0", "s1"]}


def test_a_same_class_single_never_takes_a_slice_of_an_extending_gang() -> None:
    """Scored far above the gang (srpt: 1 unit left against 25), a single of the gang's
    class still does not take one of its slices (it would stop every member); a higher
    class's single does."""
    held = [window("s0", held_by="g"), window("s1", held_by="g")]
    gang = bidder("g", 3, members=2, holds=("h0", "s0"), next_unit=5)
    assert awards_of([bidder("short", 3, units=1), gang], held) == {"g": ["s0", "s1"]}
    assert awards_of([bidder("short", 4, units=1), gang], held) == {"g": ["s0", "s1"]}
    got = awards_of([bidder("urgent", 2, units=1), gang], held)
    assert got == {"urgent": ["s0"]}  # the gang, one slice short, does not extend


def test_the_round_extends_a_gangs_set_together() -> None:
    keys = [("h0", "s0"), ("h1", "s1")]
    rnd = machine(
        [open_slice("s0", held_by="g"), open_slice("s1", "h1", held_by="g"), open_slice("f")],
        [bidder("g", members=2, holds=keys[0], next_unit=4)],
    )
    (extend,) = rnd.clear(Clear(3, {})).decisions
    assert isinstance(extend, Extend) and extend.key == keys[0]
    assert sorted(w.key for w in extend.award.windows) == keys
    assert rnd.close().stops == []


def test_a_higher_class_single_on_one_member_stops_the_whole_gang() -> None:
    rnd = machine(
        [open_slice("s0", held_by="g"), open_slice("s1", held_by="g")],
        [bidder("g", 4, members=2, holds=("h0", "s0"), next_unit=4), bidder("urgent", 2)],
    )
    (stop,) = rnd.clear(Clear(2, {})).decisions
    assert isinstance(stop, Stop) and stop.award is not None
    assert stop.award.bid.job_id == "urgent"
    # Its own class: one slice is gone, so the gang cannot extend on fewer than 2.
    assert rnd.clear(Clear(4, {})).decisions == []
    assert {s.key for s in rnd.close().stops} == {("h0", "s1")}


def test_a_gang_start_is_one_decision_for_all_its_windows() -> None:
    rnd = machine([open_slice(f"s{i}") for i in range(3)], [bidder("g", members=3)])
    (start,) = rnd.clear(Clear(3, {})).decisions
    assert isinstance(start, Start) and len(start.award.windows) == 3
    assert rnd.close().winners == {"g"}


def test_a_members_memory_kill_is_one_violation_and_its_siblings_are_free() -> None:
    c = contract_from(
        total_units=40,
        seconds_per_unit=[(0.5, 60.0), (1.0, 66.0)],
        peak_memory_bytes=[(0.5, 8.0 * GIB), (1.0, 10.0 * GIB)],
    )
    atom = AtomState.of(c, members=3)
    b, _ = atom.bidder("g", "t", 3, 0.0, 40 * GIB)
    assert b.members == 3
    ends = [
        PieceEnd("g/s0m0", common_pb2.KILLED, EndCause.RECLAIMED, 0, 0, 600.0, 12.0 * GIB),
        PieceEnd("g/s0m1", common_pb2.KILLED, EndCause.GANG_STOPPED, 0, 0, 600.0, 9.0 * GIB),
        PieceEnd("g/s0m2", common_pb2.KILLED, EndCause.GANG_STOPPED, 0, 0, 600.0, 7.0 * GIB),
    ]
    got = [atom.piece_ended(e) for e in ends]
    assert [g.violation for g in got] == [Violation.MEMORY, None, None]
    assert not any(g.failed for g in got)  # a stopped sibling costs no retry
    assert atom.violations == 1 and atom.next_unit == 0
    assert atom.calibrators[0].widen_memory > 1.0


def test_a_gang_piece_is_one_observation_of_its_speed_and_a_peak_per_member() -> None:
    """Its members share one progress file and one pace: N ends of one piece are one
    sample of its speed (else min_samples is reached after 19 / N pieces and the coverage
    overstated), while each member's own peak is learned."""
    c = contract_from(
        total_units=40,
        seconds_per_unit=[(0.5, 60.0), (1.0, 66.0)],
        peak_memory_bytes=[(0.5, 8.0 * GIB), (1.0, 10.0 * GIB)],
    )
    atom = AtomState.of(c, members=3)
    peaks = [9.0 * GIB, 7.0 * GIB, 8.0 * GIB]
    got = [
        atom.piece_ended(
            PieceEnd(f"g/s0m{i}", common_pb2.SUCCEEDED, EndCause.EXITED, 0, 10, 620.0, peak, i)
        )
        for i, peak in enumerate(peaks)
    ]
    assert [g.observed for g in got] == [True, False, False]
    calibrator = atom.calibrators[0]
    assert calibrator.observed == 1 and len(calibrator.time_ratios) == 1
    assert len(calibrator.memory_ratios) == 3
    assert atom.next_unit == 10


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[Bid], list[MarketWindow]]:
    n_windows = draw(st.integers(1, 8))
    holders = ["", "", "h-a", "h-b"]
    windows = [
        MarketWindow(
            f"a{i % 3}",
            f"s{i}",
            draw(st.sampled_from([10, 40])) * GIB,
            1000,
            draw(st.sampled_from([1800.0, CAP])),
            held_by=draw(st.sampled_from(holders)),
        )
        for i in range(n_windows)
    ]
    bidders = []
    for j in range(draw(st.integers(1, 6))):
        bidders.append(
            bidder(
                f"j{j}",
                draw(st.integers(1, 4)),
                members=draw(st.integers(1, 4)),
                units=draw(st.integers(1, 60)),
            )
        )
    for holder in ("h-a", "h-b"):
        mine = sorted(w.key for w in windows if w.held_by == holder)
        bids_to_extend: bool = draw(st.booleans())
        if mine and bids_to_extend:
            bidders.append(
                bidder(holder, draw(st.integers(1, 4)), members=len(mine), holds=mine[0])
            )
    return round_bids(bidders, windows), windows


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_gangs_get_all_their_windows_or_none_and_no_slice_twice(
    case: tuple[list[Bid], list[MarketWindow]],
) -> None:
    bids, windows = case
    awards = clear(bids, "srpt", ClearingContext())
    by_key = {w.key: w for w in windows}
    owners = Counter(w.key for a in awards for w in a.windows)
    assert all(n == 1 for n in owners.values())  # never two pieces on one slice
    assert len({a.bid.job_id for a in awards}) == len(awards)  # one award per job
    incumbents = {b.window.held_by: b.priority for b in bids if b.incumbent}
    gangs = {b.window.held_by: b.priority for b in bids if b.incumbent and b.members > 1}
    for a in awards:
        won = a.windows
        assert len(won) == a.bid.members  # never fewer than N, never more
        assert all(w.key in by_key for w in won)
        if a.bid.members > 1:
            assert len({(w.memory_bytes, w.length_seconds) for w in won}) == 1  # one family
            for w in won:  # only a lower class's (or a non-bidding holder's) slice is taken
                if w.held_by and w.held_by != a.bid.job_id and w.held_by in incumbents:
                    assert incumbents[w.held_by] > a.bid.priority
        for w in won:  # a single takes an extending gang's slice only from a lower class
            if w.held_by and w.held_by != a.bid.job_id and w.held_by in gangs:
                assert gangs[w.held_by] > a.bid.priority
    # All or nothing is not wasteful: a gang that lost had fewer free windows of a family
    # at its turn than members, so whatever its family had left went to others or to no bid.
    for b in bids:
        if b.members > 1 and b.job_id not in {a.bid.job_id for a in awards}:
            free = [w for w in b.pool if w.key not in owners and not w.held_by]
            assert len(free) < b.members
