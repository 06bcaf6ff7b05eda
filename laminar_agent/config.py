"""laminar-agent settings: frozen dataclasses grouped by concern, loaded by configlib."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from laminar_agent.core import EVENT_GAP_SECONDS
from laminar_airlock.levels import Marks
from laminar_airlock.policy import PolicyConfig
from laminar_base.configlib import check_message_bytes, doc, max_message_bytes_field
from laminar_base.errors import ConfigError
from laminar_base.settings import (
    ControlSettings,
    MetricsSettings,
    TlsSettings,
    validate_metrics,
    validate_security,
)

#: ``laminar_airlock.policy`` values: the ladder, or the OOM-killer baseline for comparisons.
AIRLOCK_POLICIES = ("ladder", "oom-killer")


def parse_uid_pool(text: str) -> range | None:
    """``executor.uid_pool`` ("FIRST-LAST", inclusive) as a range; None when empty."""
    if not text:
        return None
    first, sep, last = text.partition("-")
    try:
        pool = range(int(first), int(last) + 1) if sep else range(0)
    except ValueError:
        pool = range(0)
    if len(pool) == 0 or pool.start < 1000 or pool.stop > 2**31 - 1:
        raise ConfigError(
            f"must be FIRST-LAST with 1000 <= FIRST <= LAST < 2^31, got {text!r}",
            field="executor.uid_pool",
        )
    return pool


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
    debug_rpcs: bool = field(
        default=False,
        metadata=doc(
            "serve debug and fault-injection calls (InjectLoad) on a real GPU backend; "
            "the fake backend always serves them"
        ),
    )
    max_message_bytes: int = max_message_bytes_field()


@dataclass(frozen=True)
class ExecutorSettings:
    run_as_user: str = field(
        default="nobody",
        metadata=doc(
            "user (name or uid) subjob commands run as when the agent runs as root, with that "
            "user's group and supplementary groups; empty = as the agent itself. An agent that "
            "is not root always runs subjobs as itself. With uid_pool or tenant_users set, "
            "only tenants they do not cover run as this user"
        ),
    )
    uid_pool: str = field(
        default="3000000-3009999",
        metadata=doc(
            "uids FIRST-LAST given out one per tenant (kept for good, journaled) so that "
            "tenants cannot signal or read each other's subjobs; uids this host's passwd "
            "knows are skipped; empty = every tenant runs as run_as_user"
        ),
    )
    tenant_users: str = field(
        default="",
        metadata=doc(
            "tenants that run as an account of this host, 'tenant=user,tenant2=uid' (for "
            "shared file systems); these win over uid_pool"
        ),
    )
    cgroup_root: str = field(
        default="auto",
        metadata=doc(
            "where each subjob gets its own cgroup (v2): 'auto' = under the agent's own "
            "cgroup (systemd Delegate=yes), a path, or empty for process groups only"
        ),
    )


@dataclass(frozen=True)
class InventorySettings:
    gpu_backend: str = field(default="nvml", metadata=doc("GPU backend: nvml or fake"))
    nvml_mock: str = field(
        default="",
        metadata=doc(
            "JSON scenario of a mocked NVML the nvml backend runs on instead of the driver "
            "(tests and demos); empty = the real driver"
        ),
    )
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
    host_cpu_milli: int = field(
        default=0,
        metadata=doc(
            "host CPU the agent offers to subjobs, in milli-cores (0: every CPU of the "
            "machine); less keeps some for the system"
        ),
    )
    host_memory_bytes: int = field(
        default=0,
        metadata=doc(
            "host memory the agent offers to subjobs (0: all physical memory)", unit="bytes"
        ),
    )
    mig_on_demand: bool = field(
        default=False,
        metadata=doc(
            "give a MIG GPU a new layout when no free instance fits a probe (never destroying "
            "an instance in use; see mig_carve_busy); the nvml backend creates GPU instances "
            "through NVML, which needs root"
        ),
    )
    mig_carve_busy: bool = field(
        default=True,
        metadata=doc(
            "with mig_on_demand: a MIG GPU that runs something may still change its idle part "
            "(destroy instances that hold no lease and run nothing, create the asked profile at "
            "a free legal placement; instances in use are never touched); false: only a GPU "
            "that runs nothing is repartitioned"
        ),
    )
    cuda_checkpoint: str = field(
        default="",
        metadata=doc(
            "NVIDIA cuda-checkpoint binary that lets Airlock's suspend free GPU memory (nvml "
            "backend, whole GPUs): a path, empty = cuda-checkpoint on the agent's PATH, "
            "'off' = never"
        ),
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
    max_windows: int = field(
        default=16,
        metadata=doc("most time x capacity windows advertised per heartbeat (atomization)"),
    )
    heartbeat_event_gap_seconds: float = field(
        default=EVENT_GAP_SECONDS,
        metadata=doc(
            "least time between two heartbeats that subjob events woke, so a burst's events "
            "share one; the first event after a quieter spell goes at once",
            unit="seconds",
        ),
    )


@dataclass(frozen=True)
class AirlockSettings:
    """Airlock, the runtime-survival ladder; see docs/agent.md "Airlock" for the rungs."""

    poll_seconds: float = field(
        default=0.1,
        metadata=doc("how often memory signals are read and the ladder runs", unit="seconds"),
    )
    elevated_ratio: float = field(
        default=0.85, metadata=doc("a slice enters ELEVATED at this used/total fraction [ratio]")
    )
    critical_ratio: float = field(
        default=0.95, metadata=doc("a slice enters CRITICAL at this used/total fraction [ratio]")
    )
    clear_ratio: float = field(
        default=0.80,
        metadata=doc(
            "a slice leaves ELEVATED only below this fraction (CRITICAL: below elevated_ratio), "
            "held for hold_seconds [ratio]"
        ),
    )
    elevated_bytes: int | None = field(
        default=None,
        metadata=doc(
            "also enter ELEVATED once this much is used (whichever mark comes first); "
            "empty = ratio only",
            unit="bytes",
        ),
    )
    critical_bytes: int | None = field(
        default=None,
        metadata=doc(
            "also enter CRITICAL once this much is used; empty = ratio only", unit="bytes"
        ),
    )
    clear_bytes: int | None = field(
        default=None,
        metadata=doc(
            "also require used below this to leave ELEVATED; empty = ratio only", unit="bytes"
        ),
    )
    hold_seconds: float = field(
        default=1.0,
        metadata=doc(
            "a level falls only after the signal stayed below the lower mark this long",
            unit="seconds",
        ),
    )
    target_ratio: float = field(
        default=0.80,
        metadata=doc(
            "relief takes victims until projected use is at or below this fraction [ratio]"
        ),
    )
    resume_ratio: float = field(
        default=PolicyConfig.resume_ratio,
        metadata=doc(
            "a suspended subjob resumes only if its slice stays at or below this; keep it "
            "below elevated_ratio [ratio]"
        ),
    )
    predict_seconds: float = field(
        default=PolicyConfig.predict_seconds,
        metadata=doc(
            "at the elevated mark, act only where the memory trend reaches the critical mark "
            "within this long (and then only with stops that lose no work)",
            unit="seconds",
        ),
    )
    loss_wait_ratio: float = field(
        default=PolicyConfig.loss_wait_ratio,
        metadata=doc(
            "a suspended subjob is moved or reclaimed only after waiting this many times the "
            "work a restart would lose [ratio]"
        ),
    )
    dry_run: bool = field(
        default=False,
        metadata=doc(
            "record decisions (journaled with dry_run=true, visible in GetAirlock) without acting"
        ),
    )
    readdress_after_seconds: float = field(
        default=30.0,
        metadata=doc(
            "a restartable subjob suspended this long is handed to the zone to be re-placed",
            unit="seconds",
        ),
    )
    max_readdress: int = field(
        default=2, metadata=doc("most times one job's subjob is re-placed elsewhere [count]")
    )
    release_wait_seconds: float = field(
        default=2.0,
        metadata=doc(
            "a subjob asked to release memory (it declared support) that still holds it after "
            "this long is reclaimed; it is asked once per pressure episode",
            unit="seconds",
        ),
    )
    policy: str = field(
        default="ladder",
        metadata=doc(
            "ladder (Airlock) or oom-killer: the baseline that kills the largest process once a "
            "GPU is full, for comparisons (`laminar bench airlock`); never for production"
        ),
    )
    readdress_deadline_seconds: float = field(
        default=120.0,
        metadata=doc(
            "a subjob still suspended this long after its suspension is reclaimed", unit="seconds"
        ),
    )
    reclaim_grace_seconds: float = field(
        default=5.0,
        metadata=doc(
            "SIGTERM-to-SIGKILL grace for subjobs Airlock reclaims or preempts", unit="seconds"
        ),
    )
    host_elevated_ratio: float = field(
        default=0.90, metadata=doc("the host enters ELEVATED at this used/total memory [ratio]")
    )
    host_critical_ratio: float = field(
        default=0.97, metadata=doc("the host enters CRITICAL at this used/total memory [ratio]")
    )
    host_clear_ratio: float = field(
        default=0.85, metadata=doc("the host leaves ELEVATED only below this fraction [ratio]")
    )
    host_target_ratio: float = field(
        default=0.85,
        metadata=doc(
            "host relief reclaims victims until projected use is at or below this [ratio]"
        ),
    )
    host_psi_elevated_percent: float = field(
        default=20.0,
        metadata=doc(
            "PSI memory 'some avg10' at or above this keeps the host ELEVATED (no resumes); "
            "0 = ignore PSI [percent]"
        ),
    )

    def slice_marks(self) -> Marks:
        """Hysteresis marks for every GPU and MIG instance."""
        return Marks(
            elevated_ratio=self.elevated_ratio,
            critical_ratio=self.critical_ratio,
            clear_ratio=self.clear_ratio,
            hold_seconds=self.hold_seconds,
            elevated_bytes=self.elevated_bytes,
            critical_bytes=self.critical_bytes,
            clear_bytes=self.clear_bytes,
        )

    def host_marks(self) -> Marks:
        """Hysteresis marks for host memory (psutil used = total - available)."""
        return Marks(
            elevated_ratio=self.host_elevated_ratio,
            critical_ratio=self.host_critical_ratio,
            clear_ratio=self.host_clear_ratio,
            hold_seconds=self.hold_seconds,
        )

    def policy_config(self) -> PolicyConfig:
        """The pure ladder's configuration."""
        return PolicyConfig(
            target_ratio=self.target_ratio,
            resume_ratio=self.resume_ratio,
            readdress_after_seconds=self.readdress_after_seconds,
            max_readdress=self.max_readdress,
            reclaim_after_seconds=self.readdress_deadline_seconds,
            dry_run=self.dry_run,
            host_target_ratio=self.host_target_ratio,
            release_wait_seconds=self.release_wait_seconds,
            predict_seconds=self.predict_seconds,
            loss_wait_ratio=self.loss_wait_ratio,
        )


