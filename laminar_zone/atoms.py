"""The life cycle of an atomized job's pieces, as pure code: the router's and the simulator's.

What a piece of an atomized job means for its job is decided here once; the router's
:class:`~laminar_zone.atomizer.Atomizer` (with awaits, protobufs and journaling around it)
and the simulator's ``MigReplay`` (with its event queue) both call it and only carry out
what it returns. Per job, an :class:`AtomState` holds the contract, its phases and one
:class:`~laminar_zone.market.Calibrator` per phase, and decides

1. how the job bids (:meth:`AtomState.bidder`): from the unit it has reached, with its
   current phase's calibrated profile (:meth:`AtomState.believed`: a memory widening past
   every slice dropped), and, for the incumbent of a held window, from where its running
   piece surely is (:func:`~laminar_zone.market.assured_progress`);
2. what the market's work for a pass is (:func:`market_work`): each waiting job with its
   work left, and the classes of held pieces and client bids;
3. what a won bid starts (:meth:`AtomState.piece`): its units, what it commits to by its
   window's end, the seconds it expects and the memory it declares;
4. when a running piece's slice is put back in the round (:func:`decide_at`), and when its
   window ends (:func:`window_end_at`);
5. what an ended piece means (:meth:`AtomState.piece_ended`, a :class:`PieceEnd` in): the
   units its checkpoint covers, what the calibrator observes or widens, the violation by
   cause, whether it costs a retry; and the job's next state (:meth:`AtomState.next_state`:
   done, waiting for a window, or running).

No I/O, no clock, no randomness: times come in.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    EndCause,
    is_free_retry,
    widens_profile,
)
from laminar_zone.market import (
    Bid,
    Bidder,
    Calibrator,
    Contract,
    Profile,
    RatioPool,
    assured_progress,
    make_bidder,
    work_left_seconds,
)
from laminar_zone.placements import COMMITTING
from laminar_zone.queue import Bidding


@dataclass(frozen=True)
class Phase:
    """Units ``[start, end)`` of a job and their declared profile."""

    start: int
    end: int
    profile: Profile
    name: str = ""


def complete_phases(contract: Contract, declared: Sequence[Phase] = ()) -> tuple[Phase, ...]:
    """The declared phases and, after them, the rest of the contract's units (named
    ``rest`` if any phase was declared) with the contract's own profile."""
    phases = list(declared)
    start = phases[-1].end if phases else 0
    if start < contract.total_units:
        phases.append(
            Phase(start, contract.total_units, contract.profile, "rest" if phases else "")
        )
    return tuple(phases)


class Violation(enum.Enum):
    """Why a piece violated its contract: killed for memory, or stopped for time."""

    MEMORY = "memory"
    TIME = "time"


@dataclass(frozen=True)
class PieceEnd:
    """An ended piece as its job weighs it (the router reads it off the placement)."""

    subjob_id: str
    #: The subjob's final state (``common_pb2.SUCCEEDED``, ``KILLED``, ``FAILED``).
    state: int
    cause: EndCause
    unit_start: int
    #: Units its checkpoint covers, from ``unit_start``.
    units_done: int
    #: How long its process ran (checkpoint included, as its agent reports it) and its
    #: peak GPU memory (0: not known).
    run_seconds: float = 0.0
    peak_bytes: float = 0.0
    #: Its rank in a gang's piece (0 for a single piece): the members share one progress
    #: file and one pace, so only member 0's end is the piece's speed and observation.
    member: int = 0


@dataclass(frozen=True)
class Observed:
    """What an ended piece did to its job: ``observed`` fed the calibrator (a successful or
    stopped piece's speed and peak, or a widening), ``exceeded`` (a successful piece above
    the profile's ``1 - epsilon`` quantile), ``violation`` (killed for memory, stopped past its
    window), ``failed`` (a failure that costs a retry)."""

    observed: bool = False
    exceeded: bool = False
    violation: Violation | None = None
    failed: bool = False


class JobNext(enum.Enum):
    """An atomized job's state once its ended pieces are observed."""

    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"


@dataclass(frozen=True)
class Running:
    """A running piece holding its slice: where it started, its units, how long it ran."""

    unit_start: int
    unit_count: int
    elapsed_seconds: float


@dataclass(frozen=True)
class PiecePlan:
    """A won bid as the piece that starts: units ``unit_start`` .. ``+ unit_count - 1``
    (with incumbency more than the bid's, which are what it commits to by the window's end)."""

    unit_start: int
    unit_count: int
    expected_seconds: float
    memory_bytes: int


def window_end_at(now: float, length_seconds: float) -> float:
    """When a window of ``length_seconds`` offered at ``now`` ends (0: open-ended)."""
    return now + length_seconds if math.isfinite(length_seconds) else 0.0


def gang_member_cause(cause: EndCause, member: int, carrier: int = 0) -> EndCause:
    """How member ``member`` of a gang's piece that ended with ``cause`` reports its end,
    the router's and the simulator's: a violation (killed for memory, stopped past its
    window: a cause that widens the profile) is the piece's, once, so only ``carrier`` (the
    member killed, or the first stopped) ends with it and its siblings ``GANG_STOPPED``
    (free, unobserved); any other cause is every member's."""
    if member != carrier and widens_profile(cause):
        return EndCause.GANG_STOPPED
    return cause


