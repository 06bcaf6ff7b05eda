"""Airlock's suspend on the nvml backend (mocked NVML), with NVIDIA's cuda-checkpoint
present and absent (issue 18).

The stand-in cuda-checkpoint records its calls and does to the mocked NVML what the real
one does to the driver: ``--toggle --pid PID`` moves that process's GPU memory out of the
GPU's process list (to host memory) or back. With it, the opportunistic subjob is
suspended, its memory leaves the GPU, and it resumes with its memory back once pressure
clears; without it, a stop would free nothing, so the victim is reclaimed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_agent_nvml_faults import agent_on
from test_airlock_agent import _run_now, _spec
from waiting import wait_for

from laminar_agent.inventory.base import NOT_DETECTED
from laminar_agent.inventory.cuda_checkpoint import detect_cuda_checkpoint
from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockMig, MockNvml
from laminar_agent.metrics import AgentMetrics
from laminar_agent.state import AgentState
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2

GIB = 1 << 30
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GIB}
#: The driver forgets a process's memory when it exits; so does the mock, with this key.
LIVE = {"live_pids_only": True}


def _write(path: Path, scenario: dict[str, Any]) -> None:
    tmp = path.with_suffix(".test-tmp")
    tmp.write_text(json.dumps(scenario))
    os.replace(tmp, path)


def _stand_in(folder: Path, scenario: Path) -> Path:
    """A cuda-checkpoint that moves a pid's memory between its GPU's process list and a
    ``checkpointed`` list in the mock's scenario file, and records each call. While a file
    ``hold-PID`` exists in ``folder`` a toggle of PID takes that long (as the real copy
    takes seconds per GiB)."""
    folder.mkdir()
    path = folder / "cuda-checkpoint"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:] == ['--help']:\n    print('--toggle --pid PID')\n    sys.exit(0)\n"
        f"with open({str(folder / 'calls')!r}, 'a') as f:\n"
        "    f.write(' '.join(sys.argv[1:]) + '\\n')\n"
        "pid = sys.argv[3]\n"
        f"while os.path.exists(os.path.join({str(folder)!r}, 'hold-' + pid)):\n"
        "    import time; time.sleep(0.05)\n"
        # As the real one: a stopped process never answers it (seen on an H200).
        "if open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] in 'Tt':\n"
        "    print('process', pid, 'is stopped')\n    sys.exit(1)\n"
        f"data = json.load(open({str(scenario)!r}))\n"
        "for gpu in data['gpus']:\n"
        "    procs, held = gpu.setdefault('processes', {}), gpu.setdefault('checkpointed', {})\n"
        "    if pid in procs:\n        held[pid] = procs.pop(pid)\n        break\n"
        "    if pid in held:\n        procs[pid] = held.pop(pid)\n        break\n"
        "else:\n    print('no CUDA state in process', pid)\n    sys.exit(1)\n"
        f"tmp = {str(scenario)!r} + '.cc-tmp'\n"
        "json.dump(data, open(tmp, 'w'))\n"
        f"os.replace(tmp, {str(scenario)!r})\n"
    )
    path.chmod(0o755)
    return path


@contextmanager
def _copy_held(folder: Path, pid: str) -> Iterator[None]:
    """Inside it, the stand-in's toggle of ``pid`` takes its time (see :func:`_stand_in`).
    The hold goes however the block ends: one left behind would keep the stand-in looping
    after a failed test (and the agent's stop waiting on it)."""
    hold = folder / f"hold-{pid}"
    hold.touch()
    try:
        yield
    finally:
        hold.unlink(missing_ok=True)


Stub = agent_pb2_grpc.AgentStub
State = Callable[[str], common_pb2.Subjob]


@contextmanager
def _serving(
    tmp_path: Path, backend: NvmlBackend, **settings: object
) -> Iterator[tuple[Stub, State]]:
    """An agent on ``backend`` (:func:`agent_on`), a stub to it and one subjob's state.

    The agent has an id of its own: subjob cgroups live at ``<root>/laminar.<agent id>/
    <subjob id>``, so agents that share an id on one host (copies of these tests run at
    once, by CI or by other checkouts) put their "opp" in the same cgroup, and one agent's
    suspend stopped, and its teardown killed, the other's processes (its checkpoint then
    found the process already stopped). Its cgroup folder goes with it."""
    agent_id = f"gpuhost-{uuid.uuid4().hex[:12]}"
    cgroups = None
    try:
        with (
            agent_on(tmp_path, backend, **{"server.agent_id": agent_id, **settings}) as agent,
            grpc.insecure_channel(agent.address) as channel,
        ):
            assert agent.state is not None
            cgroups = agent.state.node.executor.cgroups
            stub = agent_pb2_grpc.AgentStub(channel)

            def state(subjob_id: str) -> common_pb2.Subjob:
                return stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=subjob_id), timeout=10)

            yield stub, state
    finally:
        if cgroups is not None:  # its subjobs' cgroups went as they ended
            with suppress(OSError):
                cgroups.base.rmdir()


