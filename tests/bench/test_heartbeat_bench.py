"""Smoke run of ``laminar bench heartbeats`` with a real router and heartbeat-only agents.

Only the shape and the sanity of the report are asserted (heartbeats counted, CPU
read, nothing left running); the figures themselves are never judged here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_placement_bench import daemons_under, run_cli

from laminar_base.errors import InvalidArgument


def test_smoke_report_fields_and_clean_exit(tmp_path: Path) -> None:
    argv = ["bench", "heartbeats", "--agents", "3", "--agents-per-process", "2", "-o", "json"]
    argv += ["--seconds", "1", "--heartbeat-seconds", "0.2", "--work-dir", str(tmp_path)]
    code, text = run_cli(argv)
    assert code == 0
    runs: list[dict[str, Any]] = json.loads(text)["runs"]
    assert [r["transport"] for r in runs] == ["unary", "stream"]
    for report in runs:
        assert report["agents"] == 3 and report["agent_processes"] == 2
        assert report["heartbeat_seconds"] == 0.2
        assert report["agents_ready_at_start"] == 3 and report["agents_ready_at_end"] == 3
        assert report["router_connections"] == 3  # one per agent, as hosts have
        assert report["nominal_heartbeats_per_second"] == pytest.approx(15.0)
        assert 0 <= report["heartbeats_with_summary"] <= report["heartbeats"]
        assert report["router_cpu_seconds"] >= 0  # an idle streaming router may read 0 ticks
        assert report["router_cpu_ratio"] == pytest.approx(
            report["router_cpu_seconds"] / report["measured_seconds"]
        )
        assert report["router_cpu_us_per_agent_second"] == pytest.approx(
            1e6 * report["router_cpu_ratio"] / 3
        )
        assert report["environment"]["cores"] >= 1
    unary, stream = runs
    assert unary["heartbeats"] > 0 and unary["router_cpu_seconds"] > 0
    assert unary["router_cpu_ms_per_heartbeat"] > 0
    # Idle agents on the stream send only every liveness period (8 s): far fewer messages.
    assert stream["heartbeats"] < unary["heartbeats"]
    assert daemons_under(tmp_path) == []


def test_one_transport_reports_one_run(tmp_path: Path) -> None:
    argv = ["bench", "heartbeats", "--agents", "1", "--transport", "stream", "-o", "json"]
    argv += ["--seconds", "1", "--heartbeat-seconds", "0.2", "--work-dir", str(tmp_path)]
    code, text = run_cli(argv)
    assert code == 0
    report = json.loads(text)
    assert report["transport"] == "stream" and report["agents_ready_at_end"] == 1
    assert daemons_under(tmp_path) == []


def test_bad_input_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="--agents"):
        run_cli(["bench", "heartbeats", "--agents", "0"])
    with pytest.raises(InvalidArgument, match="--seconds"):
        run_cli(["bench", "heartbeats", "--agents", "1", "--seconds", "0"])
    with pytest.raises(InvalidArgument, match="--agents-per-process"):
        run_cli(["bench", "heartbeats", "--agents", "1", "--agents-per-process", "0"])
    assert list(tmp_path.iterdir()) == []
