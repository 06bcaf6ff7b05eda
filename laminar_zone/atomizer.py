"""The atomization market in the router: windows, clearing rounds, bidders, feedback.

An atomized job never goes through the rigid queue. While it has no live subjob it
waits for a window; each round (on new windows, and every ``market.round_seconds``)
the router

1. **announces** the windows agents advertised with their heartbeats that can be used
   now (fresh, ready agents; not claimed by a subjob this router just started there),
   each offered for at most ``market.max_window_seconds``;
2. collects **bids**: the router bids for a job itself (``market.best_bid`` on every
   window the job's constraints allow, from its calibrated profile) unless a client
   has attached to the job's ``Bid`` stream, in which case the client's bids are used;
3. **clears** them with the configured policy (``market.clear``);
4. **materializes** each winner: one subjob of exactly the bid's units, committed on
   that slice through the agent's normal probe path (``slice_id`` + commit-if-fits).

When a subjob ends, the units its checkpoint covers are added (the agent reads them
from ``LAMINAR_CHECKPOINT_DIR/progress``), its observed time per unit and peak memory
feed the job's :class:`~laminar_zone.market.Calibrator`, and a subjob that overran its
window (stopped here) or its memory (reclaimed by Airlock) widens the profile and the
job resumes from its checkpoint in a later window. All policy is in
:mod:`laminar_zone.market` and :mod:`laminar_zone.round` (the round's per-class steps,
which the simulator drives too); this module is the I/O around them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    TERMINAL_JOB_STATES,
    EndCause,
    end_cause,
)
from laminar_base.errors import FailedPrecondition, InvalidArgument
from laminar_base.grpcutil import check_str
from laminar_zone.atoms import (
    AtomState,
    JobNext,
    Phase,
    PieceEnd,
    Running,
    broken_gang_pieces,
    complete_phases,
    decide_at,
    gang_member_cause,
    market_work,
    window_end_at,
)
from laminar_zone.config import Quota, ZoneConfig
from laminar_zone.entry import Entry
from laminar_zone.failures import outcome_unknown
from laminar_zone.lifecycle import atomized_subjob_id
from laminar_zone.market import (
    Award,
    Bid,
    Bidder,
    ClearingContext,
    Contract,
    MarketWindow,
    OpenSlice,
    Profile,
    RatioPool,
    class_windows,
    contract_from,
    feasibility,
    quantiles_from,
    slice_family,
)
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placements import COMMITTING
from laminar_zone.placer import AgentClients, Placer
from laminar_zone.queue import Bidding, Clear
from laminar_zone.reasons import Reason, set_reason
from laminar_zone.round import ClearingRound, Extend, Start, Stop
from laminar_zone.view import ZoneView

T = TypeVar("T")


class Zone(Protocol):
    """What the atomizer needs of the router's job state (:class:`laminar_zone.jobs.ZoneState`)."""

    config: ZoneConfig
    metrics: ZoneMetrics
    view: ZoneView
    clients: AgentClients
    placer: Placer
    entries: dict[str, Entry]
    shares: dict[str, float]
    quotas: dict[str, Quota]
    blocked_starts: dict[str, tuple[int, float]]
    heartbeat_seconds: float

    def apply_start_reply(
        self, placement: zone_pb2.Placement, subjob: common_pb2.Subjob
    ) -> bool: ...
    def evaluate(self, entry: Entry) -> None: ...
    def finish(self, entry: Entry, state: int, reason: str, code: Reason | None = None) -> None: ...
    def save(self, entry: Entry) -> None: ...
    def track(self, entry: Entry, agent_id: str) -> None: ...
    def set_placing(self, entry: Entry, placing: bool) -> None: ...
    def tenant_usage(self) -> tuple[dict[str, float], dict[str, int]]: ...
    def subjob_spec(
        self, entry: Entry, placement: zone_pb2.Placement, env: dict[str, str] | None = None
    ) -> common_pb2.SubjobSpec: ...
    async def terminate(
        self, placement: zone_pb2.Placement, reason: str, cause: EndCause
    ) -> None: ...
    async def roll_back_piece(
        self,
        entry: Entry,
        members: list[zone_pb2.Placement],
        unanswered: set[str],
        why: str,
    ) -> None:
        """A gang's piece did not start on every member: carry out the core's rollback
        (laminar_zone.core.ZoneCore.piece_rolled_back)."""
        ...

    async def one_pass(self) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]: ...


log = logging.getLogger("laminar.zone.atomizer")

LIVE = LIVE_SUBJOB_STATES
ENDED = ENDED_SUBJOB_STATES
#: Reason prefix, for people, of a subjob stopped at its window's end (EndCause.OVERRAN).
#: Which ends are free and which widen the profile: laminar_base.causes.
OVERRAN = "overran:"
#: A window that starts within this many seconds counts as open now.
START_TOLERANCE_SECONDS = 0.5
MAX_PHASES = 64
#: Bids a client may make in one round (more are refused, naming ``bids``).
MAX_CLIENT_BIDS = 256
#: Job families whose calibration the router pools at most (the oldest is dropped).
MAX_POOLS = 4096


def is_atomized(spec: zone_pb2.JobSpec) -> bool:
    return spec.HasField("atomization") and spec.atomization.total_units > 0


def _points(rows: Iterable[common_pb2.Quantile]) -> list[tuple[float, float]]:
    return [(q.q, q.value) for q in rows]


def validate_contract(spec: zone_pb2.JobSpec) -> tuple[Contract, tuple[Phase, ...]]:
    """The contract and its phases; InvalidArgument names the field."""
    a = spec.atomization
    # A gang (gang_size > 1, at most laminar_zone.spec.MAX_GANG) runs each piece as one
    # member per window, all of one family (laminar_zone.market.gang_bids), started,
    # extended and stopped together; each member's resources are its window's.
    r = spec.resources
    if r.gpus > 1 or r.gpu_milli:
        raise InvalidArgument(
            "an atomized job is sized to each window; only gpus=1, mig_profile or gpu_model "
            "may constrain which windows it takes",
            field="spec.resources",
        )
    check_str(a.checkpoint_dir, "spec.atomization.checkpoint_dir", max_chars=4096)
    if a.checkpoint_dir and not Path(a.checkpoint_dir).is_absolute():
        raise InvalidArgument("must be an absolute path", field="spec.atomization.checkpoint_dir")
    contract = contract_from(
        total_units=a.total_units,
        seconds_per_unit=_points(a.seconds_per_unit),
        peak_memory_bytes=_points(a.peak_memory_bytes),
        checkpoint_overhead_seconds=a.checkpoint_overhead_seconds,
        min_units=a.min_units,
        max_units=a.max_units,
        epsilon=a.epsilon,
    )
    if len(a.phases) > MAX_PHASES:
        raise InvalidArgument(f"at most {MAX_PHASES}", field="spec.atomization.phases")
    phases: list[Phase] = []
    start = 0
    for i, ph in enumerate(a.phases):
        label = f"spec.atomization.phases[{i}]"
        check_str(ph.name, f"{label}.name", max_chars=64)
        if ph.units < 1 or start + ph.units > contract.total_units:
            raise InvalidArgument(
                f"must be >= 1 and end by total_units {contract.total_units}",
                field=f"{label}.units",
            )
        profile = Profile(
            quantiles_from(_points(ph.seconds_per_unit), f"{label}.seconds_per_unit")
            if ph.seconds_per_unit
            else contract.profile.seconds_per_unit,
            quantiles_from(_points(ph.peak_memory_bytes), f"{label}.peak_memory_bytes")
            if ph.peak_memory_bytes
            else contract.profile.peak_memory_bytes,
        )
        phases.append(Phase(start, start + ph.units, profile, ph.name))
        start += ph.units
    return contract, complete_phases(contract, phases)


