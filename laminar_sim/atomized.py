"""Rigid placement against atomization, on MIG-partitioned hosts (``sim replay --mode``).

The same jobs run twice, once per mode, on equal hosts whose GPUs are cut into a mix of MIG
instances. Hosts are the agent's own: a :class:`~laminar_agent.inventory.fake.FakeGpuBackend`
built from a ``fake_gpus`` spec (the real MIG tables and placement rules) turned into ledger
slices as the agent does, held in a :class:`~laminar_agent.ledger.Ledger` that arbitrates
every probe and commit.

**Jobs.** Arrivals, GPU counts and durations come from the Philly trace (read by
:func:`laminar_sim.replay.read_jobs`). Each job gets, by seed: a priority class
(production, batch or opportunistic), a tenant, the memory profile of one pod of the
Alibaba GenAI 2026 trace, and a spread of its speed. A memory profile is the set of that
pod's peaks over consecutive windows of about an hour (``PEAK_WINDOW_SECONDS``), scaled by
``memory_scale`` (the GenAI pods ran on GPUs of about 48 GB, Philly's on 12-24 GB), so a
job's "peak memory over an hour of running" has a real distribution. Its speed is
lognormal around the Philly duration: ``seconds_per_unit`` has median ``duration / units``
and sigma ``time_sigma``; a unit is ``unit_seconds`` of work at the median.

**What happens at run time.** Every run draws from the job's own seeded stream: one speed
draw per run (a rigid job, or one subjob: the market's model, where ``n`` units take ``n``
times one draw), one peak draw per started hour of running. A peak above the slice's memory
kills the run at that hour; the work since the last checkpoint is lost.

**rigid.** Every job is an entry of the router's own decision core
(:class:`~laminar_zone.core.ZoneCore`), driven by the driver ``sim replay`` shares
(:class:`~laminar_sim.replay.CoreDriver`). A job of ``g`` GPUs is a gang of ``g`` members
asking one MIG profile each (``resources.mig_profile``) with its declared memory
(``gpu_memory_bytes``: the ``1 - epsilon`` quantile of its peaks, the same figure the
atomization contract declares): the smallest profile that holds it and has a slice for
every member. The core routes it on arrival (placed at once, or queued behind a blocked
head of its family), its queue passes are :func:`laminar_zone.trying.pass_steps` (order by
``order_key`` with the tenants' usage as the core counts it, per-family blocked heads, EASY
backfill against the core's expected start) and its tries
:func:`laminar_zone.trying.place_try`: the router's gather over the router's view of the
hosts' summaries, with its probe limits and ranking, each probe arbitrated by the host's
:class:`~laminar_agent.core.AgentCore`. A rigid job has no checkpoint: killed by a peak,
its member is reported to the core as the agent reports it (KILLED, ``RECLAIMED`` for
memory, with the peak); the core stops the gang and retries it (counted, up to the spec's
limit of 100), asking that peak (:func:`laminar_zone.core.widened_for_memory`), and it
waits as restarted (its claim cuts held windows that would fit it). It starts again from
zero.

**atomized.** Jobs of one GPU declare a contract (:func:`laminar_zone.market.contract_from`):
``units = round(duration / unit_seconds)``, the quantiles above, the checkpoint overhead
and epsilon. They are the core's ``atoms``: entries that wait (queued) in its passes while
no piece runs. Gangs (more than one GPU) are atomized too by default, as the router runs
atomized gangs (``AtomizeSpec.market_gangs``; ``--no-market-gangs``: they stay rigid,
placed as above): a gang declares the same contract (its members move in lockstep) and
bids for one window per member of one family, all or nothing
(:func:`laminar_zone.market.clear`); its pieces have a member per won slice, one speed draw
and a peak draw per member per hour; a member killed by its peak ends the piece (its
siblings stop, ``GANG_STOPPED``), and its set of slices is extended or stopped together.

All waiting work is taken in the router's **one class order** at each queue pass (a pass
after every event that changed something, as the router's wakes run one): per priority
class, highest first, that class's rigid jobs (the queue walk, whose blocked heads cut the
windows of that class and the lower ones: EASY backfill) and then one clearing round for
that class. Within a class the waiting atomized jobs are met in the walk in queue order:
each bids, in a part of the class's round on the free slices, before the rigid jobs of its
class behind it are walked whose run time is no shorter than its work left. A round's
windows are the free slices, each offered for the horizon, cut at the expected start of a
blocked rigid job of its family of that class or higher (and a held slice at the claim of
a restarted rigid job of that class or higher); every waiting job of the class bids with
:func:`laminar_zone.market.best_bid` (its profile as its
:class:`~laminar_zone.market.Calibrator` has inflated it) and
:func:`laminar_zone.market.clear` awards them with the clearing policy (tenant usage, for
the fair share, is the GPU-equivalents the tenant ran when the pass opened, as the core
counts it; a bid's waiting time is the time since the job arrived).

Each class's step of a pass's round is the router's own machine
(:class:`laminar_zone.round.ClearingRound`, opened once per pass with the free slices,
the held ones and every bidder; no quota, no spec constraint): this module only carries
out its decisions (start a piece, extend one in place, stop one whose slice another job
won, and at its close stop the pieces no step decided).

A winner starts a **piece** that runs every unit the job has left (one speed draw for the
piece), not only the units the bid said would fit: the bid's units are what it commits to
by its window's end. A checkpoint's length before the window ends, the piece is a
**holder**: its slice is offered, as a held window, in the rounds of that event, to its
holder (which bids to extend in place) and to everyone else. It keeps the slice, with no
checkpoint and no restart, unless a bid of a higher class, or of its class with a score
higher by ``hysteresis``, wins it, or no extension fits before the next commitment on the
slice (a blocked rigid job's expected start). Then it checkpoints the units done and stops
at its window's end, ``PREEMPTED`` as the router stops it: free, what it measured observed.
Without incumbency (``--no-incumbency``) a piece runs its bid's units only, and one still
running at its window's end is stopped ``OVERRAN``, as the router's window enforcement
stops it (a gang's piece once: one member ``OVERRAN``, its siblings ``GANG_STOPPED``,
:func:`~laminar_zone.atoms.gang_member_cause`). What an ended piece means for its job is the router's own
:meth:`~laminar_zone.atoms.AtomState.piece_ended`: violations, one per piece at most, are
a piece killed by a peak above its slice (**memory**: the work since the piece started is
lost, its calibrator widens memory) and a piece that overran its window (**time**: its
calibrator widens time); a piece that finishes observes its speed and peak (``observe``).

**What is not modelled.** A job runs as fast on a small MIG slice as on a large one (the
Philly durations were measured on whole GPUs, and no trace says how each job scales), MIG
layouts are fixed (no repartitioning), and the network and placement delays (milliseconds)
do not show at these time scales.

Reported per mode: GPU utilization (busy MIG compute slices over those partitioned, over
the arrival window), useful work (busy time that was not checkpoint overhead or lost
work), job completion time and queue time (arrival to first start) overall and by class,
fragmentation (the share of free compute slices that no waiting job could use because
its declared memory exceeds them, while a job waited), the safety-violation rate (rigid:
share of jobs killed at least once; atomized: share of subjobs that overran), subjobs per
job, and the window fill ratio (the share of its window a subjob used).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from laminar_agent.core import KILLED, SUCCEEDED, AgentCore, EndDecision
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.inventory.mig import COMPUTE_SLICES
from laminar_agent.ledger import (
    Bounced,
    Granted,
    LeaseRecord,
    Ledger,
    ProbeOrder,
    counter_ids,
    slices_from_gpus,
)
from laminar_airlock.traces import MemoryCurve, load_memory_curves
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_sim.engine import Engine
from laminar_sim.replay import CoreDriver, TraceJob
from laminar_sim.zone_driver import CoreHost
from laminar_zone.atoms import (
    AtomState,
    JobNext,
    PieceEnd,
    Running,
    decide_at,
    gang_member_cause,
    market_work,
    window_end_at,
)
from laminar_zone.entry import Entry
from laminar_zone.market import (
    DEFAULT_HYSTERESIS,
    DEFAULT_POLICY,
    DEFAULT_STARVATION_FLOOR_SECONDS,
    DEFAULT_STARVATION_RATIO,
    Award,
    Bid,
    Bidder,
    ClearingContext,
    Contract,
    OpenSlice,
    RatioPool,
    contract_from,
    default_min_samples,
    slice_family,
)
from laminar_zone.placement import ShapeCap
from laminar_zone.queue import Bidding
from laminar_zone.round import ClearingRound, Extend, Start
from laminar_zone.trying import ClearMarket, CloseRound, OpenRound

ProgressFn = Callable[[str, int, int], None]
MODES = ("rigid", "atomized")
#: One 8-GPU H100 host: two GPUs in halves, two 4+2+1, two 2+2+2+1, one in sevenths, one whole.
DEFAULT_MIG_LAYOUT = (
    "2xH100-80GB:mig=3g.40gb+3g.40gb,"
    "2xH100-80GB:mig=4g.40gb+2g.20gb+1g.10gb,"
    "2xH100-80GB:mig=2g.20gb+2g.20gb+2g.20gb+1g.10gb,"
    "1xH100-80GB:mig=1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb,"
    "1xH100-80GB:mig=7g.80gb"
)
#: (class, priority as in laminar.v1.PriorityClass, share of jobs).
CLASSES = (("production", 2, 0.2), ("batch", 3, 0.5), ("opportunistic", 4, 0.3))
TENANTS = 6
#: A memory profile's peaks are taken over windows of this length (about an hour).
PEAK_WINDOW_SECONDS = 3600.0
#: Lognormal sigma of a job's speed is drawn uniformly from this range.
TIME_SIGMA_RANGE = (0.05, 0.25)
#: Quantile levels declared in a contract.
QUANTILE_LEVELS = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
LEASE_TTL_SECONDS = 60.0
#: A rigid job's ``max_retries``: the most a spec may ask (``laminar_zone.spec.MAX_RETRIES``,
#: which this module does not import: it pulls in gRPC). Each memory kill is one retry.
RIGID_MAX_RETRIES = 100


def piece_demand(resources: common_pb2.Resources) -> Demand:
    """What a piece's placement holds (its slice's profile and memory): the tenant's usage
    as the core counts it."""
    return Demand(mig_profile=resources.mig_profile, gpu_memory_bytes=resources.gpu_memory_bytes)


@dataclass(frozen=True)
class AtomizeSpec:
    """Everything a run of both modes depends on besides the jobs and the profiles."""

    hosts: int = 4
    mig_layout: str = DEFAULT_MIG_LAYOUT
    seed: int = 1
    epsilon: float = 0.05
    checkpoint_overhead_seconds: float = 30.0
    horizon_seconds: float = 3600.0
    unit_seconds: float = 60.0
    memory_scale: float = 0.5
    #: Clearing policy of laminar_zone.market (``srpt`` is the router's default).
    clearing_policy: str = DEFAULT_POLICY
    #: ``Calibrator(min_samples=...)``: observations before it may shrink a profile;
    #: None = the market's default, ceil(1 / epsilon) - 1.
    calibrator_min_samples: int | None = None
    modes: tuple[str, ...] = MODES
    #: A piece whose window ends keeps its slice (no checkpoint, no restart) unless a bid of
    #: a higher class, or of its class by more than ``hysteresis``, wants it. False: every
    #: piece checkpoints and stops at its window's end (the market before issue 17).
    incumbency: bool = True
    #: ``ClearingContext.hysteresis``.
    hysteresis: float = DEFAULT_HYSTERESIS
    #: ``ClearingContext.starvation_ratio`` and ``starvation_floor_seconds``: ``srpt``'s
    #: starvation guard (ratio 0: pure SRPT).
    starvation_ratio: float = DEFAULT_STARVATION_RATIO
    starvation_floor_seconds: float = DEFAULT_STARVATION_FLOOR_SECONDS
    #: Calibration pooled per job family (``RatioPool``): here the jobs of one tenant with
    #: one memory profile (the same workload). False: each job learns alone.
    pool_calibration: bool = True
    #: In the atomized mode gangs bid in the market too (the default; ``--no-market-gangs``
    #: for the before): a gang of ``g`` GPUs bids for ``g`` windows of one MIG profile at
    #: once, all or nothing (:func:`laminar_zone.market.clear`), and runs pieces of ``g``
    #: members, as the router runs atomized gangs (laminar_zone.atomizer). False: gangs
    #: stay rigid, placed as in the rigid mode.
    market_gangs: bool = True


@dataclass(frozen=True)
class MemoryProfile:
    """One GenAI pod's peaks per window of about an hour (scaled), sorted."""

    pod: str
    peaks_bytes: tuple[int, ...]

    def quantile(self, q: float) -> int:
        """Nearest-rank q-quantile of the peaks."""
        ordered = self.peaks_bytes
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class SimJob:
    index: int
    arrival: float
    duration: float
    gpus: int
    klass: str
    priority: int
    tenant: str
    memory: MemoryProfile
    time_sigma: float


