"""Many heartbeat-only agents in one process: the zone router's membership load alone.

Each agent is the agent's real :class:`laminar_agent.heartbeat.HeartbeatClient`
with its own channel to the router, sending the summary of an idle host with
fake shared GPUs (the shape, free share and windows a real idle agent
advertises, stamped afresh on every call as a real agent does) and an empty
in-memory journal. Nothing else of an agent runs: no gRPC server, no Airlock,
no SQLite. That is the point: ``laminar bench heartbeats`` measures what the
router spends on membership, and 4,096 full agents would not fit on the two
cores of the benchmark machine beside the router they are meant to load.

    python -m laminar_bench.heartbeat_pool --count 512 --zone 127.0.0.1:7400 \\
        --state-dir /tmp/hb0 --prefix hb0-

Agents use the Heartbeats stream as real agents do (``--unary``: one Heartbeat
call per period, as agents did before it and do against an older router), each
over its own connection. Agents start one after another, spread over ``--spread-seconds`` (default one
heartbeat period), as hosts that boot independently would.
The pool writes ``STATE_DIR/pool.json`` (its pid and every agent's id) once
every client runs, and stops on SIGTERM or SIGINT (a second signal exits at
once). Exit codes: 0 clean, 2 bad arguments, 1 any other failure.

Not covered: subjob events, Airlock actions and re-addressing (the journal is
always empty), and the agents' own probe service (addresses are placeholders).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from laminar_agent.heartbeat import HeartbeatClient
from laminar_agent.journal import ActionRow, EventRow
from laminar_api.v1 import common_pb2
from laminar_base.daemon import run_daemon, serve_until_signalled, setup_logging
from laminar_base.errors import InvalidArgument

log = logging.getLogger("laminar.bench.heartbeat_pool")

POOL_INFO = "pool.json"
#: The most agents one pool may host (one event loop drives all their heartbeats).
MAX_HEARTBEAT_POOL_AGENTS = 1024
GPU_MODEL = "H100-80GB"
GPUS_PER_AGENT = 8
GPU_MEMORY_BYTES = 80 * 1024**3
#: The heartbeat period agents use until the router's first reply names its own.
INITIAL_PERIOD_SECONDS = 1.0


class EmptyJournal:
    """A journal with no subjob events and no Airlock actions (an idle host's)."""

    def __init__(self) -> None:
        self._meta: dict[str, str] = {}

    def unacked_events(self, limit: int = 1000) -> list[EventRow]:
        return []

    def ack_events(self, up_to_seq: int) -> int:
        return 0

    def actions_after(self, seq: int, limit: int = 100) -> list[ActionRow]:
        return []

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        return self._meta.get(key, default)

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value


def idle_summary(agent_id: str, address: str) -> Callable[[], common_pb2.AgentSummary]:
    """An idle host's summary as a real agent builds it for a heartbeat: every shared GPU
    free, one window per GPU open from now, a fresh ``generated_unix`` and ``generation``."""
    generation = 0

    def summary() -> common_pb2.AgentSummary:
        nonlocal generation
        generation += 1
        now = time.time()
        message = common_pb2.AgentSummary(
            agent_id=agent_id,
            address=address,
            hostname=agent_id,
            generated_unix=now,
            generation=generation,
            total_gpus=GPUS_PER_AGENT,
        )
        message.shapes.add(
            shape=f"share:{GPU_MODEL}",
            free=GPUS_PER_AGENT,
            total=GPUS_PER_AGENT,
            max_free_milli=1000,
            max_free_memory_bytes=GPU_MEMORY_BYTES,
        )
        for index in range(GPUS_PER_AGENT):
            message.windows.add(
                agent_id=agent_id,
                slice_id=f"GPU-{agent_id}-{index}",
                kind=common_pb2.SHARED_GPU,
                gpu_milli=1000,
                memory_bytes=GPU_MEMORY_BYTES,
                start_unix=now,
                gpu_model=GPU_MODEL,
            )
        return message

    return summary


class HeartbeatPool:
    """``count`` heartbeat clients named ``PREFIX0 .. PREFIX{count-1}`` on this event loop."""

    def __init__(
        self,
        count: int,
        zone: str,
        state_dir: Path,
        prefix: str,
        spread_seconds: float = 0.0,
        *,
        use_stream: bool = True,
    ) -> None:
        if not 1 <= count <= MAX_HEARTBEAT_POOL_AGENTS:
            raise InvalidArgument(
                f"must be in 1..{MAX_HEARTBEAT_POOL_AGENTS}, got {count}", field="--count"
            )
        if not zone:
            raise InvalidArgument("a zone router HOST:PORT is required", field="--zone")
        self.state_dir = state_dir
        self.agent_ids = [f"{prefix}{i}" for i in range(count)]
        # Placeholder addresses: the router never calls an idle agent.
        self.clients = [
            HeartbeatClient(
                zone,
                INITIAL_PERIOD_SECONDS,
                idle_summary(agent_id, f"127.0.0.1:{10000 + i}"),
                EmptyJournal(),
                lambda *_: None,
                use_stream=use_stream,
                # One connection per agent, as hosts have (channels alike in one process
                # would otherwise share one, and the router would ping one not 512).
                extra_channel_options=[("grpc.use_local_subchannel_pool", 1)],
            )
            for i, agent_id in enumerate(self.agent_ids)
        ]
        self.spread_seconds = spread_seconds or INITIAL_PERIOD_SECONDS
        self.stop_event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        count = len(self.clients)
        for i, (agent_id, client) in enumerate(zip(self.agent_ids, self.clients, strict=True)):
            delay = self.spread_seconds * i / count
            self._tasks.append(
                asyncio.create_task(self._run(client, delay), name=f"heartbeat-{agent_id}")
            )
        self._write_info()
        log.info("heartbeat pool of %d agents running (%s ..)", count, self.agent_ids[0])

    async def _run(self, client: HeartbeatClient, delay_seconds: float) -> None:
        await asyncio.sleep(delay_seconds)  # agents join one after another, as hosts boot
        await client.run(self.stop_event)

    async def stop(self) -> None:
        self.stop_event.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        sent = sum(c.sent for c in self.clients)
        log.info("heartbeat pool of %d agents stopped after %d heartbeats", len(self.clients), sent)

    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "agents": [{"agent_id": a} for a in self.agent_ids]}
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (POOL_INFO + ".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(self.state_dir / POOL_INFO)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m laminar_bench.heartbeat_pool",
        description="Run many heartbeat-only agents in one process (router membership load)",
    )
    p.add_argument("--count", type=int, required=True, help="how many agents")
    p.add_argument("--zone", required=True, help="zone router HOST:PORT")
    p.add_argument("--state-dir", type=Path, required=True, help="where pool.json goes")
    p.add_argument("--prefix", required=True, help="agent ids are PREFIX0, PREFIX1, ...")
    p.add_argument(
        "--spread-seconds",
        type=float,
        default=0.0,
        help="start the agents evenly over this long (default: one period)",
    )
    p.add_argument(
        "--unary",
        action="store_true",
        help="one Heartbeat call per period (default: the Heartbeats stream, as agents do)",
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    async def run() -> None:
        pool = HeartbeatPool(
            args.count,
            args.zone,
            args.state_dir,
            args.prefix,
            args.spread_seconds,
            use_stream=not args.unary,
        )
        await serve_until_signalled(
            pool.start, pool.stop, pool.stop_event, log, "nothing (heartbeats only)"
        )

    return run_daemon("laminar-heartbeat-pool", run())


if __name__ == "__main__":
    sys.exit(main())
