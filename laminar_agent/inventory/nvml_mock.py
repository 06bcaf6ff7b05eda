"""A scriptable stand-in for the ``pynvml`` module, so :class:`NvmlBackend` runs without a GPU.

It imitates the part of nvidia-ml-py's API the backend calls (same function names,
argument order and return shapes) and raises pynvml's own ``NVMLError`` subclasses, so
``except pynvml.NVMLError_NotFound`` behaves as on a real host. A test configures it in
Python (:class:`MockNvml`); the agent daemon loads one from a JSON scenario when
``inventory.nvml_mock`` (``LAMINAR_INVENTORY_NVML_MOCK``) names a file, never by default.

Events: ``xid(gpu, xid)`` (or a scenario's ``events`` list, delivered once each time the
followed file is replaced) queues an Xid critical-error event on every event set that
registered that GPU, as ``nvmlEventSetWait`` returns it (its ``device`` is the mock's
handle, not a ctypes pointer).

Processes: a scenario's ``processes`` per GPU or MIG instance, and with ``pid_dir`` one
file per process, ``<pid_dir>/<device uuid>/<pid>`` holding its bytes, which real test
processes write for themselves; ``live_pids_only`` lists only processes still running.

MIG: a scenario's instances are GPU instances with one full compute instance each (a
MIG device), numbered 1, 2, ... in the order given. The GPU-instance calls create and
destroy them as the driver does: ``nvmlDeviceCreateGpuInstanceWithPlacement`` checks the
profile's legal placements (the tables of :mod:`.mig`) and refuses an overlap
(INSUFFICIENT_RESOURCES); an instance becomes a MIG device once
``nvmlGpuInstanceCreateComputeInstance`` gave it its full compute instance; destroying a
compute instance or GPU instance a process uses is IN_USE, a GPU instance that still has
its compute instance too. Created instances live in the mock's memory, as a GPU's do until
reboot; a followed scenario file that changes replaces them.

Not covered: clocks, ECC counters, NVLink, vGPU, event types other than Xid; compute
instances smaller than their GPU instance.
"""

from __future__ import annotations

import json
import os
import threading
import uuid as uuidlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from laminar_agent.inventory.mig import MIG_PROFILES, MigProfile
from laminar_agent.inventory.model_names import canonical_model
from laminar_base.errors import InvalidArgument

GIB = 1 << 30
#: Where mock UUIDs are derived from, so a scenario always yields the same UUIDs.
_UUID_NAMESPACE = uuidlib.UUID("6c61c2a5-0b4e-4f0e-9a3e-6d4f636b6e76")
#: pynvml's constants and error classes the backend reads off the module.
_REEXPORTED = ("NVMLError", "NVML_DEVICE_MIG_ENABLE", "NVML_DEVICE_MIG_DISABLE")
MAX_MIG_DEVICES = 7
MIB = 1 << 20
#: A profile's ``nvmlDeviceGetGpuInstanceProfileInfo`` constant and the driver's profile
#: id (as ``nvidia-smi mig -lgip`` lists it), by compute slices; a 1g profile with twice
#: the memory (1g.20gb on 80 GB GPUs) is the REV1 variant.
_GI_PROFILES = {
    1: (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19),
    2: (pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14),
    3: (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9),
    4: (pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5),
    7: (pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0),
}
_GI_PROFILE_1_SLICE_DOUBLE = (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 15)
#: Compute-instance profile constants by compute slices.
_CI_PROFILES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


def _gi_profile(profile: MigProfile) -> tuple[int, int]:
    """(info constant, driver profile id) of a MIG profile."""
    if profile.compute_slices == 1 and profile.size == 2:
        return _GI_PROFILE_1_SLICE_DOUBLE
    return _GI_PROFILES[profile.compute_slices]


@dataclass
class MockMig:
    """One MIG instance of a mocked GPU; ``processes`` maps pid -> used bytes."""

    profile: str
    memory_total_bytes: int
    start: int
    size: int
    used_bytes: int = 0
    processes: dict[int, int] = field(default_factory=dict)
    #: The GPU instance's id (assigned in order when 0).
    gi_id: int = 0
    #: Whether it has its compute instance, i.e. is a MIG device processes can use.
    has_ci: bool = True


