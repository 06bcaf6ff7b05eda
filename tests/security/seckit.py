"""Helpers for security tests: certificates per name, TLS flags, status codes of real calls."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.security import Trust, load_trust, write_file
from laminar_base.settings import ControlSettings, TlsSettings
from laminar_cli.cluster import LocalCluster, ZoneProcess
from laminar_cli.zoneclient import SECRET_FILE_ENV

HEARTBEAT_SECONDS = 0.2
#: Certificates the test CA issues, with their roles: the two daemons, an operator, and an
#: intruder holding a valid certificate with broad roles (so identity checks are what stop it).
HOSTS = ["router=router+peer", "agent=agent", "ops=admin", "intruder=router+agent"]


def tls_settings(certs: Path, name: str) -> TlsSettings:
    return TlsSettings(
        ca_file=str(certs / "ca.pem"),
        cert_file=str(certs / f"{name}.pem"),
        key_file=str(certs / f"{name}-key.pem"),
    )


def tls_args(certs: Path, name: str) -> list[str]:
    """Daemon flags that turn on mTLS with ``name``'s certificate."""
    tls = tls_settings(certs, name)
    return [
        "--tls-ca-file",
        tls.ca_file,
        "--tls-cert-file",
        tls.cert_file,
        "--tls-key-file",
        tls.key_file,
    ]


def trust_for(certs: Path, name: str) -> Trust:
    return load_trust(tls_settings(certs, name), ControlSettings())


def run_job(channel: grpc.Channel, text: str) -> None:
    """Submit a one-GPU job printing ``text`` through a router; return once it succeeded."""
    stub = zone_pb2_grpc.ZoneStub(channel)
    spec = zone_pb2.JobSpec(
        command=[sys.executable, "-c", f"print({text!r})"],
        resources=common_pb2.Resources(gpus=1),
    )
    job = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)

    def done() -> bool:
        state = stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10).state
        assert state not in (zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED)
        return state == zone_pb2.JOB_SUCCEEDED

    wait_for(done)


def failure(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """Run a call that must fail; its status code and details (server streams are drained)."""
    try:
        result = call()
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            list(result)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    raise AssertionError("the call succeeded")


@contextlib.contextmanager
def secret_cluster(
    root: Path, secret: str, zone_toml: str
) -> Iterator[tuple[LocalCluster, ZoneProcess]]:
    """A router (configured by ``zone_toml``) and agent ``gpu-01``, both holding the
    shared ``secret``; the cluster's own calls carry it too."""
    secret_file = root / "secret"
    write_file(secret_file, f"{secret}\n".encode(), 0o600)
    config = root / "zone.toml"
    config.write_text(zone_toml)
    env = {SECRET_FILE_ENV: str(secret_file)}
    with LocalCluster(root / "run", env=env, trust=Trust(secret=secret)) as cluster:
        zone = cluster.start_zone(
            "a", heartbeat_seconds=HEARTBEAT_SECONDS, extra_args=["--config", str(config)]
        )
        cluster.start_agent(
            "gpu-01", "1xH100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        yield cluster, zone
