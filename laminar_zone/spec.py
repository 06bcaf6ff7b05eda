"""A submitted job's spec, checked before anything of it is kept: every refusal names the
field (gRPC INVALID_ARGUMENT), no I/O."""

from __future__ import annotations

from laminar_agent.inventory.mig import MIG_PROFILES
from laminar_api.v1 import zone_pb2
from laminar_base.demand import Demand
from laminar_base.errors import InvalidArgument
from laminar_base.grpcutil import check_number, check_str
from laminar_base.wire import check_spec
from laminar_zone.atomizer import is_atomized, validate_contract

MAX_GANG = 64
MAX_AFTER = 64
MAX_RETRIES = 100
#: Jobs one SubmitBatch may carry.
MAX_BATCH_JOBS = 10_000


def validate_spec(spec: zone_pb2.JobSpec) -> Demand:
    """Refuse bad input naming the field; returns the per-member need."""
    check_str(spec.name, "spec.name")
    need = check_spec(spec)
    if spec.run_through_partitions and not spec.restartable:
        raise InvalidArgument(
            "needs restartable: a job that runs through partitions may run twice at once, "
            "so it must be safe to restart from its checkpoint",
            field="spec.run_through_partitions",
        )
    if spec.gang_size > MAX_GANG:
        raise InvalidArgument(f"must be <= {MAX_GANG}", field="spec.gang_size")
    if len(spec.after) > MAX_AFTER:
        raise InvalidArgument(f"at most {MAX_AFTER} dependencies", field="spec.after")
    if spec.max_retries > MAX_RETRIES:
        raise InvalidArgument(f"must be <= {MAX_RETRIES}", field="spec.max_retries")
    profile = spec.resources.mig_profile
    if profile:
        models = [m for m, table in MIG_PROFILES.items() if profile in table]
        if not models:
            known = sorted({p for table in MIG_PROFILES.values() for p in table})
            raise InvalidArgument(
                f"no GPU Laminar knows has a MIG profile {profile!r} (known: {', '.join(known)})",
                field="spec.resources.mig_profile",
            )
        model = spec.resources.gpu_model
        if model and model not in models:
            raise InvalidArgument(
                f"{model} has no MIG profile {profile!r} (it is on {', '.join(models)})",
                field="spec.resources.mig_profile",
            )
    check_number(spec.time_limit_seconds, "spec.time_limit_seconds", high=10 * 365 * 86400)
    if spec.time_limit_seconds and spec.expected_seconds > spec.time_limit_seconds:
        raise InvalidArgument(
            f"{spec.expected_seconds:g} s is longer than the job's time limit "
            f"({spec.time_limit_seconds:g} s): it would be stopped before then",
            field="spec.expected_seconds",
        )
    if is_atomized(spec):
        if spec.time_limit_seconds:
            raise InvalidArgument(
                "not for an atomized job: each piece is sized to its window and stopped at "
                "its end (the contract's units bound the work)",
                field="spec.time_limit_seconds",
            )
        validate_contract(spec)
    return need
