"""A GPU backend made of declared GPUs, for tests, CI and the simulator.

Memory use is synthesized: subjobs attached to a device count their usage
(read from a file the subjob rewrites, so real memory curves can be replayed)
and operators can inject extra load that expires on the injected clock.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from laminar_agent.inventory.base import CheckpointSupport, GpuFailure, GpuInfo, MigInstanceInfo
from laminar_agent.inventory.mig import FIELD, GIB, lookup_profile, place_profiles
from laminar_agent.jobfiles import read_job_file
from laminar_base.errors import FailedPrecondition, InvalidArgument, NotFound

#: Known fake models -> memory in GiB (the number in the name).
FAKE_MODELS: dict[str, int] = {
    "H100-80GB": 80,
    "H100-94GB": 94,
    "H200-141GB": 141,
    "A100-80GB": 80,
    "A100-40GB": 40,
    "L4-24GB": 24,
    "T4-16GB": 16,
}
MAX_GPUS = 64
_ITEM = re.compile(r"^(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9-]+)(?::(.*))?$")


@dataclass(frozen=True)
class FakeGpuSpec:
    """One parsed spec item, already expanded to a count and a validated MIG layout."""

    model: str
    count: int
    memory_total_bytes: int
    mig_profiles: tuple[str, ...]
    shared: bool


def parse_fake_spec(spec: str) -> list[FakeGpuSpec]:
    """Parse ``[N x]MODEL[:opts]`` items separated by commas.

    Options are ``mig=P+P+...`` and ``shared`` (colon-separated). Every error
    is an InvalidArgument naming ``fake_gpus``.
    """
    items = [part.strip() for part in spec.split(",")]
    if not spec.strip() or any(not item for item in items):
        raise InvalidArgument(f"empty item in {spec!r}", field=FIELD)
    result: list[FakeGpuSpec] = []
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            raise InvalidArgument(f"cannot parse {item!r}: expected [N x]MODEL[:opts]", field=FIELD)
        count_text, model_text, opts_text = match.groups()
        count = int(count_text) if count_text is not None else 1
        if not 1 <= count <= MAX_GPUS:
            raise InvalidArgument(f"count in {item!r} must be 1..{MAX_GPUS}", field=FIELD)
        model = model_text.upper()
        if model not in FAKE_MODELS:
            raise InvalidArgument(
                f"unknown model {model_text!r} (known: {', '.join(FAKE_MODELS)})", field=FIELD
            )
        profiles: tuple[str, ...] = ()
        shared = False
        for opt in opts_text.split(":") if opts_text is not None else []:
            opt = opt.strip()
            if opt == "shared":
                shared = True
            elif opt.startswith("mig="):
                profiles = tuple(p.strip().lower() for p in opt[4:].split("+"))
                if not all(profiles):
                    raise InvalidArgument(f"empty MIG profile in {item!r}", field=FIELD)
                place_profiles(model, profiles)
            else:
                raise InvalidArgument(
                    f"unknown option {opt!r} in {item!r} (expected mig=... or shared)", field=FIELD
                )
        if shared and profiles:
            raise InvalidArgument(f"{item!r}: a MIG GPU cannot also be shared", field=FIELD)
        result.append(FakeGpuSpec(model, count, FAKE_MODELS[model] * GIB, profiles, shared))
    if sum(s.count for s in result) > MAX_GPUS:
        raise InvalidArgument(f"more than {MAX_GPUS} GPUs in {spec!r}", field=FIELD)
    return result


def _derive_uuid(prefix: str, *parts: object) -> str:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def read_usage_file(usage_file: Path | None, declared_bytes: int) -> int:
    """Bytes a subjob says it uses now (``$LAMINAR_GPU_MEM_FILE``); the declared size if the
    file is absent, unreadable, negative, or anything but a small regular file (the subjob
    controls it: a FIFO or a link must not wedge or inform the agent, see
    :mod:`laminar_agent.jobfiles`)."""
    if usage_file is not None:
        try:
            value = int(read_job_file(usage_file, max_bytes=32, owner_uid=None).strip())
        except (OSError, ValueError):
            return declared_bytes
        if value >= 0:
            return value
    return declared_bytes


@dataclass(frozen=True)
class _Subjob:
    device_uuids: tuple[str, ...]
    declared_bytes: int
    usage_file: Path | None

    def usage_bytes(self) -> int:
        return read_usage_file(self.usage_file, self.declared_bytes)


class FakeGpuBackend:
    """GpuBackend over GPUs described by a spec string; thread-safe."""

    name = "fake"
    #: A suspended fake subjob's memory is detached, as cuda-checkpoint would free it.
    frees_memory_on_suspend = True
    per_process_memory = False
    cuda_checkpoint = CheckpointSupport(None, "not used: the fake backend frees memory itself")

    def __init__(
        self,
        spec: str,
        *,
        agent_id: str,
        clock: Callable[[], float] = time.monotonic,
        shared_indices: frozenset[int] = frozenset(),
    ) -> None:
        self._clock = clock
        self._agent_id = agent_id
        self._lock = threading.Lock()
        self._subjobs: dict[str, _Subjob] = {}
        # device uuid -> list of (bytes, expires_at or inf)
        self._injections: dict[str, list[tuple[int, float]]] = {}
        gpus: list[GpuInfo] = []
        for item in parse_fake_spec(spec):
            for _ in range(item.count):
                index = len(gpus)
                gpu_uuid = _derive_uuid("GPU", agent_id, index)
                instances = tuple(
                    MigInstanceInfo(
                        uuid=_derive_uuid("MIG", agent_id, index, n, profile),
                        profile=profile,
                        memory_total_bytes=lookup_profile(item.model, profile).memory_bytes,
                        start=start,
                        size=size,
                        gpu_instance_id=n + 1,
                    )
                    for n, (profile, start, size) in enumerate(
                        place_profiles(item.model, item.mig_profiles)
                    )
                )
                gpus.append(
                    GpuInfo(
                        index=index,
                        uuid=gpu_uuid,
                        model=item.model,
                        memory_total_bytes=item.memory_total_bytes,
                        mig_enabled=bool(instances),
                        mig_instances=instances,
                        shared=item.shared or (index in shared_indices and not instances),
                    )
                )
        self._gpus = tuple(gpus)
        self._parent: dict[str, str] = {}
        self._totals: dict[str, int] = {}
        for gpu in self._gpus:
            self._parent[gpu.uuid] = gpu.uuid
            self._totals[gpu.uuid] = gpu.memory_total_bytes
            for mig in gpu.mig_instances:
                self._parent[mig.uuid] = gpu.uuid
                self._totals[mig.uuid] = mig.memory_total_bytes

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def apply_mig_layout(
        self, gpu_index: int, layout: Sequence[tuple[str, int, int]]
    ) -> tuple[MigInstanceInfo, ...]:
        """Give MIG GPU ``gpu_index`` the instances of ``layout`` ((profile, start, size)
        each), as destroying and creating GPU instances does on NVML: only what changes is
        touched. Refused while a subjob uses an instance it would destroy; an instance that
        stays where it was keeps its UUID (and may run a subjob meanwhile)."""
        with self._lock:
            gpu = next((g for g in self._gpus if g.index == gpu_index), None)
            if gpu is None or not gpu.mig_enabled:
                raise FailedPrecondition(
                    f"GPU {gpu_index} is not a MIG GPU", field="inventory.mig_on_demand"
                )
            place_profiles(gpu.model, [name for name, _, _ in layout])  # legal, or refused
            wanted = {(name, start) for name, start, _ in layout}
            doomed = {gpu.uuid} | {
                m.uuid for m in gpu.mig_instances if (m.profile, m.start) not in wanted
            }
            busy = [sid for sid, sub in self._subjobs.items() if doomed & set(sub.device_uuids)]
            if busy:
                raise FailedPrecondition(
                    f"GPU {gpu_index} runs {', '.join(sorted(busy))} on an instance the new "
                    "MIG layout would destroy",
                    field="gpu_index",
                )
            kept = {(m.profile, m.start): m for m in gpu.mig_instances}
            instances = tuple(
                kept.get((name, start))
                or MigInstanceInfo(
                    uuid=_derive_uuid("MIG", self._agent_id, gpu_index, "layout", name, start),
                    profile=name,
                    memory_total_bytes=lookup_profile(gpu.model, name).memory_bytes,
                    start=start,
                    size=size,
                )
                for name, start, size in layout
            )
            for old in gpu.mig_instances:
                self._parent.pop(old.uuid, None)
                self._totals.pop(old.uuid, None)
            for new in instances:
                self._parent[new.uuid] = gpu.uuid
                self._totals[new.uuid] = new.memory_total_bytes
            self._gpus = tuple(
                replace(g, mig_instances=instances) if g is gpu else g for g in self._gpus
            )
            return instances

    def refresh(self) -> None:
        """The fake topology never changes."""

    def process_memory(self) -> dict[str, dict[int, int]]:
        """Fake GPUs list no processes: subjobs report their use in a file instead."""
        return {}

    def degraded(self) -> dict[str, str]:
        """Fake GPUs do not fail (the mocked NVML scripts faults for the nvml backend)."""
        return {}

    def failed(self) -> dict[str, str]:
        return {}

    def take_failures(self) -> list[GpuFailure]:
        return []

    def driver_version(self) -> str:
        return "fake"

    def close(self) -> None:
        with self._lock:
            self._subjobs.clear()
            self._injections.clear()

    def attach_subjob(
        self,
        subjob_id: str,
        device_uuids: Sequence[str],
        declared_bytes: int,
        usage_file: Path | None,
    ) -> None:
        """Count a subjob's usage on each device (per device); re-attaching replaces."""
        if not subjob_id:
            raise InvalidArgument("must not be empty", field="subjob_id")
        if not device_uuids:
            raise InvalidArgument("must name at least one device", field="device_uuids")
        unknown = [u for u in device_uuids if u not in self._totals]
        if unknown:
            raise NotFound(f"unknown device(s) {', '.join(unknown)}", field="device_uuids")
        if declared_bytes < 0:
            raise InvalidArgument(f"must be >= 0, got {declared_bytes}", field="declared_bytes")
        with self._lock:
            self._subjobs[subjob_id] = _Subjob(tuple(device_uuids), declared_bytes, usage_file)

    def detach_subjob(self, subjob_id: str) -> None:
        """Stop counting a subjob; unknown ids are ignored so detach is idempotent."""
        with self._lock:
            self._subjobs.pop(subjob_id, None)

    def inject(
        self,
        *,
        gpu_index: int,
        device_uuid: str | None,
        used_bytes: int,
        add: bool,
        duration_seconds: float,
    ) -> int:
        """Inject synthetic load on a GPU (or one of its MIG instances).

        ``add`` stacks on the live injections, otherwise it replaces them; a
        duration of 0 lasts until changed. Returns the injected bytes now live
        on that device.
        """
        if gpu_index < 0:
            raise InvalidArgument(f"must be >= 0, got {gpu_index}", field="gpu_index")
        if gpu_index >= len(self._gpus):
            raise NotFound(f"no GPU {gpu_index} (agent has {len(self._gpus)})", field="gpu_index")
        gpu = self._gpus[gpu_index]
        target = device_uuid or gpu.uuid
        if target != gpu.uuid and target not in {m.uuid for m in gpu.mig_instances}:
            raise NotFound(
                f"{target!r} is not GPU {gpu_index} or one of its MIG instances",
                field="device_uuid",
            )
        if used_bytes < 0:
            raise InvalidArgument(f"must be >= 0, got {used_bytes}", field="used_bytes")
        if not (math.isfinite(duration_seconds) and duration_seconds >= 0):
            raise InvalidArgument(
                f"must be a finite number >= 0, got {duration_seconds}", field="duration_seconds"
            )
        now = self._clock()
        expires_at = now + duration_seconds if duration_seconds > 0 else math.inf
        with self._lock:
            live = self._live_injections(target, now) if add else []
            live.append((used_bytes, expires_at))
            self._injections[target] = live
            return sum(b for b, _ in live)

    def _live_injections(self, device_uuid: str, now: float) -> list[tuple[int, float]]:
        live = [(b, t) for b, t in self._injections.get(device_uuid, []) if t > now]
        if live:
            self._injections[device_uuid] = live
        else:
            self._injections.pop(device_uuid, None)
        return live

    def memory_used(self) -> dict[str, tuple[int, int]]:
        """Per device: attached subjob usage + live injections, clamped to the total.

        A MIG instance's usage also counts on its parent GPU, like NVML reports.
        """
        now = self._clock()
        with self._lock:
            subjobs = list(self._subjobs.values())
            own = {
                uuid: sum(b for b, _ in self._live_injections(uuid, now))
                for uuid in list(self._injections)
            }
        for subjob in subjobs:
            usage = subjob.usage_bytes()
            for uuid in subjob.device_uuids:
                own[uuid] = own.get(uuid, 0) + usage
        raw = {uuid: own.get(uuid, 0) for uuid in self._totals}
        for uuid, parent in self._parent.items():
            if parent != uuid:
                raw[parent] += min(raw[uuid], self._totals[uuid])
        return {
            uuid: (min(used, self._totals[uuid]), self._totals[uuid]) for uuid, used in raw.items()
        }