def _start(
    stub: agent_pb2_grpc.AgentStub, name: str, priority: int, gate: Path, pid_file: Path
) -> None:
    """Run a subjob on half the GPU that writes its pid, then waits for ``gate``."""
    spec = _spec(
        name, priority, common_pb2.Resources(gpu_milli=500, gpu_memory_bytes=30 * GIB), gate
    )
    code = f"import os, pathlib\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
    spec.command[-1] = code + spec.command[-1]
    _run_now(stub, spec)


@pytest.mark.parametrize("with_tool", [True, False], ids=["cuda-checkpoint", "absent"])
def test_suspend_frees_memory_through_cuda_checkpoint_else_the_victim_is_reclaimed(
    tmp_path: Path, with_tool: bool
) -> None:
    scenario = tmp_path / "nvml.json"
    _write(scenario, {**LIVE, "gpus": [H100]})
    tools = tmp_path / "bin"
    if with_tool:
        _stand_in(tools, scenario)
    backend = NvmlBackend(shared_indices=frozenset({0}), nvml=MockNvml.from_file(scenario))
    backend.cuda_checkpoint = detect_cuda_checkpoint(
        "", backend.driver_version(), search_path=str(tools)
    )
    assert backend.cuda_checkpoint.is_available == with_tool
    gate = tmp_path / "gate"
    with _serving(tmp_path, backend, **{"airlock.reclaim_grace_seconds": 0.5}) as (stub, state):

        def inventory() -> agent_pb2.Inventory:
            return stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)

        assert inventory().cuda_checkpoint_available == with_tool
        _start(stub, "prod", common_pb2.PRODUCTION, gate, tmp_path / "prod.pid")
        _start(stub, "opp", common_pb2.OPPORTUNISTIC, gate, tmp_path / "opp.pid")
        wait_for(lambda: (tmp_path / "prod.pid").exists() and (tmp_path / "opp.pid").exists())
        prod, opp = ((tmp_path / f"{n}.pid").read_text() for n in ("prod", "opp"))
        # NVML sees 50 + 30 of 80 GiB: critical pressure on the GPU.
        _write(scenario, {**LIVE, "gpus": [{**H100, "processes": {opp: 50 * GIB, prod: 30 * GIB}}]})

        if with_tool:
            wait_for(lambda: state("opp").state == common_pb2.SUSPENDED)
            calls = tools / "calls"
            assert calls.read_text().splitlines() == [f"--toggle --pid {opp}"]
            wait_for(lambda: inventory().gpus[0].memory_used_bytes == 30 * GIB)  # freed
            assert "cuda-checkpoint" in inventory().cuda_checkpoint_detail
            # Pressure clears for good when prod needs less: opp comes back, memory and all.
            data = json.loads(scenario.read_text())
            data["gpus"][0]["processes"][prod] = 10 * GIB
            _write(scenario, data)
            wait_for(lambda: state("opp").state == common_pb2.RUNNING)
            # The driver reads a checkpointed process as 0 bytes; its resume still counts
            # the 50 GiB it takes back (prod's 30 + 50 was over the resume mark: resuming
            # it then would put the GPU back at critical, again and again).
            airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
            resumes = [a.reason for a in airlock.recent_actions if a.step == "resume"]
            assert len(resumes) == 1 and "projected 60.0 GiB of 80.0 GiB" in resumes[0], resumes
            # Continued first, then restored (the stand-in, as the real tool, refuses a
            # stopped process): its memory is back on the GPU.
            wait_for(lambda: len(calls.read_text().splitlines()) == 2)
            assert calls.read_text().splitlines() == [f"--toggle --pid {opp}"] * 2
            wait_for(
                lambda: (
                    json.loads(scenario.read_text())["gpus"][0]["processes"].get(opp) == 50 * GIB
                )
            )
        else:
            wait_for(lambda: state("opp").state == common_pb2.KILLED)
            assert state("opp").end_cause == common_pb2.END_CAUSE_RECLAIMED
            assert "a stop frees nothing, so it is reclaimed" in state("opp").reason
            assert not tools.exists()
            assert "no cuda-checkpoint binary on PATH" in inventory().cuda_checkpoint_detail
        assert state("prod").state == common_pb2.RUNNING
        gate.touch()
        wait_for(lambda: state("prod").state == common_pb2.SUCCEEDED)


