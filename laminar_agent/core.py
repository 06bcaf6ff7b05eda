"""The agent's decisions, free of I/O: subjob lifecycle, arbitration batches, preemption, leases.

:class:`AgentCore` owns the host's :class:`~laminar_agent.ledger.Ledger` and the live
subjobs' lifecycle. The daemon (:class:`laminar_agent.node.Node` and the drivers it wires)
feeds it events as method calls (a batch of probes, a commit, a launch, an exit, a signal,
an agent restart) with the time passed in, and carries out the instructions it returns
(:class:`laminar_agent.carrier.Carrier`): journal rows and events, lease rows, kills,
Airlock action records. The core never awaits, reads the clock, touches
a file or a process, or draws randomness; a test drives it directly (``tests/agent/
test_agent_core.py``).

Lifecycle of a subjob on this agent::

    commit -> STARTING --launched--> RUNNING <--suspend/resume--> SUSPENDED
                  |                    |                             |
                  +-- launch failed, exit, lost at restart (any live state) --> ended

Ended states (SUCCEEDED, FAILED, KILLED, LOST) are never left, and each end carries one
:class:`~laminar_base.causes.EndCause`. A stop (TERMINATE) marks a live subjob with its cause
at once; however it then exits, it ends KILLED with that cause. An event its state does not
allow (an exit after the end, a resume of an ended or a stopping subjob, a second launch) is
refused with :class:`TransitionRefused` and changes nothing.

The core keeps only live subjobs; the journal keeps every row. After an agent restart the
core is rebuilt from the journal's live rows (:meth:`AgentCore.restore`), then
:meth:`AgentCore.recover` decides from what the driver found (its process check, its exit
record) whether each is re-adopted, recorded as ended while the agent was down, or lost.

What this does not cover: building protobuf messages, checking request fields, checkpoint
reading (units done) and timing the batch window; those are the driver's.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from laminar_agent.ledger import (
    Allocation,
    Bounced,
    FreeWindow,
    Granted,
    LeaseRecord,
    Ledger,
    ProbeOrder,
)
from laminar_agent.preemption import HolderFacts, PreemptionPlan, plan_preemption, work_seconds
from laminar_airlock.levels import Level, Marks
from laminar_airlock.policy import PRIORITY_NAMES
from laminar_base.causes import ENDED_SUBJOB_STATE_NAMES, EndCause, cause_from_token
from laminar_base.demand import Demand
from laminar_base.errors import FailedPrecondition, LaminarError

STARTING = "STARTING"
RUNNING = "RUNNING"
SUSPENDED = "SUSPENDED"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
KILLED = "KILLED"
LOST = "LOST"
#: Journal state names of a subjob that holds capacity and may still change.
LIVE_STATES = (STARTING, RUNNING, SUSPENDED)
#: Journal state names a subjob never leaves.
TERMINAL_STATES = ENDED_SUBJOB_STATE_NAMES
#: Reason prefix, for people, of a subjob its shim stopped because the agent's fence
#: expired; its cause is ``EndCause.FENCED``.
FENCED = "fenced:"
#: Journal reason prefix, for people, of a subjob the agent is stopping; whether it is being
#: stopped (and why) is its journaled end cause, set as the stop begins.
TERMINATING = "terminating: "
#: How long a preemption waits for its victims beyond their grace period.
PREEMPT_MARGIN_SECONDS = 10.0
#: Least time between two heartbeats that subjob events woke (``zone.heartbeat_event_gap_
#: seconds``): a burst's starts and ends share one heartbeat.
EVENT_GAP_SECONDS = 0.1


def event_hold(now: float, woken_at: float, gap: float = EVENT_GAP_SECONDS) -> float:
    """How long a heartbeat a subjob event wakes at ``now`` waits before it goes: the rest
    of ``gap`` since the last heartbeat an event woke (``woken_at``, when it went), so the
    first event after a quieter spell goes at once. The agent's heartbeat loop and the
    simulator's hosts (``sim load``) both ask this."""
    return max(0.0, gap - (now - woken_at))


#: The reason journaled when a lease is committed and its subjob is about to start.
COMMITTED_REASON = "lease committed"


class TransitionRefused(FailedPrecondition):
    """The subjob's state does not allow this event; nothing was changed."""


# -- instructions: what the driver carries out, in order --------------------------------------


@dataclass(frozen=True)
class NewRow:
    """Journal a new subjob row (the driver adds the spec and device ids)."""

    subjob_id: str
    job_id: str
    state: str
    reason: str
    lease: LeaseRecord
    created_unix: float


@dataclass(frozen=True)
class WriteRow:
    """Update journaled fields of a subjob row."""

    subjob_id: str
    fields: Mapping[str, object]


@dataclass(frozen=True)
class RecordEvent:
    """Journal a transition as an event (the router acknowledges it) and wake the watchers."""

    subjob_id: str
    state: str
    reason: str
    at_unix: float


@dataclass(frozen=True)
class KeepLease:
    """A lease is held. With a subjob id it is the committed form recovery re-adopts, and
    the driver journals it; without one (granted, not yet committed) it lives in memory
    only: nothing reads it back, and it dies with the agent as its TTL would end it, so
    journaling it (and deleting it again) was two commits per probe for nothing."""

    lease: LeaseRecord
    subjob_id: str
    at_unix: float


