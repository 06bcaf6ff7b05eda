"""Issue 13, item 6: an admin's ListJobs used to fail once the reply passed gRPC's 4 MiB
message limit. The router now cuts pages by size and hands out page tokens, and
``laminar jobs`` follows them through :func:`laminar_cli.zoneclient.list_jobs`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster, ZoneProcess
from laminar_cli.main import main as cli_main
from laminar_cli.zoneclient import list_jobs

#: Jobs queued with environments big enough that all of them together pass 4 MiB.
JOBS = 12
#: One variable's value: seven per job, under the router's 64 KiB per value.
VALUE = "x" * (60 * 1024)


@pytest.fixture
def zone(tmp_path: Path) -> Iterator[ZoneProcess]:
    with LocalCluster(tmp_path) as cluster:
        yield cluster.start_zone("z")  # no agent: every job stays queued


def _submit_big_jobs(stub: zone_pb2_grpc.ZoneStub) -> set[str]:
    ids = set()
    for i in range(JOBS):
        spec = zone_pb2.JobSpec(
            name=f"big-{i}",
            command=[sys.executable, "-c", "pass"],
            env={f"V{k}": VALUE for k in range(7)},
            resources=common_pb2.Resources(gpus=1),
        )
        ids.add(stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10).job_id)
    return ids


def test_list_jobs_pages_past_the_message_limit_and_the_cli_follows_the_pages(
    zone: ZoneProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    with grpc.insecure_channel(zone.address) as channel:
        stub = zone_pb2_grpc.ZoneStub(channel)
        submitted = _submit_big_jobs(stub)
        first = stub.ListJobs(zone_pb2.ListJobsRequest(limit=1000), timeout=10)
        assert first.next_page_token, "one reply cannot hold every job"
        assert 0 < len(first.jobs) < JOBS
        assert first.ByteSize() < 4 * 1024 * 1024
        # the helper follows the tokens: every job exactly once; a limit is honoured
        listed = list_jobs(stub, zone_pb2.ListJobsRequest(), 1000)
        assert sorted(j.job_id for j in listed) == sorted(submitted)
        assert len(list_jobs(stub, zone_pb2.ListJobsRequest(), 3)) == 3
        # a forged page token is refused naming the field, and the router stays healthy
        with pytest.raises(grpc.RpcError) as bad:
            stub.ListJobs(zone_pb2.ListJobsRequest(page_token="../../etc"), timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_token" in (bad.value.details() or "")
    capsys.readouterr()
    assert cli_main(["--zone", zone.address, "jobs", "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {j["job_id"] for j in shown["jobs"]} == submitted