def test_a_slow_checkpoint_blinds_airlock_to_no_other_gpu(tmp_path: Path) -> None:
    """cuda-checkpoint copies a subjob's memory to the host (about 19 s for 30 GiB on an
    H200). While GPU 0's victim is being checkpointed, GPU 1's victim is still suspended,
    and GPU 0's victim is counted as relief under way, not chosen again."""
    scenario = tmp_path / "nvml.json"
    gpus = [H100, {**H100, "name": "NVIDIA H100 80GB HBM3"}]
    _write(scenario, {**LIVE, "gpus": gpus})
    tools = tmp_path / "bin"
    _stand_in(tools, scenario)
    backend = NvmlBackend(nvml=MockNvml.from_file(scenario))
    backend.cuda_checkpoint = detect_cuda_checkpoint(
        "", backend.driver_version(), search_path=str(tools)
    )
    gate = tmp_path / "gate"
    with _serving(tmp_path, backend) as (stub, state):
        pids = {}
        for name in ("opp0", "opp1"):
            spec = _spec(
                name,
                common_pb2.OPPORTUNISTIC,
                common_pb2.Resources(gpus=1, gpu_memory_bytes=70 * GIB),
                gate,
            )
            pid_file = tmp_path / f"{name}.pid"
            code = f"import os, pathlib\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
            spec.command[-1] = code + spec.command[-1]
            subjob = _run_now(stub, spec)
            wait_for(pid_file.exists)
            pids[name] = (pid_file.read_text(), int(subjob.slice_ids[0].removeprefix("gpu")))
        held_gpu = pids["opp0"][1]
        with _copy_held(tools, pids["opp0"][0]):  # GPU 0's copy takes its time
            data = {**LIVE, "gpus": [dict(g) for g in gpus]}
            for pid, index in pids.values():
                data["gpus"][index]["processes"] = {pid: 78 * GIB}  # both GPUs critical
            _write(scenario, data)

            wait_for(lambda: state("opp1").state == common_pb2.SUSPENDED)
            # GPU 0's copy has begun (the two GPUs' steps are taken in either order).
            opp0_toggle = f"--toggle --pid {pids['opp0'][0]}"
            wait_for(lambda: opp0_toggle in (tools / "calls").read_text().splitlines())
            calls = (tools / "calls").read_text().splitlines()
            assert state("opp0").state == common_pb2.RUNNING  # its checkpoint still copies
            assert calls.count(opp0_toggle) == 1  # not chosen again
            assert held_gpu != pids["opp1"][1]
        wait_for(lambda: state("opp0").state == common_pb2.SUSPENDED)
        steps = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=50), timeout=10)
        suspends = [a.subjob_id for a in steps.recent_actions if a.step == "suspend"]
        assert sorted(suspends) == ["opp0", "opp1"]
        gate.touch()


