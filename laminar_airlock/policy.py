"""The Airlock ladder as a pure function: snapshot in, actions out.

Purity makes it deterministic (same snapshot, same actions; inputs are sorted,
never iterated in dict or set order) and lets the controller run it in
dry-run mode or replay it from the journal.

Choices made here (documented because the ladder depends on them):

* What an action frees: a subjob whose ``free_mode`` is ``"checkpoint"`` is
  *suspended* (cuda-checkpoint frees its GPU memory); ``"release_signal"`` gets
  *release_memory* (cooperative release frees it). Both count ``observed_bytes``
  as freed. A subjob with ``free_mode="none"`` would free nothing if suspended,
  so when it is picked for relief it is *reclaimed* (terminated), which frees its
  ``observed_bytes``; the reason says so. It keeps its place in victim order.
* A subjob on several slices frees ``observed_bytes // len(slice_ids)`` on each
  (memory is assumed spread evenly); once chosen on one slice it is credited on
  every slice it spans and is not chosen twice.
* Subjobs with ``observed_bytes == 0`` are never victims: they give no relief.
* *release_memory* is sent once per pressure episode: a subjob asked to release
  (``release_requested_since``) counts as relief for ``release_wait_seconds`` and
  is not asked again; if it is still picked after that, it is reclaimed, and the
  reason says it did not release. The caller ends the episode (clears the field)
  once the subjob's slices are back to normal.
* When to act: a CRITICAL slice is relieved always; an ELEVATED one only where its trend
  reaches the critical mark within ``predict_seconds`` (``SliceSignal.seconds_to_critical``,
  a first-order Taylor projection kept by ``LevelTracker``). Where the trend is flat, falling,
  slow or unknown nothing is suspended: a victim would wait below the resume mark for
  nothing (on the GenAI curves, most elevated plateaus never reach the critical mark). On a
  prediction alone only relief that loses no work is taken (suspend, a first release
  request), and only up to the first victim in order whose relief would lose work (no
  higher class is stopped to spare a lower one); a reclaim waits for the critical mark.
* Victim order for GPU relief (``relief_key``): lowest class first; within a class, victims
  whose relief loses no work (a suspend that frees memory, a first release request) before
  reclaims; then transient before long before resident, least work a reclaim loses, most
  over its declaration, least work since checkpoint.
* Critical-class subjobs (priority 1) are victims only when no running subjob of a
  lower class (priority > 1) is on that slice, and no lower-class subjob is resumed on a
  slice where a suspended critical one stays suspended.
* How long a suspended subjob waits: waiting loses no work, a move or a reclaim loses its
  work since checkpoint, so both are pushed back until it has waited at least that long
  (times ``loss_wait_ratio``; ``suspension_waits``), the ski-rental rule.
* Victims are taken as a prefix of the victim order, stopping as soon as the
  projected usage is <= ``target_ratio * total``; if even all of them do not
  suffice, all are taken and the reason says the slice stays above target.
* Resume needs every slice of the subjob NORMAL and the host NORMAL.
* Host pressure (``host_level`` above NORMAL and host use above
  ``host_target_ratio``) runs the same victim order over every subjob on the
  host, running or suspended, counting ``host_rss_bytes``. A stop (SIGSTOP, or
  cuda-checkpoint, which even moves GPU memory *into* host memory) frees no host
  memory, so host victims are *reclaimed*; the reason says so. A critical-class
  subjob is a host victim only when no lower-class subjob is live on the host.
  Subjobs already chosen for GPU relief in the same round are not chosen again
  (the next round sees them suspended); GPU-relief reclaims count their RSS.
* A subjob an operator suspended (``suspended_by_operator``) is theirs: it is never
  resumed, re-addressed or reclaimed for its wait (the operator resumes it), nor suspended
  again (it is not running); a suspended critical one of theirs holds back no lower-class
  resume. Its memory counts as it is on the slice, and host pressure may reclaim it like
  any subjob on the host (its resident memory is there; the kernel's OOM killer would not
  spare it either).
* Re-addressing is requested once per subjob (``readdress_requested`` afterwards):
  it then waits for the zone router to place a copy and end this one; it is not
  resumed in place any more, and it is reclaimed at ``reclaim_after_seconds``
  like any suspended subjob. ``readdress_count`` counts the job's earlier moves,
  so the budget holds across copies.
* ``plan_room`` (priority preemption) takes only strictly lower classes, so a
  critical subjob is never its victim; it stops as soon as both the bytes and the
  milli (when asked for) are free, skipping victims that add nothing missing.
* ``dry_run`` does not change the result: the caller records instead of acting.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from laminar_airlock.levels import Level

GIB = 1024**3

STEP_SUSPEND = "suspend"
STEP_RELEASE_MEMORY = "release_memory"
STEP_RESUME = "resume"
STEP_READDRESS = "readdress"
STEP_RECLAIM = "reclaim"

#: ``slice_id`` of actions taken for host-memory pressure.
HOST_SLICE_ID = "host"

#: Names match proto laminar.v1.PriorityClass and LifecycleClass.
PRIORITY_NAMES = {1: "critical", 2: "production", 3: "batch", 4: "opportunistic"}
LIFECYCLE_NAMES = {1: "resident", 2: "long", 3: "transient"}
FREE_MODES = ("checkpoint", "release_signal", "none")


@dataclass(frozen=True)
class SliceSignal:
    slice_id: str
    used_bytes: int
    total_bytes: int
    level: Level
    #: Compute capacity in milli-GPUs (1000 = one GPU); only ``plan_room`` on the ledger uses it.
    used_milli: int = 0
    total_milli: int = 0
    #: When use reaches the critical mark on its recent trend (``LevelTracker.seconds_to_critical``,
    #: a first-order Taylor projection): 0 at or above it, inf when flat or falling, None when
    #: no trend is known. At ELEVATED the ladder acts only where this is within
    #: ``PolicyConfig.predict_seconds``.
    seconds_to_critical: float | None = None


@dataclass(frozen=True)
class SubjobView:
    subjob_id: str
    job_id: str
    slice_ids: tuple[str, ...]
    priority: int  # 1 critical .. 4 opportunistic
    lifecycle: int  # 1 resident, 2 long, 3 transient
    declared_bytes: int
    observed_bytes: int
    started_at: float
    work_since_checkpoint_seconds: float
    suspended: bool
    suspended_since: float | None
    readdress_count: int
    free_mode: str  # "checkpoint" | "release_signal" | "none"
    restartable: bool
    gpu_count: int = 1
    #: Resident host memory of the subjob's process group (what a reclaim frees on the host).
    host_rss_bytes: int = 0
    #: The agent already asked the zone router to re-place this subjob.
    readdress_requested: bool = False
    #: Milli-GPUs held on each slice (ledger preemption only).
    milli: int = 0
    #: When the agent asked this subjob to release memory in the current pressure episode
    #: (same clock as ``Snapshot.now``); None if it was not asked.
    release_requested_since: float | None = None
    #: A suspend that frees memory is under way (cuda-checkpoint copying its memory to the
    #: host: about 19 s for 30 GiB on an H200): counted as relief, not chosen again.
    stopping: bool = False
    #: Suspended by someone else (an operator's ``SignalSubjob(SUSPEND)``), not by Airlock:
    #: it stays suspended until they resume it; Airlock neither resumes, moves nor reclaims
    #: it after a wait. Its memory counts where it is (a stopped process keeps its GPU
    #: memory); host pressure may still reclaim it, as any subjob on the host.
    suspended_by_operator: bool = False


@dataclass(frozen=True)
class Snapshot:
    now: float
    slices: tuple[SliceSignal, ...]
    subjobs: tuple[SubjobView, ...]
    host_used_bytes: int = 0
    host_total_bytes: int = 0
    host_level: Level = Level.NORMAL


@dataclass(frozen=True)
class PolicyConfig:
    target_ratio: float = 0.80
    #: Resume where the slice stays at or below this after it: just under the default
    #: elevated mark (0.85), so that a resume never itself calls for relief. (0.75 kept
    #: victims suspended for minutes on the GenAI curves, for no relief.)
    resume_ratio: float = 0.84
    readdress_after_seconds: float = 30.0
    max_readdress: int = 2
    reclaim_after_seconds: float = 120.0
    dry_run: bool = False
    host_target_ratio: float = 0.85
    #: How long a subjob asked to release memory has to do so before it is reclaimed.
    release_wait_seconds: float = 2.0
    #: At the elevated mark, relieve a slice only if its trend reaches the critical mark
    #: within this many seconds (the time a poll and a suspend take, with margin).
    predict_seconds: float = 2.0
    #: A suspended subjob is moved or reclaimed only once it has waited this many times the
    #: work a restart would lose (its work since checkpoint): waiting loses no work, a restart
    #: does (the ski-rental rule; tuned on the GenAI curves, docs/benchmarks.md).
    loss_wait_ratio: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.target_ratio <= 1.0:
            raise ValueError(f"target_ratio: must be in (0, 1], got {self.target_ratio}")
        if not 0.0 < self.resume_ratio <= 1.0:
            raise ValueError(f"resume_ratio: must be in (0, 1], got {self.resume_ratio}")
        if self.readdress_after_seconds < 0:
            raise ValueError(
                f"readdress_after_seconds: must be >= 0, got {self.readdress_after_seconds}"
            )
        if self.reclaim_after_seconds < 0:
            raise ValueError(
                f"reclaim_after_seconds: must be >= 0, got {self.reclaim_after_seconds}"
            )
        if self.max_readdress < 0:
            raise ValueError(f"max_readdress: must be >= 0, got {self.max_readdress}")
        if self.release_wait_seconds < 0:
            raise ValueError(f"release_wait_seconds: must be >= 0, got {self.release_wait_seconds}")
        if self.predict_seconds < 0:
            raise ValueError(f"predict_seconds: must be >= 0, got {self.predict_seconds}")
        if self.loss_wait_ratio < 0:
            raise ValueError(f"loss_wait_ratio: must be >= 0, got {self.loss_wait_ratio}")
        if not 0.0 < self.host_target_ratio <= 1.0:
            raise ValueError(f"host_target_ratio: must be in (0, 1], got {self.host_target_ratio}")


@dataclass(frozen=True)
class Action:
    step: str
    subjob_id: str
    slice_id: str
    reason: str
    expected_bytes_freed: int
    #: Taken because a suspension outlived its deadline, not for memory pressure now (a
    #: reclaim after ``reclaim_after_seconds``, or with the readdress budget spent).
    is_deadline: bool = False


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def freed_per_slice(subjob: SubjobView) -> int:
    """Bytes one relief action on ``subjob`` frees on each of its slices."""
    if not subjob.slice_ids:
        return 0
    return max(0, subjob.observed_bytes) // len(subjob.slice_ids)


def relief_step(subjob: SubjobView) -> str:
    """The step that really frees memory for this subjob's free mode."""
    if subjob.free_mode == "checkpoint":
        return STEP_SUSPEND
    if subjob.free_mode == "release_signal":
        # Asked once in this episode and the wait is over (pending ones are not victims).
        return STEP_RECLAIM if subjob.release_requested_since is not None else STEP_RELEASE_MEMORY
    return STEP_RECLAIM


