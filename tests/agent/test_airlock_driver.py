"""Airlock wired into a real agent: injected pressure suspends the lowest class, then resumes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from waiting import gate_code, wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_cli.cluster import LocalCluster

GIB = 1024**3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def _state(stub: agent_pb2_grpc.AgentStub, subjob_id: str) -> int:
    request = agent_pb2.GetSubjobRequest(subjob_id=subjob_id)
    return int(stub.GetSubjob(request, timeout=10).state)


def _commit(
    stub: agent_pb2_grpc.AgentStub, subjob_id: str, priority: int, gate: Path
) -> common_pb2.Subjob:
    resources = common_pb2.Resources(gpu_milli=400, gpu_memory_bytes=20 * GIB)
    code = gate_code(gate)
    spec = common_pb2.SubjobSpec(
        subjob_id=subjob_id,
        job_id=f"job-{subjob_id}",
        command=[sys.executable, "-c", code],
        priority=priority,  # type: ignore[arg-type]
        resources=resources,
    )
    reply = stub.Probe(
        agent_pb2.ProbeRequest(
            job_id=spec.job_id, resources=resources, commit_if_fits=True, spec=spec
        ),
        timeout=10,
    )
    assert reply.subjob.state == common_pb2.RUNNING
    return reply.subjob


def test_pressure_suspends_opportunistic_and_resumes(cluster: LocalCluster, tmp_path: Path) -> None:
    agent = cluster.start_agent("h", "1xA100-80GB:shared")
    gate = tmp_path / "gate"
    with grpc.insecure_channel(agent.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        _commit(stub, "crit", common_pb2.CRITICAL, gate)
        _commit(stub, "opp", common_pb2.OPPORTUNISTIC, gate)

        stub.InjectLoad(agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=40 * GIB), timeout=10)
        wait_for(lambda: _state(stub, "opp") == common_pb2.SUSPENDED)
        assert _state(stub, "crit") == common_pb2.RUNNING
        airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
        suspends = [a for a in airlock.recent_actions if a.step == "suspend"]
        assert [a.subjob_id for a in suspends] == ["opp"]
        assert suspends[0].bytes_freed == 20 * GIB
        assert (suspends[0].slice_id, suspends[0].job_id) == ("gpu0", "job-opp")
        assert [s.slice_id for s in airlock.slices] == ["gpu0"]
        assert "80.0 GiB of 80.0 GiB" in suspends[0].reason
        assert [s.spec.subjob_id for s in airlock.suspended] == ["opp"]

        stub.InjectLoad(agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=0), timeout=10)
        wait_for(lambda: _state(stub, "opp") == common_pb2.RUNNING)
        airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
        assert any(a.step == "resume" and a.subjob_id == "opp" for a in airlock.recent_actions)
        inventory = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
        assert inventory.gpus[0].memory_used_bytes == 40 * GIB

        gate.write_text("go")
        terminal = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED}
        for subjob_id in ("crit", "opp"):
            wait_for(lambda sid=subjob_id: _state(stub, sid) in terminal)  # type: ignore[misc]
            assert _state(stub, subjob_id) == common_pb2.SUCCEEDED
