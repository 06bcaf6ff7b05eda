"""laminar-agent settings: frozen dataclasses grouped by concern, loaded by configlib."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from laminar_agent.configlib import doc
from laminar_agent.errors import ConfigError


@dataclass(frozen=True)
class ServerSettings:
    listen: str = field(
        default="127.0.0.1:7401", metadata=doc("gRPC address HOST:PORT (port 0 picks one)")
    )
    metrics_listen: str = field(
        default="", metadata=doc("Prometheus HTTP address HOST:PORT; empty disables it")
    )
    agent_id: str = field(default="", metadata=doc("agent identity; empty = the hostname"))
    state_dir: str = field(
        default="/var/lib/laminar-agent", metadata=doc("journal and subjob files")
    )
    grace_seconds: float = field(
        default=5.0, metadata=doc("shutdown grace for in-flight RPCs", unit="seconds")
    )


@dataclass(frozen=True)
class InventorySettings:
    gpu_backend: str = field(default="nvml", metadata=doc("GPU backend: nvml or fake"))
    fake_gpus: str = field(
        default="4xH100-80GB",
        metadata=doc("fake backend spec, e.g. 'H100-80GB:mig=3g.40gb,A100-40GB'"),
    )
    shared_gpus: str = field(
        default="", metadata=doc("non-MIG GPUs open to fractional sharing: 'all' or indices '0,1'")
    )
    refresh_seconds: float = field(
        default=30.0, metadata=doc("how often the GPU topology is re-read", unit="seconds")
    )


@dataclass(frozen=True)
class ArbitrationSettings:
    batch_seconds: float = field(
        default=0.001,
        metadata=doc("probes arriving within this window are settled as one batch", unit="seconds"),
    )
    lease_ttl_seconds: float = field(
        default=0.2, metadata=doc("lease TTL when a probe does not ask for one", unit="seconds")
    )


@dataclass(frozen=True)
class ZoneSettings:
    zone: str = field(default="", metadata=doc("zone router HOST:PORT; empty = standalone"))
    heartbeat_seconds: float = field(
        default=1.0, metadata=doc("heartbeat period to the zone router", unit="seconds")
    )


@dataclass(frozen=True)
class AgentConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    inventory: InventorySettings = field(default_factory=InventorySettings)
    zone: ZoneSettings = field(default_factory=ZoneSettings)
    arbitration: ArbitrationSettings = field(default_factory=ArbitrationSettings)

    def validate(self) -> None:
        if self.inventory.gpu_backend not in ("nvml", "fake"):
            raise ConfigError(
                f"must be 'nvml' or 'fake', got {self.inventory.gpu_backend!r}",
                field="inventory.gpu_backend",
            )
        for key, value in (("server.listen", self.server.listen), ("zone.zone", self.zone.zone)):
            if value and not _is_host_port(value):
                raise ConfigError(f"expected HOST:PORT, got {value!r}", field=key)
        if self.server.metrics_listen and not _is_host_port(self.server.metrics_listen):
            raise ConfigError(
                f"expected HOST:PORT, got {self.server.metrics_listen!r}",
                field="server.metrics_listen",
            )
        if not 0 <= self.arbitration.batch_seconds <= 1:
            raise ConfigError("must be between 0 and 1 s", field="arbitration.batch_seconds")
        if not 0 < self.arbitration.lease_ttl_seconds <= 60:
            raise ConfigError("must be in (0, 60] s", field="arbitration.lease_ttl_seconds")
        if self.zone.heartbeat_seconds <= 0:
            raise ConfigError("must be > 0", field="zone.heartbeat_seconds")

    def replace_server(self, **changes: object) -> AgentConfig:
        return dataclasses.replace(self, server=dataclasses.replace(self.server, **changes))  # type: ignore[arg-type]


def _is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)