@dataclass
class ClientBidder:
    """A client bidding for its own job over the ``Bid`` stream."""

    job_id: str
    announces: asyncio.Queue[zone_pb2.AnnounceMessage] = field(default_factory=asyncio.Queue)
    bids: asyncio.Queue[zone_pb2.BidMessage] = field(default_factory=asyncio.Queue)


@dataclass
class Atom(AtomState):
    """Market state of one atomized job (rebuilt from its placements after a restart): its
    life cycle's (:class:`~laminar_zone.atoms.AtomState`, shared with the simulator) and
    what the router adds: a client bidder, the last losing score, the held windows."""

    last_losing_score: float = 0.0
    client: ClientBidder | None = None
    #: The last round's result for a client bidder, sent with the next announcement.
    result: zone_pb2.AnnounceMessage | None = None
    #: Subjob id -> the window its piece was started on (the slice it may keep).
    held: dict[str, common_pb2.Window] = field(default_factory=dict)


def piece_end(p: zone_pb2.Placement) -> PieceEnd:
    """An ended placement as its job's life cycle weighs it."""
    return PieceEnd(
        p.subjob_id,
        p.state,
        end_cause(p.end_cause),
        p.unit_start,
        p.units_done,
        p.run_seconds,
        float(p.peak_gpu_memory_bytes),
        p.member,
    )


def units_done(job: zone_pb2.Job) -> int:
    """The next unit to do: the furthest any ended subjob's checkpoint reached."""
    return max(
        (p.unit_start + p.units_done for p in job.placements if p.state in ENDED),
        default=0,
    )


@dataclass
class MarketRound:
    """One clearing round spread over a pass's classes (:meth:`Atomizer.open_round`): the
    round's decisions are its :class:`~laminar_zone.round.ClearingRound`'s (the simulator
    drives the same one); this is what the router needs to carry them out."""

    now: float
    now_unix: float
    #: perf_counter() when the round's current step began; ``seconds`` sums its steps
    #: (the rigid walks between them are the queue's time, not the round's).
    started: float
    waiting: list[Entry]
    #: How many windows were advertised free when the round opened.
    offered: int
    #: (agent, slice) -> (window, agent address, length offered to any class).
    by_key: dict[tuple[str, str], tuple[common_pb2.Window, str, float]]
    machine: ClearingRound
    specs: dict[str, zone_pb2.JobSpec] = field(default_factory=dict)
    clients: list[tuple[Entry, Atom]] = field(default_factory=list)
    #: Pieces whose window ends now: (agent, slice) -> (job, placement, window).
    held: dict[tuple[str, str], tuple[Entry, zone_pb2.Placement, common_pb2.Window]] = field(
        default_factory=dict
    )
    materialized: int = 0
    seconds: float = 0.0

    @property
    def classes(self) -> list[int | Bidding]:
        """The market's work for the pass (laminar_zone.queue.class_order): each waiting job
        (met in the pass's queue order, it bids ahead of the rigid jobs of its class behind
        it), and the classes of held pieces and client bids. Each carries its work left as the
        router prices it (``market.work_left_seconds``; 0 for a client bidder's job)."""
        bidders = self.machine.bidders
        waiting = {b.job_id: b for b in bidders if b.holds is None}
        return market_work(
            ((e.job.job_id, e.item.priority, waiting.get(e.job.job_id)) for e in self.waiting),
            bidders,
            self.machine.client_bids,
        )

    def note_started(self, placements: Iterable[zone_pb2.Placement]) -> None:
        """A rigid job of this pass started on these placements: their slices are taken."""
        for p in placements:
            self.machine.take((p.agent_id, s) for s in p.slice_ids)


