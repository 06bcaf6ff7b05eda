"""The atomization market as pure code: contracts, feasibility, bids, clearing, calibration.

A job that declares an atomization contract is run as a sequence of subjobs, each sized
to a window of free capacity an agent advertised. This module decides, without I/O:

* **Contract validation** (:func:`contract_from`): every field checked, errors name it.
* **Feasibility** (:func:`feasibility`): P(peak memory <= window memory and
  units x seconds-per-unit + checkpoint overhead <= window length), read from the
  profile's quantiles (piecewise-linear CDF). Memory and time are taken as independent;
  the time of ``n`` units is ``n`` times one draw of seconds-per-unit (fully correlated
  units: conservative for long subjobs).
* **Bidding** (:func:`best_bid`): the most units (within min/max and what is left) whose
  feasibility is at least ``1 - epsilon`` (binary search: feasibility falls with units).
* **Clearing** (:func:`clear`): each window goes to at most one bid and each job wins at
  most one window per round, greedily by priority class first (as everywhere in Laminar:
  a production job is never outbid by an opportunistic one), then by the policy's score;
  ties break on (job id, agent id, slice id), so a round is a pure function of its bids.
  Policies: ``utilization`` (capacity x time the subjob fills), ``fair`` (the tenant's
  deficit against its weighted share), ``responsive`` (how long the job has waited, on a
  log scale), ``srpt`` (least work left first, with a starvation guard: a job in the
  system past its patience outranks the rest of its class), ``slowdown`` (wait over work
  left) and ``blend`` (a weighted sum of the first three).
* **Incumbency** (:attr:`MarketWindow.held_by`, :attr:`Bidder.holds`): a running piece
  whose window ends bids to extend in place on its own slice; it keeps it unless a bid of
  a higher class, or of its class with a score higher by ``ClearingContext.hysteresis``,
  wins it, and a challenger takes a held slice only when no free window served it.
* **Calibration** (:class:`Calibrator`): observed seconds-per-unit and peak memory of
  finished subjobs feed a conformal-style inflation factor per resource, so that the
  share of subjobs that overrun their ``1 - epsilon`` prediction tracks ``epsilon``. An
  overrun also widens the resource it overran at once (:meth:`Calibrator.overran`: time
  for a window cut, memory for a memory kill), never the other.

No dual prices: contention is priced only through the clearing scores. Documented in
docs/atomization.md when the market is wired into the router.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from laminar_base.demand import Demand
from laminar_base.errors import InvalidArgument

POLICIES = ("utilization", "fair", "responsive", "srpt", "slowdown", "blend")
DEFAULT_EPSILON = 0.05
#: The clearing policy by default: chosen by measurement (docs/benchmarks.md, "Rigid versus
#: atomized": the lowest mean and p99 JCT of the six on the Philly trace).
DEFAULT_POLICY = "srpt"
#: ``blend`` weights (utilization, fair, responsive).
DEFAULT_BLEND = (0.5, 0.25, 0.25)
#: ``responsive`` grows with the log of the wait in these steps: 60 s of waiting scores
#: log(2) / log(1 + RESPONSIVE_FULL_SECONDS / 60), and it reaches 1 only at
#: RESPONSIVE_FULL_SECONDS, so an hour still counts against a day.
RESPONSIVE_STEP_SECONDS = 60.0
RESPONSIVE_FULL_SECONDS = 7 * 86400.0
#: ``srpt`` gives half its maximum to a job with this much work left.
SRPT_HALF_SECONDS = 3600.0
#: How much better (in score, 0..1) a bid of the same class must be to take a slice from
#: the running piece that holds it when that piece's window ends.
DEFAULT_HYSTERESIS = 0.1
#: ``srpt``'s starvation guard: a job that has been in the system longer than this many
#: times (its work left + STARVATION_FLOOR_SECONDS) is *starved* and outranks every job
#: that is not (0: no guard, pure SRPT). Chosen by measurement (docs/benchmarks.md).
DEFAULT_STARVATION_RATIO = 2.0
#: Added to the work left in a job's patience: under a long overload (6c71a0) most of a
#: class waits days, and a shorter patience promotes so many jobs that the class runs in
#: order of overdue-ness instead of SRPT's (docs/benchmarks.md: mean 0.9x rigid's).
DEFAULT_STARVATION_FLOOR_SECONDS = 4 * 86400.0


@dataclass(frozen=True)
class Quantiles:
    """A distribution given by (probability, value) points, increasing in both."""

    points: tuple[tuple[float, float], ...]

    def value_at(self, q: float) -> float:
        """The q-quantile (linear between points, flat beyond the ends)."""
        qs = [p for p, _ in self.points]
        i = bisect.bisect_left(qs, q)
        if i == 0:
            return self.points[0][1]
        if i >= len(self.points):
            return self.points[-1][1]
        (q0, v0), (q1, v1) = self.points[i - 1], self.points[i]
        return v0 + (v1 - v0) * (q - q0) / (q1 - q0) if q1 > q0 else v1

    def cdf(self, x: float) -> float:
        """P(X <= x): 0 below the first point's value... 1 at and above the last point's."""
        first_q, first_v = self.points[0]
        last_q, last_v = self.points[-1]
        if x >= last_v:
            return 1.0 if last_q >= 0.999 or x > last_v else last_q
        if x < first_v:
            return 0.0
        for (q0, v0), (q1, v1) in zip(self.points, self.points[1:], strict=False):
            if v0 <= x <= v1:
                return q0 + (q1 - q0) * ((x - v0) / (v1 - v0) if v1 > v0 else 1.0)
        return first_q

    def scaled(self, factor: float) -> Quantiles:
        return Quantiles(tuple((q, v * factor) for q, v in self.points))


@dataclass(frozen=True)
class Profile:
    seconds_per_unit: Quantiles
    peak_memory_bytes: Quantiles


@dataclass(frozen=True)
class Contract:
    total_units: int
    profile: Profile
    checkpoint_overhead_seconds: float
    min_units: int
    max_units: int
    epsilon: float


def quantiles_from(rows: Sequence[tuple[float, float]], field_name: str) -> Quantiles:
    """Validated quantile points; InvalidArgument names ``field_name``."""
    if not rows:
        raise InvalidArgument("at least one quantile is required", field=field_name)
    points = sorted((float(q), float(v)) for q, v in rows)
    for i, (q, v) in enumerate(points):
        if not 0.0 < q <= 1.0 or not math.isfinite(v) or v < 0:
            raise InvalidArgument(
                f"quantile {q} of value {v}: q must be in (0, 1] and the value >= 0",
                field=f"{field_name}[{i}]",
            )
        if i and (q == points[i - 1][0] or v < points[i - 1][1]):
            raise InvalidArgument(
                "quantiles must have distinct q and values that do not decrease",
                field=f"{field_name}[{i}]",
            )
    return Quantiles(tuple(points))


def contract_from(
    *,
    total_units: int,
    seconds_per_unit: Sequence[tuple[float, float]],
    peak_memory_bytes: Sequence[tuple[float, float]],
    checkpoint_overhead_seconds: float = 0.0,
    min_units: int = 0,
    max_units: int = 0,
    epsilon: float = 0.0,
    prefix: str = "spec.atomization",
) -> Contract:
    """A checked contract (the router's Submit path); 0 means the default where allowed."""
    if not 1 <= total_units <= 10**12:
        raise InvalidArgument(
            f"must be in 1..10^12, got {total_units}", field=f"{prefix}.total_units"
        )
    low = min_units or 1
    high = max_units or total_units
    if low > high:
        raise InvalidArgument(f"{low} > max_units {high}", field=f"{prefix}.min_units")
    if high > total_units:
        raise InvalidArgument(f"{high} > total_units {total_units}", field=f"{prefix}.max_units")
    if not 0 <= checkpoint_overhead_seconds <= 86400:
        raise InvalidArgument(
            f"must be in 0..86400 s, got {checkpoint_overhead_seconds}",
            field=f"{prefix}.checkpoint_overhead_seconds",
        )
    eps = epsilon or DEFAULT_EPSILON
    if not 0 < eps < 0.5:
        raise InvalidArgument(f"must be in (0, 0.5), got {eps}", field=f"{prefix}.epsilon")
    profile = Profile(
        quantiles_from(seconds_per_unit, f"{prefix}.seconds_per_unit"),
        quantiles_from(peak_memory_bytes, f"{prefix}.peak_memory_bytes"),
    )
    return Contract(total_units, profile, checkpoint_overhead_seconds, low, high, eps)


@dataclass(frozen=True)
class MarketWindow:
    """A slice's free capacity for a while (``laminar.v1.Window``, reduced)."""

    agent_id: str
    slice_id: str
    memory_bytes: int
    gpu_milli: int
    length_seconds: float  # math.inf when open-ended
    #: What else a bidder may care about (slice kind, MIG profile, GPU model): windows of
    #: one tag and the same figures are interchangeable.
    tag: str = ""
    #: The job whose running piece holds this slice and whose window ends now ("" = the
    #: slice is free). The holder bids to extend in place (:attr:`Bid.incumbent`); anyone
    #: else bids to take the slice when the piece stops.
    held_by: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.agent_id, self.slice_id)

    @property
    def alike(self) -> tuple[int, int, float, str, str]:
        """Windows with equal ``alike`` get identical bids from any bidder."""
        return (self.memory_bytes, self.gpu_milli, self.length_seconds, self.tag, self.held_by)


