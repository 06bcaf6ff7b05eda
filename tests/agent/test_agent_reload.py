"""`systemctl reload laminar-agent` sends SIGHUP: the agent reloads, it does not die."""

from __future__ import annotations

import signal
from pathlib import Path

from waiting import wait_for

from laminar_cli.cluster import LocalCluster


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
