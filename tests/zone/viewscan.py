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


def apply_event(view: ZoneView, event: tuple[object, ...], now: float) -> None:
    """One event of the view's property tests (a summary, a probe reply, host figures, a
    drain, a stale mark, a placeholder, a sweep) applied at ``now``."""
    kind, *rest = event
    if kind in ("heartbeat", "reply"):
        agent, shapes, draining = rest
        view.update(
            str(agent),
            "addr",
            dict(shapes),  # type: ignore[call-overload]
            heat=0,
            draining=bool(draining),
            now=now,
            is_heartbeat=kind == "heartbeat",
        )
    elif kind == "host":
        agent, host = rest
        view.note_host(str(agent), host)  # type: ignore[arg-type]
    elif kind == "drain" and rest[0] in view.agents:
        view.set_draining(str(rest[0]), bool(rest[1]))
    elif kind == "stale":
        view.mark_stale(str(rest[0]))
    elif kind == "placeholder":
        view.add_placeholder(str(rest[0]), "addr", now)
    elif kind == "sweep":
        view.sweep(now + float(rest[0]))  # type: ignore[arg-type]