def feasibility(profile: Profile, units: int, window: MarketWindow, overhead: float) -> float:
    """P(peak memory fits the window and the units plus the checkpoint end in time)."""
    memory_ok = profile.peak_memory_bytes.cdf(float(window.memory_bytes))
    if math.isinf(window.length_seconds):
        return memory_ok
    budget = window.length_seconds - overhead
    if budget <= 0 or units <= 0:
        return 0.0
    time_ok = profile.seconds_per_unit.cdf(budget / units)
    return memory_ok * time_ok


@dataclass(frozen=True)
class Bid:
    job_id: str
    tenant: str
    window: MarketWindow
    unit_start: int
    unit_count: int
    feasibility: float
    expected_seconds: float
    waited_seconds: float
    #: ``laminar.v1.PriorityClass``: lower clears first (1 critical .. 4 opportunistic).
    priority: int = 3
    #: Alike windows (``window`` first, in key order) the bid is equally good on: it wins
    #: the first of them still free. Empty: ``window`` only.
    pool: tuple[MarketWindow, ...] = ()
    #: Expected seconds of all the work the job has left (median speed): ``srpt`` and
    #: ``slowdown`` read it; 0 = unknown (taken as ``expected_seconds``).
    remaining_seconds: float = 0.0
    #: The bid of the running piece that holds ``window`` to extend in place.
    incumbent: bool = False
    #: A gang's members (> 1: a gang bid): it wins ``members`` windows of its ``pool`` at
    #: once, with a common start and length, or none (:func:`clear`). Each member runs on
    #: one slice; ``unit_count`` and the times are every member's (they move in lockstep).
    members: int = 1


