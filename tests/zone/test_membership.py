"""Delta heartbeats at the router, in process (no sockets): a heartbeat without a summary
only refreshes the agent's liveness, a router that cannot vouch for the summary asks for
it, and staleness and loss are decided on the same schedule as before.

Silence is made by moving an agent's last heartbeat back in time, never by sleeping.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from test_end_causes import _entry

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.configlib import load_config
from laminar_base.demand import Demand, HostCap
from laminar_base.errors import InvalidArgument
from laminar_base.fragmentation import demand_pod
from laminar_zone.config import ZoneConfig
from laminar_zone.entry import Entry
from laminar_zone.jobs import ZoneState
from laminar_zone.membership import Membership
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placement import ShapeCap
from laminar_zone.store import JobStore


def open_state(tmp_path: Path, name: str = "zone.db", **overrides: object) -> ZoneState:
    config = load_config(ZoneConfig, overrides=overrides)
    return ZoneState(config, JobStore(tmp_path / name), ZoneMetrics(CollectorRegistry()))


@pytest.fixture
async def zone(tmp_path: Path) -> AsyncIterator[ZoneState]:
    state = open_state(tmp_path)
    try:
        yield state
    finally:
        await state.close()
        state.store.close()


def full(version: int, agent_id: str = "h1", free: int = 2) -> zone_pb2.HeartbeatRequest:
    summary = common_pb2.AgentSummary(agent_id=agent_id, address="127.0.0.1:9", total_gpus=2)
    summary.shapes.add(shape="gpu:H100-80GB", free=free, total=2)
    return zone_pb2.HeartbeatRequest(summary=summary, summary_version=version)


def delta(version: int, agent_id: str = "h1") -> zone_pb2.HeartbeatRequest:
    return zone_pb2.HeartbeatRequest(agent_id=agent_id, summary_version=version)


def silence(zone: ZoneState, agent_id: str, seconds: float) -> None:
    """As if the agent's last heartbeat had come ``seconds`` ago."""
    record = zone.view.agents[agent_id]
    record.last_heartbeat = time.monotonic() - seconds


def running_on(zone: ZoneState, agent_id: str) -> Entry:
    """A job with a RUNNING subjob on ``agent_id``, tracked as the router tracks one."""
    entry = _entry(zone, EndCause.UNSPECIFIED, "", state=common_pb2.RUNNING)
    assert entry.job.placements[0].agent_id == agent_id
    zone.track(entry, agent_id)
    return entry


def counts(zone: ZoneState) -> tuple[float, float]:
    """(heartbeats, heartbeats with a summary) the router counted."""
    registry = zone.metrics.registry
    return (
        registry.get_sample_value("laminar_zone_heartbeats_total") or 0.0,
        registry.get_sample_value("laminar_zone_heartbeat_summaries_total") or 0.0,
    )


async def test_a_full_heartbeat_is_kept_and_its_version_acknowledged(zone: ZoneState) -> None:
    membership = Membership(zone)
    reply = membership.on_heartbeat(full(7))
    assert reply.summary_version == 7
    assert reply.fence_lease_seconds == zone.config.membership.fence_lease_seconds() > 0
    assert zone.view.agents["h1"].summary_version == 7
    assert zone.view.agents["h1"].shapes["gpu:H100-80GB"].free == 2
    assert counts(zone) == (1, 1)


async def test_a_delta_refreshes_liveness_only(zone: ZoneState) -> None:
    membership = Membership(zone)
    membership.on_heartbeat(full(3))
    record = zone.view.agents["h1"]
    shapes = record.shapes
    silence(zone, "h1", 2 * zone.view.stale_after_seconds)
    before_unix = record.last_heartbeat_unix
    reply = membership.on_heartbeat(delta(3))
    assert reply.summary_version == 3
    assert reply.fence_lease_seconds == zone.config.membership.fence_lease_seconds()
    assert reply.period_seconds == zone.config.membership.heartbeat_seconds
    assert time.monotonic() - record.last_heartbeat < zone.view.stale_after_seconds
    assert record.last_heartbeat_unix >= before_unix
    assert record.shapes is shapes  # the summary was neither rebuilt nor replaced
    assert counts(zone) == (2, 1)
    zone.sweep()
    assert not record.is_stale


async def test_without_the_delta_the_same_silence_makes_the_agent_stale(zone: ZoneState) -> None:
    membership = Membership(zone)
    membership.on_heartbeat(full(3))
    silence(zone, "h1", 2 * zone.view.stale_after_seconds)
    zone.sweep()
    assert zone.view.agents["h1"].is_stale


@pytest.mark.parametrize(
    "case", ["unknown agent", "other version", "version 0", "other certificate", "not listed"]
)
async def test_a_delta_the_router_cannot_vouch_for_asks_for_the_summary(
    zone: ZoneState, case: str
) -> None:
    membership = Membership(zone)
    membership.on_heartbeat(full(3), caller="h1", caller_names=["h1"])
    record = zone.view.agents["h1"]
    silence(zone, "h1", 1.0)
    heard = record.last_heartbeat
    request, caller, names = delta(3), "h1", ["h1"]
    if case == "unknown agent":
        request = delta(3, agent_id="h2")
    elif case == "other version":
        request = delta(4)
    elif case == "version 0":
        request = delta(0)
    elif case == "other certificate":
        caller, names = "h9", ["h9", "h1"]
    else:
        names = ["h9"]
    reply = membership.on_heartbeat(request, caller=caller, caller_names=names)
    assert reply.summary_version == 0  # send the full summary
    assert reply.fence_lease_seconds == 0  # not counted as heard from
    assert record.last_heartbeat == heard