@dataclass(frozen=True)
class DropLease:
    """A lease is gone: it expired, was released, or its subjob ended. ``journaled``: it
    was committed, so it has a journal row to delete (an uncommitted one has none)."""

    lease_id: str
    job_id: str
    why: str
    journaled: bool = True


@dataclass(frozen=True)
class Ended:
    """A subjob ended (already journaled by the instructions before it): free what the
    driver attached to it and say so."""

    subjob_id: str
    state: str
    cause: EndCause
    reason: str


@dataclass(frozen=True)
class Kill:
    """Kill a subjob's process group at once (its capacity cannot be accounted for)."""

    subjob_id: str


@dataclass(frozen=True)
class RecordReclaim:
    """Journal (and count) one Airlock reclaim a preemption decided."""

    subjob_id: str
    slice_id: str
    reason: str
    bytes_freed: int
    dry_run: bool
    work_lost_gpu_seconds: float
    cause: EndCause = EndCause.PREEMPTED


Instruction = NewRow | WriteRow | RecordEvent | KeepLease | DropLease | Ended | Kill | RecordReclaim


def merge_row_writes(instructions: Iterable[Instruction]) -> list[Instruction]:
    """Adjacent writes to one subjob's row as one write (a transition's state after the
    figures of a launch or an end), the later value of a field winning, as it would: the
    driver then issues one UPDATE where it would have issued two."""
    merged: list[Instruction] = []
    for ins in instructions:
        last = merged[-1] if merged else None
        if (
            isinstance(ins, WriteRow)
            and isinstance(last, WriteRow)
            and last.subjob_id == ins.subjob_id
        ):
            merged[-1] = WriteRow(ins.subjob_id, {**last.fields, **ins.fields})
        else:
            merged.append(ins)
    return merged


# -- events' facts ----------------------------------------------------------------------------


class ExitReport(Protocol):
    """How a subjob's process ended (``laminar_agent.executor.ExitInfo`` is one)."""

    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...
    @property
    def fenced(self) -> bool: ...
    @property
    def error(self) -> str: ...


class ExitFigures(ExitReport, Protocol):
    """An exit with the figures journaled at the end (``ExitInfo`` is one)."""

    @property
    def peak_rss_bytes(self) -> int: ...
    @property
    def run_seconds(self) -> float: ...
    @property
    def ended_unix(self) -> float: ...


@dataclass(frozen=True)
class EndDecision:
    """The end state, its cause and the reason for people."""

    state: str
    cause: EndCause
    reason: str


#: What a subjob's end reason adds when its exit record was found at an agent restart.
ENDED_WHILE_DOWN = "ended while the agent was down"


@dataclass(frozen=True)
class RestartFacts:
    """What an agent restart's driver found of one restored subjob (its I/O, done before
    the core decides): whether its journaled pid is still its process (the executor's
    check, which re-attaches to it), and its exit record if it left one."""

    #: Its journaled pid is its process and that runs (or awaits its launcher's record).
    is_running: bool
    #: Its exit record, when its process ended while the agent was down; None: none found.
    exit: ExitReport | None = None
    #: What it holds here, held again if it runs: its lease's allocations and priority,
    #: and the demand whose host CPU and memory share it takes (as at its probe).
    allocations: tuple[Allocation, ...] = ()
    lease_priority: int = 0
    demand: Demand | None = None


class Restarted(Enum):
    """What an agent restart made of a restored subjob."""

    #: Its process runs: its capacity is held again.
    READOPTED = "re-adopted"
    #: Its process runs but its capacity cannot be held (the inventory changed): stopped.
    UNHELD = "stopped: its capacity cannot be held"
    #: Its process ended while the agent was down: ended as its exit record says.
    ENDED = "ended while the agent was down"
    #: Gone without a record: lost.
    LOST = "lost"


@dataclass(frozen=True)
class RestartOutcome:
    """:meth:`AgentCore.recover`'s answer: the fate, the instructions to carry out and, for
    :attr:`Restarted.ENDED`, the end to record with the exit's figures (the driver adds what
    an atomized subjob's checkpoint covers, which it reads, then :meth:`AgentCore.exited`)."""

    fate: Restarted
    instructions: list[Instruction]
    end: EndDecision | None = None


@dataclass(frozen=True)
class RestoredSubjob:
    """A live journal row, as the core needs it after an agent restart."""

    subjob_id: str
    job_id: str
    state: str
    reason: str
    lease_id: str
    slice_ids: tuple[str, ...]
    priority: int
    lifecycle: int
    started_unix: float
    end_cause: str = ""
    peak_gpu_memory_bytes: int = 0
    #: A SUSPENDED row: when its suspension began (its SUSPENDED event); 0 if unknown.
    stopped_since_unix: float = 0.0