def victim_key(subjob: SubjobView) -> tuple[int, int, int, float, str]:
    """Sort key: lowest class first, transient before long before resident, most over
    its declaration, least work lost, then id."""
    return (
        -subjob.priority,
        -subjob.lifecycle,
        -(subjob.observed_bytes - subjob.declared_bytes),
        subjob.work_since_checkpoint_seconds,
        subjob.subjob_id,
    )


def relief_loss_seconds(subjob: SubjobView) -> float:
    """Work (seconds) relief on ``subjob`` throws away: none where its stop frees memory or
    it is asked to release, its work since checkpoint where it is reclaimed."""
    return subjob.work_since_checkpoint_seconds if relief_step(subjob) == STEP_RECLAIM else 0.0


def relief_key(subjob: SubjobView) -> tuple[int, bool, int, float, int, float, str]:
    """Sort key of GPU relief: lowest class first; within a class, victims whose relief loses
    no work (a suspend that frees memory, a first release request) before reclaims; then
    transient before long before resident, least work a reclaim loses, most over its
    declaration, least work since checkpoint (what a later move would lose), then id."""
    loss = relief_loss_seconds(subjob)
    return (
        -subjob.priority,
        relief_step(subjob) == STEP_RECLAIM,
        -subjob.lifecycle,
        loss,
        -(subjob.observed_bytes - subjob.declared_bytes),
        subjob.work_since_checkpoint_seconds,
        subjob.subjob_id,
    )


