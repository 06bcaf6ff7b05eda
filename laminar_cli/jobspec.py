"""Turn `laminar submit` flags and TOML job files into a JobSpec.

Pure code: no gRPC calls, no environment reads. Every value goes through one
converter per key, so a bad value gets the same error whether it came from a
file (named ``resources.gpu_mem``) or a flag (named ``--gpu-mem``). The router
validates again; checking here gives the user exit code 2 before any network
round trip and points at the exact spot in the file.

Not covered: semantic checks that need the cluster (does a 3g.40gb slice
exist anywhere, does an ``after`` job id exist); the router answers those.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_base.units import format_size, parse_duration, parse_size

PRIORITIES: dict[str, common_pb2.PriorityClass] = {
    "critical": common_pb2.CRITICAL,
    "production": common_pb2.PRODUCTION,
    "batch": common_pb2.BATCH,
    "opportunistic": common_pb2.OPPORTUNISTIC,
}
LIFECYCLES: dict[str, common_pb2.LifecycleClass] = {
    "resident": common_pb2.RESIDENT,
    "long": common_pb2.LONG,
    "transient": common_pb2.TRANSIENT,
}

#: Largest gang and largest whole-GPU count per member we accept from a user.
MAX_GANG = 1024
MAX_GPUS_PER_MEMBER = 64
MAX_RETRIES = 100

TOP_KEYS = frozenset(
    {
        "name",
        "command",
        "priority",
        "lifecycle",
        "tenant",
        "gang",
        "after",
        "retries",
        "env",
        "workdir",
        "expected",
        "time",
        "restartable",
        "run_through_partitions",
        "grace",
        "value",
        "release_signal",
        "resources",
        "atomization",
        "array",
    }
)
RESOURCE_KEYS = frozenset({"gpus", "mig", "gpu_milli", "gpu_mem", "gpu_model", "cpus", "mem"})
SHAPE_KEYS = ("gpus", "mig", "gpu_milli")
ATOMIZATION_KEYS = frozenset(
    {
        "total_units",
        "seconds_per_unit",
        "peak_memory",
        "checkpoint_overhead",
        "min_units",
        "max_units",
        "epsilon",
        "phases",
        "checkpoint_dir",
    }
)
PHASE_KEYS = frozenset({"name", "units", "seconds_per_unit", "peak_memory"})
_QUANTILE_KEY = re.compile(r"^p([0-9]+(?:\.[0-9]+)?)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Value:
    """One input value and the name to use when it is wrong (a file key or a flag)."""

    raw: Any
    label: str


@dataclass
class SpecInput:
    """Values gathered from a job file and flags, keyed by their file key (``resources.gpus``)."""

    values: dict[str, Value] = field(default_factory=dict)
    env: dict[str, Value] = field(default_factory=dict)
    atomization: Value | None = None

    def set(self, key: str, raw: Any, label: str) -> None:
        self.values[key] = Value(raw, label)


# ---------------------------------------------------------------- converters


def _str(v: Value) -> str:
    if not isinstance(v.raw, str):
        raise InvalidArgument(f"expected a string, got {v.raw!r}", field=v.label)
    return v.raw


def _int(v: Value, low: int, high: int) -> int:
    raw = v.raw
    if isinstance(raw, str):
        try:
            raw = int(raw.strip())
        except ValueError:
            raise InvalidArgument(f"expected an integer, got {v.raw!r}", field=v.label) from None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidArgument(f"expected an integer, got {v.raw!r}", field=v.label)
    if not low <= raw <= high:
        raise InvalidArgument(f"must be between {low} and {high}, got {raw}", field=v.label)
    return raw


def _float(v: Value, low: float, high: float) -> float:
    raw = v.raw
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            raise InvalidArgument(f"expected a number, got {v.raw!r}", field=v.label) from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidArgument(f"expected a number, got {v.raw!r}", field=v.label)
    if not low <= float(raw) <= high:
        raise InvalidArgument(f"must be between {low:g} and {high:g}, got {raw}", field=v.label)
    return float(raw)


def _bool(v: Value) -> bool:
    if not isinstance(v.raw, bool):
        raise InvalidArgument(f"expected true or false, got {v.raw!r}", field=v.label)
    return v.raw


def _size(v: Value) -> int:
    if isinstance(v.raw, bool) or not isinstance(v.raw, (int, str)):
        raise InvalidArgument(
            f"expected a size like 10GiB or a byte count, got {v.raw!r}", field=v.label
        )
    return parse_size(v.raw, field=v.label)


def _duration(v: Value) -> float:
    if isinstance(v.raw, bool) or not isinstance(v.raw, (int, float, str)):
        raise InvalidArgument(
            f"expected a duration like 30s or a number of seconds, got {v.raw!r}", field=v.label
        )
    return parse_duration(v.raw, field=v.label)


def _choice(v: Value, choices: Mapping[str, int]) -> int:
    text = _str(v).strip().lower()
    if text not in choices:
        raise InvalidArgument(
            f"unknown value {v.raw!r}; expected one of {', '.join(choices)}", field=v.label
        )
    return choices[text]


def _command(v: Value) -> list[str]:
    if isinstance(v.raw, str):
        try:
            words = shlex.split(v.raw)
        except ValueError as exc:
            raise InvalidArgument(f"cannot split command: {exc}", field=v.label) from None
    elif isinstance(v.raw, list) and all(isinstance(w, str) for w in v.raw):
        words = list(v.raw)
    else:
        raise InvalidArgument(
            f"expected a list of strings or a string, got {v.raw!r}", field=v.label
        )
    if not words or not words[0]:
        raise InvalidArgument("the command is empty", field=v.label)
    return words


def _id_list(v: Value) -> list[str]:
    items: list[str] = []
    raws = v.raw if isinstance(v.raw, list) else [v.raw]
    for raw in raws:
        if not isinstance(raw, str):
            raise InvalidArgument(f"expected job ids as strings, got {raw!r}", field=v.label)
        items.extend(part.strip() for part in raw.split(",") if part.strip())
    return items


def _quantiles(v: Value, convert: Callable[[Value], float]) -> list[common_pb2.Quantile]:
    if not isinstance(v.raw, Mapping) or not v.raw:
        raise InvalidArgument(
            "expected a table of quantiles such as { p50 = ..., p95 = ... }", field=v.label
        )
    out = []
    for key, raw in v.raw.items():
        match = _QUANTILE_KEY.match(str(key))
        if match is None or not 0 < float(match.group(1)) < 100:
            raise InvalidArgument(
                "quantile keys are pNN with 0 < NN < 100 (p50, p95, p99.9)",
                field=f"{v.label}.{key}",
            )
        value = convert(Value(raw, f"{v.label}.{key}"))
        out.append(common_pb2.Quantile(q=float(match.group(1)) / 100.0, value=value))
    out.sort(key=lambda quantile: quantile.q)
    return out


def _check_keys(table: Mapping[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise InvalidArgument(
                f"unknown key; expected one of {', '.join(sorted(allowed))}", field=prefix + key
            )


def _atomization(v: Value) -> common_pb2.AtomizationContract:
    table = v.raw
    if not isinstance(table, Mapping):
        raise InvalidArgument("expected a table", field=v.label)
    _check_keys(table, ATOMIZATION_KEYS, "atomization.")

    def item(key: str) -> Value | None:
        return Value(table[key], f"atomization.{key}") if key in table else None

    contract = common_pb2.AtomizationContract()
    total = item("total_units")
    if total is None:
        raise InvalidArgument("required in an [atomization] table", field="atomization.total_units")
    contract.total_units = _int(total, 1, 2**62)
    if (spu := item("seconds_per_unit")) is not None:
        contract.seconds_per_unit.extend(_quantiles(spu, _duration))
    if (mem := item("peak_memory")) is not None:
        contract.peak_memory_bytes.extend(_quantiles(mem, lambda q: float(_size(q))))
    if (ovh := item("checkpoint_overhead")) is not None:
        contract.checkpoint_overhead_seconds = _duration(ovh)
    if (lo := item("min_units")) is not None:
        contract.min_units = _int(lo, 1, contract.total_units)
    if (hi := item("max_units")) is not None:
        contract.max_units = _int(hi, max(1, contract.min_units), contract.total_units)
    if (eps := item("epsilon")) is not None:
        contract.epsilon = _float(eps, 1e-9, 0.5)
    if (ckpt := item("checkpoint_dir")) is not None:
        if not isinstance(ckpt.raw, str) or not ckpt.raw.startswith("/"):
            raise InvalidArgument("expected an absolute path", field=ckpt.label)
        contract.checkpoint_dir = ckpt.raw
    if (phases := item("phases")) is not None:
        if not isinstance(phases.raw, list):
            raise InvalidArgument(
                "expected an array of tables ([[atomization.phases]])", field=phases.label
            )
        for index, phase in enumerate(phases.raw):
            label = f"atomization.phases[{index}]"
            if not isinstance(phase, Mapping):
                raise InvalidArgument("expected a table", field=label)
            _check_keys(phase, PHASE_KEYS, label + ".")
            out = contract.phases.add()
            if "name" in phase:
                out.name = _str(Value(phase["name"], label + ".name"))
            if "units" not in phase:
                raise InvalidArgument("required in each phase", field=label + ".units")
            out.units = _int(Value(phase["units"], label + ".units"), 1, contract.total_units)
            if "seconds_per_unit" in phase:
                out.seconds_per_unit.extend(
                    _quantiles(
                        Value(phase["seconds_per_unit"], label + ".seconds_per_unit"), _duration
                    )
                )
            if "peak_memory" in phase:
                out.peak_memory_bytes.extend(
                    _quantiles(
                        Value(phase["peak_memory"], label + ".peak_memory"),
                        lambda q: float(_size(q)),
                    )
                )
    return contract


# ---------------------------------------------------------------- inputs


def read_job_file(path: str | Path) -> SpecInput:
    """Load a TOML job file; unknown keys and wrong shapes raise InvalidArgument naming the key."""
    import tomllib  # here: a submit without -f does not pay for the TOML parser

    file_path = Path(path)
    try:
        data = tomllib.loads(file_path.read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"job file {file_path} does not exist", field="-f") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read job file {file_path}: {exc}", field="-f") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{file_path} is not valid TOML: {exc}", field="-f") from None
    return spec_input_from_mapping(data)


def spec_input_from_mapping(data: Mapping[str, Any]) -> SpecInput:
    """The SpecInput of an already-parsed job file (checked for unknown keys, not yet converted)."""
    _check_keys(data, TOP_KEYS, "")
    out = SpecInput()
    for key, raw in data.items():
        if key == "resources":
            if not isinstance(raw, Mapping):
                raise InvalidArgument("expected a [resources] table", field="resources")
            _check_keys(raw, RESOURCE_KEYS, "resources.")
            for rkey, rraw in raw.items():
                out.set(f"resources.{rkey}", rraw, f"resources.{rkey}")
        elif key == "env":
            if not isinstance(raw, Mapping):
                raise InvalidArgument("expected a table of NAME = value", field="env")
            for name, value in raw.items():
                out.env[str(name)] = Value(value, f"env.{name}")
        elif key == "atomization":
            out.atomization = Value(raw, "atomization")
        else:
            out.set(key, raw, key)
    return out


def apply_flags(base: SpecInput, flags: Mapping[str, Any], env_flags: Sequence[str]) -> SpecInput:
    """Lay flag values (``{"resources.gpus": ("--gpus", "2")}``-style) over a file's values.

    A shape flag (--gpus, --mig, --gpu-milli) replaces the file's whole shape,
    so ``-f job.toml --gpus 2`` runs a MIG job file on two whole GPUs. --env
    entries are merged name by name; every other flag replaces the file value.
    """
    out = SpecInput(dict(base.values), dict(base.env), base.atomization)
    given = {key: value for key, value in flags.items() if value[1] is not None}
    if any(f"resources.{shape}" in given for shape in SHAPE_KEYS):
        for shape in SHAPE_KEYS:
            out.values.pop(f"resources.{shape}", None)
    for key, (label, raw) in given.items():
        out.set(key, raw, label)
    for item in env_flags:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgument(f"expected NAME=VALUE, got {item!r}", field="--env")
        out.env[name] = Value(value, f"--env {name}")
    return out


def build_spec(data: SpecInput, *, require_command: bool = True) -> zone_pb2.JobSpec:
    """Convert gathered values into a JobSpec; the first bad value raises InvalidArgument.

    ``require_command=False`` is for dry-run probes, which only need the shape.
    """
    values = data.values
    spec = zone_pb2.JobSpec()
    if "command" in values:
        spec.command.extend(_command(values["command"]))
    elif require_command:
        raise InvalidArgument(
            "missing: give it after `--` or as command = [...] in the job file", field="command"
        )
    if "name" in values:
        spec.name = _str(values["name"]).strip()
    if not spec.name and spec.command:
        spec.name = Path(spec.command[0]).name
    if "priority" in values:
        spec.priority = _choice(values["priority"], PRIORITIES)  # type: ignore[assignment]
    if "lifecycle" in values:
        spec.lifecycle = _choice(values["lifecycle"], LIFECYCLES)  # type: ignore[assignment]
    if "tenant" in values:
        spec.tenant = _str(values["tenant"]).strip()
    if "gang" in values:
        spec.gang_size = _int(values["gang"], 1, MAX_GANG)
    if "after" in values:
        spec.after.extend(_id_list(values["after"]))
    if "retries" in values:
        spec.max_retries = _int(values["retries"], 0, MAX_RETRIES)
    if "workdir" in values:
        spec.workdir = _str(values["workdir"])
    if "expected" in values:
        spec.expected_seconds = _duration(values["expected"])
    if "time" in values:
        spec.time_limit_seconds = _duration(values["time"])
    if "grace" in values:
        spec.grace_seconds = _duration(values["grace"])
    if "restartable" in values:
        spec.restartable = _bool(values["restartable"])
    if "run_through_partitions" in values:
        spec.run_through_partitions = _bool(values["run_through_partitions"])
    if "array" in values:
        from laminar_zone.arrays import parse_array  # only a submit with --array

        spec.array = _str(values["array"]).strip()
        parse_array(spec.array, values["array"].label)  # refused here, naming the flag
    if "release_signal" in values:
        spec.supports_release_signal = _bool(values["release_signal"])
    if "value" in values:
        spec.value = _float(values["value"], 0.0, 1e12)
    for name, value in data.env.items():
        if not _ENV_NAME.match(name):
            raise InvalidArgument("not a valid environment variable name", field=value.label)
        if isinstance(value.raw, bool) or not isinstance(value.raw, (str, int, float)):
            raise InvalidArgument(f"expected a string, got {value.raw!r}", field=value.label)
        spec.env[name] = str(value.raw)
    _build_resources(values, spec.resources)
    if data.atomization is not None:
        spec.atomization.CopyFrom(_atomization(data.atomization))
    return spec


def _build_resources(values: Mapping[str, Value], res: common_pb2.Resources) -> None:
    shapes = [values[f"resources.{s}"] for s in SHAPE_KEYS if f"resources.{s}" in values]
    if len(shapes) > 1:
        raise InvalidArgument(
            f"give only one of gpus, mig and gpu_milli (got {' and '.join(v.label for v in shapes)})",
            field=shapes[1].label,
        )
    if (gpus := values.get("resources.gpus")) is not None:
        res.gpus = _int(gpus, 0, MAX_GPUS_PER_MEMBER)
    if (mig := values.get("resources.mig")) is not None:
        res.mig_profile = _str(mig).strip()
        if not re.match(r"^[0-9]+g\.[0-9]+gb(\+me)?$", res.mig_profile):
            raise InvalidArgument(
                f"expected a MIG profile like 3g.40gb, got {mig.raw!r}", field=mig.label
            )
    if (milli := values.get("resources.gpu_milli")) is not None:
        res.gpu_milli = _int(milli, 1, 1000)
    if (mem := values.get("resources.gpu_mem")) is not None:
        res.gpu_memory_bytes = _size(mem)
    if (model := values.get("resources.gpu_model")) is not None:
        res.gpu_model = _str(model).strip()
    if (cpus := values.get("resources.cpus")) is not None:
        from laminar_base.demand import MAX_CPU_MILLI  # not at import: the module's dataclass

        # Cores in milli-cores; 0 would mean "the default share", so it is refused here.
        res.cpu_milli = round(_float(cpus, 0.001, MAX_CPU_MILLI / 1000) * 1000)
    if (mem := values.get("resources.mem")) is not None:
        from laminar_base.demand import MAX_HOST_MEMORY_BYTES

        res.host_memory_bytes = _size(mem)
        if not 1 <= res.host_memory_bytes <= MAX_HOST_MEMORY_BYTES:
            raise InvalidArgument(
                f"must be between 1 byte and {format_size(MAX_HOST_MEMORY_BYTES)}, got {mem.raw!r}",
                field=mem.label,
            )


def describe_resources(res: common_pb2.Resources) -> str:
    """Short human form: ``2 x GPU``, ``MIG 3g.40gb``, ``0.5 GPU share, 20.0GiB``, ``CPU only``."""
    if res.gpus:
        text = f"{res.gpus} x GPU" if res.gpus > 1 else "1 GPU"
    elif res.mig_profile:
        text = f"MIG {res.mig_profile}"
    elif res.gpu_milli:
        text = f"{res.gpu_milli / 1000:g} GPU share"
    else:
        text = "CPU only"
    if res.gpu_model:
        text += f" {res.gpu_model}"
    if res.gpu_memory_bytes:
        text += f", {format_size(res.gpu_memory_bytes)}"
    if res.cpu_milli:
        text += f", {res.cpu_milli / 1000:g} CPU"
    if res.host_memory_bytes:
        text += f", {format_size(res.host_memory_bytes)} host memory"
    return text
