"""A real agent process on the nvml backend over a mocked NVML, joined to a real router.

The agent is selected onto the mock only through ``LAMINAR_INVENTORY_NVML_MOCK``; it
runs the production NvmlBackend, so the router sees canonical model names and a job
asking for ``H100-80GB`` lands on the GPU NVML calls "NVIDIA H100 80GB HBM3". The test
then replaces the scenario file (the mock follows it) to make that GPU fall off the bus.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import grpc
from waiting import wait_for

from laminar_agent.inventory.nvml_mock import MockNvml
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import AgentProcess, LocalCluster, ZoneProcess

GIB = 1 << 30
SCENARIO = {
    "gpus": [
        {"name": "NVIDIA A100-SXM4-40GB", "memory_total_bytes": 40 * GIB},
        {"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GIB, "used_bytes": GIB},
    ]
}


def _write_scenario(path: Path, scenario: dict[str, object]) -> None:
    """Replace the file in one step, as the agent's mock follows it while running."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(scenario))
    os.replace(tmp, path)


def _start_on_mock(cluster: LocalCluster, scenario: Path) -> tuple[ZoneProcess, AgentProcess]:
    """A router and one agent on the nvml backend over the mocked NVML of ``scenario``,
    selected only through the environment, registered."""
    zone = cluster.start_zone("z", heartbeat_seconds=0.2)
    agent = cluster.start_agent(
        "gpuhost",
        "",
        zone=zone.address,
        heartbeat_seconds=0.2,
        extra_args=["--gpu-backend", "nvml"],
        env={"LAMINAR_INVENTORY_NVML_MOCK": str(scenario)},
    )
    cluster.wait_registered()
    return zone, agent


def test_agent_on_mocked_nvml_registers_runs_a_job_and_survives_a_fault(tmp_path: Path) -> None:
    scenario = tmp_path / "nvml.json"
    _write_scenario(scenario, SCENARIO)
    mock = MockNvml.from_scenario(SCENARIO)
    mock.nvmlInit()
    h100_uuid = mock.nvmlDeviceGetUUID(mock.nvmlDeviceGetHandleByIndex(1))
    seen = tmp_path / "seen.txt"
    code = f"import os, pathlib; pathlib.Path({str(seen)!r}).write_text(os.environ['CUDA_VISIBLE_DEVICES'])"
    with LocalCluster(tmp_path) as cluster:
        zone, agent = _start_on_mock(cluster, scenario)
        with grpc.insecure_channel(agent.address) as channel:
            inv = agent_pb2_grpc.AgentStub(channel).GetInventory(
                agent_pb2.GetInventoryRequest(), timeout=10
            )
        assert (inv.backend, inv.driver_version) == ("nvml", "550.54.15")
        assert [(g.model, g.uuid) for g in inv.gpus][1] == ("H100-80GB", h100_uuid)
        assert [g.model for g in inv.gpus] == ["A100-40GB", "H100-80GB"]
        assert inv.gpus[1].memory_used_bytes == GIB
        with grpc.insecure_channel(zone.address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            spec = zone_pb2.JobSpec(
                command=[sys.executable, "-c", code],
                resources=common_pb2.Resources(gpus=1, gpu_model="H100-80GB"),
            )
            job_id = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10).job_id

            def job() -> zone_pb2.Job:
                return stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=10)

            wait_for(lambda: job().state in (zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED))
            assert job().state == zone_pb2.JOB_SUCCEEDED, job().reason
        assert seen.read_text() == h100_uuid

        # The H100 falls off the bus: the agent stays up, degrades it, and recovers.
        lost = {"gpus": [SCENARIO["gpus"][0], {**SCENARIO["gpus"][1], "is_lost": True}]}
        _write_scenario(scenario, lost)
        wait_for(lambda: f"GPU {h100_uuid} degraded" in agent.log_path.read_text())
        with grpc.insecure_channel(agent.address) as channel:
            inv = agent_pb2_grpc.AgentStub(channel).GetInventory(
                agent_pb2.GetInventoryRequest(), timeout=10
            )
        assert [g.model for g in inv.gpus] == ["A100-40GB", "H100-80GB"]  # last record kept
        _write_scenario(scenario, SCENARIO)
        wait_for(lambda: f"GPU {h100_uuid} recovered" in agent.log_path.read_text())
        assert agent.is_running()


def test_airlock_sees_a_subjobs_memory_as_nvml_lists_its_processes(tmp_path: Path) -> None:
    """On the nvml backend a subjob's GPU memory is what NVML lists for its processes (a
    child of the subjob's process counts), not what the subjob says about itself."""
    scenario = tmp_path / "nvml.json"
    _write_scenario(scenario, SCENARIO)
    gate, pids = tmp_path / "gate", tmp_path / "pids"
    # The subjob starts a child and lists both pids; both run until the gate opens.
    child_code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"
    code = (
        "import os, pathlib, subprocess, sys, time\n"
        f"gate = pathlib.Path({str(gate)!r})\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
        f"pathlib.Path({str(pids)!r}).write_text(f'{{os.getpid()}} {{child.pid}}')\n"
        "while not gate.exists(): time.sleep(0.05)\n"
        "child.wait()\n"
    )
    with LocalCluster(tmp_path) as cluster:
        zone, agent = _start_on_mock(cluster, scenario)
        with (
            grpc.insecure_channel(zone.address) as zone_channel,
            grpc.insecure_channel(agent.address) as agent_channel,
        ):
            stub = zone_pb2_grpc.ZoneStub(zone_channel)
            spec = zone_pb2.JobSpec(
                command=[sys.executable, "-c", code],
                resources=common_pb2.Resources(gpus=1, gpu_model="H100-80GB"),
            )
            job_id = stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10).job_id
            wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
            _, child = (int(p) for p in pids.read_text().split())
            subjob_id = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id)).placements[0].subjob_id
            h100 = {**SCENARIO["gpus"][1], "processes": {str(child): 30 * GIB}}
            _write_scenario(scenario, {"gpus": [SCENARIO["gpus"][0], h100]})
            agent_stub = agent_pb2_grpc.AgentStub(agent_channel)

            def seen() -> int:
                request = agent_pb2.GetSubjobRequest(subjob_id=subjob_id)
                return int(agent_stub.GetSubjob(request, timeout=10).gpu_memory_used_bytes)

            wait_for(lambda: seen() == 30 * GIB)
            gate.touch()
            wait_for(
                lambda: (
                    stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id)).state
                    == zone_pb2.JOB_SUCCEEDED
                )
            )