def eligible_victims(slice_id: str, subjobs: Iterable[SubjobView]) -> list[SubjobView]:
    """Running subjobs on ``slice_id`` that may be victims, in relief order."""
    running = [s for s in subjobs if not s.suspended and slice_id in s.slice_ids]
    lower_class_runs = any(s.priority > 1 for s in running)
    eligible = [
        s for s in running if freed_per_slice(s) > 0 and not (s.priority == 1 and lower_class_runs)
    ]
    return sorted(eligible, key=relief_key)


def predicts_critical(sig: SliceSignal, config: PolicyConfig) -> bool:
    """Whether a slice needs relief now: CRITICAL, or ELEVATED with a trend that reaches the
    critical mark within ``predict_seconds``. An ELEVATED slice whose trend is flat, falling,
    too slow or unknown is left alone: a suspension there would cost the victim time (it
    resumes only below the resume mark) and prevent nothing."""
    if sig.level == Level.CRITICAL:
        return True
    if sig.level != Level.ELEVATED or sig.seconds_to_critical is None:
        return False
    return sig.seconds_to_critical <= config.predict_seconds


def release_pending(subjob: SubjobView, now: float, config: PolicyConfig) -> bool:
    """Asked to release memory and still within its wait: counted as relief, not chosen again."""
    since = subjob.release_requested_since
    return not subjob.suspended and since is not None and now - since <= config.release_wait_seconds


