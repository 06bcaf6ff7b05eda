"""Backend-neutral description of the GPUs an agent owns.

The daemon and the scheduler see only these frozen records and the
:class:`GpuBackend` protocol, so the real NVML backend and the fake one used by
tests and the simulator are interchangeable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class MigInstanceInfo:
    """One MIG instance; ``start``/``size`` are memory-slice placement on its parent."""

    uuid: str
    profile: str
    memory_total_bytes: int
    start: int
    size: int
    #: NVML's GPU instance id (dcgm-exporter's ``GPU_I_ID``); -1 when unknown.
    gpu_instance_id: int = -1


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU; ``shared`` means fractional sharing is allowed (non-MIG only)."""

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    mig_enabled: bool
    mig_instances: tuple[MigInstanceInfo, ...]
    shared: bool


class CheckpointTool(Protocol):
    """NVIDIA's cuda-checkpoint as found on this host (see :mod:`.cuda_checkpoint`)."""

    @property
    def path(self) -> str: ...

    @property
    def reads_state(self) -> bool:
        """It tells a process's state (``--get-state``), so it moves one only the way asked."""
        ...

    async def to_state(self, pid: int, want: str) -> bool:
        """Move a process's CUDA state to host memory (``"checkpointed"``) or back
        (``"running"``); False if it was there already; raises on failure."""
        ...


@dataclass(frozen=True)
class CheckpointSupport:
    """What start-up found: the tool, or None and why not (``detail`` says either)."""

    tool: CheckpointTool | None
    detail: str

    @property
    def is_available(self) -> bool:
        return self.tool is not None


#: What a backend has until the agent looks for cuda-checkpoint (and on the fake backend).
NOT_DETECTED = CheckpointSupport(None, "not looked for")


@dataclass(frozen=True)
class GpuFailure:
    """A GPU failed under its work: an Xid that needs a reset, or it fell off the bus.

    The agent ends the subjobs on it (``EndCause.GPU_FAILED``); the GPU stays degraded
    (no new work) until NVML answers on it again."""

    gpu_uuid: str
    gpu_index: int
    reason: str
    #: The Xid NVML reported (79: fell off the bus); 0 when a call found the GPU lost.
    xid: int = 0


class GpuBackend(Protocol):
    """What the agent needs from a GPU inventory source."""

    name: str
    #: Whether stopping a subjob's processes frees their GPU memory on this backend
    #: (cuda-checkpoint, or the fake backend's emulation of it). When False, Airlock does
    #: not count a plain stop as relief: a victim without the release signal is reclaimed.
    frees_memory_on_suspend: bool
    #: Whether :meth:`process_memory` reports what the driver sees per process (NVML);
    #: when False, subjobs report their own use (the fake backend's usage file).
    per_process_memory: bool
    #: NVIDIA's cuda-checkpoint as the agent found it at start: with a tool, Airlock's
    #: suspend of a subjob on whole GPUs moves its CUDA state to host memory and back.
    cuda_checkpoint: CheckpointSupport

    def gpus(self) -> tuple[GpuInfo, ...]: ...

    def refresh(self) -> None:
        """Re-read the topology (MIG layout can change under us)."""
        ...

    def memory_used(self) -> dict[str, tuple[int, int]]:
        """Device uuid (each GPU and each MIG instance) -> (used_bytes, total_bytes).

        Polled every 100 ms, so it must be cheap.
        """
        ...

    def driver_version(self) -> str: ...

    def process_memory(self) -> dict[str, dict[int, int]]:
        """Device uuid -> pid -> GPU memory bytes the driver attributes to that process."""
        ...

    def degraded(self) -> dict[str, str]:
        """GPU uuid (or ``gpu<index>``) -> why, for GPUs whose driver calls fail now: the
        agent gives them no new work until they answer again. Failed GPUs are among them."""
        ...

    def failed(self) -> dict[str, str]:
        """The degraded GPUs that failed (:class:`GpuFailure`), GPU uuid -> why."""
        ...

    def take_failures(self) -> list[GpuFailure]:
        """GPUs that failed since the last call, each once per failure: the agent ends
        their subjobs."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class MigRepartitioner(Protocol):
    """A backend that can change a MIG GPU's layout (MIG on demand): the fake backend,
    and NVML's GPU-instance calls."""

    def apply_mig_layout(
        self, gpu_index: int, layout: Sequence[tuple[str, int, int]]
    ) -> tuple[MigInstanceInfo, ...]:
        """Give GPU ``gpu_index`` the instances of ``layout`` ((profile, start, size) each)
        and return them, touching only what changes (instances in both keep their UUID);
        refused while anything runs on an instance the layout drops."""
        ...