def profiles_from_curves(
    curves: Sequence[MemoryCurve], memory_scale: float, max_bytes: int
) -> list[MemoryProfile]:
    """Peaks per window of each curve (windows with no sample skipped), scaled; curves with
    fewer than 5 windows or a peak above ``max_bytes`` (no slice could hold it) are left out."""
    out: list[MemoryProfile] = []
    for curve in curves:
        per_window = max(1, round(PEAK_WINDOW_SECONDS / curve.step_seconds))
        peaks: list[int] = []
        for start in range(0, len(curve.used_bytes), per_window):
            values = [v for v in curve.used_bytes[start : start + per_window] if v]
            if values:
                peaks.append(int(max(values) * memory_scale))
        if len(peaks) >= 5 and max(peaks) <= max_bytes:
            out.append(MemoryProfile(curve.pod, tuple(sorted(peaks))))
    return out


def load_profiles(genai_trace: Path, memory_scale: float, max_bytes: int) -> list[MemoryProfile]:
    """Memory profiles from the GenAI trace's per-pod GPU-memory curves."""
    return profiles_from_curves(load_memory_curves(genai_trace), memory_scale, max_bytes)


def make_jobs(
    trace_jobs: Sequence[TraceJob], profiles: Sequence[MemoryProfile], seed: int
) -> list[SimJob]:
    """Class, tenant, memory profile and speed spread of each job: a pure function of the seed."""
    if not profiles:
        raise ValueError("no memory profile to draw from")
    rng = random.Random(f"jobs/{seed}")
    weights = [share for _, _, share in CLASSES]
    jobs = []
    for job in trace_jobs:
        klass, priority, _ = rng.choices(CLASSES, weights)[0]
        jobs.append(
            SimJob(
                index=job.index,
                arrival=job.arrival,
                duration=job.duration,
                gpus=job.gpus,
                klass=klass,
                priority=priority,
                tenant=f"t{rng.randrange(TENANTS)}",
                memory=profiles[rng.randrange(len(profiles))],
                time_sigma=rng.uniform(*TIME_SIGMA_RANGE),
            )
        )
    return jobs


