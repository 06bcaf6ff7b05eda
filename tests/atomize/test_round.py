"""The clearing round machine (laminar_zone.round.ClearingRound), with no sockets: what one
pass's class steps decide, fed slices, bidders and steps, read from its decisions."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import laminar_zone.round
from laminar_zone.config import Quota
from laminar_zone.market import (
    Bidder,
    ClearingContext,
    OpenSlice,
    contract_from,
    make_bidder,
    slice_family,
)
from laminar_zone.queue import Clear
from laminar_zone.round import ClearingRound, Extend, Start, Stop

GIB = 1024**3
NOW = 1_000_000.0
CAP = 3600.0
FAMILY = slice_family("3g.40gb")


def open_slice(name: str, held_by: str = "", tag: str = "") -> OpenSlice:
    return OpenSlice("h0", name, 40 * GIB, 3000 // 7, FAMILY, tag=tag, held_by=held_by)


def bidder(
    job_id: str,
    priority: int = 3,
    *,
    units: int = 30,
    tenant: str = "t",
    holds: tuple[str, str] | None = None,
    next_unit: int = 0,
) -> Bidder:
    contract = contract_from(
        total_units=units,
        seconds_per_unit=[(0.5, 60.0), (1.0, 66.0)],
        peak_memory_bytes=[(0.5, 8.0 * GIB), (1.0, 10.0 * GIB)],
        checkpoint_overhead_seconds=30.0,
    )
    return make_bidder(
        job_id, tenant, contract, contract.profile, next_unit, 100.0, priority, holds=holds
    )


def machine(slices: list[OpenSlice], bidders: list[Bidder], **kwargs: object) -> ClearingRound:
    return ClearingRound(
        NOW,
        slices,
        bidders,
        "srpt",
        ClearingContext(),
        CAP,
        **kwargs,  # type: ignore[arg-type]
    )


def full(priority: int | None) -> Clear:
    return Clear(priority, {})


def test_a_part_round_offers_free_slices_only() -> None:
    held = ("h0", "held")
    rnd = machine(
        [open_slice("held", held_by="a"), open_slice("free")],
        [bidder("a", holds=held, next_unit=5), bidder("w")],
    )
    part = rnd.clear(Clear(3, {}, jobs=frozenset({"w", "a"})))
    assert part.windows == 1  # the held slice waits for the class's full round
    assert [type(d) for d in part.decisions] == [Start]
    (start,) = part.decisions
    assert isinstance(start, Start)
    assert start.award.bid.job_id == "w" and start.award.bid.window.slice_id == "free"
    # The holder did not bid in the part: its slice is decided in the full round.
    assert all(b.job_id == "w" for b in part.bids)
    whole = rnd.clear(full(3))
    assert [type(d) for d in whole.decisions] == [Extend]


def test_an_incumbent_no_higher_bid_wants_extends_in_place() -> None:
    key = ("h0", "s0")
    rnd = machine([open_slice("s0", held_by="a")], [bidder("a", holds=key, next_unit=10)])
    cleared = rnd.clear(full(3))
    (extend,) = cleared.decisions
    assert isinstance(extend, Extend) and extend.key == key
    assert extend.award.bid.incumbent and extend.award.bid.unit_start == 10
    assert extend.award.bid.window.length_seconds == CAP
    closed = rnd.close()
    assert closed.stops == [] and closed.winners == {"a"}


def test_a_higher_class_bid_takes_a_held_slice_and_the_stop_names_the_winner() -> None:
    key = ("h0", "s0")
    rnd = machine(
        [open_slice("s0", held_by="low")],
        [bidder("low", 4, holds=key, next_unit=3), bidder("high", 2)],
    )
    first = rnd.clear(full(2))
    (stop,) = first.decisions
    assert isinstance(stop, Stop) and stop.key == key
    assert stop.award is not None and stop.award.bid.job_id == "high"
    # The holder's own class comes later: its slice is decided, it bids no more.
    later = rnd.clear(full(4))
    assert later.decisions == [] and later.windows == 0 and not later.is_cleared
    assert rnd.close().stops == []  # decided already, not stopped twice


def test_an_undecided_held_piece_stops_when_the_round_closes() -> None:
    key = ("h0", "s0")
    # The class's blocked rigid head starts now: no extension fits before it.
    rnd = machine([open_slice("s0", held_by="a")], [bidder("a", holds=key)])
    cleared = rnd.clear(Clear(3, {FAMILY: NOW}))
    assert cleared.decisions == [] and cleared.windows == 0
    assert rnd.close().stops == [Stop(key)]


def test_quota_admits_awards_in_clearing_order_and_refuses_the_one_past_it() -> None:
    units: dict[str, float] = {"t": 0.0}
    memory: dict[str, int] = {}
    slices = [open_slice("s0"), open_slice("s1"), open_slice("s2")]
    # srpt clears the shortest first: "short" then "mid" then "long".
    bidders = [bidder("long", units=90), bidder("short", units=10), bidder("mid", units=40)]
    one_piece = 3000 // 7 / 1000
    rnd = machine(
        slices,
        bidders,
        quotas={"t": Quota(max_gpus=2 * one_piece + 1e-6)},
        units=units,
        memory=memory,
    )
    cleared = rnd.clear(full(3))
    won = [d.award.bid.job_id for d in cleared.decisions if isinstance(d, Start)]
    assert won == ["short", "mid"]  # each fit the quota as the tally stood; long did not
    assert {b.job_id for b in cleared.bids} == {"short", "mid", "long"}
    assert units["t"] == 2 * one_piece  # the caller's tally, counted in clearing order
    assert memory["t"] == 2 * 40 * GIB
    assert rnd.close().winners == {"short", "mid"}


def test_windows_a_higher_class_or_a_rigid_start_took_are_not_offered_again() -> None:
    rnd = machine(
        [open_slice("s0"), open_slice("s1"), open_slice("s2")],
        [bidder("p", 2), bidder("b1", 3), bidder("b2", 3), bidder("o", 4)],
    )
    (high,) = rnd.clear(full(2)).decisions
    assert isinstance(high, Start) and high.award.bid.window.slice_id == "s0"  # ties: key
    rnd.take([("h0", "s2")])  # a rigid job of the pass started there
    batch = rnd.clear(full(3))
    assert batch.windows == 1  # s1 only
    (won,) = batch.decisions
    assert isinstance(won, Start) and won.award.bid.window.slice_id == "s1"
    assert won.award.bid.job_id == "b1"  # equal scores: the lower job id
    assert rnd.clear(full(4)).windows == 0  # nothing left for the lowest class
    closed = rnd.close()
    assert closed.winners == {"p", "b1"}
    assert closed.losing_scores == {"b2": won.award.score}


def test_a_spec_that_does_not_allow_a_slice_keeps_its_job_off_it() -> None:
    rnd = machine(
        # Slices of two kinds (alike windows are judged once: a spec reads the kind).
        [open_slice("s0", tag="MIG:3g.40gb:H100"), open_slice("s1", tag="MIG:3g.40gb:A100")],
        [bidder("a")],
        allows=lambda job_id, key: key != ("h0", "s0"),
    )
    (start,) = rnd.clear(full(3)).decisions
    assert isinstance(start, Start) and start.award.bid.window.slice_id == "s1"


def test_the_machine_does_no_io() -> None:
    """No clock, no sockets, no event loop: ``now`` comes in."""
    tree = ast.parse(Path(laminar_zone.round.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported.isdisjoint({"asyncio", "grpc", "time", "socket", "laminar_api", "random"})


@st.composite
def rounds(draw: st.DrawFn) -> tuple[ClearingRound, list[Clear | list[tuple[str, str]]], float]:
    """A round over random free and held slices, bidders of random classes and tenants, a
    quota, and a pass of steps (parts, full rounds, rigid starts) in class order."""
    n_slices = draw(st.integers(1, 6))
    names = [f"s{i}" for i in range(n_slices)]
    held_by = draw(st.lists(st.booleans(), min_size=n_slices, max_size=n_slices))
    slices = []
    bidders = []
    for i, name in enumerate(names):
        tag = draw(st.sampled_from(["MIG:3g.40gb", "MIG:1g.10gb"]))
        if held_by[i]:
            job = f"h{i}"
            slices.append(open_slice(name, held_by=job, tag=tag))
            bidders.append(
                bidder(
                    job,
                    draw(st.integers(2, 4)),
                    units=draw(st.integers(1, 90)),
                    tenant=draw(st.sampled_from("tu")),
                    holds=("h0", name),
                )
            )
        else:
            slices.append(open_slice(name, tag=tag))
    waiting = [f"w{i}" for i in range(draw(st.integers(0, 6)))]
    for job in waiting:
        bidders.append(
            bidder(
                job,
                draw(st.integers(2, 4)),
                units=draw(st.integers(1, 90)),
                tenant=draw(st.sampled_from("tu")),
            )
        )
    quota = draw(st.integers(1, 4)) * 3000 // 7 / 1000 + 1e-6
    rnd = machine(slices, bidders, quotas={"t": Quota(max_gpus=quota)}, units={}, memory={})
    steps: list[Clear | list[tuple[str, str]]] = []
    for priority in (2, 3, 4):
        for _ in range(draw(st.integers(0, 2))):
            if draw(st.booleans()):
                steps.append([("h0", draw(st.sampled_from(names)))])  # a rigid start
            else:
                part = draw(st.sets(st.sampled_from(waiting))) if waiting else set()
                steps.append(Clear(priority, {}, jobs=frozenset(part)))
        heads = {FAMILY: NOW + draw(st.sampled_from([0.0, 600.0, 7200.0]))}
        steps.append(Clear(priority, draw(st.sampled_from([{}, heads]))))
    return rnd, steps, quota


@settings(max_examples=150, deadline=None)
@given(rounds())
def test_property_a_round_never_gives_a_slice_or_a_job_twice_nor_passes_a_quota(
    drawn: tuple[ClearingRound, list[Clear | list[tuple[str, str]]], float],
) -> None:
    rnd, steps, quota = drawn
    held = {s.key: s.held_by for s in rnd.slices if s.held_by}
    gone: set[tuple[str, str]] = set()  # slices a rigid start or a decision took
    jobs: set[str] = set()
    tally = 0.0
    for step in steps:
        if isinstance(step, list):
            rnd.take(step)
            gone.update(step)
            continue
        for d in rnd.clear(step).decisions:
            award = d.award
            assert award is not None
            key, job = award.bid.window.key, award.bid.job_id
            assert key not in gone and job not in jobs
            gone.add(key)
            jobs.add(job)
            assert step.priority is None or award.bid.priority == step.priority
            if isinstance(d, Start):
                assert key not in held
                assert step.jobs is None or job in step.jobs
            else:
                assert step.jobs is None  # held slices only in a class's full round
                assert key in held and d.key == key
                assert isinstance(d, Extend) == (job == held[key])
            if award.bid.tenant == "t" and not award.bid.incumbent:
                tally += award.bid.window.gpu_milli / 1000
                assert tally <= quota
    closed = rnd.close()
    decided = {a.bid.window.key for a in closed.awards if a.bid.window.held_by}
    assert [s.key for s in closed.stops] == [k for k in held if k not in decided]
    assert closed.winners == jobs
