"""A router's shutdown ends its open WatchJob and SubmitAndWatch streams at once,
UNAVAILABLE (their clients watch again once a router serves), instead of holding the
server's grace to its end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from serverkit import zone_server

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc

ONE_GPU_JOB = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))


async def test_a_shutdown_ends_open_watches_at_once(tmp_path: Path) -> None:
    grace = 60.0  # what an open watch would hold the shutdown for
    async with (
        zone_server(tmp_path, **{"server.grace_seconds": grace}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = zone_pb2_grpc.ZoneStub(channel)
        # No agent: the job stays queued, so neither stream would end on its own.
        both = stub.SubmitAndWatch(zone_pb2.SubmitRequest(spec=ONE_GPU_JOB))
        first = await both.read()
        assert first.job.state == zone_pb2.QUEUED
        watch = stub.WatchJob(zone_pb2.WatchJobRequest(job_id=first.job.job_id))
        assert (await watch.read()).job.job_id == first.job.job_id  # open and serving

        stopping = asyncio.ensure_future(server.stop())
        for stream in (watch, both):
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while await stream.read() is not grpc.aio.EOF:
                    pass  # a change before the end is read here; an OK end fails the test
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (ended.value.details() or "")
        await asyncio.wait_for(stopping, grace / 4)  # not held for the grace
