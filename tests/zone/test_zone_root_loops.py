"""The router's root loops are guarded, in process over real gRPC: a queue pass that
raises is logged with its traceback and the queue restarted with backoff, health goes
NOT_SERVING and the watchdog is held back until it runs again; a fatal loop that fails
stops the router, which exits 1. Faults come from monkeypatching the router object in
the test (there is no switch in the router)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from pathlib import Path

import pytest
from loopkit import NOT_SERVING, SERVING, RecordingNotifier, eventually, health

from laminar_base.configlib import load_config
from laminar_base.daemon import run_daemon
from laminar_base.supervise import RootLoopFailed
from laminar_zone import server as zone_server
from laminar_zone.config import ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.server import SERVICE_NAMES, Status, ZoneServer

ZONE_SERVICE = SERVICE_NAMES[0]


def zone_config(tmp_path: Path) -> ZoneConfig:
    return load_config(
        ZoneConfig,
        overrides={
            "server.listen": "127.0.0.1:0",
            "server.state_dir": str(tmp_path / "zone"),
            "queue.retry_seconds": 0.05,
        },
    )


async def _is(address: str, status: int) -> bool:
    return await health(address, ZONE_SERVICE) == status


async def _true(value: bool) -> bool:
    return value


async def test_a_failing_queue_pass_is_restarted_and_health_and_watchdog_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(zone_server, "HEALTH_CHECK_SECONDS", 0.02)
    notifier = RecordingNotifier(watchdog_interval_seconds=0.02)
    server = ZoneServer(zone_config(tmp_path), notifier=notifier)
    notifier.supervisor = server.supervisor
    caplog.set_level(logging.INFO, logger="laminar.zone")
    await server.start()
    assert server.state is not None
    broken = True
    real_pass = server.state.queue_pass

    async def queue_pass() -> None:
        if broken:
            raise RuntimeError("store: database disk image is malformed (simulated)")
        await real_pass()

    try:
        assert await _is(server.address, SERVING)
        await eventually(lambda: _true(len(notifier.pings) > 0), "a first watchdog ping")
        monkeypatch.setattr(server.state, "queue_pass", queue_pass)
        await eventually(
            lambda: _is(server.address, NOT_SERVING), "health NOT_SERVING after the fault"
        )
        failed = [r for r in caplog.records if "root loop zone-queue failed" in r.getMessage()]
        assert failed and failed[0].exc_info is not None
        assert "malformed (simulated)" in str(failed[0].exc_info[1])
        # Only the queue is down; the other root loops go on.
        problems = server.supervisor.problems(time.monotonic())
        assert all(p.startswith("zone-queue: ") for p in problems), problems

        broken = False
        await eventually(lambda: _is(server.address, SERVING), "health SERVING again")
        pings_back = len(notifier.pings)
        await eventually(lambda: _true(len(notifier.pings) > pings_back), "watchdog fed again")
        assert all(notifier.pings), notifier.pings
        assert server.supervisor.loops["zone-queue"].failures >= 1
    finally:
        await server.stop()
    assert server.status is Status.STOPPED


async def test_a_fatal_loop_that_fails_stops_the_router_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    add_loops = ZoneServer._add_root_loops

    def with_fatal_tick(self: ZoneServer) -> None:
        add_loops(self)
        self.supervisor.loops["zone-tick"].fatal = True

    def sweep(self: ZoneState) -> None:
        raise RuntimeError("membership view corrupt (simulated)")

    monkeypatch.setattr(ZoneServer, "_add_root_loops", with_fatal_tick)
    monkeypatch.setattr(ZoneState, "sweep", sweep)
    server = ZoneServer(zone_config(tmp_path))
    caplog.set_level(logging.INFO, logger="laminar.zone")
    with pytest.raises(RootLoopFailed, match="root loop zone-tick failed"):
        await asyncio.wait_for(server.run_until_signalled(), 30)
    assert server.status is Status.FAILED
    assert "zone-tick failed: the zone router stops (jobs stay in the journal)" in caplog.text
    assert server.supervisor.loops["zone-queue"].task is not None
    assert server.supervisor.loops["zone-queue"].task.done()  # the others were stopped
    assert "zone stopped" in caplog.text


def test_a_fatal_loop_failure_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> None:
        raise RootLoopFailed("root loop zone-tick failed (its traceback is in the log)")

    assert run_daemon("laminar-zone", main()) == 1
    assert capsys.readouterr().err == (
        "laminar-zone: root loop zone-tick failed (its traceback is in the log)\n"
    )


async def test_start_up_objects_are_frozen_out_of_the_collector(tmp_path: Path) -> None:
    """Once serving, the router has moved start-up's objects into the permanent
    generation, so full collections on the hot path do not walk them."""
    server = ZoneServer(zone_config(tmp_path))
    gc.unfreeze()  # whatever an earlier test froze
    assert gc.get_freeze_count() == 0
    await server.start()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        await server.stop()
        gc.unfreeze()
