"""The router's job decisions as a machine with no I/O: events in, instructions out.

:class:`ZoneCore` owns the job table's decision state (live jobs, which agents hold which
jobs, commits to confirm, arrays, the queue's blocked heads and positions, time limits,
stops owed) and every transition of it: routing a new job, what a placement try's gather
and commit mean, the rollback of a gang whose commit failed, a cancel, a job's end, the
sweep's lost agents, dependencies, and the bookkeeping of a queue pass
(:class:`PassBook`). Each transition is a method named for its event; it changes the
state and returns the instructions (:data:`Instruction`) that the driver,
:class:`laminar_zone.jobs.ZoneState`, carries out: journal writes, stops, placements,
forwards, wakes and metric counts. The core never awaits, never touches a socket or the
journal, and never reads the clock: ``now_unix`` (wall clock) and ``now_mono``
(monotonic) come in with each event.

What the core reads but does not own: the zone's view of its agents
(:class:`ZoneView`, in-memory), the set of atomized jobs (the atomizer's), and a lookup of
jobs that are no longer live (the journal, for dependencies). The leaf decisions it
strings together are the shared pure ones: :func:`laminar_zone.lifecycle.judge_attempt`,
:mod:`laminar_zone.queue`, :mod:`laminar_zone.arrays`, :mod:`laminar_zone.time_limits`.

Not covered here: the probe rounds themselves (:class:`laminar_zone.gather.Gather`), the
atomized jobs' windows (:mod:`laminar_zone.atomizer`), what agents report
(:mod:`laminar_zone.reports`), and recovery from the journal (the driver's).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from laminar_agent.inventory.mig import MIG_PROFILES
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import (
    ENDED_SUBJOB_STATES,
    LIVE_SUBJOB_STATES,
    RUNNING_JOB_STATES,
    TERMINAL_JOB_STATES,
    EndCause,
    end_cause,
)
from laminar_base.demand import Demand
from laminar_base.errors import FailedPrecondition, InvalidArgument
from laminar_zone.arrays import ArrayProgress, element_id, parse_array
from laminar_zone.config import Quota
from laminar_zone.entry import Entry, queue_item
from laminar_zone.holdings import Holdings
from laminar_zone.lifecycle import (
    Outcome,
    Record,
    Report,
    job_of,
    judge_attempt,
    judge_report,
    rigid_subjob_id,
    taken_over,
)
from laminar_zone.placement import ReleaseCurve
from laminar_zone.placements import (
    COMMITTING,
    READDRESSED,
    apply_start_reply,
    copy_subjob,
    member_states,
    moves_from_live_copy,
    note_true_end,
    now_running,
    placement_of,
    state_name,
)
from laminar_zone.queue import (
    Admit,
    QueueWalk,
    Waiting,
    order_key,
    quota_block,
    quota_never_fits,
    why_waiting,
)
from laminar_zone.reasons import END_REASONS, Reason, reason_of, set_reason
from laminar_zone.time_limits import TimeLimits
from laminar_zone.view import ZoneView

if TYPE_CHECKING:
    import random

log = logging.getLogger("laminar.zone.core")


# ==================================================================== instructions


@dataclass(frozen=True)
class Journal:
    """Write these jobs to the journal (usage rows first), then tell their watchers.

    ``grouped``: the write may share one commit with the others of this loop tick (group
    commit), since nothing outside the router depends on it before then: the driver
    commits it at the tick's end, with any write not grouped that comes first, and before
    any probe leaves for an agent (a commit on probe's intent). Watchers hear of it once it
    is committed. A router killed before that commit loses only what the journal already
    recovers from (a job still queued; a committing placement it confirms with the agent).

    ``quiet``: watchers are not told of this write (what it changed is the router's
    bookkeeping, not a state a watcher acts on: a commit on probe's intent, whose job stays
    pending and is next told running, or queued). A watcher gets the newest state at each
    read anyway, never each state a job went through."""

    entries: tuple[Entry, ...]
    grouped: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class Publish:
    """Tell the job's watchers (and its array's) what it is now, without a journal write."""

    entry: Entry


@dataclass(frozen=True)
class Terminate:
    """Ask the placement's agent to stop it; its end records ``cause``."""

    placement: zone_pb2.Placement
    why: str
    cause: EndCause


@dataclass(frozen=True)
class Release:
    """Give back leases that a try gathered and will not commit (the driver's own objects)."""

    leases: tuple[Any, ...]


@dataclass(frozen=True)
class Place:
    """Try to place the job now (one try within the probe budget)."""

    entry: Entry
    from_queue: bool = False


@dataclass(frozen=True)
class Forward:
    """Offer the job to a peer zone by flow splitting; the core hears back by
    :meth:`ZoneCore.forwarded`."""

    entry: Entry


@dataclass(frozen=True)
class ResumeForward:
    """A forward to a peer was in flight at a restart: only the peer may say whether it
    took the job, so ask it again (same idempotency key)."""

    entry: Entry


@dataclass(frozen=True)
class Confirm:
    """Ask the agent, at its next heartbeat, whether it started the job's subjob (its
    commit went unanswered); the core holds the job out of placement until then."""

    agent_id: str
    job_id: str


class Loop(enum.Enum):
    QUEUE = "queue"
    MARKET = "market"


@dataclass(frozen=True)
class Wake:
    """Wake a loop: the queue's (capacity or work changed) or the market's."""

    loop: Loop


@dataclass(frozen=True)
class Count:
    """Count ``metric`` (a :class:`laminar_zone.metrics.ZoneMetrics` attribute) with
    ``label``; ``value`` is observed (a histogram) when given, else the counter goes up."""

    metric: str
    label: str = ""
    value: float | None = None


@dataclass(frozen=True)
class Retire:
    """The move's copy ``new`` started: retire ``old``, the copy it moved from
    (:meth:`ZoneCore.retire`, then stop it), after this transition."""

    entry: Entry
    old: zone_pb2.Placement
    new: zone_pb2.Placement


@dataclass(frozen=True)
class JudgeAtomized:
    """An atomized job's piece changed: its market (the atomizer) judges it."""

    entry: Entry


@dataclass(frozen=True)
class SumUpArray:
    """An element of this array ended: journal the array's record as it stands now
    (:meth:`ZoneCore.sum_up_array`)."""

    array_id: str


@dataclass(frozen=True)
class Forget:
    """The job is done and gone from memory: its other keepers (the atomizer) forget it."""

    job_id: str


Instruction = (
    Journal
    | Publish
    | Terminate
    | Release
    | Place
    | Forward
    | ResumeForward
    | Confirm
    | Wake
    | Count
    | Retire
    | JudgeAtomized
    | SumUpArray
    | Forget
)


# ==================================================================== events' data


@dataclass(frozen=True)
class Failure:
    """A call to an agent that failed, as the driver read it."""

    #: For people: the status and its details.
    reason: str
    #: Whether the agent may still have carried it out (no answer in time, a lost reply).
    unknown: bool = True
    #: Whether the agent refused the spec as bad input (retrying cannot help).
    refused_input: bool = False
    #: The status's details alone (what the agent said).
    details: str = ""


@dataclass(frozen=True)
class Member:
    """A gang member's lease, chosen by a gather: where it runs."""

    agent_id: str
    address: str
    slice_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class NewJob:
    """What the driver gives a new job: its id (drawn by the driver), its zone, and who
    asked."""

    job_id: str
    zone: str
    request_id: str = ""
    forwarded_from: str = ""
    #: The submitter's bearer token, in memory only (a peer that takes the job uses it).
    bearer: str = ""


@dataclass(frozen=True)
class TryPlan:
    """How a placement try gathers: members, their class, how long its leases live, and
    whether the probes carry the commit (one member: no second round trip)."""

    gang_size: int
    priority: int
    lease_ttl_seconds: float
    commit_on_probe: bool


class Next(enum.Enum):
    """What a placement try does after a step."""

    COMMIT = "commit"  # leases gathered: commit them
    RETRY = "retry"  # the commit was lost: gather again, once
    STOP = "stop"  # the try is over (queued, failed, or ended meanwhile)


#: A restarted router lists the journaled agents heard from within this long.
KNOWN_AGENT_SECONDS = 86400.0
#: What the router's gauges report, each (0 when none): job states, queued jobs' classes,
#: agents' statuses.
GAUGED_JOB_STATES = ("pending", "queued", "waiting", "job_running", "job_suspended")
GAUGED_CLASSES = ("critical", "production", "batch", "opportunistic")
GAUGED_AGENT_STATUSES = ("ready", "stale", "draining")


@dataclass(frozen=True)
class Census:
    """Live jobs by state, queued jobs by priority class, agents by status: what the
    router's gauges show, every gauged label present."""

    jobs: dict[str, int]
    queued: dict[str, int]
    agents: dict[str, int]


def pass_gap(least: float, spent: float) -> float:
    """Least time from one queue pass's start to the next's: ``least``
    (``queue.min_pass_seconds``), or twice the event loop's CPU the pass took (its own and
    what the loop ran while it awaited), whichever is longer: queue passes then take at
    most half the event loop, and placements, heartbeats and calls keep the rest."""
    return max(least, 2.0 * spent)


# ==================================================================== the core


def stop_copy(agent_id: str, subjob_id: str, why: str, context: str = "") -> Terminate:
    """Stop a copy of a subjob on ``agent_id`` that the router does not count on (its end
    records :attr:`EndCause.SUPERSEDED`); ``context`` says what found it, for people. The
    driver finds the agent's address as for any stop."""
    log.warning(
        "%sstopping subjob %s on agent %s: %s",
        f"{context}: " if context else "",
        subjob_id,
        agent_id,
        why,
    )
    stop = zone_pb2.Placement(subjob_id=subjob_id, agent_id=agent_id)
    return Terminate(stop, why, EndCause.SUPERSEDED)