def work_left_seconds(contract: Contract, profile: Profile, next_unit: int) -> float:
    """A job's work left from ``next_unit`` at its profile's median speed, with one
    checkpoint overhead: what ``srpt`` ranks by (``Bid.remaining_seconds``); 0 when done."""
    left = contract.total_units - next_unit
    if left <= 0:
        return 0.0
    median = profile.seconds_per_unit.value_at(0.5)
    return left * median + contract.checkpoint_overhead_seconds


def best_bid(
    job_id: str,
    tenant: str,
    contract: Contract,
    profile: Profile,
    window: MarketWindow,
    next_unit: int,
    waited_seconds: float,
    priority: int = 3,
) -> Bid | None:
    """The largest subjob for ``window`` that fits with probability >= 1 - epsilon."""
    left = contract.total_units - next_unit
    if left <= 0:
        return None
    low = min(contract.min_units, left)
    high = min(contract.max_units, left)
    target = 1.0 - contract.epsilon
    overhead = contract.checkpoint_overhead_seconds
    if feasibility(profile, low, window, overhead) < target:
        return None
    while low < high:  # feasibility does not grow with units
        mid = (low + high + 1) // 2
        if feasibility(profile, mid, window, overhead) >= target:
            low = mid
        else:
            high = mid - 1
    median = profile.seconds_per_unit.value_at(0.5)
    return Bid(
        job_id,
        tenant,
        window,
        next_unit,
        low,
        feasibility(profile, low, window, overhead),
        low * median + overhead,
        waited_seconds,
        priority,
        remaining_seconds=work_left_seconds(contract, profile, next_unit),
        incumbent=bool(window.held_by) and window.held_by == job_id,
    )


@dataclass(frozen=True)
class Bidder:
    """A waiting atomized job as one round sees it."""

    job_id: str
    tenant: str
    contract: Contract
    profile: Profile  # the calibrated one
    next_unit: int
    waited_seconds: float
    priority: int = 3
    #: (agent, slice) this job's running piece holds and may extend in place on (its window
    #: ends now): it bids on that window only. None: a waiting job, bidding everywhere. A
    #: gang's piece holds one slice per member: ``holds`` is any of them, and it bids on
    #: every window held by it (:attr:`MarketWindow.held_by`).
    holds: tuple[str, str] | None = None
    #: A gang's members (> 1: it bids for that many windows at once, :attr:`Bid.members`).
    members: int = 1


def assured_progress(
    unit_start: int, unit_count: int, elapsed_seconds: float, profile: Profile, epsilon: float
) -> int:
    """The unit a running piece has reached with probability at least ``1 - epsilon``,
    ``elapsed_seconds`` after it started on units ``unit_start`` .. ``unit_start +
    unit_count - 1``: the time it ran over its profile's ``1 - epsilon`` quantile of seconds
    per unit (the calibrated profile: its slow pace), at most its last unit (it bids for the
    rest of its own piece, never past it). What an incumbent's extension bid counts its work
    left from, where the router has no checkpoint of a running piece yet (its units are
    reported when it ends): not from the piece's start (a nearly finished piece is not
    scored as a fresh one), and not from a median guess that a slow piece has not reached
    (its extension would promise units it cannot do by the window's end)."""
    if unit_count <= 0:
        return unit_start
    per_unit = profile.seconds_per_unit.value_at(1.0 - epsilon)
    done = unit_count - 1 if per_unit <= 0 else int(max(0.0, elapsed_seconds) / per_unit)
    return unit_start + min(unit_count - 1, done)


