"""The plain walks that :class:`laminar_zone.holdings.Holdings` keeps up with: every live
job read at every question, as the router's core did before it kept them. Tests hold the
kept readings to these, bit for bit."""

from __future__ import annotations

import struct

from laminar_base.causes import LIVE_SUBJOB_STATES, RUNNING_JOB_STATES
from laminar_zone.core import ZoneCore
from laminar_zone.placement import ReleaseCurve


def scan_usage(core: ZoneCore) -> tuple[dict[str, float], dict[str, int]]:
    """GPU units and memory each tenant's running and placing jobs hold, one walk."""
    units: dict[str, float] = {}
    memory: dict[str, int] = {}
    for e in core.entries.values():
        job = e.job
        if job.job_id in core.atoms:
            tenant = job.spec.tenant
            for p in job.placements:
                if p.state in LIVE_SUBJOB_STATES:
                    piece = core.demand_of(p.resources)
                    units[tenant] = units.get(tenant, 0.0) + piece.gpu_units
                    memory[tenant] = memory.get(tenant, 0) + piece.memory_bytes
        elif job.state in RUNNING_JOB_STATES or e.placing:
            item = e.item
            units[item.tenant] = units.get(item.tenant, 0.0) + item.units
            memory[item.tenant] = memory.get(item.tenant, 0) + item.memory_bytes
    return units, memory


def scan_ends(core: ZoneCore, family: str) -> list[tuple[float, float]]:
    """The expected ends of ``family``'s running work, one walk (unsorted)."""
    ends: list[tuple[float, float]] = []
    mean = core.mean_run_seconds.get(family, 0.0)
    for other in core.entries.values():
        job = other.job
        if job.job_id in core.atoms:
            for p in job.placements:
                if p.state in LIVE_SUBJOB_STATES and p.window_end_unix > 0:
                    need = core.demand_of(p.resources)
                    if need.family == family:
                        ends.append((p.window_end_unix, need.gpu_units))
            continue
        if job.state not in RUNNING_JOB_STATES or other.need.family != family:
            continue
        item = other.item
        run = item.expected_seconds or mean
        if run > 0:
            ends.append((job.started_unix + run, item.units))
    return ends


def bits(values: object) -> object:
    """``values`` with every float as its bytes: equal only when bit for bit equal (a
    different order of float additions shows in the last bits)."""
    if isinstance(values, float):
        return struct.pack("<d", values)
    if isinstance(values, dict):
        return [(k, bits(v)) for k, v in values.items()]  # key order matters too
    if isinstance(values, (list, tuple)):
        return [bits(v) for v in values]
    return values


def assert_holdings_match(core: ZoneCore, families: tuple[str, ...] = ("gpu",)) -> None:
    """The core's kept usage and release curves equal the plain walks, bit for bit."""
    assert bits(core.tenant_usage()) == bits(scan_usage(core))
    for family in families:
        mean = core.mean_run_seconds.get(family, 0.0)
        kept = core.holdings.release_curve(family, mean, core.entries, core.atoms)
        walked = ReleaseCurve(scan_ends(core, family))
        assert bits((kept._times, kept._freed)) == bits((walked._times, walked._freed))