def _relief_reason(
    sig: SliceSignal,
    level_mark: str,
    victim: SubjobView,
    freed: int,
    sufficient: bool,
    now: float,
) -> str:
    pct = 100.0 * sig.used_bytes / sig.total_bytes if sig.total_bytes else 0.0
    cls = (
        f"{PRIORITY_NAMES.get(victim.priority, str(victim.priority))}/"
        f"{LIFECYCLE_NAMES.get(victim.lifecycle, str(victim.lifecycle))}"
    )
    text = (
        f"{sig.slice_id} at {_gib(sig.used_bytes)} of {_gib(sig.total_bytes)} ({pct:.1f}%) "
        f"{level_mark}; victim class {cls}, frees {_gib(freed)}"
    )
    if victim.free_mode == "none":
        text += "; free_mode none: a stop frees nothing, so it is reclaimed"
    elif victim.free_mode == "release_signal" and victim.release_requested_since is not None:
        waited = now - victim.release_requested_since
        text += (
            f"; asked to release memory {waited:.1f}s ago and still holds "
            f"{_gib(victim.observed_bytes)}, so it is reclaimed"
        )
    if not sufficient:
        text += "; all eligible victims taken and the slice stays above target"
    return text


def _apply_freed(projected: dict[str, int], subjob: SubjobView) -> None:
    share = freed_per_slice(subjob)
    for sid in subjob.slice_ids:
        if sid in projected:
            projected[sid] -= share