def make_bidder(
    job_id: str,
    tenant: str,
    contract: Contract,
    profile: Profile,
    next_unit: int,
    waited_seconds: float,
    priority: int,
    *,
    phase_end: int | None = None,
    holds: tuple[str, str] | None = None,
    members: int = 1,
) -> Bidder:
    """A job as a round sees it, the router's and the simulator's: its calibrated
    ``profile`` (:meth:`Calibrator.believed`), bidding from ``next_unit`` within its current
    phase (a piece never crosses ``phase_end``; None: the contract's end), having been in
    the system ``waited_seconds`` (what the scores that age read)."""
    limit = (contract.total_units if phase_end is None else phase_end) - next_unit
    if limit < contract.total_units - next_unit:
        contract = Contract(
            contract.total_units,
            contract.profile,
            contract.checkpoint_overhead_seconds,
            min(contract.min_units, limit),
            min(contract.max_units, limit),
            contract.epsilon,
        )
    return Bidder(
        job_id, tenant, contract, profile, next_unit, waited_seconds, priority, holds, members
    )


def round_bids(
    bidders: Iterable[Bidder],
    windows: Iterable[MarketWindow],
    eligible: Callable[[Bidder, MarketWindow], bool] | None = None,
) -> list[Bid]:
    """Every bidder's best bid on the windows it may use (``eligible``), for :func:`clear`.

    Windows that are alike (:attr:`MarketWindow.alike`) get identical bids, so each bidder
    is priced once per class of windows, not once per window, and bids on the whole class
    (:attr:`Bid.pool`): :func:`clear` gives it the first window of the class still free,
    which is what bidding on every window of the class would give. The work is bidders x
    classes, not bidders x windows. A held window (:attr:`MarketWindow.held_by`) is a class
    of its own; its holder bids on it alone.
    """
    ordered = sorted(windows, key=lambda w: w.key)
    pool_of: dict[tuple[int, int, float, str, str], list[MarketWindow]] = {}
    for w in ordered:
        pool_of.setdefault(w.alike, []).append(w)
    pools = [tuple(members) for members in pool_of.values()]
    out: list[Bid] = []
    gangs = [b for b in bidders if b.members > 1]
    if gangs:
        out.extend(gang_bids(gangs, ordered, eligible))
    for b in bidders:
        if b.members > 1:
            continue
        for members in pools:
            first = members[0]
            if b.holds is not None and (first.key != b.holds or first.held_by != b.job_id):
                continue
            if first.held_by == b.job_id and b.holds != first.key:
                continue
            if eligible is not None and not eligible(b, first):
                continue
            bid = _priced(b, first)
            if bid is not None:
                out.append(replace(bid, pool=members) if len(members) > 1 else bid)
    return out


def _priced(b: Bidder, window: MarketWindow) -> Bid | None:
    """``b``'s best bid for ``window`` (:func:`best_bid`), or None."""
    return best_bid(
        b.job_id,
        b.tenant,
        b.contract,
        b.profile,
        window,
        b.next_unit,
        b.waited_seconds,
        b.priority,
    )


def gang_bids(
    bidders: Iterable[Bidder],
    windows: Sequence[MarketWindow],
    eligible: Callable[[Bidder, MarketWindow], bool] | None = None,
) -> list[Bid]:
    """Each gang's bids (:attr:`Bidder.members` > 1), one per family of windows: windows
    with the same memory, share, offered length and tag (a MIG profile's slices, on any
    host: a rigid gang's members may be spread so too), held or not. A waiting gang bids on
    the family's free windows and, after them, on the windows held by other jobs' pieces
    (:func:`clear` lets it take those only from a lower class); a gang whose piece holds
    slices (:attr:`Bidder.holds`) bids to extend on its own held windows only. A family
    with fewer windows than members gets no bid. Priced on the family's first window (all
    alike in what :func:`best_bid` reads)."""
    family_of: dict[tuple[int, int, float, str], list[MarketWindow]] = {}
    for w in windows:
        family_of.setdefault(w.alike[:4], []).append(w)
    families = [
        sorted(members, key=lambda w: (bool(w.held_by), w.key)) for members in family_of.values()
    ]
    out: list[Bid] = []
    for b in bidders:
        for family in families:
            if b.holds is not None:
                pool = [w for w in family if w.held_by == b.job_id]
            else:
                pool = [w for w in family if w.held_by != b.job_id]
            if len(pool) < b.members:
                continue
            first = pool[0]
            if eligible is not None and not eligible(b, first):
                continue
            bid = _priced(b, first)
            if bid is not None:
                out.append(replace(bid, members=b.members, pool=tuple(pool)))
    return out


@dataclass(frozen=True)
class ClearingContext:
    """What the scores need beyond the bids: tenants' usage (fair, blend), the incumbents'
    hysteresis, ``srpt``'s starvation guard."""

    #: Tenant -> GPU-seconds it ran recently (its usage).
    usage: Mapping[str, float] = field(default_factory=dict)
    #: Tenant -> weight of its fair share (unlisted: 1).
    shares: Mapping[str, float] = field(default_factory=dict)
    blend: tuple[float, float, float] = DEFAULT_BLEND
    #: A challenger of the incumbent's own class takes its slice only with a score higher
    #: by more than this.
    hysteresis: float = DEFAULT_HYSTERESIS
    #: ``srpt``'s starvation guard (:func:`patience_seconds`); 0 = pure SRPT.
    starvation_ratio: float = DEFAULT_STARVATION_RATIO
    starvation_floor_seconds: float = DEFAULT_STARVATION_FLOOR_SECONDS


