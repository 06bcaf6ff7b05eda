"""Drives the pure Airlock ladder (``laminar_airlock.policy.decide``) from the agent's tick.

The policy is a pure function; this module gathers its inputs from the node (live
subjobs, their specs and usage files, host RSS of their process groups when the
host is under pressure) and the levels the agent state tracks, then carries out
the actions through ``Node.signal`` and journals each one, so what Airlock did can
be read back with GetAirlock.

* **Dry run** journals each decision once (with ``dry_run=true``) when it first
  appears and does nothing else; a decision that stays the same tick after tick is
  not journaled again until it has gone away.
* **Re-addressing** is a hand-off: the subjob id is put on :meth:`readdress_ids`,
  which every heartbeat sends to the zone router until the subjob ends. The router
  places a copy through its probe path and then ends this one with
  ``SignalSubjob(TERMINATE, reason="readdressed: ...")``. The job's earlier moves
  come from ``spec.env["LAMINAR_READDRESS_COUNT"]`` (set by the router on the
  copy), so the budget ``max_readdress`` holds across copies.
* **A suspend that frees memory**: on the nvml backend with cuda-checkpoint (found at start)
  a suspend of a subjob on whole GPUs first toggles the CUDA state of each process NVML
  lists for it to host memory (``cuda-checkpoint --toggle --pid PID``), then stops it; a
  resume continues it, then toggles them back (cuda-checkpoint needs a running process;
  the CUDA calls of one continued before its restore wait for it). On MIG, or without the tool, its free
  mode is ``release_signal`` or ``none`` (a stop frees nothing: the policy reclaims). A
  toggle that fails leaves a plain stop, which the next poll sees as no relief.
* **Only its own suspensions**: Airlock resumes, re-addresses or reclaims (after its waits)
  only subjobs it suspended itself; one suspended by ``SignalSubjob(SUSPEND)`` is left to
  whoever suspended it (``SubjobView.suspended_by_operator``). Which are its own: within a
  run, the core's suspend count noted at its suspend; after a restart, the journal (see
  :meth:`AirlockDriver._recall`), which also recalls a re-address hand-off under way.
* **Reclamation** (the deadline passed, the re-address budget is spent, a subjob
  that a stop would not relieve, or host pressure) terminates with a reason that
  starts with ``airlock_reclaimed:`` and carries the numbers; all reclaims of one
  round run concurrently and the round ends when they have exited, so the next
  snapshot sees the memory they freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import psutil

from laminar_agent.inventory.attribution import attribute_gpu_memory
from laminar_agent.inventory.cuda_checkpoint import (
    STATE_CHECKPOINTED,
    STATE_RUNNING,
    ToggleFailed,
)
from laminar_agent.inventory.fake import FakeGpuBackend, read_usage_file
from laminar_agent.ledger import SliceKind
from laminar_agent.metrics import AgentMetrics
from laminar_agent.node import Node
from laminar_airlock.episodes import Episodes
from laminar_airlock.levels import Level, LevelTracker
from laminar_airlock.policy import (
    HOST_SLICE_ID,
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
)
from laminar_airlock.signals import HostMemory
from laminar_api.v1 import agent_pb2, common_pb2
from laminar_base.causes import EndCause
from laminar_base.jobenv import READDRESS_COUNT_ENV

log = logging.getLogger("laminar.agent.airlock")

#: Reason prefixes, for people, the agent writes (the cause is ``EndCause.RECLAIMED``); the
#: zone router's own end of a moved copy uses "readdressed:".
RECLAIMED_PREFIX = "airlock_reclaimed: "
READDRESSED_PREFIX = "readdressed:"

_SIGNAL_BY_STEP = {
    STEP_SUSPEND: agent_pb2.SUSPEND,
    STEP_RESUME: agent_pb2.RESUME,
    STEP_RECLAIM: agent_pb2.TERMINATE,
    STEP_RELEASE_MEMORY: agent_pb2.RELEASE_MEMORY,
}


@dataclass(frozen=True)
class _StaticView:
    job_id: str
    devices: tuple[str, ...]
    priority: int
    lifecycle: int
    declared_bytes: int
    free_mode: str
    restartable: bool
    readdress_count: int


@dataclass(frozen=True)
class _SuspendUnderWay:
    """A suspend carried out beside the polls (:meth:`AirlockDriver._stop_beside`)."""

    task: asyncio.Task[None]
    #: What it was decided to free (all its slices together).
    bytes_freed: int


def reason_class(action: Action) -> str:
    """Bounded metric label for why an action was taken."""
    if action.slice_id == HOST_SLICE_ID:
        return "host_pressure"
    if action.step == STEP_RESUME:
        return "cleared"
    if action.step == STEP_READDRESS:
        return "suspended_too_long"
    if action.step == STEP_RECLAIM and action.is_deadline:
        return "deadline"
    return "gpu_pressure"


def _readdress_count(spec: common_pb2.SubjobSpec) -> int:
    try:
        return max(0, int(spec.env.get(READDRESS_COUNT_ENV, "0")))
    except ValueError:
        return 0


#: Journal meta key: subjob id -> pid -> the GPU bytes of each process whose CUDA state
#: cuda-checkpoint moved to host memory, until it is restored (or the subjob ends).
HELD_META = "airlock_checkpointed"
#: How long a stopping agent waits for suspends under way through cuda-checkpoint: a
#: cancelled toggle goes on copying, so the agent lets it end and records it.
CLOSE_WAIT_SECONDS = 20.0
#: The longest wait between tries of a restore that keeps failing (each try may take the
#: tool's timeout, ``TOGGLE_TIMEOUT_SECONDS``, while the polls wait).
RESTORE_RETRY_MAX_SECONDS = 60.0


@dataclass
class RetryBackoff:
    """When something that failed is tried again: ``first_seconds`` after the first failure,
    twice as long after each further one, at most ``max_seconds``; at once after a success
    (or once its key is gone). Times are the caller's monotonic clock."""

    first_seconds: float
    max_seconds: float = RESTORE_RETRY_MAX_SECONDS
    #: Key -> (when it is due again, the wait that led there).
    _waits: dict[str, tuple[float, float]] = field(default_factory=dict)

    def is_due(self, key: str, now: float) -> bool:
        wait = self._waits.get(key)
        return wait is None or now >= wait[0]

    def failed(self, key: str, now: float) -> float:
        """It failed at ``now``; returns the wait until the next try."""
        last = self._waits.get(key)
        delay = self.first_seconds if last is None else min(self.max_seconds, 2 * last[1])
        self._waits[key] = (now + delay, delay)
        return delay

    def reset(self, key: str) -> None:
        """It succeeded, or is gone."""
        self._waits.pop(key, None)