def _relieve(
    snapshot: Snapshot, config: PolicyConfig, projected: dict[str, int], chosen: set[str]
) -> list[Action]:
    actions: list[Action] = []
    for sig in sorted(snapshot.slices, key=lambda s: s.slice_id):
        if sig.total_bytes <= 0 or not predicts_critical(sig, config):
            continue
        limit = config.target_ratio * sig.total_bytes
        if projected[sig.slice_id] <= limit:
            continue
        candidates = [
            s for s in eligible_victims(sig.slice_id, snapshot.subjobs) if s.subjob_id not in chosen
        ]
        if sig.level != Level.CRITICAL:
            # On a prediction alone, only relief that loses no work, and never past a victim
            # whose relief would (a higher class is not stopped to spare a lower one): a
            # reclaim waits for the critical mark itself, as the prediction may not come true.
            lossless = list(
                itertools.takewhile(lambda s: relief_step(s) != STEP_RECLAIM, candidates)
            )
            candidates = lossless
        # Decide first how many are needed, so every reason can say whether they suffice.
        after = projected[sig.slice_id]
        picked: list[SubjobView] = []
        for cand in candidates:
            if after <= limit:
                break
            picked.append(cand)
            after -= freed_per_slice(cand)
        sufficient = after <= limit
        mark = (
            "> critical mark"
            if sig.level == Level.CRITICAL
            else f"> elevated mark and critical projected in {sig.seconds_to_critical:.1f}s"
        ) + f", target {100.0 * config.target_ratio:.0f}%"
        for victim in picked:
            freed = freed_per_slice(victim)
            actions.append(
                Action(
                    step=relief_step(victim),
                    subjob_id=victim.subjob_id,
                    slice_id=sig.slice_id,
                    reason=_relief_reason(sig, mark, victim, freed, sufficient, snapshot.now),
                    expected_bytes_freed=freed,
                )
            )
            chosen.add(victim.subjob_id)
            _apply_freed(projected, victim)
    return actions


def _recover(
    snapshot: Snapshot, config: PolicyConfig, projected: dict[str, int], chosen: set[str]
) -> list[Action]:
    actions: list[Action] = []
    signals: Mapping[str, SliceSignal] = {s.slice_id: s for s in snapshot.slices}
    suspended = sorted(
        (
            s
            for s in snapshot.subjobs
            if s.suspended and not s.suspended_by_operator and s.subjob_id not in chosen
        ),
        key=lambda s: (
            s.priority,
            s.suspended_since if s.suspended_since is not None else snapshot.now,
            s.subjob_id,
        ),
    )
    #: Slices where a suspended critical subjob stays suspended this round: no lower class
    #: is resumed there over it (critical work never waits while a lower class runs).
    critical_waits: set[str] = set()
    for sub in suspended:
        since = sub.suspended_since if sub.suspended_since is not None else snapshot.now
        waited = snapshot.now - since
        first_slice = sub.slice_ids[0] if sub.slice_ids else ""
        known = bool(sub.slice_ids) and all(sid in signals for sid in sub.slice_ids)
        share = freed_per_slice(sub)
        readdress_after, reclaim_after = suspension_waits(sub, config)
        if sub.readdress_requested:
            # Handed to the zone router: it ends this copy once a new one is committed.
            if waited > reclaim_after:
                actions.append(
                    Action(
                        STEP_RECLAIM,
                        sub.subjob_id,
                        first_slice,
                        f"suspended {waited:.1f}s > reclaim after {reclaim_after:.1f}s"
                        f"{_loss_note(sub, config)}; re-addressing attempt "
                        f"{sub.readdress_count + 1}/{config.max_readdress} did not complete",
                        freed_per_slice(sub),
                        is_deadline=True,
                    )
                )
            elif sub.priority == 1:
                critical_waits.update(sub.slice_ids)
            continue
        if (
            known
            and snapshot.host_level == Level.NORMAL
            and not (sub.priority > 1 and critical_waits.intersection(sub.slice_ids))
            and all(
                signals[sid].level == Level.NORMAL and signals[sid].total_bytes > 0
                for sid in sub.slice_ids
            )
            and all(
                projected[sid] + share <= config.resume_ratio * signals[sid].total_bytes
                for sid in sub.slice_ids
            )
        ):
            after = projected[first_slice] + share
            total = signals[first_slice].total_bytes
            actions.append(
                Action(
                    step=STEP_RESUME,
                    subjob_id=sub.subjob_id,
                    slice_id=first_slice,
                    reason=(
                        f"{first_slice} normal; projected {_gib(after)} of {_gib(total)} "
                        f"({100.0 * after / total:.1f}%) <= resume mark "
                        f"{100.0 * config.resume_ratio:.0f}% after {waited:.1f}s suspended"
                    ),
                    expected_bytes_freed=-share,
                )
            )
            for sid in sub.slice_ids:
                projected[sid] += share
            continue
        budget_spent = sub.readdress_count >= config.max_readdress
        if waited > reclaim_after or (budget_spent and waited > readdress_after):
            why = (
                f"suspended {waited:.1f}s > reclaim after {reclaim_after:.1f}s"
                if waited > reclaim_after
                else f"suspended {waited:.1f}s and readdress budget spent "
                f"({sub.readdress_count}/{config.max_readdress})"
            )
            actions.append(
                Action(
                    STEP_RECLAIM,
                    sub.subjob_id,
                    first_slice,
                    why + _loss_note(sub, config),
                    freed_per_slice(sub),
                    is_deadline=True,
                )
            )
            continue
        if waited > readdress_after and sub.restartable:
            actions.append(
                Action(
                    STEP_READDRESS,
                    sub.subjob_id,
                    first_slice,
                    f"suspended {waited:.1f}s > readdress after "
                    f"{readdress_after:.1f}s{_loss_note(sub, config)}; attempt "
                    f"{sub.readdress_count + 1}/{config.max_readdress}",
                    freed_per_slice(sub),
                )
            )
            continue
        if sub.priority == 1:
            critical_waits.update(sub.slice_ids)
    return actions


