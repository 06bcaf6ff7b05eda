"""An agent's shutdown with the router's call stream and a WatchSubjobs stream open, in
process over real gRPC: the call stream answers what it has read and both end UNAVAILABLE
at once, so the shutdown does not wait out the server's grace on them and takes no new
probe during it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from laminar_agent.config import AgentConfig
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.server import AgentServer
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.callstream import CallClient
from laminar_base.configlib import load_config


def _probes(job_id: str) -> agent_pb2.AgentCall:
    probe = agent_pb2.ProbeRequest(
        job_id=job_id, resources=common_pb2.Resources(gpus=1), lease_ttl_seconds=60
    )
    return agent_pb2.AgentCall(probes=agent_pb2.ProbeBatchRequest(probes=[probe]))


async def test_a_shutdown_ends_the_routers_call_stream_and_takes_no_new_probe(
    tmp_path: Path,
) -> None:
    grace = 60.0  # what an open stream would hold the shutdown for
    config = load_config(
        AgentConfig,
        overrides={
            "server.listen": "127.0.0.1:0",
            "server.state_dir": str(tmp_path / "agent"),
            "server.agent_id": "stopping",
            "server.grace_seconds": grace,
        },
    )
    server = AgentServer(config, backend=FakeGpuBackend("2xA100-40GB", agent_id="stopping"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            client: CallClient[agent_pb2.AgentCall, agent_pb2.AgentCallReply] = CallClient(
                lambda: stub.Calls()
            )
            first = await client.call(_probes("before"), 10)
            assert first.probes.replies[0].HasField("lease")  # the stream is open and serves
            watch = stub.WatchSubjobs(agent_pb2.WatchSubjobsRequest())
            assert server.service is not None
            while not server.service.watches_open:  # no subjob: it sends nothing, ever
                await asyncio.sleep(0)  # the call reaching the servicer (loop turns, no timer)
            stopping = asyncio.ensure_future(server.stop())
            while not server.service.streams_ending:
                await asyncio.sleep(0)  # the shutdown's first steps (loop turns, no timer)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.call(_probes("during"), 10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while await watch.read() is not grpc.aio.EOF:
                    pass  # no event is due; an OK end fails the test
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (ended.value.details() or "")
            await asyncio.wait_for(stopping, grace / 4)  # not held for the grace
            await client.close()
        assert server.state is not None
        server.state.node.ledger.check_invariant()
        held = [lease.job_id for lease in server.state.node.ledger.leases()]
        assert held == ["before"]  # nothing granted once the shutdown began
    finally:
        if not server.stop_event.is_set():
            await server.stop()
