"""The agent's root loops are guarded, in process over real gRPC: an NVML error in the
tick is logged with its traceback, health goes NOT_SERVING and the watchdog is held back
until the restarted tick runs again. The fault is a GPU backend whose memory reading
fails while the test says so (no switch in the agent)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
from loopkit import NOT_SERVING, SERVING, RecordingNotifier, eventually, health

from laminar_agent import server as agent_server
from laminar_agent.config import AgentConfig
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.server import SERVICE_NAME, AgentServer
from laminar_base.configlib import load_config


class FlakyNvml(FakeGpuBackend):
    """Fake GPUs whose memory reading raises while ``broken`` is set, as NVML may."""

    broken = False

    def memory_used(self) -> dict[str, tuple[int, int]]:
        if self.broken:
            raise RuntimeError("NVMLError_Unknown: simulated memory read failure")
        return super().memory_used()


async def test_a_failing_tick_is_restarted_and_health_and_watchdog_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(agent_server, "HEALTH_CHECK_SECONDS", 0.02)
    config = load_config(
        AgentConfig,
        overrides={
            "server.listen": "127.0.0.1:0",
            "server.state_dir": str(tmp_path / "agent"),
            "server.agent_id": "guarded",
            "airlock.poll_seconds": 0.05,
        },
    )
    backend = FlakyNvml("1xA100-40GB", agent_id="guarded")
    notifier = RecordingNotifier(watchdog_interval_seconds=0.02)
    server = AgentServer(config, backend=backend, notifier=notifier)
    notifier.supervisor = server.supervisor
    caplog.set_level(logging.INFO, logger="laminar.agent")
    await server.start()
    try:
        assert await health(server.address, SERVICE_NAME) == SERVING
        await eventually(lambda: _true(len(notifier.pings) > 0), "a first watchdog ping")

        backend.broken = True
        await eventually(
            lambda: _is(server.address, NOT_SERVING), "health NOT_SERVING after the fault"
        )
        tick = server.supervisor.loops["agent-tick"]
        assert tick.failures >= 1
        failed = [r for r in caplog.records if "root loop agent-tick failed" in r.getMessage()]
        assert failed and failed[0].exc_info is not None
        assert "NVMLError_Unknown" in str(failed[0].exc_info[1])
        assert "watchdog held back: agent-tick: failed" in caplog.text

        backend.broken = False
        await eventually(lambda: _is(server.address, SERVING), "health SERVING again")
        pings_back = len(notifier.pings)
        await eventually(lambda: _true(len(notifier.pings) > pings_back), "watchdog fed again")
        assert "all root loops healthy again" in caplog.text
        # Every ping went out while the supervisor held the agent healthy.
        assert all(notifier.pings), notifier.pings
    finally:
        await server.stop()
    assert server.supervisor.loops["agent-tick"].task is not None
    assert server.supervisor.loops["agent-tick"].task.done()


async def _true(value: bool) -> bool:
    return value


async def _is(address: str, status: int) -> bool:
    return await health(address, SERVICE_NAME) == status


async def test_start_up_objects_are_frozen_out_of_the_collector(tmp_path: Path) -> None:
    """Once serving, the agent has moved start-up's objects into the permanent generation,
    so full collections on the hot path do not walk them."""
    config = load_config(
        AgentConfig,
        overrides={
            "server.listen": "127.0.0.1:0",
            "server.state_dir": str(tmp_path / "agent"),
            "server.agent_id": "frozen",
        },
    )
    server = AgentServer(config, backend=FakeGpuBackend("1xA100-40GB", agent_id="frozen"))
    gc.unfreeze()  # whatever an earlier test froze
    assert gc.get_freeze_count() == 0
    await server.start()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        await server.stop()
        gc.unfreeze()
