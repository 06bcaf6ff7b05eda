"""Drives the pure Airlock ladder (``airlock.policy.decide``) from the agent's tick.

The policy is a pure function; this module gathers its inputs from the node (live
subjobs, their specs and usage files) and the backend (memory per device, levels from
the tracker), then carries out the actions through ``Node.signal`` and journals each
one, so what Airlock did can be read back with GetAirlock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from airlock.levels import LevelTracker
from airlock.policy import (
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
)
from laminar_agent.inventory.fake import FakeGpuBackend, read_usage_file
from laminar_agent.node import Node
from laminar_api.v1 import agent_pb2, common_pb2

log = logging.getLogger("laminar.agent.airlock")

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
    started_unix: float


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
    ) -> None:
        self.node = node
        self.levels = levels
        self.config = config if config is not None else PolicyConfig()
        self._lock = asyncio.Lock()
        #: Monotonic time each subjob was suspended by Airlock (for readdress/reclaim age).
        self._suspended_since: dict[str, float] = {}
        self._readdress_counts: dict[str, int] = {}
        self._static: dict[str, _StaticView] = {}

    @property
    def is_busy(self) -> bool:
        return self._lock.locked()

    def snapshot(self, readings: dict[str, tuple[int, int]], now: float) -> Snapshot | None:
        """The policy's input, or None when no subjob is live (nothing to decide)."""
        live = dict(self.node.live_states)
        if not live:
            return None
        views: list[SubjobView] = []
        device_ids: set[str] = set()
        for subjob_id in list(self._static):
            if subjob_id not in live:
                del self._static[subjob_id]
        for subjob_id in sorted(live):
            static = self._static_of(subjob_id)
            if static is None or not static.devices:
                continue
            devices = static.devices
            device_ids.update(devices)
            suspended = live[subjob_id] == "SUSPENDED"
            since = self._suspended_since.get(subjob_id)
            if suspended and since is None:
                since = now
                self._suspended_since[subjob_id] = now
            views.append(
                SubjobView(
                    subjob_id=subjob_id,
                    job_id=static.job_id,
                    slice_ids=devices,
                    priority=static.priority,
                    lifecycle=static.lifecycle,
                    declared_bytes=static.declared_bytes,
                    observed_bytes=self._observed_bytes(subjob_id, static.declared_bytes),
                    started_at=static.started_unix,
                    work_since_checkpoint_seconds=max(0.0, time.time() - static.started_unix)
                    if static.started_unix
                    else 0.0,
                    suspended=suspended,
                    suspended_since=since if suspended else None,
                    readdress_count=self._readdress_counts.get(subjob_id, 0),
                    free_mode=static.free_mode,
                    restartable=static.restartable,
                    gpu_count=len(devices),
                )
            )
        if not views:
            return None
        slices = []
        for uuid in sorted(set(readings) | device_ids):
            used, total = readings.get(uuid, (0, 0))
            if uuid not in device_ids and used <= 0:
                continue
            slices.append(SliceSignal(uuid, used, total, self.levels.level(uuid)))
        return Snapshot(now=now, slices=tuple(slices), subjobs=tuple(views))

    def _static_of(self, subjob_id: str) -> _StaticView | None:
        """What never changes about a live subjob, read from the journal once, not every tick."""
        cached = self._static.get(subjob_id)
        if cached is not None:
            return cached
        row = self.node.journal.get_subjob(subjob_id)
        if row is None:
            return None
        spec = common_pb2.SubjobSpec.FromString(row.spec_blob)
        view = _StaticView(
            job_id=row.job_id,
            devices=tuple(sorted(json.loads(row.device_uuids_json or "[]"))),
            priority=int(spec.priority) or common_pb2.BATCH,
            lifecycle=int(spec.lifecycle) or common_pb2.LONG,
            declared_bytes=int(spec.resources.gpu_memory_bytes),
            free_mode="release_signal" if spec.supports_release_signal else "checkpoint",
            restartable=spec.restartable,
            started_unix=row.started_unix,
        )
        if row.started_unix:  # STARTING rows still get their start time; read them again
            self._static[subjob_id] = view
        return view

    def _observed_bytes(self, subjob_id: str, declared_bytes: int) -> int:
        """What the subjob reports in its usage file; the declaration if absent or bad."""
        return read_usage_file(self.node.executor.subjob_dir(subjob_id) / "gpu_mem", declared_bytes)

    async def step_logged(self, readings: dict[str, tuple[int, int]]) -> None:
        """``step`` for a background task: an error is logged, never lost or raised."""
        try:
            await self.step(readings)
        except Exception:
            log.exception("airlock step failed")

    async def step(self, readings: dict[str, tuple[int, int]]) -> list[Action]:
        """One decide/execute round; returns the actions carried out (none if busy)."""
        if self._lock.locked() or not self.node.live_states:
            return []
        async with self._lock:
            now = time.monotonic()
            snap = self.snapshot(readings, now)
            if snap is None:
                return []
            actions = decide(snap, self.config)
            for action in actions:
                await self._execute(action, snap, now)
            return actions

    async def _execute(self, action: Action, snap: Snapshot, now: float) -> None:
        dry_run = self.config.dry_run
        log.info(
            "airlock %s%s subjob %s on %s (expected %d bytes freed): %s",
            "(dry-run) " if dry_run else "",
            action.step,
            action.subjob_id,
            action.slice_id,
            action.expected_bytes_freed,
            action.reason,
        )
        self.node.journal.append_action(
            action.step,
            action.subjob_id,
            action.slice_id,
            action.reason,
            max(0, action.expected_bytes_freed),
            dry_run,
        )
        if dry_run:
            return
        if action.step == STEP_READDRESS:
            # No zone path to move the subjob yet: the action is recorded only.
            self._readdress_counts[action.subjob_id] = (
                self._readdress_counts.get(action.subjob_id, 0) + 1
            )
            return
        signal = _SIGNAL_BY_STEP.get(action.step)
        if signal is None:
            log.warning("airlock: unknown step %r for subjob %s", action.step, action.subjob_id)
            return
        try:
            await self.node.signal(action.subjob_id, signal, f"airlock: {action.reason}", 0.0)
        except Exception as exc:  # the subjob may have ended since the snapshot
            log.warning("airlock %s of %s failed: %s", action.step, action.subjob_id, exc)
            return
        self._track(action, snap, now)

    def _track(self, action: Action, snap: Snapshot, now: float) -> None:
        backend = self.node.backend
        fake = backend if isinstance(backend, FakeGpuBackend) else None
        view = next((s for s in snap.subjobs if s.subjob_id == action.subjob_id), None)
        if action.step == STEP_SUSPEND:
            self._suspended_since[action.subjob_id] = now
            if fake is not None:
                # A suspended fake subjob gives its memory back, as cuda-checkpoint would.
                fake.detach_subjob(action.subjob_id)
        elif action.step == STEP_RESUME:
            self._suspended_since.pop(action.subjob_id, None)
            if fake is not None and view is not None:
                fake.attach_subjob(
                    action.subjob_id,
                    list(view.slice_ids),
                    view.declared_bytes,
                    self.node.executor.subjob_dir(action.subjob_id) / "gpu_mem",
                )
        elif action.step == STEP_RECLAIM:
            self._suspended_since.pop(action.subjob_id, None)
            self._readdress_counts.pop(action.subjob_id, None)
