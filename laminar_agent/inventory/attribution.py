"""Charge the GPU memory NVML sees per process to the subjobs those processes belong to.

NVML lists processes (:meth:`NvmlBackend.process_memory`); the agent knows each
subjob's root process (its shim, whose pid is also the process group id). A process is
charged to the subjob whose root is its nearest ancestor, itself included, so a
training script's DataLoader workers and NCCL helpers count for their subjob. Not
covered: a process re-parented to init after its parent died has lost its tree and is
reported unattributed (a cgroup lookup would still find it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil

#: Deepest ancestry walked per process, so a cycle in stale data cannot loop forever.
MAX_DEPTH = 64


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from the process table; None once it has gone (or is init)."""
    try:
        parent = psutil.Process(pid).ppid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return parent if parent > 0 else None


@dataclass(frozen=True)
class Attribution:
    """``by_subjob``: subjob id -> device uuid -> bytes; ``unattributed``: device -> bytes
    used by processes of no subjob (another user's job, a leaked process); ``pids``:
    subjob id -> the pids NVML lists for it (those cuda-checkpoint toggles), sorted."""

    by_subjob: dict[str, dict[str, int]]
    unattributed: dict[str, int]
    pids: dict[str, tuple[int, ...]] = field(default_factory=dict)


def attribute_gpu_memory(
    process_memory: Mapping[str, Mapping[int, int]],
    roots: Mapping[int, str],
    parent_of: Callable[[int], int | None] = parent_pid,
) -> Attribution:
    """Sum each device's per-process memory into the subjob owning each process.

    ``roots`` maps a subjob's root pid to its id; ``parent_of`` is the process table
    (injectable for tests). Each pid's owner is looked up once per call.
    """
    owners: dict[int, str | None] = {}

    def owner(pid: int) -> str | None:
        if pid in owners:
            return owners[pid]
        chain: list[int] = []
        found: str | None = None
        current: int | None = pid
        while current is not None and len(chain) < MAX_DEPTH:
            if current in owners:
                found = owners[current]
                break
            chain.append(current)
            if current in roots:
                found = roots[current]
                break
            current = parent_of(current)
        owners.update(dict.fromkeys(chain, found))
        return found

    by_subjob: dict[str, dict[str, int]] = {}
    unattributed: dict[str, int] = {}
    pids: dict[str, set[int]] = {}
    for device, processes in process_memory.items():
        for pid, used in processes.items():
            subjob = owner(pid)
            if subjob is None:
                unattributed[device] = unattributed.get(device, 0) + used
            else:
                per_device = by_subjob.setdefault(subjob, {})
                per_device[device] = per_device.get(device, 0) + used
                pids.setdefault(subjob, set()).add(pid)
    return Attribution(by_subjob, unattributed, {s: tuple(sorted(p)) for s, p in pids.items()})