def decide_at(window_end: float, checkpoint_seconds: float, round_seconds: float = 0.0) -> float:
    """When a running piece's slice is offered again as a held window: a checkpoint's length
    (at least two rounds) before its window ends, so a stop still checkpoints in time."""
    return window_end - max(2 * round_seconds, checkpoint_seconds)


@dataclass
class AtomState:
    """The market state of one atomized job: its contract, phases and their calibrators,
    the pieces observed and the unit reached."""

    contract: Contract
    phases: tuple[Phase, ...]
    calibrators: list[Calibrator]
    #: Subjob ids already observed (an end is weighed once, also after a restart).
    observed: set[str] = field(default_factory=set)
    #: Pieces that violated their contract for memory or time.
    violations: int = 0
    #: The next unit to do: the furthest any ended piece's checkpoint reached.
    next_unit: int = 0
    #: Memory widenings dropped because they predicted more than the largest slice.
    widen_resets: int = 0
    #: A gang's members (> 1): each piece is that many member pieces, on one slice each,
    #: started, extended and stopped together (one speed, a peak per member); each member's
    #: end is weighed as a piece's (:meth:`piece_ended`), a sibling stopped by a member's
    #: kill (``GANG_STOPPED``) free and unobserved; a finished or stopped piece is one
    #: observation of its speed (member 0's end), a peak per member.
    members: int = 1
    #: Per phase: the believed profile and the calibrator version it was computed at.
    _believed: dict[
        int, tuple[tuple[tuple[int, float, int, float, float, float], int], Profile]
    ] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        contract: Contract,
        phases: Sequence[Phase] = (),
        pool_of: Callable[[int], RatioPool | None] = lambda _: None,
        min_samples: int | None = None,
        members: int = 1,
    ) -> Self:
        """A new job's state: one calibrator per phase (the rest of the units a phase of
        their own), each in its family's pool (``pool_of(phase index)``)."""
        full = complete_phases(contract, phases)
        calibrators = [
            Calibrator(ph.profile, contract.epsilon, min_samples, pool_of(i))
            for i, ph in enumerate(full)
        ]
        return cls(contract, full, calibrators, members=members)

    def phase_at(self, unit: int) -> int:
        for i, ph in enumerate(self.phases):
            if ph.start <= unit < ph.end:
                return i
        return len(self.phases) - 1

    def believed(self, unit: int, largest_bytes: int) -> tuple[Profile, bool]:
        """The profile the job bids with at ``unit`` (its phase's calibrator's
        :meth:`~laminar_zone.market.Calibrator.believed`), and whether a memory widening
        past ``largest_bytes`` was dropped just now; cached until the calibrator or the
        largest slice changes (a widening kept while a larger slice was free is dropped
        once only smaller ones are left)."""
        phase = self.phase_at(unit)
        calibrator = self.calibrators[phase]
        key = (calibrator.version, largest_bytes)
        cached = self._believed.get(phase)
        if cached is not None and cached[0] == key:
            return cached[1], False
        profile, reset = calibrator.believed(largest_bytes)
        self.widen_resets += int(reset)
        # A reset changed the calibrator: key the profile by its version after it.
        self._believed[phase] = ((calibrator.version, largest_bytes), profile)
        return profile, reset

    def need_bytes(self, largest_bytes: int) -> int:
        """The memory the job's next piece is predicted to peak at (``1 - epsilon``)."""
        profile, _ = self.believed(self.next_unit, largest_bytes)
        return int(profile.peak_memory_bytes.value_at(1.0 - self.contract.epsilon))

    def bidder(
        self,
        job_id: str,
        tenant: str,
        priority: int,
        waited_seconds: float,
        largest_bytes: int,
        *,
        holds: tuple[str, str] | None = None,
        running: Running | None = None,
    ) -> tuple[Bidder, bool]:
        """The job bidding in a round, within its current phase (a piece never crosses a
        phase boundary), and whether a memory widening was dropped for it. From its next
        unit; for the incumbent of the held window ``holds``, from where its ``running``
        piece surely is (:func:`assured_progress`), so its work left is not counted from
        the piece's start."""
        next_unit = self.next_unit
        if running is not None:
            next_unit = max(next_unit, running.unit_start)
        phase = self.phase_at(next_unit)
        profile, reset = self.believed(next_unit, largest_bytes)
        if running is not None:
            next_unit = assured_progress(
                running.unit_start,
                running.unit_count,
                running.elapsed_seconds,
                profile,
                self.contract.epsilon,
            )
        bidder = make_bidder(
            job_id,
            tenant,
            self.contract,
            profile,
            next_unit,
            waited_seconds,
            priority,
            phase_end=self.phases[phase].end,
            holds=holds,
            members=self.members,
        )
        return bidder, reset

    def piece(self, bid: Bid, window_seconds: float, *, runs_on: bool) -> PiecePlan:
        """What a won ``bid`` starts, offered for ``window_seconds``. ``runs_on``
        (incumbency, the router bidding for the job): the piece runs every unit its job has
        left within the phase and ``max_units``, keeping its slice while nobody needs it
        more; else exactly the bid's units. It declares the phase's predicted peak (the
        caller caps it at its slice)."""
        phase_index = self.phase_at(bid.unit_start)
        count, expected = bid.unit_count, bid.expected_seconds
        if runs_on:
            end = min(self.phases[phase_index].end, bid.unit_start + self.contract.max_units)
            count = max(count, end - bid.unit_start)
            expected = min(window_seconds, bid.remaining_seconds or expected)
        profile = self.calibrators[phase_index].profile()
        memory = profile.peak_memory_bytes.value_at(1.0 - self.contract.epsilon)
        return PiecePlan(bid.unit_start, count, expected, int(memory))

    def piece_ended(self, end: PieceEnd) -> Observed:
        """Weigh one ended piece (once: a piece already observed changes nothing): the
        units its checkpoint covers move the job on; a successful piece's speed and peak
        feed its phase's calibrator; a piece killed for memory (``RECLAIMED``) or stopped
        past its window (``OVERRAN``) widens it and is a violation; a piece stopped for
        other work (``PREEMPTED``) is free, no violation, but what it measured (its speed
        over the units its checkpoint covers, and its peak when its agent reported one) is
        observed as a finished piece's; a lost piece is free and observes nothing; any
        other failure costs the job a retry."""
        if end.subjob_id in self.observed:
            return Observed()
        self.observed.add(end.subjob_id)
        self.next_unit = max(self.next_unit, end.unit_start + end.units_done)
        calibrator = self.calibrators[self.phase_at(end.unit_start)]
        stopped = end.state == common_pb2.KILLED and end.cause is EndCause.PREEMPTED
        if end.units_done > 0 and (
            end.state == common_pb2.SUCCEEDED or (stopped and end.peak_bytes > 0)
        ):
            if end.member > 0:
                # The piece's pace and its observation are member 0's: N members would be N
                # correlated samples of one run. Each member's own peak is still learned.
                if end.peak_bytes > 0:
                    calibrator.observe_memory(end.peak_bytes)
                return Observed()
            declared = calibrator.declared.peak_memory_bytes.value_at(1.0 - self.contract.epsilon)
            per_unit = end.run_seconds / end.units_done
            exceeded = calibrator.observe(per_unit, end.peak_bytes or declared, judged=not stopped)
            return Observed(observed=True, exceeded=exceeded and not stopped)
        if end.state == common_pb2.KILLED and widens_profile(end.cause):
            over_time = end.cause is EndCause.OVERRAN
            calibrator.overran(time=over_time, memory=not over_time)
            self.violations += 1
            return Observed(
                observed=True, violation=Violation.TIME if over_time else Violation.MEMORY
            )
        return Observed(failed=end.state == common_pb2.FAILED and not is_free_retry(end.cause))

    def next_state(self, has_live: bool) -> JobNext:
        """The job once its ended pieces are weighed: a live piece runs it; else it is done
        when every unit is, or waits for a window."""
        if has_live:
            return JobNext.RUNNING
        if self.next_unit >= self.contract.total_units:
            return JobNext.DONE
        return JobNext.WAITING


