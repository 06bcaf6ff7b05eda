"""MIG on demand: which layout an idle MIG GPU takes to hold a profile, and what is legal.

Pure (no I/O). The ledger decides, node-locally, to repartition a MIG-enabled GPU that
runs nothing and holds no lease or reservation when no free instance of the profile a
probe asks for exists; the driver applies the layout through its GPU backend before the
first subjob on that GPU starts. A GPU that runs anything is never repartitioned.

The layout an idle GPU takes for profile ``p``: as many ``p`` instances as fit, then the
largest profiles that still fit in what is left (more compute slices first, then the
smaller memory, which more demand can use), each at the lowest legal placement (:func:`~laminar_agent.inventory.mig.
place_profiles`, NVIDIA's placement tables). Demand that arrived as ``p`` is likely to
arrive as ``p`` again (the FGD paper's observation that a cluster's workload has few
typical shapes), so filling the GPU with ``p`` strands least of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from laminar_agent.inventory.mig import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    MIG_PROFILES,
    MigProfile,
    place_profiles,
)
from laminar_base.errors import InvalidArgument

#: One instance of a layout: (profile, memory-slice start, memory slices).
Instance = tuple[str, int, int]


@dataclass(frozen=True)
class MigGpu:
    """A MIG-enabled GPU whose layout the agent may change while it runs nothing.

    ``geometry`` names the profile table (``MIG_PROFILES``) the GPU follows; it is the
    GPU's model unless the model shares another's slice geometry."""

    gpu_index: int
    model: str
    device_uuid: str
    geometry: str = ""

    @property
    def table(self) -> dict[str, MigProfile]:
        return MIG_PROFILES[self.geometry or self.model]


def check_gpu(gpu: MigGpu) -> None:
    """InvalidArgument naming ``mig_on_demand`` for a GPU whose geometry has no table."""
    if (gpu.geometry or gpu.model) not in MIG_PROFILES:
        raise InvalidArgument(
            f"GPU {gpu.gpu_index} ({gpu.geometry or gpu.model}) has no MIG profile table "
            f"(MIG models: {', '.join(MIG_PROFILES)})",
            field="mig_on_demand",
        )


@lru_cache(maxsize=64)
def layout_for(geometry: str, profile: str) -> tuple[Instance, ...]:
    """The layout an idle GPU of ``geometry`` takes to hold ``profile`` (see the module
    docstring); InvalidArgument if the geometry has no such profile."""
    table = MIG_PROFILES.get(geometry, {})
    if profile not in table:
        raise InvalidArgument(
            f"{geometry} has no MIG profile {profile!r} (known: {', '.join(table)})",
            field="resources.mig_profile",
        )
    chosen = [profile]
    fillers = sorted(table.values(), key=lambda p: (-p.compute_slices, p.memory_bytes, p.name))
    for candidate in [table[profile], *fillers]:
        while _fits(geometry, [*chosen, candidate.name]):
            chosen.append(candidate.name)
    return place_profiles(geometry, chosen)


def _fits(geometry: str, profiles: Sequence[str]) -> bool:
    try:
        place_profiles(geometry, profiles)
    except InvalidArgument:
        return False
    return True


def is_legal(geometry: str, layout: Sequence[Instance]) -> bool:
    """Whether ``layout`` is one the hardware accepts: known profiles at legal starts, no
    two instances on one memory slice, at most the GPU's compute slices in all."""
    table = MIG_PROFILES.get(geometry)
    if table is None:
        return False
    used = 0
    compute = 0
    for name, start, size in layout:
        entry = table.get(name)
        if entry is None or start not in entry.starts or size != entry.size:
            return False
        mask = ((1 << size) - 1) << start
        if start + size > MEMORY_SLICES or used & mask:
            return False
        used |= mask
        compute += entry.compute_slices
    return compute <= COMPUTE_SLICES
