"""Issue 13, item 4: leases escape neither quota, nor tenant, nor time.

Real router and agent processes; a tenant uses the two-phase API (ProbeJob with
keep_leases, then CommitJob) the way an attacker would.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from seckit import failure
from waiting import wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import AgentProcess, LocalCluster, ZoneProcess
from laminar_zone.auth import hash_token

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}


def _meta(tenant: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS[tenant]}")]


@pytest.fixture
def zone(tmp_path: Path) -> Iterator[tuple[ZoneProcess, AgentProcess]]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        "\n".join(
            f'[[token]]\ntenant = "{t}"\nrole = "tenant"\nhash = "{hash_token(tok)}"\n'
            for t, tok in TOKENS.items()
        )
    )
    config = tmp_path / "zone.toml"
    config.write_text(
        f'[auth]\ntokens_file = "{tokens}"\n[queue]\ntenant_quotas = "alice:gpus=1"\n'
    )
    with LocalCluster(tmp_path) as cluster:
        z = cluster.start_zone("a", heartbeat_seconds=0.2, extra_args=["--config", str(config)])
        agent = cluster.start_agent("h1", "4xH100-80GB", zone=z.address, heartbeat_seconds=0.2)
        stub = zone_pb2_grpc.ZoneStub(grpc.insecure_channel(z.address))
        wait_for(
            lambda: any(
                a.state == zone_pb2.AGENT_READY
                for a in stub.ListAgents(
                    zone_pb2.ListAgentsRequest(), metadata=_meta("bob"), timeout=5
                ).agents
            )
        )
        yield z, agent


def _spec(gpus: int) -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(
        command=[sys.executable, "-c", "pass"], resources=common_pb2.Resources(gpus=gpus)
    )


def _keep(stub: zone_pb2_grpc.ZoneStub, tenant: str, gpus: int) -> zone_pb2.ProbeJobReply:
    reply = stub.ProbeJob(
        zone_pb2.ProbeJobRequest(spec=_spec(gpus), keep_leases=True, lease_ttl_seconds=30),
        metadata=_meta(tenant),
        timeout=10,
    )
    assert reply.hosts and reply.hosts[0].fits, reply
    return reply


def _commit(
    stub: zone_pb2_grpc.ZoneStub, tenant: str, reply: zone_pb2.ProbeJobReply, gpus: int
) -> zone_pb2.Job:
    return stub.CommitJob(
        zone_pb2.CommitJobRequest(spec=_spec(gpus), leases=[h.lease for h in reply.hosts]),
        metadata=_meta(tenant),
        timeout=10,
    )


def test_lease_ids_are_unguessable_and_bound_to_the_tenant_that_probed(
    zone: tuple[ZoneProcess, AgentProcess],
) -> None:
    z, _ = zone
    stub = zone_pb2_grpc.ZoneStub(grpc.insecure_channel(z.address))
    first, second = _keep(stub, "bob", 1), _keep(stub, "bob", 1)
    ids = [r.hosts[0].lease.lease_id for r in (first, second)]
    assert all(re.search(r"l-[0-9a-f]{32}$", i) for i in ids), ids
    assert ids[0] != ids[1]
    # alice (who may hold one GPU) commits bob's lease: refused, and bob's stays good.
    code, details = failure(lambda: _commit(stub, "alice", first, 1))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "leases[0]" in details
    job = _commit(stub, "bob", first, 1)
    assert job.spec.tenant == "bob"
    # a guessed (sequential-looking) id is refused the same way
    forged = zone_pb2.ProbeJobReply()
    forged.hosts.add().lease.CopyFrom(second.hosts[0].lease)
    forged.hosts[0].lease.lease_id = ids[1][:-1] + ("0" if ids[1][-1] != "0" else "1")
    code, _ = failure(lambda: _commit(stub, "bob", forged, 1))
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_commit_job_checks_quota_and_the_probed_resources(
    zone: tuple[ZoneProcess, AgentProcess],
) -> None:
    z, _ = zone
    stub = zone_pb2_grpc.ZoneStub(grpc.insecure_channel(z.address))
    two = _keep(stub, "alice", 2)  # probing is not running: it is allowed
    code, details = failure(lambda: _commit(stub, "alice", two, 2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "spec.resources" in details
    one = _keep(stub, "alice", 1)
    code, details = failure(lambda: _commit(stub, "alice", one, 3))  # lease for 1, asks 3
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "spec.resources" in details
    assert _commit(stub, "alice", one, 1).spec.tenant == "alice"


def test_expired_leases_are_dropped_by_the_agent_itself(
    zone: tuple[ZoneProcess, AgentProcess],
) -> None:
    _, agent = zone
    stub = agent_pb2_grpc.AgentStub(grpc.insecure_channel(agent.address))

    def summary() -> common_pb2.AgentSummary:
        return stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=5)

    before = summary()
    for _ in range(4):
        reply = stub.Probe(
            agent_pb2.ProbeRequest(
                job_id="hog", resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=1
            ),
            timeout=5,
        )
        assert reply.WhichOneof("outcome") == "lease"
    assert summary().active_leases == 4
    # No other probe arrives: the agent's own tick must let them lapse.
    wait_for(lambda: summary().active_leases == 0, timeout_seconds=10)
    after = summary()
    assert [(s.shape, s.free) for s in after.shapes] == [(s.shape, s.free) for s in before.shapes]


def test_probe_job_is_rate_limited_by_default(zone: tuple[ZoneProcess, AgentProcess]) -> None:
    z, _ = zone
    stub = zone_pb2_grpc.ZoneStub(grpc.insecure_channel(z.address))
    codes = []
    for _ in range(60):
        try:
            stub.ProbeJob(
                zone_pb2.ProbeJobRequest(spec=_spec(1)), metadata=_meta("bob"), timeout=10
            )
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
