"""The life cycle of an atomized job's pieces (laminar_zone.atoms), with no socket: what a
piece's end means for its job, how the job bids, what a won bid starts, the market's work."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_api.v1 import common_pb2
from laminar_base.causes import EndCause
from laminar_zone.atoms import (
    AtomState,
    JobNext,
    Phase,
    PieceEnd,
    Running,
    Violation,
    complete_phases,
    decide_at,
    market_work,
    window_end_at,
)
from laminar_zone.market import (
    Bid,
    Contract,
    MarketWindow,
    RatioPool,
    assured_progress,
    contract_from,
    work_left_seconds,
)
from laminar_zone.queue import Bidding

GIB = 1024**3


def make_contract(total_units: int = 100, max_units: int = 0) -> Contract:
    return contract_from(
        total_units=total_units,
        seconds_per_unit=[(0.5, 1.0), (0.95, 2.0), (1.0, 3.0)],
        peak_memory_bytes=[(0.5, 8 * GIB), (0.95, 10 * GIB), (1.0, 12 * GIB)],
        checkpoint_overhead_seconds=5.0,
        max_units=max_units,
        epsilon=0.05,
    )


def window(length: float = 100.0, held_by: str = "") -> MarketWindow:
    return MarketWindow("a", "gpu0", 16 * GIB, 1000, length, "whole", held_by=held_by)


def bid(unit_start: int, unit_count: int, length: float = 100.0, remaining: float = 0.0) -> Bid:
    return Bid(
        "j",
        "t",
        window(length),
        unit_start,
        unit_count,
        0.99,
        40.0,
        0.0,
        remaining_seconds=remaining,
    )


def ended(
    subjob_id: str,
    state: int,
    cause: EndCause,
    unit_start: int = 0,
    units_done: int = 0,
    run_seconds: float = 10.0,
    peak: float = 8 * GIB,
) -> PieceEnd:
    return PieceEnd(subjob_id, state, cause, unit_start, units_done, run_seconds, peak)


def test_a_finished_piece_moves_the_job_on_and_feeds_its_calibrator() -> None:
    atom = AtomState.of(make_contract())
    got = atom.piece_ended(ended("s0", common_pb2.SUCCEEDED, EndCause.EXITED, 0, 40))
    assert got.observed and got.violation is None and not got.failed
    assert atom.next_unit == 40
    assert atom.calibrators[0].observed == 1
    assert atom.next_state(has_live=False) is JobNext.WAITING
    atom.piece_ended(ended("s1", common_pb2.SUCCEEDED, EndCause.EXITED, 40, 60))
    assert atom.next_state(has_live=False) is JobNext.DONE
    assert atom.next_state(has_live=True) is JobNext.RUNNING


def test_a_piece_is_weighed_once() -> None:
    atom = AtomState.of(make_contract())
    end = ended("s0", common_pb2.KILLED, EndCause.RECLAIMED)
    assert atom.piece_ended(end).violation is Violation.MEMORY
    assert atom.piece_ended(end).violation is None  # the same end again: nothing
    assert atom.violations == 1
    assert atom.calibrators[0].widen_memory == 1.5


def test_a_memory_kill_widens_memory_and_an_overrun_widens_time() -> None:
    atom = AtomState.of(make_contract())
    memory = atom.piece_ended(ended("s0", common_pb2.KILLED, EndCause.RECLAIMED, 0, 0))
    time = atom.piece_ended(ended("s1", common_pb2.KILLED, EndCause.OVERRAN, 0, 10))
    assert (memory.violation, time.violation) == (Violation.MEMORY, Violation.TIME)
    calibrator = atom.calibrators[0]
    assert (calibrator.widen_memory, calibrator.widen_time) == (1.5, 1.5)
    assert atom.violations == 2
    assert atom.next_unit == 10  # what the overrun piece's checkpoint covered counts


def test_a_piece_stopped_for_other_work_is_free_and_what_it_measured_is_observed() -> None:
    atom = AtomState.of(make_contract())
    got = atom.piece_ended(ended("s0", common_pb2.KILLED, EndCause.PREEMPTED, 0, 30, 3.0))
    assert got.observed and got.violation is None and not got.failed
    assert atom.violations == 0
    calibrator = atom.calibrators[0]
    assert calibrator.observed == 1 and calibrator.widen_time == calibrator.widen_memory == 1.0
    # Its speed over the units its checkpoint covers, against the declared 2.0 s.
    assert calibrator.time_ratios == [pytest.approx(0.1 / 2.0)]
    assert atom.next_unit == 30
    # Slower than predicted: it teaches the profile, and is no violation of it.
    slow = atom.piece_ended(ended("s1", common_pb2.KILLED, EndCause.PREEMPTED, 30, 10, 100.0))
    assert slow.observed and not slow.exceeded
    assert calibrator.observed == 2 and calibrator.violations == 0
    assert atom.next_state(has_live=False) is JobNext.WAITING


def test_a_stopped_piece_without_units_or_a_reported_peak_observes_nothing() -> None:
    atom = AtomState.of(make_contract())
    version = atom.calibrators[0].version
    for i, (units, peak) in enumerate(((0, 8 * GIB), (30, 0.0))):
        got = atom.piece_ended(
            ended(f"s{i}", common_pb2.KILLED, EndCause.PREEMPTED, 0, units, 3.0, peak)
        )
        assert got == type(got)()  # nothing observed, no violation, no retry
    assert atom.calibrators[0].version == version


def test_a_failure_costs_a_retry_unless_the_cause_is_free() -> None:
    atom = AtomState.of(make_contract())
    assert atom.piece_ended(ended("s0", common_pb2.FAILED, EndCause.EXITED)).failed
    assert not atom.piece_ended(ended("s1", common_pb2.FAILED, EndCause.READDRESSED)).failed


def test_an_unknown_peak_is_observed_as_the_declared_one() -> None:
    atom = AtomState.of(make_contract())
    atom.piece_ended(ended("s0", common_pb2.SUCCEEDED, EndCause.EXITED, 0, 10, 1.0, 0.0))
    assert atom.calibrators[0].memory_ratios == [1.0]
    # Its speed is its run over its units, against the declared 2.0 s at 1 - epsilon.
    assert atom.calibrators[0].time_ratios == [pytest.approx(0.1 / 2.0)]


def test_phases_are_completed_with_the_rest_of_the_units() -> None:
    contract = make_contract(total_units=100)
    assert complete_phases(contract) == (Phase(0, 100, contract.profile, ""),)
    warm = Phase(0, 10, contract.profile, "warm")
    assert complete_phases(contract, [warm]) == (warm, Phase(10, 100, contract.profile, "rest"))
    whole = Phase(0, 100, contract.profile, "all")
    assert complete_phases(contract, [whole]) == (whole,)


def test_each_phase_has_its_calibrator_in_its_familys_pool() -> None:
    contract = make_contract()
    pools = [RatioPool(), RatioPool()]
    atom = AtomState.of(contract, [Phase(0, 10, contract.profile)], lambda i: pools[i])
    assert all(c.time_ratios is p.time_ratios for c, p in zip(atom.calibrators, pools, strict=True))
    assert atom.phase_at(9) == 0 and atom.phase_at(10) == 1 and atom.phase_at(500) == 1


def test_a_waiting_job_bids_from_its_next_unit_within_its_phase() -> None:
    contract = make_contract()
    atom = AtomState.of(contract, [Phase(0, 10, contract.profile)])
    atom.next_unit = 4
    bidder, reset = atom.bidder("j", "t", 3, 12.0, 16 * GIB)
    assert not reset
    assert (bidder.job_id, bidder.tenant, bidder.priority, bidder.holds) == ("j", "t", 3, None)
    assert bidder.next_unit == 4 and bidder.waited_seconds == 12.0
    assert bidder.contract.max_units == 6  # never across the phase's end at unit 10


def test_an_incumbent_bids_from_where_its_piece_surely_is() -> None:
    atom = AtomState.of(make_contract())
    bidder, _ = atom.bidder(
        "j", "t", 3, 0.0, 16 * GIB, holds=("a", "gpu0"), running=Running(20, 80, 30.0)
    )
    profile, _ = atom.believed(20, 16 * GIB)
    assert bidder.next_unit == assured_progress(20, 80, 30.0, profile, 0.05)
    assert 20 < bidder.next_unit < 50 and bidder.holds == ("a", "gpu0")


def test_a_memory_widening_past_every_slice_is_dropped_once_and_counted() -> None:
    atom = AtomState.of(make_contract())
    for i in range(3):  # 10 GiB at 1 - epsilon, widened 1.5^3: past a 16 GiB slice
        atom.piece_ended(ended(f"s{i}", common_pb2.KILLED, EndCause.RECLAIMED))
    _, reset = atom.bidder("j", "t", 3, 0.0, 16 * GIB)
    assert reset and atom.widen_resets == 1
    _, again = atom.bidder("j", "t", 3, 0.0, 16 * GIB)
    assert not again and atom.widen_resets == 1
    assert atom.need_bytes(16 * GIB) <= 16 * GIB


def test_a_widening_kept_while_a_large_slice_was_free_is_dropped_when_only_small_ones_are() -> None:
    """The believed profile is cached per calibrator state and largest slice: a widening
    that fit under a 64 GiB slice is dropped once the largest slice left is 16 GiB."""
    atom = AtomState.of(make_contract())
    for i in range(3):  # 10 GiB at 1 - epsilon, widened 1.5^3 (about 34 GiB)
        atom.piece_ended(ended(f"s{i}", common_pb2.KILLED, EndCause.RECLAIMED))
    _, kept = atom.bidder("j", "t", 3, 0.0, 64 * GIB)
    assert not kept and atom.need_bytes(64 * GIB) > 16 * GIB
    _, dropped = atom.bidder("j", "t", 3, 0.0, 16 * GIB)
    assert dropped and atom.widen_resets == 1
    assert atom.need_bytes(16 * GIB) <= 16 * GIB


def test_a_won_bid_runs_every_unit_left_in_its_phase_with_incumbency() -> None:
    atom = AtomState.of(make_contract(total_units=100, max_units=70))
    won = bid(10, 20, length=300.0, remaining=95.0)
    plan = atom.piece(won, 300.0, runs_on=True)
    assert (plan.unit_start, plan.unit_count) == (10, 70)
    assert plan.expected_seconds == 95.0  # the job's work left, within the window
    assert plan.memory_bytes == int(atom.calibrators[0].profile().peak_memory_bytes.value_at(0.95))
    sized = atom.piece(won, 300.0, runs_on=False)
    assert (sized.unit_count, sized.expected_seconds) == (20, 40.0)


def test_window_ends_and_decisions() -> None:
    assert window_end_at(100.0, 50.0) == 150.0
    assert window_end_at(100.0, math.inf) == 0.0
    assert decide_at(1000.0, 30.0) == 970.0
    assert decide_at(1000.0, 30.0, round_seconds=20.0) == 960.0  # at least two rounds


def test_the_market_work_names_waiting_jobs_and_the_classes_of_held_pieces() -> None:
    atom = AtomState.of(make_contract())
    waiting, _ = atom.bidder("j1", "t", 3, 0.0, 16 * GIB)
    holder, _ = atom.bidder("j2", "t", 2, 0.0, 16 * GIB, holds=("a", "gpu0"))
    client = bid(0, 5)
    work = market_work([("q1", 3, waiting), ("q3", 4, None)], [waiting, holder], [client])
    left = work_left_seconds(waiting.contract, waiting.profile, waiting.next_unit)
    assert work[:2] == [Bidding("q1", 3, left), Bidding("q3", 4, 0.0)]
    assert sorted(w for w in work[2:] if isinstance(w, int)) == [2, 3]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    (common_pb2.SUCCEEDED, EndCause.EXITED),
                    (common_pb2.KILLED, EndCause.RECLAIMED),
                    (common_pb2.KILLED, EndCause.OVERRAN),
                    (common_pb2.KILLED, EndCause.PREEMPTED),
                    (common_pb2.FAILED, EndCause.GPU_FAILED),
                ]
            ),
            st.integers(0, 40),
        ),
        max_size=12,
    )
)
def test_the_job_never_goes_back_and_is_done_exactly_when_every_unit_is(
    ends: list[tuple[tuple[int, EndCause], int]],
) -> None:
    """Pieces start where the job stands and end in any way: the unit reached never goes
    back, violations count the widening ends, and the job is done exactly at its total."""
    atom = AtomState.of(make_contract(total_units=100))
    widening = 0
    for i, ((state, cause), done) in enumerate(ends):
        before = atom.next_unit
        got = atom.piece_ended(ended(f"s{i}", state, cause, before, done))
        widening += got.violation is not None
        assert atom.next_unit >= before
        assert atom.next_unit == before + done
    assert atom.violations == widening
    is_done = atom.next_state(has_live=False) is JobNext.DONE
    assert is_done == (atom.next_unit >= 100)
