"""laminar-agent as a real process on 127.0.0.1:0, driven with real stubs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from laminar_api.v1 import agent_pb2, agent_pb2_grpc
from laminar_cli.cluster import AgentProcess, LocalCluster

SPEC = "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb,2xA100-40GB"
GIB = 1024**3


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    with LocalCluster(tmp_path) as cluster:
        yield cluster.start_agent("host-a", SPEC)


def _stub(agent: AgentProcess) -> tuple[grpc.Channel, agent_pb2_grpc.AgentStub]:
    channel = grpc.insecure_channel(agent.address)
    return channel, agent_pb2_grpc.AgentStub(channel)


def test_inventory_health_reflection(agent: AgentProcess) -> None:
    channel, stub = _stub(agent)
    with channel:
        inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
        assert inv.backend == "fake" and inv.agent_id == "host-a"
        assert [g.model for g in inv.gpus] == ["H100-80GB", "A100-40GB", "A100-40GB"]
        assert inv.gpus[0].mig_enabled
        assert sorted(m.profile for m in inv.gpus[0].mig_instances) == [
            "1g.10gb",
            "2g.20gb",
            "3g.40gb",
        ]
        assert inv.gpus[1].memory_total_bytes == 40 * GIB
        assert len({g.uuid for g in inv.gpus}) == 3
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="laminar.v1.Agent"), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert "laminar.v1.Agent" in names
        summary = stub.GetSummary(agent_pb2.GetSummaryRequest(), timeout=10)
        shapes = {s.shape: s.total for s in summary.shapes}
        assert shapes == {"gpu:A100-40GB": 2, "mig:1g.10gb": 1, "mig:2g.20gb": 1, "mig:3g.40gb": 1}


def test_inject_load_shows_as_used_memory_and_bad_input(agent: AgentProcess) -> None:
    channel, stub = _stub(agent)
    with channel:
        stub.InjectLoad(agent_pb2.InjectLoadRequest(gpu_index=1, used_bytes=30 * GIB), timeout=10)
        inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
        assert inv.gpus[1].memory_used_bytes == 30 * GIB
        assert inv.gpus[2].memory_used_bytes == 0
        with pytest.raises(grpc.RpcError) as info:
            stub.InjectLoad(agent_pb2.InjectLoadRequest(gpu_index=9, used_bytes=1), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "gpu_index" in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:
            stub.InjectLoad(
                agent_pb2.InjectLoadRequest(gpu_index=0, slice_id="x" * 5000, used_bytes=1),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "slice_id" in (info.value.details() or "")
        # The daemon is still healthy after bad input.
        assert stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10).agent_id == "host-a"


def test_drain_and_metrics(agent: AgentProcess) -> None:
    channel, stub = _stub(agent)
    with channel:
        assert stub.Drain(agent_pb2.DrainRequest(reason="upgrade"), timeout=10).draining
        assert stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10).draining
        assert not stub.Undrain(agent_pb2.DrainRequest(), timeout=10).draining
    body = urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=10).read()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert "laminar_agent_gpu_memory_total_bytes" in families
    totals = [s.value for s in families["laminar_agent_gpu_memory_total_bytes"].samples]
    assert 40 * GIB in totals


def test_sigterm_exits_cleanly(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    agent = cluster.start_agent("host-b", "1xT4-16GB")
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(20) == 0


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--gpu-backend", "fake", "--fake-gpus", "3xNoSuchGPU"], "fake_gpus"),
        (["--gpu-backend", "fake", "--fake-gpus", "A100-40GB:mig=7g.80gb"], "fake_gpus"),
        (["--listen", "nowhere"], "server.listen"),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, flags: list[str], key: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laminar_agent", "--state-dir", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert key in result.stderr
    assert "Traceback" not in result.stderr


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here")
    unit = Path(__file__).resolve().parents[2] / "systemd" / "laminar-agent.service"
    exe = Path(sys.executable).parent / "laminar-agent"
    text = unit.read_text().replace("/usr/local/bin/laminar-agent", str(exe))
    copy = tmp_path / "laminar-agent.service"
    copy.write_text(text)
    result = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    errors = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "laminar-agent.service" in line and "Documentation" not in line
    ]
    if result.returncode != 0 and "System has not been booted with systemd" in result.stderr:
        pytest.skip("systemd-analyze cannot run without systemd as init here")
    assert not errors, errors


def test_config_file_and_environment_errors_name_the_key(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[arbitration]\nbatch_seconds = "5s"\n')
    result = subprocess.run(
        [sys.executable, "-m", "laminar_agent", "--config", str(config), "--gpu-backend", "fake"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "arbitration.batch_seconds" in result.stderr
    env = {**os.environ, "LAMINAR_ARBITRATION_LEASE_TTL_SECONDS": "-1"}
    result = subprocess.run(
        [sys.executable, "-m", "laminar_agent", "--gpu-backend", "fake"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2 and "arbitration.lease_ttl_seconds" in result.stderr
    assert "Traceback" not in result.stderr