def utilization_score(bid: Bid) -> float:
    """Capacity x time the subjob fills: its share of the window (1 = fills it)."""
    w = bid.window
    if math.isinf(w.length_seconds) or w.length_seconds <= 0:
        return min(1.0, bid.expected_seconds / 3600.0)  # open window: longer work is better
    return min(1.0, bid.expected_seconds / w.length_seconds)


def fair_score(bid: Bid, ctx: ClearingContext) -> float:
    """The tenant's deficit: 1 for a tenant that ran nothing, falling with usage per share."""
    used = ctx.usage.get(bid.tenant, 0.0) / max(ctx.shares.get(bid.tenant, 1.0), 1e-9)
    total = sum(ctx.usage.values()) or 1.0
    return 1.0 - min(1.0, used / total)


def responsive_score(bid: Bid) -> float:
    """Waiting time on a log scale, so it tells hours from days: log(1 + w / 60 s) over
    log(1 + RESPONSIVE_FULL_SECONDS / 60 s), at most 1."""
    waited = max(0.0, bid.waited_seconds)
    full = math.log1p(RESPONSIVE_FULL_SECONDS / RESPONSIVE_STEP_SECONDS)
    return min(1.0, math.log1p(waited / RESPONSIVE_STEP_SECONDS) / full)


def _remaining(bid: Bid) -> float:
    return max(bid.remaining_seconds or bid.expected_seconds, 1e-9)


def patience_seconds(bid: Bid, ctx: ClearingContext) -> float:
    """How long a job may stay in the system before ``srpt`` counts it as starved:
    ``starvation_ratio x (work left + starvation_floor_seconds)`` (inf without a guard).
    Proportional to the work left, so a long job is not promoted over short ones as soon as
    it waits, and bounded below, so a short job waits a day or so before it is."""
    if ctx.starvation_ratio <= 0:
        return math.inf
    return ctx.starvation_ratio * (_remaining(bid) + max(0.0, ctx.starvation_floor_seconds))


def srpt_score(bid: Bid, ctx: ClearingContext | None = None) -> float:
    """Shortest remaining work first, with a starvation guard (SRPT with a bounded slowdown).

    A job not starved scores SRPT_HALF / (SRPT_HALF + work left), in (0, 1]. A job in the
    system (``waited_seconds``) for at least its :func:`patience_seconds` is starved and
    scores 1 + waited / (waited + patience), in [1.5, 2): above every job that is not, and,
    among starved jobs, the one most overdue for its size first. Under pure SRPT a stream
    of short jobs can keep a long one waiting until the stream stops; the guard bounds
    that wait to a multiple of the job's size, and only the few jobs that reach it leave
    SRPT's order, so the mean barely moves. A starved incumbent also keeps its slice
    against any job not starved."""
    context = ctx or ClearingContext()
    srpt = SRPT_HALF_SECONDS / (SRPT_HALF_SECONDS + _remaining(bid))
    patience = patience_seconds(bid, context)
    waited = max(0.0, bid.waited_seconds)
    if waited < patience:
        return srpt
    return 1.0 + waited / (waited + patience)


def slowdown_score(bid: Bid) -> float:
    """SRPT that ages: (wait + SRPT_HALF) / (wait + SRPT_HALF + work left). Unwaited it
    ranks as ``srpt``; as a job waits its score climbs towards 1, so a long job that
    waited long outranks a short newcomer and the tail does not starve."""
    waited = max(0.0, bid.waited_seconds) + SRPT_HALF_SECONDS
    return waited / (waited + _remaining(bid))


def score(bid: Bid, policy: str, ctx: ClearingContext) -> float:
    if policy == "utilization":
        return utilization_score(bid)
    if policy == "fair":
        return fair_score(bid, ctx)
    if policy == "responsive":
        return responsive_score(bid)
    if policy == "srpt":
        return srpt_score(bid, ctx)
    if policy == "slowdown":
        return slowdown_score(bid)
    if policy == "blend":
        wu, wf, wr = ctx.blend
        return wu * utilization_score(bid) + wf * fair_score(bid, ctx) + wr * responsive_score(bid)
    raise InvalidArgument(f"unknown clearing policy {policy!r}", field="market.policy")


@dataclass(frozen=True)
class Award:
    bid: Bid
    score: float

    @property
    def windows(self) -> tuple[MarketWindow, ...]:
        """The windows won: a gang's one per member (its pool as awarded, ``bid.window``
        first), else ``bid.window``."""
        return self.bid.pool if self.bid.members > 1 else (self.bid.window,)


def offer_seconds(now: float, end: float, cap: float, head_start: float | None) -> float:
    """How long a window is offered in a round: to its end (``end`` <= 0: open-ended), at
    most ``cap``, and never past the expected start of the blocked rigid job of its family
    (EASY: atomized work backfills it without delaying it). <= 0: not offered."""
    length = cap if end <= 0 else min(cap, end - now)
    if head_start is not None:
        length = min(length, head_start - now)
    return length


