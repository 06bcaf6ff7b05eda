"""One clearing round spread over a pass's classes, as pure code: the router's and the simulator's.

A pass (:func:`laminar_zone.queue.class_order`) asks for a clearing round per priority
class, between the rigid walks of the classes (:class:`~laminar_zone.queue.Clear`). What
each of those rounds decides, and the state they share across the pass, is this module's
:class:`ClearingRound`; the router's :class:`~laminar_zone.atomizer.Atomizer` and the
simulator's ``MigReplay`` only feed it and carry out what it returns. Per step it

1. picks the slices of the round: free ones, and held ones (a running piece whose window
   ends now) only in a class's full round, not in a part of it (``Clear.jobs``); none a
   higher class won or a rigid job of the pass started on (:meth:`ClearingRound.take`);
2. cuts their windows at the class's blocked heads and restart claims
   (:func:`~laminar_zone.market.class_windows`);
3. chooses who bids now: the bidders of the class not awarded earlier in the pass (in a
   part, only its waiting jobs; a holder whose slice was decided bids no more), and bids
   made elsewhere (a client's) on windows still free;
4. clears them (:func:`~laminar_zone.market.clearing_round`), eligibility being the
   tenant's quota (counted in the pass's running tally, as the queue walk counts its
   starts, so one quota binds rigid and atomized work) and, if given, the job's spec
   (``allows``);
5. admits the awards in clearing order against the quotas (an incumbent keeps its slice
   whatever its tenant holds: it runs already) and turns them into decisions:
   :class:`Start` (a bid won a free window), :class:`Extend` (a piece keeps its slice),
   :class:`Stop` (a piece's slice went to another job). A gang's award (``Bid.members``
   > 1) is its whole set: one :class:`Start` or :class:`Extend` for all its windows, a
   :class:`Stop` per held slice it took.

:meth:`ClearingRound.close` ends the round: held pieces no award decided stop, and the
losers learn the best score that beat them. No I/O, no clock: ``now`` comes in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from laminar_base.demand import Demand
from laminar_zone.config import Quota
from laminar_zone.market import (
    Award,
    Bid,
    Bidder,
    ClearingContext,
    MarketWindow,
    OpenSlice,
    class_windows,
    clearing_round,
)
from laminar_zone.queue import Clear, QueueItem, quota_block


@dataclass(frozen=True)
class Start:
    """A bid won a free window: start a piece of ``award.bid`` on it now."""

    award: Award


@dataclass(frozen=True)
class Extend:
    """The piece holding ``key`` keeps its slice, in place, for the award's window
    (``award.bid.window.length_seconds``): no checkpoint, no restart. A gang's piece keeps
    all its slices (``award.windows``), named by the first."""

    key: tuple[str, str]
    award: Award


@dataclass(frozen=True)
class Stop:
    """The piece holding ``key`` checkpoints and stops: its slice went to ``award``'s job
    (a higher class, or its class by more than the hysteresis), or, ``award`` None, the
    round closed with no extension of it (none fits before the next commitment on it)."""

    key: tuple[str, str]
    award: Award | None = None


Decision = Start | Extend | Stop


@dataclass(frozen=True)
class Cleared:
    """What one step of the round decided, in clearing order, and what it weighed."""

    decisions: list[Decision]
    bids: list[Bid]
    #: Windows the step offered and bidders that bid in it (either 0: nothing cleared).
    windows: int = 0
    bidders: int = 0

    @property
    def is_cleared(self) -> bool:
        """Some bidder of ours met some window (the simulator counts such rounds)."""
        return self.windows > 0 and self.bidders > 0


@dataclass(frozen=True)
class Closed:
    """The round's end: the held pieces no step decided (each stops), each losing job's
    best score that beat one of its bids, the jobs that won, and every award."""

    stops: list[Stop]
    losing_scores: dict[str, float]
    winners: frozenset[str]
    awards: list[Award]


def piece_item(tenant: str, window: MarketWindow) -> QueueItem:
    """A piece on ``window``, as the queue's quota rule (:func:`quota_block`) weighs a job."""
    need = Demand(gpu_milli=window.gpu_milli, gpu_memory_bytes=window.memory_bytes)
    return QueueItem("", 0, tenant, 0.0, need, 1, 0.0)


