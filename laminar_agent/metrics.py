"""Prometheus metrics of laminar-agent (``laminar_agent_*``, base units, injectable registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.gpu_memory_used_bytes = Gauge(
            "laminar_agent_gpu_memory_used_bytes",
            "GPU memory in use per device (GPU or MIG instance)",
            ["device"],
            registry=r,
        )
        self.gpu_memory_total_bytes = Gauge(
            "laminar_agent_gpu_memory_total_bytes",
            "GPU memory per device (GPU or MIG instance)",
            ["device"],
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