def test_a_copy_under_way_counts_as_relief_while_nvml_reads_straddle_it(tmp_path: Path) -> None:
    """While a victim's checkpoint copies, a poll can read the GPU's totals with its memory
    still there and the process list without it (two NVML calls, one on each side of the
    copy's effect). The suspend under way counts what it was decided to free, so the same
    pressure does not take a second victim."""
    scenario = tmp_path / "nvml.json"
    _write(scenario, {**LIVE, "gpus": [H100]})
    tools = tmp_path / "bin"
    _stand_in(tools, scenario)
    backend = NvmlBackend(shared_indices=frozenset({0}), nvml=MockNvml.from_file(scenario))
    backend.cuda_checkpoint = detect_cuda_checkpoint(
        "", backend.driver_version(), search_path=str(tools)
    )
    reads = [0]  # the steps' reads of the process lists
    read_processes = backend.process_memory

    def counted() -> dict[str, dict[int, int]]:
        reads[0] += 1
        return read_processes()

    backend.process_memory = counted  # type: ignore[method-assign]
    gate = tmp_path / "gate"
    with _serving(tmp_path, backend) as (stub, state):
        _start(stub, "prod", common_pb2.PRODUCTION, gate, tmp_path / "prod.pid")
        _start(stub, "opp", common_pb2.OPPORTUNISTIC, gate, tmp_path / "opp.pid")
        wait_for(lambda: (tmp_path / "prod.pid").exists() and (tmp_path / "opp.pid").exists())
        prod, opp = ((tmp_path / f"{n}.pid").read_text() for n in ("prod", "opp"))
        pressure = {**LIVE, "gpus": [{**H100, "processes": {opp: 50 * GIB, prod: 30 * GIB}}]}
        with _copy_held(tools, opp):  # opp's copy takes its time
            _write(scenario, pressure)
            calls = tools / "calls"
            wait_for(lambda: calls.exists() and f"--toggle --pid {opp}" in calls.read_text())
            # The straddle: the totals still hold opp's 50 GiB, its process is listed no more.
            straddle = {
                **LIVE,
                "gpus": [{**H100, "used_bytes": 50 * GIB, "processes": {prod: 30 * GIB}}],
            }
            _write(scenario, straddle)
            seen = reads[0]
            wait_for(lambda: reads[0] >= seen + 3)  # three steps decided on it
            actions = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
            steps = [(a.step, a.subjob_id) for a in actions.recent_actions]
            assert steps == [("suspend", "opp")]
            assert state("prod").state == common_pb2.RUNNING
            _write(scenario, pressure)  # the copy ends as it would have
        wait_for(lambda: state("opp").state == common_pb2.SUSPENDED)
        assert state("prod").state == common_pb2.RUNNING
        gate.touch()


def test_cuda_checkpoint_frees_whole_gpus_only_not_mig(tmp_path: Path) -> None:
    """cuda-checkpoint does not support MIG: there a suspend frees nothing, so a subjob on a
    MIG instance keeps free mode ``none`` (release signal, then reclaim)."""
    mock = MockNvml(
        [
            MockGpu("NVIDIA H100 80GB HBM3", 80 * GIB),
            MockGpu(
                "NVIDIA A100-SXM4-40GB",
                40 * GIB,
                mig_capable=True,
                migs=[MockMig("3g.20gb", 20 * GIB, start=0, size=4)],
            ),
        ]
    )
    backend = NvmlBackend(nvml=mock)
    try:
        scenario = tmp_path / "unused.json"
        backend.cuda_checkpoint = detect_cuda_checkpoint(
            str(_stand_in(tmp_path / "bin", scenario)), backend.driver_version()
        )
        state = AgentState("h", backend, AgentMetrics(), tmp_path / "state")
        whole, migged = backend.gpus()
        airlock = state.airlock
        assert airlock._suspend_frees((whole.uuid,))
        assert not airlock._suspend_frees((migged.mig_instances[0].uuid,))
        assert not airlock._suspend_frees(())
        backend.cuda_checkpoint = NOT_DETECTED
        assert not airlock._suspend_frees((whole.uuid,))
    finally:
        backend.close()


def test_a_mig_instance_carved_after_start_is_not_checkpointable(tmp_path: Path) -> None:
    """MIG on demand carves instances after the agent started (new device UUIDs): a subjob
    on one is on MIG all the same, where cuda-checkpoint frees nothing (the driver read
    MIG-ness from the slices it had at start, and took such an instance for a whole GPU)."""
    mock = MockNvml(
        [
            MockGpu(
                "NVIDIA A100-SXM4-40GB",
                40 * GIB,
                mig_capable=True,
                migs=[MockMig("1g.5gb", 5 * GIB, start=s, size=1) for s in range(7)],
            ),
        ]
    )
    backend = NvmlBackend(nvml=mock)
    try:
        backend.cuda_checkpoint = detect_cuda_checkpoint(
            str(_stand_in(tmp_path / "bin", tmp_path / "unused.json")), backend.driver_version()
        )
        state = AgentState("h", backend, AgentMetrics(), tmp_path / "state", mig_on_demand=True)
        before = set(state.node.carrier.slice_names)
        resources = common_pb2.Resources(gpu_memory_bytes=20 * GIB, mig_profile="3g.20gb")

        async def carve() -> str:
            reply = await state.node.probe(
                agent_pb2.ProbeRequest(job_id="j", resources=resources, lease_ttl_seconds=30)
            )
            assert reply.WhichOneof("outcome") == "lease", reply
            await state.node.launches.mig.apply_for(reply.lease.lease_id)
            return str(state.node.carrier.devices[reply.lease.slice_ids[0]])

        carved = asyncio.run(carve())
        assert carved not in before and carved.startswith("MIG-")
        assert not state.airlock._suspend_frees((carved,))
    finally:
        backend.close()