def _normal_z(q: float) -> float:
    return statistics.NormalDist().inv_cdf(min(max(q, 1e-6), 1 - 1e-6))


def contract_for(job: SimJob, spec: AtomizeSpec) -> Contract:
    """The job's declared contract: speed quantiles (lognormal) and peak quantiles (trace)."""
    units = max(1, round(job.duration / spec.unit_seconds))
    median = job.duration / units
    time_levels = (0.001, 0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999)
    return contract_from(
        total_units=units,
        seconds_per_unit=[
            (q, median * math.exp(job.time_sigma * _normal_z(q))) for q in time_levels
        ],
        peak_memory_bytes=[(q, float(job.memory.quantile(q))) for q in QUANTILE_LEVELS],
        checkpoint_overhead_seconds=spec.checkpoint_overhead_seconds,
        epsilon=spec.epsilon,
    )


class MigHost:
    """One agent: its MIG slices from the fake backend, in the agent's decision core
    (:class:`~laminar_agent.core.AgentCore` over its real ledger): probes are arbitrated,
    leases released, committed and ended as the agent does."""

    def __init__(self, agent_id: str, ledger: Ledger) -> None:
        self.agent_id = agent_id
        self.core = AgentCore(ledger)

    @property
    def ledger(self) -> Ledger:
        return self.core.ledger

    def shapes(self) -> dict[str, ShapeCap]:
        """The summary the agent would send (``AgentSummary.shapes``): the router's view."""
        return {
            s.shape: ShapeCap(s.free, s.total, s.max_free_milli, s.max_free_memory_bytes)
            for s in self.ledger.shapes()
        }

    def arbitrate(self, orders: list[ProbeOrder], now: float) -> list[Granted | Bounced]:
        return self.core.arbitrate(orders, now, now)[0]

    def release(self, lease_id: str) -> None:
        """Give back an uncommitted lease (the router's Release)."""
        self.core.release([lease_id], "")

    def commit(self, lease_id: str, subjob_id: str, now: float) -> LeaseRecord:
        """Commit the lease to a new subjob; the committed lease."""
        self.core.commit(
            lease_id,
            subjob_id,
            subjob_id.split("/", 1)[0],
            caller="",
            priority=0,
            lifecycle=common_pb2.LONG,
            now=now,
            now_unix=now,
        )
        lease = self.ledger.lease(lease_id)
        assert lease is not None
        return lease

    def end(self, subjob_id: str, now: float) -> None:
        """The piece ``subjob_id`` ended; its capacity returns as the agent returns it."""
        self.core.end(subjob_id, EndDecision(SUCCEEDED, EndCause.EXITED, "ended"), now)


def build_hosts(spec: AtomizeSpec) -> list[MigHost]:
    """``spec.hosts`` equal hosts with the MIG layout; InvalidArgument if the layout is not
    legal on the model (the MIG tables' placement rules), or has a GPU without MIG."""
    hosts = []
    for i in range(spec.hosts):
        agent_id = f"h{i}"
        backend = FakeGpuBackend(spec.mig_layout, agent_id=agent_id)
        for gpu in backend.gpus():
            if not gpu.mig_enabled:
                raise ValueError(f"GPU {gpu.index} of {spec.mig_layout!r} has no MIG layout")
        slices = slices_from_gpus(backend.gpus())
        hosts.append(
            MigHost(agent_id, Ledger(slices, lease_prefix=f"{agent_id}-", lease_ids=counter_ids()))
        )
    return hosts


def compute_of(profile: str) -> int:
    """Compute slices of a MIG profile (``3g.40gb`` -> 3)."""
    return int(profile.split("g.", 1)[0])


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    return {
        "mean": round(statistics.fmean(values), 1),
        "p50": round(_pct(sorted(values), 0.5), 1),
        "p99": round(_pct(sorted(values), 0.99), 1),
    }


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _percentiles(values: list[float]) -> list[float]:
    if not values:
        return []
    ordered = sorted(values)
    return [round(_pct(ordered, q / 100), 1) for q in range(1, 101)]


@dataclass
class _JobState:
    job: SimJob
    need_bytes: int
    #: An atomized job's life cycle (the router's :class:`~laminar_zone.atoms.AtomState`).
    atom: AtomState | None = None
    first_start: float | None = None
    end: float | None = None
    runs: int = 0
    violations: int = 0
    #: Units completed, as (start, count), in completion order.
    done: list[tuple[int, int]] = field(default_factory=list)
    #: Its running piece (atomized), if any.
    piece: _Piece | None = None
    #: Its entry in the router's core.
    entry: Entry | None = None

    @property
    def contract(self) -> Contract | None:
        """An atomized job's contract (None: a rigid job)."""
        return self.atom.contract if self.atom is not None else None


@dataclass(eq=False)
class _Member:
    """One member of a piece: its process on one slice (a single-GPU job's piece has one)."""

    host: MigHost
    subjob_id: str
    #: The member as the router's core records it on its job.
    placement: zone_pb2.Placement
    window_key: tuple[str, str]
    profile: str
    memory: int
    #: Its highest peak drawn so far (the one that killed it, if it was killed).
    peak: int = 0


@dataclass(eq=False)
class _Piece:
    """A running atomized piece: the job's process on one slice (a gang's: one per member,
    in lockstep), for all the units it has left, extended in place for as long as it keeps
    its slices."""

    state: _JobState
    members: list[_Member]
    started: float
    unit_start: int
    per_unit: float
    #: Units the piece runs (with incumbency, every unit its job had left).
    left: int
    window_end: float
    granted_seconds: float
    key: str
    killed_at: float | None
    finish_at: float
    generation: int = 0
    stopping_at: float | None = None
    #: The member a memory peak kills at ``killed_at`` (its siblings stop with it).
    killed_member: int = 0

    @property
    def window_key(self) -> tuple[str, str]:
        """Its first member's slice: what names it in a round (:attr:`Bidder.holds`)."""
        return self.members[0].window_key

    def progress(self, now: float) -> int:
        """The next unit at ``now``: units are done one after another at ``per_unit``."""
        done = int((now - self.started) / self.per_unit) if self.per_unit > 0 else self.left
        return self.unit_start + min(self.left, max(0, done))

    def release_at(self) -> float:
        """When the slice is expected back: the end of the work or of the window."""
        return min(self.finish_at, self.window_end)


