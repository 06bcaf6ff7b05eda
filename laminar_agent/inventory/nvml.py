"""GpuBackend over NVIDIA's NVML (package nvidia-ml-py, module ``pynvml``).

pynvml is imported lazily so machines without the driver can still run the
fake backend; a failed init becomes a clean Unavailable error.
"""

from __future__ import annotations

import threading
from typing import Any

from laminar_agent.inventory.base import GpuInfo, MigInstanceInfo
from laminar_base.errors import Unavailable


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Reads GPUs and MIG instances from NVML; ``shared_indices=None`` shares all non-MIG GPUs."""

    name = "nvml"
    #: cuda-checkpoint is not integrated yet: SIGSTOP leaves GPU memory allocated.
    frees_memory_on_suspend = False

    def __init__(self, *, shared_indices: frozenset[int] | None = frozenset()) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            raise Unavailable(f"NVML not available: {exc}") from exc
        self._nvml: Any = pynvml
        self._shared_indices = shared_indices
        self._lock = threading.Lock()
        self._closed = False
        self._gpus: tuple[GpuInfo, ...] = ()
        self._handles: dict[str, Any] = {}
        self.refresh()

    def _mig_instances(self, handle: Any) -> tuple[tuple[MigInstanceInfo, Any], ...]:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return ()  # MIG not supported on this GPU
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        result: list[tuple[MigInstanceInfo, Any]] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue  # empty slot
            name = _text(nvml.nvmlDeviceGetName(mig))
            profile = name.rsplit("MIG ", 1)[-1].strip() if "MIG " in name else name
            start, size = -1, 0
            try:
                gi = nvml.nvmlDeviceGetGpuInstanceById(handle, nvml.nvmlDeviceGetGpuInstanceId(mig))
                info = nvml.nvmlGpuInstanceGetInfo(gi)
                start, size = int(info.placement.start), int(info.placement.size)
            except nvml.NVMLError:
                pass  # needs privileges on some drivers; placement stays unknown (-1)
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            info_record = MigInstanceInfo(
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                profile=profile,
                memory_total_bytes=int(memory.total),
                start=start,
                size=size,
            )
            result.append((info_record, mig))
        return tuple(sorted(result, key=lambda pair: (pair[0].start, pair[0].uuid)))

    def refresh(self) -> None:
        nvml = self._nvml
        gpus: list[GpuInfo] = []
        handles: dict[str, Any] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                instances = self._mig_instances(handle)
                handles[uuid] = handle
                for mig_info, mig_handle in instances:
                    handles[mig_info.uuid] = mig_handle
                shared = not instances and (
                    self._shared_indices is None or index in self._shared_indices
                )
                gpus.append(
                    GpuInfo(
                        index=index,
                        uuid=uuid,
                        model=_text(nvml.nvmlDeviceGetName(handle)),
                        memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                        mig_enabled=bool(instances),
                        mig_instances=tuple(m for m, _ in instances),
                        shared=shared,
                    )
                )
        except nvml.NVMLError as exc:
            raise Unavailable(f"NVML topology read failed: {exc}") from exc
        with self._lock:
            self._gpus = tuple(gpus)
            self._handles = handles

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def memory_used(self) -> dict[str, tuple[int, int]]:
        nvml = self._nvml
        with self._lock:
            handles = dict(self._handles)
        result: dict[str, tuple[int, int]] = {}
        try:
            for uuid, handle in handles.items():
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                result[uuid] = (int(memory.used), int(memory.total))
        except nvml.NVMLError as exc:
            raise Unavailable(f"NVML memory read failed: {exc}") from exc
        return result

    def driver_version(self) -> str:
        return _text(self._nvml.nvmlSystemGetDriverVersion())

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # already shut down; nothing to release