def suspension_waits(sub: SubjobView, config: PolicyConfig) -> tuple[float, float]:
    """(readdress after, reclaim after) in seconds suspended for ``sub``: the configured waits,
    both pushed back so that a move waits at least the work a restart would throw away (times
    ``loss_wait_ratio``); the reclaim stays as far behind the move as configured."""
    loss_wait = config.loss_wait_ratio * sub.work_since_checkpoint_seconds
    extra = max(0.0, loss_wait - config.readdress_after_seconds)
    return config.readdress_after_seconds + extra, config.reclaim_after_seconds + extra


def next_deadline(snapshot: Snapshot, config: PolicyConfig) -> float | None:
    """The earliest time, not before ``snapshot.now``, after which :func:`decide` could answer
    otherwise for the same memory, levels and trends: a suspended subjob reaching its readdress
    or reclaim wait, or a release request running out of its wait. None if no such time.

    A driver that knows nothing else changes until then (the simulator, between trace
    samples) may skip its polls up to that time and lose no decision."""
    times: list[float] = []
    for sub in snapshot.subjobs:
        if sub.suspended_by_operator:
            continue
        if sub.suspended:
            since = sub.suspended_since if sub.suspended_since is not None else snapshot.now
            readdress_after, reclaim_after = suspension_waits(sub, config)
            times.append(since + reclaim_after)
            if not sub.readdress_requested:
                times.append(since + readdress_after)
        elif sub.release_requested_since is not None:
            times.append(sub.release_requested_since + config.release_wait_seconds)
    # Waits compare with ">": a deadline at ``now`` still changes the answer just after it.
    later = [t for t in times if t >= snapshot.now - 1e-9]
    return min(later) if later else None


def _loss_note(sub: SubjobView, config: PolicyConfig) -> str:
    """Why the wait was longer than the configured one, when it was."""
    loss_wait = config.loss_wait_ratio * sub.work_since_checkpoint_seconds
    if loss_wait <= config.readdress_after_seconds:
        return ""
    return f" (waited at least the {sub.work_since_checkpoint_seconds:.0f}s a restart loses)"