def slice_family(mig_profile: str) -> str:
    """The rigid jobs' family a slice serves (laminar_base.demand.Demand.family): a MIG
    slice its profile's, any other slice whole-GPU jobs'. A blocked head of that family
    cuts the slice's windows."""
    return Demand(gpus=0 if mig_profile else 1, mig_profile=mig_profile).family


@dataclass(frozen=True)
class OpenSlice:
    """A slice a clearing round may offer, as the router and the simulator both describe it
    to :func:`class_windows`: free now, or held by a running piece whose window ends now."""

    agent_id: str
    slice_id: str
    memory_bytes: int
    gpu_milli: int
    #: :func:`slice_family`: whose blocked rigid head cuts its windows.
    family: str
    #: When its free time ends, on the round's clock (<= 0: open-ended). A held slice's is
    #: not read: its piece's old window ended, the slice is offered to its next commitment.
    end: float = 0.0
    #: :attr:`MarketWindow.tag`.
    tag: str = ""
    #: The job whose running piece holds the slice and whose window ends now ("" = free).
    held_by: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.agent_id, self.slice_id)


def class_windows(
    now: float,
    slices: Iterable[OpenSlice],
    heads: Mapping[str, float | None],
    max_window_seconds: float,
    taken: Container[tuple[str, str]] = (),
    claims: Iterable[tuple[int, float]] = (),
) -> list[MarketWindow]:
    """The windows one class's clearing round offers, the router's and the simulator's.

    Each slice not ``taken`` (won by a higher class, or started on by a rigid job, earlier
    in the same pass) is offered from ``now`` to its end (:func:`offer_seconds`): at most
    ``max_window_seconds``, never past ``heads[slice.family]``, the expected start of that
    family's blocked rigid head of this class or a higher one (laminar_zone.queue.Clear: a
    lower class's blocked job holds no slice against it; EASY backfill otherwise). A held
    slice stays held by its piece's job (:attr:`MarketWindow.held_by`: incumbency) and is
    offered open-ended up to those cuts. A slice with no time left (<= 0 s) is not offered;
    whether a window is long enough for a bid's checkpoint is the bid's affair
    (:func:`feasibility`). ``heads`` of every class give the length offered to any class
    (what a client is announced). ``claims`` (GPU memory, expected start: a rigid job of
    this class or higher requeued after a memory kill, laminar_zone.queue.QueueWalk.claims)
    cut a held slice with that much memory at that start, whatever its family: its piece
    does not extend in place across it (free slices are cut at their family's head only).
    Order follows ``slices``."""
    claimed = sorted(claims)
    out = []
    for s in slices:
        if s.key in taken:
            continue
        end = 0.0 if s.held_by else s.end
        cut = heads.get(s.family)
        if s.held_by and claimed:
            starts = [start for memory, start in claimed if memory <= s.memory_bytes]
            if starts:
                cut = min(starts) if cut is None else min(cut, *starts)
        length = offer_seconds(now, end, max_window_seconds, cut)
        if length > 0:
            out.append(
                MarketWindow(
                    s.agent_id, s.slice_id, s.memory_bytes, s.gpu_milli, length, s.tag, s.held_by
                )
            )
    return out


def clearing_round(
    bidders: Iterable[Bidder],
    windows: Iterable[MarketWindow],
    policy: str,
    ctx: ClearingContext,
    *,
    eligible: Callable[[Bidder, MarketWindow], bool] | None = None,
    extra_bids: Iterable[Bid] = (),
) -> tuple[list[Bid], list[Award]]:
    """One clearing round, the router's and the simulator's: every bidder's best bid on the
    windows it may use (:func:`round_bids`), plus bids made elsewhere (a client bidding over
    ``Bid``), cleared by ``policy`` (:func:`clear`). Returns (all bids, awards)."""
    bids = round_bids(bidders, windows, eligible)
    bids.extend(extra_bids)
    return bids, clear(bids, policy, ctx)