@dataclass
class LiveSubjob:
    """A subjob holding capacity on this host, as far as decisions need it."""

    subjob_id: str
    job_id: str
    state: str
    lease_id: str
    slice_ids: tuple[str, ...]
    priority: int
    lifecycle: int
    started_unix: float = 0.0
    #: Cause of a stop under way (TERMINATE sent); UNSPECIFIED while none is.
    stop_cause: EndCause = EndCause.UNSPECIFIED
    #: Why it is being stopped, for people.
    stop_reason: str = ""
    #: Peak GPU memory Airlock's polls saw (journaled at the end).
    peak_gpu_memory_bytes: int = 0
    #: The latest poll's reading of its GPU memory.
    gpu_memory_bytes: int = 0
    #: While suspended: its GPU memory at the last reading before the suspend, what a
    #: resume takes back (a checkpointed process reads 0 on its GPU meanwhile).
    resume_bytes: int = 0
    #: Suspends carried out in this run of the agent (each SUSPEND counts, a repeated one
    #: too): Airlock notes the count at its own suspend, so a later one (an operator's)
    #: is told from it.
    suspensions: int = 0
    #: Airlock is moving its CUDA state to host memory (cuda-checkpoint) before its suspend:
    #: a SIGSTOP now would stall the copy (the tool never answers a stopped process).
    is_checkpointing: bool = False
    #: Seconds it spent suspended in suspensions that ended (this run of the agent).
    stopped_seconds: float = 0.0
    #: While suspended, by anyone: when the suspension began (wall clock); else 0.
    stopped_since_unix: float = 0.0

    @property
    def is_stopping(self) -> bool:
        return self.stop_cause is not EndCause.UNSPECIFIED

    def work_seconds(self, now_unix: float) -> float:
        """The work a restart would lose (:func:`~laminar_agent.preemption.work_seconds`)."""
        return work_seconds(
            self.started_unix, self.stopped_seconds, self.stopped_since_unix, now_unix
        )


@dataclass(frozen=True)
class GpuPressure:
    """Airlock's latest poll of one GPU or MIG instance: its level and its memory."""

    level: Level
    used_bytes: int
    total_bytes: int


_GIB = 1024**3


@dataclass(frozen=True)
class Preemption:
    """What a preemption for one probe does: reclaim ``victims`` while ``slice_ids`` are
    reserved for it, or nothing and ``bounce``. ``actions`` are journaled either way."""

    victims: tuple[str, ...] = ()
    slice_ids: tuple[str, ...] = ()
    #: Victim -> the reason its stop journals, for people.
    reasons: Mapping[str, str] = field(default_factory=dict)
    actions: tuple[RecordReclaim, ...] = ()
    #: How long the victims' capacity may take to come back before the probe bounces.
    budget_seconds: float = 0.0
    bounce: Bounced | None = None
    #: The probe's priority class, for people.
    priority_name: str = ""


# -- the core ---------------------------------------------------------------------------------