def decide(snapshot: Snapshot, config: PolicyConfig) -> list[Action]:
    """Return the ladder's actions for one snapshot: relief first (slices in id order), then
    recovery of suspended subjobs (resume, readdress, reclaim) in priority order.

    A resume action carries a negative ``expected_bytes_freed`` (it takes memory back);
    readdress and reclaim of a suspended subjob count what its departure frees.
    """
    projected = {s.slice_id: s.used_bytes for s in snapshot.slices}
    chosen: set[str] = set()
    for pending in snapshot.subjobs:
        if pending.stopping or release_pending(pending, snapshot.now, config):
            chosen.add(pending.subjob_id)
            _apply_freed(projected, pending)
    actions = _relieve(snapshot, config, projected, chosen)
    actions.extend(_relieve_host(snapshot, config, actions, chosen))
    actions.extend(_recover(snapshot, config, projected, chosen))
    return actions


def host_victims(subjobs: Iterable[SubjobView]) -> list[SubjobView]:
    """Subjobs whose reclaim frees host memory, in victim order; critical ones only when no
    lower-class subjob is live (running or suspended) on the host."""
    live = list(subjobs)
    lower_class_live = any(s.priority > 1 for s in live)
    eligible = [
        s for s in live if s.host_rss_bytes > 0 and not (s.priority == 1 and lower_class_live)
    ]
    return sorted(eligible, key=victim_key)


def _relieve_host(
    snapshot: Snapshot, config: PolicyConfig, taken: list[Action], chosen: set[str]
) -> list[Action]:
    total = snapshot.host_total_bytes
    if snapshot.host_level == Level.NORMAL or total <= 0:
        return []
    by_id = {s.subjob_id: s for s in snapshot.subjobs}
    # Only a reclaim frees host memory; a suspend (even cuda-checkpoint) does not.
    projected = snapshot.host_used_bytes - sum(
        by_id[a.subjob_id].host_rss_bytes
        for a in taken
        if a.step == STEP_RECLAIM and a.subjob_id in by_id
    )
    limit = config.host_target_ratio * total
    if projected <= limit:
        return []
    candidates = [s for s in host_victims(snapshot.subjobs) if s.subjob_id not in chosen]
    picked: list[SubjobView] = []
    after = projected
    for cand in candidates:
        if after <= limit:
            break
        picked.append(cand)
        after -= cand.host_rss_bytes
    sufficient = after <= limit
    mark = "critical" if snapshot.host_level == Level.CRITICAL else "elevated"
    pct = 100.0 * snapshot.host_used_bytes / total
    actions: list[Action] = []
    for victim in picked:
        cls = (
            f"{PRIORITY_NAMES.get(victim.priority, str(victim.priority))}/"
            f"{LIFECYCLE_NAMES.get(victim.lifecycle, str(victim.lifecycle))}"
        )
        reason = (
            f"host memory at {_gib(snapshot.host_used_bytes)} of {_gib(total)} ({pct:.1f}%) "
            f"> {mark} mark, target {100.0 * config.host_target_ratio:.0f}%; victim class "
            f"{cls}{' (suspended)' if victim.suspended else ''}, frees "
            f"{_gib(victim.host_rss_bytes)} host RSS; a stop frees no host memory, so it is "
            "reclaimed"
        )
        if not sufficient:
            reason += "; all eligible victims taken and the host stays above target"
        actions.append(
            Action(STEP_RECLAIM, victim.subjob_id, HOST_SLICE_ID, reason, victim.host_rss_bytes)
        )
        chosen.add(victim.subjob_id)
    return actions


