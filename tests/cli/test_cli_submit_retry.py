"""`laminar submit` rides out a router restart (the request id makes a resend safe) and
runs the command where it was submitted from."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import grpc
import pytest
from waiting import wait_for

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster
from laminar_cli.main import main as cli_main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_submit_retries_while_the_router_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{_free_port()}"
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("a", listen=address)
        zone.process.send_signal(signal.SIGKILL)
        zone.process.wait(10)
        codes: list[int] = []
        monkeypatch.chdir(tmp_path)
        submitter = threading.Thread(
            target=lambda: codes.append(cli_main(["--zone", address, "submit", "--", "true"]))
        )
        submitter.start()
        cluster.start_zone("a", listen=address)  # back while the CLI is retrying
        submitter.join(60)
        assert codes == [0]
        job_id = capsys.readouterr().out.strip().splitlines()[-1]
        with grpc.insecure_channel(address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            wait_for(lambda: bool(stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=5).jobs))
            job = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=5)
        assert job.spec.workdir == str(tmp_path)
        assert len(stub_jobs(address)) == 1


def stub_jobs(address: str) -> list[zone_pb2.Job]:
    with grpc.insecure_channel(address) as channel:
        return list(
            zone_pb2_grpc.ZoneStub(channel).ListJobs(zone_pb2.ListJobsRequest(), timeout=5).jobs
        )


def test_job_and_cancel_retry_while_the_router_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a job and cancelling it are idempotent, so they resend while the router is down."""
    address = f"127.0.0.1:{_free_port()}"
    monkeypatch.chdir(tmp_path)
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("a", listen=address)
        assert cli_main(["--zone", address, "submit", "--", "sleep", "600"]) == 0
        job_id = capsys.readouterr().out.strip().splitlines()[-1]
        zone.process.send_signal(signal.SIGKILL)
        zone.process.wait(10)
        codes: list[int] = []

        def job_then_cancel() -> None:
            codes.append(cli_main(["--zone", address, "job", job_id, "-o", "json"]))
            codes.append(cli_main(["--zone", address, "cancel", job_id]))

        client = threading.Thread(target=job_then_cancel)
        client.start()
        cluster.start_zone("a", listen=address)  # back while the CLI is retrying
        client.join(60)
        assert codes == [0, 0]
        out = capsys.readouterr().out
        assert job_id in out and f"{job_id}: cancelled" in out
