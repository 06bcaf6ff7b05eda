"""Helpers for zone tests: a router handle with submit/poll shortcuts over real gRPC."""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster

HEARTBEAT_SECONDS = 0.2
TERMINAL = {zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED, zone_pb2.JOB_CANCELLED}


@dataclass
class Zone:
    cluster: LocalCluster
    address: str
    channel: grpc.Channel
    stub: zone_pb2_grpc.ZoneStub
    root: Path

    def submit(
        self,
        code: str = "print('ok')",
        *,
        resources: common_pb2.Resources | None = None,
        request_id: str = "",
        **fields: object,
    ) -> zone_pb2.Job:
        spec = zone_pb2.JobSpec(
            command=[sys.executable, "-c", code],
            resources=resources or common_pb2.Resources(gpus=1),
            **fields,  # type: ignore[arg-type]
        )
        return self.stub.Submit(
            zone_pb2.SubmitRequest(spec=spec, client_request_id=request_id), timeout=10
        )

    def get(self, job_id: str) -> zone_pb2.Job:
        return self.stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)

    def wait_state(self, job_id: str, *states: int, timeout_seconds: float = 30.0) -> zone_pb2.Job:
        """Poll GetJob until the job is in one of ``states`` (fails at the deadline)."""
        deadline = time.monotonic() + timeout_seconds
        job = self.get(job_id)
        while job.state not in states:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} is {zone_pb2.JobState.Name(job.state)} ({job.reason}), "
                    f"wanted {[zone_pb2.JobState.Name(s) for s in states]}"  # type: ignore[arg-type]
                )
            time.sleep(0.05)  # polling the router over gRPC, bounded by the deadline
            job = self.get(job_id)
        return job

    def watch_to_end(self, job_id: str, timeout_seconds: float = 30.0) -> list[zone_pb2.Job]:
        events = self.stub.WatchJob(
            zone_pb2.WatchJobRequest(job_id=job_id), timeout=timeout_seconds
        )
        return [event.job for event in events]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def open_zone(cluster: LocalCluster, root: Path, **kwargs: object) -> Zone:
    zone = cluster.start_zone("a", heartbeat_seconds=HEARTBEAT_SECONDS, **kwargs)  # type: ignore[arg-type]
    channel = grpc.insecure_channel(zone.address)
    return Zone(cluster, zone.address, channel, zone_pb2_grpc.ZoneStub(channel), root)
