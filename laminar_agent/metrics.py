"""Prometheus metrics of laminar-agent (``laminar_agent_*``, ``laminar_airlock_*``; base units,
bounded labels, injectable registry)."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib import metadata

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from laminar_agent.inventory.base import GpuInfo

# A `_created` series per counter and histogram doubles the series count and is read by
# nobody here; Prometheus' own created-timestamp handling does not need it.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


#: The labels dcgm-exporter puts on its per-GPU series, so Laminar's and DCGM's series join:
#: GPU index, GPU UUID, device file name, model, and for a MIG instance its profile and
#: GPU instance id (empty on a whole GPU). A MIG instance carries its GPU's index, UUID and
#: device, as in DCGM. ``modelName`` is Laminar's canonical name (``H100-80GB``), the one
#: jobs ask for, not NVML's raw name.
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID")
#: The label values of the host's row of a per-device metric (Airlock's host level).
HOST_LABEL_VALUES = ("", "", "host", "", "", "")


def gpu_label_values(gpus: Sequence[GpuInfo]) -> dict[str, tuple[str, ...]]:
    """Device uuid (each GPU and each MIG instance) -> its :data:`GPU_LABELS` values."""
    out: dict[str, tuple[str, ...]] = {}
    for gpu in gpus:
        base = (str(gpu.index), gpu.uuid, f"nvidia{gpu.index}", gpu.model)
        out[gpu.uuid] = (*base, "", "")
        for mig in gpu.mig_instances:
            gi_id = str(mig.gpu_instance_id) if mig.gpu_instance_id >= 0 else ""
            out[mig.uuid] = (*base, mig.profile, gi_id)
    return out


def laminar_version() -> str:
    try:
        return metadata.version("laminar")
    except metadata.PackageNotFoundError:
        return "unknown"


def add_build_info(registry: CollectorRegistry, subsystem: str) -> None:
    """``laminar_<subsystem>_build_info{version, python}`` = 1, to join dashboards on."""
    Gauge(
        f"laminar_{subsystem}_build_info",
        "Always 1; labels say which Laminar and Python this daemon runs",
        ["version", "python"],
        registry=registry,
    ).labels(laminar_version(), platform.python_version()).set(1)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        add_build_info(r, "agent")
        self.gpu_memory_used_bytes = Gauge(
            "laminar_agent_gpu_memory_used_bytes",
            "GPU memory in use per device (GPU or MIG instance), labelled as dcgm-exporter does",
            GPU_LABELS,
            registry=r,
        )
        self.gpu_memory_total_bytes = Gauge(
            "laminar_agent_gpu_memory_total_bytes",
            "GPU memory per device (GPU or MIG instance), labelled as dcgm-exporter does",
            GPU_LABELS,
            registry=r,
        )
        self.gpus_degraded = Gauge(
            "laminar_agent_gpus_degraded",
            "GPUs whose driver calls fail now: they take no new work until they answer",
            registry=r,
        )
        self.cuda_checkpoint_available = Gauge(
            "laminar_agent_cuda_checkpoint_available",
            "1 when NVIDIA's cuda-checkpoint was found at start: Airlock's suspend frees GPU "
            "memory on whole GPUs; 0: it asks for the release signal, then reclaims",
            registry=r,
        )
        self.allocated_ratio = Gauge(
            "laminar_agent_gpu_allocated_ratio",
            "Share of this host's GPU capacity committed to subjobs (0..1)",
            registry=r,
        )
        self.stranded_ratio = Gauge(
            "laminar_agent_gpu_stranded_ratio",
            "Share of this host's GPU capacity left free on partly used slices (0..1): "
            "capacity a whole-slice job cannot use, the fragmentation signal",
            registry=r,
        )
        self.draining = Gauge(
            "laminar_agent_draining", "1 while the agent accepts no new work", registry=r
        )
        self.rpc_seconds = Histogram(
            "laminar_agent_rpc_duration_seconds",
            "Server-side RPC handling time",
            ["method"],
            buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
            registry=r,
        )
        self.probes_total = Counter(
            "laminar_agent_probes_total", "Probes answered, by outcome", ["outcome"], registry=r
        )
        self.leases = Gauge("laminar_agent_leases", "Uncommitted leases held now", registry=r)
        self.subjobs = Gauge(
            "laminar_agent_subjobs", "Live subjobs by state", ["state"], registry=r
        )
        # -- Airlock ------------------------------------------------------------------
        self.airlock_actions_total = Counter(
            "laminar_airlock_actions_total",
            "Airlock actions by step (suspend, release_memory, resume, readdress, reclaim) and "
            "reason class (gpu_pressure, host_pressure, cleared, suspended_too_long, deadline, "
            "preempted); dry_run=true ones were recorded, not carried out",
            ["step", "reason", "dry_run"],
            registry=r,
        )
        self.airlock_level_seconds_total = Counter(
            "laminar_airlock_level_seconds_total",
            "Seconds spent in each pressure level, summed over the devices of a kind "
            "(whole_gpu, shared_gpu, mig, gpu for a MIG parent) or the host",
            ["kind", "level"],
            registry=r,
        )
        self.airlock_freed_bytes_total = Counter(
            "laminar_airlock_freed_bytes_total",
            "Memory freed by Airlock actions as counted when deciding them (gpu: device memory, "
            "host: resident memory, ledger: capacity freed for preemption)",
            ["resource"],
            registry=r,
        )
        self.airlock_work_lost_gpu_seconds_total = Counter(
            "laminar_airlock_work_lost_gpu_seconds_total",
            "Work since start thrown away by reclaims, preemptions and re-addressing, in "
            "GPU-seconds",
            ["reason"],
            registry=r,
        )
        self.airlock_cuda_checkpoint_toggles_total = Counter(
            "laminar_airlock_cuda_checkpoint_toggles_total",
            "cuda-checkpoint toggles of a suspended subjob's processes, by direction "
            "(checkpoint: to host memory on suspend, restore: back on resume) and outcome "
            "(ok, failed, already: the tool read it in that state and nothing was done)",
            ["direction", "outcome"],
            registry=r,
        )
        self.airlock_level = Gauge(
            "laminar_airlock_level",
            "Current pressure level per device (dcgm-exporter's labels) or the host (device='host'): "
            "1 normal, 2 elevated, 3 critical",
            GPU_LABELS,
            registry=r,
        )

    def record_airlock_action(
        self,
        step: str,
        reason: str,
        *,
        resource: str,
        bytes_freed: int,
        work_lost_gpu_seconds: float,
        dry_run: bool,
    ) -> None:
        """Count one journaled Airlock action; dry-run actions free nothing and lose nothing."""
        self.airlock_actions_total.labels(step, reason, "true" if dry_run else "false").inc()
        if dry_run:
            return
        if bytes_freed > 0:
            self.airlock_freed_bytes_total.labels(resource).inc(bytes_freed)
        if work_lost_gpu_seconds > 0:
            self.airlock_work_lost_gpu_seconds_total.labels(reason).inc(work_lost_gpu_seconds)