async def test_a_stale_agent_must_send_its_summary_to_come_back(zone: ZoneState) -> None:
    membership = Membership(zone)
    membership.on_heartbeat(full(3))
    silence(zone, "h1", 2 * zone.view.stale_after_seconds)
    zone.sweep()
    assert membership.on_heartbeat(delta(3)).summary_version == 0
    assert zone.view.agents["h1"].is_stale
    reply = membership.on_heartbeat(full(3))
    assert reply.summary_version == 3 and reply.want_live_subjobs  # came back: reconcile
    assert not zone.view.agents["h1"].is_stale


async def test_after_a_probe_reply_or_a_drain_the_router_asks_for_the_summary(
    zone: ZoneState,
) -> None:
    """A probe's reply (a lease taken, then released before the next heartbeat) or a drain
    changes what the view holds while the agent's summary may end up as it was: the next
    delta is refused, so the view never keeps capacity the agent no longer reports."""
    membership = Membership(zone)
    membership.on_heartbeat(full(3))
    zone.view.update(
        "h1",
        "",
        {"gpu:H100-80GB": ShapeCap(1, 2)},
        heat=1,
        draining=False,
        now=time.monotonic(),
        is_heartbeat=False,
    )
    assert membership.on_heartbeat(delta(3)).summary_version == 0
    assert membership.on_heartbeat(full(3)).summary_version == 3
    assert zone.view.agents["h1"].shapes["gpu:H100-80GB"].free == 2
    zone.view.set_draining("h1", True)
    assert membership.on_heartbeat(delta(3)).summary_version == 0


async def test_a_restarted_router_asks_for_the_summary(zone: ZoneState, tmp_path: Path) -> None:
    Membership(zone).on_heartbeat(full(3))
    restarted = open_state(tmp_path, "restarted.db")
    try:
        membership = Membership(restarted)
        assert membership.on_heartbeat(delta(3)).summary_version == 0
        assert "h1" not in restarted.view.agents
        assert membership.on_heartbeat(full(3)).summary_version == 3
        assert membership.on_heartbeat(delta(3)).summary_version == 3
    finally:
        await restarted.close()
        restarted.store.close()


async def test_an_old_agent_without_versions_is_served_as_before(zone: ZoneState) -> None:
    membership = Membership(zone)
    reply = membership.on_heartbeat(full(0, free=1))
    assert reply.summary_version == 0 and reply.period_seconds > 0
    assert zone.view.agents["h1"].shapes["gpu:H100-80GB"].free == 1
    reply = membership.on_heartbeat(full(0, free=2))
    assert zone.view.agents["h1"].shapes["gpu:H100-80GB"].free == 2


async def test_a_delta_carries_nothing_but_liveness(zone: ZoneState) -> None:
    membership = Membership(zone)
    membership.on_heartbeat(full(3))
    request = delta(3)
    request.readdress_subjob_ids.append("j-1-a1-m0")
    with pytest.raises(InvalidArgument) as info:
        membership.on_heartbeat(request)
    assert info.value.field == "summary"
    with pytest.raises(InvalidArgument) as info:
        membership.on_heartbeat(delta(3, agent_id=""))
    assert info.value.field == "agent_id"


async def test_an_agent_that_stops_heartbeating_is_lost_on_the_same_schedule(
    zone: ZoneState,
) -> None:
    """Deltas until the agent falls silent: stale after stale_after, its subjob LOST after
    lost_after counted from the last delta, with the same reason as ever."""
    membership = Membership(zone)
    membership.on_heartbeat(full(3))
    entry = running_on(zone, "h1")
    membership.on_heartbeat(delta(3))
    view, lost_after = zone.view, zone.config.membership.lost_after_seconds
    silence(zone, "h1", view.stale_after_seconds - 0.5)
    zone.sweep()
    assert not view.agents["h1"].is_stale
    silence(zone, "h1", view.stale_after_seconds + 0.5)
    zone.sweep()
    assert view.agents["h1"].is_stale
    assert entry.job.placements[0].state == common_pb2.RUNNING
    silence(zone, "h1", lost_after - 0.5)
    zone.sweep()
    assert entry.job.placements[0].state == common_pb2.RUNNING
    silence(zone, "h1", lost_after + 0.5)
    zone.sweep()
    lost = entry.job.placements[0]
    assert lost.state == common_pb2.LOST
    assert lost.end_cause == EndCause.LOST.wire
    assert lost.reason.startswith("agent h1 silent for ")
    assert f"(membership.lost_after_seconds={lost_after:g})" in lost.reason


async def test_the_router_sends_its_workload_when_the_agents_version_differs(
    zone: ZoneState,
) -> None:
    membership = Membership(zone)
    assert not membership.on_heartbeat(full(1)).workload  # nothing placed: no workload
    for _ in range(3):  # what the router is asked to place is its target workload
        zone.placer.workload.observe(demand_pod(Demand(gpus=1), HostCap()))
    assert zone.placer.workload.cache() is not None
    version = zone.placer.workload.version
    reply = membership.on_heartbeat(full(1))
    assert reply.workload_version == version
    (shape,) = reply.workload
    assert (shape.num_gpu, shape.gpu_milli, shape.count) == (1, 1000, 3)
    request = delta(1)
    request.workload_version = version
    again = membership.on_heartbeat(request)
    assert again.workload_version == 0 and not again.workload  # the agent has it
