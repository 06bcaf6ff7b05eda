"""Issue 13, item 6: log ids are ids, never paths. The agent's ReadLogs used to serve
``../../../dev`` (test_control.py re-enacts it on the agent); the router's GetLogs
passed any subjob id on. Both now refuse anything but one safe id, naming the field,
and a job's real logs are still served."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
from seckit import HEARTBEAT_SECONDS, failure
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster


def test_get_logs_takes_an_id_never_a_path(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        zone = cluster.start_zone("z", heartbeat_seconds=HEARTBEAT_SECONDS)
        cluster.start_agent(
            "gpu-01", "1xH100-80GB", zone=zone.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        with grpc.insecure_channel(zone.address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            spec = zone_pb2.JobSpec(
                command=[sys.executable, "-c", "print('mine')"],
                resources=common_pb2.Resources(gpus=1),
            )
            job = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)

            def done() -> bool:
                got = stub.GetJob(zone_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
                return got.state == zone_pb2.JOB_SUCCEEDED

            wait_for(done)
            for bad in ("../../../dev", "../agent.db", "a/b", "..", "x" * 200):
                code, details = failure(
                    lambda b=bad: stub.GetLogs(  # type: ignore[misc]
                        zone_pb2.GetLogsRequest(job_id=job.job_id, subjob_id=b), timeout=10
                    )
                )
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "subjob_id" in details, bad
            logs = stub.GetLogs(zone_pb2.GetLogsRequest(job_id=job.job_id), timeout=10)
            assert logs.data == b"mine\n"
