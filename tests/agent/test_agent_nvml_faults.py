"""The agent in process, over real gRPC, on the production NvmlBackend with a mocked NVML:
what NVML faults do to a running agent (issue 18).

* A hung NVML call never stalls the event loop: the memory poll waits on a worker
  thread while probes are answered and heartbeats go out.
* A GPU that falls off the bus (Xid 79) is drained and its subjob ended with the cause
  ``GPU_FAILED``; a real router retries the job (for free) on the other GPU; the agent's
  summary and inventory say which GPU is out and why; once NVML answers again the router
  places work on it again.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import grpc
from test_heartbeat import RecordingZone, serving
from waiting import gate_code, wait_for

from laminar_agent.config import AgentConfig
from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockNvml
from laminar_agent.server import AgentServer
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_base.configlib import load_config
from laminar_base.errors import LaminarError
from laminar_cli.cluster import LocalCluster

GIB = 1 << 30


@contextmanager
def agent_on(
    tmp_path: Path, backend: NvmlBackend, zone: str = "", **settings: object
) -> Iterator[AgentServer]:
    """A started agent on ``backend`` (polling every 50 ms, heartbeating to ``zone``, with
    ``settings`` as config overrides), running on an event loop of its own in another
    thread: a test that blocks nothing of its own sees whether the agent's loop stays free."""
    overrides: dict[str, object] = {
        "server.listen": "127.0.0.1:0",
        "server.state_dir": str(tmp_path / "agent"),
        "server.agent_id": "gpuhost",
        "airlock.poll_seconds": 0.05,
        "executor.run_as_user": "",  # subjobs write into tmp_path, which only root may enter
    }
    if zone:
        overrides |= {"zone.zone": zone, "zone.heartbeat_seconds": 0.1}
    overrides |= settings
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
            assert server.state is not None
            node = server.state.node
            for subjob_id in list(node.live_states):  # no orphans, whatever the test did
                with suppress(LaminarError):
                    await node.signal(subjob_id, agent_pb2.TERMINATE, "test over", 2.0)
            await server.stop()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), name="agent-loop")
    thread.start()
    started.wait(30)
    try:
        assert not failed, failed
        yield server
    finally:
        # As a signal does (serve_until_signalled): the loops that end now were asked to.
        loop.call_soon_threadsafe(server.supervisor.begin_stop)
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


def test_a_gpu_that_falls_off_the_bus_ends_its_work_which_the_router_retries(
    tmp_path: Path,
) -> None:
    mock = MockNvml([MockGpu("NVIDIA H100 80GB HBM3", 80 * GIB) for _ in range(2)])
    backend = NvmlBackend(nvml=mock, recover_after_seconds=1.0)
    gate, later = tmp_path / "gate", tmp_path / "later"
    with LocalCluster(tmp_path) as cluster:
        zone = cluster.start_zone("z", heartbeat_seconds=0.2)
        with (
            agent_on(tmp_path, backend, zone.address) as agent,
            grpc.insecure_channel(zone.address) as zone_channel,
            grpc.insecure_channel(agent.address) as agent_channel,
        ):
            router = zone_pb2_grpc.ZoneStub(zone_channel)
            stub = agent_pb2_grpc.AgentStub(agent_channel)

            def listed() -> common_pb2.AgentSummary:
                agents = router.ListAgents(zone_pb2.ListAgentsRequest(), timeout=10).agents
                ready = [a for a in agents if a.state == zone_pb2.AGENT_READY]
                return ready[0].summary if ready else common_pb2.AgentSummary()

            wait_for(lambda: listed().total_gpus == 2)

            def submit(gate_file: Path) -> str:
                spec = zone_pb2.JobSpec(
                    command=[sys.executable, "-c", gate_code(gate_file)],
                    resources=common_pb2.Resources(gpus=1),
                )
                return router.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10).job_id

            def job(job_id: str) -> zone_pb2.Job:
                return router.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)

            def running(job_id: str) -> list[zone_pb2.Placement]:
                return [p for p in job(job_id).placements if p.state == common_pb2.RUNNING]

            job_id = submit(gate)
            wait_for(lambda: bool(running(job_id)))
            first = running(job_id)[0]
            failing = int(first.slice_ids[0].removeprefix("gpu"))

            # Xid 79: the GPU fell off the bus, and its calls fail from now on.
            mock.gpus[failing].is_lost = True
            mock.xid(failing, 79)
            wait_for(lambda: any(p.attempt > first.attempt for p in running(job_id)))
            ended = stub.GetSubjob(
                agent_pb2.GetSubjobRequest(subjob_id=first.subjob_id), timeout=10
            )
            assert ended.state == common_pb2.KILLED
            assert ended.end_cause == common_pb2.END_CAUSE_GPU_FAILED
            assert "Xid 79: fell off the bus" in ended.reason
            retried = running(job_id)[0]
            assert retried.slice_ids == [f"gpu{1 - failing}"]
            assert job(job_id).retries_used == 0  # not the job's fault: a free retry

            # Which GPU is out, and why, in the agent's summary (what its heartbeats carry)
            # and its inventory; no new work on it: the host has no free GPU to offer.
            def summary() -> common_pb2.AgentSummary:
                return stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)

            (degraded,) = summary().degraded_gpus
            assert (degraded.index, degraded.failed) == (failing, True)
            assert "Xid 79: fell off the bus" in degraded.reason
            assert [s.free for s in summary().shapes] == [0]
            inventory = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
            assert [g.index for g in inventory.degraded_gpus] == [failing]

            # It answers again: after its hold it takes work, the next job lands on it.
            mock.gpus[failing].is_lost = False
            wait_for(lambda: not summary().degraded_gpus)
            later_job = submit(later)
            wait_for(lambda: bool(running(later_job)))
            assert running(later_job)[0].slice_ids == [f"gpu{failing}"]
            gate.touch()
            later.touch()
            for done in (job_id, later_job):
                wait_for(lambda done=done: job(done).state == zone_pb2.JOB_SUCCEEDED)