def plan_room(
    snapshot: Snapshot,
    slice_id: str,
    needed_bytes: int,
    for_priority: int,
    config: PolicyConfig,
    needed_milli: int = 0,
) -> list[Action] | None:
    """Actions on strictly lower-priority work (priority number > ``for_priority``) that leave
    ``needed_bytes`` (and ``needed_milli``, when asked) free on ``slice_id``; ``[]`` if already
    free, None if impossible.

    Used when the router asks an agent to preempt lower-priority work for a higher class:
    the agent feeds it its ledger (reserved bytes and milli per slice) so that the room is
    capacity it can lease, and sets ``free_mode="none"`` because a suspended subjob still
    holds its slice, so every victim is reclaimed.
    """
    del config  # same victim order as the ladder; no ratios involved
    sig = next((s for s in snapshot.slices if s.slice_id == slice_id), None)
    if sig is None or needed_bytes > sig.total_bytes or needed_milli > sig.total_milli:
        return None
    free = sig.total_bytes - sig.used_bytes
    free_milli = sig.total_milli - sig.used_milli
    if free >= needed_bytes and free_milli >= needed_milli:
        return []
    candidates = [
        s
        for s in snapshot.subjobs
        if not s.suspended and slice_id in s.slice_ids and s.priority > for_priority
    ]
    actions: list[Action] = []
    milli_note = f", {needed_milli} milli" if needed_milli else ""
    free_milli_note = f", {free_milli} milli" if needed_milli else ""
    for cand in sorted(candidates, key=victim_key):
        bytes_missing = free < needed_bytes
        milli_missing = free_milli < needed_milli
        if not bytes_missing and not milli_missing:
            break
        freed = freed_per_slice(cand)
        if not ((bytes_missing and freed > 0) or (milli_missing and cand.milli > 0)):
            continue  # taking it would add nothing that is missing
        free += freed
        free_milli += cand.milli
        actions.append(
            Action(
                step=relief_step(cand),
                subjob_id=cand.subjob_id,
                slice_id=slice_id,
                reason=(
                    f"make room for {PRIORITY_NAMES.get(for_priority, str(for_priority))}: "
                    f"{_gib(needed_bytes)}{milli_note} needed on {slice_id}, "
                    f"{_gib(sig.total_bytes - sig.used_bytes)}{free_milli_note} free; preempt "
                    f"{PRIORITY_NAMES.get(cand.priority, str(cand.priority))}/"
                    f"{LIFECYCLE_NAMES.get(cand.lifecycle, str(cand.lifecycle))} subjob, "
                    f"frees {_gib(freed)}" + (f", {cand.milli} milli" if needed_milli else "")
                ),
                expected_bytes_freed=freed,
            )
        )
    return actions if free >= needed_bytes and free_milli >= needed_milli else None


def decide_oom_killer(snapshot: Snapshot) -> list[Action]:
    """The baseline Airlock is compared with: what an OOM killer does on a GPU.

    Nothing happens until a slice is full (used >= total); then the subjob holding the most
    memory on it is killed, whatever its class, one per full slice per round. Nothing is
    suspended, resumed or moved. Used only by benchmarks (``laminar_airlock.policy = "oom-killer"``).
    """
    actions: list[Action] = []
    killed: set[str] = set()
    for sig in sorted(snapshot.slices, key=lambda s: s.slice_id):
        if sig.total_bytes <= 0 or sig.used_bytes < sig.total_bytes:
            continue
        running = [
            s
            for s in snapshot.subjobs
            if sig.slice_id in s.slice_ids and not s.suspended and s.subjob_id not in killed
        ]
        if not running:
            continue
        victim = min(running, key=lambda s: (-freed_per_slice(s), s.subjob_id))
        killed.add(victim.subjob_id)
        cls = PRIORITY_NAMES.get(victim.priority, str(victim.priority))
        actions.append(
            Action(
                step=STEP_RECLAIM,
                subjob_id=victim.subjob_id,
                slice_id=sig.slice_id,
                reason=(
                    f"oom-killer baseline: {sig.slice_id} full at {_gib(sig.used_bytes)} of "
                    f"{_gib(sig.total_bytes)}; killed the largest process ({cls}, "
                    f"{_gib(freed_per_slice(victim))})"
                ),
                expected_bytes_freed=freed_per_slice(victim),
            )
        )
    return actions
