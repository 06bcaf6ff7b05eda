"""Roles with the shared secret (no certificates): what can be separated.

Every agent host holds the control secret (it must, to heartbeat and to check the
router's calls), so with one secret a compromised GPU host could call ExchangeSummary
as a "peer zone" and have jobs, environment included, forwarded to it. Routers may
hold a second secret, ``control.peer_secret_file``, that peer calls must carry and
agents never see: an agent's secret then no longer opens ExchangeSummary or ForwardJob,
while real peer zones still exchange and the cluster keeps placing work.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from seckit import HEARTBEAT_SECONDS, failure, secret_cluster
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.errors import ConfigError
from laminar_base.security import PEER_SECRET_HEADER, SECRET_HEADER, Trust, load_trust, write_file
from laminar_base.settings import ControlSettings, TlsSettings
from laminar_cli.cluster import ZoneProcess

SECRET = "control-secret-held-by-every-host"
PEER_SECRET = "peer-secret-held-by-routers-only"


@dataclass
class PeerCluster:
    zone: ZoneProcess
    peer: ZoneProcess
    peer_secret_file: Path


@pytest.fixture(scope="module")
def peered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerCluster]:
    root = tmp_path_factory.mktemp("peersecret")
    peer_secret_file = root / "peer-secret"
    write_file(peer_secret_file, f"{PEER_SECRET}\n".encode(), 0o600)
    zone_toml = f'[control]\npeer_secret_file = "{peer_secret_file}"\n'
    with secret_cluster(root, SECRET, zone_toml) as (cluster, zone):
        peer = cluster.start_zone(
            "b",
            peers=[zone.address],
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=["--config", str(root / "zone.toml")],
        )
        yield PeerCluster(zone, peer, peer_secret_file)


def test_a_real_peer_zone_exchanges_with_the_peer_secret(peered: PeerCluster) -> None:
    wait_for(lambda: "peer zone b" in peered.zone.log_path.read_text())
    assert "peer secret on peer calls" in peered.zone.log_path.read_text()


def test_an_agent_hosts_secret_opens_no_peer_call(peered: PeerCluster) -> None:
    summary = zone_pb2.ZoneSummary(zone="rogue", address="127.0.0.1:9")
    spec = zone_pb2.JobSpec(
        command=[sys.executable, "-c", "pass"], resources=common_pb2.Resources(gpus=1)
    )
    forward = zone_pb2.ForwardJobRequest(from_zone="rogue", spec=spec)
    for extra in ((), ((PEER_SECRET_HEADER, "a-guess"),)):
        with Trust(secret=SECRET).channel(peered.zone.address, extra_headers=extra) as channel:
            control = zone_pb2_grpc.ZoneControlStub(channel)
            calls = (
                functools.partial(control.ExchangeSummary, summary, timeout=5),
                functools.partial(control.ForwardJob, forward, timeout=5),
            )
            for call in calls:
                code, details = failure(call)
                assert code == grpc.StatusCode.UNAUTHENTICATED
                assert PEER_SECRET_HEADER in details and "peer_secret_file" in details
                assert ("wrong" if extra else "missing") in details
    # nothing was learnt or created, and the router and its agent are healthy (a job
    # submitted here might be forwarded to zone b, which has no agent: not placed here)
    assert "peer zone rogue" not in peered.zone.log_path.read_text()
    with Trust(secret=SECRET).channel(peered.zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        assert list(stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10).jobs) == []
        agents = stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=10).agents
        assert [(a.agent_id, a.state) for a in agents] == [("gpu-01", zone_pb2.AGENT_READY)]


def test_calls_to_agents_never_carry_the_peer_secret(peered: PeerCluster) -> None:
    trust = load_trust(
        TlsSettings(),
        ControlSettings(peer_secret_file=str(peered.peer_secret_file)),
    )
    assert trust.peer_secret == PEER_SECRET
    assert PEER_SECRET_HEADER not in dict(trust.headers())
    assert dict(trust.for_peers().headers()) == {PEER_SECRET_HEADER: PEER_SECRET}
    both = Trust(secret=SECRET, peer_secret=PEER_SECRET)
    assert dict(both.headers()) == {SECRET_HEADER: SECRET}


def test_a_peer_secret_readable_by_others_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "peer-secret"
    write_file(loose, b"s3cret\n", 0o644)
    with pytest.raises(ConfigError) as err:
        load_trust(TlsSettings(), ControlSettings(peer_secret_file=str(loose)))
    assert err.value.field == "control.peer_secret_file"
