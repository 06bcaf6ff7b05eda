"""`systemctl reload laminar-agent` sends SIGHUP: the agent reloads, it does not die."""

from __future__ import annotations

import logging
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from loopkit import agent_config, eventually
from waiting import wait_for

from laminar_agent.config import AgentConfig
from laminar_agent.server import RELOADABLE_KEYS, AgentServer
from laminar_cli.cluster import AgentProcess, LocalCluster


def test_sighup_applies_reloadable_keys_names_the_rest_and_survives_a_bad_file(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[airlock]\ndry_run = false\n")
    with LocalCluster(tmp_path / "run") as cluster:
        agent = cluster.start_agent("h", "H100-80GB", extra_args=["--config", str(config)])
        config.write_text(
            "[airlock]\ndry_run = true\ntarget_ratio = 0.75\n[zone]\nmax_windows = 8\n"
        )
        agent.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: config reloaded" in agent.log_path.read_text())
        line = next(
            x for x in agent.log_path.read_text().splitlines() if "SIGHUP: config reloaded" in x
        )
        assert "applied airlock.target_ratio, airlock.dry_run" in line
        assert "need a restart: zone.max_windows" in line
        config.write_text("[airlock]\ntarget_ratio = 7\n")  # invalid: refused, agent stays
        agent.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "config not reloaded" in agent.log_path.read_text())
        assert "airlock.target_ratio" in agent.log_path.read_text().rsplit("config not", 1)[1]
        assert agent.is_running()


def _reload_lines(agent: AgentProcess) -> list[str]:
    return [x for x in agent.log_path.read_text().splitlines() if "SIGHUP: config reloaded" in x]


def test_a_key_that_needs_a_restart_is_named_at_every_reload(tmp_path: Path) -> None:
    """A reload that applies one key keeps only that key as running: the next reload
    names the others again, they still run their old values."""
    config = tmp_path / "agent.toml"
    config.write_text("")
    with LocalCluster(tmp_path / "run") as cluster:
        agent = cluster.start_agent("h", "H100-80GB", extra_args=["--config", str(config)])
        config.write_text("[airlock]\ntarget_ratio = 0.75\ncritical_ratio = 0.9\n")
        agent.process.send_signal(signal.SIGHUP)
        wait_for(lambda: len(_reload_lines(agent)) == 1)
        agent.process.send_signal(signal.SIGHUP)
        wait_for(lambda: len(_reload_lines(agent)) == 2)
        first, second = _reload_lines(agent)
        assert first.endswith(
            "applied airlock.target_ratio; need a restart: airlock.critical_ratio"
        )
        assert second.endswith("applied nothing; need a restart: airlock.critical_ratio")


def _config(tmp_path: Path, **airlock: Any) -> AgentConfig:
    return agent_config(tmp_path, **{f"airlock.{k}": v for k, v in airlock.items()})


async def test_a_reloaded_poll_period_moves_the_tick_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A poll period above the 30 s floor, reloaded, would otherwise leave the tick's
    deadline at 30 s: health NOT_SERVING and WATCHDOG=1 held back (systemd kills the agent)
    from the first long wait on. A shorter period takes over at once, deadline included."""
    loaded = [_config(tmp_path, poll_seconds=0.05)]
    server = AgentServer(loaded[0], reloader=lambda: loaded[-1])
    caplog.set_level(logging.INFO, logger="laminar.agent")
    await server.start()
    try:
        tick = server.supervisor.loops["agent-tick"]
        await eventually(lambda: _true(server.supervisor.is_healthy()), "the tick running")
        loaded.append(_config(tmp_path, poll_seconds=40, target_ratio=0.75))
        server.reload()
        assert server.config.airlock.poll_seconds == 40
        # Past the floor since the tick's last pass, within three periods: still healthy.
        assert server.supervisor.problems(tick.last_beat + 35) == []
        assert server.supervisor.problems(tick.last_beat + 121) != []
        applied = "applied airlock.poll_seconds, airlock.target_ratio; need a restart: nothing"
        assert applied in caplog.text
        loaded.append(_config(tmp_path, poll_seconds=0.05))
        server.reload()
        beat = tick.last_beat
        # Woken from its 40 s wait: passes at the short period again, deadline back down.
        await eventually(lambda: _true(tick.last_beat > beat), "a tick pass after the reload")
        assert server.supervisor.problems(tick.last_beat + 35) != []
    finally:
        await server.stop()


async def test_a_reload_out_of_range_is_refused_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def reloader() -> AgentConfig:
        return _config(tmp_path, poll_seconds=90)

    server = AgentServer(_config(tmp_path, poll_seconds=0.05), reloader=reloader)
    caplog.set_level(logging.INFO, logger="laminar.agent")
    await server.start()
    try:
        server.reload()
        assert "config not reloaded, the running one stays" in caplog.text
        assert "airlock.poll_seconds" in caplog.text
        assert server.config.airlock.poll_seconds == 0.05
        assert server.supervisor.loops["agent-tick"].quiet_seconds == 30
    finally:
        await server.stop()


async def _true(value: bool) -> bool:
    return value


def test_docs_ops_lists_the_keys_a_reload_applies() -> None:
    """docs/ops.md's list of the agent's reloadable keys is the code's (it left out two)."""
    text = (Path(__file__).parents[2] / "docs" / "ops.md").read_text()
    start = text.index("The agent applies the Airlock ladder")
    paragraph = text[start : text.index("the router applies", start)]
    named = set(re.findall(r"`([a-z_.]+)`", paragraph)) - {"laminar_agent/server.py"}
    listed = {n if "." in n else f"airlock.{n}" for n in named if n != "RELOADABLE_KEYS"}
    assert listed == RELOADABLE_KEYS