def process_group_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants; 0 if it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += int(proc.memory_info().rss)
        except psutil.Error:
            continue
    return total


class AirlockDriver:
    """Builds a Snapshot each tick, runs ``decide`` and executes its actions.

    Only one decide/execute runs at a time: a tick that arrives while actions are still
    being carried out is skipped, so a slow terminate never stacks up decisions made
    from stale snapshots.
    """

    def __init__(
        self,
        node: Node,
        levels: LevelTracker,
        config: PolicyConfig | None = None,
        *,
        metrics: AgentMetrics | None = None,
        reclaim_grace_seconds: float = 5.0,
        oom_killer_baseline: bool = False,
        poll_seconds: float = 0.1,
    ) -> None:
        self.node = node
        self.levels = levels
        self.config = config if config is not None else PolicyConfig()
        self.metrics = metrics
        self.reclaim_grace_seconds = reclaim_grace_seconds
        #: Run the OOM-killer baseline (``decide_oom_killer``, SIGKILL) instead of the ladder.
        self.oom_killer_baseline = oom_killer_baseline
        self._lock = asyncio.Lock()
        #: Airlock's memory of each subjob between polls (suspended since, release asked in
        #: this episode, handed over for re-addressing), kept as ``sim airlock`` keeps it.
        self.episodes = Episodes()
        #: Per-subjob GPU memory the driver saw at this poll (None: the backend has none).
        self._seen_by_driver: dict[str, int] | None = None
        self._static: dict[str, _StaticView] = {}
        #: Dry run: decisions already journaled and still being made.
        self._dry_seen: set[tuple[str, str, str]] = set()
        #: Pids NVML listed per live subjob at this poll (what cuda-checkpoint toggles).
        self._gpu_pids: dict[str, tuple[int, ...]] = {}
        #: GPU bytes per pid the driver saw at this poll (what a checkpoint moves out).
        self._pid_bytes: dict[int, int] = {}
        #: Subjob -> pid -> GPU bytes, for each process whose CUDA state cuda-checkpoint
        #: moved to host memory and that is not restored yet. The driver reads such a
        #: process as 0 bytes; a suspended subjob counts them (its resume takes them back),
        #: or the policy would resume it into the pressure it left (``sim airlock`` counts
        #: a suspended subjob's restore bytes the same way). Kept in the journal too: an
        #: agent restarted (an upgrade) must still restore them, or the subjob's CUDA calls
        #: would wait forever; whatever is still held when a subjob runs (a restore that
        #: failed, an operator's resume, a stop during a checkpoint) is restored at the
        #: next poll.
        self._held: dict[str, dict[int, int]] = {}
        #: Subjobs already told to the log as held without a cuda-checkpoint to restore them.
        self._unrestorable: set[str] = set()
        self._load_held()
        #: Failed restores wait before the next try (from one poll period up to a minute).
        self._restore_retry = RetryBackoff(poll_seconds)
        #: Subjob -> its core's suspend count at the suspend that Airlock carried out (or
        #: recalled from the journal): the suspension is Airlock's while the count stays.
        #: A suspension someone else made (an operator's SignalSubjob) is theirs: Airlock
        #: neither resumes it nor waits towards re-addressing or reclaim on it.
        self._suspended: dict[str, int] = {}
        #: Live subjobs some poll of this run has looked at (a suspended one seen for the
        #: first time has its suspension recalled from the journal).
        self._looked: set[str] = set()
        #: Suspends under way through cuda-checkpoint (it copies the subjob's GPU memory
        #: to the host, seconds per GiB): they run beside the polls, which count them as
        #: relief in flight, so one slow copy blinds Airlock to no other GPU.
        self._stopping: dict[str, _SuspendUnderWay] = {}
        #: A suspend beside the polls ended since the last step read the GPU totals.
        self._totals_stale = False
        if metrics is not None:
            metrics.cuda_checkpoint_available.set(
                1 if node.backend.cuda_checkpoint.is_available else 0
            )

    @property
    def is_busy(self) -> bool:
        return self._lock.locked()

    @property
    def dry_run(self) -> bool:
        return self.config.dry_run

    def readdress_ids(self) -> list[str]:
        """Ids the heartbeat asks the zone router to re-place; each stays until it ends."""
        self.episodes.prune(self.node.live_states)
        return sorted(self.episodes.readdress_pending)

    def snapshot(
        self,
        readings: dict[str, tuple[int, int]],
        now: float,
        host: HostMemory | None = None,
        host_level: Level = Level.NORMAL,
        process_memory: dict[str, dict[int, int]] | None = None,
    ) -> Snapshot | None:
        """The policy's input, or None when no subjob is live (nothing to decide).

        ``process_memory`` is the backend's per-process GPU memory read off the event loop
        (:meth:`step` does); None reads it here, blocking."""
        live = dict(self.node.live_states)
        if not live:
            return None
        views: list[SubjobView] = []
        device_ids: set[str] = set()
        self._seen_by_driver = self._driver_view(live, process_memory)
        for subjob_id in list(self._static):
            if subjob_id not in live:
                del self._static[subjob_id]
        gone = [subjob_id for subjob_id in self._held if subjob_id not in live]
        for subjob_id in gone:
            del self._held[subjob_id]  # its host copy ended with it
            self._restore_retry.reset(subjob_id)
        if gone:
            self._save_held()
        self.episodes.prune(live)
        self._looked.intersection_update(live)
        for subjob_id in [s for s in self._suspended if s not in live]:
            del self._suspended[subjob_id]
        want_rss = host is not None and host_level != Level.NORMAL
        for subjob_id in sorted(live):
            static = self._static_of(subjob_id)
            suspended = live[subjob_id] == "SUSPENDED"
            calm = static is None or all(
                self.levels.level(d) == Level.NORMAL for d in static.devices
            )
            by_airlock = self._is_airlocks(subjob_id, suspended, now)
            memory = self.episodes.poll(subjob_id, suspended=by_airlock, calm=calm, now=now)
            if subjob_id in self.node.terminating:
                continue  # already on its way out; its memory leaves with it
            if static is None or (not static.devices and not want_rss):
                continue
            devices = static.devices
            device_ids.update(devices)
            pid = self.node.executor.pid_of(subjob_id) if want_rss else None
            observed = (
                self._observed_bytes(subjob_id, static.declared_bytes, suspended) if devices else 0
            )
            self.node.note_gpu_memory(subjob_id, observed)
            # A suspend under way beside the polls counts the relief it was decided for: its
            # checkpoint may already have moved the memory out of NVML's process list while
            # the GPU's totals of this poll, read before, still hold it.
            if (under_way := self._stopping.get(subjob_id)) is not None:
                observed = max(observed, under_way.bytes_freed)
            held = self.node.core.subjob(subjob_id)  # its start and its stopped time
            views.append(
                SubjobView(
                    subjob_id=subjob_id,
                    job_id=static.job_id,
                    slice_ids=tuple(self.node.slice_name(d) for d in devices),
                    priority=static.priority,
                    lifecycle=static.lifecycle,
                    declared_bytes=static.declared_bytes,
                    observed_bytes=observed,
                    started_at=held.started_unix if held is not None else 0.0,
                    work_since_checkpoint_seconds=(
                        held.work_seconds(time.time()) if held is not None else 0.0
                    ),
                    suspended=suspended,
                    suspended_since=memory.suspended_since,
                    readdress_count=static.readdress_count,
                    free_mode=static.free_mode,
                    restartable=static.restartable,
                    gpu_count=max(1, len(devices)),
                    host_rss_bytes=process_group_rss_bytes(pid) if pid else 0,
                    readdress_requested=memory.readdress_requested,
                    release_requested_since=memory.release_requested_since,
                    stopping=subjob_id in self._stopping,
                    suspended_by_operator=suspended and not by_airlock,
                )
            )
        if not views:
            return None
        slices = []
        for uuid in sorted(set(readings) | device_ids):
            used, total = readings.get(uuid, (0, 0))
            if uuid not in device_ids and used <= 0:
                continue
            name = self.node.slice_name(uuid)
            slices.append(
                SliceSignal(
                    name,
                    used,
                    total,
                    self.levels.level(uuid),
                    seconds_to_critical=self.levels.seconds_to_critical(uuid),
                )
            )
        return Snapshot(
            now=now,
            slices=tuple(slices),
            subjobs=tuple(views),
            host_used_bytes=host.used_bytes if host is not None else 0,
            host_total_bytes=host.total_bytes if host is not None else 0,
            host_level=host_level,
        )

    def _suspensions(self, subjob_id: str) -> int:
        live = self.node.core.subjob(subjob_id)
        return live.suspensions if live is not None else 0

    def _is_airlocks(self, subjob_id: str, suspended: bool, now: float) -> bool:
        """Whether ``subjob_id`` is suspended and Airlock's suspend is what holds it: not
        when someone suspended it again since (the core counts each suspend), nor when this
        run first finds it suspended and the journal says no Airlock suspend led to it."""
        first_look = subjob_id not in self._looked
        self._looked.add(subjob_id)
        if not suspended:
            self._suspended.pop(subjob_id, None)
            return False
        count = self._suspended.get(subjob_id)
        if count is None:
            return first_look and self._recall(subjob_id, now)
        if count == self._suspensions(subjob_id):
            return True
        del self._suspended[subjob_id]
        log.info(
            "airlock: subjob %s was suspended again by a SignalSubjob: it stays suspended "
            "until it is resumed the same way",
            subjob_id,
        )
        return False

    def _recall(self, subjob_id: str, now: float) -> bool:
        """A suspended subjob this run has not seen (the agent restarted, or it was
        suspended before the first poll): whether Airlock suspended it, from the journal.
        It did if it journaled a suspend (not a dry-run one) after the subjob's previous
        state event and before the SUSPENDED one (Airlock journals each action before
        carrying it out, so a stop between the two still reads as Airlock's). Then its
        age counts from that event, and a re-address journaled since goes on (its hand-off
        to the zone router is neither undone by a resume nor made, and counted, twice)."""
        events = self.node.journal.last_events(subjob_id, 2)
        if not events or events[0].state != "SUSPENDED":
            return False
        at = events[0].at_unix
        before = events[1].at_unix if len(events) > 1 else 0.0
        actions = self.node.journal.actions_of(subjob_id, since_unix=before)
        if not any(a.step == STEP_SUSPEND and a.at_unix <= at for a in actions):
            log.info("airlock: subjob %s was suspended by a SignalSubjob: not Airlock's", subjob_id)
            return False
        moved = [a.at_unix for a in actions if a.step == STEP_READDRESS and a.at_unix >= at]
        wall = time.time()
        self.episodes.recall(
            subjob_id,
            now - max(0.0, wall - at),
            now - max(0.0, wall - moved[-1]) if moved else None,
        )
        self._suspended[subjob_id] = self._suspensions(subjob_id)
        return True

    def _static_of(self, subjob_id: str) -> _StaticView | None:
        """What never changes about a live subjob, read from the journal once, not every tick."""
        cached = self._static.get(subjob_id)
        if cached is not None:
            return cached
        row = self.node.reads.find(subjob_id)
        if row is None:
            return None
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        devices = tuple(sorted(json.loads(row.device_uuids_json or "[]")))
        view = _StaticView(
            job_id=row.job_id,
            devices=devices,
            priority=int(spec.priority) or common_pb2.BATCH,
            lifecycle=int(spec.lifecycle) or common_pb2.LONG,
            declared_bytes=int(spec.resources.gpu_memory_bytes),
            free_mode=(
                "release_signal"
                if spec.supports_release_signal
                else "checkpoint"
                if self._suspend_frees(devices)
                else "none"
            ),
            restartable=spec.restartable,
            readdress_count=_readdress_count(spec),
        )
        self._static[subjob_id] = view
        return view

    def _suspend_frees(self, devices: tuple[str, ...]) -> bool:
        """Whether a suspend frees a subjob's GPU memory here: the backend frees it itself
        (the fake one), or cuda-checkpoint can on these devices (whole GPUs, not MIG)."""
        backend = self.node.backend
        if backend.frees_memory_on_suspend:
            return True
        return (
            backend.cuda_checkpoint.is_available
            and bool(devices)
            and not any(self._is_mig(d) for d in devices)
        )

    def _is_mig(self, device_uuid: str) -> bool:
        """Whether a device is a MIG instance, as the ledger holds it now (instances carved
        after start are there too); a device the ledger does not know counts as one (no
        checkpoint is tried where it may not be supported)."""
        held = self.node.ledger.slices.get(self.node.slice_name(device_uuid))
        return held is None or held.kind == SliceKind.MIG

    def _driver_view(
        self, live: dict[str, str], process_memory: dict[str, dict[int, int]] | None
    ) -> dict[str, int] | None:
        """GPU memory per live subjob as the driver sees it (NVML's per-process lists,
        charged to each subjob through its process tree), or None where the backend has no
        such view (the fake backend: subjobs report their own use)."""
        if not self.node.backend.per_process_memory:
            return None
        roots = {
            pid: subjob_id
            for subjob_id in live
            if (pid := self.node.executor.pid_of(subjob_id)) is not None
        }
        if process_memory is None:
            process_memory = self.node.backend.process_memory()
        seen = attribute_gpu_memory(process_memory, roots)
        self._gpu_pids = seen.pids
        pid_bytes: dict[int, int] = {}
        for processes in process_memory.values():
            for pid, used in processes.items():
                pid_bytes[pid] = pid_bytes.get(pid, 0) + used
        self._pid_bytes = pid_bytes
        return {sid: sum(devices.values()) for sid, devices in seen.by_subjob.items()}

    def _observed_bytes(self, subjob_id: str, declared_bytes: int, suspended: bool) -> int:
        """What the driver sees the subjob use, plus, while it is suspended, what
        cuda-checkpoint holds of it on the host; on the fake backend, what the subjob
        reports in its usage file (the declaration if absent or bad)."""
        if self._seen_by_driver is not None:
            seen = self._seen_by_driver.get(subjob_id, 0)
            # A held pid the driver lists with memory is on the GPU after all (counted in
            # ``seen``): its restore ended unrecorded, or its checkpoint never began.
            held = self._held.get(subjob_id, {}) if suspended else {}
            return seen + sum(b for pid, b in held.items() if not self._pid_bytes.get(pid))
        return read_usage_file(self.node.executor.gpu_mem_file(subjob_id), declared_bytes)

    async def step_logged(
        self,
        readings: dict[str, tuple[int, int]],
        host: HostMemory | None = None,
        host_level: Level = Level.NORMAL,
    ) -> None:
        """``step`` for a background task: an error is logged, never lost or raised."""
        try:
            await self.step(readings, host, host_level)
        except Exception:
            log.exception("airlock step failed")

    async def step(
        self,
        readings: dict[str, tuple[int, int]],
        host: HostMemory | None = None,
        host_level: Level = Level.NORMAL,
    ) -> list[Action]:
        """One decide/execute round; returns the actions carried out or, in dry-run mode,
        newly recorded (none if busy)."""
        if self._lock.locked() or not self.node.live_states:
            return []
        async with self._lock:
            backend = self.node.backend
            # Whatever dry_run says: it repairs what the agent itself did before (a
            # checkpointed subjob resumed by hand would wait forever otherwise).
            await self._restore_running()
            if self._totals_stale and backend.per_process_memory:
                # A suspend beside the polls ended since the last step: the totals the tick
                # read may predate the memory it moved out (a relief decided on them would
                # pick a second victim for the same pressure).
                self._totals_stale = False
                readings = await asyncio.to_thread(backend.memory_used)
            # NVML's process lists are read on a worker thread: a call may take its deadline.
            processes = (
                await asyncio.to_thread(backend.process_memory)
                if backend.per_process_memory
                else None
            )
            now = time.monotonic()
            snap = self.snapshot(readings, now, host, host_level, processes)
            if snap is None:
                self._dry_seen.clear()
                return []
            actions = [
                action
                for action in (
                    decide_oom_killer(snap)
                    if self.oom_killer_baseline
                    else decide(snap, self.config)
                )
                if not self._cannot_resume(action)
            ]
            if self.config.dry_run:
                keys = [(a.step, a.subjob_id, a.slice_id) for a in actions]
                fresh = [a for a, k in zip(actions, keys, strict=True) if k not in self._dry_seen]
                self._dry_seen = set(keys)
                for action in fresh:
                    self._record(action, snap)
                return fresh
            reclaims: list[Action] = []
            for action in actions:
                self._record(action, snap)
                if action.step == STEP_RECLAIM:
                    reclaims.append(action)
                elif action.step == STEP_SUSPEND and self._checkpoints(action.subjob_id):
                    self._stop_beside(action, snap, now)
                else:
                    await self._execute(action, snap, now)
            if reclaims:
                await asyncio.gather(*(self._execute(a, snap, now) for a in reclaims))
            return actions

    def _record(self, action: Action, snap: Snapshot) -> None:
        """Log, journal and count one decision (before it is carried out, or instead of it)."""
        dry_run = self.config.dry_run
        view = next((s for s in snap.subjobs if s.subjob_id == action.subjob_id), None)
        freed = self._gpu_bytes_freed(action, view)
        log.info(
            "airlock %s%s subjob %s on %s (expected %d bytes freed): %s",
            "(dry-run) " if dry_run else "",
            action.step,
            action.subjob_id,
            action.slice_id,
            freed,
            action.reason,
        )
        self.node.journal.append_action(
            action.step,
            action.subjob_id,
            action.slice_id,
            action.reason,
            max(0, freed),
            dry_run,
            end_cause=EndCause.RECLAIMED.token if action.step == STEP_RECLAIM else "",
        )
        if self.metrics is None:
            return
        lost = 0.0
        if view is not None and action.step in (STEP_RECLAIM, STEP_READDRESS):
            lost = view.work_since_checkpoint_seconds * max(1, view.gpu_count)
        freeing = action.step in (STEP_SUSPEND, STEP_RELEASE_MEMORY, STEP_RECLAIM)
        self.metrics.record_airlock_action(
            action.step,
            reason_class(action),
            resource="host" if action.slice_id == HOST_SLICE_ID else "gpu",
            bytes_freed=max(0, freed) if freeing else 0,
            work_lost_gpu_seconds=lost,
            dry_run=dry_run,
        )

    def _gpu_bytes_freed(self, action: Action, view: SubjobView | None) -> int:
        """What ``action`` frees on its GPU slice: the policy's figure, less what a
        suspended subjob holds in host memory through cuda-checkpoint. The policy counts a
        checkpointed subjob at what it holds (its resume takes that back), but its reclaim
        or move frees none of it on the GPU: the suspend that moved it out was counted."""
        held = self._held.get(action.subjob_id)
        if not held or view is None or not view.suspended or action.slice_id == HOST_SLICE_ID:
            return action.expected_bytes_freed
        if action.step not in (STEP_RECLAIM, STEP_READDRESS):
            return action.expected_bytes_freed
        on_host = sum(held.values()) // max(1, len(view.slice_ids))
        return max(0, action.expected_bytes_freed - on_host)

    async def _execute(self, action: Action, snap: Snapshot, now: float) -> None:
        if action.step == STEP_READDRESS:
            self.episodes.applied(action, now)
            log.info(
                "airlock: subjob %s handed to the zone router for re-addressing: %s",
                action.subjob_id,
                action.reason,
            )
            return
        signal = _SIGNAL_BY_STEP.get(action.step)
        if signal is None:
            log.warning("airlock: unknown step %r for subjob %s", action.step, action.subjob_id)
            return
        if action.step == STEP_RECLAIM:
            grace = 0.0 if self.oom_killer_baseline else self.reclaim_grace_seconds
            reason = f"{RECLAIMED_PREFIX}{action.reason}"
        else:
            reason, grace = f"airlock: {action.reason}", 0.0
        if action.step == STEP_SUSPEND:
            # While it runs, then it is stopped.
            await self._checkpoint(action.subjob_id)
        try:
            cause = EndCause.RECLAIMED if action.step == STEP_RECLAIM else EndCause.TERMINATED
            await self.node.signal(action.subjob_id, signal, reason, grace, cause=cause)
        except Exception as exc:  # the subjob may have ended since the snapshot
            log.warning("airlock %s of %s failed: %s", action.step, action.subjob_id, exc)
            return
        if action.step == STEP_SUSPEND:
            self._suspended[action.subjob_id] = self._suspensions(action.subjob_id)
        elif action.step == STEP_RESUME:
            self._suspended.pop(action.subjob_id, None)
        if action.step == STEP_RESUME:
            # Continued first: cuda-checkpoint restores only a running process (on a
            # stopped one it never answers: seen on an H200, driver 580). Until the
            # restore its CUDA calls wait, so it touches no GPU memory before then.
            await self._restore(action.subjob_id)
        self._track(action, snap, now)

    async def _restore_running(self) -> None:
        """Restore what is still held of subjobs that run (a restore that failed, an
        operator's resume, a stop during a checkpoint); not those being suspended now, nor
        those being stopped (their memory would go back to a GPU they are leaving), nor
        one whose restore failed lately (:class:`RetryBackoff`)."""
        live = self.node.live_states
        terminating = self.node.terminating
        now = time.monotonic()
        for subjob_id in [s for s in self._held if live.get(s) == "RUNNING"]:
            if subjob_id in self._stopping or subjob_id in terminating:
                continue
            if self._restore_retry.is_due(subjob_id, now):
                await self._restore(subjob_id)

    def _cannot_resume(self, action: Action) -> bool:
        """A resume that could not bring the subjob's CUDA state back (no cuda-checkpoint
        any more): it stays suspended, where the ladder may re-address or reclaim it,
        rather than run with its state on the host (its CUDA calls would wait forever)."""
        if action.step != STEP_RESUME or action.subjob_id not in self._held:
            return False
        if self.node.backend.cuda_checkpoint.tool is not None:
            return False
        if action.subjob_id not in self._unrestorable:
            self._unrestorable.add(action.subjob_id)
            log.error(
                "airlock: subjob %s stays suspended: its CUDA state is on the host and "
                "there is no cuda-checkpoint to restore it (inventory.cuda_checkpoint)",
                action.subjob_id,
            )
        return True

    def _checkpoints(self, subjob_id: str) -> bool:
        """Whether suspending ``subjob_id`` runs cuda-checkpoint (slow: it copies memory)."""
        static = self._static.get(subjob_id)
        return (
            self.node.backend.cuda_checkpoint.tool is not None
            and static is not None
            and static.free_mode == "checkpoint"
            and bool(self._gpu_pids.get(subjob_id))
        )

    def _stop_beside(self, action: Action, snap: Snapshot, now: float) -> None:
        """Carry out a suspend through cuda-checkpoint beside the polls (see ``_stopping``)."""

        async def run() -> None:
            try:
                await self._execute(action, snap, now)
            except Exception:
                log.exception("airlock: suspend of %s failed", action.subjob_id)
            finally:
                self._stopping.pop(action.subjob_id, None)
                self._totals_stale = True  # GPU totals read before now may still hold it

        view = next((v for v in snap.subjobs if v.subjob_id == action.subjob_id), None)
        slices = len(view.slice_ids) if view is not None else 1
        task = asyncio.create_task(run(), name=f"airlock-suspend-{action.subjob_id}")
        bytes_freed = max(0, action.expected_bytes_freed) * slices
        self._stopping[action.subjob_id] = _SuspendUnderWay(task, bytes_freed)

    async def close(self) -> None:
        """The agent is stopping (its subjobs keep running): let the suspends under way
        end, for a while. A cancelled toggle would go on copying after the agent is gone
        and leave a running subjob's state on the host unrecorded; one that ends is
        recorded (and restored by the next agent if the subjob runs)."""
        tasks = [under_way.task for under_way in self._stopping.values()]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=CLOSE_WAIT_SECONDS)
        for task in late:
            log.error(
                "airlock: %s still under way after %.0f s at stop; cancelled (a process it "
                "was copying may keep its CUDA state on the host)",
                task.get_name(),
                CLOSE_WAIT_SECONDS,
            )
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _checkpoint(self, subjob_id: str) -> None:
        """Before a suspend: move the CUDA state of the subjob's processes to host memory,
        where cuda-checkpoint can (its free mode says so), one process at a time (each
        copies device memory), each recorded with what it held on the GPU just before.

        A tool that reads a process's state (R570 and later) has each pid journaled before
        its toggle: an agent stopped or killed during the copy leaves a record that the
        next run reconciles with the tool (:meth:`_restore` moves only what is on the
        host). R550's tool toggles blindly, so there a pid is journaled once it is done.
        The first toggle that fails ends the suspend's checkpoints (each further one would
        wait its own timeout while the suspend counts as relief under way)."""
        tool = self.node.backend.cuda_checkpoint.tool
        if tool is None or not self._checkpoints(subjob_id):
            return
        self.node.core.checkpointing(subjob_id, True)  # a SignalSubjob(SUSPEND) now is refused
        try:
            await self._checkpoint_pids(subjob_id)
        finally:
            self.node.core.checkpointing(subjob_id, False)

    async def _checkpoint_pids(self, subjob_id: str) -> None:
        tool = self.node.backend.cuda_checkpoint.tool
        assert tool is not None  # the caller checks
        for pid in self._gpu_pids[subjob_id]:
            used = self._pid_bytes.get(pid, 0)  # the latest poll's, taken at its turn
            held = self._held.setdefault(subjob_id, {})
            if tool.reads_state:
                held[pid] = used
                self._save_held()
            done = await self._toggle(subjob_id, pid, "checkpoint")
            if done:
                held[pid] = used
            else:
                held.pop(pid, None)
            if not held:
                del self._held[subjob_id]
            self._save_held()
            if not done:
                break

    async def _restore(self, subjob_id: str) -> None:
        """After a resume (or at a poll that finds the subjob running with state still
        held): bring back the CUDA state :meth:`_checkpoint` moved out. A process gone or
        no longer the subjob's is forgotten; one whose restore fails is tried again at the
        next poll."""
        held = self._held.get(subjob_id)
        if not held:
            return
        if self.node.backend.cuda_checkpoint.tool is None:
            if subjob_id not in self._unrestorable:
                self._unrestorable.add(subjob_id)
                log.error(
                    "airlock: subjob %s has CUDA state on the host (pid(s) %s) and no "
                    "cuda-checkpoint to restore it (inventory.cuda_checkpoint)",
                    subjob_id,
                    ", ".join(map(str, held)),
                )
            return
        for pid in list(held):
            if not self._owns(subjob_id, pid) or await self._toggle(subjob_id, pid, "restore"):
                del held[pid]
                if not held:
                    del self._held[subjob_id]
                self._save_held()  # at once: a stop before the next pid leaves it right
            # (a failed restore, retried later, writes nothing)
        if subjob_id not in self._held:
            self._restore_retry.reset(subjob_id)
            return
        wait = self._restore_retry.failed(subjob_id, time.monotonic())
        log.warning(
            "airlock: subjob %s keeps CUDA state of pid(s) %s on the host; next restore try "
            "in %.1f s",
            subjob_id,
            ", ".join(map(str, held)),
            wait,
        )

    def _owns(self, subjob_id: str, pid: int) -> bool:
        """Whether ``pid`` is still a process of the subjob (a journaled pid may have ended
        and been reused while the agent was down: a toggle flips whatever it names)."""
        root = self.node.executor.pid_of(subjob_id)
        if root is None:
            return False
        try:
            process = psutil.Process(pid)
            return pid == root or any(p.pid == root for p in process.parents())
        except psutil.Error:
            return False

    def _load_held(self) -> None:
        """What an earlier run of this agent checkpointed and has not restored yet."""
        raw = self.node.journal.get_meta(HELD_META) or "{}"
        try:
            saved = json.loads(raw)
            held = {
                str(subjob_id): {int(pid): int(used) for pid, used in pids.items()}
                for subjob_id, pids in saved.items()
            }
        except (ValueError, TypeError, AttributeError) as exc:
            log.error("airlock: journal meta %s unreadable (%s): ignored: %r", HELD_META, exc, raw)
            return
        self._held = {subjob_id: pids for subjob_id, pids in held.items() if pids}

    def _save_held(self) -> None:
        saved = {
            subjob_id: {str(pid): used for pid, used in pids.items()}
            for subjob_id, pids in self._held.items()
        }
        self.node.journal.set_meta(HELD_META, json.dumps(saved, sort_keys=True))

    async def _toggle(self, subjob_id: str, pid: int, direction: str) -> bool:
        """Move ``pid``'s CUDA state to the host (``direction`` "checkpoint") or back
        ("restore"); whether it is there now (it may have been already: a tool that reads
        the state toggles only the way asked for)."""
        tool = self.node.backend.cuda_checkpoint.tool
        assert tool is not None  # callers check: a checkpoint needs it, a restore waits
        want = STATE_CHECKPOINTED if direction == "checkpoint" else STATE_RUNNING
        try:
            done = await tool.to_state(pid, want)
        except (ToggleFailed, OSError) as exc:
            log.warning(
                "airlock: cuda-checkpoint %s of subjob %s failed: %s", direction, subjob_id, exc
            )
            outcome = "failed"
        else:
            log.info(
                "airlock: cuda-checkpoint %s of subjob %s: pid %d%s",
                direction,
                subjob_id,
                pid,
                "" if done else f" was {want} already",
            )
            outcome = "ok" if done else "already"
        if self.metrics is not None:
            self.metrics.airlock_cuda_checkpoint_toggles_total.labels(direction, outcome).inc()
        return outcome != "failed"

    def _track(self, action: Action, snap: Snapshot, now: float) -> None:
        backend = self.node.backend
        fake = backend if isinstance(backend, FakeGpuBackend) else None
        view = next((s for s in snap.subjobs if s.subjob_id == action.subjob_id), None)
        self.episodes.applied(action, now)
        if action.step == STEP_SUSPEND:
            if fake is not None:
                # A suspended fake subjob gives its memory back, as cuda-checkpoint would.
                fake.detach_subjob(action.subjob_id)
        elif action.step == STEP_RESUME:
            static = self._static.get(action.subjob_id)
            if fake is not None and view is not None and static is not None and static.devices:
                fake.attach_subjob(
                    action.subjob_id,
                    list(static.devices),
                    view.declared_bytes,
                    self.node.executor.gpu_mem_file(action.subjob_id),
                )
