"""A whole router (:class:`ZoneServer`) served on 127.0.0.1:0 in the test's own event
loop, for tests of what spans its lifecycle (streams at shutdown, heartbeats)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from laminar_base.configlib import load_config
from laminar_zone.config import ZoneConfig
from laminar_zone.server import Status, ZoneServer


@asynccontextmanager
async def zone_server(tmp_path: Path, **overrides: object) -> AsyncIterator[ZoneServer]:
    """A started router with ``overrides`` as config overrides; stopped on the way out
    unless the test stopped it."""
    config = load_config(
        ZoneConfig,
        overrides={
            "server.listen": "127.0.0.1:0",
            "server.state_dir": str(tmp_path / "zone"),
            **overrides,
        },
    )
    server = ZoneServer(config)
    await server.start()
    try:
        yield server
    finally:
        if server.status not in (Status.STOPPED, Status.FAILED):  # a test may have stopped it
            await server.stop()
