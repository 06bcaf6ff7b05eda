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

Not covered: clocks, ECC counters, NVLink, vGPU, event types other than Xid; MIG
placement is what the scenario says, not what the driver would choose.
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

from laminar_base.errors import InvalidArgument

GIB = 1 << 30
#: Where mock UUIDs are derived from, so a scenario always yields the same UUIDs.
_UUID_NAMESPACE = uuidlib.UUID("6c61c2a5-0b4e-4f0e-9a3e-6d4f636b6e76")
#: pynvml's constants and error classes the backend reads off the module.
_REEXPORTED = ("NVMLError", "NVML_DEVICE_MIG_ENABLE", "NVML_DEVICE_MIG_DISABLE")
MAX_MIG_DEVICES = 7


@dataclass
class MockMig:
    """One MIG instance of a mocked GPU; ``processes`` maps pid -> used bytes."""

    profile: str
    memory_total_bytes: int
    start: int
    size: int
    used_bytes: int = 0
    processes: dict[int, int] = field(default_factory=dict)


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
    """An opaque device handle, as ``nvmlDeviceGetHandleByIndex`` returns one."""

    gpu: int
    mig: int | None = None


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
        if name.startswith(("NVMLError_", "NVML_ERROR_", "nvmlEventType")):
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
        if handle.mig is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu(handle).migs[handle.mig]

    def _uuid(self, handle: _Handle) -> str:
        if handle.mig is None:
            return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'gpu{handle.gpu}')}"
        return f"MIG-{uuidlib.uuid5(_UUID_NAMESPACE, f'gpu{handle.gpu}/mig{handle.mig}')}"

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
                m.used_bytes + sum(self._listed(_Handle(handle.gpu, i)).values())
                for i, m in enumerate(gpu.migs)
            )
        else:
            total = gpu.memory_total_bytes
            used = gpu.used_bytes + sum(self._listed(handle).values())
        used = min(used, total)
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        gi_id = 0xFFFFFFFF if handle.mig is None else handle.mig + 1
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
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.migs else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return MAX_MIG_DEVICES if self._gpu(handle).mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not 0 <= index < len(self._gpu(handle).migs):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        self._mig(handle)
        assert handle.mig is not None
        return handle.mig + 1

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, instance_id: int) -> _Handle:
        self._enter("nvmlDeviceGetGpuInstanceById", handle)
        if not 1 <= instance_id <= len(self._gpu(handle).migs):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, instance_id - 1)

    def nvmlGpuInstanceGetInfo(self, instance: _Handle) -> pynvml.c_nvmlGpuInstanceInfo_t:
        self._enter("nvmlGpuInstanceGetInfo", instance)
        mig = self._mig(instance)
        assert instance.mig is not None
        return pynvml.c_nvmlGpuInstanceInfo_t(
            id=instance.mig + 1,
            profileId=0,
            placement=pynvml.c_nvmlGpuInstancePlacement_t(start=mig.start, size=mig.size),
        )

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
