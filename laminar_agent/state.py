"""The agent's in-memory state: the GPU backend, draining flag, and their protobuf views.

The ledger, executor and journal attach here as they land; this module holds no
gRPC code, only the translation of state into API messages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import psutil
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from laminar_agent.airlock_driver import AirlockDriver
from laminar_agent.cgroups import SubjobCgroups
from laminar_agent.config import AirlockSettings
from laminar_agent.core import GpuPressure
from laminar_agent.executor import RunAs
from laminar_agent.heartbeat import action_message
from laminar_agent.inventory import GpuBackend
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.metrics import HOST_LABEL_VALUES, AgentMetrics, gpu_label_values
from laminar_agent.node import Node
from laminar_airlock.levels import Level, LevelTracker, Marks
from laminar_airlock.signals import HostMemory, HostMemorySource, PsutilHostMemory
from laminar_api.v1 import agent_pb2, common_pb2
from laminar_base.errors import LaminarError

log = logging.getLogger("laminar.agent")

VERSION = "0.1.0"
HOST_KEY = "host"
_PSI_KEY = "host-psi"
#: Journal meta key of the drain flag and its reason (JSON ``{"draining", "reason"}``): a
#: restarted agent (an upgrade, a crash, the watchdog) drains on until an operator undrains.
DRAIN_META = "drain"
_LEVEL_NAMES = {Level.NORMAL: "normal", Level.ELEVATED: "elevated", Level.CRITICAL: "critical"}


class AgentState:
    def __init__(
        self,
        agent_id: str,
        backend: GpuBackend,
        metrics: AgentMetrics,
        state_dir: Path,
        *,
        batch_seconds: float = 0.001,
        lease_ttl_seconds: float = 0.2,
        airlock: AirlockSettings | None = None,
        host_memory: HostMemorySource | None = None,
        max_windows: int = 16,
        run_as: RunAs | None = None,
        tenant_users: Mapping[str, RunAs] | None = None,
        uid_pool: range | None = None,
        cgroups: SubjobCgroups | None = None,
        mig_on_demand: bool = False,
        mig_carve_busy: bool = True,
        host_totals: tuple[int, int] = (0, 0),
    ) -> None:
        """``host_memory`` replaces psutil as the host signal (tests, simulation); ``run_as``
        is the identity subjob commands take (None: the agent's own), ``tenant_users`` and
        ``uid_pool`` give tenants users of their own (see
        :class:`~laminar_agent.executor.TenantIdentities`), ``cgroups`` a cgroup per subjob."""
        self.agent_id = agent_id
        self.hostname = socket.gethostname()
        self.backend = backend
        self.metrics = metrics
        self.address = ""
        self.generation = 0
        settings = airlock if airlock is not None else AirlockSettings()
        self.airlock_settings = settings
        self.node = Node(
            agent_id,
            backend,
            state_dir,
            batch_seconds=batch_seconds,
            lease_ttl_seconds=lease_ttl_seconds,
            preempt_grace_seconds=settings.reclaim_grace_seconds,
            airlock_dry_run=settings.dry_run,
            metrics=metrics,
            max_windows=max_windows,
            run_as=run_as,
            tenant_users=tenant_users,
            uid_pool=uid_pool,
            cgroups=cgroups,
            mig_on_demand=mig_on_demand,
            mig_carve_busy=mig_carve_busy,
            host_totals=host_totals,
        )
        #: Pressure levels per device with hysteresis (Airlock's signal stage).
        self.levels = LevelTracker(settings.slice_marks())
        self.level_by_device: dict[str, Level] = {}
        #: Host memory: its own marks; PSI (where present) can hold it at ELEVATED.
        self.host_source: HostMemorySource = (
            host_memory if host_memory is not None else PsutilHostMemory()
        )
        self.host_levels = LevelTracker(settings.host_marks())
        psi = settings.host_psi_elevated_percent / 100.0
        self._psi_levels = (
            LevelTracker(
                Marks(
                    elevated_ratio=psi,
                    critical_ratio=1.0,
                    clear_ratio=psi / 2,
                    hold_seconds=settings.hold_seconds,
                )
            )
            if psi > 0
            else None
        )
        self.host_level = Level.NORMAL
        self.host_sample: HostMemory | None = None
        self._kind_by_device = {s.device_uuid: s.kind for s in self.node.slices}
        #: Why the agent drains (or was last undrained): the operator's words.
        self.drain_reason = ""
        self.restore_draining()
        self._labels_by_device = gpu_label_values(backend.gpus())
        self._last_poll: float | None = None
        #: GPUs held back from new work because their driver calls fail: key -> why.
        self._degraded: dict[str, str] = {}
        #: Runs the Airlock ladder on each tick's readings.
        self.airlock = AirlockDriver(
            self.node,
            self.levels,
            settings.policy_config(),
            metrics=metrics,
            reclaim_grace_seconds=settings.reclaim_grace_seconds,
            oom_killer_baseline=settings.policy == "oom-killer",
            poll_seconds=settings.poll_seconds,
        )

    @property
    def is_draining(self) -> bool:
        return self.node.is_draining

    def restore_draining(self) -> None:
        """Take the drain flag and reason the journal kept across a restart, before the
        agent serves or sends its first heartbeat (each heartbeat overwrites the router's
        copy of the flag). An entry that does not read keeps the host drained: an operator
        undrains it, which writes the entry again."""
        raw = self.node.journal.get_meta(DRAIN_META)
        if raw is None:
            return
        try:
            saved = json.loads(raw)
            draining, reason = bool(saved["draining"]), str(saved["reason"])
        except (ValueError, TypeError, KeyError) as exc:
            log.warning(
                "agent %s: journal meta %r does not read (%s): draining until undrained",
                self.agent_id,
                DRAIN_META,
                exc,
            )
            draining, reason = True, "unreadable drain entry in the journal"
        self.node.is_draining = draining
        self.drain_reason = reason
        self.metrics.draining.set(1 if draining else 0)
        if draining:
            log.info("agent %s still draining (kept in the journal): %s", self.agent_id, reason)

    @property
    def fake_backend(self) -> FakeGpuBackend | None:
        return self.backend if isinstance(self.backend, FakeGpuBackend) else None

    def set_draining(self, draining: bool, reason: str) -> None:
        """Drain or undrain, journaled first so that a restart keeps it."""
        if draining != self.is_draining:
            log.info(
                "agent %s %s: %s", self.agent_id, "draining" if draining else "undrained", reason
            )
        self.node.journal.set_meta(
            DRAIN_META, json.dumps({"draining": draining, "reason": reason}, sort_keys=True)
        )
        self.node.is_draining = draining
        self.drain_reason = reason
        self.metrics.draining.set(1 if draining else 0)

    async def read_memory(self) -> dict[str, tuple[int, int]]:
        """The backend's per-device memory, read on a worker thread: an NVML call may take
        up to its deadline (a wedged driver), and the event loop must keep answering
        probes and sending heartbeats meanwhile."""
        return await asyncio.to_thread(self.backend.memory_used)

    def poll_memory(
        self, readings: dict[str, tuple[int, int]] | None = None
    ) -> dict[str, tuple[int, int]]:
        """Update per-device and host memory levels from ``readings`` (as :meth:`read_memory`
        returns them; None reads them here, blocking) and publish them as metrics."""
        if readings is None:
            readings = self.backend.memory_used()
        self.metrics.leases.set(self.node.ledger.pending_leases())
        states = list(self.node.live_states.values())
        for state in ("STARTING", "RUNNING", "SUSPENDED"):
            self.metrics.subjobs.labels(state.lower()).set(states.count(state))
        now = time.monotonic()
        elapsed = 0.0 if self._last_poll is None else max(0.0, now - self._last_poll)
        self._last_poll = now
        for uuid, (used, total) in readings.items():
            level = self.levels.update(uuid, used, total, now)
            self.level_by_device[uuid] = level
            labels = self._labels_by_device.get(uuid) or ("", uuid, "", "", "", "")
            self.metrics.gpu_memory_used_bytes.labels(*labels).set(used)
            self.metrics.gpu_memory_total_bytes.labels(*labels).set(total)
            self.metrics.airlock_level.labels(*labels).set(int(level))
            if elapsed:
                self.metrics.airlock_level_seconds_total.labels(
                    self._device_kind(uuid), _LEVEL_NAMES[level]
                ).inc(elapsed)
        # New work is admitted by this poll (AgentCore.pressure_refusal); a dry run
        # changes nothing, admission included.
        self.node.core.note_pressure(
            {}
            if self.airlock.dry_run
            else {
                self.node.slice_name(uuid): GpuPressure(self.level_by_device[uuid], used, total)
                for uuid, (used, total) in readings.items()
            },
            self.airlock_settings.critical_ratio,
        )
        self._poll_host(now, elapsed)
        self._hold_degraded()
        self._end_work_on_failed_gpus()
        return readings

    def _end_work_on_failed_gpus(self) -> None:
        """A GPU that failed (an Xid that needs a reset, off the bus) ends its subjobs; it is
        held back already (it is degraded), so their capacity goes to no one."""
        for failure in self.backend.take_failures():
            reason = f"GPU {failure.gpu_index} ({failure.gpu_uuid}) failed: {failure.reason}"
            ended = self.node.end_subjobs_on_gpu(failure.gpu_index, reason)
            log.warning("%s: ending subjob(s) %s", reason, ", ".join(ended) or "none")

    def add_degraded_gpus(
        self, out: RepeatedCompositeFieldContainer[common_pb2.DegradedGpu]
    ) -> None:
        """Append the GPUs held back from new work, and why, to ``out``."""
        if not self._degraded:
            return
        failed = self.backend.failed()
        index_of = {g.uuid: g.index for g in self.backend.gpus()}
        for key, why in sorted(self._degraded.items()):
            index = index_of.get(key, int(key[3:]) if key[3:].isdigit() else 0)
            out.add(
                index=index,
                uuid="" if key not in index_of else key,
                reason=failed.get(key, why),
                failed=key in failed,
            )

    def _hold_degraded(self) -> None:
        """A GPU whose driver calls fail takes no new work: its slices are held back
        (no lease, none advertised) until it answers again (running work is left to
        Airlock and its fence)."""
        now = self.backend.degraded()
        if now.keys() == self._degraded.keys():
            return
        index_of = {g.uuid: g.index for g in self.backend.gpus()}
        ledger = self.node.ledger
        for key in sorted(now.keys() - self._degraded.keys()):
            index = index_of.get(key)
            if index is None and key.startswith("gpu") and key[3:].isdigit():
                index = int(key[3:])
            slice_ids = [s.slice_id for s in ledger.slices.values() if s.gpu_index == index]
            try:
                ledger.hold_back(key, slice_ids)
            except LaminarError as exc:  # a preemption holds it now: try again next poll
                log.info("GPU %s degraded; holding it back waits: %s", key, exc)
                continue
            self._degraded[key] = now[key]
            log.warning("GPU %s degraded (%s): no new work on it", key, now[key])
        for key in sorted(self._degraded.keys() - now.keys()):
            ledger.release_hold(key)
            del self._degraded[key]
            log.info("GPU %s answers again: it takes new work", key)
        self.metrics.gpus_degraded.set(len(self._degraded))

    def _device_kind(self, uuid: str) -> str:
        kind = self._kind_by_device.get(uuid)
        return "gpu" if kind is None else kind.name.lower()

    def _poll_host(self, now: float, elapsed: float) -> None:
        try:
            sample = self.host_source.read()
        except Exception as exc:  # a broken source must not stop the tick loop
            log.warning("host memory signal unreadable: %s", exc)
            return
        self.host_sample = sample
        level = self.host_levels.update(HOST_KEY, sample.used_bytes, sample.total_bytes, now)
        if self._psi_levels is not None and sample.psi_some_avg10 is not None:
            psi = self._psi_levels.update(_PSI_KEY, int(sample.psi_some_avg10 * 100), 10000, now)
            level = max(level, min(psi, Level.ELEVATED))
        self.host_level = level
        self.metrics.airlock_level.labels(*HOST_LABEL_VALUES).set(int(level))
        if elapsed:
            self.metrics.airlock_level_seconds_total.labels(HOST_KEY, _LEVEL_NAMES[level]).inc(
                elapsed
            )

    @property
    def pressure(self) -> Level:
        """The worst level on this host: host memory or any device."""
        return max([self.host_level, *self.level_by_device.values()])

    def inventory_message(
        self, readings: dict[str, tuple[int, int]] | None = None
    ) -> agent_pb2.Inventory:
        """The inventory with ``readings`` (:meth:`read_memory`; None reads them here)."""
        readings = self.poll_memory(readings)
        host = psutil.virtual_memory()
        inv = agent_pb2.Inventory(
            agent_id=self.agent_id,
            hostname=self.hostname,
            backend=self.backend.name,
            driver_version=self.backend.driver_version(),
            host_memory_total_bytes=host.total,
            host_memory_available_bytes=host.available,
            draining=self.is_draining,
            version=VERSION,
            cuda_checkpoint_available=self.backend.cuda_checkpoint.is_available,
            cuda_checkpoint_detail=self.backend.cuda_checkpoint.detail,
        )
        self.add_degraded_gpus(inv.degraded_gpus)
        for gpu in self.backend.gpus():
            used, _ = readings.get(gpu.uuid, (0, gpu.memory_total_bytes))
            msg = inv.gpus.add(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                memory_total_bytes=gpu.memory_total_bytes,
                memory_used_bytes=used,
                mig_enabled=gpu.mig_enabled,
                shared=gpu.shared,
            )
            for mig in gpu.mig_instances:
                mig_used, _ = readings.get(mig.uuid, (0, mig.memory_total_bytes))
                msg.mig_instances.add(
                    uuid=mig.uuid,
                    profile=mig.profile,
                    memory_total_bytes=mig.memory_total_bytes,
                    memory_used_bytes=mig_used,
                    start=mig.start,
                    size=mig.size,
                )
        self._add_slice_status(inv, readings)
        return inv

    def _add_slice_status(
        self, inv: agent_pb2.Inventory, readings: dict[str, tuple[int, int]]
    ) -> None:
        """What the ledger holds per slice, so an operator (or a test) can see that no slice
        is committed or leased past its capacity."""
        ledger = self.node.ledger
        holders: dict[str, list[str]] = {}
        for lease in ledger.leases():
            if lease.committed and lease.subjob_id:
                for allocation in lease.allocations:
                    holders.setdefault(allocation.slice_id, []).append(lease.subjob_id)
        for s in self.node.slices:
            committed_milli, leased_milli, committed_bytes, leased_bytes = ledger.usage(s.slice_id)
            used, _ = readings.get(s.device_uuid, (0, s.memory_total_bytes))
            level = self.level_by_device.get(s.device_uuid, Level.NORMAL)
            inv.slices.add(
                slice_id=s.slice_id,
                kind=s.kind.value,
                gpu_index=s.gpu_index,
                device_uuid=s.device_uuid,
                mig_profile=s.mig_profile,
                gpu_model=s.gpu_model,
                memory_total_bytes=s.memory_total_bytes,
                memory_used_bytes=used,
                capacity_milli=s.capacity_milli,
                committed_milli=committed_milli,
                leased_milli=leased_milli,
                committed_memory_bytes=committed_bytes,
                leased_memory_bytes=leased_bytes,
                pressure=int(level),
                subjob_ids=sorted(holders.get(s.slice_id, [])),
            )

    def fill_summary(self, summary: common_pb2.AgentSummary) -> None:
        """Add what only the daemon knows (address, hostname, generation) to a node summary."""
        self.generation += 1
        summary.pressure = int(self.pressure)  # type: ignore[assignment]
        summary.address = self.address
        summary.hostname = self.hostname
        summary.generation = self.generation
        self.add_degraded_gpus(summary.degraded_gpus)

    def summary_message(self, *, with_windows: bool = False) -> common_pb2.AgentSummary:
        pressured = frozenset(
            self.node.slice_name(uuid)
            for uuid, level in self.level_by_device.items()
            if level != Level.NORMAL
        )
        summary = self.node.summary(with_windows=with_windows, pressured=pressured)
        self.fill_summary(summary)
        return summary

    def airlock_message(
        self, max_actions: int, readings: dict[str, tuple[int, int]] | None = None
    ) -> agent_pb2.AirlockState:
        """Current pressure levels, suspended subjobs and the ladder's recent actions;
        ``readings`` as :meth:`read_memory` returns them (None reads them here)."""
        if readings is None:
            readings = self.backend.memory_used()
        host = self.host_sample
        state = agent_pb2.AirlockState(
            host_level=int(self.host_level),  # type: ignore[arg-type]
            host_memory_used_bytes=host.used_bytes if host is not None else 0,
            host_memory_total_bytes=host.total_bytes if host is not None else 0,
            dry_run=self.airlock.dry_run,
        )
        for uuid in sorted(readings, key=self.node.slice_name):
            used, total = readings[uuid]
            level = self.level_by_device.get(uuid, Level.NORMAL)
            state.slices.add(
                slice_id=self.node.slice_name(uuid),
                level=int(level),
                used_bytes=used,
                total_bytes=total,
            )
        for subjob in self.node.reads.list("", [common_pb2.SUSPENDED], 0):
            state.suspended.append(subjob)
        for row in self.node.journal.recent_actions(max_actions or 50):
            state.recent_actions.append(action_message(row))
        return state
