"""One spec validator: the router and the agent refuse the same bad field the same way."""

from __future__ import annotations

import pytest

from laminar_agent.node import validate_spec as validate_subjob
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.demand import Demand
from laminar_base.errors import InvalidArgument
from laminar_zone.spec import validate_spec as validate_job

BAD: dict[str, dict[str, object]] = {
    "spec.command": {"command": []},
    "spec.env": {"env": {f"K{i}": "v" for i in range(300)}},
    "spec.grace_seconds": {"grace_seconds": 1e9},
    "spec.priority": {"priority": 99},
    "spec.lifecycle": {"lifecycle": 42},
    "spec.expected_seconds": {"expected_seconds": -1.0},
    "spec.resources.gpu_milli": {"resources": common_pb2.Resources(gpu_milli=1500)},
    "spec.resources.mig_profile": {
        "resources": common_pb2.Resources(gpus=1, mig_profile="1g.10gb")
    },
    "spec.resources.cpu_milli": {"resources": common_pb2.Resources(cpu_milli=2_000_000)},
    "spec.resources.host_memory_bytes": {
        "resources": common_pb2.Resources(host_memory_bytes=1 << 50)
    },
}


def refusal(validate: object, spec: object) -> tuple[str, str]:
    with pytest.raises(InvalidArgument) as info:
        validate(spec)  # type: ignore[operator]
    return info.value.field or "", info.value.message


@pytest.mark.parametrize("field", sorted(BAD))
def test_router_and_agent_name_the_same_field_with_the_same_words(field: str) -> None:
    fields = {"command": ["/bin/true"], **BAD[field]}
    job = refusal(validate_job, zone_pb2.JobSpec(**fields))  # type: ignore[arg-type]
    subjob = refusal(
        validate_subjob,
        common_pb2.SubjobSpec(subjob_id="j-1-0", job_id="j-1", **fields),  # type: ignore[arg-type]
    )
    assert job == subjob
    assert job[0] == field


def test_a_good_spec_gives_its_demand() -> None:
    spec = zone_pb2.JobSpec(
        command=["/bin/true"], resources=common_pb2.Resources(gpu_milli=250, gpu_memory_bytes=1)
    )
    assert validate_job(spec) == Demand(gpu_milli=250, gpu_memory_bytes=1)
    spec.resources.cpu_milli = 4000
    spec.resources.host_memory_bytes = 8 << 30
    assert validate_job(spec) == Demand(
        gpu_milli=250, gpu_memory_bytes=1, cpu_milli=4000, host_memory_bytes=8 << 30
    )