def market_work(
    waiting: Iterable[tuple[str, int, Bidder | None]],
    bidders: Iterable[Bidder],
    client_bids: Iterable[Bid] = (),
) -> list[int | Bidding]:
    """The market's work for a pass (:func:`laminar_zone.queue.class_order`): each waiting
    job ``(queue id, class, its bidder or None for a client bidder's job)`` as a
    :class:`~laminar_zone.queue.Bidding` with its work left as its bidder prices it (0
    unknown), met in the pass's queue order; and the classes of every bidder (a held
    piece's among them) and every client bid."""
    work: list[int | Bidding] = [
        Bidding(
            job_id,
            priority,
            work_left_seconds(b.contract, b.profile, b.next_unit) if b is not None else 0.0,
        )
        for job_id, priority, b in waiting
    ]
    work.extend({b.priority for b in bidders} | {b.priority for b in client_bids})
    return work


def broken_gang_pieces(
    placements: Iterable[zone_pb2.Placement],
) -> list[tuple[zone_pb2.Placement, list[zone_pb2.Placement]]]:
    """A gang's pieces with a member that ended other than successfully while siblings
    still run: (that member, its live siblings). A piece is its run of placements from a
    ``member == 0`` on (its members are added together, rank 0 first); a member still
    committing is not yet a survivor. From the placements alone, so a restart finds them."""
    pieces: list[list[zone_pb2.Placement]] = []
    for p in placements:
        if p.member == 0 or not pieces:
            pieces.append([])
        pieces[-1].append(p)
    out = []
    for piece in pieces:
        ended = next(
            (
                p
                for p in piece
                if p.state in ENDED_SUBJOB_STATES and p.state != common_pb2.SUCCEEDED
            ),
            None,
        )
        survivors = [p for p in piece if p.state in LIVE_SUBJOB_STATES and p.reason != COMMITTING]
        if ended is not None and survivors:
            out.append((ended, survivors))
    return out
