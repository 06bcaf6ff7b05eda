"""Agents of one pool with config of their own (``--per-agent``): unlike hosts in one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_base.errors import InvalidArgument
from laminar_bench.agent_pool import AgentPool, PoolSpec, agent_config, read_per_agent


def spec(tmp_path: Path, per_agent: tuple[dict[str, object], ...]) -> PoolSpec:
    return PoolSpec(
        count=2,
        zone="",
        fake_gpus="1xT4-16GB",
        state_dir=tmp_path,
        prefix="p-",
        with_metrics=False,
        per_agent=per_agent,
    )


def test_each_agent_gets_its_own_keys_over_the_pools(tmp_path: Path) -> None:
    own = ({"inventory.fake_gpus": "2xA100-40GB", "inventory.host_cpu_milli": 8000}, {})
    pool = spec(tmp_path, own)
    first = agent_config(pool, "p-0", own[0])
    second = agent_config(pool, "p-1", own[1])
    assert first.inventory.fake_gpus == "2xA100-40GB"
    assert first.inventory.host_cpu_milli == 8000
    assert second.inventory.fake_gpus == "1xT4-16GB"
    assert second.inventory.host_cpu_milli == 0


def test_a_list_that_does_not_match_the_pool_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        AgentPool(spec(tmp_path, ({},)))
    assert err.value.field == "--per-agent"


def test_the_per_agent_file_must_be_a_list_of_objects(tmp_path: Path) -> None:
    path = tmp_path / "agents.json"
    path.write_text('{"inventory.fake_gpus": "1xT4-16GB"}')
    with pytest.raises(InvalidArgument) as err:
        read_per_agent(path)
    assert err.value.field == "--per-agent"
    path.write_text('[{"inventory.host_cpu_milli": 4000}]')
    assert read_per_agent(path) == ({"inventory.host_cpu_milli": 4000},)
    with pytest.raises(InvalidArgument):
        read_per_agent(tmp_path / "missing.json")
