"""Issue 20's smaller defects, each on real daemons: a relative --state-dir, slice ids in
`laminar pressure`, NOT_FOUND through the router, and a restarted router that knows an
agent it has journaled even while that agent is frozen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import wait_for

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster
from laminar_cli.main import main as cli_main


def failure(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """Run a call that must fail; its status code and details."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    raise AssertionError("the call succeeded")


TERMINAL = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}


def test_a_relative_state_dir_runs_subjobs_to_a_recorded_end(tmp_path: Path) -> None:
    info = tmp_path / "rel" / "agent.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "laminar_agent",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            "rel",  # relative to the agent's working directory
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "H100-80GB",
        ],
        cwd=tmp_path,
        env={**os.environ, "LAMINAR_EXECUTOR_RUN_AS_USER": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(info.exists)
        address = json.loads(info.read_text())["address"]
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            spec = common_pb2.SubjobSpec(
                subjob_id="rel-1", job_id="j", command=[sys.executable, "-c", "print('ok')"]
            )
            stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id="j",
                    resources=common_pb2.Resources(gpus=1),
                    commit_if_fits=True,
                    spec=spec,
                ),
                timeout=10,
            )

            def ended() -> common_pb2.Subjob | None:
                sj = stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id="rel-1"), timeout=5)
                return sj if sj.state in TERMINAL else None

            wait_for(lambda: ended() is not None)
            subjob = ended()
            assert subjob is not None
            assert subjob.state == common_pb2.SUCCEEDED, subjob.reason
    finally:
        proc.terminate()
        proc.wait(15)


def test_pressure_takes_slice_ids_and_not_found_stays_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with LocalCluster(tmp_path) as cluster:
        zone = cluster.start_zone("a", heartbeat_seconds=0.2)
        cluster.start_agent("mig", "H100-80GB:mig=3g.40gb+3g.40gb", zone=zone.address)
        cluster.wait_registered()
        argv = ["--zone", zone.address, "pressure", "mig", "--gpu", "0", "--used", "10GiB"]
        assert cli_main([*argv, "--slice", "gpu0/3g.40gb@0"]) == 0
        assert "injected 10" in capsys.readouterr().out
        with grpc.insecure_channel(zone.address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            request = zone_pb2.InjectPressureRequest(
                agent="mig", load=agent_pb2.InjectLoadRequest(gpu_index=7, used_bytes=1)
            )
            code, details = failure(lambda: stub.InjectPressure(request, timeout=10))
        assert code == grpc.StatusCode.NOT_FOUND and "gpu_index" in details


def test_a_restarted_router_drains_a_frozen_agent_it_has_journaled(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        zone = cluster.start_zone("a", listen="127.0.0.1:0", heartbeat_seconds=0.2)
        agent = cluster.start_agent("idle", "H100-80GB", zone=zone.address)
        cluster.wait_registered()
        address = zone.address
        zone.process.send_signal(signal.SIGKILL)
        zone.process.wait(10)
        agent.process.send_signal(signal.SIGSTOP)
        try:
            again = cluster.start_zone("a", listen=address, heartbeat_seconds=0.2)
            with grpc.insecure_channel(again.address) as channel:
                stub = zone_pb2_grpc.ZoneStub(channel)
                agents = stub.ListAgents(zone_pb2.ListAgentsRequest(), timeout=10).agents
                assert [a.agent_id for a in agents] == ["idle"]
                code, details = failure(
                    lambda: stub.DrainAgent(
                        zone_pb2.DrainAgentRequest(agent="idle", reason="x"), timeout=20
                    )
                )
                # it is known (no "no agent in zone"): the frozen agent just does not answer
                assert code == grpc.StatusCode.UNAVAILABLE and "no agent" not in details
        finally:
            agent.process.send_signal(signal.SIGCONT)
