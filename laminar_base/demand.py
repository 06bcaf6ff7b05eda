"""What one gang member asks for: the one demand type of router, agent and simulator.

Plain values only; :mod:`laminar_base.wire` reads one from a ``Resources`` message."""

from __future__ import annotations

from dataclasses import dataclass

from laminar_base.errors import InvalidArgument

MILLI_PER_GPU = 1000
MIG_COMPUTE_SLICES = 7


@dataclass(frozen=True)
class Demand:
    """One gang member's needs (``laminar.v1.Resources``): router, agent and simulator alike.

    At most one GPU shape is set: whole GPUs, a MIG profile or a milli share."""

    gpus: int = 0
    mig_profile: str = ""
    gpu_milli: int = 0
    gpu_memory_bytes: int = 0
    gpu_model: str = ""

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
