"""Smoke runs of ``laminar bench placement`` with a real router and two real agents.

Only the shape and the sanity of the report are asserted (every job counted,
positive latencies, at least one probe per placement, nothing left running);
the figures themselves are never judged here.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any, cast

import grpc
import psutil
import pytest
from rich.console import Console

from laminar_api.v1 import zone_pb2_grpc
from laminar_base.errors import InvalidArgument
from laminar_bench.cli import register
from laminar_bench.placement import BenchCluster, BenchSpec, Driver

REQUIRED = (
    "placements_per_second",
    "latency_p50_ms",
    "latency_p99_ms",
    "probes_per_placement",
    "bounces_per_placement",
    "router_cpu_seconds_per_placement",
    "agents",
    "agents_per_process",
    "jobs",
    "mode",
    "health_p50_ms",
    "latency_p50_to_health_p50_ratio",
    "environment",
    "journal_commits_per_job",
    "watch_events_per_job",
)


def run_cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="laminar")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    code: int = args.func(args, Console(file=out, width=200))
    return code, out.getvalue()


def daemons_under(root: Path) -> list[int]:
    """Pids of live processes whose command line names the work directory."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(str(root) in part for part in cmdline):
            found.append(proc.info["pid"])
    return found


@pytest.mark.parametrize(
    ("launch", "per_process", "watch"),
    [(False, 2, ""), (False, 2, "unary"), (True, 1, ""), (True, 1, "separately")],
    ids=["placement-pool", "placement-unary", "launch", "launch-watch-separately"],
)
def test_smoke_report_fields_and_clean_exit(
    tmp_path: Path, launch: bool, per_process: int, watch: str
) -> None:
    """Placement mode runs its agents in one pool process; launch mode one process each.
    Launch mode follows each job in its SubmitAndWatch call by default (one call per job),
    with ``--watch separately`` by Submit and then WatchJob (two). Placement mode sends its
    ProbeJob calls over a ProbeJobs stream by default, with ``--probe-calls unary`` one
    unary call each (``watch`` carries that choice for placement mode)."""
    argv = ["bench", "placement", "--agents", "2", "--jobs", "10", "-o", "json"]
    argv += ["--work-dir", str(tmp_path), "--timeout", "60"]
    argv += ["--agents-per-process", str(per_process)]
    if launch:
        argv.append("--launch")
    if watch and launch:
        argv += ["--watch", watch]
    elif watch:
        argv += ["--probe-calls", watch]
    code, text = run_cli(argv)
    assert code == 0
    report: dict[str, Any] = json.loads(text)
    for key in REQUIRED:
        assert key in report, key
    assert report["mode"] == ("launch" if launch else "placement")
    assert report["agents"] == 2 and report["agents_per_process"] == per_process
    assert report["agent_processes"] == 2 // per_process
    assert report["jobs"] == 10
    assert report["placed"] == 10 and report["not_placed"] == 0
    assert report["placements_per_second"] > 0
    assert 0 < report["latency_p50_ms"] <= report["latency_p99_ms"]
    assert report["probes_per_placement"] >= 1
    assert report["bounces_per_placement"] >= 0
    assert report["router_cpu_seconds_per_placement"] >= 0
    assert report["health_p50_ms"] > 0
    assert report["environment"]["cores"] >= 1
    assert report["processes_started"] == (10 if launch else 0)
    if launch:
        assert report["final_states"] == {"JOB_SUCCEEDED": 10}
        assert report["watch"] == (watch or "together")
        # Each stream carries at least the job as accepted and as ended.
        assert report["watch_events_per_job"] >= 2
        # Every job is journaled (grouped commits may share jobs).
        assert report["journal_commits_per_job"] > 0
    else:
        assert report["watch_events_per_job"] is None
        # Every kept lease is given back, at most one Release per agent per loop tick.
        assert 0 < report["release_calls_per_placement"] <= 1
        assert report["probe_calls"] == (watch or "stream")
        # One stream per submitter: min(32 submitters, 10 jobs).
        assert report["probe_streams"] == (0 if watch == "unary" else 10)
        assert report["probe_calls_note"] is None
    assert report["zone_calls_per_job"] == (2 if watch == "separately" else 1)
    assert daemons_under(tmp_path) == []


def test_bad_input_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="--agents"):
        run_cli(["bench", "placement", "--agents", "0", "--jobs", "10"])
    with pytest.raises(InvalidArgument, match="--fake-gpus"):
        run_cli(
            ["bench", "placement", "--agents", "1", "--jobs", "1", "--fake-gpus", "2xH100-80GB"]
        )
    with pytest.raises(InvalidArgument, match="--watch"):
        BenchSpec(agents=1, jobs=1, launch=True, watch="sometimes").validate()
    assert list(tmp_path.iterdir()) == []


async def test_a_router_without_probe_jobs_gets_unary_calls_and_the_report_says_so() -> None:
    """Against a Zone service that implements nothing (the generated base answers
    UNIMPLEMENTED), the streams are given up for unary calls, with the reason."""
    server = grpc.aio.server()
    zone_pb2_grpc.add_ZoneServicer_to_server(zone_pb2_grpc.ZoneServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            driver = Driver(BenchSpec(agents=1, jobs=1), cast(BenchCluster, None), None)
            note = await driver.open_probe_streams(zone_pb2_grpc.ZoneStub(channel))
    finally:
        await server.stop(None)
    assert driver.probe_streams == []
    assert "no ProbeJobs" in note and "unary" in note
