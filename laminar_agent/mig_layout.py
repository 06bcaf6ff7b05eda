"""MIG on demand: which layout a MIG GPU takes to hold a profile, and what is legal.

Pure (no I/O). The ledger decides, node-locally, when no free instance of the profile a
probe asks for exists; the driver applies the layout through its GPU backend before the
first subjob on it starts. An instance that is leased, runs something or is reserved is
never destroyed or moved.

Carving (the default, ``inventory.mig_carve_busy``): any MIG GPU's idle part may change.
:func:`carve_options` lists every legal way to hold the profile around the instances in
use (an idle instance of it, or a new one at a legal start whose overlapping idle instances
are destroyed), and the ledger takes the one whose GPU's :func:`fragmentation` (FGD's
measure over the workload's profile mix) grows least.

Idle GPUs only (``mig_carve_busy = false``): a GPU that runs nothing and holds no lease or
reservation takes :func:`layout_for` the profile ``p``: as many ``p`` instances as fit,
then the largest profiles that still fit in what is left (more compute slices first, then
the smaller memory, which more demand can use), each at the lowest legal placement
(:func:`~laminar_agent.inventory.mig.place_profiles`, NVIDIA's placement tables). Demand
that arrived as ``p`` is likely to arrive as ``p`` again (the FGD paper's observation that
a cluster's workload has few typical shapes), so filling the GPU with ``p`` strands least
of it.
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
    """A MIG-enabled GPU whose layout the agent may change (its idle part, or all of it
    while it runs nothing).

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


# ------------------------------------------------------------------ carving a busy GPU
#
# With carving (``inventory.mig_carve_busy``), a MIG GPU that runs something may still
# change its idle part: instances that hold no lease or reservation and run nothing may be
# destroyed and one instance of the asked profile created at a legal free placement, while
# the busy instances stay as they are (NVIDIA creates and destroys GPU instances while
# other instances of the same GPU run work). Which placement: the one that raises the GPU's
# expected fragmentation least (FGD's measure, over the workload's profile mix).

#: Profile name -> probability in the workload mix a placement is measured against.
Weights = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Carve:
    """One way to hold a profile on a GPU: the GPU's ``layout`` afterwards, the
    ``instance`` the demand takes, how many idle instances are ``destroyed`` for it, and
    whether the instance is ``created`` (False: an idle instance of the profile is used)."""

    layout: tuple[Instance, ...]
    instance: Instance
    destroyed: int
    created: bool


def _mask(instances: Sequence[Instance]) -> int:
    used = 0
    for _, start, size in instances:
        used |= ((1 << size) - 1) << start
    return used


def compute_slices(geometry: str, instances: Sequence[Instance]) -> int:
    """The compute slices ``instances`` take."""
    table = MIG_PROFILES[geometry]
    return sum(table[name].compute_slices for name, _, _ in instances)


def free_starts(geometry: str, pinned: Sequence[Instance], profile: str) -> tuple[int, ...]:
    """The legal starts of ``profile`` that overlap no ``pinned`` instance, where the
    GPU's compute slices still hold it."""
    entry = MIG_PROFILES[geometry][profile]
    if compute_slices(geometry, pinned) + entry.compute_slices > COMPUTE_SLICES:
        return ()
    used = _mask(pinned)
    return tuple(
        start
        for start in entry.starts
        if start + entry.size <= MEMORY_SLICES and not used & (((1 << entry.size) - 1) << start)
    )


@lru_cache(maxsize=4096)
def placeable_count(geometry: str, pinned: tuple[Instance, ...], profile: str) -> int:
    """How many more ``profile`` instances fit around ``pinned`` (lowest starts first)."""
    entry = MIG_PROFILES[geometry][profile]
    layout = list(pinned)
    count = 0
    while starts := free_starts(geometry, layout, profile):
        layout.append((profile, starts[0], entry.size))
        count += 1
    return count


@lru_cache(maxsize=4096)
def fragmentation(geometry: str, pinned: tuple[Instance, ...], weights: Weights) -> float:
    """FGD's fragmentation of one GPU, in compute slices: for each profile of the mix that
    no longer fits around ``pinned``, the GPU's free compute slices, times its weight."""
    free = COMPUTE_SLICES - compute_slices(geometry, pinned)
    if free <= 0:
        return 0.0
    return sum(w * free for name, w in weights if not free_starts(geometry, pinned, name))


def uniform_weights(geometry: str) -> Weights:
    """Each compute size once (its smallest-memory profile): the mix before any is known."""
    names = sorted(
        {smallest_of(geometry, p.compute_slices) for p in MIG_PROFILES[geometry].values()}
    )
    return tuple((name, 1.0 / len(names)) for name in names)


def smallest_of(geometry: str, compute_slices: int) -> str:
    """The smallest-memory profile with at least ``compute_slices`` compute slices."""
    table = MIG_PROFILES[geometry]
    return min(
        (p for p in table.values() if p.compute_slices >= compute_slices),
        key=lambda p: (p.compute_slices, p.memory_bytes, p.name),
    ).name


def carve_options(
    geometry: str,
    layout: Sequence[Instance],
    busy: Sequence[Instance],
    profile: str,
    usable: Sequence[Instance] = (),
) -> list[Carve]:
    """Every way to hold ``profile`` on a GPU with ``layout`` whose ``busy`` instances must
    stay: an idle instance of the profile in ``usable``, or a new instance at a legal start
    that overlaps no busy instance (the idle instances it overlaps are destroyed). Each
    resulting layout is legal (:func:`is_legal`); busy instances are in every one."""
    entry = MIG_PROFILES[geometry][profile]
    current = tuple(sorted(layout, key=lambda i: i[1]))
    busy_set = set(busy)
    options = [Carve(current, inst, 0, False) for inst in usable if inst[0] == profile]
    if compute_slices(geometry, busy) + entry.compute_slices > COMPUTE_SLICES:
        return options
    busy_mask = _mask(busy)
    for start in entry.starts:
        mask = ((1 << entry.size) - 1) << start
        if start + entry.size > MEMORY_SLICES or busy_mask & mask:
            continue
        new = (profile, start, entry.size)
        kept = [i for i in current if i in busy_set or not _mask([i]) & mask]
        # Idle instances that do not overlap may still hold the compute slices it needs.
        while compute_slices(geometry, [*kept, new]) > COMPUTE_SLICES:
            idle = [i for i in kept if i not in busy_set]
            kept.remove(
                max(idle, key=lambda i: (MIG_PROFILES[geometry][i[0]].compute_slices, i[1]))
            )
        after = tuple(sorted([*kept, new], key=lambda i: i[1]))
        if new in current:
            continue  # an instance already there: it is an option only while idle (usable)
        options.append(Carve(after, new, len(current) - len(kept), True))
    return options