def clear(bids: Iterable[Bid], policy: str, ctx: ClearingContext | None = None) -> list[Award]:
    """One round: windows to the best bids (priority class first, then score), one window
    per job; ties go to the lower job id, then the lower (agent, slice). A pool bid stands
    for one bid per window of its pool, so it is queued under its first window still free
    and re-queued under the next one when that is taken: the awards are exactly those of
    the expanded bids, at the cost of the pools' sizes only where windows are contested.

    Incumbency: a held window (its piece's window ends now) goes to its holder's bid to
    extend in place unless a bid of a higher class, or of the same class with a score higher
    by more than ``ctx.hysteresis``, wants it; within a class, bids on free windows go
    before bids on held ones, so a piece is displaced only by work no free window served.
    An award on a held window to another job means: the piece checkpoints and stops. A
    gang's piece extending in place keeps its set from every bid of its class, a single's
    as a gang's: one slice taken stops all its members.

    A gang's bid (:attr:`Bid.members` > 1) wins, at its turn, that many windows of its pool
    or none (:func:`_gang_windows`): a single ranked below it never takes one of a set it
    could complete, and a set it cannot complete is left whole to the bids after it. Its
    award's ``pool`` is the windows won (:attr:`Award.windows`)."""
    context = ctx or ClearingContext()
    bids = list(bids)
    # Whose piece holds a window, by class: a gang takes a held window only from a lower
    # class (or from a holder that does not bid to extend: it stops anyway).
    holder_priority = {b.window.held_by: b.priority for b in bids if b.incumbent}
    # A gang extending in place: no bid of its class or a lower one takes one of its slices
    # (a single would stop the whole set for a hysteresis-sized gain, as a gang would).
    gang_holder = {b.window.held_by: b.priority for b in bids if b.incumbent and b.members > 1}

    def kept_from(w: MarketWindow, bid: Bid) -> bool:
        holder = gang_holder.get(w.held_by) if w.held_by and w.held_by != bid.job_id else None
        return holder is not None and holder <= bid.priority

    heap: list[tuple[int, int, float, str, str, str, int, int, float, Bid]] = []
    for seq, bid in enumerate(bids):
        value = score(bid, policy, context)
        w = bid.window
        rank = value + context.hysteresis if bid.incumbent else value
        tier = 1 if w.held_by else 0
        heap.append(
            (bid.priority, tier, -rank, bid.job_id, w.agent_id, w.slice_id, seq, 0, value, bid)
        )
    heapq.heapify(heap)
    taken_windows: set[tuple[str, str]] = set()
    taken_jobs: set[str] = set()
    awards = []
    while heap:
        prio, tier, neg, job_id, _, _, seq, at, value, bid = heapq.heappop(heap)
        if job_id in taken_jobs:
            continue
        if bid.members > 1:
            gang = _gang_windows(bid, prio, taken_windows, holder_priority)
            if gang is None:
                continue  # fewer than its members free at its turn: it takes none
            taken_windows.update(w.key for w in gang)
            taken_jobs.add(job_id)
            awards.append(Award(replace(bid, window=gang[0], pool=gang), value))
            continue
        pool = bid.pool or (bid.window,)
        while at < len(pool) and (pool[at].key in taken_windows or kept_from(pool[at], bid)):
            at += 1
        if at == len(pool):
            continue
        window = pool[at]
        here = (prio, tier, neg, job_id, window.agent_id, window.slice_id)
        if at and (heap and heap[0][:6] < here):
            # Its next free window sorts after bids still queued: wait for its turn.
            heapq.heappush(heap, (*here, seq, at, value, bid))
            continue
        taken_windows.add(window.key)
        taken_jobs.add(job_id)
        won = bid if window == bid.window and not bid.pool else replace(bid, window=window, pool=())
        awards.append(Award(won, value))
    return awards


def _gang_windows(
    bid: Bid,
    priority: int,
    taken: Container[tuple[str, str]],
    holder_priority: Mapping[str, int],
) -> tuple[MarketWindow, ...] | None:
    """The ``bid.members`` windows a gang's bid wins at its turn in :func:`clear`, free ones
    first (its pool's order), or None when fewer are left: all or nothing, so a gang holds
    its whole set before any bid ranked below it takes one, and a gang that cannot complete
    takes nothing. A window held by another job's piece is taken only when that holder is
    of a lower class or does not bid to extend (a gang never displaces its own class: it
    would stop a whole set for a hysteresis-sized gain)."""
    chosen: list[MarketWindow] = []
    for w in bid.pool or (bid.window,):
        if w.key in taken:
            continue
        if w.held_by and w.held_by != bid.job_id:
            holder = holder_priority.get(w.held_by)
            if holder is not None and holder <= priority:
                continue
        chosen.append(w)
        if len(chosen) == bid.members:
            return tuple(chosen)
    return None


def default_min_samples(epsilon: float) -> int:
    """Observations before a calibrator may shrink a profile: ceil(1 / epsilon) - 1."""
    return max(1, math.ceil(1.0 / epsilon - 1e-9) - 1)


#: Ratios a family's pool keeps (the most recent): bounds the sort of each prediction.
POOL_RATIOS = 512


@dataclass
class RatioPool:
    """Observed / declared ratios shared by the calibrators of one job family (tenant and
    name, per phase): a new job of the family starts from what its elders ran, with its
    own declared profile as the scale (the prior)."""

    time_ratios: list[float] = field(default_factory=list)
    memory_ratios: list[float] = field(default_factory=list)