def widened_for_memory(
    need: Demand, peak_bytes: int, available: Callable[[str], bool]
) -> Demand | None:
    """What a rigid job whose member was reclaimed for GPU memory asks on its retry: its
    declared memory raised to the peak the agent saw, and a MIG profile that holds it (the
    smallest by memory, then name, of its GPU's table for which ``available(profile)``: the
    zone has a slice of it for every member). None: the peak is within what it declared, or
    no profile holds it (it retries as it was)."""
    if peak_bytes <= need.gpu_memory_bytes:
        return None
    if not need.mig_profile:
        return replace(need, gpu_memory_bytes=peak_bytes)
    tables = [
        table
        for model, table in MIG_PROFILES.items()
        if need.mig_profile in table and (not need.gpu_model or need.gpu_model == model)
    ]
    fitting = sorted(
        {(p.memory_bytes, p.name) for table in tables for p in table.values()},
    )
    for memory, name in fitting:
        if memory >= peak_bytes and available(name):
            return replace(need, mig_profile=name, gpu_memory_bytes=peak_bytes)
    return None


def _no_pieces(resources: common_pb2.Resources) -> Demand:
    raise AssertionError("an atomized job's piece, but the core was given no demand_of")


class ZoneCore:
    """The router's job table and its transitions (see the module's docstring)."""

    def __init__(
        self,
        view: ZoneView,
        quotas: Mapping[str, Quota],
        *,
        atoms: Collection[str] = frozenset(),
        lookup: Callable[[str], zone_pb2.Job | None] = lambda job_id: None,
        recheck_seconds: float = 1.0,
        lost_after_seconds: float = 30.0,
        may_forward: bool = False,
        demand_of: Callable[[common_pb2.Resources], Demand] | None = None,
        units_done: Callable[[zone_pb2.Job], int] = lambda job: 0,
    ) -> None:
        """``atoms``: the atomized jobs (the market places them); ``lookup``: a job no
        longer live (its journaled record), for dependencies; ``recheck_seconds``: how
        often a time limit is looked at again; ``lost_after_seconds``: silence after which
        an agent's subjobs are lost; ``may_forward``: whether peer zones may take jobs;
        ``demand_of``: what a piece's resources ask (``laminar_base.wire.demand_of``, which
        reads the wire; the core imports no gRPC); ``units_done``: how far an atomized job
        got (``laminar_zone.atomizer.units_done``), for its reason while it waits."""
        self.view = view
        self.quotas = quotas
        self.atoms = atoms
        self.lookup = lookup
        self.lost_after_seconds = lost_after_seconds
        self.may_forward = may_forward
        self.demand_of = demand_of or _no_pieces
        self.units_done = units_done
        self.entries: dict[str, Entry] = {}
        #: What the live jobs hold, per tenant and per family, kept as they change.
        self.holdings = Holdings(self.demand_of, self._piece_ends)
        #: agent id -> job ids with live placements there
        self.by_agent: dict[str, set[str]] = {}
        #: agent id -> job ids whose commit there went unanswered (asked at its heartbeat)
        self.unconfirmed: dict[str, set[str]] = {}
        #: Subjobs being moved elsewhere (Airlock asked); reports.py starts and ends moves.
        self.readdressing: set[str] = set()
        #: Arrays not yet ended: array job id -> where its elements stand.
        self.arrays: dict[str, ArrayProgress] = {}
        #: Stops the agent has not taken yet: subjob id -> the copy, why, the cause.
        self.owed_stops: dict[str, tuple[zone_pb2.Placement, str, EndCause]] = {}
        #: The clock of jobs' time limits (spec.time_limit_seconds), read by the sweep.
        self.time_limits = TimeLimits(recheck_seconds=recheck_seconds)
        #: family -> priority of its blocked head (as the last queue pass left it)
        self.blocked_families: dict[str, int] = {}
        #: family -> jobs waiting in it, as the last queue pass left them plus those since.
        self.queued_per_family: dict[str, int] = {}
        #: family -> (its blocked head's priority class, expected start)
        self.blocked_starts: dict[str, tuple[int, float]] = {}
        #: family -> mean run seconds of its succeeded jobs (estimates of unknown runs)
        self.mean_run_seconds: dict[str, float] = {}

    # ---------------------------------------------------------------- small reads

    def track(self, entry: Entry, agent_id: str) -> None:
        """The job has (or is about to have) a live subjob on this agent."""
        self.by_agent.setdefault(agent_id, set()).add(entry.job.job_id)

    def job(self, job_id: str) -> zone_pb2.Job | None:
        """A job, live or journaled."""
        entry = self.entries.get(job_id)
        return entry.job if entry is not None else self.lookup(job_id)

    def live_job(self, job_id: str) -> zone_pb2.Job | None:
        entry = self.entries.get(job_id)
        return None if entry is None else entry.job

    def tenant_usage(self) -> tuple[dict[str, float], dict[str, int]]:
        """GPU units and memory each tenant's running and placing jobs hold (an atomized
        job holds what its live pieces hold: its spec asks nothing), summed in the order of
        ``entries``; kept as jobs change (:class:`~laminar_zone.holdings.Holdings`)."""
        return self.holdings.usage(self.entries, self.atoms)

    # ---------------------------------------------------------------- what changes holdings

    def set_state(self, entry: Entry, state: int) -> None:
        """Every job state the core writes goes through here: what a job holds (tenant
        usage, its family's releases) is read again from it."""
        entry.job.state = state  # type: ignore[assignment]
        self.holdings.touch(entry)

    def set_placing(self, entry: Entry, placing: bool) -> None:
        """A placement try begins or ends: a placing job counts as holding."""
        entry.placing = placing
        self.holdings.touch(entry)

    # ---------------------------------------------------------------- blocks

    def dependency_block(self, entry: Entry) -> str:
        """Why the job waits for its dependencies, ``!``-prefixed when one failed; or ""."""
        pending = []
        for dep in entry.job.spec.after:
            job = self.job(dep)
            if job is None or job.state == zone_pb2.JOB_SUCCEEDED:
                continue
            if job.state in TERMINAL_JOB_STATES:
                return f"!dependency {dep} ended {zone_pb2.JobState.Name(job.state).lower()}"
            pending.append(dep)
        if pending:
            return f"waiting for {', '.join(pending)} to succeed"
        return ""

    def array_block(self, entry: Entry) -> str:
        """Why an array element may not be under way yet (its array's %N limit), or "";
        an element that may go counts against the limit from then on."""
        job = entry.job
        progress = self.arrays.get(job.array_id) if job.array_id else None
        if progress is None or progress.may_start(job.job_id):
            return ""
        return (
            f"array {job.array_id}: {progress.limit} elements under way at once "
            f"(%{progress.limit}); this one starts when one of them ends"
        )

    def quota_block(self, entry: Entry) -> str:
        quota = self.quotas.get(entry.job.spec.tenant)
        if quota is None:
            return ""
        units, memory = self.tenant_usage()
        tenant = entry.job.spec.tenant
        return quota_block(entry.item, quota, units.get(tenant, 0.0), memory.get(tenant, 0))

    def behind_blocked_head(self, entry: Entry) -> bool:
        """Whether a job of its kind and no higher class waits blocked at the queue's head:
        then this one may not start before it (it waits its turn in the queue)."""
        head_priority = self.blocked_families.get(entry.need.family)
        priority = entry.job.spec.priority or common_pb2.BATCH
        return head_priority is not None and priority >= head_priority

    # ---------------------------------------------------------------- recovery

    def recover_array(self, array_job: zone_pb2.Job) -> None:
        """An array's journaled record: its counts of ended elements."""
        self.arrays[array_job.job_id] = ArrayProgress(
            array_job.array.total,
            array_job.array.limit,
            succeeded=array_job.array.succeeded,
            failed=array_job.array.failed,
            cancelled=array_job.array.cancelled,
        )

    def recovered(self, entry: Entry, atomized: bool, now_mono: float) -> list[Instruction]:
        """A live job read back from the journal after a restart (an ended one is loaded
        for a subjob still settling): where its copies may run, what it waits for, and
        what to start again."""
        job = entry.job
        self.admit(entry)
        ended = job.state in TERMINAL_JOB_STATES
        if job.array_id and job.state != zone_pb2.WAITING and not ended:
            # Under way at the crash (its array's record precedes it in the journal).
            progress = self.arrays.get(job.array_id)
            if progress is not None:
                progress.active.add(job.job_id)
        instructions: list[Instruction] = []
        for p in job.placements:  # earlier attempts too: a copy may still run
            if p.state in LIVE_SUBJOB_STATES:
                self.view.add_placeholder(p.agent_id, p.agent_address, now_mono)
                self.track(entry, p.agent_id)
                if p.reason == COMMITTING:
                    self.unconfirmed.setdefault(p.agent_id, set()).add(job.job_id)
        if not atomized:
            # A move the crash cut short after its copy started: the copy it moved from
            # is retired now, not left running until its own end.
            instructions += self.finish_moves(entry, entry.current())
            self.watch_time_limit(entry)
        # An atomized job bids only once every piece has ended, a rolled-back one's (an
        # earlier attempt) too; a rigid job's try waits for old copies itself (old_copy).
        counted = job.placements if atomized else entry.current()
        if job.state == zone_pb2.PENDING and not any(
            p.state in LIVE_SUBJOB_STATES for p in counted
        ):
            if job.forwarded_to.startswith("pending:"):
                instructions.append(ResumeForward(entry))
            elif job.job_id in self.atoms:
                self.set_state(entry, zone_pb2.QUEUED)  # it waits for the next window
            else:
                instructions.append(Place(entry))
        elif job.state in (zone_pb2.QUEUED, zone_pb2.WAITING):
            entry.queued_at = now_mono
        return instructions

    def recalled_agents(
        self, known: Mapping[str, tuple[str, float]], now_unix: float, now_mono: float
    ) -> list[str]:
        """After a restart, the journal's agents (id -> address, last heard, unix) heard
        from within :data:`KNOWN_AGENT_SECONDS` are listed, idle ones too, as stale
        placeholders until they heartbeat: drain, undrain and pressure then reach an agent
        that has not heartbeated since the restart (frozen, partitioned). Returns their
        ids; older ones are left out."""
        listed = []
        for agent_id, (address, seen_unix) in known.items():
            if now_unix - seen_unix < KNOWN_AGENT_SECONDS:
                self.view.add_placeholder(agent_id, address, now_mono)
                listed.append(agent_id)
        return listed

    # ---------------------------------------------------------------- submit and route

    def new_entries(
        self, spec: zone_pb2.JobSpec, need: Demand, new: NewJob, now_unix: float, now_mono: float
    ) -> list[Entry]:
        """A new job whose spec is valid (``need`` per member): refuse what this zone can
        never run, and make its record (an array: its record, then its elements', taken in
        order); nothing is kept yet."""
        largest = self.view.largest_gpus
        if need.gpus > largest > 0 and not self.may_forward:
            # No peer zone to send it to, and no host here was ever that large.
            raise InvalidArgument(
                f"{need.gpus} GPUs on one host, but the largest host of zone {new.zone} "
                f"has {largest}; ask for at most {largest} per member (a gang spreads "
                "members over hosts)",
                field="spec.resources.gpus",
            )
        array = parse_array(spec.array) if spec.array else None
        for dep in spec.after:
            if self.job(dep) is None:
                raise InvalidArgument(f"no job {dep!r} to wait for", field="spec.after")
        refusal = quota_never_fits(queue_item(spec, need), self.quotas.get(spec.tenant))
        if refusal:
            raise FailedPrecondition(refusal, field="spec.resources")
        forwarded = new.forwarded_from
        job = zone_pb2.Job(
            job_id=new.job_id,
            spec=spec,
            state=zone_pb2.PENDING,
            reason=f"forwarded from zone {forwarded}" if forwarded else "placing",
            submitted_unix=now_unix,
            zone=new.zone,
            client_request_id=new.request_id,
            attempts=1,
        )
        entries = [Entry(job=job, need=need, submitted_mono=now_mono, bearer=new.bearer)]
        if array is None:
            return entries
        for order, index in enumerate(array.indices):
            element_spec = zone_pb2.JobSpec()
            element_spec.CopyFrom(spec)
            element_spec.ClearField("array")
            element = zone_pb2.Job(
                job_id=element_id(job.job_id, index),
                spec=element_spec,
                state=zone_pb2.PENDING,
                reason="placing",
                submitted_unix=now_unix + order * 1e-6,  # the queue takes elements in order
                zone=new.zone,
                attempts=1,
                array_id=job.job_id,
                array_index=index,
            )
            entries.append(
                Entry(job=element, need=need, submitted_mono=now_mono, bearer=new.bearer)
            )
        return entries

    def admit_new(self, entry: Entry, now_unix: float) -> bool:
        """A new job of a Submit, before its journal write: an array's own record is kept
        as its elements' progress (summed up now) and is no work itself (False); any other
        job is live, to be routed (True)."""
        job = entry.job
        if job.spec.array:
            array = parse_array(job.spec.array)
            self.admit_array(job, len(array.indices), array.limit)
            self.sum_up_array(job, now_unix)
            return False
        self.admit(entry)
        return True

    def admit(self, entry: Entry) -> None:
        """A new job (or an array's element) is live; an array's own record is kept as
        its progress (:meth:`admit_array`)."""
        self.entries[entry.job.job_id] = entry
        self.holdings.admitted(entry.job.job_id)

    def admit_array(self, array_job: zone_pb2.Job, total: int, limit: int) -> None:
        self.arrays[array_job.job_id] = ArrayProgress(total, limit)

    def drop(self, job_id: str) -> None:
        """Forget a job whose submission was not journaled."""
        self.entries.pop(job_id, None)
        self.holdings.removed(job_id)
        self.arrays.pop(job_id, None)

    def route(self, entry: Entry, allow_forward: bool, now_mono: float) -> list[Instruction]:
        """Decide a new job's first state: waiting for dependencies, its array's limit or
        quota; waiting for a window; queued (too large, or behind a blocked head of its
        family); or placing (here, or a peer zone's by flow splitting). ``allow_forward``:
        whether the request lets a peer take it and the router has a way to peers."""
        job = entry.job
        allow_forward = allow_forward and _may_leave(job)
        blocks = (
            (Reason.DEPENDENCY, self.dependency_block),
            (Reason.ARRAY_LIMIT, self.array_block),
            (Reason.QUOTA, self.quota_block),
        )
        for reason, block in blocks:
            waiting = block(entry)
            if waiting:
                self.set_state(entry, zone_pb2.WAITING)
                set_reason(job, reason, waiting)
                entry.queued_at = now_mono
                return []
        if job.job_id in self.atoms:
            if allow_forward:
                # Flow splitting picks its zone as for a rigid job (kick): a peer, or a
                # window here.
                set_reason(job, Reason.PLACING, "routing: flow splitting picks its zone")
                return []
            return self._await_window(entry, now_mono)
        gang = max(1, job.spec.gang_size)
        # counts() is O(agents): read only for a gang, not on every Submit's hot path.
        if gang > 1 and (members_total := self.view.counts(entry.need).members_total) < gang:
            self.set_state(entry, zone_pb2.QUEUED)
            set_reason(
                job,
                Reason.TOO_LARGE,
                f"the zone cannot hold this gang even when idle: its ready hosts hold "
                f"{members_total} of {gang} x {entry.need.label()}; waiting for more hosts",
            )
            entry.queued_at = now_mono
            return []
        if not (allow_forward and self.may_forward) and self.behind_blocked_head(entry):
            self._queue_behind_head(entry, now_mono)
            return []
        # A peer zone may take it (flow splitting decides first); if it stays here behind
        # a blocked head, forwarded() queues it then.
        set_reason(job, Reason.PLACING, job.reason or "placing")
        return []

    def kick(self, entry: Entry, allow_forward: bool) -> list[Instruction]:
        """After a new job is journaled: start what :meth:`route` decided."""
        if entry.job.state == zone_pb2.PENDING:
            forward = allow_forward and _may_leave(entry.job)
            return [Forward(entry) if forward else Place(entry)]
        return [Wake(Loop.QUEUE), Publish(entry)]

    def forwarded(self, entry: Entry, taken: bool, now_mono: float) -> list[Instruction]:
        """A peer zone answered a forward: it took the job, or the job stays here."""
        if taken:
            return [Forget(entry.job.job_id)]  # the peer's market runs it
        if entry.job.job_id not in self.atoms and self.behind_blocked_head(entry):
            self._queue_behind_head(entry, now_mono)  # it stays here: after the blocked head
            return [Journal((entry,)), Wake(Loop.QUEUE)]
        return self.keep_here(entry, now_mono)

    def keep_here(self, entry: Entry, now_mono: float) -> list[Instruction]:
        """No peer took ``entry``: an atomized job waits here for a window, a rigid one is
        placed."""
        if entry.job.job_id in self.atoms:
            return [*self._await_window(entry, now_mono), Journal((entry,)), Publish(entry)]
        return [Place(entry)]

    def _await_window(self, entry: Entry, now_mono: float) -> list[Instruction]:
        """An atomized job stays in this zone: it waits for a window (the market starts it)."""
        job = entry.job
        self.set_state(entry, zone_pb2.QUEUED)
        set_reason(
            job,
            Reason.WINDOW,
            f"waiting for a window; {self.units_done(job)} of "
            f"{job.spec.atomization.total_units} units done",
        )
        entry.queued_at = now_mono
        return [Wake(Loop.MARKET)]

    def _queue_behind_head(self, entry: Entry, now_mono: float) -> None:
        self.set_state(entry, zone_pb2.QUEUED)
        set_reason(
            entry.job,
            Reason.PRIORITY,
            "behind queued work of the same kind; waiting for the next queue pass",
        )
        entry.queued_at = now_mono

    # ---------------------------------------------------------------- a placement try

    def may_place(self, entry: Entry) -> bool:
        """Whether a placement try may begin: none under way, the job not ended, and no copy
        of its current attempt live (one recovered mid-commit waits for its agent's word;
        a retry or a failed commit starts a new attempt first)."""
        if entry.placing or entry.job.state in TERMINAL_JOB_STATES:
            return False
        attempt = entry.job.attempts
        return not any(
            p.attempt == attempt and p.state in LIVE_SUBJOB_STATES for p in entry.job.placements
        )

    def plan_try(self, entry: Entry, lease_ttl_seconds: float, budget_seconds: float) -> TryPlan:
        """A gang's leases outlive the whole probe budget (the first member's lease must
        still hold when the last one is found); one member commits on probe."""
        gang = max(1, entry.job.spec.gang_size)
        ttl = lease_ttl_seconds
        if gang > 1:
            ttl = max(ttl, budget_seconds + 2 * ttl)
        priority = entry.job.spec.priority or common_pb2.BATCH
        return TryPlan(gang, priority, ttl, commit_on_probe=gang == 1)

    def old_copy(self, entry: Entry, now_mono: float) -> tuple[bool, list[Instruction]]:
        """A copy from an earlier attempt may still run (being stopped, or its commit went
        unanswered): the job waits in the queue until its agent reports the end, confirms
        it never started, or is declared lost. Returns whether the job waits."""
        job = entry.job
        old = next(
            (
                p
                for p in job.placements
                if p.state in LIVE_SUBJOB_STATES and p.attempt != job.attempts
            ),
            None,
        )
        if old is None:
            return False, []
        reason = (
            f"waiting for agent {old.agent_id} to confirm whether it started subjob "
            f"{old.subjob_id} (its commit went unanswered) before placing the job again"
            if old.reason == COMMITTING
            else f"waiting for subjob {old.subjob_id} of an earlier attempt to stop on "
            f"{old.agent_id} before placing the job again"
        )
        if job.state == zone_pb2.QUEUED and job.reason == reason:
            return True, []
        self.set_state(entry, zone_pb2.QUEUED)
        set_reason(job, Reason.PREVIOUS_COPY, reason)
        entry.queued_at = now_mono
        return True, [Journal((entry,)), Publish(entry)]

    def probe_intent(
        self, entry: Entry, agent_id: str, address: str
    ) -> tuple[zone_pb2.Placement, list[Instruction]]:
        """Commit on probe: the member may start on ``agent_id`` with the probe about to go
        out; it is journaled as committing first."""
        job = entry.job
        # Counted now: the member may end, and its job be judged and published as ended,
        # before this try returns.
        job.probes += 1
        placement = job.placements.add(
            subjob_id=rigid_subjob_id(job.job_id, job.attempts, 0),
            agent_id=agent_id,
            agent_address=address,
            member=0,
            state=common_pb2.STARTING,
            reason=COMMITTING,
            attempt=job.attempts,
        )
        self.track(entry, agent_id)
        if job.state not in TERMINAL_JOB_STATES:
            self.set_state(entry, zone_pb2.PENDING)
            set_reason(job, Reason.PLACING, "probing with commit")
        # Committed before the probe leaves; watchers hear of the answer (running, queued).
        return placement, [Journal((entry,), grouped=True, quiet=True)]

    def probe_bounced(self, entry: Entry, placement: zone_pb2.Placement) -> None:
        """The host bounced the probe that carried the commit: it surely did not start."""
        job = entry.job
        job.placements.remove(placement)
        if not any(p.agent_id == placement.agent_id for p in job.placements):
            self.by_agent.get(placement.agent_id, set()).discard(job.job_id)
        # Journaled with the next change: a router that restarts before then finds a
        # committing placement and asks that agent, which knows no such subjob.

    def gathered(
        self,
        entry: Entry,
        chosen: Sequence[Any] | None,
        failures: Sequence[Failure],
        reasons: Sequence[str],
        now_mono: float,
        now_unix: float,
    ) -> tuple[Next, list[Instruction]]:
        """A gather ended without commit on probe: ``chosen`` leases (one per member), or
        none with the probes' ``reasons`` and the calls that failed."""
        job = entry.job
        if job.state in TERMINAL_JOB_STATES:  # cancelled while probing
            return Next.STOP, [Release(tuple(chosen))] if chosen else []
        if chosen:
            return Next.COMMIT, []
        refused = [f for f in failures if f.refused_input]
        if refused:
            why = f"the agent refused the job: {refused[0].reason}"
            ended = self.finish(entry, zone_pb2.JOB_FAILED, why, now_unix, Reason.REFUSED)
            return Next.STOP, [*ended, Journal((entry,))]
        instructions: list[Instruction] = [Count("placements", "queued")]
        instructions += self.enqueue(entry, reasons, now_mono, now_unix)
        return Next.STOP, instructions

    def begin_commit(self, entry: Entry, members: Sequence[Member]) -> list[Instruction]:
        """Journal the intent of every member before any Commit goes out."""
        job = entry.job
        attempt = job.attempts
        for index, member in enumerate(members):
            job.placements.append(
                zone_pb2.Placement(
                    subjob_id=rigid_subjob_id(job.job_id, attempt, index),
                    agent_id=member.agent_id,
                    agent_address=member.address,
                    slice_ids=list(member.slice_ids),
                    member=index,
                    state=common_pb2.STARTING,
                    reason=COMMITTING,
                    attempt=attempt,
                )
            )
            self.track(entry, member.agent_id)
        self.set_state(entry, zone_pb2.PENDING)
        set_reason(job, Reason.PLACING, "committing leases")
        return [Journal((entry,))]

    def committed(
        self, entry: Entry, answers: Sequence[Failure | None], now_unix: float
    ) -> tuple[bool, list[Instruction]]:
        """Every member's Commit was answered (``None``: taken; the driver recorded the
        reply) or failed. One failure rolls the gang back (:meth:`roll_back`) and the job
        retries; a spec the agent refused fails it. Returns whether the job runs."""
        job = entry.job
        failures = [a for a in answers if a is not None]
        if not failures:
            now_running(job, now_unix)
            self.holdings.touch(entry)
            return True, [Journal((entry,))]
        why = "; ".join(f.reason for f in failures)
        log.warning("job %s: commit failed (%s); rolling back all members", job.job_id, why)
        current = entry.current()
        unknown = {
            current[member].subjob_id
            for member, answer in enumerate(answers)
            if answer is not None and answer.unknown
        }
        instructions = self.roll_back(entry, current, unknown, why, now_unix)
        # A job cancelled while its commits were out stays so (the rollback still stops or
        # confirms what may run; their ends are reported to an ended job).
        if job.state not in TERMINAL_JOB_STATES:
            set_reason(job, Reason.RETRYING, f"commit failed: {why}")
            if any(f.refused_input for f in failures):
                # The agent refused the spec itself (a workdir or command it cannot use).
                # Hosts are meant to be alike, and each retry left one more failed subjob on
                # the agent (a retry storm of several a second): the job fails for good.
                instructions += self.finish(
                    entry,
                    zone_pb2.JOB_FAILED,
                    f"the agent refused the job: {why}",
                    now_unix,
                    Reason.REFUSED,
                )
        instructions.append(Journal((entry,)))
        return False, instructions

    def piece_rolled_back(
        self,
        entry: Entry,
        members: Sequence[zone_pb2.Placement],
        unanswered: Container[str],
        why: str,
        now_unix: float,
    ) -> list[Instruction]:
        """An atomized job's piece did not start on every member (a gang's member bounced,
        or a commit went unanswered, a single piece's too): its members are rolled back as
        a rigid gang's are (:meth:`roll_back`), and the job bids again once every one of
        them has ended (the atomizer's evaluate: a live member holds it out of the market).
        A single piece's unanswered commit is so confirmed with its agent, never taken as
        not started: a piece started beside it would run the same units twice."""
        job = entry.job
        log.warning(
            "job %s: piece did not start on every member (%s); rolling back %d member(s)",
            job.job_id,
            why,
            len(members),
        )
        instructions = self.roll_back(entry, members, unanswered, why, now_unix)
        # A job cancelled while the piece's commits were out stays so, and never bids
        # again; the rollback still stops or confirms what may run.
        if job.state not in TERMINAL_JOB_STATES:
            stops = sum(isinstance(i, Terminate) for i in instructions)
            asks = sum(isinstance(i, Confirm) for i in instructions)
            self.set_state(entry, zone_pb2.PENDING)
            set_reason(
                job,
                Reason.PLACING,
                f"{'gang ' if len(members) > 1 else ''}rollback: {why}; stopping {stops} "
                f"member(s), asking {asks} agent(s) whether they started theirs, then "
                "bidding again",
            )
        # Journaled before any stop leaves: a restart finds the attempt ended.
        return [Journal((entry,)), *instructions]

    def roll_back(
        self,
        entry: Entry,
        members: Sequence[zone_pb2.Placement],
        unanswered: Container[str],
        why: str,
        now_unix: float,
    ) -> list[Instruction]:
        """A gang's commit failed on a member (``why``): nothing of this attempt runs, for
        a rigid gang and an atomized gang's piece alike. Each live member is

        - started: stopped (``COMMIT_FAILED``, free). Its record stays live until its agent
          reports the end, and the job is not placed again before that;
        - of unknown outcome (its subjob id in ``unanswered``: the commit's reply was lost,
          the agent may have started it): confirmed with its agent at its next heartbeat,
          not stopped blindly. A stop sent now could reach the agent before the commit
          does, be answered "no such subjob" (nothing owed) and be lost, and the agent is
          the one that just did not answer. The record stays live, holding the job out
          of placement, until the agent says; if it started, it is stopped then
          (:meth:`confirmed`: the job moved on), owed until the agent takes the stop; if
          the commit lands after the agent said no, its heartbeat's list of live subjobs
          stops it (:meth:`reconcile`);
        - refused (bounced, busy, bad input): it never started, and ends now
          (``FAILED``, ``COMMIT_FAILED``).

        The attempt ends (``attempts`` + 1), so the router counts on none of its members
        whatever an agent reports later (:func:`~laminar_zone.lifecycle.judge_report`)."""
        job = entry.job
        gang = len(members) > 1
        instructions: list[Instruction] = []
        for p in members:
            if p.state not in LIVE_SUBJOB_STATES:
                continue
            if p.reason != COMMITTING:
                instructions.append(
                    Terminate(
                        p,
                        f"gang rollback: another member failed to commit ({why})",
                        EndCause.COMMIT_FAILED,
                    )
                )
            elif p.subjob_id in unanswered:
                instructions.append(self._confirm(p.agent_id, job.job_id))
            else:
                p.state = common_pb2.FAILED
                p.end_cause = EndCause.COMMIT_FAILED.wire
                p.reason = (
                    f"gang rollback: never started ({why})" if gang else f"commit failed: {why}"
                )
                p.ended_unix = now_unix
        job.attempts += 1
        return instructions

    def probe_committed(
        self,
        entry: Entry,
        placement: zone_pb2.Placement,
        reply: common_pb2.Subjob | None,
        slice_ids: Sequence[str],
        unsure: str,
        now_unix: float,
    ) -> tuple[bool, list[Instruction]]:
        """The end of a try whose probes carried the commit: the member runs (its probe's
        ``reply`` says so, on ``slice_ids``), or may run where a probe got no answer
        (``unsure``: confirmed with that agent before the job is placed again, as for a
        commit of unknown outcome). Returns whether the job was placed."""
        job = entry.job
        if placement.state in ENDED_SUBJOB_STATES:
            # Its end was reported before the probe's reply came (or instead of it: a lost
            # reply): it ran, and the report already judged the job.
            if reply is not None:
                apply_start_reply(placement, reply)
            return True, [Journal((entry,), grouped=True)]  # its end is journaled
        if reply is not None:
            del placement.slice_ids[:]
            placement.slice_ids.extend(slice_ids)
            copy_subjob(placement, reply)
            if job.state in TERMINAL_JOB_STATES:  # cancelled while it started: stop it
                return False, [
                    Journal((entry,)),
                    Terminate(placement, "cancelled while starting", EndCause.CANCELLED),
                ]
            now_running(job, now_unix)
            self.holdings.touch(entry)
            return True, [Journal((entry,), grouped=True)]  # the intent recovers it
        why = unsure or "no answer"
        log.warning("job %s: a probe carrying the commit got no answer (%s)", job.job_id, why)
        confirm = self._confirm(placement.agent_id, job.job_id)
        job.attempts += 1
        if job.state not in TERMINAL_JOB_STATES:
            set_reason(job, Reason.RETRYING, f"commit failed: {why}")
        return False, [confirm, Journal((entry,))]

    def commit_lost(
        self, entry: Entry, may_retry: bool, now_mono: float, now_unix: float
    ) -> tuple[Next, list[Instruction]]:
        """A try's commit did not place the job: a lost commit (a lease expired on a busy
        agent) is transient, so the try gathers once more (``may_retry``); after that the
        job waits in the queue."""
        job = entry.job
        instructions: list[Instruction] = [Count("placements", "commit_failed")]
        if job.state in TERMINAL_JOB_STATES:
            return Next.STOP, instructions
        if not may_retry:
            return Next.STOP, instructions + self.enqueue(entry, [job.reason], now_mono, now_unix)
        return Next.RETRY, instructions

    def placed(
        self,
        entry: Entry,
        from_queue: bool,
        tried_seconds: float,
        now_mono: float,
        probes: int,
        bounces: int,
    ) -> list[Instruction]:
        """The try placed the job: count it."""
        job = entry.job
        latency = now_mono - (entry.queued_at if from_queue else entry.submitted_mono)
        priority = common_pb2.PriorityClass.Name(job.spec.priority or common_pb2.BATCH).lower()
        instructions: list[Instruction] = [
            Count("placements", "placed"),
            Count("placement_seconds", value=tried_seconds),
            Count("probes_per_placement", value=probes),
            Count("bounces_per_placement", value=bounces),
        ]
        if from_queue:
            instructions.append(Count("queue_seconds", priority, latency))
        return instructions

    def _confirm(self, agent_id: str, job_id: str) -> Confirm:
        self.unconfirmed.setdefault(agent_id, set()).add(job_id)
        return Confirm(agent_id, job_id)

    def enqueue(
        self, entry: Entry, reasons: Sequence[str], now_mono: float, now_unix: float
    ) -> list[Instruction]:
        """The try found no room: the job waits in the queue, saying why."""
        job = entry.job
        if job.state in TERMINAL_JOB_STATES:
            return []
        self.set_state(entry, zone_pb2.QUEUED)
        if reasons:
            log.info("job %s queued after %d probe(s): %s", job.job_id, job.probes, reasons[-1])
        entry.queued_at = now_mono
        self._explain_one(entry, now_unix)
        self.blocked_families.setdefault(entry.need.family, job.spec.priority or common_pb2.BATCH)
        return [Journal((entry,)), Wake(Loop.QUEUE)]

    def _explain_one(self, entry: Entry, now_unix: float) -> None:
        """Why a job just queued waits. Its position is behind the jobs of its family the
        last queue pass left waiting and those queued since (the next pass places it
        exactly): counting them here was a scan of every job, per job queued."""
        counts = self.view.counts(entry.need)
        family = entry.need.family
        position = self.queued_per_family.get(family, 0) + 1
        self.queued_per_family[family] = position
        entry.job.queue_position = position
        why = why_waiting(
            entry.need,
            gang_size=max(1, entry.job.spec.gang_size),
            hosts_ready=counts.ready,
            hosts_matching=counts.matching,
            hosts_fitting=counts.fitting,
            position=position,
            expected_start=None,
            now=now_unix,
            members_total=counts.members_total,
        )
        set_reason(entry.job, Reason[why.token.upper()], why.text)

    # ---------------------------------------------------------------- a job's attempt

    def evaluate(self, entry: Entry, now_unix: float) -> list[Instruction]:
        """Derive the job's state from its current attempt's subjobs: finish it, stop the
        gang's other members and retry, or show it running or suspended."""
        job = entry.job
        if job.state in TERMINAL_JOB_STATES:
            return []
        if job.job_id in self.atoms:
            return [JudgeAtomized(entry)]
        current = entry.current()
        copies = member_states(current)
        instructions: list[Instruction] = self.finish_moves(entry, current)
        verdict = judge_attempt(copies, job.spec.gang_size, job.retries_used, job.spec.max_retries)
        if verdict.outcome is Outcome.SUCCEEDED:
            run = max(p.run_seconds for p in current)
            family = entry.need.family
            old = self.mean_run_seconds.get(family)
            self.mean_run_seconds[family] = run if old is None else 0.8 * old + 0.2 * run
            instructions += self.finish(
                entry, zone_pb2.JOB_SUCCEEDED, "all subjobs succeeded", now_unix
            )
        elif verdict.outcome in (Outcome.RETRY, Outcome.FAILED):
            assert verdict.failed_member is not None
            first = current[verdict.failed_member]
            for index in verdict.stop:
                instructions.append(
                    Terminate(
                        current[index],
                        f"gang member {first.member} ended: {first.reason}",
                        EndCause.GANG_STOPPED,
                    )
                )
            what = (
                f"subjob {first.subjob_id} on {first.agent_id} ended "
                f"{state_name(first.state)}: {first.reason}"
            )
            if verdict.outcome is Outcome.FAILED:
                limited = end_cause(first.end_cause) is EndCause.TIME_LIMIT
                code = Reason.TIME_LIMIT if limited else None
                return instructions + self.finish(entry, zone_pb2.JOB_FAILED, what, now_unix, code)
            if verdict.counted:
                job.retries_used += 1
            if end_cause(first.end_cause) in (EndCause.RECLAIMED, EndCause.EXITED):
                # Reclaimed for memory, or failed on its own (a CUDA OOM is an exit): a
                # peak past what it declared was the declaration's error either way.
                self.widen_for_memory(entry, first.peak_gpu_memory_bytes)
            job.attempts += 1
            self.set_state(entry, zone_pb2.PENDING)
            counted = f"retry {job.retries_used} of {job.spec.max_retries}"
            set_reason(
                job,
                Reason.RETRYING,
                f"retrying ({counted if verdict.counted else 'not counted'}) after {what}",
            )
            instructions += [Count("retries"), Place(entry)]
        elif verdict.outcome is Outcome.RUNNING:
            suspended = verdict.suspended
            self.set_state(entry, zone_pb2.JOB_SUSPENDED if suspended else zone_pb2.JOB_RUNNING)
            job.started_unix = job.started_unix or now_unix
            where = sorted({p.agent_id for p in current if p.state == common_pb2.SUSPENDED})
            set_reason(
                job,
                Reason.SUSPENDED if suspended else Reason.NONE,
                f"{suspended} subjob(s) suspended by Airlock (GPU memory pressure on "
                f"{', '.join(where)})"
                if suspended
                else "",
            )
            self.watch_time_limit(entry)
        return instructions

    def widen_for_memory(self, entry: Entry, peak_bytes: int) -> None:
        """A member was reclaimed, or failed, having used ``peak_bytes`` of GPU memory: the
        retry asks for that much (:func:`widened_for_memory`; nothing where the peak is
        within the declaration), written into the job's spec too (the journal's record,
        what a recovered router reads)."""
        gang = max(1, entry.job.spec.gang_size)

        def available(profile: str) -> bool:
            return self.view.counts(Demand(mig_profile=profile)).members_total >= gang

        need = widened_for_memory(entry.need, peak_bytes, available)
        if need is None:
            return
        log.info(
            "job %s: ended past its declared GPU memory, at %d bytes; its retry asks %s",
            entry.job.job_id,
            peak_bytes,
            f"MIG {need.mig_profile}" if need.mig_profile else f"{need.gpu_memory_bytes} bytes",
        )
        entry.need = need
        self.holdings.touch(entry)
        resources = entry.job.spec.resources
        resources.gpu_memory_bytes = need.gpu_memory_bytes
        resources.mig_profile = need.mig_profile

    def watch_time_limit(self, entry: Entry) -> None:
        if entry.job.job_id not in self.atoms:  # pieces end with their windows
            self.time_limits.watch(entry.job, entry.current())

    def finish_moves(self, entry: Entry, current: list[zone_pb2.Placement]) -> list[Instruction]:
        """A move's copy started (it runs, or already ended) while the copy it moved away
        from still lives (the move was cut short by a restart, or its copy's report came
        first): retire the old one."""
        return [
            Retire(entry, current[index], current[by])
            for index, by in taken_over(member_states(current)).items()
            if current[index].state in LIVE_SUBJOB_STATES
        ]

    def retire(
        self, entry: Entry, old: zone_pb2.Placement, new: zone_pb2.Placement, now_unix: float
    ) -> list[Instruction]:
        """The copy ``new`` runs: the one it moved away from ends (a free retry's cause)."""
        if old.state not in LIVE_SUBJOB_STATES:
            return []  # retired already (the move's own task and an event both saw it run)
        why = f"{READDRESSED} moved to {new.agent_id} after Airlock suspended it on {old.agent_id}"
        old.state = common_pb2.KILLED
        old.end_cause = EndCause.READDRESSED.wire
        old.reason = why
        old.ended_unix = now_unix
        instructions: list[Instruction] = []
        if new.state in ENDED_SUBJOB_STATES:
            # The copy ended before its move was done: judge the job now.
            instructions += self.evaluate(entry, now_unix)
        log.info("job %s: subjob %s %s as %s", entry.job.job_id, old.subjob_id, why, new.subjob_id)
        # The old copy is stopped first: a retry's Place, awaited inline by the driver,
        # must not keep the suspended copy alive for a whole placement try.
        return [
            Journal((entry,)),
            Count("readdressed"),
            Terminate(old, why, EndCause.READDRESSED),
            *instructions,
        ]

    # ---------------------------------------------------------------- ends

    def finish(
        self,
        entry: Entry,
        state: int,
        reason: str,
        now_unix: float,
        code: Reason | None = None,
    ) -> list[Instruction]:
        """End the job in ``state``; ``code`` (default: by the state) says why for scripts."""
        job = entry.job
        self.set_state(entry, state)
        set_reason(job, END_REASONS.get(state, Reason.NONE) if code is None else code, reason)
        job.ended_unix = now_unix
        job.queue_position = 0
        job.expected_start_unix = 0
        name = zone_pb2.JobState.Name(state).lower()
        log.info("job %s %s: %s", job.job_id, name, reason)
        instructions: list[Instruction] = [Count("finished", name)]
        if job.array_id:
            progress = self.arrays.get(job.array_id)
            if progress is not None:
                progress.element_ended(job)
                instructions.append(SumUpArray(job.array_id))
        instructions.append(Wake(Loop.QUEUE))
        return instructions

    def sum_up_array(self, array_job: zone_pb2.Job, now_unix: float) -> None:
        """Write where the array's elements stand into its record; end it with its last."""
        progress = self.arrays.get(array_job.job_id)
        if progress is None:
            return
        running = any(
            (e := self.entries.get(element)) is not None and e.job.state in RUNNING_JOB_STATES
            for element in progress.active
        )
        progress.sum_up(array_job, any_running=running, now_unix=now_unix)
        if progress.done:
            del self.arrays[array_job.job_id]

    def forget_if_done(self, entry: Entry) -> list[Instruction]:
        """An ended job with no live subjob leaves memory (the journal keeps it); once:
        an entry no longer in memory (or replaced) gives nothing."""
        job = entry.job
        if job.state not in TERMINAL_JOB_STATES or self.entries.get(job.job_id) is not entry:
            return []
        if any(p.state in LIVE_SUBJOB_STATES for p in job.placements):
            return []
        for p in job.placements:
            jobs = self.by_agent.get(p.agent_id)
            if jobs is not None:
                jobs.discard(job.job_id)
        self.time_limits.forget(p.subjob_id for p in job.placements)
        # Kept in memory while dependents may ask; the journal has it anyway.
        self.entries.pop(job.job_id, None)
        self.holdings.removed(job.job_id)
        return [Forget(job.job_id)]

    def array_elements(self, array_id: str) -> list[zone_pb2.Job]:
        """The elements of an array not ended yet (a cancel of the array cancels them)."""
        return [
            e.job
            for e in self.entries.values()
            if e.job.array_id == array_id and e.job.state not in TERMINAL_JOB_STATES
        ]

    def cancel_job(self, job: zone_pb2.Job, reason: str, now_unix: float) -> list[Instruction]:
        """A user's cancel of ``job`` (as the journal or memory has it): an array cancels
        each of its elements not ended yet (its own record sums them up; an element that
        ended meanwhile is not refused), any other job itself (:meth:`cancel`). A cancelled
        job with nothing left running leaves memory at once; one with copies still running
        leaves when their ends are reported. The stops come last, after every element's
        journal write, so a driver sends them together rather than one after another."""
        targets = self.array_elements(job.job_id) if job.job_id in self.arrays else [job]
        instructions: list[Instruction] = []
        for target in targets:
            instructions += self.cancel(target, reason, now_unix)
            entry = self.entries.get(target.job_id)
            if entry is not None:
                instructions += self.forget_if_done(entry)
        return [i for i in instructions if not isinstance(i, Terminate)] + [
            i for i in instructions if isinstance(i, Terminate)
        ]

    def cancel(self, job: zone_pb2.Job, reason: str, now_unix: float) -> list[Instruction]:
        """Cancel a job (``job``: as the journal or memory has it): it ends now, and every
        live subjob of its attempt is stopped. Cancelling twice is harmless."""
        if job.state == zone_pb2.JOB_CANCELLED:
            # A resend whose first reply was lost, or two users at once, get the job.
            return []
        entry = self.entries.get(job.job_id)
        if entry is None or job.state in TERMINAL_JOB_STATES:
            raise FailedPrecondition(
                f"job {job.job_id} has already ended ({zone_pb2.JobState.Name(job.state).lower()})",
                field="job_id",
            )
        why = f"cancelled: {reason or 'by request'}"
        instructions = self.finish(entry, zone_pb2.JOB_CANCELLED, why, now_unix)
        instructions.append(Journal((entry,)))
        instructions += [
            Terminate(p, why, EndCause.CANCELLED)
            for p in entry.current()
            if p.state in LIVE_SUBJOB_STATES
        ]
        return instructions

    # ---------------------------------------------------------------- stops owed

    def owe_stop(self, stop: zone_pb2.Placement, why: str, cause: EndCause) -> None:
        """The agent did not take a stop (it did not answer): the sweep asks again."""
        self.owed_stops[stop.subjob_id] = (stop, why, cause)

    def stop_taken(self, subjob_id: str) -> None:
        """Taken, ended already, or unknown to the agent: nothing more is owed."""
        self.owed_stops.pop(subjob_id, None)

    # ---------------------------------------------------------------- agents' reports

    def report(
        self,
        agent_id: str,
        subjob: common_pb2.Subjob,
        ended_job: zone_pb2.Job | None,
        now_unix: float,
    ) -> tuple[Entry | None, bool, list[Instruction]]:
        """An agent's event on one of its subjobs, judged by
        :func:`~laminar_zone.lifecycle.judge_report` and carried into the record.
        ``ended_job``: the journal's record when the job is no longer live. Returns the
        live entry whose record changed (to be evaluated), whether ``ended_job`` changed
        (to be journaled), and what to do."""
        subjob_id = subjob.spec.subjob_id
        job_id = subjob.spec.job_id or job_of(subjob_id)
        entry = self.entries.get(job_id)
        job = entry.job if entry is not None else ended_job
        p = placement_of(job, subjob_id)
        verdict = judge_report(
            Record(p.agent_id, p.state, p.attempt) if p is not None else None,
            agent_id,
            job.attempts if job is not None else 0,
            job is None or job.state in TERMINAL_JOB_STATES,
            subjob.state,
        )
        if verdict is Report.IGNORE:
            if p is not None and p.agent_id != agent_id:
                log.warning(
                    "ignoring an event for subjob %s from agent %s: it is placed on %s",
                    subjob_id,
                    agent_id,
                    p.agent_id,
                )
            return None, False, []
        if verdict is Report.STOP:
            why = (
                f"superseded: the router replaced this copy ({p.reason})"
                if p is not None
                else "superseded: its job has ended or is unknown to the router"
            )
            return None, False, [stop_copy(agent_id, subjob_id, why)]
        assert job is not None and p is not None
        instructions: list[Instruction] = []
        if verdict is Report.TRUE_END:
            if entry is None:
                note_true_end(p, subjob)
            else:
                instructions += self.true_end(entry, p, subjob, now_unix)
        else:
            copy_subjob(p, subjob)
            if verdict is Report.APPLY_AND_STOP:
                instructions.append(stop_copy(agent_id, subjob_id, "superseded: the job moved on"))
        return entry, entry is None, instructions

    def true_end(
        self, entry: Entry, p: zone_pb2.Placement, subjob: common_pb2.Subjob, now_unix: float
    ) -> list[Instruction]:
        """A copy declared LOST while its agent was out of touch reports how it really
        ended: the record says so. If it succeeded and the job has not ended, it wins:
        the retry still running is stopped, the retry spent on it is given back, and the
        job succeeds (first finisher wins; gangs, which retry as a whole, excepted)."""
        note_true_end(p, subjob)
        job = entry.job
        log.info(
            "subjob %s of job %s declared lost ended %s on %s",
            p.subjob_id,
            job.job_id,
            state_name(subjob.state),
            p.agent_id,
        )
        if (
            subjob.state != common_pb2.SUCCEEDED
            or job.state in TERMINAL_JOB_STATES
            or max(1, job.spec.gang_size) > 1
            or job.job_id in self.atoms
        ):
            return []
        why = f"superseded: copy {p.subjob_id} on {p.agent_id} succeeded first"
        instructions: list[Instruction] = [
            Terminate(other, why, EndCause.SUPERSEDED)
            for other in job.placements
            if other is not p and other.state in LIVE_SUBJOB_STATES
        ]
        if job.retries_used > 0 and p.attempt < job.attempts:
            job.retries_used -= 1
        return instructions + self.finish(
            entry,
            zone_pb2.JOB_SUCCEEDED,
            f"subjob {p.subjob_id} succeeded (reported late)",
            now_unix,
        )

    def reconcile(self, agent_id: str, live_ids: Sequence[str]) -> list[Instruction]:
        """The agent lists the subjobs it runs: stop each copy this router no longer
        counts on (declared lost and retried, superseded, of an ended or unknown job),
        as :func:`~laminar_zone.lifecycle.judge_report` decides for a live report."""
        instructions: list[Instruction] = []
        for subjob_id in live_ids:
            entry = self.entries.get(job_of(subjob_id))
            p = placement_of(entry.job if entry is not None else None, subjob_id)
            verdict = judge_report(
                Record(p.agent_id, p.state, p.attempt) if p is not None else None,
                agent_id,
                entry.job.attempts if entry is not None else 0,
                entry is None or entry.job.state in TERMINAL_JOB_STATES,
                common_pb2.RUNNING,
            )
            if verdict in (Report.STOP, Report.APPLY_AND_STOP):
                why = (
                    f"superseded: the router replaced this copy ({p.reason})"
                    if p is not None and p.state in ENDED_SUBJOB_STATES
                    else "superseded: the job moved on or is unknown to the router"
                )
                instructions.append(
                    stop_copy(agent_id, subjob_id, why, f"reconciling agent {agent_id}")
                )
        return instructions

    def to_confirm(self, agent_id: str) -> list[str]:
        """The agent heartbeats: the jobs with commits of unknown outcome on it, to ask it
        about (they leave the set; :meth:`reconfirm` puts back what could not be asked)."""
        return sorted(self.unconfirmed.pop(agent_id, set()))

    @staticmethod
    def is_unsure(p: zone_pb2.Placement, agent_id: str) -> bool:
        """Whether ``p`` is a commit on ``agent_id`` whose outcome is not known yet."""
        return p.agent_id == agent_id and p.reason == COMMITTING and p.state in LIVE_SUBJOB_STATES

    def reconfirm(self, agent_id: str, job_id: str) -> None:
        """The agent could not say (no answer): ask again at its next heartbeat."""
        self.unconfirmed.setdefault(agent_id, set()).add(job_id)

    def confirmed(
        self,
        entry: Entry,
        p: zone_pb2.Placement,
        subjob: common_pb2.Subjob | None,
        now_unix: float,
    ) -> list[Instruction]:
        """The agent says whether it started a commit of unknown outcome: ``subjob`` as it
        stands, or None (it knows no such subjob: the commit never started it). A copy
        the job no longer counts on is stopped."""
        job = entry.job
        if subjob is None:
            index = list(job.placements).index(p)
            # A move's copy that never started leaves the member where it was.
            moved = moves_from_live_copy(job.placements[:index], p)
            p.state = common_pb2.FAILED
            p.end_cause = (EndCause.READDRESSED if moved else EndCause.COMMIT_UNCONFIRMED).wire
            p.reason = "commit unconfirmed: the agent never started it"
            p.ended_unix = now_unix
            return []
        copy_subjob(p, subjob)
        moved_on = p.attempt != job.attempts or job.state in TERMINAL_JOB_STATES
        if moved_on and p.state in LIVE_SUBJOB_STATES:
            return [stop_copy(p.agent_id, p.subjob_id, "superseded: the job moved on")]
        return []

    # ---------------------------------------------------------------- re-addressing

    def readdress(self, agent_id: str, subjob_id: str) -> tuple[Entry | None, list[Instruction]]:
        """Airlock on ``agent_id`` asks to move a long-suspended subjob. Returns the job's
        entry when a copy is to be placed elsewhere (the old one is retired once the copy
        runs: :meth:`move_committed`), or what to do instead: an atomized piece goes back
        to the market (it resumes from its checkpoint); a gang member moves only with its
        gang, by retry; a member already moving waits."""
        job_id = job_of(subjob_id)
        entry = self.entries.get(job_id)
        if entry is None or subjob_id in self.readdressing:
            return None, []
        placement = next((p for p in entry.current() if p.subjob_id == subjob_id), None)
        if placement is None or placement.agent_id != agent_id:
            return None, []
        if placement.state not in LIVE_SUBJOB_STATES:
            return None, []
        if any(
            p is not placement and p.member == placement.member and p.state in LIVE_SUBJOB_STATES
            for p in entry.current()
        ):
            return None, []  # a move of this member is under way (or awaits its agent's word)
        if job_id in self.atoms:  # back to the market: it resumes from its checkpoint
            # (an atomized gang's other members stop with it: laminar_zone.atomizer)
            why = f"{READDRESSED} Airlock suspended it too long on {agent_id}; back to the market"
            return None, [Terminate(placement, why, EndCause.READDRESSED)]
        if max(1, entry.job.spec.gang_size) > 1:
            log.info("not re-addressing %s: gang members move together only by retry", subjob_id)
            return None, []
        self.readdressing.add(subjob_id)
        return entry, []

    def move_to(
        self, entry: Entry, old: zone_pb2.Placement, member: Member
    ) -> tuple[zone_pb2.Placement, int, list[Instruction]]:
        """A host was found for a move of ``old``: journal its copy as committing there.
        Returns the copy, how many moves of the member came before it, and what to do."""
        job = entry.job
        moves = sum(
            1 for p in job.placements if p.member == old.member and p.attempt == old.attempt
        )
        job.placements.append(
            zone_pb2.Placement(
                subjob_id=rigid_subjob_id(job.job_id, old.attempt, old.member, moves),
                agent_id=member.agent_id,
                agent_address=member.address,
                slice_ids=list(member.slice_ids),
                member=old.member,
                state=common_pb2.STARTING,
                reason=COMMITTING,
                attempt=old.attempt,
            )
        )
        self.track(entry, member.agent_id)
        return job.placements[-1], moves, [Journal((entry,))]

    def move_committed(
        self,
        entry: Entry,
        old: zone_pb2.Placement,
        new: zone_pb2.Placement,
        failure: Failure | None,
        now_unix: float,
    ) -> list[Instruction]:
        """The Commit of a move's copy was answered (``failure`` None) or failed: the
        copy runs, and the old one is retired; or the agent may run it (confirmed at its
        next report, the copy counting as live meanwhile, so the member is not moved
        again); or it surely did not start, and the member stays where it was."""
        if failure is not None and new.reason == COMMITTING:
            if failure.unknown:
                return [self._confirm(new.agent_id, entry.job.job_id), Journal((entry,))]
            new.state = common_pb2.FAILED
            new.end_cause = EndCause.READDRESSED.wire
            new.reason = f"{READDRESSED} commit of the copy failed: {failure.details}"
            return [Journal((entry,))]
        # Answered, or its agent reported it before the lost reply: it ran, the move is done.
        return self.retire(entry, old, new, now_unix)

    def moved(self, subjob_id: str) -> None:
        """A move of ``subjob_id`` is over (done, or given up)."""
        self.readdressing.discard(subjob_id)

    # ---------------------------------------------------------------- the sweep

    def census(self) -> Census:
        """The live jobs and the agents counted for the gauges (O(jobs + agents))."""
        jobs = dict.fromkeys(GAUGED_JOB_STATES, 0)
        queued = dict.fromkeys(GAUGED_CLASSES, 0)
        agents = dict.fromkeys(GAUGED_AGENT_STATUSES, 0)
        for e in self.entries.values():
            state = zone_pb2.JobState.Name(e.job.state).lower()
            if state in jobs:
                jobs[state] += 1
            if e.job.state == zone_pb2.QUEUED:
                priority = e.job.spec.priority or common_pb2.BATCH
                label = common_pb2.PriorityClass.Name(priority).lower()
                if label in queued:
                    queued[label] += 1
        for r in self.view.agents.values():
            if r.status.value in agents:
                agents[r.status.value] += 1
        return Census(jobs, queued, agents)

    def sweep(self, now_mono: float, now_unix: float) -> list[Instruction]:
        """Once a period: stale agents, time limits, stops owed, lost agents' subjobs."""
        for stale in self.view.sweep(now_mono):
            log.warning(
                "agent %s stale: no heartbeat for %.1f s; no more probes to it",
                stale.agent_id,
                now_mono - stale.last_heartbeat,
            )
        instructions: list[Instruction] = []
        for placement, why in self.time_limits.due(now_unix, self.live_job):
            log.info("job %s: subjob %s %s", job_of(placement.subjob_id), placement.subjob_id, why)
            instructions.append(Terminate(placement, why, EndCause.TIME_LIMIT))
        for subjob_id, (stop, why, cause) in list(self.owed_stops.items()):
            record = self.view.agents.get(stop.agent_id)
            if record is not None and not record.is_stale:
                # A stale agent's fence stops its work; when it is back, reconciling does.
                del self.owed_stops[subjob_id]
                instructions.append(Terminate(stop, why, cause))
        return instructions + self.agents_lost(now_mono, now_unix)

    def agents_lost(self, now_mono: float, now_unix: float) -> list[Instruction]:
        """Agents silent past ``lost_after_seconds``: their live subjobs are lost, and each
        job is judged again."""
        lost_after = self.lost_after_seconds
        instructions: list[Instruction] = []
        for agent_id, job_ids in list(self.by_agent.items()):
            record = self.view.agents.get(agent_id)
            if record is None or not record.is_stale:
                continue
            silent = now_mono - record.last_heartbeat
            if silent < lost_after:
                continue
            for job_id in list(job_ids):
                entry = self.entries.get(job_id)
                if entry is None:
                    job_ids.discard(job_id)
                    continue
                placements = entry.job.placements
                for i, p in enumerate(placements):
                    if p.agent_id == agent_id and p.state in LIVE_SUBJOB_STATES:
                        p.state = common_pb2.LOST
                        # A move's copy never confirmed (its fence stopped it if it ran)
                        # leaves the member where it was, as when its agent says it never
                        # started it; any other copy is the member, lost.
                        moved = p.reason == COMMITTING and moves_from_live_copy(placements[:i], p)
                        p.end_cause = (EndCause.READDRESSED if moved else EndCause.LOST).wire
                        p.reason = (
                            f"agent {agent_id} silent for {silent:.0f} s "
                            f"(membership.lost_after_seconds={lost_after:g})"
                        )
                        p.ended_unix = now_unix
                job_ids.discard(job_id)
                instructions += self.evaluate(entry, now_unix)
                instructions.append(Journal((entry,)))  # the driver forgets it if done
        return instructions

    # ---------------------------------------------------------------- the queue

    def resolve_waiting(self, now_unix: float) -> list[Instruction]:
        """Dependencies: fail jobs whose dependency failed, release those whose all succeeded."""
        instructions: list[Instruction] = []
        for entry in list(self.entries.values()):
            if entry.job.state != zone_pb2.WAITING:
                continue
            block = self.dependency_block(entry)
            if block.startswith("!"):
                instructions += self.finish(
                    entry, zone_pb2.JOB_FAILED, block[1:], now_unix, Reason.DEPENDENCY_FAILED
                )
                instructions.append(Journal((entry,)))
            elif not block and reason_of(entry.job.reason_code) is Reason.DEPENDENCY:
                set_reason(entry.job, Reason.PLACING, "dependencies succeeded")
        return instructions

    def waiting(self) -> list[Entry]:
        """The jobs a queue pass walks (waiting or queued, no try under way)."""
        return [
            e
            for e in self.entries.values()
            if e.job.state in (zone_pb2.QUEUED, zone_pb2.WAITING) and not e.placing
        ]

    def idle_pass(self) -> None:
        """A pass found nothing waiting: no family is blocked."""
        self.blocked_families.clear()
        self.blocked_starts.clear()
        self.queued_per_family.clear()

    def begin_pass(
        self,
        waiting: list[Entry],
        units: dict[str, float],
        memory: dict[str, int],
        shares: Mapping[str, float],
        now_unix: float,
        now_mono: float,
        *,
        backfill: bool,
    ) -> PassBook:
        """A queue pass over ``waiting`` (sorted here) with the tenants' usage."""
        waiting.sort(key=lambda e: order_key(e.item, units, shares))
        walk = QueueWalk(now_unix, backfill=backfill)
        return PassBook(self, waiting, units, memory, now_unix, now_mono, walk)

    def end_pass(self, book: PassBook) -> list[Instruction]:
        """The pass is over: each family's blocked head and positions as it left them."""
        self.queued_per_family = book.queued_per_family
        self.blocked_families = {
            family: self.entries[head.job_id].job.spec.priority or common_pb2.BATCH
            for family, head in book.walk.heads.items()
            if head.job_id in self.entries
        }
        #: When each family's blocked head is expected to start: windows of that family
        #: end there, so atomized work backfills it without delaying it (EASY).
        self.blocked_starts = {
            family: (self.blocked_families[family], head.expected_start)
            for family, head in book.walk.heads.items()
            if head.expected_start is not None and family in self.blocked_families
        }
        return [*book.instructions, Journal(tuple(book.changed))]

    def expected_start(
        self,
        entry: Entry,
        units_ahead: float,
        now_unix: float,
        releases: dict[str, ReleaseCurve],
        free_now: dict[Demand, float],
    ) -> float | None:
        """When ``entry`` may start: from what of its need is free now (in GPU units) and
        the expected ends of running work of its family. ``releases`` holds each family's
        ends and ``free_now`` each demand's free units, made once per pass (each family's
        curve from :class:`~laminar_zone.holdings.Holdings`, which keeps the running jobs'
        ends as they change; the view read once per demand, not per waiting job) and
        dropped when the pass starts a job of that family."""
        family = entry.need.family
        free = free_now.get(entry.need)
        if free is None:
            # What the head could use now, members that fit a ready host as its summary
            # shows (fragments too small for one member count for nothing): EASY's shadow
            # time counts them beside the running jobs' ends.
            free = free_now[entry.need] = self.view.free_for(entry.need) * entry.need.gpu_units
        if family not in releases:
            releases[family] = self.holdings.release_curve(
                family, self.mean_run_seconds.get(family, 0.0), self.entries, self.atoms
            )
        return releases[family].start(now_unix, free, units_ahead, entry.item.units)

    def _piece_ends(self, entry: Entry, family: str) -> list[tuple[float, float]]:
        """(window end, GPU units) of the atomized job's live pieces on ``family``'s slices:
        its pieces give their slices back when their windows end (a window offered past a
        blocked head's start is cut there: the market's class_windows), not when the whole
        job is expected to end."""
        out = []
        for p in entry.job.placements:
            if p.state in LIVE_SUBJOB_STATES and p.window_end_unix > 0:
                need = self.demand_of(p.resources)
                if need.family == family:
                    out.append((p.window_end_unix, need.gpu_units))
        return out


