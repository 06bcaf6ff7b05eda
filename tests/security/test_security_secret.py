"""The shared secret on a real router and a real agent (no TLS).

Both daemons read ``control.shared_secret_file`` from the environment; the
router's calls to agents and the agent's heartbeats carry it, so jobs place
as before, while a caller without it (or with a wrong one) is refused
UNAUTHENTICATED on every control call. Health, reflection and the submitter
API do not need it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from seckit import HEARTBEAT_SECONDS, failure, run_job

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.security import SECRET_HEADER, Trust, write_file
from laminar_cli.cluster import AgentProcess, LocalCluster, ZoneProcess
from laminar_cli.main import main
from laminar_cli.zoneclient import SECRET_FILE_ENV

SECRET = "correct-horse-battery-staple"


@dataclass
class SecretCluster:
    cluster: LocalCluster
    zone: ZoneProcess
    agent: AgentProcess
    secret_file: Path


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecretCluster]:
    root = tmp_path_factory.mktemp("secret")
    secret_file = root / "secret"
    write_file(secret_file, f"{SECRET}\n".encode(), 0o600)
    env = {SECRET_FILE_ENV: str(secret_file)}
    with LocalCluster(root / "run", env=env, trust=Trust(secret=SECRET)) as cluster:
        zone = cluster.start_zone("a", heartbeat_seconds=HEARTBEAT_SECONDS)
        agent = cluster.start_agent(
            "agent", "2xH100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        yield SecretCluster(cluster, zone, agent, secret_file)


def test_the_router_with_the_secret_places_a_job(guarded: SecretCluster) -> None:
    with grpc.insecure_channel(guarded.zone.address) as channel:  # Zone needs no secret
        run_job(channel, "with secret")
    for daemon in (guarded.zone, guarded.agent):
        log = daemon.log_path.read_text()
        assert "authenticated by shared secret" in log
        assert "unauthenticated" not in log


def test_control_calls_without_the_secret_are_unauthenticated(guarded: SecretCluster) -> None:
    probe = agent_pb2.ProbeRequest(job_id="j", resources=common_pb2.Resources(gpus=1))
    commit = agent_pb2.CommitRequest(
        lease_id="agent-r0-1",
        spec=common_pb2.SubjobSpec(job_id="j", command=["true"]),
    )
    with grpc.insecure_channel(guarded.agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        for call in (
            lambda: stub.Probe(probe, timeout=5),
            lambda: stub.Commit(commit, timeout=5),
            lambda: stub.WatchSubjobs(agent_pb2.WatchSubjobsRequest(), timeout=5),
        ):
            code, details = failure(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert f"missing {SECRET_HEADER}" in details and "shared_secret_file" in details
        code, details = failure(
            lambda: stub.Commit(commit, timeout=5, metadata=[(SECRET_HEADER, "guess")])
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert f"wrong {SECRET_HEADER}" in details
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(guarded.zone.address) as channel:
        code, details = failure(
            lambda: zone_pb2_grpc.ZoneControlStub(channel).Heartbeat(
                zone_pb2.HeartbeatRequest(summary=common_pb2.AgentSummary(agent_id="fake")),
                timeout=5,
            )
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED
        agents = zone_pb2_grpc.ZoneStub(channel).ListAgents(zone_pb2.ListAgentsRequest(), timeout=5)
        assert [a.agent_id for a in agents.agents] == ["agent"]  # the fake one never joined


def test_the_cli_sends_the_secret_to_agents(
    guarded: SecretCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    address = guarded.agent.address
    assert main(["--secret-file", str(guarded.secret_file), "inventory", "--agent", address]) == 0
    assert "H100-80GB" in capsys.readouterr().out
    assert main(["inventory", "--agent", address]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