class Calibrator:
    """Conformal-style inflation of a job's profile from its finished subjobs.

    For each resource it keeps the ratios observed / declared (1 - epsilon)-quantile. The
    inflation factor is the finite-sample-corrected (1 - epsilon) quantile of those ratios,
    never below 1 before ``min_samples`` observations: a new job is not trusted to be faster
    than declared. The default, ``ceil(1 / epsilon) - 1`` (19 at epsilon 0.05), is the
    smallest n at which the split-conformal rank ``ceil((n + 1)(1 - epsilon))`` stays within
    the n samples, i.e. where the empirical quantile really covers 1 - epsilon; below it
    the coverage is only n / (n + 1) (the simulator's replay measured 5.9% overruns at
    min_samples 5 against 3.4% at 19, epsilon 0.05).

    With a ``pool``, the ratios are the family's (:class:`RatioPool`, the last
    ``POOL_RATIOS``): the samples count across the family's jobs, so a job whose family
    ran before learns within its first pieces. Widening after an overrun stays the job's.
    """

    def __init__(
        self,
        declared: Profile,
        epsilon: float,
        min_samples: int | None = None,
        pool: RatioPool | None = None,
    ) -> None:
        self.declared = declared
        self.epsilon = epsilon
        self.min_samples = min_samples if min_samples is not None else default_min_samples(epsilon)
        shared = pool if pool is not None else RatioPool()
        self.time_ratios: list[float] = shared.time_ratios
        self.memory_ratios: list[float] = shared.memory_ratios
        self.widen_time = 1.0
        self.widen_memory = 1.0
        self.observed = 0
        self.violations = 0

    def _factor(self, ratios: list[float], widen: float) -> float:
        if not ratios:
            return widen
        ordered = sorted(ratios)
        n = len(ordered)
        rank = min(n, math.ceil((n + 1) * (1.0 - self.epsilon)))
        conformal = ordered[rank - 1]
        if n < self.min_samples:
            conformal = max(1.0, conformal)
        return max(conformal, 1e-6) * widen

    def profile(self) -> Profile:
        """The declared profile scaled by the current inflation factors."""
        return Profile(
            self.declared.seconds_per_unit.scaled(self._factor(self.time_ratios, self.widen_time)),
            self.declared.peak_memory_bytes.scaled(
                self._factor(self.memory_ratios, self.widen_memory)
            ),
        )

    def observe(
        self, seconds_per_unit: float, peak_memory_bytes: float, *, judged: bool = True
    ) -> bool:
        """A finished subjob's figures; True if it overran the current prediction. A piece
        stopped for other work (``judged`` False) teaches the profile without counting as
        a violation of it: its run was cut short, so it says nothing of the coverage."""
        current = self.profile()
        q = 1.0 - self.epsilon
        overran = seconds_per_unit > current.seconds_per_unit.value_at(q) or (
            peak_memory_bytes > current.peak_memory_bytes.value_at(q)
        )
        self.observed += 1
        self.violations += int(overran and judged)
        base_time = max(self.declared.seconds_per_unit.value_at(q), 1e-12)
        base_memory = max(self.declared.peak_memory_bytes.value_at(q), 1e-12)
        self.time_ratios.append(seconds_per_unit / base_time)
        self.memory_ratios.append(peak_memory_bytes / base_memory)
        for ratios in (self.time_ratios, self.memory_ratios):
            del ratios[:-POOL_RATIOS]
        self.widen_time = self.widen_memory = 1.0  # real figures are in the ratios now
        return overran

    def observe_memory(self, peak_memory_bytes: float) -> None:
        """A peak without a speed of its own: a gang member beside the one whose end
        stands for the piece's pace (its members share one progress file, so their times
        are one sample, not several). Learned, not counted as an observation."""
        q = 1.0 - self.epsilon
        base_memory = max(self.declared.peak_memory_bytes.value_at(q), 1e-12)
        self.memory_ratios.append(peak_memory_bytes / base_memory)
        del self.memory_ratios[:-POOL_RATIOS]
        self.widen_memory = 1.0  # a real figure is in the ratios now

    def overran(self, factor: float = 1.5, *, time: bool = True, memory: bool = True) -> None:
        """A subjob ran out of its window (``time``) or its memory (``memory``) and restarts
        from its checkpoint: widen that prediction at once, until real figures are observed.
        A window cut says nothing about memory: widening memory on it could push a job's
        predicted peak above every slice, and a job that never runs is never observed."""
        if time:
            self.widen_time *= factor
        if memory:
            self.widen_memory *= factor

    def believed(self, largest_slice_bytes: int) -> tuple[Profile, bool]:
        """The profile bids use, and whether a memory widening was just dropped.

        A memory widening that pushes the predicted peak (at ``1 - epsilon``) above the
        largest slice there is would leave the job unable to win any window, so it would
        never be observed and never lose the widening: it is dropped then (the router and
        the simulator alike). A time widening is kept. ``largest_slice_bytes`` 0 means
        unknown (no window seen yet): nothing is dropped."""
        profile = self.profile()
        if self.widen_memory <= 1.0 or largest_slice_bytes <= 0:
            return profile, False
        if profile.peak_memory_bytes.value_at(1.0 - self.epsilon) <= largest_slice_bytes:
            return profile, False
        self.widen_memory = 1.0
        return self.profile(), True

    @property
    def version(self) -> tuple[int, float, int, float, float, float]:
        """Changes whenever :meth:`profile` may (a family's pool too): a cache key."""
        return (
            len(self.time_ratios),
            self.time_ratios[-1] if self.time_ratios else 0.0,
            len(self.memory_ratios),
            self.memory_ratios[-1] if self.memory_ratios else 0.0,
            self.widen_time,
            self.widen_memory,
        )

    @property
    def violation_rate(self) -> float:
        return self.violations / self.observed if self.observed else 0.0
