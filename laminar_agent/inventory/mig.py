"""NVIDIA MIG profile tables and a placement solver.

Tables follow the "Supported MIG Profiles" section of NVIDIA's MIG user guide
(A100 and H100: 8 memory slices, 7 compute slices). ``starts`` are the legal
placement start slots, ``size`` the memory slices the instance occupies.
Memory per profile is the number in its name in GiB, which is how the fake
backend sizes instances; the NVML backend reports the real figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from laminar_base.errors import InvalidArgument

GIB = 1024**3
MEMORY_SLICES = 8
COMPUTE_SLICES = 7
FIELD = "fake_gpus"


@dataclass(frozen=True)
class MigProfile:
    name: str
    memory_bytes: int
    compute_slices: int
    size: int
    starts: tuple[int, ...]


def _profile(name: str, size: int, starts: tuple[int, ...]) -> MigProfile:
    compute = int(name.split("g.", 1)[0])
    memory_gib = int(name.split(".", 1)[1].removesuffix("gb"))
    return MigProfile(name, memory_gib * GIB, compute, size, starts)


_ONE_G = (0, 1, 2, 3, 4, 5, 6)
_TWO_SLOT = (0, 2, 4, 6)

_BIG_GPU = (  # H100-80GB and A100-80GB share slice geometry and names.
    _profile("1g.10gb", 1, _ONE_G),
    _profile("1g.20gb", 2, _TWO_SLOT),
    _profile("2g.20gb", 2, (0, 2, 4)),
    _profile("3g.40gb", 4, (0, 4)),
    _profile("4g.40gb", 4, (0,)),
    _profile("7g.80gb", 8, (0,)),
)

MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "H100-80GB": {p.name: p for p in _BIG_GPU},
    "A100-80GB": {p.name: p for p in _BIG_GPU},
    "A100-40GB": {
        p.name: p
        for p in (
            _profile("1g.5gb", 1, _ONE_G),
            _profile("1g.10gb", 2, _TWO_SLOT),
            _profile("2g.10gb", 2, (0, 2, 4)),
            _profile("3g.20gb", 4, (0, 4)),
            _profile("4g.20gb", 4, (0,)),
            _profile("7g.40gb", 8, (0,)),
        )
    },
}


def lookup_profile(model: str, profile: str) -> MigProfile:
    """Return the table entry or raise InvalidArgument naming ``fake_gpus``."""
    table = MIG_PROFILES.get(model)
    if table is None:
        raise InvalidArgument(
            f"model {model!r} does not support MIG (MIG models: {', '.join(MIG_PROFILES)})",
            field=FIELD,
        )
    entry = table.get(profile)
    if entry is None:
        raise InvalidArgument(
            f"unknown MIG profile {profile!r} for {model} (known: {', '.join(table)})",
            field=FIELD,
        )
    return entry


def place_profiles(model: str, profiles: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """Lay out instances as (profile, start, size), in the order given.

    Each instance takes the lowest legal free start slot; if that leads to a
    dead end a later start is tried (small backtracking search), so any layout
    the hardware accepts is found, and the result is deterministic.
    """
    entries = [lookup_profile(model, p) for p in profiles]
    compute = sum(e.compute_slices for e in entries)
    if compute > COMPUTE_SLICES:
        raise InvalidArgument(
            f"MIG layout {'+'.join(profiles)} on {model} does not fit: needs {compute} "
            f"compute slices, GPU has {COMPUTE_SLICES}",
            field=FIELD,
        )
    starts: list[int] = []

    def solve(i: int, used: int) -> bool:
        if i == len(entries):
            return True
        entry = entries[i]
        for start in entry.starts:
            mask = ((1 << entry.size) - 1) << start
            if start + entry.size <= MEMORY_SLICES and not used & mask:
                starts.append(start)
                if solve(i + 1, used | mask):
                    return True
                starts.pop()
        return False

    if not solve(0, 0):
        raise InvalidArgument(
            f"MIG layout {'+'.join(profiles)} on {model} does not fit in any legal placement "
            f"({MEMORY_SLICES} memory slices)",
            field=FIELD,
        )
    return tuple((e.name, s, e.size) for e, s in zip(entries, starts, strict=True))
