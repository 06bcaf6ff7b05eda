"""``laminar sim airlock``: the Airlock ladder against an OOM killer on a simulated cluster.

Every GPU (80 GiB by default) hosts a *sharing group*: a few subjobs replaying real
GPU-memory curves of the Alibaba GenAI trace, chosen by
:func:`laminar_airlock.traces.choose_sharing_group` so that their sum starts below 75 % and later
crosses the critical mark. The same GPUs, curves and classes run twice, once per policy:

* ``ladder``: :func:`laminar_airlock.policy.decide` with ``PolicyConfig()`` defaults, on levels from
  :class:`laminar_airlock.levels.LevelTracker` (the agent's hysteresis code, default marks);
* ``oom-killer``: :func:`laminar_airlock.policy.decide_oom_killer`.

Each GPU is polled every ``poll_seconds`` of simulated time, like the agent's tick. A poll
that provably cannot act is skipped, and the run is the same as with every poll (a test
checks it): for the ladder, a GPU below the elevated mark at NORMAL with nothing suspended,
stalled or asked to release, until one trend window before its memory would reach the
mark; and a GPU whose memory is flat after a poll that did nothing, until
``LevelTracker.next_change`` (a hold or the trend window running out) or
``policy.next_deadline`` (a wait running out), whichever is first, or until its memory or
subjobs change. The trend then gets the samples of the skipped polls within its window
(memory between changes is linear, so they are exact). For the OOM killer, a GPU that is
not full is never polled. Skipped polls are not events; the report counts the polls that ran.

How the world is modelled (choices, stated because the figures depend on them):

* **Memory** of a subjob is a function of its *progress* (seconds of work done, which
  stops while it is suspended or stalled): sample ``i`` of its curve is reached at
  ``i * step_seconds``, moving linearly from sample ``i - 1`` over ``ramp_seconds`` (the
  trace samples every 57 s; how fast memory moves between samples is not in the trace).
* **CUDA OOM**: when the summed memory reaches the GPU's capacity, the subjobs still
  allocating *stall* (the caching allocator frees its cache and retries) for
  ``oom_grace_seconds``; if no room has been made by then, each staller dies of CUDA OOM
  (the process that allocated last). A restore (resume, moved copy or re-run) that does not
  fit fails at once the same way. So used memory never exceeds capacity: the excess is
  what kills. With a grace of 0 the OOM killer never sees a full GPU.
* **Free modes** are drawn per subjob: ``release_share`` answer the release signal; of the
  others, ``stop_frees_share`` (default 1: the sim's GPUs are whole GPUs, where the agent
  uses cuda-checkpoint when it finds the tool) are suspended with cuda-checkpoint, the rest
  have free mode ``none`` (a stop frees nothing; the ladder reclaims them when it picks them).
* **suspend** frees all the subjob's GPU memory (cuda-checkpoint) and pauses its
  progress; **resume** allocates it again at once. **release_memory** (only subjobs with
  ``free_mode="release_signal"``) frees ``release_ratio`` of its memory after
  ``release_delay_seconds`` and runs on that much below its curve for the rest of its
  run (it may be asked again in a later episode, which starts when its GPU is NORMAL).
* **The cluster is agents and a router, driven through their own cores.** Each GPU is an
  agent host with its own :class:`~laminar_agent.core.AgentCore` over a ledger of one
  shared GPU of ``gpu_total_bytes``; each subjob is a job of the router's
  :class:`~laminar_zone.core.ZoneCore` (``sim replay``'s ``CoreDriver`` answers its
  steps at once) that declares its share (``gpu_milli`` = 1000 / group size) and the
  least memory its curve uses, rounded up to whole GiB, with its class, lifecycle,
  restartability and release signal, its undisturbed run time as ``expected_seconds``,
  and ``MAX_RETRIES`` retries. The groups running at time 0 are the workload's: each
  member's share is granted and committed by its GPU's agent core (a probe pinned to the
  GPU) and the router's core reads the running jobs back as from its journal
  (``zone_driver.recover_running``). From then on the simulator places nothing itself.
* **reclaim** and **OOM** end the run, not the subjob: the agent's core ends it (cause
  ``RECLAIMED``, or a failed exit for a CUDA OOM) and its report goes to the router's
  core, which retries the job (a reclaim's retry is free and asks the peak memory the
  agent saw, ``widened_for_memory``; an OOM's is counted) with a placement try at once,
  then from its queue (class order, fair share, per-family blocked heads, EASY backfill)
  at every subjob end and every ``requeue_delay_seconds`` (the router's
  ``queue.retry_seconds``, 1 s). A try probes agents whose summaries show room
  (the router's probe plan and ranking), and each agent's core admits it or not: it
  refuses new work on a GPU that Airlock holds ELEVATED or CRITICAL, or where memory in
  use, what its suspended subjobs take back on resume and the declaration reach
  Airlock's critical mark (``AgentCore.pressure_refusal``; the OOM killer's agent keeps no
  levels, so only the memory part applies there). The re-run restarts from its last
  checkpoint (restartable subjobs checkpoint every ``checkpoint_seconds`` of progress) or
  from its start. Both policies re-run their victims alike. Work lost is the progress a
  run threw away, times its GPU share (1 / group size).
* **readdress** (restartable subjobs only, as the policy decides): the agent's heartbeat
  (every ``readdress_delay_seconds``, the agent's 1 s) names the subjob to the router
  until it is moved or ends; the router's core decides the move
  (``ZoneCore.readdress``), gathers one member over every other host, commits the copy
  there and then stops the old one (``zone_driver.readdress_at_once``, the steps of the
  router's ``AgentReports``). The copy restarts from the checkpoint, losing the work since.
  No host takes it: the next heartbeat asks again, until the ladder reclaims it.
* A queue pass that provably places nothing (no agent has a share free for the smallest
  declaration waiting, or every such agent's core refuses it) is not run: it would
  change no placement (it draws nothing from the router's random stream either).
* The run stops at ``horizon_seconds`` (default twice the window); a subjob completed by
  then counts as completed, whatever happened to its earlier runs.
* No host-memory pressure, no new arrivals beyond the re-runs, no network delay between
  router and agents (every request is answered at once).
* Airlock's view of a subjob (``SubjobView.declared_bytes``) is the least memory of its
  curve, as before; suspend and resume are carried out on the agent's core too, so that
  a suspended subjob's memory counts against new work until it resumes.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from laminar_agent.config import ZoneSettings
from laminar_agent.core import FAILED, KILLED, SUCCEEDED, AgentCore, EndDecision, GpuPressure
from laminar_agent.ledger import (
    Bounced,
    Granted,
    Ledger,
    ProbeOrder,
    Slice,
    SliceKind,
    counter_ids,
)
from laminar_airlock.episodes import Episodes, Memory
from laminar_airlock.levels import TREND_WINDOW_SECONDS, Level, LevelTracker, Marks
from laminar_airlock.policy import (
    FREE_MODES,
    PRIORITY_NAMES,
    STEP_READDRESS,
    STEP_RECLAIM,
    STEP_RELEASE_MEMORY,
    STEP_RESUME,
    STEP_SUSPEND,
    Action,
    PolicyConfig,
    SliceSignal,
    Snapshot,
    SubjobView,
    decide,
    decide_oom_killer,
    next_deadline,
)
from laminar_airlock.traces import MemoryCurve, choose_sharing_group
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import MILLI_PER_GPU, Demand
from laminar_sim.engine import Engine, EventHandle
from laminar_sim.replay import CoreDriver
from laminar_sim.zone_driver import CoreHost, readdress_at_once, recover_running
from laminar_zone.config import QueueSettings
from laminar_zone.core import NewJob
from laminar_zone.entry import Entry
from laminar_zone.lifecycle import job_of, rigid_subjob_id
from laminar_zone.placement import ShapeCap
from laminar_zone.trying import ClearMarket, CloseRound, OpenRound, Round

GIB = 1024**3
GPU_TOTAL_BYTES = 80 * GIB
POLICIES = ("ladder", "oom-killer")
CLASS_NAMES = tuple(PRIORITY_NAMES[p] for p in sorted(PRIORITY_NAMES))
HIGH_PRIORITY = (1, 2)
#: Seeded class mix: (priority, share, lifecycle choices).
CLASS_MIX: tuple[tuple[int, float, tuple[int, ...]], ...] = (
    (1, 0.10, (1,)),
    (2, 0.30, (1, 2)),
    (3, 0.30, (2,)),
    (4, 0.30, (3,)),
)
#: How a subjob stands at the end of the run: it completed (maybe after re-runs), or it was
#: still running, suspended or queued at the horizon.
STATE_COMPLETED = "completed"
STATE_UNFINISHED = "unfinished"
TERMINAL_STATES = (STATE_COMPLETED, STATE_UNFINISHED)
#: How one run (attempt) of a subjob can end other than by completing: a reclaim or a CUDA
#: OOM sends it back to the zone queue, a move restarts it elsewhere at once.
END_RECLAIMED = "reclaimed"
END_OOM = "oom"
END_MOVED = "moved"
ATTEMPT_ENDS = (END_RECLAIMED, END_OOM, END_MOVED)
ACTION_STEPS = (STEP_SUSPEND, STEP_RELEASE_MEMORY, STEP_RESUME, STEP_READDRESS, STEP_RECLAIM)
_EPS = 1e-9
#: Bytes within which a GPU counts as at a mark (crossing times are computed in floats).
_SLACK = 1024**2

ProgressFn = Callable[[str, int, int], None]
#: The one GPU of each simulated agent, and the tenant every job is submitted as.
SLICE_ID = "gpu0"
TENANT = "genai"
#: A job's retries: a CUDA OOM is a failed exit, whose retry the router counts; a reclaim's
#: retry is free. A job that fails its last one ends failed (unfinished here).
MAX_RETRIES = 3


@dataclass(frozen=True)
class AirlockSimSpec:
    """One experiment; every duration in simulated seconds."""

    gpus: int = 1000
    seed: int = 1
    #: Period of each GPU's Airlock poll.
    poll_seconds: float = 0.1
    #: Subjobs per GPU (members of a sharing group).
    members: int = 3
    #: Trace samples per group (57 s each in the GenAI trace).
    window: int = 60
    gpu_total_bytes: int = GPU_TOTAL_BYTES
    #: A group's summed curve starts below this share of the GPU ...
    start_below_ratio: float = 0.75
    #: ... and later exceeds this one (default: the critical mark).
    peak_above_ratio: float = Marks().critical_ratio
    #: Time memory takes to move from one trace sample to the next.
    ramp_seconds: float = 5.0
    #: How long an allocation that does not fit stalls before it fails (CUDA OOM).
    oom_grace_seconds: float = 0.2
    #: The agent's heartbeat period (``zone.heartbeat_seconds``): Airlock's ask to move a
    #: subjob reaches the router with the next heartbeat, and again with each one after
    #: until the subjob is moved or ends.
    readdress_delay_seconds: float = ZoneSettings().heartbeat_seconds
    #: Delay before a subjob asked to release memory has released it.
    release_delay_seconds: float = 1.0
    #: Share of its memory a cooperative subjob releases.
    release_ratio: float = 0.5
    #: Share of subjobs that support the release signal (the rest use cuda-checkpoint).
    release_share: float = 0.2
    #: Share of the other subjobs whose stop frees their GPU memory (cuda-checkpoint on a
    #: whole GPU, as the agent does where it finds the tool); the rest have free mode
    #: ``none``: a stop frees nothing, so the ladder reclaims them when it picks them.
    stop_frees_share: float = 1.0
    #: Share of subjobs that are restartable.
    restartable_share: float = 0.5
    #: Checkpoint period (of progress) of restartable subjobs.
    checkpoint_seconds: float = 600.0
    #: The router's queue pass period (``queue.retry_seconds``) while re-runs wait: a
    #: reclaimed or OOM-killed run's retry is tried at once, then at each pass (and at each
    #: subjob end, which wakes the queue).
    requeue_delay_seconds: float = QueueSettings().retry_seconds
    #: Simulated time at which the run stops; subjobs not completed by then are unfinished
    #: (0: twice the window, 2 * window * 57 s on the GenAI trace).
    horizon_seconds: float = 0.0
    policies: tuple[str, ...] = POLICIES

    def validate(self) -> None:
        """Raise ``ValueError("--flag: why")`` for the first bad field."""
        checks: list[tuple[bool, str, str]] = [
            (1 <= self.gpus <= 100_000, "--gpus", f"must be in 1..100000, got {self.gpus}"),
            (0.001 <= self.poll_seconds <= 60, "--poll-seconds", "must be in [0.001, 60]"),
            (1 <= self.members <= 16, "--members", f"must be in 1..16, got {self.members}"),
            (2 <= self.window <= 1440, "--window", f"must be in 2..1440, got {self.window}"),
            (self.ramp_seconds > 0, "--ramp-seconds", "must be > 0"),
            (self.oom_grace_seconds >= 0, "--oom-grace-seconds", "must be >= 0"),
            (self.readdress_delay_seconds >= 0, "--readdress-delay-seconds", "must be >= 0"),
            (self.release_delay_seconds >= 0, "--release-delay-seconds", "must be >= 0"),
            (0 < self.release_ratio <= 1, "--release-ratio", "must be in (0, 1]"),
            (0 <= self.release_share <= 1, "--release-share", "must be in [0, 1]"),
            (0 <= self.stop_frees_share <= 1, "--stop-frees-share", "must be in [0, 1]"),
            (0 <= self.restartable_share <= 1, "--restartable-share", "must be in [0, 1]"),
            (self.requeue_delay_seconds > 0, "--requeue-delay-seconds", "must be > 0"),
            (self.horizon_seconds >= 0, "--horizon-seconds", "must be >= 0"),
            (self.checkpoint_seconds > 0, "--checkpoint-seconds", "must be > 0"),
            (
                0 < self.start_below_ratio < self.peak_above_ratio,
                "--peak-above-ratio",
                "must be above the start ratio",
            ),
        ]
        for ok, flag, message in checks:
            if not ok:
                raise ValueError(f"{flag}: {message}")
        if not self.policies or any(p not in POLICIES for p in self.policies):
            raise ValueError(f"--policies: choose from {', '.join(POLICIES)}")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("--policies: a policy is listed twice")


@dataclass(frozen=True)
class MemberPlan:
    """One subjob of a GPU's group: its curve and what Airlock knows about it."""

    subjob_id: str
    curve: tuple[int, ...]
    step_seconds: float
    priority: int
    lifecycle: int
    free_mode: str
    restartable: bool

    @property
    def run_seconds(self) -> float:
        return len(self.curve) * self.step_seconds


