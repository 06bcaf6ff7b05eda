"""Many real agents in one process, so that hundreds of them fit on a small benchmark machine.

Each agent is a full :class:`laminar_agent.server.AgentServer`: its own gRPC
server on its own loopback port, its own state directory and journal, its own
metrics registry and its own heartbeat to the zone router. The pool serves
all agents' metrics on one Prometheus endpoint, each sample labelled with its
``agent``. They only share the process, its event loop and its GIL, which is
the point: 256 agent processes would not fit on two cores, and the
benchmark reports how many agents each process hosted.

    python -m laminar_bench.agent_pool --count 32 --zone 127.0.0.1:7400 \\
        --fake-gpus 8xH100-80GB:shared --state-dir /tmp/pool0 --prefix p0-

The pool writes ``STATE_DIR/pool.json`` (its pid, its metrics address and
every agent's id, address and state directory) once all agents serve, and
stops them all on SIGTERM or SIGINT (a second signal exits at once). Running
subjobs are left to the agents' usual shutdown rules (they keep running).
Exit codes: 0 clean, 2 bad arguments or config, 1 any other failure.

Not covered: one agent failing at start stops the whole pool (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from laminar_agent.config import AgentConfig
from laminar_agent.server import AgentServer
from laminar_base.configlib import load_config
from laminar_base.daemon import run_daemon, serve_until_signalled, setup_logging
from laminar_base.errors import InvalidArgument, LaminarError

log = logging.getLogger("laminar.bench.pool")

POOL_INFO = "pool.json"
#: The most agents one pool may host; beyond this a single event loop is the bottleneck.
MAX_POOL_AGENTS = 512


@dataclass(frozen=True)
class PoolSpec:
    """What a pool runs: ``count`` agents named ``PREFIX0 .. PREFIX{count-1}``."""

    count: int
    zone: str
    fake_gpus: str
    state_dir: Path
    prefix: str
    with_metrics: bool = True
    airlock_poll_seconds: float | None = None
    #: Per agent (in id order), config keys of its own: a cluster of unlike hosts.
    per_agent: tuple[Mapping[str, object], ...] = ()

    def agent_ids(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(self.count)]


def agent_config(
    spec: PoolSpec, agent_id: str, own: Mapping[str, object] | None = None
) -> AgentConfig:
    """One agent's config: the same keys ``laminar-agent`` would get from its flags, then
    ``own`` (its keys from ``--per-agent``)."""
    overrides: dict[str, object] = {
        "server.listen": "127.0.0.1:0",
        "server.state_dir": str(spec.state_dir / agent_id),
        "server.agent_id": agent_id,
        "server.metrics_listen": "",  # the pool serves one endpoint for all, see PoolCollector
        "zone.zone": spec.zone,
        "inventory.gpu_backend": "fake",
        "inventory.fake_gpus": spec.fake_gpus,
        "executor.run_as_user": "",  # a local pool runs subjobs as whoever runs the bench
    }
    if spec.airlock_poll_seconds is not None:
        overrides["airlock.poll_seconds"] = spec.airlock_poll_seconds
    overrides.update(own or {})
    return load_config(AgentConfig, overrides=overrides)


class PoolCollector(Collector):
    """Every agent's metrics in one exposition, each sample labelled with its ``agent``.

    One HTTP endpoint per pool instead of one per agent: fewer threads, one
    scrape, and a stop that does not wait for 32 HTTP servers to wind down.
    """

    def __init__(self, servers: list[tuple[str, AgentServer]]) -> None:
        self._servers = servers

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for agent_id, server in self._servers:
            if server.state is None:
                continue
            for family in server.state.metrics.registry.collect():
                target = merged.get(family.name)
                if target is None:
                    target = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = target
                for sample in family.samples:
                    target.samples.append(
                        sample._replace(labels={**sample.labels, "agent": agent_id})
                    )
        return list(merged.values())


class AgentPool:
    """Start and stop ``spec.count`` agent servers on the running event loop."""

    def __init__(self, spec: PoolSpec) -> None:
        if not 1 <= spec.count <= MAX_POOL_AGENTS:
            raise InvalidArgument(
                f"must be in 1..{MAX_POOL_AGENTS}, got {spec.count}", field="--count"
            )
        if spec.per_agent and len(spec.per_agent) != spec.count:
            raise InvalidArgument(
                f"lists {len(spec.per_agent)} agents, the pool has {spec.count}",
                field="--per-agent",
            )
        self.spec = spec
        own = spec.per_agent or ({},) * spec.count
        # Built (and validated) before anything starts, so bad config fails fast with exit 2.
        self.servers = [
            AgentServer(agent_config(spec, a, o))
            for a, o in zip(spec.agent_ids(), own, strict=True)
        ]
        self.stop_event = asyncio.Event()
        self.metrics_address = ""
        self._metrics_http: Any = None

    async def start(self) -> None:
        """Start every agent, one after another; on any failure stop those already started."""
        started: list[AgentServer] = []
        try:
            for server in self.servers:
                await server.start()
                started.append(server)
        except BaseException:
            await asyncio.gather(*(s.stop() for s in started), return_exceptions=True)
            raise
        if self.spec.with_metrics:
            registry = CollectorRegistry()
            registry.register(
                PoolCollector(list(zip(self.spec.agent_ids(), self.servers, strict=True)))
            )
            httpd, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
            self._metrics_http = httpd
            self.metrics_address = f"127.0.0.1:{httpd.server_port}"
        self._write_info()
        log.info(
            "pool of %d agents serving (%s .. %s), zone %s",
            len(self.servers),
            self.servers[0].address,
            self.servers[-1].address,
            self.spec.zone or "none",
        )

    async def stop(self) -> None:
        if self._metrics_http is not None:
            # shutdown() blocks until the serving thread notices (up to 0.5 s): not on the loop.
            await asyncio.to_thread(self._metrics_http.shutdown)
            self._metrics_http.server_close()
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)
        log.info("pool of %d agents stopped", len(self.servers))

    def _write_info(self) -> None:
        info = {
            "pid": os.getpid(),
            "metrics_address": self.metrics_address,
            "agents": [
                {
                    "agent_id": agent_id,
                    "address": server.address,
                    "metrics_address": self.metrics_address,  # shared, label agent=ID
                    "state_dir": str(self.spec.state_dir / agent_id),
                }
                for agent_id, server in zip(self.spec.agent_ids(), self.servers, strict=True)
            ],
        }
        self.spec.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.spec.state_dir / (POOL_INFO + ".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(self.spec.state_dir / POOL_INFO)

    async def run_until_signalled(self) -> None:
        await serve_until_signalled(
            self.start, self.stop, self.stop_event, log, "running subjobs keep running"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m laminar_bench.agent_pool",
        description="Run several laminar agents (fake GPUs) in one process for benchmarks",
    )
    p.add_argument("--count", type=int, required=True, help="how many agents")
    p.add_argument("--zone", default="", help="zone router HOST:PORT (empty: standalone)")
    p.add_argument("--fake-gpus", required=True, help="fake GPU spec of every agent")
    p.add_argument("--state-dir", type=Path, required=True, help="pool.json and one dir per agent")
    p.add_argument("--prefix", required=True, help="agent ids are PREFIX0, PREFIX1, ...")
    p.add_argument("--no-metrics", action="store_true", help="no Prometheus endpoint for the pool")
    p.add_argument(
        "--airlock-poll-seconds",
        type=float,
        help="agents' airlock.poll_seconds (default: the agent's own default)",
    )
    p.add_argument(
        "--per-agent",
        type=Path,
        help="JSON file: a list with one object per agent of config keys of its own, "
        'e.g. [{"inventory.fake_gpus": "2xT4-16GB:shared", "inventory.host_cpu_milli": 64000}]',
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return p


def read_per_agent(path: Path | None) -> tuple[Mapping[str, object], ...]:
    """The ``--per-agent`` file: a JSON list of objects (InvalidArgument naming the flag)."""
    if path is None:
        return ()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot read {path}: {exc}", field="--per-agent") from None
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise InvalidArgument(f"{path}: expected a JSON list of objects", field="--per-agent")
    return tuple(data)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    spec = PoolSpec(
        count=args.count,
        zone=args.zone,
        fake_gpus=args.fake_gpus,
        state_dir=args.state_dir,
        prefix=args.prefix,
        with_metrics=not args.no_metrics,
        airlock_poll_seconds=args.airlock_poll_seconds,
        per_agent=read_per_agent(args.per_agent),
    )

    async def run() -> None:
        await AgentPool(spec).run_until_signalled()

    try:
        return run_daemon("laminar-agent-pool", run())
    except LaminarError as exc:  # pragma: no cover - run_daemon maps these already
        print(f"laminar-agent-pool: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
