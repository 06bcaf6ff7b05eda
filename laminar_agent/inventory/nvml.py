"""GpuBackend over NVIDIA's NVML (package nvidia-ml-py, module ``pynvml``).

pynvml is imported lazily so machines without the driver can still run the
fake backend; a failed init becomes a clean Unavailable error. A stand-in module
(:mod:`laminar_agent.inventory.nvml_mock`) can be injected so this code runs without
a GPU.

Every NVML call goes through :meth:`NvmlBackend._call`. A call that fails degrades the
GPU it was about (:meth:`NvmlBackend.degraded` says which and why) instead of raising
into the agent's loops: memory polls skip that GPU, a topology read keeps its last
known record. The GPU recovers on the next pass whose calls succeed. Each call has a deadline, so a
wedged driver blocks the caller for at most one deadline, not forever; the agent calls
every read from a worker thread (``asyncio.to_thread``), never from its event loop, and
holds a degraded GPU back from new work.

A GPU *fails* (:meth:`NvmlBackend.take_failures`) on an Xid that needs a reset
(:data:`FATAL_XIDS`, watched on a thread of its own through ``nvmlEventSetWait``) or when a
call finds it lost (``GPU_IS_LOST``: it fell off the bus): the agent ends its subjobs and
holds it back. It takes work again once NVML answers on it: at once for a lost GPU that
is back, and after ``recover_after_seconds`` without a new fatal Xid for one that kept
answering. Other Xids (13, 31, 43, 45: an application's own fault) are logged and left to
the process they hit.

MIG on demand (:meth:`NvmlBackend.apply_mig_layout`) changes a MIG GPU's layout with
NVML's GPU-instance calls, touching only what changes: the instances that stay keep their
GPU instance and UUID (and may run work meanwhile: NVIDIA supports creating and destroying
GPU instances while other instances of the GPU run); every other GPU instance of the GPU
(those the new layout drops, and any a crash left without a compute instance) is
destroyed, compute instance first; each new one is created at its placement with one
compute instance spanning it, which makes it a MIG device. It needs root (the driver
answers NO_PERMISSION otherwise) and refuses when NVML lists a process on an instance it
would destroy. Tested on the mocked NVML only: not run on a real H100 here.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from laminar_agent.inventory.base import NOT_DETECTED, GpuFailure, GpuInfo, MigInstanceInfo
from laminar_agent.inventory.mig import place_profiles
from laminar_agent.inventory.model_names import canonical_model
from laminar_base.errors import FailedPrecondition, Unavailable

log = logging.getLogger(__name__)

#: GPU-instance ids a repartition sweeps (the driver numbers them from 1; H100 has at most
#: 7 instances, ids stay small).
MAX_GPU_INSTANCE_ID = 32
#: Compute-instance ids tried per GPU instance when destroying it.
MAX_COMPUTE_INSTANCES = 8
#: ``NVML_COMPUTE_INSTANCE_PROFILE_*`` constants by compute slices: the compute instance
#: that spans a whole GPU instance.
COMPUTE_PROFILE_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}

#: How long one NVML call may take before its GPU is degraded (they take microseconds
#: to milliseconds; a wedged driver takes forever).
CALL_DEADLINE_SECONDS = 1.0
#: Xids after which a GPU needs a reset (NVIDIA's Xid catalog): its work is ended and it is
#: drained. Xids not listed are an application's own errors, left to it.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "fell off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
#: How long one ``nvmlEventSetWait`` waits, so the watcher sees a close soon.
EVENT_WAIT_MS = 500
#: A GPU that had a fatal Xid but keeps answering takes work again after this long
#: without another one.
RECOVER_AFTER_SECONDS = 30.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _same_device(a: Any, b: Any) -> bool:
    """Whether two NVML device handles name one device: pynvml's are ctypes pointers (a new
    object per call, compared by address), a mock's are plain values."""
    if a == b:
        return True
    try:
        return bool(ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value)
    except (ctypes.ArgumentError, TypeError):
        return False


class NvmlCallFailed(Exception):
    """One NVML call failed; ``code`` is NVML's return code (``NVMLError.value``)."""

    def __init__(self, call: str, code: int, message: str) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call}: {message} (NVML code {code})")