@dataclass(frozen=True)
class AgentConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    inventory: InventorySettings = field(default_factory=InventorySettings)
    zone: ZoneSettings = field(default_factory=ZoneSettings)
    arbitration: ArbitrationSettings = field(default_factory=ArbitrationSettings)
    airlock: AirlockSettings = field(default_factory=AirlockSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)

    def validate(self) -> None:
        if self.inventory.gpu_backend not in ("nvml", "fake"):
            raise ConfigError(
                f"must be 'nvml' or 'fake', got {self.inventory.gpu_backend!r}",
                field="inventory.gpu_backend",
            )
        if self.inventory.nvml_mock and self.inventory.gpu_backend != "nvml":
            raise ConfigError(
                "a mocked NVML needs inventory.gpu_backend = nvml", field="inventory.nvml_mock"
            )
        for name, amount in (
            ("inventory.host_cpu_milli", self.inventory.host_cpu_milli),
            ("inventory.host_memory_bytes", self.inventory.host_memory_bytes),
        ):
            if not 0 <= amount < 2**62:
                raise ConfigError(f"must be >= 0 (0: the whole machine), got {amount}", field=name)
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
        if not 0 <= self.zone.heartbeat_event_gap_seconds <= 1:
            raise ConfigError("must be in 0..1 s", field="zone.heartbeat_event_gap_seconds")
        if not 0 <= self.zone.max_windows <= 1024:
            raise ConfigError("must be in 0..1024", field="zone.max_windows")
        _validate_airlock(self.airlock)
        validate_security(self.tls, self.control)
        validate_metrics(self.metrics, self.tls)
        check_message_bytes(self.server.max_message_bytes, "server.max_message_bytes")
        if len(self.executor.run_as_user) > 64 or "\x00" in self.executor.run_as_user:
            raise ConfigError("must be a user name or uid", field="executor.run_as_user")
        parse_uid_pool(self.executor.uid_pool)

    def replace_server(self, **changes: object) -> AgentConfig:
        return dataclasses.replace(self, server=dataclasses.replace(self.server, **changes))  # type: ignore[arg-type]


