"""Issue 13, item 3: any certificate the CA signed could call ExchangeSummary as a
"peer zone" and have jobs (with their environment) forwarded to it. The role check
stops agent and admin certificates (test_control.py); ``auth.peer_names`` narrows the
peer role to the routers the operator lists, so even a certificate wrongly issued with
the peer role is refused, and the listed peer still exchanges."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import grpc
from seckit import HEARTBEAT_SECONDS, failure, tls_args, trust_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.certs import init_certs
from laminar_cli.cluster import LocalCluster


def test_only_listed_peer_certificates_exchange_or_forward(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    init_certs(certs, ["router=router+peer", "peer-b=router+peer", "stray=peer", "ops=admin"])
    config = tmp_path / "zone.toml"
    config.write_text('[auth]\npeer_names = ["peer-b"]\n')
    with LocalCluster(tmp_path / "run", trust=trust_for(certs, "ops")) as cluster:
        zone = cluster.start_zone(
            "z",
            heartbeat_seconds=HEARTBEAT_SECONDS,
            extra_args=[*tls_args(certs, "router"), "--config", str(config)],
        )
        summary = zone_pb2.ZoneSummary(zone="other", address="127.0.0.1:9")
        spec = zone_pb2.JobSpec(
            command=[sys.executable, "-c", "pass"], resources=common_pb2.Resources(gpus=1)
        )
        forward = zone_pb2.ForwardJobRequest(from_zone="other", spec=spec)
        with trust_for(certs, "stray").channel(zone.address) as channel:
            control = zone_pb2_grpc.ZoneControlStub(channel)
            for call in (
                functools.partial(control.ExchangeSummary, summary, timeout=5),
                functools.partial(control.ForwardJob, forward, timeout=5),
            ):
                code, details = failure(call)
                assert code == grpc.StatusCode.PERMISSION_DENIED
                assert "auth.peer_names" in details and "stray" in details
        assert "peer zone other" not in zone.log_path.read_text()
        with trust_for(certs, "peer-b").channel(zone.address) as channel:
            reply = zone_pb2_grpc.ZoneControlStub(channel).ExchangeSummary(summary, timeout=5)
            assert reply.zone == "z"
        with trust_for(certs, "ops").channel(zone.address) as channel:
            jobs = zone_pb2_grpc.ZoneStub(channel).ListJobs(zone_pb2.ListJobsRequest(), timeout=10)
            assert list(jobs.jobs) == []  # the stray's forward created nothing
