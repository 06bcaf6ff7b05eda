"""The host CPU and memory an agent offers come from its config when set (ops keep some for
the system; benchmarks shape an agent like a trace node), else from the machine."""

from __future__ import annotations

from pathlib import Path

import grpc
import psutil
import pytest

from laminar_agent.config import AgentConfig, InventorySettings
from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_base.errors import ConfigError
from laminar_cli.cluster import LocalCluster

GIB = 1024**3


def summary(tmp_path: Path, env: dict[str, str]) -> common_pb2.AgentSummary:
    with LocalCluster(tmp_path) as cluster:
        agent = cluster.start_agent("h", "1xH100-80GB", env=env)
        with grpc.insecure_channel(agent.address) as channel:
            return agent_pb2_grpc.AgentStub(channel).GetSummary(
                agent_pb2.GetSummaryRequest(), timeout=10
            )


def test_configured_totals_are_what_the_agent_offers(tmp_path: Path) -> None:
    env = {
        "LAMINAR_INVENTORY_HOST_CPU_MILLI": "3500",
        "LAMINAR_INVENTORY_HOST_MEMORY_BYTES": str(6 * GIB),
    }
    got = summary(tmp_path, env)
    assert got.cpu_total_milli == 3500
    assert got.memory_total_bytes == 6 * GIB


def test_unset_totals_are_the_machines(tmp_path: Path) -> None:
    got = summary(tmp_path, {"LAMINAR_INVENTORY_HOST_CPU_MILLI": "1500"})
    assert got.cpu_total_milli == 1500
    assert got.memory_total_bytes == psutil.virtual_memory().total


@pytest.mark.parametrize("key", ["host_cpu_milli", "host_memory_bytes"])
def test_a_negative_total_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        AgentConfig(inventory=InventorySettings(**{key: -1})).validate()  # type: ignore[arg-type]
    assert err.value.field == f"inventory.{key}"