class NvmlBackend:
    """Reads GPUs and MIG instances from NVML; ``shared_indices=None`` shares all non-MIG GPUs.

    ``nvml`` is the pynvml module to use (a mock in tests and with ``inventory.nvml_mock``);
    None imports the real one. Calls run on one worker thread and may take
    ``call_deadline_seconds``; while a call that missed it is still hung, every other
    call fails at once, so a wedged driver costs a caller one deadline, not one per call.
    A hung call can still delay the process's exit (the worker is joined).
    """

    name = "nvml"
    #: A plain SIGSTOP leaves GPU memory allocated; :attr:`cuda_checkpoint`, where found,
    #: frees it on whole GPUs (Airlock decides per subjob).
    frees_memory_on_suspend = False
    per_process_memory = True

    def __init__(
        self,
        *,
        shared_indices: frozenset[int] | None = frozenset(),
        nvml: Any = None,
        call_deadline_seconds: float = CALL_DEADLINE_SECONDS,
        recover_after_seconds: float = RECOVER_AFTER_SECONDS,
    ) -> None:
        self._deadline_seconds = call_deadline_seconds
        self._recover_after_seconds = recover_after_seconds
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._hung: Future[Any] | None = None
        self._hung_lock = threading.Lock()
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            self._nvml: Any = nvml
            self._call("nvmlInit")
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            self._worker.shutdown(wait=False)
            raise Unavailable(f"NVML not available: {exc}") from exc
        self._shared_indices = shared_indices
        self._lock = threading.Lock()
        self._closed = False
        self._gpus: tuple[GpuInfo, ...] = ()
        self._handles: dict[str, Any] = {}
        #: Device uuid (GPU or MIG instance) -> the uuid of the GPU it belongs to.
        self._parent: dict[str, str] = {}
        #: Pass ("topology", "memory", "processes") -> GPU key -> why that pass failed on it.
        self._faults: dict[str, dict[str, str]] = {}
        #: Failed GPU uuid -> (why, monotonic time before which it stays failed).
        self._failed: dict[str, tuple[str, float]] = {}
        self._new_failures: list[GpuFailure] = []
        self._events_stop = threading.Event()
        self._events_thread: threading.Thread | None = None
        self._event_set: Any = None
        try:
            self._driver_version = _text(self._call("nvmlSystemGetDriverVersion"))
        except NvmlCallFailed as failure:
            log.warning("NVML driver version unknown: %s", failure)
            self._driver_version = ""
        self.refresh()
        self._watch_events()
        #: Set by the agent at start (:func:`.cuda_checkpoint.detect_cuda_checkpoint`).
        self.cuda_checkpoint = NOT_DETECTED

    def _call(self, call: str, *args: Any) -> Any:
        """The one door to NVML: run ``call`` on the worker within the deadline; any
        NVMLError, a missed deadline or a still-hung earlier call is NvmlCallFailed."""
        with self._hung_lock:
            if self._hung is not None and not self._hung.done():
                raise NvmlCallFailed(
                    call, self._nvml.NVML_ERROR_TIMEOUT, "an earlier NVML call is still hung"
                )
            self._hung = None
            future = self._worker.submit(getattr(self._nvml, call), *args)
        try:
            return future.result(timeout=self._deadline_seconds)
        except FutureTimeout:
            with self._hung_lock:
                self._hung = future
            message = f"no answer within {self._deadline_seconds:g} s"
            raise NvmlCallFailed(call, self._nvml.NVML_ERROR_TIMEOUT, message) from None
        except self._nvml.NVMLError as exc:
            raise NvmlCallFailed(call, int(exc.value), str(exc)) from exc

    def _record_faults(self, source: str, faults: dict[str, str]) -> None:
        """Replace what ``source`` last found wrong, logging each GPU that degrades or recovers."""
        with self._lock:
            before = self._degraded_locked()
            self._faults[source] = faults
            after = self._degraded_locked()
        for key in sorted(after.keys() - before.keys()):
            log.warning("GPU %s degraded: %s", key, after[key])
        for key in sorted(before.keys() - after.keys()):
            log.info("GPU %s recovered: NVML answers again (was: %s)", key, before[key])

    def _degraded_locked(self) -> dict[str, str]:
        merged = {key: why for key, (why, _) in self._failed.items()}
        for source in sorted(self._faults):
            for key, reason in self._faults[source].items():
                merged.setdefault(key, reason)
        return merged

    def degraded(self) -> dict[str, str]:
        """GPU uuid (``gpu<index>`` when NVML never gave one) -> the failed call, for degraded GPUs."""
        with self._lock:
            return self._degraded_locked()

    def failed(self) -> dict[str, str]:
        """GPU uuid -> why, for the degraded GPUs that failed (an Xid, off the bus)."""
        with self._lock:
            return {key: why for key, (why, _) in self._failed.items()}

    def take_failures(self) -> list[GpuFailure]:
        """GPUs that failed since the last call, once per failure."""
        with self._lock:
            taken, self._new_failures = self._new_failures, []
        return taken

    def _fail(self, gpu_uuid: str, why: str, *, xid: int = 0, hold_seconds: float = 0.0) -> None:
        """Record that a GPU failed; a GPU already failed keeps its first reason and only
        has its hold extended."""
        until = time.monotonic() + hold_seconds
        with self._lock:
            known = gpu_uuid in self._failed
            if known:
                first_why, first_until = self._failed[gpu_uuid]
                why, until = first_why, max(first_until, until)
            self._failed[gpu_uuid] = (why, until)
            if not known:
                index = next((g.index for g in self._gpus if g.uuid == gpu_uuid), -1)
                self._new_failures.append(GpuFailure(gpu_uuid, index, why, xid))
        if not known:
            log.error("GPU %s failed: %s; its subjobs end and it takes no new work", gpu_uuid, why)

    def _note_lost(self, gpu_uuid: str, failure: NvmlCallFailed) -> None:
        """A call that finds the GPU lost means it fell off the bus: it failed."""
        if failure.code == self._nvml.NVML_ERROR_GPU_IS_LOST:
            self._fail(gpu_uuid, f"fell off the bus ({failure})")

    def _recover(self, answered: set[str]) -> None:
        """Failed GPUs that answered this poll and are past their hold take work again."""
        now = time.monotonic()
        with self._lock:
            back = {
                key: self._failed.pop(key)[0]
                for key in sorted(answered & self._failed.keys())
                if now >= self._failed[key][1]
            }
        for key, why in back.items():
            log.info("GPU %s recovered: NVML answers again (was: %s)", key, why)

    def _watch_events(self) -> None:
        """Register every GPU for Xid events and watch them on a thread of its own (a wait
        blocks by design, so it never occupies the call worker). A driver without events
        leaves only the calls to find a failed GPU."""
        xid_events = int(self._nvml.nvmlEventTypeXidCriticalError)
        try:
            event_set = self._call("nvmlEventSetCreate")
        except NvmlCallFailed as failure:
            log.warning("no NVML events on this host, Xids go unseen: %s", failure)
            return
        watched: list[int] = []
        for gpu in self._gpus:
            try:
                self._call(
                    "nvmlDeviceRegisterEvents", self._handles[gpu.uuid], xid_events, event_set
                )
            except (NvmlCallFailed, KeyError) as failure:
                log.warning("GPU %s reports no Xid events: %s", gpu.uuid, failure)
                continue
            watched.append(gpu.index)
        self._event_set = event_set
        self._events_thread = threading.Thread(
            target=self._wait_events, args=(event_set,), name="nvml-events", daemon=True
        )
        self._events_thread.start()
        log.info("watching Xid events of GPU(s) %s", ", ".join(map(str, watched)) or "none")

    def _wait_events(self, event_set: Any) -> None:
        nvml = self._nvml
        while not self._events_stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(event_set, EVENT_WAIT_MS)
            except nvml.NVMLError as exc:
                if int(exc.value) != nvml.NVML_ERROR_TIMEOUT:
                    log.warning("waiting for NVML events failed: %s", exc)
                    self._events_stop.wait(1.0)
                continue
            except Exception:  # the watcher must outlive one bad event
                log.exception("NVML event watcher")
                self._events_stop.wait(1.0)
                continue
            self._on_event(event)

    def _on_event(self, event: Any) -> None:
        if not int(event.eventType) & int(self._nvml.nvmlEventTypeXidCriticalError):
            return
        xid = int(event.eventData)
        with self._lock:
            gpu_uuid = next(
                (
                    self._parent[uuid]
                    for uuid, handle in self._handles.items()
                    if self._parent[uuid] == uuid and _same_device(handle, event.device)
                ),
                None,
            )
        if gpu_uuid is None:
            log.warning("Xid %d from a device this agent does not know", xid)
            return
        what = FATAL_XIDS.get(xid)
        if what is None:
            log.warning(
                "GPU %s reported Xid %d: the application's error, left to it", gpu_uuid, xid
            )
            return
        self._fail(
            gpu_uuid, f"Xid {xid}: {what}", xid=xid, hold_seconds=self._recover_after_seconds
        )

    def _mig_instances(self, handle: Any) -> tuple[bool, tuple[tuple[MigInstanceInfo, Any], ...]]:
        """Whether MIG is enabled, and the GPU's MIG instances; NOT_SUPPORTED, an empty slot
        (NOT_FOUND) and a hidden placement (NO_PERMISSION) are answers, any other failure
        propagates. A MIG-enabled GPU with no instance holds no work (CUDA cannot use it
        whole) until instances are created."""
        nvml = self._nvml
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", handle)
        except NvmlCallFailed as failure:
            if failure.code == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return False, ()  # MIG not supported on this GPU
            raise
        if current != self._nvml.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        result: list[tuple[MigInstanceInfo, Any]] = []
        for slot in range(self._call("nvmlDeviceGetMaxMigDeviceCount", handle)):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            except NvmlCallFailed as failure:
                if failure.code == self._nvml.NVML_ERROR_NOT_FOUND:
                    continue  # empty slot
                raise
            name = _text(self._call("nvmlDeviceGetName", mig))
            profile = name.rsplit("MIG ", 1)[-1].strip() if "MIG " in name else name
            start, size, gi_id = -1, 0, -1
            try:
                gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig))
                gi = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id)
                info = self._call("nvmlGpuInstanceGetInfo", gi)
                start, size = int(info.placement.start), int(info.placement.size)
            except NvmlCallFailed as failure:
                if failure.code not in (
                    nvml.NVML_ERROR_NO_PERMISSION,
                    nvml.NVML_ERROR_NOT_SUPPORTED,
                ):
                    raise
                # needs privileges on some drivers; placement stays unknown (-1)
            memory = self._call("nvmlDeviceGetMemoryInfo", mig)
            info_record = MigInstanceInfo(
                uuid=_text(self._call("nvmlDeviceGetUUID", mig)),
                profile=profile,
                memory_total_bytes=int(memory.total),
                start=start,
                size=size,
                gpu_instance_id=gi_id,
            )
            result.append((info_record, mig))
        return True, tuple(sorted(result, key=lambda pair: (pair[0].start, pair[0].uuid)))

    def _gi_profile_ids(self, handle: Any) -> dict[str, tuple[int, int]]:
        """MIG profile name -> (GPU-instance profile id, compute slices) as the driver
        names them (``nvmlDeviceGetGpuInstanceProfileInfo`` over every profile constant)."""
        nvml = self._nvml
        out: dict[str, tuple[int, int]] = {}
        for constant in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, constant)
            except NvmlCallFailed as failure:
                if failure.code in (
                    nvml.NVML_ERROR_NOT_SUPPORTED,
                    nvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    continue  # no such profile on this GPU
                raise
            name = _text(info.name).rsplit("MIG ", 1)[-1].strip()
            out.setdefault(name, (int(info.id), int(info.sliceCount)))
        return out

    def _destroy_gpu_instance(self, handle: Any, gi_id: int) -> bool:
        """Destroy GPU instance ``gi_id`` (its compute instances first); False if none."""
        nvml = self._nvml
        try:
            gi = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        except NvmlCallFailed as failure:
            if failure.code in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
                return False
            raise
        for ci_id in range(MAX_COMPUTE_INSTANCES):
            try:
                ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
            except NvmlCallFailed as failure:
                if failure.code in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            self._call("nvmlComputeInstanceDestroy", ci)
        self._call("nvmlGpuInstanceDestroy", gi)
        return True

    def apply_mig_layout(
        self, gpu_index: int, layout: Sequence[tuple[str, int, int]]
    ) -> tuple[MigInstanceInfo, ...]:
        """Give MIG GPU ``gpu_index`` the instances of ``layout`` ((profile, start, size)
        each) through NVML's GPU-instance calls and return them as read back. Only what
        changes is touched: instances not in ``layout`` are destroyed, new ones created at
        their placements, and those in both keep their GPU instance and UUID (and may run
        work meanwhile: NVIDIA creates and destroys GPU instances beside running ones).
        Refused for a GPU without MIG enabled (FailedPrecondition), and where NVML lists a
        process on an instance it would destroy (Unavailable: it may end); an NVML failure
        part way is Unavailable,
        and applying the layout again finishes it (leftover instances are swept)."""
        with self._lock:
            gpu = next((g for g in self._gpus if g.index == gpu_index), None)
            handles = dict(self._handles)
            parent = dict(self._parent)
        if gpu is None or not gpu.mig_enabled:
            raise FailedPrecondition(
                f"GPU {gpu_index} is not a MIG GPU", field="inventory.mig_on_demand"
            )
        place_profiles(gpu.model, [name for name, _, _ in layout])  # legal, or refused
        wanted = {(name, start) for name, start, _ in layout}
        current = {(m.profile, m.start) for m in gpu.mig_instances}
        if current == wanted and len(gpu.mig_instances) == len(layout):
            return gpu.mig_instances  # already so (a restart re-applying its journaled layout)
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", gpu_index)
            doomed = {m.uuid for m in gpu.mig_instances if (m.profile, m.start) not in wanted}
            for uuid, device in sorted(handles.items()):
                if (
                    uuid in doomed
                    and parent.get(uuid) == gpu.uuid
                    and self._call("nvmlDeviceGetComputeRunningProcesses", device)
                ):
                    raise Unavailable(
                        f"GPU {gpu_index} runs processes on {uuid}, which the new MIG layout "
                        "would destroy (retried at the next commit on it)"
                    )
            keep = {
                m.gpu_instance_id
                for m in gpu.mig_instances
                if (m.profile, m.start) in wanted and m.gpu_instance_id >= 0
            }
            kept = {(m.profile, m.start) for m in gpu.mig_instances if m.gpu_instance_id in keep}
            for gi_id in range(MAX_GPU_INSTANCE_ID + 1):
                if gi_id not in keep:
                    self._destroy_gpu_instance(handle, gi_id)
            profiles = self._gi_profile_ids(handle)
            for name, start, size in layout:
                if (name, start) in kept:
                    continue
                if name not in profiles:
                    raise FailedPrecondition(
                        f"GPU {gpu_index} has no MIG profile {name} (driver offers "
                        f"{', '.join(sorted(profiles)) or 'none'})",
                        field="inventory.mig_on_demand",
                    )
                profile_id, slices = profiles[name]
                placement = self._nvml.c_nvmlGpuInstancePlacement_t(start=start, size=size)
                gi = self._call(
                    "nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, placement
                )
                ci_profile = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gi,
                    COMPUTE_PROFILE_BY_SLICES[slices],
                    self._nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                self._call("nvmlGpuInstanceCreateComputeInstance", gi, int(ci_profile.id))
        except NvmlCallFailed as failure:
            self.refresh()
            raise Unavailable(
                f"MIG layout of GPU {gpu_index} not applied: {failure} (retried at the next "
                "commit on it)"
            ) from failure
        self.refresh()
        with self._lock:
            now = next((g for g in self._gpus if g.index == gpu_index), gpu)
        return now.mig_instances

    def _read_gpu(self, index: int) -> tuple[GpuInfo, dict[str, Any]]:
        """One GPU's record and the handles of its devices (itself and its MIG instances)."""
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        uuid = _text(self._call("nvmlDeviceGetUUID", handle))
        mig_enabled, instances = self._mig_instances(handle)
        handles = {uuid: handle, **{m.uuid: h for m, h in instances}}
        shared = not mig_enabled and (self._shared_indices is None or index in self._shared_indices)
        memory_total = int(self._call("nvmlDeviceGetMemoryInfo", handle).total)
        gpu = GpuInfo(
            index=index,
            uuid=uuid,
            model=canonical_model(_text(self._call("nvmlDeviceGetName", handle)), memory_total),
            memory_total_bytes=memory_total,
            mig_enabled=mig_enabled,
            mig_instances=tuple(m for m, _ in instances),
            shared=shared,
        )
        return gpu, handles

    def refresh(self) -> None:
        """Re-read the topology; a GPU whose read fails keeps its last record and is degraded.

        Raises Unavailable only when NVML cannot even count GPUs on the first read.
        """
        with self._lock:
            previous = {gpu.index: gpu for gpu in self._gpus}
            old_handles, old_parent = dict(self._handles), dict(self._parent)
        try:
            count = int(self._call("nvmlDeviceGetCount"))
        except NvmlCallFailed as failure:
            if not previous:
                raise Unavailable(f"NVML topology read failed: {failure}") from failure
            self._record_faults("topology", {g.uuid: str(failure) for g in previous.values()})
            return
        gpus: list[GpuInfo] = []
        handles: dict[str, Any] = {}
        parent: dict[str, str] = {}
        faults: dict[str, str] = {}
        for index in range(count):
            try:
                gpu, gpu_handles = self._read_gpu(index)
            except NvmlCallFailed as failure:
                old = previous.get(index)
                faults[old.uuid if old is not None else f"gpu{index}"] = str(failure)
                if old is None:
                    continue  # never read: nothing to offer until NVML answers
                gpu = old
                gpu_handles = {u: h for u, h in old_handles.items() if old_parent[u] == old.uuid}
            gpus.append(gpu)
            handles.update(gpu_handles)
            parent.update(dict.fromkeys(gpu_handles, gpu.uuid))
        with self._lock:
            self._gpus = tuple(gpus)
            self._handles = handles
            self._parent = parent
        self._record_faults("topology", faults)

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def _devices(self) -> tuple[list[tuple[str, str, Any]], frozenset[str]]:
        """(device uuid, GPU uuid, handle) for every device, and the uuids of MIG parents."""
        with self._lock:
            devices = [(u, self._parent[u], h) for u, h in self._handles.items()]
            mig_parents = frozenset(g.uuid for g in self._gpus if g.mig_enabled)
        return devices, mig_parents

    def _instance_gone(self, uuid: str, gpu_uuid: str, failure: NvmlCallFailed) -> bool:
        """Whether a call on device ``uuid`` failed NOT_FOUND because it is a MIG instance
        destroyed since the devices were listed (a layout change, ours or anyone's, between
        the listing and the call): the topology, read again, no longer holds it. That is no
        fault of its GPU, which was degraded for a poll and refused work after each
        repartition."""
        if uuid == gpu_uuid or failure.code != self._nvml.NVML_ERROR_NOT_FOUND:
            return False
        self.refresh()
        with self._lock:
            return uuid not in self._handles

    def memory_used(self) -> dict[str, tuple[int, int]]:
        """Readings of every device of every healthy GPU; a GPU with a failed read is left out."""
        devices, _ = self._devices()
        result: dict[str, tuple[int, int]] = {}
        faults: dict[str, str] = {}
        for uuid, gpu_uuid, handle in devices:
            if gpu_uuid in faults:
                continue  # one failed call per GPU per poll is enough to know
            try:
                memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            except NvmlCallFailed as failure:
                if self._instance_gone(uuid, gpu_uuid, failure):
                    continue
                faults[gpu_uuid] = str(failure)
                self._note_lost(gpu_uuid, failure)
                continue
            result[uuid] = (int(memory.used), int(memory.total))
        self._record_faults("memory", faults)
        parent = {uuid: gpu_uuid for uuid, gpu_uuid, _ in devices}
        self._recover({gpu_uuid for _, gpu_uuid, _ in devices} - faults.keys())
        return {u: r for u, r in result.items() if parent[u] not in faults}

    def process_memory(self) -> dict[str, dict[int, int]]:
        """Device uuid -> pid -> GPU memory bytes NVML attributes to that process.

        Whole GPUs and MIG instances are asked; a MIG parent is not (its instances hold
        its processes). A process NVML lists without a figure (``usedGpuMemory`` None, as
        under WDDM) is left out, as is every device of a GPU whose call failed.
        """
        devices, mig_parents = self._devices()
        result: dict[str, dict[int, int]] = {}
        faults: dict[str, str] = {}
        for uuid, gpu_uuid, handle in devices:
            if uuid in mig_parents or gpu_uuid in faults:
                continue
            try:
                processes = self._call("nvmlDeviceGetComputeRunningProcesses", handle)
            except NvmlCallFailed as failure:
                if self._instance_gone(uuid, gpu_uuid, failure):
                    continue
                faults[gpu_uuid] = str(failure)
                self._note_lost(gpu_uuid, failure)
                continue
            result[uuid] = {
                int(p.pid): int(p.usedGpuMemory) for p in processes if p.usedGpuMemory is not None
            }
        self._record_faults("processes", faults)
        parent = {uuid: gpu_uuid for uuid, gpu_uuid, _ in devices}
        return {u: pids for u, pids in result.items() if parent[u] not in faults}

    def driver_version(self) -> str:
        return self._driver_version

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._events_stop.set()
        if self._events_thread is not None:
            self._events_thread.join(2 * EVENT_WAIT_MS / 1000)
        if self._event_set is not None:
            try:
                self._call("nvmlEventSetFree", self._event_set)
            except NvmlCallFailed:
                pass  # the driver frees it at shutdown anyway
        try:
            self._call("nvmlShutdown")
        except NvmlCallFailed:
            pass  # already shut down (or hung); nothing more to release
        self._worker.shutdown(wait=False)
