"""Input hardening of both daemons: a message size limit, and bounded lists and numbers.

Real processes on loopback, with ``server.max_message_bytes`` lowered to 64 KiB
through the environment so an oversized message is cheap to send. Each refusal
must leave the daemon serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laminar_agent.config import AgentConfig
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.configlib import load_config
from laminar_base.errors import ConfigError
from laminar_cli.cluster import LocalCluster
from laminar_zone.config import ZoneConfig
from laminar_zone.peers import MAX_PEERS

LIMIT_BYTES = 64 * 1024


@dataclass
class Daemons:
    agent: agent_pb2_grpc.AgentStub
    zone: zone_pb2_grpc.ZoneStub
    control: zone_pb2_grpc.ZoneControlStub
    channels: list[grpc.Channel]


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    root = tmp_path_factory.mktemp("limits")
    with LocalCluster(root, env={"LAMINAR_SERVER_MAX_MESSAGE_BYTES": str(LIMIT_BYTES)}) as cluster:
        zone = cluster.start_zone("lim", heartbeat_seconds=0.2)
        agent = cluster.start_agent("lim-h1", "1xH100-80GB", zone=zone.address)
        zone_channel = grpc.insecure_channel(zone.address)
        agent_channel = grpc.insecure_channel(agent.address)
        yield Daemons(
            agent_pb2_grpc.AgentStub(agent_channel),
            zone_pb2_grpc.ZoneStub(zone_channel),
            zone_pb2_grpc.ZoneControlStub(zone_channel),
            [zone_channel, agent_channel],
        )
        for channel in (zone_channel, agent_channel):
            channel.close()


def _serving(channel: grpc.Channel) -> bool:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _refused(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)  # type: ignore[operator]
    return info.value


def test_oversized_messages_get_resource_exhausted_and_harm_nothing(daemons: Daemons) -> None:
    big = "x" * (LIMIT_BYTES + 1)
    error = _refused(daemons.agent.Drain, agent_pb2.DrainRequest(reason=big))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    spec = zone_pb2.JobSpec(command=["true"], env={"BIG": big})
    error = _refused(daemons.zone.Submit, zone_pb2.SubmitRequest(spec=spec))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert all(_serving(channel) for channel in daemons.channels)
    assert daemons.agent.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10).agent_id


@pytest.mark.parametrize(
    ("rpc", "request_", "field"),
    [
        ("agent.Release", agent_pb2.ReleaseRequest(lease_ids=["l"] * 5000), "lease_ids"),
        ("agent.ListSubjobs", agent_pb2.ListSubjobsRequest(states=[99]), "states"),  # type: ignore[list-item]
        ("agent.ListSubjobs", agent_pb2.ListSubjobsRequest(states=[1] * 65), "states"),  # type: ignore[list-item]
        ("agent.ReadLogs", agent_pb2.ReadLogsRequest(subjob_id="s", offset=2**64 - 1), "subjob_id"),
        (
            "agent.ProbeBatch",
            agent_pb2.ProbeBatchRequest(probes=[agent_pb2.ProbeRequest()] * 257),
            "probes",
        ),
        ("zone.ListJobs", zone_pb2.ListJobsRequest(states=[1] * 65), "states"),  # type: ignore[list-item]
        ("zone.GetLogs", zone_pb2.GetLogsRequest(job_id="j-1", offset=2**63), "job_id"),
        (
            "control.Heartbeat",
            zone_pb2.HeartbeatRequest(
                summary=common_pb2.AgentSummary(
                    agent_id="a",
                    address="127.0.0.1:1",
                    shapes=[common_pb2.ShapeCapacity(shape=f"gpu:{i}") for i in range(300)],
                )
            ),
            "summary.shapes",
        ),
        (
            "control.Heartbeat",
            zone_pb2.HeartbeatRequest(
                summary=common_pb2.AgentSummary(
                    agent_id="a", address="127.0.0.1:1", hostname="h" * 300
                )
            ),
            "summary.hostname",
        ),
        (
            "control.Heartbeat",
            zone_pb2.HeartbeatRequest(
                summary=common_pb2.AgentSummary(agent_id="a", address="127.0.0.1:1"),
                readdress_subjob_ids=["s"] * 300,
            ),
            "readdress_subjob_ids",
        ),
        (
            "control.ExchangeSummary",
            zone_pb2.ZoneSummary(zone="b", address="not an address"),
            "address",
        ),
    ],
)
def test_lists_and_numbers_past_their_bounds_are_refused_naming_the_field(
    daemons: Daemons, rpc: str, request_: object, field: str
) -> None:
    who, method = rpc.split(".")
    stub = {"agent": daemons.agent, "zone": daemons.zone, "control": daemons.control}[who]
    error = _refused(getattr(stub, method), request_)
    code, details = error.code(), error.details()  # type: ignore[attr-defined]
    if field in ("subjob_id", "job_id"):
        # Unknown ids are looked up first; the point is that the answer is not INTERNAL.
        assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), details
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert field in details, details
    assert all(_serving(channel) for channel in daemons.channels)


def test_a_router_learns_at_most_max_peers_peer_zones(daemons: Daemons) -> None:
    codes = []
    for port in range(20000, 20000 + MAX_PEERS + 2):
        summary = zone_pb2.ZoneSummary(zone="p", address=f"127.0.0.1:{port}")
        try:
            daemons.control.ExchangeSummary(summary, timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())  # type: ignore[attr-defined]
            assert "address" in exc.details()  # type: ignore[attr-defined]
    assert codes.count(grpc.StatusCode.OK) == MAX_PEERS
    assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_max_message_bytes_is_validated_naming_the_key(tmp_path: Path) -> None:
    for root in (AgentConfig, ZoneConfig):
        with pytest.raises(ConfigError, match=r"server\.max_message_bytes"):
            load_config(root, overrides={"server.max_message_bytes": "1KiB"})  # type: ignore[type-var]
        config = load_config(root, overrides={"server.max_message_bytes": "8MiB"})  # type: ignore[type-var]
        assert config.server.max_message_bytes == 8 * 1024 * 1024  # type: ignore[attr-defined]