@dataclass
class _Totals:
    busy: float = 0.0  # compute-slice seconds held, over the arrival window
    free: float = 0.0  # compute-slice seconds free, over the arrival window
    frag: float = 0.0  # of which no waiting job could use
    useful: float = 0.0  # compute-slice seconds of work kept (whole run)
    held: float = 0.0  # compute-slice seconds held (whole run)
    overhead: float = 0.0
    lost: float = 0.0
    subjobs: int = 0
    subjob_violations: int = 0
    #: Violations by cause: "memory" (killed: peak above the slice), "time" (cut at the window).
    causes: dict[str, int] = field(default_factory=lambda: {"memory": 0, "time": 0})
    #: Rigid jobs killed at least once (by memory), in either mode: in the atomized mode
    #: these are the gangs, outside the subjob violations.
    rigid_killed: int = 0
    #: Rigid jobs the core failed: killed once more than their retries allow.
    rigid_failed: int = 0
    fills: list[float] = field(default_factory=list)
    rounds: int = 0
    bids: int = 0
    #: Windows a piece kept its slice past (incumbency) and pieces that gave it up to a
    #: better bid.
    extensions: int = 0
    displaced: int = 0


class _MigRound:
    """The pass's clearing round as :func:`laminar_zone.trying.pass_steps` asks for it (what
    the router's ``MarketRound`` is to its pass): the market's work for the class order and
    the slices a rigid start of the pass took."""

    def __init__(self, machine: ClearingRound, classes: list[int | Bidding]) -> None:
        self.machine = machine
        self.classes = classes

    def note_started(self, placements: Iterable[zone_pb2.Placement]) -> None:
        """A rigid job of this pass started on these placements: their slices are taken
        (as ``MarketRound.note_started`` takes them)."""
        for p in placements:
            self.machine.take((p.agent_id, s) for s in p.slice_ids)


