"""MIG on demand through a real agent process, on fake GPUs and on the nvml backend over the
mocked NVML (its GPU-instance calls): an idle MIG GPU takes the layout a probe needs; a
busy one keeps its own with ``inventory.mig_carve_busy = false``, and by default has its
idle part carved while its running instance is untouched; a restarted agent keeps what it
applied."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from waiting import wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_cli.cluster import AgentProcess, LocalCluster

ON_DEMAND = {"LAMINAR_INVENTORY_MIG_ON_DEMAND": "true"}
NO_CARVE = {**ON_DEMAND, "LAMINAR_INVENTORY_MIG_CARVE_BUSY": "false"}
#: Two H100s laid out as seven 1g.10gb instances each.
GPUS = "2xH100-80GB:mig=1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"
SLEEP = "import sys, time; time.sleep(60)"
PRINT = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
GIB = 1 << 30
#: The same two GPUs as NVML reports them.
SCENARIO = {
    "gpus": [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 80 * GIB,
            "migs": [
                {"profile": "1g.10gb", "memory_total_bytes": 10 * GIB, "start": s, "size": 1}
                for s in range(7)
            ],
        }
    ]
    * 2
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _start(
    cluster: LocalCluster, backend: str, folder: Path, env: dict[str, str] = ON_DEMAND
) -> AgentProcess:
    if backend == "fake":
        return cluster.start_agent("h", GPUS, env=env)
    scenario = folder / "nvml.json"
    if not scenario.exists():
        scenario.write_text(json.dumps(SCENARIO))
    return cluster.start_agent(
        "h",
        "",
        extra_args=["--gpu-backend", "nvml"],
        env={**env, "LAMINAR_INVENTORY_NVML_MOCK": str(scenario)},
    )


def _stub(agent: AgentProcess) -> tuple[grpc.Channel, agent_pb2_grpc.AgentStub]:
    channel = grpc.insecure_channel(agent.address)
    return channel, agent_pb2_grpc.AgentStub(channel)


def _run(
    stub: agent_pb2_grpc.AgentStub, subjob_id: str, profile: str, code: str
) -> agent_pb2.ProbeReply:
    return stub.Probe(
        agent_pb2.ProbeRequest(
            job_id=f"job-{subjob_id}",
            resources=common_pb2.Resources(mig_profile=profile),
            commit_if_fits=True,
            spec=common_pb2.SubjobSpec(
                subjob_id=subjob_id,
                job_id=f"job-{subjob_id}",
                command=[sys.executable, "-c", code],
            ),
        ),
        timeout=10,
    )


def _free(stub: agent_pb2_grpc.AgentStub) -> dict[str, int]:
    summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
    return {s.shape: s.free for s in summary.shapes}


def _state(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> int:
    return stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10).state


@pytest.mark.parametrize("backend", ["fake", "nvml"])
def test_without_carving_an_idle_gpu_is_repartitioned_and_a_busy_one_never(
    cluster: LocalCluster, backend: str, tmp_path: Path
) -> None:
    agent = _start(cluster, backend, tmp_path, NO_CARVE)
    channel, stub = _stub(agent)
    with channel:
        # Idle GPUs advertise what they could hold: two 3g.40gb each.
        assert _free(stub)["mig:3g.40gb"] == 4
        # GPU 0 gets busy on a 1g.10gb instance it already has.
        small = _run(stub, "small", "1g.10gb", SLEEP)
        assert small.WhichOneof("outcome") == "lease", small
        assert small.lease.slice_ids[0].startswith("gpu0/1g.10gb@")
        # No 3g.40gb instance exists: the idle GPU 1 is repartitioned, GPU 0 is not.
        big = _run(stub, "big", "3g.40gb", PRINT)
        assert big.WhichOneof("outcome") == "lease", big
        assert big.lease.slice_ids[:] == ["gpu1/3g.40gb@0"]
        assert big.lease.device_uuids[0].startswith("MIG-")
        wait_for(lambda: _state(stub, "big") == common_pb2.SUCCEEDED)
        logs = stub.ReadLogs(agent_pb2.ReadLogsRequest(subjob_id="big"), timeout=10)
        assert logs.data.decode().split() == [big.lease.device_uuids[0]]
        # GPU 1 keeps its new layout: the next 3g.40gb takes one of its instances as is.
        second = _run(stub, "second", "3g.40gb", SLEEP)
        assert second.WhichOneof("outcome") == "lease", second
        assert second.lease.slice_ids[0].startswith("gpu1/3g.40gb@")
        third = _run(stub, "third", "3g.40gb", SLEEP)
        assert {second.lease.slice_ids[0], third.lease.slice_ids[0]} == {
            "gpu1/3g.40gb@0",
            "gpu1/3g.40gb@4",
        }
        # Both GPUs busy: a 7g.80gb fits nowhere now, and waiting may help.
        full = _run(stub, "full", "7g.80gb", SLEEP)
        assert full.WhichOneof("outcome") == "bounce" and full.bounce.retryable, full
        assert _state(stub, "small") == common_pb2.RUNNING


@pytest.mark.parametrize("backend", ["fake", "nvml"])
def test_a_busy_gpu_has_its_idle_part_carved_and_its_running_instance_untouched(
    cluster: LocalCluster, backend: str, tmp_path: Path
) -> None:
    agent = _start(cluster, backend, tmp_path)
    channel, stub = _stub(agent)
    with channel:
        small = _run(stub, "small", "1g.10gb", SLEEP)
        assert small.lease.slice_ids[0].startswith("gpu0/1g.10gb@"), small
        start = int(small.lease.slice_ids[0].rsplit("@", 1)[1])
        assert start >= 4  # where it leaves the most room: 4g and 3g at 0 still fit
        # GPU 1 is idle: the two 3g.40gb go there, where they strand least.
        for name in ("big", "second"):
            reply = _run(stub, name, "3g.40gb", SLEEP)
            assert reply.lease.slice_ids[0].startswith("gpu1/3g.40gb@"), reply
        # Now only GPU 0's idle part holds one: its idle 1g instances at 0-3 give way to a
        # 3g at 0, while the running one stays with its device.
        third = _run(stub, "third", "3g.40gb", PRINT)
        assert third.lease.slice_ids[:] == ["gpu0/3g.40gb@0"], third
        wait_for(lambda: _state(stub, "third") == common_pb2.SUCCEEDED)
        logs = stub.ReadLogs(agent_pb2.ReadLogsRequest(subjob_id="third"), timeout=10)
        assert logs.data.decode().split() == [third.lease.device_uuids[0]]
        assert third.lease.device_uuids[0] != small.lease.device_uuids[0]
        assert _state(stub, "small") == common_pb2.RUNNING
        # "third" ended: GPU 0 holds, around its running 1g, six 1g or the one 3g at 0
        # (GPU 1 is full). Polled: a memory read of an instance the repartition destroyed
        # can hold GPU 0 back until the next Airlock poll, and "third" may end before it.
        wait_for(lambda: (_free(stub).get("mig:1g.10gb"), _free(stub).get("mig:3g.40gb")) == (6, 1))


@pytest.mark.parametrize("backend", ["fake", "nvml"])
def test_a_restarted_agent_keeps_the_layout_it_applied_and_its_running_subjob(
    cluster: LocalCluster, backend: str, tmp_path: Path
) -> None:
    agent = _start(cluster, backend, tmp_path)
    channel, stub = _stub(agent)
    with channel:
        big = _run(stub, "big", "4g.40gb", SLEEP)
        assert big.lease.slice_ids[:] == ["gpu0/4g.40gb@0"]
    agent.process.kill()
    agent.process.wait()
    agent = _start(cluster, backend, tmp_path)
    channel, stub = _stub(agent)
    with channel:
        # Re-adopted on the instance it ran on, which exists again after the restart.
        assert _state(stub, "big") == common_pb2.RUNNING
        free = _free(stub)
        assert free["mig:3g.40gb"] == 1 + 2  # GPU 0's other instance, and idle GPU 1's two
        assert free["mig:4g.40gb"] == 1  # idle GPU 1 only
