"""A drain outlives the agent: real agent (and router) processes restarted by SIGTERM and
SIGKILL, as an upgrade (``systemctl restart``), the watchdog or a crash restarts them."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import AgentProcess, LocalCluster

RESTARTS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="sigkill")]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _restart(cluster: LocalCluster, agent: AgentProcess, how: signal.Signals) -> AgentProcess:
    agent.process.send_signal(how)
    agent.process.wait(20)
    return cluster.start_agent(agent.agent_id, agent.fake_gpus, zone=agent.zone)


def _probe(agent: AgentProcess) -> agent_pb2.ProbeReply:
    with grpc.insecure_channel(agent.address) as channel:
        return agent_pb2_grpc.AgentStub(channel).Probe(
            agent_pb2.ProbeRequest(job_id="j", resources=common_pb2.Resources(gpus=1)),
            timeout=10,
        )


def _is_draining(agent: AgentProcess) -> bool:
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        return stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10).draining


def _draining_gauge(agent: AgentProcess) -> float:
    body = urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=10).read()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return float(families["laminar_agent_draining"].samples[0].value)


@pytest.mark.parametrize("how", RESTARTS)
def test_a_drain_and_an_undrain_survive_a_restart(
    cluster: LocalCluster, how: signal.Signals
) -> None:
    agent = cluster.start_agent("h", "1xA100-40GB")
    with grpc.insecure_channel(agent.address) as channel:
        agent_pb2_grpc.AgentStub(channel).Drain(
            agent_pb2.DrainRequest(reason="upgrade"), timeout=10
        )
    agent = _restart(cluster, agent, how)
    assert _is_draining(agent)
    bounced = _probe(agent)
    assert bounced.WhichOneof("outcome") == "bounce" and "draining" in bounced.bounce.reason
    assert _draining_gauge(agent) == 1
    assert "still draining (kept in the journal): upgrade" in agent.log_path.read_text()
    with grpc.insecure_channel(agent.address) as channel:
        agent_pb2_grpc.AgentStub(channel).Undrain(agent_pb2.DrainRequest(reason="done"), timeout=10)
    agent = _restart(cluster, agent, how)
    assert not _is_draining(agent)
    assert _probe(agent).WhichOneof("outcome") == "lease"
    assert _draining_gauge(agent) == 0


@pytest.mark.parametrize("how", RESTARTS)
def test_the_router_sees_a_restarted_agent_still_draining(
    cluster: LocalCluster, how: signal.Signals
) -> None:
    """Step 2 of the upgrade (docs/ops.md): the restarted agent's heartbeats overwrite the
    router's copy of the flag, so they must carry the drain the router asked for."""
    zone = cluster.start_zone("z", heartbeat_seconds=0.2)
    agent = cluster.start_agent("h", "1xA100-40GB", zone=zone.address, heartbeat_seconds=0.2)
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)

        def info() -> zone_pb2.AgentInfo:
            agents = stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=10).agents
            return next((a for a in agents if a.agent_id == "h"), zone_pb2.AgentInfo())

        wait_for(lambda: info().state == zone_pb2.AGENT_READY)
        drained = stub.DrainAgent(
            zone_pb2.DrainAgentRequest(agent="h", reason="upgrade"), timeout=10
        )
        assert drained.state == zone_pb2.AGENT_DRAINING
        agent = _restart(cluster, agent, how)
        started = time.time()
        # A heartbeat from the new process (its address is new) after it started.
        wait_for(lambda: info().address == agent.address and info().last_heartbeat_unix > started)
        assert info().state == zone_pb2.AGENT_DRAINING and info().summary.draining
        stub.UndrainAgent(zone_pb2.DrainAgentRequest(agent="h", reason="upgraded"), timeout=10)
        agent = _restart(cluster, agent, how)
        started = time.time()
        wait_for(lambda: info().address == agent.address and info().last_heartbeat_unix > started)
        assert info().state == zone_pb2.AGENT_READY
