"""What :meth:`ZoneView.counts` and :meth:`ZoneView.free_for` must answer, by a plain scan
of every agent: the reference the view's tests hold its kept and indexed answers to."""

from __future__ import annotations

from laminar_base.demand import Demand
from laminar_zone.placement import CPU_ONLY_CAPACITY, members_fitting
from laminar_zone.view import HostCounts, ZoneView


def scan_counts(view: ZoneView, need: Demand) -> HostCounts:
    ready = matching = now = members = 0
    for record in view.agents.values():
        if not record.is_ready:
            continue
        ready += 1
        ever = members_fitting(need, record.shapes, total=True)
        if ever >= 1:
            matching += 1
            members += ever
            if members_fitting(need, record.shapes) >= 1:
                now += 1
    return HostCounts(ready, matching, now, members)


def scan_free(view: ZoneView, need: Demand) -> int:
    return sum(
        min(members_fitting(need, r.shapes), CPU_ONLY_CAPACITY)
        for r in view.agents.values()
        if r.is_ready
    )