class Atomizer:
    def __init__(self, zone: Zone) -> None:
        self.zone = zone
        self.config = zone.config.market
        self.atoms: dict[str, Atom] = {}
        #: agent id -> the windows of its last heartbeat.
        self.windows: dict[str, list[common_pb2.Window]] = {}
        #: (agent id, slice id) -> monotonic time until which a window is taken by us.
        self._claimed: dict[tuple[str, str], float] = {}
        self.wake = asyncio.Event()
        self.round_number = 0
        self._blend = zone.config.blend()
        root = self.config.checkpoint_root or str(
            Path(zone.config.server.state_dir) / "checkpoints"
        )
        self._checkpoint_root = Path(root)
        #: Subjobs asked to stop at their window's end, so each is asked once.
        self._overrunning: set[str] = set()
        #: (tenant, job name, phase index) -> the family's calibration ratios.
        self._pools: dict[tuple[str, str, int], RatioPool] = {}

    # ------------------------------------------------------------------ jobs

    def admit(self, job: zone_pb2.Job) -> None:
        """Start (or, after a restart, rebuild) the market state of an atomized job (a bid's
        waiting time is its entry's, since ``Entry.submitted_mono``)."""
        contract, phases = validate_contract(job.spec)
        atom = Atom.of(
            contract, phases, partial(self._pool, job.spec), members=max(1, job.spec.gang_size)
        )
        self.atoms[job.job_id] = atom
        for p in job.placements:  # a restart: replay what was observed, in order
            if p.state in ENDED:
                self._observe(job, atom, p, replay=True)
            elif p.attempt != job.attempts:
                # A rolled-back piece's member, stopped or confirmed by the rollback: never
                # stopped again by its window's end (which would count a violation).
                self._overrunning.add(p.subjob_id)

    def _pool(self, spec: zone_pb2.JobSpec, phase: int) -> RatioPool | None:
        """The ratio pool of the job's family (tenant, name, phase), if calibration is
        pooled and the job has a name (an unnamed job is a family of its own)."""
        if not self.config.pool_calibration or not spec.name:
            return None
        key = (spec.tenant, spec.name, phase)
        pool = self._pools.get(key)
        if pool is None:
            if len(self._pools) >= MAX_POOLS:
                self._pools.pop(next(iter(self._pools)))  # the oldest family
            pool = self._pools[key] = RatioPool()
        return pool

    def forget(self, job_id: str) -> None:
        self.atoms.pop(job_id, None)

    def checkpoint_dir(self, job: zone_pb2.Job) -> str:
        return job.spec.atomization.checkpoint_dir or str(self._checkpoint_root / job.job_id)

    def progress(self, job: zone_pb2.Job) -> zone_pb2.AtomizationProgress | None:
        atom = self.atoms.get(job.job_id)
        if atom is None:
            return None
        done = units_done(job)
        calibrator = atom.calibrators[atom.phase_at(done)]
        profile = calibrator.profile()
        observed = sum(c.observed for c in atom.calibrators) + atom.violations
        violations = sum(c.violations for c in atom.calibrators) + atom.violations
        out = zone_pb2.AtomizationProgress(
            units_done=done,
            units_total=atom.contract.total_units,
            violation_rate=violations / observed if observed else 0.0,
            subjobs=len(job.placements),
            last_losing_score=atom.last_losing_score,
        )
        for q, v in profile.seconds_per_unit.points:
            out.seconds_per_unit.add(q=q, value=v)
        for q, v in profile.peak_memory_bytes.points:
            out.peak_memory_bytes.add(q=q, value=v)
        return out

    def evaluate(self, entry: Entry) -> None:
        """The job's state from its subjobs: running, waiting for a window, done or failed
        (what each ended piece means, and the next state, are its
        :class:`~laminar_zone.atoms.AtomState`'s)."""
        job = entry.job
        atom = self.atoms.get(job.job_id)
        if atom is None or job.state in (
            zone_pb2.JOB_SUCCEEDED,
            zone_pb2.JOB_FAILED,
            zone_pb2.JOB_CANCELLED,
        ):
            return
        if any(p.state in LIVE and p.reason == COMMITTING for p in job.placements):
            return
        for p in job.placements:
            if p.state in ENDED and p.subjob_id not in atom.observed:
                failure = self._observe(job, atom, p, replay=False)
                if failure:
                    self.zone.finish(entry, zone_pb2.JOB_FAILED, failure)
                    return
        if atom.members > 1:
            # From the placements' states, not from the ends observed just now: after a
            # restart every ended member is replayed as observed, and a survivor whose
            # sibling ended before the stop was sent must still be stopped.
            for ended, survivors in broken_gang_pieces(job.placements):
                self._stop_siblings(entry, ended, survivors)
        # A piece declared lost and observed as such may report its true end later (a
        # checkpoint it did reach): the placements say how far the job really is.
        atom.next_unit = max(atom.next_unit, units_done(job))
        live = [p for p in job.placements if p.state in LIVE]
        if live and all(p.attempt != job.attempts for p in live):
            # Only a rolled-back piece's members are live (stopping, or being confirmed):
            # the job is not running; it stays pending, saying so, until they have ended.
            return
        done = atom.next_unit
        total = atom.contract.total_units
        state = atom.next_state(bool(live))
        if state is JobNext.RUNNING:
            p = live[-1]
            job.state = (
                zone_pb2.JOB_SUSPENDED if p.state == common_pb2.SUSPENDED else zone_pb2.JOB_RUNNING
            )
            job.started_unix = job.started_unix or time.time()
            job.expected_start_unix = 0.0
            suspended = p.state == common_pb2.SUSPENDED
            what = "suspended by Airlock" if suspended else "running"
            set_reason(
                job,
                Reason.SUSPENDED if suspended else Reason.NONE,
                f"units {p.unit_start}..{p.unit_start + p.unit_count - 1} {what} on "
                f"{p.agent_id}/{','.join(p.slice_ids)}; {done} of {total} done",
            )
            return
        if state is JobNext.DONE:
            self.zone.metrics.atomized_subjobs.observe(len(job.placements))
            self.zone.finish(
                entry,
                zone_pb2.JOB_SUCCEEDED,
                f"all {total} units done in {len(job.placements)} subjob(s)",
            )
            return
        job.state = zone_pb2.QUEUED
        set_reason(job, Reason.WINDOW, f"waiting for a window; {done} of {total} units done")

    def _stop_siblings(
        self, entry: Entry, ended: zone_pb2.Placement, survivors: Iterable[zone_pb2.Placement]
    ) -> None:
        """A gang member ended before its piece did (killed for memory, failed, lost): its
        live siblings stop (``GANG_STOPPED``: free and unobserved, :mod:`laminar_zone.atoms`),
        each once, so the whole piece ends and the job bids again from the gang's
        checkpoint."""
        for p in survivors:
            if p.subjob_id not in self._overrunning:
                why = f"gang member {ended.member} ({ended.subjob_id}) ended: {ended.reason}"
                p.reason = why
                self._overrunning.add(p.subjob_id)
                log.info("job %s: subjob %s stops: %s", entry.job.job_id, p.subjob_id, why)
                self.zone.spawn(
                    self.zone.terminate(p, why, EndCause.GANG_STOPPED), f"stop-{p.subjob_id}"
                )

    def _observe(
        self, job: zone_pb2.Job, atom: Atom, p: zone_pb2.Placement, *, replay: bool
    ) -> str:
        """Weigh one ended subjob (:meth:`~laminar_zone.atoms.AtomState.piece_ended`) and
        carry it out: metrics, and a retry used or a failure that ends the job (returned)."""
        got = atom.piece_ended(piece_end(p))
        if replay:
            return ""  # retries_used is journaled with the job
        metrics = self.zone.metrics
        if got.observed:
            metrics.atomized_observations.inc()
            if got.exceeded or got.violation is not None:
                metrics.atomized_violations.inc()
        if got.violation is not None:
            log.info(
                "job %s: subjob %s overran (%s); profile widened, resuming at unit %d",
                job.job_id,
                p.subjob_id,
                p.reason,
                p.unit_start + p.units_done,
            )
        if not got.failed:
            return ""  # done, or killed by us or lost: resumes from its checkpoint
        what = f"subjob {p.subjob_id} on {p.agent_id} failed: {p.reason}"
        if job.retries_used >= job.spec.max_retries:
            return what
        job.retries_used += 1
        self.zone.metrics.retries.inc()
        log.info("job %s: %s; retry %d", job.job_id, what, job.retries_used)
        return ""

    # ------------------------------------------------------------------ windows

    def note_windows(self, agent_id: str, windows: Iterable[common_pb2.Window]) -> None:
        """An agent's heartbeat: its current windows; wakes a round if they changed."""
        fresh = list(windows)[:1024]
        old = self.windows.get(agent_id, [])
        keys = [(w.slice_id, w.memory_bytes, w.gpu_milli, w.end_unix) for w in fresh]
        if keys != [(w.slice_id, w.memory_bytes, w.gpu_milli, w.end_unix) for w in old]:
            self.wake.set()
        self.windows[agent_id] = fresh

    def open_windows(
        self, now_unix: float, now: float
    ) -> list[tuple[common_pb2.Window, str, OpenSlice]]:
        """(window, agent address, slice as the market sees it) of ready agents' windows
        usable now that no award of ours claimed; how long each is offered is
        :func:`laminar_zone.market.class_windows`'s."""
        out = []
        for key, until in list(self._claimed.items()):
            if until <= now:
                del self._claimed[key]
        for agent_id, windows in sorted(self.windows.items()):
            record = self.zone.view.agents.get(agent_id)
            if record is None or not record.is_ready:
                continue
            for w in windows:
                if w.start_unix > now_unix + START_TOLERANCE_SECONDS:
                    continue  # a future window: shown to users, not cleared yet
                if (agent_id, w.slice_id) in self._claimed:
                    continue
                out.append((w, record.address, self._open_slice(w)))
        return out

    def any_class_heads(self) -> dict[str, float | None]:
        """The last pass's blocked rigid heads of every class, family -> expected start:
        they cut the windows announced to any class (``blocked_starts``)."""
        return {family: start for family, (_, start) in self.zone.blocked_starts.items()}

    @staticmethod
    def _open_slice(w: common_pb2.Window, held_by: str = "") -> OpenSlice:
        """An advertised window as :func:`laminar_zone.market.class_windows` takes it."""
        return OpenSlice(
            w.agent_id,
            w.slice_id,
            w.memory_bytes,
            w.gpu_milli,
            slice_family(w.mig_profile if w.kind == common_pb2.MIG else ""),
            w.end_unix,
            f"{w.kind}:{w.mig_profile}:{w.gpu_model}",
            held_by,
        )

    # ------------------------------------------------------------------ rounds

    async def run(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """The market's root loop: on new windows and every ``market.round_seconds``, while
        an atomized job waits or a piece's window ends, it runs the zone's one pass (rigid walks and clearing rounds in one class order,
        laminar_zone.queue.class_order); a pass that raises ends it and its supervisor
        restarts it (laminar_base.supervise)."""
        while not stop.is_set():
            beat()
            try:
                await asyncio.wait_for(self.wake.wait(), self.config.round_seconds)
            except TimeoutError:
                pass
            self.wake.clear()
            await self.enforce_windows()
            if self._waiting() or self._due(time.time()):
                await self.zone.one_pass()

    def _waiting(self) -> list[Entry]:
        out = []
        for job_id, atom in self.atoms.items():
            del atom
            entry = self.zone.entries.get(job_id)
            if entry is None or entry.placing or entry.job.state != zone_pb2.QUEUED:
                continue
            out.append(entry)
        return sorted(out, key=lambda e: e.job.job_id)

    @staticmethod
    def _allows(spec: zone_pb2.JobSpec, w: common_pb2.Window) -> bool:
        r = spec.resources
        if r.gpu_model and w.gpu_model != r.gpu_model:
            return False
        if r.mig_profile:
            return w.kind == common_pb2.MIG and w.mig_profile == r.mig_profile
        if r.gpus == 1:
            return w.kind == common_pb2.WHOLE_GPU
        return True

    def _due(self, now_unix: float) -> list[tuple[Entry, Atom, list[zone_pb2.Placement]]]:
        """Running pieces whose window ends within a checkpoint's length (at least two
        rounds): this round decides whether each keeps its slice (incumbency). A piece is
        its live members (a gang's: one per slice), due only when every one of them is."""
        if not self.config.incumbency:
            return []
        out = []
        for job_id, atom in sorted(self.atoms.items()):
            entry = self.zone.entries.get(job_id)
            if entry is None or entry.placing or atom.client is not None:
                continue  # a client sizes its own pieces to their windows
            checkpoint = atom.contract.checkpoint_overhead_seconds
            live = [p for p in entry.job.placements if p.state in LIVE]
            if live and all(
                p.state == common_pb2.RUNNING
                and p.reason != COMMITTING
                and p.window_end_unix > 0
                and now_unix >= decide_at(p.window_end_unix, checkpoint, self.config.round_seconds)
                and p.subjob_id not in self._overrunning
                for p in live
            ):
                out.append((entry, atom, live))
        return out

    @staticmethod
    def _key(w: common_pb2.Window) -> tuple[str, str]:
        return (w.agent_id, w.slice_id)

    def _live_slices(self) -> set[tuple[str, str]]:
        """(agent, slice) of every live piece of an atomized job."""
        out: set[tuple[str, str]] = set()
        for job_id in self.atoms:
            entry = self.zone.entries.get(job_id)
            if entry is None:
                continue
            for p in entry.job.placements:
                if p.state in LIVE:
                    out.update((p.agent_id, s) for s in p.slice_ids)
        return out

    def _held_window(self, atom: Atom, p: zone_pb2.Placement) -> common_pb2.Window:
        """The window a running piece holds: the one it started on; after a restart the
        slice as its agent advertises it (a busy slice's future window), else one rebuilt
        from the placement (its memory then is what the piece declared)."""
        known = atom.held.get(p.subjob_id)
        if known is not None:
            return known
        slice_id = p.slice_ids[0] if p.slice_ids else ""
        for w in self.windows.get(p.agent_id, []):
            # A shared GPU's window is the room left beside the piece, not the piece's.
            if w.slice_id == slice_id and w.kind != common_pb2.SHARED_GPU:
                atom.held[p.subjob_id] = w
                return w
        r = p.resources
        kind = common_pb2.MIG if r.mig_profile else common_pb2.WHOLE_GPU
        if r.gpu_milli:
            kind = common_pb2.SHARED_GPU
        return common_pb2.Window(
            agent_id=p.agent_id,
            slice_id=p.slice_ids[0] if p.slice_ids else "",
            kind=kind,
            mig_profile=r.mig_profile,
            gpu_model=r.gpu_model,
            gpu_milli=r.gpu_milli or 1000,
            memory_bytes=r.gpu_memory_bytes,
        )

    async def open_round(
        self, units: dict[str, float], memory: dict[str, int]
    ) -> MarketRound | None:
        """A clearing round for the pass that is starting (None: no atomized job waits and
        no piece's window ends). ``units``/``memory`` are the pass's running tally per
        tenant: the round counts its awards into it, as the queue walk counts its starts,
        so one quota binds rigid and atomized work alike. The pass then clears each class
        (:meth:`clear_class`) between the rigid walks of its classes and closes the round
        (:meth:`close_round`): laminar_zone.queue.class_order says when."""
        waiting = self._waiting()
        now, now_unix = time.monotonic(), time.time()
        due = self._due(now_unix)
        if not waiting and not due:
            return None
        started = time.perf_counter()
        self.round_number += 1
        # A slice one of our pieces runs on is not free, whatever its agent advertised (a
        # piece past the expected end it declared shows as a window that opened).
        busy = self._live_slices()
        usable = [o for o in self.open_windows(now_unix, now) if self._key(o[0]) not in busy]
        # What a client is shown: each usable slice as long as no class's blocked head
        # cuts it (it may bid for any class). The round itself offers every usable slice;
        # each class's step cuts them at the heads of that class and the higher ones only
        # (a batch head due now leaves a production bid its slice).
        announced = class_windows(
            now_unix,
            (o for _, _, o in usable),
            self.any_class_heads(),
            self.config.max_window_seconds,
        )
        markets = {m.key: m for m in announced}
        by_key = {
            o.key: (w, address, markets[o.key].length_seconds if o.key in markets else 0.0)
            for w, address, o in usable
        }
        slices = [o for _, _, o in usable]
        bidders: list[Bidder] = []
        specs: dict[str, zone_pb2.JobSpec] = {}
        clients: list[tuple[Entry, Atom]] = []
        held: dict[tuple[str, str], tuple[Entry, zone_pb2.Placement, common_pb2.Window]] = {}
        largest = self.largest_slice_bytes()
        for entry in waiting:
            atom = self.atoms[entry.job.job_id]
            if atom.client is not None:
                clients.append((entry, atom))
                continue
            bidders.append(self._bidder(entry, atom, now, largest))
            specs[entry.job.job_id] = entry.job.spec
        for entry, atom, members in due:
            keys = []
            for p in members:  # a gang's piece holds one slice per member
                w = self._held_window(atom, p)
                key = (w.agent_id, w.slice_id)
                keys.append(key)
                held[key] = (entry, p, w)
                slices.append(self._open_slice(w, entry.job.job_id))
            specs[entry.job.job_id] = entry.job.spec
            bidders.append(
                self._bidder(
                    entry, atom, now, largest, holds=keys[0], running=(members[0], now_unix)
                )
            )
        client_bids: list[Bid] = []
        if clients:
            replies = await asyncio.gather(
                *(self._client_bids(e, a, by_key, markets, now) for e, a in clients)
            )
            for got in replies:
                client_bids.extend(got)

        def allows(job_id: str, key: tuple[str, str]) -> bool:
            window = by_key[key][0] if key in by_key else held[key][2]
            return self._allows(specs[job_id], window)

        machine = ClearingRound(
            now_unix,
            slices,
            bidders,
            self.config.policy,
            ClearingContext(
                usage=dict(units),
                shares=self.zone.shares,
                blend=self._blend,
                hysteresis=self.config.hysteresis,
            ),
            self.config.max_window_seconds,
            client_bids=client_bids,
            quotas=self.zone.quotas,
            units=units,
            memory=memory,
            allows=allows,
        )
        rnd = MarketRound(
            now=now,
            now_unix=now_unix,
            started=started,
            waiting=waiting,
            offered=len(usable),
            by_key=by_key,
            machine=machine,
            specs=specs,
            clients=clients,
            held=held,
        )
        rnd.seconds += time.perf_counter() - started
        return rnd

    async def clear_class(self, rnd: MarketRound, step: Clear) -> None:
        """The clearing round of class ``step.priority`` (None: every class), as the round's
        machine decides it (:meth:`laminar_zone.round.ClearingRound.clear`): pieces that
        lost their slice stop, pieces that kept it extend, winners on free windows start
        now, before any lower class's rigid job may try."""
        rnd.started = time.perf_counter()
        cleared = rnd.machine.clear(step)
        order = {key: i for i, key in enumerate(rnd.held)}
        held = [d for d in cleared.decisions if not isinstance(d, Start)]
        await self._decide_held(rnd, sorted(held, key=lambda d: order[d.key]))
        results = await asyncio.gather(
            *(
                self._materialize(self.zone.entries[d.award.bid.job_id], d.award, rnd.by_key)
                for d in cleared.decisions
                if isinstance(d, Start) and d.award.bid.job_id in self.zone.entries
            )
        )
        rnd.materialized += sum(results)
        rnd.seconds += time.perf_counter() - rnd.started

    async def close_round(self, rnd: MarketRound) -> list[Bid]:
        """After the last class: pieces whose window ends with no award stop, losers learn
        the score that beat them, clients hear the outcome, waiting jobs say why. Returns
        the winning bids (tests and benchmarks read them)."""
        rnd.started = time.perf_counter()
        closed = rnd.machine.close()
        awards = closed.awards
        for job_id, best in closed.losing_scores.items():  # losers learn what beat them
            loser = self.atoms.get(job_id)
            if loser is not None:
                loser.last_losing_score = max(loser.last_losing_score, best)
        for entry, atom in rnd.clients:
            award = next((a for a in awards if a.bid.job_id == entry.job.job_id), None)
            refused = list(atom.result.refused) if atom.result is not None else []
            atom.result = zone_pb2.AnnounceMessage(
                won=award is not None,
                winning_score=award.score if award else atom.last_losing_score,
                winning_bid=_bid_message(award.bid, award.score) if award else None,
                refused=refused,  # this round's, set while its bids were taken
            )
        await self._decide_held(rnd, closed.stops)
        future = self.future_windows(rnd.now_unix)
        for entry in rnd.waiting:
            if entry.job.job_id not in closed.winners or all(
                a.bid.window.held_by for a in awards if a.bid.job_id == entry.job.job_id
            ):
                self._explain_wait(entry, bool(rnd.offered), rnd.now_unix, future)
        rnd.seconds += time.perf_counter() - rnd.started
        self.zone.metrics.clearing_round_seconds.observe(rnd.seconds)
        if awards:
            log.info(
                "clearing round %d (%s): %d window(s), %d held, %d bid(s), %d award(s), %d started",
                self.round_number,
                self.config.policy,
                rnd.offered,
                len(rnd.held),
                len(rnd.machine.bids),
                len(awards),
                rnd.materialized,
            )
        return [a.bid for a in awards]

    async def _decide_held(self, rnd: MarketRound, decisions: Iterable[Extend | Stop]) -> None:
        """Carry out the round's decisions on pieces whose window ends: extended in place
        (:class:`~laminar_zone.round.Extend`), or stopped (:class:`~laminar_zone.round.Stop`:
        it checkpoints; the job resumes from there in a later window)."""
        for decision in decisions:
            key = decision.key
            entry = rnd.held[key][0]
            # The piece's members (a gang's: one per held slice) are decided together.
            members = [m for m, (e, _, _) in rnd.held.items() if e is entry]
            if isinstance(decision, Extend):
                kept = decision.award
                length = kept.bid.window.length_seconds
                window_end = window_end_at(rnd.now_unix, length)
                for member in members:
                    rnd.held[member][1].window_end_unix = window_end
                self.zone.save(entry)
                self.zone.metrics.window_extensions.inc()
                log.info(
                    "job %s: subjob %s keeps %s for another %.1f s (no bid of a higher "
                    "class, none of its class better by %.2f; score %.3f)",
                    entry.job.job_id,
                    ",".join(rnd.held[m][1].subjob_id for m in members),
                    ",".join(f"{a}/{s}" for a, s in members),
                    length,
                    self.config.hysteresis,
                    kept.score,
                )
                continue
            award = decision.award
            if award is not None:
                why = (
                    f"window ended: {key[0]}/{key[1]} goes to job {award.bid.job_id} "
                    f"(class {award.bid.priority}, score {award.score:.3f}); resumes from its "
                    "checkpoint"
                )
            else:
                why = (
                    f"window ended: {key[0]}/{key[1]} is held for other work (no extension "
                    "fits before the next commitment on it); resumes from its checkpoint"
                )
            # Every member stops, each checkpointing (a gang's progress is common to them);
            # a gang's other slices were decided with this one, so each is asked once.
            stops = [rnd.held[m][1] for m in members]
            stops = [s for s in stops if s.subjob_id not in self._overrunning]
            for stop in stops:
                stop.reason = why
                self._overrunning.add(stop.subjob_id)
            if not stops:
                continue
            self.zone.save(entry)
            log.info(
                "job %s: subjob(s) %s stop: %s",
                entry.job.job_id,
                ",".join(s.subjob_id for s in stops),
                why,
            )
            await asyncio.gather(*(self.zone.terminate(s, why, EndCause.PREEMPTED) for s in stops))

    def future_windows(self, now_unix: float) -> list[tuple[float, str, common_pb2.Window]]:
        """Windows of ready agents that open later, soonest first (computed once a round)."""
        out: list[tuple[float, str, common_pb2.Window]] = []
        for agent_id, windows in self.windows.items():
            record = self.zone.view.agents.get(agent_id)
            if record is None or not record.is_ready:
                continue
            out.extend((w.start_unix, agent_id, w) for w in windows if w.start_unix > now_unix)
        out.sort(key=lambda item: (item[0], item[1], item[2].slice_id))
        return out

    def _explain_wait(
        self,
        entry: Entry,
        any_offered: bool,
        now_unix: float,
        future: list[tuple[float, str, common_pb2.Window]],
    ) -> None:
        """Why a job got no window this round, and when the next one it fits opens: the
        earliest advertised window (a busy slice's holders' expected end) of a kind it may
        use with room for its predicted peak memory."""
        job = entry.job
        atom = self.atoms[job.job_id]
        done = units_done(job)
        profile = atom.calibrators[atom.phase_at(done)].profile()
        need = profile.peak_memory_bytes.value_at(1.0 - atom.contract.epsilon)
        soonest = next(
            (
                (start, f"{agent_id}/{w.slice_id}")
                for start, agent_id, w in future
                if w.memory_bytes >= need and self._allows(job.spec, w)
            ),
            None,
        )
        why = (
            f"outbid (a score of {atom.last_losing_score:.3f} won)"
            if any_offered and atom.last_losing_score
            else "no free slice fits it now"
            if any_offered
            else "no free slice is advertised now"
        )
        set_reason(
            job,
            Reason.WINDOW,
            f"waiting for a window; {done} of {atom.contract.total_units} units done; {why}",
        )
        job.expected_start_unix = soonest[0] if soonest else 0.0
        if soonest:
            job.reason += f"; the next window it fits opens in about {soonest[0] - now_unix:.0f} s on {soonest[1]}"

    def largest_slice_bytes(self) -> int:
        """The largest slice any agent advertises a window on (0 before any window)."""
        return max((w.memory_bytes for ws in self.windows.values() for w in ws), default=0)

    def _bidder(
        self,
        entry: Entry,
        atom: Atom,
        now: float,
        largest_bytes: int,
        holds: tuple[str, str] | None = None,
        running: tuple[zone_pb2.Placement, float] | None = None,
    ) -> Bidder:
        """The router bidding for a job (:meth:`~laminar_zone.atoms.AtomState.bidder`): for
        the incumbent ``running`` piece (with the Unix time its window ends, now), from
        where it is surely reached."""
        job = entry.job
        piece = None
        if running is not None and running[0].started_unix > 0:
            p, now_unix = running
            piece = Running(p.unit_start, p.unit_count, now_unix - p.started_unix)
        bidder, reset = atom.bidder(
            job.job_id,
            job.spec.tenant,
            job.spec.priority or common_pb2.BATCH,
            # Time in the system since submission, as the simulator counts it: what the
            # clearing scores that age (srpt's starvation guard, slowdown, responsive) read.
            now - entry.submitted_mono,
            largest_bytes,
            holds=holds,
            running=piece,
        )
        if reset:
            log.info(
                "job %s: its memory widening predicted more than the largest slice (%d bytes); "
                "dropped, so it can win a window and be observed",
                job.job_id,
                largest_bytes,
            )
        return bidder

    async def _client_bids(
        self,
        entry: Entry,
        atom: Atom,
        by_key: dict[tuple[str, str], tuple[common_pb2.Window, str, float]],
        markets: dict[tuple[str, str], MarketWindow],
        now: float,
    ) -> list[Bid]:
        """Announce to a client bidder and take its bids for this round (bounded wait)."""
        client = atom.client
        assert client is not None
        job = entry.job
        announce = zone_pb2.AnnounceMessage(round=self.round_number)
        if atom.result is not None:
            announce.MergeFrom(atom.result)
            atom.result = None
        for w, _, length in by_key.values():
            if length > 0 and self._allows(job.spec, w):
                copy = announce.windows.add()
                copy.CopyFrom(w)
                if w.end_unix <= 0 or w.end_unix - time.time() > length:
                    copy.end_unix = time.time() + length
        client.announces.put_nowait(announce)
        deadline = time.monotonic() + self.config.bid_timeout_seconds
        message: zone_pb2.BidMessage | None = None
        while (left := deadline - time.monotonic()) > 0:
            try:
                got = await asyncio.wait_for(client.bids.get(), left)
            except TimeoutError:
                break
            if got.round == self.round_number:
                message = got
                break
        if message is None:
            return []
        # The router judges a client's bid as its own: the calibrated profile of the job's
        # current phase, its units within the phase, P(fits) >= 1 - epsilon.
        bidder = self._bidder(entry, atom, now, self.largest_slice_bytes())
        next_unit = bidder.next_unit
        contract = bidder.contract
        target = 1.0 - contract.epsilon
        median = bidder.profile.seconds_per_unit.value_at(0.5)
        remaining = (contract.total_units - next_unit) * median
        remaining += contract.checkpoint_overhead_seconds
        out = []
        refused: list[zone_pb2.RefusedBid] = []

        def refuse(field: str, reason: str) -> None:
            log.info("job %s: client bid refused: %s: %s", job.job_id, field, reason)
            refused.append(zone_pb2.RefusedBid(field=field, reason=reason))

        if len(message.bids) > MAX_CLIENT_BIDS:
            refuse("bids", f"{len(message.bids)} bids, at most {MAX_CLIENT_BIDS} a round")
        for i, b in enumerate(message.bids[:MAX_CLIENT_BIDS]):
            key = (b.agent_id, b.slice_id)
            label = f"bids[{i}]"
            if key not in markets:
                refuse(
                    f"{label}.slice_id",
                    f"{b.agent_id}/{b.slice_id} is no window of round {self.round_number}",
                )
                continue
            left = contract.total_units - next_unit
            if b.unit_start != next_unit:
                refuse(f"{label}.unit_start", f"{b.unit_start}, but the next unit is {next_unit}")
                continue
            if not 1 <= b.unit_count <= min(contract.max_units, left):
                refuse(
                    f"{label}.unit_count",
                    f"{b.unit_count}, must be 1 to {min(contract.max_units, left)}",
                )
                continue
            window = markets[key]
            if b.memory_bytes > window.memory_bytes:
                refuse(
                    f"{label}.memory_bytes",
                    f"{b.memory_bytes} bytes, the slice has {window.memory_bytes}",
                )
                continue
            fits = feasibility(
                bidder.profile, int(b.unit_count), window, contract.checkpoint_overhead_seconds
            )
            if fits < target:
                refuse(
                    f"{label}.unit_count",
                    f"{b.unit_count} units on {b.agent_id}/{b.slice_id} fit with probability "
                    f"{fits:.3f} by the job's calibrated profile, below 1 - epsilon = "
                    f"{target:.3f}",
                )
                continue
            seconds = (
                b.seconds if b.seconds > 0 and math.isfinite(b.seconds) else window.length_seconds
            )
            out.append(
                Bid(
                    job.job_id,
                    job.spec.tenant,
                    window,
                    next_unit,
                    int(b.unit_count),
                    fits,  # the router's estimate, not the client's claim
                    min(seconds, window.length_seconds),
                    bidder.waited_seconds,
                    job.spec.priority or common_pb2.BATCH,
                    # The job's work left, not the piece's: a client cutting small pieces
                    # is not ranked as a short job by srpt.
                    remaining_seconds=remaining,
                )
            )
        if refused:  # told with the next announce, beside the round's result
            if atom.result is None:
                atom.result = zone_pb2.AnnounceMessage()
            atom.result.refused.extend(refused)
        return out

    # ------------------------------------------------------------------ materialize

    async def _materialize(
        self,
        entry: Entry,
        award: Award,
        by_key: dict[tuple[str, str], tuple[common_pb2.Window, str, float]],
    ) -> bool:
        """Start the winner's piece on its won windows' slices (a gang's: one member per
        window, committed together, all or nothing); False if it did not start."""
        job = entry.job
        atom = self.atoms.get(job.job_id)
        if atom is None or job.state != zone_pb2.QUEUED or entry.placing:
            return False
        bid, score = award.bid, award.score
        length = bid.window.length_seconds  # as offered to the bid's class
        # With incumbency the piece runs every unit its job has left (within the phase and
        # max_units): it keeps its slice while nobody needs it more, and stops,
        # checkpointed, when its window ends and it does not. A client sizes its own.
        plan = atom.piece(bid, length, runs_on=self.config.incumbency and atom.client is None)
        count, expected = plan.unit_count, plan.expected_seconds
        won = [by_key[w.key] for w in award.windows]
        size = len(won)
        members: list[tuple[zone_pb2.Placement, common_pb2.Window, str]] = []
        window_end = window_end_at(time.time(), length)  # one end for every member
        for i, (w, address, _) in enumerate(won):
            self._claimed[(w.agent_id, w.slice_id)] = (
                time.monotonic() + 2 * self.zone.heartbeat_seconds
            )
            placement = job.placements.add(
                subjob_id=atomized_subjob_id(job.job_id, bid.unit_start, len(job.placements)),
                agent_id=w.agent_id,
                agent_address=address,
                slice_ids=[w.slice_id],
                state=common_pb2.STARTING,
                reason=COMMITTING,
                attempt=job.attempts,
                member=i,
                unit_start=bid.unit_start,
                unit_count=count,
                window_end_unix=window_end,
                resources=_resources(w, min(w.memory_bytes, plan.memory_bytes)),
            )
            members.append((placement, w, address))
        where = ", ".join(f"{w.agent_id}/{w.slice_id}" for _, w, _ in members)
        job.state = zone_pb2.PENDING
        set_reason(
            job,
            Reason.PLACING,
            f"starting units {bid.unit_start}..{bid.unit_start + count - 1} on {where} "
            f"(score {score:.3f}, P(fits) {bid.feasibility:.3f})",
        )
        for agent_id in dict.fromkeys(w.agent_id for _, w, _ in members):
            self.zone.track(entry, agent_id)
        self.zone.save(entry)
        self.zone.set_placing(entry, True)
        unanswered: set[str] = set()
        try:
            outcomes = await asyncio.gather(
                *(
                    self._commit_member(entry, p, w, address, expected, size, unanswered)
                    for p, w, address in members
                )
            )
        finally:
            self.zone.set_placing(entry, False)
        started = all(o == "" for o in outcomes)
        if started:
            for p, w, _ in members:
                atom.held[p.subjob_id] = w
            self.zone.metrics.window_fill.observe(
                min(1.0, bid.expected_seconds / length) if math.isfinite(length) else 0.0
            )
            log.info(
                "job %s: subjob(s) %s units %d+%d on %s for a %.1f s window "
                "(expected %.1f s, P(fits) %.3f, score %.3f)",
                job.job_id,
                ",".join(p.subjob_id for p, _, _ in members),
                bid.unit_start,
                count,
                where,
                length,
                bid.expected_seconds,
                bid.feasibility,
                score,
            )
        elif not unanswered and all(
            p.state == common_pb2.STARTING and p.reason == COMMITTING for p, _, _ in members
        ):
            # Every window was gone (each member bounced): those subjobs never existed.
            del job.placements[-size:]
            if job.state not in TERMINAL_JOB_STATES:  # not cancelled while they were out
                job.state = zone_pb2.QUEUED
                set_reason(
                    job,
                    Reason.WINDOW,
                    f"window on {where} was gone ({'; '.join(o for o in outcomes if o)}); "
                    "waiting for the next",
                )
        else:
            # Nothing of the piece runs (a gang member did not start, or a commit went
            # unanswered): the router's core decides each member's fate (ZoneCore.roll_back,
            # as for a rigid gang) and the zone carries it out. Its members are stopped by
            # that rollback alone, never again by their window's end or a sibling's
            # (enforce_windows, _stop_siblings).
            self._overrunning.update(p.subjob_id for p, _, _ in members)
            why = "; ".join(o for o in outcomes if o)
            await self.zone.roll_back_piece(entry, [p for p, _, _ in members], unanswered, why)
        self.zone.evaluate(entry)
        self.zone.save(entry)
        return started

    async def _commit_member(
        self,
        entry: Entry,
        placement: zone_pb2.Placement,
        w: common_pb2.Window,
        address: str,
        expected_seconds: float,
        size: int,
        unanswered: set[str],
    ) -> str:
        """Commit one member of a piece on its window's slice through the agent's probe
        (commit-if-fits). Returns "" when it started, else why not; one that bounced is left
        ``COMMITTING`` for the caller. One whose commit went unanswered, a single piece or
        a gang's member, is left live and ``COMMITTING`` (added to ``unanswered``): a
        commit of unknown outcome, which the piece's rollback asks its agent about at its
        next heartbeat (``ZoneCore.roll_back``, ``ZoneCore.confirmed``), so the job does not
        bid again while it may run beside a new piece."""
        job = entry.job
        # The agent keeps LAMINAR_* for itself: a member learns its place as torch.distributed
        # does (RANK of WORLD_SIZE).
        env = {"RANK": str(placement.member), "WORLD_SIZE": str(size)}
        spec = self.zone.subjob_spec(entry, placement, env if size > 1 else None)
        spec.resources.CopyFrom(placement.resources)
        spec.unit_start = placement.unit_start
        spec.unit_count = placement.unit_count
        spec.checkpoint_dir = self.checkpoint_dir(job)
        spec.expected_seconds = expected_seconds
        try:
            reply = await self.zone.clients.stub(address).Probe(
                agent_pb2.ProbeRequest(
                    probe_id=f"{placement.subjob_id}-r{self.round_number}",
                    job_id=job.job_id,
                    resources=placement.resources,
                    priority=spec.priority,
                    value=spec.value,
                    slice_id=w.slice_id,
                    tenant=job.spec.tenant,
                    commit_if_fits=True,
                    spec=spec,
                ),
                timeout=self.zone.config.placement.rpc_timeout_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            if not outcome_unknown(exc):  # the agent refused it: it surely did not start
                return f"{w.agent_id}/{w.slice_id} refused: {exc.code().name}: {exc.details()}"
            unanswered.add(placement.subjob_id)
            return f"commit unconfirmed: {exc.code().name}: {exc.details()}"
        self.zone.placer.note_summary(reply.summary)
        if not reply.HasField("subjob"):
            return f"{w.agent_id}/{w.slice_id} bounced: {reply.bounce.reason or 'no room'}"
        self.zone.apply_start_reply(placement, reply.subjob)
        return ""

    async def enforce_windows(self) -> None:
        """Stop subjobs still running past their window's end (plus grace): they resume
        from their checkpoint later, and their profile is widened. A gang's piece overruns
        once: its first member so stopped is the violation (``OVERRAN``), the others stop
        with it (``GANG_STOPPED``, free)."""
        now_unix = time.time()
        grace = self.config.overrun_grace_seconds
        live: set[str] = set()
        for job_id in list(self.atoms):
            entry = self.zone.entries.get(job_id)
            if entry is None:
                continue
            overran: zone_pb2.Placement | None = None
            for p in entry.job.placements:
                if p.state in LIVE:
                    live.add(p.subjob_id)
                if (
                    p.state in LIVE
                    and p.reason != COMMITTING
                    and p.window_end_unix > 0
                    and now_unix > p.window_end_unix + grace
                    and p.subjob_id not in self._overrunning
                ):
                    why = (
                        f"{OVERRAN} window ended at {p.window_end_unix:.0f} "
                        f"({now_unix - p.window_end_unix:.1f} s ago, grace {grace:g} s)"
                    )
                    if overran is None or overran.unit_start != p.unit_start:
                        overran = p  # the piece's overrun: this member carries it
                    cause = gang_member_cause(EndCause.OVERRAN, p.member, overran.member)
                    if cause is not EndCause.OVERRAN:
                        why = f"gang member {overran.member} ({overran.subjob_id}) {why}"
                    p.reason = why
                    self._overrunning.add(p.subjob_id)
                    live.add(p.subjob_id)
                    await self.zone.terminate(p, why, cause)
        self._overrunning &= live

    # ------------------------------------------------------------------ client bidding

    async def bid_stream(
        self, first: zone_pb2.BidMessage, messages: AsyncIterator[zone_pb2.BidMessage]
    ) -> AsyncIterator[zone_pb2.AnnounceMessage]:
        """Attach a client bidder to its job until the stream or the job ends."""
        job_id = check_str(first.job_id, "job_id", required=True)
        atom = self.atoms.get(job_id)
        if atom is None:
            raise FailedPrecondition(f"job {job_id} is not a live atomized job", field="job_id")
        if atom.client is not None:
            raise FailedPrecondition(f"job {job_id} already has a client bidder", field="job_id")
        if atom.members > 1:
            raise FailedPrecondition(
                f"job {job_id} is a gang of {atom.members}: the router bids for a gang's "
                "pieces (a client bids for one window at a time)",
                field="job_id",
            )
        client = ClientBidder(job_id)
        atom.client = client
        self.wake.set()

        async def pump() -> None:
            async for message in messages:
                if message.job_id and message.job_id != job_id:
                    continue
                client.bids.put_nowait(message)

        reader = asyncio.create_task(pump(), name=f"bid-reader-{job_id}")
        try:
            while True:
                if job_id not in self.atoms:  # the job ended: the last result, and done
                    last = zone_pb2.AnnounceMessage(round=self.round_number, done=True)
                    if atom.result is not None:
                        last.MergeFrom(atom.result)
                    yield last
                    return
                getter = asyncio.ensure_future(client.announces.get())
                done, _ = await asyncio.wait(
                    {getter, reader},
                    timeout=self.config.round_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                if reader in done:
                    return  # the client closed its side
        finally:
            reader.cancel()
            if atom.client is client:
                atom.client = None
            log.info("job %s: client bidder detached; the router bids for it again", job_id)


def _resources(w: common_pb2.Window, memory_bytes: int) -> common_pb2.Resources:
    """What a piece's member on window ``w`` asks of its slice."""
    resources = common_pb2.Resources(gpu_memory_bytes=memory_bytes, gpu_model=w.gpu_model)
    if w.kind == common_pb2.MIG:
        resources.mig_profile = w.mig_profile
    elif w.kind == common_pb2.SHARED_GPU:
        resources.gpu_milli = w.gpu_milli
    else:
        resources.gpus = 1
    return resources


def _bid_message(bid: Bid, score: float) -> zone_pb2.SubjobBid:
    return zone_pb2.SubjobBid(
        slice_id=bid.window.slice_id,
        agent_id=bid.window.agent_id,
        unit_start=bid.unit_start,
        unit_count=bid.unit_count,
        score=score,
        feasibility=bid.feasibility,
        seconds=bid.expected_seconds,
    )