class AgentCore:
    """The live subjobs and the ledger of one agent, and every decision on them."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._live: dict[str, LiveSubjob] = {}
        self._arrivals = itertools.count()
        #: Draining: every probe that is not a dry run bounces (not retryable here).
        self.is_draining = False
        #: Airlock's latest poll by slice name (a GPU's, or a MIG instance's): what new
        #: work is admitted by (:meth:`pressure_refusal`).
        self.pressure: dict[str, GpuPressure] = {}
        #: Airlock's critical mark (``airlock.critical_ratio``): new work may not take a GPU
        #: to it.
        self.critical_ratio = Marks().critical_ratio

    # -- queries

    @property
    def live_states(self) -> dict[str, str]:
        """Live subjob id -> state name (a copy)."""
        return {sid: s.state for sid, s in self._live.items()}

    @property
    def stopping(self) -> frozenset[str]:
        """Live subjobs being stopped (TERMINATE sent): never chosen as victims again."""
        return frozenset(sid for sid, s in self._live.items() if s.is_stopping)

    def subjob(self, subjob_id: str) -> LiveSubjob | None:
        return self._live.get(subjob_id)

    def holding(self, slice_ids: Collection[str]) -> list[str]:
        """Live subjobs holding any of ``slice_ids`` that are not being stopped already, in
        the order they became live (a failed GPU's victims)."""
        return [
            sid
            for sid, s in self._live.items()
            if not s.is_stopping and any(slice_id in slice_ids for slice_id in s.slice_ids)
        ]

    def busy_until(self, expected_seconds: Mapping[str, float]) -> dict[str, float]:
        """Slice id -> when its holders are expected to end (started + declared
        ``expected_seconds``, by subjob id), the latest holder on a shared slice. A holder
        that declared nothing, or has not started, opens no window."""
        until: dict[str, float] = {}
        for subjob_id, expected in expected_seconds.items():
            live = self._live.get(subjob_id)
            if expected <= 0 or live is None or live.started_unix <= 0:
                continue
            end = live.started_unix + expected
            for slice_id in live.slice_ids:
                until[slice_id] = max(until.get(slice_id, 0.0), end)
        return until

    def windows(
        self,
        now_unix: float,
        expected_seconds: Mapping[str, float],
        max_windows: int,
        pressured: Collection[str] = (),
    ) -> list[FreeWindow]:
        """The windows a heartbeat advertises (at most ``max_windows``, the ledger's order):
        busy slices open when their holders expect to end (:meth:`busy_until`). A slice
        under memory pressure (``pressured``: slice or GPU names) advertises none: new
        work there would only be Airlock's next victim."""
        busy_until = self.busy_until(expected_seconds)
        return [
            w
            for w in self.ledger.windows(now_unix, busy_until, max_windows)
            if w.slice.slice_id not in pressured
            and w.slice.slice_id.split("/", 1)[0] not in pressured
        ]

    def capacity_ratios(self) -> tuple[float, float]:
        """Allocated and stranded shares of the host's GPU capacity: stranded is the idle
        part of a slice that is partly used (a share too small for most work)."""
        total = committed = stranded = 0
        for s in self.ledger.slices.values():
            used = self.ledger.usage(s.slice_id)[0]
            total += s.capacity_milli
            committed += used
            if 0 < used < s.capacity_milli:
                stranded += s.capacity_milli - used
        return (committed / total, stranded / total) if total else (0.0, 0.0)

    def peak_gpu_memory_bytes(self, subjob_id: str) -> int:
        live = self._live.get(subjob_id)
        return live.peak_gpu_memory_bytes if live is not None else 0

    def _require(self, subjob_id: str, *states: str) -> LiveSubjob:
        live = self._live.get(subjob_id)
        if live is None:
            raise TransitionRefused(
                f"subjob {subjob_id} is not live on this agent (it has ended)", field="subjob_id"
            )
        if states and live.state not in states:
            raise TransitionRefused(
                f"subjob {subjob_id} is {live.state.lower()}, not {' or '.join(states).lower()}",
                field="subjob_id",
            )
        return live

    # -- leases and arbitration

    def next_arrival(self) -> int:
        """Arrival order of a probe: the last tie-break of a batch."""
        return next(self._arrivals)

    def admit(self, probe_id: str, agent_id: str) -> Bounced | None:
        """A probe (not a dry run) bounces at once while the agent drains."""
        if self.is_draining:
            return Bounced(probe_id, f"agent {agent_id} is draining", False)
        return None

    @staticmethod
    def may_preempt(result: Granted | Bounced, allow_preemption: bool) -> bool:
        """Whether a settled probe goes on to preempt: it asked to, and its bounce is one a
        retry could pass (not a demand this host can never hold)."""
        return isinstance(result, Bounced) and allow_preemption and result.retryable

    def expire(self, now: float) -> list[Instruction]:
        """Drop uncommitted leases (and reservations) whose deadline (monotonic ``now``) passed."""
        return [
            DropLease(lease.lease_id, lease.job_id, "expired", journaled=False)
            for lease in self.ledger.expire(now)
        ]

    def note_pressure(
        self, pressure: Mapping[str, GpuPressure], critical_ratio: float | None = None
    ) -> None:
        """Airlock's latest poll (slice name -> its reading; a GPU missing from it is not
        under watch) and its critical mark: what :meth:`arbitrate` admits new work by."""
        self.pressure = dict(pressure)
        if critical_ratio is not None:
            self.critical_ratio = critical_ratio

    def _forget_reading(self, live: LiveSubjob) -> None:
        """An ended subjob's memory leaves Airlock's latest reading of its GPU at once: the
        next poll would show it gone, and new work admitted meanwhile by the reading one
        poll old would be refused for memory no one holds."""
        if live.gpu_memory_bytes <= 0:
            return
        for key in {k for s in live.slice_ids for k in (s, s.split("/", 1)[0])}:
            reading = self.pressure.get(key)
            if reading is not None:
                used = max(0, reading.used_bytes - live.gpu_memory_bytes)
                self.pressure[key] = GpuPressure(reading.level, used, reading.total_bytes)

    def pressure_refusal(self, declared_bytes: int, slice_ids: Sequence[str]) -> str:
        """Why new work declaring ``declared_bytes`` of GPU memory on ``slice_ids`` would
        only be Airlock's next victim, or "": a GPU Airlock holds ELEVATED or CRITICAL, or
        one where the memory in use, what its suspended subjobs take back on resume and the
        declaration reach Airlock's critical mark (the ledger admits by declarations; this
        is what is on the GPU now, work grown past its declaration included): new work may
        fill a GPU by its declarations, past Airlock's target, but not to where Airlock
        reclaims (admitted there, it would be the next victim, and its retry again). A GPU with nothing on it takes whatever its ledger admits (the
        declaration is the work's own need, and no one else's memory is at stake). Not
        covered: host memory pressure, and memory a subjob will grow to beyond its
        declaration (Airlock's ladder handles that once it shows)."""
        for slice_id in slice_ids:
            watched = self._watched(slice_id)
            if watched is None:
                continue
            reading, resume = watched
            used, total = reading.used_bytes, reading.total_bytes
            if reading.level != Level.NORMAL:
                return (
                    f"{slice_id} is under GPU memory pressure (Airlock {reading.level.name}, "
                    f"{used / _GIB:.1f} of {total / _GIB:.1f} GiB in use)"
                )
            if self._past_critical(reading, resume, declared_bytes):
                held = used + resume + declared_bytes
                return (
                    f"{slice_id} would hold {held / _GIB:.1f} of {total / _GIB:.1f} GiB "
                    f"({used / _GIB:.1f} in use, {resume / _GIB:.1f} to resume, "
                    f"{declared_bytes / _GIB:.1f} declared), at Airlock's critical mark "
                    f"{self.critical_ratio:.0%}"
                )
        return ""

    def admitted_declarations(self, declared: Sequence[int], slice_ids: Sequence[str]) -> int:
        """How many of the ascending ``declared`` memories :meth:`pressure_refusal` admits
        on ``slice_ids`` (a refusal of one is a refusal of every larger): each slice's
        reading and resume memory once, then a bisection, where asking each would sum the
        suspended subjobs' memory per declaration (``sim airlock`` asks this of every
        agent with a share free before each queue pass)."""
        watched = []
        for slice_id in slice_ids:
            state = self._watched(slice_id)
            if state is None:
                continue
            if state[0].level != Level.NORMAL:
                return 0
            watched.append(state)
        lo, hi = 0, len(declared)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            d = declared[mid - 1]
            if any(self._past_critical(reading, resume, d) for reading, resume in watched):
                hi = mid - 1
            else:
                lo = mid
        return lo

    def _watched(self, slice_id: str) -> tuple[GpuPressure, int] | None:
        """Airlock's reading of the slice's GPU and the memory its suspended subjobs take
        back on resume; None when Airlock does not watch it."""
        gpu = slice_id.split("/", 1)[0]
        reading = self.pressure.get(slice_id) or self.pressure.get(gpu)
        if reading is None or reading.total_bytes <= 0:
            return None
        resume = sum(
            s.resume_bytes
            for s in self._live.values()
            if s.state == SUSPENDED
            and any(x == slice_id or x.split("/", 1)[0] == gpu for x in s.slice_ids)
        )
        return reading, resume

    def _past_critical(self, reading: GpuPressure, resume: int, declared_bytes: int) -> bool:
        """Whether memory in use, ``resume`` and ``declared_bytes`` reach the critical mark
        on a GPU with something on it (an idle GPU takes what its ledger admits)."""
        used = reading.used_bytes
        held = used + resume + declared_bytes
        return used + resume > 0 and held >= self.critical_ratio * reading.total_bytes

    def arbitrate(
        self, orders: Sequence[ProbeOrder], now: float, now_unix: float
    ) -> tuple[list[Granted | Bounced], list[Instruction]]:
        """Settle one batch of probes together: lapsed leases go first, then the ledger grants
        in (priority, value, arrival) order, choosing among the slices Airlock's pressure
        admits for each probe's declaration (:meth:`pressure_refusal`, asked per slice: new
        work on a refused GPU would only be Airlock's next victim); a probe with no admitted
        choice bounces, retryable, for the refusal of the slices the ledger would have
        chosen; each lease granted is announced (KeepLease without a subjob: the driver
        holds it in memory, see :class:`KeepLease`)."""
        instructions = self.expire(now)
        results = self.ledger.arbitrate(orders, now, self._refusal if self.pressure else None)
        instructions += [
            KeepLease(r.lease, "", now_unix) for r in results if isinstance(r, Granted)
        ]
        return results, instructions

    def _refusal(self, demand: Demand, slice_ids: Sequence[str]) -> str:
        """:meth:`pressure_refusal` as the ledger asks it (:data:`ledger.Refusal`)."""
        return self.pressure_refusal(demand.gpu_memory_bytes, slice_ids)

    def release(self, lease_ids: Sequence[str], caller: str) -> tuple[int, list[Instruction]]:
        """Give back uncommitted leases issued to ``caller``; others are skipped, not counted."""
        instructions: list[Instruction] = []
        for lease_id in lease_ids:
            lease = self.ledger.lease(lease_id)
            if lease is None or lease.committed or lease.caller != caller:
                continue
            self.ledger.release(lease_id)
            instructions.append(DropLease(lease_id, lease.job_id, "released", journaled=False))
        return len(instructions), instructions

    # -- lifecycle

    def commit(
        self,
        lease_id: str,
        subjob_id: str,
        job_id: str,
        *,
        caller: str,
        priority: int,
        lifecycle: int,
        now: float,
        now_unix: float,
    ) -> list[Instruction]:
        """Commit a lease to a new subjob, which starts as STARTING (a lapsed lease is refused:
        :meth:`expire` first to journal the lapse). ``priority`` 0 takes the lease's; ``now``
        is monotonic (lease deadlines), ``now_unix`` wall-clock."""
        if subjob_id in self._live:
            raise TransitionRefused(f"subjob {subjob_id} already exists", field="spec.subjob_id")
        lease = self.ledger.commit(lease_id, subjob_id, now, caller)
        slice_ids = tuple(a.slice_id for a in lease.allocations)
        self._live[subjob_id] = LiveSubjob(
            subjob_id,
            job_id or lease.job_id,
            STARTING,
            lease_id,
            slice_ids,
            priority or lease.priority,
            lifecycle,
        )
        return [
            NewRow(subjob_id, job_id or lease.job_id, STARTING, COMMITTED_REASON, lease, now_unix),
            KeepLease(lease, subjob_id, now_unix),
        ]

    def launched(
        self, subjob_id: str, pid: int, now_unix: float, pid_start: str = ""
    ) -> list[Instruction]:
        """Its process started: STARTING -> RUNNING (only once). ``now_unix`` (when the
        launch was answered) is the subjob's start; ``pid_start`` is the process's identity
        as the executor read it ("": unknown), journaled apart for a restart's adopt to
        tell this process from a reused pid."""
        live = self._require(subjob_id, STARTING)
        live.state = RUNNING
        live.started_unix = now_unix
        reason = f"started as pid {pid} on {','.join(live.slice_ids) or 'cpu'}"
        row = {"pid": pid, "started_unix": now_unix, "pid_start": pid_start}
        return [
            WriteRow(subjob_id, row),
            *self._transition(live, RUNNING, reason, now_unix),
        ]

    def launch_failed(self, subjob_id: str, error: str, now_unix: float) -> list[Instruction]:
        """Its process could not be started: STARTING -> FAILED (launch_failed)."""
        self._require(subjob_id, STARTING)
        decision = EndDecision(FAILED, EndCause.LAUNCH_FAILED, f"could not start: {error}")
        return self.end(subjob_id, decision, now_unix)

    def suspend(self, subjob_id: str, why: str, now_unix: float) -> list[Instruction]:
        """RUNNING -> SUSPENDED (again from SUSPENDED: the signal is repeated, as asked)."""
        live = self.check_suspend(subjob_id)
        if live.state == RUNNING:
            live.resume_bytes = live.gpu_memory_bytes
            live.stopped_since_unix = now_unix
        live.suspensions += 1
        return self._transition(live, SUSPENDED, f"suspended: {why}", now_unix)

    def resume(self, subjob_id: str, why: str, now_unix: float) -> list[Instruction]:
        """SUSPENDED -> RUNNING (again from RUNNING: the signal is repeated, as asked)."""
        live = self.check_signal(subjob_id)
        live.resume_bytes = 0
        if live.state == SUSPENDED and live.stopped_since_unix:
            live.stopped_seconds += max(0.0, now_unix - live.stopped_since_unix)
        live.stopped_since_unix = 0.0
        return self._transition(live, RUNNING, f"resumed: {why}", now_unix)

    def check_release_memory(self, subjob_id: str) -> None:
        """A memory release asks a live process; it changes no state."""
        self._require(subjob_id)

    def check_signal(self, subjob_id: str) -> LiveSubjob:
        """Suspend and resume need a started subjob that is not being stopped."""
        live = self._require(subjob_id, RUNNING, SUSPENDED)
        if live.is_stopping:
            raise TransitionRefused(
                f"subjob {subjob_id} is being stopped ({TERMINATING}{live.stop_reason})",
                field="subjob_id",
            )
        return live

    def check_suspend(self, subjob_id: str) -> LiveSubjob:
        """A suspend needs what :meth:`check_signal` does, and no checkpoint under way: a
        SIGSTOP during cuda-checkpoint's copy stalls it (the tool waits forever on a stopped
        process, each pid its timeout), so it is refused; once Airlock's suspend is done, a
        suspend is taken (and the suspension is then the caller's)."""
        live = self.check_signal(subjob_id)
        if live.is_checkpointing:
            raise TransitionRefused(
                f"subjob {subjob_id} is being suspended by Airlock (cuda-checkpoint is copying "
                "its GPU memory to host memory, which a stop now would stall); suspend it "
                "again once it is suspended",
                field="subjob_id",
            )
        return live

    def checkpointing(self, subjob_id: str, is_checkpointing: bool) -> None:
        """Airlock's cuda-checkpoint of the subjob begins (True) or ends (False)."""
        live = self._live.get(subjob_id)
        if live is not None:
            live.is_checkpointing = is_checkpointing

    def stop(self, subjob_id: str, why: str, cause: EndCause) -> list[Instruction]:
        """Begin a stop (TERMINATE): its cause is journaled now, so the end records it however
        and whenever the process exits. ``UNSPECIFIED`` is ``TERMINATED``."""
        live = self._require(subjob_id)
        live.stop_cause = cause if cause is not EndCause.UNSPECIFIED else EndCause.TERMINATED
        live.stop_reason = why
        return [
            WriteRow(
                subjob_id, {"reason": f"{TERMINATING}{why}", "end_cause": live.stop_cause.token}
            )
        ]

    def note_gpu_memory(self, subjob_id: str, used_bytes: int) -> None:
        """A poll's reading of a live subjob's GPU memory; the latest and the peak are kept."""
        live = self._live.get(subjob_id)
        if live is None:
            return
        live.gpu_memory_bytes = used_bytes
        live.peak_gpu_memory_bytes = max(live.peak_gpu_memory_bytes, used_bytes)

    def gpu_memory_bytes(self, subjob_id: str) -> int:
        """The latest poll's reading of a live subjob's GPU memory (0: ended or none)."""
        live = self._live.get(subjob_id)
        return live.gpu_memory_bytes if live is not None else 0

    def decide_exit(self, subjob_id: str, info: ExitReport, context: str = "") -> EndDecision:
        """End state, cause and reason of a live subjob whose process ended. A subjob being
        stopped ends KILLED with its stop's cause however it exited; its reason starts with
        the stop's reason, for people."""
        live = self._require(subjob_id)
        how = f"ended by signal {info.signal}" if info.signal else f"exited {info.exit_code}"
        if info.fenced:
            decision = EndDecision(
                KILLED,
                EndCause.FENCED,
                f"{FENCED} the agent was out of touch with its router past the fence lease, "
                f"so the router may run this work elsewhere; {how}",
            )
        elif live.is_stopping:
            why = live.stop_reason
            decision = EndDecision(KILLED, live.stop_cause, f"{why}; {how}" if why else how)
        elif info.exit_code == 0:
            decision = EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0")
        elif info.signal:
            decision = EndDecision(FAILED, EndCause.EXITED, how)
        else:
            error = f": {info.error}" if info.error else ""
            decision = EndDecision(FAILED, EndCause.EXITED, f"{how}{error}")
        if context:
            return EndDecision(decision.state, decision.cause, f"{decision.reason}; {context}")
        return decision

    def exited(
        self,
        subjob_id: str,
        decision: EndDecision,
        info: ExitFigures,
        now_unix: float,
        *,
        units_done: int = 0,
        note: str = "",
    ) -> list[Instruction]:
        """A live subjob's process ended as :meth:`decide_exit` decided: its end, with the
        exit's figures journaled (an exit code the process never gave is -1). ``units_done``
        and ``note`` are what an atomized subjob's checkpoint covers, the note added to the
        reason for people."""
        if note:
            decision = replace(decision, reason=f"{decision.reason}; {note}")
        fields = {
            "exit_code": info.exit_code if info.exit_code is not None else -1,
            "signal": info.signal or 0,
            "peak_rss_bytes": info.peak_rss_bytes,
            "run_seconds": info.run_seconds,
            "units_done": units_done,
        }
        return self.end(subjob_id, decision, now_unix, ended_unix=info.ended_unix, fields=fields)

    def end(
        self,
        subjob_id: str,
        decision: EndDecision,
        now_unix: float,
        *,
        ended_unix: float = 0.0,
        fields: Mapping[str, object] | None = None,
    ) -> list[Instruction]:
        """A live subjob ends: its capacity is released and its end journaled, once.
        ``fields`` are the exit's figures to journal with it (exit code, run time...)."""
        if decision.state not in TERMINAL_STATES or decision.cause is EndCause.UNSPECIFIED:
            raise ValueError(f"not an end: {decision.state} ({decision.cause.name})")
        live = self._require(subjob_id)
        del self._live[subjob_id]
        self._forget_reading(live)
        instructions: list[Instruction] = []
        lease = self.ledger.release(live.lease_id) if live.lease_id else None
        if live.lease_id:
            instructions.append(
                DropLease(live.lease_id, lease.job_id if lease else live.job_id, "ended")
            )
        row = dict(fields or {})
        row["peak_gpu_memory_bytes"] = live.peak_gpu_memory_bytes
        row["ended_unix"] = ended_unix or now_unix
        row["end_cause"] = decision.cause.token
        instructions.append(WriteRow(subjob_id, row))
        instructions += self._transition(live, decision.state, decision.reason, now_unix)
        instructions.append(Ended(subjob_id, decision.state, decision.cause, decision.reason))
        return instructions

    def _transition(
        self, live: LiveSubjob, state: str, reason: str, now_unix: float
    ) -> list[Instruction]:
        live.state = state
        return [
            WriteRow(live.subjob_id, {"state": state, "reason": reason}),
            RecordEvent(live.subjob_id, state, reason, now_unix),
        ]

    # -- agent restart

    def restore(self, row: RestoredSubjob) -> None:
        """Take back a live journal row after an agent restart (its stop too, if one had
        begun); then :meth:`adopt`, :meth:`end` with what the exit file says, or
        :meth:`lose` it. Its capacity is not held until adopted."""
        if row.state not in LIVE_STATES:
            raise TransitionRefused(
                f"subjob {row.subjob_id} has ended ({row.state.lower()})", field="subjob_id"
            )
        if row.subjob_id in self._live:
            raise TransitionRefused(f"subjob {row.subjob_id} already restored", field="subjob_id")
        cause = cause_from_token(row.end_cause)
        self._live[row.subjob_id] = LiveSubjob(
            row.subjob_id,
            row.job_id,
            row.state,
            row.lease_id,
            row.slice_ids,
            row.priority,
            row.lifecycle,
            started_unix=row.started_unix,
            stop_cause=cause,
            stop_reason=(
                row.reason.removeprefix(TERMINATING) if cause is not EndCause.UNSPECIFIED else ""
            ),
            peak_gpu_memory_bytes=row.peak_gpu_memory_bytes,
            stopped_since_unix=row.stopped_since_unix if row.state == SUSPENDED else 0.0,
        )

    def adopt(
        self,
        subjob_id: str,
        allocations: Sequence[Allocation],
        lease_priority: int,
        *,
        cpu_milli: int = 0,
        host_memory_bytes: int = 0,
    ) -> list[Instruction]:
        """A restored subjob's process still runs: hold its capacity again. Capacity that
        cannot be accounted for must not keep running (that would overcommit a slice): it
        is killed, holding nothing, and its exit ends it KILLED (terminated) as any stop.
        ``cpu_milli`` and ``host_memory_bytes`` are the host share it holds again."""
        live = self._require(subjob_id)
        lease_id = live.lease_id or f"adopted-{subjob_id}"
        try:
            self.ledger.adopt(
                lease_id,
                live.job_id,
                0,
                subjob_id,
                allocations,
                lease_priority,
                cpu_milli=cpu_milli,
                host_memory_bytes=host_memory_bytes,
            )
        except LaminarError as exc:
            instructions = self.stop(
                subjob_id, f"cannot re-adopt its capacity ({exc})", EndCause.TERMINATED
            )
            if live.lease_id and self.ledger.lease(live.lease_id) is None:
                instructions.append(DropLease(live.lease_id, live.job_id, "not re-adopted"))
            live.lease_id = ""  # whatever holds that id now is not this subjob's
            return [*instructions, Kill(subjob_id)]
        live.lease_id = lease_id
        return []

    def recover(self, subjob_id: str, facts: RestartFacts, now_unix: float) -> RestartOutcome:
        """A restored subjob after an agent restart, from what the driver found: re-adopted
        while its process runs (its capacity held again, or it is stopped where that cannot
        be held), else ended as its exit record says, else lost. A running process wins over
        an exit record (its watcher reports the end it leaves)."""
        if facts.is_running:
            cpu, memory = (0, 0) if facts.demand is None else self.ledger.host_need(facts.demand)
            refused = self.adopt(
                subjob_id,
                facts.allocations,
                facts.lease_priority,
                cpu_milli=cpu,
                host_memory_bytes=memory,
            )
            return RestartOutcome(Restarted.UNHELD if refused else Restarted.READOPTED, refused)
        if facts.exit is not None:
            end = self.decide_exit(subjob_id, facts.exit, ENDED_WHILE_DOWN)
            return RestartOutcome(Restarted.ENDED, [], end)
        return RestartOutcome(Restarted.LOST, self.lose(subjob_id, now_unix))

    def lose(self, subjob_id: str, now_unix: float) -> list[Instruction]:
        """A restored subjob's process is gone and left no exit record."""
        decision = EndDecision(
            LOST, EndCause.LOST, "process gone after agent restart; no exit record"
        )
        return self.end(subjob_id, decision, now_unix)

    # -- priority preemption

    def holders(self) -> dict[str, HolderFacts]:
        """Facts about every live subjob, for the preemption plan."""
        return {
            sid: HolderFacts(
                job_id=s.job_id,
                priority=s.priority,
                lifecycle=s.lifecycle,
                started_at=s.started_unix,
                is_terminating=s.is_stopping,
                stopped_seconds=s.stopped_seconds,
                stopped_since_unix=s.stopped_since_unix,
            )
            for sid, s in sorted(self._live.items())
        }

    def choose_preemption(
        self,
        order: ProbeOrder,
        bounce: Bounced,
        now_unix: float,
        *,
        dry_run: bool,
        grace_seconds: float,
    ) -> Preemption:
        """Which strictly lower-priority holders to reclaim so that ``order`` (which bounced
        with ``bounce``) fits, and why; a bounce when none would, or in dry-run."""
        cls = PRIORITY_NAMES.get(order.priority, str(order.priority))
        plan = plan_preemption(
            self.ledger,
            order.demand,
            order.priority,
            self.holders(),
            now_unix,
            slice_id=order.slice_id,
        )
        if plan is None or not plan.victims:
            why = (
                "no lower-priority work to reclaim would make it fit"
                if plan is None
                else "room is free but could not be leased"
            )
            reason = f"{bounce.reason}; preemption for {cls}: {why}"
            return Preemption(bounce=Bounced(order.probe_id, reason, True))
        reasons = self._preemption_reasons(order, plan, cls)
        actions = self._reclaims(plan, reasons, now_unix, dry_run)
        victims = tuple(plan.victims)
        if dry_run:
            reason = f"{bounce.reason}; airlock dry-run: would preempt {', '.join(victims)}"
            return Preemption(actions=actions, bounce=Bounced(order.probe_id, reason, True))
        return Preemption(
            victims=victims,
            slice_ids=tuple(plan.slice_ids),
            reasons=reasons,
            actions=actions,
            budget_seconds=grace_seconds + PREEMPT_MARGIN_SECONDS,
            priority_name=cls,
        )

    @staticmethod
    def preemption_timed_out(order: ProbeOrder, preemption: Preemption) -> Bounced:
        """The victims' capacity did not come back within the budget."""
        return Bounced(
            order.probe_id,
            f"preempted {', '.join(preemption.victims)} but their capacity was not released "
            f"within {preemption.budget_seconds:.0f} s",
            True,
        )

    @staticmethod
    def _preemption_reasons(order: ProbeOrder, plan: PreemptionPlan, cls: str) -> dict[str, str]:
        reasons: dict[str, str] = {}
        for room in plan.rooms:
            need = f"{room.needed_bytes / 1024**3:.1f} GiB"
            if room.needed_milli and room.needed_milli < room.slice.capacity_milli:
                need += f", {room.needed_milli} milli"
            for action in room.actions:
                reasons.setdefault(
                    action.subjob_id,
                    f"preempted: by job {order.job_id} ({cls}) needing {room.slice.slice_id} "
                    f"({need}): {action.reason}",
                )
        return reasons

    def _reclaims(
        self, plan: PreemptionPlan, reasons: Mapping[str, str], now_unix: float, dry_run: bool
    ) -> tuple[RecordReclaim, ...]:
        """One record per victim (the first room that chose it), with the GPU time lost."""
        records: dict[str, RecordReclaim] = {}
        for room in plan.rooms:
            for action in room.actions:
                if action.subjob_id in records:
                    continue
                live = self._live.get(action.subjob_id)
                gpus = len(live.slice_ids) if live is not None else 1
                started = live.started_unix if live is not None else 0.0
                lost = max(0.0, now_unix - started) * max(1, gpus) if started else 0.0
                records[action.subjob_id] = RecordReclaim(
                    action.subjob_id,
                    room.slice.slice_id,
                    reasons[action.subjob_id],
                    max(0, action.expected_bytes_freed),
                    dry_run,
                    lost,
                )
        return tuple(records.values())

    def reserve(self, owner: str, preemption: Preemption, now: float) -> None:
        """Hold the preemption's slices for ``owner`` until its budget runs out (monotonic)."""
        self.ledger.reserve(owner, preemption.slice_ids, now + preemption.budget_seconds)

    def unreserve(self, owner: str) -> None:
        self.ledger.unreserve(owner)