@dataclass
class PassBook:
    """One queue pass's bookkeeping: which jobs the walk takes (:meth:`admit`), why each
    one left waits (:meth:`waited`), and what a start changes (:meth:`started`); the
    driver drives :func:`laminar_zone.queue.class_order` with these and places the jobs it
    starts."""

    core: ZoneCore
    waiting: list[Entry]
    units: dict[str, float]
    memory: dict[str, int]
    now_unix: float
    now_mono: float
    walk: QueueWalk
    changed: list[Entry] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    releases: dict[str, ReleaseCurve] = field(default_factory=dict)  # per family, this pass
    free_now: dict[Demand, float] = field(default_factory=dict)  # per demand, this pass
    queued_per_family: dict[str, int] = field(default_factory=dict)

    def admit(self, entry: Entry) -> Admit:
        """Whether ``entry`` is walked in this pass, and whether it could ever fit."""
        core = self.core
        job = entry.job
        if job.state in TERMINAL_JOB_STATES or entry.placing:
            return Admit.SKIP
        if job.state == zone_pb2.WAITING and core.dependency_block(entry):
            return Admit.SKIP
        held = core.array_block(entry) if job.state == zone_pb2.WAITING else ""
        if held:
            if job.reason != held:
                set_reason(job, Reason.ARRAY_LIMIT, held)
                self.changed.append(entry)
            return Admit.SKIP
        waits, instructions = core.old_copy(entry, self.now_mono)
        if waits:
            self.instructions += instructions
            return Admit.SKIP
        if job.job_id in core.atoms:  # placed by the market, not by this walk
            if job.state == zone_pb2.WAITING:
                self.core.set_state(entry, zone_pb2.QUEUED)
                set_reason(job, Reason.WINDOW, "dependencies succeeded; waiting for a window")
                self.changed.append(entry)
                self.instructions.append(Wake(Loop.MARKET))
            return Admit.SKIP
        tenant = job.spec.tenant
        blocked = quota_block(
            entry.item,
            core.quotas.get(tenant),
            self.units.get(tenant, 0.0),
            self.memory.get(tenant, 0),
        )
        if blocked:
            if job.state != zone_pb2.WAITING or job.reason != blocked:
                self.core.set_state(entry, zone_pb2.WAITING)
                set_reason(job, Reason.QUOTA, blocked)
                self.changed.append(entry)
            return Admit.SKIP
        # A job the zone cannot hold even when idle blocks nobody (the view keeps its
        # counts per demand between changes).
        never = core.view.counts(entry.need).members_total < entry.item.gang_size
        return Admit.NEVER if never else Admit.WALK

    def may_start(self, entry: Entry, rng: random.Random) -> bool:
        """Whether the walk's start of ``entry`` is tried now (some host may fit it); if
        so, it is placing from the queue."""
        if not self.core.view.any_fits(entry.need, rng):
            return False
        self.core.set_state(entry, zone_pb2.PENDING)
        set_reason(entry.job, Reason.PLACING, "placing from the queue")
        return True

    def started(self, entry: Entry, placed: bool) -> bool:
        """The try of a started job ended; returns whether the walk counts it started."""
        if not placed and entry.job.state in TERMINAL_JOB_STATES:
            # It ended while being placed (cancelled, or it ran and its end was reported
            # before the placement returned): it waits for nothing.
            return True
        if placed:
            tenant = entry.job.spec.tenant
            self.units[tenant] = self.units.get(tenant, 0.0) + entry.item.units
            self.memory[tenant] = self.memory.get(tenant, 0) + entry.item.memory_bytes
            self.releases.pop(entry.need.family, None)
            family = entry.need.family  # the room it took was its family's
            self.free_now = {n: f for n, f in self.free_now.items() if n.family != family}
            return True
        return False

    def expected_start(self, entry: Entry, units_ahead: float) -> float | None:
        return self.core.expected_start(
            entry, units_ahead, self.now_unix, self.releases, self.free_now
        )

    def waited(self, entry: Entry, wait: Waiting) -> None:
        """The walk left ``entry`` waiting: say why, where, and until when."""
        job = entry.job
        hosts = self.core.view.counts(entry.need)
        why = why_waiting(
            entry.need,
            gang_size=entry.item.gang_size,
            hosts_ready=hosts.ready,
            hosts_matching=hosts.matching,
            hosts_fitting=hosts.fitting,
            position=wait.position,
            expected_start=wait.expected_start,
            now=self.now_unix,
            blocked_by=wait.blocked_by if hosts.fitting else "",
            members_total=hosts.members_total,
        )
        self.queued_per_family[entry.need.family] = wait.position
        if (
            job.state != zone_pb2.QUEUED
            or job.reason != why.text
            or job.queue_position != wait.position
        ):
            self.core.set_state(entry, zone_pb2.QUEUED)
            set_reason(job, Reason[why.token.upper()], why.text)
            job.queue_position = wait.position
            job.expected_start_unix = wait.expected_start or 0.0
            self.changed.append(entry)


def _may_leave(job: zone_pb2.Job) -> bool:
    """Flow splitting sends rigid and atomized jobs alike to peers (an atomized job then
    bids for the peer's windows); an array's elements stay with their array."""
    return not job.array_id


def journaled(instructions: Iterable[Instruction]) -> list[Entry]:
    """The entries the instructions journal, in order (tests read them)."""
    return [e for i in instructions if isinstance(i, Journal) for e in i.entries]
