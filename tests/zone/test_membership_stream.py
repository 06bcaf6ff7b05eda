"""The Heartbeats stream at the router, in process (no sockets): an agent on a stream may
stay silent for the liveness period, is stale as soon as its stream ends (unless a newer
stream speaks for it), and a stream speaks for one agent only.

Silence is made by moving an agent's last heartbeat back in time, never by sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_membership import delta, full, open_state, running_on, silence

from laminar_api.v1 import common_pb2
from laminar_base.configlib import load_config
from laminar_base.errors import InvalidArgument
from laminar_zone.config import ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.membership import HeartbeatStream, Membership


@pytest.fixture
async def zone(tmp_path: Path) -> AsyncIterator[ZoneState]:
    state = open_state(tmp_path)
    try:
        yield state
    finally:
        await state.close()
        state.store.close()


def stale_after(zone: ZoneState) -> float:
    return zone.config.membership.stale_after_seconds()


async def test_a_streaming_agent_may_stay_silent_for_the_liveness_period(zone: ZoneState) -> None:
    members = Membership(zone)
    stream = HeartbeatStream()
    reply = members.on_stream_heartbeat(stream, full(1))
    liveness = zone.config.membership.liveness_seconds()
    assert reply.liveness_seconds == liveness
    assert liveness > stale_after(zone)  # the case that needs the allowance
    # The slack of unary heartbeats after the liveness period: 2 periods by default.
    allowed = liveness + stale_after(zone) - zone.config.membership.heartbeat_seconds
    assert zone.view.agents["h1"].silence_allowed_seconds == pytest.approx(allowed)
    silence(zone, "h1", allowed - 0.5)
    zone.sweep()
    assert not zone.view.agents["h1"].is_stale
    silence(zone, "h1", allowed + 0.5)
    zone.sweep()
    assert zone.view.agents["h1"].is_stale


async def test_a_unary_agent_keeps_the_periodic_bound(zone: ZoneState) -> None:
    members = Membership(zone)
    reply = members.on_heartbeat(full(1))
    assert reply.liveness_seconds == 0
    silence(zone, "h1", stale_after(zone) + 0.5)
    zone.sweep()
    assert zone.view.agents["h1"].is_stale


async def test_the_end_of_a_stream_makes_the_agent_stale_at_once(zone: ZoneState) -> None:
    members = Membership(zone)
    stream = HeartbeatStream()
    members.on_stream_heartbeat(stream, full(1))
    members.on_stream_heartbeat(stream, delta(1))
    entry = running_on(zone, "h1")
    before = zone.view.agents["h1"].last_heartbeat
    members.close_stream(stream)
    record = zone.view.agents["h1"]
    assert record.is_stale
    assert not record.is_ready  # no more probes to it
    # Loss is still counted from the last heartbeat, not from the stream's end.
    assert record.last_heartbeat == before
    zone.sweep()
    assert entry.job.placements[0].state == common_pb2.RUNNING
    # It comes back with its summary, as any stale agent does.
    assert members.on_heartbeat(delta(1)).summary_version == 0
    assert members.on_heartbeat(full(1)).summary_version == 1
    assert not zone.view.agents["h1"].is_stale
    assert zone.view.agents["h1"].silence_allowed_seconds == 0.0


async def test_a_newer_stream_outlives_the_end_of_the_older(zone: ZoneState) -> None:
    members = Membership(zone)
    old, new = HeartbeatStream(), HeartbeatStream()
    members.on_stream_heartbeat(old, full(1))
    members.on_stream_heartbeat(new, delta(1))
    members.close_stream(old)  # the old connection's end is noticed after the new one
    assert not zone.view.agents["h1"].is_stale
    assert members.streams["h1"] is new
    members.close_stream(new)
    assert zone.view.agents["h1"].is_stale
    assert "h1" not in members.streams


async def test_a_stream_speaks_for_one_agent(zone: ZoneState) -> None:
    members = Membership(zone)
    stream = HeartbeatStream()
    members.on_stream_heartbeat(stream, full(1))
    with pytest.raises(InvalidArgument, match="agent_id"):
        members.on_stream_heartbeat(stream, full(1, agent_id="h2"))
    assert "h2" not in zone.view.agents


async def test_a_refused_delta_does_not_bind_the_stream(zone: ZoneState) -> None:
    members = Membership(zone)
    stream = HeartbeatStream()
    reply = members.on_stream_heartbeat(stream, delta(3))  # a router restart: unknown agent
    assert reply.summary_version == 0 and reply.liveness_seconds == 0
    assert stream.agent_id == "" and not members.streams
    members.close_stream(stream)  # nothing to mark
    assert "h1" not in zone.view.agents


def test_the_liveness_period_leaves_half_the_fence_lease() -> None:
    long = {"membership.stream_liveness_seconds": 60.0}
    membership = load_config(ZoneConfig, overrides=long).membership
    assert membership.liveness_seconds() == pytest.approx(membership.fence_lease_seconds() / 2)
    unfenced = load_config(ZoneConfig, overrides={**long, "membership.fence": False})
    assert unfenced.membership.liveness_seconds() == 60.0
    short = {"membership.stream_liveness_seconds": 0.1}
    assert load_config(ZoneConfig, overrides=short).membership.liveness_seconds() == 1.0
