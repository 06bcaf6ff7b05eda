"""Atomized job admission in the router: contract and phase checks name the field."""

from __future__ import annotations

import pytest

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_zone.atomizer import units_done, validate_contract

GIB = 1 << 30


def _spec(**contract: object) -> zone_pb2.JobSpec:
    fields: dict[str, object] = {
        "total_units": 100,
        "seconds_per_unit": [common_pb2.Quantile(q=0.5, value=1.0)],
        "peak_memory_bytes": [common_pb2.Quantile(q=0.95, value=8 * GIB)],
    }
    fields.update(contract)
    return zone_pb2.JobSpec(
        command=["x"],
        atomization=common_pb2.AtomizationContract(**fields),  # type: ignore[arg-type]
    )


def test_phases_cover_the_units_in_order_and_the_rest_uses_the_flat_profile() -> None:
    spec = _spec(
        phases=[
            common_pb2.ResourcePhase(
                name="warmup", units=10, seconds_per_unit=[common_pb2.Quantile(q=0.5, value=5)]
            )
        ]
    )
    contract, phases = validate_contract(spec)
    assert [(p.name, p.start, p.end) for p in phases] == [("warmup", 0, 10), ("rest", 10, 100)]
    assert phases[0].profile.seconds_per_unit.value_at(0.5) == 5
    assert phases[1].profile == contract.profile
    # A phase without memory quantiles keeps the flat ones.
    assert phases[0].profile.peak_memory_bytes == contract.profile.peak_memory_bytes


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_spec(total_units=0), "spec.atomization.total_units"),
        (_spec(seconds_per_unit=[]), "spec.atomization.seconds_per_unit"),
        (_spec(epsilon=0.7), "spec.atomization.epsilon"),
        (_spec(checkpoint_dir="relative/dir"), "spec.atomization.checkpoint_dir"),
        (
            _spec(phases=[common_pb2.ResourcePhase(units=101)]),
            "spec.atomization.phases[0].units",
        ),
        (
            _spec(
                phases=[
                    common_pb2.ResourcePhase(
                        units=5, peak_memory_bytes=[common_pb2.Quantile(q=2, value=1)]
                    )
                ]
            ),
            "spec.atomization.phases[0].peak_memory_bytes[0]",
        ),
    ],
)
def test_bad_contracts_are_refused_naming_the_field(spec: zone_pb2.JobSpec, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_contract(spec)
    assert err.value.field == field


def test_an_atomized_gang_is_accepted_but_each_member_takes_one_slice() -> None:
    gang = _spec()
    gang.gang_size = 2
    contract, _ = validate_contract(gang)  # a gang's piece: one member per window
    assert contract.total_units == gang.atomization.total_units
    wide = _spec()
    wide.resources.gpus = 2
    with pytest.raises(InvalidArgument) as err:
        validate_contract(wide)
    assert err.value.field == "spec.resources"


def test_units_done_is_the_furthest_checkpoint_of_ended_subjobs() -> None:
    job = zone_pb2.Job(
        placements=[
            zone_pb2.Placement(
                state=common_pb2.SUCCEEDED, unit_start=0, unit_count=10, units_done=10
            ),
            zone_pb2.Placement(state=common_pb2.KILLED, unit_start=10, unit_count=10, units_done=4),
            # A running subjob's units do not count until its checkpoint is read at its end.
            zone_pb2.Placement(state=common_pb2.RUNNING, unit_start=14, unit_count=10),
        ]
    )
    assert units_done(job) == 14
    assert units_done(zone_pb2.Job()) == 0