@dataclass(frozen=True)
class GpuPlan:
    index: int
    members: tuple[MemberPlan, ...]
    pods: tuple[str, ...] = ()


def draw_class(rng: random.Random) -> tuple[int, int]:
    """A seeded (priority, lifecycle) from :data:`CLASS_MIX`."""
    pick = rng.random()
    acc = 0.0
    for priority, share, lifecycles in CLASS_MIX:
        acc += share
        if pick < acc:
            return priority, rng.choice(lifecycles)
    priority, _, lifecycles = CLASS_MIX[-1]
    return priority, rng.choice(lifecycles)


def build_workload(
    curves: Sequence[MemoryCurve], spec: AirlockSimSpec, progress: ProgressFn | None = None
) -> list[GpuPlan]:
    """One sharing group per GPU (seed ``spec.seed`` and the GPU index), classes, free modes
    and restartability drawn from the same seed. Each member runs its curve cut to a seeded
    length between half the window and all of it."""
    plans: list[GpuPlan] = []
    for index in range(spec.gpus):
        group = choose_sharing_group(
            curves,
            members=spec.members,
            gpu_total_bytes=spec.gpu_total_bytes,
            window=spec.window,
            seed=spec.seed * 1_000_003 + index,
            start_below_ratio=spec.start_below_ratio,
            peak_above_ratio=spec.peak_above_ratio,
        )
        rng = random.Random(f"airlock-sim/{spec.seed}/{index}")
        # Its own stream, so that the share does not change the other draws.
        stop_rng = random.Random(f"airlock-sim/{spec.seed}/{index}/stop-frees")
        members = []
        for slot, curve in enumerate(group.curves):
            priority, lifecycle = draw_class(rng)
            length = rng.randint(max(2, spec.window // 2), spec.window)
            is_release = rng.random() < spec.release_share
            restartable = rng.random() < spec.restartable_share
            stop_frees = stop_rng.random() < spec.stop_frees_share
            members.append(
                MemberPlan(
                    subjob_id=f"g{index}-s{slot}",
                    curve=curve[:length],
                    step_seconds=group.step_seconds,
                    priority=priority,
                    lifecycle=lifecycle,
                    free_mode="release_signal"
                    if is_release
                    else "checkpoint"
                    if stop_frees
                    else "none",
                    restartable=restartable,
                )
            )
        plans.append(GpuPlan(index, tuple(members), group.pods))
        if progress is not None and (index + 1) % 100 == 0:
            progress("groups", index + 1, spec.gpus)
    return plans


@dataclass
class SubjobOutcome:
    """How one subjob stood at the end of the run (every subjob gets one)."""

    subjob_id: str
    priority: int
    state: str
    reason: str
    lost_gpu_seconds: float
    suspended_seconds: float
    #: How its runs ended other than by completing (reclaimed, oom, requeued, moved).
    ends: dict[str, int]
    #: Simulated time it completed at, None if unfinished.
    completed_at: float | None = None


class _Sub:
    __slots__ = (
        "done",
        "ends",
        "failed",
        "finished",
        "gpu",
        "last_reason",
        "lost_before",
        "move",
        "plan",
        "progress",
        "queued_at",
        "ramp",
        "readdress_count",
        "released_bytes",
        "run_id",
        "share",
        "stall_bytes",
        "stalled_until",
        "suspended",
        "suspended_total",
    )  # fmt: skip

    def __init__(self, plan: MemberPlan, share: float, gpu: int, ramp_seconds: float) -> None:
        self.plan = plan
        self.ramp = ramp_seconds
        #: GPU-seconds lost by earlier runs (a re-run restarts from its checkpoint).
        self.lost_before = 0.0
        self.share = share
        self.gpu = gpu
        self.progress = 0.0
        self.suspended = False
        self.suspended_total = 0.0
        self.stalled_until: float | None = None
        self.stall_bytes = 0
        self.released_bytes = 0
        self.readdress_count = 0
        #: The subjob id of its current (or last) run, as the router's core named it.
        self.run_id = ""
        #: The agent's next heartbeat that names it for a move (Airlock readdressed it).
        self.move: EventHandle | None = None
        #: Off every GPU: completed, or waiting in the zone queue.
        self.done = False
        #: Completed for good.
        self.finished: float | None = None
        #: Its job failed: the router has no retry left for it.
        self.failed = False
        #: When it entered the zone queue (None while on a GPU).
        self.queued_at: float | None = None
        self.ends: Counter[str] = Counter()
        self.last_reason = ""

    def snapped(self, progress: float) -> float:
        """``progress``, or the trace sample it is a rounding error away from (so that a ramp
        that starts there is seen to start, not skipped for a whole sample)."""
        step = self.plan.step_seconds
        nearest = round(progress / step) * step
        return nearest if abs(progress - nearest) < 1e-6 else progress

    # -- memory as a function of progress -------------------------------------------------
    def _curve_at(self, p: float) -> float:
        curve, step = self.plan.curve, self.plan.step_seconds
        i = min(int(p // step), len(curve) - 1)
        if i == 0:
            return float(curve[0])
        frac = min(1.0, (p - i * step) / self.ramp)
        return curve[i - 1] + (curve[i] - curve[i - 1]) * frac

    def demand(self) -> float:
        """Bytes on the GPU now (0 when suspended)."""
        if self.suspended or self.done:
            return 0.0
        if self.stalled_until is not None:
            return float(self.stall_bytes)
        return max(0.0, self._curve_at(self.progress) - self.released_bytes)

    def restore_bytes(self) -> float:
        return max(0.0, self._curve_at(self.progress) - self.released_bytes)

    def is_running(self) -> bool:
        return not (self.done or self.suspended or self.stalled_until is not None)

    def rate(self) -> float:
        """Bytes per second of growth now (running subjobs only)."""
        if not self.is_running():
            return 0.0
        curve, step = self.plan.curve, self.plan.step_seconds
        i = min(int(self.progress // step), len(curve) - 1)
        if i == 0 or self.progress - i * step >= self.ramp - _EPS:
            return 0.0
        return (curve[i] - curve[i - 1]) / self.ramp

    def next_breakpoint(self) -> float:
        """Progress still to go until its rate changes or it completes (never ~0, so that
        simulated time always moves on)."""
        step = self.plan.step_seconds
        p = self.progress
        i = int(p // step)
        points = [(i + 1) * step, (i + 2) * step, self.plan.run_seconds]
        if i > 0:
            points.append(i * step + self.ramp)
        nxt = min((x for x in points if x > p + 1e-7), default=self.plan.run_seconds)
        return max(0.0, min(nxt, self.plan.run_seconds) - p)

    def work_since_checkpoint(self, checkpoint_seconds: float) -> float:
        if self.plan.restartable:
            return self.progress - checkpoint_seconds * math.floor(
                self.progress / checkpoint_seconds
            )
        return self.progress


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return round(sorted_values[index], 1)


class _Gpu:
    __slots__ = (
        "above_critical",
        "handle",
        "index",
        "last",
        "last_poll",
        "name",
        "phase",
        "quiet_signature",
        "quiet_until",
        "segments",
        "skipping",
        "subs",
    )  # fmt: skip

    def __init__(self, index: int, poll_seconds: float) -> None:
        self.index = index
        self.name = f"gpu{index}"
        self.subs: list[_Sub] = []
        self.last = 0.0
        # Agents are not synchronised: a fixed, spread phase within the poll period.
        self.phase = ((index * 0.6180339887498949) % 1.0) * poll_seconds
        self.handle: EventHandle | None = None
        self.above_critical = 0.0
        #: After a ladder poll that did nothing on flat memory: no poll can act before this
        #: time (``LevelTracker.next_change``, ``policy.next_deadline``) while the GPU's
        #: subjobs and their memory stay as :attr:`quiet_signature` says.
        self.quiet_until: float | None = None
        self.quiet_signature: tuple[tuple[str, bool, int], ...] = ()
        #: Used memory since the last few changes, (from, bytes then, bytes per second), so
        #: a poll after skipped ones can give the trend the samples they would have taken.
        self.segments: list[tuple[float, float, float]] = []
        self.last_poll: float | None = None
        #: Its polls are being skipped (a poll every period would be due).
        self.skipping = False

    def note_segment(self, now: float, used: float, rate: float, keep_seconds: float) -> None:
        segments = self.segments
        while segments and segments[-1][0] >= now:
            segments.pop()
        segments.append((now, used, rate))
        while len(segments) > 1 and segments[1][0] <= now - keep_seconds:
            segments.pop(0)

    def used_at(self, at: float) -> float:
        """Used memory at ``at`` (within the kept segments)."""
        start, used, rate = self.segments[0]
        for segment in self.segments:
            if segment[0] > at:
                break
            start, used, rate = segment
        return used + rate * (at - start)


@dataclass
class PolicyResult:
    """Everything one policy's run produced; :meth:`figures` is its part of the report."""

    policy: str
    outcomes: dict[str, SubjobOutcome]
    actions: Counter[str]
    polls: int
    events: int
    wall_seconds: float
    simulated_seconds: float
    above_critical_gpu_seconds: float
    overcapacity_after_poll: int
    max_used_ratio_after_poll: float
    moved: int
    #: Times the router found no GPU for a readdressed subjob and tried again later.
    move_retries: int = 0
    #: Stops (suspend, reclaim, move, CUDA OOM) of a critical subjob while a lower class ran
    #: on its GPU.
    critical_stopped_while_lower_ran: int = 0
    #: Seconds a critical subjob stayed suspended while a lower class ran on its GPU.
    critical_suspended_while_lower_ran_seconds: float = 0.0
    #: Simulated times at which the report also gives the share of subjobs completed (one
    #: window, the longest undisturbed run, and 1.25 and 1.5 windows).
    completion_marks_seconds: tuple[float, ...] = ()

    def figures(self) -> dict[str, Any]:
        killed: dict[str, dict[str, int]] = {c: {"reclaimed": 0, "oom": 0} for c in CLASS_NAMES}
        lost: dict[str, float] = dict.fromkeys(CLASS_NAMES, 0.0)
        suspended: dict[str, float] = dict.fromkeys(CLASS_NAMES, 0.0)
        completed: dict[str, list[int]] = {c: [0, 0] for c in CLASS_NAMES}
        states: Counter[str] = Counter()
        ends: Counter[str] = Counter()
        finish_times: list[float] = []
        for out in self.outcomes.values():
            cls = PRIORITY_NAMES[out.priority]
            states[out.state] += 1
            ends.update(out.ends)
            killed[cls]["reclaimed"] += out.ends.get(END_RECLAIMED, 0)
            killed[cls]["oom"] += out.ends.get(END_OOM, 0)
            lost[cls] += out.lost_gpu_seconds
            suspended[cls] += out.suspended_seconds
            completed[cls][1] += 1
            if out.completed_at is not None:
                completed[cls][0] += 1
                finish_times.append(out.completed_at)
        total = len(self.outcomes)
        finish_times.sort()
        return {
            "subjobs": total,
            "terminal_states": {s: states.get(s, 0) for s in TERMINAL_STATES},
            "completion_ratio": round(states[STATE_COMPLETED] / total, 4) if total else None,
            "completion_ratio_by_class": {
                c: round(done / n, 4) if n else None for c, (done, n) in completed.items()
            },
            "completion_ratio_by_time": {
                f"{mark:.0f}s": round(bisect.bisect_right(finish_times, mark) / total, 4)
                if total
                else None
                for mark in self.completion_marks_seconds
            },
            "completed_at_p50_seconds": _quantile(finish_times, 0.5),
            "completed_at_p99_seconds": _quantile(finish_times, 0.99),
            "run_ends": {e: ends.get(e, 0) for e in ATTEMPT_ENDS},
            "killed": sum(k["reclaimed"] + k["oom"] for k in killed.values()),
            "killed_by_class": killed,
            "critical_stopped_while_lower_ran": self.critical_stopped_while_lower_ran,
            "critical_suspended_while_lower_ran_seconds": round(
                self.critical_suspended_while_lower_ran_seconds, 1
            ),
            "work_lost_gpu_seconds_by_class": {c: round(v, 1) for c, v in lost.items()},
            "work_lost_gpu_seconds": round(sum(lost.values()), 1),
            "high_priority_work_lost_gpu_seconds": round(
                sum(lost[PRIORITY_NAMES[p]] for p in HIGH_PRIORITY), 1
            ),
            "suspended_seconds_by_class": {c: round(v, 1) for c, v in suspended.items()},
            "actions_by_step": {s: self.actions.get(s, 0) for s in ACTION_STEPS},
            "moved": self.moved,
            "move_retries_no_room": self.move_retries,
            "above_critical_gpu_seconds": round(self.above_critical_gpu_seconds, 1),
            "overcapacity_after_poll": self.overcapacity_after_poll,
            "max_used_ratio_after_poll": round(self.max_used_ratio_after_poll, 4),
            "polls": self.polls,
            "events": self.events,
            "simulated_seconds": round(self.simulated_seconds, 1),
            "wall_seconds": round(self.wall_seconds, 2),
            "events_per_second": round(self.events / self.wall_seconds)
            if self.wall_seconds > 0
            else None,
        }


class _Agent:
    """One simulated GPU as an agent host: its own :class:`AgentCore` over a ledger of one
    shared GPU of the simulation's size (host CPU and memory not arbitrated). Before the
    core settles a probe it is given Airlock's reading of the GPU, as the live agent's poll
    gives it (``AgentCore.note_pressure``): what the core admits new work by."""

    def __init__(self, run: _Run, gpu: _Gpu, total_bytes: int) -> None:
        self.run = run
        self.index = gpu.index
        self.agent_id = f"h{gpu.index}"
        self.core = AgentCore(
            Ledger(
                [
                    Slice(
                        SLICE_ID,
                        SliceKind.SHARED_GPU,
                        0,
                        f"{self.agent_id}-gpu0",
                        "GPU",
                        total_bytes,
                    )
                ],
                lease_prefix=f"{self.agent_id}-",
                lease_ids=counter_ids(),
            )
        )
        self.core.critical_ratio = run.tracker.marks.critical_ratio

    def arbitrate(self, orders: list[ProbeOrder], now: float) -> list[Granted | Bounced]:
        """A batch of probes, settled by the agent's core on Airlock's reading of now."""
        self.run.agent_entries.touch(self.index)
        self.core.note_pressure({SLICE_ID: self.run._pressure(self)})
        return self.core.arbitrate(orders, now, now)[0]

    def release(self, lease_id: str) -> None:
        self.run.agent_entries.touch(self.index)
        self.core.release([lease_id], "")

    def commit(self, lease_id: str, subjob_id: str, now: float) -> None:
        """Commit the lease to the subjob, which launches at once (RUNNING)."""
        self.run.agent_entries.touch(self.index)
        plan = self.run.subs[job_of(subjob_id)].plan
        self.core.commit(
            lease_id,
            subjob_id,
            job_of(subjob_id),
            caller="",
            priority=plan.priority,
            lifecycle=plan.lifecycle,
            now=now,
            now_unix=now,
        )
        self.core.launched(subjob_id, 0, now)

    def shapes(self) -> dict[str, ShapeCap]:
        """The summary the agent would send (``AgentSummary.shapes``)."""
        return {
            s.shape: ShapeCap(s.free, s.total, s.max_free_milli, s.max_free_memory_bytes)
            for s in self.core.ledger.shapes()
        }


class _Driver(CoreDriver):
    """``sim replay``'s driver of the router's core, but a queue pass whose outcome is
    known is not run (:meth:`_Run.pass_signature`): none can place anything, or nothing a
    pass reads changed since a pass that placed nothing. The router's pass runs at every
    subjob end and every ``queue.retry_seconds``, and on a thousand hosts a pass over a
    long queue costs the simulator a good part of a second. A skipped pass leaves the
    waiting jobs' explanations as they were and draws nothing from the router's random
    stream (a pass run again would draw its random probe sample anew: the only thing that
    could differ)."""

    def note(self, host: CoreHost) -> None:
        assert isinstance(host, _Agent)
        host.run.agent_entries.touch(host.index)
        super().note(host)

    def queue_pass(self) -> None:
        owner = self.owner
        assert isinstance(owner, _Run)
        signature = owner.pass_signature()
        if signature is None or signature == owner.idle_signature:
            self.pass_due = False
            return
        waiting = set(owner.queued)
        super().queue_pass()
        owner.idle_signature = signature if waiting <= owner.queued else None


def _admitted(declared: Sequence[int], room: float, core: AgentCore) -> int:
    """How many of the ascending ``declared`` memories an agent with ``room`` left in its
    ledger admits on its GPU: those within the room that its core does not refuse
    (``AgentCore.admitted_declarations``; a refusal of one is a refusal of every larger)."""
    return min(
        bisect.bisect_right(declared, room), core.admitted_declarations(declared, (SLICE_ID,))
    )


#: How far before a reading's end of validity it is read again (float slack on progress).
_READING_MARGIN_SECONDS = 1e-6


class _AgentEntries:
    """The agents' part of :meth:`_Run.pass_signature`, kept as agents change instead of
    read from every agent at every wake (on 5,000 GPUs that walk was most of the run).

    Per agent, its entry ``(index, ledger usage, declarations admitted)`` when it has a
    share free for the smallest waiting one, else None; an entry is read again only when
    the agent was touched (:meth:`touch`: its GPU, ledger or subjobs changed), when the
    waiting declarations changed, or when Airlock's reading of its GPU may have moved
    (memory on a ramp; a flat reading is kept until its next trace sample). The entries
    are what reading every agent gives (``tests/sim/test_sim_airlock.py`` holds them to
    that walk at every pass)."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        n = len(run.agents)
        self.entries: list[tuple[int, tuple[int, int, int, int], int] | None] = [None] * n
        #: Agents whose entry may have changed since it was read.
        self.touched: set[int] = set(range(n))
        #: Airlock's reading of each agent's GPU as last read, and until when it holds.
        self.readings: list[tuple[GpuPressure, float] | None] = [None] * n
        #: (until, agent, stamp) of the readings that hold until a time: read again then.
        self.expiring: list[tuple[float, int, int]] = []
        self.stamps = [0] * n
        self.admitting = 0
        self.key: tuple[int, tuple[int, ...]] | None = None

    def touch(self, index: int) -> None:
        self.touched.add(index)
        self.readings[index] = None

    def hosts(self, milli: int, declared: list[int]) -> tuple[bool, tuple[object, ...]]:
        """(whether any agent admits a waiting declaration, every agent's entry)."""
        now = self.run.engine.now
        key = (milli, tuple(declared))
        if key != self.key:
            self.key = key
            self.touched.update(range(len(self.entries)))
        expiring = self.expiring
        while expiring and expiring[0][0] <= now + _READING_MARGIN_SECONDS:
            _, index, stamp = heapq.heappop(expiring)
            if stamp == self.stamps[index]:
                self.touch(index)
        for index in sorted(self.touched):
            self._read(index, milli, declared, now)
        self.touched.clear()
        return self.admitting > 0, tuple(self.entries)

    def _read(self, index: int, milli: int, declared: list[int], now: float) -> None:
        run = self.run
        agent = run.agents[index]
        old = self.entries[index]
        usage = agent.core.ledger.usage(SLICE_ID)
        entry = None
        if MILLI_PER_GPU - usage[0] - usage[1] >= milli:
            reading = self.readings[index]
            if reading is None:
                reading = self._reading(index, now)
            room = run.total - usage[2] - usage[3]
            agent.core.note_pressure({SLICE_ID: reading[0]})
            entry = (index, usage, _admitted(declared, room, agent.core))
        self.entries[index] = entry
        self.admitting += (entry is not None and entry[2] > 0) - (old is not None and old[2] > 0)

    def _reading(self, index: int, now: float) -> tuple[GpuPressure, float]:
        run = self.run
        gpu = run.gpus[index]
        reading = (run._pressure(run.agents[index]), run._flat_until(gpu, now))
        self.readings[index] = reading
        self.stamps[index] += 1
        if reading[1] < math.inf:
            heapq.heappush(self.expiring, (reading[1], index, self.stamps[index]))
        return reading


class _Run:
    """One policy over the whole cluster, on a fresh engine."""

    def __init__(
        self,
        spec: AirlockSimSpec,
        plans: Sequence[GpuPlan],
        policy: str,
        progress: ProgressFn | None,
    ) -> None:
        self.spec = spec
        self.policy = policy
        self.is_ladder = policy == "ladder"
        self.config = PolicyConfig()
        self.tracker = LevelTracker()
        #: Airlock's memory of each subjob between polls, kept as the agent's driver keeps it.
        self.episodes = Episodes()
        marks = self.tracker.marks
        total = spec.gpu_total_bytes
        self.total = total
        self.elevated_bytes = marks.elevated_ratio * total
        #: Polls start this long before the elevated mark: the trend looks back as far.
        self.trend_lead = TREND_WINDOW_SECONDS
        self.critical_bytes = marks.critical_ratio * total
        self.engine = Engine(spec.seed)
        self.progress = progress
        self.gpus = [_Gpu(p.index, spec.poll_seconds) for p in plans]
        #: Each GPU is an agent host: its own AgentCore over a ledger of one shared GPU.
        self.agents = [_Agent(self, gpu, spec.gpu_total_bytes) for gpu in self.gpus]
        #: The agents' part of the skipped pass's signature, kept as they change.
        self.agent_entries = _AgentEntries(self)
        #: The zone router's own core over those agents, answered at once (sim replay's
        #: CoreDriver): re-runs, their queue passes and placement tries are its.
        self.driver = _Driver(self.engine, self.agents, self, spec.seed)
        self.core = self.driver.core
        self.subs: dict[str, _Sub] = {}
        for plan, gpu in zip(plans, self.gpus, strict=True):
            share = 1.0 / max(1, len(plan.members))
            for member in plan.members:
                sub = _Sub(member, share, gpu.index, spec.ramp_seconds)
                self.subs[member.subjob_id] = sub
                self._recover(sub, self.agents[gpu.index], len(plan.members))
        self.outcomes: dict[str, SubjobOutcome] = {}
        self.actions: Counter[str] = Counter()
        self.polls = 0
        self.overcapacity = 0
        self.max_after = 0.0
        self.moved = 0
        self.move_retries = 0
        self.completed = 0
        self.critical_stopped = 0
        self.critical_suspended_seconds = 0.0
        #: Subjobs whose run ended and whose job the router's core has not started again.
        self.queued: set[str] = set()
        #: What the last queue pass that placed nothing read (:meth:`pass_signature`).
        self.idle_signature: tuple[object, ...] | None = None
        self.router_handle: EventHandle | None = None
        #: Jobs the router's core ended, as it left them (tests read them).
        self.ended_jobs: dict[str, zone_pb2.Job] = {}
        self.tick_every = max(1, len(self.subs) // 200)
        steps = [m.step_seconds for plan in plans for m in plan.members]
        self.window_seconds = spec.window * (steps[0] if steps else 0.0)
        self.horizon = spec.horizon_seconds or 2.0 * self.window_seconds

    # -- the cluster at the window's start, as the router's journal holds it ---------------
    def _recover(self, sub: _Sub, agent: _Agent, members: int) -> None:
        """``sub``'s job runs on its GPU at time 0, placed there by the workload: its
        agent's core grants and commits its share (a probe pinned to the GPU), and the
        router's core reads the running job back as from its journal (``recovered``), so
        that its end, a re-run or a move is the router's from then on."""
        plan = sub.plan
        # It declares its share of the GPU and the least memory its curve uses, rounded up
        # to whole GiB (what a user writes): what the agents' ledgers and admission count.
        declared = -(-min(plan.curve) // GIB) * GIB
        need = Demand(gpu_milli=MILLI_PER_GPU // members, gpu_memory_bytes=declared)
        spec = zone_pb2.JobSpec(
            command=["trace"],
            tenant=TENANT,
            resources=common_pb2.Resources(
                gpu_milli=need.gpu_milli, gpu_memory_bytes=need.gpu_memory_bytes
            ),
            priority=plan.priority,  # type: ignore[arg-type]
            lifecycle=plan.lifecycle,  # type: ignore[arg-type]
            restartable=plan.restartable,
            supports_release_signal=plan.free_mode == "release_signal",
            expected_seconds=plan.run_seconds,
            max_retries=MAX_RETRIES,
        )
        subjob_id = rigid_subjob_id(plan.subjob_id, 1, 0)
        order = ProbeOrder(
            f"{subjob_id}/recover", plan.subjob_id, 0, need, plan.priority, 0.0, 0, 60.0, SLICE_ID
        )
        agent.core.note_pressure({})  # the workload's co-location, whatever Airlock reads
        (granted,), _ = agent.core.arbitrate([order], 0.0, 0.0)
        if not isinstance(granted, Granted):
            raise AssertionError(f"{plan.subjob_id}: its own GPU refused it: {granted.reason}")
        agent.commit(granted.lease.lease_id, subjob_id, 0.0)
        placement = zone_pb2.Placement(
            subjob_id=subjob_id,
            agent_id=agent.agent_id,
            agent_address=agent.agent_id,
            slice_ids=[SLICE_ID],
            member=0,
            state=common_pb2.RUNNING,
            reason="running",
            attempt=1,
            started_unix=0.0,
        )
        recover_running(
            self.core,
            spec,
            need,
            NewJob(plan.subjob_id, "sim"),
            placement,
            0.0,
            self.driver.carry_out,
        )
        self.driver.live.add(subjob_id)
        sub.run_id = subjob_id
        self.gpus[agent.index].subs.append(sub)

    # -- the driver's owner (laminar_sim.replay.CoreOwner) ---------------------------------
    def clock(self) -> None:
        """Nothing to integrate: the figures are kept per GPU as it advances."""

    def subjob_started(self, host: CoreHost, subjob_id: str, slice_ids: tuple[str, ...]) -> None:
        """The agent's core committed a subjob the router's core placed: a re-run of a job
        whose run ended, or a move's copy (the run it moves away from ends now, losing the
        work since its checkpoint). It starts at once from its restart point."""
        assert isinstance(host, _Agent)
        self.agent_entries.touch(host.index)
        sub = self.subs[job_of(subjob_id)]
        now = self.engine.now
        if not sub.done:  # a move's copy: this run ends here and restarts there
            old = self.gpus[sub.gpu]
            restart, lost = self._restart_point(sub)
            self._leave_gpu(sub, now)
            old.subs = [s for s in old.subs if s is not sub]
            self._schedule(old)
            sub.lost_before += lost * sub.share
            sub.progress = restart
            sub.readdress_count += 1
            sub.ends[END_MOVED] += 1
            self.moved += 1
        self.queued.discard(sub.plan.subjob_id)
        sub.run_id = subjob_id
        self._place(sub, self.gpus[host.index], now)

    def subjob_ended(self, host: CoreHost, placement: zone_pb2.Placement) -> None:
        """The agent's core ended a subjob. The simulator ended its run already (it
        completed, died or was reclaimed), unless the router stopped it (a copy nothing
        counts on): then this run ends, losing its work since the checkpoint."""
        assert isinstance(host, _Agent)
        self.agent_entries.touch(host.index)
        sub = self.subs[job_of(placement.subjob_id)]
        if sub.run_id != placement.subjob_id or sub.done:
            return
        gpu = self.gpus[sub.gpu]
        self._advance(gpu, self.engine.now)
        if not sub.done:
            self._end_run(
                sub,
                END_RECLAIMED,
                f"stopped by the router: {placement.reason}",
                self.engine.now,
                report=False,
            )
            gpu.subs = [s for s in gpu.subs if not s.done]
            self._schedule(gpu)

    def job_placed(self, entry: Entry) -> None:
        """Its member started already (:meth:`subjob_started`)."""

    def job_ended(self, entry: Entry) -> None:
        """The router's core ended the job: it succeeded, or it failed with no retry left
        (its subjob waits no longer). Its record, as the core left it."""
        job = entry.job
        self.ended_jobs[job.job_id] = job
        sub = self.subs[job.job_id]
        if job.state != zone_pb2.JOB_SUCCEEDED and sub.finished is None:
            self.queued.discard(job.job_id)
            sub.queued_at = None
            sub.failed = True

    def open_round(self, step: OpenRound) -> Round | None:
        return None  # no atomized work here

    def clear_market(self, step: ClearMarket) -> None:
        raise AssertionError("no market in sim airlock")

    def close_round(self, step: CloseRound) -> None:
        raise AssertionError("no market in sim airlock")

    def pass_done(self, kept: list[Entry]) -> None:
        """The jobs left waiting are tried again at the router's next pass."""

    # -- what the agent reports --------------------------------------------------------------
    def _report_end(self, sub: _Sub, decision: EndDecision, exit_code: int) -> None:
        """The agent's core ends the run and its heartbeat reports it to the router's core
        (``CoreDriver.end_subjob``: its verdict, a retry's placement try), as an event of
        its own at this instant: the simulator's state is settled before the router acts."""
        run_id = sub.run_id
        entry = self.core.entries.get(sub.plan.subjob_id)
        if entry is None:
            return
        self.engine.schedule(
            0.0, lambda: self.driver.end_subjob(entry, run_id, decision, exit_code)
        )

    def _router_pass(self) -> None:
        """The router's periodic queue pass (``queue.retry_seconds``) while re-runs wait:
        the agents' pressure is not in their summaries' free shares, so only a pass sees it
        ease."""
        self.router_handle = None
        if not self.queued:
            return
        self.driver.wake()
        self.router_handle = self.engine.schedule(
            self.spec.requeue_delay_seconds, self._router_pass
        )

    def pass_signature(self) -> tuple[object, ...] | None:
        """What a queue pass's placements depend on, besides the router's random probe
        sample: the waiting jobs and their needs and, for each agent with a share free,
        its ledger's use and how many of the waiting declarations its core admits
        (``AgentCore.pressure_refusal`` on Airlock's reading now; the declarations it
        admits are the smallest ones, as a refusal of one is a refusal of every larger),
        kept per agent as agents change (:class:`_AgentEntries`). None: no agent admits
        any waiting job, so no pass can place one."""
        needs = self.waiting_needs()
        if not needs:
            return None
        milli = min(n.gpu_milli for _, n in needs)
        declared = sorted(n.gpu_memory_bytes for _, n in needs)
        admitting, hosts = self.agent_entries.hosts(milli, declared)
        return (needs, hosts) if admitting else None

    def waiting_needs(self) -> tuple[tuple[str, Demand], ...]:
        """The waiting jobs the router's core holds and what each asks, by job id."""
        return tuple(
            sorted(
                ((j, e.need) for j in self.queued if (e := self.core.entries.get(j)) is not None),
                key=lambda pair: pair[0],
            )
        )

    def _flat_until(self, gpu: _Gpu, now: float) -> float:
        """Until when :meth:`_used_at` reads ``gpu`` as it does at ``now`` while nothing
        touches the GPU: ``now`` when a running subjob's memory is on a ramp, else when the
        first running one reaches its next trace sample (inf: none will)."""
        until = math.inf
        dt = now - gpu.last
        for s in gpu.subs:
            if not s.is_running():
                continue
            curve, step = s.plan.curve, s.plan.step_seconds
            run = s.plan.run_seconds
            p = min(s.progress + dt, run) if dt > 0 else s.progress
            i = min(int(p // step), len(curve) - 1)
            if i > 0 and curve[i] != curve[i - 1] and (p - i * step) / s.ramp < 1.0:
                return now  # on a ramp: it moves
            edge = (i + 1) * step
            if i + 1 >= len(curve) or run <= edge:
                continue  # flat to its end
            until = min(until, now + (edge - p) - _READING_MARGIN_SECONDS)
        return until

    def _pressure(self, agent: _Agent) -> GpuPressure:
        """Airlock's reading of ``agent``'s GPU now, as its latest poll noted it: the level
        (the ladder's; the OOM killer's agent keeps none) and the memory in use."""
        gpu = self.gpus[agent.index]
        level = self.tracker.level(gpu.name) if self.is_ladder else Level.NORMAL
        return GpuPressure(level, int(self._used_at(gpu, self.engine.now)), self.total)

    def _used_at(self, gpu: _Gpu, now: float) -> float:
        """Memory in use on ``gpu`` at ``now`` (computed, not advanced: the GPU's state does not
        change between its wakes, whichever polls were skipped)."""
        dt = now - gpu.last
        used = 0.0
        for s in gpu.subs:
            if s.is_running() and dt > 0:
                p = min(s.progress + dt, s.plan.run_seconds)
                used += max(0.0, s._curve_at(p) - s.released_bytes)
            else:
                used += s.demand()
        return used

    # -- bookkeeping ----------------------------------------------------------------------
    def _leave_gpu(self, sub: _Sub, now: float) -> None:
        """This run of ``sub`` leaves its GPU: close its suspension and Airlock's memory of it."""
        self.agent_entries.touch(sub.gpu)
        since = self.episodes.suspended_since.get(sub.plan.subjob_id)
        if sub.suspended and since is not None:
            sub.suspended_total += now - since
        self.episodes.forget(sub.plan.subjob_id)
        sub.done = True
        sub.suspended = False
        sub.stalled_until = None
        sub.released_bytes = 0
        if sub.move is not None:
            self.engine.cancel(sub.move)
            sub.move = None

    def _complete(self, sub: _Sub, now: float) -> None:
        if sub.done:
            return
        self._leave_gpu(sub, now)
        sub.finished = now
        self.completed += 1
        self._report_end(sub, EndDecision(SUCCEEDED, EndCause.EXITED, "exited 0"), 0)
        if self.progress is not None and (
            self.completed % self.tick_every == 0 or self.completed == len(self.subs)
        ):
            self.progress(self.policy, self.completed, len(self.subs))

    def _restart_point(self, sub: _Sub) -> tuple[float, float]:
        """(progress a new run starts from, work this run loses): its last checkpoint when it
        is restartable, its start otherwise."""
        lost = sub.work_since_checkpoint(self.spec.checkpoint_seconds)
        return sub.progress - lost, lost

    def _is_lower_running(self, sub: _Sub) -> bool:
        gpu = self.gpus[sub.gpu]
        return any(
            s is not sub and s.plan.priority > sub.plan.priority and not s.suspended and not s.done
            for s in gpu.subs
        )

    def _note_stop(self, sub: _Sub) -> None:
        """Count a stop of a critical subjob while a lower class runs beside it."""
        if sub.plan.priority == 1 and not sub.done and self._is_lower_running(sub):
            self.critical_stopped += 1

    def _end_run(
        self, sub: _Sub, cause: str, reason: str, now: float, *, report: bool = True
    ) -> None:
        """This run ends without completing (reclaimed or CUDA OOM): the work since its
        checkpoint is lost, and its agent reports the end to the router's core, which
        decides the re-run (a retry: a placement try at once, then the queue)."""
        if sub.done:
            return
        self.agent_entries.touch(sub.gpu)
        if cause in (END_RECLAIMED, END_OOM):
            self._note_stop(sub)
        if report:  # the agent's last reading of it (the router widens a reclaimed job's)
            self.agents[sub.gpu].core.note_gpu_memory(sub.run_id, int(sub.demand()))
        self._leave_gpu(sub, now)
        restart, lost = self._restart_point(sub)
        sub.lost_before += lost * sub.share
        sub.progress = restart
        sub.ends[cause] += 1
        sub.last_reason = reason
        sub.queued_at = now
        self.queued.add(sub.plan.subjob_id)
        if self.router_handle is None:
            self.router_handle = self.engine.schedule(
                self.spec.requeue_delay_seconds, self._router_pass
            )
        if report:
            decision = (
                EndDecision(KILLED, EndCause.RECLAIMED, reason)
                if cause == END_RECLAIMED
                else EndDecision(FAILED, EndCause.EXITED, reason)
            )
            self._report_end(sub, decision, -9 if cause == END_RECLAIMED else 1)

    def _place(self, sub: _Sub, gpu: _Gpu, now: float) -> None:
        """A new run of ``sub`` starts on ``gpu`` from its restart point."""
        self._advance(gpu, now)
        sub.queued_at = None
        sub.done = False
        sub.gpu = gpu.index
        gpu.subs.append(sub)
        gpu.subs.sort(key=lambda s: s.plan.subjob_id)
        self._fail_restore(gpu, sub, now, "moved copy" if sub.ends[END_MOVED] else "re-run")
        self._schedule(gpu)

    def _advance(self, gpu: _Gpu, now: float) -> None:
        self.agent_entries.touch(gpu.index)
        dt = now - gpu.last
        if dt > 0:
            used = self._used(gpu)
            if used >= self.critical_bytes - _SLACK:
                gpu.above_critical += dt
            if any(s.suspended and s.plan.priority == 1 for s in gpu.subs) and any(
                not s.suspended and s.plan.priority > 1 for s in gpu.subs
            ):
                self.critical_suspended_seconds += dt
            for sub in gpu.subs:
                if sub.is_running():
                    sub.progress = sub.snapped(sub.progress + dt)
        gpu.last = now
        for sub in gpu.subs:
            if sub.is_running() and sub.progress >= sub.plan.run_seconds - 1e-6:
                self._complete(sub, now)
        gpu.subs = [s for s in gpu.subs if not s.done]

    @staticmethod
    def _used(gpu: _Gpu) -> float:
        return sum(s.demand() for s in gpu.subs)

    # -- one GPU wake-up ------------------------------------------------------------------
    def wake(self, gpu: _Gpu, is_poll: bool) -> None:
        now = self.engine.now
        if gpu.skipping and not is_poll:
            # A poll every period would run at this wake if it falls on the poll grid.
            is_poll = abs(self._poll_at_or_after(gpu, now) - now) <= 1e-9
        self._advance(gpu, now)
        self._resolve_stalls(gpu, now)
        self._stall_if_full(gpu, now)
        if is_poll:
            self._poll(gpu, now)
        self._schedule(gpu)

    def _resolve_stalls(self, gpu: _Gpu, now: float) -> None:
        for sub in list(gpu.subs):
            if sub.stalled_until is None or sub.stalled_until > now + _EPS:
                continue
            others = sum(s.demand() for s in gpu.subs if s is not sub)
            if others + sub.stall_bytes < self.total - _SLACK:
                sub.stalled_until = None  # room was made: the retry succeeds
                continue
            self._end_run(
                sub,
                END_OOM,
                f"CUDA OOM: {gpu.name} full at {others / GIB + sub.stall_bytes / GIB:.1f} of "
                f"{self.total / GIB:.0f} GiB for {self.spec.oom_grace_seconds:g}s while it "
                "allocated",
                now,
            )
        gpu.subs = [s for s in gpu.subs if not s.done]

    def _stall_if_full(self, gpu: _Gpu, now: float) -> None:
        used = self._used(gpu)
        if used < self.total - _SLACK:
            return
        for sub in gpu.subs:
            if sub.rate() > 0:
                sub.stall_bytes = int(sub.demand())
                sub.stalled_until = now + self.spec.oom_grace_seconds
        if self.spec.oom_grace_seconds <= 0:
            self._resolve_stalls(gpu, now)

    def _fail_restore(self, gpu: _Gpu, sub: _Sub, now: float, what: str) -> None:
        used = self._used(gpu)
        if used <= self.total:
            return
        self._end_run(
            sub,
            END_OOM,
            f"CUDA OOM: {what} on {gpu.name} needed {sub.restore_bytes() / GIB:.1f} GiB with "
            f"{(used - sub.demand()) / GIB:.1f} of {self.total / GIB:.0f} GiB in use",
            now,
        )
        gpu.subs = [s for s in gpu.subs if not s.done]

    def _view(self, sub: _Sub, now: float, memory: Memory) -> SubjobView:
        observed = sub.restore_bytes() if sub.suspended else sub.demand()
        return SubjobView(
            subjob_id=sub.plan.subjob_id,
            job_id=sub.plan.subjob_id,
            slice_ids=(f"gpu{sub.gpu}",),
            priority=sub.plan.priority,
            lifecycle=sub.plan.lifecycle,
            declared_bytes=min(sub.plan.curve),
            observed_bytes=int(observed),
            started_at=0.0,
            work_since_checkpoint_seconds=sub.work_since_checkpoint(self.spec.checkpoint_seconds),
            suspended=sub.suspended,
            suspended_since=memory.suspended_since,
            readdress_count=sub.readdress_count,
            free_mode=sub.plan.free_mode,
            restartable=sub.plan.restartable,
            readdress_requested=memory.readdress_requested,
            release_requested_since=memory.release_requested_since,
        )

    def _catch_up(self, gpu: _Gpu, now: float) -> None:
        """Feed the tracker the samples of the polls skipped within the trend window, as the
        agent, which polls every period, would have had them (skipped polls decide nothing,
        so only the trend needs them)."""
        period = self.spec.poll_seconds
        last = gpu.last_poll
        if not gpu.segments or (last is not None and now - last < 1.5 * period):
            return
        start = now - self.trend_lead - period
        if last is not None:
            start = max(start, last + 0.5 * period)
        at = self._poll_at_or_after(gpu, start)
        while at < now - 0.5 * period:
            self.tracker.update(gpu.name, int(gpu.used_at(at)), self.total, at)
            at += period

    def _poll(self, gpu: _Gpu, now: float) -> None:
        self.polls += 1
        self.agent_entries.touch(gpu.index)
        used = int(self._used(gpu))
        if self.is_ladder:
            self._catch_up(gpu, now)
            gpu.last_poll = now
        level = (
            self.tracker.update(gpu.name, used, self.total, now) if self.is_ladder else Level.NORMAL
        )
        if gpu.subs:
            calm = level == Level.NORMAL  # the pressure episode is over (Episodes.poll)
            views = []
            core = self.agents[gpu.index].core
            for s in gpu.subs:
                memory = self.episodes.poll(
                    s.plan.subjob_id, suspended=s.suspended, calm=calm, now=now
                )
                if not s.suspended:  # the agent's reading (a suspended one adds nothing to the peak)
                    core.note_gpu_memory(s.run_id, int(s.demand()))
                views.append(self._view(s, now, memory))
            snap = Snapshot(
                now=now,
                slices=(
                    SliceSignal(
                        gpu.name,
                        used,
                        self.total,
                        level,
                        seconds_to_critical=self.tracker.seconds_to_critical(gpu.name)
                        if self.is_ladder
                        else None,
                    ),
                ),
                subjobs=tuple(views),
            )
            actions = decide(snap, self.config) if self.is_ladder else decide_oom_killer(snap)
            for action in actions:
                self._apply(gpu, action, now)
            gpu.quiet_until = None
            if self.is_ladder and not actions and self._is_flat(gpu):
                times = [
                    t
                    for t in (self.tracker.next_change(gpu.name), next_deadline(snap, self.config))
                    if t is not None
                ]
                gpu.quiet_until = min(times) if times else math.inf
                gpu.quiet_signature = self._signature(gpu)
        after = self._used(gpu)
        self.max_after = max(self.max_after, after / self.total)
        if after > self.total + 1:
            self.overcapacity += 1

    def _apply(self, gpu: _Gpu, action: Action, now: float) -> None:
        sub = self.subs.get(action.subjob_id)
        if sub is None or sub.done:
            return
        self.actions[action.step] += 1
        self.agent_entries.touch(sub.gpu)
        since = self.episodes.suspended_since.get(sub.plan.subjob_id)
        if action.step != STEP_RECLAIM:
            self.episodes.applied(action, now)
        if action.step in (STEP_SUSPEND, STEP_READDRESS):
            self._note_stop(sub)
        core = self.agents[sub.gpu].core
        if action.step == STEP_SUSPEND:
            if not sub.suspended:  # its reading before the stop: what a resume takes back
                core.note_gpu_memory(sub.run_id, int(sub.demand()))
            core.suspend(sub.run_id, action.reason, now)
            sub.suspended = True
            sub.stalled_until = None
        elif action.step == STEP_RESUME:
            core.resume(sub.run_id, action.reason, now)
            if since is not None:
                sub.suspended_total += now - since
            sub.suspended = False
            self._fail_restore(gpu, sub, now, "resume")
        elif action.step == STEP_RELEASE_MEMORY:
            self.engine.schedule(
                self.spec.release_delay_seconds, lambda: self._release(sub, gpu.index)
            )
        elif action.step == STEP_READDRESS:
            sub.move = self.engine.schedule(
                self.spec.readdress_delay_seconds, lambda: self._readdress(sub)
            )
        elif action.step == STEP_RECLAIM:
            self._end_run(sub, END_RECLAIMED, f"airlock_reclaimed: {action.reason}", now)
            gpu.subs = [s for s in gpu.subs if not s.done]

    def _release(self, sub: _Sub, index: int) -> None:
        released = self.episodes.release_sent.get(sub.plan.subjob_id)
        if sub.done or sub.gpu != index or released is None or sub.suspended:
            return
        gpu = self.gpus[index]
        self._advance(gpu, self.engine.now)
        if sub.done:
            self._schedule(gpu)
            return
        freed = int(sub.demand() * self.spec.release_ratio)
        sub.released_bytes += freed
        if sub.stalled_until is not None:
            sub.stall_bytes -= freed
        self._schedule(gpu)

    def _readdress(self, sub: _Sub) -> None:
        """The agent's heartbeat names ``sub`` for a move (it does at every heartbeat until
        the subjob ends): the router's core decides it (``ZoneCore.readdress``: a gather
        elsewhere, the copy committed, the old run stopped), as the router's
        ``AgentReports`` does; the copy's start is :meth:`subjob_started`. No host: the next
        heartbeat asks again, until the ladder reclaims it."""
        sub.move = None
        if sub.done or sub.plan.subjob_id not in self.episodes.readdress_pending:
            return
        now = self.engine.now
        old = self.gpus[sub.gpu]
        self._advance(old, now)
        if sub.done:
            self._schedule(old)
            return
        agent = self.agents[sub.gpu]
        self.driver.sync()
        moved = readdress_at_once(
            self.core,
            agent.agent_id,
            sub.run_id,
            gather=self.driver.gather,
            lease_ttl_seconds=self.driver.settings.lease_ttl_seconds,
            start=self.driver.start_subjob,
            now=now,
            carry_out=self.driver.carry_out,
        )
        self.driver.sync()
        if not moved and not sub.done:
            self.move_retries += 1
            sub.move = self.engine.schedule(
                self.spec.readdress_delay_seconds, lambda: self._readdress(sub)
            )

    # -- scheduling -----------------------------------------------------------------------
    def _poll_at_or_after(self, gpu: _Gpu, at: float) -> float:
        period = self.spec.poll_seconds
        k = math.ceil((at - gpu.phase) / period - 1e-7)
        return gpu.phase + max(0, k) * period

    def _poll_after(self, gpu: _Gpu, now: float) -> float:
        period = self.spec.poll_seconds
        k = math.floor((now - gpu.phase) / period + 1e-7) + 1
        return gpu.phase + max(0, k) * period

    @staticmethod
    def _is_flat(gpu: _Gpu) -> bool:
        """No subjob's memory moves: none ramps, none stalls."""
        return all(s.rate() == 0 and s.stalled_until is None for s in gpu.subs)

    @staticmethod
    def _signature(gpu: _Gpu) -> tuple[tuple[str, bool, int], ...]:
        return tuple((s.plan.subjob_id, s.suspended, int(s.demand())) for s in gpu.subs)

    def _is_active(self, gpu: _Gpu, used: float, rate: float) -> bool:
        if any(s.stalled_until is not None for s in gpu.subs):
            return True
        if not self.is_ladder:
            return False
        return (
            used + max(0.0, rate) * self.trend_lead >= self.elevated_bytes - _SLACK
            or self.tracker.level(gpu.name) != Level.NORMAL
            or any(s.suspended or s.plan.subjob_id in self.episodes.release_sent for s in gpu.subs)
        )

    def _schedule(self, gpu: _Gpu) -> None:
        self.agent_entries.touch(gpu.index)
        if gpu.handle is not None:
            self.engine.cancel(gpu.handle)
            gpu.handle = None
        now = self.engine.now
        used = self._used(gpu)
        rate = sum(s.rate() for s in gpu.subs)
        if self.is_ladder:
            gpu.note_segment(now, used, rate, self.trend_lead + 2 * self.spec.poll_seconds)
        if not gpu.subs:
            return
        times: list[float] = []
        for sub in gpu.subs:
            if sub.is_running():
                times.append(now + sub.next_breakpoint())
            if sub.stalled_until is not None:
                times.append(sub.stalled_until)
        if rate > 0:
            for mark in (self.critical_bytes, float(self.total)):
                if used < mark - _SLACK:
                    times.append(now + (mark - used) / rate)
        poll_at: float | None = None
        gpu.skipping = False
        if self._is_active(gpu, used, rate):
            poll_at = self._poll_after(gpu, now)
            quiet = gpu.quiet_until
            if (
                quiet is not None
                and self._is_flat(gpu)
                and gpu.quiet_signature == self._signature(gpu)
            ):
                # Nothing a poll sees changes before ``quiet``: look again then.
                poll_at = (
                    None if math.isinf(quiet) else max(poll_at, self._poll_at_or_after(gpu, quiet))
                )
                gpu.skipping = True
        elif self.is_ladder and rate > 0:
            # From one trend window before the elevated mark, so that the trend is known there.
            poll_at = self._poll_at_or_after(
                gpu, now + (self.elevated_bytes - used) / rate - self.trend_lead
            )
        if poll_at is not None:
            times.append(poll_at)
        if not times:
            return
        at = max(now, min(times))
        is_poll = poll_at is not None and abs(at - poll_at) <= 1e-9
        gpu.handle = self.engine.schedule_at(at, lambda: self.wake(gpu, is_poll))

    def run(self) -> PolicyResult:
        for gpu in self.gpus:
            self._schedule(gpu)
        started = time.perf_counter()
        stats = self.engine.run(until_seconds=self.horizon)
        wall = time.perf_counter() - started
        now = self.engine.now
        for gpu in self.gpus:
            self._advance(gpu, now)
        for sub in self.subs.values():
            where = (
                "completed"
                if sub.finished is not None
                else "failed (no retry left)"
                if sub.failed
                else "queued"
                if sub.queued_at is not None
                else "suspended"
                if sub.suspended
                else "running"
            )
            if sub.finished is None and not sub.done:
                self._leave_gpu(sub, now)  # closes its suspended time at the horizon
            reason = f"{where} at {now:.0f}s"
            if sub.last_reason:
                reason += f"; last run ended: {sub.last_reason}"
            self.outcomes[sub.plan.subjob_id] = SubjobOutcome(
                sub.plan.subjob_id,
                sub.plan.priority,
                STATE_COMPLETED if sub.finished is not None else STATE_UNFINISHED,
                reason,
                sub.lost_before,
                sub.suspended_total,
                dict(sub.ends),
                sub.finished,
            )
        return PolicyResult(
            policy=self.policy,
            outcomes=dict(sorted(self.outcomes.items())),
            actions=self.actions,
            polls=self.polls,
            events=stats.events_processed,
            wall_seconds=wall,
            simulated_seconds=stats.simulated_seconds,
            above_critical_gpu_seconds=sum(g.above_critical for g in self.gpus),
            overcapacity_after_poll=self.overcapacity,
            max_used_ratio_after_poll=self.max_after,
            moved=self.moved,
            move_retries=self.move_retries,
            critical_stopped_while_lower_ran=self.critical_stopped,
            critical_suspended_while_lower_ran_seconds=self.critical_suspended_seconds,
            completion_marks_seconds=tuple(self.window_seconds * k for k in (1.0, 1.25, 1.5)),
        )


def run_policy(
    spec: AirlockSimSpec,
    plans: Sequence[GpuPlan],
    policy: str,
    progress: ProgressFn | None = None,
) -> PolicyResult:
    """Run one policy on ``plans`` (the same plans give the same result)."""
    if policy not in POLICIES:
        raise ValueError(f"--policies: unknown policy {policy!r}")
    return _Run(spec, plans, policy, progress).run()


def run_airlock_sim(
    spec: AirlockSimSpec, plans: Sequence[GpuPlan], progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Every policy of ``spec`` on the same plans; the JSON report."""
    spec.validate()
    results = {p: run_policy(spec, plans, p, progress) for p in spec.policies}
    members = [m for plan in plans for m in plan.members]
    classes = Counter(PRIORITY_NAMES[m.priority] for m in members)
    config = PolicyConfig()
    marks = Marks()
    return {
        "experiment": "airlock",
        "gpus": len(plans),
        "gpu_total_gib": spec.gpu_total_bytes / GIB,
        "seed": spec.seed,
        "members_per_gpu": spec.members,
        "window_samples": spec.window,
        "poll_seconds": spec.poll_seconds,
        "ramp_seconds": spec.ramp_seconds,
        "oom_grace_seconds": spec.oom_grace_seconds,
        "readdress_delay_seconds": spec.readdress_delay_seconds,
        "release_delay_seconds": spec.release_delay_seconds,
        "checkpoint_seconds": spec.checkpoint_seconds,
        "requeue_delay_seconds": spec.requeue_delay_seconds,
        "horizon_seconds": spec.horizon_seconds
        or 2.0 * spec.window * (members[0].step_seconds if members else 0.0),
        "stop_frees_share": spec.stop_frees_share,
        "subjobs": len(members),
        "subjobs_by_class": {c: classes.get(c, 0) for c in CLASS_NAMES},
        "restartable": sum(m.restartable for m in members),
        "free_modes": {mode: sum(m.free_mode == mode for m in members) for mode in FREE_MODES},
        "ladder_config": {
            **{k: v for k, v in dataclasses.asdict(config).items() if k != "dry_run"},
            "elevated_ratio": marks.elevated_ratio,
            "critical_ratio": marks.critical_ratio,
            "clear_ratio": marks.clear_ratio,
            "hold_seconds": marks.hold_seconds,
        },
        "policies": {name: result.figures() for name, result in results.items()},
        "work_lost_definition": (
            "progress since the last checkpoint (restartable) or since start, times the GPU "
            "share (1 / group size), of every run that was reclaimed, killed by CUDA OOM, "
            "re-queued or moved (the subjob re-runs from there); high priority = critical + "
            "production"
        ),
    }