class MigReplay:
    """One mode over the jobs: events, hosts, the pieces of atomized jobs and their market.

    Every job is an entry of the router's :class:`~laminar_zone.core.ZoneCore`, driven by
    :class:`~laminar_sim.replay.CoreDriver`: its queue passes
    (:func:`~laminar_zone.trying.pass_steps`) order rigid and atomized work in one class
    order, its placement tries (:func:`~laminar_zone.trying.place_try`) place the rigid
    jobs over the MIG hosts, and a rigid member's end goes back as the agent's report
    (retries and end causes are the core's). The atomized jobs are the core's ``atoms``:
    the pass meets them in its queue order and asks this replay's clearing round
    (:class:`~laminar_zone.round.ClearingRound`) for them; their pieces live here."""

    def __init__(self, spec: AtomizeSpec, jobs: Sequence[SimJob], mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        self.spec = spec
        self.mode = mode
        self.engine = Engine(spec.seed)
        self.hosts = build_hosts(spec)
        self.by_id = {h.agent_id: h for h in self.hosts}
        first = self.hosts[0].ledger.slices.values()
        #: Profiles by memory, smallest first.
        self.profiles = sorted(
            {(s.memory_total_bytes, s.mig_profile) for s in first}, key=lambda p: (p[0], p[1])
        )
        self.memory_of = {p: m for m, p in self.profiles}
        #: Slices of each profile over all hosts (what a gang may ask at most).
        self.profile_slices: dict[str, int] = {}
        for host in self.hosts:
            for s in host.ledger.slices.values():
                self.profile_slices[s.mig_profile] = self.profile_slices.get(s.mig_profile, 0) + 1
        self.largest_bytes = self.profiles[-1][0]
        self.capacity = sum(
            compute_of(s.mig_profile) for h in self.hosts for s in h.ledger.slices.values()
        )
        #: Every slice: (agent, slice id) -> (profile, memory).
        self.slice_of: dict[tuple[str, str], tuple[str, int]] = {
            (h.agent_id, s.slice_id): (s.mig_profile, s.memory_total_bytes)
            for h in self.hosts
            for s in h.ledger.slices.values()
        }
        #: Free slices: (agent, slice id) -> (profile, memory).
        self.free = dict(self.slice_of)
        self.free_compute = self.capacity
        self.pools: dict[tuple[str, str], RatioPool] = {}
        self.states = [self._state(job) for job in jobs]
        self.by_job = {self.job_id(s): s for s in self.states}
        #: The atomized jobs: the router's core leaves them to the market (this replay).
        self.atoms: set[str] = set()
        self.driver = CoreDriver(
            self.engine, self.hosts, self, spec.seed, atoms=self.atoms, demand_of=piece_demand
        )
        self.core = self.driver.core
        #: Rigid jobs the last pass left waiting.
        self.rigid_queue: list[_JobState] = []
        self.waiting: list[_JobState] = []  # atomized jobs without a running subjob
        #: Pieces whose window ends now: they extend in place or stop, in this event's rounds.
        self.deciding: list[_Piece] = []
        self.totals = _Totals()
        self.last = 0.0
        self.frag_now = 0
        self.window_end = jobs[-1].arrival if jobs else 0.0
        self.next_key = 0
        self.slices_seen: dict[tuple[tuple[str, str], str, int, str], OpenSlice] = {}
        #: The waiting atomized jobs of this pass by job id (class_order's biddings).
        self.bidding: dict[str, _JobState] = {}
        #: This pass's clearing round (the router's machine) and, for what it decides, the
        #: waiting jobs by bidder id and the pieces whose window ends by held slice.
        self.round: ClearingRound | None = None
        self.bidders: dict[str, _JobState] = {}
        self.held: dict[tuple[str, str], _Piece] = {}

    # ----------------------------------------------------------------- set-up

    def _state(self, job: SimJob) -> _JobState:
        q = 1.0 - self.spec.epsilon
        need = job.memory.quantile(q)
        state = _JobState(job, need_bytes=need)
        if self.mode == "atomized" and (job.gpus == 1 or self.spec.market_gangs):
            pool = None
            if self.spec.pool_calibration:  # a family: the tenant's jobs of one workload
                pool = self.pools.setdefault((job.tenant, job.memory.pod), RatioPool())
            state.atom = AtomState.of(
                contract_for(job, self.spec),
                pool_of=lambda _: pool,
                min_samples=self.spec.calibrator_min_samples,
                members=job.gpus,
            )
        return state

    @staticmethod
    def job_id(state: _JobState) -> str:
        """The job's id in the router's core."""
        return f"j{state.job.index}"

    def rng(self, state: _JobState) -> random.Random:
        """The job's stream for its run number ``state.runs``: the same in both modes."""
        return random.Random(f"{self.spec.seed}/{state.job.index}/{state.runs}")

    # ------------------------------------------------------------------ clocks

    def clock(self) -> None:
        """Integrate busy, free and fragmented compute over the arrival window."""
        now = self.engine.now
        span = max(0.0, min(now, self.window_end) - min(self.last, self.window_end))
        self.totals.busy += span * (self.capacity - self.free_compute)
        self.totals.free += span * self.free_compute
        self.totals.frag += span * self.frag_now
        self.last = now

    def measure_fragmentation(self) -> None:
        """Free compute on slices smaller than every waiting job's declared memory."""
        needs = [s.need_bytes for s in self.rigid_queue] + [
            self._atom_need(s) for s in self.waiting
        ]
        if not needs:
            self.frag_now = 0
            return
        smallest = min(needs)
        self.frag_now = sum(compute_of(p) for p, mem in self.free.values() if mem < smallest)

    def _atom_need(self, state: _JobState) -> int:
        assert state.atom is not None
        return state.atom.need_bytes(self.largest_bytes)

    # ------------------------------------------------------------------ events

    def arrive(self, state: _JobState) -> None:
        """A Submit to the router's core: a rigid job asks its MIG profile per member (the
        smallest that holds its declared memory and has a slice for every member); an
        atomized one asks nothing (it waits for a window)."""
        self.clock()
        job = state.job
        job_id = self.job_id(state)
        if state.contract is not None:
            self.atoms.add(job_id)
            self.waiting.append(state)
            spec = zone_pb2.JobSpec(
                command=["piece"],
                tenant=job.tenant,
                priority=common_pb2.PriorityClass.Name(job.priority),
                expected_seconds=job.duration,
            )
            need = Demand()
        else:
            family = self.family(state)
            need = Demand(mig_profile=family, gpu_memory_bytes=state.need_bytes)
            spec = zone_pb2.JobSpec(
                command=["trace"],
                tenant=job.tenant,
                resources=common_pb2.Resources(
                    mig_profile=family, gpu_memory_bytes=state.need_bytes
                ),
                gang_size=job.gpus,
                priority=common_pb2.PriorityClass.Name(job.priority),
                expected_seconds=job.duration,
                max_retries=RIGID_MAX_RETRIES,
            )
        state.entry = self.driver.submit(spec, need, job_id)

    # ------------------------------------------------------- the core's owner: rigid jobs

    def family(self, state: _JobState) -> str:
        """The MIG profile a rigid job asks: the smallest that holds its declared memory
        and has a slice for each of its members (the largest if none does)."""
        for memory, profile in self.profiles:
            if memory >= state.need_bytes and self.profile_slices[profile] >= state.job.gpus:
                return profile
        return self.profiles[-1][1]

    def subjob_started(self, host: CoreHost, subjob_id: str, slice_ids: tuple[str, ...]) -> None:
        for slice_id in slice_ids:
            self.take(host.agent_id, slice_id)

    def subjob_ended(self, host: CoreHost, placement: zone_pb2.Placement) -> None:
        for slice_id in placement.slice_ids:
            self.give_back(host.agent_id, slice_id)

    def job_placed(self, entry: Entry) -> None:
        """The core placed a rigid job: its members run for one speed draw of the job; a
        peak above the smallest of their slices kills the run at that hour."""
        now = self.engine.now
        state = self.by_job[entry.job.job_id]
        if state.first_start is None:
            state.first_start = now
        rng = self.rng(state)
        state.runs += 1
        run = state.job.duration * math.exp(state.job.time_sigma * rng.gauss(0.0, 1.0))
        members = entry.current()
        slices = [self.slice_of[(p.agent_id, p.slice_ids[0])] for p in members]
        smallest = min(memory for _, memory in slices)
        compute = sum(compute_of(profile) for profile, _ in slices)
        killed_at: float | None = None
        peak = 0
        for hour in range(max(1, math.ceil(run / PEAK_WINDOW_SECONDS))):
            peak = max(
                state.job.memory.peaks_bytes[rng.randrange(len(state.job.memory.peaks_bytes))]
                for _ in range(len(slices))
            )
            if peak > smallest:
                killed_at = min(
                    run, hour * PEAK_WINDOW_SECONDS + rng.random() * PEAK_WINDOW_SECONDS
                )
                break
        length = run if killed_at is None else killed_at
        ids = [p.subjob_id for p in members]
        self.engine.schedule(
            length,
            partial(
                self.rigid_run_ends,
                entry,
                ids,
                length * compute,
                peak if killed_at is not None else 0,
                smallest,
            ),
        )

    def rigid_run_ends(
        self, entry: Entry, subjob_ids: list[str], held: float, peak: int, slice_bytes: int
    ) -> None:
        """The run ends: every member exits 0, or (``peak`` above ``slice_bytes``) one is
        killed by its memory peak: the agent reports it reclaimed for memory with the peak
        it saw, and the core stops the gang and retries it asking that much memory
        (:func:`laminar_zone.core.widened_for_memory`)."""
        self.clock()
        state = self.by_job[entry.job.job_id]
        self.totals.held += held
        if not peak:
            self.totals.useful += held
            for subjob_id in subjob_ids:
                decision = EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0")
                self.driver.end_subjob(entry, subjob_id, decision, 0)
            return
        self.totals.lost += held
        # Rigid violations are counted per job: its first kill names the cause.
        self.totals.rigid_killed += int(state.violations == 0)
        state.violations += 1
        why = f"GPU memory peak {peak} B above the slice's {slice_bytes} B"
        decision = EndDecision(KILLED, EndCause.RECLAIMED, why)
        self.driver.end_subjob(entry, subjob_ids[0], decision, -9, peak_gpu_memory_bytes=peak)
        state.need_bytes = entry.need.gpu_memory_bytes  # what it declares now

    def job_ended(self, entry: Entry) -> None:
        """The core ended a rigid job: it succeeded, or failed with no retry left."""
        state = self.by_job[entry.job.job_id]
        if entry.job.state == zone_pb2.JOB_SUCCEEDED:
            state.done.append((0, 1))
            self.finish(state)
        else:
            self.totals.rigid_failed += 1

    def pass_done(self, kept: list[Entry]) -> None:
        self.rigid_queue = [self.by_job[e.job.job_id] for e in kept]
        self.measure_fragmentation()

    def take(self, agent_id: str, slice_id: str) -> tuple[str, int]:
        profile, memory = self.free.pop((agent_id, slice_id))
        self.free_compute -= compute_of(profile)
        return profile, memory

    def give_back(self, agent_id: str, slice_id: str) -> None:
        profile, memory = self.slice_of[(agent_id, slice_id)]
        self.free[(agent_id, slice_id)] = (profile, memory)
        self.free_compute += compute_of(profile)

    def finish(self, state: _JobState) -> None:
        state.end = self.engine.now

    def new_key(self) -> str:
        self.next_key += 1
        return f"r{self.next_key}"

    # ----------------------------------------------------------------- market

    def open_slice(
        self, key: tuple[str, str], profile: str, memory: int, holder: str = ""
    ) -> OpenSlice:
        """A free or held slice as the router describes it to ``class_windows`` (cached:
        a slice's figures never change, only who holds it)."""
        cache_key = (key, profile, memory, holder)
        found = self.slices_seen.get(cache_key)
        if found is None:
            milli = compute_of(profile) * 1000 // COMPUTE_SLICES
            found = OpenSlice(*key, memory, milli, slice_family(profile), held_by=holder)
            if not holder:
                self.slices_seen[cache_key] = found
        return found

    @staticmethod
    def bidder_id(state: _JobState) -> str:
        """The job's id in the market (what ties in a round break on)."""
        return f"j{state.job.index:07d}"

    def open_round(self, step: OpenRound) -> _MigRound | None:
        """The pass's market (``OpenRound``): None when no atomized work waits. Without
        incumbency, the pieces whose window ends stop first."""
        if not self.spec.incumbency:
            for piece in list(self.deciding):
                self.stop(piece, EndCause.OVERRAN)
        self.round = None
        if self.mode != "atomized" or not (self.waiting or self.deciding):
            return None
        # The waiting atomized jobs take their place in the queue order among the rigid
        # ones: each bids ahead of the rigid jobs of its class behind it.
        self.bidding = {self.job_id(s): s for s in self.waiting}
        self.round = self.open_clearing(step.units)
        bidders = self.round.bidders
        waiting = {b.job_id: b for b in bidders if b.holds is None}
        market = market_work(
            (
                (job_id, s.job.priority, waiting[self.bidder_id(s)])
                for job_id, s in self.bidding.items()
            ),
            bidders,
        )
        return _MigRound(self.round, market)

    def open_clearing(self, usage: dict[str, float]) -> ClearingRound:
        """The pass's clearing round, the router's machine: the free slices and the held
        ones (pieces whose window ends now), every waiting job's bidder and every holder's,
        the tenants' usage as the pass opened (the core's count); no quota, no spec
        constraint (every job may use any slice)."""
        now = self.engine.now
        self.held = {m.window_key: p for p in self.deciding for m in p.members}
        self.bidders = {self.bidder_id(s): s for s in self.waiting}
        slices = [self.open_slice(key, *free) for key, free in sorted(self.free.items())]
        slices.extend(
            self.open_slice(m.window_key, m.profile, m.memory, self.bidder_id(p.state))
            for p in self.deciding
            for m in p.members
        )
        bidders = [self._bidder(s) for s in self.waiting]
        # An incumbent bids from where the router can tell its piece surely is (it has no
        # checkpoint of a running piece), not from the piece's true progress.
        bidders.extend(
            self._bidder(p.state, p.window_key, Running(p.unit_start, p.left, now - p.started))
            for p in self.deciding
        )
        ctx = ClearingContext(
            usage=dict(usage),
            hysteresis=self.spec.hysteresis,
            starvation_ratio=self.spec.starvation_ratio,
            starvation_floor_seconds=self.spec.starvation_floor_seconds,
        )
        return ClearingRound(
            now, slices, bidders, self.spec.clearing_policy, ctx, self.spec.horizon_seconds
        )

    def clear_market(self, step: ClearMarket) -> None:
        """One class's step of the pass's round (:meth:`ClearingRound.clear`), as the pass
        asks for it; its decisions carried out here: a start on a free window, an extension
        in place, a stop of a piece whose slice another job won."""
        assert self.round is not None
        clear = step.step
        if clear.jobs is not None:  # a part of the round: queue ids to the market's
            states = (self.bidding.get(job_id) for job_id in clear.jobs)
            clear = replace(
                clear, jobs=frozenset(self.bidder_id(s) for s in states if s is not None)
            )
        cleared = self.round.clear(clear)
        if not cleared.is_cleared:
            return
        self.totals.rounds += 1
        self.totals.bids += len(cleared.bids)
        for decision in cleared.decisions:
            if isinstance(decision, Start):
                state = self.bidders[decision.award.bid.job_id]
                self.waiting.remove(state)
                self.start_piece(state, decision.award)
            elif isinstance(decision, Extend):
                self.extend(self.held[decision.key], decision.award.bid)
            else:  # taken by a better bid: the piece checkpoints and stops
                piece = self.held[decision.key]
                self.totals.displaced += int(piece.stopping_at is None)
                self.stop(piece)

    def close_round(self, step: CloseRound) -> None:
        """The pass's last class is done: the pieces no step decided stop."""
        assert self.round is not None
        for stop in self.round.close().stops:
            self.stop(self.held[stop.key])
        self.round = None

    def _bidder(
        self,
        state: _JobState,
        holds: tuple[str, str] | None = None,
        running: Running | None = None,
    ) -> Bidder:
        """The job as the router bids for it (:meth:`~laminar_zone.atoms.AtomState.bidder`)."""
        assert state.atom is not None
        bidder, _ = state.atom.bidder(
            self.bidder_id(state),
            state.job.tenant,
            state.job.priority,
            self.engine.now - state.job.arrival,
            self.largest_bytes,
            holds=holds,
            running=running,
        )
        return bidder

    def start_piece(self, state: _JobState, award: Award) -> None:
        """The winner's process on each won window's slice (a gang's: one member per window,
        one speed draw for all), for all the units it has left: it runs until they are done,
        a member is killed by a peak (its siblings stop with it), or its window ends and it
        does not keep its slices (then it checkpoints and stops)."""
        now = self.engine.now
        bid = award.bid
        window = bid.window
        members: list[_Member] = []
        for i, won in enumerate(award.windows):
            host = self.by_id[won.agent_id]
            profile, memory = self.free[won.key]
            tag = "" if len(award.windows) == 1 else f"m{i}"
            order = ProbeOrder(
                f"{state.job.index}/{state.runs}{tag}",
                f"j{state.job.index}",
                0,
                Demand(mig_profile=profile),
                state.job.priority,
                0.0,
                0,
                LEASE_TTL_SECONDS,
                slice_id=won.slice_id,
            )
            reply = host.arbitrate([order], now)[0]
            assert isinstance(reply, Granted), reply
            subjob_id = f"j{state.job.index}/s{state.runs}{tag}"
            host.commit(reply.lease.lease_id, subjob_id, now)
            self.take(host.agent_id, won.slice_id)
            self.driver.note(host)
            # The member as the router records it on its job: what the tenant's usage counts.
            entry = state.entry
            assert entry is not None
            entry.job.placements.append(
                zone_pb2.Placement(
                    subjob_id=subjob_id,
                    agent_id=host.agent_id,
                    slice_ids=[won.slice_id],
                    state=common_pb2.RUNNING,
                    resources=common_pb2.Resources(mig_profile=profile, gpu_memory_bytes=memory),
                    window_end_unix=window_end_at(now, window.length_seconds),
                )
            )
            placement = entry.job.placements[-1]  # the job's own copy
            members.append(_Member(host, subjob_id, placement, won.key, profile, memory))
        entry = state.entry
        assert entry is not None
        entry.job.state = zone_pb2.JOB_RUNNING
        if state.first_start is None:
            state.first_start = now
        rng = self.rng(state)
        state.runs += 1
        atom = state.atom
        assert atom is not None
        contract = atom.contract
        median = state.job.duration / contract.total_units
        per_unit = median * math.exp(state.job.time_sigma * rng.gauss(0.0, 1.0))
        # The piece the router starts for the bid: with incumbency, every unit its job has
        # left; its bid's units are what it commits to by its window's end.
        plan = atom.piece(bid, window.length_seconds, runs_on=self.spec.incumbency)
        start, left = plan.unit_start, plan.unit_count
        run = left * per_unit + contract.checkpoint_overhead_seconds
        peaks = state.job.memory.peaks_bytes
        killed_at: float | None = None
        killed_member = 0
        for hour in range(max(1, math.ceil(run / PEAK_WINDOW_SECONDS))):
            # A peak drawn per member per hour (for one member: the single piece's draws).
            for i, member in enumerate(members):
                member.peak = max(member.peak, peaks[rng.randrange(len(peaks))])
                if member.peak > member.memory:
                    begin = hour * PEAK_WINDOW_SECONDS
                    killed_at = (
                        now + begin + rng.random() * (min(run, begin + PEAK_WINDOW_SECONDS) - begin)
                    )
                    killed_member = i
                    break
            if killed_at is not None:
                break
        piece = _Piece(
            state=state,
            members=members,
            started=now,
            unit_start=start,
            per_unit=per_unit,
            left=left,
            window_end=now + window.length_seconds,
            granted_seconds=window.length_seconds,
            key=self.new_key(),
            killed_at=killed_at,
            finish_at=now + run,
            killed_member=killed_member,
        )
        state.piece = piece
        self.totals.subjobs += len(members)
        self.arm(piece)

    def arm(self, piece: _Piece) -> None:
        """Schedule the piece's next event: its end, its kill, or the decision at its
        window's end (a checkpoint's length before it) whether it keeps its slice."""
        piece.generation += 1
        generation = piece.generation
        decide = decide_at(piece.window_end, self.spec.checkpoint_overhead_seconds)
        at, what = piece.finish_at, "finish"
        if piece.finish_at > piece.window_end and decide < at:
            at, what = decide, "decide"
        if piece.killed_at is not None and piece.killed_at < at:
            at, what = piece.killed_at, "kill"

        def fire() -> None:
            if piece.generation != generation:
                return
            self.clock()
            if what == "decide":
                self.deciding.append(piece)
                self.driver.wake()
            else:
                self.end_piece(piece, EndCause.EXITED if what == "finish" else EndCause.RECLAIMED)

        self.engine.schedule_at(max(at, self.engine.now), fire)

    def extend(self, piece: _Piece, bid: Bid) -> None:
        """The piece keeps its slices for the held window's length: no checkpoint, no restart."""
        now = self.engine.now
        self.deciding.remove(piece)
        piece.window_end = now + bid.window.length_seconds
        # As the router records an extension on the piece's placements (its window's end
        # is when the core expects the slice back for a blocked head).
        for member in piece.members:
            member.placement.window_end_unix = window_end_at(now, bid.window.length_seconds)
        piece.granted_seconds += bid.window.length_seconds
        self.totals.extensions += 1
        self.arm(piece)

    def stop(self, piece: _Piece, cause: EndCause = EndCause.PREEMPTED) -> None:
        """The piece's window ends and it does not keep the slice: it checkpoints the units
        done by now and stops a checkpoint's length later, at its window's end. ``cause``:
        the round gave its slice to other work or no extension fit (``PREEMPTED``, the
        router's stop), or, without incumbency, it ran into its window's end (``OVERRAN``,
        the router's window enforcement). A gang's piece stops once, whichever of its
        slices was decided first."""
        if piece in self.deciding:
            self.deciding.remove(piece)
        if piece.stopping_at is not None:
            return
        piece.stopping_at = self.engine.now
        piece.generation += 1
        generation = piece.generation

        def fire() -> None:
            if piece.generation == generation:
                self.clock()
                self.end_piece(piece, cause)

        self.engine.schedule(self.spec.checkpoint_overhead_seconds, fire)

    def end_piece(self, piece: _Piece, cause: EndCause) -> None:
        """``EXITED``: every unit done; ``RECLAIMED``: a member killed by a peak (work since
        the piece started is lost; its siblings are stopped, ``GANG_STOPPED``); else
        stopped, checkpointed at its window's end. What each member's end means for the job
        (units done, calibration, violation, its next state) is its
        :meth:`~laminar_zone.atoms.AtomState.piece_ended`'s, as for the router's pieces."""
        now = self.engine.now
        state = piece.state
        atom = state.atom
        assert atom is not None
        overhead = atom.contract.checkpoint_overhead_seconds
        state.piece = None
        killed = cause is not EndCause.EXITED
        for member in piece.members:
            member.host.end(member.subjob_id, now)
            self.give_back(*member.window_key)
            self.driver.note(member.host)
            member.placement.state = common_pb2.KILLED if killed else common_pb2.SUCCEEDED
        entry = state.entry
        assert entry is not None
        compute = sum(compute_of(m.profile) for m in piece.members)
        length = now - piece.started
        self.totals.held += length * compute
        self.totals.fills.append(min(1.0, length / piece.granted_seconds))
        t = self.totals
        done = 0
        if cause is EndCause.RECLAIMED:
            t.lost += length * compute
        else:
            if cause is EndCause.EXITED:
                done = piece.left
            else:
                assert piece.stopping_at is not None
                done = piece.progress(piece.stopping_at) - piece.unit_start
            work = done * piece.per_unit
            t.useful += work * compute
            t.overhead += overhead * compute
            t.lost += max(0.0, length - work - overhead) * compute
            if done:
                state.done.append((piece.unit_start, done))
        # A kill or an overrun is the piece's once: its siblings stop with it.
        carrier = piece.killed_member if cause is EndCause.RECLAIMED else 0
        for i, member in enumerate(piece.members):
            member_cause = gang_member_cause(cause, i, carrier)
            member.placement.end_cause = member_cause.wire
            got = atom.piece_ended(
                PieceEnd(
                    member.subjob_id,
                    member.placement.state,
                    member_cause,
                    piece.unit_start,
                    done,
                    length,  # the process's run, as its agent reports it
                    float(member.peak),
                    i,
                )
            )
            if got.violation is not None:
                t.subjob_violations += 1
                t.causes[got.violation.value] += 1
        if atom.next_state(has_live=False) is JobNext.DONE:
            self.finish(state)
            entry.job.state = zone_pb2.JOB_SUCCEEDED
            self.driver.carry_out(self.core.forget_if_done(entry))
        else:
            entry.job.state = zone_pb2.QUEUED
            self.waiting.append(state)
        self.driver.wake()

    # -------------------------------------------------------------------- run

    def run(self, progress: ProgressFn | None = None) -> dict[str, Any]:
        for state in self.states:
            self.engine.schedule_at(state.job.arrival, partial(self.arrive, state))
        started = time.perf_counter()
        events = 0
        while self.engine.pending:
            stats = self.engine.run(max_events=2000)
            events += stats.events_processed
            if progress is not None:
                done = sum(1 for s in self.states if s.end is not None)
                progress(self.mode, done, len(self.states))
            if stats.events_processed == 0:
                break
        self.clock()
        for host in self.hosts:
            host.ledger.check_invariant()
        return self.report(events, time.perf_counter() - started)

    def report(self, events: int, wall: float) -> dict[str, Any]:
        states = self.states
        finished = [s for s in states if s.end is not None]
        jct = [s.end - s.job.arrival for s in finished if s.end is not None]
        queue = [s.first_start - s.job.arrival for s in states if s.first_start is not None]
        by_class: dict[str, dict[str, float]] = {}
        for klass, _, _ in CLASSES:
            waits = [
                s.first_start - s.job.arrival
                for s in states
                if s.job.klass == klass and s.first_start is not None
            ]
            by_class[klass] = {"jobs": len(waits), **_summary(waits)}
        atomized = [s for s in states if s.contract is not None]
        t = self.totals
        span = max(self.window_end, 1e-9)
        if self.mode == "atomized":
            violations, population = t.subjob_violations, t.subjobs
            violation_basis = "subjobs"
        else:
            violations, population = sum(1 for s in states if s.violations), len(states)
            violation_basis = "jobs"
        violation_ratio = violations / population if population else 0.0
        rigid_runs = sum(s.runs for s in states if s.contract is None)
        rigid_jobs = sum(1 for s in states if s.contract is None)
        return {
            "jobs": len(states),
            "finished": len(finished),
            "atomized_jobs": len(atomized),
            "rigid_jobs": rigid_jobs,
            "jct_seconds": _summary(jct),
            # Single-GPU jobs (atomized in that mode) and gangs (rigid in both modes).
            "jct_by_shape_seconds": {
                shape: _summary(
                    [
                        s.end - s.job.arrival
                        for s in finished
                        if s.end is not None and is_gang == (s.job.gpus > 1)
                    ]
                )
                for shape, is_gang in (("single", False), ("gang", True))
            },
            "jct_percentiles_seconds": _percentiles(jct),
            "queue_seconds": _summary(queue),
            "queue_by_class_seconds": by_class,
            "gpu_utilization_ratio": round(t.busy / (self.capacity * span), 4),
            "useful_work_ratio": round(t.useful / t.held, 4) if t.held else 0.0,
            "fragmentation_ratio": round(t.frag / t.free, 4) if t.free else 0.0,
            "violation_ratio": round(violation_ratio, 4),
            "violations": violations,
            "violation_basis": violation_basis,
            "violation_population": population,
            "violations_by_cause": dict(t.causes)
            if self.mode == "atomized"
            else {"memory": t.rigid_killed, "time": 0},
            "rigid_jobs_killed": t.rigid_killed,
            "rigid_jobs_failed": t.rigid_failed,
            "subjobs": t.subjobs + rigid_runs,
            "subjobs_per_job": round((t.subjobs + rigid_runs) / max(1, len(states)), 3),
            "subjobs_per_atomized_job": round(t.subjobs / max(1, len(atomized)), 3),
            "window_fill_ratio": round(statistics.fmean(t.fills), 4) if t.fills else None,
            "lost_gpu_seconds": round(t.lost / COMPUTE_SLICES, 1),
            "checkpoint_gpu_seconds": round(t.overhead / COMPUTE_SLICES, 1),
            "clearing_rounds": t.rounds,
            "widen_resets": sum(s.atom.widen_resets for s in atomized if s.atom is not None),
            "bids": t.bids,
            "extensions": t.extensions,
            "displaced": t.displaced,
            "makespan_seconds": round(self.engine.now, 1),
            "events_processed": events,
            "wall_seconds": round(wall, 2),
        }


def run_modes(
    spec: AtomizeSpec, jobs: Sequence[SimJob], progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Each mode of ``spec.modes`` over the same jobs; a JSON-ready dict per mode."""
    return {mode: MigReplay(spec, jobs, mode).run(progress) for mode in spec.modes}


def placeable(job: SimJob, hosts: Sequence[MigHost]) -> bool:
    """Some profile holds the job's largest peak and has a slice for each member."""
    peak = max(job.memory.peaks_bytes)
    counts: dict[str, int] = {}
    for host in hosts:
        for s in host.ledger.slices.values():
            if s.memory_total_bytes >= peak:
                counts[s.mig_profile] = counts.get(s.mig_profile, 0) + 1
    return any(n >= job.gpus for n in counts.values())


def run_experiment(
    spec: AtomizeSpec,
    trace_jobs: Sequence[TraceJob],
    profiles: Sequence[MemoryProfile],
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """The modes on the same jobs: the ``modes`` part of the report, plus what they ran on."""
    hosts = build_hosts(spec)
    largest = max(s.memory_total_bytes for s in hosts[0].ledger.slices.values())
    usable = [p for p in profiles if max(p.peaks_bytes) <= largest]
    all_jobs = make_jobs(trace_jobs, usable, spec.seed)
    jobs = [j for j in all_jobs if placeable(j, hosts)]
    if not jobs:
        raise ValueError("no job fits the MIG hosts")
    slices = list(hosts[0].ledger.slices.values())
    capacity = spec.hosts * sum(compute_of(s.mig_profile) for s in slices)
    span = max(jobs[-1].arrival, 1.0)
    gpus = spec.hosts * len({s.gpu_index for s in slices})
    offered = sum(j.gpus * j.duration for j in jobs) / (gpus * span)
    sizing = MigReplay(spec, jobs[:1], "rigid")
    offered_compute = sum(
        j.gpus * j.duration * compute_of(sizing.family(sizing._state(j))) for j in jobs
    ) / (capacity * span)
    profile_counts: dict[str, int] = {}
    for s in slices:
        profile_counts[s.mig_profile] = profile_counts.get(s.mig_profile, 0) + 1
    return {
        "jobs": len(jobs),
        "left_out_jobs": len(all_jobs) - len(jobs),
        "single_gpu_jobs": sum(1 for j in jobs if j.gpus == 1),
        "classes": {name: sum(1 for j in jobs if j.klass == name) for name, _, _ in CLASSES},
        "memory_profiles": len(usable),
        "hosts": spec.hosts,
        "mig_layout": spec.mig_layout,
        "slices_per_host": dict(sorted(profile_counts.items())),
        "compute_slices": capacity,
        "epsilon": spec.epsilon,
        "checkpoint_overhead_seconds": spec.checkpoint_overhead_seconds,
        "horizon_seconds": spec.horizon_seconds,
        "unit_seconds": spec.unit_seconds,
        "memory_scale": spec.memory_scale,
        "clearing_policy": spec.clearing_policy,
        "starvation_ratio": spec.starvation_ratio,
        "starvation_floor_seconds": spec.starvation_floor_seconds,
        "market_gangs": spec.market_gangs,
        "calibrator_min_samples": spec.calibrator_min_samples or default_min_samples(spec.epsilon),
        "arrival_span_seconds": round(jobs[-1].arrival, 1),
        "offered_gpu_load": round(offered, 3),
        "offered_compute_load": round(offered_compute, 3),
        "modes": run_modes(spec, jobs, progress),
    }
