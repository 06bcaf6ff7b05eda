"""``laminar bench heartbeats``: what an idle zone router spends on membership.

A zone router process and N heartbeat-only agents multiplexed in pool
processes (:mod:`laminar_bench.heartbeat_pool`: the agent's real heartbeat
client, an idle host's summary, nothing else of an agent), joining at up to
JOIN_PER_SECOND (the start-up storm of N first heartbeats in one period is
not the idle load this measures). Once the router lists every agent as ready
and a few periods have passed (every agent's first, full heartbeat is behind),
the benchmark reads the router process's CPU time
(psutil, user + system) and its heartbeat counters, waits ``seconds``, and
reads them again. Nothing else happens: no job, no probe.

Reported: the router's CPU as a fraction of one core (CPU seconds over wall
seconds), CPU per heartbeat, the heartbeat rate the router saw against the
rate N agents at the router's period would send, and that CPU per heartbeat
scaled to the nominal rate (what the router would spend if the machine kept
up with every agent). The benchmark machines are small and shared: CPU per
heartbeat is the figure to compare, not wall rates. Numbers are reported,
never judged; the benchmark fails only when the cluster cannot be started.

Transports (``transport``): ``stream``, the Heartbeats stream agents use (a
message per agent per liveness period when nothing changes, plus the router's
HTTP/2 keepalive pings, which no counter sees but the router's CPU includes),
and ``unary``, one Heartbeat call per agent per period (older agents, or an
older router). Every agent has its own connection, as hosts do. The router's
CPU per agent per second is the figure the two share.

Not covered: heartbeats that carry subjob events or Airlock actions, TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from laminar_base.errors import InvalidArgument
from laminar_bench.heartbeat_pool import MAX_HEARTBEAT_POOL_AGENTS, POOL_INFO
from laminar_bench.placement import (
    AgentEndpoint,
    BenchCluster,
    BenchSpec,
    ProgressFn,
    _busy_ratio,
    _wait_info,
    cpu_seconds,
    environment,
    measure_cluster,
    scrape_heartbeats,
)
from laminar_zone.config import MembershipSettings

#: Heartbeat periods waited after every agent is listed, before measuring.
WARM_UP_PERIODS = 3.0
#: Agents joining per second at the start: each first heartbeat carries the full summary,
#: and a burst of N of them in one period is a start-up storm, not the idle load measured.
JOIN_PER_SECOND = 400.0
DEFAULT_AGENTS_PER_PROCESS = 512
TRANSPORTS = ("stream", "unary")


@dataclass(frozen=True)
class HeartbeatBenchSpec:
    agents: int
    seconds: float = 20.0  # measurement window
    agents_per_process: int = DEFAULT_AGENTS_PER_PROCESS
    heartbeat_seconds: float = 0.0  # 0 = the router's default
    work_dir: Path | None = None  # state dirs and logs; default a temporary dir, removed
    transport: str = "stream"  # "stream" (Heartbeats) or "unary" (one Heartbeat per period)

    def validate(self) -> None:
        if self.transport not in TRANSPORTS:
            raise InvalidArgument(
                f"must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}",
                field="--transport",
            )
        if not 1 <= self.agents <= 4096:
            raise InvalidArgument(f"must be in 1..4096, got {self.agents}", field="--agents")
        if not 1 <= self.seconds <= 3600:
            raise InvalidArgument(f"must be in 1..3600 s, got {self.seconds}", field="--seconds")
        if not 1 <= self.agents_per_process <= MAX_HEARTBEAT_POOL_AGENTS:
            raise InvalidArgument(
                f"must be in 1..{MAX_HEARTBEAT_POOL_AGENTS}, got {self.agents_per_process}",
                field="--agents-per-process",
            )
        if not 0 <= self.heartbeat_seconds <= 60:
            raise InvalidArgument(
                f"must be in 0..60 s, got {self.heartbeat_seconds}", field="--heartbeat-seconds"
            )

    @property
    def period_seconds(self) -> float:
        return self.heartbeat_seconds or MembershipSettings().heartbeat_seconds


class HeartbeatCluster(BenchCluster):
    """The router and the heartbeat pools; :meth:`stop` ends every one of them."""

    router_metrics_address: str = ""
    ready_at_start: int = 0

    def __init__(self, root: Path, spec: HeartbeatBenchSpec) -> None:
        super().__init__(
            root, BenchSpec(agents=spec.agents, jobs=1, heartbeat_seconds=spec.heartbeat_seconds)
        )
        self.per_process = spec.agents_per_process
        self.transport = spec.transport
        #: Every pool starts its agents over this long, so that N / spread join per second.
        self.spread_seconds = max(spec.period_seconds, spec.agents / JOIN_PER_SECOND)

    async def start(self, progress: ProgressFn | None = None) -> None:
        argv = ["-m", "laminar_zone", "--listen", "127.0.0.1:0", "--state-dir"]
        zone_dir = self.root / "zone"
        argv += [str(zone_dir), "--metrics-listen", "127.0.0.1:0"]
        if self.spec.heartbeat_seconds:
            argv += ["--heartbeat-seconds", f"{self.spec.heartbeat_seconds:g}"]
        self.router = self._spawn("router", argv, zone_dir, "zone.json")
        info = await _wait_info(self.router, 60.0)
        self.router_address = str(info["address"])
        self.router_metrics_address = str(info.get("metrics_address", ""))
        self.router_pid = self.router.process.pid
        for first in range(0, self.spec.agents, self.per_process):
            count = min(self.per_process, self.spec.agents - first)
            name = f"hbpool{first // self.per_process}"
            argv = ["-m", "laminar_bench.heartbeat_pool", "--count", str(count)]
            argv += ["--zone", self.router_address, "--state-dir", str(self.root / name)]
            argv += ["--prefix", f"{name}-a", "--log-level", "INFO"]
            argv += ["--spread-seconds", f"{self.spread_seconds:g}"]
            if self.transport == "unary":
                argv.append("--unary")
            self.agent_children.append(self._spawn(name, argv, self.root / name, POOL_INFO))
        start_timeout = 60.0 + 0.05 * self.spec.agents
        listed = 0
        for child in self.agent_children:
            info = await _wait_info(child, start_timeout)
            # BenchCluster lists agents by endpoint; heartbeat-only agents serve nothing.
            listed += len(info["agents"])
            self.agents.extend(
                AgentEndpoint(a["agent_id"], "", "", int(info["pid"])) for a in info["agents"]
            )
            if progress is not None:
                progress("starting agents", listed, self.spec.agents)
        self.ready_at_start = await self.wait_ready(start_timeout)

    async def wait_ready(self, timeout_seconds: float) -> int:
        """Poll until the router counts every agent as ready or the deadline passes; how many
        it counts. Read from its ``laminar_zone_agents{state="ready"}`` gauge (updated once a
        period), not ListAgents, whose 4,096 entries per poll would load the router measured.
        An overloaded router (agents going stale for want of CPU) is a result to report,
        not a failure."""
        deadline = time.monotonic() + timeout_seconds
        ready = 0
        while True:
            with contextlib.suppress(OSError):
                figures = await asyncio.to_thread(scrape_heartbeats, self.router_metrics_address)
                ready = int(figures.get("laminar_zone_agents_ready", 0.0))
            if ready >= self.spec.agents or time.monotonic() > deadline:
                return ready
            self._check_alive()
            await asyncio.sleep(0.5)  # heartbeats arrive on their own schedule


async def _measure(
    spec: HeartbeatBenchSpec, cluster: HeartbeatCluster, progress: ProgressFn | None
) -> dict[str, Any]:
    t_start = time.monotonic()
    await cluster.start(progress)
    started_seconds = time.monotonic() - t_start
    await asyncio.sleep(WARM_UP_PERIODS * spec.period_seconds)  # first, full heartbeats pass
    if progress is not None:
        progress("measuring", 0, 1)
    before = await asyncio.to_thread(scrape_heartbeats, cluster.router_metrics_address)
    router0 = cpu_seconds([cluster.router_pid])
    agents0 = cpu_seconds(cluster.agent_pids())
    machine0 = psutil.cpu_times()
    t0 = time.monotonic()
    await asyncio.sleep(spec.seconds)  # the measurement window: heartbeats only
    wall = time.monotonic() - t0
    router_cpu = cpu_seconds([cluster.router_pid]) - router0
    agents_cpu = cpu_seconds(cluster.agent_pids()) - agents0
    machine_busy = _busy_ratio(machine0, psutil.cpu_times())
    connections = router_connections(cluster.router_pid)
    after = await asyncio.to_thread(scrape_heartbeats, cluster.router_metrics_address)
    cluster._check_alive()
    ready_at_end = await cluster.wait_ready(0.0)
    beats = after["laminar_zone_heartbeats"] - before["laminar_zone_heartbeats"]
    full = after["laminar_zone_heartbeat_summaries"] - before["laminar_zone_heartbeat_summaries"]
    per_beat = router_cpu / beats if beats else 0.0
    nominal_rate = spec.agents / spec.period_seconds
    return {
        "benchmark": "heartbeats",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "environment": environment(),
        "agents": spec.agents,
        "agent_processes": len(cluster.agent_children),
        "agents_per_process": spec.agents_per_process,
        "heartbeat_seconds": spec.period_seconds,
        "start_seconds": started_seconds,
        "join_spread_seconds": cluster.spread_seconds,
        "agents_ready_at_start": cluster.ready_at_start,
        "agents_ready_at_end": ready_at_end,
        "measured_seconds": wall,
        "transport": spec.transport,
        "router_connections": connections,
        "heartbeats": int(beats),
        "heartbeats_with_summary": int(full),
        "heartbeats_per_second": beats / wall,
        "nominal_heartbeats_per_second": nominal_rate,
        "router_cpu_seconds": router_cpu,
        "router_cpu_ratio": router_cpu / wall,
        "router_cpu_ms_per_heartbeat": 1000 * per_beat,
        "router_cpu_us_per_agent_second": 1e6 * router_cpu / wall / spec.agents,
        "router_cpu_ratio_at_nominal_rate": per_beat * nominal_rate,
        "agents_cpu_ratio": agents_cpu / wall,
        "machine_cpu_busy_ratio": machine_busy,
        "cpu_definition": (
            "user + system CPU seconds of the router process (psutil) over wall seconds, "
            "in a window with heartbeats only; per heartbeat: over laminar_zone_heartbeats_total"
        ),
    }


def router_connections(pid: int) -> int:
    """Established TCP connections of the router process (one per agent is expected)."""
    process = psutil.Process(pid)
    listing = getattr(process, "net_connections", process.connections)
    return sum(1 for c in listing(kind="tcp") if c.status == psutil.CONN_ESTABLISHED)


def run_heartbeat_bench(
    spec: HeartbeatBenchSpec, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Start the router and pools, measure, stop every process (also on Ctrl-C or SIGTERM)."""
    spec.validate()
    return measure_cluster(
        spec.work_dir,
        lambda root: HeartbeatCluster(root, spec),
        lambda cluster: _measure(spec, cluster, progress),
    )


__all__ = ["TRANSPORTS", "HeartbeatBenchSpec", "run_heartbeat_bench", "scrape_heartbeats"]