def _ratio(a: AirlockSettings, name: str) -> None:
    value = float(getattr(a, name))
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"must be in (0, 1], got {value}", field=f"airlock.{name}")


def _validate_airlock(a: AirlockSettings) -> None:
    """Every bad airlock value raises one ConfigError naming its key."""
    if not 0.001 <= a.poll_seconds <= 60:
        raise ConfigError(
            f"must be between 1 ms and 60 s, got {a.poll_seconds}", field="airlock.poll_seconds"
        )
    for name in (
        "elevated_ratio",
        "critical_ratio",
        "clear_ratio",
        "target_ratio",
        "resume_ratio",
        "host_elevated_ratio",
        "host_critical_ratio",
        "host_clear_ratio",
        "host_target_ratio",
    ):
        _ratio(a, name)
    for prefix in ("", "host_"):
        clear = getattr(a, f"{prefix}clear_ratio")
        elevated = getattr(a, f"{prefix}elevated_ratio")
        critical = getattr(a, f"{prefix}critical_ratio")
        if clear > elevated:
            raise ConfigError(
                f"must be <= {prefix}elevated_ratio ({elevated}), got {clear}",
                field=f"airlock.{prefix}clear_ratio",
            )
        if elevated > critical:
            raise ConfigError(
                f"must be <= {prefix}critical_ratio ({critical}), got {elevated}",
                field=f"airlock.{prefix}elevated_ratio",
            )
    for name in ("elevated_bytes", "critical_bytes", "clear_bytes"):
        value = getattr(a, name)
        if value is not None and value <= 0:
            raise ConfigError(f"must be > 0 bytes, got {value}", field=f"airlock.{name}")
    if (
        a.clear_bytes is not None
        and a.elevated_bytes is not None
        and a.clear_bytes > a.elevated_bytes
    ):
        raise ConfigError("must be <= airlock.elevated_bytes", field="airlock.clear_bytes")
    if (
        a.elevated_bytes is not None
        and a.critical_bytes is not None
        and a.elevated_bytes > a.critical_bytes
    ):
        raise ConfigError("must be <= airlock.critical_bytes", field="airlock.elevated_bytes")
    if not 0 <= a.loss_wait_ratio <= 1000:
        raise ConfigError(
            f"must be between 0 and 1000, got {a.loss_wait_ratio}", field="airlock.loss_wait_ratio"
        )
    if a.policy not in AIRLOCK_POLICIES:
        raise ConfigError(
            f"must be one of {', '.join(AIRLOCK_POLICIES)}, got {a.policy!r}",
            field="laminar_airlock.policy",
        )
    for name in (
        "hold_seconds",
        "readdress_after_seconds",
        "readdress_deadline_seconds",
        "reclaim_grace_seconds",
        "release_wait_seconds",
        "predict_seconds",
    ):
        value = getattr(a, name)
        if not 0 <= value <= 7 * 86400:
            raise ConfigError(
                f"must be between 0 s and 7 days, got {value}", field=f"airlock.{name}"
            )
    if a.readdress_deadline_seconds < a.readdress_after_seconds:
        raise ConfigError(
            f"must be >= airlock.readdress_after_seconds ({a.readdress_after_seconds} s), "
            f"got {a.readdress_deadline_seconds}",
            field="airlock.readdress_deadline_seconds",
        )
    if not 0 <= a.max_readdress <= 100:
        raise ConfigError(f"must be 0..100, got {a.max_readdress}", field="airlock.max_readdress")
    if not 0 <= a.host_psi_elevated_percent <= 100:
        raise ConfigError(
            f"must be 0..100, got {a.host_psi_elevated_percent}",
            field="airlock.host_psi_elevated_percent",
        )


def _is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)
