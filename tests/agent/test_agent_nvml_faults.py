"""The agent in process, over real gRPC, on the production NvmlBackend with a mocked NVML:
what NVML faults do to a running agent (issue 18).

* A hung NVML call never stalls the event loop: the memory poll waits on a worker
  thread while probes are answered and heartbeats go out.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from test_heartbeat import RecordingZone, serving
from waiting import wait_for

from laminar_agent.config import AgentConfig
from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockNvml
from laminar_agent.server import AgentServer
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.configlib import load_config

GIB = 1 << 30


@contextmanager
def agent_on(tmp_path: Path, backend: NvmlBackend, zone: str = "") -> Iterator[AgentServer]:
    """A started agent on ``backend`` (polling every 50 ms, heartbeating to ``zone``),
    running on an event loop of its own in another thread: a test that blocks nothing of
    its own sees whether the agent's loop stays free."""
    overrides: dict[str, object] = {
        "server.listen": "127.0.0.1:0",
        "server.state_dir": str(tmp_path / "agent"),
        "server.agent_id": "gpuhost",
        "airlock.poll_seconds": 0.05,
    }
    if zone:
        overrides |= {"zone.zone": zone, "zone.heartbeat_seconds": 0.1}
    server = AgentServer(load_config(AgentConfig, overrides=overrides), backend=backend)
    started = threading.Event()
    failed: list[BaseException] = []

    async def run() -> None:
        try:
            await server.start()
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            started.set()
        try:
            await server.stop_event.wait()
        finally:
            await server.stop()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), name="agent-loop")
    thread.start()
    started.wait(30)
    try:
        assert not failed, failed
        yield server
    finally:
        loop.call_soon_threadsafe(server.stop_event.set)
        thread.join(60)
        loop.close()


def test_a_hung_nvml_call_stalls_neither_probes_nor_heartbeats(tmp_path: Path) -> None:
    mock = MockNvml([MockGpu("NVIDIA H100 80GB HBM3", 80 * GIB)])
    # A deadline far past the test's: were the poll on the event loop, nothing below
    # would be answered until the hang ends.
    backend = NvmlBackend(nvml=mock, call_deadline_seconds=600)
    release = threading.Event()
    recorder = RecordingZone()
    call = "nvmlDeviceGetMemoryInfo"
    with serving(recorder) as zone, agent_on(tmp_path, backend, zone) as server:
        try:
            mock.hang(call, release)
            wait_for(lambda: mock.blocked(call) > 0)  # the agent's memory poll is stuck
            beats = len(recorder.snapshot())
            with grpc.insecure_channel(server.address) as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                reply = stub.Probe(
                    agent_pb2.ProbeRequest(
                        probe_id="p", job_id="j", resources=common_pb2.Resources(gpus=1)
                    ),
                    timeout=10,
                )
                assert reply.WhichOneof("outcome") == "lease"
                summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
                assert summary.total_gpus == 1
            wait_for(lambda: len(recorder.snapshot()) >= beats + 3)  # heartbeats go out
            assert mock.blocked(call) == 1  # all of the above happened during the hang
        finally:
            release.set()