@dataclass
class MockGpu:
    """One mocked GPU, named as NVML names it (e.g. ``NVIDIA H100 80GB HBM3``)."""

    name: str
    memory_total_bytes: int
    used_bytes: int = 0
    processes: dict[int, int] = field(default_factory=dict)
    mig_capable: bool = False
    migs: list[MockMig] = field(default_factory=list)
    #: Fell off the bus: every call on this GPU fails with GPU_IS_LOST.
    is_lost: bool = False
    #: MIG mode; None: enabled when the GPU has instances.
    mig_enabled: bool | None = None

    def __post_init__(self) -> None:
        if self.mig_enabled is None:
            self.mig_enabled = bool(self.migs)
        for number, mig in enumerate(self.migs, start=1):
            if mig.gi_id == 0:
                mig.gi_id = number
        #: GPU instance ids are never reused within a mock's life, so UUIDs stay unique.
        self.next_gi_id = max((m.gi_id for m in self.migs), default=0) + 1

    def mig(self, gi_id: int) -> MockMig | None:
        return next((m for m in self.migs if m.gi_id == gi_id), None)


def _read_scenario(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(
            f"cannot read NVML mock scenario {str(path)!r}: {exc}", field="inventory.nvml_mock"
        ) from None
    if not isinstance(data, dict):
        raise InvalidArgument("an NVML mock scenario is a JSON object", field="inventory.nvml_mock")
    return data


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the scenario file is rewritten or replaced."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class _Handle:
    """An opaque handle: a device (a GPU, or a MIG device when ``mig`` names its GPU
    instance id), a GPU instance (``kind="gi"``) or a compute instance (``kind="ci"``)."""

    gpu: int
    mig: int | None = None
    kind: str = "device"


@dataclass
class _EventSet:
    """An ``nvmlEventSetCreate`` result: the GPUs registered on it and its queued events."""

    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event mask
    queue: deque[Any] = field(default_factory=deque)


def _read_pid_files(folder: Path) -> dict[int, int]:
    """``<folder>/<pid>`` files holding bytes; others (a toggled ``<pid>.checkpointed``,
    a file mid-write) are not listed."""
    try:
        names = [entry.name for entry in folder.iterdir()]
    except OSError:
        return {}
    out: dict[int, int] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            out[int(name)] = int((folder / name).read_text())
        except (OSError, ValueError):
            continue
    return out


def _is_running(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process awaiting its parent does not): the driver
    lists no exited process. Without psutil: the decision core's imports reach this module."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: existing is all we can tell
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml maps the code to its NVMLError_* subclass


class MockNvml:
    """A pynvml look-alike over :class:`MockGpu` records, with failures a test can script.

    ``fail(call, code, gpu=...)`` makes the named function raise until ``heal(call)``;
    ``hang(call, until)`` blocks it until an event is set; ``gpus[i].is_lost = True`` makes
    a GPU fall off the bus. Thread-safe: the agent may
    poll from a worker thread while a test reconfigures it.
    """

    def __init__(
        self,
        gpus: list[MockGpu],
        *,
        driver_version: str = "550.54.15",
        live_pids_only: bool = False,
        pid_dir: Path | None = None,
    ) -> None:
        """``live_pids_only``: list (and count) only processes that exist on this host, as
        the driver does once a process has exited (scenario key ``live_pids_only``).
        ``pid_dir``: processes also list themselves there, one file per process,
        ``<pid_dir>/<device uuid>/<pid>`` holding its bytes (scenario key ``pid_dir``), so
        real processes (a test's subjobs) can say what they use without a shared file."""
        self.gpus = gpus
        self.driver_version = driver_version
        self.live_pids_only = live_pids_only
        self.pid_dir = pid_dir
        self._source: Path | None = None
        self._source_stamp: tuple[int, int, int] | None = None
        self._failures: dict[str, tuple[int, int | None]] = {}
        self._hangs: dict[str, threading.Event] = {}
        #: Call name -> how many callers are blocked in its hang now.
        self._blocked: dict[str, int] = {}
        self._lock = threading.Lock()
        #: Event sets by id; waiters sleep on ``_events_changed``.
        self._event_sets: dict[int, _EventSet] = {}
        self._events_changed = threading.Condition(self._lock)
        self._initialized = 0
        for name in _REEXPORTED:
            setattr(self, name, getattr(pynvml, name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVMLError_", "NVML_", "nvmlEventType", "c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # Scripting -------------------------------------------------------------------------

    def fail(
        self, call: str, code: int = pynvml.NVML_ERROR_UNKNOWN, gpu: int | None = None
    ) -> None:
        """Make ``call`` raise ``NVMLError(code)`` (only for GPU index ``gpu`` when given)."""
        if not callable(getattr(type(self), call, None)) or not call.startswith("nvml"):
            raise InvalidArgument(f"no NVML call named {call!r} in the mock", field="call")
        with self._lock:
            self._failures[call] = (code, gpu)

    def hang(self, call: str, until: threading.Event) -> None:
        """Make ``call`` block until ``until`` is set, as a wedged driver does."""
        self.fail(call)  # validates the name
        with self._lock:
            self._failures.pop(call)
            self._hangs[call] = until

    def xid(self, gpu: int, xid: int) -> None:
        """Report Xid ``xid`` on GPU index ``gpu`` to every event set registered for it."""
        with self._lock:
            for event_set in self._event_sets.values():
                mask = event_set.registered.get(gpu, 0)
                if mask & pynvml.nvmlEventTypeXidCriticalError:
                    event_set.queue.append(
                        pynvml.nvmlFriendlyObject(
                            {
                                "device": _Handle(gpu),
                                "eventType": pynvml.nvmlEventTypeXidCriticalError,
                                "eventData": xid,
                                "gpuInstanceId": 0xFFFFFFFF,
                                "computeInstanceId": 0xFFFFFFFF,
                            }
                        )
                    )
            self._events_changed.notify_all()

    def pending_events(self) -> int:
        """Events queued and not yet taken by ``nvmlEventSetWait``."""
        with self._lock:
            return sum(len(event_set.queue) for event_set in self._event_sets.values())

    def blocked(self, call: str) -> int:
        """How many callers are blocked in ``call``'s hang right now."""
        with self._lock:
            return self._blocked.get(call, 0)

    def heal(self, call: str | None = None) -> None:
        """Stop failing ``call`` (every call when None)."""
        with self._lock:
            if call is None:
                self._failures.clear()
                self._hangs.clear()
            else:
                self._failures.pop(call, None)
                self._hangs.pop(call, None)

    @staticmethod
    def _parse_events(data: dict[str, Any]) -> list[tuple[int, int]]:
        """A scenario's ``events``: ``[{"gpu": 1, "xid": 79}, ...]`` -> [(gpu, xid)]."""
        try:
            return [(int(e["gpu"]), int(e["xid"])) for e in data.get("events", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"bad NVML mock scenario events: {exc!r}", field="inventory.nvml_mock"
            ) from None

    @staticmethod
    def _parse(data: dict[str, Any]) -> tuple[list[MockGpu], str, dict[str, int]]:
        try:
            gpus = [
                MockGpu(
                    name=str(g["name"]),
                    memory_total_bytes=int(g["memory_total_bytes"]),
                    used_bytes=int(g.get("used_bytes", 0)),
                    processes={int(p): int(b) for p, b in g.get("processes", {}).items()},
                    mig_capable=bool(g.get("mig_capable", bool(g.get("migs")))),
                    mig_enabled=bool(g["mig_enabled"]) if "mig_enabled" in g else None,
                    migs=[
                        MockMig(
                            profile=str(m["profile"]),
                            memory_total_bytes=int(m["memory_total_bytes"]),
                            start=int(m["start"]),
                            size=int(m["size"]),
                            used_bytes=int(m.get("used_bytes", 0)),
                            processes={int(p): int(b) for p, b in m.get("processes", {}).items()},
                        )
                        for m in g.get("migs", [])
                    ],
                    is_lost=bool(g.get("is_lost", False)),
                )
                for g in data["gpus"]
            ]
            errors = {str(call): int(code) for call, code in data.get("errors", {}).items()}
            return gpus, str(data.get("driver_version", "550.54.15")), errors
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgument(
                f"bad NVML mock scenario: {exc!r}", field="inventory.nvml_mock"
            ) from None

    @classmethod
    def from_scenario(cls, data: dict[str, Any]) -> MockNvml:
        """Build from a JSON-like scenario (see docs/agent.md, "A mocked NVML")."""
        gpus, driver_version, errors = cls._parse(data)
        live_only = bool(data.get("live_pids_only", False))
        pid_dir = Path(str(data["pid_dir"])) if data.get("pid_dir") else None
        mock = cls(gpus, driver_version=driver_version, live_pids_only=live_only, pid_dir=pid_dir)
        for call, code in errors.items():
            mock.fail(call, code)
        return mock

    @classmethod
    def from_file(cls, path: str | Path) -> MockNvml:
        """Build from a JSON scenario file, and follow it: when the file is replaced
        (write a new one, then rename it over), the next call sees its GPUs and errors,
        so a test can script a running agent's NVML from outside the process."""
        mock = cls.from_scenario(_read_scenario(Path(path)))
        mock._source = Path(path)
        mock._source_stamp = _stamp(mock._source)
        return mock

    def _follow_source(self) -> None:
        if self._source is None:
            return
        stamp = _stamp(self._source)
        if stamp == self._source_stamp:
            return
        try:
            data = _read_scenario(self._source)
            gpus, driver_version, errors = self._parse(data)
            events = self._parse_events(data)
        except InvalidArgument:
            return  # mid-write or broken: keep the last good scenario
        with self._lock:
            if stamp == self._source_stamp:
                return  # another thread followed it first: its events are queued once
            self._source_stamp = stamp
            self.gpus, self.driver_version = gpus, driver_version
            self.live_pids_only = bool(data.get("live_pids_only", False))
            self.pid_dir = Path(str(data["pid_dir"])) if data.get("pid_dir") else None
            self._failures = {call: (code, None) for call, code in errors.items()}
        for gpu, xid in events:
            self.xid(gpu, xid)

    # Plumbing --------------------------------------------------------------------------

    def _enter(self, call: str, handle: _Handle | None = None) -> None:
        self._follow_source()
        with self._lock:
            failure = self._failures.get(call)
            hang = self._hangs.get(call)
            initialized = self._initialized > 0
        if hang is not None:
            with self._lock:
                self._blocked[call] = self._blocked.get(call, 0) + 1
            try:
                hang.wait()
            finally:
                with self._lock:
                    self._blocked[call] -= 1
        if call != "nvmlInit" and not initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            if not 0 <= handle.gpu < len(self.gpus):
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if self.gpus[handle.gpu].is_lost:
                raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if failure is not None:
            code, gpu = failure
            if gpu is None or (handle is not None and handle.gpu == gpu):
                raise _error(code)

    def _listed(self, handle: _Handle) -> dict[int, int]:
        """The processes the driver lists on a device (GPU or MIG instance): the scenario's
        and those in ``pid_dir``; with ``live_pids_only``, those still running."""
        if handle.mig is None:
            processes = dict(self._gpu(handle).processes)
        else:
            processes = dict(self._mig(handle).processes)
        if self.pid_dir is not None:
            processes.update(_read_pid_files(self.pid_dir / self._uuid(handle)))
        if not self.live_pids_only:
            return processes
        return {pid: used for pid, used in processes.items() if _is_running(pid)}

    def _gpu(self, handle: _Handle) -> MockGpu:
        return self.gpus[handle.gpu]

    def _mig(self, handle: _Handle) -> MockMig:
        """The instance a MIG device, GPU-instance or compute-instance handle names."""
        if handle.mig is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        mig = self._gpu(handle).mig(handle.mig)
        if mig is None or (handle.kind != "gi" and not mig.has_ci):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)  # destroyed since
        return mig

    def _uuid(self, handle: _Handle) -> str:
        if handle.mig is None:
            return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'gpu{handle.gpu}')}"
        number = handle.mig - 1  # a scenario's n-th instance keeps the UUID it always had
        return f"MIG-{uuidlib.uuid5(_UUID_NAMESPACE, f'gpu{handle.gpu}/mig{number}')}"

    def _profiles(self, handle: _Handle) -> dict[str, MigProfile]:
        """The MIG profiles of a GPU's model; NOT_SUPPORTED when it has no MIG."""
        gpu = self._gpu(handle)
        table = MIG_PROFILES.get(canonical_model(gpu.name, gpu.memory_total_bytes))
        if not gpu.mig_capable or table is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return table

    def _profile_by_id(self, handle: _Handle, profile_id: int) -> MigProfile:
        for profile in self._profiles(handle).values():
            if _gi_profile(profile)[1] == profile_id:
                return profile
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _in_use(self, gpu: int, mig: MockMig) -> bool:
        return bool(mig.has_ci and self._listed(_Handle(gpu, mig.gi_id)))

    # The pynvml API --------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        with self._lock:
            self._initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        with self._lock:
            self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(index)
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return self._uuid(handle)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        gpu = self._gpu(handle)
        return gpu.name if handle.mig is None else f"{gpu.name} MIG {self._mig(handle).profile}"

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> pynvml.c_nvmlMemory_t:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        gpu = self._gpu(handle)
        if handle.mig is not None:
            mig = self._mig(handle)
            total = mig.memory_total_bytes
            used = mig.used_bytes + sum(self._listed(handle).values())
        elif gpu.migs:
            total = gpu.memory_total_bytes
            used = gpu.used_bytes + sum(
                m.used_bytes
                + (sum(self._listed(_Handle(handle.gpu, m.gi_id)).values()) if m.has_ci else 0)
                for m in gpu.migs
            )
        else:
            total = gpu.memory_total_bytes
            used = gpu.used_bytes + sum(self._listed(handle).values())
        used = min(used, total)
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        gi_id = 0xFFFFFFFF if handle.mig is None else handle.mig
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": gi_id,
                    "computeInstanceId": 0 if handle.mig is not None else 0xFFFFFFFF,
                }
            )
            for pid, used in sorted(self._listed(handle).items())
        ]

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        gpu = self._gpu(handle)
        if not gpu.mig_capable:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return MAX_MIG_DEVICES if self._gpu(handle).mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        devices = [m for m in self._gpu(handle).migs if m.has_ci]
        if not 0 <= index < len(devices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, devices[index].gi_id)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        self._mig(handle)
        assert handle.mig is not None
        return handle.mig

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, instance_id: int) -> _Handle:
        self._enter("nvmlDeviceGetGpuInstanceById", handle)
        if self._gpu(handle).mig(instance_id) is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, instance_id, "gi")

    def nvmlGpuInstanceGetInfo(self, instance: _Handle) -> pynvml.c_nvmlGpuInstanceInfo_t:
        self._enter("nvmlGpuInstanceGetInfo", instance)
        mig = self._mig(instance)
        gpu = self._gpu(instance)
        model = canonical_model(gpu.name, gpu.memory_total_bytes)
        profile = MIG_PROFILES.get(model, {}).get(mig.profile)
        return pynvml.c_nvmlGpuInstanceInfo_t(
            id=mig.gi_id,
            profileId=_gi_profile(profile)[1] if profile is not None else 0,
            placement=pynvml.c_nvmlGpuInstancePlacement_t(start=mig.start, size=mig.size),
        )

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: _Handle, profile: int, version: int = 2
    ) -> Any:
        """The GPU-instance profile behind info constant ``profile``; NOT_SUPPORTED for a
        constant this GPU has no profile for."""
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        for entry in self._profiles(handle).values():
            constant, profile_id = _gi_profile(entry)
            if constant != profile:
                continue
            info = (
                pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                if version == 2
                else pynvml.c_nvmlGpuInstanceProfileInfo_t()
            )
            info.id = profile_id
            info.sliceCount = entry.compute_slices
            info.instanceCount = len(entry.starts)
            info.memorySizeMB = entry.memory_bytes // MIB
            if version == 2:
                info.name = f"MIG {entry.name}".encode()
            return info
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: _Handle, profile_id: int, placement: Any
    ) -> _Handle:
        """A GPU instance of ``profile_id`` at ``placement`` (start, size), without its
        compute instance yet."""
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
        gpu = self._gpu(handle)
        if not gpu.mig_enabled:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(handle, profile_id)
        start, size = int(placement.start), int(placement.size)
        if start not in profile.starts or size != profile.size:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            taken: set[int] = set()
            for mig in gpu.migs:
                taken.update(range(mig.start, mig.start + mig.size))
            compute = sum(int(m.profile.split("g.", 1)[0]) for m in gpu.migs)
            if taken & set(range(start, start + size)) or compute + profile.compute_slices > 7:
                raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            mig = MockMig(
                profile=profile.name,
                memory_total_bytes=profile.memory_bytes,
                start=start,
                size=size,
                gi_id=gpu.next_gi_id,
                has_ci=False,
            )
            gpu.next_gi_id += 1
            gpu.migs.append(mig)
            gpu.migs.sort(key=lambda m: m.start)
        return _Handle(handle.gpu, mig.gi_id, "gi")

    def nvmlGpuInstanceDestroy(self, instance: _Handle) -> None:
        self._enter("nvmlGpuInstanceDestroy", instance)
        mig = self._mig(instance)
        if mig.has_ci:
            raise _error(pynvml.NVML_ERROR_IN_USE)  # its compute instance goes first
        with self._lock:
            self._gpu(instance).migs.remove(mig)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, instance: _Handle, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        """Compute-instance profile ``profile`` inside a GPU instance; the mock models the
        full compute instance only (smaller ones are NOT_SUPPORTED)."""
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo", instance)
        mig = self._mig(instance)
        slices = self._profiles(instance)[mig.profile].compute_slices
        if profile != _CI_PROFILES[slices]:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = (
            pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else pynvml.c_nvmlComputeInstanceProfileInfo_t()
        )
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = 1
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, instance: _Handle, profile_id: int) -> _Handle:
        self._enter("nvmlGpuInstanceCreateComputeInstance", instance)
        mig = self._mig(instance)
        if profile_id != _CI_PROFILES[self._profiles(instance)[mig.profile].compute_slices]:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            if mig.has_ci:
                raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            mig.has_ci = True
        return _Handle(instance.gpu, mig.gi_id, "ci")

    def nvmlGpuInstanceGetComputeInstanceById(self, instance: _Handle, ci_id: int) -> _Handle:
        self._enter("nvmlGpuInstanceGetComputeInstanceById", instance)
        mig = self._mig(instance)
        if ci_id != 0 or not mig.has_ci:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(instance.gpu, mig.gi_id, "ci")

    def nvmlComputeInstanceDestroy(self, instance: _Handle) -> None:
        self._enter("nvmlComputeInstanceDestroy", instance)
        mig = self._mig(instance)
        if self._in_use(instance.gpu, mig):
            raise _error(pynvml.NVML_ERROR_IN_USE)
        with self._lock:
            mig.has_ci = False

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return int(pynvml.nvmlEventTypeXidCriticalError)

    def nvmlEventSetCreate(self) -> int:
        self._enter("nvmlEventSetCreate")
        with self._lock:
            set_id = len(self._event_sets) + 1
            self._event_sets[set_id] = _EventSet()
        return set_id

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: int) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        with self._lock:
            target = self._event_sets.get(event_set)
            if target is None or handle.mig is not None:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            target.registered[handle.gpu] = target.registered.get(handle.gpu, 0) | event_types

    def nvmlEventSetWait(self, event_set: int, timeoutms: int) -> Any:
        """The next event of ``event_set``; NVMLError_Timeout after ``timeoutms``."""
        self._enter("nvmlEventSetWait")
        with self._lock:
            target = self._event_sets.get(event_set)
            if target is None:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._events_changed.wait_for(lambda: bool(target.queue), timeoutms / 1000.0)
            if not target.queue:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            return target.queue.popleft()

    def nvmlEventSetFree(self, event_set: int) -> None:
        self._enter("nvmlEventSetFree")
        with self._lock:
            if self._event_sets.pop(event_set, None) is None:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._events_changed.notify_all()
