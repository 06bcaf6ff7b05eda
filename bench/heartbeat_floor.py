"""Where a heartbeat's router CPU goes: the gRPC call itself against the handler.

Two parts, numbers reported, never asserted:

1. ``router``: a real laminar-zone process; N calls each (64 at a time on one channel) of
   a gRPC health check (the floor of any call to it), a full heartbeat (an idle host's
   summary) and a delta heartbeat (agent id and summary version only); the router's CPU
   (psutil) per call. A router without delta heartbeats (``--router-path`` of an older
   checkout) refuses the delta, which is then left out.
2. ``grpc``: grpc.aio alone with an empty handler, per unary call and per message on a
   long-lived bidirectional stream (256 connections): what any transport change starts
   from.

    .venv/bin/python bench/heartbeat_floor.py [--calls 10000] [--router-path DIR] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_bench.heartbeat_pool import idle_summary

CONCURRENCY = 64
CONNECTIONS = 256


def cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def per_call_ms(
    process: psutil.Process, calls: int, call: Callable[[], Awaitable[Any]], workers: list[Any]
) -> float:
    """Server CPU per call of ``calls`` calls, spread over ``workers`` (one task each)."""
    per = calls // len(workers)

    async def worker(_: Any) -> None:
        for _ in range(per):
            await call()

    before = cpu(process)
    await asyncio.gather(*(worker(w) for w in workers))
    return 1000 * (cpu(process) - before) / (per * len(workers))


def start_router(router_path: str) -> tuple[subprocess.Popen[bytes], Path]:
    state_dir = Path(tempfile.mkdtemp(prefix="laminar-floor-"))
    env = {**os.environ, "PYTHONPATH": router_path} if router_path else None
    argv = [sys.executable, "-m", "laminar_zone", "--listen", "127.0.0.1:0"]
    router = subprocess.Popen(
        [*argv, "--state-dir", str(state_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=router_path or None,  # with -m the working directory comes first on sys.path
    )
    return router, state_dir / "zone.json"


async def router_part(calls: int, router: subprocess.Popen[bytes], info: Path) -> dict[str, float]:
    for _ in range(600):
        if info.exists() and json.loads(info.read_text() or "{}").get("address"):
            break
        await asyncio.sleep(0.05)  # the router writes it once it serves
    address = json.loads(info.read_text())["address"]
    process = psutil.Process(router.pid)
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        control = zone_pb2_grpc.ZoneControlStub(channel)
        full = zone_pb2.HeartbeatRequest(
            summary=idle_summary("floor-1", "127.0.0.1:9")(), summary_version=1
        )
        delta = zone_pb2.HeartbeatRequest(agent_id="floor-1", summary_version=1)
        keeps_versions = (await control.Heartbeat(full)).summary_version == 1
        cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("health_check_ms", lambda: health.Check(health_pb2.HealthCheckRequest())),
            ("full_heartbeat_ms", lambda: control.Heartbeat(full)),
        ]
        if keeps_versions:
            cases.append(("delta_heartbeat_ms", lambda: control.Heartbeat(delta)))
        workers = list(range(CONCURRENCY))
        return {name: await per_call_ms(process, calls, c, workers) for name, c in cases}


def _empty_server(port_queue: Any) -> None:
    async def main() -> None:
        async def unary(request: bytes, context: Any) -> bytes:
            return b"ok"

        async def bidi(requests: Any, context: Any) -> Any:
            async for _ in requests:
                yield b"ok"

        handler = grpc.method_handlers_generic_handler(
            "floor.Floor",
            {
                "Unary": grpc.unary_unary_rpc_method_handler(unary),
                "Stream": grpc.stream_stream_rpc_method_handler(bidi),
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


async def grpc_part(calls: int) -> dict[str, float]:
    ports: Any = multiprocessing.Queue()
    server = multiprocessing.Process(target=_empty_server, args=(ports,), daemon=True)
    server.start()
    try:
        address = f"127.0.0.1:{ports.get(timeout=60)}"
        process = psutil.Process(server.pid)
        channels = [grpc.aio.insecure_channel(address) for _ in range(CONNECTIONS)]
        unary = [ch.unary_unary("/floor.Floor/Unary") for ch in channels]  # type: ignore[call-arg]
        streams = [ch.stream_stream("/floor.Floor/Stream")() for ch in channels]  # type: ignore[call-arg]
        turn = {"unary": 0, "stream": 0}

        async def one_unary() -> None:
            turn["unary"] = (turn["unary"] + 1) % CONNECTIONS
            await unary[turn["unary"]](b"x")

        out = {"unary_call_ms": await per_call_ms(process, calls, one_unary, channels)}
        per = calls // CONNECTIONS
        before = cpu(process)

        async def talk(stream: Any) -> None:
            for _ in range(per):
                await stream.write(b"x")
                await stream.read()
            await stream.done_writing()

        await asyncio.gather(*(talk(s) for s in streams))
        out["stream_message_ms"] = 1000 * (cpu(process) - before) / (per * CONNECTIONS)
        for channel in channels:
            await channel.close(None)
        return out
    finally:
        server.terminate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per case")
    parser.add_argument("--router-path", default="", help="PYTHONPATH of the router to run")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = parser.parse_args()
    router, info = start_router(args.router_path)
    try:
        router_figures = asyncio.run(router_part(args.calls, router, info))
    finally:
        router.terminate()
        router.wait()
        shutil.rmtree(info.parent, ignore_errors=True)
    report = {
        "calls": args.calls,
        "router": router_figures,
        "grpc": asyncio.run(grpc_part(args.calls)),
    }
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        for part in ("router", "grpc"):
            for name, value in report[part].items():
                print(f"{part:7} {name:20} {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