@dataclass
class ClearingRound:
    """One clearing round over a pass, its state shared by the pass's class steps.

    ``slices``: the free slices when the round opened and the held ones (a piece whose
    window ends now, :attr:`OpenSlice.held_by`). ``bidders``: every waiting job's bidder and
    every holder's (:attr:`Bidder.holds`). ``client_bids``: bids made elsewhere (a client
    over ``Bid``), on the windows announced at the open. ``quotas`` None: no quota (the
    simulator); else tenant -> :class:`Quota`, checked against ``units``/``memory``, the
    pass's running tally per tenant, which the round adds its awards to (the caller's
    dicts: the queue walk counts its starts in the same ones). ``allows(job_id, key)``: the
    job's spec allows that slice (None: every slice); asked once per class of alike windows
    (:attr:`~laminar_zone.market.MarketWindow.alike`), so it reads only what their tag
    says (kind, MIG profile, GPU model)."""

    now: float
    slices: list[OpenSlice]
    bidders: list[Bidder]
    policy: str
    ctx: ClearingContext
    max_window_seconds: float
    client_bids: list[Bid] = field(default_factory=list)
    quotas: Mapping[str, Quota] | None = None
    units: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    allows: Callable[[str, tuple[str, str]], bool] | None = None
    #: Windows a higher class won, or a rigid job started on, in this pass.
    taken: set[tuple[str, str]] = field(default_factory=set)
    #: Every bid of the pass's steps and every award admitted, in order.
    bids: list[Bid] = field(default_factory=list)
    awards: list[Award] = field(default_factory=list)
    #: Held slices a step decided (extended, or lost to another job).
    decided: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        # A client's bid past its tenant's quota at the open is dropped (the tally of the
        # open: later awards are admitted in clearing order, step by step).
        self.client_bids = [b for b in self.client_bids if self.within_quota(b.tenant, b.window)]

    @property
    def held(self) -> list[tuple[str, str]]:
        """The held slices, in the order they came."""
        return [s.key for s in self.slices if s.held_by]

    def within_quota(self, tenant: str, window: MarketWindow) -> bool:
        """A piece on ``window`` keeps ``tenant`` within its quota, counting what it runs
        and what this pass has started or awarded it so far."""
        if self.quotas is None:
            return True
        return not quota_block(
            piece_item(tenant, window),
            self.quotas.get(tenant),
            self.units.get(tenant, 0.0),
            self.memory.get(tenant, 0),
        )

    def take(self, keys: Iterable[tuple[str, str]]) -> None:
        """A rigid job of this pass started on these slices: no later step offers them."""
        self.taken.update(keys)

    def _eligible(self, b: Bidder, w: MarketWindow) -> bool:
        if w.held_by and w.held_by == b.job_id:
            return True  # its own slice: it holds it already, within its quota
        if not self.within_quota(b.tenant, w):
            return False
        return self.allows is None or self.allows(b.job_id, w.key)

    def clear(self, step: Clear) -> Cleared:
        """The clearing round of class ``step.priority`` (None: every class): its bidders not
        awarded yet, on the windows no higher class (nor a rigid start) took, cut at the
        class's heads and claims. Returns its decisions in clearing order."""
        priority = step.priority
        part = step.jobs
        # A part of the class's round (step.jobs: waiting jobs ahead of the class's next
        # rigid job) is on free slices only; held ones wait for the class's full round.
        slices = self.slices if part is None else [s for s in self.slices if not s.held_by]
        windows = class_windows(
            self.now, slices, step.heads, self.max_window_seconds, self.taken, step.claims
        )
        awarded = {a.bid.job_id for a in self.awards}

        def bids_now(job_id: str, job_priority: int, on_held: bool) -> bool:
            if (priority is not None and job_priority != priority) or job_id in awarded:
                return False
            return part is None or (job_id in part and not on_held)

        theirs = [
            b
            for b in self.client_bids
            if bids_now(b.job_id, b.priority, bool(b.window.held_by))
            and b.window.key not in self.taken
        ]
        if not windows and not theirs:
            return Cleared([], [])
        ours = [
            b
            for b in self.bidders
            if bids_now(b.job_id, b.priority, b.holds is not None)
            and (b.holds is None or b.holds not in self.decided)
        ]
        if not ours and not theirs:
            return Cleared([], [], len(windows))
        checks = self.quotas is not None or self.allows is not None
        bids, awards = clearing_round(
            ours,
            windows,
            self.policy,
            self.ctx,
            eligible=self._eligible if checks else None,
            extra_bids=theirs,
        )
        self.bids.extend(bids)
        decisions: list[Decision] = []
        for won in awards:  # in clearing order: the best keep the tenant's quota
            tenant, won_windows = won.bid.tenant, won.windows
            if not won.bid.incumbent:
                if not self.within_quotas(tenant, won_windows):
                    continue
                for window in won_windows:
                    item = piece_item(tenant, window)
                    self.units[tenant] = self.units.get(tenant, 0.0) + item.units
                    self.memory[tenant] = self.memory.get(tenant, 0) + item.need.memory_bytes
            self.taken.update(w.key for w in won_windows)
            self.awards.append(won)
            held = [w for w in won_windows if w.held_by]
            if not held:
                decisions.append(Start(won))
                continue
            self.decided.update(w.key for w in held)
            if won.bid.incumbent:  # a gang's set is kept whole, its first key names it
                decisions.append(Extend(held[0].key, won))
            else:  # each piece holding one of them stops; the winner waits for them
                decisions.extend(Stop(w.key, won) for w in held)
        return Cleared(decisions, bids, len(windows), len(ours))

    def within_quotas(self, tenant: str, windows: Iterable[MarketWindow]) -> bool:
        """Pieces on all of ``windows`` (a gang's set) keep ``tenant`` within its quota."""
        if self.quotas is None:
            return True
        units, memory = self.units.get(tenant, 0.0), self.memory.get(tenant, 0)
        for window in windows:
            item = piece_item(tenant, window)
            if quota_block(item, self.quotas.get(tenant), units, memory):
                return False
            units += item.units
            memory += item.need.memory_bytes
        return True

    def close(self) -> Closed:
        """After the pass's last step: every held piece no step decided stops; each job
        that won nothing learns the best score that won a window it bid on."""
        winning = {w.key: a.score for a in self.awards for w in a.windows}
        winners = frozenset(a.bid.job_id for a in self.awards)
        losing: dict[str, float] = {}
        for bid in self.bids:
            key = bid.window.key
            if bid.job_id not in winners and key in winning:
                losing[bid.job_id] = max(losing.get(bid.job_id, winning[key]), winning[key])
        stops = [Stop(key) for key in self.held if key not in self.decided]
        return Closed(stops, losing, winners, list(self.awards))
