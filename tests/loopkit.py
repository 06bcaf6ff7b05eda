"""Helpers for tests of guarded root loops in daemons run in process: a notifier that
records what it would tell systemd, gRPC health over a real channel, and polling with a
deadline on the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laminar_agent.config import AgentConfig
from laminar_base.configlib import load_config
from laminar_base.sdnotify import Notifier
from laminar_base.supervise import Supervisor

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class RecordingNotifier(Notifier):
    """Records each WATCHDOG=1 with whether the supervisor held the daemon healthy then."""

    def __init__(self, watchdog_interval_seconds: float) -> None:
        super().__init__(None)
        self.watchdog_interval_seconds = watchdog_interval_seconds
        self.supervisor: Supervisor | None = None
        self.pings: list[bool] = []

    def notify(self, *states: str) -> None:
        if "WATCHDOG=1" in states:
            assert self.supervisor is not None
            self.pings.append(self.supervisor.is_healthy())


async def health(address: str, service: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return int(reply.status)


async def eventually(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout_seconds: float = 30.0
) -> None:
    """Poll ``predicate`` on the event loop until true; fail the test at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout_seconds:.0f} s: {what}")
        await asyncio.sleep(0.02)  # polling, bounded by the deadline


def agent_config(tmp_path: Path, **overrides: object) -> AgentConfig:
    """An in-process agent's config: loopback on port 0, one fake A100, state in
    ``tmp_path``; ``overrides`` by ``section.key``."""
    return load_config(
        AgentConfig,
        overrides={
            "server.listen": "127.0.0.1:0",
            "server.state_dir": str(tmp_path / "agent"),
            "server.agent_id": "inproc",
            "inventory.gpu_backend": "fake",
            "inventory.fake_gpus": "1xA100-40GB",
            **overrides,
        },
    )
