"""mTLS between a real router and a real agent, with certificates from `laminar certs init`.

One cluster per module: the router serves and calls with the ``router`` certificate,
the agent with ``agent``, and the test talks as ``ops``. A job placed through the
router proves both directions (agent -> router heartbeats, router -> agent
Probe/Commit); plaintext clients and certificates from another CA are refused at
the handshake; a lease is bound to the identity that probed for it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from seckit import HEARTBEAT_SECONDS, HOSTS, failure, run_job, tls_args, trust_for
from waiting import wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.grpcutil import channel_options
from laminar_cli.certs import init_certs
from laminar_cli.cluster import AgentProcess, LocalCluster, ZoneProcess
from laminar_cli.main import main


@dataclass
class TlsCluster:
    cluster: LocalCluster
    zone: ZoneProcess
    agent: AgentProcess
    certs: Path
    other_ca: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    root = tmp_path_factory.mktemp("mtls")
    certs, other = root / "certs", root / "other-ca"
    init_certs(certs, HOSTS)
    init_certs(other, ["ops"])  # same names, another CA
    with LocalCluster(root / "run", trust=trust_for(certs, "ops")) as cluster:
        zone = cluster.start_zone(
            "a",
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=[*tls_args(certs, "router"), "--tls-allowed-names", "agent,router,intruder"],
        )
        agent = cluster.start_agent(
            "agent",
            "2xH100-80GB",
            zone=zone.address,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=[*tls_args(certs, "agent"), "--tls-allowed-names", "router,ops,intruder"],
        )
        cluster.wait_registered()
        yield TlsCluster(cluster, zone, agent, certs, other)


def test_a_job_runs_through_the_router_over_mtls(tls: TlsCluster) -> None:
    with trust_for(tls.certs, "ops").channel(tls.zone.address, channel_options()) as channel:
        run_job(channel, "over mtls")
    log = (tls.agent.state_dir / "agent.log").read_text()
    assert "authenticated by mTLS" in log
    assert "unauthenticated" not in log


def test_health_and_reflection_keep_working_over_mtls(tls: TlsCluster) -> None:
    trust = trust_for(tls.certs, "ops")
    for address in (tls.zone.address, tls.agent.address):
        with trust.channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            names = {s.name for r in replies for s in r.list_services_response.service}
            assert names & {"laminar.v1.Agent", "laminar.v1.ZoneControl"}


def test_plaintext_clients_are_refused(tls: TlsCluster) -> None:
    with grpc.insecure_channel(tls.agent.address) as channel:
        code, _ = failure(
            lambda: agent_pb2_grpc.AgentStub(channel).GetInventory(
                agent_pb2.GetInventoryRequest(), timeout=5
            )
        )
    assert code == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(tls.zone.address) as channel:
        code, _ = failure(
            lambda: zone_pb2_grpc.ZoneStub(channel).ListAgents(
                zone_pb2.ListAgentsRequest(), timeout=5
            )
        )
    assert code == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_from_another_ca_and_no_certificate_are_refused(tls: TlsCluster) -> None:
    stranger = trust_for(tls.other_ca, "ops")  # right name, wrong CA
    with stranger.channel(tls.agent.address) as channel:
        code, _ = failure(
            lambda: agent_pb2_grpc.AgentStub(channel).Probe(
                agent_pb2.ProbeRequest(job_id="j", resources=common_pb2.Resources(gpus=1)),
                timeout=5,
            )
        )
    assert code == grpc.StatusCode.UNAVAILABLE
    ca = (tls.certs / "ca.pem").read_bytes()  # server verified, but no client certificate
    with grpc.secure_channel(tls.agent.address, grpc.ssl_channel_credentials(ca)) as channel:
        code, _ = failure(
            lambda: agent_pb2_grpc.AgentStub(channel).GetInventory(
                agent_pb2.GetInventoryRequest(), timeout=5
            )
        )
    assert code == grpc.StatusCode.UNAVAILABLE


def test_the_cli_talks_to_an_mtls_agent_with_its_files_and_explains_a_failed_handshake(
    tls: TlsCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    def files(folder: Path) -> list[str]:
        return [
            "--ca-file",
            str(folder / "ca.pem"),
            "--cert-file",
            str(folder / "ops.pem"),
            "--key-file",
            str(folder / "ops-key.pem"),
        ]

    address = tls.agent.address
    assert main([*files(tls.certs), "inventory", "--agent", address]) == 0
    assert "H100-80GB" in capsys.readouterr().out
    assert main([*files(tls.other_ca), "inventory", "--agent", address]) == 3
    err = capsys.readouterr().err
    assert f"TLS handshake with {address} failed" in err and "--ca-file" in err


def test_allowed_names_limit_control_calls_to_the_named_certificates(tls: TlsCluster) -> None:
    # The router takes control calls only from "agent" and "router": ops is refused there,
    # though its Zone calls (submitters) work. The agent does not list "agent" itself.
    with trust_for(tls.certs, "ops").channel(tls.zone.address) as channel:
        code, details = failure(
            lambda: zone_pb2_grpc.ZoneControlStub(channel).Heartbeat(
                zone_pb2.HeartbeatRequest(summary=common_pb2.AgentSummary(agent_id="x")),
                timeout=5,
            )
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "'ops'" in details and "tls.allowed_names" in details
        agents = zone_pb2_grpc.ZoneStub(channel).ListAgents(zone_pb2.ListAgentsRequest(), timeout=5)
        assert [a.agent_id for a in agents.agents] == ["agent"]
    with trust_for(tls.certs, "agent").channel(tls.agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        for call in (
            lambda: stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=5),
            lambda: stub.WatchSubjobs(agent_pb2.WatchSubjobsRequest(), timeout=5),
        ):
            code, details = failure(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "'agent'" in details and "tls.allowed_names" in details
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_an_agent_id_is_bound_to_the_certificate_naming_it(tls: TlsCluster) -> None:
    # "intruder" has the agent role and may make control calls (allowed names), but it
    # cannot speak for agent "agent": its certificate does not name it.
    with trust_for(tls.certs, "intruder").channel(tls.zone.address) as channel:
        code, details = failure(
            lambda: zone_pb2_grpc.ZoneControlStub(channel).Heartbeat(
                zone_pb2.HeartbeatRequest(
                    summary=common_pb2.AgentSummary(agent_id="agent", address="127.0.0.1:9")
                ),
                timeout=5,
            )
        )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "summary.agent_id" in details and "'agent'" in details and "intruder" in details
    with trust_for(tls.certs, "ops").channel(tls.zone.address) as channel:
        agents = zone_pb2_grpc.ZoneStub(channel).ListAgents(zone_pb2.ListAgentsRequest(), timeout=5)
    assert [a.address for a in agents.agents] == [tls.agent.address]  # the view is untouched


def test_a_lease_is_committed_and_released_only_by_the_identity_that_probed(
    tls: TlsCluster,
) -> None:
    # Both certificates carry the router role; the lease is still only the prober's.
    ops = trust_for(tls.certs, "router").channel(tls.agent.address)
    intruder = trust_for(tls.certs, "intruder").channel(tls.agent.address)
    with ops, intruder:
        as_ops, as_intruder = agent_pb2_grpc.AgentStub(ops), agent_pb2_grpc.AgentStub(intruder)
        reply = as_ops.Probe(
            agent_pb2.ProbeRequest(
                job_id="j-lease", resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=30
            ),
            timeout=10,
        )
        assert reply.WhichOneof("outcome") == "lease", reply
        lease_id = reply.lease.lease_id
        spec = common_pb2.SubjobSpec(
            job_id="j-lease",
            command=[sys.executable, "-c", "pass"],
            resources=common_pb2.Resources(gpus=1),
        )
        code, details = failure(
            lambda: as_intruder.Commit(
                agent_pb2.CommitRequest(lease_id=lease_id, spec=spec), timeout=10
            )
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "'router'" in details and "'intruder'" in details and "lease_id" in details
        released = as_intruder.Release(agent_pb2.ReleaseRequest(lease_ids=[lease_id]), timeout=10)
        assert released.released == 0
        released = as_ops.Release(agent_pb2.ReleaseRequest(lease_ids=[lease_id]), timeout=10)
        assert released.released == 1


def test_peer_routers_exchange_and_forward_over_mtls_and_refuse_a_plaintext_peer(
    tmp_path: Path,
) -> None:
    certs = tmp_path / "certs"
    init_certs(certs, HOSTS)
    with LocalCluster(tmp_path / "run", trust=trust_for(certs, "ops")) as cluster:
        a = cluster.start_zone(
            "a", heartbeat_seconds=HEARTBEAT_SECONDS, extra_args=tls_args(certs, "router")
        )
        b = cluster.start_zone(
            "b",
            peers=[a.address],
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=tls_args(certs, "router"),
        )
        cluster.start_agent(
            "agent",  # its certificate names it: an agent id another certificate names is refused
            "4xH100-80GB",
            zone=b.address,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=tls_args(certs, "agent"),
        )
        cluster.wait_registered()
        # A plaintext router (started after wait_registered, which speaks TLS) cannot peer.
        plain = cluster.start_zone("plain", peers=[a.address], heartbeat_seconds=HEARTBEAT_SECONDS)
        wait_for(lambda: "summary exchange with peer" in plain.log_path.read_text())
        trust = trust_for(certs, "ops")
        with trust.channel(a.address) as ca, trust.channel(b.address) as cb:
            za, zb = zone_pb2_grpc.ZoneStub(ca), zone_pb2_grpc.ZoneStub(cb)
            spec = zone_pb2.JobSpec(
                command=[sys.executable, "-c", "pass"], resources=common_pb2.Resources(gpus=1)
            )
            forwarded: list[zone_pb2.Job] = []

            def forwarded_one() -> bool:
                # Zone a has no agents: once b's summary (4 free GPUs) arrived over mTLS, a
                # new job goes to b with probability 5/6; the others wait in a's queue.
                job = za.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
                got = za.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
                if got.state == zone_pb2.FORWARDED:
                    forwarded.append(got)
                return bool(forwarded)

            wait_for(forwarded_one)
            remote_id = forwarded[0].forwarded_to.rpartition("/")[2]
            assert forwarded[0].forwarded_to.startswith("b@")

            def remote_done() -> bool:
                remote = zb.GetJob(zone_pb2.GetJobRequest(job_id=remote_id), timeout=10)
                return remote.state == zone_pb2.JOB_SUCCEEDED

            wait_for(remote_done)
        log = a.log_path.read_text()
        assert "peer zone b" in log and "peer zone plain" not in log
