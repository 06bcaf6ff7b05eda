"""Plain values of the decision code read from protobuf messages, at the edge."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.demand import Demand, validate_demand
from laminar_base.errors import InvalidArgument
from laminar_base.fragmentation import PodShape
from laminar_base.grpcutil import check_exec_size, check_number, check_str

#: Most whole GPUs one member may ask for on one host.
MAX_GPUS_PER_MEMBER = 64
MAX_COMMAND_ARGS = 4096
MAX_ENV_VARS = 256


def demand_of(resources: common_pb2.Resources) -> Demand:
    """The demand a stored (already validated) ``Resources`` message describes."""
    return Demand(
        gpus=resources.gpus,
        mig_profile=resources.mig_profile,
        gpu_milli=resources.gpu_milli,
        gpu_memory_bytes=resources.gpu_memory_bytes,
        gpu_model=resources.gpu_model,
        cpu_milli=resources.cpu_milli,
        host_memory_bytes=resources.host_memory_bytes,
    )


def parse_demand(resources: common_pb2.Resources) -> Demand:
    """The demand of a request's ``resources``; bad input raises InvalidArgument naming the
    field (``resources.<name>``)."""
    check_str(resources.mig_profile, "resources.mig_profile", max_chars=32)
    check_str(resources.gpu_model, "resources.gpu_model", max_chars=64)
    if resources.gpus > MAX_GPUS_PER_MEMBER:
        raise InvalidArgument(
            f"{resources.gpus} GPUs on one host is more than {MAX_GPUS_PER_MEMBER}",
            field="resources.gpus",
        )
    demand = demand_of(resources)
    validate_demand(demand)
    return demand


#: The classes a spec may name, read once (``EnumTypeWrapper.values()`` builds a list on
#: every call, and every Submit, ProbeJob and commit checks both).
_PRIORITY_CLASSES = frozenset(common_pb2.PriorityClass.values())
_LIFECYCLE_CLASSES = frozenset(common_pb2.LifecycleClass.values())


def check_spec(spec: zone_pb2.JobSpec | common_pb2.SubjobSpec) -> Demand:
    """What a job (router) and a subjob (agent) share, checked one way with one set of
    messages, each naming its field (``spec.<name>``); returns the per-member demand."""
    check_str(spec.tenant, "spec.tenant")
    check_str(spec.workdir, "spec.workdir", max_chars=4096)
    if not spec.command:
        raise InvalidArgument("must not be empty", field="spec.command")
    if len(spec.command) > MAX_COMMAND_ARGS:
        raise InvalidArgument(
            f"has {len(spec.command)} arguments, at most {MAX_COMMAND_ARGS}", field="spec.command"
        )
    for arg in spec.command:
        check_str(arg, "spec.command", max_chars=65536)
    if not spec.command[0]:
        raise InvalidArgument(
            "must start with a program, not an empty string", field="spec.command"
        )
    if len(spec.env) > MAX_ENV_VARS:
        raise InvalidArgument(
            f"has {len(spec.env)} variables, at most {MAX_ENV_VARS}", field="spec.env"
        )
    for key, value in spec.env.items():
        check_str(key, "spec.env", max_chars=256, required=True)
        check_str(value, f"spec.env[{key}]", max_chars=65536)
    check_exec_size(spec.command, spec.env, "spec")
    check_number(spec.grace_seconds, "spec.grace_seconds", high=3600)
    # Queue order, Airlock and preemption rank by these classes: an unknown one is bad input.
    if spec.priority not in _PRIORITY_CLASSES:
        raise InvalidArgument(f"unknown priority class {spec.priority}", field="spec.priority")
    if spec.lifecycle not in _LIFECYCLE_CLASSES:
        raise InvalidArgument(f"unknown lifecycle class {spec.lifecycle}", field="spec.lifecycle")
    check_number(spec.value, "spec.value", low=-1e12, high=1e12)
    check_number(spec.expected_seconds, "spec.expected_seconds", high=10 * 365 * 86400)
    try:
        return parse_demand(spec.resources)
    except InvalidArgument as exc:
        raise InvalidArgument(
            exc.message.split(": ", 1)[-1], field=f"spec.{exc.field or 'resources'}"
        ) from None


# -- the target workload a router shares with its agents ----------------------------------

#: Most shapes a heartbeat reply carries (ObservedWorkload keeps at most 256).
MAX_WORKLOAD_SHAPES = 256


def workload_message(counts: Mapping[PodShape, int]) -> list[zone_pb2.WorkloadShape]:
    """A router's observed workload as heartbeat replies carry it."""
    return [
        zone_pb2.WorkloadShape(
            cpu_milli=shape.cpu_milli,
            num_gpu=shape.num_gpu,
            gpu_milli=shape.gpu_milli,
            gpu_models=list(shape.gpu_models),
            count=count,
        )
        for shape, count in list(counts.items())[:MAX_WORKLOAD_SHAPES]
    ]


def workload_counts(shapes: Sequence[zone_pb2.WorkloadShape]) -> Counter[PodShape]:
    """The counts a heartbeat reply's workload stands for (bounded, malformed shapes
    skipped: a router's reply is trusted, not assumed well-formed)."""
    counts: Counter[PodShape] = Counter()
    for s in list(shapes)[:MAX_WORKLOAD_SHAPES]:
        if s.count <= 0 or s.gpu_milli > 1000 or s.num_gpu > 1024:
            continue
        models = tuple(str(m)[:64] for m in list(s.gpu_models)[:16])
        counts[PodShape(s.cpu_milli, 0, s.num_gpu, s.gpu_milli, models)] += s.count
    return counts
