"""Heartbeats over the stream against a real router started in the test (127.0.0.1:0):
an agent killed with SIGKILL is stale at once (well within the periodic bound, while its
allowed silence is far longer), a change reaches the router without waiting a period, a
router with the stream turned off gets unary heartbeats, and the stream refuses a caller
without the shared secret as the unary call does.

The killed agent is a real process (the heartbeat benchmark's pool of one agent, the
agent's own heartbeat client); the others run the client in the test's event loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from loopkit import eventually
from serverkit import zone_server

from laminar_agent.heartbeat import HeartbeatClient
from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.security import Trust, write_file
from laminar_bench.heartbeat_pool import POOL_INFO, EmptyJournal, idle_summary
from laminar_zone.server import ZoneServer
from laminar_zone.view import AgentRecord

SHAPE = "share:H100-80GB"


def record(server: ZoneServer, agent_id: str) -> AgentRecord | None:
    assert server.state is not None
    return server.state.view.agents.get(agent_id)


async def _true(value: bool) -> bool:
    return value


def on_stream(server: ZoneServer, agent_id: str) -> Callable[[], asyncio.Future[bool]]:
    """A predicate: the router holds the agent, ready, on a heartbeat stream."""

    def check() -> asyncio.Future[bool]:
        r = record(server, agent_id)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        fut.set_result(r is not None and r.is_ready and r.silence_allowed_seconds > 0)
        return fut

    return check


async def test_an_agent_killed_while_streaming_is_stale_at_once(tmp_path: Path) -> None:
    async with zone_server(tmp_path) as server:
        membership = server.config.membership
        state_dir = tmp_path / "pool"
        argv = [sys.executable, "-m", "laminar_bench.heartbeat_pool", "--count", "1"]
        argv += ["--zone", server.address, "--state-dir", str(state_dir), "--prefix", "k"]
        argv += ["--spread-seconds", "0.01", "--log-level", "WARNING"]
        pool = await asyncio.create_subprocess_exec(*argv)
        try:
            await eventually(lambda: _true((state_dir / POOL_INFO).exists()), "the pool runs")
            await eventually(on_stream(server, "k0"), "the agent on its stream")
            agent = record(server, "k0")
            assert agent is not None
            # Silence alone would take liveness + stale_after: far longer than the bound.
            assert agent.silence_allowed_seconds > 2 * membership.stale_after_seconds()
            last = agent.last_heartbeat
            os.kill(pool.pid, signal.SIGKILL)
            await asyncio.wait_for(pool.wait(), 10)
            await eventually(lambda: _true(agent.is_stale), "stale after SIGKILL")
            # Made stale by its stream's end (which takes back the silence the stream
            # allowed), not by that silence running out.
            assert agent.silence_allowed_seconds == 0.0
            assert agent.last_heartbeat == last  # loss still counts from its last heartbeat
        finally:
            if pool.returncode is None:
                pool.kill()
                await asyncio.wait_for(pool.wait(), 10)


def changing_summary(agent_id: str) -> tuple[Callable[[], common_pb2.AgentSummary], list[int]]:
    """An idle host's summary whose free GPUs the test sets through the returned list
    (its second item counts the times the client looked at the summary)."""
    idle = idle_summary(agent_id, "127.0.0.1:9")
    free = [8, 0]

    def summary() -> common_pb2.AgentSummary:
        free[1] += 1
        message = idle()
        message.shapes[0].free = free[0]
        return message

    return summary, free


@asynccontextmanager
async def running(client: HeartbeatClient) -> AsyncIterator[HeartbeatClient]:
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop), name="test-heartbeat-client")
    try:
        yield client
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_change_reaches_the_router_without_waiting_a_period(tmp_path: Path) -> None:
    period = 60.0  # nothing in this test may wait for it
    overrides = {"membership.heartbeat_seconds": period, "membership.lost_after_seconds": 300.0}
    async with zone_server(tmp_path, **overrides) as server:
        summary, free = changing_summary("c0")
        client = HeartbeatClient(server.address, period, summary, EmptyJournal(), lambda *_: None)
        async with running(client):
            await eventually(on_stream(server, "c0"), "the agent on its stream", 10)
            agent = record(server, "c0")
            assert agent is not None and agent.shapes[SHAPE].free == 8
            free[0] = 3
            client.wake.set()  # what a subjob event does in the agent
            await eventually(
                lambda: _true(agent.shapes[SHAPE].free == 3), "the new summary", timeout_seconds=10
            )
            assert client.use_stream and client.streams_opened == 1
            assert client.streamed >= 2 and client.failures == 0


async def test_an_idle_streaming_agent_sends_only_every_liveness_period(tmp_path: Path) -> None:
    overrides = {"membership.heartbeat_seconds": 0.2, "membership.stream_liveness_seconds": 60.0}
    async with zone_server(tmp_path, **overrides) as server:
        summary, looked = changing_summary("i0")
        client = HeartbeatClient(server.address, 0.2, summary, EmptyJournal(), lambda *_: None)
        async with running(client):
            await eventually(on_stream(server, "i0"), "the agent on its stream", 10)
            streamed, passes = client.streamed, looked[1]
            # The client looks at its summary every period; with nothing new, nothing goes.
            await eventually(lambda: _true(looked[1] >= passes + 5), "five more periods", 10)
            assert client.streamed == streamed
            assert client.liveness_seconds == server.config.membership.liveness_seconds()


async def test_a_router_with_the_stream_off_gets_unary_heartbeats(tmp_path: Path) -> None:
    overrides = {"membership.heartbeat_seconds": 0.2, "membership.stream": False}
    async with zone_server(tmp_path, **overrides) as server:
        summary, _ = changing_summary("u0")
        client = HeartbeatClient(server.address, 0.2, summary, EmptyJournal(), lambda *_: None)
        async with running(client):

            async def joined() -> bool:
                r = record(server, "u0")
                return r is not None and r.is_ready and client.sent >= 3

            await eventually(joined, "unary heartbeats", 10)
            assert not client.use_stream and client.streamed == 0
            agent = record(server, "u0")
            assert agent is not None and agent.silence_allowed_seconds == 0.0


async def test_the_stream_refuses_a_caller_without_the_secret(tmp_path: Path) -> None:
    secret = "stream-secret"
    secret_file = tmp_path / "secret"
    write_file(secret_file, f"{secret}\n".encode(), 0o600)
    async with zone_server(tmp_path, **{"control.shared_secret_file": str(secret_file)}) as server:
        request = zone_pb2.HeartbeatRequest(
            summary=idle_summary("s0", "127.0.0.1:9")(), summary_version=1
        )
        async with grpc.aio.insecure_channel(server.address) as channel:
            call = zone_pb2_grpc.ZoneControlStub(channel).Heartbeats()  # type: ignore[call-arg]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.write(request)
                await call.read()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert record(server, "s0") is None
        async with Trust(secret=secret).aio_channel(server.address) as channel:
            call = zone_pb2_grpc.ZoneControlStub(channel).Heartbeats()  # type: ignore[call-arg]
            await call.write(request)
            reply = await call.read()
            assert isinstance(reply, zone_pb2.HeartbeatReply)
            assert reply.summary_version == 1 and reply.liveness_seconds > 0
            await call.done_writing()
        agent = record(server, "s0")
        assert agent is not None


async def test_a_shutdown_ends_the_streams_at_once_and_agents_notice(tmp_path: Path) -> None:
    grace = 60.0  # what open streams would hold the shutdown for
    async with zone_server(tmp_path, **{"server.grace_seconds": grace}) as server:
        summary, _ = changing_summary("d0")
        client = HeartbeatClient(server.address, 1.0, summary, EmptyJournal(), lambda *_: None)
        async with running(client):
            await eventually(on_stream(server, "d0"), "the agent on its stream", 10)
            await asyncio.wait_for(server.stop(), grace / 4)
            agent = record(server, "d0")
            assert agent is not None and not agent.is_stale  # a shutdown is not the agent's
            # Idle, the agent notices at once, not a liveness period later.
            await eventually(lambda: _true(client.failures >= 1), "the agent notices", 5)
