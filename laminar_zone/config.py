"""laminar-zone settings: frozen dataclasses grouped by concern, loaded by the shared configlib."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from laminar_base.configlib import check_message_bytes, doc, max_message_bytes_field
from laminar_base.errors import ConfigError, InvalidArgument
from laminar_base.fragmentation import MIN_OBSERVED, PodShape, workload_from_rows
from laminar_base.settings import (
    ControlSettings,
    MetricsSettings,
    TlsSettings,
    require_readable_file,
    validate_metrics,
    validate_security,
)
from laminar_base.units import parse_size
from laminar_zone.market import DEFAULT_POLICY, POLICIES
from laminar_zone.view import SAMPLE_SIZE, ProbeLimits


@dataclass(frozen=True)
class ServerSettings:
    listen: str = field(
        default="127.0.0.1:7400", metadata=doc("gRPC address HOST:PORT (port 0 picks one)")
    )
    metrics_listen: str = field(
        default="", metadata=doc("Prometheus HTTP address HOST:PORT; empty disables it")
    )
    zone_name: str = field(default="zone-a", metadata=doc("this zone's name"))
    state_dir: str = field(
        default="/var/lib/laminar-zone", metadata=doc("journal (jobs, queue) and zone.json")
    )
    grace_seconds: float = field(
        default=5.0, metadata=doc("shutdown grace for in-flight RPCs", unit="seconds")
    )
    max_message_bytes: int = max_message_bytes_field()


#: How much slower an agent's clock may run than the router's over one fence lease.
FENCE_CLOCK_MARGIN_RATIO = 0.05
#: After the fence deadline: the shim notices within 0.5 s, gives SIGTERM at most 1 s
#: before SIGKILL, and the kill and reap take well under the remaining 0.5 s.
FENCE_STOP_SECONDS = 2.0


@dataclass(frozen=True)
class MembershipSettings:
    heartbeat_seconds: float = field(
        default=1.0, metadata=doc("heartbeat period the router asks agents for", unit="seconds")
    )
    stale_after_periods: float = field(
        default=3.0, metadata=doc("an agent silent this many periods gets no probes")
    )
    lost_after_seconds: float = field(
        default=30.0,
        metadata=doc(
            "an agent silent this long has its running subjobs declared lost; its fence "
            "(lost_after / 1.05 - 2 s) stops them first, so a retry never overlaps them",
            unit="seconds",
        ),
    )
    fence: bool = field(
        default=True,
        metadata=doc(
            "fence agents: their subjobs stop when the agent loses touch with this router "
            "for longer than the fence lease (off: a LOST subjob may still be running)"
        ),
    )
    stream: bool = field(
        default=True,
        metadata=doc(
            "serve the Heartbeats stream: an agent sends only changes plus a liveness "
            "message, and is stale as soon as its stream ends (off: agents fall back to "
            "one Heartbeat call per period)"
        ),
    )
    stream_liveness_seconds: float = field(
        default=12.0,
        metadata=doc(
            "on the stream, the longest an agent with nothing new stays silent; it is "
            "stale after this plus stale_after_periods - 1 periods of silence (at most "
            "half the fence lease is used; 1 period gives the unary bound)",
            unit="seconds",
        ),
    )

    def fence_lease_seconds(self) -> float:
        """How long an agent's subjobs may run on after the last heartbeat this router
        acknowledged: lost_after less a clock-rate margin (the agent's clock may run
        FENCE_CLOCK_MARGIN_RATIO slower than ours) and the time the shim needs to notice
        and stop a subjob (poll, SIGTERM, SIGKILL). 0 with fencing off."""
        if not self.fence:
            return 0.0
        return self.lost_after_seconds / (1 + FENCE_CLOCK_MARGIN_RATIO) - FENCE_STOP_SECONDS

    def stale_after_seconds(self) -> float:
        """Silence after which an agent gets no probes (its stream aside)."""
        return self.heartbeat_seconds * self.stale_after_periods

    def liveness_seconds(self) -> float:
        """The liveness period streaming agents are told: stream_liveness_seconds, but never
        less than a period nor more than half the fence lease, so that a liveness message
        that fails leaves the agent half a lease to get through again (it opens a new
        stream a period later and speaks at once)."""
        liveness = max(self.stream_liveness_seconds, self.heartbeat_seconds)
        lease = self.fence_lease_seconds()
        return min(liveness, lease / 2) if lease > 0 else liveness


@dataclass(frozen=True)
class PlacementSettings:
    probes_per_attempt: int = field(
        default=1,
        metadata=doc(
            "d: agents probed in parallel per attempt; 1: a one-member job's probe carries "
            "the commit (one call per placement; gangs probe 2 per attempt)"
        ),
    )
    sample_size: int = field(
        default=SAMPLE_SIZE,
        metadata=doc("candidates drawn from the view and ranked per generation (>= d)"),
    )
    max_attempts: int = field(default=4, metadata=doc("probe rounds per job before it queues"))
    regenerations: int = field(
        default=2, metadata=doc("times the candidate set is redrawn within one budget")
    )
    budget_seconds: float = field(
        default=2.0, metadata=doc("time budget of one placement try", unit="seconds")
    )
    lease_ttl_seconds: float = field(
        default=5.0,
        metadata=doc(
            "TTL the router asks for on each lease (unused leases are released at once; "
            "the TTL only matters if the router dies, and must outlast a busy agent's commit)",
            unit="seconds",
        ),
    )
    rpc_timeout_seconds: float = field(
        default=5.0, metadata=doc("deadline of one Probe/Commit/Release call", unit="seconds")
    )
    concurrency: int = field(default=128, metadata=doc("placements in flight at once"))
    workload_prior_file: str = field(
        default="",
        metadata=doc(
            "JSON list of task shapes with counts ({cpu_milli, num_gpu, gpu_milli, "
            "gpu_models, count}, as a router observes them) that the target workload "
            "ranking measures fragmentation against starts from; empty: learned from "
            "arrivals alone (and kept in the journal across restarts)"
        ),
    )
    workload_min_observed: int = field(
        default=MIN_OBSERVED,
        metadata=doc(
            "tasks the router observes (a prior counts) before it ranks tasks of one GPU or "
            "none by the learned target workload (until then: first fit in its host order); "
            "tasks of several GPUs, and agents, use the target from the first; 0: no wait"
        ),
    )

    def limits(self) -> ProbeLimits:
        """The probing budget the pure :class:`~laminar_zone.view.ProbePlan` follows."""
        return ProbeLimits(
            probes_per_attempt=self.probes_per_attempt,
            sample_size=self.sample_size,
            max_attempts=self.max_attempts,
            regenerations=self.regenerations,
        )


@dataclass(frozen=True)
class AuthSettings:
    tokens_file: str = field(
        default="",
        metadata=doc(
            "TOML file of per-tenant bearer tokens, stored as sha256 hashes; reread on SIGHUP. "
            "Empty: submitters are not authenticated (the router warns at start)"
        ),
    )
    agent_ids: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "agent ids allowed to heartbeat (comma-separated); empty = any id. Under mTLS "
            "the certificate must also name the id; with a shared secret this list is what "
            "keeps a secret holder from joining under a new id"
        ),
    )
    peer_names: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "under mTLS, certificate names (CN or SAN) of the peer routers allowed to call "
            "ExchangeSummary and ForwardJob (comma-separated); empty = any certificate with "
            "the peer role"
        ),
    )


@dataclass(frozen=True)
class LimitsSettings:
    submit_per_second: float = field(
        default=0.0, metadata=doc("Submit calls per tenant per second; 0 = no limit [1/s]")
    )
    probe_per_second: float = field(
        default=20.0,
        metadata=doc(
            "ProbeJob calls per tenant per second, each call of a ProbeJobs stream "
            "counted as one (each may hold leases on hosts); 0 = no limit [1/s]"
        ),
    )
    burst: int = field(default=20, metadata=doc("calls a tenant may make at once [count]"))
    max_queued_per_tenant: int = field(
        default=0, metadata=doc("unfinished jobs one tenant may have; 0 = no cap [count]")
    )


@dataclass(frozen=True)
class QueueSettings:
    tenant_shares: str = field(
        default="",
        metadata=doc("fair-share weights 'alice=2,bob=1'; unlisted tenants weigh 1"),
    )
    tenant_quotas: str = field(
        default="",
        metadata=doc(
            "per-tenant limits 'alice:gpus=4:gpu_memory=80GiB,bob:gpus=2' "
            "(GPU-equivalents and declared GPU memory, running at once)"
        ),
    )
    backfill: bool = field(
        default=True,
        metadata=doc("let small jobs run ahead of a blocked one if it is not delayed"),
    )
    retry_seconds: float = field(
        default=1.0, metadata=doc("queue pass period besides heartbeat triggers", unit="seconds")
    )
    min_pass_seconds: float = field(
        default=0.02,
        metadata=doc(
            "least time between two queue passes: wakes within it (jobs queued, capacity "
            "freed) are served by one pass, so a burst of submissions costs a few passes, "
            "not one per job; a pass that took longer (a long queue) is followed by as long "
            "a pause, so passes take at most half the router's event loop",
            unit="seconds",
        ),
    )


@dataclass(frozen=True)
class PeerSettings:
    peers: tuple[str, ...] = field(
        default=(), metadata=doc("peer zone routers HOST:PORT,... for flow splitting")
    )
    gamma: float = field(default=1.0, metadata=doc("heat exponent in W = (1+S)/(1+H)^gamma"))
    exchange_seconds: float = field(
        default=1.0, metadata=doc("zone-summary exchange period", unit="seconds")
    )
    stale_after_periods: float = field(
        default=1.5, metadata=doc("a peer summary older than this many periods weighs 0")
    )


@dataclass(frozen=True)
class MarketSettings:
    """The atomization market (docs/atomization.md)."""

    policy: str = field(
        default=DEFAULT_POLICY,
        metadata=doc(
            "clearing policy: srpt (least work left first), slowdown, utilization, fair, "
            "responsive or blend (docs/atomization.md: srpt measured best)"
        ),
    )
    blend_weights: str = field(
        default="0.5,0.25,0.25",
        metadata=doc("blend weights of utilization,fair,responsive"),
    )
    round_seconds: float = field(
        default=1.0,
        metadata=doc("clearing round period besides new windows", unit="seconds"),
    )
    max_window_seconds: float = field(
        default=3600.0,
        metadata=doc(
            "an open-ended window is offered for at most this long; at its end a piece keeps "
            "its slice (incumbency) or stops and resumes from its checkpoint",
            unit="seconds",
        ),
    )
    incumbency: bool = field(
        default=True,
        metadata=doc(
            "a piece runs all the units its job has left (within max_units and the phase) "
            "and extends in place at its window's end unless a bid of a higher class, or of "
            "its class better by market.hysteresis, wants the slice; false: pieces are sized "
            "to their window and one still running past it is stopped"
        ),
    )
    pool_calibration: bool = field(
        default=True,
        metadata=doc(
            "calibrate a job's profile from the pieces of its whole family (tenant, name, "
            "phase), not its own pieces only, so it learns within a few pieces"
        ),
    )
    hysteresis: float = field(
        default=0.1,
        metadata=doc(
            "how much higher (in score, 0..1) a bid of a piece's own class must score to take "
            "its slice at its window's end"
        ),
    )
    overrun_grace_seconds: float = field(
        default=5.0,
        metadata=doc("how long past its window's end a subjob may run", unit="seconds"),
    )
    bid_timeout_seconds: float = field(
        default=0.5,
        metadata=doc("how long a round waits for a client's bids", unit="seconds"),
    )
    checkpoint_root: str = field(
        default="",
        metadata=doc(
            "checkpoint directories of atomized jobs without their own, ROOT/<job id>; must be "
            "shared storage that every host reaches; empty = STATE_DIR/checkpoints"
        ),
    )


@dataclass(frozen=True)
class Quota:
    max_gpus: float = 0.0  # 0 = unlimited
    max_gpu_memory_bytes: int = 0


@dataclass(frozen=True)
class ZoneConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    membership: MembershipSettings = field(default_factory=MembershipSettings)
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    peers: PeerSettings = field(default_factory=PeerSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    market: MarketSettings = field(default_factory=MarketSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)

    def validate(self) -> None:
        for key, value in (
            ("server.listen", self.server.listen),
            ("server.metrics_listen", self.server.metrics_listen),
        ):
            if value and not is_host_port(value):
                raise ConfigError(f"expected HOST:PORT, got {value!r}", field=key)
        for peer in self.peers.peers:
            if not is_host_port(peer):
                raise ConfigError(f"expected HOST:PORT, got {peer!r}", field="peers.peers")
        if not self.server.zone_name or len(self.server.zone_name) > 64:
            raise ConfigError("must be 1-64 characters", field="server.zone_name")
        positive = (
            ("membership.heartbeat_seconds", self.membership.heartbeat_seconds),
            ("membership.stale_after_periods", self.membership.stale_after_periods),
            ("membership.lost_after_seconds", self.membership.lost_after_seconds),
            ("membership.stream_liveness_seconds", self.membership.stream_liveness_seconds),
            ("placement.budget_seconds", self.placement.budget_seconds),
            ("placement.lease_ttl_seconds", self.placement.lease_ttl_seconds),
            ("placement.rpc_timeout_seconds", self.placement.rpc_timeout_seconds),
            ("queue.retry_seconds", self.queue.retry_seconds),
            ("peers.exchange_seconds", self.peers.exchange_seconds),
            ("peers.stale_after_periods", self.peers.stale_after_periods),
            ("market.round_seconds", self.market.round_seconds),
            ("market.max_window_seconds", self.market.max_window_seconds),
            ("market.bid_timeout_seconds", self.market.bid_timeout_seconds),
        )
        membership = self.membership
        if membership.fence and membership.fence_lease_seconds() < max(
            0.5, 2 * membership.heartbeat_seconds
        ):
            least = (FENCE_STOP_SECONDS + max(0.5, 2 * membership.heartbeat_seconds)) * (
                1 + FENCE_CLOCK_MARGIN_RATIO
            )
            raise ConfigError(
                f"must be at least {least:.2f} s with heartbeat_seconds="
                f"{membership.heartbeat_seconds:g}, so that the fence leaves agents two "
                "heartbeats (or set membership.fence = false)",
                field="membership.lost_after_seconds",
            )
        for key, number in positive:
            if not number > 0:
                raise ConfigError(f"must be > 0, got {number}", field=key)
        if not 0 <= self.queue.min_pass_seconds <= 1:
            raise ConfigError(
                f"must be in 0..1 s, got {self.queue.min_pass_seconds}",
                field="queue.min_pass_seconds",
            )
        if self.placement.lease_ttl_seconds > 60:
            raise ConfigError("must be <= 60 s", field="placement.lease_ttl_seconds")
        for key, count in (
            ("placement.probes_per_attempt", self.placement.probes_per_attempt),
            ("placement.max_attempts", self.placement.max_attempts),
            ("placement.concurrency", self.placement.concurrency),
        ):
            if count < 1:
                raise ConfigError(f"must be >= 1, got {count}", field=key)
        if self.placement.sample_size < self.placement.probes_per_attempt:
            raise ConfigError(
                "must be >= placement.probes_per_attempt", field="placement.sample_size"
            )
        if self.placement.regenerations < 0:
            raise ConfigError("must be >= 0", field="placement.regenerations")
        if self.placement.workload_min_observed < 0:
            raise ConfigError(
                f"must be >= 0, got {self.placement.workload_min_observed}",
                field="placement.workload_min_observed",
            )
        if self.peers.gamma < 0:
            raise ConfigError("must be >= 0", field="peers.gamma")
        for key, rate in (
            ("limits.submit_per_second", self.limits.submit_per_second),
            ("limits.probe_per_second", self.limits.probe_per_second),
        ):
            if not 0 <= rate <= 1e6:
                raise ConfigError(f"must be in 0..1000000, got {rate}", field=key)
        if self.limits.burst < 1:
            raise ConfigError(f"must be >= 1, got {self.limits.burst}", field="limits.burst")
        if self.limits.max_queued_per_tenant < 0:
            raise ConfigError("must be >= 0", field="limits.max_queued_per_tenant")
        if self.auth.tokens_file:
            require_readable_file(self.auth.tokens_file, "auth.tokens_file")
        self.workload_prior()
        if self.market.overrun_grace_seconds < 0:
            raise ConfigError("must be >= 0", field="market.overrun_grace_seconds")
        if not 0 <= self.market.hysteresis <= 1:
            raise ConfigError(
                f"must be in [0, 1], got {self.market.hysteresis}", field="market.hysteresis"
            )
        if self.market.policy not in POLICIES:
            raise ConfigError(
                f"must be one of {', '.join(POLICIES)}, got {self.market.policy!r}",
                field="market.policy",
            )
        validate_security(self.tls, self.control)
        validate_metrics(self.metrics, self.tls)
        check_message_bytes(self.server.max_message_bytes, "server.max_message_bytes")
        self.shares()
        self.quotas()
        self.blend()

    def blend(self) -> tuple[float, float, float]:
        """``market.blend_weights`` as (utilization, fair, responsive)."""
        try:
            weights = tuple(float(x) for x in self.market.blend_weights.split(","))
        except ValueError:
            weights = ()
        if len(weights) != 3 or any(not 0 <= w <= 1e6 for w in weights) or not sum(weights) > 0:
            raise ConfigError(
                f"expected three weights >= 0, not all 0, got {self.market.blend_weights!r}",
                field="market.blend_weights",
            )
        return weights[0], weights[1], weights[2]

    def workload_prior(self) -> Counter[PodShape]:
        """The task shapes and counts of ``placement.workload_prior_file`` (none without
        one): the mix a router that ran before would have learned, so a fresh router ranks
        by it from the first placement (``laminar sim fgd --workload-prior`` is the same
        for the simulator's routers)."""
        path = self.placement.workload_prior_file
        if not path:
            return Counter()
        key = "placement.workload_prior_file"
        require_readable_file(path, key)
        try:
            rows = json.loads(Path(path).read_text(encoding="utf-8"))
            return workload_from_rows(rows, path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            raise ConfigError(str(exc), field=key) from None

    def shares(self) -> dict[str, float]:
        """Tenant fair-share weights from ``queue.tenant_shares``."""
        out: dict[str, float] = {}
        for item in _items(self.queue.tenant_shares):
            tenant, sep, weight = item.partition("=")
            try:
                value = float(weight)
            except ValueError:
                value = -1.0
            if not sep or not tenant or not value > 0:
                raise ConfigError(
                    f"expected TENANT=WEIGHT with WEIGHT > 0, got {item!r}",
                    field="queue.tenant_shares",
                )
            out[tenant.strip()] = value
        return out

    def quotas(self) -> dict[str, Quota]:
        """Per-tenant quotas from ``queue.tenant_quotas``."""
        out: dict[str, Quota] = {}
        for item in _items(self.queue.tenant_quotas):
            tenant, *limits = item.split(":")
            if not tenant or not limits:
                raise ConfigError(
                    f"expected TENANT:gpus=N[:gpu_memory=SIZE], got {item!r}",
                    field="queue.tenant_quotas",
                )
            gpus, memory = 0.0, 0
            for limit in limits:
                key, _, value = limit.partition("=")
                try:
                    if key == "gpus":
                        gpus = float(value)
                        if not gpus > 0:
                            raise ValueError(value)
                    elif key == "gpu_memory":
                        memory = parse_size(value, field="gpu_memory")
                    else:
                        raise ValueError(key)
                except (ValueError, InvalidArgument):
                    raise ConfigError(
                        f"bad limit {limit!r} for tenant {tenant!r} (gpus=N, gpu_memory=SIZE)",
                        field="queue.tenant_quotas",
                    ) from None
            out[tenant.strip()] = Quota(max_gpus=gpus, max_gpu_memory_bytes=memory)
        return out


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 <= int(port) <= 65535)
