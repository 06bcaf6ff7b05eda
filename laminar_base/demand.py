"""What one gang member asks for: the one demand type of router, agent and simulator.

Plain values only; :mod:`laminar_base.wire` reads one from a ``Resources`` message."""

from __future__ import annotations

from dataclasses import dataclass

from laminar_base.errors import InvalidArgument

MILLI_PER_GPU = 1000
MIG_COMPUTE_SLICES = 7
#: Most host CPU one member may ask for, in milli-cores (1024 cores).
MAX_CPU_MILLI = 1024 * 1000
#: Most host memory one member may ask for (64 TiB).
MAX_HOST_MEMORY_BYTES = 64 * 1024**4


@dataclass(frozen=True)
class Demand:
    """One gang member's needs (``laminar.v1.Resources``): router, agent and simulator alike.

    At most one GPU shape is set: whole GPUs, a MIG profile or a milli share. Host CPU
    (``cpu_milli``) and host memory (``host_memory_bytes``) are capacity like GPUs: 0 means
    "not given", and the host then reserves the default :func:`host_share` works out."""

    gpus: int = 0
    mig_profile: str = ""
    gpu_milli: int = 0
    gpu_memory_bytes: int = 0
    gpu_model: str = ""
    cpu_milli: int = 0
    host_memory_bytes: int = 0

    @property
    def family(self) -> str:
        """Jobs of one family compete for the same physical slices (queue blocking, backfill)."""
        if self.mig_profile:
            return f"mig:{self.mig_profile}"
        if self.gpus or self.gpu_milli:
            return "gpu"
        return "cpu"

    @property
    def gpu_units(self) -> float:
        """GPU-equivalents: the currency of quotas and fair share."""
        if self.mig_profile:
            head = self.mig_profile.split("g.", 1)[0]
            compute = int(head) if head.isdigit() else MIG_COMPUTE_SLICES
            return compute / MIG_COMPUTE_SLICES
        if self.gpu_milli:
            return self.gpu_milli / MILLI_PER_GPU
        return float(self.gpus)

    @property
    def memory_bytes(self) -> int:
        """Declared GPU memory across the member's slices."""
        return self.gpu_memory_bytes * max(1, self.gpus)

    def label(self) -> str:
        """Human words for the shape, used in waiting explanations."""
        model = f" {self.gpu_model}" if self.gpu_model else ""
        if self.mig_profile:
            return f"{self.mig_profile} slice"
        if self.gpu_milli:
            return f"{self.gpu_milli}-milli share of a{model} GPU"
        if self.gpus == 1:
            return f"whole{model} GPU"
        if self.gpus > 1:
            return f"{self.gpus} whole{model} GPUs on one host"
        return "CPU-only slot"


@dataclass(frozen=True)
class HostCap:
    """A host's CPU, memory and per-GPU free share as its agent reports them
    (``laminar.v1.AgentSummary``): what the router filters and ranks candidates on.

    A total of 0 means the agent does not arbitrate that resource (it never bounces on
    it). ``gpu_free_milli`` lists the whole or shared GPUs (not MIG) in index order."""

    cpu_free_milli: int = 0
    cpu_total_milli: int = 0
    memory_free_bytes: int = 0
    memory_total_bytes: int = 0
    gpu_free_milli: tuple[int, ...] = ()
    gpus_total: int = 0

    def fits(self, demand: Demand) -> bool:
        """Whether one member of ``demand`` finds the host CPU and memory it reserves."""
        cpu, memory = host_share(
            demand, self.cpu_total_milli, self.memory_total_bytes, self.gpus_total
        )
        return (self.cpu_total_milli == 0 or cpu <= self.cpu_free_milli) and (
            self.memory_total_bytes == 0 or memory <= self.memory_free_bytes
        )


def host_share(
    demand: Demand, cpu_total_milli: int, memory_total_bytes: int, gpus_total: int
) -> tuple[int, int]:
    """The host CPU (milli-cores) and memory (bytes) one member of ``demand`` reserves on a
    host with these totals.

    What the demand asks for, when it asks; otherwise the host's CPU and memory in
    proportion to the GPU share it takes (``gpu_units / gpus_total`` of each, rounded
    down), so a job asking for half of a host's GPUs gets half its CPU and memory. A
    CPU-only demand that asks for nothing reserves nothing, and so does every demand on a
    host with no GPUs: the default is a share of the GPUs, and there are none to share.
    """
    cpu, memory = demand.cpu_milli, demand.host_memory_bytes
    if gpus_total > 0 and (cpu == 0 or memory == 0):
        ratio = min(1.0, demand.gpu_units / gpus_total)
        cpu = cpu or int(cpu_total_milli * ratio)
        memory = memory or int(memory_total_bytes * ratio)
    return cpu, memory


def validate_demand(demand: Demand) -> None:
    """Reject nonsense demands with InvalidArgument naming the field."""
    if demand.gpus < 0:
        raise InvalidArgument(f"must be >= 0, got {demand.gpus}", field="resources.gpus")
    if demand.gpu_milli < 0 or demand.gpu_milli > MILLI_PER_GPU:
        raise InvalidArgument(
            f"must be in 0..{MILLI_PER_GPU}, got {demand.gpu_milli}", field="resources.gpu_milli"
        )
    if demand.gpu_memory_bytes < 0:
        raise InvalidArgument(
            f"must be >= 0, got {demand.gpu_memory_bytes}", field="resources.gpu_memory_bytes"
        )
    if not 0 <= demand.cpu_milli <= MAX_CPU_MILLI:
        raise InvalidArgument(
            f"must be in 0..{MAX_CPU_MILLI}, got {demand.cpu_milli}", field="resources.cpu_milli"
        )
    if not 0 <= demand.host_memory_bytes <= MAX_HOST_MEMORY_BYTES:
        raise InvalidArgument(
            f"must be in 0..{MAX_HOST_MEMORY_BYTES}, got {demand.host_memory_bytes}",
            field="resources.host_memory_bytes",
        )
    if demand.gpus > 0 and demand.mig_profile:
        raise InvalidArgument("cannot be combined with gpus", field="resources.mig_profile")
    if demand.gpus > 0 and demand.gpu_milli > 0:
        raise InvalidArgument("cannot be combined with gpus", field="resources.gpu_milli")
    if demand.mig_profile and demand.gpu_milli > 0:
        raise InvalidArgument("cannot be combined with mig_profile", field="resources.gpu_milli")
    if _is_cpu_only(demand) and demand.gpu_memory_bytes > 0:
        raise InvalidArgument(
            "needs gpus, mig_profile or gpu_milli", field="resources.gpu_memory_bytes"
        )


def _is_cpu_only(demand: Demand) -> bool:
    return demand.gpus == 0 and not demand.mig_profile and demand.gpu_milli == 0
