"""GPU inventory: one :class:`GpuBackend` interface, an NVML and a fake implementation."""

from __future__ import annotations

from laminar_agent.inventory.base import GpuBackend, GpuFailure, GpuInfo, MigInstanceInfo
from laminar_base.errors import InvalidArgument

__all__ = [
    "GpuBackend",
    "GpuFailure",
    "GpuInfo",
    "MigInstanceInfo",
    "open_backend",
    "parse_shared_gpus",
]


def parse_shared_gpus(shared_gpus: str) -> frozenset[int] | None:
    """Parse "" (none), "all" (None = every non-MIG GPU) or comma-separated indices."""
    text = shared_gpus.strip()
    if text == "all":
        return None
    if not text:
        return frozenset()
    try:
        indices = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise InvalidArgument(
            f"expected '', 'all' or comma-separated GPU indices, got {shared_gpus!r}",
            field="shared_gpus",
        ) from None
    if any(i < 0 for i in indices):
        raise InvalidArgument(f"GPU indices must be >= 0, got {shared_gpus!r}", field="shared_gpus")
    return indices


def open_backend(
    name: str,
    *,
    fake_spec: str,
    agent_id: str,
    shared_gpus: str = "",
    nvml_mock: str = "",
) -> GpuBackend:
    """Build the backend named by config (``nvml`` or ``fake``).

    ``shared_gpus`` marks non-MIG GPUs that allow fractional sharing: "", "all",
    or comma-separated indices (the fake spec's ``:shared`` option adds to it).
    ``nvml_mock`` names a JSON scenario: the ``nvml`` backend then runs on the mocked
    NVML module instead of the driver (tests and demos; never the default).
    """
    shared = parse_shared_gpus(shared_gpus)
    if name == "fake":
        from laminar_agent.inventory.fake import MAX_GPUS, FakeGpuBackend

        indices = frozenset(range(MAX_GPUS)) if shared is None else shared
        return FakeGpuBackend(fake_spec, agent_id=agent_id, shared_indices=indices)
    if name == "nvml":
        from laminar_agent.inventory.nvml import NvmlBackend

        if nvml_mock:
            from laminar_agent.inventory.nvml_mock import MockNvml

            return NvmlBackend(shared_indices=shared, nvml=MockNvml.from_file(nvml_mock))
        return NvmlBackend(shared_indices=shared)
    raise InvalidArgument(f"must be 'nvml' or 'fake', got {name!r}", field="gpu_backend")
